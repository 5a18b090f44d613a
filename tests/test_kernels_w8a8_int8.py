"""INT8 W8A8 Triton kernels against plain torch (interpreter on CPU, native on a GPU).

The int32 accumulator (RAW_ACC) must match the reference bit for bit; so must the codes and
scales of the fused per-token quantization kernel.
"""
import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import pytest
import torch

from course_lib import quant
from course_lib.compare import cmp
from kernels._common import on_gpu
from kernels.w8a8_int8 import (int8_gemm, int8_gemm_reference, int8_supported,
                               quantize_activations, quantize_rows_int8, quantize_weight,
                               w8a8_int8_linear, w8a8_int8_reference)

DEV = "cuda" if on_gpu() else "cpu"
SUPPORTED, WHY = int8_supported()
needs_int8 = pytest.mark.skipif(not SUPPORTED, reason=WHY)
# ragged shapes: M, N, K not multiples of the blocks (16/32 in the interpreter)
SHAPES = [(1, 33, 50), (3, 17, 128), (7, 40, 77), (16, 40, 96), (20, 50, 64), (33, 9, 40)]
if on_gpu():
    SHAPES += [(1, 4096, 4096), (64, 1024, 4096), (300, 1000, 2000)]


def _case(M, N, K, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) / K ** 0.5                       # (N, K)
    x = torch.randn(M, K, generator=g).to(dtype)                        # (M, K)
    w_q, ws = quantize_weight(w)
    return x.to(DEV), w_q.to(DEV), ws.to(DEV)


@needs_int8
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_int32_accumulator_is_bit_exact(M, N, K):
    g = torch.Generator().manual_seed(M * 1000 + N)
    xq = torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8)
    wq = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    acc = int8_gemm(xq.to(DEV), torch.ones(M, device=DEV), wq.to(DEV), torch.ones(N, device=DEV),
                    raw_acc=True)
    assert acc.dtype == torch.int32
    assert torch.equal(acc.cpu(), int8_gemm_reference(xq, wq))


@needs_int8
def test_int32_accumulator_at_the_extremes():
    K = 200                                           # every product +-16129, no cancellation
    xq = torch.full((5, K), -127, dtype=torch.int8)
    wq = torch.full((6, K), 127, dtype=torch.int8)
    wq[1] = -127
    acc = int8_gemm(xq.to(DEV), torch.ones(5, device=DEV), wq.to(DEV), torch.ones(6, device=DEV),
                    raw_acc=True).cpu()
    assert int(acc[0, 0]) == -K * 16129 and int(acc[0, 1]) == K * 16129
    assert torch.equal(acc, int8_gemm_reference(xq, wq))


@needs_int8
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_row_quantization_matches_course_lib_bit_for_bit(dtype):
    x, _, _ = _case(12, 4, 150, dtype)
    x[0] = 0.0                                        # an all-zero token: scale 1
    x[1, 3] = 1000.0                                  # one outlier: the rest of row 1 -> 0
    x[2, :4] = torch.tensor([0.5, 1.5, 2.5, -2.5], dtype=dtype) * 2 / 127   # ties at scale 2/127
    x[2, 4] = 2.0
    xq, xs = quantize_rows_int8(x)
    hq, hs = quantize_activations(x.cpu())
    assert xq.dtype == torch.int8 and xs.shape == (12,) and xs[0].item() == 1.0
    assert torch.equal(xs.cpu(), hs), "scales must equal course_lib.quant's"
    assert torch.equal(xq.cpu(), hq), "codes must equal course_lib.quant's"
    assert torch.equal(hq, quant.quantize(x.cpu().float(), "int8", "per_token").q)


@needs_int8
@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_matches_reference(M, N, K, dtype):
    x, w_q, ws = _case(M, N, K, dtype)
    y = w8a8_int8_linear(x, w_q, ws)
    ref = w8a8_int8_reference(x, w_q, ws)
    assert y.dtype == dtype and y.shape == (M, N)
    if dtype == torch.float32:   # same codes, exact sums, same fp32 epilogue: identical
        assert torch.equal(y.cpu(), ref.cpu())
    else:
        assert torch.allclose(y.float().cpu(), ref.float().cpu(), rtol=1e-2, atol=1e-2)


@needs_int8
def test_layer_is_close_to_full_precision_and_keeps_batch_dims():
    x, w_q, ws = _case(8, 64, 256)
    w = w_q.float() * ws[:, None]
    exact = x @ w.T
    y = w8a8_int8_linear(x.view(2, 4, 256), w_q, ws)
    assert y.shape == (2, 4, 64)
    rel = (y.reshape(8, 64) - exact).norm() / exact.norm()
    assert 1e-4 < rel.item() < 0.02


