"""The course's GPU performance targets, and the measurements that separate the hypotheses
for a slow W4A16 decode: one part of the benchmark ``python -m kernels.bench`` (lesson 10).

``evaluate_targets`` reads a run's rows against each target (value and met, null when this
machine cannot measure it) and ``targets_table`` prints them; ``separating_measurements``
(``python -m kernels.bench --separate``, GPU only) times the pieces of the weight-only calls.
"""
from __future__ import annotations

import torch
from kernels._triton import triton  # Triton, or its stand-in where it is not installed

from course_lib import bench
from kernels.bench_decode import _cuda_graph
from kernels.bench_layers import device_record, versions


# ---------------------------------------------------------------------------------- targets

def _find(rows, layer_kn, M, fmt):
    for r in rows:
        if (r["K"], r["N"], r["M"]) == (*layer_kn, M) and fmt in r["results"]:
            return r["results"][fmt]
    return None


def evaluate_targets(rows: list[dict], decode: dict | None, read_gbps: float | None,
                     on_gpu: bool, is_hopper: bool) -> list[dict]:
    """The course's GPU performance targets, each with value and met (null if unmeasured).

    Bandwidth shares are of the measured *read* bandwidth: a GEMV only reads its weights,
    so against a copy (read + write) it can pass 100%.
    """
    copy_gbps = read_gbps
    def ratio(kn, M, fmt):
        r = _find(rows, kn, M, fmt) if on_gpu else None
        return None if r is None else r["ratio_vs_baseline"]

    def bw_share(kn, M, fmt):
        r = _find(rows, kn, M, fmt) if on_gpu else None
        return None if r is None or not copy_gbps else r["gbps"] / copy_gbps

    dec = None
    if on_gpu and decode and "w4a16 g128" in decode.get("results", {}):
        dec = decode["results"]["w4a16 g128"]["ratio_vs_baseline"]
    fp8 = ratio((8192, 8192), 4096, "fp8 w8a8") if is_hopper else None
    spec = [
        ("bf16_gemv_read_bw", "BF16 GEMV (8192x28672, batch 1) >= 65% of measured read bandwidth",
         0.65, bw_share((8192, 28672), 1, "bf16")),
        ("w4a16_b1_70b_mlp", "W4A16 g128 batch 1 at 8192x28672 >= 2.8x BF16", 2.8,
         ratio((8192, 28672), 1, "w4a16 g128")),
        ("w4a16_b1_4096", "W4A16 g128 batch 1 at 4096x4096 >= 2.0x BF16", 2.0,
         ratio((4096, 4096), 1, "w4a16 g128")),
        ("w4a16_b1_read_bw", "W4A16 g128 batch 1 at 8192x28672 >= 60% of read bandwidth "
         "(quantized bytes)", 0.60, bw_share((8192, 28672), 1, "w4a16 g128")),
        ("w8a16_b1_70b_mlp", "W8A16 batch 1 at 8192x28672 >= 1.7x BF16", 1.7,
         ratio((8192, 28672), 1, "w8a16")),
        ("w4a16_b16_70b_mlp", "W4A16 g128 batch 16 at 8192x28672 >= 1.5x BF16", 1.5,
         ratio((8192, 28672), 16, "w4a16 g128")),
        ("fp8_prefill_m4096", "FP8 W8A8 incl. activation quantization, M=4096 at 8192x8192 "
         "(Hopper) >= 1.3x BF16", 1.3, fp8),
        ("int8_prefill_m4096", "INT8 W8A8 incl. activation quantization, M=4096 at 8192x8192 "
         "(cc >= 8.0: INT8 tensor cores at twice the BF16 rate) >= 1.4x BF16", 1.4,
         ratio((8192, 8192), 4096, "int8 w8a8")),
        ("decode_w4a16_b1", "End-to-end decode batch 1: W4A16 >= 2x BF16 tokens/s", 2.0, dec),
    ]
    return [{"id": i, "description": d, "threshold": t, "value": v,
             "met": None if v is None else bool(v >= t)} for i, d, t, v in spec]


