"""Quantization-aware training: fake quantization the gradient can pass through (lesson 15).

Every method before lesson 15 rounds a trained model and then repairs what it can. Here the
model keeps training while its weights are rounded in the forward pass, so the weights (and
the grid itself) learn to live with the rounding. The pieces, in the order the lesson builds
them:

- :class:`RoundSTE` / :func:`fake_quant_ste`: the straight-through estimator. The forward pass
  rounds on the grid of lessons 02-03, ``s * clamp(round(w / s), -qmax, qmax)``; the backward
  pass pretends the rounding was the identity inside the clip range and passes the gradient
  there, and passes zero outside it (where the clamp really is flat).
- :class:`LSQFakeQuant` / :func:`fake_quant_lsq`: the same forward with a *learned* step size
  ``s`` (Esser et al., "Learned Step Size Quantization", ICLR 2020). Its gradient with respect
  to ``s`` is ``round(w/s) - w/s`` inside the range and ``-qmax`` / ``+qmax`` below / above it,
  summed over the weights that share the step and multiplied by LSQ's gradient scale
  ``1 / sqrt(n * qmax)`` (n weights per step; the paper's N_W * Q_P, with one step per layer).
  The paper set it for SGD, to keep the steps' relative updates near the weights'; under Adam
  a constant factor on a gradient cancels, and the steps' learning rate (``scale_lr`` of
  :func:`param_groups`) sets the balance instead (lesson 15 measures both).
- :func:`clip_scale`: learned clipping, a symmetric one-factor version of OmniQuant's
  "learnable weight clipping" (Shao et al. 2024, which learns one factor for the max and one
  for the min): the step is ``sigmoid(gamma) * max|w| / qmax`` with one learned ``gamma`` per
  group, so training can only pull the range in from the absmax, never past it.
- :func:`ternary_absmean`: BitNet b1.58's weights, three levels ``{-1, 0, +1} * mean|W|``
  (one scale per tensor), with the plain straight-through gradient (the identity everywhere).
- :class:`QATLinear` and :func:`prepare_qat`: a model's block Linears swapped for ones that
  compute with their fake-quantized weight; :func:`qat_step` (one optimiser step) and
  :func:`train_qat` (the loop that calls it, with a learning curve); :func:`freeze` turns the
  trained model into :class:`~course_lib.methods.calibration.GroupQuantLinear` layers whose
  integer codes the existing writers (``course_lib.export``) save.
- :func:`tune_block` and :func:`blockwise_qat`: block-wise reconstruction on a model too big
  to train whole on a CPU, as in EfficientQAT's first phase (Block-AP: every parameter of a
  block, weights and steps) and OmniQuant (which keeps the weights frozen and learns clipping
  and equivalent transformations instead): one decoder block at a time, learn its steps (and
  optionally its weights) so that its outputs on captured calibration activations match the
  float block's. EfficientQAT's second phase (E2E-QP, the steps trained end to end with the
  codes frozen) is not done here.
- :data:`GGML_BLOCKS` / :func:`gguf_bits_per_weight`: the bits per weight of llama.cpp's
  block formats that can hold a low-bit grid (Q4_0, Q2_0, TQ1_0, TQ2_0), from their layouts.

``python -m course_lib.experiments.qat_tables --model bundled`` and ``--model smollm2`` write
the committed tables ``results/qat_bundled.json`` and ``results/qat_smollm2.json``
(:func:`load_results` reads them; the writer lives with the course's other experiments, in
``course_lib.experiments``: it also drives llama.cpp).
"""
from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.methods import calibration as cal

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"

#: The ways a QATLinear learns its grid: "lsq" (a learned step per group, LSQ), "clip"
#: (a learned clipping factor per group, a symmetric form of OmniQuant's LWC), "ternary"
#: (BitNet b1.58's absmean, one scale per tensor, nothing learned but the weights), "fixed"
#: (the absmax step of round-to-nearest, recomputed from the weights at every step: plain STE).
MODES = ("lsq", "clip", "ternary", "fixed")


# ----------------------------------------------------------------------------- input checks
def check_bits(bits) -> int:
    """The symmetric grid of lessons 02-03 needs at least 2 bits (qmax = 2**(bits-1) - 1 >= 1)."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be a whole number from 2 to 8: the symmetric grid has levels "
                         f"-qmax..qmax with qmax = 2**(bits-1) - 1, and 1 bit would leave only "
                         f"0 (use mode='ternary' for three levels); got {bits!r}")
    return bits


def qmax_of(bits: int) -> int:
    """Largest code of the symmetric grid: 7 at 4 bits, 3 at 3 bits, 1 at 2 bits (lesson 02)."""
    return 2 ** (check_bits(bits) - 1) - 1


def check_group_size(in_features: int, group_size) -> int:
    """A group size must be a whole number that divides the layer's inputs."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a whole number >= 1 (inputs per scale, e.g. 32); "
                         f"got {group_size!r}")
    return cal.check_group_size(in_features, group_size)


