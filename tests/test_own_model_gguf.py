"""A learner's model in and out of GGUF (course_lib.own_model, gguf_model, export; lesson 17).

Each architecture's constructed checkpoint (tests/test_own_model.py's CASES: random weights
from transformers' config classes, nothing downloaded) is written as GGUF by the course's
exporter at F16 and Q8_0, with the tokenizer built from the folder's tokenizer.json (SmolLM2's,
copied in: the vocabulary is then 49152 rows). The file is read back with own_model and
compared with transformers' forward; then run in llama.cpp and compared with the course model
reading the same file. Then SmolLM2's packaged GGUF and the converted folder against
smollm.load(), k-quants, and the refusals.

Tolerances, and why. Read back, the weights are exactly the exporter's rounding of the
originals (F16: each weight to fp16; Q8_0: llama.cpp's rule, 8-bit codes per block of 32,
checked with torch.equal), so the only difference from transformers is that rounding: with
logits of magnitude ~1, F16 moves them by about 5e-4 and Q8_0 by about 5e-3 (bounds 3e-3 and
3e-2). llama.cpp against the course model on the same file: its F16 matmuls and fp16 KV cache
(about 4e-4 measured), and in Q8_0 its activations rounded to 8-bit blocks inside the dot
products (bound 5% of the largest logit).
"""
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_own_model import BASE, CASES  # noqa: E402  (the constructed checkpoints)

from course_lib import engine, export, own_model as O, smollm  # noqa: E402
from course_lib import gguf_model as gm  # noqa: E402

transformers = pytest.importorskip("transformers")    # a course dependency: present in the venv
torch.set_num_threads(1)

VOCAB = 49152                       # SmolLM2's tokenizer, copied into each folder
TOL_HF = {"f16": 3e-3, "q8_0": 3e-2}
TOL_ENGINE = {"f16": 2e-3, "q8_0": 0.05}     # q8_0: relative to the largest |logit|
T = 12
#: q and k weights scaled up so attention is sharp (scores of several units, not ~0.05): a
#: wrong RoPE row order or a lost q/k norm then moves the logits far past the tolerances.
QK_GAIN = 8.0


def _tokenizer_json() -> Path:
    path = smollm.model_dir() / "tokenizer.json"
    if not path.exists():
        smollm.convert(verbose=False)
    return path


def build(folder: Path, case: str, vocab: int = VOCAB, **over):
    """A random checkpoint of ``case`` (test_own_model's settings, this vocabulary) with
    SmolLM2's tokenizer.json beside it; returns the transformers model (fp32, eval)."""
    cfg_cls, model_cls, extra = CASES[case]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_cls)(**{**BASE, **extra, "vocab_size": vocab, **over})
    cfg._attn_implementation = "eager"
    hf = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():   # norms away from 1 and biases away from 0, so a dropped one shows
        for n, p in hf.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.add_(0.2 * torch.randn_like(p))
            if n.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(QK_GAIN)
    hf.save_pretrained(folder)
    if vocab >= VOCAB:
        shutil.copy(_tokenizer_json(), folder / "tokenizer.json")
    return hf


def _ids(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, BASE["vocab_size"], (1, T), generator=g)


