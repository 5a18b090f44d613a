"""Quantize your own checkpoint one decoder layer at a time (lesson 17, the capstone).

:mod:`course_lib.own_model` opens a Hugging Face folder and reads one decoder layer's tensors
without touching the others (``safetensors.safe_open`` reads lazily). This module runs the
course's methods on that stream, in the sequential scheme of GPTQ's reference code
(github.com/IST-DASLab/gptq at commit 4fe02ad, ``llama.py``, ``llama_sequential``: layer ``i``
is quantized, then run again on its inputs, and those outputs are layer ``i + 1``'s inputs)
and of llm-compressor's ``oneshot`` (0.14.0.1, ``llmcompressor/pipelines/sequential/
pipeline.py``, lines 61-67 and 162-175: each subgraph calibrated, then run once more to
"capture outputs of compressed modules" for the next when ``propagate_error`` is set). Both
hold the whole model in CPU memory and move one layer at a time to the GPU; here the other
layers stay on disk::

    x = embed(calibration ids)                   # (n, T, D): the embedding is read, then let go
    for i in range(num_hidden_layers):
        block = own_model.load_layer(folder, i)  # this layer's tensors only
        method(block, x, cos, sin)               # RTN, GPTQ or AWQ: the methods' own block steps
        write(block)                             # one shard per layer, as soon as it is done
        x = block(x)                             # the next layer's inputs, from QUANTIZED weights

Memory then holds one layer, its calibration activations and the method's state, never the
model. The bill (:func:`course_lib.own_model.bill`, ``path="layer"``) estimates that from the
config; ``tools/stream_1b.py`` measures it on a model of Llama-3.2-1B's shapes against the
whole-model path (``results/stream_1b.json``).
The same loop on the whole model in memory is :func:`course_lib.methods.calibration.
quantize_blockwise`; tests/test_stream.py checks that both give the same codes.

What :func:`quantize` writes is a compressed-tensors ``pack-quantized`` checkpoint, the layout
:func:`course_lib.export.export_compressed` writes for a model in memory (codes packed eight
per int32, a scale per group, the head and embeddings unquantized), split in one shard per
decoder layer plus one for each tensor outside the layers (the embedding, the final norm, an
untied head: the largest tensors, read and written one at a time), listed in
``model.safetensors.index.json``. Everything goes into a staging folder beside ``out`` that
becomes ``out`` only when the last file is written: a crash or a full disk leaves nothing
half-written under ``out``.

:func:`evaluate` scores the result against the unquantized checkpoint the same way, streamed:
each model's layers run one at a time over all evaluation windows (the hidden states are held,
not the layers), then the head, window by window: perplexity of both, KL(reference || quantized)
and top-1 agreement, per window and their mean (lesson 04's measures).

The command is ``python -m course_lib.quantize_own`` (:mod:`course_lib.quantize_own`).
"""
from __future__ import annotations

import errno
import json
import math
import os
import shutil
import sys
import time
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from course_lib import export, hardware, own_model
from course_lib.methods import awq, calibration as cal, gptq
from course_lib.methods.calibration import GroupQuantLinear
from course_lib.model import Block, LlamaModel, RMSNorm, rope_frequencies

METHODS = ("rtn", "gptq", "awq")
#: Widths a pack-quantized checkpoint holds (W4A16, W8A16: what vLLM's kernels take).
BITS = export.SUPPORTED_BITS
#: Grids whose symmetric integer codes a pack-quantized checkpoint stores as they are
#: (llama.cpp's q4_0 / q4_1 grids go to GGUF instead).
GRIDS = ("course", "llm-compressor", "llm-compressor-grid")
#: Keyword arguments each method's block step takes through ``quantize(**method_kw)``.
METHOD_KW = {"rtn": ("grid",),
             "gptq": ("damp", "block_size", "grid"),
             "awq": ("n_grid", "clip", "search_windows", "grid", "scale_o_proj")}
#: Files copied from the source folder when present: what transformers and vLLM read besides
#: the weights (the tokenizer, its settings and chat template, generation defaults).
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "generation_config.json", "tokenizer.model", "chat_template.jinja")
#: Calibration and evaluation defaults: windows of 512 tokens, as the course's SmolLM2 tables.
WINDOW = 512


# ----------------------------------------------------------------------------- small checks
def _whole(name: str, v, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name} must be a whole number >= {lo}; got {v!r}")
    return v


def _open(source) -> own_model.Checkpoint:
    return source if isinstance(source, own_model.Checkpoint) else \
        own_model.open_checkpoint(source)


def _names_a_file(text: str) -> bool:
    """Whether a str is the path of an existing file (not a text that happens to be short)."""
    if "\n" in text or len(text) > 1024:
        return False
    try:
        return Path(text).expanduser().is_file()
    except (OSError, ValueError):                   # too long for a name, or a NUL in it
        return False