def check_positive(name: str, value, whole: bool = False):
    """A learning rate or a step count must be a positive (whole) number."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) \
        and value > 0 and (not whole or float(value).is_integer())
    if not ok:
        kind = "a whole number >= 1" if whole else "a positive number"
        raise ValueError(f"{name} must be {kind}; got {value!r}")
    return int(value) if whole else float(value)


class NonFiniteLoss(FloatingPointError):
    """Training stopped because a loss (or a gradient) became NaN or infinite."""


def check_loss(loss: torch.Tensor, step: int) -> float:
    """Stop with a message that says at which step and why when the loss is not finite."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise NonFiniteLoss(
            f"the loss is {value} at step {step}: training diverged (the learning rate is "
            f"probably too high for these weights, or a step size went to 0 or below and "
            f"w / s blew up). Lower lr (try a tenth), or check the inputs for NaN; the model "
            f"holds the weights of step {step - 1}")
    return value


# ----------------------------------------------------------------------------- STE
class RoundSTE(torch.autograd.Function):
    """Fake quantization with a fixed step and the straight-through estimator (lesson 15).

    forward: ``s * clamp(round(w / s), -qmax, qmax)`` (round half to even, as lesson 02);
    backward: ``grad * 1[-qmax <= w / s <= qmax]`` to ``w``; nothing to ``s`` (a fixed step).
    """

    @staticmethod
    def forward(ctx, w, scale, qmax):
        v = w / scale                                                        # codes before rounding
        ctx.save_for_backward((v >= -qmax) & (v <= qmax))                    # inside the range
        return torch.clamp(torch.round(v), -qmax, qmax) * scale

    @staticmethod
    def backward(ctx, grad):
        (inside,) = ctx.saved_tensors
        return grad * inside, None, None


def fake_quant_ste(w: torch.Tensor, scale: torch.Tensor, bits: int) -> torch.Tensor:
    """``RoundSTE`` on ``w`` with step ``scale`` (broadcast against w) at ``bits`` bits."""
    return RoundSTE.apply(w, scale, qmax_of(bits))


def _sum_to(t: torch.Tensor, shape) -> torch.Tensor:
    """Sum a broadcast gradient back to the shape of the tensor that was broadcast."""
    while t.dim() > len(shape):
        t = t.sum(0)
    dims = [i for i, (a, b) in enumerate(zip(t.shape, shape)) if b == 1 and a != 1]
    return t.sum(dims, keepdim=True) if dims else t


class LSQFakeQuant(torch.autograd.Function):
    """Fake quantization with a learned step (LSQ, Esser et al. 2020) (lesson 15).

    forward: ``w_hat = s * clamp(round(w / s), -qmax, qmax)``, ``s`` broadcast against ``w``;
    backward to w: the straight-through estimator (1 inside the range, 0 outside);
    backward to s: ``d w_hat / d s`` = ``round(w/s) - w/s`` inside, ``-qmax`` below, ``+qmax``
    above, summed over the weights sharing a step, times ``grad_scale`` (LSQ: 1/sqrt(n qmax)).
    """

    @staticmethod
    def forward(ctx, w, scale, qmax, grad_scale):
        v = w / scale
        q = torch.clamp(torch.round(v), -qmax, qmax)
        inside = (v >= -qmax) & (v <= qmax)
        ctx.save_for_backward(inside, torch.where(inside, q - v, q))
        ctx.scale_shape, ctx.grad_scale = scale.shape, grad_scale
        return q * scale

    @staticmethod
    def backward(ctx, grad):
        inside, dw_ds = ctx.saved_tensors
        grad_s = _sum_to(grad * dw_ds, ctx.scale_shape) * ctx.grad_scale
        return grad * inside, grad_s, None, None


def lsq_grad_scale(n_per_step: int, bits: int) -> float:
    """LSQ's gradient scale for a step shared by ``n_per_step`` weights: 1 / sqrt(n * qmax)."""
    return 1.0 / math.sqrt(n_per_step * qmax_of(bits))


