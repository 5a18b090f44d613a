"""course_lib.export_rotated (lesson 16): a QuaRot-rotated W4A16 model as a compressed-tensors
checkpoint whose transform_config re-creates R4, read back by compressed-tensors' own code.

The reading path (documented in export_rotated.load_rotated): transformers 5.24.0's
``AutoModelForCausalLM.from_pretrained`` for the quantized weights (it ignores transform_config),
then compressed-tensors 0.20.1's ``apply_transform_config`` for the online hook, then the
checkpoint's stored matrices loaded into that hook (as vLLM's weight loader does).

Tolerance, measured on the bundled model (2 x 64 random bytes, largest |logit| 17.1), max
|course logits - loaded logits|: float32 checkpoint 1.5e-5 (the same codes, scales and float32
tensors on both sides: what is left is float32 summation order, transformers' Llama against
model.py and compressed-tensors' dense x @ W / sqrt(640) against the course's fwht, butterflies
plus a 20 x 20 matmul); asymmetric codes 1.4e-5; GPTQ's codes 1.1e-5; bf16 checkpoint 2.1e-5
against the course's model with its unquantized tensors (the R1-rotated embeddings and head)
rounded to bf16 as the file stores them (0.031 without that rounding); the bf16 scales
themselves are exact (quantized with scale_dtype=torch.bfloat16). ABS_TOL = 2e-4 leaves a 10x
margin for other CPUs' summation order.
"""
import json

import pytest
import torch

compressed_tensors = pytest.importorskip("compressed_tensors")

from course_lib import device, export  # noqa: E402
from course_lib import export_rotated as XR  # noqa: E402
from course_lib import hadamard as Hd  # noqa: E402
from course_lib import model as M  # noqa: E402
from course_lib import rotate as R  # noqa: E402
from course_lib.methods import calibration as cal  # noqa: E402

device.ensure_triton_mode()   # transformers may import triton: interpreter mode first on a CPU

ABS_TOL = 2e-4    # measured 1.4e-5 .. 2.1e-5 (float32 summation order, see above)
WRONG = 1.0       # a missing or different R4 moves logits by 19.8 .. 25.2 (measured)


@pytest.fixture(scope="module")
def bundled():
    return M.load_pretrained().requires_grad_(False)


