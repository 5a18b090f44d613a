"""course_lib.export.export_gguf and llama.cpp's block formats (lesson 13), without the engine:
the layouts against the gguf package's reference quantizers (written to match ggml-quants.c bit
for bit), the file read back, and every refusal. tests/test_engine.py checks the same bytes
against llama.cpp's own quantizer when the engine is built."""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, quants

from course_lib import export
from course_lib import gguf_model as gm
from course_lib.methods import calibration as cal
from course_lib.model import LlamaModel, ModelConfig

KINDS = {"q4_0": T.Q4_0, "q4_1": T.Q4_1, "q8_0": T.Q8_0}


def _weights():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 256, generator=g) * torch.rand(48, 1, generator=g)   # (48, 256)
    w[0, :32] = 0                                              # an all-zero block
    w[1, :32] = torch.tensor([1.0, -1.0] * 16)                 # |max| tie: the first one wins
    w[2, 32:64] = torch.linspace(-3, 3, 32)                    # max and -max both present
    w[3, :32] = torch.arange(32) / 4 - 4                       # values on .5 boundaries
    w[4, :32] = 1e-3 * torch.randn(32, generator=g)            # tiny scale
    w[5, 64:96] = -7.25                                        # a constant block
    return w.half().float()                                    # what an F16 file holds


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_block_bytes_match_the_reference_quantizer(kind):
    w = _weights()
    ours = gm.QUANTIZERS[kind](w).to_bytes()
    ref = quants.quantize(w.numpy(), KINDS[kind])
    assert ours.dtype == np.uint8 and ours.shape == ref.shape
    assert np.array_equal(ours, ref)
    back = getattr(gm, f"unpack_{kind}")(ours, w.shape[1]).dequantize()
    assert torch.equal(back, torch.from_numpy(quants.dequantize(ref, KINDS[kind])))


def test_q4_0_rule_by_hand():
    block = torch.zeros(1, 32)
    block[0, 3], block[0, 7] = 2.0, -2.0                       # tie on |x|: the first (+2) wins
    bq = gm.quantize_q4_0(block)
    assert float(bq.scale[0, 0]) == -0.25                     # d = max / -8
    assert int(bq.codes[0, 3]) == -8 and int(bq.codes[0, 7]) == 7   # -max clipped to 7
    raw = bq.to_bytes()[0]
    assert raw[:2].view(np.float16)[0] == np.float16(-0.25)
    assert raw[2 + 3] & 0x0F == 0 and raw[2 + 7] & 0x0F == 15 and raw[2] == 0x88


def test_q8_0_rounds_halves_away_from_zero():
    block = torch.zeros(1, 32)
    block[0, 0], block[0, 1], block[0, 2] = 127.0, 2.5, -0.5   # d = 1: 2.5 -> 3, -0.5 -> -1
    codes = gm.quantize_q8_0(block).codes[0]
    assert codes[:3].tolist() == [127, 3, -1]


@pytest.mark.parametrize("bad, words", [
    (torch.zeros(4, 48), "multiple of 32"),
    (torch.zeros(32), "2-D"),
    (torch.full((2, 32), float("nan")), "NaN"),
    (torch.zeros(2, 32, dtype=torch.int32), "floating-point"),
])
def test_quantizers_refuse_bad_weights(bad, words):
    for fn in (gm.quantize_q4_0, gm.quantize_q8_0):
        with pytest.raises(ValueError, match=words):
            fn(bad)


def test_pack_blocks_refuses_codes_off_the_grid():
    bq = gm.quantize_q4_0(_weights())
    bq.codes[0, 0] = 9
    with pytest.raises(ValueError, match="-8..7"):
        bq.to_bytes()


def test_rope_permutation_round_trips():
    order = gm.permute_rope_rows(64, 4)
    assert torch.equal(order[gm.unpermute_rope_rows(64, 4)], torch.arange(64))


# ----------------------------------------------------------------------------- the file
CFG = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, intermediate_size=128, max_position_embeddings=128,
           rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)


def _source(path, arch="llama", **over):
    """A metadata-only GGUF file like the packaged one, for a tiny model."""
    c = {**CFG, **over}
    w = GGUFWriter(str(path), arch)
    a = f"{arch}."
    w.add_uint32(a + "block_count", c["num_hidden_layers"])
    w.add_uint32(a + "embedding_length", c["hidden_size"])
    w.add_uint32(a + "feed_forward_length", c["intermediate_size"])
    w.add_uint32(a + "attention.head_count", c["num_attention_heads"])
    w.add_uint32(a + "attention.head_count_kv", c["num_key_value_heads"])
    w.add_uint32(a + "context_length", c["max_position_embeddings"])
    w.add_float32(a + "rope.freq_base", c["rope_theta"])
    w.add_float32(a + "attention.layer_norm_rms_epsilon", c["rms_norm_eps"])
    w.add_uint32(a + "vocab_size", c["vocab_size"])
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(c["vocab_size"])])
    w.add_array("tokenizer.ggml.merges", ["t 1", "t 2"])
    w.add_file_type(3)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture()
def tiny(tmp_path):
    torch.manual_seed(0)
    model = LlamaModel(ModelConfig(**CFG)).eval()
    return model, _source(tmp_path / "source.gguf")


def _read(path):
    reader = gm.open_gguf(path)
    cfg = gm.config_from_gguf(reader)
    return reader, cfg, gm.read_tensors(reader, cfg)


