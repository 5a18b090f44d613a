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

import json
import shutil
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
        raise ValueError(f"pack-quantized checkpoints here hold 4- or 8-bit codes; got {bits!r}")
    if not isinstance(codes, torch.Tensor) or codes.dim() != 2 or codes.is_floating_point() \
            or codes.dtype == torch.bool or codes.numel() == 0:
        raise ValueError("codes must be a non-empty 2-D integer tensor (rows, cols) of unsigned "
                         "codes; got " + (f"{codes.dtype} of shape {tuple(codes.shape)}"
                                          if isinstance(codes, torch.Tensor) else type(codes).__name__))
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
                      strict_scales: bool = True) -> Path:
    """Write ``model`` (its Linears GroupQuantLinear from RTN / GPTQ / AWQ) as a compressed-tensors
    pack-quantized checkpoint in ``folder`` (lessons 06-07). Returns the folder.

    dtype: the checkpoint's dtype (scales and every unquantized tensor). strict_scales: refuse
    scales that are not exactly representable in ``dtype`` (the checkpoint would then compute
    with rounded scales, not the ones the method used); quantize with ``scale_dtype=dtype``.
    tokenizer_json: a tokenizer.json to copy; default: the byte-level one for a 256-token model.
    """
    from safetensors.torch import save_file
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
    folder.mkdir(parents=True, exist_ok=True)
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
    return folder


def vllm_command(folder: str | Path) -> str:
    """The command that serves the exported folder with vLLM on a GPU machine (lesson 06)."""
    if not isinstance(folder, (str, Path)):
        raise TypeError(f"folder must be the exported checkpoint's folder (str or Path); got "
                        f"{type(folder).__name__}")
    if Path(folder).is_file():
        raise NotADirectoryError(f"{folder} is a file; vLLM serves the exported *folder* "
                                 f"(config.json + model.safetensors)")
    return f"vllm serve {folder} --dtype bfloat16 --max-model-len 256"
