"""W8A8: weights *and* activations in 8 bits, INT8 or FP8 E4M3, side by side (lesson 08).

Weights are quantized once, per output channel. Activations are quantized at run time, in one
of two ways:

- ``static_per_tensor``: one scale per layer input, fixed in advance from calibration text
  (max |x| seen / qmax). Cheapest at run time, and the one an outlier hurts most: the outlier
  channel sets the scale for every value of every token. Values beyond the calibrated range
  are clipped.
- ``dynamic_per_token``: each token (row of x) gets its own scale max|x_row| / qmax, computed
  on the fly (a small extra kernel on a GPU, ``kernels.w8a8_int8`` / ``kernels.fp8_w8a8``).

INT8 products are summed exactly in int32 (``int8_common.int8_matmul_int32``); FP8 E4M3 codes
are the values of ``course_lib.formats``' grid (the same codes and scales as
``kernels.fp8_w8a8``'s GPU kernel, bit for bit) multiplied and summed in fp32, as the GPU
kernel accumulates. ``SmoothQuant`` (``methods.smoothquant``) is applied before quantizing.

The results command scores every variant and writes ``results/w8a8_<model>.json``::

    python -m course_lib.methods.w8a8 --model bundled
    python -m course_lib.methods.w8a8 --model smollm2      # SmolLM2-135M, when installed

Taught in lesson 08; papers: SmoothQuant (Xiao et al., ICML 2023), LLM.int8() (Dettmers et
al., NeurIPS 2022), FP8 formats (Micikevicius et al., 2022).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn as nn

from course_lib import device, quant
from course_lib.methods import llm_int8, smoothquant
from course_lib.methods.int8_common import (BUNDLED, SMOLLM, bundled_setup, eval_windows,
                                            int8_matmul_int32, protocol_record, smollm_setup)

FORMATS = {"int8": 127.0, "fp8_e4m3": 448.0}     # qmax: the largest code
ACT_MODES = ("static_per_tensor", "dynamic_per_token")
ROOT = Path(__file__).resolve().parents[2]


def _check(fmt: str, act: str):
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {list(FORMATS)}; got {fmt!r}")
    if act not in ACT_MODES:
        raise ValueError(f"act must be one of {ACT_MODES}; got {act!r}")


def quantize_weight(w: torch.Tensor, fmt: str = "int8") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel weights: (codes (N, K), scale (N,) fp32) (lesson 08).

    INT8 codes are int8; FP8 codes are ``torch.float8_e4m3fn`` (exactly the grid values of
    ``course_lib.quant``, as ``kernels.fp8_w8a8.quantize_weight`` makes them).
    """
    _check(fmt, "dynamic_per_token")
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D floating-point weight (N, K); got "
                         f"{tuple(getattr(w, 'shape', ()))}")
    qt = quant.quantize(w.detach().float(), fmt, "per_channel")
    q = qt.q if fmt == "int8" else qt.q.to(torch.float8_e4m3fn)
    return q, qt.scale.reshape(-1).float()


