"""Ship a QuaRot-rotated W4A16 model as a compressed-tensors checkpoint WITH its online rotation
(lesson 16; the checkpoint format of lessons 06-07).

A rotated model (:func:`course_lib.rotate.quarot`, then RTN / GPTQ W4 groups from
:mod:`course_lib.methods`) holds two kinds of rotation:

- fused ones, R1 (residual stream) and R2 (values, per head): they are part of the weights, so
  :func:`course_lib.export.export_compressed` writes them as it writes any weight;
- online ones, which the model runs on activations: R4 on down_proj's input, R3 on queries and
  keys after RoPE. down_proj's codes were chosen in R4's basis: a reader that skips R4, or runs
  a different Hadamard matrix, computes a different function.

:func:`export_rotated` writes R4 as a compressed-tensors ``transform_config`` and the course's
own matrix beside the weights, so that compressed-tensors' code re-creates THE SAME rotation;
:func:`load_rotated` reads such a folder back. What compressed-tensors 0.20.1 does (read from
its installed source; paths under ``compressed_tensors/``):

* Where the config lives: ``quantization_config["transform_config"]`` in config.json
  (``base.py:8`` names the key; ``ModelCompressor.update_config`` writes it there,
  ``compressors/model_compressors/model_compressor.py:219-252``). It is a ``TransformConfig``
  (``transform/transform_config.py``): named ``TransformScheme``s (``type``, ``apply``,
  ``randomize``, ``head_dim``, ``precision``: ``transform/transform_scheme.py:35-40``), each
  ``apply`` entry a ``TransformArgs`` (targets, location, inverse: ``transform/transform_args.py``).
* What re-creates the rotation: ``apply_transform_config(model, config)``
  (``transform/apply.py:14-30``). For location ``input`` it registers a submodule named
  ``{scheme}_{location}`` (``transform/factory/base.py:114``) and a forward pre-hook that
  rotates the Linear's input (``base.py:119-125``): y = x @ W / sqrt(n) (``HadamardTransform
  .forward``, ``transform/factory/hadamard.py:89-108``; ``transform/utils/matrix.py:99-100``).
* Stored or regenerated? Regenerated from the type: ``"hadamard"`` builds Sylvester's matrix and
  refuses any size that is not a power of two (``transform/utils/hadamard.py:21-50``, the
  refusal at 41-42), ``"random-hadamard"`` draws signs times ITS OWN Hadamard construction
  (``utils/hadamard.py:53-77``, ``transform/factory/random_hadamard.py:20-27``) from a generator
  that ``apply_transform_config`` never seeds (``factory/base.py:53-58``, ``apply.py:23``),
  i.e. torch's fixed default seed. For the FFN widths here (bundled 640 = 20 x 32, SmolLM2
  1536 = 12 x 128) that matrix is not the course's Kronecker product (:mod:`course_lib.hadamard`
  explains both constructions), so a regenerated R4 is the wrong rotation. The matrices ARE
  part of a saved checkpoint: each transform submodule's ``weight`` is a parameter that
  ``save_pretrained`` writes (``apply.py:26-27``, ``_register_tied_transform_weights``
  ``apply.py:33-70``), under ``<module>.<scheme>_<location>.weight``.
* So the exact round trip stores the course's matrix under that name, one per block (dtype of
  the checkpoint: the entries are +-1, exact in bf16), and :func:`load_rotated` loads it into
  the modules ``apply_transform_config`` made. vLLM does the same from the checkpoint for
  every type but ``"hadamard"`` (read at vllm-project/vllm commit 055e47c,
  ``vllm/model_executor/layers/quantization/compressed_tensors/transform/module.py``:
  ``HadamardTransform`` loads ``weight`` through a weight loader, divides it by sqrt(n) in
  ``process_weights_after_loading``, and applies it as a dense matmul; ``"hadamard"`` runs its
  own power-of-two kernel instead). The type written here is ``"hadamard"`` only where the
  course's matrix IS Sylvester's (a power-of-two width, no sign flips), else
  ``"random-hadamard"``.
* transformers 5.24.0 does not apply a transform config: its ``CompressedTensorsConfig``
  (``transformers/utils/quantization_config.py:1095-1171``) keeps no ``transform_config``
  (extra keys go to ``QuantizationConfig``, which ignores them: ``quantization/quant_config.py:
  370-371``), so ``ModelCompressor.from_compression_config`` gets None (``model_compressor.py:
  85-89``, called at ``transformers/quantizers/quantizer_compressed_tensors.py:65``). Loading
  with ``AutoModelForCausalLM.from_pretrained`` alone silently drops R4 (it reports the stored
  matrices as UNEXPECTED keys): use :func:`load_rotated`.

What compressed-tensors 0.20.1 can express, step by step:

* R1, R2 (fused): locations ``weight_input`` / ``weight_output`` (``transform_args.py:30-31,
  36-44``, fused at load by ``factory/base.py:127-157``). NOT written: the weights already
  hold them, and ``apply_transform_config`` would fuse them a second time.
* R4: location ``input`` on ``mlp.down_proj`` (above). Written, with the course's matrix.
* R3: locations ``q_attn`` and ``k_cache`` with ``head_dim`` (``transform_args.py:24-25,
  33-34``; hooked into attention by ``factory/base.py:168-187``). The format can say it, but
  the reading path cannot run it here: the key hook replaces the attention's
  ``past_key_values`` / ``past_key_value`` argument (``modeling/kvcache.py:119-128``) and
  transformers 5.24.0's ``LlamaAttention.forward`` takes ``cache`` instead
  (``transformers/models/llama/modeling_llama.py:238, 252``), so only the queries are rotated
  (measured on the bundled model: logits off by 9.8 of 17); vLLM applies transforms only to a
  Linear's input or output (``transform/linear.py`` at vllm commit 021d70c,
  ``get_linear_transform_schemes``). :func:`export_rotated` therefore refuses a model with R3:
  rotate it with ``quarot(..., qk=False)``.

Hook wanted in export.py (not there yet): ``export_compressed(..., extra_tensors=None,
extra_quantization_config=None)`` so these tensors and the config go in with the first write;
today the staged model.safetensors and config.json are rewritten once (:func:`_add_transform`).
"""
from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import torch
import torch.nn as nn

