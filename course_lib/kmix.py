"""What a Q4_K_M file holds, and writing such a mix with the course's own quantizers (lesson 14).

"Q4_K_M" names a *mix*, not a format: llama.cpp's quantizer picks a block format per tensor
(``llama_tensor_get_type`` in its ``src/llama-quant.cpp``). :func:`llama_type` is that rule for a
Llama-architecture model and the three mixes the lesson opens (Q4_K_M, Q4_K_S, Q3_K_M), as far as
they differ for such a model:

- every 2-D weight starts at the mix's base type (Q4_K for Q4_K_*, Q3_K for Q3_K_M);
- ``attn_v`` and ``ffn_down`` get more bits in some layers: in Q4_K_M, Q6_K in the layers
  :func:`use_more_bits` picks (the first and last eighth, and every third layer between);
  in Q4_K_S, Q5_K in the first layers; in Q3_K_M, Q5_K in the first layers and Q4_K elsewhere
  (``attn_output`` too);
- the output head (SmolLM2 ties it to the token embedding, so the embedding plays that part)
  gets Q6_K, or Q8_0 when its rows are not a multiple of 256 wide (``src/llama-quant.cpp``
  lines 489-510, llama-cpp-python 0.3.36); an untied token embedding keeps the base type;
- a k-quant needs rows a multiple of 256 wide; otherwise the tensor *falls back* to a
  32-block format (Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0) and llama.cpp
  counts it in "N of M tensor(s) required fallback quantization".

:func:`where_the_bits_go` splits a mix's bits per weight by cause (base type, norms, upgrades,
head, fallbacks) on the shapes :func:`llama_shapes` builds; :func:`read_mix` reads a GGUF
file's tensor types and bytes; :func:`write_mix` writes a file
from the course's F16 GGUF with a type per tensor, quantized by :mod:`course_lib.kquants`
(optionally with an importance vector per tensor); from the same F16 file and the same types it
gives llama.cpp's bytes exactly.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from course_lib import kquants

#: llama.cpp's mixes this module knows: base type of the 2-D weights.
MIXES = {"q4_k_m": "q4_k", "q4_k_s": "q4_k", "q3_k_m": "q3_k"}
#: a k-quant's 32-block stand-in when the rows are not a multiple of 256 wide.
FALLBACK = {"q2_k": "q4_0", "q3_k": "q4_0", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}
#: llama.cpp's file-type numbers, written in ``general.file_type``.
FILE_TYPES = {"f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9,
              "q3_k_m": 12, "q4_k_s": 14, "q4_k_m": 15}
KINDS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _whole(v, name: str, minimum: int = 1) -> int:
    """v as an int: a whole number >= ``minimum`` (not a bool, not a string)."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        if isinstance(v, (float, np.floating)) and float(v).is_integer() and v >= minimum:
            return int(v)
        raise ValueError(f"{name} must be a whole number >= {minimum}; got {v!r}")
    return int(v)


def _layer(layer, n_layers, what: str = "layer") -> tuple[int, int]:
    n_layers = _whole(n_layers, "n_layers")
    layer = _whole(layer, what, minimum=0)
    if layer >= n_layers:
        raise ValueError(f"{what} {layer} is past the model: a model of n_layers={n_layers} has "
                         f"layers 0..{n_layers - 1}")
    return layer, n_layers


