"""Save a GPTQ / AWQ / RTN model as a compressed-tensors ``pack-quantized`` checkpoint: the W4A16
format llm-compressor writes and vLLM serves (lessons 06-07).

What goes in the folder (Hugging Face layout, self-contained):

- ``model.safetensors``: per quantized Linear ``<name>.weight_packed`` int32 (out, in / 8): the
  4-bit code q (in -8..7) stored as q + 8, eight per int32, element j of each run of eight in
  bits 4j..4j+3 (the first element lowest); ``<name>.weight_scale`` (out, in / group) in the
  checkpoint's dtype; ``<name>.weight_shape`` int64 [out, in]; asymmetric only:
  ``<name>.weight_zero_point`` int32 (out / 8, in / group), zero points packed the same way
  along the *rows*. Everything else (embeddings, norms, the head) as plain tensors.
- ``config.json`` with ``quantization_config`` (``quant_method: compressed-tensors``,
  ``format: pack-quantized``, one config group: int, 4 bits, group strategy, the group size,
  symmetric or not; the head in ``ignore``).
- a tokenizer: the model's own ``tokenizer.json``, or for the byte-level bundled model one made
  here whose ids are the bytes (transformers and vLLM both read it).

The codes are written exactly as the method chose them. The course's asymmetric codes u in
0..15 with zero point z mean (u - z) * scale; compressed-tensors stores q = u - 8 and
zp = z - 8, which is the same weight. Scales are stored in the checkpoint's dtype (bf16 by
default): quantize with ``scale_dtype=torch.bfloat16`` and the checkpoint computes exactly what
the course's model does (PLATFORM.md: fp16 scales in a bf16 model lost accuracy in transformers).

Serve it with ``vllm serve <folder>`` (vLLM reads the format from config.json). Load it on a CPU
with transformers (and ``compressed-tensors`` installed): ``AutoModelForCausalLM.from_pretrained
(folder, dtype=torch.float32)``; asymmetric checkpoints need
``quantization_config=CompressedTensorsConfig(dequantize=True)`` with compressed-tensors 0.20.1.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn as nn

from course_lib.methods.calibration import GroupQuantLinear

#: Bit widths the pack-quantized format and vLLM's W4A16 / W8A16 kernels take.
SUPPORTED_BITS = (4, 8)
COMPRESSED_TENSORS_VERSION = "0.20.1"


def pack_int32(codes: torch.Tensor, bits: int, dim: int = 1) -> torch.Tensor:
    """Pack unsigned codes (0..2**bits-1) ``32 // bits`` per int32 along ``dim`` (first element
    in the lowest bits), as compressed-tensors' ``pack_to_int32`` does for 4 and 8 bits."""
    if isinstance(bits, bool) or bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be 4 or 8 (pack-quantized checkpoints here hold 4- or 8-bit "
                         f"codes); got {bits!r}")
    if not isinstance(codes, torch.Tensor) or codes.dim() != 2 or codes.is_floating_point() \
            or codes.dtype == torch.bool or codes.numel() == 0:
        raise ValueError("codes must be a non-empty 2-D integer tensor (rows, cols) of unsigned "
                         "codes; got " + (f"{codes.dtype} of shape {tuple(codes.shape)}"
                                          if isinstance(codes, torch.Tensor) else
                                          f"{type(codes).__name__} (torch.from_numpy converts "
                                          f"an array)"))
    if dim not in (0, 1) or isinstance(dim, bool):
        raise ValueError(f"dim is the axis to pack along, 0 or 1; got {dim!r}")
    per = 32 // bits
    u = codes.to(torch.int64)
    if int(u.min()) < 0 or int(u.max()) >= 2 ** bits:
        raise ValueError(f"codes must lie in 0..{2 ** bits - 1} (offset by {2 ** (bits - 1)}) "
                         f"before packing; got {int(u.min())}..{int(u.max())}")
    if dim == 0:
        u = u.T
    rows, cols = u.shape
    pad = -cols % per
    u = torch.nn.functional.pad(u, (0, pad)).view(rows, -1, per)            # (rows, words, per)
    shifts = torch.arange(per, dtype=torch.int64) * bits                     # (per,)
    words = (u << shifts).sum(-1)                                            # (rows, words)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    return (words.T if dim == 0 else words).contiguous()


def byte_tokenizer_json() -> dict:
    """A ``tokenizer.json`` for a byte-level model: token id = byte value (0..255).

    It uses the GPT-2 byte-to-character table (each byte gets a printable stand-in character)
    with an empty merge list, so every byte is its own token and ids are the bytes themselves.
    """
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): b for b, c in zip(bs, cs)}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                              "use_regex": False},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                        "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": []}}


def _quantized_layers(model: nn.Module) -> dict[str, GroupQuantLinear]:
    layers = {n: m for n, m in model.named_modules() if isinstance(m, GroupQuantLinear)}
    if not layers:
        raise ValueError("the model has no GroupQuantLinear layers: quantize it first with "
                         "course_lib.methods (gptq.gptq_model, awq.awq_model or "
                         "calibration.rtn_model)")
    return layers


