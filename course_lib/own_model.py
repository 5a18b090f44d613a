"""Your own model: a Hugging Face checkpoint folder from your disk, checked, priced and loaded
lazily into the course's decoder (lesson 17, the capstone, builds on it).

A checkpoint folder holds ``config.json``, the weights as one ``model.safetensors`` or as shards
listed in ``model.safetensors.index.json``, and usually a ``tokenizer.json``. Two other sources
are read the same way: a **GGUF file** (llama.cpp's format; pass the ``.gguf`` file itself) of
the ``llama``, ``qwen2`` or ``qwen3`` architecture, its tensors decoded one at a time through
the course's decoders (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), and the
course's converted SmolLM2 folder (``models/smollm2-135m-instruct``: block codes, decoded as
``smollm.load()`` decodes them). A quantized GGUF's weights already sit on its grid: quantizing
them again measures how well a method recovers that grid, not the original model (lesson 13's
double-quantization trap); a warning says so once per file. The architectures
read here compute what :class:`course_lib.model.LlamaModel` computes, with at most these
additions (the fields of :class:`~course_lib.model.ModelConfig` named in brackets):

==========================  ==========================================================
``LlamaForCausalLM``        Llama 2, Llama 3.x (``llama3`` RoPE scaling: ``rope_scaling``),
                            SmolLM / SmolLM2, TinyLlama (an untied head)
``MistralForCausalLM``      a sliding attention window when the config sets one
                            (``sliding_window``: Mistral-7B-v0.1's 4096)
``Qwen2ForCausalLM``        biases on q, k and v, none on o (``qkv_bias``): Qwen2, Qwen2.5
``Qwen3ForCausalLM``        an RMSNorm over each head of q and k before RoPE (``qk_norm``)
==========================  ==========================================================

Everything else is refused with the reason and the list above: Gemma (embeddings scaled by
sqrt(hidden), norms that multiply by 1 + weight, logit soft-capping), Phi-3 (q, k, v fused in
one ``qkv_proj``), mixtures of experts, other RoPE scalings (YaRN, linear, dynamic), a sliding
window on only some layers, checkpoints already quantized.

The pieces, in the order a learner uses them:

- :func:`bill`: from ``config.json`` alone, the parameters, the bytes in each storage format
  (lesson 00's sum, parameters x bits per weight / 8, with the scales of lesson 03 and
  llama.cpp's Q4_K_M mix of lesson 14) and the memory a method needs, whole model or one layer
  at a time, against this machine's free memory; a method that does not fit is refused with the
  figures and what to change.
- :func:`open_checkpoint`: every check that needs no weight read (config, index, shards, tensor
  names, shapes and dtypes from the safetensors headers, the tokenizer's vocabulary).
- :func:`load`: the whole model; :func:`layer_state` / :func:`load_layer`: one decoder layer,
  reading only its tensors (``safetensors.safe_open``), so quantization can stream layer by layer.
"""
from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from course_lib import hardware, kmix, kquants, quant
from course_lib.model import Block, LlamaModel, ModelConfig, model_from_state_dict

#: Architectures read here (config.json's ``architectures``) and the ``model_type`` each has.
SUPPORTED = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
             "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
#: Checkpoints learners have that use them (for messages).
EXAMPLES = ("Llama 2 and 3.x, SmolLM/SmolLM2, TinyLlama (LlamaForCausalLM); Mistral-7B "
            "(MistralForCausalLM); Qwen2/Qwen2.5 (Qwen2ForCausalLM); Qwen3 dense "
            "(Qwen3ForCausalLM)")

#: Why a model_type that learners meet is refused (what the course's decoder does not compute).
UNSUPPORTED_WHY = {
    "gemma": "Gemma scales the embeddings by sqrt(hidden_size), its RMSNorm multiplies by "
             "(1 + weight) and its MLP uses GELU",
    "gemma2": "Gemma 2 adds logit soft-capping, extra norms after attention and MLP and a "
              "sliding window on every other layer to Gemma's differences",
    "gemma3": "Gemma 3 has Gemma's norms and scaled embeddings, q/k norms and local/global "
              "attention layers",
    "gemma3_text": "Gemma 3 has Gemma's norms and scaled embeddings, q/k norms and local/global "
                   "attention layers",
    "phi3": "Phi-3 stores q, k and v fused in one qkv_proj and gate/up fused in gate_up_proj",
    "phi": "Phi-1/2 use LayerNorm, a parallel attention/MLP block and GELU",
    "mixtral": "Mixtral is a mixture of experts (a router picks 2 of 8 MLPs per token)",
    "qwen2_moe": "Qwen2-MoE is a mixture of experts",
    "qwen3_moe": "Qwen3-MoE is a mixture of experts",
    "deepseek_v2": "DeepSeek-V2 is a mixture of experts with latent attention (MLA)",
    "deepseek_v3": "DeepSeek-V3 is a mixture of experts with latent attention (MLA)",
    "llama4": "Llama 4 is a mixture of experts with chunked attention",
    "gpt_oss": "gpt-oss is a mixture of experts with attention sinks",
    "olmoe": "OLMoE is a mixture of experts",
    "gpt2": "GPT-2 uses LayerNorm, learned positions, GELU and fused qkv (Conv1D)",
}
#: config.json keys that mark a mixture of experts, whatever its model_type.
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")

#: The Hugging Face classes' defaults (transformers 5.x, models/<type>/configuration_<type>.py)
#: for keys a config.json may leave out.
HF_DEFAULTS = {
    "llama": {"rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "tie_word_embeddings": False},
    "mistral": {"rms_norm_eps": 1e-6, "max_position_embeddings": 4096 * 32,
                "tie_word_embeddings": False, "sliding_window": 4096},
    "qwen2": {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": False},
    "qwen3": {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": False,
              "head_dim": 128},
}
REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads")
INDEX_NAME = "model.safetensors.index.json"
#: Stored dtypes a full-precision checkpoint uses; anything else (I32, U8, F8...) is packed codes.
FLOAT_DTYPES = ("F32", "F16", "BF16")


def _supported_list() -> str:
    return f"supported: {', '.join(SUPPORTED)} ({EXAMPLES})"


# ----------------------------------------------------------------------------- config
def _config_path(source) -> Path:
    """config.json of a folder (or the path of a config.json itself), with clear errors."""
    if not isinstance(source, (str, Path)):
        raise TypeError(f"pass the checkpoint folder (a str or Path); got {type(source).__name__}")
    p = Path(source).expanduser()
    if p.is_file():
        if p.name == "config.json":
            return p
        raise NotADirectoryError(f"{str(p)!r} is a file; pass the checkpoint *folder* that holds "
                                 f"config.json and the *.safetensors weights (here: "
                                 f"{str(p.parent)!r})")
    if not p.is_dir():
        raise FileNotFoundError(f"checkpoint folder {str(p)!r} does not exist. Expected a folder "
                                f"with config.json and *.safetensors (the Hugging Face layout, "
                                f"as `hf download <repo> --local-dir <folder>` writes it)")
    path = p / "config.json"
    if not path.exists():
        found = sorted(q.name for q in p.iterdir())[:8]
        hint = ""
        ggufs = [n for n in found if n.endswith(".gguf")]
        if ggufs:
            hint = (f" It holds a GGUF file: pass the file itself, e.g. "
                    f"{str(p / ggufs[0])!r}")
        raise FileNotFoundError(f"{path} is missing: a checkpoint folder needs config.json next "
                                f"to its *.safetensors files (the folder holds {found}).{hint}")
    return path


def _is_gguf(source) -> bool:
    """True when ``source`` names a .gguf file (which must then exist)."""
    if not isinstance(source, (str, Path)):
        return False
    p = Path(source).expanduser()
    if p.suffix.lower() != ".gguf":
        return False
    if not p.is_file():
        raise FileNotFoundError(f"GGUF file {str(p)!r} does not exist" +
                                (" (it is a folder: pass the .gguf file inside it)"
                                 if p.is_dir() else ""))
    return True


def _gguf_reader(path):
    """The opened GGUF file and its architecture, refused unless llama, qwen2 or qwen3."""
    from course_lib import gguf_model as gm
    reader = gm.open_gguf(Path(path).expanduser())
    return reader, gm.gguf_architecture(reader)


def gguf_config(path) -> ModelConfig:
    """The :class:`ModelConfig` of a GGUF file (``gguf_model.config_from_gguf``), its
    architecture checked."""
    from course_lib import gguf_model as gm
    reader, _ = _gguf_reader(path)
    return gm.config_from_gguf(reader)


def read_raw_config(source) -> dict:
    """``config.json`` as a dict: ``source`` is the checkpoint folder, a config.json path or a
    dict already read; for a ``.gguf`` file, the config.json its metadata describes
    (``ModelConfig.to_hf_dict``)."""
    if isinstance(source, dict):
        return dict(source)
    if _is_gguf(source):
        return gguf_config(source).to_hf_dict()
    path = _config_path(source)
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); re-download the checkpoint") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} holds a JSON {type(raw).__name__}, not an object of settings")
    return raw


