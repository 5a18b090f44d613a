"""Rotations that keep a Llama model's function and spread its outliers: QuaRot on the course's
model (taught in lesson 16).

Computational invariance. RMSNorm divides by the root mean square, and an orthogonal Q keeps it:
rms(x Q) = rms(x). So once each norm's scale is folded into the Linears that read it
(:func:`fold_norms`), the whole residual stream can live in a rotated basis (R1):

    embeddings      E -> E Q                 (every token starts rotated)
    readers         W -> W Q                 q, k, v, gate, up, lm_head: (x Q)(W Q)^T = x W^T
    writers         W -> Q^T W, b -> b Q     o_proj, down_proj: their output lands rotated

and the logits do not change beyond rounding (:func:`rotate_residual`). Inside a block, two more
rotations cannot be fused into weights alone and run online, as a module the model calls. The
names R1..R4 are SpinQuant's (Liu et al., arXiv 2405.16406); QuaRot (Ashkboos et al., arXiv
2404.00456) uses the same places, with a random Hadamard for R1 and a plain one online (its
code, github.com/spcl/QuaRot ``fake_quant/rotation_utils.py``: ``rotate_model``,
``rotate_mlp_output``, ``QKRotationWrapper``):

    R4  the down_proj input, (B, T, F): fwht on F = 1536, down_proj's weight W -> W R
                                        (:func:`online_down_proj`, :class:`RotatedMLP`)
    R3  queries and keys after RoPE, per head (hd = 64): q.k is unchanged, the KV cache stores
        rotated keys (:func:`online_qk`, :class:`HadamardQKAttention`)

and one more that fuses offline, per head, into v_proj and o_proj (SpinQuant's R2,
:func:`rotate_values`). Every function returns a changed COPY and records what it did in the
copy's ``rotation_steps`` list; a step applied twice is refused.

Hook needed in model.py for R3: :class:`course_lib.model.Attention` applies RoPE and attends in
one ``forward`` with no call in between, so :class:`HadamardQKAttention` repeats that forward with
one line added. With ``self.qk_rotation = nn.Identity()`` in ``Attention.__init__`` and
``q, k = self.qk_rotation(q), self.qk_rotation(k)`` right after ``apply_rope``, the subclass
would shrink to setting that attribute.

:func:`incoherence` measures what the rotation buys: max |t| / rms(t) per row, between 1 (every
entry the same size) and sqrt(n) (one entry holds everything).
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.hadamard import factor, fwht, orthogonality_error, random_hadamard, random_signs
from course_lib.model import MLP, Attention, LlamaModel, RMSNorm, apply_rope

#: Default tolerance on max |Q Q^T - I| for a matrix handed in as a rotation. A float32
#: random_hadamard(576) is within 1e-7; a bfloat16 one (4e-3: 1/24 rounded) is refused.
ORTHOGONALITY_ATOL = 1e-5


# ----------------------------------------------------------------------------- measuring
def incoherence(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """max |t| / rms(t) along ``dim``: one value per row (or token) (lesson 16).

    1 when every entry has the same magnitude, sqrt(n) when one entry of n holds all the energy,
    about sqrt(2 ln n) for Gaussian noise. t: any float tensor; returns t's shape without ``dim``.
    """
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise TypeError(f"t must be a floating-point torch tensor; got "
                        f"{getattr(t, 'dtype', type(t).__name__)}")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -t.dim() <= dim < max(t.dim(), 1):
        raise ValueError(f"dim must be a whole number in [-{t.dim()}, {t.dim() - 1}] for a tensor "
                         f"of shape {tuple(t.shape)}; got {dim!r}")
    if t.numel() == 0:
        raise ValueError("t is empty: there is nothing to measure")
    if not bool(torch.isfinite(t).all()):
        raise ValueError("t holds NaN or inf: find where they come from before measuring")
    t = t.detach().double()
    rms = t.pow(2).mean(dim).sqrt()
    if bool((rms == 0).any()):
        raise ValueError(f"{int((rms == 0).sum())} row(s) of t are all zero along dim {dim}: "
                         f"their max / rms is undefined; drop them first")
    return t.abs().amax(dim) / rms


# ----------------------------------------------------------------------------- argument checks
def _check_model(model, what: str) -> None:
    if not isinstance(model, LlamaModel):
        raise TypeError(f"{what} takes a course LlamaModel (smollm.load() or "
                        f"model.load_pretrained()); got {type(model).__name__}")
    for name, m in model.named_modules():
        if name.endswith(("_proj", "lm_head")) and type(m) is not nn.Linear:
            raise TypeError(f"{what}: {name} is a {type(m).__name__}, not a plain nn.Linear. "
                            f"Rotate the float model first, then quantize it (QuaRot's order)")


def _steps(model) -> list[str]:
    return list(getattr(model, "rotation_steps", []))


def _refuse_twice(model, step: str, what: str) -> None:
    done = [s for s in _steps(model) if s.split()[0] == step]
    if done:
        raise ValueError(f"{what}: this model already has {done[0]!r} (its rotation_steps: "
                         f"{_steps(model)}). Applying it twice gives a different basis than the "
                         f"one recorded; start again from the unrotated model")


def _check_seed(seed) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be None (a plain Hadamard) or a whole number (random sign "
                         f"flips); got {seed!r}")


def _check_rotation(Q, n: int, atol: float) -> torch.Tensor:
    """Q as float64 if it is an (n, n) finite orthogonal matrix, else a clear error."""
    if isinstance(atol, bool) or not isinstance(atol, (int, float)) or not 0 < atol < 1:
        raise ValueError(f"atol must be a number in (0, 1); got {atol!r}")
    if not isinstance(Q, torch.Tensor) or not Q.is_floating_point():
        raise TypeError(f"Q must be a floating-point torch tensor (n, n); got "
                        f"{getattr(Q, 'dtype', type(Q).__name__)}")
    if tuple(Q.shape) != (n, n):
        raise ValueError(f"Q must be (hidden_size, hidden_size) = ({n}, {n}) for this model; got "
                         f"{tuple(Q.shape)}. Build one with hadamard.random_hadamard({n}, seed)")
    if not bool(torch.isfinite(Q).all()):
        raise ValueError("Q holds NaN or inf; it is not a rotation")
    err = orthogonality_error(Q)
    if err > atol:
        Qd = Q.detach().double()
        gram = Qd @ Qd.T
        hint = ""
        c = float(gram[0, 0])
        if c > 0 and float((gram - c * torch.eye(n, dtype=torch.float64)).abs().max()) <= atol * c:
            hint = (f" Its rows are orthogonal with squared length {c:g}: divide it by "
                    f"sqrt({c:g}) = {math.sqrt(c):g} (a +-1 Hadamard matrix needs / sqrt(n)).")
        raise ValueError(f"Q is not orthogonal: max |Q Q^T - I| = {err:.2e} > atol = {atol:g}, "
                         f"so the rotated model would compute a different function.{hint} Use "
                         f"hadamard.random_hadamard(n, seed) in float32 or float64 (bfloat16 is "
                         f"too coarse), or orthonormalise with torch.linalg.qr")
    return Q.detach().double()


def _norms_are_folded(model) -> None:
    bad = [n for n, m in model.named_modules()
           if isinstance(m, RMSNorm) and not bool((m.weight == 1).all())]
    if bad:
        raise ValueError(f"the RMSNorm scales are not folded ({len(bad)} norms with weights != 1, "
                         f"first {bad[0]}): a rotation commutes with x / rms(x) but not with the "
                         f"per-channel scale. Run rotate.fold_norms(model) first")


@torch.no_grad()
def _set(p: torch.Tensor, value64: torch.Tensor) -> None:
    """Write a float64 result into parameter ``p``, rounded once to p's dtype."""
    p.copy_(value64.to(p.dtype))