from course_lib import export
from course_lib.hadamard import hadamard
from course_lib.methods.calibration import GroupQuantLinear
from course_lib.rotate import HadamardQKAttention, OnlineHadamard, RotatedMLP

#: The scheme name in config.json; also the middle of the stored tensors' names.
R4_SCHEME = "R4"
#: compressed-tensors' location name for a rotation of a Linear's input (transform_args.py:29).
R4_LOCATION = "input"
#: Which modules the R4 scheme targets (compressed-tensors' "re:" prefix: a regular expression).
R4_TARGETS = [r"re:.*mlp\.down_proj$"]
#: The rotation_steps entries (first word) this exporter knows.
KNOWN_STEPS = ("fold_norms", "R1", "R2", "R3", "R4")


# ----------------------------------------------------------------------------- what to export
def _step_kinds(model) -> list[str]:
    """The first word of each entry of ``model.rotation_steps`` (rotate.py records them)."""
    steps = list(getattr(model, "rotation_steps", None) or [])
    if not all(isinstance(s, str) and s for s in steps):
        raise ValueError(f"model.rotation_steps must be a list of the names rotate.py records; "
                         f"got {steps!r}")
    return [s.split()[0] for s in steps]


def _r3_refusal(steps) -> str:
    return (f"this model has QuaRot's R3 (queries and keys rotated after RoPE; rotation_steps "
            f"{steps}), which cannot be exported: compressed-tensors 0.20.1 can write it as "
            f"'q_attn' + 'k_cache' transforms, but its key hook (compressed_tensors/modeling/"
            f"kvcache.py:119-128) looks for a 'past_key_values' argument that transformers "
            f"5.24.0's LlamaAttention renamed 'cache', so a reader would rotate the queries and "
            f"not the keys; vLLM applies no attention transforms at all. Rotate with "
            f"rotate.quarot(model, qk=False) (R1, R2 and R4 export exactly), then quantize")