def _rounded(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """What the exporter stores for a 2-D weight: fp16, or llama.cpp's Q8_0 rounding."""
    return w.half().float() if fmt == "f16" else gm.quantize_q8_0(w).dequantize()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{(case, fmt): (hf model, course model from the folder, GGUF path)}, built lazily."""
    cache = {}

    def get(case, fmt):
        if (case, fmt) not in cache:
            d = tmp_path_factory.mktemp(case)
            hf = build(d, case)
            ours = O.load(d)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")        # the sliding-window cases warn
                path = export.export_gguf(ours, d / f"m_{fmt}.gguf", fmt, tokenizer=d)
            cache[case, fmt] = (hf, ours, path)
        return cache[case, fmt]
    return get


def _open_quiet(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                # a Q8_0 file warns (tested below)
        return O.open_checkpoint(path)


@pytest.mark.parametrize("fmt", ["f16", "q8_0"])
@pytest.mark.parametrize("case", list(CASES))
def test_exported_gguf_reads_back_and_matches_transformers(exported, case, fmt):
    hf, ours, path = exported(case, fmt)
    ck = _open_quiet(path)
    arch = {"qwen2": "qwen2", "qwen2_window": "qwen2", "qwen3": "qwen3"}.get(case, "llama")
    assert ck.format == "gguf" and ck.gguf_architecture == arch
    assert gm.read_metadata(path)[0][2] == arch                     # general.architecture
    back = O.load(ck)
    # the weights are exactly the exporter's rounding (q/k rows back in Hugging Face's order)
    sd = back.state_dict()
    for name, w in ours.state_dict().items():
        if name == "lm_head.weight" and ours.config.tie_word_embeddings:
            continue
        want = w if w.dim() == 1 else _rounded(w, "f16" if fmt == "f16" else "q8_0")
        assert torch.equal(sd[name], want), name
    cfg, src = back.config, ours.config
    assert (cfg.qkv_bias, cfg.qk_norm, cfg.head_dim, cfg.tie_word_embeddings) == \
        (src.qkv_bias, src.qk_norm, src.head_dim, src.tie_word_embeddings)
    assert torch.allclose(back.inv_freq, ours.inv_freq, rtol=1e-6, atol=0)   # llama3 RoPE too
    ids = _ids()
    with torch.no_grad():
        ref, got = hf(ids).logits[0].float(), back(ids)[0]
    # a sliding window is not in the file (llama.cpp's converter leaves it out): compare the
    # positions inside it
    n = src.sliding_window or T
    d = (ref[:n] - got[:n]).abs().max().item()
    print(f"{case} {fmt}: GGUF read back vs transformers, max |logit difference| {d:.2e}")
    assert d < TOL_HF[fmt], (case, fmt, d)


def test_the_llama3_rope_scaling_travels_as_llama_cpps_factors(exported):
    """rope_freqs holds the converter's factors; reading them back gives the same
    frequencies (the four config numbers are not all recoverable: two equivalent ones are)."""
    _, ours, path = exported("llama3", "f16")
    reader = gm.open_gguf(path)
    factors = next(np.asarray(t.data) for t in reader.tensors if t.name == "rope_freqs.weight")
    assert factors.dtype == np.float32 and factors.shape == (ours.config.head_dim // 2,)
    assert factors.max() == 8.0 and factors.min() == 1.0
    scaling = gm.config_from_gguf(reader).rope_scaling
    assert scaling["rope_type"] == "llama3" and scaling["factor"] == 8.0
    with pytest.raises(ValueError, match="no Llama 3 RoPE scaling"):
        gm.llama3_rope_from_factors(np.array([1, 3, 2, 8, 8, 8, 8, 8.0]), 500000.0, 16)
    assert gm.llama3_rope_from_factors(np.ones(8), 500000.0, 16) is None


@pytest.mark.parametrize("theta,hd,scaling", [
    (500000.0, 64, {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192}),      # Llama-3.2-1B's config
    (500000.0, 128, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}),     # Llama-3.1-8B's config
    (10000.0, 16, {"factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
                   "original_max_position_embeddings": 512}),
])
def test_llama3_factors_give_back_the_same_frequencies(theta, hd, scaling):
    from course_lib.model import ModelConfig, rope_frequencies
    cfg = ModelConfig(hidden_size=4 * hd, num_attention_heads=4, num_key_value_heads=4,
                      rope_theta=theta, rope_scaling={"rope_type": "llama3", **scaling})
    factors = export.llama3_rope_factors(cfg)
    back = gm.llama3_rope_from_factors(factors, theta, hd)
    again = ModelConfig(hidden_size=4 * hd, num_attention_heads=4, num_key_value_heads=4,
                        rope_theta=theta, rope_scaling=back)
    assert torch.allclose(rope_frequencies(again), rope_frequencies(cfg), rtol=1e-6, atol=0)
    assert np.array_equal(export.llama3_rope_factors(again), factors)


def test_the_sliding_window_is_said_to_be_lost(tmp_path):
    build(tmp_path, "mistral")
    with pytest.warns(UserWarning, match="sliding window of 5"):
        export.export_gguf(O.load(tmp_path), tmp_path / "m.gguf", "f16", tokenizer=tmp_path)


# ----------------------------------------------------------------------------- llama.cpp
needs_engine = pytest.mark.skipif(
    not engine.available() and not os.environ.get("COURSE_REQUIRE_ENGINE"),
    reason=engine.skip_reason())


@needs_engine
@pytest.mark.parametrize("fmt", ["f16", "q8_0"])
@pytest.mark.parametrize("case", list(CASES))
def test_llama_cpp_runs_the_export_as_the_course_reads_it(exported, case, fmt):
    _, _, path = exported(case, fmt)
    back = O.load(_open_quiet(path))
    ids = _ids(2)[0]
    theirs = engine.logits(path, ids)
    with torch.no_grad():
        ours = back(ids[None])[0]
    d = (theirs - ours).abs().max().item()
    scale = ours.abs().max().item()
    print(f"{case} {fmt}: llama.cpp vs the course, max |logit difference| {d:.2e} "
          f"(largest |logit| {scale:.2f})")
    assert d < TOL_ENGINE[fmt] * (scale if fmt == "q8_0" else 1), (case, fmt, d, scale)
    assert torch.equal(theirs.argmax(-1), ours.argmax(-1)) or fmt == "q8_0"


@needs_engine
@pytest.mark.parametrize("case", ["smollm", "qwen2"])
def test_a_wrong_rope_row_order_would_show(exported, tmp_path, monkeypatch, case):
    """The comparison above is not vacuous: the same export with the q/k rows left in Hugging
    Face's order (llama) or permuted (qwen2, which llama.cpp rotates NeoX-style) gives
    llama.cpp logits far outside the tolerance."""
    _, ours, path = exported(case, "f16")
    ids = _ids(2)[0]
    good = (engine.logits(path, ids) - ours(ids[None])[0].detach()).abs().max().item()
    import course_lib.gguf_model as gmod
    if case == "smollm":
        monkeypatch.setattr(gmod, "permute_rope_rows", lambda n, h: torch.arange(n))
    else:
        monkeypatch.setattr(export, "gguf_architecture_of", lambda cfg: "llama")
        monkeypatch.setattr(export, "_model_fields", lambda cfg, arch, f=export._model_fields:
                            [(k.replace("llama.", "qwen2."), t, "qwen2" if v == "llama" else v, s)
                             for k, t, v, s in f(cfg, "qwen2")])
    bad_path = export.export_gguf(ours, tmp_path / "bad.gguf", "f16", tokenizer=path.parent)
    bad = (engine.logits(bad_path, ids) - ours(ids[None])[0].detach()).abs().max().item()
    print(f"{case}: right order {good:.2e}, wrong order {bad:.2e}")
    assert bad > 20 * TOL_ENGINE["f16"] and bad > 20 * good


@needs_engine
def test_the_exported_tokenizer_splits_text_as_the_folders_does(exported):
    """llama.cpp tokenizes with the GGUF's vocabulary, merges and pre-tokenizer ("smollm"):
    the same ids as the tokenizers package on the folder's tokenizer.json."""
    _, _, path = exported("smollm", "f16")
    llm = engine.load(path)
    tok = O.load_tokenizer(path)
    text = "The capital of France is Paris. It's 1234 km away;\n  tabs\there, émojis 🦙!"
    from course_lib.model import HFTokenizer
    want = HFTokenizer(_tokenizer_json()).encode(text)
    assert llm.tokenize(text.encode(), add_bos=False, special=False) == want
    assert tok.encode(text) == want                         # the GGUF's tokenizer, read back


# ----------------------------------------------------------------------------- the tokenizer
def test_tokenizer_fields_match_smollm2s_packaged_file():
    """Built from SmolLM2's tokenizer.json: the tokens, types, merges and pre-tokenizer that
    llama.cpp's converter wrote into the packaged GGUF."""
    ours = {k: v for k, _, v, _ in export.tokenizer_fields(_tokenizer_json(), VOCAB)}
    theirs = {k: v for k, _, v, _ in gm.read_metadata(smollm.gguf_path())}
    assert ours["tokenizer.ggml.pre"] == theirs["tokenizer.ggml.pre"] == "smollm"
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                "tokenizer.ggml.token_type"):
        assert ours[key] == theirs[key], key
    assert ours["tokenizer.ggml.add_bos_token"] is False


