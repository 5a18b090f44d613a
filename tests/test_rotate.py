"""course_lib.rotate (lesson 16): norm folding, QuaRot's rotations on the course's model, and
incoherence before and after.

Tolerances, measured (max |logits - original logits| after quarot(): norms folded, R1 with
random_hadamard(D, 0), R2, R4, R3; 2 x 128 random bytes on the bundled model, largest |logit|
18.1; 256 clean calibration tokens on SmolLM2, largest |logit| 40.3):

    float32   bundled 2.0e-5 (1.1e-6 of the largest |logit|); SmolLM2 6.9e-5 (1.7e-6), at most
              9.2e-5 (2.3e-6) after any single step; every SmolLM2 block's output equals the
              original's times Q to 5.1e-7 of its largest entry (which reaches 2.0e4)
    float64   bundled 4.6e-6, SmolLM2 1.8e-5 as model.py runs: its RMSNorm computes in float32
              (x.float()), so a float64 model rounds there; with that norm kept in float64 the
              logits (read before model.py's final .float()) agree to 4.6e-14 (bundled) and
              4.4e-13 (SmolLM2, 1.1e-14 relative): the float32 differences are rounding, not a
              change of function.
"""
import copy
import math

import pytest
import torch
import torch.nn as nn

from course_lib import hadamard as Hd
from course_lib import model as M
from course_lib import rotate as R
from course_lib import smollm

FP32_ABS = 1e-4          # bundled model, float32 (measured 2.0e-5)
FP32_REL = 5e-6          # of the largest |logit| (measured 1.1e-6)


@pytest.fixture(scope="module")
def bundled():
    return M.load_pretrained().requires_grad_(False)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (2, 128), generator=torch.Generator().manual_seed(0))


def _tiny(tied=False, intermediate=48, head_dim=None, bias=False, seed=0) -> M.LlamaModel:
    cfg = M.ModelConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=intermediate,
                        tie_word_embeddings=tied, head_dim=head_dim, attention_bias=bias,
                        mlp_bias=bias)
    m = M.LlamaModel(cfg).init_weights(seed).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))   # scales worth folding
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return m


def _logits64(model, ids) -> torch.Tensor:
    """The head's output before model.py's final .float() (float64 in a float64 model)."""
    out = {}
    h = model.lm_head.register_forward_hook(lambda mod, i, o: out.__setitem__("y", o.detach()))
    try:
        model(ids)
    finally:
        h.remove()
    return out["y"].double()


def _rmsnorm_in_own_dtype(self, x):
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _block_outputs(model, ids) -> list[torch.Tensor]:
    outs = []
    hs = [b.register_forward_hook(lambda mod, i, o: outs.append(o.detach().double()))
          for b in model.model.layers]
    try:
        model(ids)
    finally:
        for h in hs:
            h.remove()
    return outs


# ----------------------------------------------------------------------------- invariance
def test_every_step_keeps_the_bundled_models_logits_in_float32(bundled, ids):
    ref = bundled(ids).double()
    top = float(ref.abs().max())
    D = bundled.config.hidden_size
    steps = []
    m = R.fold_norms(bundled)
    steps.append(m)
    m = R.rotate_residual(m, Hd.random_hadamard(D, 0))
    steps.append(m)
    for step in (lambda x: R.rotate_values(x, 1), lambda x: R.online_down_proj(x, 2),
                 lambda x: R.online_qk(x, 3)):
        m = step(m)
        steps.append(m)
    for s in steps:
        d = float((s(ids).double() - ref).abs().max())
        assert d < FP32_ABS and d / top < FP32_REL, (s.rotation_steps, d)
    assert m.rotation_steps == ["fold_norms", f"R1 ({D} x {D})", "R2 (fused, 32, seed=1)",
                                "R4 (online, 640, seed=2)", "R3 (online, 32, seed=3)"]
    assert isinstance(m.model.layers[0].mlp, R.RotatedMLP)
    assert isinstance(m.model.layers[0].self_attn, R.HadamardQKAttention)