def online_rotation(model: nn.Module) -> OnlineHadamard:
    """The R4 rotation a rotated, quantized course model runs on down_proj's input, checked
    to be one that a compressed-tensors checkpoint can carry (lesson 16).

    Refuses: a model with no rotation or none online (export.export_compressed writes those
    exactly), R3, steps rotate.py does not record, a structure that disagrees with
    ``rotation_steps``, blocks with different R4 matrices (one scheme holds one matrix per
    size: ``factory/hadamard.py:51``), and unquantized Linears.
    """
    from course_lib.model import LlamaModel
    if not isinstance(model, LlamaModel):
        raise TypeError(f"export_rotated takes a course LlamaModel rotated by course_lib.rotate "
                        f"and quantized by course_lib.methods; got {type(model).__name__}")
    kinds = _step_kinds(model)
    steps = list(getattr(model, "rotation_steps", []) or [])
    unknown = [s for s, k in zip(steps, kinds) if k not in KNOWN_STEPS]
    if unknown:
        raise ValueError(f"rotation step(s) {unknown} are not ones rotate.py records "
                         f"({', '.join(KNOWN_STEPS)}): export_rotated cannot tell how a reader "
                         f"should re-create them")
    blocks = list(model.model.layers)
    has_r3 = any(isinstance(b.self_attn, HadamardQKAttention) for b in blocks)
    if "R3" in kinds or has_r3:
        raise ValueError(_r3_refusal(steps))
    rotated_mlps = [isinstance(b.mlp, RotatedMLP) for b in blocks]
    if not any(k in ("R1", "R2", "R4") for k in kinds) and not any(rotated_mlps):
        raise ValueError(f"this model has no rotation (rotation_steps {steps}): write it with "
                         f"export.export_compressed(model, folder)")
    if "R4" not in kinds and not any(rotated_mlps):
        raise ValueError(f"this model's rotations are all fused into its weights (rotation_steps "
                         f"{steps}): nothing runs online, so export.export_compressed(model, "
                         f"folder) writes it exactly")
    if "R4" not in kinds or not all(rotated_mlps):
        raise ValueError(f"rotation_steps {steps} and the model disagree: "
                         f"{sum(rotated_mlps)} of {len(blocks)} blocks run an online down_proj "
                         f"rotation (RotatedMLP). Build it with rotate.online_down_proj (or "
                         f"rotate.quarot) on the whole model")
    _check_quantized(model)
    rotations = [b.mlp.down_rotation for b in blocks]
    first = rotations[0]
    if not isinstance(first, OnlineHadamard) or any(
            not isinstance(r, OnlineHadamard) or r.n != first.n
            or not torch.equal(r.signs.cpu(), first.signs.cpu()) for r in rotations):
        raise ValueError("the blocks' down_proj rotations are not one and the same "
                         "OnlineHadamard: a compressed-tensors scheme holds one matrix per size "
                         "(compressed_tensors/transform/factory/hadamard.py:51)")
    return first


def _check_quantized(model: nn.Module) -> None:
    blocks = model.model.layers
    plain = [f"model.layers.{i}.{n}" for i, b in enumerate(blocks)
             for n, m in b.named_modules() if type(m) is nn.Linear]
    if plain:
        raise ValueError(f"Linears {plain[:3]} are not quantized: quantize the rotated model "
                         f"(every block) with course_lib.methods, e.g. calibration.rtn_model("
                         f"model, 4, 32, scale_dtype=torch.bfloat16), then export")
    down = blocks[0].mlp.down_proj
    if not isinstance(down, GroupQuantLinear):
        raise ValueError(f"down_proj is a {type(down).__name__}, not a GroupQuantLinear from "
                         f"course_lib.methods: quantize with RTN or GPTQ before exporting")


