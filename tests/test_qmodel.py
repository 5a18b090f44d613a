"""course_lib.qmodel: swapping Linears for fake-quant / packed ones, skip lists, byte reports."""
import pytest
import torch
import torch.nn as nn

from course_lib import qmodel, quant
from course_lib.model import LlamaModel, ModelConfig


def small_llama():
    return LlamaModel(ModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=128)).init_weights(0).eval()


def test_fake_quant_weights_equal_library_fake_quantize_and_original_is_untouched():
    m = small_llama()
    w0 = m.model.layers[0].mlp.down_proj.weight.clone()
    qm, rep = qmodel.quantize_model(m, "int4", "per_group", 32)
    assert torch.equal(m.model.layers[0].mlp.down_proj.weight, w0)        # copy by default
    lin = qm.model.layers[0].mlp.down_proj
    assert isinstance(lin, qmodel.FakeQuantLinear)
    assert torch.equal(lin.weight, quant.fake_quantize(w0, "int4", "per_group", 32))
    assert len(torch.unique(lin.weight[0, :32])) <= 15                   # 15 INT4 levels per group
    assert rep.skipped == ["model.embed_tokens", "lm_head"] and len(rep.quantized) == 14
    assert isinstance(qm.lm_head, nn.Linear)


def test_packed_matches_fake_and_really_is_smaller():
    m = small_llama()
    ids = torch.randint(0, 256, (2, 16))
    for fmt, gran, gs in [("int8", "per_channel", None), ("int4", "per_group", 32),
                          ("int3", "per_group", 64), ("uint4", "per_group", 32)]:
        fq, r1 = qmodel.quantize_model(m, fmt, gran, gs, mode="fake")
        pk, r2 = qmodel.quantize_model(m, fmt, gran, gs, mode="packed")
        assert torch.allclose(fq(ids), pk(ids), atol=5e-3), fmt                # fp16 scales only
        lin = pk.model.layers[1].self_attn.q_proj
        bits = qmodel._bits(fmt)
        assert lin.codes.dtype == (torch.uint8 if bits <= 4 else torch.int8)
        assert lin.codes.shape == ((64, 32) if bits <= 4 else (64, 64))
        assert qmodel.buffer_bytes(pk) < qmodel.buffer_bytes(m)


def test_report_counts_bytes():
    m = small_llama()
    n_params = sum(p.numel() for p in m.parameters())
    _, rep = qmodel.quantize_model(m, "int8", "per_channel")
    assert rep.bytes_before == 2 * n_params
    lin_w = sum(mod.weight.numel() for n, mod in m.named_modules()
                if isinstance(mod, nn.Linear) and n != "lm_head")
    rows = sum(mod.weight.shape[0] for n, mod in m.named_modules()
               if isinstance(mod, nn.Linear) and n != "lm_head")
    assert rep.bytes_after == 2 * n_params - 2 * lin_w + lin_w + 2 * rows  # 1 B/weight + fp16 scales
    _, rep4 = qmodel.quantize_model(m, "int4", "per_group", 32)
    assert rep4.bytes_after < rep.bytes_after and rep4.ratio > rep.ratio
    assert "MiB" in str(rep4)


def test_skip_and_only():
    m = small_llama()
    ids = torch.randint(0, 256, (1, 12))
    qm, rep = qmodel.quantize_model(m, "int4", "per_group", 32, skip=())
    assert isinstance(qm.lm_head, qmodel.FakeQuantLinear) and rep.skipped == []
    emb = qm.model.embed_tokens
    assert isinstance(emb, qmodel.FakeQuantEmbedding)
    assert torch.equal(emb.weight, quant.fake_quantize(m.model.embed_tokens.weight, "int4",
                                                       "per_group", 32))
    pk, rep_p = qmodel.quantize_model(m, "int4", "per_group", 32, skip=(), mode="packed")
    assert isinstance(pk.model.embed_tokens, qmodel.PackedEmbedding)
    assert torch.allclose(pk(ids), qm(ids), atol=5e-3)
    assert rep_p.bytes_after == rep.bytes_after
    _, rep_head = qmodel.quantize_model(m, "int4", "per_group", 32, skip=("embed_tokens",))
    assert rep.bytes_after < rep_head.bytes_after
    qm, rep = qmodel.quantize_model(m, "int3", "per_group", 32, only=["layers.1.mlp.down_proj"])
    assert [n for n, _ in rep.quantized] == ["model.layers.1.mlp.down_proj"]
    with pytest.raises(ValueError, match="no layer name contains"):
        qmodel.quantize_model(m, "int4", only=["nonexistent"])
    with pytest.raises(TypeError, match="list"):
        qmodel.quantize_model(m, "int4", skip="lm_head")


def test_works_on_any_module_built_from_linear():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(5, 16)
    qn, rep = qmodel.quantize_model(net, "int8", "per_channel", mode="packed")
    assert len(rep.quantized) == 2
    assert torch.allclose(qn(x), net(x), atol=0.05)
    assert qmodel.linear_names(qn) == ["0", "2"]


def test_bad_input_errors():
    m = small_llama()
    with pytest.raises(ValueError, match="unknown mode"):
        qmodel.quantize_model(m, mode="real")
    with pytest.raises(ValueError, match="integer formats"):
        qmodel.quantize_model(m, "fp8_e4m3")
    with pytest.raises(ValueError, match="does not divide"):
        qmodel.quantize_model(m, "int4", "per_group", 48)
    with pytest.raises(ValueError, match="no nn.Linear"):
        qmodel.quantize_model(nn.Sequential(nn.ReLU()))


def test_a_skip_fragment_that_matches_nothing_is_an_error():
    m = small_llama()
    # a typo: without the check lm_head would be quantized though the caller meant to keep it
    with pytest.raises(ValueError, match=r"\['lm_heads'\] match no layer"):
        qmodel.quantize_model(m, "int4", "per_group", 32, skip=("lm_heads",))
    _, rep = qmodel.quantize_model(m, "int4", "per_group", 32, skip=("lm_head",))
    assert "lm_head" in rep.skipped