def quantize_activations(x: torch.Tensor, fmt: str = "int8", act: str = "dynamic_per_token",
                         static_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (codes (M, K), per-row scale (M,)) (lesson 08).

    dynamic_per_token: scale[m] = max|x[m]| / qmax (1 for an all-zero row), the rule of
    ``course_lib.quant`` and of the GPU kernels. static_per_tensor: every row uses
    ``static_scale`` (from calibration); values beyond qmax * static_scale are clipped.
    """
    _check(fmt, act)
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x must be a 2-D floating-point (tokens, features) tensor; got "
                         f"{tuple(getattr(x, 'shape', ()))}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x holds NaN or inf: 8-bit codes cannot carry them (a NaN would become "
                         "a finite code silently); check the layer before this one")
    if act == "dynamic_per_token":
        qt = quant.quantize(x.float(), fmt, "per_token")
        q, s = qt.q, qt.scale.reshape(-1).float()                         # (M, K), (M,)
    else:
        if isinstance(static_scale, bool) or not isinstance(static_scale, (int, float)) \
                or not 0 < static_scale < float("inf"):
            raise ValueError(f"static_per_tensor needs a positive, finite static_scale from "
                             f"calibration (max |x| on calibration text / qmax, e.g. 0.05): see "
                             f"calibrate_static_scales; got {static_scale!r}")
        qmax = FORMATS[fmt]
        y = (x.float() / static_scale).clamp(-qmax, qmax)                 # (M, K)
        if fmt == "int8":
            q = torch.round(y).to(torch.int8)
        else:
            from course_lib.formats import round_to_format
            q = round_to_format(y, fmt)
        s = torch.full((x.shape[0],), float(static_scale))
    if fmt == "fp8_e4m3":
        q = q.to(torch.float8_e4m3fn)                                     # exact: grid values
    return q, s


def w8a8_matmul(xq, xs, w_q, w_scale) -> torch.Tensor:
    """y[m, n] = xs[m] * ws[n] * sum_k xq[m, k] wq[n, k]: (M, N) fp32 (lesson 08).

    INT8: the sum is the exact int32 accumulator. FP8: each product of two E4M3 values is
    exact in fp32; the sum is in fp32, like the GPU kernel's accumulator."""
    codes = (torch.int8, torch.float8_e4m3fn)
    if xq.dtype not in codes or w_q.dtype != xq.dtype:
        raise TypeError(f"xq and w_q must both be int8 or both float8_e4m3fn codes (from "
                        f"quantize_activations and quantize_weight); got {xq.dtype} and {w_q.dtype}")
    if xq.dim() != 2 or w_q.dim() != 2 or xq.shape[1] != w_q.shape[1]:
        raise ValueError(f"expected xq (M, K) and w_q (N, K) with the same K; got "
                         f"{tuple(xq.shape)} and {tuple(w_q.shape)}")
    if tuple(xs.shape) != (xq.shape[0],) or tuple(w_scale.shape) != (w_q.shape[0],):
        raise ValueError(f"xs must be ({xq.shape[0]},) (one scale per token) and w_scale "
                         f"({w_q.shape[0]},) (one per output channel); got {tuple(xs.shape)} and "
                         f"{tuple(w_scale.shape)}")
    if xq.dtype == torch.int8:
        acc = int8_matmul_int32(xq, w_q).float()                 # (M, N)
    else:
        acc = xq.float() @ w_q.float().T                                  # (M, N)
    return acc * xs[:, None] * w_scale[None, :]


class W8A8Linear(nn.Module):
    """A Linear with 8-bit weights (per channel) and 8-bit activations (lesson 08).

    fmt: "int8" or "fp8_e4m3"; act: "dynamic_per_token" or "static_per_tensor" (then
    ``act_absmax``, the calibration max |x| of this layer's input, sets the scale).
    """

    def __init__(self, linear: nn.Linear, fmt: str = "int8", act: str = "dynamic_per_token",
                 act_absmax: float | None = None):
        super().__init__()
        _check(fmt, act)
        self.fmt, self.act = fmt, act
        self.out_features, self.in_features = linear.weight.shape
        w_q, w_scale = quantize_weight(linear.weight, fmt)
        self.register_buffer("w_q", w_q)                                  # (out, in)
        self.register_buffer("w_scale", w_scale)                          # (out,)
        self.static_scale = None
        if act == "static_per_tensor":
            if isinstance(act_absmax, bool) or not isinstance(act_absmax, (int, float)) \
                    or not 0 < act_absmax < float("inf"):
                raise ValueError(f"static_per_tensor needs this layer's calibration max |x|, a "
                                 f"positive finite number (act_absmax > 0); got {act_absmax!r}")
            self.static_scale = float(act_absmax) / FORMATS[fmt]
        self.bias = linear.bias

    def forward(self, x):                                                 # (..., in) -> (..., out)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input has {x.shape[-1]} features but this layer expects "
                             f"{self.in_features} (in_features)")
        xq, xs = quantize_activations(x.reshape(-1, self.in_features), self.fmt, self.act,
                                      self.static_scale)                  # (M, in), (M,)
        y = w8a8_matmul(xq, xs, self.w_q, self.w_scale)                   # (M, out)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}, {self.fmt}, {self.act}"


@torch.no_grad()
def calibrate_static_scales(model: nn.Module, ids: torch.Tensor, skip=("lm_head",),
                            batch_size: int = 8) -> dict[str, float]:
    """max |x| of every Linear's input over calibration ids (B, T): {name: float} (lesson 08)."""
    from course_lib import activations

    names = [n for n, m in model.named_modules()
             if isinstance(m, nn.Linear) and not any(s in n for s in skip)]
    acts = activations.capture_linear_inputs(model, ids, names=names, batch_size=batch_size)
    return {n: float(x.abs().max()) for n, x in acts.items()}