# ----------------------------------------------------------------------------- the matrix
def transform_matrix(rotation: OnlineHadamard) -> torch.Tensor:
    """W with x @ W / sqrt(n) == rotation(x): the matrix compressed-tensors multiplies by
    (``factory/hadamard.py:100-107``), (n, n) float64, entries +-1 (lesson 16).

    rotation(x) = fwht(x) * s = x @ H^T diag(s) / sqrt(n) (:func:`course_lib.hadamard.fwht`),
    so W = H^T diag(s), built from the course's own H and checked against the module.
    """
    n = rotation.n
    W = hadamard(n, torch.float64).T * rotation.signs.double().cpu()[None, :]   # (n, n) H^T S
    err = float((W / math.sqrt(n) - rotation.matrix(torch.float64).cpu()).abs().max())
    if err > 1e-12:
        raise ValueError(f"the online rotation of size {n} is not hadamard({n})^T diag(signs) "
                         f"(max difference {err:.1e}): it was not built by rotate.OnlineHadamard")
    return W


def scheme_type(W: torch.Tensor) -> str:
    """"hadamard" when W is Sylvester's matrix, the one compressed-tensors' "hadamard" builds
    (``utils/hadamard.py:21-50``) and vLLM computes without reading it; else
    "random-hadamard", a matrix that vLLM reads from the checkpoint (lesson 16)."""
    n = W.shape[0]
    if n & (n - 1) == 0 and torch.equal(W, hadamard(n, torch.float64)):
        return "hadamard"
    return "random-hadamard"


def transform_config(W: torch.Tensor) -> dict:
    """The ``transform_config`` block for R4, validated by compressed-tensors' own
    ``TransformConfig`` (lesson 16)."""
    from compressed_tensors.transform import TransformArgs, TransformConfig, TransformScheme
    scheme = TransformScheme(type=scheme_type(W), precision=torch.float32, apply=[
        TransformArgs(targets=R4_TARGETS, location=R4_LOCATION)])
    return TransformConfig(config_groups={R4_SCHEME: scheme}).model_dump()


def transform_tensors(model: nn.Module, W: torch.Tensor, dtype: torch.dtype) -> dict:
    """{"model.layers.i.mlp.down_proj.R4_input.weight": W} for every block, in ``dtype``: the
    names ``apply_transform_config`` gives the matrices (``factory/base.py:114``) (lesson 16).

    One copy per block, so a reader that looks each block's name up finds it: for SmolLM2
    30 x 1536 x 1536 bf16 values, 142 MB beside the weights.
    """
    stored = W.to(dtype)
    if not torch.equal(stored.double(), W):
        raise ValueError(f"the +-1 rotation matrix is not exact in {dtype}")
    return {f"model.layers.{i}.mlp.down_proj.{R4_SCHEME}_{R4_LOCATION}.weight":
            stored.clone(memory_format=torch.contiguous_format)     # one tensor per name
            for i in range(len(model.model.layers))}


# ----------------------------------------------------------------------------- writing
def _weights_only(model: nn.Module) -> nn.Module:
    """A copy without the online rotation modules, SHARING every tensor with ``model`` (the
    copy's state dict is what export_compressed writes: no ``down_rotation.signs``)."""
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    m = copy.deepcopy(model, memo)
    for block in m.model.layers:
        del block.mlp.down_rotation                       # RotatedMLP -> its three Linears
    return m