def quantization_config(bits: int, group_size: int, symmetric: bool,
                        ignore=("lm_head",)) -> dict:
    """The ``quantization_config`` block of config.json for W{bits}A16 group-wise integers."""
    if isinstance(bits, bool) or bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS} (what vLLM's W4A16/W8A16 kernels "
                         f"take); got {bits!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a whole number >= 1 (inputs per scale); got "
                         f"{group_size!r}")
    if not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be True or False; got {symmetric!r}")
    if isinstance(ignore, str) or not isinstance(ignore, (list, tuple)) \
            or not all(isinstance(n, str) for n in ignore):
        raise TypeError(f"ignore must be a list of module names such as ['lm_head'] (a single "
                        f"string would be read one letter at a time); got {ignore!r}")
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "quantization_status": "compressed", "version": COMPRESSED_TENSORS_VERSION,
            "config_groups": {"group_0": {
                "targets": ["Linear"], "input_activations": None, "output_activations": None,
                "weights": {"num_bits": bits, "type": "int", "symmetric": symmetric,
                            "strategy": "group", "group_size": group_size, "dynamic": False,
                            "actorder": None, "observer": "minmax"}}},
            "ignore": list(ignore), "kv_cache_scheme": None}


def export_compressed(model: nn.Module, folder: str | Path, dtype: torch.dtype = torch.bfloat16,
                      tokenizer_json: str | Path | None = None,
                      strict_scales: bool = True, overwrite: bool = False) -> Path:
    """Write ``model`` (its Linears GroupQuantLinear from RTN / GPTQ / AWQ) as a compressed-tensors
    pack-quantized checkpoint in ``folder`` (lessons 06-07). Returns the folder.

    dtype: the checkpoint's dtype (scales and every unquantized tensor). strict_scales: refuse
    scales that are not exactly representable in ``dtype`` (the checkpoint would then compute
    with rounded scales, not the ones the method used); quantize with ``scale_dtype=dtype``.
    tokenizer_json: a tokenizer.json to copy; default: the byte-level one for a 256-token model.
    A folder that already holds a checkpoint (config.json, *.safetensors, ...) is refused unless
    ``overwrite=True``, which replaces that checkpoint's files (other files stay).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a course model quantized by a method (an nn.Module with "
                        f"GroupQuantLinear layers); got {type(model).__name__}")
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a folder path (str or Path); got {type(folder).__name__}")
    for name, v in (("strict_scales", strict_scales), ("overwrite", overwrite)):
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be True or False; got {v!r}")
    if tokenizer_json is not None and not isinstance(tokenizer_json, (str, os.PathLike)):
        raise TypeError(f"tokenizer_json must be None or the path of a tokenizer.json; got "
                        f"{type(tokenizer_json).__name__}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch dtype (torch.bfloat16 or "
                        f"torch.float16 for vLLM); got {dtype!r}")
    if Path(folder).is_file():
        raise NotADirectoryError(f"{folder} is a file; export_compressed writes a checkpoint "
                                 f"*folder*: give a folder path")
    if tokenizer_json is not None and not Path(tokenizer_json).is_file():
        raise FileNotFoundError(f"tokenizer_json {tokenizer_json} is not a file; pass the path "
                                f"of a tokenizer.json, or None for the byte-level one")
    layers = _quantized_layers(model)
    on_float_minimum = [n for n, m in layers.items() if getattr(m, "offset", None) is not None
                        or (not m.symmetric and m.zero is None)]
    if on_float_minimum:
        raise ValueError(f"Linears {on_float_minimum[:4]} are on llama.cpp's Q4_1 grid (a float "
                         f"minimum per block), which compressed-tensors' integer zero points "
                         f"cannot hold: write them as GGUF (export_gguf with 'Q4_1'), or quantize "
                         f"with grid='course' and symmetric=False for this format")
    kinds = {(m.bits, m.group_size, m.symmetric) for m in layers.values()}
    if len(kinds) != 1:
        raise ValueError(f"every quantized Linear must share one format for a single config "
                         f"group; found {sorted(kinds)}")
    bits, group_size, symmetric = kinds.pop()
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"a pack-quantized checkpoint that vLLM serves holds 4- or 8-bit codes "
                         f"(W4A16, W8A16); this model is {bits}-bit. Quantize with bits=4 to "
                         f"export (3-bit models stay in the course)")
    plain = [n for n, m in model.named_modules() if type(m) is nn.Linear and n != "lm_head"]
    if plain:
        raise ValueError(f"Linears {plain[:4]} are not quantized; quantize every block (not a "
                         f"slice with n_blocks) before exporting")
    if symmetric is False and any(m.out_features % (32 // bits) for m in layers.values()):
        raise ValueError("asymmetric zero points are packed along the rows: out_features must "
                         f"be a multiple of {32 // bits}")
    folder = Path(folder)
    existing = sorted({p.name for pattern in CHECKPOINT_PATTERNS for p in folder.glob(pattern)
                       if p.is_file()}) if folder.is_dir() else []
    if existing and not overwrite:
        raise FileExistsError(f"{folder} already holds a checkpoint ({', '.join(existing[:3])}"
                              f"{' ...' if len(existing) > 3 else ''}); pass overwrite=True to "
                              f"replace it (or choose another folder)")
    with _staging_folder(folder) as tmp:
        _write_compressed(model, tmp, layers, bits, group_size, symmetric, dtype, tokenizer_json,
                          strict_scales)
    return folder


def _write_compressed(model, folder: Path, layers, bits, group_size, symmetric, dtype,
                      tokenizer_json, strict_scales) -> None:
    """The files of :func:`export_compressed`, written into ``folder`` (a fresh staging one)."""
    from safetensors.torch import save_file
    offset = 2 ** (bits - 1)
    sd = {}
    for name, t in model.state_dict().items():
        mod_name, _, leaf = name.rpartition(".")
        if mod_name in layers:
            continue
        sd[name] = t.detach().to(dtype).contiguous()
    for name, m in layers.items():
        scale = m.scale.float()
        stored = scale.to(dtype)
        if strict_scales and not torch.equal(stored.float(), scale):
            raise ValueError(f"{name}: its scales are not exactly representable in {dtype}; "
                             f"quantize with scale_dtype={dtype} (or pass strict_scales=False "
                             f"to round them)")
        u = m.codes.to(torch.int64) + (offset if symmetric else 0)           # 0..2**bits-1
        sd[f"{name}.weight_packed"] = pack_int32(u, bits)                   # (out, in*bits/32)
        sd[f"{name}.weight_scale"] = stored.contiguous()                    # (out, G)
        sd[f"{name}.weight_shape"] = torch.tensor([m.out_features, m.in_features])
        if not symmetric:
            sd[f"{name}.weight_zero_point"] = pack_int32(m.zero.to(torch.int64), bits, dim=0)
        if m.bias is not None:
            sd[f"{name}.bias"] = m.bias.detach().to(dtype).contiguous()
    if getattr(model.config, "tie_word_embeddings", False):
        sd.pop("lm_head.weight", None)
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_hf_dict()
    cfg["torch_dtype"] = str(dtype).replace("torch.", "")
    cfg["quantization_config"] = quantization_config(bits, group_size, symmetric)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if tokenizer_json is not None:
        shutil.copy(tokenizer_json, folder / "tokenizer.json")
    elif model.config.vocab_size == 256:
        (folder / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()))
    else:
        raise ValueError("pass tokenizer_json= (the model's tokenizer.json) so the folder is "
                         "self-contained")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length":
         model.config.max_position_embeddings}) + "\n")


#: Files that belong to a Hugging Face checkpoint: an export replaces all of them, so a folder
#: never mixes the new weights with an older checkpoint's shards or index (a loader that
#: follows a stale index would read the old weights).
CHECKPOINT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin",
                       "pytorch_model.bin.index.json", "config.json", "generation_config.json",
                       "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                       "recipe.yaml")


@contextlib.contextmanager
def _staging_folder(folder: Path):
    """Yield a fresh folder beside ``folder``; on success its files replace the checkpoint
    files of ``folder`` (created if missing; other files there are left alone); on any error
    the staging folder is removed and ``folder`` is untouched."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.partial-", dir=folder.parent))
    try:
        yield tmp
        if not folder.exists():
            tmp.rename(folder)                                   # atomic on one file system
            return
        for pattern in CHECKPOINT_PATTERNS:                      # the older checkpoint's files
            for old in folder.glob(pattern):
                if old.is_file():
                    old.unlink()
        for new in tmp.iterdir():
            new.replace(folder / new.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def vllm_command(folder: str | Path) -> str:
    """The command that serves the exported folder with vLLM on a GPU machine (lesson 06)."""
    if not isinstance(folder, (str, Path)):
        raise TypeError(f"folder must be the exported checkpoint's folder (str or Path); got "
                        f"{type(folder).__name__}")
    if Path(folder).is_file():
        raise NotADirectoryError(f"{folder} is a file; vLLM serves the exported *folder* "
                                 f"(config.json + model.safetensors)")
    return f"vllm serve {folder} --dtype bfloat16 --max-model-len 256"


# ======================================================================= GGUF (lessons 13, 17)
#: The formats :func:`export_gguf` writes, with llama.cpp's file-type number for each.
GGUF_FORMATS = {"f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7}
#: Bits per weight of each format (the fp16 scale, and Q4_1's fp16 minimum, included).
GGUF_BITS = {"f16": 16.0, "q8_0": 8.5, "q4_1": 5.0, "q4_0": 4.5}


def _gguf_name(hf_name: str) -> str:
    """A course (Hugging Face) tensor name -> its GGUF name (the inverse of the reader's map)."""
    from course_lib.gguf_model import GGUF_TO_HF, GGUF_TO_HF_EXTRA
    parts = hf_name.split(".")
    if len(parts) > 3 and parts[:2] == ["model", "layers"]:
        key = "model.layers.{i}." + ".".join(parts[3:])
        for g, h in {**GGUF_TO_HF, **GGUF_TO_HF_EXTRA}.items():
            if h == key:
                return g.format(i=parts[2])
    for g, h in GGUF_TO_HF.items():
        if h == hf_name and "{i}" not in g:
            return g
    raise ValueError(f"tensor {hf_name!r} has no place in a llama GGUF file (is the model a "
                     f"course LlamaModel?)")


def _check_gguf_format(fmt, name: str = "fmt") -> str:
    if not isinstance(fmt, str) or fmt.lower() not in GGUF_FORMATS:
        raise ValueError(f"{name} must be one of {sorted(GGUF_FORMATS)} (the formats this writer "
                         f"lays out bit for bit as llama.cpp does); got {fmt!r}. K-quants "
                         f"(Q4_K_M ...) come from llama.cpp's own quantizer")
    return fmt.lower()


def _exact_fp16(t: torch.Tensor) -> bool:
    t = t.float()
    return bool(torch.isfinite(t.half().float()).all()) and torch.equal(t.half().float(), t)


def block_weights(m: GroupQuantLinear, fmt: str, strict_scales: bool = True):
    """A method's quantized Linear as llama.cpp blocks of ``fmt``, its codes and scales
    unchanged (lesson 13): Q4_0 holds symmetric 4-bit codes in -8..7 per 32 weights, Q8_0
    symmetric 8-bit codes in -127..127, Q4_1 codes 0..15 with a scale and a float minimum
    (the q4_1 grid's offset is m; a zero point z gives ``m = -z * s``). The scales (and minima) must be
    exact in fp16, as the file stores them (``strict_scales=False`` rounds them)."""
    from course_lib.gguf_model import BLOCK, BlockQuantized
    if not isinstance(m, GroupQuantLinear):
        raise TypeError(f"m must be a method's quantized Linear (GroupQuantLinear, from "
                        f"calibration.rtn_model, gptq or awq); got {type(m).__name__}: a plain "
                        f"weight goes through gguf_model.quantize_q4_0 / quantize_q8_0 instead")
    if not isinstance(fmt, str) or fmt.lower() not in ("q4_0", "q4_1", "q8_0"):
        raise ValueError(f"fmt must be 'q4_0', 'q4_1' or 'q8_0' (the block formats a method's "
                         f"codes go into); got {fmt!r}")
    fmt = fmt.lower()
    if not isinstance(strict_scales, bool):
        raise TypeError(f"strict_scales must be True or False; got {strict_scales!r}")
    want = {"q4_0": (4, True), "q8_0": (8, True), "q4_1": (4, False)}[fmt]
    if (m.bits, m.symmetric) != want or m.group_size != BLOCK:
        kind = f"int{m.bits} {'sym' if m.symmetric else 'asym'} g{m.group_size}"
        raise ValueError(f"this layer is {kind} ({m.method}); {fmt.upper()} holds "
                         f"{'symmetric' if want[1] else 'asymmetric'} {want[0]}-bit codes in "
                         f"blocks of {BLOCK}: quantize with bits={want[0]}, group_size={BLOCK}"
                         f"{'' if want[1] else ', symmetric=False'} (grid='{fmt}'), or export "
                         f"as 'f16'. Rounding its weights a second time would quantize twice")
    scale = m.scale.float()
    offset = getattr(m, "offset", None)                     # llama.cpp's Q4_1 grid: minimum m
    if m.symmetric:
        minimum = None
    elif offset is not None:
        minimum = offset.float() - (0 if m.zero is None else m.zero.float() * scale)
    else:
        minimum = -m.zero.float() * scale
    if strict_scales and not all(_exact_fp16(t) for t in (scale, minimum) if t is not None):
        raise ValueError(f"{fmt.upper()} stores scales{'' if m.symmetric else ' and minima'} "
                         f"as fp16 and this layer's are not exact in fp16: quantize with "
                         f"scale_dtype=torch.float16 (or pass strict_scales=False to round them)")
    codes = m.codes.to(torch.int16)
    if fmt == "q4_0" and (int(codes.min()) < -8 or int(codes.max()) > 7):
        raise ValueError(f"Q4_0 codes lie in -8..7; got {int(codes.min())}..{int(codes.max())}")
    codes = codes.to(torch.int8) if m.symmetric else codes.to(torch.uint8)
    return BlockQuantized(fmt, codes, scale.half(),
                          None if minimum is None else minimum.half())


def _gguf_tensor(name: str, t: torch.Tensor, mod, fmt: str, embed_fmt: str,
                 strict_scales: bool):
    """(GGUF name, numpy data, raw type or None) for one course tensor."""
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from course_lib.gguf_model import QUANTIZERS, BlockQuantized
    gname = _gguf_name(name)
    if t.dim() == 1:                                                     # norms: F32
        return gname, t.detach().float().numpy().copy(), None
    kind = embed_fmt if gname in ("token_embd.weight", "output.weight") else fmt
    if isinstance(mod, GroupQuantLinear):
        if kind == "f16":
            value = mod.dequantized()
        else:
            value = block_weights(mod, kind, strict_scales)
    else:
        value = t.detach().float()
        if kind != "f16":
            value = QUANTIZERS[kind](value)
    return gname, value, kind


def _f16_weights(value: torch.Tensor, name: str):
    """A weight (out, in) as F16 data, refusing one whose nonzero blocks of 32 weights (whole
    rows when the width is not a multiple of 32) would all round to 0 in fp16: below fp16's
    smallest step, 6e-08, the weights would be lost without a word. (Values past fp16's
    range, which become inf, are refused by gguf_model.write_gguf.)"""
    h = value.half()
    if bool(((value != 0) & (h == 0)).any()):
        per = 32 if value.shape[-1] % 32 == 0 else value.shape[-1]
        v, hb = value.reshape(-1, per), h.reshape(-1, per)
        lost = (v != 0).any(1) & (hb == 0).all(1)
        if bool(lost.any()):
            i = int(lost.nonzero()[0])
            row = i * per // value.shape[-1]
            raise ValueError(f"{name}: {int(lost.sum())} block(s) of {per} weights are nonzero "
                             f"but all round to 0 in fp16 (the first: row {row}, "
                             f"largest |w| {float(v[i].abs().max()):.3g}; fp16's smallest step is "
                             f"6e-08): an F16 file would store zeros. Scale the weights up, or "
                             f"check where values this small come from")
    return h.numpy()


class _Fields:
    """Metadata entries shaped like ``gguf.GGUFReader`` for ``config_from_gguf``."""
    class _F:
        def __init__(self, v):
            self.v = v

        def contents(self):
            return self.v

    def __init__(self, entries):
        self.fields = {k: self._F(v) for k, _, v, _ in entries}
        self.tensors = []


def _gguf_metadata(source, cfg) -> list:
    """The source file's metadata (tokenizer included) as (key, type, value, item type),
    checked against the model: same architecture, same shapes."""
    from course_lib.gguf_model import config_from_gguf, read_metadata
    if source is None:
        from course_lib import smollm
        source = smollm.gguf_path()
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source must be the path of the GGUF file the model came from; got "
                        f"{type(source).__name__}")
    entries = read_metadata(source)
    src_cfg = config_from_gguf(_Fields(entries))          # refuses another architecture
    src_arch = next(v for k, _, v, _ in entries if k == "general.architecture")
    if src_arch != gguf_architecture_of(cfg):
        raise ValueError(f"the source GGUF {Path(source).name} is a {src_arch!r} model but this "
                         f"model is written as {gguf_architecture_of(cfg)!r}; pass a GGUF of the "
                         f"same architecture, or tokenizer= the model's folder")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "intermediate_size", "vocab_size"):
        if getattr(src_cfg, key) != getattr(cfg, key):
            raise ValueError(f"the source GGUF {Path(source).name} describes another model "
                             f"({key} {getattr(src_cfg, key)}, the model has "
                             f"{getattr(cfg, key)}): pass the GGUF the model came from")
    return entries


