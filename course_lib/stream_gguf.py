"""Write a GGUF file one decoder layer at a time (lesson 17; the block formats: lessons 13, 14).

A GGUF file puts every tensor's name, shape, type and offset in its header, before the data.
All of them follow from the config and the chosen types, without reading a weight, so the
writer here works in two passes over nothing but numbers, then one pass over the weights::

    plan = [Entry(name, shape, kind) for every tensor]     # from the config: no weight read
    write the header: metadata, tokenizer, tensor infos    # export.gguf_fields, as export_gguf
    for each tensor in plan order:                         # token_embd, blk.0.*, blk.1.*, ...
        read it (one decoder layer at most), encode it, append its bytes (aligned)

Memory then holds one layer, never the model, as :func:`course_lib.stream.quantize` does.
``gguf.GGUFWriter`` (gguf 0.19.0, ``gguf_writer.py``) supports exactly this: ``add_tensor_info``
declares a tensor without its data, ``write_tensor_data`` appends one tensor's bytes, padded to
the 32-byte alignment, in the declared order. The file is written under a temporary name beside
the target and renamed at the end: an error or a full disk leaves nothing half-written.

Two entry points:

- :func:`from_packed`: the folder ``python -m course_lib.quantize_own`` writes (a
  compressed-tensors pack-quantized checkpoint, :func:`course_lib.stream.quantize`) to GGUF,
  bit-exact: a symmetric W4 group of ``g`` inputs is ``g / 32`` Q4_0 blocks sharing the
  group's scale (Q4_0 decodes ``(nibble - 8) * d``, compressed-tensors ``(u - 8) * scale``:
  the same codes, the same scale), W8 the same in Q8_0 (``q * d``). A bf16 scale is exact in
  fp16 from 2**-17 up to 65504 (bf16 keeps 8 significant bits, fp16 11; below 2**-14 fp16 is
  subnormal, with steps of 2**-24); each scale is checked, and a group size that is not a
  multiple of 32 is refused: GGUF has no block format for it.
- :func:`from_checkpoint`: any checkpoint :func:`course_lib.own_model.open_checkpoint` opens,
  each 2-D weight rounded to the format ``types`` names for it by :func:`course_lib.kquants.
  quantize` (llama.cpp's rounding, with an importance vector when given): what a k-quant mix
  planned from measured sensitivity writes.

The metadata, the tokenizer, the tensor names and llama's RoPE row order are
:mod:`course_lib.export`'s (:func:`~course_lib.export.gguf_fields`,
:func:`~course_lib.export.rope_row_order`), the ones :func:`~course_lib.export.export_gguf`
writes for a model in memory.
"""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from course_lib import export, kmix, kquants, own_model

#: llama.cpp's file-type numbers (``general.file_type``), include/llama.h lines 118-150 of
#: llama-cpp-python 0.3.36's llama.cpp (LLAMA_FTYPE_ALL_F32 = 0 ... LLAMA_FTYPE_MOSTLY_BF16 =
#: 32); a k-quant is named by its _M mix (Q4_K_M = 15 ...), as llama-quantize names such files.
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9,
              "q2_k": 10, "q3_k": 12, "q4_k": 15, "q5_k": 17, "q6_k": 18, "bf16": 32}
#: Unquantized formats a 2-D weight may be written in.
FLOAT_KINDS = ("f32", "f16", "bf16")
#: How :func:`from_packed` writes the tensors the folder keeps unquantized (embedding, head).
REST = ("stored", "llama")
#: Bytes of one value of each unquantized format.
_FLOAT_BYTES = {"f32": 4, "f16": 2, "bf16": 2}


# ----------------------------------------------------------------------------- the plan
@dataclass
class Entry:
    """One tensor of the file: its GGUF name, shape (out, in) or (n,), and format ("f32",
    "f16", "bf16", or a block format of :data:`course_lib.kquants.FORMATS`)."""
    name: str
    shape: tuple
    kind: str

    @property
    def nbytes(self) -> int:
        if self.kind in _FLOAT_BYTES:
            return int(np.prod(self.shape)) * _FLOAT_BYTES[self.kind]
        return self.shape[0] * kquants.row_bytes(self.kind, self.shape[1])


