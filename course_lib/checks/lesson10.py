"""Lesson 10 exercises: the roofline floor of a layer, the speed-up it allows a format, and
reading how a format's gain changes with the batch from another machine's results JSON.

References: ``course_lib.bench.layer_floor_ms``, ``course_lib.bench.floor_speedup`` and
``course_lib.bench.gain_by_batch``.
"""
from __future__ import annotations

from course_lib import bench
from course_lib.checks import Case, Exercise, register

H100 = {"bandwidth_gbps": 3350.0, "peak_tflops": 989.0}
A100 = {"bandwidth_gbps": 2039.0, "peak_tflops": 312.0}


# ---------------------------------------------------------------------------- 10.layer_floor_ms

def _floor_cases():
    return [
        Case((1, 28672, 8192), dict(H100), label="batch 1, BF16, H100: memory-bound"),
        Case((1, 28672, 8192, 4, 128), dict(H100), label="batch 1, INT4 g128 (scales count)"),
        Case((4096, 28672, 8192), dict(H100), label="prefill 4096 tokens: compute-bound"),
        Case((300, 4096, 4096, 8, 4096), dict(A100), label="A100, INT8 per channel, M=300"),
        Case((64, 1024, 4096), {"bandwidth_gbps": 25.0, "peak_tflops": None},
             label="a CPU: no compute peak, bandwidth only",
             hint="peak_tflops=None means no compute roof: the floor is the time of the bytes "
                  "alone."),
        Case((1, 4096, 4096), {"bandwidth_gbps": 0.0, "peak_tflops": 989.0},
             label="zero bandwidth", raises=ValueError),
        Case((1, 4096, 4096), {"bandwidth_gbps": float("nan"), "peak_tflops": 989.0},
             label="NaN bandwidth (a failed measurement)", raises=ValueError),
        Case((1, 4096, 4096), {"bandwidth_gbps": 3350.0, "peak_tflops": 0.0},
             label="a peak of 0 is not 'no peak' (None)", raises=ValueError),
        Case((1, 4096, 4096), {"bandwidth_gbps": 3350.0, "peak_tflops": -989.0},
             label="negative peak", raises=ValueError),
    ]


def _check_bw(bandwidth_gbps):
    if bandwidth_gbps <= 0:
        raise ValueError("bandwidth must be positive")


def _floor_zero_peak_as_none(M, N, K, weight_bits=16, group_size=None, bandwidth_gbps=3350.0,
                             peak_tflops=989.0):
    """Tested `if peak_tflops:` for "no compute roof": a peak of 0 (or below) is ignored."""
    return bench.layer_floor_ms(M, N, K, weight_bits, group_size, bandwidth_gbps,
                                peak_tflops if peak_tflops and peak_tflops > 0 else None)


def _floor_nan_passes(M, N, K, weight_bits=16, group_size=None, bandwidth_gbps=3350.0,
                      peak_tflops=989.0):
    """Checked `bandwidth_gbps <= 0` only: a NaN bandwidth gives a NaN floor, silently."""
    _check_bw(bandwidth_gbps)
    if bandwidth_gbps != bandwidth_gbps:
        return float("nan")
    return bench.layer_floor_ms(M, N, K, weight_bits, group_size, bandwidth_gbps, peak_tflops)


def _floor_bytes_only(M, N, K, weight_bits=16, group_size=None, bandwidth_gbps=3350.0,
                      peak_tflops=989.0):
    """Forgot the compute roof: prefill looks as cheap as its bytes."""
    _check_bw(bandwidth_gbps)
    return bench.linear_bytes(M, N, K, weight_bits, group_size=group_size) / (bandwidth_gbps * 1e9) * 1e3


def _floor_sum(M, N, K, weight_bits=16, group_size=None, bandwidth_gbps=3350.0, peak_tflops=989.0):
    """Added the memory and compute times instead of taking the larger (they overlap)."""
    _check_bw(bandwidth_gbps)
    t = bench.linear_bytes(M, N, K, weight_bits, group_size=group_size) / (bandwidth_gbps * 1e9)
    if peak_tflops is not None:
        t += bench.linear_flops(M, N, K) / (peak_tflops * 1e12)
    return t * 1e3


def _floor_seconds(M, N, K, weight_bits=16, group_size=None, bandwidth_gbps=3350.0,
                   peak_tflops=989.0):
    """Returned seconds, not milliseconds."""
    return bench.layer_floor_ms(M, N, K, weight_bits, group_size, bandwidth_gbps, peak_tflops) / 1e3


