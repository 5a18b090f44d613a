"""The quantization grids of GPTQ, AWQ and round-to-nearest (course_lib.methods.calibration):
the course's, llm-compressor's and llama.cpp's Q4_0 / Q4_1, each against a plain reference."""
import math

import numpy as np
import pytest
import torch

from course_lib import data
from course_lib import eval as ceval
from course_lib.methods import awq, gptq
from course_lib.methods import calibration as cal
from course_lib.model import load_pretrained


@pytest.fixture(scope="module")
def model():
    return load_pretrained()


def _weights(seed=0, out_f=24, in_f=128):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(out_f, in_f, generator=g) * 0.05
    W[0, :32] = 0                                          # an all-zero block
    W[1, 32:64] = 0.25                                     # a constant block
    W[2, :32] = torch.linspace(-1, 1, 32)                  # a tie: -1 and 1 have the same |w|
    W[3] = W[3].abs()                                      # a one-sided row
    W[4, 5] = 3.0                                          # an outlier
    return W


# ----------------------------------------------------------------------------- plain references
def _ref_q4_0(block):
    """llama.cpp's quantize_row_q4_0_ref for one block, written as the C reads (fp32 scalars)."""
    x = [np.float32(v) for v in block]
    amax, mx = np.float32(0), np.float32(0)
    for v in x:
        if amax < abs(v):
            amax, mx = abs(v), v
    d = np.float32(mx / np.float32(-8))
    inv = np.float32(1) / d if d != 0 else np.float32(0)
    q = [min(15, int(np.float32(np.float32(v * inv) + np.float32(8.5)))) for v in x]
    return [c - 8 for c in q], np.float16(d)


def _ref_q4_1(block):
    x = [np.float32(v) for v in block]
    lo, hi = min(x), max(x)
    d = np.float32((hi - lo) / np.float32(15))
    inv = np.float32(1) / d if d != 0 else np.float32(0)
    q = [min(15, int(np.float32(np.float32((v - lo) * inv) + np.float32(0.5)))) for v in x]
    return q, np.float16(d), np.float16(lo)


def _ref_llm_compressor(row, bits, gs):
    """compressed-tensors' symmetric grid in fp32 scalars: s = absmax / 7.5 (4 bits)."""
    out = []
    for g0 in range(0, len(row), gs):
        blk = [np.float32(v) for v in row[g0:g0 + gs]]
        s = np.float32(max(abs(v) for v in blk) / np.float32((2 ** bits - 1) / 2))
        s = s if s != 0 else np.float32(1)
        out += [float(np.float32(max(-2 ** (bits - 1), min(2 ** (bits - 1) - 1,
                                                            np.round(v / s))) * s)) for v in blk]
    return out


