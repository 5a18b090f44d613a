"""Shared plumbing of the kernel wrappers: input checks, launch plans (lesson 09).

Nothing here is a kernel; it keeps the three kernel files short and their checks identical.
"""
from __future__ import annotations

import math
import os

import torch

from kernels import INTERPRET

ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Batch sizes up to this use the GEMV-style kernel (one row of x per program, reductions
# with tl.sum); larger batches use the tl.dot kernel (tensor cores on a GPU).
GEMV_MAX_M = 8


def on_gpu() -> bool:
    """True when kernels run natively on a CUDA GPU (not the interpreter)."""
    return not INTERPRET and torch.cuda.is_available()


def check_activations(x: torch.Tensor, K: int, name: str = "x") -> torch.Tensor:
    """Check x (..., K) and return it as a contiguous (M, K) matrix."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in ACT_DTYPES:
        raise TypeError(f"{name} has dtype {x.dtype}; use float16, bfloat16 or float32 "
                        f"activations (convert with {name}.to(torch.bfloat16))")
    if x.dim() < 1 or x.shape[-1] != K:
        raise ValueError(f"{name} has shape {tuple(x.shape)} but the weight expects "
                         f"{K} input features in its last dimension")
    return x.reshape(-1, K).contiguous()  # (M, K)


def check_device(*tensors: torch.Tensor) -> None:
    """All tensors on one device; on a GPU machine that device must be CUDA."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"inputs are on different devices {sorted(map(str, devices))}; "
                         "move them to one device with .to(device)")
    dev = tensors[0].device
    if on_gpu() and dev.type != "cuda":
        raise ValueError(f"this machine runs Triton natively on the GPU but the inputs are on "
                         f"{dev}; move them with .cuda()")
    if INTERPRET and dev.type != "cpu":
        raise ValueError("Triton is in interpreter mode (TRITON_INTERPRET=1): pass CPU tensors")


def num_sms() -> int:
    """Streaming multiprocessors on the GPU (a CPU stand-in of 1 in the interpreter)."""
    if on_gpu():
        return torch.cuda.get_device_properties(0).multi_processor_count
    return 1


def gemv_plan(M: int, N: int, K: int, k_unit: int) -> tuple[int, int]:
    """Choose (BLOCK_N, SPLIT_K) for the GEMV kernels so the GPU has enough programs.

    A batch-1 GEMV reads each weight once; to reach memory bandwidth every SM needs several
    programs in flight. We split N into blocks of rows, as small as 8 rows when N is small,
    and when that is still too few programs we also split K (each split adds its partial
    sums into the output with an atomic add). ``k_unit`` is the smallest K step (a group).
    In the interpreter we pick small blocks and no split (speed does not matter there).
    """
    if not on_gpu():
        return 16, 1
    target = 4 * num_sms()  # programs wanted: a few waves of the whole GPU
    for block_n in (64, 32, 16, 8):
        if M * math.ceil(N / block_n) >= target:
            return block_n, 1
    programs = M * math.ceil(N / 8)
    if programs >= 2 * num_sms():  # two waves already: a split's extra zero-fill and cast
        return 8, 1                # kernels would cost more than they bring
    max_split = max(1, K // (4 * k_unit))  # each split keeps at least four K steps
    split_k = min(max_split, math.ceil(target / programs))
    return 8, max(1, split_k)


def pow2_at_least(n: int, lo: int = 16, hi: int = 128) -> int:
    """The smallest power of two >= n, clamped to [lo, hi] (block sizes must be powers of 2)."""
    return max(lo, min(hi, 1 << max(0, math.ceil(math.log2(max(n, 1))))))


def autotune_enabled() -> bool:
    """Autotune on a GPU unless COURSE_KERNELS_AUTOTUNE=0 (read at every call).

    Autotuning compiles and times every configuration for every new shape: right for a
    benchmark, slow for a test sweep over many small shapes (the GPU check runs its
    correctness tests with it off, and one test with it on).
    """
    return on_gpu() and os.environ.get("COURSE_KERNELS_AUTOTUNE", "1") != "0"


def choose(tuned, raw, gpu_default, interp_meta: dict):
    """(kernel, launch keywords) for one call: autotuned, a fixed GPU config, or interpreter."""
    if autotune_enabled():
        return tuned, {}
    if on_gpu():
        return raw, {**gpu_default.kwargs, "num_warps": gpu_default.num_warps,
                     "num_stages": gpu_default.num_stages}
    return raw, interp_meta