def _flag(v, name: str) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {v!r}")
    return bool(v)


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers that get more bits in the _M mixes: the first eighth,
    the last eighth, and every third layer in between."""
    layer, n_layers = _layer(layer, n_layers)
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or \
        (layer - n_layers // 8) % 3 == 2


@dataclass(frozen=True)
class Choice:
    """The type a mix wants for one tensor, the type stored, and whether it fell back."""
    wanted: str
    stored: str
    fallback: bool


def _check_mix(mix) -> str:
    if not isinstance(mix, str) or mix.lower() not in MIXES:
        raise ValueError(f"mix must be one of {sorted(MIXES)}; got {mix!r}")
    return mix.lower()


def llama_type(mix: str, name: str, cols: int, n_layers: int, tied: bool = True) -> Choice:
    """The block format llama.cpp's ``mix`` gives tensor ``name`` (a GGUF name such as
    ``blk.3.ffn_down.weight``) whose rows are ``cols`` wide, in a model of ``n_layers`` layers
    (Llama architecture). ``tied``: the model has no separate ``output.weight`` (the token
    embedding is the head)."""
    mix = _check_mix(mix)
    if not isinstance(name, str):
        raise TypeError(f"name must be a GGUF tensor name such as 'blk.3.ffn_down.weight'; got "
                        f"{type(name).__name__}")
    cols = _whole(cols, "cols")
    n_layers = _whole(n_layers, "n_layers")
    tied = _flag(tied, "tied")
    # llama.cpp 0.3.36, vendor/llama.cpp/src/llama-quant.cpp: the head (output.weight, or the
    # token embedding while no output.weight exists: has_tied_embeddings, lines 185 and 937)
    # gets Q6_K, Q8_0 when its rows are not a multiple of 256 (lines 488-510); an untied
    # token_embd.weight takes the TOKEN_EMBD branch (lines 525-540), which changes the type
    # only for the IQ/TQ mixes: it keeps default_type, the mix's base type (line 742), with
    # the usual fallback for its width (lines 395-440).
    head = name == "output.weight" or (tied and name == "token_embd.weight")
    if head:
        t = "q8_0" if cols % kquants.QK_K else "q6_k"
        return Choice(t, t, False)
    t = MIXES[mix]
    if name == "token_embd.weight":               # untied: the mix's base type, as any weight
        return _fit(t, cols)
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", name)
    if not m or m.group(2) not in KINDS:
        raise ValueError(f"{name!r} is not a Linear weight of a llama GGUF file (token_embd."
                         f"weight, output.weight, or blk.N.KIND.weight with KIND one of "
                         f"{', '.join(KINDS)})")
    layer, kind = int(m.group(1)), m.group(2)
    _layer(layer, n_layers, f"{name}: layer")
    if kind == "attn_v":
        if mix == "q4_k_m" and use_more_bits(layer, n_layers):
            t = "q6_k"
        elif mix == "q4_k_s" and layer < 4:
            t = "q5_k"
        elif mix == "q3_k_m":
            t = "q5_k" if layer < 2 else "q4_k"
    elif kind == "ffn_down":
        if mix == "q4_k_m" and use_more_bits(layer, n_layers):
            t = "q6_k"
        elif mix == "q4_k_s" and layer < n_layers // 8:
            t = "q5_k"
        elif mix == "q3_k_m":
            t = "q5_k" if layer < n_layers // 16 else "q4_k"
    elif kind == "attn_output" and mix == "q3_k_m":
        t = "q4_k"
    return _fit(t, cols)


def _fit(t: str, cols: int) -> Choice:
    """The wanted k-quant ``t``, or its 32-block fallback when rows of ``cols`` do not fit."""
    if cols % kquants.QK_K == 0:
        return Choice(t, t, False)
    stored = FALLBACK[t]
    return Choice(t, stored if cols % 32 == 0 else "f16", True)


def llama_shapes(n_layers: int, hidden: int, intermediate: int, kv: int, vocab: int,
                 tied: bool) -> dict[str, tuple]:
    """The tensor shapes of a Llama-architecture GGUF file, (out, in) for the 2-D weights and
    (n,) for the norms: ``kv`` is the width of attn_k and attn_v (KV heads x head size).
    SmolLM2-135M: ``llama_shapes(30, 576, 1536, 192, 49152, tied=True)`` (272 tensors)."""
    for label, v in (("n_layers", n_layers), ("hidden", hidden), ("intermediate", intermediate),
                     ("kv", kv), ("vocab", vocab)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{label} must be a whole number >= 1; got {v!r}")
    tied = _flag(tied, "tied")
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    if not tied:
        shapes["output.weight"] = (vocab, hidden)
    for i in range(n_layers):
        shapes.update({f"blk.{i}.attn_norm.weight": (hidden,), f"blk.{i}.ffn_norm.weight": (hidden,),
                       f"blk.{i}.attn_q.weight": (hidden, hidden),
                       f"blk.{i}.attn_k.weight": (kv, hidden), f"blk.{i}.attn_v.weight": (kv, hidden),
                       f"blk.{i}.attn_output.weight": (hidden, hidden),
                       f"blk.{i}.ffn_gate.weight": (intermediate, hidden),
                       f"blk.{i}.ffn_up.weight": (intermediate, hidden),
                       f"blk.{i}.ffn_down.weight": (hidden, intermediate)})
    return shapes


def where_the_bits_go(mix: str, shapes: dict, n_layers: int) -> dict[str, float]:
    """Bits per weight of ``mix`` on a model of these ``shapes`` (:func:`llama_shapes`; the
    file is tied when it has no ``output.weight``), split in the order the rule adds them:
    every weight in the base type, the norms in F32, the per-tensor upgrades of the mix, the
    head in its own type, and the fallbacks of rows that are not a multiple of 256. Bits per
    weight is llama.cpp's: all tensor bits over all weights. The parts sum to ``"total"``."""
    mix = _check_mix(mix)
    if MIXES[mix] not in kquants.BLOCKS:
        raise ValueError(f"where_the_bits_go needs a base type the course writes; {mix}'s is "
                         f"{MIXES[mix]}")
    if not isinstance(shapes, dict):
        raise TypeError(f"shapes must be a dict {{tensor name: shape}} (kmix.llama_shapes builds "
                        f"it); got {type(shapes).__name__}")
    if not shapes or "token_embd.weight" not in shapes:
        raise ValueError("shapes must hold a model's tensors, token_embd.weight among them "
                         "(kmix.llama_shapes builds them)")
    n_layers = _whole(n_layers, "n_layers")
    for name, s in shapes.items():
        _shape(name, s, dims=(1, 2))
    layers = {lk[0] for lk in map(layer_kind, shapes) if lk}
    if layers and max(layers) + 1 != n_layers:
        raise ValueError(f"n_layers={n_layers} does not match shapes, which hold layers "
                         f"0..{max(layers)}: pass n_layers={max(layers) + 1} (the rule picks "
                         f"the upgraded layers from the layer count)")
    tied = "output.weight" not in shapes
    base = kquants.bits_per_weight(MIXES[mix])
    n = sum(int(np.prod(s)) for s in shapes.values())
    bits = lambda t: kquants.bits_per_weight(t)
    parts = {"base": 0.0, "norms": 0.0, "upgrades": 0.0, "head": 0.0, "fallbacks": 0.0}
    for name, s in shapes.items():
        size = int(np.prod(s))
        parts["base"] += base * size
        if len(s) == 1:
            parts["norms"] += (32 - base) * size
            continue
        c = llama_type(mix, name, s[1], n_layers, tied)
        is_head = name == "output.weight" or (tied and name == "token_embd.weight")
        parts["head" if is_head else "upgrades"] += (bits(c.wanted) - base) * size
        stored = bits(c.stored) if c.stored != "f16" else 16.0
        parts["fallbacks"] += (stored - bits(c.wanted)) * size
    out = {k: v / n for k, v in parts.items()}
    out["total"] = sum(out.values())
    return out


