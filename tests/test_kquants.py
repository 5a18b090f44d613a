"""llama.cpp's 5-bit blocks and k-quants in the course (lesson 14): course_lib.kquants gives the
engine's own bytes (``ggml_quantize_chunk`` through ctypes) for every format, with and without
an importance vector, on real SmolLM2 rows and on edge rows; its decoding matches the engine's
``dequantize_row_*``; bad input is refused with a message that says what to do.

The engine comparisons skip with one line when llama-cpp-python is not built (`make engine`);
CI sets COURSE_REQUIRE_ENGINE=1, and then a missing engine fails instead."""
import os

import numpy as np
import pytest
import torch

from course_lib import engine
from course_lib import kquants as kq

needs_engine = pytest.mark.skipif(
    not engine.available() and not os.environ.get("COURSE_REQUIRE_ENGINE"),
    reason=engine.skip_reason())


def _edge_rows(k: int, seed: int = 0) -> np.ndarray:
    """Rows that stress the scale searches: all zero, one outlier among zeros, one outlier in
    noise, constant (positive, negative), tiny, all positive, exact ties, large."""
    rng = np.random.default_rng(seed)
    zero = np.zeros(k, np.float32)
    spike = zero.copy()
    spike[7] = 5.0
    noisy = rng.normal(0, 0.02, k).astype(np.float32)
    noisy[k // 2] = 3.0
    return np.stack([zero, spike, noisy, np.full(k, 0.25, np.float32),
                     np.full(k, -0.125, np.float32), rng.normal(0, 1e-20, k).astype(np.float32),
                     np.abs(rng.normal(0, 1, k)).astype(np.float32),
                     (rng.integers(-8, 8, k) * 0.5).astype(np.float32),
                     rng.normal(0, 100, k).astype(np.float32)])


@pytest.fixture(scope="module")
def smollm_rows():
    """Real rows of SmolLM2 in fp16 (what its F16 file holds): 48 rows of layer 3's ffn_down
    (1536 wide: every format) and of its attn_v (576 wide: the 32-blocks)."""
    from course_lib import smollm
    if not smollm.available():
        pytest.skip("SmolLM2 is not converted (make smollm)")
    m = smollm.load()
    layer = m.model.layers[3]
    down = layer.mlp.down_proj.weight.detach()[:48].half().float().numpy()
    v = layer.self_attn.v_proj.weight.detach()[:48].half().float().numpy()
    return {1536: down, 576: v}


def _imatrix(k: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.random(k) ** 4 * 10).astype(np.float32)     # spread like real activations


@needs_engine
@pytest.mark.parametrize("fmt", kq.FORMATS)
@pytest.mark.parametrize("with_imatrix", [False, True])
def test_bytes_match_ggml_on_smollm2_rows(smollm_rows, fmt, with_imatrix):
    for k, rows in smollm_rows.items():
        if not kq.fits(fmt, k):
            continue
        imx = _imatrix(k) if with_imatrix else None
        ours, theirs = kq.quantize(rows, fmt, imx), engine.quantize_chunk(rows, fmt, imx)
        assert ours.shape == theirs.shape == (len(rows), kq.row_bytes(fmt, k))
        bad = np.nonzero((ours != theirs).any(1))[0]
        assert len(bad) == 0, f"{fmt} (imatrix {with_imatrix}): rows {bad[:5]} differ"


@needs_engine
@pytest.mark.parametrize("fmt", kq.FORMATS)
@pytest.mark.parametrize("imatrix", ["none", "random", "zeros"])
def test_bytes_match_ggml_on_edge_rows(fmt, imatrix):
    k = 512 if fmt.endswith("_k") else 96
    rows = _edge_rows(k)
    imx = {"none": None, "random": _imatrix(k), "zeros": np.zeros(k, np.float32)}[imatrix]
    # the tiny row (1e-20) has scales that round to 0 in fp16: refused by default (see
    # tests/test_bad_input_1315.py), llama.cpp's bytes with strict_scales=False
    ours = kq.quantize(rows, fmt, imx, strict_scales=False)
    theirs = engine.quantize_chunk(rows, fmt, imx)
    bad = np.nonzero((ours != theirs).any(1))[0]
    assert len(bad) == 0, f"{fmt} (imatrix {imatrix}): edge rows {bad.tolist()} differ"


@needs_engine
@pytest.mark.parametrize("fmt", kq.FORMATS)
def test_decoding_matches_ggml(smollm_rows, fmt):
    k = 1536 if fmt.endswith("_k") else 576
    raw = engine.quantize_chunk(smollm_rows[k], fmt)
    ours, theirs = kq.dequantize(raw, fmt, k), engine.dequantize_chunk(raw, fmt, k)
    assert np.array_equal(ours, theirs)
    edge = engine.quantize_chunk(_edge_rows(512), fmt)
    assert np.array_equal(kq.dequantize(edge, fmt, 512), engine.dequantize_chunk(edge, fmt, 512))


def test_sizes_and_bits_per_weight():
    assert {f: kq.bits_per_weight(f) for f in ("q4_k", "q5_k", "q6_k", "q5_0", "q5_1")} == \
        {"q4_k": 4.5, "q5_k": 5.5, "q6_k": 6.5625, "q5_0": 5.5, "q5_1": 6.0}
    assert kq.row_bytes("q4_k", 1536) == 6 * 144 and kq.row_bytes("q5_0", 576) == 18 * 22
    assert kq.fits("q4_k", 1536) and not kq.fits("q4_k", 576) and kq.fits("q5_0", 576)


def test_scale_packing_round_trips_and_matches_the_layout():
    rng = np.random.default_rng(0)
    sc, m = rng.integers(0, 64, (100, 8)), rng.integers(0, 64, (100, 8))
    packed = kq.pack_scales_k4(sc, m)
    assert packed.shape == (100, 12) and packed.dtype == np.uint8
    s2, m2 = kq.unpack_scales_k4(packed)
    assert np.array_equal(s2, sc) and np.array_equal(m2, m)
    one = kq.pack_scales_k4(np.array([1, 2, 3, 4, 63, 17, 32, 5]), np.array([9, 0, 0, 0, 48, 0, 0, 0]))
    # sub-block 4: scale 63 = 0b111111 -> low nibble 15 in byte 8, top bits 0b11 on byte 0
    # minimum 48 = 0b110000 -> low nibble 0 in byte 8's high half, top bits 0b11 on byte 4
    assert one[8] == 0x0F and one[0] == (1 | 0b11 << 6) and one[4] == (9 | 0b11 << 6)


def test_q4_k_block_decodes_to_its_own_formula():
    """One super-block built by hand: w = d * sc_j * q - dmin * m_j."""
    rng = np.random.default_rng(0)
    sc, m = rng.integers(0, 64, 8), rng.integers(0, 64, 8)
    q = rng.integers(0, 16, 256).astype(np.uint8)
    d, dmin = np.float16(0.01), np.float16(0.002)
    L = q.reshape(4, 2, 32)
    qs = (L[:, 0] | (L[:, 1] << 4)).reshape(128)
    raw = np.concatenate([np.array([d, dmin], np.float16).view(np.uint8),
                          kq.pack_scales_k4(sc, m), qs])[None]
    w = kq.dequantize(raw, "q4_k", 256)[0].reshape(8, 32)
    want = (np.float32(d) * sc[:, None].astype(np.float32)) * q.reshape(8, 32) - \
        (np.float32(dmin) * m[:, None].astype(np.float32))
    assert np.array_equal(w, want.astype(np.float32))


def test_refusals():
    with pytest.raises(ValueError, match="formats that take 576 columns: q4_0, q4_1, q5_0"):
        kq.quantize(np.zeros((2, 576), np.float32), "q4_k")
    with pytest.raises(ValueError, match="fmt must be one of"):
        kq.quantize(np.zeros((2, 256), np.float32), "q3_k")
    with pytest.raises(ValueError, match="one weight per column: shape \\(256,\\)"):
        kq.quantize(np.zeros((2, 256), np.float32), "q4_k", np.ones(255))
    with pytest.raises(ValueError, match="never negative"):
        kq.quantize(np.zeros((2, 256), np.float32), "q4_k", -np.ones(256))
    with pytest.raises(ValueError, match="NaN or inf"):
        kq.quantize(np.zeros((2, 256), np.float32), "q6_k", np.full(256, np.nan))
    with pytest.raises(ValueError, match="NaN or inf"):
        kq.quantize(np.full((1, 32), np.inf, np.float32), "q5_0")
    with pytest.raises(ValueError, match="2-D floating-point"):
        kq.quantize(np.zeros(256, np.float32), "q4_k")
    with pytest.raises(ValueError, match="takes 144 bytes"):
        kq.dequantize(np.zeros((1, 143), np.uint8), "q4_k", 256)


@pytest.mark.parametrize("fmt", kq.FORMATS)
def test_fp16_overflow_is_refused(fmt):
    """Weights so large that a block's fp16 scale would be inf (llama.cpp writes the inf and its
    file check rejects the tensor later): refused here, saying so."""
    w = np.full((1, 256), 1e9, np.float32)
    w[0, ::2] = -1e9
    with pytest.raises(ValueError, match="overflows fp16"):
        kq.quantize(w, fmt)


def test_torch_input_and_quantization_error():
    w = torch.randn(4, 512) * 0.05
    for fmt, bound in (("q4_k", 0.02), ("q5_k", 0.01), ("q6_k", 0.005)):
        back = kq.dequantize(kq.quantize(w, fmt), fmt, 512)
        assert np.abs(back - w.numpy()).max() < bound, fmt


@needs_engine
def test_engine_binding_refusals():
    with pytest.raises(ValueError, match="fmt must be one of"):
        engine.quantize_chunk(np.zeros((1, 256), np.float32), "iq4_xs")
    with pytest.raises(ValueError, match="multiple of 256"):
        engine.quantize_chunk(np.zeros((1, 576), np.float32), "q4_k")