def _text(text, what: str) -> tuple[str, str]:
    """(the text, how to name it in a message) from a str of text, or a path to a text file."""
    if isinstance(text, os.PathLike) or (isinstance(text, str) and _names_a_file(text)):
        p = Path(text).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"the {what} file {str(p)!r} does not exist; pass the path "
                                    f"of a UTF-8 text file, or the text itself as a str")
        try:
            body = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{p} is not UTF-8 text ({e}); the {what} text must be a plain "
                             f"text file") from None
        where = f"the {what} file {p.name}"
    elif isinstance(text, str):
        if text.endswith((".txt", ".md")) and "\n" not in text and " " not in text:
            raise FileNotFoundError(f"the {what} file {text!r} does not exist (pass an existing "
                                    f"path, or the text itself)")
        body, where = text, f"the {what} text given"
    else:
        raise TypeError(f"the {what} text must be a str (the text, or a path to a .txt file), "
                        f"a Path, or None for the course's; got {type(text).__name__}")
    if not body.strip():
        raise ValueError(f"{where} is empty")
    return body, where


def _tokens(ck, text, part: int, what: str) -> tuple[torch.Tensor, str]:
    """The model's own token ids (N,) of ``text``, or of the course's clean split's ``part``
    (0: calibration, 1: evaluation) when ``text`` is None."""
    if text is None:
        from course_lib import data
        body = data.clean_split()[part]
        where = f"the course's {what} text (data.clean_split, part {part})"
    else:
        body, where = _text(text, what)
    ids = own_model.load_tokenizer(ck).encode(body)
    return torch.tensor(ids, dtype=torch.long), where


def _check_window(ck, n_windows, window) -> None:
    _whole("n_windows", n_windows)
    _whole("window", window, 2)
    ctx = ck.config.max_position_embeddings
    if window > ctx:
        raise ValueError(f"window {window} exceeds the model's context of {ctx} tokens "
                         f"(max_position_embeddings); use a window <= {ctx}")


def _short(where: str, have: int, n_windows: int, window: int, flag: str) -> ValueError:
    fit = have // window
    return ValueError(f"{where} holds {have:,} tokens with this model's tokenizer, but "
                      f"{n_windows} windows of {window} tokens need {n_windows * window:,}. "
                      f"Use a longer text, or fewer windows ({flag} {fit} fit"
                      f"{'' if fit else ' none at this window'}), or shorter ones")


# ----------------------------------------------------------------------------- token windows
def calibration_ids(source, text=None, n_windows: int = 8, window: int = WINDOW,
                    seed: int = 0) -> torch.Tensor:
    """Calibration windows (n_windows, window) int64 for the checkpoint ``source`` (lesson 17).

    ``text``: a str of text, or the path of a UTF-8 text file; None takes the course's
    calibration text (the clean protocol's calibration part, :func:`course_lib.data.
    clean_split`, which shares no run of 50 characters with the evaluation part). Tokenized
    with the checkpoint's own tokenizer.json; the windows are non-overlapping and chosen at
    random (``seed``), as :func:`course_lib.methods.calibration.windows_from_ids` does. A text
    too short for ``n_windows x window`` tokens is refused with the counts."""
    ck = _open(source)
    _check_window(ck, n_windows, window)
    ids, where = _tokens(ck, text, 0, "calibration")
    if len(ids) < n_windows * window:
        raise _short(where, len(ids), n_windows, window, "--windows")
    return cal.windows_from_ids(ids, n_windows, window, seed)


def eval_ids(source, text=None, n_windows: int = 4, window: int = WINDOW) -> torch.Tensor:
    """Evaluation windows (n_windows, window) int64: the first ``n_windows`` disjoint windows of
    held-out text (``text`` as in :func:`calibration_ids`; None: the course's evaluation text,
    the clean split's other part), each scored on its own by :func:`evaluate` (``window - 1``
    predictions each, as :func:`course_lib.smollm.reference` scores SmolLM2)."""
    ck = _open(source)
    _check_window(ck, n_windows, window)
    ids, where = _tokens(ck, text, 1, "evaluation")
    if len(ids) < n_windows * window:
        raise _short(where, len(ids), n_windows, window, "--eval-windows")
    return ids[:n_windows * window].view(n_windows, window).clone()


def _check_ids(ids, cfg, what: str = "ids") -> torch.Tensor:
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32) \
            or ids.dim() != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
        got = f"{tuple(ids.shape)} {ids.dtype}" if isinstance(ids, torch.Tensor) else \
            type(ids).__name__
        raise ValueError(f"{what} must be token windows, an int64 tensor (windows, tokens) as "
                         f"calibration_ids / eval_ids return; got {got}")
    if int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size:
        raise ValueError(f"{what} span [{int(ids.min())}, {int(ids.max())}] but the model has "
                         f"{cfg.vocab_size} tokens: were they made with another model's "
                         f"tokenizer?")
    if ids.shape[1] > cfg.max_position_embeddings:
        raise ValueError(f"windows of {ids.shape[1]} tokens exceed the model's context of "
                         f"{cfg.max_position_embeddings}")
    return ids.long()