# ----------------------------------------------------------------------------- norm folding
@torch.no_grad()
def _fold(norm: RMSNorm, readers: list[nn.Linear]) -> None:
    g = norm.weight.double()                                             # (D,)
    for lin in readers:
        _set(lin.weight, lin.weight.double() * g)                        # (out, D) W diag(g)
    norm.weight.fill_(1.0)


def fold_norms(model: LlamaModel) -> LlamaModel:
    """A copy with each RMSNorm's scale folded into the Linears that read it, norms set to 1
    (lesson 16).

    input_layernorm -> q_proj, k_proj, v_proj; post_attention_layernorm -> gate_proj, up_proj;
    the final norm -> lm_head. W -> W diag(g), computed in float64, rounded once.
    A TIED head (SmolLM2: lm_head.weight is embed_tokens.weight) is UNTIED in the copy
    (config.tie_word_embeddings = False, the head gets its own tensor): the head is scaled by the
    final norm, the embedding is not. The copy holds 28M more parameters for SmolLM2.
    """
    _check_model(model, "fold_norms")
    m = copy.deepcopy(model)
    if m.lm_head.weight is m.model.embed_tokens.weight:
        m.lm_head.weight = nn.Parameter(m.model.embed_tokens.weight.detach().clone(),
                                        requires_grad=m.lm_head.weight.requires_grad)
    m.config.tie_word_embeddings = False
    for block in m.model.layers:
        att, mlp = block.self_attn, block.mlp
        _fold(block.input_layernorm, [att.q_proj, att.k_proj, att.v_proj])
        _fold(block.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj])
    _fold(m.model.norm, [m.lm_head])
    m.rotation_steps = _steps(model) + ["fold_norms"]
    return m