def _check_kind(name: str, kind, shape: tuple) -> str:
    """A format for tensor ``name`` of ``shape``, or a ValueError saying what fits."""
    formats = FLOAT_KINDS + kquants.FORMATS
    if not isinstance(kind, str) or kind.lower() not in formats:
        raise ValueError(f"types[{name!r}] must be one of {', '.join(formats)}; got {kind!r}")
    kind = kind.lower()
    if len(shape) == 1 and kind != "f32":
        raise ValueError(f"types[{name!r}] = {kind!r}: {name} is a 1-D tensor (a norm or a "
                         f"bias), which llama.cpp keeps in F32")
    if kind in FLOAT_KINDS:
        return kind
    if len(shape) != 2:
        raise ValueError(f"types[{name!r}] = {kind!r}: {name} is a {len(shape)}-D tensor, which "
                         f"llama.cpp keeps in F32; only 2-D weights take a block format")
    if not kquants.fits(kind, shape[1]):
        raise ValueError(f"types[{name!r}] = {kind!r}: {kquants._misfit(kind, shape[1])}. "
                         f"Nothing is changed silently: choose a format that fits")
    return kind


def _gguf_shapes(cfg, hf_shapes: dict[str, tuple]) -> list[tuple[str, str, tuple]]:
    """(GGUF name, checkpoint name, shape) of every tensor in file order: the embedding, each
    layer's tensors, the final norm, an untied head (as :func:`export.export_gguf` orders
    them). ``hf_shapes``: checkpoint name -> shape."""
    names = sorted(hf_shapes)
    outer = ["model.embed_tokens.weight"]
    layers = [[k for k in names if k.startswith(f"model.layers.{i}.")]
              for i in range(cfg.num_hidden_layers)]
    tail = ["model.norm.weight"] + ([] if cfg.tie_word_embeddings else ["lm_head.weight"])
    out = []
    for k in outer + [k for layer in layers for k in layer] + tail:
        if k not in hf_shapes:
            raise ValueError(f"the checkpoint has no tensor {k!r}")
        out.append((export._gguf_name(k), k, tuple(int(s) for s in hf_shapes[k])))
    return out


@dataclass
class GGUFReport:
    """What a streamed GGUF write did: ``path``, ``types`` (GGUF name -> format, every tensor),
    ``rest`` (how the unquantized tensors were written), ``bytes_written`` (the file),
    ``seconds``, ``peak_rss_bytes`` (the process's peak, :func:`course_lib.stream.
    peak_rss_bytes`)."""
    path: Path
    types: dict[str, str]
    rest: str
    bytes_written: int = 0
    seconds: float = 0.0
    peak_rss_bytes: int | None = None

    def counts(self) -> dict[str, int]:
        """Format -> how many tensors use it."""
        out: dict[str, int] = {}
        for k in self.types.values():
            out[k] = out.get(k, 0) + 1
        return dict(sorted(out.items()))

    def table(self) -> str:
        from course_lib import hardware
        kinds = ", ".join(f"{k.upper()} x{n}" for k, n in self.counts().items())
        rss = "unknown" if self.peak_rss_bytes is None else \
            f"{self.peak_rss_bytes / hardware.GB:.3f} GB"
        rows = [("GGUF file", str(self.path)),
                ("size", f"{self.bytes_written / hardware.GB:.3f} GB"),
                ("tensor formats", kinds),
                ("embedding and head", self.rest),
                ("seconds", f"{self.seconds:.1f}"),
                ("peak resident memory", rss)]
        w = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)

    __str__ = table


# ----------------------------------------------------------------------------- the writer
def _target(path, overwrite: bool) -> Path:
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be True or False; got {overwrite!r}")
    path = export.gguf_target(path, overwrite, "overwrite=True (--overwrite)")
    return path.expanduser().absolute()


def _check_space(path: Path, need: int) -> None:
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    free = shutil.disk_usage(parent).free
    if free < need * 1.02 + 2 ** 20:
        raise OSError(errno.ENOSPC, f"the GGUF file needs {need / 2 ** 30:.2f} GiB but the disk "
                                    f"holding {parent} has {free / 2 ** 30:.2f} GiB free; free "
                                    f"space or write the file to another disk")