def test_float64_shows_the_differences_are_rounding(bundled, ids, monkeypatch):
    m64 = copy.deepcopy(bundled).double()
    ref = _logits64(m64, ids)
    d = float((_logits64(R.quarot(m64, 0), ids) - ref).abs().max())
    assert d < 2e-5                          # model.py's RMSNorm computes in float32
    monkeypatch.setattr(M.RMSNorm, "forward", _rmsnorm_in_own_dtype)
    ref = _logits64(m64, ids)
    d = float((_logits64(R.quarot(m64, 0), ids) - ref).abs().max())
    assert d < 1e-10 * float(ref.abs().max())


def test_every_layer_carries_the_residual_rotated(bundled, ids):
    D = bundled.config.hidden_size
    Q = Hd.random_hadamard(D, 0, torch.float64)
    rot = R.quarot(bundled, 0)
    for l, (h, hr) in enumerate(zip(_block_outputs(bundled, ids), _block_outputs(rot, ids))):
        assert (hr - h @ Q).abs().max() < 1e-5 * h.abs().max(), l


def test_the_originals_are_not_touched(bundled, ids):
    before = {k: v.clone() for k, v in bundled.state_dict().items()}
    R.quarot(bundled, 4)
    assert all(torch.equal(before[k], v) for k, v in bundled.state_dict().items())
    assert not hasattr(bundled, "rotation_steps")


def test_decoding_with_a_kv_cache_matches(bundled):
    prompt = torch.tensor([list(b"def main():\n    ")])
    rot = R.quarot(bundled, 0)
    assert torch.equal(M.generate(rot, prompt, 24), M.generate(bundled, prompt, 24))


def test_fold_norms_unties_a_tied_head_and_keeps_the_function():
    m = _tiny(tied=True)
    assert m.lm_head.weight is m.model.embed_tokens.weight
    ids = torch.randint(0, 256, (2, 16))
    f = R.fold_norms(m)
    assert f.lm_head.weight is not f.model.embed_tokens.weight
    assert f.config.tie_word_embeddings is False and m.config.tie_word_embeddings is True
    assert m.lm_head.weight is m.model.embed_tokens.weight            # the original stays tied
    assert all(bool((n.weight == 1).all()) for n in f.modules() if isinstance(n, M.RMSNorm))
    assert torch.allclose(f(ids), m(ids), atol=1e-5)
    g = m.model.norm.weight.detach()
    assert torch.allclose(f.lm_head.weight, m.model.embed_tokens.weight * g)
    assert torch.equal(f.model.embed_tokens.weight, m.model.embed_tokens.weight)


def test_a_tied_model_with_unit_norms_stays_tied_through_r1():
    m = M.LlamaModel(M.ModelConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=48,
                                   tie_word_embeddings=True)).init_weights(0).eval()
    ids = torch.randint(0, 256, (2, 16))
    r = R.rotate_residual(m, Hd.random_hadamard(48, 1))
    assert r.lm_head.weight is r.model.embed_tokens.weight            # E Q is both
    assert torch.allclose(r(ids), m(ids), atol=1e-5)


def test_biases_are_rotated_too():
    m = _tiny(bias=True)
    ids = torch.randint(0, 256, (2, 16))
    r = R.quarot(m, 2)
    assert torch.allclose(r(ids), m(ids), atol=1e-4)


# ----------------------------------------------------------------------------- the online modules
def test_online_hadamard_is_an_orthogonal_matrix_and_fuses():
    rot = R.OnlineHadamard(48, seed=3)
    Rm = rot.matrix()
    assert Hd.orthogonality_error(Rm) < 1e-13
    x = torch.randn(2, 5, 48, dtype=torch.float64)
    assert torch.allclose(rot(x), x @ Rm, atol=1e-12)
    assert torch.allclose(Rm, Hd.random_hadamard(48, 3, torch.float64).T)
    lin = nn.Linear(48, 7).double()
    want = lin(x)
    rot.fuse_into(lin)
    assert torch.allclose(lin(rot(x)), want, atol=1e-12)
    assert torch.equal(R.OnlineHadamard(48).signs, torch.ones(48))
    assert "signs" in dict(rot.named_buffers())                       # saved with the model
    with pytest.raises(ValueError, match="size 48; got a last dimension of 40"):
        rot(torch.randn(3, 40))


