"""Lesson 10 exercises: the roofline floor of a layer, and the speed-up it allows a format.

References: ``course_lib.bench.layer_floor_ms`` and ``course_lib.bench.floor_speedup``.
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
             label="a CPU: no compute peak, bandwidth only"),
        Case((1, 4096, 4096), {"bandwidth_gbps": 0.0, "peak_tflops": 989.0},
             label="zero bandwidth", raises=ValueError),
    ]


def _check_bw(bandwidth_gbps):
    if bandwidth_gbps <= 0:
        raise ValueError("bandwidth must be positive")


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
    hint=("time = max(bytes / bandwidth, FLOPs / peak), in ms; bytes = "
          "bench.linear_bytes(M, N, K, weight_bits, group_size=group_size) (weights, 16-bit "
          "scales, x, y), FLOPs = 2*M*N*K; bandwidth_gbps is 1e9 bytes/s, peak_tflops 1e12 "
          "FLOP/s; peak None means no compute roof; bandwidth <= 0 raises ValueError"),
    wrong=[_floor_bytes_only, _floor_sum, _floor_seconds, _floor_weights_only],
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
        Case((1, 4096, 4096, 4, 128), {"bandwidth_gbps": -1.0}, label="negative bandwidth",
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


def _speedup_no_scales(M, N, K, weight_bits, group_size=None, bandwidth_gbps=3350.0,
                       base_tflops=989.0, fmt_tflops=None):
    """Forgot the scales' bytes of the quantized format."""
    return bench.floor_speedup(M, N, K, weight_bits, None, bandwidth_gbps, base_tflops, fmt_tflops)


register(Exercise(
    id="10.floor_speedup",
    title="the speed-up over BF16 that the roofline allows",
    reference=bench.floor_speedup,
    cases=_speedup_cases,
    hint=("floor(BF16) / floor(format) with layer_floor_ms: BF16 uses 16 bits, no scales and "
          "base_tflops; the format uses weight_bits, group_size and fmt_tflops (None: the BF16 "
          "rate, since weight-only formats multiply in BF16)"),
    wrong=[_speedup_byte_ratio, _speedup_ignores_fmt_rate, _speedup_inverted, _speedup_no_scales],
    rtol=1e-9, atol=0.0,
))