def test_unknown_and_sentencepiece_tokenizers_are_refused(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    bpe = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    bpe.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="does not know"):
        export.tokenizer_fields(tmp_path, 128)
    bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    bpe.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="SentencePiece"):
        export.tokenizer_fields(tmp_path, 128)
    wl = Tokenizer(models.WordLevel({"a": 0}, unk_token="a"))
    wl.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="'WordLevel' tokenizer"):
        export.tokenizer_fields(tmp_path, 128)
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        export.tokenizer_fields(tmp_path / "none", 128)


def test_a_tokenizer_that_does_not_match_the_vocabulary_is_refused(tmp_path):
    build(tmp_path, "smollm", vocab=128)                  # embedding of 128 rows
    model = O.load(tmp_path)
    with pytest.raises(ValueError, match="belongs to another model"):
        export.export_gguf(model, tmp_path / "m.gguf", "f16", tokenizer=_tokenizer_json())
    with pytest.raises(ValueError, match="not both"):
        export.export_gguf(model, tmp_path / "m.gguf", "f16", tokenizer=tmp_path,
                           source=smollm.gguf_path())
    assert not (tmp_path / "m.gguf").exists()


def test_a_gguf_whose_tokenizer_is_larger_than_its_embedding_is_refused(exported, tmp_path):
    _, _, path = exported("smollm", "f16")
    entries = gm.read_metadata(path)
    reader = gm.open_gguf(path)
    fields = [(k, t, v + ["extra"] if k == "tokenizer.ggml.tokens" else
               (v + [1] if k == "tokenizer.ggml.token_type" else v), s) for k, t, v, s in entries]
    tensors = [(t.name, np.asarray(t.data), None) for t in reader.tensors]
    bad = gm.write_gguf(tmp_path / "bad.gguf", fields, 1, tensors)
    with pytest.raises(ValueError, match="different models"):
        O.open_checkpoint(bad)