def quantize_model_w8a8(model: nn.Module, fmt: str = "int8", act: str = "dynamic_per_token",
                        act_absmax: dict | None = None, skip=("lm_head", "embed_tokens")):
    """A copy of ``model`` with every Linear but ``skip`` replaced by :class:`W8A8Linear`."""
    from course_lib.methods import swap_linears

    _check(fmt, act)
    if act_absmax is not None and not isinstance(act_absmax, dict):
        raise TypeError(f"act_absmax must be a dict {{Linear name: max |x|}} from "
                        f"calibrate_static_scales(model, ids); got {type(act_absmax).__name__}")
    if act == "static_per_tensor" and not act_absmax:
        raise ValueError("static_per_tensor needs act_absmax = calibrate_static_scales(model, ids)")

    def make(name, lin):
        a = None if act_absmax is None else act_absmax.get(name)
        if act == "static_per_tensor" and a is None:
            raise ValueError(f"no calibration maximum for {name}: calibrate the same model")
        return W8A8Linear(lin, fmt, act, a)
    return swap_linears(model, make, skip=skip)[0]


# ---------------------------------------------------------------------------- the table

VARIANTS = (
    # label, kind, fmt, act, smoothing alpha (None: no smoothing)[, extra smoothing groups]
    ("W8A16 INT8 (weights only)", "w8a16", "int8", None, None),
    ("W8A8 INT8 static per-tensor", "w8a8", "int8", "static_per_tensor", None),
    ("W8A8 INT8 static per-tensor + SmoothQuant 0.5", "w8a8", "int8", "static_per_tensor", 0.5),
    ("W8A8 INT8 static per-tensor + SmoothQuant 0.8", "w8a8", "int8", "static_per_tensor", 0.8),
    ("W8A8 INT8 static per-tensor + SmoothQuant 0.8, down_proj too", "w8a8", "int8",
     "static_per_tensor", 0.8, ("down_proj",)),
    ("W8A8 INT8 static per-tensor + SmoothQuant 0.8, down_proj and o_proj too", "w8a8", "int8",
     "static_per_tensor", 0.8, ("down_proj", "o_proj")),
    ("W8A8 INT8 dynamic per-token", "w8a8", "int8", "dynamic_per_token", None),
    ("W8A8 INT8 dynamic per-token + SmoothQuant 0.5", "w8a8", "int8", "dynamic_per_token", 0.5),
    ("W8A8 INT8 dynamic per-token + SmoothQuant 0.8", "w8a8", "int8", "dynamic_per_token", 0.8),
    ("W8A8 INT8 dynamic per-token + SmoothQuant 0.8, down_proj too", "w8a8", "int8",
     "dynamic_per_token", 0.8, ("down_proj",)),
    ("W8A8 INT8 dynamic per-token + SmoothQuant 0.8, down_proj and o_proj too", "w8a8", "int8",
     "dynamic_per_token", 0.8, ("down_proj", "o_proj")),
    ("W8A8 FP8 E4M3 dynamic per-token", "w8a8", "fp8_e4m3", "dynamic_per_token", None),
    ("LLM.int8() (threshold 6.0)", "llm_int8", "int8", "dynamic_per_token", None),
)


def build_variant(model, calib_ids, kind: str, fmt: str, act: str | None, alpha: float | None,
                  stats: dict | None = None, extra=()):
    """The quantized copy of ``model`` for one row of the table (lesson 08).

    stats: ``smoothquant.calibrate_absmax(model, calib_ids)`` (computed when None); extra:
    smoothing groups beyond the reference ones (``smoothquant.EXTRA_GROUPS``)."""
    if kind == "w8a16":
        from course_lib import qmodel
        return qmodel.quantize_model(model, "int8", "per_channel")[0]
    if kind == "llm_int8":
        return llm_int8.quantize_model_int8(model, llm_int8.DEFAULT_THRESHOLD, "fp16")
    if kind != "w8a8":
        raise ValueError(f"unknown kind {kind!r}: w8a16, w8a8 or llm_int8")
    base = model
    if alpha is not None:
        stats = stats if stats is not None else smoothquant.calibrate_absmax(model, calib_ids)
        base, _ = smoothquant.smooth_model(model, stats, alpha, extra=extra)
    absmax = calibrate_static_scales(base, calib_ids) if act == "static_per_tensor" else None
    return quantize_model_w8a8(base, fmt, act, absmax)