def test_down_proj_sees_the_rotated_input(bundled, ids):
    from course_lib.activations import capture_linear_inputs
    name = "model.layers.1.mlp.down_proj"
    before = capture_linear_inputs(bundled, ids, names=[name])[name]
    after = capture_linear_inputs(R.online_down_proj(bundled, 5), ids, names=[name])[name]
    assert torch.allclose(after, Hd.fwht(before) * Hd.random_signs(640, 5), atol=1e-5)


class _RecordingCache:
    """A cache with lesson 11's ``attend`` hook that records the keys it is handed."""

    def __init__(self):
        self.k = {}

    def length(self) -> int:
        return 0

    def attend(self, layer, q, k, v):
        self.k[layer] = k
        rep = q.shape[1] // k.shape[1]
        return torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)


def test_r3_hands_rotated_keys_to_a_quantized_cache(bundled, ids):
    plain, rotated = _RecordingCache(), _RecordingCache()
    out = bundled(ids, plain)
    rot = R.online_qk(bundled, 7)
    out_r = rot(ids, rotated)
    assert torch.allclose(out_r, out, atol=1e-4)
    s = Hd.random_signs(32, 7)
    assert torch.allclose(rotated.k[2], Hd.fwht(plain.k[2]) * s, atol=1e-5)


def test_r3_runs_with_lesson_11s_int8_cache(bundled, ids):
    from course_lib.kv import QuantizedKVCache
    rot = R.online_qk(bundled)
    a = bundled(ids, QuantizedKVCache(bundled, "int8"))
    b = rot(ids, QuantizedKVCache(rot, "int8"))
    assert torch.isfinite(b).all() and (a - b).abs().max() < 0.05 * a.abs().max()


def test_subclasses_carry_every_attribute_of_what_they_wrap(bundled):
    """If model.py's Attention or MLP gains an attribute, wrap() must copy it too."""
    att, mlp = bundled.model.layers[0].self_attn, bundled.model.layers[0].mlp
    watt = R.HadamardQKAttention.wrap(att, R.OnlineHadamard(32))
    wmlp = R.RotatedMLP.wrap(mlp, R.OnlineHadamard(640))
    for old, new, extra in ((att, watt, "qk_rotation"), (mlp, wmlp, "down_rotation")):
        plain = {k for k in vars(old) if not k.startswith("_")}
        assert plain <= set(vars(new)), plain - set(vars(new))
        assert set(old._modules) | {extra} == set(new._modules)
        assert all(getattr(new, k) == getattr(old, k) for k in plain if k != "training")


def test_quantizing_after_rotating_keeps_the_online_rotation(bundled, ids):
    from course_lib import qmodel
    rot = R.quarot(bundled, 0)
    q, _ = qmodel.quantize_model(rot, "int8", "per_channel", None)
    assert isinstance(q.model.layers[0].mlp, R.RotatedMLP)
    assert (q(ids) - bundled(ids)).abs().max() < 0.05 * bundled(ids).abs().max()


# ----------------------------------------------------------------------------- incoherence
def test_incoherence_bounds_and_shapes():
    assert torch.allclose(R.incoherence(torch.ones(3, 16)), torch.ones(3, dtype=torch.float64))
    spike = torch.zeros(2, 64)
    spike[:, 5] = -3.0
    assert torch.allclose(R.incoherence(spike), torch.full((2,), 8.0, dtype=torch.float64))
    t = torch.randn(4, 6, 10)
    assert R.incoherence(t, dim=1).shape == (4, 10)
    assert torch.allclose(R.incoherence(Hd.fwht(spike)), torch.ones(2, dtype=torch.float64))


@pytest.mark.parametrize("t, dim, kind, match", [
    (torch.zeros(2, 4), -1, ValueError, "all zero"),
    (torch.tensor([[1.0, float("nan")]]), -1, ValueError, "NaN"),
    (torch.ones(2, 4, dtype=torch.int64), -1, TypeError, "floating-point"),
    (torch.ones(2, 4), 2, ValueError, "dim must be"),
    (torch.ones(0, 4), -1, ValueError, "empty"),
])
def test_incoherence_bad_input(t, dim, kind, match):
    with pytest.raises(kind, match=match):
        R.incoherence(t, dim)


