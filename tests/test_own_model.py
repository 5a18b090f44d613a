"""course_lib.own_model: a learner's own checkpoint folder, loaded into the course's decoder.

Each supported architecture is checked against transformers' own forward on a constructed
checkpoint: random weights from transformers' config classes, written to tmp_path with
save_pretrained (nothing downloaded), logits compared in fp32 (max abs difference < 1e-4).
Then the lazy per-layer reads, the bill, and one test per refusal.
"""
import json
import shutil

import pytest
import torch

from course_lib import hardware, own_model as O
from course_lib.model import BUNDLED_DIR, KVCache, LlamaModel, ModelConfig, load_pretrained, \
    save_pretrained

transformers = pytest.importorskip("transformers")   # a course dependency: present in the venv

TOL = 1e-4
BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

#: name -> (config class, model class, settings): the checkpoints learners have, in miniature.
CASES = {
    # Llama 3.x (Llama-3.2-1B: tied head, llama3 RoPE scaling, theta 500000)
    "llama3": ("LlamaConfig", "LlamaForCausalLM",
               dict(tie_word_embeddings=True, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE)),
    # Llama 2 / TinyLlama: an untied head, theta 10000, 4 query heads per KV head
    "tinyllama": ("LlamaConfig", "LlamaForCausalLM",
                  dict(tie_word_embeddings=False, num_key_value_heads=1)),
    # SmolLM / SmolLM2: Llama with a tied head
    "smollm": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=True)),
    # Mistral: a sliding window shorter than the test's 12 tokens, head_dim given (Nemo-style)
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(tie_word_embeddings=False, sliding_window=5, head_dim=32)),
    # Qwen2.5-0.5B: q/k/v biases, a tied head
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    # Qwen2 with its sliding window switched on for every layer (max_window_layers 0)
    "qwen2_window": ("Qwen2Config", "Qwen2ForCausalLM",
                     dict(use_sliding_window=True, sliding_window=5, max_window_layers=0)),
    # Qwen3-0.6B: q/k norms per head, head_dim 32 != 64 / 4, a tied head
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(tie_word_embeddings=True, head_dim=32)),
}


def build(folder, case, **save_kw):
    """A random checkpoint of ``case`` written by transformers; returns the HF model (fp32)."""
    cfg_cls, model_cls, extra = CASES[case]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_cls)(**{**BASE, **extra})
    cfg._attn_implementation = "eager"    # the reference: plain masked softmax attention
    hf = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():   # norms away from 1 and biases away from 0, so a dropped one shows
        for n, p in hf.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(folder, **save_kw)
    return hf