def _row_key(row: dict) -> tuple:
    smoothed = row.get("smoothed")
    if smoothed is None and row.get("alpha") is not None:
        smoothed = ["norms", "down_proj"]      # rows written before the reference default
    return (row["kind"], row["fmt"], row["act"], row["alpha"], tuple(smoothed or ()))


def score_variants(model, ref, calib_ids, variants=VARIANTS, log=print, reuse=(),
                   spread: bool = False) -> list[dict]:
    """Score each variant against the reference ``ref`` (``course_lib.eval``) (lesson 08).

    reuse: rows of an earlier run on the same windows and calibration; a variant found there
    (same kind, format, activations, alpha and smoothed groups) is copied, not recomputed.
    spread: each row also keeps its per-window figures and bootstrap intervals (SmolLM2)."""
    from course_lib.methods.int8_common import score

    stats = smoothquant.calibrate_absmax(model, calib_ids)
    known = {_row_key(r): r for r in reuse}
    rows = []
    for label, kind, fmt, act, alpha, *more in variants:
        extra = tuple(more[0]) if more else ()
        key = (kind, fmt, act, alpha, tuple(["norms", *extra]) if alpha is not None else ())
        if key in known:
            rows.append(dict(known[key], variant=label, smoothed=list(key[4]) or None))
            log(f"{label:48s} reused from the earlier run (same windows and calibration)")
            continue
        t0 = time.time()
        qm = build_variant(model, calib_ids, kind, fmt, act, alpha, stats, extra)
        r = score(qm, ref, spread)
        row = {"variant": label, "kind": kind, "fmt": fmt, "act": act, "alpha": alpha,
               "smoothed": None if alpha is None else ["norms", *extra],
               "bits_per_byte": r["bits_per_byte"], "kl_nats": r["kl_nats"],
               "top1_agreement": r["top1_agreement"]}
        for k in ("perplexity", "windows", "interval"):
            if k in r:
                row[k] = r[k]
        rows.append(row)
        log(f"{label:48s} KL {row['kl_nats']:.5f}  top-1 {row['top1_agreement']:.4f}  "
            f"({time.time() - t0:.1f} s)")
    return rows


def alpha_sweep(model, ref, calib_ids, alphas, act: str = "static_per_tensor",
                fmt: str = "int8", extra=()) -> list[dict]:
    """KL and top-1 of SmoothQuant + W8A8 at each alpha (lesson 08's plot); extra: smoothing
    groups beyond the reference ones."""
    extra = smoothquant._check_extra(extra)
    rows = [dict(alpha=a, **{k: v for k, v in r.items() if k in ("kl_nats", "top1_agreement")})
            for a, r in zip(alphas, score_variants(
                model, ref, calib_ids,
                [(f"alpha {a}", "w8a8", fmt, act, a, extra) for a in alphas],
                log=lambda *_: None))]
    return rows


# ---------------------------------------------------------------------------- the command