def architecture(raw: dict) -> str:
    """The supported architecture ``raw`` (a config.json dict) names, or a ValueError saying why
    it is refused and what is supported."""
    mtype = raw.get("model_type")
    archs = raw.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if raw.get("quantization_config"):
        qc = raw["quantization_config"]
        how = qc.get("quant_method", "?") if isinstance(qc, dict) else "?"
        raise ValueError(f"this checkpoint is already quantized (quantization_config: "
                         f"quant_method {how!r}); start from the unquantized BF16/FP16 release of "
                         f"the model, which is what the course's methods quantize")
    moe = [k for k in MOE_KEYS if raw.get(k)]
    if mtype in UNSUPPORTED_WHY or moe:
        why = UNSUPPORTED_WHY.get(mtype) or f"a mixture of experts ({moe[0]} = {raw[moe[0]]})"
        raise ValueError(f"unsupported architecture {archs or [mtype]}: {why}, which the "
                         f"course's decoder does not compute. {_supported_list()}")
    hits = [a for a in archs if a in SUPPORTED]
    if not hits:
        if not archs and mtype in SUPPORTED.values():   # a config without `architectures`
            return next(a for a, t in SUPPORTED.items() if t == mtype)
        raise ValueError(f"unsupported architecture {archs or [mtype]} (model_type {mtype!r}); "
                         f"{_supported_list()}")
    arch = hits[0]
    if mtype is not None and mtype != SUPPORTED[arch]:
        raise ValueError(f"config.json names architecture {arch} but model_type {mtype!r} (a "
                         f"{arch} has model_type {SUPPORTED[arch]!r}); the file is inconsistent")
    return arch


def _rope(raw: dict) -> tuple[float, dict | None]:
    """rope_theta and the scaling dict (None when unscaled), from either spelling (transformers
    4.x: rope_theta + rope_scaling; 5.x: rope_parameters), refusing scalings not computed here."""
    rp = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or (rp if rp else None)
    theta = rp.get("rope_theta", raw.get("rope_theta", 10000.0))
    if raw.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"partial_rotary_factor {raw['partial_rotary_factor']} (RoPE on part of "
                         f"each head) is not supported; {_supported_list()}")
    if scaling is None:
        return theta, None
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be a dict or null; got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise ValueError(f"RoPE scaling {kind!r} is not supported (supported: none, or Llama 3.x's "
                         f"'llama3'); YaRN, linear, dynamic and longrope change the positions "
                         f"in ways the course's decoder does not compute")
    need = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in need if k not in scaling]
    if missing:
        raise ValueError(f"the 'llama3' RoPE scaling needs {list(need)}; config.json lacks "
                         f"{missing}")
    return theta, {"rope_type": "llama3", **{k: scaling[k] for k in need}}


def own_config(source) -> ModelConfig:
    """The :class:`ModelConfig` of a supported checkpoint (folder, config.json path or dict),
    with the architecture's own settings (q/k/v biases, q/k norms, sliding window) and
    transformers' defaults for keys the file leaves out. Refusals say why and what is supported.
    A ``.gguf`` file: the config its metadata describes (``gguf_model.config_from_gguf``)."""
    if _is_gguf(source):
        return gguf_config(source)
    raw = read_raw_config(source)
    arch = architecture(raw)
    mtype = SUPPORTED[arch]
    missing = [k for k in REQUIRED_KEYS if raw.get(k) is None]
    if missing:
        raise ValueError(f"config.json lacks {missing}: the model's shapes cannot be known "
                         f"without them; re-download config.json")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported: the course's MLP is SwiGLU "
                         f"(silu); {_supported_list()}")
    d = {**HF_DEFAULTS[mtype], **{k: v for k, v in raw.items() if v is not None}}
    if raw.get("num_key_value_heads") is None:        # HF: None means one KV head per query head
        d["num_key_value_heads"] = raw["num_attention_heads"]
    d.pop("rope_parameters", None)
    d["rope_theta"], d["rope_scaling"] = _rope(raw)
    window = None
    if mtype == "mistral":
        window = d.get("sliding_window")              # None in the file: full attention
        if "sliding_window" in raw and raw["sliding_window"] is None:
            window = None
    elif mtype in ("qwen2", "qwen3") and raw.get("use_sliding_window") \
            and raw.get("sliding_window") is not None:
        # transformers' rule (configuration_qwen2.py): without layer_types, the layers from
        # max_window_layers on attend through the window
        n, first = d["num_hidden_layers"], raw.get("max_window_layers", 28)
        kinds = raw.get("layer_types") or ["sliding_attention" if i >= first else "full_attention"
                                           for i in range(n)]
        if all(k == "sliding_attention" for k in kinds):
            window = raw["sliding_window"]
        elif any(k == "sliding_attention" for k in kinds):
            raise ValueError(f"use_sliding_window is true: {kinds.count('sliding_attention')} of "
                             f"the {len(kinds)} layers of this {arch} attend through a sliding "
                             f"window and the others do not, which the course's decoder does not "
                             f"compute (released Qwen2.5 and Qwen3 checkpoints set it false)")
    d["sliding_window"] = window
    d.pop("use_sliding_window", None)
    if mtype == "qwen2":
        d.update(qkv_bias=True, attention_bias=False, mlp_bias=False)
    elif mtype == "qwen3":
        d.update(qk_norm=True, mlp_bias=False)
    elif mtype == "mistral":
        d.update(attention_bias=False, mlp_bias=False)
    try:
        return ModelConfig.from_dict(d)
    except (TypeError, ValueError) as e:
        raise ValueError(f"config.json does not describe a model the course can build: {e}") \
            from None


