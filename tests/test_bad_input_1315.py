"""Bad input to the library of lessons 13-15 (issue 39): kquants, imatrix, kmix, sensitivity,
export, gguf_model and spread refuse it with a message that names the argument (and says what
to do) instead of a silent wrong answer or an internal error; the GGUF writers (and the
compressed-tensors one) never replace an existing file without ``overwrite=True``; and kmix
plans and writes files with their own ``output.weight`` (an untied head), on the course's
bundled model and on a file built here with the gguf package.

Written from the outside: each case is an input of a kind the issue lists (sizes that are not
a multiple of the block, zero or negative counts, fp16 scales that overflow or round to 0,
NaN/inf, layers past the model, windows past the context, a string where a list of names is
expected, the wrong container type, an existing file). Everything runs on the bundled 4-layer
model or on arrays built here, in seconds; the comparisons with llama.cpp's own quantizer skip
when the engine is not built."""
import json
import os

import numpy as np
import pytest
import torch
from gguf import GGUFWriter

from course_lib import engine, export, imatrix, kmix, kquants, sensitivity, spread
from course_lib import gguf_model as gm
from course_lib.experiments import sensitivity_scan
from course_lib.methods import calibration as cal
from course_lib.model import BUNDLED_DIR, LlamaModel, ModelConfig, load_pretrained

needs_engine = pytest.mark.skipif(
    not engine.available() and not os.environ.get("COURSE_REQUIRE_ENGINE"),
    reason=engine.skip_reason())

RNG = np.random.default_rng(0)
W = RNG.normal(size=(8, 256)).astype(np.float32)                   # (8, 256): every format fits
WT = torch.from_numpy(W)