def max_diff(hf, ours, T=12, seed=1):
    ids = torch.randint(0, BASE["vocab_size"], (2, T), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return (hf(ids).logits.float() - ours(ids)).abs().max().item()


@pytest.mark.parametrize("case", list(CASES))
def test_each_architecture_matches_transformers(tmp_path, case):
    hf = build(tmp_path, case)
    ck = O.open_checkpoint(tmp_path)
    assert ck.architecture == CASES[case][1]
    ours = O.load(ck)
    d = max_diff(hf, ours)
    print(f"{case}: max |logit difference| vs transformers = {d:.2e}")
    assert d < TOL, f"{case}: logits differ by {d:.2e} (tolerance {TOL})"
    # and the feature under test is switched on, so the agreement is not vacuous
    cfg = ck.config
    if case == "qwen2":
        assert cfg.qkv_bias and ours.model.layers[0].self_attn.o_proj.bias is None
    if case == "qwen3":
        assert cfg.qk_norm and cfg.head_dim == 32
    if case == "mistral":
        assert cfg.sliding_window == 5 and cfg.head_dim == 32
    if case == "qwen2_window":
        assert cfg.sliding_window == 5
    if case == "llama3":
        unscaled = ModelConfig(**{**BASE, "rope_theta": 500000.0})
        assert not torch.allclose(LlamaModel(unscaled).inv_freq, ours.inv_freq)
    if case == "tinyllama":
        assert ours.lm_head.weight is not ours.model.embed_tokens.weight
    if CASES[case][2].get("tie_word_embeddings"):
        assert ours.lm_head.weight is ours.model.embed_tokens.weight


def test_sliding_window_changes_the_logits_and_matches_a_cached_decode(tmp_path):
    """The window is really applied (a full-attention model gives other logits past it), and
    decoding one token at a time through the KV cache gives the full forward's logits."""
    build(tmp_path, "mistral")
    ours = O.load(tmp_path)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = ours(ids)
        cache = KVCache(ours.config.num_hidden_layers)
        steps = torch.cat([ours(ids[:, :3], cache)] +
                          [ours(ids[:, t:t + 1], cache) for t in range(3, 12)], dim=1)
        wide = O.load(tmp_path)
        for blk in wide.model.layers:
            blk.self_attn.window = None
        no_window = wide(ids)
    assert (full - steps).abs().max() < 1e-5
    assert torch.allclose(full[:, :5], no_window[:, :5], atol=1e-6)   # inside the window: same
    assert (full[:, 5:] - no_window[:, 5:]).abs().max() > 1e-3       # past it: different


def test_sharded_checkpoint_with_index(tmp_path):
    hf = build(tmp_path, "tinyllama", max_shard_size="20KB")
    assert (tmp_path / O.INDEX_NAME).exists()
    ck = O.open_checkpoint(tmp_path)
    assert len(ck.files) > 2, ck.files
    d = max_diff(hf, O.load(ck))
    print(f"sharded ({len(ck.files)} shards): max |logit difference| = {d:.2e}")
    assert d < TOL
    assert ck.stored_bytes() == 4 * O.count_parameters(ck.config)["total"]   # saved in fp32


def test_mistrals_own_consolidated_file_is_left_aside(tmp_path):
    """Mistral's repositories hold consolidated.safetensors (its own names) beside the HF
    files; the HF files are read, and a folder with only the consolidated file is explained."""
    from safetensors.torch import save_file
    build(tmp_path, "mistral")
    save_file({"layers.0.attention.wq.weight": torch.zeros(2, 2)},
              str(tmp_path / "consolidated.safetensors"))
    assert O.open_checkpoint(tmp_path).files == ["model.safetensors"]
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="Mistral's own names"):
        O.open_checkpoint(tmp_path)


def test_the_bundled_model_loads_as_the_course_loader_loads_it():
    a, b = O.load(BUNDLED_DIR), load_pretrained()
    ids = torch.arange(40)[None]
    with torch.no_grad():
        assert torch.equal(a(ids), b(ids))


# ----------------------------------------------------------------------------- layer by layer
def _record_reads(monkeypatch):
    """Names of the tensors read through safetensors.safe_open, and the files opened."""
    import safetensors
    real = safetensors.safe_open
    reads, opened = [], []

    class Spy:
        def __init__(self, path, framework="pt", device="cpu"):
            self.h = real(path, framework=framework, device=device)
            opened.append(path)

        def __enter__(self):
            self.h.__enter__()
            return self

        def __exit__(self, *a):
            return self.h.__exit__(*a)

        def get_tensor(self, name):
            reads.append(name)
            return self.h.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    return reads, opened