# ----------------------------------------------------------------------------- the checkpoint
@dataclass
class Checkpoint:
    """What :func:`open_checkpoint` found: every check passed, no weight read yet.

    ``weight_map``: tensor name -> file name in ``folder`` (from the index, or the headers);
    for a GGUF file, tensor name -> the file's tensor name (``blk.0.attn_q.weight`` ...).
    ``shapes`` / ``dtypes``: from the safetensors headers (a GGUF's tensor types: "Q4_K" ...;
    the converted SmolLM2 folder's block kinds: "Q4_1", "Q8_0"). ``tokenizer``: the
    tokenizer.json path (the .gguf file itself when its metadata holds the tokenizer), or None
    (then ``notes`` says so). ``vocab_in_tokenizer``: its largest id + 1. ``format``:
    "safetensors", "gguf" or "course-blocks" (the converted SmolLM2 folder); ``path``: the
    .gguf file; ``gguf_architecture``: its ``general.architecture``.
    """
    folder: Path
    architecture: str
    config: ModelConfig
    weight_map: dict[str, str]
    shapes: dict[str, tuple]
    dtypes: dict[str, str]
    tokenizer: Path | None = None
    vocab_in_tokenizer: int | None = None
    notes: list[str] = field(default_factory=list)
    format: str = "safetensors"
    path: Path | None = None
    gguf_architecture: str | None = None
    nbytes: dict[str, int] | None = None
    _reader: object = field(default=None, repr=False, compare=False)

    @property
    def files(self) -> list[str]:
        """The weight files in ``folder`` (a GGUF source: the .gguf file's name)."""
        if self.format == "gguf":
            return [self.path.name]
        return sorted(set(self.weight_map.values()))

    def layer_names(self, i: int) -> list[str]:
        """The checkpoint's tensor names of decoder layer ``i``."""
        n = self.config.num_hidden_layers
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise ValueError(f"layer must be a whole number in 0..{n - 1} (the model has {n} "
                             f"decoder layers); got {i!r}")
        prefix = f"model.layers.{i}."
        return sorted(k for k in self.weight_map if k.startswith(prefix))

    def stored_bytes(self) -> int:
        """Bytes of the tensors the model uses, as stored (BF16 checkpoint: 2 per parameter;
        a GGUF file: its tensors' bytes, blocks and scales included)."""
        if self.nbytes is not None:
            return sum(self.nbytes.values())
        size = {"F32": 4, "F16": 2, "BF16": 2}
        return sum(math.prod(s) * size[self.dtypes[k]] for k, s in self.shapes.items())

    @property
    def quantized(self) -> list[str]:
        """The tensor types of this checkpoint's weights that are already quantized (a GGUF's
        "Q4_K" ..., the converted SmolLM2's "Q4_1", "Q8_0"); empty for float weights."""
        return sorted({d for d in self.dtypes.values() if d not in FLOAT_DTYPES})


def _expected(cfg: ModelConfig) -> dict[str, tuple]:
    """Every tensor name the course's model needs for ``cfg`` and its shape (the head left out
    when tied). Built on the meta device: no memory."""
    with torch.device("meta"):
        m = LlamaModel(cfg)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    if cfg.tie_word_embeddings:
        shapes.pop("lm_head.weight")
    return shapes


def _header(path: Path) -> dict[str, tuple[tuple, str]]:
    """{name: (shape, dtype)} from one safetensors file's header; no tensor data is read."""
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(str(path), framework="pt") as f:
            out = {}
            for k in f.keys():
                sl = f.get_slice(k)
                out[k] = (tuple(sl.get_shape()), sl.get_dtype())
            return out
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{path} is not a readable safetensors file ({e}); it may be truncated "
                         f"or corrupt: re-download it") from None


def _weight_files(folder: Path) -> tuple[dict[str, str] | None, list[str]]:
    """(the index's weight_map or None, the files to read), with clear errors for missing
    weights, a broken index and missing shards."""
    index = folder / INDEX_NAME
    if index.exists():
        try:
            wm = json.loads(index.read_text()).get("weight_map")
        except (json.JSONDecodeError, AttributeError) as e:
            raise ValueError(f"{index} is not a valid index ({e}); re-download it") from None
        if not isinstance(wm, dict) or not wm:
            raise ValueError(f"{index} has no 'weight_map' (tensor name -> shard file); "
                             f"re-download it")
        files = sorted(set(wm.values()))
        absent = [f for f in files if not (folder / f).is_file()]
        if absent:
            raise FileNotFoundError(f"{len(absent)} of the {len(files)} shards listed in "
                                    f"{INDEX_NAME} are missing from {str(folder)!r}: {absent[:4]}"
                                    f"{'...' if len(absent) > 4 else ''}; the download is "
                                    f"incomplete: fetch them again")
        return wm, files
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    if any(f.startswith("consolidated") for f in files) and \
            any(not f.startswith("consolidated") for f in files):
        # Mistral's repositories ship its own format (consolidated.safetensors) beside HF's
        files = [f for f in files if not f.startswith("consolidated")]
    if not files:
        others = sorted(p.name for p in folder.iterdir()
                        if p.suffix in (".bin", ".pt", ".pth", ".gguf", ".ckpt"))
        hint = (f" It holds {others[:3]}: this loader reads safetensors only; transformers can "
                f"re-save a .bin checkpoint with save_pretrained(..., safe_serialization=True)"
                if others else "")
        raise FileNotFoundError(f"no *.safetensors weights in {str(folder)!r}.{hint}")
    shards = [re.fullmatch(r".*-(\d+)-of-(\d+)\.safetensors", f) for f in files]
    if any(shards):
        total = max(int(m.group(2)) for m in shards if m)
        have = {int(m.group(1)) for m in shards if m}
        lost = sorted(set(range(1, total + 1)) - have)
        raise FileNotFoundError(f"{str(folder)!r} holds sharded weights (of {total} files) but no "
                                f"{INDEX_NAME}" + (f", and shards {lost} are missing" if lost
                                                   else "") + "; download the index (and every "
                                f"shard) with the checkpoint")
    return None, files


def _vocab_of(tokenizer_json: Path) -> int:
    """Largest token id + 1 of a tokenizer.json (added tokens included)."""
    from tokenizers import Tokenizer
    try:
        tok = Tokenizer.from_file(str(tokenizer_json))
    except Exception as e:  # the tokenizers package raises its own Exception type
        raise ValueError(f"{tokenizer_json} is not a tokenizer the tokenizers package reads "
                         f"({e}); re-download it") from None
    ids = tok.get_vocab(with_added_tokens=True).values()
    return max(ids) + 1 if ids else 0