def _encode(entry: Entry, value) -> np.ndarray:
    """A tensor's bytes in ``entry.kind``: ``value`` a float tensor (encoded here), or the
    block bytes already made (uint8 (rows, row bytes))."""
    if isinstance(value, np.ndarray) and value.dtype == np.uint8:
        data = value
    elif entry.kind == "f32":
        data = value.detach().float().contiguous().numpy()
    elif entry.kind == "f16":
        data = export._f16_weights(value.detach().float(), entry.name)
    elif entry.kind == "bf16":
        b = value.detach().to(torch.bfloat16).contiguous()
        data = b.view(torch.int16).numpy().view(np.uint8).reshape(b.shape[0], -1)
    else:
        data = quantize_rows(value, entry.kind, None, entry.name)
    if entry.kind == "f32" or entry.kind == "f16":
        if not np.isfinite(data).all():
            raise ValueError(f"{entry.name}: NaN or inf (a value past fp16's range becomes inf "
                             f"in F16): refusing to write a broken weight")
    if data.nbytes != entry.nbytes:
        raise ValueError(f"{entry.name}: {data.nbytes} bytes, but the header says "
                         f"{entry.nbytes} ({entry.kind}, shape {entry.shape})")
    return data


def quantize_rows(w: torch.Tensor, kind: str, imatrix=None, name: str = "") -> np.ndarray:
    """:func:`course_lib.kquants.quantize` of a weight (out, in), a slice of rows at a time
    (rows are quantized independently, so the bytes are the same): its float32 temporaries
    then stay near 16 MiB even for a 49152-row embedding."""
    w = w.detach().float()
    step = max(1, 2 ** 22 // w.shape[1])                     # about 4 M weights a slice
    try:
        return np.concatenate([kquants.quantize(w[i:i + step], kind, imatrix)
                               for i in range(0, w.shape[0], step)])
    except ValueError as e:
        raise ValueError(f"{name} ({kind}): {e}") from None


class _Writer:
    """The header written from the plan, then each tensor's bytes in plan order
    (``write(name, value)``), into a temporary file renamed to ``path`` by ``finish()``.
    Used as a context manager: any error removes the temporary file."""

    def __init__(self, path: Path, fields: list, file_type: int, plan: list[Entry]):
        self.path, self.plan, self.next = path, plan, 0
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
        os.close(fd)
        self.tmp = Path(tmp)
        mask = os.umask(0)                 # mkstemp makes the file 0600: give it the usual
        os.umask(mask)                     # permissions of a new file (0666 less the umask)
        os.chmod(tmp, 0o666 & ~mask)
        self.w = None
        try:
            self._header(fields, file_type, plan)
        except BaseException as e:
            self._cleanup(e)
            raise

    def _header(self, fields: list, file_type: int, plan: list[Entry]) -> None:
        from gguf import GGMLQuantizationType as T, GGUFValueType, GGUFWriter
        arch = next(v for k, _, v, _ in fields if k == "general.architecture")
        self.w = GGUFWriter(str(self.tmp), arch)
        for key, vtype, val, sub in fields:               # as gguf_model.write_gguf copies them
            if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
                continue
            self.w.add_key_value(key, val, GGUFValueType(vtype),
                                 sub_type=None if sub is None else GGUFValueType(sub))
        self.w.add_file_type(file_type)
        for e in plan:
            if e.kind in ("f32", "f16"):
                self.w.add_tensor_info(e.name, e.shape, np.dtype(np.float32 if e.kind == "f32"
                                                                 else np.float16), e.nbytes)
            else:                                         # raw bytes: (rows, bytes per row)
                rows = int(np.prod(e.shape[:-1])) if len(e.shape) > 1 else 1
                self.w.add_tensor_info(e.name, (rows, e.nbytes // rows), np.dtype(np.uint8),
                                       e.nbytes, raw_dtype=getattr(T, e.kind.upper()))
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_ti_data_to_file()

    def __enter__(self):
        return self

    def write(self, name: str, value) -> None:
        if self.next >= len(self.plan) or self.plan[self.next].name != name:
            want = self.plan[self.next].name if self.next < len(self.plan) else "nothing more"
            raise RuntimeError(f"tensor {name!r} written out of order; the header says {want}")
        data = _encode(self.plan[self.next], value)
        self.w.write_tensor_data(np.ascontiguousarray(data))
        self.next += 1

    def finish(self) -> Path:
        if self.next != len(self.plan):
            raise RuntimeError(f"{len(self.plan) - self.next} tensors of the header were not "
                               f"written (the next: {self.plan[self.next].name})")
        self.w.close()
        os.replace(self.tmp, self.path)
        return self.path

    def _cleanup(self, exc) -> None:
        """Close and remove the temporary file; a full disk is said as such."""
        if self.w is not None:
            self.w.close()
        if self.tmp.exists():
            self.tmp.unlink()
        if exc is not None and _disk_full(exc):
            raise OSError(errno.ENOSPC, f"the disk holding {self.path.parent} filled up while "
                                        f"writing {self.path.name}; nothing was left behind (the "
                                        f"temporary file was removed). Free space or write to "
                                        f"another disk") from exc

    def __exit__(self, kind, exc, tb):
        self._cleanup(exc)
        return False


def _disk_full(e: BaseException) -> bool:
    return getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e)


def _bar(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, unit="layer")


def _flag(v, name: str) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be True or False; got {v!r}")
    return v


# ----------------------------------------------------------------------------- a packed folder
def _packed(folder):
    """The command's output folder, checked: (stream._Packed reader, group size). A folder
    that is not a symmetric int4/int8 pack-quantized checkpoint is refused."""
    from course_lib import stream
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be the quantized folder (str or Path); got "
                        f"{type(folder).__name__}")
    folder = Path(folder).expanduser()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} holds no config.json: pass the folder that "
                                f"`python -m course_lib.quantize_own ... --out DIR` wrote")
    raw = own_model.read_raw_config(folder)
    qc = raw.get("quantization_config")
    if not qc:
        raise ValueError(f"{folder} is not quantized (its config.json has no "
                         f"quantization_config): from_packed converts the folder "
                         f"course_lib.quantize_own writes; write an unquantized checkpoint "
                         f"with from_checkpoint(folder, path, types)")
    reader = stream._Packed(folder, raw)                    # refuses other formats, g_idx, zp
    w = list(qc["config_groups"].values())[0]["weights"]
    g = w.get("group_size")
    if w.get("strategy") != "group" or not isinstance(g, int):
        raise ValueError(f"{folder}: weights quantized with strategy {w.get('strategy')!r}; "
                         f"from_packed takes group-wise scales (strategy 'group')")
    return reader, g