# ----------------------------------------------------------------------------- reading tensors
def _read(folder: Path, weight_map: dict[str, str], names) -> dict[str, torch.Tensor]:
    """``names`` as stored (no dtype change), each read on its own from its shard."""
    from safetensors import safe_open
    by_file: dict[str, list[str]] = {}
    for k in names:
        by_file.setdefault(weight_map[k], []).append(k)
    out = {}
    for f, ks in by_file.items():
        with safe_open(str(folder / f), framework="pt") as h:
            for k in ks:
                out[k] = h.get_tensor(k)
    return out


def _source_tensors(ck, names) -> dict[str, torch.Tensor]:
    """Tensors of an unquantized source: as stored from safetensors shards; decoded to fp32
    by own_model from a GGUF file or the course's converted SmolLM2 folder."""
    if getattr(ck, "format", "safetensors") == "safetensors":
        return _read(ck.folder, ck.weight_map, names)
    return own_model._read(ck, list(names), torch.float32)


def _source_path(ck) -> Path:
    """What the learner passed: the folder, or the .gguf file itself."""
    return getattr(ck, "path", None) or ck.folder


def rope(cfg, T: int):
    """cos, sin (T, head_dim) for positions 0..T-1: :meth:`LlamaModel.rope` itself, run on the
    config's frequencies (no model built)."""
    return LlamaModel.rope(types.SimpleNamespace(inv_freq=rope_frequencies(cfg)), 0, T)


def capture_inputs(source, ids):
    """The first decoder layer's inputs on windows ``ids`` (n, T): ``(x (n, T, D) fp32, cos,
    sin)``, from the embedding alone (no layer is read). The embedding rows are looked up in
    the stored dtype and then widened to fp32, which is exact, so ``x`` equals what the whole
    model in fp32 computes (lesson 17)."""
    ck = _open(source)
    ids = _check_ids(ids, ck.config)
    name = "model.embed_tokens.weight"
    emb = _source_tensors(ck, [name])[name]                                   # (V, D) stored
    x = F.embedding(ids, emb).float()                                          # (n, T, D)
    del emb
    cos, sin = rope(ck.config, ids.shape[1])
    return x, cos, sin


# ----------------------------------------------------------------------------- the methods
def _block_step(method, bits, group_size, act_order, scale_dtype, batch_size, kw):
    """The method's step on one decoder block in place, ``step(block, x, cos, sin)``: the same
    calls :func:`gptq.gptq_model`, :func:`awq.awq_model` and :func:`calibration.rtn_model` make
    on each block (one source per algorithm; tests/test_stream.py checks the codes agree)."""
    grid = kw.get("grid", "course")
    if method == "rtn":
        def step(block, x=None, cos=None, sin=None):
            for name, lin in cal.linears(block).items():
                cal.replace(block, name, cal.rtn_linear(lin, bits, group_size, True, scale_dtype,
                                                        grid=grid))
    elif method == "gptq":
        damp, bsize = kw.get("damp", 0.01), kw.get("block_size", 128)

        def step(block, x, cos, sin):
            gptq.gptq_block(block, x, cos, sin, bits, group_size, True, damp, bsize, act_order,
                            scale_dtype, batch_size, grid)
    else:
        def step(block, x, cos, sin):
            awq.awq_block(block, x, cos, sin, bits, group_size, True,
                          kw.get("n_grid", awq.DEFAULT_GRID), kw.get("clip", True),
                          kw.get("search_windows", 8), batch_size, scale_dtype, None, grid,
                          kw.get("scale_o_proj", False))
    return step


def gptq_copy(block, x, cos, sin, bits: int = 4, group_size: int | None = None,
              act_order: bool = False) -> Block:
    """A COPY of ``block`` with every Linear quantized by the library's GPTQ on the Hessians of
    its inputs ``x`` (n, T, D) (:func:`course_lib.methods.gptq.gptq_block`, the step
    :func:`quantize` takes on each block, at its defaults); ``group_size`` None: one group per
    row. Lesson 17 passes it to the sequential loop it builds."""
    import copy
    q = copy.deepcopy(block)
    gptq.gptq_block(q, x, cos, sin, bits, group_size, act_order=act_order)
    return q


def rtn_copy(block, x, cos, sin, bits: int = 4, group_size: int | None = None) -> Block:
    """A COPY of ``block`` with every Linear rounded to nearest (``x``, ``cos``, ``sin`` are
    ignored: the baseline needs no calibration); ``group_size`` None: one scale per row."""
    import copy
    q = copy.deepcopy(block)
    for name, lin in cal.linears(q).items():
        cal.replace(q, name, cal.rtn_linear(lin, bits, group_size or lin.in_features))
    return q


