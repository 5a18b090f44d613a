"""SmoothQuant: the factors, the worked example, folding invariance, refusals."""
import math

import pytest
import torch

from course_lib import data
from course_lib.methods import smoothquant as sq
from course_lib.model import LlamaModel, ModelConfig, load_pretrained


def test_worked_example_from_the_source():
    ex = sq.worked_example(64.0, 0.5, 0.5)
    assert abs(ex["s"] - 11.3) < 0.05 and abs(ex["s"] - math.sqrt(64) / math.sqrt(0.5)) < 1e-5
    assert abs(ex["act_max"] - 5.66) < 0.005 and abs(ex["weight_max"] - 5.66) < 0.005


def test_factors_by_hand_and_edge_cases():
    a = torch.tensor([64.0, 1.0, 0.0, 4.0])
    w = torch.tensor([0.5, 1.0, 0.3, 0.0])
    s = sq.smoothing_factors(a, w, 0.5)
    assert torch.allclose(s, torch.tensor([8 / math.sqrt(0.5), 1.0, 1.0, 1.0]))
    assert torch.allclose(sq.smoothing_factors(a[:2], w[:2], 1.0), a[:2])       # all to weights
    assert torch.allclose(sq.smoothing_factors(a[:2], w[:2], 0.0), 1 / w[:2])   # all to activations
    x_after, w_after = sq.smoothed_maxima(a[:2], w[:2], 0.75)
    assert torch.allclose(x_after, a[:2] ** 0.25 * w[:2] ** 0.25)
    assert torch.allclose(w_after, a[:2] ** 0.75 * w[:2] ** 0.75)


@pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan"), True])
def test_alpha_outside_0_1_is_refused(alpha):
    with pytest.raises(ValueError, match=r"alpha .* \[0, 1\]"):
        sq.smoothing_factors(torch.ones(3), torch.ones(3), alpha)


def test_bad_maxima_are_refused():
    with pytest.raises(ValueError, match="width must match"):
        sq.smoothing_factors(torch.ones(3), torch.ones(4))
    with pytest.raises(ValueError, match="non-negative"):
        sq.smoothing_factors(torch.tensor([1.0, -2.0]), torch.ones(2))


def _tiny(seed=0):
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=48, max_position_embeddings=32)
    return LlamaModel(cfg).init_weights(seed).eval()


def test_folding_leaves_the_float_model_unchanged_random_model():
    model = _tiny()
    ids = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(0))
    stats = sq.calibrate_absmax(model, ids)
    smooth, factors = sq.smooth_model(model, stats, alpha=0.5)
    assert len(factors) == 2 * 2                       # the reference: the two norms per block
    assert any(float((s - 1).abs().max()) > 0.1 for s in factors.values())   # it did something
    q0 = model.model.layers[0].self_attn.q_proj.weight
    assert not torch.allclose(smooth.model.layers[0].self_attn.q_proj.weight, q0)
    assert torch.allclose(smooth(ids), model(ids), rtol=1e-4, atol=1e-4)


def test_folding_leaves_the_bundled_model_unchanged_and_flattens_activations():
    model = load_pretrained()
    text = data.heldout_text()
    calib = data.to_tensor(text[32768:32768 + 1024]).view(4, 256)
    ids = data.to_tensor(text[:512]).view(2, 256)
    stats = sq.calibrate_absmax(model, calib)
    smooth, _ = sq.smooth_model(model, stats, alpha=0.5, extra=("down_proj", "o_proj"))
    ref, out = model(ids), smooth(ids)
    assert (out - ref).abs().max() < 1e-3 * ref.abs().max()
    # after smoothing the down_proj inputs are far flatter (max over median channel)
    name = "model.layers.0.mlp.down_proj"
    after = sq.calibrate_absmax(smooth, calib, names=[name])[name]
    before = stats[name]
    ratio = lambda a: float(a.max() / a.median())        # noqa: E731
    assert ratio(after) < ratio(before) / 2