def _add_transform(folder: Path, config: dict, tensors: dict) -> None:
    """Put the transform config into config.json's quantization_config and the matrices into
    model.safetensors (``folder``: a staging folder export_compressed just wrote)."""
    from safetensors.torch import load_file, save_file
    weights = load_file(str(folder / "model.safetensors"))
    clash = sorted(set(weights) & set(tensors))
    if clash:
        raise ValueError(f"the model already has tensors named {clash[:2]}")
    save_file({**weights, **tensors}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"]["transform_config"] = config
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def export_rotated(model: nn.Module, folder: str | os.PathLike,
                   dtype: torch.dtype = torch.bfloat16,
                   tokenizer_json: str | os.PathLike | None = None,
                   strict_scales: bool = True, overwrite: bool = False) -> Path:
    """Write a rotated (QuaRot R1 / R2 / R4), W4-quantized course model as a compressed-tensors
    pack-quantized checkpoint whose config.json carries R4 as a ``transform_config`` and whose
    model.safetensors holds the course's R4 matrix (lesson 16). Returns the folder.

    The weights (R1 and R2 fused in them) go through :func:`course_lib.export.export_compressed`
    with ``dtype``, ``tokenizer_json`` and ``strict_scales`` as there. Read it back with
    :func:`load_rotated`. Refused (see :func:`online_rotation`): no rotation or none online,
    R3, unquantized Linears, unknown steps. An existing checkpoint in ``folder`` is replaced
    only with ``overwrite=True``; a failed export leaves ``folder`` untouched.
    """
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a folder path (str or Path); got {type(folder).__name__}")
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be True or False; got {overwrite!r}")
    rotation = online_rotation(model)
    W = transform_matrix(rotation)                                       # (F, F) +-1
    folder = Path(folder)
    if folder.is_file():
        raise NotADirectoryError(f"{folder} is a file; export_rotated writes a checkpoint "
                                 f"*folder*: give a folder path")
    existing = sorted({p.name for pattern in export.CHECKPOINT_PATTERNS
                       for p in folder.glob(pattern) if p.is_file()}) if folder.is_dir() else []
    if existing and not overwrite:
        raise FileExistsError(f"{folder} already holds a checkpoint ({', '.join(existing[:3])}); "
                              f"pass overwrite=True to replace it (or choose another folder)")
    with export._staging_folder(folder) as tmp:
        export.export_compressed(_weights_only(model), tmp, dtype=dtype,
                                 tokenizer_json=tokenizer_json, strict_scales=strict_scales)
        _add_transform(tmp, transform_config(W), transform_tensors(model, W, dtype))
    return folder


# ----------------------------------------------------------------------------- reading
def load_rotated(folder: str | os.PathLike, dtype: torch.dtype = torch.float32,
                 dequantize: bool = False, apply_transforms: bool = True,
                 stored_matrices: bool = True):
    """Load an :func:`export_rotated` folder with transformers and let compressed-tensors
    re-create its online rotation (lesson 16). Returns the transformers model.

    1. ``AutoModelForCausalLM.from_pretrained``: the quantized weights (transformers 5.24.0
       ignores ``transform_config``; ``dequantize=True`` for asymmetric checkpoints, as with
       :mod:`course_lib.export`);
    2. compressed-tensors' ``apply_transform_config`` with the folder's transform config: the
       online hooks, with matrices compressed-tensors builds itself;
    3. the stored matrices loaded into those hooks' ``weight`` parameters, as vLLM's weight
       loader does: the course's exact R4.

    ``apply_transforms=False`` stops after 1 and ``stored_matrices=False`` after 2: both are
    wrong models, there to show what each step is for.
    """
    from transformers import AutoModelForCausalLM
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} holds no config.json: give the folder export_rotated "
                                f"wrote")
    qcfg = json.loads((folder / "config.json").read_text()).get("quantization_config") or {}
    if not qcfg.get("transform_config"):
        raise ValueError(f"{folder}/config.json has no quantization_config.transform_config: "
                         f"not a rotated export (load it with AutoModelForCausalLM."
                         f"from_pretrained)")
    kwargs = {}
    if dequantize:
        from transformers import CompressedTensorsConfig
        kwargs["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs).eval()
    if apply_transforms:
        from compressed_tensors.transform import TransformConfig, apply_transform_config
        apply_transform_config(model, TransformConfig.model_validate(qcfg["transform_config"]))
        if stored_matrices:
            _load_matrices(model, folder)
    return model


def _load_matrices(model: nn.Module, folder: Path) -> None:
    """Copy the checkpoint's transform matrices into the modules apply_transform_config made."""
    from compressed_tensors.transform.factory.base import TransformBase
    from safetensors import safe_open
    names = [f"{n}.weight" for n, m in model.named_modules() if isinstance(m, TransformBase)]
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        missing = sorted(set(names) - set(f.keys()))
        if missing:
            raise ValueError(f"{folder}/model.safetensors lacks the transform matrices "
                             f"{missing[:2]}: without them compressed-tensors would run its own "
                             f"Hadamard matrix, not the one the weights were quantized for")
        stored = {name: f.get_tensor(name) for name in names}
    with torch.no_grad():
        model.load_state_dict(stored, strict=False)