def check_packed_settings(bits: int, group_size: int) -> None:
    """Refuse, before any work, settings GGUF cannot hold exactly: Q4_0 / Q8_0 blocks are 32
    weights with one fp16 scale, so a group must be a whole number of blocks."""
    if bits not in (4, 8):
        raise ValueError(f"GGUF holds the command's symmetric {bits}-bit codes only as Q4_0 "
                         f"(4 bits) or Q8_0 (8 bits); got bits={bits}")
    if group_size % 32:
        raise ValueError(f"group_size {group_size} is not a multiple of 32: llama.cpp's "
                         f"{'Q4_0' if bits == 4 else 'Q8_0'} blocks hold 32 weights with one "
                         f"scale, so a group of {group_size} cannot be written exactly. Use "
                         f"--group-size 32, 64, 128 ... for a GGUF file")


def preflight(source, bits: int | None, group_size: int | None, path,
              overwrite: bool = False) -> Path:
    """What ``quantize_own --gguf`` checks before the long part: the settings GGUF holds
    exactly (:func:`check_packed_settings`), the target (a .gguf name, not an existing file
    unless ``overwrite``), and a tokenizer llama.cpp's GGUF can carry (the checkpoint's
    tokenizer.json, byte-level BPE: :func:`course_lib.export.tokenizer_fields`). Returns the
    target path. ``bits`` None (``--method kmix``, :func:`from_checkpoint`): no packed
    settings to check, and a GGUF source's own tokenizer is copied."""
    if bits is not None:
        check_packed_settings(bits, group_size)
    path = _target(path, overwrite)
    ck = source if isinstance(source, own_model.Checkpoint) else \
        own_model.open_checkpoint(source)
    if bits is None and ck.format == "gguf":
        return path
    if ck.tokenizer is None or Path(ck.tokenizer).suffix != ".json":
        raise ValueError(f"{ck.folder} has no tokenizer.json, which the GGUF's tokenizer is "
                         f"built from: drop --gguf, or add the model's tokenizer.json")
    try:
        export.tokenizer_fields(ck.tokenizer, ck.config.vocab_size)
    except ValueError as e:
        raise ValueError(f"--gguf: the tokenizer cannot be written into a GGUF file: {e}") \
            from None
    return path


