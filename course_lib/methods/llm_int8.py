"""LLM.int8(): vector-wise INT8 matmul with a mixed-precision decomposition (lesson 05).

Paper: T. Dettmers, M. Lewis, Y. Belkada, L. Zettlemoyer,  # quotation: the paper's authors
"LLM.int8(): 8-bit Matrix Multiplication for Transformers at Scale",  # quotation: the paper's title
NeurIPS 2022.

The pieces, in the order lesson 05 teaches them:

- :func:`quantize_rows`: one absmax scale per row (a token of x, an output channel of W);
- :func:`int8_matmul_int32` and :func:`vectorwise_int8_matmul`: int8 x int8 products summed in
  int32, then each output y[m, n] scaled once by xs[m] * ws[n] ("vector-wise" quantization);
- :func:`outlier_columns` and :func:`mixed_int8_matmul`: the input feature columns of x in
  which any |x| reaches the threshold (6.0 in the paper) go through a 16-bit matmul, all the
  others through INT8;
- :class:`Int8Linear` and :func:`quantize_model_int8`: that layer swapped into a model;
- :func:`threshold_report`, :func:`systematic_features`, :class:`ZeroFeaturesLinear`: which
  columns cross the threshold, and the paper's ablation (zero those features);
- :func:`decomposition_cost`: what the 16-bit side path costs in bytes and FLOPs, counted
  as bitsandbytes computes it.

Weights are stored as int8 codes with one scale per output channel (over the whole row). The
16-bit path multiplies the outlier columns of x, unquantized, by the matching columns of the
weight *dequantized* from those codes, as bitsandbytes does when weights are stored in 8 bits.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib import quant
# The exact INT8 matmul and the tables' setups live one module below, shared with W8A8 (lesson
# 08); lesson 05 calls them from here (llm_int8.int8_matmul_int32).
from course_lib.methods.int8_common import QMAX, eval_windows, int8_matmul_int32  # noqa: F401

DEFAULT_THRESHOLD = 6.0
OUTLIER_MODES = ("fp16", "int8", "zero")


# ---------------------------------------------------------------------------- vector-wise INT8

def _check_matrix(x, what: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"{what} must be a 2-D floating-point tensor; got "
                         f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))} "
                         f"{getattr(x, 'dtype', '')}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{what} holds NaN or inf: an absmax scale would be meaningless; fix "
                         f"the values (torch.nan_to_num) before quantizing")
    return x


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT8 with one absmax scale per row (lesson 05): (q int8 (R, K), scale (R,)).

    scale[r] = max_k |x[r, k]| / 127 (1 for an all-zero row); q = round(x / scale) (half to
    even), clamped to [-127, 127]. Rows are tokens of an activation or output channels of a
    weight. The same numbers as ``course_lib.quant.quantize(x, "int8", "per_token")``.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x must be a 2-D floating-point tensor (rows, K); got "
                         f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))} "
                         f"{getattr(x, 'dtype', '')}")
    qt = quant.quantize(x.float(), "int8", "per_token")    # refuses NaN / inf itself
    return qt.q, qt.scale.reshape(-1).float()                         # (R, K) int8, (R,) fp32


def vectorwise_int8_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y ~ x @ w.T with both operands in INT8: per-token x per-output-channel scales (lesson 05).

    x (M, K), w (N, K) float. Returns (M, N) fp32: acc (int32) * xs[:, None] * ws[None, :].
    """
    _check_matrix(x, "x"), _check_matrix(w, "w")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x has {x.shape[1]} features but w expects {w.shape[1]}")
    xq, xs = quantize_rows(x)                                           # (M, K), (M,)
    wq, ws = quantize_rows(w)                                           # (N, K), (N,)
    acc = int8_matmul_int32(xq, wq)                                     # (M, N) int32
    return acc.float() * xs[:, None] * ws[None, :]                      # (M, N)


# ---------------------------------------------------------------------------- decomposition

def _check_threshold(threshold) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
            or not math.isfinite(threshold) or threshold <= 0:
        raise ValueError(f"threshold must be a positive magnitude such as 6.0 (the paper's); got "
                         f"{threshold!r}. For no decomposition use outliers='int8'")
    return float(threshold)