def test_layer_state_reads_only_that_layer(tmp_path, monkeypatch):
    build(tmp_path, "qwen3", max_shard_size="20KB")
    ck = O.open_checkpoint(tmp_path)
    reads, opened = _record_reads(monkeypatch)
    sd = O.layer_state(ck, 1)
    assert reads and all(k.startswith("model.layers.1.") for k in reads)
    assert set(sd) == {f"self_attn.{n}.weight" for n in
                       ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")} | \
        {f"mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")} | \
        {"input_layernorm.weight", "post_attention_layernorm.weight"}
    assert {p.split("/")[-1] for p in opened} == {ck.weight_map[k] for k in reads}
    assert len(opened) < len(ck.files)        # the other shards are never opened


def test_a_loaded_layer_computes_what_the_whole_model_computes(tmp_path):
    build(tmp_path, "qwen2")
    ck = O.open_checkpoint(tmp_path)
    whole = O.load(ck)
    x = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(0))
    cos, sin = whole.rope(0, 7)
    with torch.no_grad():
        for i in range(2):
            assert torch.equal(O.load_layer(ck, i)(x, cos, sin), whole.model.layers[i](x, cos, sin))
    outer = O.outer_state(ck)
    assert set(outer) == {"model.embed_tokens.weight", "model.norm.weight"}   # tied: no head


def test_layer_index_and_dtype_are_checked(tmp_path):
    build(tmp_path, "smollm")
    with pytest.raises(ValueError, match=r"0\.\.1"):
        O.layer_state(tmp_path, 2)
    with pytest.raises(ValueError, match="whole number"):
        O.layer_state(tmp_path, 1.0)
    with pytest.raises(TypeError, match="floating-point"):
        O.load(tmp_path, dtype=torch.int8)
    assert O.layer_state(tmp_path, 0, torch.bfloat16)["mlp.up_proj.weight"].dtype == torch.bfloat16


# ----------------------------------------------------------------------------- the course's own writer
@pytest.mark.parametrize("case", ["qwen2", "qwen2_window", "qwen3", "mistral"])
def test_a_course_model_saves_as_the_class_that_computes_it(tmp_path, case):
    """to_hf_dict names Qwen2/Qwen3/Mistral when the config uses their additions, and
    transformers loads the file back to the same logits."""
    build(tmp_path / "a", case)
    ours = O.load(tmp_path / "a")
    save_pretrained(ours, tmp_path / "b", dtype=torch.float32)
    assert json.loads((tmp_path / "b" / "config.json").read_text())["architectures"] == \
        [CASES[case][1]]
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "b",
                                                             attn_implementation="eager").float()
    assert max_diff(back.eval(), ours) < TOL


def test_default_config_writes_the_same_llama_config_as_before():
    d = ModelConfig().to_hf_dict()
    assert d["architectures"] == ["LlamaForCausalLM"]
    assert not {"qkv_bias", "qk_norm", "sliding_window"} & set(d)
    with pytest.raises(ValueError, match="exclude each other"):
        ModelConfig(qkv_bias=True, attention_bias=True)
    with pytest.raises(ValueError, match="sliding_window"):
        ModelConfig(sliding_window=0)


# ----------------------------------------------------------------------------- refusals
def write_config(folder, **kw):
    folder.mkdir(parents=True, exist_ok=True)
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **BASE}
    base.update(kw)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in base.items()
                                                    if v is not None}))
    return folder


@pytest.mark.parametrize("arch,mtype,extra,says", [
    ("GemmaForCausalLM", "gemma", {}, "sqrt"),
    ("Gemma2ForCausalLM", "gemma2", {}, "soft-capping"),
    ("Phi3ForCausalLM", "phi3", {}, "qkv_proj"),
    ("MixtralForCausalLM", "mixtral", {"num_local_experts": 8}, "mixture of experts"),
    ("Qwen3MoeForCausalLM", "qwen3_moe", {"num_experts": 128}, "mixture of experts"),
    ("LlamaForCausalLM", "llama", {"num_local_experts": 4}, "mixture of experts"),
    ("FalconForCausalLM", "falcon", {}, "unsupported architecture"),
    ("MistralForCausalLM", "llama", {}, "inconsistent"),
])
def test_unsupported_architectures_are_refused_naming_what_is_supported(tmp_path, arch, mtype,
                                                                        extra, says):
    write_config(tmp_path, architectures=[arch], model_type=mtype, **extra)
    with pytest.raises(ValueError) as e:
        O.open_checkpoint(tmp_path)
    assert says in str(e.value)
    if says != "inconsistent":
        assert "Qwen2ForCausalLM" in str(e.value) and "TinyLlama" in str(e.value)
    with pytest.raises(ValueError):           # the bill refuses them too
        O.bill(tmp_path)