def _scale_fp16(scale: torch.Tensor, name: str) -> torch.Tensor:
    """The stored scales (out, G) as fp16, refused where fp16 does not hold them exactly."""
    s = scale.float()
    h = s.half()
    bad = ~(h.float() == s) | ~torch.isfinite(h)
    if bool(bad.any()):
        i = tuple(int(v) for v in bad.nonzero()[0])
        raise ValueError(f"{name}: {int(bad.sum())} scale(s) are not exact in fp16 (the first, "
                         f"at {i}: {float(s[i]):.6g}; fp16 holds a bf16 scale exactly from "
                         f"2**-17 = 7.6e-06 up to 65504). The GGUF would compute with rounded "
                         f"scales: write it with from_checkpoint (llama.cpp's own rounding) "
                         f"instead")
    return h


def _blocks(codes_u: torch.Tensor, scale: torch.Tensor, bits: int, name: str) -> np.ndarray:
    """Unsigned codes (out, in) and one scale per group (out, G) -> Q4_0 / Q8_0 bytes: each
    group of g inputs is g / 32 blocks with the group's scale (lesson 13's block layout)."""
    from course_lib.gguf_model import BLOCK, BlockQuantized
    rows, cols = codes_u.shape
    g = cols // scale.shape[1]
    d = _scale_fp16(scale, name).repeat_interleave(g // BLOCK, dim=1)        # (out, in/32)
    q = (codes_u - 2 ** (bits - 1)).to(torch.int8)                            # signed codes
    try:
        return BlockQuantized("q4_0" if bits == 4 else "q8_0", q, d, None).to_bytes()
    except ValueError as e:
        raise ValueError(f"{name}: {e} (llama.cpp's Q8_0 kernels take codes -127..127: "
                         f"quantize with grid='course')") from None


def _float_kind(t: torch.Tensor) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "f16"}.get(t.dtype, "f32")


def _rest_kind(rest: str, gname: str, shape: tuple, dtype_kind: str, bits: int, tied: bool
               ) -> str:
    """The format of an unquantized 2-D tensor of the folder (embedding, head).

    "stored": the folder's own dtype (BF16, F16 or F32), so the file computes exactly what the
    folder does. "llama": what llama-quantize chooses for a Q4_0 / Q8_0 file
    (src/llama-quant.cpp of llama-cpp-python 0.3.36, ``llama_tensor_get_type_impl`` lines
    488-511 and ``tensor_type_fallback`` lines 390-418): the output head, and a tied token
    embedding that plays its part, Q6_K (Q8_0 in a Q8_0 file, or when the rows are not a
    multiple of 256 wide); an untied token embedding the file's type."""
    if rest == "stored":
        return dtype_kind
    base = "q4_0" if bits == 4 else "q8_0"
    if gname == "output.weight" or tied:
        return "q6_k" if base != "q8_0" and kquants.fits("q6_k", shape[1]) else "q8_0"
    return base