def open_checkpoint(folder) -> Checkpoint:
    """Check a checkpoint folder without reading a weight: config.json (a supported
    architecture), the index and its shards, every tensor's name, shape and dtype (from the
    safetensors headers) against the config, and the tokenizer's vocabulary against the
    embedding. Each problem raises with what is wrong and what to do.

    ``folder`` may also be a ``.gguf`` file (:func:`_open_gguf`) or the course's converted
    SmolLM2 folder (block codes in ``weights.safetensors``, :func:`_open_course_blocks`)."""
    if _is_gguf(folder):
        return _open_gguf(Path(folder).expanduser())
    cfg_path = _config_path(folder)
    if cfg_path.name == "config.json" and Path(folder).is_file():
        raise NotADirectoryError(f"pass the checkpoint folder, not its config.json: "
                                 f"{str(cfg_path.parent)!r}")
    folder = cfg_path.parent
    raw = read_raw_config(folder)
    arch = architecture(raw)
    cfg = own_config(raw)
    if _course_blocks_file(folder) is not None:
        return _open_course_blocks(folder, arch, cfg)
    index_map, files = _weight_files(folder)
    found: dict[str, tuple[tuple, str]] = {}
    where: dict[str, str] = {}
    for f in files:
        for k, v in _header(folder / f).items():
            found[k], where[k] = v, f
    notes = []
    if index_map is not None:
        lost = sorted(k for k, f in index_map.items() if where.get(k) != f)
        if lost:
            raise ValueError(f"{INDEX_NAME} lists {len(lost)} tensors that are not in the shard "
                             f"it names, for example {lost[0]!r} in {index_map[lost[0]]!r}; a "
                             f"shard is truncated or from another download: fetch it again")
    expected = _expected(cfg)
    have = set(found)
    if cfg.tie_word_embeddings and "lm_head.weight" in have:
        notes.append("lm_head.weight is stored although the head is tied to the embeddings "
                     "(tie_word_embeddings true): the embedding is used, as transformers does")
    ignorable = {k for k in have if k.endswith("rotary_emb.inv_freq")} | \
        ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
    missing = sorted(set(expected) - have)
    extra = sorted(have - set(expected) - ignorable)
    if missing or extra:
        hint = ""
        if any(k.startswith("layers.") and ".attention.wq." in k for k in extra):
            hint = (" These are Mistral's own names (consolidated.safetensors), not the Hugging "
                    "Face layout: use the model-*.safetensors files and their index")
        elif missing and any(("model." + k) in expected for k in extra):
            hint = (" The names lack the 'model.' prefix: this is a base model's file "
                    "(LlamaModel), not a ...ForCausalLM checkpoint")
        elif missing == ["lm_head.weight"]:
            hint = (" The head is missing while config.json says tie_word_embeddings is false: "
                    "a tied model must say true")
        raise ValueError(f"the weights in {str(folder)!r} do not match {arch}'s config: "
                         f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected "
                         f"{extra[:5]}{'...' if len(extra) > 5 else ''}.{hint}")
    for k, shape in expected.items():
        got, dt = found[k]
        if got != shape:
            raise ValueError(f"tensor {k} has shape {got} in {where[k]} but config.json implies "
                             f"{shape}; the config and the weights come from different models")
        if dt not in FLOAT_DTYPES:
            raise ValueError(f"tensor {k} is stored as {dt} in {where[k]}: the codes of a "
                             f"quantized checkpoint (packed integers or FP8), not {'/'.join(FLOAT_DTYPES)} weights; "
                             f"start from the unquantized release")
    ck = Checkpoint(folder, arch, cfg, {k: where[k] for k in expected},
                    {k: found[k][0] for k in expected}, {k: found[k][1] for k in expected},
                    notes=notes)
    return _with_tokenizer(ck)


def _with_tokenizer(ck: Checkpoint) -> Checkpoint:
    """The folder's tokenizer.json, checked against the embedding's rows."""
    cfg = ck.config
    tj = ck.folder / "tokenizer.json"
    if tj.exists():
        n = _vocab_of(tj)
        if n > cfg.vocab_size:
            raise ValueError(f"tokenizer.json has ids up to {n - 1} but the embedding has "
                             f"{cfg.vocab_size} rows (vocab_size): the tokenizer belongs to "
                             f"another model; use the tokenizer.json released with these weights")
        ck.tokenizer, ck.vocab_in_tokenizer = tj, n
        if n < cfg.vocab_size:
            ck.notes.append(f"the embedding has {cfg.vocab_size - n} rows no token uses (vocab "
                            f"{cfg.vocab_size}, tokenizer {n}): padding, as many releases do")
    else:
        ck.notes.append("no tokenizer.json: loading works, but evaluating on text needs it "
                        "(download it with the checkpoint)")
    return ck


# ----------------------------------------------------------------------------- other sources
#: Block kinds of the converted SmolLM2 folder (smollm.convert): ``<name>.<kind>.codes`` ...
COURSE_BLOCK_KINDS = ("q4_0", "q4_1", "q8_0")
_WARNED: set = set()


def _course_blocks_file(folder: Path) -> Path | None:
    """weights.safetensors of a course-converted folder (its tensors are block codes,
    ``<name>.q4_1.codes`` ...), or None for an ordinary checkpoint."""
    f = folder / "weights.safetensors"
    if not f.is_file() or any(folder.glob("model*.safetensors")):
        return None
    names = _header(f)
    if any(re.search(r"\.(q4_0|q4_1|q8_0)\.codes$", k) for k in names):
        return f
    return None


def _open_course_blocks(folder: Path, arch: str, cfg: ModelConfig) -> Checkpoint:
    """The course's converted SmolLM2 folder (``python -m course_lib.smollm convert``):
    ``weights.safetensors`` holds each quantized weight as its block codes, fp16 scales and
    minimums; ``source.json`` says which file they came from."""
    f = folder / "weights.safetensors"
    header = _header(f)
    shapes, dtypes = {}, {}
    for k, (shape, dt) in header.items():
        m = re.fullmatch(r"(.+)\.(q4_0|q4_1|q8_0)\.(codes|scale|minimum)", k)
        if m is None:
            shapes[k], dtypes[k] = shape, dt
        elif m.group(3) == "codes":
            shapes[m.group(1)], dtypes[m.group(1)] = shape, m.group(2).upper()
    expected = _expected(cfg)
    missing = sorted(set(expected) - set(shapes))
    extra = sorted(set(shapes) - set(expected) - {"lm_head.weight"})
    if missing or extra:
        raise ValueError(f"{f} does not match config.json: missing {missing[:5]}, unexpected "
                         f"{extra[:5]}; convert again with `python -m course_lib.smollm convert "
                         f"--force`")
    for k, shape in expected.items():
        if shapes[k] != shape:
            raise ValueError(f"tensor {k} has shape {shapes[k]} in {f} but config.json implies "
                             f"{shape}; convert again with `python -m course_lib.smollm convert "
                             f"--force`")
    ck = Checkpoint(folder, arch, cfg, {k: f.name for k in expected},
                    {k: shapes[k] for k in expected}, {k: dtypes[k] for k in expected},
                    format="course-blocks")
    src = folder / "source.json"
    where = json.loads(src.read_text()).get("file", "?") if src.is_file() else "?"
    ck.notes.append(f"the course's converted folder: weights decoded from their block codes "
                    f"({', '.join(ck.quantized)}; from {where}, source.json), as smollm.load() "
                    f"decodes them")
    return _with_tokenizer(ck)