def gguf_architecture_of(cfg) -> str:
    """The GGUF architecture llama.cpp's converter writes for a course config
    (conversion/llama.py and qwen.py, llama-cpp-python 0.3.36): "qwen3" with q/k norms
    (Qwen3ForCausalLM), "qwen2" with q/k/v biases (Qwen2ForCausalLM), else "llama" (Llama,
    Mistral, SmolLM, TinyLlama: LlamaForCausalLM and MistralForCausalLM)."""
    if cfg.qk_norm:
        return "qwen3"
    if cfg.qkv_bias:
        return "qwen2"
    return "llama"


def gguf_fields(cfg, tokenizer=None, source=None, stacklevel: int = 2) -> list:
    """A GGUF file's metadata for a course config, as (key, value type, value, item type): the
    header :func:`export_gguf` writes and :mod:`course_lib.stream_gguf` streams (lesson 17).

    With ``tokenizer`` (the model's folder or its tokenizer.json): the hyper-parameters of
    ``cfg`` under the architecture's own key names (:func:`_model_fields`) and the tokenizer
    built from that file (:func:`tokenizer_fields`); otherwise copied from ``source`` (default:
    SmolLM2's packaged GGUF), checked against ``cfg`` (:func:`_gguf_metadata`). A sliding window
    is not written (llama.cpp's converter does not write it): a warning says so."""
    import warnings
    if tokenizer is not None and source is not None:
        raise ValueError("pass source= (a GGUF whose metadata and tokenizer are copied) or "
                         "tokenizer= (the model's folder or tokenizer.json), not both")
    arch = gguf_architecture_of(cfg)
    if tokenizer is not None:
        fields = _model_fields(cfg, arch) + tokenizer_fields(tokenizer, cfg.vocab_size)
    else:
        fields = _gguf_metadata(source, cfg)
    if cfg.sliding_window is not None:
        warnings.warn(f"the model attends through a sliding window of {cfg.sliding_window} "
                      f"tokens; llama.cpp's {arch} architecture attends to every earlier token "
                      f"(its converter does not write the window), so the file computes what "
                      f"the model does on sequences up to {cfg.sliding_window} tokens only",
                      UserWarning, stacklevel=stacklevel)
    return fields