def _path(p, name: str) -> Path:
    if not isinstance(p, (str, bytes, Path)) and not hasattr(p, "__fspath__"):
        raise TypeError(f"{name} must be the path of a GGUF file (str or Path); got "
                        f"{type(p).__name__}")
    return Path(p)


def plan(mix: str, src) -> dict[str, Choice]:
    """llama_type for every 2-D weight of the GGUF file ``src``: {GGUF name: Choice}.

    Tied or not: a file with its own ``output.weight`` (an untied head: TinyLlama, Llama 2,
    the course's bundled model) gets the head's type for it and the mix's base type for
    ``token_embd.weight``, as llama.cpp's quantizer does (see :func:`llama_type`)."""
    from course_lib.gguf_model import open_gguf
    mix = _check_mix(mix)
    reader = open_gguf(_path(src, "src"))
    names = {t.name for t in reader.tensors}
    if "llama.block_count" not in reader.fields:
        arch = reader.fields.get("general.architecture")
        raise ValueError(f"{src} is not a llama-architecture GGUF file (general.architecture "
                         f"{arch.contents() if arch is not None else 'missing'!r}, no "
                         f"llama.block_count): the rule here is llama.cpp's for Llama models")
    n_layers = int(reader.fields["llama.block_count"].contents())
    out = {}
    for t in reader.tensors:
        if len(t.shape) == 2:
            out[t.name] = llama_type(mix, t.name, int(t.shape[0]), n_layers,
                                     tied="output.weight" not in names)
    return out


# ----------------------------------------------------------------------------- reading a file
def read_mix(path) -> list[dict]:
    """Every tensor of a GGUF file: name, type (lower case), shape (out, in), weights, bytes."""
    from course_lib.gguf_model import open_gguf
    rows = []
    for t in open_gguf(_path(path, "path")).tensors:
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))
        rows.append({"name": t.name, "type": t.tensor_type.name.lower(), "shape": shape,
                     "weights": int(t.n_elements), "bytes": int(t.n_bytes)})
    return rows