def _open_gguf(path: Path) -> Checkpoint:
    """A GGUF file as a :class:`Checkpoint`: the architecture (llama, qwen2, qwen3), the
    config from its metadata, every tensor's name, shape and type checked (no weight
    decoded), the tokenizer in its metadata against the embedding."""
    from course_lib import gguf_model as gm
    reader, garch = _gguf_reader(path)
    cfg = gm.config_from_gguf(reader)
    expected = _expected(cfg)
    weight_map, shapes, dtypes, nbytes = {}, {}, {}, {}
    for t in reader.tensors:
        if t.name == gm.ROPE_FREQS:                       # folded into cfg.rope_scaling
            continue
        kind = t.tensor_type.name
        if kind not in gm.DECODED_TYPES:
            raise ValueError(f"tensor {t.name} of {path.name} is stored as {kind}, which the "
                             f"course does not decode; it decodes {', '.join(gm.DECODED_TYPES)}. "
                             f"Use a file in one of them (llama.cpp's llama-quantize writes "
                             f"them), ideally the F16/BF16 one")
        name = gm.hf_name(t.name, garch)
        weight_map[name] = t.name
        shapes[name] = tuple(int(s) for s in reversed(t.shape.tolist()))
        dtypes[name], nbytes[name] = kind, int(t.n_bytes)
    missing = sorted(set(expected) - set(weight_map))
    extra = sorted(set(weight_map) - set(expected))
    if missing or extra:
        raise ValueError(f"the tensors of {path.name} do not match its metadata ({garch}): "
                         f"missing {missing[:5]}, unexpected {extra[:5]}; the file may be "
                         f"incomplete or of a variant the course does not compute")
    for k, shape in expected.items():
        if shapes[k] != shape:
            raise ValueError(f"tensor {weight_map[k]} has shape {shapes[k]} but the metadata "
                             f"implies {shape}; the file is inconsistent")
    ck = Checkpoint(path.parent, gm.ARCHITECTURES[garch], cfg, weight_map, shapes, dtypes,
                    format="gguf", path=path, gguf_architecture=garch, nbytes=nbytes,
                    _reader=reader)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        n = len(tokens.contents())
        if n > cfg.vocab_size:
            raise ValueError(f"the tokenizer in {path.name} has {n} tokens but the embedding "
                             f"has {cfg.vocab_size} rows: the file's tokenizer and weights "
                             f"belong to different models")
        ck.tokenizer, ck.vocab_in_tokenizer = path, n
        if n < cfg.vocab_size:
            ck.notes.append(f"the embedding has {cfg.vocab_size - n} rows no token uses")
    else:
        ck.notes.append(f"{path.name} holds no tokenizer (tokenizer.ggml.tokens): loading "
                        f"works, evaluating on text does not")
    if ck.quantized:
        _warn_quantized(ck)
    return ck


def _warn_quantized(ck: Checkpoint) -> None:
    """Once per file: a quantized GGUF's weights already sit on their grid."""
    key = (str(ck.path.resolve()), ck.path.stat().st_mtime_ns)
    if key in _WARNED:
        return
    _WARNED.add(key)
    counts = {}
    for k, d in ck.dtypes.items():
        if d not in FLOAT_DTYPES:
            counts[d] = counts.get(d, 0) + 1
    kinds = ", ".join(f"{d} ({n} tensors)" for d, n in sorted(counts.items()))
    msg = (f"{ck.path.name} is already quantized: {kinds}. Its weights sit on that grid, so "
           f"quantizing them again inherits it: a method's error is then measured against "
           f"this quantized model, not the original one, and stacks on the file's own error "
           f"(lesson 13's double-quantization trap). Start from the F16/BF16 release to "
           f"measure a method")
    ck.notes.append(msg)
    warnings.warn(msg, UserWarning, stacklevel=4)


def _as_checkpoint(source) -> Checkpoint:
    return source if isinstance(source, Checkpoint) else open_checkpoint(source)


def _read(ck: Checkpoint, names: list[str], dtype) -> dict[str, torch.Tensor]:
    """The tensors ``names``, each read on its own from its shard (safe_open: lazy), or
    decoded from the GGUF file (mapped: only these tensors' bytes are read) or from the
    converted folder's block codes."""
    if ck.format == "gguf":
        return _read_gguf(ck, names, dtype)
    if ck.format == "course-blocks":
        return _read_course_blocks(ck, names, dtype)
    from safetensors import safe_open
    by_file: dict[str, list[str]] = {}
    for k in names:
        by_file.setdefault(ck.weight_map[k], []).append(k)
    out = {}
    for f, ks in by_file.items():
        with safe_open(str(ck.folder / f), framework="pt") as h:
            for k in ks:
                out[k] = h.get_tensor(k).to(dtype)
    return out


def _read_gguf(ck: Checkpoint, names: list[str], dtype) -> dict[str, torch.Tensor]:
    from course_lib import gguf_model as gm
    if ck._reader is None:
        ck._reader = gm.open_gguf(ck.path)
    by_name = {t.name: t for t in ck._reader.tensors}
    out = {}
    for k in names:
        _, v = gm.decode_tensor(by_name[ck.weight_map[k]], ck.gguf_architecture, ck.config)
        out[k] = (v.dequantize() if isinstance(v, gm.BlockQuantized) else v).to(dtype)
    return out


def _read_course_blocks(ck: Checkpoint, names: list[str], dtype) -> dict[str, torch.Tensor]:
    from safetensors import safe_open
    from course_lib.gguf_model import BlockQuantized
    out = {}
    with safe_open(str(ck.folder / "weights.safetensors"), framework="pt") as h:
        for k in names:
            kind = ck.dtypes[k].lower()
            if kind in COURSE_BLOCK_KINDS:
                keys = set(h.keys())
                m = f"{k}.{kind}.minimum"
                bq = BlockQuantized(kind, h.get_tensor(f"{k}.{kind}.codes"),
                                    h.get_tensor(f"{k}.{kind}.scale"),
                                    h.get_tensor(m) if m in keys else None)
                out[k] = bq.dequantize().to(dtype)
            else:
                out[k] = h.get_tensor(k).to(dtype)
    return out


def _check_dtype(dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch dtype such as torch.float32 or "
                        f"torch.bfloat16; got {dtype!r}")