def _source(path, c: dict):
    """A metadata-only llama GGUF file for a model of config ``c`` (what export_gguf copies)."""
    w = GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", c["num_hidden_layers"])
    w.add_uint32("llama.embedding_length", c["hidden_size"])
    w.add_uint32("llama.feed_forward_length", c["intermediate_size"])
    w.add_uint32("llama.attention.head_count", c["num_attention_heads"])
    w.add_uint32("llama.attention.head_count_kv", c["num_key_value_heads"])
    w.add_uint32("llama.context_length", c["max_position_embeddings"])
    w.add_float32("llama.rope.freq_base", c["rope_theta"])
    w.add_float32("llama.attention.layer_norm_rms_epsilon", c["rms_norm_eps"])
    w.add_uint32("llama.vocab_size", c["vocab_size"])
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(c["vocab_size"])])
    w.add_array("tokenizer.ggml.merges", ["t 1", "t 2"])
    w.add_file_type(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def bundled():
    return load_pretrained()


@pytest.fixture(scope="module")
def files(bundled, tmp_path_factory):
    """The bundled model as an F16 GGUF file (untied: it has its own output.weight)."""
    d = tmp_path_factory.mktemp("bad_input")
    cfg = json.loads((BUNDLED_DIR / "config.json").read_text())
    src = _source(d / "source.gguf", cfg)
    f16 = export.export_gguf(bundled, d / "f16.gguf", "f16", source=src)
    return {"dir": d, "source": src, "f16": f16}


def refused(fn, error, match):
    with pytest.raises(error, match=match):
        fn()


# ----------------------------------------------------------------------------- kquants
KQUANTS = [
    ("row_bytes cols not a multiple", lambda: kquants.row_bytes("q4_0", 33), "cols=33.*multiple of 32"),
    ("row_bytes cols 0", lambda: kquants.row_bytes("q4_0", 0), "cols must be a whole number >= 1"),
    ("row_bytes cols negative", lambda: kquants.row_bytes("q4_k", -256), "cols must be a whole"),
    ("row_bytes cols a string", lambda: kquants.row_bytes("q4_k", "256"), "cols must be a whole"),
    ("row_bytes cols 64.5", lambda: kquants.row_bytes("q4_0", 64.5), "cols must be a whole"),
    ("row_bytes cols True", lambda: kquants.row_bytes("q4_0", True), "cols must be a whole"),
    ("fits cols negative", lambda: kquants.fits("q4_0", -32), "cols must be a whole"),
    ("fits cols 0", lambda: kquants.fits("q4_0", 0), "cols must be a whole"),
    ("check_imatrix negative", lambda: kquants.check_imatrix(-np.ones(32), 32), "imatrix.*never negative"),
    ("check_imatrix NaN", lambda: kquants.check_imatrix(np.full(32, np.nan), 32), "imatrix.*NaN or inf"),
    ("check_imatrix a string", lambda: kquants.check_imatrix("abc", 3), "imatrix must be"),
    ("check_imatrix cols 0", lambda: kquants.check_imatrix(np.ones(0), 0), "cols must be"),
    ("make_qx_quants nmax 0", lambda: kquants.make_qx_quants(W[:, :16], 0), "nmax must be"),
    ("make_qx_quants nmax -4", lambda: kquants.make_qx_quants(W[:, :16], -4), "nmax must be"),
    ("make_qx_quants x 1-D", lambda: kquants.make_qx_quants(W[0, :16], 32), "x must be a non-empty 2-D"),
    ("make_qx_quants x NaN", lambda: kquants.make_qx_quants(np.full((2, 16), np.nan), 32), "x holds .* NaN"),
    ("make_qx_quants qw shape", lambda: kquants.make_qx_quants(W[:, :16], 32, np.ones((8, 15))), "qw needs one weight"),
    ("make_qx_quants qw negative", lambda: kquants.make_qx_quants(W[:, :16], 32, -np.ones((8, 16))), "qw holds error weights"),
    ("make_qkx_quants nstep -5", lambda: kquants.make_qkx_quants(W[:, :32], np.ones((8, 32)), 15, -1.0, 0.1, -5, False), "nstep must be"),
    ("make_qkx_quants nmax 0", lambda: kquants.make_qkx_quants(W[:, :32], np.ones((8, 32)), 0, -1.0, 0.1, 20, False), "nmax must be"),
    ("make_qkx_quants w shape", lambda: kquants.make_qkx_quants(W[:, :32], np.ones((8, 31)), 15, -1.0, 0.1, 20, False), "w needs one weight"),
    ("make_qkx_quants w negative", lambda: kquants.make_qkx_quants(W[:, :32], -np.ones((8, 32)), 15, -1.0, 0.1, 20, False), "w holds error weights"),
    ("make_qkx_quants rdelta NaN", lambda: kquants.make_qkx_quants(W[:, :32], np.ones((8, 32)), 15, -1.0, float("nan"), 20, False), "rdelta must be"),
    ("make_qp_quants x negative", lambda: kquants.make_qp_quants(-np.abs(W[:, :8]), 63, np.ones((8, 8))), "never negative"),
    ("make_qp_quants nmax 0", lambda: kquants.make_qp_quants(np.abs(W[:, :8]), 0, np.ones((8, 8))), "nmax must be"),
    ("make_qp_quants qw shape", lambda: kquants.make_qp_quants(np.abs(W[:, :8]), 63, np.ones((8, 7))), "qw needs one weight"),
    ("pack_scales_k4 1.5", lambda: kquants.pack_scales_k4(np.full(8, 1.5), np.zeros(8)), "not whole numbers"),
    ("unpack_scales_k4 11 bytes", lambda: kquants.unpack_scales_k4(np.zeros(11, np.uint8)), r"q must hold 12"),
    ("unpack_scales_k4 floats", lambda: kquants.unpack_scales_k4(np.zeros(12) + 0.5), "not whole numbers"),
    ("unpack_scales_k4 300", lambda: kquants.unpack_scales_k4(np.full(12, 300)), "0..255"),
    ("quantize no rows", lambda: kquants.quantize(np.zeros((0, 256), np.float32), "q4_0"), "w has shape"),
    ("quantize a string", lambda: kquants.quantize("w", "q4_0"), "2-D floating-point weight"),
    ("quantize NaN", lambda: kquants.quantize(np.where(W > 2, np.nan, W), "q4_k"), "NaN or inf.*row"),
    ("quantize strict_scales str", lambda: kquants.quantize(W, "q4_0", strict_scales="no"), "strict_scales"),
    ("dequantize cols not a multiple", lambda: kquants.dequantize(kquants.quantize(W, "q4_k"), "q4_k", 200), "cols=200"),
    ("dequantize cols 0", lambda: kquants.dequantize(kquants.quantize(W, "q4_k"), "q4_k", 0), "cols must be"),
    ("dequantize cols mismatch", lambda: kquants.dequantize(kquants.quantize(W, "q4_k"), "q4_k", 512), "pass the cols"),
]


@pytest.mark.parametrize("label, fn, match", KQUANTS, ids=[c[0] for c in KQUANTS])
def test_kquants_refuses(label, fn, match):
    refused(fn, (ValueError, TypeError), match)


@pytest.mark.parametrize("fmt", kquants.FORMATS)
def test_fp16_scales_that_overflow_or_round_to_zero_are_refused(fmt):
    big = W.copy()
    big[0, :32] = 1e10                                            # a scale far past 65504
    with pytest.raises(ValueError, match="overflows fp16"):
        kquants.quantize(big, fmt)
    tiny = np.zeros((2, 256), np.float32)
    tiny[1, :] = 1e-20 * RNG.normal(size=256)                     # every scale rounds to 0
    with pytest.raises(ValueError, match=r"row 1, columns 0\.\..*rounds to 0 in fp16.*strict_scales=False"):
        kquants.quantize(tiny, fmt)
    raw = kquants.quantize(tiny, fmt, strict_scales=False)       # llama.cpp's bytes: zeros
    assert not kquants.dequantize(raw, fmt, 256).any()
    assert np.array_equal(kquants.quantize(W, fmt), kquants.quantize(W, fmt, strict_scales=False))


@pytest.mark.parametrize("fmt", ["q4_0", "q5_0", "q4_k", "q5_k", "q6_k"])
def test_an_importance_vector_of_zeros_is_refused_not_written_as_zeros(fmt):
    """With no error weight on any column, llama.cpp's search keeps scale 0: the whole weight
    would decode as zeros. (Q4_1, Q5_1 keep their minimum; Q8_0 ignores the vector.)"""
    with pytest.raises(ValueError, match=r"importance vector \(imatrix\) is 0 on all"):
        kquants.quantize(W, fmt, np.zeros(256))
    raw = kquants.quantize(W, fmt, np.zeros(256), strict_scales=False)
    assert not kquants.dequantize(raw, fmt, 256).any()


def test_kquants_valid_input_in_other_containers():
    """torch tensors and whole floats are accepted and give the NumPy answers."""
    assert kquants.row_bytes("q4_k", 1536.0) == 864 and isinstance(kquants.row_bytes("q4_k", 256.0), int)
    assert np.array_equal(kquants.quantize(WT, "q4_k", torch.ones(256)), kquants.quantize(W, "q4_k", np.ones(256)))
    raw = kquants.quantize(W, "q6_k")
    assert np.array_equal(kquants.dequantize(torch.from_numpy(raw), "q6_k", 256),
                          kquants.dequantize(raw, "q6_k", 256))
    sc, m = np.arange(8), np.arange(8)[::-1].copy()
    assert np.array_equal(kquants.pack_scales_k4(sc.astype(float), m.astype(float)),
                          kquants.pack_scales_k4(sc, m))              # whole floats: the same bytes
    s1, L1 = kquants.make_qx_quants(W[:, :16], 32)
    s2, L2 = kquants.make_qx_quants(WT[:, :16], 32)
    assert np.array_equal(s1, s2) and np.array_equal(L1, L2)


# ----------------------------------------------------------------------------- imatrix
WIN = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))