def rope_row_order(gguf_name: str, cfg):
    """The row order llama.cpp's converter stores ``gguf_name`` in, (out,) int64, or None when
    the rows keep Hugging Face's order: the llama architecture interleaves the two halves of
    each head of attn_q / attn_k (weights and biases) for its RoPE kernel
    (:func:`course_lib.gguf_model.permute_rope_rows`); qwen2 and qwen3 do not."""
    from course_lib.gguf_model import permute_rope_rows
    if gguf_architecture_of(cfg) != "llama" or not gguf_name.endswith(
            ("attn_q.weight", "attn_k.weight", "attn_q.bias", "attn_k.bias")):
        return None
    q = ".attn_q." in gguf_name
    heads = cfg.num_attention_heads if q else cfg.num_key_value_heads
    return permute_rope_rows(heads * cfg.head_dim, heads)


def _model_fields(cfg, arch: str) -> list:
    """The hyper-parameter entries llama.cpp's converter writes for ``cfg`` (TextModel.
    set_gguf_parameters in conversion/base.py; LlamaModel adds the vocabulary size and the
    RoPE dimension count), as (key, value type, value, item type)."""
    from gguf import GGUFValueType as V
    a = f"{arch}."
    u32 = [("block_count", cfg.num_hidden_layers), ("context_length", cfg.max_position_embeddings),
           ("embedding_length", cfg.hidden_size), ("feed_forward_length", cfg.intermediate_size),
           ("attention.head_count", cfg.num_attention_heads),
           ("attention.head_count_kv", cfg.num_key_value_heads),
           ("attention.key_length", cfg.head_dim), ("attention.value_length", cfg.head_dim)]
    if arch == "llama":
        u32 += [("vocab_size", cfg.vocab_size), ("rope.dimension_count", cfg.head_dim)]
    out = [("general.architecture", int(V.STRING), arch, None)]
    out += [(a + k, int(V.UINT32), int(v), None) for k, v in u32]
    out += [(a + "rope.freq_base", int(V.FLOAT32), float(cfg.rope_theta), None),
            (a + "attention.layer_norm_rms_epsilon", int(V.FLOAT32), float(cfg.rms_norm_eps),
             None)]
    return out


