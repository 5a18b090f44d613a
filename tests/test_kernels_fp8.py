"""FP8 W8A8 Triton kernels against the plain-torch emulation (interpreter on CPU, native on GPU)."""
import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import pytest
import torch

from course_lib.compare import cmp
from kernels._common import on_gpu
from kernels.fp8_w8a8 import (FP8_DTYPE, fp8_gemm, fp8_supported, fp8_w8a8_linear,
                              fp8_w8a8_reference, quantize_activations, quantize_rows_fp8,
                              quantize_weight)

DEV = "cuda" if on_gpu() else "cpu"
SUPPORTED, WHY = fp8_supported()
needs_fp8 = pytest.mark.skipif(not SUPPORTED, reason=WHY)
SHAPES = [(1, 33, 50), (3, 17, 128), (7, 40, 77), (16, 40, 96), (20, 50, 64), (33, 9, 40)]
if on_gpu():
    SHAPES += [(1, 4096, 4096), (64, 1024, 4096), (300, 1000, 2000)]


def _case(M, N, K, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) / K ** 0.5                       # (N, K)
    x = torch.randn(M, K, generator=g).to(dtype)                        # (M, K)
    w_q, ws = quantize_weight(w)
    return x.to(DEV), w_q.to(DEV), ws.to(DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_quantization_matches_host(dtype):
    x, _, _ = _case(12, 4, 150, dtype)
    x[0] = 0.0                                                          # an all-zero token: scale 1
    x[1, 3] = 1000.0                                                    # one outlier: tiny values go subnormal
    xq, xs = quantize_rows_fp8(x)
    xq_h, xs_h = quantize_activations(x.cpu())
    assert xq.dtype == FP8_DTYPE and xs.shape == (12,)
    assert torch.allclose(xs.cpu(), xs_h, rtol=1e-6) and xs[0].item() == 1.0
    assert torch.equal(xq.cpu().float(), xq_h.float()), "codes must equal course_lib.quant's"


def test_grid_rounding_every_e4m3_midpoint():
    """Values halfway between grid points round to even, as torch's own cast does."""
    grid = torch.arange(0, 256, dtype=torch.uint8).view(FP8_DTYPE).float()
    grid = grid[torch.isfinite(grid) & (grid >= 0)].unique()           # (n,) sorted
    mids = (grid[:-1] + grid[1:]) / 2
    vals = torch.cat([grid, mids, -mids, torch.tensor([448.0])])[None, :]   # (1, n)
    vals[0, -1] = 448.0                                                 # pins the scale to 1
    xq, xs = quantize_rows_fp8(vals.to(DEV))
    assert xs.item() == 1.0
    assert torch.equal(xq.cpu().float(), vals.to(FP8_DTYPE).float())


# Tolerances come from the formats, not from the CPU emulation: Hopper's FP8 tensor cores
# keep about 14 bits of the fp32 accumulator while they add (DeepSeek-V3 technical report,
# section 3.3.2). Promoted to fp32 once per BLOCK_K (fast_accum=False), a sum is off by at
# most ~2**-13 of the sum of |products|. Left in the tensor cores for all of K (the fast
# default), each of the K/32 wgmma steps may add that much again: the bound grows with
# K/32 (on an H200 the error was ~2**-12 at K = 4096, the bound 2**-6). Other GPUs and the
# interpreter accumulate in fp32. The output dtype then rounds once (2**-8 relative for
# bf16, 2**-24 for fp32).
ACC_REL = 2 ** -13
OUT_REL = {torch.float32: 2 ** -24, torch.bfloat16: 2 ** -8}
HOPPER = on_gpu() and torch.cuda.get_device_capability(0)[0] == 9


def _fp8_bound(xq, xs, w_q, ws, dtype, fast=False):
    """Allowed |kernel - exact| per output: accumulation error plus one output rounding."""
    mag = (xq.float().abs() @ w_q.float().abs().cpu().T) * xs[:, None] * ws.cpu()[None, :]
    steps = -(-xq.shape[1] // 32) if (fast and HOPPER) else 1           # wgmma adds along K
    return ACC_REL * steps * mag + OUT_REL[dtype] * mag + 1e-30


@needs_fp8
@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fast", [True, False], ids=["fast_accum", "promoted"])
def test_layer_matches_emulation(M, N, K, dtype, fast):
    x, w_q, ws = _case(M, N, K, dtype)
    xq, xs = quantize_activations(x.cpu())                              # the host's codes
    exact = (xq.float() @ w_q.float().cpu().T) * xs[:, None] * ws.cpu()[None, :]   # (M, N)
    y = fp8_w8a8_linear(x, w_q, ws, fast_accum=fast).float().cpu()
    err = (y - exact).abs()
    assert torch.all(err <= _fp8_bound(xq, xs, w_q, ws, dtype, fast)), float(err.max())
    if not fast:
        return
    # the host quantizer gives the same codes on every device, and the same scales up to
    # one rounding (on a GPU torch divides by the constant 448 as a multiplication by its
    # reciprocal: the last bit of a scale may differ; on an H200 no code did)
    xq_d, xs_d = quantize_activations(x)
    assert torch.equal(xq_d.cpu().float(), xq.float()), \
        f"course_lib.quant's FP8 codes differ between the CPU and {DEV}"
    assert torch.allclose(xs_d.cpu(), xs, rtol=2 ** -23, atol=0)
    # and the reference (emulation) itself agrees to the output rounding
    ref = fp8_w8a8_reference(x, w_q, ws).float().cpu()
    ref_err = (ref - exact).abs()
    assert torch.all(ref_err <= _fp8_bound(xq, xs, w_q, ws, dtype)), float(ref_err.max())


@needs_fp8
def test_gemm_with_host_quantized_activations_is_exact_up_to_summation():
    x, w_q, ws = _case(5, 30, 96, torch.float32)
    xq, xs = quantize_activations(x.cpu())                              # host codes (CPU)
    y = fp8_gemm(xq.to(DEV), xs.to(DEV), w_q, ws, out_dtype=torch.float32)
    expected = (xq.float() @ w_q.float().cpu().T) * xs[:, None] * ws.cpu()[None, :]
    assert torch.all((y.cpu() - expected).abs()
                     <= _fp8_bound(xq, xs, w_q, ws, torch.float32, fast=True))


def test_the_bound_still_catches_real_bugs():
    """A wrong scale or a lost K tail is far outside the format's tolerance."""
    x, w_q, ws = (t.cpu() for t in _case(3, 20, 100, torch.float32))    # all on the CPU
    xq, xs = quantize_activations(x)
    exact = (xq.float() @ w_q.float().T) * xs[:, None] * ws[None, :]
    bound = _fp8_bound(xq, xs, w_q, ws, torch.float32)
    no_tail = (xq.float()[:, :96] @ w_q.float()[:, :96].T) * xs[:, None] * ws[None, :]
    assert not torch.all((no_tail - exact).abs() <= bound)
    assert not torch.all((exact * 1.01 - exact).abs() <= bound)


def test_emulation_is_close_to_full_precision():
    x, w_q, ws = _case(4, 64, 256, torch.float32)
    w = w_q.float() * ws[:, None]
    exact = x @ w.T
    # E4M3 has 3 mantissa bits: a relative error of a few percent per product, averaged out
    rel = (fp8_w8a8_reference(x, w_q, ws) - exact).norm() / exact.norm()
    assert 1e-4 < rel.item() < 0.05


def test_refusal_message_on_old_gpus(monkeypatch):
    import kernels.fp8_w8a8 as mod
    monkeypatch.setattr(mod, "INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA A100")
    ok, why = mod.fp8_supported()
    assert not ok and "8.0" in why and "8.9" in why
    x, w_q, ws = _case(1, 8, 16, torch.float32)
    with pytest.raises(RuntimeError, match="fp8_w8a8_reference"):
        mod.fp8_w8a8_linear(x, w_q, ws)
    with pytest.raises(RuntimeError, match="compute capability 8.0"):
        mod.quantize_rows_fp8(x)


def test_bad_inputs_say_what_to_do():
    x, w_q, ws = _case(1, 8, 16, torch.float32)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        fp8_w8a8_reference(x, w_q.float(), ws)
    with pytest.raises(ValueError, match="one scale per output row"):
        fp8_w8a8_reference(x, w_q, ws[:3])


def test_fast_weight_quantization_agrees_with_course_lib():
    w = torch.randn(40, 300) * torch.logspace(-3, 2, 40)[:, None]      # rows of very different size
    w[3] = 0.0
    q1, s1 = quantize_weight(w)
    q2, s2 = quantize_weight(w, fast=True)
    assert torch.equal(q1.float(), q2.float()) and torch.allclose(s1, s2, rtol=1e-7)


def test_weight_quantization_refuses_nan_and_inf_on_both_paths():
    for bad in (float("nan"), float("inf")):
        w = torch.randn(4, 32)
        w[1, 2] = bad
        for fast in (False, True):                  # the fast path gave a NaN row scale 1.0
            with pytest.raises(ValueError, match="NaN|non-finite"):
                quantize_weight(w, fast=fast)


def test_reference_refuses_int_activations_and_3d_weights():
    w_q, ws = quantize_weight(torch.randn(16, 64))
    with pytest.raises(TypeError, match="dtype torch.int32"):
        fp8_w8a8_reference(torch.ones(1, 64, dtype=torch.int32), w_q, ws)
    for fast in (False, True):
        with pytest.raises(ValueError, match="2-D floating-point weight"):
            quantize_weight(torch.randn(2, 16, 64), fast=fast)



@pytest.mark.skipif(not fp8_supported()[0], reason=fp8_supported()[1])
@pytest.mark.parametrize("M", [1, 5, 16])
def test_fused_quantization_gives_the_two_kernel_result(M):
    """Decode batches quantize x in the FP8 GEMM's prologue (one launch): the same codes and
    scales as quantize_rows_fp8, so the same output; a NaN row comes out NaN."""
    from kernels.fp8_w8a8 import fp8_w8a8_linear

    g = torch.Generator().manual_seed(5)
    w_q, ws = quantize_weight(torch.randn(40, 96, generator=g) / 10)
    x = torch.randn(M, 96, generator=g)
    dev = "cuda" if on_gpu() else "cpu"
    w_q, ws, x = w_q.to(dev), ws.to(dev), x.to(dev)
    two = fp8_w8a8_linear(x, w_q, ws, fused=False)
    one = fp8_w8a8_linear(x, w_q, ws)
    assert torch.allclose(one, two, rtol=1e-5, atol=1e-5)
    x[0, 3] = float("nan")
    for fused in (True, False):
        y = fp8_w8a8_linear(x, w_q, ws, fused=fused).cpu()
        assert torch.isnan(y[0]).all() and torch.isfinite(y[1:]).all(), fused
    with pytest.raises(ValueError, match="at most 16 tokens"):
        fp8_w8a8_linear(torch.randn(17, 96, device=dev), w_q, ws, fused=True)