def fake_quant_lsq(w: torch.Tensor, scale: torch.Tensor, bits: int,
                   grad_scale: float | None = None) -> torch.Tensor:
    """``LSQFakeQuant`` on w with a learned step ``scale``; ``grad_scale`` None: LSQ's, with
    n = w.numel() / scale.numel() weights per step."""
    if grad_scale is None:
        grad_scale = lsq_grad_scale(max(1, w.numel() // max(1, scale.numel())), bits)
    return LSQFakeQuant.apply(w, scale, qmax_of(bits), grad_scale)


def clip_scale(w_groups: torch.Tensor, gamma: torch.Tensor, bits: int) -> torch.Tensor:
    """Learned clipping's step: ``sigmoid(gamma) * max|w| / qmax`` per group (OmniQuant's LWC
    in symmetric form: one learned factor on the absmax, where LWC learns one each for max, min).

    w_groups (..., G, gs), gamma (..., G, 1): a step (..., G, 1). gamma = +inf is round-to-
    nearest's absmax step; training can only shrink the range (sigmoid < 1)."""
    amax = w_groups.detach().abs().amax(-1, keepdim=True).clamp_min(1e-12)   # (..., G, 1)
    return torch.sigmoid(gamma) * amax / qmax_of(bits)


def ternary_absmean(w: torch.Tensor, eps: float = 1e-6):
    """BitNet b1.58's weight rounding: ``(w_hat, scale)`` with scale = mean|w| and
    ``w_hat = scale * clamp(round(w / scale), -1, 1)``; the gradient to w is the identity
    (``w + (w_hat - w).detach()``, as the paper's training code does: no clip mask)."""
    scale = w.detach().abs().mean().clamp_min(eps)
    w_hat = torch.clamp(torch.round(w.detach() / scale), -1, 1) * scale
    return w + (w_hat - w).detach(), scale


# ----------------------------------------------------------------------------- the layer
class QATLinear(nn.Module):
    """A Linear that computes with its fake-quantized weight and learns through it (lesson 15).

    ``weight`` (out, in) stays in fp32 and is trained (unless ``train_weight=False``); what the
    layer computes with is its rounded copy. mode (see ``MODES``): "lsq" holds a learned
    ``step`` (out, G, 1) started at round-to-nearest's absmax / qmax; "clip" a learned
    ``gamma`` (out, G, 1) started at ``clip_init`` (sigmoid(4) = 0.982 of the absmax); "fixed"
    recomputes the absmax step from the weights each time; "ternary" uses one absmean scale.
    At step 0, "lsq" and "fixed" give exactly round-to-nearest's weight.

    ``grad_scale`` ("lsq" only): the factor on the step's gradient; None is LSQ's
    ``1 / sqrt(group_size * qmax)``, 1.0 switches it off (lesson 15 compares the two).
    """

    def __init__(self, linear: nn.Linear, bits: int = 4, group_size: int = 32, mode: str = "lsq",
                 train_weight: bool = True, clip_init: float = 4.0,
                 grad_scale: float | None = None):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
        if grad_scale is not None:
            if mode != "lsq":
                raise ValueError(f"grad_scale applies to the learned step of mode 'lsq' only; "
                                 f"mode {mode!r} has no step gradient to scale")
            grad_scale = check_positive("grad_scale", grad_scale)
        self.out_features, self.in_features = linear.weight.shape
        self.mode = mode
        self.bits = None if mode == "ternary" else check_bits(bits)
        self.group_size = self.in_features if mode == "ternary" else \
            check_group_size(self.in_features, group_size)
        w = linear.weight.detach().float().clone()                           # (out, in)
        self.weight = nn.Parameter(w, requires_grad=train_weight)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().float().clone(),
                                                                  requires_grad=train_weight)
        G = self.in_features // self.group_size
        self.grad_scale = grad_scale
        if mode == "lsq":
            amax = w.view(self.out_features, G, self.group_size).abs().amax(-1, keepdim=True)
            step = torch.where(amax == 0, torch.ones_like(amax), amax / qmax_of(bits))
            self.step = nn.Parameter(step)                                   # (out, G, 1)
        if mode == "clip":
            self.gamma = nn.Parameter(torch.full((self.out_features, G, 1), float(clip_init)))

    def groups(self) -> torch.Tensor:
        return self.weight.view(self.out_features, -1, self.group_size)     # (out, G, gs)

    def scale(self) -> torch.Tensor:
        """The step each group is rounded with: (out, G, 1)."""
        wg = self.groups()
        if self.mode == "lsq":
            return self.step
        if self.mode == "clip":
            return clip_scale(wg, self.gamma, self.bits)
        if self.mode == "fixed":
            amax = wg.detach().abs().amax(-1, keepdim=True)
            return torch.where(amax == 0, torch.ones_like(amax), amax / qmax_of(self.bits))
        return ternary_absmean(self.weight)[1].reshape(1, 1, 1).expand(self.out_features, 1, 1)

    def quantized_weight(self) -> torch.Tensor:
        """The weight the layer computes with, (out, in), differentiable through the STE."""
        if self.mode == "ternary":
            return ternary_absmean(self.weight)[0]
        wg, s = self.groups(), self.scale()                                  # (out, G, gs), (out, G, 1)
        if self.mode == "lsq":
            g = lsq_grad_scale(self.group_size, self.bits) if self.grad_scale is None \
                else self.grad_scale
            wq = fake_quant_lsq(wg, s, self.bits, g)
        elif self.mode == "clip":
            wq = LSQFakeQuant.apply(wg, s, qmax_of(self.bits), 1.0)          # gradient reaches gamma
        else:
            wq = RoundSTE.apply(wg, s, qmax_of(self.bits))
        return wq.reshape(self.out_features, self.in_features)

    def forward(self, x):                                                    # (..., in) -> (..., out)
        return F.linear(x, self.quantized_weight(), self.bias)

    @torch.no_grad()
    def codes_and_scale(self, scale_dtype: torch.dtype = torch.float32):
        """(int8 codes (out, in), step (out, G) in ``scale_dtype``), codes taken with the
        stored (rounded) step so that codes * stored step is exactly what a file holds."""
        s = self.scale().detach().to(scale_dtype).float()                    # (out, G, 1)
        s = torch.where(s > 0, s, torch.ones_like(s))
        qm = 1 if self.mode == "ternary" else qmax_of(self.bits)
        codes = torch.clamp(torch.round(self.groups().detach() / s), -qm, qm).to(torch.int8)
        return codes.reshape(self.out_features, self.in_features), s[..., 0].to(scale_dtype)

    def extra_repr(self):
        what = "ternary absmean" if self.mode == "ternary" else \
            f"int{self.bits} g{self.group_size} {self.mode}"
        return f"{self.in_features}, {self.out_features}, {what}"


def qat_linears(model: nn.Module) -> dict[str, QATLinear]:
    """The QATLinear layers of a model, by name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, QATLinear)}


def prepare_qat(model: nn.Module, bits: int = 4, group_size: int = 32, mode: str = "lsq",
                train_weight: bool = True, skip=("lm_head", "embed_tokens"),
                inplace: bool = False, **kw) -> nn.Module:
    """Swap every trainable block Linear (not the head, not the embeddings) for a
    :class:`QATLinear`; everything else is frozen. A copy unless ``inplace``. Checks the bits
    and group size against every layer before changing anything (lesson 15)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    if mode != "ternary":
        check_bits(bits)
    targets = [(n, m) for n, m in model.named_modules()
               if type(m) is nn.Linear and not any(s in n for s in skip)
               and m.weight.requires_grad]
    if not targets:
        raise ValueError("this model has no trainable nn.Linear outside "
                         f"{list(skip)} to quantize-aware train (are its weights frozen "
                         f"with requires_grad=False, or already swapped?)")
    if mode != "ternary":
        for name, lin in targets:
            try:
                check_group_size(lin.in_features, group_size)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
    if not inplace:
        model = copy.deepcopy(model)
    for p in model.parameters():
        p.requires_grad_(False)
    for name, lin in targets:
        cal.replace(model, name, QATLinear(model.get_submodule(name), bits, group_size, mode,
                                           train_weight, **kw))
    return model


def param_groups(model: nn.Module, lr: float, scale_lr: float | None = None) -> list[dict]:
    """AdamW groups: the weights at ``lr`` (weight decay 0: decay would pull them off the
    pretrained values), the learned steps / clipping factors at ``scale_lr`` (default 10 lr)."""
    lr = check_positive("lr", lr)
    scale_lr = lr * 10 if scale_lr is None else check_positive("scale_lr", scale_lr)
    weights, grids = [], []
    for n, p in model.named_parameters():
        if p.requires_grad:
            (grids if n.endswith((".step", ".gamma")) else weights).append(p)
    if not weights and not grids:
        raise ValueError("the model has no trainable parameter: call prepare_qat first")
    groups = []
    if weights:
        groups.append({"params": weights, "lr": lr, "weight_decay": 0.0, "base_lr": lr})
    if grids:
        groups.append({"params": grids, "lr": scale_lr, "weight_decay": 0.0, "base_lr": scale_lr})
    return groups


# ----------------------------------------------------------------------------- one step, the loop
def qat_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
             teacher_logits: torch.Tensor | None = None, step: int = 0,
             clip_norm: float = 1.0) -> float:
    """One QAT step (lesson 15): forward through the fake-quantized model, the loss, backward
    through the straight-through estimator, clip the gradient norm, the optimiser's step.

    Loss: cross-entropy on the next bytes ``y`` (B, T), or, with ``teacher_logits`` (B, T, V)
    of the float model, the KL divergence from the teacher (LLM-QAT's distillation). Refuses a
    non-finite loss (saying at which step) before touching the weights. Returns the loss."""
    logits = model(x)                                                        # (B, T, V)
    V = logits.shape[-1]
    if teacher_logits is None:
        loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
    else:
        loss = F.kl_div(F.log_softmax(logits, -1).reshape(-1, V),
                        F.log_softmax(teacher_logits, -1).reshape(-1, V),
                        log_target=True, reduction="batchmean")
    value = check_loss(loss, step)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for g in opt.param_groups for p in g["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, clip_norm)
    if not torch.isfinite(norm):
        raise NonFiniteLoss(f"the gradient norm is {float(norm)} at step {step} (the loss was "
                            f"{value:.4g}): a step size near 0 makes w / s huge; lower lr")
    opt.step()
    with torch.no_grad():                      # a learned step must stay positive
        for m in model.modules():
            if isinstance(m, QATLinear) and m.mode == "lsq":
                m.step.clamp_(min=1e-8)
    return value


def lr_at(step: int, steps: int, warmup: int = 0, final_frac: float = 0.1) -> float:
    """Multiplier of the base learning rate: linear warm-up, then cosine to ``final_frac``."""
    if step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * t))