#: llama.cpp's converter names the pre-tokenizer (``tokenizer.ggml.pre``) from a hash of the
#: ids its tokenizer gives this text (conversion/base.py, ``get_vocab_base_pre``,
#: llama-cpp-python 0.3.36): the same text, and the hashes of the tokenizers of the models the
#: course loads, with the model each was computed from.
PRE_CHECK_TEXT = ('\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ '
                  '(multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 '
                  '33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ '
                  '------======= нещо на Български \'\'\'\'\'\'```````""""......!!!!!!?????? '
                  'I\'ve been \'told he\'s there, \'RE you sure? \'M not sure I\'ll make it, '
                  '\'D you like some tea? We\'Ve a\'lL')
KNOWN_PRE = {   # hash -> (tokenizer.ggml.pre, the model it was computed from; base.py line)
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5":
        ("llama-bpe", "meta-llama/Meta-Llama-3-8B; line 1714"),
    "c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d":
        ("smaug-bpe", "abacusai/Smaug-Llama-3-70B-Instruct; line 1783"),
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249":
        ("smollm", "HuggingFaceTB/SmolLM-135M; line 1807"),
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea":
        ("qwen2", "Qwen/Qwen1.5-7B; line 1759"),
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c":
        ("qwen2", "Qwen/Qwen3-Embedding-0.6B; line 1690"),
    "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5":
        ("deepseek-r1-qwen", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B; line 1837"),
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e":
        ("tekken", "mistralai/Mistral-Nemo-Base-2407; line 1804"),
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454":
        ("gpt-2", "openai-community/gpt2; line 1741"),
}
#: llama.cpp's token types (gguf-py constants.py, TokenType).
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5


def _has_byte_level(node) -> bool:
    if isinstance(node, dict):
        if node.get("type") == "ByteLevel":
            return True
        return any(_has_byte_level(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_byte_level(v) for v in node)
    return False


def tokenizer_pre(tokenizer_json) -> str:
    """``tokenizer.ggml.pre`` for a tokenizer.json, chosen as llama.cpp's converter chooses
    it: the hash of the ids of :data:`PRE_CHECK_TEXT` looked up in :data:`KNOWN_PRE`. An
    unknown tokenizer is refused (the converter refuses it too)."""
    import hashlib
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tokenizer_json))
    ids = tok.encode(PRE_CHECK_TEXT).ids
    digest = hashlib.sha256(str(ids).encode()).hexdigest()
    if digest not in KNOWN_PRE:
        known = sorted({v[0] for v in KNOWN_PRE.values()})
        raise ValueError(f"{tokenizer_json}: a pre-tokenizer llama.cpp's converter does not know "
                         f"(hash {digest[:16]}...; known here: {', '.join(known)}). llama.cpp "
                         f"would split text differently from this tokenizer: convert the model "
                         f"with llama.cpp's convert_hf_to_gguf.py and pass that file as source=")
    return KNOWN_PRE[digest][0]