# ----------------------------------------------------------------------------- bad input
def test_rotate_residual_refuses_what_is_not_a_rotation(bundled):
    f = R.fold_norms(bundled)
    with pytest.raises(ValueError, match=r"\(256, 256\) for this model; got \(576, 576\)"):
        R.rotate_residual(f, Hd.random_hadamard(576))
    with pytest.raises(ValueError, match=r"not orthogonal: max \|Q Q\^T - I\|"):
        R.rotate_residual(f, torch.randn(256, 256))
    with pytest.raises(ValueError, match=r"divide it by sqrt\(256\) = 16"):
        R.rotate_residual(f, Hd.hadamard(256))
    with pytest.raises(ValueError, match="not orthogonal"):
        R.rotate_residual(f, Hd.random_hadamard(256, 0) * 1.001)
    Qnan = Hd.random_hadamard(256)
    Qnan[3, 4] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        R.rotate_residual(f, Qnan)
    with pytest.raises(TypeError, match="floating-point"):
        R.rotate_residual(f, torch.eye(256, dtype=torch.int64))
    with pytest.raises(ValueError, match="atol"):
        R.rotate_residual(f, Hd.random_hadamard(256), atol=0)


def test_a_bfloat16_hadamard_of_576_is_refused_as_a_rotation():
    with pytest.raises(ValueError, match="not orthogonal"):
        R._check_rotation(Hd.random_hadamard(576, 0, torch.bfloat16), 576, R.ORTHOGONALITY_ATOL)


def test_rotate_residual_needs_folded_norms_and_refuses_a_second_r1(bundled):
    with pytest.raises(ValueError, match=r"Run rotate.fold_norms\(model\) first"):
        R.rotate_residual(bundled, Hd.random_hadamard(256))
    r = R.rotate_residual(R.fold_norms(bundled), Hd.random_hadamard(256))
    with pytest.raises(ValueError, match="already has 'R1"):
        R.rotate_residual(r, Hd.random_hadamard(256, 1))


@pytest.mark.parametrize("step", [R.online_down_proj, R.online_qk, R.rotate_values])
def test_online_steps_refuse_a_second_application(step):
    m = step(_tiny())
    with pytest.raises(ValueError, match="already has"):
        step(m)


def test_sizes_with_no_hadamard_name_the_dimension():
    with pytest.raises(ValueError, match="intermediate_size = 28: no Hadamard matrix of order 28"):
        R.online_down_proj(_tiny(intermediate=28))
    with pytest.raises(ValueError, match="head_dim = 28"):
        R.online_qk(_tiny(head_dim=28))
    with pytest.raises(ValueError, match="head_dim = 28"):
        R.rotate_values(_tiny(head_dim=28))


def test_refuses_other_models_quantized_models_and_bad_seeds():
    from course_lib import qmodel
    with pytest.raises(TypeError, match="course LlamaModel"):
        R.fold_norms(nn.Linear(4, 4))
    q, _ = qmodel.quantize_model(_tiny(), "int8", "per_channel", None)
    with pytest.raises(TypeError, match="Rotate the float model first"):
        R.fold_norms(q)
    with pytest.raises(ValueError, match="seed"):
        R.online_down_proj(_tiny(), seed=1.5)
    with pytest.raises(TypeError, match="qk must be True or False"):
        R.quarot(_tiny(), qk=1)


def test_nan_in_the_model_is_reported_not_spread(bundled, ids):
    rot = R.online_down_proj(bundled)
    with torch.no_grad():
        rot.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        rot(ids)


# ----------------------------------------------------------------------------- SmolLM2
requires_smollm = pytest.mark.skipif(not smollm.available(),
                                     reason=f"SmolLM2 is not installed here: {smollm.INSTALL}")