@pytest.mark.parametrize("extra,says", [
    ({"quantization_config": {"quant_method": "gptq"}}, "already quantized"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'yarn' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ({"hidden_act": "gelu"}, "silu"),
    ({"hidden_size": None}, "lacks ['hidden_size']"),
    ({"num_attention_heads": 5}, "multiple"),
])
def test_configs_the_decoder_cannot_compute_are_refused(tmp_path, extra, says):
    write_config(tmp_path, **extra)
    with pytest.raises(ValueError) as e:
        O.own_config(tmp_path)
    assert says in str(e.value)


def test_qwen_with_sliding_layers_is_refused(tmp_path):
    write_config(tmp_path, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                 use_sliding_window=True, sliding_window=4, max_window_layers=1,
                 layer_types=["full_attention", "sliding_attention"])
    with pytest.raises(ValueError, match="sliding window"):
        O.own_config(tmp_path)
    write_config(tmp_path, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                 use_sliding_window=True, sliding_window=4, max_window_layers=1)  # HF's rule
    with pytest.raises(ValueError, match="1 of the 2 layers"):
        O.own_config(tmp_path)
    write_config(tmp_path, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                 use_sliding_window=True, sliding_window=4, max_window_layers=0)  # every layer
    assert O.own_config(tmp_path).sliding_window == 4
    write_config(tmp_path, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                 use_sliding_window=False, sliding_window=32768)    # as Qwen2.5 ships
    assert O.own_config(tmp_path).sliding_window is None
    raw = json.loads(write_config(tmp_path).joinpath("config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "quantization_config": None}))
    assert O.own_config(tmp_path).hidden_size == 64                 # null: not quantized


def test_folder_problems_say_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        O.open_checkpoint(tmp_path / "nope")
    (tmp_path / "w.safetensors").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="folder"):
        O.open_checkpoint(tmp_path / "w.safetensors")
    with pytest.raises(FileNotFoundError, match="config.json"):
        O.open_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        O.open_checkpoint(tmp_path)


def test_no_weights_and_bin_only_folders(tmp_path):
    write_config(tmp_path)
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        O.open_checkpoint(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="safe_serialization"):
        O.open_checkpoint(tmp_path)
    assert O.bill(tmp_path).params["total"] > 0     # the bill needs config.json only


def test_missing_shards_are_named(tmp_path):
    build(tmp_path, "tinyllama", max_shard_size="20KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    shards[1].unlink()
    with pytest.raises(FileNotFoundError) as e:
        O.open_checkpoint(tmp_path)
    assert shards[1].name in str(e.value) and "incomplete" in str(e.value)
    (tmp_path / O.INDEX_NAME).unlink()
    with pytest.raises(FileNotFoundError, match=r"shards \[2\] are missing"):
        O.open_checkpoint(tmp_path)


def test_an_index_naming_the_wrong_shard_is_refused(tmp_path):
    build(tmp_path, "tinyllama", max_shard_size="20KB")
    idx = json.loads((tmp_path / O.INDEX_NAME).read_text())
    files = sorted(set(idx["weight_map"].values()))
    name = next(k for k, f in idx["weight_map"].items() if f == files[0])
    idx["weight_map"][name] = files[1]
    (tmp_path / O.INDEX_NAME).write_text(json.dumps(idx))
    with pytest.raises(ValueError, match="not in the shard"):
        O.open_checkpoint(tmp_path)


def test_a_truncated_shard_is_refused(tmp_path):
    build(tmp_path, "smollm")
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        O.open_checkpoint(tmp_path)


def test_weights_that_do_not_match_the_config(tmp_path):
    build(tmp_path, "tinyllama")
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 80}))
    with pytest.raises(ValueError, match="different models"):
        O.open_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match=r"missing \['model.layers.2"):
        O.open_checkpoint(tmp_path)