def test_imatrix_refuses(bundled):
    refused(lambda: imatrix.collect("smollm2", WIN), TypeError, "model must be a course LlamaModel")
    refused(lambda: imatrix.collect(bundled, WIN, progress="yes"), TypeError, "progress")
    refused(lambda: imatrix.collect(bundled, WIN - 300), ValueError, "windows: token id out of range")
    refused(lambda: imatrix.collect(bundled, WIN.numpy()), ValueError, "windows must be token ids.*torch.as_tensor")
    refused(lambda: imatrix.collect(bundled, torch.zeros(1, 300, dtype=torch.long)), ValueError,
            "past the model's context of 256")
    refused(lambda: imatrix.from_inputs(torch.zeros(0, 4)), ValueError, "at least one token")
    refused(lambda: imatrix.from_inputs(np.ones((2, 4), np.float32)), ValueError, "torch.from_numpy")
    refused(lambda: imatrix.gguf_names("model.layers.0.self_attn.q_proj"), TypeError, "imx must be a dict")
    refused(lambda: imatrix.weighted_error(WT, WT + 1, -torch.ones(256)), ValueError, "imx .*never negative")
    refused(lambda: imatrix.weighted_error(WT, WT * float("nan"), torch.ones(256)), ValueError, "w_q holds NaN")
    refused(lambda: imatrix.weighted_error(WT, WT, torch.full((256,), float("inf"))), ValueError, "imx holds NaN or inf")
    refused(lambda: imatrix.weighted_error("w", WT, torch.ones(256)), TypeError, "w must be a tensor")
    # numpy and torch give the same number
    assert imatrix.weighted_error(W, W + 1, np.ones(256)) == imatrix.weighted_error(WT, WT + 1, torch.ones(256))


# ----------------------------------------------------------------------------- kmix
S30 = kmix.llama_shapes(30, 576, 1536, 192, 49152, True)
KMIX = [
    ("use_more_bits layer past", lambda: kmix.use_more_bits(40, 30), ValueError, "layer 40 is past the model"),
    ("use_more_bits layer -1", lambda: kmix.use_more_bits(-1, 30), ValueError, "layer must be a whole number >= 0"),
    ("use_more_bits n_layers 0", lambda: kmix.use_more_bits(0, 0), ValueError, "n_layers must be"),
    ("use_more_bits layer 1.5", lambda: kmix.use_more_bits(1.5, 30), ValueError, "layer must be"),
    ("use_more_bits layer '1'", lambda: kmix.use_more_bits("1", 30), ValueError, "layer must be"),
    ("llama_type layer past", lambda: kmix.llama_type("q4_k_m", "blk.40.attn_v.weight", 256, 30), ValueError, "blk.40.attn_v.weight: layer 40 is past"),
    ("llama_type cols 0", lambda: kmix.llama_type("q4_k_m", "blk.0.attn_v.weight", 0, 30), ValueError, "cols must be"),
    ("llama_type cols -256", lambda: kmix.llama_type("q4_k_m", "output.weight", -256, 30), ValueError, "cols must be"),
    ("llama_type n_layers 0", lambda: kmix.llama_type("q4_k_m", "blk.0.attn_v.weight", 256, 0), ValueError, "n_layers must be"),
    ("llama_type unknown kind", lambda: kmix.llama_type("q4_k_m", "blk.0.attn_z.weight", 256, 30), ValueError, "attn_z.*not a Linear weight"),
    ("llama_type a norm", lambda: kmix.llama_type("q4_k_m", "blk.0.attn_norm.weight", 256, 30), ValueError, "not a Linear weight"),
    ("llama_type name 3", lambda: kmix.llama_type("q4_k_m", 3, 256, 30), TypeError, "name must be a GGUF tensor name"),
    ("llama_type tied 'no'", lambda: kmix.llama_type("q4_k_m", "token_embd.weight", 256, 30, tied="no"), TypeError, "tied must be True or False"),
    ("llama_shapes tied 'no'", lambda: kmix.llama_shapes(2, 576, 1536, 192, 49152, "no"), TypeError, "tied"),
    ("where_the_bits_go n_layers mismatch", lambda: kmix.where_the_bits_go("q4_k_m", S30, 20), ValueError, "n_layers=20 does not match.*layers 0..29"),
    ("where_the_bits_go 3-D shape", lambda: kmix.where_the_bits_go("q4_k_m", {**S30, "blk.0.attn_q.weight": (2, 3, 576)}, 30), ValueError, "blk.0.attn_q.weight"),
    ("where_the_bits_go negative dim", lambda: kmix.where_the_bits_go("q4_k_m", {**S30, "blk.0.attn_q.weight": (-576, 576)}, 30), ValueError, "shape of 'blk.0.attn_q.weight'"),
    ("where_the_bits_go shapes a list", lambda: kmix.where_the_bits_go("q4_k_m", list(S30), 30), TypeError, "shapes must be a dict"),
    ("plan src 3", lambda: kmix.plan("q4_k_m", 3), TypeError, "src must be the path"),
    ("summary []", lambda: kmix.summary([]), ValueError, "rows must be a non-empty list"),
    ("summary 'abc'", lambda: kmix.summary("abc"), ValueError, "rows must be a non-empty list"),
    ("summary missing key", lambda: kmix.summary([{"name": "x", "bytes": 3}]), ValueError, "missing type, weights"),
    ("summary negative bytes", lambda: kmix.summary([{"type": "f16", "bytes": -3, "weights": 4}]), ValueError, r"rows\[0\]\['bytes'\]"),
    ("layer_kind 3", lambda: kmix.layer_kind(3), TypeError, "name must be"),
    ("file_bytes format not fitting", lambda: kmix.file_bytes({"a": "q4_k"}, {"a": (4, 576)}), ValueError, r"types\['a'\].*576"),
    ("file_bytes unknown tensor", lambda: kmix.file_bytes({"b": "q4_k"}, {"a": (4, 256)}), ValueError, "types names 'b'"),
    ("file_bytes 1-D shape", lambda: kmix.file_bytes({}, {"a": (256,)}), ValueError, "shape of 'a'"),
    ("file_bytes negative shape", lambda: kmix.file_bytes({}, {"a": (-4, 256)}), ValueError, "shape of 'a'"),
    ("file_bytes types a list", lambda: kmix.file_bytes(["a"], {"a": (4, 256)}), TypeError, "types must be a dict"),
]


