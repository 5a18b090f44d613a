"""A learned rotation, small: SpinQuant's idea on one block of the course's model (taught in
lesson 16).

QuaRot (lesson 16, :mod:`course_lib.rotate`) rotates the residual stream with a RANDOM Hadamard
matrix. SpinQuant (Liu et al., ICLR 2025, arXiv 2405.16406, section 3) observes that random
rotations differ in how well the rotated model quantizes, and LEARNS the rotations that fuse
into the weights (its R1 on the residual stream and R2 per attention head), by minimising the
quantized network's loss with the rounding passed straight through (the straight-through
estimator of lesson 15) while the matrices stay orthogonal: it updates them with Cayley SGD on
the Stiefel manifold (the set of orthogonal matrices), so that no step leaves it.

Here the same idea at the size of one block, fast enough to train live on a CPU:

- the rotation is PARAMETERISED so that it is orthogonal whatever the parameters are:
  Q = Q0 @ cayley(A), with Q0 = ``random_hadamard(n, seed)`` (QuaRot's R1, where training
  starts), A = (P - P^T) / 2 skew-symmetric, and the Cayley transform
  cayley(A) = (I - A)^-1 (I + A), orthogonal for every skew-symmetric A and equal to I at
  A = 0. P starts at 0, so step 0 is the random Hadamard exactly. Any optimiser can then
  train P (Adam here); SpinQuant's Cayley SGD instead moves Q along the manifold with the
  same transform, a different route to the same constraint;
- the objective is the W4A4 output error of ONE block's Linears that read the residual
  stream: its attention inputs (q_proj, k_proj, v_proj) and MLP inputs (gate_proj, up_proj),
  after RMSNorm with the norm's scale folded into the weights (:func:`course_lib.rotate.fold_norms`).
  With the basis Q those Linears compute fq(n Q) fq(W Q)^T, where fq is per-token INT4 for
  the activations and per-output-channel INT4 for the weights (or weights left in float,
  ``w_bits=None``, as SpinQuant does before GPTQ), against the float n W^T: the relative
  squared error, summed over the five Linears' outputs (:func:`block_quant_error`). The
  rounding passes the gradient straight through (:func:`fake_quant_ste`);
- the inputs n come from calibration text (:func:`capture_block_inputs`), the score from
  held-out text, never the same tokens.

SpinQuant trains one R1 for the whole model on the network's final loss; a rotation trained on
one block fits that block's inputs and is a lesson-sized picture of the idea, not a
replacement for the full run. The full run, small, is :func:`train_rotation_model`: the whole
model (:func:`trainable_model`: norms folded, R2 and R4 fixed, every block Linear's input in
INT4, weights float) trained on its next-token loss from the same random Hadamard; the module
command ``python -m course_lib.experiments.spinquant_full`` runs it on SmolLM2 and scores the
learned R1 against the random one (``results/spinquant_smollm2.json``, read by
:func:`load_record`).

    X = capture_block_inputs(model, calib_ids, layer=5)          # calibration tokens
    W = block_weights(model, layer=5)
    rot, history = train_rotation(X, W, steps=30, seed=0)         # from random_hadamard(576, 0)
    Q = rot.matrix()                                              # (576, 576) float64, orthogonal
    rotate.rotate_residual(rotate.fold_norms(model), Q)           # the same model, new basis
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn as nn

from course_lib import quant
from course_lib.hadamard import orthogonality_error, random_hadamard
from course_lib.model import LlamaModel

#: The five Linears of a block that read the (normalised) residual stream, by input.
ATTN_READERS = ("q_proj", "k_proj", "v_proj")
MLP_READERS = ("gate_proj", "up_proj")

#: Tolerance on A + A^T for a matrix handed to :func:`cayley` as skew-symmetric (relative to
#: the largest |A|, or absolute for a small A).
SKEW_ATOL = 1e-6


# ----------------------------------------------------------------------------- argument checks
def _whole(name: str, v, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ValueError(f"{name} must be a whole number {rng}; got {v!r}")
    return v


def _bits(name: str, v, allow_none: bool = False):
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 2 <= v <= 8:
        extra = " or None (kept in float)" if allow_none else ""
        raise ValueError(f"{name} must be a whole number of bits in 2..8{extra}; got {v!r}")
    return v


def _float_matrix(name: str, t, square: bool = False) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point torch tensor; got "
                        f"{getattr(t, 'dtype', type(t).__name__)}")
    if t.dim() != 2 or (square and t.shape[0] != t.shape[1]):
        want = "square (n, n)" if square else "2-D"
        raise ValueError(f"{name} must be a {want} matrix; got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"{name} is empty")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} holds NaN or inf")
    return t


# ----------------------------------------------------------------------------- the Cayley map
def skew(P: torch.Tensor) -> torch.Tensor:
    """(P - P^T) / 2: the skew-symmetric part of a square matrix (lesson 16). A^T = -A."""
    _float_matrix("P", P, square=True)
    return (P - P.T) / 2


def cayley(A: torch.Tensor) -> torch.Tensor:
    """The Cayley transform (I - A)^-1 (I + A) of a skew-symmetric A, (n, n) (lesson 16).

    Orthogonal for every skew-symmetric A (the eigenvalues of A are imaginary, so I - A is
    always invertible, and (I - A)^-1 (I + A) maps the unit circle to itself), equal to I at
    A = 0, and differentiable: gradients flow to A. Computed in A's dtype with one linear
    solve. A that is not square, not finite or not skew-symmetric (|A + A^T| above
    :data:`SKEW_ATOL` times max(1, max|A|)) raises ValueError; build one with :func:`skew`.
    """
    _float_matrix("A", A, square=True)
    with torch.no_grad():
        asym = float((A + A.T).abs().max())
        size = max(1.0, float(A.abs().max()))
    if asym > SKEW_ATOL * size:
        raise ValueError(f"A must be skew-symmetric (A^T = -A) for its Cayley transform to be a "
                         f"rotation: max |A + A^T| = {asym:.2e}. Take its skew-symmetric part "
                         f"with spinquant.skew(P) = (P - P^T) / 2")
    eye = torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
    return torch.linalg.solve(eye - A, eye + A)                        # (n, n)


class LearnedRotation(nn.Module):
    """Q = Q0 @ cayley(skew(P)): an orthogonal (n, n) whose parameter P is free (lesson 16).

    Q0 = ``random_hadamard(n, seed)`` (the random Hadamard QuaRot uses) unless ``Q0`` is given
    (any orthogonal (n, n), checked to 1e-5). P starts at zero, so Q starts at Q0 exactly.
    ``forward()`` returns Q in P's dtype (float32: orthogonal to about 1e-6);
    :meth:`matrix` recomputes it in float64 (orthogonal to about 1e-14), the form to fuse
    into a model with :func:`course_lib.rotate.rotate_residual`.
    """

    def __init__(self, n: int, seed: int = 0, Q0: torch.Tensor | None = None):
        super().__init__()
        _whole("n", n, 1)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be a whole number (the random Hadamard's signs); "
                             f"got {seed!r}")
        if Q0 is None:
            Q0 = random_hadamard(n, seed, torch.float64)
        else:
            _float_matrix("Q0", Q0, square=True)
            if Q0.shape[0] != n:
                raise ValueError(f"Q0 must be ({n}, {n}); got {tuple(Q0.shape)}")
            err = orthogonality_error(Q0)
            if err > 1e-5:
                raise ValueError(f"Q0 is not orthogonal (max |Q0 Q0^T - I| = {err:.2e}): "
                                 f"training would start from a matrix that changes the model. "
                                 f"Use hadamard.random_hadamard(n, seed), or orthonormalise "
                                 f"with torch.linalg.qr")
            Q0 = Q0.detach().double()
        self.n, self.seed = n, seed
        self.register_buffer("Q0", Q0.float())                         # (n, n)
        self.register_buffer("Q0_64", Q0.clone(), persistent=False)    # (n, n) float64
        self.P = nn.Parameter(torch.zeros(n, n))                       # (n, n) free

    def forward(self) -> torch.Tensor:
        return self.Q0.to(self.P.dtype) @ cayley(skew(self.P))        # (n, n)

    @torch.no_grad()
    def matrix(self) -> torch.Tensor:
        """Q in float64, detached: (n, n), orthogonal to rounding."""
        return self.Q0_64 @ cayley(skew(self.P.detach().double()))

    def extra_repr(self) -> str:
        return f"n={self.n}, seed={self.seed}"


# ----------------------------------------------------------------------------- fake quantization
def fake_quant_ste(x: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """Symmetric absmax fake quantization along the last dim, gradient straight through
    (lesson 16; lesson 15's STE).

    The forward value is the course's per-token rule (``quant.fake_quantize(x, "int<bits>",
    "per_token")``, lessons 02 and 08): per row (a token of activations, an output channel of a
    weight) scale = max|x| / qmax (7 at 4 bits), x -> scale * round(x / scale), half to even; an
    all-zero row stays zero. Nothing is clipped (absmax), so the backward pass is the identity.
    x: (..., n) float; returns x's shape and dtype.
    """
    _bits("bits", bits)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point torch tensor; got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    q = quant.fake_quantize(x.detach(), f"int{bits}", "per_token")          # (..., n)
    return x + (q - x).detach()                                         # value q, gradient 1


def fake_quant_scale_ste(x: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """The same per-token rule as :func:`fake_quant_ste`, with the gradient through the scale
    as well (lesson 16; SpinQuant's quantizer): s * round(x / s), s = max|x_row| / qmax, only
    ``round`` passed straight through. The value is identical; the backward pass now sees that
    a larger max|x| makes every step of the row coarser, which is what a rotation changes."""
    _bits("bits", bits)
    qmax = 2 ** (bits - 1) - 1
    s = x.abs().amax(-1, keepdim=True) / qmax                            # (..., 1)
    s = torch.where(s == 0, torch.ones_like(s), s)
    z = x / s
    return s * (z + (torch.round(z) - z).detach())                      # round half to even


def _check_parts(X, W) -> None:
    for name, d in (("X", X), ("W", W)):
        if not isinstance(d, dict) or set(d) != {"attn", "mlp"}:
            raise ValueError(f"{name} must be a dict with keys 'attn' and 'mlp' (from "
                             f"capture_block_inputs / block_weights); got "
                             f"{sorted(d) if isinstance(d, dict) else type(d).__name__}")
    for part in ("attn", "mlp"):
        x, w = _float_matrix(f"X[{part!r}]", X[part]), _float_matrix(f"W[{part!r}]", W[part])
        if x.shape[1] != w.shape[1]:
            raise ValueError(f"X[{part!r}] {tuple(x.shape)} and W[{part!r}] {tuple(w.shape)} "
                             f"must have the same number of columns (the hidden size)")


def _error(Q, X, W, refs, a_bits, w_bits) -> torch.Tensor:
    total = Q.new_zeros(())
    for part in ("attn", "mlp"):
        x, w = X[part].to(Q.dtype), W[part].to(Q.dtype)
        xq = fake_quant_ste(x @ Q, a_bits)                              # (N, D) rotated tokens
        wq = w @ Q if w_bits is None else fake_quant_ste(w @ Q, w_bits)  # (out, D)
        ref = refs[part]                                                # (N, out) float output
        total = total + (xq @ wq.T - ref).pow(2).sum() / ref.pow(2).sum()
    return total


def _refs(X, W, dtype) -> dict:
    with torch.no_grad():
        return {p: X[p].to(dtype) @ W[p].to(dtype).T for p in ("attn", "mlp")}  # (N, out)


def block_quant_error(Q: torch.Tensor, X: dict, W: dict, a_bits: int = 4,
                      w_bits: int | None = 4) -> torch.Tensor:
    """The quantized block's relative output error in the basis Q, a 0-d tensor (lesson 16).

    X: {"attn": (N, D), "mlp": (M, D)} normalised inputs (:func:`capture_block_inputs`);
    W: {"attn": (out_a, D), "mlp": (out_m, D)} folded weights (:func:`block_weights`).
    For each: ||fq_a(X Q) fq_w(W Q)^T - X W^T||^2 / ||X W^T||^2, summed over the two
    (fq: :func:`fake_quant_ste`; ``w_bits=None`` keeps the weights in float).
    Differentiable in Q (the rounding passes the gradient straight through). With Q = I it is
    the unrotated block's error.
    """
    _float_matrix("Q", Q, square=True)
    _bits("a_bits", a_bits)
    _bits("w_bits", w_bits, allow_none=True)
    _check_parts(X, W)
    if X["attn"].shape[1] != Q.shape[0]:
        raise ValueError(f"Q is {tuple(Q.shape)} but the inputs have {X['attn'].shape[1]} "
                         f"columns: Q must be (hidden_size, hidden_size)")
    return _error(Q, X, W, _refs(X, W, Q.dtype), a_bits, w_bits)


# ----------------------------------------------------------------------------- one block's data
def _check_layer(model, layer) -> int:
    if not isinstance(model, LlamaModel):
        raise TypeError(f"model must be a course LlamaModel (smollm.load() or "
                        f"model.load_pretrained()); got {type(model).__name__}")
    if getattr(model, "rotation_steps", None):
        raise ValueError(f"this model is already rotated ({model.rotation_steps}): learn the "
                         f"rotation on the original model, then fold and rotate a copy")
    n = model.config.num_hidden_layers
    return _whole("layer", layer, 0, n - 1)


@torch.no_grad()
def capture_block_inputs(model: LlamaModel, ids: torch.Tensor, layer: int,
                         batch_size: int = 4) -> dict[str, torch.Tensor]:
    """The normalised inputs of block ``layer``'s Linears on ``ids`` (lesson 16).

    {"attn": (tokens, D), "mlp": (tokens, D)}: what input_layernorm and
    post_attention_layernorm give with their scale folded away (x / rms(x), in float32, as
    the model's RMSNorm computes it), i.e. what q/k/v and gate/up read once the norms are
    folded. ids: (B, T) or (T,) token ids; use calibration text to train, held-out text to
    score.
    """
    layer = _check_layer(model, layer)
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.dtype == torch.bool:
        raise TypeError(f"ids must be an integer tensor of token ids (B, T); got "
                        f"{getattr(ids, 'dtype', type(ids).__name__)}")
    if ids.numel() == 0:
        raise ValueError("ids is empty: give the model some calibration tokens")
    _whole("batch_size", batch_size, 1)
    ids = ids[None] if ids.dim() == 1 else ids
    block = model.model.layers[layer]
    store: dict[str, list[torch.Tensor]] = {"attn": [], "mlp": []}

    def grab(part):
        def hook(norm, inputs, output):
            x = inputs[0].float()                                       # (b, T, D)
            n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
            store[part].append(n.reshape(-1, n.shape[-1]))
        return hook

    handles = [block.input_layernorm.register_forward_hook(grab("attn")),
               block.post_attention_layernorm.register_forward_hook(grab("mlp"))]
    try:
        for i in range(0, ids.shape[0], batch_size):
            model(ids[i:i + batch_size])
    finally:
        for h in handles:
            h.remove()
    return {k: torch.cat(v) for k, v in store.items()}                  # (tokens, D) each


@torch.no_grad()
def block_weights(model: LlamaModel, layer: int) -> dict[str, torch.Tensor]:
    """Block ``layer``'s reader weights with the norm scales folded in, float32 (lesson 16).

    {"attn": cat(q, k, v) diag(g_in), (q + 2 kv, D); "mlp": cat(gate, up) diag(g_post),
    (2 F, D)}: the matrices :func:`course_lib.rotate.fold_norms` would leave there. The model
    is not changed.
    """
    layer = _check_layer(model, layer)
    block = model.model.layers[layer]
    att, mlp = block.self_attn, block.mlp
    for name in ATTN_READERS + MLP_READERS:
        lin = getattr(att if name in ATTN_READERS else mlp, name)
        if type(lin) is not nn.Linear:
            raise TypeError(f"layer {layer}'s {name} is a {type(lin).__name__}, not a plain "
                            f"nn.Linear: learn the rotation on the float model")
    g_in = block.input_layernorm.weight.float()                         # (D,)
    g_post = block.post_attention_layernorm.weight.float()              # (D,)
    w_attn = torch.cat([getattr(att, n).weight.float() for n in ATTN_READERS]) * g_in
    w_mlp = torch.cat([getattr(mlp, n).weight.float() for n in MLP_READERS]) * g_post
    return {"attn": w_attn, "mlp": w_mlp}


# ----------------------------------------------------------------------------- training
def train_rotation(X: dict, W: dict, steps: int = 30, lr: float = 1e-4, seed: int = 0,
                   a_bits: int = 4, w_bits: int | None = 4, Q0: torch.Tensor | None = None,
                   progress: bool = False) -> tuple[LearnedRotation, list[float]]:
    """Train Q = Q0 @ cayley(skew(P)) to lower :func:`block_quant_error` on X (lesson 16).

    Adam on P for ``steps`` full-batch steps (X is a few hundred calibration tokens), its
    learning rate decayed to 0 on a cosine; each step moves every entry of P by about ``lr``,
    and 1e-4 is what held-out error liked on SmolLM2's block 5 (2e-3 made it worse than the
    start). Starts at Q0 = random_hadamard(D, seed) (or ``Q0``). Returns the rotation and
    the loss before each step, plus the loss after the last one (``steps + 1`` values). The
    rotation stays orthogonal whatever the steps do (asserted in tests/test_spinquant.py).
    """
    _whole("steps", steps, 1)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 1:
        raise ValueError(f"lr must be a number in (0, 1), e.g. 1e-4; got {lr!r}")
    _bits("a_bits", a_bits)
    _bits("w_bits", w_bits, allow_none=True)
    _check_parts(X, W)
    rot = LearnedRotation(X["attn"].shape[1], seed, Q0)
    refs = _refs(X, W, torch.float32)
    opt = torch.optim.Adam(rot.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    history = []
    it = range(steps)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="learning the rotation", leave=False)
    for _ in it:
        loss = _error(rot(), X, W, refs, a_bits, w_bits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        history.append(float(loss.detach()))
    with torch.no_grad():
        history.append(float(_error(rot(), X, W, refs, a_bits, w_bits)))
    if not all(math.isfinite(h) for h in history):
        raise FloatingPointError(f"the loss became non-finite ({history[-3:]}); lower lr")
    return rot, history


# ----------------------------------------------------------------------------- the whole model
class _Basis:
    """The rotation being learned, shared by every reader of the residual stream: the current
    Q (set once per step) and the last rotated, quantized input (q, k, v read one tensor;
    gate and up another), so each is rotated and rounded once."""

    def __init__(self, a_bits: int, fq=None):
        self.a_bits, self.Q, self.fq = a_bits, None, fq or fake_quant_scale_ste
        self.x = self.xq = None

    def rotated_input(self, x: torch.Tensor) -> torch.Tensor:
        if x is not self.x:
            self.x, self.xq = x, self.fq(x.float() @ self.Q, self.a_bits)
        return self.xq


class _LearnedReader(nn.Module):
    """q/k/v/gate/up of the norm-folded model seen in the learned basis: fq(x Q) (W Q)^T, which
    is x W^T when nothing is rounded (lesson 16: the reader's weight W Q, its input x Q)."""

    def __init__(self, linear: nn.Linear, basis: _Basis, w_bits: int | None):
        super().__init__()
        self.weight, self.bias, self.basis, self.w_bits = linear.weight, linear.bias, basis, w_bits

    def forward(self, x):                                                # (..., D)
        w = self.weight.float() @ self.basis.Q                           # (out, D) W Q
        if self.w_bits is not None:
            w = self.basis.fq(w, self.w_bits)
        return nn.functional.linear(self.basis.rotated_input(x), w, self.bias)


class _QuantInput(nn.Module):
    """o_proj / down_proj: the input rounded per token (gradient straight through), W float or
    rounded per output channel."""

    def __init__(self, linear: nn.Linear, a_bits: int, w_bits: int | None, fq):
        super().__init__()
        w = linear.weight.detach().float()
        self.weight = w if w_bits is None else quant.fake_quantize(w, f"int{w_bits}", "per_channel")
        self.bias, self.a_bits, self.fq = linear.bias, a_bits, fq

    def forward(self, x):
        return nn.functional.linear(self.fq(x.float(), self.a_bits), self.weight, self.bias)


class _MatrixRotation(nn.Module):
    """R4 as a plain matmul x @ R (the same matrix as the online fwht; autograd-friendly)."""

    def __init__(self, R: torch.Tensor):
        super().__init__()
        self.register_buffer("R", R.float())

    def forward(self, x):
        return x.float() @ self.R


def trainable_model(model: LlamaModel, a_bits: int = 4, w_bits: int | None = None,
                    scale_grad: bool = True) -> tuple[LlamaModel, _Basis]:
    """SmolLM2 (or the bundled model) as SpinQuant trains it, with R1 left open (lesson 16).

    A copy of ``model`` with the norms folded, R2 fused into v_proj / o_proj and R4 online on
    down_proj's input (QuaRot's fixed rotations, :func:`course_lib.rotate.quarot`'s steps
    but R1 and R3), every block Linear's input rounded per token to ``a_bits`` and the
    weights kept in float (``w_bits=None``: SpinQuant's advice when GPTQ quantizes the
    weights afterwards) or rounded per output channel. The readers of the residual stream
    (q, k, v, gate, up) compute fq(x Q) (W Q)^T with Q = ``basis.Q``, to be set before each
    forward: in exact arithmetic the model ``rotate.quarot(model, Q=Q)`` quantized as
    ``rotation_table``'s row ``a4`` (``w4a4`` with ``w_bits=4``). R3 is left out: it moves no
    Linear's input, only the KV cache. Every parameter is frozen. ``scale_grad``: the rounding
    passes its gradient through the per-token scale too (:func:`fake_quant_scale_ste`, as
    SpinQuant's quantizer does), or not (:func:`fake_quant_ste`): without it the gradient cannot
    see that a rotation lowers a token's max |x|, and on SmolLM2 two batches' gradients are
    nearly unrelated (:func:`gradient_coherence`).
    """
    from course_lib import rotate
    _bits("a_bits", a_bits)
    _bits("w_bits", w_bits, allow_none=True)
    if not isinstance(model, LlamaModel):
        raise TypeError(f"model must be a course LlamaModel; got {type(model).__name__}")
    if getattr(model, "rotation_steps", None):
        raise ValueError(f"this model is already rotated ({model.rotation_steps}): learn the "
                         f"rotation on the original float model")
    m = rotate.online_down_proj(rotate.rotate_values(rotate.fold_norms(model)))
    m.requires_grad_(False)
    if not isinstance(scale_grad, bool):
        raise TypeError(f"scale_grad must be True or False; got {scale_grad!r}")
    fq = fake_quant_scale_ste if scale_grad else fake_quant_ste
    basis = _Basis(a_bits, fq)
    for block in m.model.layers:
        att, mlp = block.self_attn, block.mlp
        for parent, names in ((att, ATTN_READERS), (mlp, MLP_READERS)):
            for name in names:
                setattr(parent, name, _LearnedReader(getattr(parent, name), basis, w_bits))
        att.o_proj = _QuantInput(att.o_proj, a_bits, w_bits, fq)
        mlp.down_rotation = _MatrixRotation(mlp.down_rotation.matrix(torch.float32))
        mlp.down_proj = _QuantInput(mlp.down_proj, a_bits, w_bits, fq)
    return m, basis


def _lm_loss(m: LlamaModel, ids: torch.Tensor, teacher: LlamaModel | None = None
             ) -> torch.Tensor:
    """Next-token cross-entropy of ``m`` on ``ids`` (B, T), or with a ``teacher`` (the float
    model) the KL divergence from the teacher's next-token distribution, nats per token."""
    logits = m(ids)[:, :-1].float()                                      # (B, T-1, V)
    if teacher is None:
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           ids[:, 1:].reshape(-1))
    with torch.no_grad():
        p = torch.log_softmax(teacher(ids)[:, :-1].float(), -1)          # (B, T-1, V)
    q = torch.log_softmax(logits, -1)
    return (p.exp() * (p - q)).sum(-1).mean()


def gradient_coherence(model: LlamaModel, ids: torch.Tensor, batch: int = 2,
                       scale_grad: bool = True, seed: int = 0) -> list[float]:
    """How much two batches agree on where to move R1 (lesson 16): the gradient of the W16A4
    model's KL (:func:`trainable_model`) with respect to P at the random Hadamard, on each
    ``batch`` windows of ``ids`` (n, T), and the cosine between every two of them. Near 0:
    each batch points somewhere else, and a few steps learn noise; near 1: they agree."""
    _whole("batch", batch, 1)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or len(ids) < 2 * batch:
        raise ValueError(f"ids must be (n, T) token windows with n >= 2 * batch = {2 * batch}")
    m, basis = trainable_model(model, scale_grad=scale_grad)
    rot = LearnedRotation(model.config.hidden_size, seed)
    grads = []
    for i in range(0, len(ids) - batch + 1, batch):
        basis.Q, rot.P.grad = rot(), None
        _lm_loss(m, ids[i:i + batch], model).backward()
        grads.append(skew(rot.P.grad).flatten())
        basis.x = basis.xq = None
    return [float(torch.nn.functional.cosine_similarity(a, b, 0))
            for i, a in enumerate(grads) for b in grads[i + 1:]]


def loss_along_gradient(model: LlamaModel, grad_ids: torch.Tensor, val_ids: torch.Tensor,
                        etas=(0.003, 0.03), seed: int = 0) -> dict:
    """The W16A4 model's KL (:func:`trainable_model`) at P = -eta * g, g the gradient at the
    random Hadamard on ``grad_ids`` (lesson 16): on those same windows and on ``val_ids``, for
    eta = 0 and each of ``etas``. Where the gradient predicts the loss, a small step lowers
    the loss on the windows it came from; on a rough landscape it need not."""
    m, basis = trainable_model(model)
    rot = LearnedRotation(model.config.hidden_size, seed)
    basis.Q = rot()
    _lm_loss(m, grad_ids, model).backward()
    g = rot.P.grad.detach().clone()
    basis.x = basis.xq = None

    def mean_kl(ids):
        return float(sum(_lm_loss(m, ids[i:i + 1], model) for i in range(len(ids))) / len(ids))

    out = []
    for eta in (0.0,) + tuple(etas):
        with torch.no_grad():
            rot.P.copy_(-eta * g)
            basis.Q = rot()
            out.append({"eta": eta, "step_norm": float(eta * g.norm()),
                        "kl_grad_windows": mean_kl(grad_ids), "kl_val_windows": mean_kl(val_ids)})
        basis.x = basis.xq = None
    return {"grad_norm": float(g.norm()), "points": out}


def train_rotation_model(model: LlamaModel, train_ids: torch.Tensor, val_ids: torch.Tensor,
                         steps: int = 40, lr: float = 1e-4, batch: int = 2, seed: int = 0,
                         a_bits: int = 4, w_bits: int | None = None, val_every: int = 10,
                         objective: str = "kl", optimizer: str = "sgd",
                         progress: bool = False) -> tuple[LearnedRotation, dict]:
    """Learn R1 for the WHOLE model on its quantized next-token loss (SpinQuant's run, small;
    lesson 16's module command ``course_lib.experiments.spinquant_full``).

    The model of :func:`trainable_model`; Q = random_hadamard(D, seed) @ cayley(skew(P)) with
    P trained by Adam (cosine to 0) on ``train_ids`` (n, T), ``batch`` windows a step,
    cycling. ``objective``: ``"kl"``, the KL divergence of the quantized model's next-token
    distribution from the float model's (what the course's tables score), or ``"ce"``, the
    next-token cross-entropy that SpinQuant's script trains (the transformers Trainer's loss,
    with Cayley SGD, 100 steps of 8 x 2048 tokens). ``optimizer``: ``"sgd"`` (momentum 0.9:
    each step follows the gradient's size, as SpinQuant's Cayley SGD does) or ``"adam"`` (as
    :func:`train_rotation`; on the whole model it moves every entry of P by about ``lr`` a
    step, most of them along directions the noisy small-batch gradient barely supports).
    Every ``val_every`` steps (and at 0 and the end) the same loss on ``val_ids`` (more
    calibration windows, never evaluation text) is measured and the P with the lowest one is
    kept: early stopping on calibration text. Returns the rotation (at its best P) and the
    history: train losses per step, (step, validation loss) pairs, the best step, seconds.
    """
    import time
    _whole("steps", steps, 1)
    _whole("batch", batch, 1)
    _whole("val_every", val_every, 1)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 1:
        raise ValueError(f"lr must be a number in (0, 1), e.g. 1e-4; got {lr!r}")
    for name, ids in (("train_ids", train_ids), ("val_ids", val_ids)):
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
            raise ValueError(f"{name} must be token windows (n, T), an integer tensor; got "
                             f"{getattr(ids, 'shape', type(ids).__name__)}")
        model.check_ids(ids)
    if objective not in ("kl", "ce"):
        raise ValueError(f"objective must be 'kl' (from the float model) or 'ce' (next-token "
                         f"cross-entropy); got {objective!r}")
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' or 'adam'; got {optimizer!r}")
    teacher = model if objective == "kl" else None
    m, basis = trainable_model(model, a_bits, w_bits)
    rot = LearnedRotation(model.config.hidden_size, seed)
    opt = (torch.optim.SGD(rot.parameters(), lr=lr, momentum=0.9) if optimizer == "sgd" else
           torch.optim.Adam(rot.parameters(), lr=lr))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)

    def validate() -> float:
        with torch.no_grad():
            basis.Q = rot()
            return float(sum(_lm_loss(m, val_ids[i:i + 1], teacher)
                             for i in range(len(val_ids))) / len(val_ids))

    t0 = time.perf_counter()
    train, val = [], [(0, validate())]
    best = (val[0][1], 0, rot.P.detach().clone())
    it = range(steps)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="learning R1 on the whole model", leave=False)
    for step in it:
        i = (step * batch) % len(train_ids)
        xb = torch.cat([train_ids, train_ids])[i:i + batch]               # (batch, T), cycling
        basis.Q = rot()
        loss = _lm_loss(m, xb, teacher)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        basis.x = basis.xq = None                                        # drop the graph
        train.append(float(loss.detach()))
        if not math.isfinite(train[-1]):
            raise FloatingPointError(f"the loss became non-finite at step {step}; lower lr")
        if (step + 1) % val_every == 0 or step + 1 == steps:
            v = validate()
            val.append((step + 1, v))
            if v < best[0]:
                best = (v, step + 1, rot.P.detach().clone())
        if progress:
            it.set_postfix(loss=f"{train[-1]:.3f}", val=f"{val[-1][1]:.3f}")
    with torch.no_grad():
        rot.P.copy_(best[2])
    return rot, {"train_loss": train, "val_loss": val, "best_step": best[1],
                 "seconds": round(time.perf_counter() - t0, 1)}