def targets_table(result: dict) -> str:
    """The performance targets as text: met / MISSED / - (not measured), with the value."""
    out = []
    for t in result["targets"]:
        v = "not measured" if t["value"] is None else f"{t['value']:.2f}"
        if t["id"] == "cpu_quick_under_60s" and t["value"] is not None:
            v = f"{t['value']:.1f} s"
        out.append(f"[{ {True: 'met', False: 'MISSED', None: '-'}[t['met']]:6s}] {t['description']}: {v}")
    return "\n".join(out)


# ------------------------------------------------------------------ separating measurements

def separating_measurements(shapes=((4096, 4096), (8192, 28672)), log=print) -> dict:
    """The measurements that separate the slow-decode hypotheses (GPU only; CUDA graphs):

    * W8A16 at batch 1 through the tensor-core kernel against the CUDA-core GEMV on the same
      bytes (pipelining and tensor cores, or the dequantization maths?);
    * the W4A16 kernel alone (one launch, x used as it is) against the first version's
      activation preparation alone (``gemv_activations``) and its GEMV kernel alone;
    * the decode-attention kernel (lesson 11) at its benchmark sizes.
    Each output is checked against the plain-torch reference before it is timed.
    """
    from course_lib.device import require_gpu
    from kernels import w4a16, w8a16
    from kernels.decode_attention import benchmark_rows

    require_gpu("kernels.bench.separating_measurements")
    out = {"device": device_record(), "versions": versions(), "layers": []}
    for K, N in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        w = torch.randn(N, K, device="cuda", generator=g) / K ** 0.5      # (N, K)
        x = torch.randn(1, K, device="cuda", generator=g).to(torch.bfloat16)
        w_q, s8 = w8a16.quantize_weight(w)
        wt = w4a16.quantize_weight(w, 128)
        words = wt.packed.view(torch.int32)
        xp = w4a16.gemv_activations(x)
        y = torch.empty((1, N), device="cuda", dtype=torch.bfloat16)

        def gemv_kernel_alone():
            w4a16.w4a16_gemv_kernel[(triton.cdiv(N, 32), 1)](
                xp, words, wt.scale, wt.scale, y, 1, N, K, xp.stride(0), words.stride(0),
                wt.scale.stride(0), y.stride(0), w4a16.MAGIC.value, GROUP=128, BLOCK_M=1,
                BLOCK_N=32, SPLIT_K=1, HAS_ZERO=False, BLOCK_K=256, num_warps=4, num_stages=3)

        calls = {
            "w8a16 dot M=1": lambda: w8a16.w8a16_linear(x, w_q, s8),
            "w8a16 gemv M=1": lambda: w8a16.w8a16_linear(x, w_q, s8, kernel="gemv"),
            "w4a16 dot kernel (whole call)": lambda: w4a16.w4a16_linear(x, wt),
            "w4a16 gemv: activation preparation alone": lambda: w4a16.gemv_activations(x),
            "w4a16 gemv: kernel alone": gemv_kernel_alone,
            "w4a16 gemv (whole call)": lambda: w4a16.w4a16_linear(x, wt, kernel="gemv"),
        }
        ref8, ref4 = w8a16.w8a16_reference(x, w_q, s8).float(), w4a16.w4a16_reference(x, wt).float()
        for name, ref in (("w8a16 dot M=1", ref8), ("w8a16 gemv M=1", ref8),
                          ("w4a16 dot kernel (whole call)", ref4), ("w4a16 gemv (whole call)", ref4)):
            err = ((calls[name]().float() - ref).norm() / ref.norm()).item()
            assert err < 2e-2, f"{name} at {K}x{N}: relative error {err:.3g}"
        row = {"K": K, "N": N, "us": {}}
        for name, fn in calls.items():
            step, graph = _cuda_graph(fn)
            row["us"][name] = round(1e3 * bench.time_gpu(step), 2)
            row.setdefault("cuda_graph", {})[name] = graph
            log(f"  {K}x{N} {name}: {row['us'][name]} us")
        out["layers"].append(row)
    try:
        out["decode_attention"] = benchmark_rows()
    except Exception as e:  # noqa: BLE001  (never timed on a GPU before: record, go on)
        out["decode_attention"] = {"error": f"{type(e).__name__}: {e}"}
    return out