def test_refusal_on_old_gpus(monkeypatch):
    import kernels.w8a8_int8 as mod
    monkeypatch.setattr(mod, "INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Tesla T4")
    ok, why = mod.int8_supported()
    assert not ok and "7.5" in why and "8.0" in why
    x, w_q, ws = _case(1, 8, 16)
    with pytest.raises(RuntimeError, match="w8a8_int8_reference"):
        mod.w8a8_int8_linear(x, w_q, ws)


def test_bad_inputs_say_what_to_do():
    x, w_q, ws = _case(2, 8, 16)
    with pytest.raises(TypeError, match="int8"):
        w8a8_int8_reference(x, w_q.float(), ws)
    with pytest.raises(ValueError, match="one scale per output row"):
        w8a8_int8_reference(x, w_q, ws[:3])
    with pytest.raises(ValueError, match="16 input features"):
        w8a8_int8_reference(torch.randn(2, 15), w_q, ws)
    with pytest.raises(TypeError, match="dtype"):
        w8a8_int8_reference(x.long(), w_q, ws)
    with pytest.raises(ValueError, match="NaN"):
        quantize_weight(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="2-D floating-point"):
        quantize_weight(torch.ones(3, dtype=torch.float32))
    if SUPPORTED:
        with pytest.raises(ValueError, match="xq must be int8"):
            int8_gemm(x, torch.ones(2), w_q, ws)


@pytest.mark.skipif(not SUPPORTED, reason="INT8 W8A8 needs compute capability 8.0+")
def test_nan_or_inf_in_activations_never_comes_out_finite():
    """A NaN in x must not vanish: the per-token max skips NaN and the codes clamp it to
    +-127, so without a check the row would come out finite and wrong (issue 19)."""
    x, w_q, ws = _case(4, 24, 64)
    x = x.clone()
    x[1, 5], x[2, 7] = float("nan"), float("inf")
    y = w8a8_int8_linear(x, w_q, ws).float().cpu()                     # (4, 24)
    assert torch.isnan(y[1]).all() and not torch.isfinite(y[2]).any()
    assert torch.isfinite(y[[0, 3]]).all()
    xq, xs = quantize_rows_int8(x)
    assert torch.isnan(xs[1]) and torch.isfinite(xs[[0, 3]]).all()


@pytest.mark.skipif(not SUPPORTED, reason="INT8 W8A8 needs compute capability 8.0+")
@pytest.mark.parametrize("M", [1, 5, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_quantization_gives_the_two_kernel_result(M, dtype):
    """Decode batches quantize x in the GEMM's prologue (one launch): the same codes and
    scales as quantize_rows_int8, so the same output, bit for bit."""
    x, w_q, ws = _case(M, 40, 150, dtype)
    two = w8a8_int8_linear(x, w_q, ws, fused=False)
    one = w8a8_int8_linear(x, w_q, ws)                                   # fused by default
    assert torch.equal(one, two)
    assert cmp("int8 fused", w8a8_int8_reference(x, w_q, ws), one, rtol=2e-2, atol=2e-2)
    x = x.clone()
    x[0, 3] = float("nan")
    assert torch.isnan(w8a8_int8_linear(x, w_q, ws, fused=True)[0]).all()
    with pytest.raises(ValueError, match="at most 16 tokens"):
        w8a8_int8_linear(torch.randn(17, 150), w_q, ws, fused=True)


def test_compile_jobs_are_well_formed():
    from kernels import bench, compile_check
    from kernels.w8a8_int8 import compile_jobs
    jobs = compile_jobs(90)
    assert {j.name for j in jobs} == {"quantize_rows_int8", "int8_gemm", "int8_gemm raw",
                                      "int8_fused"}
    assert all(j.default for j in jobs) and {j.min_cc for j in jobs} == {0, 80}
    assert "kernels.w8a8_int8" in compile_check.KERNEL_MODULES
    assert "kernels.w8a8_int8" in bench.GPU_KERNEL_MODULES


def test_kernels_compile_ahead_of_time_turing_refused_ampere_and_hopper_ok():
    """The native GPU path, checked without a GPU: Triton's own ptxas compiles both kernels;
    sm_75 cannot compile the int8 tl.dot (the wrapper refuses below 8.0); Hopper uses wgmma."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "kernels.compile_check", "--arch", "75", "80",
                           "90", "--only", "int8"], capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    if "SKIPPED" in out:
        pytest.skip(out.strip().splitlines()[-1])
    assert proc.returncode == 0 and "0 unexpected result(s)" in out, out[-3000:]
    assert "sm_75 int8_gemm            refused (expected)" in out
    assert "sm_75 quantize_rows_int8   ok" in out and "sm_80 int8_gemm            ok" in out
    assert any(l.startswith("sm_90 int8_gemm            ok") and "mma=wgmma s8" in l
               for l in out.splitlines())