def test_untied_config_without_a_head_and_base_model_names(tmp_path):
    from safetensors.torch import load_file, save_file
    build(tmp_path, "smollm")                        # tied: no lm_head.weight in the file
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    with pytest.raises(ValueError, match="tie_word_embeddings is false"):
        O.open_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    sd = load_file(str(tmp_path / "model.safetensors"))
    save_file({k.removeprefix("model."): v for k, v in sd.items()},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="'model.' prefix"):
        O.open_checkpoint(tmp_path)


def test_packed_integer_weights_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file
    build(tmp_path, "smollm")
    sd = load_file(str(tmp_path / "model.safetensors"))
    k = "model.layers.0.mlp.up_proj.weight"
    sd[k] = torch.zeros(sd[k].shape, dtype=torch.int32)
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="stored as I32"):
        O.open_checkpoint(tmp_path)


def _tokenizer_json(path, n):
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(n)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))


def test_tokenizer_vocabulary_is_checked_against_the_embedding(tmp_path):
    build(tmp_path, "smollm")                        # vocab_size 128
    _tokenizer_json(tmp_path / "tokenizer.json", 200)
    with pytest.raises(ValueError, match="another model"):
        O.open_checkpoint(tmp_path)
    _tokenizer_json(tmp_path / "tokenizer.json", 120)          # padding rows: fine, noted
    ck = O.open_checkpoint(tmp_path)
    assert ck.vocab_in_tokenizer == 120 and any("8 rows" in n for n in ck.notes)
    assert O.load_tokenizer(ck).encode("t5 t7") == [5, 7]
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        O.load_tokenizer(tmp_path)


# ----------------------------------------------------------------------------- the bill
@pytest.mark.parametrize("case", list(CASES))
def test_parameter_count_from_the_config_alone(tmp_path, case):
    hf = build(tmp_path, case)
    p = O.count_parameters(O.own_config(tmp_path))
    assert p["total"] == sum(t.numel() for t in {id(t): t for t in hf.parameters()}.values())
    assert p["total"] == O.load(tmp_path).num_parameters()


LLAMA31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
              "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 500000.0,
              "tie_word_embeddings": False,
              "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"}}


def test_bill_of_llama_3_1_8b_reuses_lesson_00_arithmetic():
    b = O.bill(LLAMA31_8B, free_bytes=32 * 10 ** 9)     # a 32 GB laptop
    assert b.params["total"] == 8_030_261_248          # Llama-3.1-8B's published count
    assert b.formats["BF16"]["bytes"] == hardware.weight_bytes(8_030_261_248, "bf16")
    # Q4_K_M: the same type-by-type pricing as lesson 03's hardware.llama_q4_k_m_bits
    assert b.formats["Q4_K_M"]["bytes"] == \
        hardware.llama_q4_k_m_bits(32, 4096, 14336, 1024, 128256)["bytes"]
    # W4 g128: 4 + 16/128 bits on the 32 layers' Linears, the rest (embedding, head, norms) BF16
    lin = 32 * 218_103_808
    assert b.formats["W4 g128"]["bytes"] == pytest.approx(lin * 4.125 / 8 + (8_030_261_248 - lin) * 2)
    assert b.output_bytes == pytest.approx(b.formats["W4 g128"]["bytes"])
    assert b.need["whole"] > 32e9 > b.need["layer"]   # an fp32 8B model alone is 32 GB
    assert b.fits("layer") and not b.fits("whole")
    assert "does NOT fit" in b.table()