def _special_id(value, vocab: dict):
    """A tokenizer_config.json special token (a string or {"content": ...}) -> its id."""
    if isinstance(value, dict):
        value = value.get("content")
    return vocab.get(value) if isinstance(value, str) else None


def tokenizer_fields(tokenizer, vocab_size: int) -> list:
    """The tokenizer entries of a GGUF file, built from a Hugging Face ``tokenizer.json``
    (``tokenizer``: the file, or the folder holding it and maybe ``tokenizer_config.json``), as
    llama.cpp's converter writes a byte-level BPE tokenizer (``_set_vocab_gpt2`` and
    gguf-py's ``SpecialVocab``): model "gpt2", the pre-tokenizer (:func:`tokenizer_pre`),
    ``vocab_size`` tokens (ids no token uses become "[PAD<id>]", UNUSED), their types (added
    special tokens CONTROL, other added tokens USER_DEFINED), the merges, BOS/EOS/padding/
    unknown ids and whether to add BOS, the chat template. Refused with the reason: a
    vocabulary larger than the embedding, a tokenizer that is not byte-level BPE."""
    from gguf import GGUFValueType as V
    if not isinstance(tokenizer, (str, os.PathLike)):
        raise TypeError(f"tokenizer must be the model's folder or its tokenizer.json (str or "
                        f"Path); got {type(tokenizer).__name__}")
    path = Path(tokenizer)
    path = path / "tokenizer.json" if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: the GGUF's tokenizer is built from the "
                                f"model's tokenizer.json (download it with the checkpoint)")
    try:
        j = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    model = j.get("model") or {}
    kind = model.get("type")
    if kind != "BPE":
        raise ValueError(f"{path} holds a {kind!r} tokenizer; the course writes llama.cpp's "
                         f"'gpt2' tokenizer, byte-level BPE only (Llama 3.x, SmolLM, Qwen, "
                         f"Mistral Nemo). Convert with llama.cpp's convert_hf_to_gguf.py and "
                         f"pass that file as source=")
    if not _has_byte_level(j.get("pre_tokenizer")):
        raise ValueError(f"{path} is a SentencePiece-style BPE (no ByteLevel pre-tokenizer: Llama "
                         f"2, TinyLlama, Mistral 7B v0.1), which llama.cpp stores as its 'llama' "
                         f"tokenizer from tokenizer.model; the course does not write it. Convert "
                         f"with llama.cpp's convert_hf_to_gguf.py and pass that file as source=")
    vocab = dict(model.get("vocab") or {})
    added = {t["id"]: t for t in j.get("added_tokens") or []}
    for i, t in added.items():
        vocab[t["content"]] = i
    top = max(vocab.values(), default=-1)
    if top >= vocab_size:
        raise ValueError(f"{path} has token ids up to {top} but the model's embedding has "
                         f"{vocab_size} rows: the tokenizer belongs to another model")
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
            continue
        tok = by_id[i]
        tokens.append(tok)
        if i in added:
            looks = tok.startswith("<|") and tok.endswith("|>")
            types.append(TOKEN_CONTROL if added[i].get("special") or looks
                         else TOKEN_USER_DEFINED)
        else:
            types.append(TOKEN_NORMAL)
    merges = model.get("merges") or []
    if merges and not isinstance(merges[0], str):      # [a, b] pairs (tokenizers >= 0.20)
        sp = chr(ord(" ") + 256)
        merges = [" ".join(part.replace(" ", sp) for part in pair) for pair in merges]
    out = [("tokenizer.ggml.model", int(V.STRING), "gpt2", None),
           ("tokenizer.ggml.pre", int(V.STRING), tokenizer_pre(path), None),
           ("tokenizer.ggml.tokens", int(V.ARRAY), tokens, int(V.STRING)),
           ("tokenizer.ggml.token_type", int(V.ARRAY), types, int(V.INT32)),
           ("tokenizer.ggml.merges", int(V.ARRAY), list(merges), int(V.STRING))]
    cfg_path = path.parent / "tokenizer_config.json"
    tc = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
    add_bos = tc.get("add_bos_token")
    if add_bos is None:                                 # what the post-processor adds
        pp = j.get("post_processor") or {}
        for proc in pp.get("processors", [pp]):
            if proc.get("type") == "TemplateProcessing":
                single = proc.get("single") or []
                add_bos = bool(single) and "SpecialToken" in single[0] and len(single) > 1
    for key, name in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                      ("pad_token", "padding")):
        i = _special_id(tc.get(key), vocab)
        if i is not None:
            out.append((f"tokenizer.ggml.{name}_token_id", int(V.UINT32), int(i), None))
    if add_bos is not None:
        out.append(("tokenizer.ggml.add_bos_token", int(V.BOOL), bool(add_bos), None))
    if isinstance(tc.get("chat_template"), str):
        out.append(("tokenizer.chat_template", int(V.STRING), tc["chat_template"], None))
    return out