def layer_state(source, i: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Decoder layer ``i``'s tensors, named as in :class:`course_lib.model.Block`
    (``self_attn.q_proj.weight`` ...), read from the shards that hold them and nothing else.
    ``source``: a folder or an opened :class:`Checkpoint` (open once when streaming)."""
    _check_dtype(dtype)
    ck = _as_checkpoint(source)
    names = ck.layer_names(i)
    prefix = f"model.layers.{i}."
    return {k[len(prefix):]: v for k, v in _read(ck, names, dtype).items()}


def load_layer(source, i: int, dtype: torch.dtype = torch.float32) -> Block:
    """Decoder layer ``i`` as a :class:`course_lib.model.Block` holding its weights (eval mode):
    ``block(x, *model.rope(0, T))`` runs it. Only this layer's tensors are read."""
    ck = _as_checkpoint(source)
    sd = layer_state(ck, i, dtype)
    with torch.device("meta"):
        block = Block(ck.config, i)
    block.load_state_dict(sd, strict=True, assign=True)
    return block.eval()


def outer_state(source, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The tensors outside the decoder layers: the embedding, the final norm and (untied) the
    head, under their checkpoint names."""
    _check_dtype(dtype)
    ck = _as_checkpoint(source)
    names = [k for k in ck.weight_map if not k.startswith("model.layers.")]
    return _read(ck, names, dtype)


def load(source, dtype: torch.dtype = torch.float32) -> LlamaModel:
    """The whole checkpoint as a course :class:`LlamaModel` in eval mode, each tensor read and
    converted to ``dtype`` on its own (no second full copy in the file's dtype)."""
    _check_dtype(dtype)
    ck = _as_checkpoint(source)
    sd = _read(ck, list(ck.weight_map), dtype)
    return model_from_state_dict(ck.config, sd, dtype)


def load_tokenizer(source):
    """The checkpoint's tokenizer.json (``course_lib.model.HFTokenizer``), checked against the
    embedding by :func:`open_checkpoint`."""
    from course_lib.model import HFTokenizer
    ck = _as_checkpoint(source)
    if ck.format == "gguf" and ck.tokenizer is not None:
        return _gguf_tokenizer(ck.path)
    if ck.tokenizer is None and ck.format == "gguf":
        raise FileNotFoundError(f"{ck.path.name} holds no tokenizer (tokenizer.ggml.tokens); "
                                f"use the tokenizer.json released with the model")
    if ck.tokenizer is None:
        raise FileNotFoundError(f"{ck.folder / 'tokenizer.json'} is missing: download "
                                f"tokenizer.json with the checkpoint (a tokenizer.model alone is "
                                f"sentencepiece's format: transformers' AutoTokenizer can "
                                f"save_pretrained it as tokenizer.json)")
    return HFTokenizer(ck.tokenizer)


def _gguf_tokenizer(path: Path):
    """The tokenizer a GGUF file's metadata holds, as ``course_lib.model.HFTokenizer``: built by
    transformers' GGUF tokenizer conversion (as ``smollm.convert`` builds SmolLM2's)."""
    from course_lib.model import HFTokenizer
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ImportError("reading a GGUF file's tokenizer needs transformers (a course "
                          "dependency): pip install transformers") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # transformers raises several types for tokenizers it cannot build
        raise ValueError(f"transformers cannot build the tokenizer of {path.name} ({e}); use "
                         f"the tokenizer.json released with the model") from None
    out = HFTokenizer.__new__(HFTokenizer)
    out.tok = tok.backend_tokenizer
    out.vocab_size = out.tok.get_vocab_size()
    return out


# ----------------------------------------------------------------------------- the bill
def linear_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of each Linear of one decoder layer (the ones a method quantizes)."""
    D, F_, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    H, K = cfg.num_attention_heads, cfg.num_key_value_heads
    return {"q_proj": (H * hd, D), "k_proj": (K * hd, D), "v_proj": (K * hd, D),
            "o_proj": (D, H * hd), "gate_proj": (F_, D), "up_proj": (F_, D), "down_proj": (D, F_)}


def count_parameters(cfg: ModelConfig) -> dict[str, int]:
    """Parameters by part, from the config alone: ``embedding``, ``layers`` (all of them),
    ``per_layer``, ``linear_per_layer`` (the 7 Linear weights a method quantizes),
    ``small_per_layer`` (norms and biases), ``head`` (0 when tied), ``final_norm``, ``total``."""
    D, V, hd = cfg.hidden_size, cfg.vocab_size, cfg.head_dim
    H, K, F_ = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size
    lin = sum(o * i for o, i in linear_shapes(cfg).values())
    small = 2 * D                                              # the two RMSNorms
    if cfg.attention_bias or cfg.qkv_bias:
        small += (H + 2 * K) * hd
    if cfg.attention_bias:
        small += D
    if cfg.mlp_bias:
        small += 2 * F_ + D
    if cfg.qk_norm:
        small += 2 * hd
    per_layer = lin + small
    head = 0 if cfg.tie_word_embeddings else V * D
    total = V * D + cfg.num_hidden_layers * per_layer + D + head
    return {"embedding": V * D, "layers": cfg.num_hidden_layers * per_layer,
            "per_layer": per_layer, "linear_per_layer": lin, "small_per_layer": small,
            "head": head, "final_norm": D, "total": total}


def _gguf_bytes(cfg: ModelConfig, mix: str) -> int:
    """Bytes of the GGUF file ``llama-quantize`` writes for ``mix`` ("q8_0", "q4_0" or
    "q4_k_m"): each 2-D weight priced row by row in the type llama.cpp gives it, 1-D tensors
    (norms, biases) in F32 as llama.cpp keeps them.

    The head (or a tied embedding, which plays its part) is not stored in the file's base type:
    in llama.cpp's ``llama_tensor_get_type`` (``src/llama-quant.cpp`` lines 488-510,
    llama-cpp-python 0.3.36) it becomes Q6_K for any base type but Q8_0, and Q6_K falls back
    to Q8_0 where rows are not a multiple of 256 (SmolLM2's 576): ``kmix.llama_type`` gives
    that type. A Q8_0 file keeps its head in Q8_0. Q4_K_M's other rules: ``kmix.llama_type``."""
    p = count_parameters(cfg)
    L, D, V = cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size
    tied = cfg.tie_word_embeddings
    gguf = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
            "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    tensors = [("token_embd.weight", V, D)] + ([] if tied else [("output.weight", V, D)])
    for i in range(L):
        tensors += [(f"blk.{i}.{gguf[n]}.weight", o, c) for n, (o, c) in linear_shapes(cfg).items()]
    total = 4 * (L * p["small_per_layer"] + D)
    for name, rows, cols in tensors:
        head = name == "output.weight" or (tied and name == "token_embd.weight")
        if mix == "q4_k_m" or (head and mix != "q8_0"):
            fmt = kmix.llama_type("q4_k_m", name, cols, L, tied=tied).stored
        else:
            fmt = mix
        if fmt == "f16" or not kquants.fits(fmt, cols):
            total += rows * cols * 2                     # llama.cpp keeps such rows in F16
        else:
            total += rows * kquants.row_bytes(fmt, cols)
    return total


def linear_bytes(out_features: int, in_features: int, bits: float, group_size: int) -> float:
    """Bytes of one (out, in) weight at ``bits`` with a 16-bit scale per ``group_size`` weights
    of a row: lesson 00's params x bits per weight / 8 with lesson 03's 4 + 16/128. A row whose
    width ``group_size`` does not divide ends in a partial group that still carries its scale
    (SmolLM2's 576 = 4 x 128 + 64: 5 scales a row)."""
    if in_features % group_size == 0:
        return hardware.weight_bytes(out_features * in_features,
                                     quant.bits_per_weight(bits, group_size))
    return hardware.weight_bytes(out_features * in_features, bits) + \
        out_features * math.ceil(in_features / group_size) * 2


def format_bytes(cfg: ModelConfig) -> dict[str, dict]:
    """Bytes of the whole model in each storage format, with how each is counted.

    Lesson 00's sum, parameters x bits per weight / 8, with the scales counted as in lesson 03
    (``quant.bits_per_weight``: 4 + 16/128 = 4.125 for W4 g128). The W8/W4 rows are
    compressed-tensors checkpoints: the decoder's Linear weights quantized, the embedding, the
    head, norms and biases left in BF16 (llm-compressor's recipes leave lm_head out). The GGUF
    rows quantize the embedding and head too (:func:`_gguf_bytes`).
    """
    p = count_parameters(cfg)
    rest = p["total"] - cfg.num_hidden_layers * p["linear_per_layer"]   # kept in BF16

    def linears(bits, group):
        total = 0.0
        for o, i in linear_shapes(cfg).values():
            g = i if group == "channel" else group   # one scale per output row: group = in
            total += linear_bytes(o, i, bits, g)
        return cfg.num_hidden_layers * total + hardware.weight_bytes(rest, "bf16")

    return {
        "FP32": {"bytes": hardware.weight_bytes(p["total"], "fp32"), "how": "every weight 32 bits"},
        "BF16": {"bytes": hardware.weight_bytes(p["total"], "bf16"),
                 "how": "every weight 16 bits (how most checkpoints ship)"},
        "W8 per-channel": {"bytes": linears(8, "channel"),
                           "how": "Linears 8 bits + one 16-bit scale per row; rest BF16"},
        "W4 g128": {"bytes": linears(4, 128), "how": "Linears 4 + 16/128 bits; rest BF16"},
        "W4 g32": {"bytes": linears(4, 32), "how": "Linears 4 + 16/32 bits; rest BF16"},
        "Q8_0": {"bytes": _gguf_bytes(cfg, "q8_0"), "how": "GGUF: every 2-D weight 8.5 bits"},
        "Q4_0": {"bytes": _gguf_bytes(cfg, "q4_0"),
                 "how": "GGUF: 2-D weights 4.5 bits, the head in Q6_K (Q8_0 when its rows are "
                        "not a multiple of 256), as llama-quantize writes it"},
        "Q4_K_M": {"bytes": _gguf_bytes(cfg, "q4_k_m"),
                   "how": "GGUF: llama.cpp's mix (Q4_K, Q6_K on attn_v/ffn_down of some layers "
                          "and on the head)"},
    }


#: Released configs (their config.json on the Hugging Face Hub, keys the count needs).
SMOLLM2_135M = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
                "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                "tie_word_embeddings": True}
LLAMA32_1B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
              "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
              "tie_word_embeddings": True, "rope_theta": 500000.0,
              "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                               "original_max_position_embeddings": 8192,
                               "rope_type": "llama3"}}
LLAMA31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
              "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False,
              "rope_theta": 500000.0,
              "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                               "original_max_position_embeddings": 8192,
                               "rope_type": "llama3"}}