@pytest.mark.parametrize("fmt", ["f16", "q8_0", "q4_0", "q4_1"])
def test_written_file_reads_back(tiny, tmp_path, fmt):
    model, src = tiny
    path = export.export_gguf(model, tmp_path / f"m_{fmt}.gguf", fmt, source=src)
    reader, cfg, tensors = _read(path)
    assert cfg.hidden_size == 64 and cfg.num_key_value_heads == 2 and cfg.tie_word_embeddings
    assert reader.fields["general.file_type"].contents() == export.GGUF_FORMATS[fmt]
    assert reader.fields["tokenizer.ggml.tokens"].contents() == [f"t{i}" for i in range(96)]
    for name, w in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        got = tensors[name]
        got = got.dequantize() if isinstance(got, gm.BlockQuantized) else got
        kind = "q8_0" if "embed" in name and fmt != "f16" else fmt
        if w.dim() == 1:
            want = w.float()
        elif kind == "f16":
            want = w.half().float()
        else:
            want = gm.QUANTIZERS[kind](w).dequantize()
        assert torch.equal(got, want), name                    # q/k rows back in HF order
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]


def test_a_methods_codes_go_in_unchanged(tiny, tmp_path):
    model, src = tiny
    qm = cal.rtn_model(model, 4, 32, scale_dtype=torch.float16)     # codes -7..7, fp16 scales
    path = export.export_gguf(qm, tmp_path / "rtn.gguf", "q4_0", source=src)
    _, _, tensors = _read(path)
    lin = qm.model.layers[1].mlp.down_proj
    got = tensors["model.layers.1.mlp.down_proj.weight"]
    assert got.kind == "q4_0" and torch.equal(got.codes, lin.codes)
    assert torch.equal(got.dequantize(), lin.dequantized())
    qa = cal.rtn_model(model, 4, 32, symmetric=False, scale_dtype=torch.float16)
    p1 = export.export_gguf(qa, tmp_path / "asym.gguf", "q4_1", source=src, strict_scales=False)
    got = _read(p1)[2]["model.layers.0.self_attn.o_proj.weight"]
    assert got.kind == "q4_1"
    assert torch.allclose(got.dequantize(), qa.model.layers[0].self_attn.o_proj.dequantized(),
                          atol=1e-2)


def test_refusals_leave_nothing_behind(tiny, tmp_path):
    model, src = tiny
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match="fmt must be one of"):
        export.export_gguf(model, out / "a.gguf", "q4_k", source=src)
    with pytest.raises(ValueError, match=r"\.gguf"):
        export.export_gguf(model, out / "a.bin", "q4_0", source=src)
    with pytest.raises(TypeError, match="LlamaModel"):
        export.export_gguf(torch.nn.Linear(2, 2), out / "a.gguf", source=src)
    other = _source(tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(ValueError, match="'llama' architecture"):
        export.export_gguf(model, out / "a.gguf", source=other)
    wider = _source(tmp_path / "wide.gguf", hidden_size=128)
    with pytest.raises(ValueError, match="another model"):
        export.export_gguf(model, out / "a.gguf", source=wider)
    g128 = cal.rtn_model(model, 4, 64, scale_dtype=torch.float16)
    with pytest.raises(ValueError, match="group_size=32"):
        export.export_gguf(g128, out / "a.gguf", "q4_0", source=src)
    fp32 = cal.rtn_model(model, 4, 32)                          # fp32 scales
    with pytest.raises(ValueError, match="scale_dtype=torch.float16"):
        export.export_gguf(fp32, out / "a.gguf", "q4_0", source=src)
    nan = LlamaModel(ModelConfig(**CFG)).eval()
    nan.model.layers[1].mlp.up_proj.weight.data[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        export.export_gguf(nan, out / "a.gguf", "q4_0", source=src)
    assert list(out.iterdir()) == []                            # nothing, not even a partial


def test_block_size_must_divide_the_rows(tmp_path):
    cfg = {**CFG, "hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2}
    model = LlamaModel(ModelConfig(**cfg)).eval()
    src = _source(tmp_path / "s.gguf", hidden_size=48)
    with pytest.raises(ValueError, match="multiple of 32"):
        export.export_gguf(model, tmp_path / "m.gguf", "q4_0", source=src)
    assert export.export_gguf(model, tmp_path / "m.gguf", "f16", source=src).is_file()


def test_an_existing_file_is_kept_unless_asked(tiny, tmp_path):
    model, src = tiny
    path = tmp_path / "m.gguf"
    path.write_bytes(b"old")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export.export_gguf(model, path, "q8_0", source=src)
    assert path.read_bytes() == b"old"
    export.export_gguf(model, path, "q8_0", source=src, overwrite=True)
    assert path.read_bytes()[:4] == b"GGUF"
    with pytest.raises(IsADirectoryError, match="folder"):
        export.export_gguf(model, tmp_path, "q8_0", source=src)


def test_metadata_reader_refuses_other_files(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"GGML" + bytes(40))
    with pytest.raises(ValueError, match="not a GGUF file"):
        gm.read_metadata(tmp_path / "x.gguf")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        gm.read_metadata(tmp_path / "none.gguf")


@pytest.mark.parametrize("grid", ["q4_0", "q4_1"])
def test_rtn_on_llama_cpps_grid_writes_the_same_bytes_as_the_writers_rounding(tiny, tmp_path,
                                                                              grid):
    """The methods' grid= (GPTQ, AWQ, RTN) and the writer agree on llama.cpp's rule: RTN on
    the grid, written with its codes unchanged, is byte for byte the writer's own rounding."""
    model, src = tiny
    qm = cal.rtn_model(model, 4, 32, grid=grid)
    a = _read(export.export_gguf(qm, tmp_path / "grid.gguf", grid, source=src))[2]
    b = _read(export.export_gguf(model, tmp_path / "plain.gguf", grid, source=src))[2]
    for name, t in b.items():
        if isinstance(t, gm.BlockQuantized):
            assert np.array_equal(a[name].to_bytes(), t.to_bytes()), name