def test_refusals():
    model = _tiny()
    ids = torch.randint(0, 64, (2, 8))
    stats = sq.calibrate_absmax(model, ids)
    with pytest.raises(ValueError, match="no foldable predecessor"):
        sq.smooth_model(model, stats, layers=["lm_head"])
    with pytest.raises(ValueError, match=r"extra must name groups among \['down_proj', 'o_proj'\]"):
        sq.smooth_model(model, stats, extra=("gate_proj",))
    with pytest.raises(TypeError, match="act_absmax must be a dict"):
        sq.smooth_model(model, [torch.ones(32)])
    bad = dict(stats)
    bad["model.layers.0.self_attn.q_proj"] = torch.ones(31)
    with pytest.raises(ValueError, match="32 input features"):
        sq.smooth_model(model, bad)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        sq.smooth_model(model, stats, alpha=2)
    with pytest.raises(ValueError, match="no calibration maxima"):
        sq.smooth_model(model, {})
    with pytest.raises(ValueError, match="Llama-layout"):
        sq.fold_groups(torch.nn.Linear(3, 3))


def test_one_layer_smooths_its_whole_group_only():
    model = _tiny()
    stats = sq.calibrate_absmax(model, torch.randint(0, 64, (2, 8)))
    smooth, factors = sq.smooth_model(model, stats, layers=["model.layers.1.self_attn.k_proj"])
    assert list(factors) == ["model.layers.1.input_layernorm"]
    assert torch.equal(smooth.model.layers[0].mlp.down_proj.weight,
                       model.model.layers[0].mlp.down_proj.weight)


