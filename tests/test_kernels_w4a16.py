"""W4A16 Triton kernels against the plain-torch reference (interpreter on CPU, native on GPU)."""
import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import pytest
import torch

from course_lib import quant
from course_lib.compare import cmp
from kernels._common import on_gpu
from kernels.w4a16 import (W4A16Weight, dequantize_weight, quantize_weight, unpack_int4_words,
                           w4a16_linear, w4a16_reference)

DEV = "cuda" if on_gpu() else "cpu"
# (M, N, K, group): batch 1 and above, N not a multiple of the block, every group size
SHAPES = [(1, 33, 64, 32), (1, 17, 128, 128), (2, 40, 128, 64), (5, 31, 96, 32),
          (8, 50, 192, 64), (9, 33, 64, 32), (16, 65, 128, 128), (33, 20, 96, 32)]
if on_gpu():
    SHAPES += [(1, 4096, 4096, 128), (4, 14336, 4096, 128), (16, 1024, 4096, 64),
               (64, 4096, 14336, 128), (1, 1000, 4096, 32)]
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-2), torch.bfloat16: (1.6e-2, 1e-1)}


def _case(M, N, K, G, dtype, symmetric=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) / K ** 0.5                       # (N, K)
    x = torch.randn(M, K, generator=g).to(dtype)                        # (M, K)
    wt = quantize_weight(w, G, symmetric)
    dev = lambda t: None if t is None else t.to(DEV)  # noqa: E731
    return x.to(DEV), W4A16Weight(dev(wt.packed), dev(wt.scale), dev(wt.zero), G), w


@pytest.mark.parametrize("M,N,K,G", SHAPES)
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(M, N, K, G, symmetric, dtype):
    x, wt, _ = _case(M, N, K, G, dtype, symmetric)
    rtol, atol = TOL[dtype]
    res = cmp("w4a16", w4a16_reference(x, wt), w4a16_linear(x, wt), rtol=rtol, atol=atol)
    assert res, str(res)


# fp16 activations take the fp16 dequantization (the inline PTX _ASM_F16 on a GPU, the
# pure-Triton path here): a few shapes on a CPU, the real layer shapes on a GPU.
FP16_SHAPES = [(1, 33, 64, 32), (5, 31, 96, 32), (16, 65, 128, 128)] + SHAPES[8:]


@pytest.mark.parametrize("M,N,K,G", FP16_SHAPES)
@pytest.mark.parametrize("symmetric", [True, False])
def test_matches_reference_fp16(M, N, K, G, symmetric):
    x, wt, _ = _case(M, N, K, G, torch.float16, symmetric)
    rtol, atol = TOL[torch.float16]
    res = cmp("w4a16 fp16", w4a16_reference(x, wt), w4a16_linear(x, wt), rtol=rtol, atol=atol)
    assert res, str(res)


