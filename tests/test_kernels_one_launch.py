"""One launch per call (issue 18, design item 1): a W4A16 or W8A16 call at any batch runs
exactly one Triton kernel and no other torch compute op (views and ``empty`` allowed).

Counted two ways, so that the test can fail: a TorchDispatchMode records every torch op the
wrapper runs (it is paused while the kernel runs: in the interpreter, the launch itself
copies tensors with torch ops), and a stand-in for the jitted kernel counts its launches.
The teaching GEMV (which relayouts x every call) is the negative control.
"""
import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernels import w4a16, w8a16
from kernels._common import on_gpu

DEV = "cuda" if on_gpu() else "cpu"
ALLOWED = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default}


class _Ops(TorchDispatchMode):
    """Records the torch ops run while it is active and not paused."""

    def __init__(self):
        super().__init__()
        self.ops, self.paused = [], False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.ops.append(func)
        return func(*args, **(kwargs or {}))

    def compute(self):
        """Ops that compute: everything but views, metadata and allocation."""
        return [f for f in self.ops if not (getattr(f, "is_view", False) or f in ALLOWED)]


class _Launches:
    """Stands in for a jitted kernel: counts launches, pauses the op recorder meanwhile."""

    def __init__(self, kernel, ops):
        self.kernel, self.ops, self.count = kernel, ops, 0

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.count += 1
            self.ops.paused = True
            try:
                return self.kernel[grid](*args, **kw)
            finally:
                self.ops.paused = False
        return launch


def _count(monkeypatch, mod, names, call):
    """(kernel launches, torch compute ops) of one call, after a warm-up call."""
    call()                                     # warm-up: prepack, split-K workspace
    ops = _Ops()
    launchers = [_Launches(getattr(mod, n), ops) for n in names]
    for n, l in zip(names, launchers):
        monkeypatch.setattr(mod, n, l)
    with ops:
        call()
    return sum(l.count for l in launchers), ops.compute()


@pytest.mark.parametrize("M", [1, 5, 16, 33])
@pytest.mark.parametrize("split_k", [None, 2])
def test_w4a16_is_one_launch_at_every_batch(M, split_k, monkeypatch):
    wt = w4a16.quantize_weight(torch.randn(40, 128), 32, symmetric=M % 2 == 0)
    wt = w4a16.W4A16Weight(wt.packed.to(DEV), wt.scale.to(DEV),
                           None if wt.zero is None else wt.zero.to(DEV), 32)
    x = torch.randn(M, 128, device=DEV, dtype=torch.bfloat16)
    launches, compute = _count(monkeypatch, w4a16, ["w4a16_dot_kernel"],
                               lambda: w4a16.w4a16_linear(x, wt, split_k=split_k))
    assert launches == 1 and compute == [], (launches, compute)


@pytest.mark.parametrize("M", [1, 8, 16, 33])
def test_w8a16_is_one_launch_at_every_batch(M, monkeypatch):
    w_q, s = w8a16.quantize_weight(torch.randn(40, 96))
    w_q, s = w_q.to(DEV), s.to(DEV)
    x = torch.randn(M, 96, device=DEV, dtype=torch.float16)
    names = ["w8a16_gemm_kernel"] + (["_gemm"] if on_gpu() else [])   # autotuned or raw
    launches, compute = _count(monkeypatch, w8a16, names, lambda: w8a16.w8a16_linear(x, w_q, s))
    assert launches == 1 and compute == [], (launches, compute)


@pytest.mark.skipif(on_gpu(), reason="the control patches the interpreter's raw kernel")
def test_the_count_catches_the_teaching_gemv(monkeypatch):
    """The GEMV prepares x (float, arange, pow, mul, sum, cat, ...) and casts its output:
    the same count must see those ops, or the test above proves nothing."""
    wt = w4a16.quantize_weight(torch.randn(40, 128), 32)
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    launches, compute = _count(monkeypatch, w4a16, ["w4a16_gemv_kernel"],
                               lambda: w4a16.w4a16_linear(x, wt, kernel="gemv"))
    assert launches == 1 and len(compute) >= 5, compute


@pytest.mark.parametrize("M", [1, 16])
def test_int8_w8a8_decode_is_one_launch(M, monkeypatch):
    """INT8 W8A8 at decode sizes quantizes x inside the GEMM: one launch, no torch op."""
    from kernels import w8a8_int8

    if not w8a8_int8.int8_supported()[0]:
        pytest.skip(w8a8_int8.int8_supported()[1])
    w_q, ws = w8a8_int8.quantize_weight(torch.randn(40, 96))
    w_q, ws = w_q.to(DEV), ws.to(DEV)
    x = torch.randn(M, 96, device=DEV, dtype=torch.bfloat16)
    launches, compute = _count(monkeypatch, w8a8_int8,
                               ["int8_fused_kernel", "int8_gemm_kernel",
                                "quantize_rows_int8_kernel"],
                               lambda: w8a8_int8.w8a8_int8_linear(x, w_q, ws))
    assert launches == 1 and compute == [], (launches, compute)


@pytest.mark.parametrize("M", [1, 16])
def test_fp8_w8a8_decode_is_one_launch(M, monkeypatch):
    """FP8 W8A8 at decode sizes quantizes x inside the GEMM: one launch, no torch op."""
    from kernels import fp8_w8a8

    if not fp8_w8a8.fp8_supported()[0]:
        pytest.skip(fp8_w8a8.fp8_supported()[1])
    w_q, ws = fp8_w8a8.quantize_weight(torch.randn(40, 96))
    w_q, ws = w_q.to(DEV), ws.float().to(DEV)
    x = torch.randn(M, 96, device=DEV, dtype=torch.bfloat16)
    launches, compute = _count(monkeypatch, fp8_w8a8,
                               ["fp8_fused_kernel", "fp8_gemm_kernel", "quantize_rows_fp8_kernel"],
                               lambda: fp8_w8a8.fp8_w8a8_linear(x, w_q, ws))
    assert launches == 1 and compute == [], (launches, compute)