def test_fold_scales_by_hand():
    norm = torch.tensor([1.0, 2.0, 4.0])
    w = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, -1.0]])
    s = torch.tensor([2.0, 4.0, 0.5])
    new_norm, (new_w,) = sq.fold_scales(norm, [w], s)
    assert new_norm.tolist() == [0.5, 0.5, 8.0]
    assert new_w.tolist() == [[2.0, 4.0, 0.5], [4.0, 0.0, -0.5]]
    assert norm.tolist() == [1.0, 2.0, 4.0]                      # not modified in place
    up = torch.arange(6.0).view(3, 2)                            # a Linear predecessor (K=3, in=2)
    new_up, _ = sq.fold_scales(up, [w], s)
    assert torch.equal(new_up, up / s[:, None])
    x = torch.randn(5, 2)
    assert torch.allclose((x @ new_up.T) @ new_w.T, (x @ up.T) @ w.T, atol=1e-5)
    with pytest.raises(ValueError, match="finite and positive"):
        sq.fold_scales(norm, [w], torch.tensor([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match=r"\(out, 3\)"):
        sq.fold_scales(norm, [w.T], s)


def _gqa_model(seed=0, dtype=torch.float64):
    cfg = ModelConfig(vocab_size=64, hidden_size=48, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=2, intermediate_size=40, max_position_embeddings=32)
    return LlamaModel(cfg).init_weights(seed).eval().to(dtype)


@pytest.mark.parametrize("extra", [(), ("down_proj",), ("o_proj",), ("down_proj", "o_proj")])
def test_every_group_choice_leaves_the_model_unchanged_in_full_precision(extra):
    """In float64 the smoothed model's hidden states equal the original's (GQA: 6 query heads
    read 2 KV heads), whichever groups are smoothed."""
    model = _gqa_model()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    stats = sq.calibrate_absmax(model, ids)
    smooth, factors = sq.smooth_model(model, stats, alpha=0.6, extra=extra)
    assert len(factors) == 2 * (2 + len(extra))
    assert all(float((s - 1).abs().max()) > 0.05 for s in factors.values())   # real factors
    with torch.no_grad():
        h0, h1 = model.model.layers[1](*_block_inputs(model, ids)), \
            smooth.model.layers[1](*_block_inputs(smooth, ids))
        assert torch.allclose(h1, h0, rtol=1e-10, atol=1e-12)
        assert torch.allclose(smooth(ids), model(ids), rtol=1e-6, atol=1e-7)


def _block_inputs(model, ids):
    x = model.model.embed_tokens(ids)
    cos, sin = model.rope(0, ids.shape[1])
    return x, cos, sin


def test_o_proj_factors_are_shared_by_the_query_heads_of_a_kv_head():
    model = _gqa_model()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    stats = sq.calibrate_absmax(model, ids)
    smooth, factors = sq.smooth_model(model, stats, alpha=0.5, layers=["model.layers.0.self_attn.o_proj"])
    assert list(factors) == ["model.layers.0.self_attn.v_proj"]
    s = factors["model.layers.0.self_attn.v_proj"]                       # (K*hd,) = (2*8,)
    assert s.shape == (16,)
    o0, o1 = (m.model.layers[0].self_attn.o_proj.weight for m in (model, smooth))
    cols = (o1 / o0)[0].reshape(2, 3, 8)                                 # (K, H/K, hd)
    assert torch.allclose(cols, s.reshape(2, 1, 8).expand(2, 3, 8).double())
    v0, v1 = (m.model.layers[0].self_attn.v_proj.weight for m in (model, smooth))
    assert torch.allclose(v1 * s[:, None].double(), v0)
    # the shared factor balances the largest activation and weight over the sharing heads
    a = stats["model.layers.0.self_attn.o_proj"].reshape(2, 3, 8).amax(1).reshape(-1)
    w = o0.abs().amax(0).float().reshape(2, 3, 8).amax(1).reshape(-1)
    assert torch.allclose(s, sq.smoothing_factors(a, w, 0.5))


def test_gqa_share_and_expand_by_hand():
    x = torch.arange(12.0)                          # H=4 heads of hd=3, K=2 KV heads
    assert sq.gqa_share(x, 4, 2).tolist() == [3.0, 4.0, 5.0, 9.0, 10.0, 11.0]
    assert sq.gqa_expand(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), 4, 2).tolist() == \
        [1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 4.0, 5.0, 6.0]
    assert torch.equal(sq.gqa_share(x, 4, 4), x)    # no GQA: nothing shared
    with pytest.raises(ValueError, match=r"n_heads \(4\) must be a multiple of n_kv_heads \(3\)"):
        sq.gqa_share(x, 4, 3)
    with pytest.raises(ValueError, match="multiple of n_heads = 5"):
        sq.gqa_share(x, 5, 1)
    with pytest.raises(ValueError, match="n_kv_heads must be a whole number >= 1"):
        sq.gqa_expand(torch.ones(6), 4, 0)


def test_reference_groups_are_the_default_and_extras_add_groups():
    model = _tiny()
    names = [p for p, _ in sq.fold_groups(model)]
    assert names[:2] == ["model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm"]
    assert len(names) == 4
    both = [p for p, _ in sq.fold_groups(model, extra=("o_proj", "down_proj"))]
    assert both[:4] == ["model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
                        "model.layers.0.mlp.up_proj", "model.layers.0.self_attn.v_proj"]
    assert "model.layers.1.self_attn.o_proj" in sq.foldable_linears(model)


@pytest.mark.parametrize("alpha", [50, 80.0])
def test_alpha_as_a_percent_is_refused_with_the_fraction_named(alpha):
    with pytest.raises(ValueError, match=r"a fraction \(0.5 in the paper, not 50\)"):
        sq.smoothing_factors(torch.ones(3), torch.ones(3), alpha)


def test_nan_maxima_and_nan_activations_are_refused():
    with pytest.raises(ValueError, match="finite and non-negative"):
        sq.smoothing_factors(torch.tensor([1.0, float("nan")]), torch.ones(2))
    model = _tiny()
    ids = torch.randint(0, 64, (2, 8))
    model.model.layers[0].input_layernorm.weight.data[3] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        sq.calibrate_absmax(model, ids)