@dataclass
class Curve:
    """A learning curve: the training loss of every step and held-out scores now and then."""
    loss: list = field(default_factory=list)           # (step, loss)
    heldout: list = field(default_factory=list)        # (step, {kl_nats, top1_agreement, ...})
    seconds: float = 0.0


def random_windows(corpus: torch.Tensor, batch: int, ctx: int, g: torch.Generator):
    """(inputs (B, ctx), next-token targets (B, ctx)) from random windows of a 1-D corpus."""
    if len(corpus) < ctx + 2:
        raise ValueError(f"the corpus ({len(corpus)} tokens) is too short for windows of {ctx} + 1")
    starts = torch.randint(0, len(corpus) - ctx - 1, (batch,), generator=g)   # (B,)
    w = corpus[starts[:, None] + torch.arange(ctx + 1)[None, :]]              # (B, ctx+1)
    return w[:, :-1], w[:, 1:]


def train_qat(model: nn.Module, corpus: torch.Tensor, steps: int, lr: float = 2e-4,
              scale_lr: float | None = None, batch: int = 8, ctx: int = 128,
              teacher: nn.Module | None = None, evaluate=None, eval_every: int = 0,
              seed: int = 0, warmup: int = 0, step_fn=qat_step, progress: bool = False,
              desc: str = "QAT") -> Curve:
    """Train a :func:`prepare_qat` model for ``steps`` steps on random windows of ``corpus``
    (lesson 15). ``teacher``: the float model, whose logits the loss distils (None: plain
    cross-entropy). ``evaluate(model) -> dict`` is called before the first step, every
    ``eval_every`` steps and after the last (the held-out learning curve). ``step_fn``: the
    step to call, ``qat_step`` or the learner's own with the same arguments."""
    steps = check_positive("steps", steps, whole=True)
    check_positive("lr", lr)
    batch = check_positive("batch", batch, whole=True)
    ctx = check_positive("ctx", ctx, whole=True)
    if not qat_linears(model):
        raise ValueError("the model has no QATLinear layers: call prepare_qat(model, ...) first")
    opt = torch.optim.AdamW(param_groups(model, lr, scale_lr), betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(seed)
    curve = Curve()
    t0 = time.perf_counter()

    def score(step):
        if evaluate is not None:
            model.eval()
            with torch.no_grad():
                curve.heldout.append((step, evaluate(model)))
            model.train()

    score(0)
    from tqdm.auto import tqdm
    model.train()
    for step in tqdm(range(steps), desc=desc, disable=not progress, leave=False):
        for grp in opt.param_groups:
            grp["lr"] = grp["base_lr"] * lr_at(step, steps, warmup)
        x, y = random_windows(corpus, batch, ctx, g)                         # (B, ctx) each
        t_logits = None
        if teacher is not None:
            with torch.no_grad():
                t_logits = teacher(x)                                        # (B, ctx, V)
        curve.loss.append((step, step_fn(model, opt, x, y, t_logits, step)))
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            score(step + 1)
    model.eval()
    score(steps)
    curve.seconds = time.perf_counter() - t0
    return curve


@torch.no_grad()
def freeze(model: nn.Module, scale_dtype: torch.dtype = torch.float32, inplace: bool = False,
           container_bits: int | None = None) -> nn.Module:
    """Every QATLinear as a :class:`~course_lib.methods.calibration.GroupQuantLinear` with its
    integer codes and steps (``scale_dtype``: fp16 for GGUF's Q4_0, bf16 for a bf16
    compressed-tensors checkpoint), so the writers of lessons 06 and 13 can save it. Ternary
    layers become 2-bit codes -1..1 (one scale per row, the tensor's absmean).

    container_bits: label the layers with this width instead (4: a 3-bit, 2-bit or ternary
    grid's codes -3..3 / -1..1 are 4-bit codes that use only some of the 16 levels, so Q4_0
    and pack-quantized INT4 hold the grid exactly, at 4 bits per code: the values survive,
    the saving does not)."""
    if container_bits is not None:
        check_bits(container_bits)
    if not inplace:
        model = copy.deepcopy(model)
    layers = qat_linears(model)
    if not layers:
        raise ValueError("the model has no QATLinear layers to freeze")
    for name, m in layers.items():
        codes, scale = m.codes_and_scale(scale_dtype)
        bits = 2 if m.mode == "ternary" else m.bits
        if container_bits is not None:
            if container_bits < bits:
                raise ValueError(f"{name}: {bits}-bit codes do not fit {container_bits}-bit "
                                 f"containers")
            bits = container_bits
        bias = None if m.bias is None else nn.Parameter(m.bias.detach().clone(), requires_grad=False)
        new = cal.GroupQuantLinear(codes, scale, None, bits, m.group_size, bias, torch.float32,
                                   method=f"qat-{m.mode}")
        cal.replace(model, name, new)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@torch.no_grad()
def to_container(model: nn.Module, bits: int = 4, group_size: int = 32,
                 scale_dtype: torch.dtype = torch.float16) -> nn.Module:
    """A copy whose GroupQuantLinear layers (a frozen QAT model, or RTN / GPTQ) are relabelled as
    ``bits``-bit codes in groups of ``group_size`` with steps stored in ``scale_dtype``: what a
    file format with wider codes holds (lesson 15). The codes are unchanged (a 3-bit grid's
    -3..3 are 4-bit codes too); a per-row scale (ternary) is repeated for every group; the
    steps are rounded to ``scale_dtype`` (fp16: GGUF), which moves each weight by at most half
    an fp16 ulp of its step."""
    model = copy.deepcopy(model)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, cal.GroupQuantLinear)}
    if not layers:
        raise ValueError("the model has no GroupQuantLinear layers: freeze() a QAT model first")
    for name, m in layers.items():
        if not m.symmetric or m.bits > bits:
            raise ValueError(f"{name}: int{m.bits} {'sym' if m.symmetric else 'asym'} codes do "
                             f"not fit symmetric {bits}-bit containers")
        scale = m.scale.float()                                              # (out, G)
        if m.group_size != group_size:
            if m.in_features % group_size or scale.shape[1] != 1:
                raise ValueError(f"{name}: groups of {m.group_size} cannot be rewritten as groups "
                                 f"of {group_size}")
            scale = scale.repeat(1, m.in_features // group_size)             # (out, in/gs)
        new = cal.GroupQuantLinear(m.codes.clone(), scale.to(scale_dtype), None, bits, group_size,
                                   m.bias, torch.float32, method=m.method)
        cal.replace(model, name, new)
    return model


# ----------------------------------------------------------------------------- block by block
def block_loss(block: nn.Module, x: torch.Tensor, target: torch.Tensor, cos, sin) -> torch.Tensor:
    """Mean squared error between a block's outputs on x (B, T, D) and the target (B, T, D),
    relative to the target's mean square (so blocks of any scale weigh the same)."""
    y = block(x, cos, sin)                                                   # (B, T, D)
    return (y - target).pow(2).mean() / target.pow(2).mean().clamp_min(1e-12)


def tune_block(block: nn.Module, x: torch.Tensor, target: torch.Tensor, cos, sin, bits: int,
               group_size: int, mode: str = "lsq", steps: int = 20, lr: float = 1e-5,
               scale_lr: float = 1e-3, batch: int = 2, train_weight: bool = True,
               seed: int = 0) -> list[float]:
    """EfficientQAT's block-wise phase (Block-AP) on one decoder block, in place (lesson 15):
    swap its Linears for :class:`QATLinear` (started at round-to-nearest), then train the steps (and
    the weights, if ``train_weight``) for ``steps`` steps on batches of ``batch`` calibration
    windows so that ``block(x)`` matches ``target`` (the float block's outputs), x (n, T, D).
    Returns the loss of every step (relative MSE)."""
    steps = check_positive("steps", steps, whole=True)
    batch = check_positive("batch", batch, whole=True)
    if x.shape != target.shape or x.dim() != 3:
        raise ValueError(f"x and target must be the same (windows, tokens, width); got "
                         f"{tuple(x.shape)} and {tuple(target.shape)}")
    prepare_qat(block, bits, group_size, mode, train_weight, skip=(), inplace=True)
    opt = torch.optim.AdamW(param_groups(block, lr, scale_lr), betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(seed)
    losses = []
    block.train()
    for step in range(steps):
        for grp in opt.param_groups:
            grp["lr"] = grp["base_lr"] * lr_at(step, steps)
        pick = torch.randperm(x.shape[0], generator=g)[:batch]
        loss = block_loss(block, x[pick], target[pick], cos, sin)
        losses.append(check_loss(loss, step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            for m in qat_linears(block).values():
                if m.mode == "lsq":
                    m.step.clamp_(min=1e-8)
    block.eval()
    return losses


def blockwise_qat(model: nn.Module, ids: torch.Tensor, bits: int, group_size: int = 32,
                  mode: str = "lsq", steps: int = 20, lr: float = 1e-5, scale_lr: float = 1e-3,
                  batch: int = 2, train_weight: bool = True, n_blocks: int | None = None,
                  progress: bool = False, log: list | None = None):
    """:func:`tune_block` on every decoder block in turn (or the first ``n_blocks``), each on
    the calibration windows ``ids`` (n, T): block i's inputs come from the blocks already
    tuned (as the model will run), its target from the float model on the float inputs
    (OmniQuant / EfficientQAT). Returns ``(frozen copy with GroupQuantLinear layers, seconds)``;
    ``log`` collects each block's loss curve."""
    check_bits(bits) if mode != "ternary" else None
    cal.check_model(model, bits, group_size)
    t0 = time.perf_counter()
    qmodel = copy.deepcopy(model).requires_grad_(False)
    fp_layers = list(model.model.layers)
    layers = list(qmodel.model.layers)[:n_blocks]
    cos, sin = model.rope(0, ids.shape[1])                                   # (T, hd) each
    with torch.no_grad():
        x_fp = torch.cat([model.model.embed_tokens(ids[i:i + 8])
                          for i in range(0, ids.shape[0], 8)])               # (n, T, D)
    x_q = x_fp.clone()
    from tqdm.auto import tqdm
    for i, block in enumerate(tqdm(layers, desc=f"blocks W{bits}", disable=not progress,
                                   leave=False)):
        y_fp = cal.run_block(fp_layers[i], x_fp, cos, sin, 8)               # the target
        block.requires_grad_(True)
        losses = tune_block(block, x_q, y_fp, cos, sin, bits, group_size, mode, steps, lr,
                            scale_lr, batch, train_weight, seed=i)
        block.requires_grad_(False)
        if log is not None:
            log.append(losses)
        with torch.no_grad():
            x_q = cal.run_block(block, x_q, cos, sin, 8)
        x_fp = y_fp
    return freeze(qmodel, inplace=True), time.perf_counter() - t0


# ----------------------------------------------------------------------------- the tables
#: The settings of the committed runs and of the lessons' short live runs. Bundled: QAT from
#: the pretrained checkpoint on random windows of the training split, distilling the float
#: model's next-byte distributions (LLM-QAT's loss), scored on the held-out text against the
#: float model; RTN and GPTQ (lesson 06's calibration) on the same grid. SmolLM2: block by
#: block on calibration windows of the clean protocol's calibration text, scored on its
#: evaluation text (course_lib.smollm.PROTOCOLS: the two share no 50-character run).
#: ``python -m course_lib.experiments.qat_tables --model smollm2`` writes results/qat_smollm2.json
#: (it refuses until the methods table it copies rows from is on the same protocol).
PROTOCOL = "clean"
SETTINGS = {
    "bundled": {"group_size": 32, "bits": (4, 3, 2, "ternary"), "steps": 200, "batch": 8,
                "ctx": 128, "lr": 1e-4, "scale_lr": None, "eval_windows": 32, "eval_window": 256,
                "curve_windows": 8, "eval_every": 40, "calib_windows": 32, "calib_window": 256,
                "slice": {"bits": 3, "steps": 40, "batch": 8, "ctx": 128, "eval_windows": 8,
                          "eval_every": 20}},
    "smollm2": {"group_size": 32, "bits": (3, 2), "steps": 200, "batch": 2, "lr": 1e-4,
                "scale_lr": 1e-3, "calib_windows": 16, "calib_window": 512, "eval_windows": 8,
                "eval_window": 512, "n_blocks": None, "methods_2bit": ("gptq", "gptq+act", "awq"),
                "export_windows": 1,
                "slice": {"bits": 3, "steps": 40, "n_blocks": 1, "calib_windows": 4,
                          "eval_windows": 1}},
}


def label(bits) -> str:
    """'int4', 'int3', 'int2' or 'ternary'."""
    return "ternary" if bits == "ternary" else f"int{bits}"


def bits_per_weight(bits, group_size: int) -> float:
    """Storage per weight at an ideal packing: codes + a 16-bit step per group; ternary:
    log2(3) bits (the information in a trit, one scale per tensor neglected). What real files
    charge is :func:`gguf_bits_per_weight` (ternary: TQ1_0 1.6875, TQ2_0 2.0625)."""
    if bits == "ternary":
        return math.log2(3)
    return bits + 16 / group_size


#: llama.cpp block formats that can hold a symmetric low-bit grid, as laid out in
#: ``ggml/src/ggml-common.h`` of the llama.cpp vendored in the llama-cpp-python 0.3.36 sdist
#: (QK_K = 256 at line 89): name -> (weights per block, {field: bytes}). Q4_0 (lines 194-199):
#: ``d`` (fp16) and ``qs[QK4_0 / 2]``, QK4_0 = 32; Q2_0 (lines 187-192): ``d`` and
#: ``qs[QK2_0 / 4]``, QK2_0 = 64, codes -1..2; TQ1_0 (lines 275-281):
#: ``qs[(QK_K - 4 * QK_K / 64) / 5]`` (5 trits per byte, 3^5 = 243 < 256), ``qh[QK_K / 64]``
#: (4 trits per byte) and ``d``; TQ2_0 (lines 283-288): ``qs[QK_K / 4]`` (2 bits per trit)
#: and ``d``. Each struct's size is pinned there by a static_assert.
GGML_BLOCKS = {
    "Q4_0": (32, {"d": 2, "qs": 32 // 2}),
    "Q2_0": (64, {"d": 2, "qs": 64 // 4}),
    "TQ1_0": (256, {"qs": (256 - 4 * 256 // 64) // 5, "qh": 256 // 64, "d": 2}),
    "TQ2_0": (256, {"qs": 256 // 4, "d": 2}),
}


def gguf_bits_per_weight(name: str) -> float:
    """Bits per weight of a llama.cpp block format of :data:`GGML_BLOCKS`: the bytes of its
    fields times 8 over the weights per block (TQ1_0: 54 bytes per 256 = 1.6875)."""
    if name not in GGML_BLOCKS:
        raise ValueError(f"unknown block format {name!r}; known: {', '.join(GGML_BLOCKS)}")
    n, fields = GGML_BLOCKS[name]
    return 8 * sum(fields.values()) / n


def results_path(model_name: str) -> Path:
    if model_name not in SETTINGS:
        raise ValueError(f"unknown model {model_name!r}; known: {', '.join(SETTINGS)}")
    return RESULTS_DIR / f"qat_{model_name}.json"


def load_results(model_name: str) -> dict:
    """The committed table results/qat_<model>.json."""
    path = results_path(model_name)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python -m "
                                f"course_lib.experiments.qat_tables --model {model_name}`")
    return json.loads(path.read_text())


def find(rows: list[dict], method: str, bits) -> dict:
    """The row of one method at one width (4, 3, 2 or "ternary")."""
    for r in rows:
        if r["method"] == method and r["bits"] == bits:
            return r
    raise KeyError(f"no row {method} {label(bits)}")


def _scores(model, ref, spread: bool = False) -> dict:
    """The four means of ``model`` on ``ref`` (rounded); ``spread`` (SmolLM2's table): also
    each window's figures and bootstrap intervals (``course_lib.protocol.score``)."""
    from course_lib import eval as ceval
    from course_lib import protocol
    r = protocol.score(model, ref) if spread else ceval.compare(model, ref)
    out = {k: round(float(r[k]), 6) for k in ("bits_per_byte", "perplexity", "kl_nats",
                                                 "top1_agreement")}
    if spread:
        out.update(windows=r["windows"], interval=r["interval"])
    return out


@torch.no_grad()
def ternary_rtn(model: nn.Module) -> nn.Module:
    """BitNet's absmean rounding applied once to a trained model, no training (the PTQ
    baseline of the ternary row)."""
    return freeze(prepare_qat(model, mode="ternary"))


def bundled_run(model, bits, st: dict, corpus, ref_curve, steps=None, progress=False):
    """One QAT run of the bundled model at ``bits`` (4, 3, 2 or "ternary"):
    (QAT model, learning curve)."""
    mode = "ternary" if bits == "ternary" else "lsq"
    q = prepare_qat(model, 2 if bits == "ternary" else bits, st["group_size"], mode)

    def evaluate(m):
        from course_lib import eval as ceval
        r = ceval.compare(m, ref_curve)
        return {"kl_nats": round(float(r["kl_nats"]), 6),
                "top1_agreement": round(float(r["top1_agreement"]), 6)}

    curve = train_qat(q, corpus, steps or st["steps"], lr=st["lr"], scale_lr=st["scale_lr"],
                      batch=st["batch"], ctx=st["ctx"], teacher=model, evaluate=evaluate,
                      eval_every=st["eval_every"], progress=progress, desc=f"QAT {label(bits)}")
    return q, curve


def bundled_slice(model, corpus) -> dict:
    """The short run lesson 15 repeats live (``SETTINGS['bundled']['slice']``): its held-out
    KL and top-1 before and after, on the first ``eval_windows`` windows."""
    from course_lib import data
    from course_lib import eval as ceval
    st = SETTINGS["bundled"]
    sl = st["slice"]
    W = st["eval_window"]
    ref = ceval.reference(model, data.heldout_text(sl["eval_windows"] * W + 1), window=W)
    short = {**st, **sl}
    q, curve = bundled_run(model, sl["bits"], short, corpus, ref)
    return {**sl, "curve": [[s, h] for s, h in curve.heldout],
            "loss": [[s, round(v, 6)] for s, v in curve.loss], "seconds": round(curve.seconds, 1)}


def smollm2_slice(model) -> dict:
    """What lesson 15 runs live on SmolLM2: one block tuned at 3 bits on a few windows, its
    relative output error before and after, and the model's KL on one window."""
    from course_lib import smollm
    st = SETTINGS["smollm2"]
    sl = st["slice"]
    ids = cal.calibration_ids("smollm2", sl["calib_windows"], st["calib_window"],
                              protocol=PROTOCOL)
    ref = smollm.reference(model, sl["eval_windows"], st["eval_window"], protocol=PROTOCOL)
    log: list = []
    qm, secs = blockwise_qat(model, ids, sl["bits"], st["group_size"], steps=sl["steps"],
                             lr=st["lr"], scale_lr=st["scale_lr"], batch=st["batch"],
                             n_blocks=sl["n_blocks"], log=log)
    rtn = cal.rtn_model(model, sl["bits"], st["group_size"], n_blocks=sl["n_blocks"])
    return {**sl, "block_loss": [round(log[0][0], 6), round(log[0][-1], 6)],
            "qat": _scores(qm, ref), "rtn": _scores(rtn, ref), "seconds": round(secs, 1)}
