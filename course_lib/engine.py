"""llama.cpp, the engine that runs quantized models on laptops, driven from the course (lesson 13).

llama.cpp is C/C++; ``llama-cpp-python`` builds it from source and wraps it for Python. It is
optional for the course (``make engine`` builds it once, about 5 minutes on 2 cores) and every
function here says so in one line when it is missing. What lesson 13 does with it:

- :func:`logits` and :func:`score`: the engine's logits on token ids, and perplexity / KL /
  top-1 agreement on the course's evaluation windows, each window scored alone (the protocol of
  ``course_lib.smollm.reference``), so the engine and the course's ``LlamaModel`` are compared
  on the same predictions;
- :func:`quantize_file`: llama.cpp's own quantizer (``llama_model_quantize``), to check the
  course's GGUF writer byte for byte and to show the double-quantization trap;
- :func:`decode_speed`: greedy decoding tokens/s, several runs, median and spread;
- :func:`speed_limits`: decode speed against its two limits measured here: memory (read
  bandwidth / bytes per token) and compute (:func:`prefill_speed`, the engine's arithmetic
  for a token when bytes are free, a loose bound), at 1 and 2 threads;
- :func:`bytes_per_token` and :func:`predicted_tokens_per_s`: lesson 00's prediction of the
  decode speed from the bytes each token reads and the measured memory bandwidth.

Lesson 14 adds :func:`quantize_chunk` and :func:`dequantize_chunk`: the engine's own block
quantizer (``ggml_quantize_chunk``, the C function ``llama_model_quantize`` calls per tensor)
and decoder, called through ctypes on rows the course chooses, to check
:mod:`course_lib.kquants` byte for byte; and the k-quant mixes in :func:`quantize_file`.

The build flag matters: llama.cpp's default native build (``GGML_NATIVE=ON``) detected
AVX-512/AMX on the course's test machine and crashed at the first evaluation; the portable
build (``-DGGML_NATIVE=OFF``: AVX2 and FMA, no AVX-512) runs everywhere x86-64 does.
``-DLLAVA_BUILD=OFF`` skips llama-cpp-python's multimodal library (mtmd, for images), which
the course never loads: a shorter build.
"""
from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

#: The engine version the course pins, and the build flags that work everywhere.
VERSION = "0.3.36"
CMAKE_ARGS = "-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
INSTALL = f'CMAKE_ARGS="{CMAKE_ARGS}" pip install llama-cpp-python=={VERSION}'
MAKE = "make engine"
#: llama.cpp's file types (``LLAMA_FTYPE_MOSTLY_*``) for the formats lesson 13 uses, and the
#: k-quant mixes of lesson 14.
FTYPES = {"f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7,
          "q3_k_m": 12, "q4_k_s": 14, "q4_k_m": 15}


# ----------------------------------------------------------------------------- is it there?
def available() -> bool:
    """True when ``llama_cpp`` imports (the engine is built)."""
    try:
        import llama_cpp  # noqa: F401
        return True
    except Exception:                 # ImportError, or a library that does not load (OSError)
        return False


def skip_reason() -> str:
    """The one line a lesson prints when the engine is absent."""
    return (f"llama.cpp (llama-cpp-python) is not installed: the engine cells skip. Build it "
            f"once with `{MAKE}` (about 5 minutes) and run this notebook again.")


def require(feature: str | None = None):
    """The ``llama_cpp`` module, or a clear error: absent (how to build it), or built without
    ``feature`` (a function of its C API, e.g. ``"llama_model_quantize"``)."""
    try:
        import llama_cpp
    except ImportError:
        raise ImportError(f"llama.cpp's Python binding is not installed; build it with "
                          f"`{MAKE}` (or `{INSTALL}`), about 5 minutes once") from None
    except OSError as e:
        raise ImportError(f"llama_cpp is installed but its library does not load ({e}); "
                          f"rebuild it with `{MAKE}`") from None
    if feature is not None and not hasattr(llama_cpp, feature):
        raise RuntimeError(f"this llama-cpp-python ({getattr(llama_cpp, '__version__', '?')}) "
                           f"has no {feature}; the course needs version {VERSION}: "
                           f"`{MAKE}` installs it")
    return llama_cpp


def version() -> str | None:
    """The installed llama-cpp-python version, or None."""
    if not available():
        return None
    import llama_cpp
    return getattr(llama_cpp, "__version__", "?")


# ----------------------------------------------------------------------------- arguments
def _gguf_file(path, what: str = "path") -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be the path of a .gguf file; got {type(path).__name__}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{what} {path} is a folder; pass the .gguf file itself")
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist (write it with "
                                f"course_lib.export.export_gguf)")
    return path


def _threads(threads) -> int:
    if threads is None:
        return max(1, min(4, os.cpu_count() or 1))
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a whole number >= 1; got {threads!r}")
    return threads