def llama3_rope_factors(cfg):
    """The ``rope_freqs`` tensor llama.cpp's converter writes for Llama 3's RoPE scaling
    (conversion/llama.py, ``LlamaModel.generate_extra_tensors``): float32 (head_dim / 2,), or
    None when the config has no scaling."""
    import numpy as np
    from course_lib.gguf_model import _rope_factor_rule
    rs = cfg.rope_scaling
    if rs is None:
        return None
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    return _rope_factor_rule(inv, float(rs["factor"]), float(rs["low_freq_factor"]),
                             float(rs["high_freq_factor"]),
                             float(rs["original_max_position_embeddings"]))


def gguf_target(path, overwrite: bool, flag: str = "overwrite=True") -> Path:
    """The .gguf file to write (lessons 13, 17): a .gguf name, refused when it exists unless
    ``overwrite`` (``flag``: how the caller's user says so)."""
    from course_lib.smollm import file_target
    path = file_target(path, "path", "model.gguf")
    if path.suffix != ".gguf":
        raise ValueError(f"path must name a .gguf file (llama.cpp's format); got {str(path)!r}")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass {flag} to replace it, or choose another "
                              f"name")
    return path


def export_gguf(model: nn.Module, path: str | os.PathLike, fmt: str = "q4_0",
                source: str | os.PathLike | None = None, overwrite: bool = False,
                embed_fmt: str | None = None, strict_scales: bool = True,
                tokenizer: str | os.PathLike | None = None) -> Path:
    """Write a course LlamaModel as a GGUF file that llama.cpp runs (lessons 13, 17). Returns path.

    fmt: "f16", "q8_0", "q4_0" or "q4_1", the block layouts of llama.cpp bit for bit. A plain
    Linear is rounded with llama.cpp's own rule for ``fmt`` (the same bytes as its quantizer
    from the same weights); a method's :class:`GroupQuantLinear` (GPTQ, AWQ, RTN on the
    format's grid) goes in with its codes and scales unchanged (:func:`block_weights`).
    The token embeddings (also the tied output head) are Q8_0 in the quantized formats, as
    llama.cpp's quantizer chooses for SmolLM2, F16 in "f16" (``embed_fmt`` overrides); norms,
    biases and q/k norms F32.

    The architecture is the one llama.cpp's converter writes (:func:`gguf_architecture_of`:
    llama, qwen2 or qwen3, with its own key names); Llama 3's RoPE scaling goes in as the
    converter's ``rope_freqs`` tensor (:func:`llama3_rope_factors`), and the llama
    architecture's q/k rows (and biases) in llama.cpp's interleaved order. Metadata and the
    tokenizer: with ``tokenizer`` (the model's folder or its tokenizer.json), the hyper-
    parameters from the model's config and the tokenizer built from that file
    (:func:`tokenizer_fields`); otherwise copied from ``source`` (default: SmolLM2's packaged
    GGUF), whose architecture and shapes must match the model. A sliding window (Mistral,
    Qwen2 with it switched on) is not written, as the converter does not write it: llama.cpp's
    llama and qwen2 attend to every earlier token, the same as the model up to the window's
    length (a warning says so).

    An existing file is refused unless ``overwrite=True``; the file is written under a
    temporary name beside ``path`` and renamed at the end, so a failed or refused export
    leaves nothing behind and never a half-written file.
    """
    from gguf import GGMLQuantizationType as T
    from course_lib.gguf_model import write_gguf
    from course_lib.model import LlamaModel
    fmt = _check_gguf_format(fmt)
    embed_fmt = _check_gguf_format(embed_fmt, "embed_fmt") if embed_fmt is not None else \
        ("f16" if fmt == "f16" else "q8_0")
    if not isinstance(model, LlamaModel):
        raise TypeError(f"export_gguf writes a course LlamaModel (smollm.load(), "
                        f"own_model.load(...), then a method); got {type(model).__name__}")
    for name, v in (("overwrite", overwrite), ("strict_scales", strict_scales)):
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be True or False; got {v!r}")
    if tokenizer is not None and source is not None:
        raise ValueError("pass source= (a GGUF whose metadata and tokenizer are copied) or "
                         "tokenizer= (the model's folder or tokenizer.json), not both")
    path = gguf_target(path, overwrite)
    cfg = model.config
    fields = gguf_fields(cfg, tokenizer, source, stacklevel=3)
    mods = dict(model.named_modules())
    tensors = []                                  # (name, numpy array, raw type or None)
    factors = llama3_rope_factors(cfg)
    if factors is not None:
        tensors.append(("rope_freqs.weight", factors, None))
    for name, t in model.state_dict().items():
        mod_name, _, leaf = name.rpartition(".")
        if leaf not in ("weight", "bias") or \
                (name == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        try:
            gname, value, kind = _gguf_tensor(name, t, mods.get(mod_name), fmt, embed_fmt,
                                              strict_scales)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        order = rope_row_order(gname, cfg)
        if order is not None:
            value = value.rows(order) if hasattr(value, "rows") else value[order.numpy()] \
                if kind is None else value[order]
        if kind is None:
            tensors.append((gname, value, None))
        elif kind == "f16":
            tensors.append((gname, _f16_weights(value, gname), None))
        else:
            tensors.append((gname, value.to_bytes(), getattr(T, kind.upper())))
    return write_gguf(path, fields, GGUF_FORMATS[fmt], tensors, overwrite=overwrite)