def summary(rows: list[dict]) -> dict:
    """Bytes, MiB and bits per weight of a file's tensors (llama.cpp's "quant size ... BPW"),
    and the tensor count and bytes per type."""
    if not isinstance(rows, (list, tuple)) or not rows:
        empty = " (empty)" if isinstance(rows, (list, tuple)) else ""
        raise ValueError(f"rows must be a non-empty list of tensors, as kmix.read_mix returns; "
                         f"got {type(rows).__name__}{empty}")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ValueError(f"rows[{i}] must be a dict with 'type', 'bytes' and 'weights' (a row "
                             f"of kmix.read_mix); got {type(r).__name__}")
        missing = [k for k in ("type", "bytes", "weights") if k not in r]
        if missing:
            raise ValueError(f"rows[{i}] must be a dict with 'type', 'bytes' and 'weights' (a row "
                             f"of kmix.read_mix); missing {', '.join(missing)}")
        for k in ("bytes", "weights"):
            if isinstance(r[k], bool) or not isinstance(r[k], (int, np.integer)) or r[k] < 1:
                raise ValueError(f"rows[{i}][{k!r}] must be a whole number >= 1; got {r[k]!r}")
    total = sum(r["bytes"] for r in rows)
    n = sum(r["weights"] for r in rows)
    by_type = {}
    for r in rows:
        c, b = by_type.get(r["type"], (0, 0))
        by_type[r["type"]] = (c + 1, b + r["bytes"])
    return {"tensors": len(rows), "bytes": total, "mib": total / 2**20,
            "bits_per_weight": 8 * total / n, "by_type": by_type}