def test_gguf_rows_price_the_head_as_llama_quantize_writes_it():
    # Llama-3.1-8B: untied head 4096 wide (a multiple of 256) -> Q6_K in a Q4_0 file, Q8_0 in a
    # Q8_0 file; the token embedding (untied) keeps the base type
    b = O.bill(LLAMA31_8B, free_bytes=32 * 10 ** 9)
    V, D, L = 128256, 4096, 32
    from course_lib import kquants
    all_q4_0 = b.formats["Q4_0"]["bytes"] - V * (kquants.row_bytes("q6_k", D)
                                                - kquants.row_bytes("q4_0", D))
    lin = L * 218_103_808 + V * D                       # the Linears and the embedding in Q4_0
    small = 4 * (L * 2 * D + D)                         # norms in F32
    assert all_q4_0 == (lin + V * D) // 32 * 18 + small   # the head too, in Q4_0
    assert b.formats["Q8_0"]["bytes"] == (lin + V * D) // 32 * 34 + small


def test_gguf_rows_match_the_files_llama_cpp_wrote_for_smollm2():
    from course_lib import kmix_table, smollm
    if not smollm.available():
        pytest.skip("SmolLM2 is not converted here")
    fb = O.format_bytes(O.own_config(smollm.model_dir()))
    files = {r["file"]: r["tensor_bytes"] for r in kmix_table.load_table()["rows"]}
    # the tied 576-wide head: Q6_K falls back to Q8_0 (576 is not a multiple of 256)
    assert fb["Q4_0"]["bytes"] == files["Q4_0 (llama.cpp)"]
    assert fb["Q4_K_M"]["bytes"] == files["Q4_K_M (llama.cpp)"]


def test_a_method_that_does_not_fit_is_refused_with_the_figures():
    with pytest.raises(MemoryError) as e:
        O.bill(LLAMA31_8B, method="gptq", free_bytes=8 * 10 ** 9, path="layer")
    msg = str(e.value)
    assert "8.00 GB free" in msg and "GPTQ Hessians" in msg and "calib_samples=32" in msg
    assert "method='rtn'" in msg
    O.bill(LLAMA31_8B, method="rtn", free_bytes=8 * 10 ** 9, path="layer")   # RTN fits
    with pytest.raises(MemoryError, match="path='layer'"):
        O.bill(LLAMA31_8B, method="rtn", free_bytes=8 * 10 ** 9, path="whole")


def test_bill_reads_this_machines_free_memory_and_checks_its_arguments(tmp_path):
    b = O.bill(BUNDLED_DIR)
    assert b.free_bytes is None or b.free_bytes > 0
    assert b.free_bytes == O.free_memory_bytes() or b.free_bytes > 0
    for kw, says in [({"method": "hqq"}, "method"), ({"bits": 5}, "bits"),
                     ({"group_size": 0}, "group_size"), ({"calib_samples": 0}, "calib"),
                     ({"free_bytes": -1}, "free_bytes"), ({"path": "disk"}, "path")]:
        with pytest.raises(ValueError, match=says):
            O.bill(BUNDLED_DIR, **kw)


def test_bill_of_a_qwen3_counts_its_head_dim_and_norms(tmp_path):
    build(tmp_path, "qwen3")
    b = O.bill(tmp_path, method="awq", free_bytes=10 ** 12)
    assert b.params["small_per_layer"] == 2 * 64 + 2 * 32          # two RMSNorms, q/k norms
    assert O.linear_shapes(b.config)["q_proj"] == (4 * 32, 64)
    assert "AWQ" in " ".join(b.parts["layer"])


def test_partial_groups_are_priced_with_their_scale():
    """SmolLM2-135M's width 576 is 4 x 128 + 64: each row has 5 group-128 scales, not 4.5."""
    smollm2 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
               "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
               "num_attention_heads": 9, "num_key_value_heads": 3, "tie_word_embeddings": True}
    b = O.bill(smollm2, free_bytes=10 ** 12)
    assert b.params["total"] == 134_515_008               # SmolLM2-135M's parameter count
    assert O.linear_bytes(1536, 576, 4, 128) == 1536 * 576 / 2 + 1536 * 5 * 2
    assert O.linear_bytes(576, 1536, 4, 128) == 576 * 1536 * 4.125 / 8
