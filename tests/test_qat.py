"""Quantization-aware training (course_lib.qat): the straight-through estimator, LSQ's step
gradient, learned clipping, BitNet's ternary weights, the QAT layer, step and loop."""
import copy
import math

import pytest
import torch
import torch.nn as nn

from course_lib import qat, quant
from course_lib.methods import calibration as cal
from course_lib.model import LlamaModel, ModelConfig


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _tiny_model(seed=0):
    cfg = ModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaModel(cfg).init_weights(seed)


# ----------------------------------------------------------------------------- the STE
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_ste_forward_is_the_grid_of_lessons_02_03(bits):
    w = torch.randn(16, 64, generator=_gen(bits))
    s = w.view(16, 2, 32).abs().amax(-1, keepdim=True) / qat.qmax_of(bits)   # absmax step
    out = qat.fake_quant_ste(w.view(16, 2, 32), s, bits).reshape(16, 64)
    assert torch.equal(out, quant.fake_quantize(w, f"int{bits}", "per_group", 32))


def test_ste_backward_passes_inside_the_range_and_zero_outside():
    w = torch.tensor([-5.0, -3.0, -2.9, -0.4, 0.0, 0.6, 3.0, 3.2, 9.0], requires_grad=True)
    s = torch.tensor(1.0)
    out = qat.fake_quant_ste(w, s, 3)                                      # qmax 3
    g = torch.arange(1.0, 10.0)
    out.backward(g)
    inside = torch.tensor([0, 1, 1, 1, 1, 1, 1, 0, 0], dtype=torch.float32)  # |w/s| <= 3
    assert torch.equal(w.grad, g * inside)
    # the forward really is flat there (and a staircase inside): the definition
    assert torch.equal(out.detach(), torch.tensor([-3.0, -3, -3, -0, 0, 1, 3, 3, 3]))


# ----------------------------------------------------------------------------- LSQ
def _lsq_reference_grad_s(w, s, qmax):
    """LSQ's d w_hat / d s written from the paper's definition, weight by weight."""
    out = []
    for v in (w / s).tolist():
        if v < -qmax:
            out.append(-qmax)
        elif v > qmax:
            out.append(qmax)
        else:
            out.append(round(v) - v)                      # Python rounds half to even too
    return torch.tensor(out, dtype=w.dtype)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_lsq_step_gradient_matches_its_definition(bits):
    qmax = qat.qmax_of(bits)
    w = torch.randn(40, dtype=torch.float64, generator=_gen(bits)) * 2
    s = torch.tensor([0.37], dtype=torch.float64, requires_grad=True)
    gs = qat.lsq_grad_scale(40, bits)
    assert gs == pytest.approx(1 / math.sqrt(40 * qmax))
    up = torch.randn(40, dtype=torch.float64, generator=_gen(9))
    (qat.fake_quant_lsq(w, s, bits, gs) * up).sum().backward()
    expect = (up * _lsq_reference_grad_s(w, 0.37, qmax)).sum() * gs
    assert torch.allclose(s.grad, expect.reshape(1), rtol=1e-12, atol=1e-12)


def test_lsq_step_gradient_is_the_derivative_where_rounding_is_locally_constant():
    # Between two rounding boundaries w_hat = s * q with q fixed (inside) or s * +-qmax
    # (clipped): differentiable in s, so a central finite difference must agree.
    w = torch.tensor([0.31, -0.72, 1.44, -2.6, 5.0, -7.5, 0.05], dtype=torch.float64)
    s0 = 0.5003
    up = torch.tensor([0.3, -1.2, 0.8, 2.0, -0.5, 1.1, 0.7], dtype=torch.float64)
    s = torch.tensor(s0, dtype=torch.float64, requires_grad=True)
    (qat.LSQFakeQuant.apply(w, s, 3, 1.0) * up).sum().backward()
    h = 1e-6

    def f(sv):
        return float((qat.LSQFakeQuant.apply(w, torch.tensor(sv, dtype=torch.float64), 3, 1.0)
                      * up).sum())

    fd = (f(s0 + h) - f(s0 - h)) / (2 * h)
    # LSQ's gradient adds round(v) - v inside, the term the staircase's derivative in s lacks
    # (q fixed: d(s q)/ds = q); the definition: q - v inside, +-qmax outside
    v = w / s0
    q = torch.clamp(torch.round(v), -3, 3)
    inside = v.abs() <= 3
    assert fd == pytest.approx(float((up * q).sum()), rel=1e-6)
    assert float(s.grad) == pytest.approx(float((up * torch.where(inside, q - v, q)).sum()),
                                          rel=1e-12)