def compressed_tensors(block, prefix: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One quantized decoder block as a pack-quantized checkpoint stores it, under ``prefix``
    (``model.layers.<i>.``): what :func:`course_lib.export.export_compressed` writes for the
    block, codes unchanged (``weight_packed`` int32, ``weight_scale`` in ``dtype``,
    ``weight_shape``), every other tensor (norms, biases) in ``dtype``."""
    layers = {n: m for n, m in block.named_modules() if isinstance(m, GroupQuantLinear)}
    plain = [n for n, m in block.named_modules() if type(m) is torch.nn.Linear]
    if not layers or plain:
        raise ValueError(f"{prefix}: every Linear must be quantized before it is written "
                         f"(plain: {plain[:3]})")
    sd = {}
    for name, t in block.state_dict().items():
        mod_name, _, _ = name.rpartition(".")
        if mod_name not in layers:
            sd[prefix + name] = t.detach().to(dtype).contiguous()
    for name, m in layers.items():
        if not m.symmetric:
            raise ValueError(f"{prefix}{name}: asymmetric codes are not written by the stream "
                             f"(symmetric grids only)")
        scale = m.scale.float()
        stored = scale.to(dtype)
        if not torch.equal(stored.float(), scale):
            raise ValueError(f"{prefix}{name}: its scales are not exact in {dtype}; quantize "
                             f"with scale_dtype={dtype}")
        u = m.codes.to(torch.int64) + 2 ** (m.bits - 1)                       # 0..2**bits-1
        sd[f"{prefix}{name}.weight_packed"] = export.pack_int32(u, m.bits)
        sd[f"{prefix}{name}.weight_scale"] = stored.contiguous()
        sd[f"{prefix}{name}.weight_shape"] = torch.tensor([m.out_features, m.in_features])
        if m.bias is not None:
            sd[f"{prefix}{name}.bias"] = m.bias.detach().to(dtype).contiguous()
    return sd


def _write_shard(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """One safetensors shard (tests replace this writer to simulate a full disk)."""
    from safetensors.torch import save_file
    save_file(tensors, str(path), metadata={"format": "pt"})


def _disk_full(e: BaseException) -> bool:
    return getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e)


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory since it started (``getrusage``'s ru_maxrss:
    kilobytes on Linux, bytes on macOS; on Windows psutil's peak working set), or None where
    it cannot be read."""
    try:
        import resource
    except ImportError:                                     # Windows
        try:
            import psutil
            return int(psutil.Process().memory_info().peak_wset)
        except Exception:  # psutil missing, or no peak_wset on this platform
            return None
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if sys.platform == "darwin" else int(r) * 1024


# ----------------------------------------------------------------------------- quantize
@dataclass
class StreamReport:
    """What :func:`quantize` did: ``seconds_per_layer`` (read, quantize, write and run each
    layer), ``seconds_inputs`` (the embedding lookup), ``peak_rss_bytes`` (the process's peak
    since it started, :func:`peak_rss_bytes`), ``peak_rss_per_layer`` (that peak as each
    layer finished, then once more after the embedding, norm and head were written: where the
    peak was reached), ``bytes_written`` (the folder's shards)."""
    method: str
    bits: int
    group_size: int
    act_order: bool
    folder: Path
    architecture: str
    layers: int
    calibration: tuple | None
    seconds_per_layer: list[float] = field(default_factory=list)
    seconds_inputs: float = 0.0
    seconds_total: float = 0.0
    peak_rss_bytes: int | None = None
    bytes_written: int = 0
    peak_rss_per_layer: list = field(default_factory=list)

    def table(self) -> str:
        gb = lambda b: "unknown" if b is None else f"{b / hardware.GB:.3f} GB"   # noqa: E731
        s = self.seconds_per_layer
        name = self.method.upper() + (" act-order" if self.act_order and self.method == "gptq"
                                      else "")
        calib = "none (RTN reads no text)" if self.calibration is None else \
            f"{self.calibration[0]} windows x {self.calibration[1]} tokens"
        rows = [("method", f"{name}, W{self.bits} g{self.group_size} symmetric"),
                ("model", f"{self.architecture}, {self.layers} decoder layers"),
                ("calibration", calib),
                ("seconds per layer", f"mean {sum(s) / len(s):.2f}, min {min(s):.2f}, "
                                      f"max {max(s):.2f}" if s else "-"),
                ("seconds in all", f"{self.seconds_total:.1f}"),
                ("peak resident memory", gb(self.peak_rss_bytes)),
                ("written", f"{gb(self.bytes_written)} in {self.folder}")]
        w = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)

    __str__ = table


def _check_out(out, ck, overwrite: bool) -> Path:
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out must be the output folder (a str or Path); got "
                        f"{type(out).__name__}")
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be True or False; got {overwrite!r}")
    out = Path(out).expanduser().absolute()
    src = _source_path(ck).resolve()
    if out.resolve() == src or (src.is_dir() and src in out.resolve().parents):
        raise ValueError(f"out {str(out)!r} is the source checkpoint's folder or inside it; "
                         f"write the quantized model to a folder of its own")
    if out.is_file():
        raise NotADirectoryError(f"out {str(out)!r} is a file; give a folder path for the "
                                 f"quantized checkpoint")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        n = sum(1 for _ in out.iterdir())
        raise FileExistsError(f"out {str(out)!r} already exists and holds {n} file(s); choose "
                              f"another folder, or pass overwrite=True (--overwrite) to replace "
                              f"the checkpoint in it")
    return out


