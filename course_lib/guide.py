"""Choosing a scheme: the course's own measured summary, which GPUs compute which formats,
a decision rule with its reasons and evidence, and the serving commands (lesson 12,
``notebooks/12_validate_and_choose.ipynb``).

Nothing here retypes a measured number: :func:`summary_rows` reads the JSON files that
earlier lessons' commands wrote to ``results/`` (``methods_*.json``, ``w8a8_*.json``,
``kv_*.json``, ``smollm2_rtn.json``, ``llm_int8_*.json``, ``bench_*.json``), and the
evidence behind a recommendation (:func:`recommend`) is read from those rows. The GPU
figures come from the catalogue in ``course_lib.hardware`` (lesson 00).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from course_lib import hardware as hw

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"
MODELS = ("smollm2", "bundled")
LIMITS = ("memory", "decode", "prefill", "accuracy")
SCHEMES = {
    "bf16": "BF16, not quantized",
    "w8a16": "W8A16: 8-bit weights (INT8 per channel, or FP8), 16-bit maths",
    "w4a16": "W4A16: 4-bit weights in groups of 128 (GPTQ or AWQ), 16-bit maths",
    "fp8_w8a8": "FP8 W8A8: FP8 weights per channel, FP8 activations per token (dynamic)",
    "int8_w8a8": "INT8 W8A8 with SmoothQuant: INT8 weights and activations",
}
#: Decode (batch 1) and prefill shapes whose ratios the summary quotes: (K, N, M).
DECODE_SHAPE = (8192, 28672, 1)        # a 70B gate/up projection, one token
PREFILL_SHAPE = (8192, 8192, 4096)     # a 70B q/o projection, a 4,096-token prompt


# ---------------------------------------------------------------------------------------
# Reading results/
# ---------------------------------------------------------------------------------------

def load_results(results_dir: str | Path = RESULTS_DIR) -> dict[str, dict]:
    """Every ``results/*.json`` as {file name: parsed JSON} (lesson 12)."""
    d = Path(results_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"{d} is not a folder; the results live in the course's results/")
    return {p.name: json.loads(p.read_text()) for p in sorted(d.glob("*.json"))}


def newest_bench(results: dict, kind: str = "cuda") -> tuple[str, dict] | tuple[None, None]:
    """The newest benchmark (``bench_*.json``, lesson 10) run on a ``kind`` device ("cuda" or
    "cpu") in ``results``, as (file name, data); (None, None) when there is none."""
    found = [(v.get("created_utc", ""), k) for k, v in results.items()
             if k.startswith("bench_") and v.get("device", {}).get("kind") == kind]
    if not found:
        return None, None
    name = max(found)[1]
    return name, results[name]


def gpu_bench(results: dict) -> tuple[str, dict] | tuple[None, None]:
    """The newest GPU benchmark in ``results`` as (file, data) (lesson 12's speed columns)."""
    return newest_bench(results, "cuda")


def bench_ratio(bench: dict | None, label: str, shape: tuple[int, int, int]) -> float | None:
    """Speed of ``label`` relative to the benchmark's baseline (BF16 on a GPU) at one layer
    shape (K, N, M), or None when that row was not measured (lessons 10 and 12)."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__") or len(shape) != 3 or \
            not all(isinstance(v, int) and not isinstance(v, bool) for v in shape):
        raise ValueError(f"shape is a layer shape (K, N, M): input width, output width and "
                         f"batch, three whole numbers as in the benchmark's rows (e.g. (4096, "
                         f"4096, 1)); got {shape!r}")
    if not bench:
        return None
    K, N, M = shape
    for layer in bench.get("layers", []):
        if (layer["K"], layer["N"], layer["M"]) == (K, N, M) and label in layer["results"]:
            return layer["results"][label].get("ratio_vs_baseline")
    return None


def decode_ratio(bench: dict | None, label: str) -> float | None:
    """End-to-end decode tokens/s of ``label`` over the baseline's (the benchmark's decode
    section: several layers at batch 1), or None."""
    if not bench:
        return None
    row = bench.get("decode", {}).get("results", {}).get(label)
    return None if row is None else row.get("ratio_vs_baseline")


def best_swept(results: dict, kernel: str = "w4a16") -> tuple[str, dict] | tuple[None, None]:
    """The fastest launch plan of ``kernel`` in a GPU launch-plan sweep (``sweep_gemv_*.json``,
    lesson 10), as (file, row with ``speedup_vs_bf16``), or (None, None) when none was run."""
    for name in sorted(results):
        if name.startswith("sweep_gemv"):
            rows = [r for r in results[name].get("rows", []) if r.get("kernel") == kernel
                    and r.get("speedup_vs_bf16") is not None]
            if rows:
                return name, max(rows, key=lambda r: r["speedup_vs_bf16"])
    return None, None


def swept_activation_prep_ms(results: dict, sweep_name: str, shape: str) -> float | None:
    """The W4A16 activation preparation timed alone in a launch-plan sweep (lesson 10), in ms,
    at the named shape; the sweep's W4A16 times include it. None when not recorded."""
    for sh in results.get(sweep_name, {}).get("shapes", []):
        if sh.get("shape") == shape:
            return sh.get("w4a16_activation_prep_ms")
    return None


def _methods_row(results, model, method, bits, group_size):
    data = results.get(f"methods_{model}.json")
    for r in (data or {}).get("rows", []):
        if (r["method"], r["bits"], r["group_size"]) == (method, bits, group_size):
            return r
    return None


def _w8a8_row(results, model, variant):
    data = results.get(f"w8a8_{model}.json")
    return next((r for r in (data or {}).get("rows", []) if r["variant"] == variant), None)


def _kv_row(results, model, fmt):
    data = results.get("kv_smollm2.json" if model == "smollm2" else "kv_tiny.json")
    if not data or fmt not in data.get("overall", {}):
        return None
    return {**data["overall"][fmt], "bits_per_value": data["bits_per_value"][fmt],
            "context": data["context"]}


#: The summary's rows: (scheme key, label, where the quality comes from, GPU bench label).
SUMMARY_SPEC = [
    ("w8a16", "W8A16 INT8 per channel (RTN)", ("w8a8", "W8A16 INT8 (weights only)"), "w8a16"),
    ("w4a16", "W4A16 INT4 g32, round-to-nearest", ("methods", "rtn", 4, 32), "w4a16 g128"),
    ("w4a16", "W4A16 INT4 g32, GPTQ act-order", ("methods", "gptq+act", 4, 32), "w4a16 g128"),
    ("w4a16", "W4A16 INT4 g32, AWQ", ("methods", "awq", 4, 32), "w4a16 g128"),
    ("w3a16", "W3A16 INT3 g32, GPTQ act-order", ("methods", "gptq+act", 3, 32), None),
    ("fp8_w8a8", "W8A8 FP8 E4M3, dynamic per token", ("w8a8", "W8A8 FP8 E4M3 dynamic per-token"),
     "fp8 w8a8"),
    ("int8_w8a8", "W8A8 INT8 dynamic per token + SmoothQuant 0.5",
     ("w8a8", "W8A8 INT8 dynamic per-token + SmoothQuant 0.5"), "int8 w8a8"),
    ("int8_w8a8", "W8A8 INT8 static per tensor, no smoothing",
     ("w8a8", "W8A8 INT8 static per-tensor"), None),
    ("llm_int8", "LLM.int8() (outliers > 6.0 kept in 16-bit)",
     ("w8a8", "LLM.int8() (threshold 6.0)"), None),
    ("kv_fp8", "KV cache FP8 E4M3, one scale per layer", ("kv", "fp8_tensor"), None),
    ("kv_int8", "KV cache INT8, scale per token and head", ("kv", "int8"), None),
    ("kv_kivi4", "KV cache KIVI 4-bit", ("kv", "kivi4"), None),
    ("kv_kivi2", "KV cache KIVI 2-bit", ("kv", "kivi2"), None),
]


def summary_rows(results: dict, model: str = "smollm2") -> list[dict]:
    """The course's measured summary for ``model`` ("smollm2" or "bundled"), read from the
    results files (lesson 12). Rows whose file is missing are left out.

    Each row: scheme, label, bits (per weight, or per cached value for KV rows), kl, top1,
    ppl (SmolLM2 only), source (file name), split (SmolLM2: the text protocol its file was
    measured on, "clean" or "v1"), and from the newest GPU benchmark decode_x
    (batch-1 layer at :data:`DECODE_SHAPE`), prefill_x (:data:`PREFILL_SHAPE`) and e2e_x
    (end-to-end decode), each as a speed ratio over BF16; None where not measured.
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; the summary exists for {', '.join(MODELS)}")
    bench_name, bench = gpu_bench(results)
    rows = []
    for scheme, label, (kind, *key), bench_label in SUMMARY_SPEC:
        if kind == "methods":
            r, source = _methods_row(results, model, *key), f"methods_{model}.json"
            bits = r and r["bits_per_weight"]
        elif kind == "w8a8":
            r, source = _w8a8_row(results, model, key[0]), f"w8a8_{model}.json"
            bits = 8.0
        else:
            r = _kv_row(results, model, key[0])
            source = "kv_smollm2.json" if model == "smollm2" else "kv_tiny.json"
            bits = r and r["bits_per_value"]
        if r is None:
            continue
        kv_row = kind == "kv"
        split = results[source].get("protocol") if model == "smollm2" else None
        rows.append({
            "scheme": scheme, "label": label, "bits": bits,
            "kl": r["kl"] if kv_row else r["kl_nats"],
            "top1": r["top1"] if kv_row else r["top1_agreement"],
            "ppl": r.get("ppl") if kv_row else r.get("perplexity"), "source": source,
            # SmolLM2's text: "clean" (lesson 04's split) or "v1" (its first split, whose
            # halves overlap: files not yet rerun say so); None for the bundled model
            "split": (split.get("name", "v1") if isinstance(split, dict) else "v1")
            if model == "smollm2" else None,
            "decode_x": bench_ratio(bench, bench_label, DECODE_SHAPE) if bench_label else None,
            "prefill_x": bench_ratio(bench, bench_label, PREFILL_SHAPE) if bench_label else None,
            "e2e_x": decode_ratio(bench, bench_label) if bench_label else None,
            "bench": bench_name if bench_label else None})
    return rows


def find_row(rows: list[dict], label_start: str) -> dict:
    """The summary row whose label starts with ``label_start`` (lesson 12)."""
    for r in rows:
        if r["label"].startswith(label_start):
            return r
    raise KeyError(f"no summary row starts with {label_start!r}; rows: "
                   f"{', '.join(r['label'] for r in rows)}")


def format_summary(rows: list[dict]) -> str:
    """The summary as a plain-text table (lesson 12)."""
    def x(v):
        return "-" if v is None else f"{v:.2f}x"
    split = any(r.get("split") for r in rows)
    table = [(r["label"], r["bits"], r["kl"], r["top1"], "-" if r["ppl"] is None else r["ppl"],
              *((r.get("split") or "-",) if split else ()),
              x(r["decode_x"]), x(r["prefill_x"]), x(r["e2e_x"])) for r in rows]
    return hw.format_table(table, ["scheme", "bits", "KL (nats)", "top-1", "ppl",
                                   *(("text",) if split else ()),
                                   "GPU decode b1", "GPU prefill", "GPU e2e decode"])


# ---------------------------------------------------------------------------------------
# Which GPUs compute which formats
# ---------------------------------------------------------------------------------------

SUPPORT_FORMATS = ("bf16", "fp8", "int8", "fp4")


def support_rows() -> list[dict]:
    """Per catalogue GPU: native dense rate for each format's maths (None: not native, the
    engine unpacks to 16-bit: memory and bandwidth saved, compute not). Lesson 12."""
    return [{"gpu": g.name, "arch": g.arch, "cc": g.compute_capability,
             **{f: g.native_tflops(f) for f in SUPPORT_FORMATS}} for g in hw.GPUS.values()]


def format_support(rows: list[dict] | None = None) -> str:
    """:func:`support_rows` as text: TFLOPS where native, "16-bit" where the maths falls back."""
    rows = support_rows() if rows is None else rows
    table = [(r["gpu"], r["arch"], r["cc"] or "-",
              *[("16-bit" if r[f] is None else r[f]) for f in SUPPORT_FORMATS]) for r in rows]
    return hw.format_table(table, ["GPU", "arch", "cc", "BF16 TF", "FP8 TF", "INT8 TOPS",
                                   "FP4 TF"])


# ---------------------------------------------------------------------------------------
# The decision rule
# ---------------------------------------------------------------------------------------

def _check_params(params) -> float:
    if isinstance(params, bool) or not isinstance(params, (int, float)) \
            or not math.isfinite(params) or params <= 0:
        raise ValueError(f"params is the model's parameter count, a number > 0 (8.03e9 for "
                         f"Llama 3.1 8B); got {params!r}")
    return float(params)


def _check_count(name: str, value, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1 ({example}); got {value!r}")
    return value


#: The catalogue models whose KV shapes the rule assumes for a model of a given size.
KV_SHAPE_MODELS = ("Llama 3.1 8B", "Llama 3.1 70B", "Llama 3.1 405B")


def kv_bytes_per_token_for(params: float) -> float:
    """BF16 KV-cache bytes per token assumed for a model of ``params`` parameters: those of
    the Llama 3.1 model nearest in size (on a log scale), 8B below about 24B parameters,
    70B up to about 169B, 405B above (lesson 12). 8.03e9 -> 131,072; 70.6e9 -> 327,680.
    A model with its own config should use ``hw.kv_bytes_per_token_from_config`` instead."""
    params = _check_params(params)
    nearest = min(KV_SHAPE_MODELS, key=lambda m: abs(math.log(hw.get_model(m).params / params)))
    return hw.model_kv_bytes_per_token(nearest, "bf16")


#: An FP8 KV cache is advised when the BF16 cache of the whole batch weighs at least this
#: share of the model's BF16 weights: then halving the cache saves at least 10% of the
#: bytes a BF16 decode step reads (0.5 x 0.25 / 1.25), more with quantized weights.
KV_FP8_SHARE = 0.25


def choose_kv_cache(limit: str, params: float, batch: int = 1, context: int = 4096) -> str:
    """The KV-cache format for ``batch`` conversations of ``context`` tokens (lesson 12):
    "fp8" when the BF16 cache weighs at least :data:`KV_FP8_SHARE` of the BF16 weights and
    the limit is not accuracy (lesson 11 measured an FP8 cache's small but real KL), else
    "bf16". Long contexts and large batches make the cache the bigger read (lesson 11)."""
    if limit not in LIMITS:
        raise ValueError(f"unknown limit {limit!r}; choose one of {', '.join(LIMITS)}")
    params = _check_params(params)
    batch = _check_count("batch", batch, "the number of conversations decoded together, e.g. 8")
    context = _check_count("context", context, "tokens per conversation, e.g. 4096")
    cache_gb = batch * context * kv_bytes_per_token_for(params) / hw.GB
    if limit != "accuracy" and cache_gb >= KV_FP8_SHARE * params * 2 / hw.GB:
        return "fp8"
    return "bf16"


def choose_scheme(limit: str, gpu: str, params: float, batch: int = 1,
                  context: int = 4096) -> tuple[str, str]:
    """(weight scheme, KV-cache format) for what limits you, on one GPU of the catalogue, for
    ``batch`` conversations of ``context`` tokens (lesson 12).

    The KV format is :func:`choose_kv_cache`'s. Weights have *room* in a format when they,
    the KV cache of the whole batch (in that KV format, :func:`kv_bytes_per_token_for`) and
    the engine's workspace (``hw.DEFAULT_WORKSPACE_GB``) fit the memory an engine may use
    (``gpu.usable_gb()``, 90%): fitting the weights alone is not serving (lesson 00).

    - ``accuracy``: "bf16" when BF16 weights have room, otherwise "w8a16" (the closest to
      the reference the course measured);
    - ``memory``: 8 bits when 8-bit weights have room ("fp8_w8a8" where FP8 maths is native,
      else "w8a16"), otherwise "w4a16";
    - ``decode`` (tokens/s of a batch of at most a few dozen users, memory-bound): "w4a16"
      when 8-bit weights have no room; otherwise "fp8_w8a8" where FP8 maths is native, else
      "int8_w8a8" where INT8 is, else "w8a16". That branch rests on ONE measurement: the
      course's first, untuned Triton kernels on one H200 (``bench_cuda_nvidia_h200_quick.json``,
      the 70B-sized layer of :data:`DECODE_SHAPE`): W8A8 1.68x BF16 at batch 1 (1.62x at 16),
      W4A16 0.62x (0.87x). Serving practice with tuned kernels says otherwise for
      latency-bound decode: Kurtic et al. (arXiv:2411.02355, vLLM with Marlin W4A16 kernels)
      find W4A16 the most cost-efficient for synchronous (latency-bound) serving and W8A8 for
      asynchronous continuous batching on high-end GPUs; see :data:`DECODE_PRACTICE`;
    - ``prefill`` (long prompts, big batches: compute-bound): "fp8_w8a8" where FP8 maths is
      native, else "int8_w8a8" where INT8 maths is, else "bf16".
    """
    if limit not in LIMITS:
        raise ValueError(f"unknown limit {limit!r}; choose one of {', '.join(LIMITS)}")
    g = hw.get_gpu(gpu)
    params = _check_params(params)
    kv_cache = choose_kv_cache(limit, params, batch, context)
    fp8 = g.native_tflops("fp8") is not None
    int8 = g.native_tflops("int8") is not None
    cache_gb = batch * context * kv_bytes_per_token_for(params) / hw.GB / (2 if kv_cache == "fp8" else 1)
    room_gb = g.usable_gb() - hw.DEFAULT_WORKSPACE_GB - cache_gb    # what the weights may take
    if limit == "accuracy":
        return ("bf16" if params * 2 / hw.GB <= room_gb else "w8a16"), kv_cache
    if limit == "memory":
        if params * 1 / hw.GB <= room_gb:
            return ("fp8_w8a8" if fp8 else "w8a16"), kv_cache
        return "w4a16", kv_cache
    if limit == "decode":
        if params * 1 / hw.GB > room_gb:
            return "w4a16", kv_cache
        return ("fp8_w8a8" if fp8 else "int8_w8a8" if int8 else "w8a16"), kv_cache
    return ("fp8_w8a8" if fp8 else ("int8_w8a8" if int8 else "bf16")), kv_cache


#: What serving practice with tuned kernels finds for decode, beside the course's own
#: untuned measurement that :func:`choose_scheme` follows (lesson 12).
DECODE_PRACTICE = ("Kurtic et al., 'Give Me BF16 or Give Me Death' (arXiv:2411.02355, abstract; "
                   "vLLM, Marlin W4A16 kernels): W4A16 is the most cost-efficient for "
                   "synchronous (latency-bound) serving, W8A8 for asynchronous continuous "
                   "batching of mid and large models on high-end GPUs")


def _fmt_x(v) -> str:
    return "not measured" if v is None else f"{v:.2f}x BF16"


def _rule_answer(answer) -> tuple[str, str]:
    if (not isinstance(answer, (tuple, list)) or len(answer) != 2
            or answer[0] not in SCHEMES or answer[1] not in ("bf16", "fp8")):
        raise ValueError(f"the rule must return (weight scheme, kv cache) with a scheme among "
                         f"{', '.join(SCHEMES)} and a cache 'bf16' or 'fp8'; it returned {answer!r}")
    return answer[0], answer[1]


#: The batch sizes the GPU benchmark measured at decode (rows with M = 1 and M = 16).
DECODE_BATCHES = (1, 16)


def decode_evidence(bench: dict | None, batch: int) -> dict[str, float] | None:
    """The course's measured decode speed-ups over BF16 at the 70B-sized layer
    (:data:`DECODE_SHAPE`) for the measured batch nearest ``batch`` (1 or 16), per kernel
    label, or None without a GPU benchmark (lesson 12)."""
    if not bench:
        return None
    m = min(DECODE_BATCHES, key=lambda b: abs(math.log(b / batch)))
    shape = (DECODE_SHAPE[0], DECODE_SHAPE[1], m)
    out = {label: bench_ratio(bench, label, shape) for label in
           ("w8a16", "w4a16 g128", "fp8 w8a8", "int8 w8a8")}
    return {"batch": m, **{k: v for k, v in out.items() if v is not None}}


def recommend(limit: str, gpu: str, params: float, results: dict | None = None,
              rule=choose_scheme, batch: int = 1, context: int = 4096) -> dict:
    """``rule``'s (scheme, KV cache) with the reasons and the measured evidence behind it
    (lesson 12's decision widget). Evidence is read from ``results`` (default: the course's
    results/). ``rule`` takes (limit, gpu, params, batch, context).

    Returns {scheme, description, weights_gb, kv_cache, kv_gb, reasons: [...], evidence: [...]}.
    """
    results = load_results() if results is None else results
    g = hw.get_gpu(gpu)
    params = _check_params(params)
    batch = _check_count("batch", batch, "the number of conversations decoded together, e.g. 8")
    context = _check_count("context", context, "tokens per conversation, e.g. 4096")
    scheme, kv_cache = _rule_answer(rule(limit, gpu, params, batch, context))
    rows = summary_rows(results, "smollm2")
    bench_name, bench = gpu_bench(results)
    fp8 = g.native_tflops("fp8") is not None
    bits = {"bf16": 16, "w8a16": 8, "fp8_w8a8": 8, "int8_w8a8": 8, "w4a16": hw.bits_per_weight("int4_g128")}
    w_gb = params * bits[scheme] / 8 / hw.GB
    kv16_gb = batch * context * kv_bytes_per_token_for(params) / hw.GB
    kv_gb = kv16_gb / (2 if kv_cache == "fp8" else 1)
    need = w_gb + kv_gb + hw.DEFAULT_WORKSPACE_GB
    reasons = [f"{g.name} ({g.arch}): FP8 maths {'native' if fp8 else 'NOT native'}; "
               f"{g.memory_gb:g} GB, {g.usable_gb():.0f} usable by an engine",
               f"{batch} conversation(s) of {context:,} tokens: a KV cache of {kv_gb:.1f} GB in "
               f"{kv_cache.upper()} (the KV shape of the nearest Llama 3.1), weights {w_gb:.1f} GB "
               f"({params * 2 / hw.GB:.1f} GB in BF16), workspace {hw.DEFAULT_WORKSPACE_GB:g} GB: "
               f"{need:.1f} GB" + ("" if need <= g.usable_gb() else
                                   ": more than one GPU holds, so split the model over several "
                                   "GPUs (tensor parallelism) or serve fewer, shorter conversations")]
    evidence = []

    def ev(label_start, what):
        try:
            r = find_row(rows, label_start)
        except KeyError:
            return
        evidence.append(f"{what}: {r['label']} on SmolLM2-135M: KL {r['kl']:.4f}, top-1 "
                        f"{r['top1']:.1%} ({r['source']})")

    measured = decode_evidence(bench, batch)
    rebuild = ("measured with the course's first kernels: the weight-only kernels are being "
               "rebuilt for bandwidth (lesson 10), so rerun the benchmark on your GPU")
    if scheme == "bf16":
        reasons.append("nothing to gain that is worth any risk: BF16 fits, keep it (and keep it "
                       "as the rollback whatever you deploy)" if limit == "accuracy" else
                       "no format with faster maths than BF16 on this GPU")
        if limit == "accuracy":
            ev("W8A16", "should it have to shrink, the closest measured")
    if scheme == "w8a16":
        reasons.append("8-bit weights, 16-bit maths: half the bytes of BF16, the smallest "
                       "quality loss the course measured for any quantized scheme")
        ev("W8A16", "closest measured")
    if scheme in ("fp8_w8a8", "int8_w8a8"):
        kind = "FP8" if scheme == "fp8_w8a8" else "INT8"
        reasons.append(f"{kind} weights AND activations: half the bytes, and the maths runs on "
                       f"{kind} tensor cores at twice the BF16 rate, so prefill speeds up too")
        if scheme == "int8_w8a8":
            reasons.append("no FP8 maths here; activation outliers need SmoothQuant (or "
                           "per-token scales) for INT8")
            ev("W8A8 INT8 dynamic", "with smoothing")
            ev("W8A8 INT8 static", "without smoothing")
        else:
            ev("W8A8 FP8", "quality")
        label = "fp8 w8a8" if scheme == "fp8_w8a8" else "int8 w8a8"
        evidence.append(f"speed on {bench_name}: prefill "
                        f"{_fmt_x(bench_ratio(bench, label, PREFILL_SHAPE))}, decode batch 1 "
                        f"{_fmt_x(bench_ratio(bench, label, DECODE_SHAPE))} (70B-sized layer)")
    if limit == "decode" and measured:
        evidence.append(f"decode at batch {measured['batch']} on {bench_name}, 70B-sized layer: "
                        + ", ".join(f"{k} {v:.2f}x" for k, v in measured.items() if k != "batch")
                        + f" BF16; {rebuild}")
        if scheme != "w4a16":
            reasons.append("decode: this rule follows ONE measurement, the course's first, "
                           "untuned Triton kernels on one H200 (its W8A8 kernels beat BF16 at "
                           "decode, its 4-bit kernel did not); with tuned kernels serving "
                           "practice differs: " + DECODE_PRACTICE + ". For latency-bound "
                           "decode with vLLM's Marlin kernels, measure W4A16 before taking this")
    if scheme == "w4a16":
        reasons.append("4-bit weights with group-128 scales: 4.125 bits per weight, about a "
                       "quarter of BF16's bytes; GPTQ or AWQ, not round-to-nearest")
        if limit == "decode":
            reasons.append("chosen because 8-bit weights leave no room for the batch's cache: "
                           "the fit comes first")
        reasons.append("the gain needs a tuned dequantizing kernel (Marlin-style, in vLLM; "
                       "Q4_K_M in llama.cpp): measure; prefill still runs in 16-bit maths")
        ev("W4A16 INT4 g32, round", "round-to-nearest")
        ev("W4A16 INT4 g32, GPTQ", "GPTQ")
        evidence.append(f"the course's own Triton W4A16 kernel on {bench_name}: decode batch 1 "
                        f"{_fmt_x(bench_ratio(bench, 'w4a16 g128', DECODE_SHAPE))}, prefill "
                        f"{_fmt_x(bench_ratio(bench, 'w4a16 g128', PREFILL_SHAPE))}: bytes saved "
                        f"are not speed until the kernel is good ({rebuild})")
        sweep_name, best = best_swept(results, "w4a16")
        if best is not None:
            prep = swept_activation_prep_ms(results, sweep_name, best.get("shape"))
            prep_txt = "" if prep is None else f" ({prep * 1e3:.0f} us, timed separately)"
            evidence.append(f"the best of the launch plans swept for it ({sweep_name}): "
                            f"{_fmt_x(best['speedup_vs_bf16'])}; those times include the "
                            f"activation preparation{prep_txt}, so the sweep does not isolate "
                            f"the kernel (lesson 10)")
    if params < 3e9 and scheme in ("w4a16", "int8_w8a8"):
        reasons.append("a small model: small models lose more to quantization than large ones "
                       "(the evidence below is a 135M model): validate with care")
    if kv_cache == "fp8":
        reasons.append(f"--kv-cache-dtype fp8: the batch's BF16 cache ({kv16_gb:.1f} GB) weighs at "
                       f"least {KV_FP8_SHARE:.0%} of the BF16 weights, so halving it saves at "
                       f"least a tenth of each decode step's reads and doubles the tokens that "
                       f"fit (lesson 11); give the engine calibrated scales (without them vLLM "
                       f"uses 1.0)")
        ev("KV cache FP8", "FP8 cache, 4,096 tokens")
    else:
        reasons.append("KV cache in BF16: " + ("quality first" if limit == "accuracy" else
                       f"at {batch} x {context:,} tokens the cache ({kv16_gb:.1f} GB) is a small "
                       f"share of the step; an FP8 cache pays at long contexts and large batches"))
    if g.native_tflops("fp4") is not None:
        reasons.append("this GPU has FP4 tensor cores: NVFP4 (W4A4) makes 4-bit fast for "
                       "prefill too; validate its accuracy like any other scheme")
    return {"scheme": scheme, "description": SCHEMES[scheme], "weights_gb": w_gb,
            "kv_cache": kv_cache, "kv_gb": kv_gb, "reasons": reasons, "evidence": evidence}


# ---------------------------------------------------------------------------------------
# Serving commands (shown, never run)
# ---------------------------------------------------------------------------------------

#: Llama 3.1 8B's embedding and output matrices (config.json: vocab 128,256 x hidden 4,096,
#: untied), which FP8 checkpoints keep in BF16.
LLAMA_8B_VOCAB, LLAMA_8B_HIDDEN = 128_256, 4096


def loaded_weights_gib(params: float, bits: float, kept_16bit_params: float = 0.0) -> float:
    """GiB an engine's "model loading" log line reports: ``kept_16bit_params`` in BF16, the
    rest at ``bits`` per weight (lesson 12)."""
    params = _check_params(params)
    if isinstance(bits, str):                     # a format name: "fp8", "int4_g128", "bf16"
        try:
            bits = hw.bits_per_weight(bits)
        except (KeyError, ValueError) as err:
            raise ValueError(f"bits is the bits per weight of the quantized part (a number such "
                             f"as 8 or 4.125) or a format name course_lib.hardware knows; "
                             f"{bits!r} is neither: {err}") from None
    if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not 0 < bits <= 32:
        raise ValueError(f"bits is the bits per weight of the quantized part, in (0, 32] (8 for "
                         f"FP8, 4.125 for INT4 g128), or a format name such as 'fp8'; got "
                         f"{bits!r}")
    if not 0 <= kept_16bit_params <= params:
        raise ValueError("kept_16bit_params must be between 0 and params")
    return ((params - kept_16bit_params) * bits / 8 + kept_16bit_params * 2) / hw.GIB


#: Bits per value of llama.cpp's Q8_0 blocks (32 codes of 8 bits and one fp16 scale), the
#: format of its ``-ctk q8_0 -ctv q8_0`` cache and of its Q8_0 weight files.
Q8_0_BITS = hw.bits_with_scales(8, 32)

#: The serving commands (shown, never run here; lesson 13 runs llama.cpp on the learner's own
#: GPTQ model). Each: engine, command, what it changes, the log line that shows it.
SERVING = [
    {"engine": "vLLM",
     "command": "vllm serve meta-llama/Llama-3.1-8B-Instruct --quantization fp8",
     "changes": "BF16 weights are quantized to FP8 as they load (one scale per tensor, "
                "activation scales computed on the fly): FP8 W8A8 with no calibration and no "
                "new checkpoint. Where FP8 maths is not native (an A100) it runs weight-only.",
     "look_for": "the model-loading line: about half the BF16 GiB"},
    {"engine": "vLLM",
     "command": "vllm serve RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8",
     "changes": "a pre-quantized FP8 W8A8 checkpoint with STATIC scales: its config.json gives "
                "the weights and the activations one scale per tensor each, calibrated offline "
                "(input_activations: dynamic false, strategy tensor). Nothing is computed per "
                "token at run time.",
     "look_for": "the model-loading line (about 8.5 GiB for the 8B model)"},
    {"engine": "vLLM",
     "command": "vllm serve RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8-dynamic "
                "--kv-cache-dtype fp8",
     "changes": "the -FP8-dynamic checkpoint: weights with one scale per output channel, "
                "activations scaled per token at run time (dynamic, lesson 08). The flag stores "
                "the KV cache in FP8: half the bytes per token, about twice the tokens fit. This "
                "checkpoint carries no KV scales, and then vLLM uses a scale of 1.0 for keys and "
                "values (fine while they stay within E4M3's range, lossy for outlier channels; "
                "lesson 11 calibrates them). --calculate-kv-scales estimates them once from a "
                "warm-up batch; a checkpoint calibrated on a dataset (llm-compressor) is what "
                "vLLM's Quantized KV Cache page recommends. With the FlashAttention 3 backend "
                "(Hopper) the queries are quantized to FP8 too and attention runs in FP8: more "
                "than a storage change.",
     "look_for": "'GPU KV cache size: N tokens' and 'Maximum concurrency for ... tokens per "
                 "request': N roughly doubles"},
    {"engine": "vLLM",
     "command": "vllm serve RedHatAI/Meta-Llama-3.1-70B-Instruct-quantized.w4a16 "
                "--gpu-memory-utilization 0.85",
     "changes": "a pre-quantized W4A16 checkpoint (compressed-tensors, as llm-compressor and the "
                "course's own export write it): config.json declares the scheme, so no "
                "--quantization flag; the weights go through a dequantizing kernel (Marlin on "
                "NVIDIA). The flag keeps 15% of the GPU back instead of 10%.",
     "look_for": "the quantization method the engine reports, and the model-loading GiB"},
    {"engine": "SGLang",
     "command": "python -m sglang.launch_server --model-path "
                "RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8-dynamic --kv-cache-dtype fp8_e4m3",
     "changes": "the same checkpoint in SGLang, which also reads the scheme from config.json; "
                "its flag names the FP8 variant of the cache explicitly (E4M3: 3 mantissa bits; "
                "fp8_e5m2 is the other choice, more range and less precision): half the cache "
                "bytes, so about twice the tokens in the pool. Without scales in the checkpoint "
                "(or --quantization-param-path) SGLang uses 1.0, 'which may cause accuracy "
                "issues' (its Quantized KV Cache page), and the attention backend must have a "
                "fused FP8-cache path or decode slows down. Its INT8 cache (--int8-kv-cache, "
                "per token and head) is phase 1: MHA models, the Triton backend, --page-size 1.",
     "look_for": "the start-up line that reports the KV-cache pool ('KV Cache is allocated. "
                 "#tokens: N'): N roughly doubles"},
    {"engine": "llama.cpp",
     "command": "llama-server -m SmolLM2-135M-Instruct-Q4_K_M.gguf -c 8192 -fa on "
                "-ctk q8_0 -ctv q8_0",
     "changes": "weights from a GGUF file in Q4_K_M (4-bit k-quant blocks, each with its own "
                "scales, a few tensors kept at higher precision); -ctk/-ctv store keys and "
                f"values in Q8_0 blocks ({Q8_0_BITS:g} bits per value instead of 16) and need "
                "flash attention (-fa on; older builds take a bare -fa), without which the "
                "quantized V cache is refused. -c sets the context the cache is sized for.",
     "look_for": "the KV-cache line at start-up, which names K (q8_0) and V (q8_0) and their MiB"},
    {"engine": "llama.cpp",
     "command": "llama-cli -m SmolLM2-135M-Instruct-Q8_0.gguf -n 64 -p 'def fibonacci(n):'",
     "changes": f"weights in Q8_0 ({Q8_0_BITS:g} bits per weight), the cache left in F16 (the "
                "default): lesson 13 writes such files from the course's own models and runs "
                "them, the GPTQ model included.",
     "look_for": "the model-loading lines: file type Q8_0 and the model's size in MiB"},
]

#: A W4A16 GPTQ recipe for SmolLM2-135M with llm-compressor (shown, not run: llm-compressor
#: pins older transformers than this course's environment). Written for this course.
LLM_COMPRESSOR_RECIPE = '''\
# W4A16 with GPTQ for SmolLM2-135M, as llm-compressor runs it (this course's example).
import datasets
import transformers
from llmcompressor import oneshot

RECIPE = """
quant_stage:
  quant_modifiers:
    GPTQModifier:
      targets: ["Linear"]
      ignore: ["lm_head"]       # the output head stays 16-bit (lesson 04)
      scheme: "W4A16"           # INT4 weights, one scale per group of 128
      dampening_frac: 0.01      # lesson 06's damping, as a share of the mean diagonal
      actorder: "static"        # llm-compressor 0.14's default when the scheme sets none
                                # (modifiers/gptq/base.py:132, 154-158): act-order (lesson 06)
"""

repo = "HuggingFaceTB/SmolLM2-135M"
lm = transformers.AutoModelForCausalLM.from_pretrained(repo, torch_dtype="bfloat16")
tokenizer = transformers.AutoTokenizer.from_pretrained(repo)
calib = datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split="train[:2000]")
calib = calib.filter(lambda row: len(row["text"]) > 300)    # whole paragraphs only

oneshot(model=lm, tokenizer=tokenizer, dataset=calib, recipe=RECIPE,
        max_seq_length=512, num_calibration_samples=256,
        output_dir="SmolLM2-135M-W4A16-GPTQ")                # compressed-tensors, for vLLM
'''


def serving_text() -> str:
    """The serving commands with what each changes and which log line shows it (lesson 12)."""
    import textwrap
    out = []
    for s in SERVING:
        out += [f"[{s['engine']}] $ {s['command']}",
                textwrap.fill(s["changes"], 92, initial_indent="    changes:  ",
                              subsequent_indent=" " * 14),
                textwrap.fill(s["look_for"], 92, initial_indent="    look for: ",
                              subsequent_indent=" " * 14), ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# The common-mistakes quiz
# ---------------------------------------------------------------------------------------

QUIZ = {
    "q1": ("A 4-bit weight-only (W4A16) checkpoint will make 4,000-token prompts faster on "
           "an H100.", {"a": "yes: a quarter of the bytes", "b": "yes, but only with FP8 "
           "activations", "c": "no: prefill is compute-bound and W4A16 does its maths in "
           "16-bit"}, "c"),
    "q2": ("An NVFP4 checkpoint on an H100 ...", {"a": "saves memory, but its maths is unpacked "
           "to 16-bit: no FP4 tensor cores before Blackwell", "b": "runs FP4 maths at twice the "
           "FP8 rate", "c": "cannot be loaded at all"}, "a"),
    "q3": ("Perplexity moved by under 1%. The 4-bit model is ...", {"a": "fine: ship it",
           "b": "not yet validated: check KL/top-1, your tasks and long generations",
           "c": "certainly broken"}, "b"),
    "q4": ("'4-bit' Llama 3.1 70B with group-128 scales takes ...", {"a": "35.3 GB (4 bits "
           "exactly)", "b": "70.6 GB", "c": "about 36.4 GB: scales add 0.125 bits per weight"},
           "c"),
    "q5": ("To save memory, quantize the output head and embeddings to 4 bits too?",
           {"a": "no: they are sensitive and a small share of a large model's weights; tools "
            "keep them in 16-bit", "b": "yes: every byte counts"}, "a"),
    "q6": ("The 70B model's FP8 weights fit in 80 GB with 9 GB to spare, so it is servable "
           "on one H100.", {"a": "yes", "b": "no: weights + workspace + the users' KV cache "
           "must fit"}, "b"),
}


def quiz_answer(question: str) -> str:
    """The right option (a letter) of a common-mistakes question (lesson 12)."""
    if question not in QUIZ:
        raise KeyError(f"unknown question {question!r}; questions: {', '.join(QUIZ)}")
    return QUIZ[question][2]


__all__ = ["RESULTS_DIR", "MODELS", "LIMITS", "SCHEMES", "load_results", "newest_bench", "gpu_bench",
           "bench_ratio", "decode_ratio", "best_swept", "summary_rows", "find_row", "format_summary",
           "support_rows", "format_support", "choose_scheme", "choose_kv_cache", "kv_bytes_per_token_for",
           "KV_FP8_SHARE", "KV_SHAPE_MODELS", "DECODE_BATCHES", "DECODE_PRACTICE", "decode_evidence", "swept_activation_prep_ms",
           "recommend", "loaded_weights_gib", "Q8_0_BITS", "SERVING", "LLM_COMPRESSOR_RECIPE", "serving_text",
           "QUIZ", "quiz_answer"]
