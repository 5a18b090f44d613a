"""W8A16 Triton kernels against the plain-torch reference (interpreter on CPU, native on GPU)."""
import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import pytest
import torch

from course_lib.compare import cmp
from kernels._common import on_gpu
from kernels.w8a16 import quantize_weight, w8a16_linear, w8a16_reference

DEV = "cuda" if on_gpu() else "cpu"
# (M, N, K): batch 1 and above, sizes that are not multiples of the blocks, odd sizes
SHAPES = [(1, 33, 50), (1, 64, 96), (2, 17, 77), (5, 40, 100), (8, 31, 64),
          (9, 48, 33), (16, 33, 70), (33, 65, 96)]
if on_gpu():
    SHAPES += [(1, 4096, 4096), (16, 1024, 4096), (64, 4096, 1000), (1, 1000, 14336)]
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-2), torch.bfloat16: (1.6e-2, 1e-1)}


def _case(M, N, K, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) / K ** 0.5                       # (N, K)
    x = torch.randn(M, K, generator=g).to(dtype)                        # (M, K)
    w_q, scale = quantize_weight(w)
    return x.to(DEV), w_q.to(DEV), scale.to(DEV)


@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_reference(M, N, K, dtype):
    x, w_q, scale = _case(M, N, K, dtype)
    rtol, atol = TOL[dtype]
    res = cmp("w8a16", w8a16_reference(x, w_q, scale), w8a16_linear(x, w_q, scale),
              rtol=rtol, atol=atol)
    assert res, str(res)


@pytest.mark.parametrize("path", [dict(split_k=3, block_n=8, kernel="gemv"), dict(force_gemm=True),
                                  dict(block_n=16, split_k=2, kernel="gemv"), dict(),
                                  dict(split_k=2), dict(block_n=16, split_k=3)])
def test_every_path(path):
    x, w_q, scale = _case(3, 37, 90, torch.float32, seed=1)
    res = cmp("w8a16", w8a16_reference(x, w_q, scale), w8a16_linear(x, w_q, scale, **path),
              rtol=1e-4, atol=1e-4)
    assert res, str(res)


def test_reference_is_dequantize_then_matmul():
    x, w_q, scale = _case(2, 8, 16, torch.float32)
    expected = x @ (w_q.float() * scale[:, None]).T
    assert torch.allclose(w8a16_reference(x, w_q, scale), expected, atol=1e-5)
    # the quantized weight is close to the original, 1 byte per weight
    assert w_q.dtype == torch.int8 and scale.shape == (8,)


def test_leading_dims_and_empty_batch():
    x, w_q, scale = _case(6, 20, 40, torch.float32)
    y = w8a16_linear(x.reshape(2, 3, 40), w_q, scale)
    assert y.shape == (2, 3, 20)
    assert torch.allclose(y.reshape(6, 20), w8a16_reference(x, w_q, scale), atol=1e-4)
    assert w8a16_linear(x[:0], w_q, scale).shape == (0, 20)


def test_bad_inputs_say_what_to_do():
    x, w_q, scale = _case(1, 8, 16, torch.float32)
    with pytest.raises(ValueError, match="16 input features"):
        w8a16_linear(x[:, :15], w_q, scale)
    with pytest.raises(TypeError, match="int8"):
        w8a16_linear(x, w_q.float(), scale)
    with pytest.raises(ValueError, match="one value per output row"):
        w8a16_linear(x, w_q, scale[:4])
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        w8a16_linear(x.to(torch.int32), w_q, scale)


def test_gemv_plan_fills_a_132_sm_gpu(monkeypatch):
    import kernels._common as common

    monkeypatch.setattr(common, "on_gpu", lambda: True)
    monkeypatch.setattr(common, "num_sms", lambda: 132)
    assert common.gemv_plan(1, 28672, 8192, 128) == (32, 1)     # 896 programs: no split
    assert common.gemv_plan(1, 4096, 4096, 128) == (8, 1)       # 512 programs, two waves
    bn, sk = common.gemv_plan(1, 1024, 4096, 128)               # 128 programs: split K
    assert bn == 8 and sk == 5
    assert common.gemv_plan(1, 1024, 256, 128)[1] == 1          # too little K to split
    monkeypatch.setattr(common, "on_gpu", lambda: False)
    assert common.gemv_plan(1, 28672, 8192, 128) == (16, 1)     # interpreter: small, no split


def test_reference_and_quantizer_refuse_bad_shapes_and_int_activations():
    w_q, scale = quantize_weight(torch.randn(16, 64))
    with pytest.raises(TypeError, match="dtype torch.int32"):    # came back as int32, truncated
        w8a16_reference(torch.ones(1, 64, dtype=torch.int32), w_q, scale)
    with pytest.raises(ValueError, match="64 input features"):
        w8a16_reference(torch.randn(1, 63), w_q, scale)
    for bad in (torch.randn(64), torch.randn(2, 16, 64), torch.ones(16, 64, dtype=torch.int32)):
        with pytest.raises(ValueError, match="2-D floating-point weight"):
            quantize_weight(bad)


def test_split_k_leaves_its_workspace_at_zero_and_bad_names_are_refused():
    from kernels import _common

    x, w_q, scale = _case(2, 40, 256, torch.float32, seed=3)
    for _ in range(2):
        y = w8a16_linear(x, w_q, scale, split_k=4)
        assert cmp("split-K", w8a16_reference(x, w_q, scale), y, rtol=1e-4, atol=1e-4)
        ws, cnt = _common._WORKSPACES[(str(x.device), 2, 40, 3)]
        assert not ws.any() and not cnt.any()
    with pytest.raises(ValueError, match="kernel='tiled': choose one of"):
        w8a16_linear(x, w_q, scale, kernel="tiled")
    with pytest.raises(ValueError, match="block_n=8 is too narrow for tl.dot"):
        w8a16_linear(x, w_q, scale, block_n=8)


def test_nan_in_x_comes_out_nan():
    x, w_q, scale = _case(3, 16, 64, torch.float32)
    x = x.clone()
    x[1, 3] = float("nan")
    y = w8a16_linear(x, w_q, scale).cpu()
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()