def _method_kw(method, kw) -> dict:
    unknown = sorted(set(kw) - set(METHOD_KW[method]))
    if unknown:
        raise TypeError(f"{method} takes no {unknown}; its settings: {list(METHOD_KW[method])}")
    grid = kw.get("grid", "course")
    if grid not in GRIDS:
        raise ValueError(f"grid {grid!r} cannot be written as a pack-quantized checkpoint; use "
                         f"one of {GRIDS} (llama.cpp's q4_0 / q4_1 grids go to GGUF, lesson 13)")
    return kw


def quantize(source, out, method: str = "gptq", bits: int = 4, group_size: int = 128,
             ids: torch.Tensor | None = None, act_order: bool = True, overwrite: bool = False,
             progress: bool = True, dtype: torch.dtype = torch.bfloat16, batch_size: int = 16,
             **method_kw) -> StreamReport:
    """Quantize the checkpoint folder ``source`` one decoder layer at a time into ``out``, a
    compressed-tensors checkpoint transformers and vLLM load (lesson 17). Returns a
    :class:`StreamReport`.

    method: "rtn" (no calibration), "gptq" (``act_order``: columns by decreasing Hessian
    diagonal, static groups) or "awq"; ``method_kw``: the method's own settings
    (:data:`METHOD_KW`: GPTQ's ``damp`` and ``block_size``, AWQ's ``n_grid`` ...; ``grid``).
    bits 4 or 8, symmetric, a scale per ``group_size`` inputs stored in ``dtype`` (bf16:
    the codes are chosen against the stored scale, so the checkpoint computes what the course
    computed). ids: calibration windows (n, T) from :func:`calibration_ids` (None: 8 windows of
    512 tokens of the course's calibration text).

    Each layer is read (:func:`course_lib.own_model.load_layer`), quantized by the method's
    block step, written as its own shard, and run on the calibration activations to make the
    next layer's inputs. The files go to a staging folder beside ``out``, renamed to ``out``
    at the end; on any error (a full disk included) it is removed and ``out`` is untouched.
    An ``out`` that holds files is refused unless ``overwrite``.
    """
    t_start = time.perf_counter()
    ck = _open(source)
    cfg = ck.config
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    if isinstance(bits, bool) or bits not in BITS:
        raise ValueError(f"bits must be one of {BITS} (what a pack-quantized checkpoint and "
                         f"vLLM's W4A16 / W8A16 kernels take); got {bits!r}")
    _whole("group_size", group_size)
    for name, (_, inputs) in own_model.linear_shapes(cfg).items():
        if inputs % group_size:
            raise ValueError(f"group_size {group_size} does not divide {name}'s {inputs} "
                             f"inputs; group sizes that divide every Linear of this model: "
                             f"{_common_groups(cfg)}")
    for name, v in (("act_order", act_order), ("progress", progress)):
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be True or False; got {v!r}")
    if not isinstance(dtype, torch.dtype) or dtype not in (torch.bfloat16, torch.float16,
                                                           torch.float32):
        raise TypeError(f"dtype must be torch.bfloat16, torch.float16 or torch.float32 (the "
                        f"checkpoint's dtype); got {dtype!r}")
    _whole("batch_size", batch_size)
    kw = _method_kw(method, method_kw)
    out = _check_out(out, ck, overwrite)
    calibrated = method != "rtn"
    if calibrated:
        ids = calibration_ids(ck) if ids is None else _check_ids(ids, cfg, "calibration ids")
    _check_space(ck, out, bits, group_size, dtype)
    L = cfg.num_hidden_layers
    outer_names = _outer_names(ck)            # each in a shard of its own, read one at a time
    n_shards = L + len(outer_names)
    shard = lambda k: f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"   # noqa: E731
    report = StreamReport(method, bits, group_size, act_order and method == "gptq", out,
                          ck.architecture, L, tuple(ids.shape) if calibrated else None)
    step = _block_step(method, bits, group_size, act_order, dtype, batch_size, kw)
    weight_map: dict[str, str] = {}
    what = "the calibration inputs"
    try:
        with export._staging_folder(out) as tmp:
            if calibrated:
                t0 = time.perf_counter()
                x, cos, sin = capture_inputs(ck, ids)                         # (n, T, D)
                report.seconds_inputs = time.perf_counter() - t0
            bar = _bar(L, progress, f"{method.upper()} W{bits} layers")
            for i in range(L):
                t0 = time.perf_counter()
                what = f"layer {i}"
                block = own_model.load_layer(ck, i)
                with torch.no_grad():
                    step(block, x, cos, sin) if calibrated else step(block)
                sd = compressed_tensors(block, f"model.layers.{i}.", dtype)
                _write_shard(sd, tmp / shard(i))
                weight_map.update({k: shard(i) for k in sd})
                del sd
                if calibrated and i + 1 < L:
                    x = cal.run_block(block, x, cos, sin, batch_size)         # quantized outputs
                del block
                report.seconds_per_layer.append(time.perf_counter() - t0)
                report.peak_rss_per_layer.append(peak_rss_bytes())
                if bar is not None:
                    bar.set_postfix_str(f"layer {i}: {report.seconds_per_layer[-1]:.1f} s, "
                                        f"peak RSS {_gb(peak_rss_bytes())}")
                    bar.update(1)
            if bar is not None:
                bar.close()
            what = "the embedding, final norm and head"
            for j, name in enumerate(outer_names):
                t = {name: _source_tensors(ck, [name])[name].to(dtype).contiguous()}
                _write_shard(t, tmp / shard(L + j))
                weight_map[name] = shard(L + j)
                del t
            report.peak_rss_per_layer.append(peak_rss_bytes())
            what = "config.json, the index and the tokenizer"
            _write_metadata(ck, tmp, weight_map, bits, group_size, dtype)
            report.bytes_written = sum(p.stat().st_size for p in tmp.glob("*.safetensors"))
    except Exception as e:
        if _disk_full(e):
            raise OSError(errno.ENOSPC, f"the disk holding {out.parent} filled up while "
                                        f"writing {what}; nothing was left under {out} (the "
                                        f"staging folder was removed). Free "
                                        f"{_gb(_output_bytes(ck, bits, group_size, dtype))} "
                                        f"there, or write to another disk") from e
        raise
    report.seconds_total = time.perf_counter() - t_start
    report.peak_rss_bytes = peak_rss_bytes()
    return report