def _floor_weights_only(M, N, K, weight_bits=16, group_size=None, bandwidth_gbps=3350.0,
                        peak_tflops=989.0):
    """Counted only the weight bytes: no scales, no activations."""
    _check_bw(bandwidth_gbps)
    t_mem = N * K * weight_bits / 8 / (bandwidth_gbps * 1e9)
    t_flop = 0.0 if peak_tflops is None else bench.linear_flops(M, N, K) / (peak_tflops * 1e12)
    return max(t_mem, t_flop) * 1e3


register(Exercise(
    id="10.layer_floor_ms",
    title="the roofline floor of a linear layer",
    reference=bench.layer_floor_ms,
    cases=_floor_cases,
    hint=["Two things limit a layer: moving its bytes and doing its FLOPs. They overlap: do "
          "you add the two times or take one of them? And in which unit do you answer?",
          "bytes = bench.linear_bytes(M, N, K, weight_bits, group_size=group_size), FLOPs = "
          "bench.linear_flops(M, N, K); bandwidth_gbps is 1e9 bytes/s, peak_tflops 1e12 FLOP/s.",
          "max(bytes / (bandwidth_gbps * 1e9), flops / (peak_tflops * 1e12)) * 1e3; no compute "
          "term when peak_tflops is None (not when it is 0); ValueError unless bandwidth_gbps and "
          "a given peak_tflops are finite and positive (NaN too)"],
    wrong=[_floor_bytes_only, _floor_sum, _floor_seconds, _floor_weights_only,
           _floor_zero_peak_as_none, _floor_nan_passes],
    rtol=1e-9, atol=0.0,
))


# ---------------------------------------------------------------------------- 10.floor_speedup

def _speedup_cases():
    return [
        Case((1, 28672, 8192, 4, 128), label="W4A16 g128, batch 1, H100"),
        Case((4096, 28672, 8192, 4, 128), label="W4A16 g128, prefill: no gain"),
        Case((4096, 8192, 8192, 8, 8192), {"fmt_tflops": 1979.0}, label="FP8 W8A8 prefill, H100"),
        Case((16, 4096, 4096, 8, 4096), {"bandwidth_gbps": 2039.0, "base_tflops": 312.0},
             label="W8A16 batch 16 on an A100"),
        Case((256, 4096, 4096, 4, 32), label="W4A16 g32, batch 256: near the ridge"),
        Case((1, 4096, 4096, 4, 128), {"bandwidth_gbps": -1.0},
             label="a negative bandwidth: raise ValueError (as layer_floor_ms does)",
             raises=ValueError),
        Case((4096, 8192, 8192, 8, 8192), {"fmt_tflops": 0.0}, label="a format rate of 0 is not "
             "'the BF16 rate' (None): raise ValueError", raises=ValueError,
             hint="None means 'the BF16 rate'; 0 is a rate, and not a positive one. Does "
                  "`fmt_tflops or base_tflops` tell them apart?"),
        Case((1, 4096, 4096, 4, 128), {"base_tflops": float("nan")},
             label="a NaN BF16 rate: raise ValueError (as layer_floor_ms does)",
             raises=ValueError),
    ]


def _speedup_byte_ratio(M, N, K, weight_bits, group_size=None, bandwidth_gbps=3350.0,
                        base_tflops=989.0, fmt_tflops=None):
    """Only the bytes: predicts the decode gain at every batch, prefill included."""
    _check_bw(bandwidth_gbps)
    return bench.linear_bytes(M, N, K, 16) / bench.linear_bytes(M, N, K, weight_bits, group_size=group_size)


def _speedup_ignores_fmt_rate(M, N, K, weight_bits, group_size=None, bandwidth_gbps=3350.0,
                              base_tflops=989.0, fmt_tflops=None):
    """Ran every format's maths at the BF16 rate: FP8 loses its prefill gain."""
    return bench.floor_speedup(M, N, K, weight_bits, group_size, bandwidth_gbps, base_tflops, None)


def _speedup_inverted(M, N, K, weight_bits, group_size=None, bandwidth_gbps=3350.0,
                      base_tflops=989.0, fmt_tflops=None):
    """Divided the format's floor by BF16's (a slow-down factor, not a speed-up)."""
    return 1.0 / bench.floor_speedup(M, N, K, weight_bits, group_size, bandwidth_gbps,
                                     base_tflops, fmt_tflops)


def _speedup_zero_rate_as_none(M, N, K, weight_bits, group_size=None, bandwidth_gbps=3350.0,
                               base_tflops=989.0, fmt_tflops=None):
    """Wrote `fmt_tflops or base_tflops`: a rate of 0 silently becomes the BF16 rate."""
    return bench.floor_speedup(M, N, K, weight_bits, group_size, bandwidth_gbps, base_tflops,
                               fmt_tflops or None)