# ----------------------------------------------------------------------------- R1: residual stream
@torch.no_grad()
def rotate_residual(model: LlamaModel, Q: torch.Tensor, atol: float = ORTHOGONALITY_ATOL
                    ) -> LlamaModel:
    """A copy whose residual stream lives in the basis Q (QuaRot's R1, fused; lesson 16).

    Q: (D, D) orthogonal (max |Q Q^T - I| <= atol, checked in float64). Embeddings E Q; every
    Linear that reads the residual (q, k, v, gate, up, lm_head) W Q; every Linear that writes
    it (o_proj, down_proj) Q^T W and its bias b Q. The norms must be folded first
    (:func:`fold_norms`): the model's function is then unchanged up to rounding.
    """
    _check_model(model, "rotate_residual")
    Q = _check_rotation(Q, model.config.hidden_size, atol)               # (D, D) float64
    _refuse_twice(model, "R1", "rotate_residual")
    _norms_are_folded(model)
    m = copy.deepcopy(model)
    Q = Q.to(m.lm_head.weight.device)
    E = m.model.embed_tokens.weight                                      # (V, D)
    _set(E, E.double() @ Q)
    for block in m.model.layers:
        att, mlp = block.self_attn, block.mlp
        for lin in (att.q_proj, att.k_proj, att.v_proj, mlp.gate_proj, mlp.up_proj):
            _set(lin.weight, lin.weight.double() @ Q)                    # (out, D) W Q
        for lin in (att.o_proj, mlp.down_proj):
            _set(lin.weight, Q.T @ lin.weight.double())                  # (D, in) Q^T W
            if lin.bias is not None:
                _set(lin.bias, lin.bias.double() @ Q)                    # (D,) b Q
    if m.lm_head.weight is not E:                      # a tied head is E Q already
        _set(m.lm_head.weight, m.lm_head.weight.double() @ Q)            # (V, D) W Q
    m.rotation_steps = _steps(model) + [f"R1 ({Q.shape[0]} x {Q.shape[0]})"]
    return m


# ----------------------------------------------------------------------------- online rotations
class OnlineHadamard(nn.Module):
    """x -> fwht(x) * signs along the last dim: x @ R with R = (diag(s) H / sqrt(n))^T (lesson 16).

    R is orthogonal; ``seed=None`` uses no sign flips (s = 1, QuaRot's online Hadamard), an int
    seed uses :func:`course_lib.hadamard.random_signs`. The signs are a persistent buffer, so a
    saved state dict shows the rotation (a plain LlamaModel refuses to load it, rather than
    silently dropping it). To fuse R into a Linear that reads the rotated x, apply this module to
    the Linear's weight rows: W -> W R (:meth:`fuse_into`).
    """

    def __init__(self, n: int, seed: int | None = None):
        super().__init__()
        factor(n)                                         # a ValueError naming the sizes that work
        _check_seed(seed)
        self.n, self.seed = n, seed
        signs = torch.ones(n) if seed is None else random_signs(n, seed)
        self.register_buffer("signs", signs)                             # (n,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:                 # x: (..., n)
        if x.shape[-1] != self.n:
            raise ValueError(f"this online Hadamard rotates vectors of size {self.n}; got a last "
                             f"dimension of {x.shape[-1]} (shape {tuple(x.shape)})")
        return fwht(x) * self.signs.to(x.dtype)                          # (..., n)

    def matrix(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """R itself, (n, n): forward(x) == x @ R."""
        return self.forward(torch.eye(self.n, dtype=dtype))

    @torch.no_grad()
    def fuse_into(self, lin: nn.Linear) -> None:
        """W -> W R in place (float64, rounded once), so lin(forward(x)) == old lin(x)."""
        _set(lin.weight, self.forward(lin.weight.double()))

    def extra_repr(self) -> str:
        return f"n={self.n}, seed={self.seed}"


class RotatedMLP(MLP):
    """SwiGLU with QuaRot's R4: down( R^T-fused weight, rotate(silu(gate(x)) * up(x)) ) (lesson 16).

    ``down_rotation`` runs online on the (B, T, F) product; down_proj stays a plain nn.Linear
    (named as before, so quantizers swap it as usual) and sees the rotated input.
    """

    @classmethod
    def wrap(cls, mlp: MLP, rotation: OnlineHadamard) -> "RotatedMLP":
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.gate_proj, new.up_proj, new.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        new.down_rotation = rotation
        return new

    def forward(self, x):                                                # x: (B, T, D)
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)                  # (B, T, F)
        return self.down_proj(self.down_rotation(h))                     # (B, T, D)


