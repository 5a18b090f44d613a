"""Launch-plan sweep for the weight-only GEMV kernels on a GPU (lessons 09-10).

    python -m kernels.sweep_gemv            # writes results/sweep_gemv_<gpu>.json
    python -m kernels.sweep_gemv --fp8-only # only the FP8 accumulation part, into that file

The benchmark (``kernels.bench``) times each kernel the way a model calls it: the autotuner
picks BLOCK_K, warps and stages, and ``kernels._common.gemv_plan`` picks BLOCK_N and split-K.
When a kernel misses its target there, this sweep says whether another launch plan would
have met it: for batch 1 on a Llama 8B and a Llama 70B layer it times every (BLOCK_N,
SPLIT_K, configuration) of the W4A16 and W8A16 GEMV kernels with the configuration forced,
next to torch's BF16 matmul and the W4A16 wrapper's separate activation preparation.
It also measures how far the FP8 GEMM's sums are from exact, with the kernel's promotion to
fp32 every BLOCK_K (see ``kernels.fp8_w8a8``), against the tests' bound of 2^-13.

GPU only (it refuses on a CPU: the interpreter's timings mean nothing). Medians of
``triton.testing.do_bench``. Each row is saved as it is measured.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

import kernels  # noqa: F401  (TRITON_INTERPRET before triton)
from kernels._triton import triton  # Triton, or its stand-in where it is not installed
from course_lib import device
from kernels import w4a16, w8a16
from kernels._common import gemv_plan, on_gpu

SHAPES = [("70B gate/up_proj", 28672, 8192), ("8B q/o_proj", 4096, 4096)]   # (name, N, K)
BLOCK_NS = (8, 16, 32, 64)
SPLITS = (1, 2, 4)
# (BLOCK_K, warps, stages): the autotune lists' larger steps, and steps of up to 1024 weights
W4_CONFIGS = [(256, 4, 3), (256, 8, 3), (512, 4, 3), (512, 8, 2), (1024, 4, 2), (1024, 8, 2)]
W8_CONFIGS = [(128, 4, 3), (256, 4, 3), (256, 8, 3), (512, 4, 3), (512, 8, 2)]


def _configs(triples):
    return [triton.Config({"BLOCK_K": bk}, num_warps=w, num_stages=s) for bk, w, s in triples]


def _time(fn) -> float:
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=10, rep=40, return_mode="median"))   # ms


def sweep(out_path: str, budget_s: float = 200.0) -> dict:
    t_start = time.time()
    props = torch.cuda.get_device_properties(0)
    res = {"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
           "triton": triton.__version__, "machine": device.machine_record(),   # the host CPU
           "rows": [], "fp8_accumulation": [], "partial": True}

    def save():
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)

    g = torch.Generator(device="cuda").manual_seed(0)
    for name, N, K in SHAPES:
        w = torch.randn(N, K, device="cuda", generator=g) / K ** 0.5            # (N, K)
        x = torch.randn(1, K, device="cuda", generator=g).to(torch.bfloat16)     # (1, K)
        wb = w.to(torch.bfloat16)
        bf16_ms = _time(lambda: x @ wb.T)
        t4 = w4a16.quantize_weight(w, 128)
        wq8, s8 = w8a16.quantize_weight(w)
        wq8, s8 = wq8.cuda(), s8.cuda()
        xp_ms = _time(lambda: w4a16.gemv_activations(x))
        shape = {"shape": name, "N": N, "K": K, "bf16_ms": bf16_ms,
                 "w4a16_activation_prep_ms": xp_ms,
                 "w4a16_default_ms": _time(lambda: w4a16.w4a16_linear(x, t4)),
                 "w8a16_default_ms": _time(lambda: w8a16.w8a16_linear(x, wq8, s8)),
                 "plan_w4": gemv_plan(1, N, K, 128), "plan_w8": gemv_plan(1, N, K, 64)}
        print(f"{name}: bf16 {bf16_ms:.4f} ms, w4a16 (autotuned) {shape['w4a16_default_ms']:.4f} "
              f"ms, w8a16 {shape['w8a16_default_ms']:.4f} ms, activation prep {xp_ms:.4f} ms",
              flush=True)
        cases = [(kind, bn, sk, c) for bn in BLOCK_NS for sk in SPLITS   # both kinds advance
                 for kind, cfgs in (("w4a16", _configs(W4_CONFIGS)),     # together under the
                                    ("w8a16", _configs(W8_CONFIGS)))      # time budget
                 for c in cfgs]
        shape_end = time.time() + budget_s / len(SHAPES)
        for kind, bn, sk, c in cases:
            if time.time() > shape_end:
                res["stopped_early"] = f"budget of {budget_s} s spent"
                break
            row = {"shape": name, "kernel": kind, "BLOCK_N": bn, "SPLIT_K": sk,
                   "BLOCK_K": c.kwargs["BLOCK_K"], "warps": c.num_warps, "stages": c.num_stages}
            try:
                if kind == "w4a16":
                    fn = lambda: w4a16.w4a16_linear(x, t4, block_n=bn, split_k=sk, config=c)  # noqa: E731
                    wbytes = t4.nbytes()
                else:
                    fn = lambda: w8a16.w8a16_linear(x, wq8, s8, block_n=bn, split_k=sk, config=c)  # noqa: E731
                    wbytes = wq8.numel() + s8.numel() * 4
                ms = _time(fn)
                row.update(ms=ms, speedup_vs_bf16=bf16_ms / ms, weight_gbps=wbytes / ms / 1e6)
            except Exception as e:   # a config that does not fit (registers, shared memory)
                row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
            res["rows"].append(row)
        best = {}
        for kind in ("w4a16", "w8a16"):
            ok = [r for r in res["rows"] if r["shape"] == name and r["kernel"] == kind and "ms" in r]
            if ok:
                best[kind] = min(ok, key=lambda r: r["ms"])
                print(f"  best {kind}: {best[kind]}", flush=True)
        shape["best"] = best
        res.setdefault("shapes", []).append(shape)
        save()
    res["fp8_accumulation"] = fp8_accumulation()
    res["partial"] = False
    res["seconds"] = round(time.time() - t_start, 1)
    save()
    return res


def fp8_accumulation() -> list:
    """Max |FP8 GEMM - exact| / sum|products| for K = 512..8192 at M = 64, N = 1024, and the
    prefill time at M = 4096 on a 70B q/o_proj against BF16, with Triton's fast Hopper
    accumulation (``fast_accum=True``, the default) and with promotion to fp32 every
    BLOCK_K (``fast_accum=False``)."""
    from kernels import fp8_w8a8 as f8
    ok, why = f8.fp8_supported()
    if not ok:
        return [{"skipped": why}]
    out = []
    for fast in (True, False):
        for K in (512, 2048, 4096, 8192):
            g = torch.Generator().manual_seed(K)
            w = torch.randn(1024, K, generator=g) / K ** 0.5
            x = torch.randn(64, K, generator=g)
            w_q, ws = f8.quantize_weight(w)
            xq, xs = f8.quantize_activations(x)
            exact = (xq.double() @ w_q.double().T) * xs.double()[:, None] * ws.double()[None, :]
            mag = ((xq.double().abs() @ w_q.double().abs().T) * xs.double()[:, None]
                   * ws.double()[None, :])
            y = f8.fp8_gemm(xq.cuda(), xs.cuda(), w_q.cuda(), ws.cuda(), out_dtype=torch.float32,
                            fast_accum=fast)
            rel = float(((y.double().cpu() - exact).abs() / mag).max())
            out.append({"fast_accum": fast, "K": K, "max_err_over_mag": rel})
            print(f"  fp8 fast_accum={fast} K={K}: max |err| / sum|products| = {rel:.2e} "
                  f"(2^-13 = {2 ** -13:.2e})", flush=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    w = torch.randn(8192, 8192, device="cuda", generator=g) / 8192 ** 0.5
    x = torch.randn(4096, 8192, device="cuda", generator=g).to(torch.bfloat16)
    w_q, ws = f8.quantize_weight(w)
    wb = w.to(torch.bfloat16)
    bf16_ms = _time(lambda: x @ wb.T)
    for fast in (True, False):
        fp8_ms = _time(lambda: f8.fp8_w8a8_linear(x, w_q, ws, fast_accum=fast))
        out.append({"fast_accum": fast, "prefill_M": 4096, "N": 8192, "K": 8192,
                    "bf16_ms": bf16_ms, "fp8_w8a8_ms": fp8_ms, "speedup_vs_bf16": bf16_ms / fp8_ms})
        print(f"  fp8 W8A8 fast_accum={fast} prefill M=4096 8192x8192: {fp8_ms:.3f} ms vs bf16 "
              f"{bf16_ms:.3f} ms ({bf16_ms / fp8_ms:.2f}x)", flush=True)
    return out


def fp8_codes_by_device() -> dict:
    """Where course_lib.quant's per-token FP8 codes differ between the CPU and the GPU."""
    from kernels import fp8_w8a8 as f8
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1000, generator=g)
    xq_c, xs_c = f8.quantize_activations(x)
    xq_g, xs_g = f8.quantize_activations(x.cuda())
    diff = (xq_c.float() != xq_g.cpu().float())
    idx = diff.nonzero()[:8].tolist()
    rows = [{"x": float(x[i, j]), "scale_cpu": float(xs_c[i]), "scale_gpu": float(xs_g[i]),
             "x_over_scale_cpu": float(x[i, j] / xs_c[i]),
             "x_over_scale_gpu": float((x.cuda()[i, j] / xs_g[i]).cpu()),
             "code_cpu": float(xq_c[i, j].float()), "code_gpu": float(xq_g[i, j].float().cpu())}
            for i, j in idx]
    res = {"n_codes": diff.numel(), "n_differ": int(diff.sum()),
           "scales_equal": bool(torch.equal(xs_c, xs_g.cpu())), "examples": rows}
    print(f"  FP8 codes CPU vs GPU: {res['n_differ']} of {res['n_codes']} differ; scales equal: "
          f"{res['scales_equal']}; {rows[:3]}", flush=True)
    return res


def main() -> int:
    if not on_gpu():
        print("kernels.sweep_gemv: needs a CUDA GPU (the Triton interpreter's timings mean "
              "nothing); on a CPU run `python -m kernels.bench --quick` instead", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0).lower().replace(" ", "_")
    os.makedirs("results", exist_ok=True)
    path = os.path.join("results", f"sweep_gemv_{name}.json")
    if "--fp8-only" in sys.argv:     # update only the FP8 sections of an earlier sweep
        res = json.load(open(path)) if os.path.exists(path) else {"device": torch.cuda.get_device_name(0)}
        res["fp8_accumulation"] = fp8_accumulation()
        res["fp8_codes_by_device"] = fp8_codes_by_device()
        res["fp8_machine"] = device.machine_record()        # this update's host
        res.setdefault("machine", res["fp8_machine"])
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {path}")
        return 0
    budget = float(os.environ.get("SWEEP_BUDGET_S", "200"))
    sweep(path, budget)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