# the models' setups (BUNDLED, SMOLLM, bundled_setup, smollm_setup): course_lib.methods.int8_common
ALPHAS = (0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def protocol_window_texts(n: int) -> list[str]:
    """The decoded text of SmolLM2's first ``n`` evaluation windows (``smollm.WINDOW`` tokens)
    on the first protocol, "v1", whose halves overlap: lesson 05 measures that overlap window by
    window, the reason every SmolLM2 table moved to the clean split."""
    from course_lib import smollm

    ids, tok, W = smollm.eval_ids("v1"), smollm.tokenizer(), smollm.WINDOW
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(ids) // W:
        raise ValueError(f"n must be a whole number of windows in 1..{len(ids) // W}; got {n!r}")
    return [tok.decode(ids[i * W:(i + 1) * W].tolist()) for i in range(n)]


def add_sweep(model_name: str, alphas) -> int:
    """Add an alpha sweep to results/w8a8_<model>.json, on the file's own setup; the table's
    smoothed rows (alpha 0.5 and 0.8) join the sweep without being recomputed."""
    path = ROOT / "results" / f"w8a8_{model_name}.json"
    saved = json.loads(path.read_text())
    (BUNDLED if model_name == "bundled" else SMOLLM).update(saved["setup"])
    model, ref, calib = bundled_setup() if model_name == "bundled" else smollm_setup()
    sweep = {}
    for act in ACT_MODES:
        rows = alpha_sweep(model, ref, calib, list(alphas), act)
        for r in saved["rows"]:
            if r["kind"] == "w8a8" and r["fmt"] == "int8" and r["act"] == act \
                    and r["alpha"] is not None and r.get("smoothed") == ["norms"]:
                rows.append({"alpha": r["alpha"], "kl_nats": r["kl_nats"],
                             "top1_agreement": r["top1_agreement"]})
        sweep[act] = sorted(rows, key=lambda r: r["alpha"])
        print(act, [f"{r['alpha']}: {r['kl_nats']:.4f}" for r in sweep[act]])
    saved["alpha_sweep"] = sweep
    saved["alpha_sweep_smoothed"] = ["norms"]
    saved["alpha_sweep_machine"] = device.machine_record()   # the table's rows keep "machine"
    path.write_text(json.dumps(saved, indent=1) + "\n")
    print("wrote", path)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="W8A8 variants side by side -> results/w8a8_<model>.json")
    p.add_argument("--model", choices=["bundled", "smollm2"], default="bundled")
    p.add_argument("--no-sweep", action="store_true",
                   help="skip the alpha sweep (the results file's sweep is kept)")
    p.add_argument("--sweep-extra", nargs="*", default=[], choices=list(smoothquant.EXTRA_GROUPS),
                   help="smoothing groups beyond the reference ones for the alpha sweep")
    p.add_argument("--reuse", action="store_true",
                   help="copy rows of the existing results file measured on the same windows and "
                        "calibration instead of recomputing them")
    p.add_argument("--windows", type=int, default=None,
                   help="SmolLM2: evaluation windows of 512 tokens (default: the protocol's 8)")
    p.add_argument("--sweep-only", type=float, nargs="+", default=None, metavar="ALPHA",
                   help="add an alpha sweep at these alphas to the existing results file")
    args = p.parse_args(argv)
    if args.windows is not None:
        SMOLLM["n_windows"] = args.windows
    if args.sweep_only:
        return add_sweep(args.model, args.sweep_only)
    torch.manual_seed(0)
    t0 = time.time()
    model, ref, calib = bundled_setup() if args.model == "bundled" else smollm_setup()
    path = ROOT / "results" / f"w8a8_{args.model}.json"
    reuse, reused_machine = [], None
    if args.reuse and path.exists():
        old = json.loads(path.read_text())
        setup = BUNDLED if args.model == "bundled" else SMOLLM
        if {k: old["setup"].get(k) for k in setup} == setup and \
                abs(old["reference_bits_per_byte"] - ref.bits_per_byte) < 1e-9:
            reuse = old["rows"]
            reused_machine = old.get("machine", {"cpu": "not recorded",
                                                 "torch": old.get("torch", "not recorded")})
        else:
            print("--reuse: the results file was measured on another setup; recomputing all")
    rows = score_variants(model, ref, calib, reuse=reuse, spread=args.model == "smollm2")
    sweep, swept, sweep_machine = {}, ["norms", *args.sweep_extra], None
    if not args.no_sweep:
        for act in ACT_MODES:
            sweep[act] = alpha_sweep(model, ref, calib, ALPHAS, act, extra=args.sweep_extra)
            print(act, [f"{r['alpha']}: {r['kl_nats']:.5f}" for r in sweep[act]])
    elif path.exists():         # keep the file's sweep, saying which groups it smoothed
        old = json.loads(path.read_text())
        sweep = old.get("alpha_sweep", {})
        sweep_machine = old.get("alpha_sweep_machine", old.get("machine"))
        # files written before the reference default also smoothed down_proj
        swept = old.get("alpha_sweep_smoothed", ["norms", "down_proj"])
        if old.get("eval_windows", {}).get("n_windows", SMOLLM["n_windows"]) != \
                eval_windows(ref)["n_windows"]:
            sweep = {}
    out = {"model": args.model, "setup": BUNDLED if args.model == "bundled" else SMOLLM,
           "eval_windows": eval_windows(ref), "alpha_sweep_smoothed": swept,
           "reference_bits_per_byte": ref.bits_per_byte, "reference_perplexity": ref.perplexity,
           "rows": rows, "alpha_sweep": sweep,
           "torch": torch.__version__, "seconds": round(time.time() - t0, 1),
           "machine": device.machine_record()}
    if args.model == "smollm2":
        out["protocol"] = protocol_record(ref)
    if reused_machine is not None:     # --reuse: copied rows were measured there
        out["machine"]["reused_rows_machine"] = reused_machine
    if sweep and sweep_machine is not None:    # --no-sweep kept the file's sweep: measured there
        out["alpha_sweep_machine"] = sweep_machine
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