# ----------------------------------------------------------------------------- SmolLM2
def test_smollm2s_packaged_gguf_and_converted_folder_equal_smollm_load():
    ref = smollm.load().state_dict()
    with pytest.warns(UserWarning, match="already quantized: Q4_1"):
        O._WARNED.clear()
        ck = O.open_checkpoint(smollm.gguf_path())
    for source in (ck, smollm.model_dir()):
        got = O.load(source).state_dict()
        assert set(got) == set(ref)
        for k in ref:
            assert torch.equal(got[k], ref[k]), (source, k)
    folder = O.open_checkpoint(smollm.model_dir())
    assert folder.format == "course-blocks" and folder.quantized == ["Q4_1", "Q8_0"]
    assert any("source.json" in n for n in folder.notes)
    assert O.own_config(smollm.gguf_path()) == ck.config
    assert ck.files == [smollm.GGUF_NAME] and folder.files == ["weights.safetensors"]
    assert O.bill(smollm.gguf_path(), free_bytes=10 ** 12).params["total"] == 134_515_008
    assert O.bill(ck, free_bytes=10 ** 12).need == O.bill(folder, free_bytes=10 ** 12).need
    assert ck.stored_bytes() < smollm.gguf_path().stat().st_size
    assert O.load_tokenizer(ck).encode("The capital of France is") == \
        smollm.tokenizer().encode("The capital of France is")