def test_lsq_weight_gradient_is_the_ste():
    w = torch.randn(8, 32, generator=_gen(3), requires_grad=True)
    s = torch.full((8, 1, 1), 0.2, requires_grad=True)
    out = qat.fake_quant_lsq(w.view(8, 1, 32), s, 4)
    out.sum().backward()
    assert torch.equal(w.grad, ((w / 0.2).abs() <= 7).float())
    assert s.grad.shape == (8, 1, 1)


def test_lsq_broadcast_step_gradient_sums_per_group():
    w = torch.randn(4, 3, 8, dtype=torch.float64, generator=_gen(5))
    s = torch.rand(4, 3, 1, dtype=torch.float64, generator=_gen(6)) * 0.5 + 0.1
    s.requires_grad_(True)
    qat.LSQFakeQuant.apply(w, s, 7, 1.0).sum().backward()
    for i in range(4):
        for j in range(3):
            expect = _lsq_reference_grad_s(w[i, j], float(s.detach()[i, j, 0]), 7).sum()
            assert float(s.grad[i, j, 0]) == pytest.approx(float(expect), abs=1e-12)


def test_qat_linear_grad_scale_default_is_lsqs_and_1_switches_it_off():
    lin = nn.Linear(64, 8, bias=False)
    torch.nn.init.normal_(lin.weight, generator=_gen(7))
    x = torch.randn(16, 64, generator=_gen(8))
    grads = {}
    for gs in (None, 1.0):
        q = qat.QATLinear(lin, 3, 32, "lsq", grad_scale=gs)
        q(x).pow(2).sum().backward()
        grads[gs] = q.step.grad.clone()
    g = qat.lsq_grad_scale(32, 3)                                            # 1/sqrt(32 * 3)
    assert torch.allclose(grads[None], grads[1.0] * g, rtol=1e-6, atol=0)


@pytest.mark.parametrize("mode, gs, match", [
    ("lsq", 0.0, "grad_scale must be a positive number"),
    ("lsq", float("nan"), "grad_scale must be a positive number"),
    ("clip", 1.0, "grad_scale applies to the learned step of mode 'lsq' only"),
    ("ternary", 0.5, "grad_scale applies to the learned step of mode 'lsq' only"),
])
def test_qat_linear_refuses_a_grad_scale_it_cannot_use(mode, gs, match):
    with pytest.raises(ValueError, match=match):
        qat.QATLinear(nn.Linear(64, 8), 3, 32, mode, grad_scale=gs)


# ----------------------------------------------------------------------------- learned clipping
def test_learned_clipping_step_and_its_gradient_by_finite_differences():
    wg = torch.randn(6, 4, 16, dtype=torch.float64, generator=_gen(7))
    gamma = torch.full((6, 4, 1), 1.5, dtype=torch.float64, requires_grad=True)
    s = qat.clip_scale(wg, gamma, 3)
    amax = wg.abs().amax(-1, keepdim=True)
    assert torch.allclose(s, torch.sigmoid(torch.tensor(1.5)) * amax / 3)
    # d s / d gamma is smooth: check it against a finite difference
    s.sum().backward()
    h = 1e-6
    fd = ((qat.clip_scale(wg, gamma.detach() + h, 3) - qat.clip_scale(wg, gamma.detach() - h, 3))
          / (2 * h))
    assert torch.allclose(gamma.grad, fd, rtol=1e-6)


