"""What QuaRot's rotation buys at each bit width: one table per model, every row measured without
and with the rotation (lesson 16).

    python -m course_lib.experiments.rotation_table --model bundled          # 1-3 minutes
    python -m course_lib.experiments.rotation_table --model smollm2          # about an hour
    python -m course_lib.experiments.rotation_table --model smollm2 --resume # rows still missing
    python -m course_lib.experiments.rotation_table --model smollm2 --windows 1 --out /tmp/s.json

write ``results/rotation_<model>.json`` (the command lives in ``course_lib/experiments/``
with the course's other writers; this module holds the rows, how each is built and scored, the live slice and the
reader). The rotation is :func:`course_lib.rotate.quarot`
(seed 0): the norms folded, R1 = a random Hadamard of the hidden size fused into the weights,
R2 per head into v_proj and o_proj, R4 online on down_proj's input, R3 online on the queries
and keys after RoPE. It is applied to the FLOAT model; the quantizer runs on the rotated
copy, exactly as on the plain one. Every row is scored against the unquantized, unrotated
model on the same windows: perplexity, KL and top-1, each window's figures and a bootstrap
interval (:mod:`course_lib.protocol`), and the rotated-minus-plain difference window by window
(``protocol.paired``).

The rows (:data:`ROWS`); nothing here is a second quantizer:

- **W4A16**: round-to-nearest at groups of 32 on the course's grid (absmax / 7, codes -7..7;
  lesson 06's W4 g32, ``methods.calibration.rtn_model``), GPTQ at the same grid
  (``methods.gptq.gptq_model``, calibration text only) and RTN with one scale per output channel
  (the weights of the W4A8 and W4A4 rows, alone).
- **A8, A4**: activations alone per token (weights float): what the rotation does for the
  activations, apart from the weights.
- **W8A8, W4A8, W4A4**: weights per output channel, activations per token, both symmetric
  integers from :func:`course_lib.quant.quantize` (lesson 08's dynamic per-token scheme:
  scale = max |x_row| / qmax), every Linear of the decoder blocks (embeddings and head stay);
  W4A8 and W4A4 again with GPTQ's weights at groups of 32 (QuaRot quantizes its W4A4 weights
  with GPTQ, per channel): per-channel round-to-nearest INT4 alone costs SmolLM2-135M more
  than any activation format does.
- **KV4**: the cache in 4 bits, two ways, both lesson 11's quantizers (:mod:`course_lib.kv`):
  ``kv4`` one scale and minimum per token and KV head (``kv.minmax_quantize`` over the head's
  channels; QuaRot's head-wise option, ``k_groupsize = head_dim`` in ``QKRotationWrapper``,
  github.com/spcl/QuaRot ``fake_quant/rotation_utils.py``), every token read quantized; and
  ``kv4-kivi``, lesson 11's KIVI-4 (keys per channel, values per token, 128 recent tokens in
  BF16). With the rotation the cache holds keys rotated after RoPE (R3) and values rotated
  per head (R2).
- **MXFP4 and NVFP4** (lesson 03's block formats, ``quant.quantize_mxfp4`` /
  ``quantize_nvfp4``): activations alone (weights float), then weights and activations both.
  NVFP4's second-level FP32 scale is taken per token here (each token divided by its own
  max |x| first), so a row does not depend on how many windows share a batch.
- **SmoothQuant** beside them (no rotation): lesson 08's smoothing of the reference groups
  (the two norms) at alpha 0.5 and 0.8, calibrated on calibration text, then W8A8 or W4A4.
- **W4A4 + KV4**, QuaRot's full setting (GPTQ weights at groups of 32).

SmolLM2 here was expanded from a Q4_1 file: its block weights sit on a 4-bit grid of groups of
32, a structure a rotation destroys. Its table therefore carries
the weight rows again on ``smollm.off_grid(model)`` (the weights moved off that grid, scored
against that moved model: ``general_case``), and the bundled model, trained in float, is the
general case throughout. Activations and the KV cache carry no such grid.

Time (measured at 1 thread on 2 shared cores, load average about 5; the JSON records every
variant's seconds): the bundled table 70-160 s. SmolLM2's full table is about 48 scoring passes
over 8 windows of 512 tokens plus 4 GPTQ runs (the GPTQ rows share one GPTQ model per base):
``--windows 1`` took 18 min, 12 of them GPTQ, so the full table needs about an hour. Rows are
written as they finish; ``--resume`` keeps rows measured under the same protocol.

:func:`live_slice` scores a few rows on one or two short windows for the lesson to recompute
and compare with the file's ``slice``; :func:`load_table` reads a committed table.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib import kv, quant, rotate
from course_lib import eval as ceval
from course_lib import protocol as cprotocol
from course_lib.model import LlamaModel

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"
#: The rotation's seed (random sign flips of R1's Hadamard): rotate.quarot(model, SEED).
SEED = 0
#: SmolLM2's text protocol (course_lib.smollm.PROTOCOLS).
PROTOCOL = "clean"
#: Formats a weight or an activation can take in the activation rows (:class:`ActQuantLinear`).
FORMATS = ("int8", "int4", "mxfp4", "nvfp4")
#: A weight-only format besides them: INT4 with 16 levels, scale = absmax / 7.5 and codes
#: -8..7 (llm-compressor's symmetric INT4, compressed-tensors' calculate_qparams), against the
#: course's 15 (absmax / 7, codes -7..7, lesson 02's symmetric grid).
WEIGHT_FORMATS = FORMATS + ("int4-16",)
#: Weight-only quantizers (group-wise, methods.calibration's course grid).
WEIGHT_METHODS = ("rtn-g32", "gptq-g32")
KV_FORMATS = ("int4-token", "kivi4")
WEIGHT_BITS, WEIGHT_GROUP = 4, 32
#: SmoothQuant's migration strengths: 0.5 (the paper's and llm-compressor's default) and 0.8
#: (lesson 08's choice for SmolLM2, its best dynamic per-token row).
SMOOTHQUANT_ALPHAS = (0.5, 0.8)

#: Per model: evaluation windows x tokens, calibration windows x tokens (GPTQ), the first
#: ``smooth_windows`` of those for SmoothQuant's maxima (lesson 08: 2 x 512 on SmolLM2, 8 x
#: 256 on the bundled model), and the live slice.
SETTINGS = {
    "bundled": {"eval_windows": 32, "eval_window": 256, "calib_windows": 32,
                "calib_window": 256, "smooth_windows": 8,
                "slice": {"rows": ("a4", "kv4"), "n_windows": 2, "window": 256}},
    "smollm2": {"eval_windows": 8, "eval_window": 512, "calib_windows": 16,
                "calib_window": 512, "smooth_windows": 2,
                "slice": {"rows": ("a4", "kv4"), "n_windows": 1, "window": 256}},
}


# ----------------------------------------------------------------------------- the rows
@dataclass(frozen=True)
class Row:
    """One row of the table: what is quantized, and how (lesson 16).

    weights: None (float), a method of :data:`WEIGHT_METHODS`, or a format of :data:`FORMATS`
    (per output channel for integers, blocks along the input for MXFP4 / NVFP4);
    acts: None or a format of :data:`FORMATS` (per token); kv: None or a format of
    :data:`KV_FORMATS`; alpha: SmoothQuant's strength (a row measured without the rotation
    only)."""
    name: str
    what: str
    weights: str | None = None
    acts: str | None = None
    kv: str | None = None
    alpha: float | None = None

    @property
    def rotated_too(self) -> bool:
        return self.alpha is None

    @property
    def needs_calibration(self) -> bool:
        return self.weights == "gptq-g32" or self.alpha is not None


_ROWS = [
    Row("fp", "no quantization: the rotation alone (KL is rounding)"),
    Row("w4a16-rtn", "W4A16 round-to-nearest, groups of 32 (course grid, absmax/7)", "rtn-g32"),
    Row("w4a16-gptq", "W4A16 GPTQ, groups of 32 (course grid), no act-order", "gptq-g32"),
    Row("w4a16-rtn-pc", "W4A16 round-to-nearest, one scale per output channel", "int4"),
    Row("a8", "INT8 activations per token, float weights", acts="int8"),
    Row("a4", "INT4 activations per token, float weights", acts="int4"),
    Row("w8a8", "W8A8 INT8: weights per channel, activations per token", "int8", "int8"),
    Row("w4a8", "W4A8: INT4 weights per channel (RTN), INT8 activations per token", "int4",
        "int8"),
    Row("w4a4", "W4A4: INT4 weights per channel (RTN), INT4 activations per token", "int4",
        "int4"),
    Row("w4a4-16", "W4A4 with llm-compressor's INT4 grid for the weights (16 levels: "
                   "absmax / 7.5, codes -8..7; per channel, RTN), INT4 activations per token",
        "int4-16", "int4"),
    Row("w4a8-gptq", "W4A8: GPTQ weights (groups of 32), INT8 activations per token",
        "gptq-g32", "int8"),
    Row("w4a4-gptq", "W4A4: GPTQ weights (groups of 32), INT4 activations per token",
        "gptq-g32", "int4"),
    Row("kv4", "KV cache INT4, one scale and minimum per token and head", kv="int4-token"),
    Row("kv4-kivi", "KV cache KIVI-4 (lesson 11: keys per channel, values per token, 128 "
                    "recent tokens in BF16)", kv="kivi4"),
    Row("w4a4-kv4", "W4A4 with GPTQ weights (groups of 32) and the INT4 per-token KV cache: "
                    "QuaRot's full setting (its GPTQ is per channel)", "gptq-g32", "int4",
        "int4-token"),
    Row("a-mxfp4", "MXFP4 activations (blocks of 32, E8M0 scales), float weights",
        acts="mxfp4"),
    Row("a-nvfp4", "NVFP4 activations (blocks of 16, E4M3 scales, FP32 scale per token), "
                   "float weights", acts="nvfp4"),
    Row("mxfp4", "MXFP4 weights and activations", "mxfp4", "mxfp4"),
    Row("nvfp4", "NVFP4 weights (FP32 scale per tensor) and activations (per token)",
        "nvfp4", "nvfp4"),
] + [Row(f"{base}-sq{a}", f"SmoothQuant alpha {a} (norms smoothed, lesson 08), then {label}",
         w, act, alpha=a)
     for base, label, w, act in (("w8a8", "W8A8", "int8", "int8"),
                                 ("w4a4", "W4A4", "int4", "int4"))
     for a in SMOOTHQUANT_ALPHAS]

#: Every row by name, in the table's order.
ROWS: dict[str, Row] = {r.name: r for r in _ROWS}
#: The weight rows measured again on SmolLM2 moved off its Q4_1 grid (the general case).
GENERAL_ROWS = ("w4a16-rtn", "w4a16-gptq", "w4a16-rtn-pc")

GRID_NOTE = ("SmolLM2 here was expanded from a Q4_1 GGUF file: its block weights sit on a 4-bit "
             "grid (groups of 32, 16 levels each), a structure the rotation destroys, so its "
             "weight rows compare the rotation with weights that were 4-bit already. "
             "general_case holds the same weight rows on smollm.off_grid(model) (moved off that "
             "grid, scored against that moved model), and results/rotation_bundled.json the "
             "bundled model, trained in float. Activations and the KV cache carry no such grid.")
BUNDLED_NOTE = ("The bundled model was trained in float: its weight rows are the general case "
                "(SmolLM2's table adds rows on SmolLM2 moved off its Q4_1 grid).")


def get_row(row) -> Row:
    """The :class:`Row` called ``row`` (one of :data:`ROWS`), or ``row`` itself."""
    if isinstance(row, Row):
        return row
    if not isinstance(row, str) or row not in ROWS:
        raise ValueError(f"unknown row {row!r}; known: {', '.join(ROWS)}")
    return ROWS[row]


# ----------------------------------------------------------------------------- quantizers
def _check_format(fmt, what: str, known=FORMATS) -> None:
    if fmt is not None and fmt not in known:
        raise ValueError(f"{what} must be None (kept in float) or one of {list(known)}; got "
                         f"{fmt!r} (INT8 and INT4 are the integer widths this table uses: "
                         f"bits=3 or 'int3' is not one of its rows)")


def _block(fmt: str) -> int:
    return {"mxfp4": 32, "nvfp4": 16}.get(fmt, 1)


def fake_quant_weight(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """w (out, in) as ``fmt`` stores it, dequantized (lesson 16's rows): INT8 / INT4 with one
    absmax scale per output channel (``quant.fake_quantize``, per_channel), MXFP4 / NVFP4 in
    blocks along the input (NVFP4's FP32 scale per tensor)."""
    _check_format(fmt, "the weight format", WEIGHT_FORMATS)
    w = w.detach().float()
    if fmt in ("int8", "int4"):
        return quant.fake_quantize(w, fmt, "per_channel")
    if fmt == "int4-16":                                  # llm-compressor's symmetric INT4
        if not bool(torch.isfinite(w).all()):
            raise ValueError("the weights hold NaN or inf: quantize a finite model")
        s = w.abs().amax(1, keepdim=True) / 7.5                          # (out, 1)
        s = torch.where(s == 0, torch.ones_like(s), s)                   # an all-zero row
        return torch.round(w / s).clamp(-8, 7) * s
    qt = quant.quantize_mxfp4(w) if fmt == "mxfp4" else quant.quantize_nvfp4(w)
    return quant.dequantize(qt)


def fake_quant_tokens(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x (M, K) as ``fmt`` stores each token, dequantized (lesson 16's rows): INT8 / INT4 with
    one absmax scale per token (``quant.fake_quantize``, per_token: lesson 08's dynamic
    per-token rule), MXFP4 blocks of 32, NVFP4 blocks of 16 with an FP32 scale per token (the
    token is divided by its max |x| before ``quant.quantize_nvfp4``, whose tensor scale is
    then the same for every token, and multiplied back after)."""
    _check_format(fmt, "the activation format")
    x = x.float()
    if fmt in ("int8", "int4"):
        return quant.fake_quantize(x, fmt, "per_token")
    if fmt == "mxfp4":
        return quant.dequantize(quant.quantize_mxfp4(x))
    a = x.abs().amax(-1, keepdim=True)                                      # (M, 1)
    a = torch.where(a == 0, torch.ones_like(a), a)
    return quant.dequantize(quant.quantize_nvfp4(x / a)) * a                # (M, K)


class _SharedInput:
    """Remembers the last quantized input, so that Linears fed the same tensor (q, k, v; gate,
    up) quantize it once. Holds the tensor itself (a freed tensor's address can be reused)."""

    def __init__(self):
        self.x = self.fmt = self.xq = None

    def get(self, x: torch.Tensor, fmt: str) -> torch.Tensor:
        if x is self.x and fmt == self.fmt:
            return self.xq
        xq = fake_quant_tokens(x.reshape(-1, x.shape[-1]), fmt).reshape(x.shape)
        self.x, self.fmt, self.xq = x, fmt, xq
        return xq


class ActQuantLinear(nn.Module):
    """A Linear whose weights are stored in ``weights`` and whose input is quantized per token
    to ``acts`` on every call (lesson 16; lesson 08's W8A8 generalised to 4 bits and to the
    block formats). Either may be None (kept in float). The weights are quantized once."""

    def __init__(self, linear: nn.Module, weights: str | None, acts: str | None,
                 shared: _SharedInput | None = None):
        super().__init__()
        from course_lib.methods.calibration import GroupQuantLinear
        if type(linear) is GroupQuantLinear:
            if weights is not None:
                raise ValueError(f"this Linear's weights are quantized already ({linear.method} "
                                 f"int{linear.bits} g{linear.group_size}): pass weights=None "
                                 f"and quantize its input only")
        elif type(linear) is not nn.Linear:
            raise TypeError(f"ActQuantLinear wraps a plain nn.Linear (or a GroupQuantLinear "
                            f"from RTN / GPTQ, for its input only); got {type(linear).__name__}")
        _check_format(weights, "weights", WEIGHT_FORMATS)
        _check_format(acts, "acts")
        if weights is None and acts is None:
            raise ValueError("weights and acts are both None: nothing to quantize (use the "
                             "Linear itself)")
        self.out_features, self.in_features = linear.weight.shape
        for fmt in (weights, acts):
            if fmt is not None and self.in_features % _block(fmt):
                raise ValueError(f"{fmt} needs in_features to be a multiple of its block of "
                                 f"{_block(fmt)}; this Linear has {self.in_features}")
        self.weights, self.acts = weights, acts
        w = linear.weight.detach().float()
        self.register_buffer("weight", w if weights is None else fake_quant_weight(w, weights))
        self.bias = linear.bias
        self.shared = shared

    def forward(self, x):                                          # (..., in) -> (..., out)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input has {x.shape[-1]} features but this layer expects "
                             f"{self.in_features}")
        if self.acts is not None:
            x = (self.shared.get(x, self.acts) if self.shared is not None else
                 fake_quant_tokens(x.reshape(-1, self.in_features), self.acts).reshape(x.shape))
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias)

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}, weights={self.weights}, acts={self.acts}"


def act_quant_model(model: LlamaModel, weights: str | None, acts: str | None) -> LlamaModel:
    """A copy of ``model`` with every Linear of the decoder blocks an :class:`ActQuantLinear`
    (the embeddings and the output head stay in float, as in every table of the course). A
    block Linear already quantized by RTN or GPTQ (a ``GroupQuantLinear``) keeps its weights
    (``weights`` must be None) and gets its input quantized."""
    import copy
    from course_lib.methods.calibration import GroupQuantLinear
    _check_format(weights, "weights", WEIGHT_FORMATS)
    _check_format(acts, "acts")
    if not isinstance(model, LlamaModel):
        raise TypeError(f"act_quant_model takes a course LlamaModel; got {type(model).__name__}")
    model = copy.deepcopy(model)
    shared = _SharedInput()
    for block in model.model.layers:
        found = [(n, m) for n, m in block.named_modules()
                 if type(m) in (nn.Linear, GroupQuantLinear)]
        for name, lin in found:
            parent, _, child = name.rpartition(".")
            setattr(block.get_submodule(parent) if parent else block, child,
                    ActQuantLinear(lin, weights, acts, shared))
    return model


class TokenKV4Cache:
    """A cache-shaped hook (``model(ids, cache)``) that stores keys and values in ``bits`` bits,
    one scale and minimum per token and KV head (``kv.minmax_quantize`` over the head's
    channels, both stored in fp16 as lesson 11's caches store them), and attends over them
    (lesson 16). Each token is quantized as it is stored, so every query reads every key and
    value quantized, its own included (lesson 11's INT8 cache works the same way)."""

    def __init__(self, config, bits: int = 4):
        if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
            raise ValueError(f"bits must be a whole number 2..8; got {bits!r}")
        self.config, self.bits = getattr(config, "config", config), bits

    def length(self) -> int:
        return 0          # every forward starts a fresh window

    def attend(self, layer: int, q, k, v):                   # q (B, H, T, hd); k, v (B, K, T, hd)
        kq = kv.minmax_dequantize(*kv.minmax_quantize(kv.to_bf16(k), self.bits))
        vq = kv.minmax_dequantize(*kv.minmax_quantize(kv.to_bf16(v), self.bits))
        pos = torch.arange(q.shape[2], device=q.device)
        return kv.attention(q, kq, vq, pos).to(q.dtype)                     # (B, H, T, hd)


class WithCache(nn.Module):
    """``model`` called with a quantized KV cache on every forward: what ``eval`` and
    ``protocol`` score (they call ``model(ids)``)."""

    def __init__(self, model: nn.Module, cache):
        super().__init__()
        self.model, self.cache, self.config = model, cache, model.config

    def forward(self, ids):
        return self.model(ids, self.cache)


def kv_cache(config, fmt: str):
    """The cache hook of KV format ``fmt`` (:data:`KV_FORMATS`) for a model of ``config``."""
    if fmt == "int4-token":
        return TokenKV4Cache(config, 4)
    if fmt == "kivi4":
        return kv.PerQueryEmulation(config, "kivi4")
    raise ValueError(f"unknown KV format {fmt!r}; known: {', '.join(KV_FORMATS)}")


# ----------------------------------------------------------------------------- building a row
def check_model(model, what: str = "rotation_table") -> None:
    """Refuse what the table cannot score honestly: not a course LlamaModel, a model rotated
    already (the table rotates it itself, and scores against the unrotated one), or a model
    whose block Linears are already quantized."""
    if not isinstance(model, LlamaModel):
        raise TypeError(f"{what} takes a course LlamaModel (smollm.load() or "
                        f"model.load_pretrained()); got {type(model).__name__}")
    steps = getattr(model, "rotation_steps", None)
    if steps:
        raise ValueError(f"{what}: this model is rotated already (rotation_steps {steps}); pass "
                         f"the unrotated float model: the table rotates a copy itself and scores "
                         f"both against the unrotated one")
    for name, m in model.named_modules():
        if name.endswith("_proj") and type(m) is not nn.Linear:
            raise TypeError(f"{what}: {name} is a {type(m).__name__}, not a plain nn.Linear: "
                            f"pass the float model, the table quantizes it")


def prepare(model: LlamaModel, rotated: bool, seed: int = SEED) -> LlamaModel:
    """The float model a row quantizes: ``model`` itself, or ``rotate.quarot(model, seed)``."""
    check_model(model)
    if not isinstance(rotated, bool):
        raise TypeError(f"rotated must be True or False; got {rotated!r}")
    return rotate.quarot(model, seed) if rotated else model


def _check_ids(calib_ids, model) -> torch.Tensor:
    ids = torch.as_tensor(calib_ids) if calib_ids is not None else None
    if ids is None or ids.dim() != 2 or ids.is_floating_point() or ids.shape[0] < 1:
        raise ValueError(f"this row calibrates (GPTQ or SmoothQuant): pass calib_ids, token "
                         f"windows (n, T) of calibration text (methods.calibration."
                         f"calibration_ids), never evaluation text; got "
                         f"{None if ids is None else tuple(ids.shape)}")
    model.check_ids(ids)
    return ids


def quantize(base: LlamaModel, row, calib_ids=None, smooth_windows: int | None = None,
             progress: bool = False, memo: dict | None = None) -> nn.Module:
    """The model to score for ``row`` (a name of :data:`ROWS` or a :class:`Row`), built on
    the float model ``base`` (plain or rotated: :func:`prepare`). ``calib_ids`` (n, T):
    calibration windows for GPTQ and SmoothQuant (SmoothQuant reads the first
    ``smooth_windows`` of them; all by default). ``memo``: a dict in which the GPTQ model of
    each base is kept, so that the rows sharing it run GPTQ once (same base, same ids)."""
    row = get_row(row)
    if not isinstance(base, LlamaModel):
        raise TypeError(f"base must be a course LlamaModel (from prepare()); got "
                        f"{type(base).__name__}")
    m = base
    if row.needs_calibration:
        calib_ids = _check_ids(calib_ids, base)
    if row.alpha is not None:
        if getattr(base, "rotation_steps", None):
            raise ValueError(f"row {row.name!r} is SmoothQuant, measured beside the rotation, "
                             f"not on top of it: pass the unrotated model")
        from course_lib.methods import smoothquant
        stats = smoothquant.calibrate_absmax(base, calib_ids[:smooth_windows])
        m = smoothquant.smooth_model(base, stats, row.alpha)[0]
    if row.weights == "rtn-g32":
        from course_lib.methods import calibration as cal
        m = cal.rtn_model(m, WEIGHT_BITS, WEIGHT_GROUP)
    elif row.weights == "gptq-g32":
        from course_lib.methods import gptq
        key = (id(base), calib_ids.shape, int(calib_ids.sum()))
        if memo is not None and key in memo:
            m = memo[key]
        else:
            m = gptq.gptq_model(m, calib_ids, WEIGHT_BITS, WEIGHT_GROUP, progress=progress)[0]
            if memo is not None:
                memo[key] = m
    if row.acts is not None or row.weights in WEIGHT_FORMATS:
        m = act_quant_model(m, row.weights if row.weights in WEIGHT_FORMATS else None, row.acts)
    if row.kv is not None:
        m = WithCache(m, kv_cache(m.config, row.kv))
    return m


# ----------------------------------------------------------------------------- scoring
def reference(model: LlamaModel, model_name: str, n_windows: int, window: int
              ) -> ceval.Reference:
    """The unquantized model's log-probabilities on the table's windows: SmolLM2's clean
    protocol (``smollm.reference``), or the bundled model's held-out text (as the methods
    table scores it)."""
    _check_name(model_name)
    for what, v in (("n_windows", n_windows), ("window", window)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{what} must be a whole number >= 1; got {v!r}")
    if model_name == "smollm2":
        from course_lib import smollm
        return smollm.reference(model, n_windows, window, protocol=PROTOCOL)
    from course_lib import data
    return ceval.reference(model, data.heldout_text(n_windows * window + 1), window=window)


def calibration(model_name: str, n_windows: int, window: int) -> torch.Tensor:
    """Calibration windows (n, T): SmolLM2's from the clean protocol's calibration text, the
    bundled model's from its training split (``methods.calibration.calibration_ids``)."""
    from course_lib.methods import calibration as cal
    _check_name(model_name)
    kw = {"protocol": PROTOCOL} if model_name == "smollm2" else {}
    return cal.calibration_ids(model_name, n_windows, window, **kw)


def score(qm: nn.Module, ref: ceval.Reference) -> dict:
    """Perplexity, KL and top-1 against ``ref``, each window's figures and bootstrap intervals
    (``protocol.score``)."""
    return cprotocol.score(qm, ref)


def compare(plain: dict, rotated: dict) -> dict | None:
    """Rotated minus plain, window by window (``protocol.paired`` with a = rotated): KL and
    negative log-likelihood (lower is better: ``a_better`` counts windows the rotation wins).
    None with fewer than 2 windows."""
    if len(plain["windows"]["kl_nats"]) < 2:
        return None
    return {k: cprotocol.paired(rotated["windows"][k], plain["windows"][k])
            for k in ("kl_nats", "nll_nats")}


def _check_name(model_name) -> None:
    if model_name not in SETTINGS:
        raise ValueError(f"unknown model {model_name!r}; known: {', '.join(SETTINGS)}")


def load_model(model_name: str) -> LlamaModel:
    """The float model: ``"bundled"`` (model.load_pretrained) or ``"smollm2"`` (smollm.load)."""
    _check_name(model_name)
    if model_name == "bundled":
        from course_lib.model import load_pretrained
        return load_pretrained().requires_grad_(False)
    from course_lib import smollm
    if not smollm.available():
        raise RuntimeError(f"SmolLM2 is not installed: {smollm.INSTALL}, then "
                           f"python -m course_lib.smollm")
    return smollm.load().requires_grad_(False)


def measure_row(bases: dict, row, ref: ceval.Reference, calib_ids=None,
                smooth_windows: int | None = None, progress: bool = False,
                memo: dict | None = None) -> dict:
    """One row of the table: ``row`` built on ``bases["plain"]`` and ``bases["rotated"]``
    (:func:`prepare`), each scored against ``ref`` (:func:`score`, with its seconds), and the
    rotated-minus-plain comparison (:func:`compare`). A SmoothQuant row has ``rotated`` None."""
    row = get_row(row)
    if not isinstance(bases, dict) or set(bases) != {"plain", "rotated"}:
        raise ValueError("bases must be {'plain': model, 'rotated': prepare(model, True)}")
    out = {"row": row.name, "what": row.what}
    for key in ("plain", "rotated"):
        if key == "rotated" and not row.rotated_too:
            out[key] = None
            continue
        t0 = time.perf_counter()
        with torch.no_grad():
            qm = quantize(bases[key], row, calib_ids, smooth_windows, progress, memo)
            r = score(qm, ref)
        del qm
        r["seconds"] = round(time.perf_counter() - t0, 2)
        out[key] = r
    out["rotated_minus_plain"] = compare(out["plain"], out["rotated"]) if out["rotated"] else None
    out["load_avg_1min"] = round(os.getloadavg()[0], 1)
    return out


# ----------------------------------------------------------------------------- the live slice
def live_slice(model: LlamaModel, model_name: str, rows=None, n_windows: int | None = None,
               window: int | None = None, seed: int = SEED,
               rotated: LlamaModel | None = None) -> dict:
    """A few rows without and with the rotation on ``n_windows`` short windows (lesson 16
    recomputes it live and compares it with the committed table's ``slice``, computed by this
    same function). Defaults: ``SETTINGS[model_name]['slice']``. Rows needing calibration are
    refused (too slow to run live). ``rotated``: ``rotate.quarot(model, seed)`` if the caller
    has built it already (it is not built again; on SmolLM2 that takes tens of seconds)."""
    _check_name(model_name)
    check_model(model, "live_slice")
    if rotated is not None:
        steps = getattr(rotated, "rotation_steps", [])
        if not isinstance(rotated, LlamaModel) or [x.split()[0] for x in steps] != \
                ["fold_norms", "R1", "R2", "R4", "R3"]:
            raise ValueError(f"rotated must be rotate.quarot(model, seed={seed}) of the same "
                             f"model (rotation_steps fold_norms, R1, R2, R4, R3); got "
                             f"{steps or type(rotated).__name__}")
    sl = SETTINGS[model_name]["slice"]
    rows = [get_row(r) for r in (sl["rows"] if rows is None else rows)]
    if not rows:
        raise ValueError(f"rows is empty: name at least one of {', '.join(ROWS)}")
    slow = [r.name for r in rows if r.needs_calibration]
    if slow:
        raise ValueError(f"live_slice runs rows without calibration; {slow} calibrate (GPTQ or "
                         f"SmoothQuant): read them from load_table() instead")
    n_windows = sl["n_windows"] if n_windows is None else n_windows
    window = sl["window"] if window is None else window
    ref = reference(model, model_name, n_windows, window)
    if rotated is not None:                    # the same function as model, to rounding
        ids = ref.ids[None, :16]
        with torch.no_grad():
            a, b = model(ids), rotated(ids)
        if float((a - b).abs().max()) > 1e-3 * float(a.abs().max()):
            raise ValueError("rotated does not compute the same function as model (its logits "
                             "differ beyond rounding): pass rotate.quarot(model, seed) of this "
                             "very model")
    bases = {"plain": model, "rotated": rotated if rotated is not None else
             prepare(model, True, seed)}
    out = []
    for row in rows:
        res = {"row": row.name}
        for key, base in bases.items():
            with torch.no_grad():
                r = score(quantize(base, row), ref)
            res[key] = {k: r[k] for k in ("perplexity", "kl_nats", "top1_agreement")}
        out.append(res)
    return {"n_windows": n_windows, "window": window, "seed": seed, "protocol": (
        PROTOCOL if model_name == "smollm2" else "bundled"), "rows": out}


# ----------------------------------------------------------------------------- reading
def results_path(model_name: str) -> Path:
    """results/rotation_<model>.json."""
    _check_name(model_name)
    return RESULTS_DIR / f"rotation_{model_name}.json"


def load_table(model_name: str) -> dict:
    """The committed table, results/rotation_<model>.json."""
    path = results_path(model_name)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python -m "
                                f"course_lib.experiments.rotation_table --model {model_name}`")
    return json.loads(path.read_text())


def find(table: dict, row: str, general: bool = False) -> dict:
    """One row of a table (``general``: of SmolLM2's off-grid section)."""
    get_row(row)
    rows = table["general_case"]["rows"] if general else table["rows"]
    for r in rows:
        if r["row"] == row:
            return r
    raise KeyError(f"no row {row!r} in this table{' (general case)' if general else ''}; it has "
                   f"{[r['row'] for r in rows]}")


def format_table(rows: list[dict]) -> str:
    """Rows as plain text: KL, top-1 and perplexity without and with the rotation, and the
    paired KL difference's interval."""
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"format_table needs a non-empty list of rows as load_table(...)['rows'] "
                         f"holds; got {rows!r:.80}")
    head = (f"{'row':14s} {'KL plain':>9s} {'KL rot':>9s} {'top1 pl':>8s} {'top1 rot':>8s} "
            f"{'ppl pl':>8s} {'ppl rot':>8s}  rotated - plain KL [95%]")
    lines = [head]
    for r in rows:
        p, q = r["plain"], r["rotated"]
        f = lambda d, k, fmt: format(d[k], fmt) if d else "-"  # noqa: E731
        c = (r.get("rotated_minus_plain") or {}).get("kl_nats")
        diff = (f"{c['diff']:+.4f} [{c['interval'][0]:+.4f}, {c['interval'][1]:+.4f}] "
                f"{c['a_better']}/{c['n_windows']}") if c else "-"
        lines.append(f"{r['row']:14s} {f(p, 'kl_nats', '9.4f')} {f(q, 'kl_nats', '9.4f')} "
                     f"{f(p, 'top1_agreement', '8.4f')} {f(q, 'top1_agreement', '8.4f')} "
                     f"{f(p, 'perplexity', '8.3f')} {f(q, 'perplexity', '8.3f')}  {diff}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the reference
#: llm-compressor's rotation recipes beside the course's rows (tools/llm_compressor_rotation.py
#: writes the record): (label, course row, general case?, llm-compressor's plain recipe, its
#: QuaRot-style recipe (SpinQuantModifier R1-R4), its QuIP recipe).
REFERENCE_PAIRS = (
    ("W4A16 RTN g32", "w4a16-rtn", False, "w4_g32 rtn"),
    ("W4A16 GPTQ g32", "w4a16-gptq", False, "w4_g32 gptq"),
    ("W8A8", "w8a8", False, "w8a8 rtn"),
    ("W4A4 RTN", "w4a4", False, "w4a4 rtn"),
    ("W4A4 RTN, 16-level grid", "w4a4-16", False, "w4a4 rtn"),
    ("W4A16 RTN g32, off grid", "w4a16-rtn", True, "off_grid w4_g32 rtn"),
    ("W4A16 GPTQ g32, off grid", "w4a16-gptq", True, "off_grid w4_g32 gptq"),
)
REFERENCE_FILE = "llm_compressor_rotation_smollm2.json"


def load_reference() -> dict:
    """llm-compressor's QuIP / SpinQuant record on SmolLM2 (results/
    llm_compressor_rotation_smollm2.json, written by tools/llm_compressor_rotation.py in
    llm-compressor's own environment)."""
    path = RESULTS_DIR / REFERENCE_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run tools/llm_compressor_rotation.py (its "
                                f"docstring says how) and write it there")
    return json.loads(path.read_text())


def reference_pairs(table: dict, rec: dict) -> list[dict]:
    """Each course row beside llm-compressor's recipe of the same scheme on the same windows:
    KL without a rotation (course, llm-compressor), with QuaRot's rotations (the course's
    ``rotate.quarot``; llm-compressor's SpinQuantModifier with R1-R4, random Hadamard) and
    llm-compressor's QuIPModifier (every Linear's input rotated online), and the course's
    rotated KL minus llm-compressor's QuaRot-style one window by window (``protocol.paired``;
    None where a recipe did not run)."""
    out = []
    for label, row, general, plain in REFERENCE_PAIRS:
        scheme, quantizer = plain.rsplit(" ", 1)
        r = find(table, row, general)
        ref = {k: rec["rows"].get(f"{scheme} {k}{quantizer}") for k in
               ("", "spinquant_r1-r4+", "quip+")}
        kl = lambda d: d.get("kl_nats") if d else None  # noqa: E731
        quarot = ref["spinquant_r1-r4+"]
        ok = quarot and "windows" in quarot and r["rotated"]
        out.append({"label": label, "course_plain": r["plain"]["kl_nats"],
                    "course_rotated": r["rotated"]["kl_nats"], "llmc_plain": kl(ref[""]),
                    "llmc_quarot": kl(quarot), "llmc_quip": kl(ref["quip+"]),
                    "course_minus_llmc": cprotocol.paired(
                        r["rotated"]["windows"]["kl_nats"], quarot["windows"]["kl_nats"])
                    if ok else None})
    return out


def format_reference(pairs: list[dict]) -> str:
    """:func:`reference_pairs` as plain text."""
    f = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
    lines = [f"{'':26s} {'no rotation':>21s} {'QuaRot rotations':>21s} {'QuIP':>7s}",
             f"{'':26s} {'course':>10s} {'llm-c.':>10s} {'course':>10s} {'llm-c.':>10s} "
             f"{'llm-c.':>7s}  course - llm-c. (rotated) [95%], windows course wins"]
    for p in pairs:
        c = p["course_minus_llmc"]
        d = (f"{c['diff']:+.4f} [{c['interval'][0]:+.4f}, {c['interval'][1]:+.4f}] "
             f"{c['a_better']}/{c['n_windows']}") if c else "-"
        lines.append(f"{p['label']:26s} {f(p['course_plain']):>10s} {f(p['llmc_plain']):>10s} "
                     f"{f(p['course_rotated']):>10s} {f(p['llmc_quarot']):>10s} "
                     f"{f(p['llmc_quip']):>7s}  {d}")
    return "\n".join(lines)