def _ids(ids) -> list[int]:
    t = torch.as_tensor(ids)
    if t.dim() != 1 or t.numel() == 0 or t.is_floating_point():
        raise ValueError(f"ids must be a non-empty 1-D sequence of token ids; got shape "
                         f"{tuple(t.shape)} {t.dtype}")
    return [int(i) for i in t]


# ----------------------------------------------------------------------------- running it
def load(path, n_ctx: int = 512, threads: int | None = None):
    """A ``llama_cpp.Llama`` for a GGUF file that keeps every position's logits (quiet)."""
    llama_cpp = require()
    path = _gguf_file(path)
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 8:
        raise ValueError(f"n_ctx must be a whole number of tokens >= 8; got {n_ctx!r}")
    threads = _threads(threads)
    try:
        return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx,
                               n_threads=threads, n_threads_batch=threads, logits_all=True,
                               verbose=False)
    except ValueError as e:
        raise ValueError(f"llama.cpp could not load {path} ({e}): is it a complete GGUF file "
                         f"of a model llama.cpp knows?") from None


def _as_llm(model, n_ctx: int, threads):
    return load(model, n_ctx, threads) if isinstance(model, (str, os.PathLike)) else model


def logits(model, ids, threads: int | None = None) -> torch.Tensor:
    """The engine's logits (T, V) fp32 for token ids (T,), every position (lesson 13).
    ``model``: a GGUF path or a loaded ``Llama``."""
    toks = _ids(ids)
    llm = _as_llm(model, max(8, len(toks)), threads)
    if len(toks) > llm.n_ctx():
        raise ValueError(f"{len(toks)} tokens do not fit the context of {llm.n_ctx()}; load "
                         f"the model with a larger n_ctx")
    if max(toks) >= llm.n_vocab() or min(toks) < 0:
        raise ValueError(f"token ids must lie in 0..{llm.n_vocab() - 1}; got {min(toks)}.."
                         f"{max(toks)}")
    llm.reset()
    llm.eval(toks)
    return torch.from_numpy(np.array(llm.scores[: len(toks)], dtype=np.float32))