def test_clip_layer_starts_near_round_to_nearest_and_shrinks_the_range_only():
    lin = nn.Linear(64, 8, bias=False)
    q = qat.QATLinear(lin, 3, 32, "clip", clip_init=30.0)                  # sigmoid(30) = 1 - 1e-13
    assert torch.allclose(q.quantized_weight(), quant.fake_quantize(lin.weight.detach(), "int3",
                                                                    "per_group", 32), atol=1e-6)
    q.gamma.data.fill_(-50.0)
    assert float(q.scale().detach().max()) < 1e-20                          # never past the absmax


# ----------------------------------------------------------------------------- ternary
def test_ternary_absmean_is_bitnets_definition():
    w = torch.tensor([[0.9, -0.05, 0.3, -0.6], [0.0, 0.2, -1.4, 0.1]], requires_grad=True)
    w_hat, scale = qat.ternary_absmean(w)
    assert float(scale) == pytest.approx(float(w.detach().abs().mean()))
    assert set(torch.unique(w_hat.detach() / scale).tolist()) <= {-1.0, 0.0, 1.0}
    assert torch.allclose(w_hat.detach(), torch.clamp(torch.round(w.detach() / scale), -1, 1)
                          * scale)
    w_hat.sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))                          # identity STE


# ----------------------------------------------------------------------------- the layer
@pytest.mark.parametrize("mode", ["lsq", "fixed"])
def test_qat_linear_starts_at_round_to_nearest(mode):
    lin = nn.Linear(96, 24)
    q = qat.QATLinear(lin, 4, 32, mode)
    assert torch.equal(q.quantized_weight().detach(),
                       quant.fake_quantize(lin.weight.detach(), "int4", "per_group", 32))
    x = torch.randn(5, 96, generator=_gen(1))
    assert torch.allclose(q(x), nn.functional.linear(x, q.quantized_weight(), lin.bias))


def test_freeze_gives_the_codes_and_weight_the_layer_computed_with():
    model = _tiny_model()
    q = qat.prepare_qat(model, 3, 32, "lsq")
    with torch.no_grad():
        for m in qat.qat_linears(q).values():
            m.step.mul_(0.9)                                                 # a learned step
    ids = torch.randint(0, 256, (2, 16), generator=_gen(2))
    frozen = qat.freeze(q)
    assert torch.allclose(frozen(ids), q(ids), atol=1e-5)
    layers = {n: m for n, m in frozen.named_modules() if isinstance(m, cal.GroupQuantLinear)}
    assert len(layers) == 14 and all(int(m.codes.abs().max()) <= 3 for m in layers.values())


def test_freeze_with_fp16_steps_is_exact_in_fp16():
    q = qat.prepare_qat(_tiny_model(), 4, 32, "lsq")
    frozen = qat.freeze(q, scale_dtype=torch.float16)
    for m in frozen.modules():
        if isinstance(m, cal.GroupQuantLinear):
            assert m.scale.dtype == torch.float16
            assert torch.equal(m.weight, m.dequantized())


# ----------------------------------------------------------------------------- step and loop
def test_qat_step_lowers_the_loss_and_moves_the_steps():
    model = _tiny_model()
    q = qat.prepare_qat(model, 3, 32, "lsq")
    opt = torch.optim.AdamW(qat.param_groups(q, 3e-3), betas=(0.9, 0.95))
    corpus = torch.randint(0, 8, (4000,), generator=_gen(0))                # an easy text
    g = _gen(1)
    x, y = qat.random_windows(corpus, 4, 32, g)
    before = [m.step.detach().clone() for m in qat.qat_linears(q).values()]
    losses = [qat.qat_step(q, opt, x, y, step=i) for i in range(8)]
    assert losses[-1] < losses[0]
    after = [m.step.detach() for m in qat.qat_linears(q).values()]
    assert any(not torch.equal(a, b) for a, b in zip(after, before))
    assert not any(p.requires_grad for n, p in q.named_parameters() if "embed" in n or "norm" in n)