def outlier_columns(x: torch.Tensor, threshold: float = DEFAULT_THRESHOLD) -> torch.Tensor:
    """Indices (ascending, int64) of the columns of x (tokens, features) in which any
    |x| >= threshold (lesson 05). These feature columns go through the 16-bit matmul."""
    threshold = _check_threshold(threshold)
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D (tokens, features) tensor; got "
                         f"{tuple(getattr(x, 'shape', ()))}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x holds NaN or inf: a NaN never compares >= threshold, so its column "
                         "would silently stay in INT8; fix the activations first")
    return torch.nonzero((x.abs() >= threshold).any(dim=0)).flatten()  # (n_outliers,)


def mixed_int8_matmul(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                      threshold: float = DEFAULT_THRESHOLD, outliers: str = "fp16"
                      ) -> torch.Tensor:
    """LLM.int8()'s matmul (lesson 05): y = x_O @ W_O.T (16-bit) + INT8 rest, (M, N) fp32.

    x (M, K) float; w_q (N, K) int8 codes; w_scale (N,) per-output-channel scales.
    O = :func:`outlier_columns` of x. ``outliers``: "fp16" keeps those columns in 16-bit
    (the decomposition), "int8" quantizes every column (no decomposition; the threshold is
    ignored), "zero" drops the outlier columns altogether (the paper's ablation).
    Per-token scales of x are taken over the columns that go through INT8 only: without the
    outliers they are small, so the rest of the row keeps its resolution.
    """
    if outliers not in OUTLIER_MODES:
        raise ValueError(f"outliers must be one of {OUTLIER_MODES}; got {outliers!r}")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x must be a 2-D floating-point (tokens, features) tensor; got "
                         f"{tuple(getattr(x, 'shape', ()))} {getattr(x, 'dtype', '')}")
    if w_q.dtype != torch.int8 or w_q.dim() != 2 or w_q.shape[1] != x.shape[1]:
        raise ValueError(f"w_q must be int8 codes (N, {x.shape[1]}); got {w_q.dtype} "
                         f"{tuple(w_q.shape)} (make them with quantize_rows(w))")
    ws = torch.as_tensor(w_scale).reshape(-1).float()                   # (N,)
    if ws.numel() != w_q.shape[0]:
        raise ValueError(f"w_scale must hold one scale per output channel ({w_q.shape[0]}); got "
                         f"{ws.numel()}")
    if not bool(torch.isfinite(ws).all()) or bool((ws <= 0).any()):
        raise ValueError("w_scale must hold positive, finite scales (max |row| / 127, or 1 for "
                         "an all-zero row), as quantize_rows makes them")
    K = x.shape[1]
    if outliers == "int8":
        cols = torch.zeros(0, dtype=torch.long)
    else:
        cols = outlier_columns(x, threshold)                            # (n,)
    keep = torch.ones(K, dtype=torch.bool)
    keep[cols] = False                                                  # (K,) regular columns
    y = torch.zeros(x.shape[0], w_q.shape[0])                           # (M, N)
    if bool(keep.any()):                                                # (every column may cross)
        xq, xs = quantize_rows(x[:, keep].float())                      # (M, K-n), (M,)
        acc = int8_matmul_int32(xq, w_q[:, keep])                       # (M, N) int32
        y = acc.float() * xs[:, None] * ws[None, :]                     # (M, N)
    if outliers == "fp16" and len(cols):
        w_out = w_q[:, cols].float() * ws[:, None]                      # (N, n) dequantized
        y = y + x[:, cols].float() @ w_out.T                            # (M, N) 16-bit side path
    return y


class Int8Linear(nn.Module):
    """An ``nn.Linear`` computed the LLM.int8() way (lesson 05).

    Buffers: ``w_q`` int8 (out, in) and ``w_scale`` fp32 (out,). Each call quantizes the
    input per token on the fly and sends the columns crossing ``threshold`` through a 16-bit
    matmul (``outliers="fp16"``), or not (``"int8"``), or drops them (``"zero"``).
    """

    def __init__(self, linear: nn.Linear, threshold: float = DEFAULT_THRESHOLD,
                 outliers: str = "fp16"):
        super().__init__()
        if outliers not in OUTLIER_MODES:
            raise ValueError(f"outliers must be one of {OUTLIER_MODES}; got {outliers!r}")
        self.threshold = _check_threshold(threshold)
        self.outliers = outliers
        self.out_features, self.in_features = linear.weight.shape
        w_q, w_scale = quantize_rows(linear.weight.detach().float())     # (out, in), (out,)
        self.register_buffer("w_q", w_q)
        self.register_buffer("w_scale", w_scale)
        self.bias = linear.bias

    def forward(self, x):                                               # (..., in) -> (..., out)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input has {x.shape[-1]} features but this layer expects "
                             f"{self.in_features} (in_features)")
        y = mixed_int8_matmul(x.reshape(-1, self.in_features), self.w_q, self.w_scale,
                              self.threshold, self.outliers)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self):
        return (f"{self.in_features}, {self.out_features}, threshold={self.threshold:g}, "
                f"outliers={self.outliers}")