def score(model, ids, window: int = 512, n_windows: int = 2, ref=None,
          threads: int | None = None) -> dict:
    """Perplexity of the engine on ``n_windows`` disjoint windows of ``window`` tokens of
    ``ids``, each scored alone (``window - 1`` predictions per window): the protocol of
    ``smollm.reference``. With ``ref`` (that function's result on the same windows), also
    the KL divergence from the course's model and the top-1 agreement, and ``windows``: each
    figure per window (``nll_nats``, ``kl_nats``, ``top1_agreement``; lessons 13, 14)."""
    from course_lib import eval as ceval
    for name, v, lo in (("window", window, 2), ("n_windows", n_windows, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be a whole number >= {lo}; got {v!r}")
    ids = torch.as_tensor(ids).long().flatten()
    if n_windows * window > len(ids):
        raise ValueError(f"{n_windows} windows of {window} tokens need {n_windows * window} "
                         f"tokens; ids holds {len(ids)}")
    llm = _as_llm(model, window, threads)
    nll, kl, top1, n = 0.0, 0.0, 0.0, 0
    per = {"nll_nats": [], "kl_nats": [], "top1_agreement": []}        # one figure a window
    for w in range(n_windows):
        block = ids[w * window:(w + 1) * window]                            # (window,)
        lp = torch.log_softmax(logits(llm, block[:-1]), -1)                  # (window-1, V)
        tgt = block[1:]
        w_nll = -float(lp.gather(1, tgt[:, None]).sum())
        nll += w_nll
        per["nll_nats"].append(w_nll / len(tgt))
        if ref is not None:
            r = ref.logprobs[n:n + window - 1]
            if r.shape != lp.shape or not torch.equal(ref.targets[n:n + window - 1], tgt):
                raise ValueError("ref was scored on other windows: make it with "
                                 "smollm.reference(model, n_windows, window) on the same ids")
            k, t1 = ceval.kl_and_top1(r, lp)
            kl += k * len(tgt)
            top1 += t1 * len(tgt)
            per["kl_nats"].append(k)
            per["top1_agreement"].append(t1)
        n += len(tgt)
    out = {"perplexity": math.exp(nll / n), "predictions": n, "n_windows": n_windows,
           "window": window}
    if ref is not None:
        out.update(kl_nats=kl / n, top1_agreement=top1 / n, windows=per)
    return out


def generate(model, ids, max_new_tokens: int = 8, threads: int | None = None) -> list[int]:
    """Greedy continuation of token ids by the engine: the new ids (lesson 13)."""
    toks = _ids(ids)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
            or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a whole number >= 1; got {max_new_tokens!r}")
    llm = _as_llm(model, 512, threads)
    llm.reset()
    llm.eval(toks)
    new = []
    for _ in range(max_new_tokens):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        new.append(nxt)
        llm.eval([nxt])
    return new


def decode_speed(model, prompt_ids, new_tokens: int = 32, runs: int = 3,
                 threads: int | None = None) -> dict:
    """Greedy decoding speed: ``runs`` times, the prompt is evaluated, then ``new_tokens``
    tokens are decoded one at a time and timed (prompt excluded). Returns the tokens/s of
    every run, their median, min and max, and the thread count (lesson 13)."""
    for name, v in (("new_tokens", new_tokens), ("runs", runs)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1; got {v!r}")
    toks = _ids(prompt_ids)
    threads = _threads(threads)
    llm = _as_llm(model, 512, threads)
    if len(toks) + new_tokens > llm.n_ctx():
        raise ValueError(f"prompt ({len(toks)}) + new_tokens ({new_tokens}) exceed the "
                         f"context of {llm.n_ctx()}")
    samples = []
    for _ in range(runs):
        llm.reset()
        llm.eval(toks)
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t0 = time.perf_counter()
        for _ in range(new_tokens):
            llm.eval([nxt])
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        samples.append(new_tokens / (time.perf_counter() - t0))
    return {"tokens_per_s": samples, "median": statistics.median(samples),
            "min": min(samples), "max": max(samples), "threads": threads,
            "new_tokens": new_tokens, "runs": runs}


def set_threads(model, threads: int) -> None:
    """Change a loaded engine's thread count (decoding and batches) in place (lesson 13)."""
    llama_cpp = require()
    threads = _threads(threads)
    llama_cpp.llama_set_n_threads(model._ctx.ctx, threads, threads)
    model.n_threads = model.n_threads_batch = threads


def prefill_speed(model, prompt_ids, runs: int = 2, threads: int | None = None) -> float:
    """Tokens/s of evaluating ``prompt_ids`` in one batch, the best of ``runs`` (lesson 13).

    A batch reads every weight once for all its tokens, so bytes stop being the limit: this
    is the rate at which the engine's batch kernels do one token's arithmetic on this machine,
    a *loose compute ceiling* of decoding. Loose, because a batch runs other kernels than a
    single token and they do less work per token (llama.cpp 0.3.36: a repacked Q4_0 matrix
    meets 4 or more rows in ``ggml_gemm_q4_0_8x8_q8_0`` and one row in
    ``ggml_gemv_q4_0_8x8_q8_0``, ``ggml/src/ggml-cpu/repack.cpp`` lines 4637-4647; F16 and
    Q8_0 batches go to llamafile's tiled kernels, which refuse a single row,
    ``ggml/src/ggml-cpu/llamafile/sgemm.cpp`` lines 3818-3822). Decoding one token at a time
    should not be faster; being slower does not by itself mean it waits for memory.
    """
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"runs must be a whole number >= 1; got {runs!r}")
    toks = _ids(prompt_ids)
    if len(toks) < 16:
        raise ValueError(f"a prefill of {len(toks)} tokens measures launch costs, not "
                         "arithmetic: give at least 16 prompt tokens (lesson 13 uses 128)")
    llm = _as_llm(model, 512, threads)
    if len(toks) > llm.n_ctx():
        raise ValueError(f"the prompt ({len(toks)} tokens) exceeds the context of {llm.n_ctx()}")
    best = 0.0
    for _ in range(runs):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(toks)
        best = max(best, len(toks) / (time.perf_counter() - t0))
    return best


def speed_limits(models: dict, files: dict, threads=(1, 2), new_tokens: int = 48,
                 runs: int = 3, prompt_tokens: int = 128, progress=None) -> dict:
    """Decode speed against its two limits, all measured on this machine (lesson 13).

    For each thread count T: the read bandwidth with T threads (``course_lib.bandwidth``),
    then for every file (loaded engines in ``models``, paths in ``files``, same keys) the
    decode tokens/s (``runs`` rounds, the files taking turns, so a busy moment of the machine
    hits them all alike) and the prefill tokens/s of a ``prompt_tokens`` prompt. Two limits:

    * **memory**: read bandwidth / bytes per token (lesson 00's rule);
    * **compute**: the prefill rate, the engine's arithmetic for one token when bytes are free,
      run by its batch kernels (a loose bound: see :func:`prefill_speed`).

    Decoding can beat neither; ``limit`` names the lower one. ``progress``: a callable given
    one line per step (``tqdm.write`` in the notebook), or None.
    """
    from course_lib import bandwidth, smollm

    if set(models) != set(files):
        raise ValueError(f"models and files must have the same keys; got {sorted(models)} "
                         f"and {sorted(files)}")
    threads = [_threads(t) for t in threads]
    say = progress or (lambda line: None)
    prompt = smollm.tokenizer().encode("The capital of France is")
    prefill_ids = smollm.eval_ids()[:prompt_tokens]
    out = {"threads": threads, "new_tokens": new_tokens, "runs": runs,
           "prompt_tokens": prompt_tokens, "bandwidth_gbps": {}, "rows": {}}
    torch_threads = torch.get_num_threads()
    for T in threads:
        torch.set_num_threads(T)                 # the bandwidth the engine's T threads can pull
        try:
            bw = bandwidth.measure_read_bandwidth("cpu").median_gbps
        finally:
            torch.set_num_threads(torch_threads)
        out["bandwidth_gbps"][T] = bw
        say(f"{T} thread(s): read bandwidth {bw:.1f} GB/s")
        for llm in models.values():
            set_threads(llm, T)
        samples = {n: [] for n in models}
        for _ in range(runs):
            for n, llm in models.items():
                samples[n] += decode_speed(llm, prompt, new_tokens, 1, T)["tokens_per_s"]
        for n, llm in models.items():
            nbytes = bytes_per_token(files[n])
            memory = predicted_tokens_per_s(nbytes, bw)
            compute = prefill_speed(llm, prefill_ids, 2, T)
            row = out["rows"].setdefault(n, {"bytes_per_token": nbytes})
            row[T] = {"decode": samples[n], "median": statistics.median(samples[n]),
                      "max": max(samples[n]), "min": min(samples[n]),
                      "memory_limit": memory, "compute_limit": compute,
                      "limit": "memory" if memory < compute else "compute"}
            r = row[T]
            say(f"  {n:10s} decode {r['median']:6.1f} tokens/s ({r['min']:.1f}-{r['max']:.1f}); "
                f"limits: memory {memory:6.1f}, compute {compute:6.1f}")
    return out


def quantize_file(src, dst, fmt: str, allow_requantize: bool = False,
                  overwrite: bool = False, threads: int | None = None) -> Path:
    """llama.cpp's own quantizer (``llama_model_quantize``) from GGUF ``src`` to ``dst`` in
    ``fmt`` ("f16", "q8_0", "q4_0", "q4_1"; the k-quant mixes "q4_k_m", "q4_k_s", "q3_k_m" of
    lesson 14). llama.cpp refuses to requantize a file whose
    weights are already quantized unless ``allow_requantize=True`` (the double-quantization
    trap of lesson 13). Written under a temporary name and renamed: nothing half-written."""
    llama_cpp = require("llama_model_quantize")
    src = _gguf_file(src, "src")
    if not isinstance(fmt, str) or fmt.lower() not in FTYPES:
        raise ValueError(f"fmt must be one of {sorted(FTYPES)}; got {fmt!r}")
    for name, v in (("allow_requantize", allow_requantize), ("overwrite", overwrite)):
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be True or False; got {v!r}")
    if not isinstance(dst, (str, os.PathLike)) or Path(dst).suffix != ".gguf":
        raise ValueError(f"dst must be a path ending in .gguf; got {dst!r}")
    dst = Path(dst)
    if dst.resolve() == src.resolve():
        raise ValueError("dst must differ from src (llama.cpp reads src while writing dst)")
    if dst.exists() and not overwrite:
        raise FileExistsError(f"{dst} exists; pass overwrite=True to replace it")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[fmt.lower()]
    params.allow_requantize = allow_requantize
    params.nthread = _threads(threads)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".partial", dir=dst.parent)
    os.close(fd)
    try:
        from llama_cpp._utils import suppress_stdout_stderr
        with suppress_stdout_stderr(disable=False):       # llama.cpp logs every tensor
            rc = llama_cpp.llama_model_quantize(str(src).encode(), tmp.encode(), params)
        if rc != 0:
            hint = "" if allow_requantize else (" (its weights may be quantized already: "
                                                "llama.cpp requantizes only with "
                                                "allow_requantize=True)")
            raise RuntimeError(f"llama_model_quantize failed on {src.name} -> {fmt} (code "
                               f"{rc}){hint}")
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dst


# ----------------------------------------------------------------------------- ggml's quantizer
#: ggml's tensor types (``enum ggml_type``) for the block formats of lessons 13 and 14.
GGML_TYPES = {"q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q4_k": 12, "q5_k": 13,
              "q6_k": 14}
_GGML = None


def _libggml():
    """The engine's ``libggml-base`` through ctypes, loaded once, lazily (lesson 14)."""
    global _GGML
    if _GGML is None:
        import ctypes
        llama_cpp = require()
        lib_dir = Path(llama_cpp.__file__).resolve().parent / "lib"
        found = sorted(lib_dir.glob("libggml-base.*")) if lib_dir.is_dir() else []
        if not found:
            raise ImportError(f"llama_cpp has no libggml-base library in {lib_dir}; rebuild it "
                              f"with `{MAKE}`")
        lib = ctypes.CDLL(str(found[0]))
        f = lib.ggml_quantize_chunk
        f.restype = ctypes.c_size_t
        f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                      ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        _GGML = lib
    return _GGML


def quantize_chunk(rows, fmt: str, imatrix=None) -> np.ndarray:
    """llama.cpp's own bytes for ``rows`` (n, k) in block format ``fmt``: its C function
    ``ggml_quantize_chunk(type, src, dst, start, nrows, n_per_row, imatrix)``, the one
    ``llama_model_quantize`` calls for every tensor, through ctypes (lesson 14). ``imatrix``:
    optional importance weights (k,), one per column. Returns uint8 (n, bytes per row); the
    course's :func:`course_lib.kquants.quantize` must give the same bytes."""
    from course_lib import kquants
    if not isinstance(fmt, str) or fmt.lower() not in GGML_TYPES:
        raise ValueError(f"fmt must be one of {sorted(GGML_TYPES)}; got {fmt!r}")
    fmt = fmt.lower()
    x = np.ascontiguousarray(torch.as_tensor(rows).detach().float().cpu().numpy())
    if x.ndim != 2 or x.size == 0:
        raise ValueError(f"rows must be a non-empty 2-D array (n, k); got shape {x.shape}")
    n, k = x.shape
    if not kquants.fits(fmt, k):
        raise ValueError(f"{fmt.upper()} needs rows a multiple of {kquants.BLOCKS[fmt][0]} "
                         f"wide; got {k}")
    qw = None if imatrix is None else np.ascontiguousarray(kquants.check_imatrix(imatrix, k))
    lib = _libggml()
    out = np.zeros((n, kquants.row_bytes(fmt, k)), np.uint8)
    size = lib.ggml_quantize_chunk(GGML_TYPES[fmt], x.ctypes.data, out.ctypes.data, 0, n, k,
                                   None if qw is None else qw.ctypes.data)
    if size != out.size:
        raise RuntimeError(f"ggml_quantize_chunk wrote {size} bytes, expected {out.size}")
    return out


def dequantize_chunk(raw, fmt: str, cols: int) -> np.ndarray:
    """llama.cpp's own decoding of rows of ``fmt`` bytes (n, bytes per row) to float32
    (n, cols): its ``dequantize_row_*`` functions through ctypes (lesson 14)."""
    import ctypes
    from course_lib import kquants
    if not isinstance(fmt, str) or fmt.lower() not in GGML_TYPES:
        raise ValueError(f"fmt must be one of {sorted(GGML_TYPES)}; got {fmt!r}")
    fmt = fmt.lower()
    raw = np.ascontiguousarray(raw)
    if raw.dtype != np.uint8 or raw.ndim != 2 or not kquants.fits(fmt, cols) or \
            raw.shape[1] != kquants.row_bytes(fmt, cols):
        raise ValueError(f"raw must be uint8 (n, {fmt.upper()} bytes of a {cols}-wide row); "
                         f"got {raw.shape} {raw.dtype}")
    f = getattr(_libggml(), f"dequantize_row_{fmt[:-1] + 'K' if fmt.endswith('_k') else fmt}")
    f.restype = None
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    out = np.zeros((raw.shape[0], cols), np.float32)
    f(raw.ctypes.data, out.ctypes.data, out.size)
    return out


# ----------------------------------------------------------------------------- prediction
def bytes_per_token(path) -> int:
    """Bytes of weights one decoded token reads: every tensor of the file (the tied token
    embedding counts whole: it is also the output head, read in full for every token)."""
    from course_lib.gguf_model import open_gguf
    reader = open_gguf(_gguf_file(path))
    return int(sum(int(t.n_bytes) for t in reader.tensors))


def predicted_tokens_per_s(n_bytes, bandwidth_gbps) -> float:
    """Lesson 00's floor turned into a speed: bandwidth / bytes per token, in tokens/s."""
    for name, v in (("n_bytes", n_bytes), ("bandwidth_gbps", bandwidth_gbps)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            raise ValueError(f"{name} must be a positive finite number; got {v!r}")
    return bandwidth_gbps * 1e9 / n_bytes


def decode_bytes(sizes: dict, n_vocab: int) -> int:
    """Bytes of weights a model reads to decode one token, from a GGUF file's tensor sizes
    ``{name: bytes}`` (lesson 13): every tensor once, except the token embedding, of which
    decoding looks up one row (``bytes / n_vocab``) when the file has its own ``output.weight``
    head; with tied embeddings (no ``output.weight``) the embedding *is* the head and is read
    whole."""
    if not isinstance(sizes, dict) or not sizes:
        raise ValueError("sizes must be a non-empty dict {tensor name: bytes}")
    if isinstance(n_vocab, bool) or not isinstance(n_vocab, int) or n_vocab < 1:
        raise ValueError(f"n_vocab must be a whole number >= 1; got {n_vocab!r}")
    for name, b in sizes.items():
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise ValueError(f"sizes[{name!r}] must be a whole number of bytes >= 0; got {b!r}")
    total = 0
    for name, b in sizes.items():
        if name == "token_embd.weight" and "output.weight" in sizes:
            total += b // n_vocab
        else:
            total += b
    return total


def choose_file(rows: list, ref_perplexity: float, budget: float) -> str:
    """The file to ship (lesson 13): among ``rows`` ({"file", "perplexity", "bytes"}) whose
    perplexity is at most ``ref_perplexity * (1 + budget)``, the smallest; on a tie in bytes,
    the lower perplexity. ``budget`` is a fraction (0.05 = 5 %). ValueError if none fits."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or \
            not 0 <= budget < 1:
        raise ValueError(f"budget is a fraction of the reference perplexity, 0 <= budget < 1 "
                         f"(0.05 for 5 %); got {budget!r}")
    if isinstance(ref_perplexity, bool) or not isinstance(ref_perplexity, (int, float)) or \
            not 1 <= ref_perplexity < math.inf:
        raise ValueError(f"ref_perplexity must be a finite number >= 1; got {ref_perplexity!r}")
    limit = ref_perplexity * (1 + budget)
    fits = [r for r in rows if r["perplexity"] <= limit]
    if not fits:
        raise ValueError(f"no file has perplexity <= {limit:.3f}: raise the budget or ship a "
                         f"larger format")
    return min(fits, key=lambda r: (r["bytes"], r["perplexity"]))["file"]


# ----------------------------------------------------------------------------- explaining the gap
def q8_codes_cpu(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations (rows, in) -> Q8_0 codes and fp16 scales the way llama.cpp's x86 CPU path
    makes them before its integer dot products (``quantize_row_q8_0``, AVX2): per block of 32,
    the scale is stored as fp16(max|x| / 127), but the codes are x times the fp32 ``127 / max``
    rounded half to *even* (``_mm256_round_ps``), not the reference quantizer's x / d with
    halves away from zero (``gguf_model.quantize_q8_0``, what weights get). Lesson 13."""
    if x.dim() != 2 or x.shape[-1] % 32 or not x.is_floating_point():
        raise ValueError(f"x must be float (rows, in) with in a multiple of 32; got "
                         f"{x.dtype} {tuple(x.shape)}")
    b = x.float().reshape(x.shape[0], -1, 32)                             # (rows, nb, 32)
    amax = b.abs().amax(-1, keepdim=True)                                 # (rows, nb, 1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))     # fp32, as the CPU does
    q = torch.round(b * inv)                                              # halves to even
    return q.to(torch.int8).reshape(x.shape), (amax / 127.0)[..., 0].half()


class q8_activations:
    """Inside ``with q8_activations(model):`` every Linear of a course model (the head too)
    sees its input rounded to Q8_0 blocks of 32 along the input, as llama.cpp's CPU dot
    products do for Q4_0/Q4_1/Q8_0 weights (lesson 13). ``rule="cpu"`` (the default) rounds the
    way its x86 CPU path does (``q8_codes_cpu``: fp32 127/max, halves to even); ``rule="ref"``
    the way its reference quantizer does (``gguf_model.quantize_q8_0``: x / d, halves away
    from zero). The difference left between the engine and the course model is then mostly
    fp16 rounding (KV cache, attention) and summation order."""

    def __init__(self, model: torch.nn.Module, rule: str = "cpu"):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a course LlamaModel; got {type(model).__name__}")
        if rule not in ("cpu", "ref"):
            raise ValueError(f"rule must be 'cpu' (llama.cpp's x86 path) or 'ref' (its reference "
                             f"quantizer); got {rule!r}")
        self.model, self.handles, self.rule = model, [], rule

    def _round(self, mod, inputs):
        from course_lib.gguf_model import quantize_q8_0
        x = inputs[0]                                                    # (..., in)
        if x.shape[-1] % 32:
            return None
        flat = x.reshape(-1, x.shape[-1])
        if self.rule == "cpu":
            q, d = q8_codes_cpu(flat)
            y = (q.reshape(q.shape[0], -1, 32).float() * d.float()[..., None]).reshape(x.shape)
        else:
            y = quantize_q8_0(flat).dequantize().reshape(x.shape)
        return (y.to(x.dtype),) + inputs[1:]

    def __enter__(self):
        for mod in self.model.modules():
            if isinstance(mod, torch.nn.Linear):
                self.handles.append(mod.register_forward_pre_hook(self._round))
        return self.model

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []
        return False


# ----------------------------------------------------------------------------- the full table
RESULTS_FILE = Path(__file__).resolve().parent.parent / "results" / "engine_smollm2.json"
#: SmolLM2's text protocol for lesson 13's table (course_lib.smollm.PROTOCOLS): calibration and
#: evaluation text share no verbatim run (lesson 04).
PROTOCOL = "clean"
SPEED_FILE = Path(__file__).resolve().parent.parent / "results" / "engine_speed_limits.json"


def committed_speed_limits(path: Path = SPEED_FILE) -> dict:
    """The committed ``speed_limits`` measurement (``python -m course_lib.engine limits``),
    thread counts back as integers; {} when the file is missing (lesson 13 without the engine)."""
    import json
    path = Path(path)
    if not path.exists():
        return {}
    out = json.loads(path.read_text())
    out["threads"] = [int(t) for t in out["threads"]]
    out["bandwidth_gbps"] = {int(t): v for t, v in out["bandwidth_gbps"].items()}
    out["rows"] = {n: {(int(k) if k.isdigit() else k): v for k, v in row.items()}
                   for n, row in out["rows"].items()}
    return out


def write_speed_limits(threads=(1, 2), new_tokens: int = 64, runs: int = 5,
                       path: Path = SPEED_FILE) -> dict:
    """``speed_limits`` on lesson 13's four files (F16, Q8_0, Q4_0 RTN and GPTQ), longer than
    the notebook's run, with the machine it ran on: ``python -m course_lib.engine limits``."""
    import json
    from course_lib import device, export
    from course_lib.methods import calibration as cal
    from course_lib.methods import gptq
    device.ensure_triton_mode()        # before anything imports triton (bandwidth needs it)
    from tqdm.auto import tqdm
    out_dir = Path(tempfile.mkdtemp(prefix="engine-speed-"))
    model = _fp16_model()
    m_gptq, _ = gptq.gptq_model(model, cal.calibration_ids("smollm2", 4, 256), 4, 32,
                                grid="q4_0", act_order=True)
    files = {"F16": export.export_gguf(model, out_dir / "f16.gguf", "f16"),
             "Q8_0": export.export_gguf(model, out_dir / "q8_0.gguf", "q8_0"),
             "Q4_0 RTN": export.export_gguf(cal.rtn_model(model, 4, 32, grid="q4_0"),
                                            out_dir / "q4_0_rtn.gguf", "q4_0"),
             "Q4_0 GPTQ": export.export_gguf(m_gptq, out_dir / "q4_0_gptq.gguf", "q4_0")}
    models = {n: load(f, threads=max(threads)) for n, f in files.items()}
    res = speed_limits(models, files, threads, new_tokens, runs, progress=tqdm.write)
    res["machine"] = {**device.machine_record(), "load_avg_1min": os.getloadavg()[0]}
    res["command"] = (f"python -m course_lib.engine limits --threads {' '.join(map(str, threads))} "
                      f"--new-tokens {new_tokens} --runs {runs}")
    res["engine"] = f"llama-cpp-python=={version()} ({CMAKE_ARGS})"
    of_memory = [r[t]["median"] / r[t]["memory_limit"] for r in res["rows"].values()
                 for t in res["threads"]]
    res["note"] = (f"compute_limit is the prefill rate of a prompt_tokens batch, a loose bound: "
                   f"llama.cpp runs batches through other kernels than single tokens (repacked "
                   f"Q4_0: ggml_gemm_q4_0_8x8_q8_0 vs ggml_gemv_q4_0_8x8_q8_0, "
                   f"ggml/src/ggml-cpu/repack.cpp lines 4637-4647 in llama-cpp-python 0.3.36). "
                   f"Every file decoded at {min(of_memory):.0%}-{max(of_memory):.0%} of "
                   f"memory_limit here.")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1) + "\n")
    del models
    import shutil
    shutil.rmtree(out_dir, ignore_errors=True)
    return res