class HadamardQKAttention(Attention):
    """Attention with QuaRot's R3: queries and keys rotated per head after RoPE (lesson 16).

    q k^T = (q R)(k R)^T for an orthogonal R (hd, hd), so attention is unchanged, while the KV
    cache (plain, or lesson 11's quantized caches through ``cache.attend``) stores k R, whose
    outliers are spread over the head's 64 channels. The forward is Attention's with the one
    line marked below.
    """

    @classmethod
    def wrap(cls, attn: Attention, rotation: OnlineHadamard) -> "HadamardQKAttention":
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.layer, new.H, new.K, new.hd = attn.layer, attn.H, attn.K, attn.hd
        new.q_proj, new.k_proj, new.v_proj, new.o_proj = (attn.q_proj, attn.k_proj, attn.v_proj,
                                                          attn.o_proj)
        new.qk_rotation = rotation
        return new

    def forward(self, x, cos, sin, cache=None):
        B, T, _ = x.shape                                                  # x: (B, T, D)
        q = self.q_proj(x).view(B, T, self.H, self.hd).transpose(1, 2)     # (B, H, T, hd)
        k = self.k_proj(x).view(B, T, self.K, self.hd).transpose(1, 2)     # (B, K, T, hd)
        v = self.v_proj(x).view(B, T, self.K, self.hd).transpose(1, 2)     # (B, K, T, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k = self.qk_rotation(q), self.qk_rotation(k)                    # R3: the added line
        if getattr(cache, "attend", None) is not None:  # a quantized cache (lesson 11)
            y = cache.attend(self.layer, q, k, v)                          # (B, H, T, hd)
            return self.o_proj(y.transpose(1, 2).reshape(B, T, self.H * self.hd))
        past = 0
        if cache is not None:
            past = 0 if cache.k[self.layer] is None else cache.k[self.layer].shape[2]
            k, v = cache.update(self.layer, k, v)                          # (B, K, S, hd)
        rep = self.H // self.K
        k = k.repeat_interleave(rep, dim=1)                                # (B, H, S, hd)
        v = v.repeat_interleave(rep, dim=1)                                # (B, H, S, hd)
        if past == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)    # (B, H, T, hd)
        else:
            S = k.shape[2]
            cols = torch.arange(S, device=q.device)[None, :]               # (1, S)
            rows = past + torch.arange(T, device=q.device)[:, None]        # (T, 1)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=cols <= rows)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.H * self.hd)             # (B, T, H*hd)
        return self.o_proj(y)                                              # (B, T, D)


def online_down_proj(model: LlamaModel, seed: int | None = None) -> LlamaModel:
    """A copy with QuaRot's R4: the down_proj input rotated online by a Hadamard of the FFN width,
    down_proj's weight W -> W R fused (lesson 16).

    Every block's MLP becomes a :class:`RotatedMLP` (F = 1536 = 12 x 128 for SmolLM2). ``seed``:
    None for a plain Hadamard (QuaRot), an int for random sign flips as well.
    """
    _check_model(model, "online_down_proj")
    _check_seed(seed)
    _refuse_twice(model, "R4", "online_down_proj")
    width = model.config.intermediate_size
    try:
        factor(width)
    except ValueError as e:
        raise ValueError(f"online_down_proj needs a Hadamard of the FFN width "
                         f"intermediate_size = {width}: {e}") from None
    m = copy.deepcopy(model)
    for block in m.model.layers:
        rotation = OnlineHadamard(width, seed).to(block.mlp.down_proj.weight.device)
        rotation.fuse_into(block.mlp.down_proj)                          # (D, F) W R
        block.mlp = RotatedMLP.wrap(block.mlp, rotation)
    m.rotation_steps = _steps(model) + [f"R4 (online, {width}, seed={seed})"]
    return m