def from_packed(folder, path, rest: str = "stored", overwrite: bool = False,
                progress: bool = True) -> GGUFReport:
    """Write the command's quantized folder as a GGUF file llama.cpp runs, one decoder layer in
    memory at a time (lesson 17). Returns a :class:`GGUFReport`.

    folder: what ``python -m course_lib.quantize_own ... --out DIR`` (:func:`course_lib.stream.
    quantize`) wrote: symmetric W4 or W8, a scale per group of ``g`` inputs. Each quantized
    Linear goes in bit-exact: W4 as Q4_0, W8 as Q8_0, each group as ``g / 32`` blocks with the
    group's scale (g must be a multiple of 32, each scale exact in fp16: checked, refused
    otherwise). Norms and biases are F32 (exact). The embedding and an untied head, which the
    folder keeps unquantized, go in as ``rest`` says: "stored" (default) in the folder's own
    dtype (BF16 for the command's folders: llama.cpp runs BF16 tensors, and the file then
    computes exactly the folder's model), or "llama": as llama.cpp's quantizer chooses for a
    Q4_0 / Q8_0 file (Q6_K or Q8_0 for the head and a tied embedding, rounded by
    :func:`course_lib.kquants.quantize`; smaller, no longer the folder's values). The choice
    is recorded in the report (``rest``, ``types``).

    The metadata, tokenizer (the folder's tokenizer.json) and names are those of
    :func:`course_lib.export.export_gguf`. An existing ``path`` is refused unless
    ``overwrite``; the file is written under a temporary name and renamed at the end.
    """
    t0 = time.perf_counter()
    from course_lib import stream
    if rest not in REST:
        raise ValueError(f"rest must be one of {REST} (how the embedding and head are written); "
                         f"got {rest!r}")
    overwrite, progress = _flag(overwrite, "overwrite"), _flag(progress, "progress")
    reader, g = _packed(folder)
    path = _target(path, overwrite)
    cfg, bits = reader.config, reader.bits
    check_packed_settings(bits, g)
    fields = export.gguf_fields(cfg, tokenizer=reader.folder, stacklevel=3)
    # the shapes, from the safetensors headers and config (no tensor read)
    from safetensors import safe_open
    hf_shapes, dtypes = {}, {}
    by_file: dict[str, list[str]] = {}
    for k, f in reader.weight_map.items():
        by_file.setdefault(f, []).append(k)
    for f, ks in by_file.items():
        with safe_open(str(reader.folder / f), framework="pt") as h:
            for k in ks:
                hf_shapes[k], dtypes[k] = tuple(h.get_slice(k).get_shape()), \
                    h.get_slice(k).get_dtype()
    lin = own_model.linear_shapes(cfg)
    for k in list(hf_shapes):
        if k.endswith(".weight_packed"):
            base = k[:-len(".weight_packed")]
            hf_shapes[base + ".weight"] = lin[base.rsplit(".", 1)[1]]
            dtypes[base + ".weight"] = "PACKED"
        if k.endswith((".weight_packed", ".weight_scale", ".weight_shape")):
            del hf_shapes[k]
    stored = {"BF16": "bf16", "F16": "f16", "F32": "f32"}
    tied = cfg.tie_word_embeddings
    plan = []
    rope = export.llama3_rope_factors(cfg)
    if rope is not None:
        plan.append(Entry("rope_freqs.weight", tuple(rope.shape), "f32"))
    order = _gguf_shapes(cfg, hf_shapes)
    for gname, hname, shape in order:
        if len(shape) == 1:
            kind = "f32"
        elif dtypes[hname] == "PACKED":
            kind = "q4_0" if bits == 4 else "q8_0"
        else:
            kind = _rest_kind(rest, gname, shape, stored.get(dtypes[hname], "f32"), bits, tied)
        plan.append(Entry(gname, shape, kind))
    types = {e.name: e.kind for e in plan}
    _check_space(path, sum(e.nbytes for e in plan))
    file_type = FILE_TYPES["q4_0" if bits == 4 else "q8_0"]
    outer_kinds = ", ".join(sorted({types[n].upper() for n in ("token_embd.weight",
                                                               "output.weight") if n in types}))
    report = GGUFReport(path, types, f"as stored in the folder ({outer_kinds}): exact"
                        if rest == "stored" else
                        f"as llama-quantize chooses ({outer_kinds}): rounded")
    with _Writer(path, fields, file_type, plan) as w:
        if rope is not None:
            w.write("rope_freqs.weight", torch.from_numpy(rope))
        name = "model.embed_tokens.weight"
        t = stream._read(reader.folder, reader.weight_map, [name])[name]
        w.write("token_embd.weight", t)
        del t
        bar = _bar(cfg.num_hidden_layers, progress, f"GGUF Q{bits}_0 layers")
        for i in range(cfg.num_hidden_layers):
            prefix = f"model.layers.{i}."
            sd = stream._read(reader.folder, reader.weight_map,
                              [k for k in reader.weight_map if k.startswith(prefix)])
            for gname, hname, _ in order:
                if not hname.startswith(prefix):
                    continue
                if dtypes[hname] == "PACKED":
                    base = hname[:-len(".weight")]
                    rows, cols = (int(v) for v in sd[base + ".weight_shape"])
                    u = stream.unpack_int32(sd[base + ".weight_packed"], bits, 1, cols)
                    value = _blocks(u, sd[base + ".weight_scale"], bits, hname)
                else:
                    value = sd[hname]
                rows = export.rope_row_order(gname, cfg)
                if rows is not None:
                    value = value[rows.numpy()] if isinstance(value, np.ndarray) else value[rows]
                w.write(gname, value)
            del sd
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        outer = stream._read(reader.folder, reader.weight_map,
                             ["model.norm.weight"] + ([] if tied else ["lm_head.weight"]))
        w.write("output_norm.weight", outer["model.norm.weight"])
        if not tied:
            w.write("output.weight", outer["lm_head.weight"])
        del outer
        w.finish()
    return _finish(report, t0)