@pytest.mark.parametrize("label, fn, error, match", KMIX, ids=[c[0] for c in KMIX])
def test_kmix_refuses(label, fn, error, match):
    refused(fn, error, match)


def test_write_mix_refuses(files):
    f16, d = files["f16"], files["dir"]
    q = {"blk.0.attn_q.weight": "q4_k"}
    (d / "exists.gguf").write_bytes(b"mine")
    refused(lambda: kmix.write_mix(f16, d / "exists.gguf", q), FileExistsError, "overwrite=True")
    refused(lambda: kmix.write_mix(f16, d / "exists.gguf", q, overwrite="no"), TypeError, "overwrite must be True or False")
    assert (d / "exists.gguf").read_bytes() == b"mine"
    for types, error, match in [
            ("q4_k", TypeError, "types must be a dict"),
            (["blk.0.attn_q.weight"], TypeError, "types must be a dict"),
            ({"blk.0.ffn_down.weight": "q4_k"}, ValueError, r"types\['blk.0.ffn_down.weight'\] = 'q4_k'.*640"),
            ({"blk.0.attn_norm.weight": "q4_0"}, ValueError, "1-D tensor, which stays F32")]:
        refused(lambda: kmix.write_mix(f16, d / "a.gguf", types), error, match)
    for imx, error, match in [
            ({"blk.0.attn_q.weight": np.ones(10)}, ValueError, r"imatrix\['blk.0.attn_q.weight'\].*one weight per column"),
            ({"blk.0.attn_q.weight": np.full(256, np.nan)}, ValueError, r"imatrix\['blk.0.attn_q.weight'\].*NaN"),
            ([1, 2], TypeError, "imatrix must be None or a dict")]:
        refused(lambda: kmix.write_mix(f16, d / "a.gguf", q, imatrix=imx), error, match)
    refused(lambda: kmix.write_mix(f16, d / "a.gguf", q, progress="no"), TypeError, "progress")
    assert not (d / "a.gguf").exists() and not [p for p in d.iterdir() if "partial" in p.name]


# ----------------------------------------------------------------------------- untied heads
def _types(path):
    return {t.name: t.tensor_type.name.lower() for t in gm.open_gguf(path).tensors}


def test_bundled_model_is_untied_and_plans_and_writes(bundled, files, tmp_path):
    """The bundled model has its own lm_head (tie_word_embeddings false in its config.json):
    the head gets Q6_K (256 wide), token_embd the base type, as llama.cpp gives them."""
    assert not bundled.config.tie_word_embeddings
    assert bundled.lm_head.weight.data_ptr() != bundled.model.embed_tokens.weight.data_ptr()
    f16 = files["f16"]
    assert "output.weight" in _types(f16)
    expect = {"q4_k_m": ("q4_k", "q6_k"), "q4_k_s": ("q4_k", "q6_k"), "q3_k_m": ("q3_k", "q6_k")}
    for mix, (embd, head) in expect.items():
        p = kmix.plan(mix, f16)
        assert p["token_embd.weight"] == kmix.Choice(embd, embd, False)
        assert p["output.weight"] == kmix.Choice(head, head, False)
    p = kmix.plan("q4_k_m", f16)
    types = {n: c.stored for n, c in p.items()}
    out = kmix.write_mix(f16, tmp_path / "mine.gguf", types)
    written = _types(out)
    assert all(written[n] == t for n, t in types.items())
    head = torch.from_numpy(kquants.dequantize(
        np.asarray(next(t.data for t in gm.open_gguf(out).tensors if t.name == "output.weight")),
        "q6_k", 256))
    ref = bundled.lm_head.weight.detach().half().float()
    assert float((head - ref).abs().max()) < 0.05 * float(ref.abs().max())