def test_q4_0_round_to_nearest_equals_llama_cpps_reference_code():
    W = _weights()
    codes, scale, second = cal.grid_quantize(W, 4, 32, grid="q4_0")
    assert second is None and scale.dtype == torch.float16 and codes.dtype == torch.int8
    for r in range(W.shape[0]):
        for g in range(W.shape[1] // 32):
            q, d = _ref_q4_0(W[r, g * 32:(g + 1) * 32].tolist())
            assert codes[r, g * 32:(g + 1) * 32].tolist() == q, (r, g)
            assert float(scale[r, g]) == float(d), (r, g)
    assert codes[0, :32].eq(0).all() and scale[0, 0] == 0             # all-zero block
    assert codes[2, 0] == -8 and codes[2, 31] == 7                    # the first of a tie: -1
    wq = cal.fake_quant(W, 4, 32, grid="q4_0")
    assert torch.equal(wq, (codes.float().view(24, 4, 32) * scale.float()[..., None]).view(24, 128))


def test_q4_1_round_to_nearest_equals_llama_cpps_reference_code():
    W = _weights(1)
    codes, scale, m = cal.grid_quantize(W, 4, 32, grid="q4_1")
    assert scale.dtype == m.dtype == torch.float16 and codes.dtype == torch.uint8
    for r in range(W.shape[0]):
        for g in range(W.shape[1] // 32):
            q, d, lo = _ref_q4_1(W[r, g * 32:(g + 1) * 32].tolist())
            assert codes[r, g * 32:(g + 1) * 32].tolist() == q, (r, g)
            assert float(scale[r, g]) == float(d) and float(m[r, g]) == float(lo), (r, g)
    assert codes[1, 32:64].eq(0).all() and scale[1, 1] == 0          # constant block: w = m
    wq = cal.fake_quant(W, 4, 32, grid="q4_1")
    assert torch.allclose(wq[1, 32:64], torch.full((32,), 0.25), atol=1e-3)
    lin = cal.rtn_linear(torch.nn.Linear(128, 24, bias=False), grid="q4_1", group_size=32)
    assert lin.offset.dtype == torch.float16 and lin.zero is None and not lin.symmetric
    assert lin.grid == "q4_1"


@pytest.mark.parametrize("name", ["q4_0", "q4_1"])
def test_llama_cpp_grids_give_the_gguf_packages_bytes(name):
    quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType as T
    W = _weights(2)
    codes, scale, second = cal.grid_quantize(W, 4, 32, grid=name)
    raw = quants.quantize(W.numpy(), T.Q4_0 if name == "q4_0" else T.Q4_1)
    blocks = raw.reshape(-1, 18 if name == "q4_0" else 20)          # one row of bytes per block
    head = 2 if name == "q4_0" else 4
    assert np.array_equal(blocks[:, :2].copy().view(np.float16).ravel(), scale.numpy().ravel())
    if name == "q4_1":
        assert np.array_equal(blocks[:, 2:4].copy().view(np.float16).ravel(),
                              second.numpy().ravel())
    nib = blocks[:, head:]
    u = np.concatenate([nib & 0x0F, nib >> 4], axis=1).astype(np.int16)   # (blocks, 32)
    mine = codes.numpy().astype(np.int16).reshape(-1, 32) + (8 if name == "q4_0" else 0)
    assert np.array_equal(u, mine)


@pytest.mark.parametrize("bits, gs", [(4, 32), (3, 64), (8, 128)])
def test_llm_compressor_grid_is_absmax_over_7_5_with_codes_minus_8_to_7(bits, gs):
    W = _weights(3)
    got = cal.fake_quant(W, bits, gs, grid="llm-compressor")
    ref = torch.tensor([_ref_llm_compressor(r, bits, gs) for r in W.tolist()],
                       dtype=torch.float64)
    assert torch.allclose(got.double(), ref, rtol=0, atol=1e-6)
    codes, scale, _ = cal.grid_quantize(W, bits, gs, grid="llm-compressor")
    assert int(codes.min()) == -2 ** (bits - 1) and int(codes.max()) == 2 ** (bits - 1) - 1
    assert torch.allclose(scale[4, 0], W[4, :gs].abs().max() / ((2 ** bits - 1) / 2))


def test_course_grid_is_unchanged():
    from course_lib import quant
    W = _weights(4)
    assert torch.equal(cal.fake_quant(W, 4, 32, grid="course"),
                       quant.fake_quantize(W, "int4", "per_group", 32, True))
    codes, _, _ = cal.grid_quantize(W, 4, 32)
    assert int(codes.abs().max()) == 7


# ----------------------------------------------------------------------------- GPTQ on each grid
@pytest.mark.parametrize("name", ["course", "llm-compressor", "llm-compressor-grid", "q4_0",
                                  "q4_1"])
def test_gptq_with_an_identity_hessian_is_round_to_nearest_on_its_grid(name):
    W = _weights(5)
    codes, scale, second = gptq.gptq_quantize(W, torch.eye(128), 4, 32, grid=name)
    c2, s2, z2 = cal.grid_quantize(W, 4, 32, grid=name)
    assert torch.equal(codes, c2) and torch.equal(scale, s2.to(scale.dtype))
    assert (second is None) == (z2 is None)


def _problem(seed, in_f=128, out_f=16):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(2000, in_f, generator=g) * (torch.rand(in_f, generator=g) * 4)
    X[:, :32] += X[:, 32:64]
    return torch.randn(out_f, in_f, generator=g) * 0.05, gptq.hessian(X), X


@pytest.mark.parametrize("name, block", [("llm-compressor", 32), ("q4_0", 64), ("q4_1", 128)])
def test_lazy_blocks_equal_the_plain_loop_on_each_grid(name, block):
    W, H, _ = _problem(6)
    Wp, Hp = gptq.prepare(W, H, 0.01)
    plain = gptq.gptq_plain(Wp, gptq.inverse_cholesky(Hp), 4, 32, grid=name)
    lazy = gptq.gptq_quantize(W, H, 4, 32, damp=0.01, block_size=block, grid=name)
    # chaotic (fp32 codes after two orders of summation): no code and no scale differed on
    # AVX-512, avx2 with 1 thread and default/SSE4_2
    assert torch.equal(plain[0], lazy[0])
    assert torch.allclose(plain[1].float(), lazy[1].float(), rtol=0, atol=1e-6)


def test_llm_compressor_scales_come_from_the_original_weight_up_front():
    W, H, _ = _problem(7)
    _, scale, _ = gptq.gptq_quantize(W, H, 4, 32, grid="llm-compressor")
    want = W.view(16, 4, 32).abs().amax(-1) / 7.5
    assert torch.equal(scale, want)
    _, scale_course, _ = gptq.gptq_quantize(W, H, 4, 32)
    assert not torch.allclose(scale_course[:, 1:], W.view(16, 4, 32).abs().amax(-1)[:, 1:] / 7)
    # the same grid with the course's timing: group 0 from the original W, the later groups not
    _, scale_late, _ = gptq.gptq_quantize(W, H, 4, 32, grid="llm-compressor-grid")
    assert torch.equal(scale_late[:, 0], want[:, 0])
    assert not torch.allclose(scale_late[:, 1:], want[:, 1:])


@pytest.mark.parametrize("name", ["q4_0", "q4_1", "llm-compressor"])
def test_gptq_beats_round_to_nearest_on_the_same_grid_per_layer(name):
    W, H, X = _problem(8)
    codes, scale, second = gptq.gptq_quantize(W, H, 4, 32, grid=name)
    gr = cal.get_grid(name)
    wq = gr.dequantize(codes.view(16, 4, 32), scale[..., None],
                       None if second is None else second[..., None]).view(16, 128)
    # chaotic (error feedback): 0.873 (q4_0), 0.837 (q4_1), 0.853..0.860 (llm-compressor: moved
    # 0.8% under default/SSE4_2) of RTN on AVX-512, avx2 with 1 thread and default/SSE4_2
    assert gptq.output_error(W, wq, X) < gptq.output_error(W, cal.fake_quant(W, 4, 32, grid=name), X)


def test_gptq_on_q4_0_has_lower_kl_than_rtn_on_q4_0(model):
    ids = cal.calibration_ids("bundled", 16, 256)
    ref = ceval.reference(model, data.heldout_text(8 * 256 + 1), window=256)
    qm, _ = gptq.gptq_model(model, ids, 4, 32, grid="q4_0")
    rtn = cal.rtn_model(model, 4, 32, grid="q4_0")
    lin = qm.model.layers[0].self_attn.q_proj
    assert lin.grid == "q4_0" and lin.scale.dtype == torch.float16
    assert int(lin.codes.min()) >= -8 and int(lin.codes.max()) <= 7
    kl_gptq, kl_rtn = ceval.compare(qm, ref)["kl_nats"], ceval.compare(rtn, ref)["kl_nats"]
    # chaotic (error feedback): GPTQ 0.00081..0.00084 (3.4% apart on AVX-512, avx2 with 1 thread,
    # default/SSE4_2) against RTN's 0.00263: a ratio of 0.31..0.32
    assert kl_gptq < kl_rtn, (kl_gptq, kl_rtn)


def test_awq_on_q4_0_keeps_llama_cpps_grid(model):
    ids = cal.calibration_ids("bundled", 4, 128)
    qm, _ = awq.awq_model(model, ids, 4, 32, n_grid=4, n_blocks=1, grid="q4_0")
    lin = qm.model.layers[0].mlp.down_proj
    assert lin.grid == "q4_0" and lin.scale.dtype == torch.float16
    c, s, _ = cal.grid_quantize(lin.weight.detach().float(), 4, 32, grid="q4_0")
    assert int(lin.codes.min()) >= -8
    assert not math.isnan(float(lin.weight.sum()))


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("call, match", [
    (lambda: cal.fake_quant(torch.randn(4, 64), 3, 32, grid="q4_0"), "4-bit only"),
    (lambda: cal.fake_quant(torch.randn(4, 64), 4, 64, grid="q4_1"), "blocks of 32"),
    (lambda: cal.fake_quant(torch.randn(4, 64), 4, 32, False, grid="q4_0"), "is symmetric"),
    (lambda: cal.fake_quant(torch.randn(4, 64), 4, 32, True, grid="q4_1"), "asymmetric"),
    (lambda: cal.fake_quant(torch.randn(4, 64), 4, 32, False, grid="llm-compressor"),
     "is symmetric"),
    (lambda: cal.fake_quant(torch.randn(4, 64), 4, 32, grid="q8_0"), "unknown grid"),
    (lambda: cal.grid_quantize(torch.randn(64), 4, 32, grid="q4_0"), "2-D weight"),
    (lambda: cal.rtn_linear(torch.nn.Linear(64, 4), 4, 32, scale_dtype=torch.bfloat16,
                            grid="q4_0"), "float16"),
    (lambda: gptq.gptq_quantize(torch.randn(4, 64), torch.eye(64), 4, 64, grid="q4_0"),
     "blocks of 32"),
    (lambda: gptq.gptq_plain(torch.randn(4, 64), torch.eye(64), 5, 32, grid="q4_1"),
     "4-bit only"),
    (lambda: awq.scaled_fake_quant(torch.randn(4, 64), torch.ones(64), 4, 16, grid="q4_0"),
     "blocks of 32"),
    (lambda: awq.search_clip(torch.randn(4, 64), torch.randn(8, 64), 2, 32, grid="q4_0"),
     "4-bit only"),
])
def test_a_grid_refuses_what_it_does_not_define(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_model_level_calls_refuse_before_any_work(model):
    ids = cal.calibration_ids("bundled", 2, 64)
    with pytest.raises(ValueError, match="blocks of 32"):
        gptq.gptq_model(model, ids, 4, 128, grid="q4_0")
    with pytest.raises(ValueError, match="4-bit only"):
        awq.awq_model(model, ids, 3, 32, grid="q4_1")
    with pytest.raises(ValueError, match="unknown grid"):
        cal.rtn_model(model, 4, 32, grid="Q4_0")