def _gb(b) -> str:
    return "unknown" if b is None else f"{b / hardware.GB:.2f} GB"


def _bar(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, unit="layer")


def _common_groups(cfg) -> list[int]:
    from math import gcd
    g = 0
    for _, i in own_model.linear_shapes(cfg).values():
        g = gcd(g, i)
    return [d for d in (32, 64, 128, 256) if g % d == 0] or [d for d in range(1, g + 1)
                                                             if g % d == 0][-4:]


def _output_bytes(ck, bits, group_size, dtype) -> float:
    """Bytes of the output: own_model's bill (W``bits`` g``group_size``, the rest in 16 bits),
    the rest at 4 bytes when ``dtype`` is fp32."""
    b = own_model.bill(own_model.read_raw_config(_source_path(ck)), "rtn", bits, group_size,
                       free_bytes=0).output_bytes
    if dtype == torch.float32:
        p = own_model.count_parameters(ck.config)
        b += 2 * (p["total"] - ck.config.num_hidden_layers * p["linear_per_layer"])
    return b


def _check_space(ck, out: Path, bits, group_size, dtype) -> None:
    """Refuse before any work when the disk holding ``out`` has less free space than the output
    needs (plus 5%)."""
    parent = out
    while not parent.exists():
        parent = parent.parent
    need = _output_bytes(ck, bits, group_size, dtype) * 1.05
    free = shutil.disk_usage(parent).free
    if free < need:
        raise OSError(errno.ENOSPC, f"the quantized checkpoint needs about {_gb(need)} but the "
                                    f"disk holding {parent} has {_gb(free)} free; free space "
                                    f"or choose an output folder on another disk")


def _outer_names(ck) -> list[str]:
    """The tensors outside the decoder layers (embedding, final norm, an untied head)."""
    names = sorted(k for k in ck.weight_map if not k.startswith("model.layers."))
    if ck.config.tie_word_embeddings:
        names = [k for k in names if k != "lm_head.weight"]
    return names


def _write_metadata(ck, folder: Path, weight_map, bits, group_size, dtype) -> None:
    """config.json (the source's, with export's quantization_config), the index, and the
    tokenizer files of the source folder."""
    raw = own_model.read_raw_config(_source_path(ck))
    raw["torch_dtype"] = str(dtype).replace("torch.", "")
    raw.pop("dtype", None)
    raw["quantization_config"] = export.quantization_config(bits, group_size, True)
    (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    total = sum((folder / f).stat().st_size for f in set(weight_map.values()))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / own_model.INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    tok = getattr(ck, "tokenizer", None)
    if tok is not None and Path(tok).suffix == ".json":
        shutil.copy(tok, folder / "tokenizer.json")
    if ck.folder.is_dir() and getattr(ck, "format", "safetensors") != "gguf":
        for name in COPIED:
            if (ck.folder / name).is_file() and not (folder / name).exists():
                shutil.copy(ck.folder / name, folder / name)
    if (folder / "tokenizer.json").exists() and not (folder / "tokenizer_config.json").exists():
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast",
             "model_max_length": ck.config.max_position_embeddings}) + "\n")