def test_a_gguf_layer_decodes_only_its_own_tensors(monkeypatch):
    ck = _open_quiet(smollm.gguf_path())
    seen = []
    real = gm.decode_tensor

    def spy(t, *a, **kw):
        seen.append(t.name)
        return real(t, *a, **kw)
    monkeypatch.setattr(gm, "decode_tensor", spy)
    block = O.load_layer(ck, 7)
    assert seen and all(n.startswith("blk.7.") for n in seen) and len(seen) == 9
    whole = smollm.load()
    x = torch.randn(1, 5, 576, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(block(x, *whole.rope(0, 5)), whole.model.layers[7](x, *whole.rope(0, 5)))
    assert set(O.outer_state(ck)) == {"model.embed_tokens.weight", "model.norm.weight"}


# ----------------------------------------------------------------------------- k-quants, refusals
def test_k_quant_weights_are_decoded_as_llama_cpp_decodes_them(tmp_path):
    """A Qwen3 of width 256 (k-quants need rows a multiple of 256) written with the course's
    Q4_K/Q5_K/Q6_K quantizers (kmix.write_mix, llama.cpp's bytes): own_model decodes each as
    kquants.dequantize does, and a requantized file warns."""
    from course_lib import kmix, kquants
    build(tmp_path, "qwen3", hidden_size=256, intermediate_size=512, head_dim=64)
    ours = O.load(tmp_path)
    f16 = export.export_gguf(ours, tmp_path / "f16.gguf", "f16", tokenizer=tmp_path)
    types = {}
    for t in gm.open_gguf(f16).tensors:
        if t.name.startswith("blk.") and len(t.shape) == 2:
            types[t.name] = ("q4_k", "q5_k", "q6_k")[len(types) % 3]
    mix = kmix.write_mix(f16, tmp_path / "mix.gguf", types)
    O._WARNED.clear()
    with pytest.warns(UserWarning, match="Q4_K .*quantizing them again inherits it"):
        ck = O.open_checkpoint(mix)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # once per file: no second warning
        O.open_checkpoint(mix)
    assert set(ck.quantized) == {"Q4_K", "Q5_K", "Q6_K"}
    back = O.layer_state(ck, 1)
    w = ours.model.layers[1].mlp.down_proj.weight.detach()
    fmt = types["blk.1.ffn_down.weight"]
    want = kquants.dequantize(kquants.quantize(w.half().float(), fmt), fmt, w.shape[1])
    assert np.array_equal(back["mlp.down_proj.weight"].numpy(), want)
    if engine.available():
        raw = next(np.asarray(t.data) for t in gm.open_gguf(mix).tensors
                   if t.name == "blk.1.ffn_down.weight")
        assert np.array_equal(engine.dequantize_chunk(raw, fmt, w.shape[1]), want)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "bf16", "q5_0", "q5_1"])
def test_each_block_format_reads_back_as_written(exported, tmp_path, fmt):
    """A Qwen2 (q/k/v biases) in the other formats own_model decodes: Q4_0/Q4_1 from the
    exporter (llama.cpp's rounding), BF16 and Q5_0/Q5_1 rewritten from the F16 file; every
    decoder weight read back is exactly what the file holds."""
    from gguf import GGMLQuantizationType as Q
    from course_lib import kmix, kquants
    _, ours, f16 = exported("qwen2", "f16")
    if fmt in ("q4_0", "q4_1"):
        path = export.export_gguf(ours, tmp_path / "m.gguf", fmt, tokenizer=f16.parent)
        want = lambda w: gm.QUANTIZERS[fmt](w).dequantize()          # noqa: E731
    elif fmt == "bf16":
        reader = gm.open_gguf(f16)
        tensors = []
        for t in reader.tensors:
            data = np.asarray(t.data)
            if t.name.startswith("blk.") and data.ndim == 2:
                b = torch.from_numpy(data.astype(np.float32)).bfloat16()
                tensors.append((t.name, b.view(torch.uint8).numpy(), Q.BF16))
            else:
                tensors.append((t.name, data, None))
        path = gm.write_gguf(tmp_path / "m.gguf", gm.read_metadata(f16), 32, tensors)
        want = lambda w: w.half().float().bfloat16().float()          # noqa: E731
    else:
        types = {t.name: fmt for t in gm.open_gguf(f16).tensors
                 if t.name.startswith("blk.") and len(t.shape) == 2}
        path = kmix.write_mix(f16, tmp_path / "m.gguf", types, file_type="q8_0")
        want = lambda w: torch.from_numpy(kquants.dequantize(           # noqa: E731
            kquants.quantize(w.half().float(), fmt), fmt, w.shape[1]))
    ck = _open_quiet(path)
    assert fmt.upper() in ck.quantized or fmt == "bf16"
    for i in range(ours.config.num_hidden_layers):
        got = O.layer_state(ck, i)
        for name, w in ours.model.layers[i].state_dict().items():
            expect = w if w.dim() == 1 else want(w.detach())
            assert torch.equal(got[name], expect), (fmt, i, name)