def layer_kind(name: str) -> tuple[int, str] | None:
    """(layer, kind) of ``blk.{i}.{kind}.weight``, or None for the other tensors."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a GGUF tensor name (str); got {type(name).__name__}")
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", name)
    return (int(m.group(1)), m.group(2)) if m else None


# ----------------------------------------------------------------------------- writing one
def _f16_weights(src):
    """(metadata entries, [(name, array)]) of the course's F16 GGUF file: the 2-D weights as
    float32 (rows in the file's order, fp16 values exactly), the rest as stored."""
    from course_lib.gguf_model import open_gguf, read_metadata
    reader = open_gguf(src)
    tensors = []
    for t in reader.tensors:
        kind = t.tensor_type.name
        if kind not in ("F16", "F32"):
            raise ValueError(f"{Path(src).name}: tensor {t.name} is {kind}; write_mix starts "
                             f"from an F16 file (export_gguf(model, path, 'f16')): quantizing "
                             f"an already-quantized tensor would round it twice")
        tensors.append((t.name, np.asarray(t.data)))
    return read_metadata(src), tensors


def file_bytes(types: dict, shapes: dict) -> int:
    """Bytes of the tensors of a mix: {name: format} with {name: (out, in)} (a tensor that
    ``types`` leaves out counts as F16)."""
    for label, v in (("types", types), ("shapes", shapes)):
        if not isinstance(v, dict):
            raise TypeError(f"{label} must be a dict keyed by tensor name; got {type(v).__name__}")
    extra = sorted(set(types) - set(shapes))
    if extra:
        raise ValueError(f"types names {extra[0]!r}, which shapes does not hold: give its shape "
                         f"or drop it")
    total = 0
    for name, shape in shapes.items():
        out, cols = _shape(name, shape, dims=(2,))
        t = types.get(name, "f16")
        if t == "f16":
            total += out * cols * 2
            continue
        try:
            total += out * kquants.row_bytes(t, cols)
        except ValueError as e:
            raise ValueError(f"types[{name!r}]: {e}") from None
    return total


def _shape(name, s, dims=(2,)) -> tuple:
    """A shape of whole numbers >= 1 with len in ``dims``, or a ValueError naming the tensor."""
    ok = isinstance(s, (tuple, list)) and len(s) in dims and all(
        not isinstance(v, bool) and isinstance(v, (int, np.integer)) and v >= 1 for v in s)
    if not ok:
        want = " or ".join(f"{d}-D" for d in dims)
        raise ValueError(f"the shape of {name!r} must be a {want} tuple of whole numbers >= 1 "
                         f"((out, in) for a weight); got {s!r}")
    return tuple(int(v) for v in s)


def check_imatrices(imatrix: dict | None, shapes: dict) -> None:
    """Each importance vector of ``imatrix`` ({GGUF name: (in,)}) names a 2-D weight of
    ``shapes`` ({GGUF name: shape}) and fits its width (lessons 14, 17); ValueError otherwise."""
    for name, v in (imatrix or {}).items():
        if name not in shapes:
            raise ValueError(f"imatrix[{name!r}]: the file has no tensor {name!r}")
        if len(shapes[name]) != 2:
            raise ValueError(f"imatrix[{name!r}]: {name} is not a 2-D weight")
        try:
            kquants.check_imatrix(v, shapes[name][1])
        except ValueError as e:
            raise ValueError(f"imatrix[{name!r}]: {e}") from None


def write_mix(src, dst, types: dict, imatrix: dict | None = None, file_type: str = "q4_k_m",
              overwrite: bool = False, progress: bool = False) -> Path:
    """Write GGUF ``dst`` from the F16 GGUF ``src`` with the block format ``types[name]`` for
    each 2-D weight (GGUF names; any other 2-D weight stays F16, 1-D tensors stay F32).
    ``imatrix``: {GGUF name: importance vector (in,)} for the tensors that use one.
    ``file_type`` is what ``general.file_type`` says (a mix or a format). Written under a
    temporary name beside ``dst`` and renamed: nothing half-written (lesson 14)."""
    from gguf import GGMLQuantizationType as T

    from course_lib.gguf_model import write_gguf
    from course_lib.smollm import file_target
    if not isinstance(types, dict):
        raise TypeError(f"types must be a dict {{GGUF tensor name: format}} (e.g. "
                        f"{{n: c.stored for n, c in kmix.plan(mix, src).items()}}); got "
                        f"{type(types).__name__}")
    if imatrix is not None and not isinstance(imatrix, dict):
        raise TypeError(f"imatrix must be None or a dict {{GGUF tensor name: importance vector}} "
                        f"(imatrix.gguf_names(imatrix.collect(...))); got {type(imatrix).__name__}")
    overwrite, progress = _flag(overwrite, "overwrite"), _flag(progress, "progress")
    if file_type not in FILE_TYPES:
        raise ValueError(f"file_type must be one of {sorted(FILE_TYPES)}; got {file_type!r}")
    dst = file_target(dst, "dst", "mix.gguf")
    if dst.suffix != ".gguf":
        raise ValueError(f"dst must name a .gguf file; got {str(dst)!r}")
    if dst.exists() and not overwrite:
        raise FileExistsError(f"{dst} exists; pass overwrite=True to replace it")
    if _path(src, "src").resolve() == dst.resolve():
        raise ValueError("dst must differ from src")
    meta, tensors = _f16_weights(src)
    names = {n for n, _ in tensors}
    unknown = sorted(set(types) - names) + sorted(set(imatrix or {}) - names)
    if unknown:
        raise ValueError(f"no tensor named {unknown[0]!r} in {Path(src).name}")
    shapes = {n: d.shape for n, d in tensors}
    for name, fmt in types.items():
        if fmt != "f16" and fmt not in kquants.FORMATS:
            raise ValueError(f"types[{name!r}] must be 'f16' or one of {kquants.FORMATS}; "
                             f"got {fmt!r}")
        if len(shapes[name]) != 2:
            raise ValueError(f"types[{name!r}]: {name} is a {len(shapes[name])}-D tensor, which "
                             f"stays F32; only 2-D weights take a block format")
        if fmt != "f16" and not kquants.fits(fmt, shapes[name][1]):
            raise ValueError(f"types[{name!r}] = {fmt!r}: "
                             f"{kquants._misfit(fmt, shapes[name][1])}")
    check_imatrices(imatrix, shapes)
    items = tensors
    if progress:
        from tqdm.auto import tqdm
        items = tqdm(tensors, desc="quantizing", unit="tensor")
    out = []
    for name, data in items:
        fmt = types.get(name, "f16") if data.ndim == 2 else None
        if fmt is None:
            out.append((name, np.ascontiguousarray(data, np.float32), None))
        elif fmt == "f16":
            out.append((name, np.ascontiguousarray(data, np.float16), None))
        else:
            qw = None if imatrix is None else imatrix.get(name)
            try:
                raw = kquants.quantize(data.astype(np.float32), fmt, qw)
            except ValueError as e:
                raise ValueError(f"{name} ({fmt}): {e}") from None
            out.append((name, raw, getattr(T, fmt.upper())))
    return write_gguf(dst, meta, FILE_TYPES[file_type], out, overwrite=overwrite)