@needs_engine
@pytest.mark.parametrize("mix", ["q4_k_m", "q4_k_s", "q3_k_m"])
def test_untied_bundled_model_matches_llama_cpp(files, tmp_path, mix):
    """llama.cpp's own quantizer on the same untied F16 file picks the same type for every
    tensor, and (for the mixes the course writes) the same bytes."""
    f16 = files["f16"]
    theirs = engine.quantize_file(f16, tmp_path / "llama.gguf", mix)
    plan = kmix.plan(mix, f16)
    t_types = _types(theirs)
    assert {n: c.stored for n, c in plan.items()} == {n: t_types[n] for n in plan}
    if kmix.MIXES[mix] in kquants.BLOCKS:
        ours = kmix.write_mix(f16, tmp_path / "ours.gguf", {n: c.stored for n, c in plan.items()},
                              file_type=mix)
        a = {t.name: np.asarray(t.data).tobytes() for t in gm.open_gguf(theirs).tensors}
        b = {t.name: np.asarray(t.data).tobytes() for t in gm.open_gguf(ours).tensors}
        assert a.keys() == b.keys() and all(a[n] == b[n] for n in a)


def test_constructed_untied_file_plans_and_writes(tmp_path):
    """A file built here with the gguf package (not the course's writer): rows 64 wide, so
    the head falls to Q8_0 and token_embd to the base type's fallback (Q5_0 for Q4_K)."""
    g = np.random.default_rng(2)
    w = GGUFWriter(str(tmp_path / "untied.gguf"), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_uint32("llama.embedding_length", 64)
    w.add_uint32("llama.feed_forward_length", 256)
    w.add_uint32("llama.attention.head_count", 4)
    w.add_uint32("llama.attention.head_count_kv", 2)
    w.add_uint32("llama.context_length", 64)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32("llama.vocab_size", 96)
    w.add_file_type(1)
    f16 = lambda *s: (g.normal(size=s) * 0.05).astype(np.float16)   # noqa: E731
    w.add_tensor("token_embd.weight", f16(96, 64))
    w.add_tensor("output.weight", f16(96, 64))
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    for i in range(2):
        for name, shape in (("attn_q", (64, 64)), ("attn_k", (32, 64)), ("attn_v", (32, 64)),
                            ("attn_output", (64, 64)), ("ffn_gate", (256, 64)),
                            ("ffn_up", (256, 64)), ("ffn_down", (64, 256))):
            w.add_tensor(f"blk.{i}.{name}.weight", f16(*shape))
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(64, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    src = tmp_path / "untied.gguf"
    p = kmix.plan("q4_k_m", src)
    assert p["output.weight"] == kmix.Choice("q8_0", "q8_0", False)
    assert p["token_embd.weight"] == kmix.Choice("q4_k", "q5_0", True)
    assert p["blk.0.ffn_down.weight"] == kmix.Choice("q4_k", "q4_k", False)   # 256 wide
    assert p["blk.1.ffn_down.weight"] == kmix.Choice("q6_k", "q6_k", False)   # the last eighth
    types = {n: c.stored for n, c in p.items()}
    out = kmix.write_mix(src, tmp_path / "q4_k_m.gguf", types)
    assert {n: _types(out)[n] for n in types} == types
    # the tied twin (no output.weight) gives the embedding the head's type instead
    assert kmix.llama_type("q4_k_m", "token_embd.weight", 64, 2, tied=True).stored == "q8_0"


# ----------------------------------------------------------------------------- sensitivity
def test_sensitivity_refuses(bundled):
    r = refused
    r(lambda: sensitivity.scan_windows(0, 512), ValueError, "n_windows must be a whole number >= 1")
    r(lambda: sensitivity.scan_windows(2, 1), ValueError, "window must be a whole number >= 2")
    r(lambda: sensitivity.scan_windows(2.5, 512), ValueError, "n_windows must be")
    r(lambda: sensitivity.low_format(0), ValueError, "cols must be")
    r(lambda: sensitivity.low_format(100), ValueError, "cols=100: rows must be a multiple of 32")
    r(lambda: sensitivity.candidates(-32), ValueError, "cols must be")
    assert sensitivity.candidates(100) == [] and sensitivity.candidates(576)[:2] == ["q4_0", "q4_1"]
    r(lambda: sensitivity.Scanner(bundled, WIN[0]), ValueError, "windows must be token ids")
    r(lambda: sensitivity.Scanner(bundled, torch.zeros(1, 300, dtype=torch.long)), ValueError, "context of 256")
    r(lambda: sensitivity.Scanner(bundled, WIN + 300), ValueError, "vocabulary has 256")
    r(lambda: sensitivity.Scanner(bundled, WIN[:, :1]), ValueError, "at least 2 tokens")
    r(lambda: sensitivity.Scanner("model", WIN), TypeError, "model must be a course LlamaModel")
    sc = sensitivity.Scanner(bundled, WIN)
    wq = bundled.model.layers[0].self_attn.q_proj.weight.detach()
    r(lambda: sc.kl(4, "attn_q", wq), ValueError, "layer 4 is past the model")
    r(lambda: sc.kl(-1, "attn_q", wq), ValueError, "layer must be")
    r(lambda: sc.kl(0, "attn_z", wq), ValueError, "kind must be one of")
    r(lambda: sc.kl(0, "attn_q", wq[:, :128]), ValueError, r"weight must have the shape.*\(256, 256\)")
    r(lambda: sc.kl(0, "attn_q", wq * float("nan")), ValueError, "weight holds NaN")
    assert sc.kl(0, "attn_q", wq.numpy()) == sc.kl(0, "attn_q", wq)   # an array: the same answer
    kw = dict(n_windows=1, window=32, cal_windows=1, progress=False)
    r(lambda: sensitivity.scan(bundled, layers=[0], kinds="attn_q", **kw), TypeError, "not the string 'attn_q'")
    r(lambda: sensitivity.scan(bundled, layers=[40], kinds=("attn_q",), **kw), ValueError, "layers holds 40, past the model")
    r(lambda: sensitivity.scan(bundled, layers=[-1], kinds=("attn_q",), **kw), ValueError, "each of layers must be")
    r(lambda: sensitivity.scan(bundled, layers=0, kinds=("attn_q",), **kw), TypeError, r"layers must be a list.*\[0\]")
    r(lambda: sensitivity.scan(bundled, layers=[0], kinds=("attn_z",), **kw), ValueError, "attn_z")
    r(lambda: sensitivity.scan(bundled, layers=[0], kinds=(), **kw), ValueError, "kinds is empty")
    r(lambda: sensitivity.scan(bundled, 0, 32, 1, layers=[0], progress=False), ValueError, "n_windows")
    r(lambda: sensitivity.scan(bundled, 1, 1, 1, layers=[0], progress=False), ValueError, "window must be")
    r(lambda: sensitivity.scan(bundled, 1, 32, 0, layers=[0], progress=False), ValueError, "cal_windows")
    r(lambda: sensitivity.scan(bundled, 1, 300, 1, layers=[0], progress=False), ValueError, "context of 256")
    r(lambda: sensitivity.scan("smollm2", 1, 32, 1, layers=[0], progress=False), TypeError, "model must be")
    r(lambda: sensitivity_scan.main(["scan", "--windows", "0"]), SystemExit, "2")


ROWS = [{"tensor": "blk.0.attn_q.weight", "layer": 0, "kind": "attn_q", "format": "q4_0",
         "kl_mean": 0.01, "weighted_error": {"q4_0": 2.0, "q8_0": 0.5},
         "bytes": {"q4_0": 100, "q8_0": 200}},
        {"tensor": "blk.1.attn_v.weight", "layer": 1, "kind": "attn_v", "format": "q4_0",
         "kl_mean": 0.03, "weighted_error": {"q4_0": 3.0, "q8_0": 0.3},
         "bytes": {"q4_0": 100, "q8_0": 200}}]


def test_allocation_refuses():
    r = refused
    r(lambda: sensitivity.heat_map(ROWS, 1), ValueError, r"scan_rows\[1\] is layer 1, past n_layers=1")
    r(lambda: sensitivity.heat_map(ROWS, 0), ValueError, "n_layers must be")
    r(lambda: sensitivity.heat_map("abc", 30), ValueError, "scan_rows must be a non-empty list")
    r(lambda: sensitivity.heat_map([], 30), ValueError, "scan_rows must be a non-empty list")
    r(lambda: sensitivity.heat_map({"rows": ROWS}, 30), TypeError, r"load_scan\(\)\['rows'\]")
    r(lambda: sensitivity.costs_from_scan([]), ValueError, "scan_rows must be")
    r(lambda: sensitivity.costs_from_scan([{"tensor": "x"}]), ValueError, "missing format")
    costs, sizes = sensitivity.costs_from_scan(ROWS)
    r(lambda: sensitivity.smallest({}), ValueError, "sizes must be a non-empty dict")
    r(lambda: sensitivity.smallest({"a": {"q4_0": -3}}), ValueError, r"sizes\['a'\]\['q4_0'\]")
    for budget in (float("nan"), float("inf"), -1, True, "1e9"):
        r(lambda: sensitivity.allocate(costs, sizes, budget), ValueError, "budget must be a positive")
    bad = {t: dict(s) for t, s in sizes.items()}
    bad["blk.0.attn_q.weight"]["q4_0"] = -3
    r(lambda: sensitivity.allocate(costs, bad, 1000), ValueError, r"sizes\['blk.0.attn_q.weight'\]")
    r(lambda: sensitivity.estimated_cost(costs, {"foo": "q4_0"}), ValueError, "pick names 'foo'")
    r(lambda: sensitivity.estimated_cost(costs, {"blk.0.attn_q.weight": "q9_0"}), ValueError, "'q9_0' is not a format")
    r(lambda: sensitivity.estimated_cost(costs, "q4_0"), TypeError, "pick must be dicts")
    # NumPy numbers are numbers: the same allocation as Python ones
    np_costs = {t: {f: np.float32(c) for f, c in cs.items()} for t, cs in costs.items()}
    assert sensitivity.allocate(np_costs, sizes, np.int64(300)) == sensitivity.allocate(costs, sizes, 300)


# ----------------------------------------------------------------------------- export
@pytest.fixture(scope="module")
def rtn(bundled):
    return cal.rtn_model(bundled, 4, 32, grid="q4_0")


def test_export_refuses(bundled, rtn, files, tmp_path):
    r = refused
    r(lambda: export.pack_int32(torch.zeros(2, 8, dtype=torch.int32), 3), ValueError, "bits must be 4 or 8")
    r(lambda: export.pack_int32(np.zeros((2, 8), np.int32), 4), ValueError, "torch.from_numpy")
    r(lambda: export.quantization_config(4, 128, True, ignore="lm_head"), TypeError, "ignore must be a list")
    r(lambda: export.block_weights(bundled.model.layers[0].self_attn.q_proj, "q4_0"), TypeError, "m must be a method's quantized Linear")
    r(lambda: export.block_weights(rtn.model.layers[0].self_attn.q_proj, "q4_k"), ValueError, "fmt must be 'q4_0'")
    r(lambda: export.block_weights(rtn.model.layers[0].self_attn.q_proj, "q4_0", strict_scales=1), TypeError, "strict_scales")
    src = files["source"]
    r(lambda: export.export_gguf(bundled, tmp_path / "e.gguf", "q4_0", source=src, embed_fmt="q4_k"), ValueError, "embed_fmt must be one of")
    r(lambda: export.export_gguf(bundled, tmp_path / "e.gguf", "q4_0", source=src, strict_scales="no"), TypeError, "strict_scales")
    r(lambda: export.export_compressed("model", tmp_path / "c"), TypeError, "model must be")
    r(lambda: export.export_compressed(rtn, 3), TypeError, "folder must be a folder path")
    r(lambda: export.export_compressed(rtn, tmp_path / "c", overwrite="yes"), TypeError, "overwrite must be True or False")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("fmt", ["f16", "q8_0", "q4_0", "q4_1"])
def test_export_gguf_refuses_weights_fp16_cannot_hold(files, tmp_path, fmt):
    m = load_pretrained()
    with torch.no_grad():
        m.model.layers[0].self_attn.q_proj.weight[0, :32] = 1e7         # past fp16 / its scales
    with pytest.raises(ValueError, match="model.layers.0.self_attn.q_proj.weight|attn_q.weight"):
        export.export_gguf(m, tmp_path / "big.gguf", fmt, source=files["source"])
    m = load_pretrained()
    with torch.no_grad():
        m.model.layers[0].self_attn.q_proj.weight[0, :32] = 1e-9        # block (scale) rounds to 0
    with pytest.raises(ValueError, match=r"(q_proj|attn_q)\.weight.*rounds? to 0 in fp16"):
        export.export_gguf(m, tmp_path / "tiny.gguf", fmt, source=files["source"])
    assert not list(tmp_path.iterdir())                                 # nothing half-written


# ----------------------------------------------------------------------------- gguf_model
def test_gguf_model_refuses(files, tmp_path):
    r = refused
    q41 = gm.quantize_q4_1(WT).to_bytes()
    r(lambda: gm.unpack_q4_1(q41, 250), ValueError, "cols=250")
    r(lambda: gm.unpack_q4_1(q41, 128), ValueError, "cols is not the tensor's column count")
    r(lambda: gm.unpack_q4_1(q41.astype(np.float32), 256), ValueError, "raw must be the tensor's bytes")
    r(lambda: gm.unpack_q4_0(gm.quantize_q4_0(WT).to_bytes()[0], 256), ValueError, "raw must be")
    r(lambda: gm.unpack_q8_0(gm.quantize_q8_0(WT).to_bytes(), 0), ValueError, "cols must be")
    assert torch.equal(gm.unpack_q4_1(torch.from_numpy(q41), 256).codes, gm.unpack_q4_1(q41, 256).codes)
    big, tiny = WT.clone(), WT.clone()
    big[0, :32], tiny[0, :32] = 1e7, 1e-9
    for kind in ("q4_0", "q4_1", "q8_0"):
        q = gm.QUANTIZERS[kind]
        r(lambda: q(big), ValueError, "fp16")
        r(lambda: q(tiny), ValueError, r"row 0, columns 0\.\.31.*rounds to 0 in fp16")
        r(lambda: q(W), ValueError, "torch.from_numpy")
        r(lambda: q(torch.zeros(0, 32)), ValueError, "w has no rows")
    r(lambda: gm.reciprocal_or_zero(np.ones(3)), TypeError, "d must be a torch tensor")
    r(lambda: gm.permute_rope_rows(-64, 4), ValueError, "n_rows must be")
    r(lambda: gm.permute_rope_rows(64, 0), ValueError, "n_heads must be")
    r(lambda: gm.open_gguf(3), TypeError, "path must be")
    r(lambda: gm.read_tensors(gm.open_gguf(files["f16"]), "cfg"), TypeError, "cfg must be")
    r(lambda: gm.config_from_gguf("not a reader".split()), TypeError, "reader must be")
    assert gm.config_from_gguf(files["f16"]) == gm.config_from_gguf(gm.open_gguf(files["f16"]))
    bq = gm.quantize_q4_0(WT)
    r(lambda: bq.rows(torch.tensor([0, 0, 1, 2, 3, 4, 5, 6])), ValueError, "permutation of the 8 rows")
    r(lambda: bq.rows(torch.arange(8) + 5), ValueError, "permutation")
    # write_gguf: never over an existing file without overwrite=True; refuses what it cannot write
    meta = gm.read_metadata(files["f16"])
    t = [("a.weight", np.ones((4, 32), np.float16), None)]
    path = tmp_path / "w.gguf"
    path.write_bytes(b"mine")
    r(lambda: gm.write_gguf(path, meta, 1, t), FileExistsError, "overwrite=True")
    assert path.read_bytes() == b"mine"
    assert gm.write_gguf(path, meta, 1, t, overwrite=True) == path and path.read_bytes()[:4] == b"GGUF"
    new = tmp_path / "n.gguf"
    r(lambda: gm.write_gguf(new, meta, 1, t, overwrite="yes"), TypeError, "overwrite")
    r(lambda: gm.write_gguf(new, meta, 1, t + t), ValueError, "'a.weight' appears twice")
    r(lambda: gm.write_gguf(new, meta, -1, t), ValueError, "file_type")
    r(lambda: gm.write_gguf(new, meta, 1, {"a.weight": t[0][1]}), TypeError, "tensors must be a list")
    r(lambda: gm.write_gguf(new, "abc", 1, t), TypeError, "fields must be a list")
    r(lambda: gm.write_gguf(new, meta, 1, [("a.weight", np.ones((4, 32)), None)]), ValueError, "a.weight: unquantized data must be float32 or float16")
    r(lambda: gm.write_gguf(new, meta, 1, [("a.weight", np.full((4, 32), np.inf, np.float16), None)]), ValueError, "a.weight: the data holds NaN or inf")
    r(lambda: gm.write_gguf(new, meta, 1, [("a.weight", torch.ones(4, 32), None)]), TypeError, r"a.weight: data must be a NumPy array.*\.numpy\(\)")
    from gguf import GGMLQuantizationType as T
    r(lambda: gm.write_gguf(new, meta, 1, [("a.weight", np.zeros((4, 17), np.uint8), T.Q4_0)]), ValueError, "a.weight: Q4_0 data .* multiple of 18 bytes")
    assert not new.exists() and not [p for p in tmp_path.iterdir() if "partial" in p.name]


def test_gguf_writers_never_overwrite_without_the_flag(bundled, files, tmp_path):
    """export_gguf, kmix.write_mix and gguf_model.write_gguf refuse an existing file, and
    export_compressed an existing checkpoint, unless overwrite=True."""
    path = tmp_path / "m.gguf"
    path.write_bytes(b"mine")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export.export_gguf(bundled, path, "f16", source=files["source"])
    with pytest.raises(FileExistsError, match="overwrite=True"):
        kmix.write_mix(files["f16"], path, {})
    assert path.read_bytes() == b"mine"
    assert export.export_gguf(bundled, path, "f16", source=files["source"], overwrite=True) == path
    assert kmix.write_mix(files["f16"], path, {}, file_type="f16", overwrite=True) == path
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    rtn = cal.rtn_model(bundled, 4, 32, scale_dtype=torch.bfloat16)
    with pytest.raises(FileExistsError, match="already holds a checkpoint.*overwrite=True"):
        export.export_compressed(rtn, folder)
    assert (folder / "config.json").read_text() == "{}"
    export.export_compressed(rtn, folder, overwrite=True)
    assert json.loads((folder / "config.json").read_text())["quantization_config"]
    fresh = export.export_compressed(rtn, tmp_path / "empty_is_fine")   # a new folder: no flag
    assert (fresh / "model.safetensors").is_file()


# ----------------------------------------------------------------------------- spread
def test_spread_refuses():
    name = next(iter(spread.BANDS))
    r = refused
    r(lambda: spread.largest_deviation("no such number"), ValueError, "no band for 'no such number'")
    r(lambda: spread.largest_deviation(3), TypeError, "name must be")
    r(lambda: spread.check("no such number", 1.0, 1.0), KeyError, "BANDS")    # still a KeyError
    r(lambda: spread.check(name, "1.0", 1.0), TypeError, "live must be a number")
    r(lambda: spread.check(name, True, 1.0), TypeError, "live must be a number")
    r(lambda: spread.check(name, torch.tensor([1.0, 2.0]), 1.0), TypeError, "live must be one number")
    r(lambda: spread.check(name, np.array([1.0, 5.0]), 1.0), TypeError, "live must be one number")
    r(lambda: spread.check(name, 1.0, "1"), TypeError, "committed must be a number")
    r(lambda: spread.describe(name, -0.1), ValueError, "dev must be")
    r(lambda: spread.describe(name, float("nan")), ValueError, "dev must be")
    r(lambda: spread.describe(name, "0.1"), TypeError, "dev must be a number")
    r(lambda: spread.describe("no such number", 0.001), ValueError, "no band")
    assert spread.check(name, torch.tensor(1.0), 1.0) == spread.check(name, np.float32(1.0), 1.0) == 0.0
    spread.largest_deviation(next(iter(spread.BOUNDS)))          # a bound's name is known
    assert spread.describe(name, 0.0).startswith("0.0% from the committed value")


def test_a_tiny_untied_model_round_trips_through_export_and_plan(tmp_path):
    """A course LlamaModel built untied (tie_word_embeddings=False) exports with its own
    output.weight, and kmix.plan gives the head and the embedding their llama.cpp types."""
    cfg = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, intermediate_size=128, max_position_embeddings=128,
               rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaModel(ModelConfig(**cfg)).eval()
    src = _source(tmp_path / "src.gguf", cfg)
    f16 = export.export_gguf(model, tmp_path / "f16.gguf", "f16", source=src)
    assert not gm.config_from_gguf(f16).tie_word_embeddings
    p = kmix.plan("q4_k_m", f16)
    assert p["output.weight"].stored == "q8_0" and p["token_embd.weight"].stored == "q5_0"
    out = kmix.write_mix(f16, tmp_path / "mix.gguf", {n: c.stored for n, c in p.items()})
    assert _types(out)["output.weight"] == "q8_0"