def _tiny_gguf(path, arch="llama", qtype=None):
    """A metadata-and-tensors GGUF of a 1-layer model (no tokenizer)."""
    from gguf import GGML_QUANT_SIZES, GGUFWriter
    w = GGUFWriter(str(path), arch)
    a = f"{arch}."
    for k, v in (("block_count", 1), ("embedding_length", 256), ("feed_forward_length", 256),
                 ("attention.head_count", 4), ("attention.head_count_kv", 4),
                 ("context_length", 64)):
        w.add_uint32(a + k, v)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-5)
    shapes = {"token_embd.weight": (32, 256), "output_norm.weight": (256,),
              "blk.0.attn_norm.weight": (256,), "blk.0.ffn_norm.weight": (256,)}
    for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        shapes[f"blk.0.{n}.weight"] = (256, 256)
    for name, shape in shapes.items():
        if qtype is not None and name == "blk.0.ffn_up.weight":
            block, size = GGML_QUANT_SIZES[qtype]
            w.add_tensor(name, np.zeros((256, 256 // block * size), np.uint8), raw_dtype=qtype)
        else:
            w.add_tensor(name, np.zeros(shape, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_refusals_name_what_is_supported(tmp_path):
    from gguf import GGMLQuantizationType as Q
    with pytest.raises(ValueError) as e:
        O.open_checkpoint(_tiny_gguf(tmp_path / "gpt2.gguf", arch="gpt2"))
    assert "'gpt2' model" in str(e.value) and "'qwen3'" in str(e.value)
    with pytest.raises(ValueError, match="'phi3' model"):
        O.own_config(_tiny_gguf(tmp_path / "phi3.gguf", arch="phi3"))
    with pytest.raises(ValueError) as e:
        O.open_checkpoint(_tiny_gguf(tmp_path / "q2k.gguf", qtype=Q.Q2_K))
    assert "stored as Q2_K" in str(e.value) and "Q4_K" in str(e.value)
    with pytest.raises(ValueError, match="no q/k norms"):
        O.open_checkpoint(_tiny_gguf(tmp_path / "qwen3.gguf", arch="qwen3"))
    ck = O.open_checkpoint(_tiny_gguf(tmp_path / "ok.gguf"))      # F32: no warning, no tokenizer
    assert ck.quantized == [] and ck.tokenizer is None
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        O.load_tokenizer(ck)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        O.open_checkpoint(tmp_path / "none.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"GGML" + bytes(40))
    with pytest.raises(ValueError, match="not a readable GGUF"):
        O.open_checkpoint(tmp_path / "junk.gguf")
    folder = tmp_path / "f"
    folder.mkdir()
    shutil.copy(tmp_path / "ok.gguf", folder / "model.gguf")
    with pytest.raises(FileNotFoundError, match="pass the file itself"):
        O.open_checkpoint(folder)


def test_export_refuses_a_source_of_another_architecture(exported, tmp_path):
    _, ours, _ = exported("qwen3", "f16")
    with pytest.raises(ValueError, match="'llama' model but this model is written as 'qwen3'"):
        export.export_gguf(ours, tmp_path / "m.gguf", "f16", source=smollm.gguf_path())