@pytest.mark.skipif(not on_gpu(), reason="the inline assembly runs only on a GPU (sm_80+); "
                                          "tests/test_ptx_interp.py runs it on a CPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("symmetric", [True, False])
def test_inline_assembly_and_pure_triton_paths_agree_bit_for_bit(dtype, symmetric):
    x, wt, _ = _case(4, 4096, 4096, 128, dtype, symmetric, seed=5)
    assert torch.equal(w4a16_linear(x, wt, asm=True), w4a16_linear(x, wt, asm=False))


GEMV = dict(kernel="gemv")


@pytest.mark.parametrize("path", [dict(split_k=2, block_n=8, **GEMV), dict(force_gemm=True),
                                  dict(split_k=3, block_n=16, **GEMV), dict(block_k=32, **GEMV),
                                  dict(block_k=128, **GEMV), dict(block_k=128, split_k=2, **GEMV),
                                  dict(block_k=256, block_n=32, **GEMV),
                                  dict(block_k=64, block_n=8, **GEMV),
                                  dict(), dict(split_k=2), dict(split_k=3, block_k=64),
                                  dict(split_k=6, block_n=16), dict(block_k=128, block_n=64),
                                  dict(block_k=128, split_k=2, kernel="dot")])
@pytest.mark.parametrize("symmetric", [True, False])
def test_every_path(path, symmetric):
    x, wt, _ = _case(3, 37, 192, 32, torch.float32, symmetric, seed=1)
    res = cmp("w4a16", w4a16_reference(x, wt), w4a16_linear(x, wt, **path), rtol=1e-4, atol=1e-4)
    assert res, str(res)


@pytest.mark.parametrize("symmetric", [True, False])
def test_weight_round_trips_through_course_lib_quant(symmetric):
    _, wt, w = _case(1, 12, 128, 32, torch.float32, symmetric)
    qt = quant.quantize(w, "int4", "per_group", 32, symmetric)
    qt.scale = qt.scale.half().float()                                  # stored in fp16
    assert torch.equal(dequantize_weight(wt).cpu(), quant.dequantize(qt))
    assert wt.packed.shape == (12, 64) and wt.packed.dtype == torch.uint8
    assert wt.scale.dtype == torch.float16
    assert wt.nbytes() == 12 * 64 + 2 * 12 * 4 + (0 if symmetric else 4 * 12 * 4)
    assert 8 * quantize_weight(torch.randn(8, 1024)).nbytes() / (8 * 1024) == 4.125


@pytest.mark.parametrize("force_gemm", [False, True])
@pytest.mark.parametrize("symmetric", [True, False])
def test_bit_trick_gives_every_code_exactly_in_order(force_gemm, symmetric):
    """Code k at column k, all 16 codes: an identity x reads each weight back exactly
    (scale 1, zero point 3 when asymmetric), through the GEMV and the GEMM kernel."""
    lo = -8 if symmetric else 0
    codes = torch.arange(lo, lo + 16, dtype=torch.int8 if symmetric else torch.uint8)
    codes = codes.repeat(1, 2)                                          # (1, 32)
    zero = None if symmetric else torch.full((1, 1), 3, dtype=torch.int32)
    wt = W4A16Weight(quant.pack_int4(codes), torch.ones(1, 1), zero, 32)
    wt = W4A16Weight(wt.packed.to(DEV), wt.scale.to(DEV), None if zero is None else zero.to(DEV), 32)
    eye = torch.eye(32)                                                 # row k picks column k
    want = codes.float()[0] - (0 if symmetric else 3)                   # (32,)
    for rows in (eye[:8], eye[8:16], eye[16:24], eye[24:]):             # batches of 8 rows
        y = w4a16_linear(rows.to(DEV), wt, force_gemm=force_gemm)       # (8, 1)
        k0 = int(rows.argmax(dim=1)[0])
        assert torch.equal(y[:, 0].cpu(), want[k0:k0 + 8]), (force_gemm, symmetric, k0)


@pytest.mark.parametrize("signed", [True, False])
def test_unpack_int4_words_is_bit_exact_for_every_byte(signed):
    """The bit trick in plain torch (the kernels' method) against course_lib.quant, on all
    256 byte values, i.e. every code in both nibbles."""
    packed = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(8, 32)   # (8, 32)
    got = unpack_int4_words(packed.view(torch.int32), signed=signed)    # (8, 64)
    want = quant.unpack_int4(packed, signed=signed).float()             # (8, 64)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert sorted(set(got.flatten().tolist())) == list(range(-8, 8) if signed else range(16))
    with pytest.raises(TypeError, match="int32"):
        unpack_int4_words(packed)


def test_bad_inputs_say_what_to_do():
    x, wt, _ = _case(1, 8, 64, 32, torch.float32)
    with pytest.raises(ValueError, match="64 input features"):
        w4a16_linear(x[:, :63], wt)
    with pytest.raises(ValueError, match="not supported"):
        quantize_weight(torch.randn(4, 96), group_size=48)
    with pytest.raises(ValueError, match="expected"):
        w4a16_linear(x, W4A16Weight(wt.packed, wt.scale[:, :1], None, 32))
    with pytest.raises(TypeError, match="W4A16Weight"):
        w4a16_linear(x, wt.packed)
    with pytest.raises(ValueError, match="multiple of the kernel layout's unit of 64 codes"):
        w4a16_linear(x, wt, block_k=48)
    with pytest.raises(ValueError, match="multiple of the group size 32"):
        w4a16_linear(x, wt, block_k=48, kernel="gemv")


def test_reference_and_quantizer_refuse_bad_shapes_and_int_activations():
    wt = quantize_weight(torch.randn(16, 128), 128)
    with pytest.raises(TypeError, match="dtype torch.int32"):
        w4a16_reference(torch.ones(1, 128, dtype=torch.int32), wt)
    with pytest.raises(ValueError, match="128 input features"):
        w4a16_reference(torch.randn(1, 64), wt)
    with pytest.raises(ValueError, match="2-D floating-point weight"):
        quantize_weight(torch.randn(2, 16, 128), 128)               # built a 3-D 'packed' weight before


@pytest.mark.parametrize("symmetric", [True, False])
def test_split_k_workspace_is_zero_again_after_every_call(symmetric):
    """The split-K slices meet in an fp32 workspace and a counter per tile; the last slice
    resets both, so the next call (or a CUDA graph replay) needs no zero-fill kernel."""
    from kernels import _common

    x, wt, _ = _case(2, 40, 256, 32, torch.float32, symmetric, seed=2)
    for _ in range(2):
        y = w4a16_linear(x, wt, split_k=4, block_k=64)
        assert cmp("split-K", w4a16_reference(x, wt), y, rtol=1e-4, atol=1e-4)
        ws, cnt = _common._WORKSPACES[(str(x.device), 2, 40, 2)]
        assert not ws.any() and not cnt.any()


def test_kernel_by_name_and_bad_names():
    x, wt, _ = _case(2, 16, 64, 32, torch.float32)
    ref = w4a16_reference(x, wt)
    for name in ("dot", "gemv", "gemm"):
        assert cmp(name, ref, w4a16_linear(x, wt, kernel=name), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="kernel='tiled': choose one of"):
        w4a16_linear(x, wt, kernel="tiled")
    with pytest.raises(ValueError, match="block_k=48 must be a multiple of the kernel layout"):
        w4a16_linear(x, wt, block_k=48)
    if not on_gpu():
        with pytest.raises(ValueError, match="asm=True needs a GPU"):
            w4a16_linear(x, wt, asm=True)


def test_group_32_with_an_odd_number_of_groups_runs_the_gemm_by_default():
    """The dot kernel reads K in units of 64 codes at group 32 (two groups a unit): K = 96
    has no whole number of them, so the default takes the GEMM and kernel='dot' refuses."""
    x, wt, _ = _case(2, 24, 96, 32, torch.float32, seed=3)
    ref = w4a16_reference(x, wt)
    assert cmp("default", ref, w4a16_linear(x, wt), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="units of 64 codes .*K = 96 is not a multiple.*gemm"):
        w4a16_linear(x, wt, kernel="dot")


@pytest.mark.parametrize("kernel", ["dot", "gemv"])
def test_nan_in_x_comes_out_nan(kernel):
    x, wt, _ = _case(3, 16, 64, 32, torch.float32, symmetric=False)
    x = x.clone()
    x[1, 3] = float("nan")
    y = w4a16_linear(x, wt, kernel=kernel).cpu()
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()