def test_train_qat_records_a_learning_curve_and_distils_from_a_teacher():
    model = _tiny_model()
    q = qat.prepare_qat(model, 2, 32, "lsq")
    corpus = torch.randint(0, 8, (4000,), generator=_gen(0))
    calls = []

    def evaluate(m):
        calls.append(1)
        return {"n": len(calls)}

    curve = qat.train_qat(q, corpus, 6, lr=1e-3, batch=2, ctx=16, teacher=model,
                          evaluate=evaluate, eval_every=3)
    assert [s for s, _ in curve.heldout] == [0, 3, 6] and len(curve.loss) == 6
    assert all(l >= 0 for _, l in curve.loss)                               # a KL


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("bits", [1, 9, 0, 3.0, True])
def test_bits_the_grid_cannot_take(bits):
    with pytest.raises(ValueError, match="bits must be a whole number from 2 to 8"):
        qat.QATLinear(nn.Linear(64, 4), bits, 32)


def test_group_size_the_layer_cannot_take():
    with pytest.raises(ValueError, match="does not divide"):
        qat.QATLinear(nn.Linear(96, 4), 4, 64)
    with pytest.raises(ValueError, match="self_attn.q_proj: group_size 48 does not divide"):
        qat.prepare_qat(_tiny_model(), 4, 48)
    with pytest.raises(ValueError, match="group_size must be a whole number"):
        qat.QATLinear(nn.Linear(64, 4), 4, 0)


@pytest.mark.parametrize("kw, match", [({"lr": 0}, "lr must be a positive number"),
                                       ({"lr": -1e-3}, "lr must be a positive number"),
                                       ({"steps": 0}, "steps must be a whole number >= 1"),
                                       ({"steps": 2.5}, "steps must be a whole number >= 1")])
def test_learning_rate_and_steps_must_be_positive(kw, match):
    q = qat.prepare_qat(_tiny_model(), 4, 32)
    args = {"steps": 2, "lr": 1e-3, **kw}
    with pytest.raises(ValueError, match=match):
        qat.train_qat(q, torch.randint(0, 8, (500,)), batch=2, ctx=8, **args)


def test_nan_loss_stops_and_says_at_which_step():
    model = _tiny_model()
    q = qat.prepare_qat(model, 4, 32)
    calls = []

    def poisoned(m, opt, x, y, t, step):
        calls.append(step)
        if step == 3:
            with torch.no_grad():
                m.model.embed_tokens.weight.fill_(float("nan"))     # a poisoned input
        return qat.qat_step(m, opt, x, y, t, step)

    with pytest.raises(qat.NonFiniteLoss, match=r"the loss is nan at step 3: training diverged"):
        qat.train_qat(q, torch.randint(0, 8, (800,)), 10, batch=2, ctx=8, step_fn=poisoned)
    assert calls == [0, 1, 2, 3]


def test_model_without_a_trainable_linear():
    with pytest.raises(ValueError, match="no trainable nn.Linear"):
        qat.prepare_qat(nn.Sequential(nn.Embedding(10, 4)), 4, 4)
    frozen = _tiny_model().requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable nn.Linear"):
        qat.prepare_qat(frozen, 4, 32)
    with pytest.raises(ValueError, match="no QATLinear layers: call prepare_qat"):
        qat.train_qat(_tiny_model(), torch.randint(0, 8, (500,)), 2, batch=2, ctx=8)


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown mode 'bitnet'; known: lsq, clip, ternary"):
        qat.prepare_qat(_tiny_model(), 4, 32, "bitnet")


