"""course_lib.qmodel: swapping Linears for fake-quant / packed ones, skip lists, byte reports."""
import copy

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
    # independent: the same net with each weight rounded by hand, one absmax scale per row
    # (fp16 scales are the only difference: far below INT8's step); per-tensor scales differ
    def by_hand(per_row):
        h = copy.deepcopy(net)
        for lin in (h[0], h[2]):
            w = lin.weight.detach()
            s = (w.abs().amax(1, keepdim=True) if per_row else w.abs().max()) / 127
            lin.weight.data = torch.round(w / s) * s
        return h(x)
    assert torch.allclose(qn(x), by_hand(True), atol=2e-4)
    assert not torch.allclose(qn(x), by_hand(False), atol=2e-4)
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


def test_stored_bytes_by_hand_zero_points_and_refusals():
    # (4, 64) at 4 bits: 128 bytes of codes; groups of 32: 8 fp16 scales = 16 bytes
    assert qmodel.stored_bytes((4, 64), "int4", "per_group", 32) == 128 + 16
    assert qmodel.stored_bytes((4, 64), "int4", "per_group", 32, symmetric=False) == 128 + 16 + 8
    assert qmodel.stored_bytes((4, 64), "uint4", "per_group", 32) == 128 + 16 + 8   # always asym
    assert qmodel.stored_bytes((4, 64), "int8", "per_channel", None) == 256 + 8
    assert qmodel.stored_bytes((4, 64), "int3", "per_tensor", None) == 96 + 2
    with pytest.raises(ValueError, match="divides in_features=64"):
        qmodel.stored_bytes((4, 64), "int4", "per_group", 24)
    with pytest.raises(ValueError, match="two whole numbers"):
        qmodel.stored_bytes((4, 0), "int4", "per_channel", None)
    with pytest.raises(ValueError, match="two whole numbers"):
        qmodel.stored_bytes((4, 64, 2), "int4", "per_channel", None)
    with pytest.raises(ValueError, match="unknown granularity"):
        qmodel.stored_bytes((4, 64), "int4", "per_row", None)
    with pytest.raises(ValueError, match="bits must be 2..8"):
        qmodel.stored_bytes((4, 64), "int9", "per_channel", None)
    # the packed layer's real buffers agree with the count (zero points included)
    lin = nn.Linear(64, 4, bias=False)
    pk = qmodel.PackedLinear(lin, "int4", "per_group", 32, symmetric=False)
    assert pk.nbytes() == qmodel.stored_bytes((4, 64), "int4", "per_group", 32, symmetric=False)


def test_inplace_and_a_tied_head():
    m = small_llama()
    same, rep = qmodel.quantize_model(m, "int4", "per_group", 32, inplace=True)
    assert same is m and isinstance(m.model.layers[0].mlp.down_proj, qmodel.FakeQuantLinear)
    tied = LlamaModel(ModelConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=128,
                                  tie_word_embeddings=True)).init_weights(0).eval()
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    w0 = tied.model.embed_tokens.weight.detach().clone()
    qt, rep = qmodel.quantize_model(tied, "int4", "per_group", 32, skip=("embed_tokens",))
    assert "lm_head" in [n for n, _ in rep.quantized]
    assert torch.equal(qt.model.embed_tokens.weight, w0)                 # the embedding kept
    assert torch.equal(qt.lm_head.weight, quant.fake_quantize(w0, "int4", "per_group", 32))
    assert tied.lm_head.weight is tied.model.embed_tokens.weight         # the original still tied


def test_fake_quant_weight_and_sweep_refusals():
    w = torch.tensor([[7.0, 0.5, 1.5, 2.5, -2.5, -0.5, 3.5, 0.0]])
    assert qmodel.fake_quant_weight(w, 4).tolist() == [[7, 0, 2, 2, -2, 0, 4, 0]]   # half to even
    for bad, words in [((w, 1), "bits must be"), ((w, 4.0), "bits must be"),
                       ((w, 4, 3), "group_size"), ((w[0], 4), "2-D float"),
                       ((w.long(), 4), "2-D float")]:
        with pytest.raises(ValueError, match=words):
            qmodel.fake_quant_weight(*bad)
    m = small_llama()
    with pytest.raises(ValueError, match="non-empty list of"):
        qmodel.rtn_sweep(m, None, [])
    with pytest.raises(ValueError, match="non-empty list of name pieces"):
        qmodel.layer_sensitivity(m, None, [])
    with pytest.raises(ValueError, match="non-empty list of name pieces"):
        qmodel.layer_sensitivity(m, None, ".q_proj")
    with pytest.raises(ValueError, match="repeat"):
        qmodel.layer_sensitivity(m, None, [".q_proj", ".q_proj"])
