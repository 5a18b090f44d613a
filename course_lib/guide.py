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
    ppl (SmolLM2 only), source (file name), and from the newest GPU benchmark decode_x
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
        rows.append({
            "scheme": scheme, "label": label, "bits": bits,
            "kl": r["kl"] if kv_row else r["kl_nats"],
            "top1": r["top1"] if kv_row else r["top1_agreement"],
            "ppl": r.get("ppl") if kv_row else r.get("perplexity"), "source": source,
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
    table = [(r["label"], r["bits"], r["kl"], r["top1"], "-" if r["ppl"] is None else r["ppl"],
              x(r["decode_x"]), x(r["prefill_x"]), x(r["e2e_x"])) for r in rows]
    return hw.format_table(table, ["scheme", "bits", "KL (nats)", "top-1", "ppl",
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


#: The share of a GPU's usable memory the decision rule lets the weights take.
WEIGHT_SHARE = 0.5


def choose_scheme(limit: str, gpu: str, params: float) -> str:
    """The weight scheme for what limits you, on one GPU of the catalogue (lesson 12).

    "Room" means the weights take at most :data:`WEIGHT_SHARE` (half) of the memory an
    engine may use on one GPU (``gpu.usable_gb()``, 90% of it), leaving the rest for the KV
    cache: fitting is not serving (lesson 00).

    - ``accuracy``: no quantization ("bf16") when BF16 weights have room; otherwise "w8a16"
      (the closest to the reference the course measured);
    - ``memory``: 8 bits when 8-bit weights have room ("fp8_w8a8" where FP8 maths is
      native, else "w8a16"); otherwise "w4a16";
    - ``decode`` (one user's tokens/s, memory-bound): "w4a16", the fewest bytes per token;
    - ``prefill`` (long prompts, big batches: compute-bound): "fp8_w8a8" where FP8 maths is
      native, else "int8_w8a8" where INT8 maths is, else "bf16".
    """
    if limit not in LIMITS:
        raise ValueError(f"unknown limit {limit!r}; choose one of {', '.join(LIMITS)}")
    g = hw.get_gpu(gpu)
    params = _check_params(params)
    fp8 = g.native_tflops("fp8") is not None
    int8 = g.native_tflops("int8") is not None
    room_gb = WEIGHT_SHARE * g.usable_gb()                # the rest is for the KV cache
    if limit == "accuracy":
        return "bf16" if params * 2 / hw.GB <= room_gb else "w8a16"
    if limit == "memory":
        if params * 1 / hw.GB <= room_gb:
            return "fp8_w8a8" if fp8 else "w8a16"
        return "w4a16"
    if limit == "decode":
        return "w4a16"
    return "fp8_w8a8" if fp8 else ("int8_w8a8" if int8 else "bf16")


def _fmt_x(v) -> str:
    return "not measured" if v is None else f"{v:.2f}x BF16"


def recommend(limit: str, gpu: str, params: float, results: dict | None = None,
              rule=choose_scheme) -> dict:
    """``rule``'s scheme with the reasons and the measured evidence behind it (lesson 12's
    decision widget). Evidence is read from ``results`` (default: the course's results/).

    Returns {scheme, description, weights_gb, kv_cache, reasons: [...], evidence: [...]}.
    """
    results = load_results() if results is None else results
    g = hw.get_gpu(gpu)
    params = _check_params(params)
    scheme = rule(limit, gpu, params)
    if scheme not in SCHEMES:
        raise ValueError(f"the rule returned {scheme!r}; known schemes: {', '.join(SCHEMES)}")
    rows = summary_rows(results, "smollm2")
    bench_name, bench = gpu_bench(results)
    fp8 = g.native_tflops("fp8") is not None
    bits = {"bf16": 16, "w8a16": 8, "fp8_w8a8": 8, "int8_w8a8": 8, "w4a16": hw.bits_per_weight("int4_g128")}
    w_gb = params * bits[scheme] / 8 / hw.GB
    room = WEIGHT_SHARE * g.usable_gb()
    reasons = [f"{g.name} ({g.arch}): FP8 maths {'native' if fp8 else 'NOT native'}; "
               f"{g.memory_gb:g} GB, {g.usable_gb():.0f} usable, of which the rule gives the "
               f"weights {room:.0f} GB and keeps the rest for the KV cache",
               f"the weights take {w_gb:.1f} GB in this scheme ({params * 2 / hw.GB:.1f} GB in "
               f"BF16){'' if w_gb <= room else ': more than that share of one GPU, so split them over several GPUs (tensor parallelism)'}"]
    evidence = []

    def ev(label_start, what):
        try:
            r = find_row(rows, label_start)
        except KeyError:
            return
        evidence.append(f"{what}: {r['label']} on SmolLM2-135M: KL {r['kl']:.4f}, top-1 "
                        f"{r['top1']:.1%} ({r['source']})")

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
    if scheme == "fp8_w8a8":
        reasons.append("FP8 weights AND activations: half the bytes, and the maths runs on "
                       "FP8 tensor cores at twice the BF16 rate, so prefill speeds up too")
        ev("W8A8 FP8", "quality")
        evidence.append(f"speed on {bench_name}: prefill "
                        f"{_fmt_x(bench_ratio(bench, 'fp8 w8a8', PREFILL_SHAPE))}, decode batch 1 "
                        f"{_fmt_x(bench_ratio(bench, 'fp8 w8a8', DECODE_SHAPE))}")
    if scheme == "int8_w8a8":
        reasons.append("no FP8 maths here, but INT8 tensor cores run at twice the BF16 rate; "
                       "activation outliers need SmoothQuant (or per-token scales)")
        ev("W8A8 INT8 dynamic", "with smoothing")
        ev("W8A8 INT8 static", "without smoothing")
        evidence.append(f"speed on {bench_name}: prefill "
                        f"{_fmt_x(bench_ratio(bench, 'int8 w8a8', PREFILL_SHAPE))}")
    if scheme == "w4a16":
        reasons.append("4-bit weights with group-128 scales: 4.125 bits per weight, about a "
                       "quarter of BF16's bytes; GPTQ or AWQ, not round-to-nearest")
        reasons.append("the gain needs a tuned dequantizing kernel (vLLM's Marlin-style kernels):"
                       " measure; prefill still runs in 16-bit and gains nothing")
        ev("W4A16 INT4 g32, round", "round-to-nearest")
        ev("W4A16 INT4 g32, GPTQ", "GPTQ")
        evidence.append(f"the course's own Triton W4A16 kernel on {bench_name}: decode batch 1 "
                        f"{_fmt_x(bench_ratio(bench, 'w4a16 g128', DECODE_SHAPE))}, prefill "
                        f"{_fmt_x(bench_ratio(bench, 'w4a16 g128', PREFILL_SHAPE))}: bytes saved "
                        f"are not speed until the kernel is good")
        sweep_name, best = best_swept(results, "w4a16")
        if best is not None:
            evidence.append(f"the best of the launch plans swept for it ({sweep_name}): "
                            f"{_fmt_x(best['speedup_vs_bf16'])}: the kernel's instruction count, "
                            f"not its block sizes, is the limit (lesson 10)")
    if params < 3e9 and scheme in ("w4a16", "int8_w8a8"):
        reasons.append("a small model: small models lose more to quantization than large ones "
                       "(the evidence below is a 135M model): validate with care")
    kv_cache = "bf16"
    if limit in ("memory", "prefill"):
        kv_cache = "fp8"
        reasons.append("add --kv-cache-dtype fp8: half the cache bytes, twice the tokens that "
                       "fit (lesson 11)")
        ev("KV cache FP8", "FP8 cache, 4,096 tokens")
    if g.native_tflops("fp4") is not None:
        reasons.append("this GPU has FP4 tensor cores: NVFP4 (W4A4) makes 4-bit fast for "
                       "prefill too; validate its accuracy like any other scheme")
    return {"scheme": scheme, "description": SCHEMES[scheme], "weights_gb": w_gb,
            "kv_cache": kv_cache, "reasons": reasons, "evidence": evidence}


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
    if not 0 <= kept_16bit_params <= params:
        raise ValueError("kept_16bit_params must be between 0 and params")
    return ((params - kept_16bit_params) * bits / 8 + kept_16bit_params * 2) / hw.GIB


SERVING = [
    {"command": "vllm serve meta-llama/Llama-3.1-8B-Instruct --quantization fp8",
     "changes": "BF16 weights are quantized to FP8 as they load (one scale per tensor, "
                "activation scales computed on the fly): FP8 W8A8 with no calibration and no "
                "new checkpoint. Where FP8 maths is not native (an A100) it runs weight-only.",
     "look_for": "the model-loading line: about half the BF16 GiB"},
    {"command": "vllm serve RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8 --kv-cache-dtype fp8",
     "changes": "the KV cache is stored in FP8: half the bytes per token, so about twice "
                "the tokens fit; the weights' scheme is unchanged.",
     "look_for": "'GPU KV cache size: N tokens' and 'Maximum concurrency for ... tokens per "
                 "request': N roughly doubles"},
    {"command": "vllm serve RedHatAI/Meta-Llama-3.1-70B-Instruct-quantized.w4a16 "
                "--max-model-len 16384",
     "changes": "a pre-quantized checkpoint (GPTQ/AWQ, or compressed-tensors as llm-compressor "
                "writes it): config.json declares its own scheme, so no --quantization flag; "
                "W4A16 runs through a dequantizing kernel.",
     "look_for": "the quantization method the engine reports, and the model-loading GiB"},
    {"command": "vllm serve RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8",
     "changes": "a pre-quantized FP8 W8A8 checkpoint: weight scales in the file, activations "
                "scaled per token at run time.",
     "look_for": "the model-loading line (about 8.5 GiB for the 8B model)"},
]

LLM_COMPRESSOR_RECIPE = '''\
from transformers import AutoModelForCausalLM, AutoTokenizer
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier

model_id = "meta-llama/Llama-3.1-8B-Instruct"
model = AutoModelForCausalLM.from_pretrained(model_id, device_map="auto", dtype="auto")
tok = AutoTokenizer.from_pretrained(model_id)

# FP8 weights, dynamic FP8 activations; keep the output layer in 16-bit
recipe = QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=["lm_head"])
oneshot(model=model, recipe=recipe)

model.save_pretrained("Llama-3.1-8B-Instruct-FP8")
tok.save_pretrained("Llama-3.1-8B-Instruct-FP8")
'''


def serving_text() -> str:
    """The serving commands with what each changes and which log line shows it (lesson 12)."""
    out = []
    for s in SERVING:
        out += [f"$ {s['command']}", f"    changes:  {s['changes']}",
                f"    look for: {s['look_for']}", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# The common-mistakes quiz
# ---------------------------------------------------------------------------------------

QUIZ = {
    "q1": ("A 4-bit weight-only (W4A16) checkpoint will make 4,000-token prompts faster on "
           "an H100.", {"a": "yes: a quarter of the bytes", "b": "no: prefill is compute-bound "
           "and W4A16 does its maths in 16-bit", "c": "yes, but only with FP8 activations"}, "b"),
    "q2": ("An NVFP4 checkpoint on an H100 ...", {"a": "runs FP4 maths at twice the FP8 rate",
           "b": "cannot be loaded at all", "c": "saves memory, but its maths is unpacked to "
           "16-bit: no FP4 tensor cores before Blackwell"}, "c"),
    "q3": ("Perplexity moved by under 1%. The 4-bit model is ...", {"a": "fine: ship it",
           "b": "not yet validated: check KL/top-1, your tasks and long generations",
           "c": "certainly broken"}, "b"),
    "q4": ("'4-bit' Llama 3.1 70B with group-128 scales takes ...", {"a": "35.3 GB (4 bits "
           "exactly)", "b": "about 36.4 GB: scales add 0.125 bits per weight", "c": "70.6 GB"},
           "b"),
    "q5": ("To save memory, quantize the output head and embeddings to 4 bits too?",
           {"a": "yes: every byte counts", "b": "no: they are sensitive and a small share of "
            "a large model's weights; tools keep them in 16-bit"}, "b"),
    "q6": ("The 70B model's FP8 weights fit in 80 GB with 9 GB to spare, so it is servable "
           "on one H100.", {"a": "yes", "b": "no: weights + workspace + the users' KV cache "
           "must fit"}, "b"),
}


def quiz_answer(question: str) -> str:
    """The right option (a letter) of a common-mistakes question (lesson 12)."""
    if question not in QUIZ:
        raise KeyError(f"unknown question {question!r}; questions: {', '.join(QUIZ)}")
    return QUIZ[question][2]


__all__ = ["RESULTS_DIR", "MODELS", "LIMITS", "SCHEMES", "WEIGHT_SHARE", "load_results", "newest_bench", "gpu_bench",
           "bench_ratio", "decode_ratio", "best_swept", "summary_rows", "find_row", "format_summary",
           "support_rows", "format_support", "choose_scheme", "recommend", "loaded_weights_gib",
           "SERVING", "LLM_COMPRESSOR_RECIPE", "serving_text", "QUIZ", "quiz_answer"]