@pytest.fixture(scope="module")
def smol_runs():
    """SmolLM2 and its QuaRot copy, run once on 256 clean calibration tokens: logits, block
    outputs, q_proj / down_proj inputs and the keys in the cache."""
    m = smollm.load()
    ids = smollm.calibration_ids(256, protocol="clean")[None]               # (1, 256)
    rot = R.quarot(m, 0)
    runs = {}
    for label, model in (("original", m), ("rotated", rot)):
        L = model.config.num_hidden_layers
        seen: dict[str, list] = {"q": [], "down": [], "blocks": []}
        hooks = []
        for b in model.model.layers:
            hooks.append(b.self_attn.q_proj.register_forward_pre_hook(
                lambda mod, i: seen["q"].append(i[0][0].detach())))
            hooks.append(b.mlp.down_proj.register_forward_pre_hook(
                lambda mod, i: seen["down"].append(i[0][0].detach())))
            hooks.append(b.register_forward_hook(
                lambda mod, i, o: seen["blocks"].append(o[0].detach().double())))
        cache = M.KVCache(L)
        try:
            with torch.no_grad():
                seen["logits"] = model(ids, cache)[0].double()
        finally:
            for h in hooks:
                h.remove()
        seen["keys"] = cache.k
        seen["weights"] = {k: [model.get_submodule(f"model.layers.{i}.{k}").weight.detach()
                               for i in range(L)] for k in ("self_attn.q_proj", "mlp.down_proj")}
        runs[label] = seen
    return runs


@requires_smollm
def test_smollm2_quarot_keeps_the_logits_and_every_layer(smol_runs):
    a, b = smol_runs["original"], smol_runs["rotated"]
    top = float(a["logits"].abs().max())
    d = float((b["logits"] - a["logits"]).abs().max())
    assert d < 5e-4 and d / top < 1e-5                       # measured 6.9e-5, 1.7e-6
    assert torch.equal(a["logits"].argmax(-1), b["logits"].argmax(-1))
    Q = Hd.random_hadamard(576, 0, torch.float64)
    assert len(a["blocks"]) == 30
    for l, (h, hr) in enumerate(zip(a["blocks"], b["blocks"])):
        assert (hr - h @ Q).abs().max() < 1e-5 * h.abs().max(), f"layer {l}"   # 5.1e-7 worst


@requires_smollm
def test_smollm2_incoherence_falls_to_the_gaussian_level(smol_runs):
    """Measured (30 layers x 256 tokens): q_proj inputs mean 15.9 -> 3.0 (max 23.2 -> 5.4);
    down_proj inputs mean 13.4 -> 3.4 (max 39.0 -> 5.2); keys per head 4.8 -> 2.5;
    weight rows, max over rows: q_proj 17.7 -> 5.1, down_proj 28.1 -> 5.8. A Gaussian vector
    of 576 entries sits near sqrt(2 ln 576) = 3.6."""
    a, b = smol_runs["original"], smol_runs["rotated"]

    def inc(ts):
        return torch.stack([R.incoherence(t) for t in ts])

    for kind in ("q", "down"):
        before, after = inc(a[kind]), inc(b[kind])
        assert before.mean() > 10 and after.mean() < 4 and after.max() < 7, kind
    keys_before, keys_after = inc(a["keys"]), inc(b["keys"])
    assert keys_after.mean() < 0.6 * keys_before.mean()
    for kind in ("self_attn.q_proj", "mlp.down_proj"):
        before, after = inc(a["weights"][kind]), inc(b["weights"][kind])
        assert before.max() > 15 and after.max() < 7, kind


@pytest.mark.parametrize("extra", [{"qk_norm": True}, {"sliding_window": 8}])
def test_online_qk_refuses_attention_it_would_change(extra):
    """HadamardQKAttention has no per-head q/k norms (Qwen3) and no window (Mistral): refused,
    never a model that silently drops them."""
    cfg = M.ModelConfig(hidden_size=48, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=48, **extra)
    m = M.LlamaModel(cfg).init_weights(0).eval()
    with pytest.raises(ValueError, match="qk=False"):
        R.online_qk(m)
    R.online_down_proj(m)                                  # the other rotations still apply