def _speedup_no_scales(M, N, K, weight_bits, group_size=None, bandwidth_gbps=3350.0,
                       base_tflops=989.0, fmt_tflops=None):
    """Forgot the scales' bytes of the quantized format."""
    return bench.floor_speedup(M, N, K, weight_bits, None, bandwidth_gbps, base_tflops, fmt_tflops)


register(Exercise(
    id="10.floor_speedup",
    title="the speed-up over BF16 that the roofline allows",
    reference=bench.floor_speedup,
    cases=_speedup_cases,
    hint=["A speed-up is the old time over the new time. What does each format move, and at "
          "which rate does each multiply?",
          "Both floors come from layer_floor_ms: BF16 with 16 bits, no scales, base_tflops; the "
          "format with weight_bits, group_size and its own rate.",
          "layer_floor_ms(M, N, K, 16, None, bw, base_tflops) / layer_floor_ms(M, N, K, "
          "weight_bits, group_size, bw, base_tflops if fmt_tflops is None else fmt_tflops)"],
    wrong=[_speedup_byte_ratio, _speedup_ignores_fmt_rate, _speedup_inverted, _speedup_no_scales,
           _speedup_zero_rate_as_none],
    rtol=1e-9, atol=0.0,
))


# ---------------------------------------------------------------------------- 10.gain_by_batch

def gain_by_batch_reference(result, fmt, layer_kn):
    """{M: baseline ms / fmt ms} over one layer's decode rows: ``course_lib.bench.gain_by_batch``."""
    return bench.gain_by_batch(result, fmt, layer_kn)


def _row(K, N, M, base, times, phase=None):
    return {"layer": f"{K}x{N}", "K": K, "N": N, "M": M, "baseline": base,
            "phase": phase or ("decode" if M <= 64 else "prefill"),
            "results": {f: {"ms": ms, "ratio_vs_bf16": None} for f, ms in times.items()}}


def _planted_gpu_result():
    """A made-up H100-like result (planted numbers, not a measurement): W4A16 gains 3.3x at
    batch 1 and less as the batch grows; a second layer and a prefill row to filter out."""
    rows = []
    for M, bf16, w4, w8 in [(1, 0.150, 0.045, 0.085), (4, 0.152, 0.060, 0.090),
                            (16, 0.160, 0.110, 0.100), (64, 0.200, 0.190, 0.150)]:
        rows.append(_row(8192, 28672, M, "bf16", {"bf16": bf16, "w4a16 g128": w4, "w8a16": w8}))
    rows.append(_row(8192, 28672, 2048, "bf16", {"bf16": 2.1, "w4a16 g128": 2.6, "w8a16": 2.3}))
    rows.insert(2, _row(4096, 4096, 1, "bf16", {"bf16": 0.012, "w4a16 g128": 0.006, "w8a16": 0.008}))
    return {"layers": rows}


def _committed_cpu_result():
    """The course's committed CPU run (results/*.json), whose baseline is fp32."""
    import json
    from pathlib import Path

    path = sorted((Path(__file__).resolve().parents[2] / "results").glob("bench_cpu_*.json"))[0]
    return json.loads(path.read_text())


def _gain_cases():
    cpu = _committed_cpu_result()
    cpu_row = next(r for r in cpu["layers"] if r["phase"] == "decode")
    cpu_fmt = [f for f in cpu_row["results"] if f.startswith("int4")][0]
    return [
        Case((_planted_gpu_result(), "w4a16 g128", (8192, 28672)), label="planted GPU run, W4A16"),
        Case((_planted_gpu_result(), "w8a16", (8192, 28672)), label="planted GPU run, W8A16"),
        Case((_planted_gpu_result(), "w4a16 g128", (4096, 4096)), label="the other layer: one batch"),
        Case((cpu, cpu_fmt, (cpu_row["K"], cpu_row["N"])),
             label="the committed CPU run: its baseline is fp32, not bf16",
             hint="Against which baseline is each row's ratio? row['baseline'] names it (fp32 on a "
                  "CPU)."),
        Case((_planted_gpu_result(), "fp8 w8a8", (8192, 28672)), label="a format not measured",
             raises=ValueError),
        Case((_planted_gpu_result(), "w8a16", (1024, 4096)), label="a layer not measured",
             raises=ValueError),
        Case((_shuffled(), "w4a16 g128", (8192, 28672)), label="rows stored out of batch order",
             hint="The batches in increasing order, whatever the rows' order in the file."),
        Case((_with_time(16, "w4a16 g128", 0.0), "w4a16 g128", (8192, 28672)),
             label="a time of 0 ms (a failed measurement)", raises=ValueError),
        Case((_with_time(4, "bf16", float("nan")), "w4a16 g128", (8192, 28672)),
             label="a NaN baseline time", raises=ValueError),
        Case((_with_time(1, "w4a16 g128", None), "w4a16 g128", (8192, 28672)),
             label="a missing time (None)", raises=ValueError),
        Case((_duplicated(4), "w4a16 g128", (8192, 28672)), label="two rows for batch 4",
             raises=ValueError),
    ]