QWEN25_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
              "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
              "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True,
              "rope_theta": 1000000.0, "use_sliding_window": False}
QWEN3_06B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
             "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
             "tie_word_embeddings": True, "rope_theta": 1000000, "attention_bias": False}
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
              "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "tie_word_embeddings": False, "sliding_window": 4096}
#: LLaMA 1's 7B as huggyllama/llama-7b ships it: written before transformers had
#: num_key_value_heads, and without tie_word_embeddings (transformers' default: False).
LLAMA1_7B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
             "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32}
#: Which config is which, for the lesson's table.
RELEASED = {"SmolLM2-135M": SMOLLM2_135M, "Qwen2.5-0.5B": QWEN25_05B, "Qwen3-0.6B": QWEN3_06B,
            "Llama-3.2-1B": LLAMA32_1B, "Mistral-7B-v0.1": MISTRAL_7B, "Llama-3.1-8B": LLAMA31_8B}


#: "kmix": a k-quant mix chosen by measured sensitivity (:mod:`course_lib.own_kmix`), written
#: as GGUF (:func:`course_lib.stream_gguf.from_checkpoint`).
METHODS = ("rtn", "gptq", "awq", "kmix")
PATHS = ("layer", "whole")
#: The defaults of :func:`bill` for calibrated methods: the GPTQ reference code's
#: (github.com/IST-DASLab/gptq, llama.py: ``--nsamples`` default 128, ``model.seqlen = 2048``;
#: llama_sequential keeps ``inps`` and ``outs`` of shape (nsamples, seqlen, hidden) and one GPTQ
#: object, each with its Hessian, per Linear of the layer: the parts :func:`method_memory` counts).
CALIB_SAMPLES, CALIB_SEQ_LEN = 128, 2048