# ----------------------------------------------------------------------------- the full-model record
#: The command that learns R1 on the whole model and scores it (results/spinquant_<model>.json),
#: the rows it scores (``course_lib.rotation_table``'s), the random Hadamard seeds beside it and
#: its training defaults.
COMMAND = "python -m course_lib.experiments.spinquant_full"
ROWS = ("a4", "w4a4", "w4a4-gptq")
DEFAULT_ROWS = ("a4",)
SEEDS = (0, 1, 2)
TRAIN = {"steps": 8, "lr": 1e-3, "batch": 4, "val_every": 4, "a_bits": 4, "w_bits": None,
         "objective": "kl", "optimizer": "sgd",
         "train_windows": "3/4 of the calibration windows", "val_windows": "the last 1/4"}
RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"


def results_path(model_name: str) -> Path:
    """results/spinquant_<model>.json (``"smollm2"`` or ``"bundled"``)."""
    if model_name not in ("smollm2", "bundled"):
        raise ValueError(f"unknown model {model_name!r}; known: smollm2, bundled")
    return RESULTS_DIR / f"spinquant_{model_name}.json"


def load_record(model_name: str = "smollm2") -> dict:
    """The committed full-model record (lesson 16 reads it)."""
    path = results_path(model_name)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `{COMMAND} --model {model_name}`")
    return json.loads(path.read_text())