def _shuffled():
    res = _planted_gpu_result()
    res["layers"] = res["layers"][::-1]
    return res


def _with_time(M, fmt, ms):
    res = _planted_gpu_result()
    row = next(r for r in res["layers"] if r["M"] == M and r["N"] == 28672)
    row["results"][fmt]["ms"] = ms
    return res


def _duplicated(M):
    import copy

    res = _planted_gpu_result()
    row = next(r for r in res["layers"] if r["M"] == M and r["N"] == 28672)
    twin = copy.deepcopy(row)
    twin["results"]["w4a16 g128"]["ms"] *= 2
    res["layers"].append(twin)
    return res


def _decode_rows(result, fmt, layer_kn, phase="decode"):
    rows = [r for r in result["layers"] if (r["K"], r["N"]) == tuple(layer_kn)
            and (phase is None or r["phase"] == phase)]
    if not rows or fmt not in rows[0]["results"]:
        raise ValueError(f"{fmt} or {layer_kn} not measured")
    return rows


def _gain_no_time_checks(result, fmt, layer_kn):
    """The right ratios, but no check of the times: a 0 ms raises ZeroDivisionError, a NaN or
    None time goes through (or fails deep inside Python), a duplicated batch overwrites."""
    return {r["M"]: r["results"][r["baseline"]]["ms"] / r["results"][fmt]["ms"]
            for r in sorted(_decode_rows(result, fmt, layer_kn), key=lambda r: r["M"])}


def _gain_last_row_wins(result, fmt, layer_kn):
    """Checked the times but let a second row of the same batch replace the first."""
    out = {}
    for r in sorted(_decode_rows(result, fmt, layer_kn), key=lambda r: r["M"]):
        b, t = r["results"][r["baseline"]]["ms"], r["results"][fmt]["ms"]
        if not all(isinstance(v, float) and 0 < v < float("inf") for v in (b, t)):
            raise ValueError("bad time")
        out[r["M"]] = b / t
    return out


def _gain_inverted(result, fmt, layer_kn):
    """Divided the format's time by the baseline's (a slow-down factor)."""
    return {r["M"]: r["results"][fmt]["ms"] / r["results"][r["baseline"]]["ms"]
            for r in _decode_rows(result, fmt, layer_kn)}


def _gain_vs_bf16_always(result, fmt, layer_kn):
    """Assumed the baseline is always bf16 (on a CPU run it is fp32)."""
    return {r["M"]: r["results"]["bf16"]["ms"] / r["results"][fmt]["ms"]
            for r in _decode_rows(result, fmt, layer_kn)}


def _gain_with_prefill(result, fmt, layer_kn):
    """Kept the prefill rows too (M = 2048 is not a decode batch)."""
    return {r["M"]: r["results"][r["baseline"]]["ms"] / r["results"][fmt]["ms"]
            for r in _decode_rows(result, fmt, layer_kn, phase=None)}


def _gain_any_layer(result, fmt, layer_kn):
    """Did not filter on the layer: another layer's row at the same batch overwrote it."""
    rows = [r for r in result["layers"] if r["phase"] == "decode" and fmt in r["results"]]
    _decode_rows(result, fmt, layer_kn)
    return {r["M"]: r["results"][r["baseline"]]["ms"] / r["results"][fmt]["ms"] for r in rows}


register(Exercise(
    id="10.gain_by_batch",
    title="how a format's gain changes with the batch, read from a results JSON",
    reference=gain_by_batch_reference,
    cases=_gain_cases,
    hint=["Which rows of result['layers'] belong to this layer and to decode, and against which "
          "format is each row's speed-up measured?",
          "Keep rows with (r['K'], r['N']) == layer_kn and r['phase'] == 'decode'; each row names "
          "its baseline in r['baseline'] (bf16 on most GPUs, fp32 on a CPU); raise ValueError "
          "when nothing matches, fmt is missing, a time is not a positive finite number, or "
          "two rows share a batch.",
          "{r['M']: r['results'][r['baseline']]['ms'] / r['results'][fmt]['ms'] for r in rows}"],
    wrong=[_gain_inverted, _gain_vs_bf16_always, _gain_with_prefill, _gain_any_layer,
           _gain_no_time_checks, _gain_last_row_wins],
    rtol=1e-12, atol=0.0,
))