def online_qk(model: LlamaModel, seed: int | None = None) -> LlamaModel:
    """A copy with QuaRot's R3: queries and keys rotated per head after RoPE, online (lesson 16).

    Nothing is fused (RoPE sits between k_proj and the rotation); attention scores are unchanged
    and the KV cache holds rotated keys. head_dim = 64 for SmolLM2.
    """
    _check_model(model, "online_qk")
    _check_seed(seed)
    _refuse_twice(model, "R3", "online_qk")
    cfg = model.config
    if getattr(cfg, "qk_norm", False) or getattr(cfg, "sliding_window", None) is not None:
        raise ValueError("online_qk rotates queries and keys in an attention without per-head q/k "
                         "norms (Qwen3) or a sliding window (Mistral); this model has "
                         f"qk_norm={getattr(cfg, 'qk_norm', False)}, sliding_window="
                         f"{getattr(cfg, 'sliding_window', None)}: use quarot(..., qk=False)")
    hd = model.config.head_dim
    try:
        factor(hd)
    except ValueError as e:
        raise ValueError(f"online_qk needs a Hadamard of head_dim = {hd}: {e}") from None
    m = copy.deepcopy(model)
    for block in m.model.layers:
        rotation = OnlineHadamard(hd, seed).to(block.self_attn.q_proj.weight.device)
        block.self_attn = HadamardQKAttention.wrap(block.self_attn, rotation)
    m.rotation_steps = _steps(model) + [f"R3 (online, {hd}, seed={seed})"]
    return m


@torch.no_grad()
def rotate_values(model: LlamaModel, seed: int | None = None) -> LlamaModel:
    """A copy with a per-head rotation fused into v_proj and o_proj (SpinQuant's R2; lesson 16).

    Each value head v (hd,) becomes v R: v_proj's rows of that head R^T W (bias b R), and
    o_proj's columns of every query head W R. Attention mixes values within a head, so its
    output per head is y R, which o_proj undoes: the function is unchanged, the V cache holds
    rotated values. No online work. QuaRot's code does more here (``rotate_ov_proj`` in
    ``fake_quant/rotation_utils.py``, and in ``fake_quant/main.py`` an online Hadamard of order
    num_attention_heads on o_proj's input): a Hadamard across the heads too, which SmolLM2's
    9 heads do not allow (no Hadamard matrix has order 9).
    """
    _check_model(model, "rotate_values")
    _check_seed(seed)
    _refuse_twice(model, "R2", "rotate_values")
    hd = model.config.head_dim
    try:
        factor(hd)
    except ValueError as e:
        raise ValueError(f"rotate_values needs a Hadamard of head_dim = {hd}: {e}") from None
    m = copy.deepcopy(model)
    R = OnlineHadamard(hd, seed).matrix()                                # (hd, hd) float64
    for block in m.model.layers:
        att = block.self_attn
        R = R.to(att.v_proj.weight.device)
        Wv = att.v_proj.weight.double().view(att.K, hd, -1)              # (K, hd, D)
        _set(att.v_proj.weight, (R.T @ Wv).reshape(att.K * hd, -1))      # per head R^T W
        if att.v_proj.bias is not None:
            _set(att.v_proj.bias, (att.v_proj.bias.double().view(att.K, hd) @ R).reshape(-1))
        Wo = att.o_proj.weight.double().view(-1, att.H, hd)              # (D, H, hd)
        _set(att.o_proj.weight, (Wo @ R).reshape(-1, att.H * hd))        # per head W R
    m.rotation_steps = _steps(model) + [f"R2 (fused, {hd}, seed={seed})"]
    return m


def quarot(model: LlamaModel, seed: int = 0, values: bool = True, qk: bool = True,
           down_proj: bool = True, Q: torch.Tensor | None = None) -> LlamaModel:
    """QuaRot's rotations on a copy, in order: fold_norms, R1 = random_hadamard(D, seed), then
    R2 (values), R4 (down_proj input, online) and R3 (queries and keys, online) (lesson 16).
    ``Q``: another orthogonal (D, D) for R1 (a learned one, ``spinquant``); seed is then unused."""
    for name, v in (("values", values), ("qk", qk), ("down_proj", down_proj)):
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be True or False; got {v!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be a whole number; got {seed!r}")
    R1 = random_hadamard(model.config.hidden_size, seed, torch.float64) if Q is None else Q
    m = rotate_residual(fold_norms(model), R1)
    if values:
        m = rotate_values(m)
    if down_proj:
        m = online_down_proj(m)
    if qk:
        m = online_qk(m)
    return m