def quantize_model_int8(model: nn.Module, threshold: float = DEFAULT_THRESHOLD,
                        outliers: str = "fp16", skip=("lm_head", "embed_tokens"), only=None):
    """A copy of ``model`` with every Linear (but ``skip``) replaced by :class:`Int8Linear`."""
    from course_lib.methods import swap_linears

    _check_threshold(threshold)
    qm, _ = swap_linears(model, lambda name, lin: Int8Linear(lin, threshold, outliers),
                         skip=skip, only=only)
    return qm


# ---------------------------------------------------------------------------- analysis

def _check_acts(acts) -> None:
    if not isinstance(acts, dict) or not acts:
        raise ValueError("acts must be a non-empty dict {Linear name: (tokens, features) "
                         "inputs}, e.g. from activations.capture_linear_inputs")
    for name, x in acts.items():
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[0] == 0:
            raise ValueError(f"{name}: inputs must be a (tokens, features) tensor with at least "
                             f"one token; got {tuple(getattr(x, 'shape', ()))}")
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name}: inputs hold NaN or inf (a NaN never crosses a threshold, "
                             f"so it would be counted as small); check the model first")


def _check_fraction(v, what: str, example: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise ValueError(f"{what} is a fraction in [0, 1] ({example}, not a percent); got {v!r}")
    return float(v)


def threshold_report(acts: dict, threshold: float = DEFAULT_THRESHOLD) -> list[dict]:
    """Per Linear input (tokens, features): how many columns cross the threshold, on what
    fraction of the tokens, and which columns do most often (lesson 05)."""
    threshold = _check_threshold(threshold)
    _check_acts(acts)
    rows = []
    for name, x in acts.items():                                         # x: (T, K)
        hit = x.abs() >= threshold                                       # (T, K)
        per_col = hit.float().mean(0)                                    # (K,) token fraction
        cols = torch.nonzero(per_col > 0).flatten()
        top = cols[per_col[cols].argsort(descending=True)][:5]
        rows.append({"layer": name, "features": x.shape[1], "n_columns": int(cols.numel()),
                     "column_fraction": cols.numel() / x.shape[1],
                     "token_fraction": float(hit.any(1).float().mean()),
                     "max_abs": float(x.abs().max()), "top_columns": top.tolist()})
    return rows


def systematic_features(acts: dict, threshold: float = DEFAULT_THRESHOLD,
                        min_layer_fraction: float = 0.25, min_token_fraction: float = 0.06
                        ) -> dict[int, dict]:
    """The paper's outlier features: a hidden dimension whose magnitude reaches ``threshold``
    in at least ``min_layer_fraction`` of the layers and, there, on at least
    ``min_token_fraction`` of the tokens (6.0, 25% and 6% in the paper) (lesson 05).

    ``acts``: inputs of Linears that all read the same hidden dimensions (for example every
    block's q_proj and gate_proj: the normalized residual stream). Returns {dim: {"layers":
    fraction of layers, "tokens": mean token fraction where it crosses}}.
    """
    threshold = _check_threshold(threshold)
    _check_acts(acts)
    _check_fraction(min_layer_fraction, "min_layer_fraction", "0.25 for 25%")
    _check_fraction(min_token_fraction, "min_token_fraction", "0.06 for 6%")
    widths = {x.shape[1] for x in acts.values()}
    if len(widths) != 1:
        raise ValueError(f"the inputs have different widths {sorted(widths)}: pass Linears "
                         f"that read the same hidden dimensions (e.g. q_proj and gate_proj)")
    frac = torch.stack([(x.abs() >= threshold).float().mean(0) for x in acts.values()])  # (L, K)
    big = frac >= min_token_fraction                                      # (L, K)
    layer_share = big.float().mean(0)                                     # (K,)
    dims = torch.nonzero(layer_share >= min_layer_fraction).flatten().tolist()
    return {d: {"layers": float(layer_share[d]),
                "tokens": float(frac[big[:, d], d].mean())} for d in dims}


class ZeroFeaturesLinear(nn.Module):
    """A float Linear whose input feature columns ``columns`` are set to zero (lesson 05):
    the paper's ablation, which removes the outlier features instead of keeping them."""

    def __init__(self, linear: nn.Linear, columns):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        cols = torch.as_tensor(columns, dtype=torch.long).reshape(-1)
        if cols.numel() and (int(cols.min()) < 0 or int(cols.max()) >= linear.in_features):
            raise ValueError(f"columns must be input feature indices in 0..{linear.in_features - 1}"
                             f"; got {cols.tolist()[:8]}")
        mask = torch.ones(linear.in_features, dtype=linear.weight.dtype)
        mask[cols] = 0
        self.register_buffer("mask", mask)                               # (in,)

    def forward(self, x):                                                # (..., in) -> (..., out)
        return F.linear(x * self.mask, self.weight, self.bias)


def zero_features(model: nn.Module, columns: dict) -> nn.Module:
    """A copy of ``model`` where each Linear named in ``columns`` ({name: indices}) sees zeros
    in those input columns (lesson 05)."""
    from course_lib.methods import swap_linears

    if not columns:
        raise ValueError("columns is empty: pass {layer name: column indices}")
    qm, done = swap_linears(model, lambda n, lin: ZeroFeaturesLinear(lin, columns[n]),
                            skip=(), only=list(columns))
    extra = [n for n in done if n not in columns]
    if extra:   # a name fragment matched more layers than asked for
        raise ValueError(f"layer names {extra} matched a fragment but are not keys of columns")
    return qm


def decomposition_cost(M: int, N: int, K: int, n_outliers: int, act_bytes: int = 2) -> dict:
    """What the 16-bit side path adds to one W8A8 layer y = x W^T (lesson 05), counted the way
    bitsandbytes computes it: ``int8_mixed_scaled_mm`` in bitsandbytes 0.50.2,
    ``bitsandbytes/backends/default/ops.py`` lines 64-100 (its CUDA path calls the same op).

    A plain INT8 layer reads the int8 weight (N*K bytes) and the int8 activations (M*K) and
    writes the 16-bit output (M*N*act_bytes): ``base_bytes``. The decomposition adds
    (``extra_bytes``):

    - the gather of the n outlier columns of x into a contiguous copy (line 78): M*n read and
      written, 2*M*n*act_bytes;
    - the matching weight columns dequantized to 16-bit (lines 81-85): n*N int8 read, n*N
      16-bit written;
    - ``output.addmm(subA, subB)`` (line 98), which adds the 16-bit outlier product into the
      INT8 path's finished output: it reads both small operands ((M*n + n*N)*act_bytes) and
      reads and rewrites the whole output (``output_roundtrip_bytes`` = 2*M*N*act_bytes). A
      kernel that added the product in its epilogue would save that round trip.

    And 2*M*N*n FLOPs at the 16-bit rate (half the INT8 rate on A100/H100).
    """
    for v, what in ((M, "M"), (N, "N"), (K, "K"), (act_bytes, "act_bytes")):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{what} must be a positive integer; got {v!r}")
    if isinstance(n_outliers, bool) or not isinstance(n_outliers, int) or not 0 <= n_outliers <= K:
        raise ValueError(f"n_outliers must be a whole number of columns in 0..K={K}; got "
                         f"{n_outliers!r}")
    n = n_outliers
    base_bytes = N * K + M * K + M * N * act_bytes
    gather = 2 * M * n * act_bytes                                   # x[:, cols].contiguous()
    weight_cols = n * N + n * N * act_bytes                          # int8 read, 16-bit written
    operands = (M * n + n * N) * act_bytes                           # addmm reads subA, subB
    roundtrip = 0 if n == 0 else 2 * M * N * act_bytes               # addmm reads, rewrites y
    extra_bytes = gather + weight_cols + operands + roundtrip
    int8_flops, f16_flops = 2 * M * N * (K - n), 2 * M * N * n
    return {"base_bytes": base_bytes, "extra_bytes": extra_bytes,
            "output_roundtrip_bytes": roundtrip,
            "bytes_ratio": (base_bytes + extra_bytes) / base_bytes,
            "int8_flops": int8_flops, "fp16_flops": f16_flops,
            # matmul time relative to all-INT8: a 16-bit FLOP costs two INT8 ones on A100/H100
            "compute_ratio": (int8_flops + 2 * f16_flops) / (2 * M * N * K)}


# ---------------------------------------------------------------------------- the command

def outlier_facts(model, calib_ids: torch.Tensor, ref=None, threshold: float = DEFAULT_THRESHOLD,
                  spread: bool = False) -> dict:
    """What lesson 05 reads off a model: which input columns cross the threshold, per layer;
    the systematic features; and (with ``ref``) zeroing them versus zeroing as many random
    columns, against the reference (``spread``: with each window's figures and bootstrap
    intervals). Used by ``python -m course_lib.methods.llm_int8``."""
    from course_lib import activations
    from course_lib.methods.int8_common import score

    acts = activations.capture_linear_inputs(model, calib_ids, batch_size=4)
    acts = {n: x for n, x in acts.items() if not n.endswith(("k_proj", "v_proj", "up_proj"))}
    report = threshold_report(acts, threshold)
    normed = {n: x for n, x in acts.items() if n.endswith(("q_proj", "gate_proj"))}
    top = {n: x.abs().amax(0).topk(3).indices.tolist() for n, x in normed.items()}
    down = {n: {"max": float(x.abs().max()), "median_channel_max": float(x.abs().amax(0).median()),
                "channels_over_threshold": int(((x.abs() >= threshold).any(0)).sum())}
            for n, x in acts.items() if n.endswith("down_proj")}
    feats = systematic_features(normed, threshold)
    out = {"threshold": threshold, "report": report, "top3_channels_post_norm": top,
           "down_proj": down, "systematic_features": {str(k): v for k, v in feats.items()}}
    # what to zero: the systematic features, or (when the model has none by the paper's
    # criterion) the three channels most often among the top 3 of the normalized inputs
    if feats:
        zeroed, kind = list(feats), "systematic features"
    else:
        from collections import Counter
        counts = Counter(c for cols in top.values() for c in cols)
        zeroed, kind = [c for c, _ in counts.most_common(3)], "three most persistent channels"
    out["zeroed"], out["zeroed_kind"] = zeroed, kind
    if ref is not None:
        names = [n for n in (n for n, _ in model.named_modules())
                 if n.endswith(("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))]
        width = next(iter(normed.values())).shape[1]
        g = torch.Generator().manual_seed(0)
        others = [int(c) for c in torch.randperm(width, generator=g) if int(c) not in zeroed]
        rnd = others[:len(zeroed)]
        out["eval_windows"] = eval_windows(ref)
        out["reference"] = {"perplexity": ref.perplexity, "bits_per_byte": ref.bits_per_byte}
        out["zero_systematic"] = score(zero_features(model, {n: zeroed for n in names}), ref,
                                       spread)
        out["zero_random"] = score(zero_features(model, {n: rnd for n in names}), ref, spread)
        out["random_columns"] = rnd
    return out


def main(argv=None) -> int:
    import argparse
    import json
    from pathlib import Path

    p = argparse.ArgumentParser(description="LLM.int8() outlier facts -> results/llm_int8_<model>.json")
    p.add_argument("--model", choices=["bundled", "smollm2"], default="bundled")
    p.add_argument("--windows", type=int, default=None,
                   help="SmolLM2: evaluation windows of 512 tokens (default: the protocol's 8)")
    args = p.parse_args(argv)
    from course_lib.methods import int8_common as setups
    if args.windows is not None:
        setups.SMOLLM["n_windows"] = args.windows
    model, ref, calib = setups.bundled_setup() if args.model == "bundled" else setups.smollm_setup()
    out = outlier_facts(model, calib, ref, spread=args.model == "smollm2")
    out["model"] = args.model
    if args.model == "smollm2":
        out["protocol"] = setups.protocol_record(ref)
    from course_lib import device
    out["machine"] = device.machine_record()
    path = Path(__file__).resolve().parents[2] / "results" / f"llm_int8_{args.model}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