def _fp16_model():
    from course_lib import smollm
    model = smollm.load()
    for p in model.parameters():                   # what an F16 file holds, exactly
        p.data = p.data.half().float()
    return model


def write_table(n_windows: int = 8, calib_windows: int = 16, runs: int = 5,
                new_tokens: int = 64, threads: int | None = None,
                build_seconds: float | None = None, path: Path = RESULTS_FILE) -> dict:
    """Lesson 13's tables on the full protocol: perplexity / KL / top-1 through the engine and
    in the course for F16, Q8_0, Q4_0 (RTN, GPTQ, AWQ on llama.cpp's grid), the packaged Q4_1
    file and its requantization to Q4_0; decode tokens/s (``runs`` interleaved runs of
    ``new_tokens``) beside bandwidth / bytes. ``python -m course_lib.engine table``."""
    import json
    from course_lib import bandwidth, export, smollm
    from course_lib import protocol as cprotocol
    from course_lib.gguf_model import quantize_q8_0
    from course_lib.methods import awq, gptq
    from course_lib.methods import calibration as cal
    from course_lib import device
    device.ensure_triton_mode()        # before anything imports triton (bandwidth needs it)
    require("llama_model_quantize")
    threads = _threads(threads if threads is not None else min(2, os.cpu_count() or 1))
    t_all = time.perf_counter()
    bw = bandwidth.measure_copy_bandwidth("cpu")
    out_dir = Path(tempfile.mkdtemp(prefix="engine-table-"))
    model = _fp16_model()
    ref = smollm.reference(model, n_windows, protocol=PROTOCOL)
    ids_cal = cal.calibration_ids("smollm2", calib_windows, 512, protocol=PROTOCOL)
    seconds = {}
    t0 = time.perf_counter()
    m_gptq, _ = gptq.gptq_model(model, ids_cal, 4, 32, grid="q4_0", act_order=True)
    seconds["gptq"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    m_awq, _ = awq.awq_model(model, ids_cal, 4, 32, grid="q4_0")
    seconds["awq"] = time.perf_counter() - t0
    m_rtn = cal.rtn_model(model, 4, 32, grid="q4_0")
    models = {"F16": (model, "f16"), "Q8_0": (model, "q8_0"), "Q4_0 RTN": (m_rtn, "q4_0"),
              "Q4_0 GPTQ": (m_gptq, "q4_0"), "Q4_0 AWQ": (m_awq, "q4_0")}
    files = {name: export.export_gguf(m, out_dir / f"{name.replace(' ', '_')}.gguf", fmt)
             for name, (m, fmt) in models.items()}
    files["Q4_1 (packaged)"] = smollm.gguf_path()
    files["Q4_1 requantized to Q4_0"] = quantize_file(
        smollm.gguf_path(), out_dir / "twice.gguf", "q4_0", allow_requantize=True,
        threads=threads)
    rows = []
    for name, f in files.items():
        r = {"file": name, "bytes": f.stat().st_size, "bytes_per_token": bytes_per_token(f)}
        e = score(f, smollm.eval_ids(PROTOCOL), 512, n_windows, ref, threads)
        r.update({f"engine_{k}": e[k] for k in ("perplexity", "kl_nats", "top1_agreement")})
        r["engine_windows"] = e["windows"]
        if name in models:
            m = models[name][0]
            if models[name][1] != "f16":
                import copy
                m = copy.deepcopy(m)
                emb = m.model.embed_tokens.weight
                emb.data = quantize_q8_0(emb.data).dequantize()     # the file's Q8_0 embedding
            c = cprotocol.score(m, ref) if name != "F16" else {"perplexity": ref.perplexity,
                                                                "kl_nats": 0.0,
                                                                "top1_agreement": 1.0}
            r.update({f"course_{k}": c[k] for k in ("perplexity", "kl_nats", "top1_agreement")})
            if "windows" in c:
                r["course_windows"] = c["windows"]
        rows.append(r)
    from course_lib import smollm as sm
    prompt = sm.tokenizer().encode("The capital of France is")
    speed_files = ["F16", "Q8_0", "Q4_0 RTN", "Q4_0 GPTQ", "Q4_1 (packaged)"]
    llms = {n: load(files[n], threads=threads) for n in speed_files}
    samples = {n: [] for n in speed_files}
    for _ in range(runs):
        for n in speed_files:
            samples[n] += decode_speed(llms[n], prompt, new_tokens, 1, threads)["tokens_per_s"]
    speed = []
    for n in speed_files:
        nb = bytes_per_token(files[n])
        pred = predicted_tokens_per_s(nb, bw.median_gbps)
        med = statistics.median(samples[n])
        speed.append({"file": n, "tokens_per_s": samples[n], "median": med,
                      "min": min(samples[n]), "max": max(samples[n]), "bytes_per_token": nb,
                      "predicted_tokens_per_s": pred, "measured_over_predicted": med / pred})
    out = {"engine": f"llama-cpp-python=={version()}", "cmake_args": CMAKE_ARGS,
           "build_seconds": build_seconds,
           "protocol": {"name": PROTOCOL, "text": "course_lib.data.clean_split()[1]",
                        "n_windows": n_windows, "window_tokens": 512,
                        "spread": "per-window figures (engine_windows, course_windows); "
                                  "course_lib.protocol.paired compares two files",
                        "reference": "course fp32 LlamaModel, weights rounded to fp16",
                        "calibration": {"windows": calib_windows, "tokens": 512,
                                        "text": "course_lib.data.clean_split()[0]",
                                        "gptq": "act_order, grid q4_0", "awq": "grid q4_0"}},
           "machine": {**device.machine_record(),
                       "cpus": os.cpu_count(), "engine_threads": threads,
                       "load_avg_1min": os.getloadavg()[0],
                       "copy_bandwidth_gbps": bw.median_gbps},
           "seconds": {**{k: round(v, 1) for k, v in seconds.items()},
                       "total": round(time.perf_counter() - t_all, 1)},
           "reference_perplexity": ref.perplexity, "rows": rows,
           "speed": {"runs": runs, "new_tokens": new_tokens, "threads": threads, "rows": speed}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    del llms
    import shutil
    shutil.rmtree(out_dir, ignore_errors=True)
    return out


def main(argv=None) -> None:
    import argparse
    p = argparse.ArgumentParser(prog="python -m course_lib.engine",
                                description="lesson 13's tables through llama.cpp")
    p.add_argument("command", choices=["table", "limits"],
                   help="table: perplexity/KL/speed (results/engine_smollm2.json); limits: decode "
                        "speed against its two limits (results/engine_speed_limits.json)")
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--calib-windows", type=int, default=16)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, nargs="+", default=None)
    p.add_argument("--build-seconds", type=float, default=None)
    a = p.parse_args(argv)
    if a.command == "limits":
        res = write_speed_limits(tuple(a.threads or (1, 2)), a.new_tokens, a.runs)
        print(f"wrote {SPEED_FILE}: {res['machine'].get('cpu')}")
        return
    if a.threads and len(a.threads) > 1:
        p.error("table takes one --threads value")
    a.threads = a.threads[0] if a.threads else None
    out = write_table(a.windows, a.calib_windows, a.runs, a.new_tokens, a.threads,
                      a.build_seconds)
    for r in out["rows"]:
        print(r)
    for r in out["speed"]["rows"]:
        print({k: v for k, v in r.items() if k != "tokens_per_s"})


if __name__ == "__main__":
    main()