@pytest.fixture(scope="module")
def rotated(bundled):
    """quarot without R3 (refused, see test_r3_is_refused_with_the_reason), then RTN W4 g32."""
    return cal.rtn_model(R.quarot(bundled, 0, qk=False), 4, 32, scale_dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def folder32(rotated, tmp_path_factory):
    return XR.export_rotated(rotated, tmp_path_factory.mktemp("r") / "ckpt", dtype=torch.float32)


def _logits(hf, ids):
    with torch.no_grad():
        return hf(ids).logits


def _course(model, ids):
    with torch.no_grad():
        return model(ids)


def test_the_folder_carries_r4_and_the_course_matrix(rotated, folder32):
    cfg = json.loads((folder32 / "config.json").read_text())["quantization_config"]
    assert cfg["format"] == "pack-quantized"
    scheme = cfg["transform_config"]["config_groups"]["R4"]
    assert scheme["type"] == "random-hadamard"              # 640 = 20 x 32 is not Sylvester
    assert scheme["apply"] == [{"targets": [r"re:.*mlp\.down_proj$"], "location": "input",
                                "inverse": False, "ignore": []}]
    from safetensors import safe_open
    with safe_open(str(folder32 / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        W = f.get_tensor("model.layers.3.mlp.down_proj.R4_input.weight")
    assert not [k for k in keys if "signs" in k]            # the course's buffers stay home
    assert {f"model.layers.{i}.mlp.down_proj.R4_input.weight" for i in range(4)} <= keys
    R4 = rotated.model.layers[0].mlp.down_rotation.matrix(torch.float64)         # (640, 640)
    assert W.shape == (640, 640) and bool((W.abs() == 1).all())
    assert (W.double() / 640 ** 0.5 - R4).abs().max() < 1e-15


def test_compressed_tensors_reproduces_the_course_model(rotated, folder32, ids):
    from compressed_tensors.transform.factory.base import TransformBase
    hf = XR.load_rotated(folder32)
    hooks = {n: m for n, m in hf.named_modules() if isinstance(m, TransformBase)}
    assert sorted(hooks) == [f"model.layers.{i}.mlp.down_proj.R4_input" for i in range(4)]
    R4 = rotated.model.layers[0].mlp.down_rotation.matrix(torch.float32)
    for m in hooks.values():        # the rotation compressed-tensors runs IS the course's
        assert torch.allclose(m(torch.eye(640)), R4, atol=1e-7)
    ours, theirs = _course(rotated, ids), _logits(hf, ids)
    assert (ours - theirs).abs().max() < ABS_TOL, float((ours - theirs).abs().max())


def test_each_reading_step_is_needed(rotated, folder32, ids):
    ours = _course(rotated, ids)
    # transformers alone: transform_config ignored, down_proj reads unrotated inputs
    plain = _logits(XR.load_rotated(folder32, apply_transforms=False), ids)
    assert (ours - plain).abs().max() > WRONG
    # compressed-tensors' own random-hadamard(640): a different matrix from the course's
    regen = XR.load_rotated(folder32, stored_matrices=False)
    hook = regen.model.layers[0].mlp.down_proj.R4_input
    R4 = rotated.model.layers[0].mlp.down_rotation.matrix(torch.float32)
    differ = (hook(torch.eye(640)) - R4).abs() > 1 / 640 ** 0.5    # entries +-1/sqrt(640)
    assert differ.float().mean() > 0.25, float(differ.float().mean())  # measured 0.50
    assert (ours - _logits(regen, ids)).abs().max() > WRONG


def test_a_bf16_checkpoint_matches_the_course_model_with_bf16_tensors(rotated, tmp_path, ids):
    folder = XR.export_rotated(rotated, tmp_path / "ckpt")               # dtype bf16
    from safetensors import safe_open
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("model.layers.0.mlp.down_proj.R4_input.weight").dtype == \
            torch.bfloat16
    import copy
    course = copy.deepcopy(rotated)
    for name, p in course.named_parameters():   # what the file stores in bf16 (codes, scales
        if not name.endswith(".weight") or "embed" in name or "lm_head" in name \
                or "norm" in name:               # and the GroupQuantLinear weights are exact)
            p.data = p.data.to(torch.bfloat16).float()
    ours, theirs = _course(course, ids), _logits(XR.load_rotated(folder), ids)
    assert (ours - theirs).abs().max() < ABS_TOL, float((ours - theirs).abs().max())


def test_asymmetric_codes_load_dequantized(bundled, tmp_path, ids):
    qm = cal.rtn_model(R.quarot(bundled, 0, qk=False, values=False), 4, 32, symmetric=False,
                       scale_dtype=torch.bfloat16)
    folder = XR.export_rotated(qm, tmp_path / "ckpt", dtype=torch.float32)
    ours, theirs = _course(qm, ids), _logits(XR.load_rotated(folder, dequantize=True), ids)
    assert (ours - theirs).abs().max() < ABS_TOL, float((ours - theirs).abs().max())


def test_gptq_codes_round_trip_too(bundled, tmp_path, ids):
    """GPTQ calibrates down_proj on the rotated inputs (RotatedMLP runs R4 before it)."""
    from course_lib.methods import gptq
    calib = cal.calibration_ids("bundled", 8, 128)
    qm, _ = gptq.gptq_model(R.quarot(bundled, 0, qk=False), calib, 4, 32,
                            scale_dtype=torch.bfloat16)
    folder = XR.export_rotated(qm, tmp_path / "ckpt", dtype=torch.float32)
    ours, theirs = _course(qm, ids), _logits(XR.load_rotated(folder), ids)
    assert (ours - theirs).abs().max() < ABS_TOL, float((ours - theirs).abs().max())  # 1.1e-5


def _tiny(intermediate: int) -> M.LlamaModel:
    cfg = M.ModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=intermediate)
    return M.LlamaModel(cfg).init_weights(0).eval().requires_grad_(False)


def test_a_power_of_two_width_is_sylvester_and_needs_no_stored_matrix(tmp_path, ids):
    """F = 64: the course's matrix is Sylvester's, compressed-tensors' "hadamard" rebuilds it."""
    qm = cal.rtn_model(R.quarot(_tiny(64), 0, qk=False), 4, 32, scale_dtype=torch.bfloat16)
    folder = XR.export_rotated(qm, tmp_path / "ckpt", dtype=torch.float32)
    cfg = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert cfg["transform_config"]["config_groups"]["R4"]["type"] == "hadamard"
    ours = _course(qm, ids)
    for stored in (True, False):
        theirs = _logits(XR.load_rotated(folder, stored_matrices=stored), ids)
        assert (ours - theirs).abs().max() < ABS_TOL, (stored, float((ours - theirs).abs().max()))
    signed = cal.rtn_model(R.online_down_proj(R.fold_norms(_tiny(64)), seed=3), 4, 32,
                           scale_dtype=torch.bfloat16)   # sign flips: stored, random-hadamard
    W = XR.transform_matrix(signed.model.layers[0].mlp.down_rotation)
    assert XR.scheme_type(W) == "random-hadamard" and not torch.equal(W, Hd.hadamard(64, W.dtype))


def test_r3_is_refused_with_the_reason(bundled, tmp_path):
    qm = cal.rtn_model(R.quarot(bundled, 0), 4, 32, scale_dtype=torch.bfloat16)   # R3 on
    with pytest.raises(ValueError, match=r"R3.*past_key_values.*'cache'.*qk=False"):
        XR.export_rotated(qm, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_compressed_tensors_still_skips_the_key_hook():
    """The reason R3 is refused, pinned: compressed-tensors 0.20.1's k_cache transform never runs
    under transformers 5.24.0 (its query transform does). When this fails, keys are rotated:
    R3 can be exported, and export_rotated's refusal should go."""
    from compressed_tensors.transform import (TransformArgs, TransformConfig, TransformScheme,
                                              apply_transform_config)
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1)).eval()
    attn = [r"re:.*self_attn$"]
    apply_transform_config(hf, TransformConfig(config_groups={"R3": TransformScheme(
        type="hadamard", head_dim=16, apply=[TransformArgs(targets=attn, location="q_attn"),
                                             TransformArgs(targets=attn, location="k_cache")])}))
    calls = {"q_attn": 0, "k_cache": 0}
    for loc in calls:
        getattr(hf.model.layers[0].self_attn, f"R3_{loc}").register_forward_hook(
            lambda m, i, o, loc=loc: calls.__setitem__(loc, calls[loc] + 1))
    with torch.no_grad():
        hf(torch.tensor([[1, 2, 3]]), use_cache=True)
        hf(torch.tensor([[1, 2, 3]]), use_cache=False)
    assert calls == {"q_attn": 2, "k_cache": 0}


def test_bad_models_are_refused(bundled, rotated, tmp_path):
    rtn = lambda m: cal.rtn_model(m, 4, 32, scale_dtype=torch.bfloat16)  # noqa: E731
    for model, error, message in [
            (torch.nn.Linear(2, 2), TypeError, "course LlamaModel"),
            (rtn(bundled), ValueError, "no rotation.*export_compressed"),
            (rtn(R.fold_norms(bundled)), ValueError, "no rotation.*export_compressed"),
            (rtn(R.quarot(bundled, 0, qk=False, down_proj=False)), ValueError,
             "all fused.*export_compressed"),
            (R.quarot(bundled, 0, qk=False), ValueError, "not quantized.*rtn_model")]:
        with pytest.raises(error, match=message):
            XR.export_rotated(model, tmp_path / "x")
    import copy
    odd = copy.deepcopy(rotated)
    odd.rotation_steps = odd.rotation_steps + ["S1 (learned)"]
    with pytest.raises(ValueError, match="not ones rotate.py records"):
        XR.export_rotated(odd, tmp_path / "x")
    odd.rotation_steps = [s for s in rotated.rotation_steps if not s.startswith("R4")]
    with pytest.raises(ValueError, match="disagree"):
        XR.export_rotated(odd, tmp_path / "x")
    odd = copy.deepcopy(rotated)
    odd.model.layers[1].mlp.down_rotation = R.OnlineHadamard(640, seed=1)
    with pytest.raises(ValueError, match="one and the same"):
        XR.export_rotated(odd, tmp_path / "x")
    half = cal.rtn_model(R.quarot(bundled, 0, qk=False), 4, 32, scale_dtype=torch.bfloat16,
                         n_blocks=2)
    with pytest.raises(ValueError, match="not quantized"):
        XR.export_rotated(half, tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


def test_folders_are_refused_or_left_untouched(rotated, bundled, tmp_path):
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(NotADirectoryError, match="checkpoint \\*folder\\*"):
        XR.export_rotated(rotated, afile)
    with pytest.raises(TypeError, match="folder must be a folder path"):
        XR.export_rotated(rotated, 5)
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text("old")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        XR.export_rotated(rotated, old)
    fp32 = cal.rtn_model(R.quarot(bundled, 0, qk=False), 4, 32)    # fp32 scales: refused
    with pytest.raises(ValueError, match="scale_dtype"):
        XR.export_rotated(fp32, old, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "old"]
    assert [p.name for p in old.iterdir()] == ["config.json"]
    assert (old / "config.json").read_text() == "old"
    XR.export_rotated(rotated, old, overwrite=True)
    assert "transform_config" in json.loads((old / "config.json").read_text())[
        "quantization_config"]


def test_load_rotated_refuses_folders_without_the_rotation(rotated, folder32, tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        XR.load_rotated(tmp_path)
    plain = export.export_compressed(cal.rtn_model(M.load_pretrained(), 4, 32,
                                                   scale_dtype=torch.bfloat16), tmp_path / "p")
    with pytest.raises(ValueError, match="no quantization_config.transform_config"):
        XR.load_rotated(plain)
    from safetensors.torch import load_file, save_file
    import shutil
    broken = tmp_path / "broken"
    shutil.copytree(folder32, broken)
    sd = {k: v for k, v in load_file(str(broken / "model.safetensors")).items()
          if "R4_input" not in k}
    save_file(sd, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="lacks the transform matrices"):
        XR.load_rotated(broken)