# ----------------------------------------------------------------------------- reading the output
def unpack_int32(words: torch.Tensor, bits: int, dim: int = 1, n: int | None = None
                 ) -> torch.Tensor:
    """The inverse of :func:`course_lib.export.pack_int32`: unsigned codes (int64) from int32
    words, ``32 // bits`` per word along ``dim`` (first element lowest), cut to ``n``."""
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}; got {bits!r}")
    per, mask = 32 // bits, 2 ** bits - 1
    w = (words.T if dim == 0 else words).to(torch.int64) & 0xFFFFFFFF            # (rows, words)
    shifts = torch.arange(per, dtype=torch.int64) * bits                        # (per,)
    u = ((w[..., None] >> shifts) & mask).reshape(w.shape[0], -1)               # (rows, cols)
    if n is not None:
        u = u[:, :n]
    return (u.T if dim == 0 else u).contiguous()


class _Unquantized:
    """Layers of an unquantized checkpoint (own_model)."""

    def __init__(self, ck):
        self.ck, self.config, self.name = ck, ck.config, str(ck.folder)

    def layer(self, i: int) -> Block:
        return own_model.load_layer(self.ck, i)

    def outer(self) -> dict[str, torch.Tensor]:
        return _source_tensors(self.ck, [k for k in self.ck.weight_map
                                         if not k.startswith("model.layers.")])