def _finish(report: GGUFReport, t0: float) -> GGUFReport:
    from course_lib import stream
    report.bytes_written = report.path.stat().st_size
    report.seconds = time.perf_counter() - t0
    report.peak_rss_bytes = stream.peak_rss_bytes()
    return report


# ----------------------------------------------------------------------------- any checkpoint
def from_checkpoint(source, path, types: dict, imatrix: dict | None = None,
                    file_type: str | None = None, overwrite: bool = False,
                    progress: bool = True, tokenizer=None) -> GGUFReport:
    """Write any checkpoint :func:`course_lib.own_model.open_checkpoint` opens (a Hugging Face
    folder, a GGUF file, the converted SmolLM2) as GGUF, each 2-D weight in the format
    ``types[gguf_name]`` names ("blk.3.attn_v.weight": "q4_k", ...), one decoder layer in
    memory at a time (lessons 14, 17). Returns a :class:`GGUFReport`.

    types: GGUF tensor name -> "f32", "f16", "bf16" or a block format of
    :data:`course_lib.kquants.FORMATS`, rounded by :func:`course_lib.kquants.quantize`
    (llama.cpp's bytes from the same float weights); a 2-D weight ``types`` leaves out is
    written F16 (as :func:`course_lib.kmix.write_mix` does), 1-D tensors F32. A name the model
    does not have, or a format the row width does not allow (a k-quant needs rows a multiple
    of 256 wide), is refused before anything is written: nothing is changed silently.
    imatrix: GGUF name -> importance vector (in,) for the tensors that use one.
    file_type: what ``general.file_type`` says (a key of :data:`FILE_TYPES`); default: the
    format holding the most decoder weights. tokenizer: the tokenizer.json (or its folder) to
    write; default the checkpoint's own (a GGUF source's metadata and tokenizer are copied,
    as :func:`course_lib.export.export_gguf` copies ``source``'s). The file is written under a
    temporary name and renamed at the end; an existing ``path`` is refused unless
    ``overwrite``.
    """
    t0 = time.perf_counter()
    overwrite, progress = _flag(overwrite, "overwrite"), _flag(progress, "progress")
    if not isinstance(types, dict):
        raise TypeError(f"types must be a dict {{GGUF tensor name: format}} such as "
                        f"{{'blk.0.attn_v.weight': 'q6_k'}}; got {type(types).__name__}")
    if imatrix is not None and not isinstance(imatrix, dict):
        raise TypeError(f"imatrix must be None or a dict {{GGUF tensor name: importance vector}};"
                        f" got {type(imatrix).__name__}")
    ck = source if isinstance(source, own_model.Checkpoint) else \
        own_model.open_checkpoint(source)
    cfg = ck.config
    path = _target(path, overwrite)
    gguf_source = None
    if tokenizer is None:
        if ck.format == "gguf":                 # a GGUF source: its metadata, tokenizer too
            gguf_source = ck.path
        elif ck.tokenizer is None or Path(ck.tokenizer).suffix != ".json":
            raise FileNotFoundError(f"{ck.folder} has no tokenizer.json to write into the GGUF; "
                                    f"pass tokenizer= the model's tokenizer.json")
        else:
            tokenizer = ck.tokenizer
    hf_shapes = {k: ck.shapes[k] for k in ck.weight_map}
    if tuple(hf_shapes.get("model.embed_tokens.weight", ())) != (cfg.vocab_size,
                                                                  cfg.hidden_size):
        hf_shapes["model.embed_tokens.weight"] = (cfg.vocab_size, cfg.hidden_size)
    order = _gguf_shapes(cfg, hf_shapes)
    shapes = {g: s for g, _, s in order}
    unknown = sorted(set(types) - set(shapes)) + sorted(set(imatrix or {}) - set(shapes))
    if unknown:
        raise ValueError(f"the model has no tensor {unknown[0]!r} (GGUF names such as "
                         f"'blk.0.attn_v.weight', 'token_embd.weight', 'output.weight')")
    plan = []
    rope = export.llama3_rope_factors(cfg)
    if rope is not None:
        plan.append(Entry("rope_freqs.weight", tuple(rope.shape), "f32"))
    for gname, _, shape in order:
        kind = _check_kind(gname, types.get(gname, "f16" if len(shape) == 2 else "f32"), shape)
        plan.append(Entry(gname, shape, kind))
    kmix.check_imatrices(imatrix, shapes)
    kinds = {e.name: e.kind for e in plan}
    if file_type is None:
        weight = {}
        for e in plan:
            if e.name.startswith("blk.") and len(e.shape) == 2:
                weight[e.kind] = weight.get(e.kind, 0) + int(np.prod(e.shape))
        file_type = max(weight, key=weight.get) if weight else "f16"
    if file_type not in FILE_TYPES:
        raise ValueError(f"file_type must be one of {sorted(FILE_TYPES)}; got {file_type!r}")
    fields = export.gguf_fields(cfg, tokenizer=tokenizer, source=gguf_source, stacklevel=3)
    _check_space(path, sum(e.nbytes for e in plan))
    report = GGUFReport(path, kinds, "as types says (" + ", ".join(sorted(
        {kinds[n].upper() for n in ("token_embd.weight", "output.weight") if n in kinds})) + ")")

    def put(w, gname, value):
        entry = w.plan[w.next]
        o = export.rope_row_order(gname, cfg)
        if o is not None:
            value = value[o]
        if entry.kind in kquants.FORMATS:
            qw = None if imatrix is None else imatrix.get(gname)
            value = quantize_rows(value, entry.kind, qw, gname)
        w.write(gname, value)

    with _Writer(path, fields, FILE_TYPES[file_type], plan) as w:
        if rope is not None:
            w.write("rope_freqs.weight", torch.from_numpy(rope))
        name = "model.embed_tokens.weight"
        put(w, "token_embd.weight", own_model._read(ck, [name], torch.float32)[name])
        bar = _bar(cfg.num_hidden_layers, progress, "GGUF layers")
        for i in range(cfg.num_hidden_layers):
            sd = own_model.layer_state(ck, i)
            prefix = f"model.layers.{i}."
            for gname, hname, _ in order:
                if hname.startswith(prefix):
                    put(w, gname, sd[hname[len(prefix):]])
            del sd
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        names = ["model.norm.weight"] + ([] if cfg.tie_word_embeddings else ["lm_head.weight"])
        outer = own_model._read(ck, names, torch.float32)
        put(w, "output_norm.weight", outer["model.norm.weight"])
        if not cfg.tie_word_embeddings:
            put(w, "output.weight", outer["lm_head.weight"])
        del outer
        w.finish()
    return _finish(report, t0)