def free_memory_bytes() -> int | None:
    """Memory this machine can give a new job now: psutil's ``available``, else /proc/meminfo's
    MemAvailable; None when neither can be read."""
    try:
        import psutil
        return int(psutil.virtual_memory().available)
    except Exception:  # psutil missing or unsupported here: fall back to /proc/meminfo
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def method_memory(cfg: ModelConfig, method: str = "gptq", path: str = "layer",
                  calib_samples: int = CALIB_SAMPLES, seq_len: int = CALIB_SEQ_LEN
                  ) -> dict[str, float]:
    """Peak memory (bytes) of quantizing with ``method`` along ``path``, by part, in fp32.

    ``"whole"``: the whole model in fp32, held once (as llm-compressor's oneshot holds it on the
    CPU); the course's own whole-model path holds it twice (its methods quantize a
    ``copy.deepcopy``) and ``export_compressed`` adds a bf16 state dict, so it measured about
    2.4x this on Llama-3.2-1B's shapes (``results/stream_1b.json``). ``"layer"``:
    one decoder layer at a time, its weights and their quantized copy, or the embedding while
    layer 0's inputs are made, whichever is larger. Calibrated methods (GPTQ, AWQ) add the
    activations of every calibration sample at the layer's input and output (2 x samples x
    seq_len x hidden, in fp32; the GPTQ reference code keeps them in the model's dtype), one
    sample's forward working memory (the MLP's three (seq_len, F) tensors and the (heads,
    seq_len, seq_len) attention scores of a plain softmax) and the method's state: GPTQ one
    (in x in) Hessian per Linear of the layer, as the reference code's llama_sequential holds
    them (see :data:`CALIB_SAMPLES`), plus one inverse; AWQ the widest Linear's inputs again,
    for its search over scales (an estimate: implementations differ). RTN needs no calibration: only the weights.
    "kmix" (:func:`course_lib.own_kmix.scan`) holds the layer's input, its float output and the
    output with one tensor rounded.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    if path not in PATHS:
        raise ValueError(f"path must be 'layer' (one decoder layer at a time) or 'whole' (the "
                         f"model in memory); got {path!r}")
    for name, v in (("calib_samples", calib_samples), ("seq_len", seq_len)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1; got {v!r}")
    p = count_parameters(cfg)
    D, F_, H = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads
    f32 = 4
    parts = {}
    if path == "whole":
        parts["model (fp32)"] = f32 * p["total"]
    else:
        w = 2 * f32 * p["per_layer"]
        if method != "rtn":   # the embedding makes layer 0's inputs once, then is let go
            w = max(w, f32 * p["embedding"])
        parts["weights: one layer x 2 (original, quantized) or the embedding (fp32)"] = w
    if method == "rtn":
        return parts
    n, T = calib_samples, seq_len
    if method == "kmix":     # own_kmix.scan: the input, the float output, one rounded output
        parts["calibration activations, layer in + out + a rounded out (fp32)"] = \
            3 * f32 * n * T * D
    else:
        parts["calibration activations, layer in + out (fp32)"] = 2 * f32 * n * T * D
    parts["one sample's forward (fp32)"] = f32 * (3 * T * F_ + H * T * T)
    ins = [i for _, i in linear_shapes(cfg).values()]
    if method == "kmix":
        return parts
    if method == "gptq":
        parts["GPTQ Hessians, one per Linear (fp32)"] = f32 * (sum(i * i for i in ins)
                                                               + max(ins) ** 2)
    else:
        parts["AWQ: the widest Linear's inputs (fp32)"] = f32 * n * T * max(ins)
    return parts


@dataclass
class Bill:
    """What :func:`bill` computed. ``need[path]`` is the total of ``parts[path]`` (bytes)."""
    architecture: str
    config: ModelConfig
    params: dict[str, int]
    formats: dict[str, dict]
    method: str
    bits: int
    group_size: int
    calib_samples: int
    seq_len: int
    parts: dict[str, dict[str, float]]
    need: dict[str, float]
    free_bytes: int | None
    output_bytes: float

    def fits(self, path: str = "layer") -> bool | None:
        """Whether ``path`` fits in the free memory (None when it is unknown)."""
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}; got {path!r}")
        return None if self.free_bytes is None else self.need[path] <= self.free_bytes

    def check(self, path: str = "layer") -> "Bill":
        """Raise MemoryError with the figures and what to change when ``path`` does not fit."""
        if self.fits(path) is not False:
            return self
        raise MemoryError(self._refusal(path))

    def _refusal(self, path: str) -> str:
        gb = lambda b: f"{b / hardware.GB:.2f} GB"   # noqa: E731
        what = "KMIX" if self.method == "kmix" else f"{self.method.upper()} W{self.bits}"
        lines = [f"{what} on this {self.architecture} "
                 f"({self.params['total'] / 1e9:.2f}B parameters), "
                 f"{'one layer at a time' if path == 'layer' else 'whole model in memory'}, "
                 f"needs {gb(self.need[path])} but this machine has {gb(self.free_bytes)} free:"]
        lines += [f"  {k}: {gb(v)}" for k, v in self.parts[path].items()]
        tries = []
        if path == "whole" and self.need["layer"] <= self.free_bytes:
            tries.append(f"path='layer' (one decoder layer at a time) needs {gb(self.need['layer'])}")
        if self.method != "rtn":
            for n, T in ((max(1, self.calib_samples // 4), self.seq_len),
                         (self.calib_samples, max(1, self.seq_len // 4))):
                m = sum(method_memory(self.config, self.method, "layer", n, T).values())
                tries.append(f"calib_samples={n}, seq_len={T} needs {gb(m)} (path='layer')")
            m = sum(method_memory(self.config, "rtn", "layer").values())
            tries.append(f"method='rtn' (no calibration) needs {gb(m)} (path='layer')")
        lines.append("What to change: " + "; ".join(tries) if tries else
                     "Nothing smaller exists for this model: free memory, or use a machine with more")
        return "\n".join(lines)

    def table(self) -> str:
        """The bill as text: parameters, bytes per format, memory per path against free memory."""
        gb = lambda b: f"{b / hardware.GB:8.3f} GB"   # noqa: E731
        head = f"{self.params['head']:,}" if self.params["head"] else "tied"
        out = [f"{self.architecture}: {self.params['total']:,} parameters "
               f"({self.config.num_hidden_layers} layers of {self.params['per_layer']:,}; "
               f"embedding {self.params['embedding']:,}; head {head})",
               "bytes per format:"]
        out += [f"  {k:<15}{gb(v['bytes'])}   {v['how']}" for k, v in self.formats.items()]
        free = "unknown" if self.free_bytes is None else gb(self.free_bytes).strip()
        what = ("KMIX (a k-quant mix, GGUF" if self.method == "kmix" else
                f"{self.method.upper()} W{self.bits} g{self.group_size} (")
        out.append(f"{what} output "
                   f"{gb(self.output_bytes).strip()}), calibration {self.calib_samples} x "
                   f"{self.seq_len} tokens; free memory {free}:")
        for path in PATHS:
            ok = {True: "fits", False: "does NOT fit", None: "free memory unknown"}[self.fits(path)]
            out.append(f"  {path:<6}{gb(self.need[path])}   {ok}")
            out += [f"          {gb(v)}   {k}" for k, v in self.parts[path].items()]
        return "\n".join(out)

    __str__ = table


def bill(source, method: str = "gptq", bits: int = 4, group_size: int = 128,
         calib_samples: int = CALIB_SAMPLES, seq_len: int = CALIB_SEQ_LEN,
         free_bytes: int | None = None, path: str | None = None) -> Bill:
    """The bill of quantizing a checkpoint, from its ``config.json`` alone (no weight read).

    ``source``: the checkpoint folder, its config.json or the dict, a .gguf file or an opened
    :class:`Checkpoint`. Parameters by part; bytes in
    each storage format (:func:`format_bytes`); the memory ``method`` needs whole-model and
    layer by layer (:func:`method_memory`) against ``free_bytes`` (default: this machine's free
    memory now, :func:`free_memory_bytes`); the size of the output, W``bits`` g``group_size``
    with the rest in BF16. ``path``: ``"layer"`` or ``"whole"`` to refuse (MemoryError, with
    the figures and what to change) when that path does not fit; None only reports.
    """
    if isinstance(source, Checkpoint):
        arch, cfg = source.architecture, source.config
    elif _is_gguf(source):
        from course_lib import gguf_model as gm
        reader, garch = _gguf_reader(source)
        arch, cfg = gm.ARCHITECTURES[garch], gm.config_from_gguf(reader)
    else:
        raw = read_raw_config(source)
        arch = architecture(raw)
        cfg = own_config(raw)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    if isinstance(bits, bool) or bits not in (2, 3, 4, 8):
        raise ValueError(f"bits must be 2, 3, 4 or 8; got {bits!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a whole number >= 1 (32, 128 ...); got "
                         f"{group_size!r}")
    if free_bytes is not None and (isinstance(free_bytes, bool) or not isinstance(free_bytes, int)
                                   or free_bytes < 0):
        raise ValueError(f"free_bytes must be a whole number of bytes >= 0, or None to read "
                         f"this machine's; got {free_bytes!r}")
    if path is not None and path not in PATHS:
        raise ValueError(f"path must be None (report only), 'layer' or 'whole'; got {path!r}")
    parts = {p: method_memory(cfg, method, p, calib_samples, seq_len) for p in PATHS}
    p = count_parameters(cfg)
    out = cfg.num_hidden_layers * sum(linear_bytes(o, i, bits, group_size)
                                      for o, i in linear_shapes(cfg).values())
    out += hardware.weight_bytes(p["total"] - cfg.num_hidden_layers * p["linear_per_layer"],
                                 "bf16")
    fmts = format_bytes(cfg)
    if method == "kmix":                           # a GGUF file at Q4_K_M's bytes by default
        out = fmts["Q4_K_M"]["bytes"]
    b = Bill(arch, cfg, p, fmts, method, bits, group_size, calib_samples, seq_len,
             parts, {k: float(sum(v.values())) for k, v in parts.items()},
             free_memory_bytes() if free_bytes is None else free_bytes, out)
    if path is not None:
        b.check(path)
    return b