class _Packed:
    """Layers of a compressed-tensors pack-quantized folder (what :func:`quantize` writes),
    each Linear's weight dequantized in fp32 as :class:`GroupQuantLinear` computes it."""

    def __init__(self, folder: Path, raw: dict):
        qc = raw["quantization_config"]
        groups = list(qc.get("config_groups", {}).values())
        w = groups[0].get("weights", {}) if len(groups) == 1 else {}
        if qc.get("format") != "pack-quantized" or len(groups) != 1 or w.get("type") != "int" \
                or not w.get("symmetric", False) or w.get("num_bits") not in BITS:
            raise ValueError(f"{folder} is a quantized checkpoint this reader does not take "
                             f"(format {qc.get('format')!r}, {len(groups)} config group(s), "
                             f"weights {w}); it reads symmetric int4/int8 pack-quantized "
                             f"folders, as course_lib.stream.quantize writes them")
        self.bits = w["num_bits"]
        self.folder, self.name = folder, str(folder)
        clean = {k: v for k, v in raw.items() if k != "quantization_config"}
        self.config = own_model.own_config(clean)
        index = folder / own_model.INDEX_NAME
        if index.exists():
            self.weight_map = json.loads(index.read_text())["weight_map"]
        else:
            from safetensors import safe_open
            self.weight_map = {}
            for f in sorted(folder.glob("*.safetensors")):
                with safe_open(str(f), framework="pt") as h:
                    self.weight_map.update({k: f.name for k in h.keys()})
        if any(k.endswith(("weight_g_idx", "weight_zero_point")) for k in self.weight_map):
            raise ValueError(f"{folder} stores group indices or zero points (act-order g_idx, "
                             f"asymmetric codes), which this reader does not take")

    def _dequantized(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for k, v in sd.items():
            if k.endswith((".weight_scale", ".weight_shape")):
                continue
            if k.endswith(".weight_packed"):
                base = k[:-len(".weight_packed")]
                rows, cols = (int(t) for t in sd[base + ".weight_shape"])
                scale = sd[base + ".weight_scale"].float()                          # (out, G)
                q = unpack_int32(v, self.bits, 1, cols).float() - 2 ** (self.bits - 1)
                g = cols // scale.shape[1]
                out[base + ".weight"] = (q.view(rows, -1, g) * scale[..., None]).reshape(rows,
                                                                                      cols)
            else:
                out[k] = v.float()
        return out

    def layer(self, i: int) -> Block:
        prefix = f"model.layers.{i}."
        sd = _read(self.folder, self.weight_map,
                   [k for k in self.weight_map if k.startswith(prefix)])
        sd = {k[len(prefix):]: v for k, v in self._dequantized(sd).items()}
        with torch.device("meta"):
            block = Block(self.config, i)
        block.load_state_dict(sd, strict=True, assign=True)
        return block.eval()

    def outer(self) -> dict[str, torch.Tensor]:
        return _read(self.folder, self.weight_map,
                     [k for k in self.weight_map if not k.startswith("model.layers.")])


def _reader(source):
    if isinstance(source, own_model.Checkpoint):
        return _Unquantized(source)
    raw = own_model.read_raw_config(source)
    if raw.get("quantization_config"):
        return _Packed(Path(source).expanduser(), raw)
    return _Unquantized(own_model.open_checkpoint(source))


def load_packed(folder) -> LlamaModel:
    """The folder :func:`quantize` wrote, read back whole as the course's model (fp32; each
    Linear dequantized as :class:`GroupQuantLinear` computes it). For small models and
    checks (lesson 17 compares it with llama.cpp running the GGUF file of the same codes);
    :func:`evaluate` streams instead."""
    r = _reader(folder)
    if not isinstance(r, _Packed):
        raise ValueError(f"{folder} is not a folder stream.quantize wrote (its config.json has "
                         f"no quantization_config): open an unquantized checkpoint with "
                         f"own_model.load")
    sd = {k: v.float() for k, v in r.outer().items()}
    for i in range(r.config.num_hidden_layers):
        sd.update({f"model.layers.{i}.{k}": v for k, v in r.layer(i).state_dict().items()})
    return own_model.model_from_state_dict(r.config, sd, torch.float32)


# ----------------------------------------------------------------------------- evaluate
@torch.no_grad()
def _final_hidden(reader, ids, progress: bool, desc: str, batch_size: int) -> torch.Tensor:
    """Hidden states after the last layer, (n, T, D) fp32, one layer in memory at a time."""
    cfg = reader.config
    name = "model.embed_tokens.weight"
    emb = reader.outer()[name] if isinstance(reader, _Packed) else \
        _source_tensors(reader.ck, [name])[name]
    x = F.embedding(ids, emb).float()                                              # (n, T, D)
    del emb
    cos, sin = rope(cfg, ids.shape[1])
    bar = _bar(cfg.num_hidden_layers, progress, desc)
    for i in range(cfg.num_hidden_layers):
        x = cal.run_block(reader.layer(i), x, cos, sin, batch_size)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return x


def _head(reader):
    """(final RMSNorm, head weight (V, D) fp32) of a checkpoint."""
    outer = reader.outer()
    cfg = reader.config
    norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
    norm.weight.data = outer["model.norm.weight"].float()
    head = outer["model.embed_tokens.weight"] if cfg.tie_word_embeddings else \
        outer["lm_head.weight"]
    return norm, head.float()


@torch.no_grad()
def evaluate(reference, quantized, ids: torch.Tensor, progress: bool = True,
             batch_size: int = 4) -> dict:
    """Score ``quantized`` against ``reference`` on windows ``ids`` (n, T), streamed (lesson 17).

    reference: the unquantized checkpoint folder (or its :class:`own_model.Checkpoint`);
    quantized: the folder :func:`quantize` wrote (or any checkpoint own_model opens). Each
    window is scored on its own (T - 1 predictions, as :func:`course_lib.smollm.reference`).
    Each model runs layer by layer over all windows, holding the hidden states (n, T, D) and
    one layer; then the final norm and head, one window at a time. Returns ``perplexity``
    (reference and quantized), ``kl_nats`` (mean KL(reference || quantized) per prediction),
    ``top1_agreement``, and ``windows``: the same per window (``nll_reference``,
    ``nll_quantized``, ``kl_nats``, ``top1_agreement``), as
    :func:`course_lib.protocol.window_scores` defines them.
    """
    ref, q = _reader(reference), _reader(quantized)
    a, b = asdict(ref.config), asdict(q.config)
    # a GGUF file stores floats (rms_norm_eps, rope_theta) in float32: equal to 1e-6 is equal
    same = lambda u, v: u == v or (isinstance(u, float) and isinstance(v, float)  # noqa: E731
                                   and math.isclose(u, v, rel_tol=1e-6))
    differ = [k for k in a if not same(a[k], b[k])]
    if differ:
        k = differ[0]
        raise ValueError(f"the two checkpoints are different models ({k}: {a[k]} in "
                         f"{ref.name}, {b[k]} in {q.name}); evaluate a quantized model against "
                         f"the checkpoint it came from")
    ids = _check_ids(ids, ref.config)
    if ids.shape[1] < 2:
        raise ValueError("evaluation windows need at least 2 tokens (one prediction)")
    h = {}
    for key, reader in (("reference", ref), ("quantized", q)):
        h[key] = _final_hidden(reader, ids, progress, f"evaluate: {key} layers", batch_size)
    heads = {"reference": _head(ref), "quantized": _head(q)}
    win = {"nll_reference": [], "nll_quantized": [], "kl_nats": [], "top1_agreement": []}
    for w in range(ids.shape[0]):
        lp = {}
        for key, (norm, head) in heads.items():
            lp[key] = F.log_softmax(F.linear(norm(h[key][w, :-1]), head).float(), -1)  # (T-1, V)
        tgt = ids[w, 1:]
        p = lp["reference"].exp()
        kl = torch.where(p > 0, p * (lp["reference"] - lp["quantized"]),
                         torch.zeros_like(p)).sum(-1)                                   # (T-1,)
        win["kl_nats"].append(float(kl.double().mean()))
        win["top1_agreement"].append(float((lp["reference"].argmax(-1) ==
                                            lp["quantized"].argmax(-1)).double().mean()))
        for key in ("reference", "quantized"):
            nll = -lp[key].gather(-1, tgt[:, None])[:, 0]
            win[f"nll_{key}"].append(float(nll.double().mean()))
        del lp, p, kl
    mean = lambda v: sum(v) / len(v)   # noqa: E731  (every window has T - 1 predictions)
    return {"perplexity": {"reference": math.exp(mean(win["nll_reference"])),
                           "quantized": math.exp(mean(win["nll_quantized"]))},
            "kl_nats": mean(win["kl_nats"]), "top1_agreement": mean(win["top1_agreement"]),
            "windows": win, "n_windows": ids.shape[0], "window": ids.shape[1]}