# ----------------------------------------------------------------------------- containers
def test_a_3_bit_grid_in_4_bit_containers_keeps_codes_and_weights():
    q = qat.prepare_qat(_tiny_model(), 3, 32, "lsq")
    frozen = qat.freeze(q)
    boxed = qat.to_container(frozen, 4, 32, torch.float32)
    ids = torch.randint(0, 256, (1, 12), generator=_gen(4))
    assert torch.equal(boxed(ids), frozen(ids))
    for m in boxed.modules():
        if isinstance(m, cal.GroupQuantLinear):
            assert m.bits == 4 and int(m.codes.abs().max()) <= 3
    with pytest.raises(ValueError, match="do not fit symmetric 2-bit containers"):
        qat.to_container(frozen, 2)


def test_ternary_rows_become_groups_of_32_with_the_same_scale():
    q = qat.prepare_qat(_tiny_model(), mode="ternary")
    frozen = qat.freeze(q)
    boxed = qat.to_container(frozen, 4, 32, torch.float32)
    ids = torch.randint(0, 256, (1, 12), generator=_gen(5))
    assert torch.allclose(boxed(ids), q(ids), atol=1e-5)
    lin = boxed.model.layers[0].mlp.down_proj
    assert lin.scale.shape == (64, 128 // 32) and torch.equal(lin.scale, lin.scale[:, :1].expand(-1, 4))


# ----------------------------------------------------------------------------- block by block
def test_tune_block_lowers_the_block_error_from_round_to_nearest():
    model = _tiny_model()
    block = copy.deepcopy(model.model.layers[0]).requires_grad_(True)
    cos, sin = model.rope(0, 16)
    x = torch.randn(4, 16, 64, generator=_gen(6))
    with torch.no_grad():
        target = model.model.layers[0](x, cos, sin)
    losses = qat.tune_block(block, x, target, cos, sin, 2, 32, steps=15, lr=1e-3, scale_lr=1e-2)
    assert losses[-1] < losses[0]
    assert len(qat.qat_linears(block)) == 7


def test_blockwise_qat_quantizes_every_block_linear():
    model = _tiny_model()
    ids = torch.randint(0, 256, (4, 16), generator=_gen(7))
    log = []
    qm, secs = qat.blockwise_qat(model, ids, 3, 32, steps=2, log=log)
    kinds = {type(m).__name__ for n, m in qm.named_modules() if n.count(".") >= 3 and "proj" in n}
    assert kinds == {"GroupQuantLinear"} and len(log) == 2 and secs > 0
    assert all(p.requires_grad is False for p in qm.parameters())


def test_tune_block_refuses_mismatched_activations():
    model = _tiny_model()
    cos, sin = model.rope(0, 8)
    with pytest.raises(ValueError, match="x and target must be the same"):
        qat.tune_block(model.model.layers[0], torch.zeros(2, 8, 64), torch.zeros(2, 8, 32),
                       cos, sin, 3, 32)


def test_the_export_only_rerun_is_for_smollm2_only():
    """``--export-only`` reruns the GGUF/llama.cpp check of the SmolLM2 table alone
    (``course_lib.experiments.qat_tables.rerun_exports``); the bundled table has no export to
    rerun."""
    from course_lib.experiments import qat_tables
    with pytest.raises(SystemExit):
        qat_tables.main(["--model", "bundled", "--export-only"])


# ----------------------------------------------------------------------------- file formats
def test_gguf_block_sizes_match_the_gguf_package():
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    for name in ("Q4_0", "TQ1_0", "TQ2_0"):                  # Q2_0 is newer than gguf 0.19
        n, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
        assert qat.GGML_BLOCKS[name][0] == n
        assert sum(qat.GGML_BLOCKS[name][1].values()) == nbytes
        assert qat.gguf_bits_per_weight(name) == 8 * nbytes / n
    assert qat.gguf_bits_per_weight("TQ1_0") == 1.6875 and qat.gguf_bits_per_weight("TQ2_0") == 2.0625
    assert qat.gguf_bits_per_weight("Q2_0") == 2.25


def test_gguf_bits_per_weight_names_the_formats_it_knows():
    with pytest.raises(ValueError, match="unknown block format 'Q3_K'; known: Q4_0, Q2_0, TQ1_0"):
        qat.gguf_bits_per_weight("Q3_K")
