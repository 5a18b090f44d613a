"""The writer of the methods tables (lessons 06, 07 and 12): RTN, GPTQ (with and without
act-order) and AWQ at 4 and 3 bits on one model, written to ``results/methods_<model>.json``.

    python -m course_lib.experiments.methods_table --model bundled    # a minute on 2 cores
    python -m course_lib.experiments.methods_table --model smollm2    # tens of minutes
    python -m course_lib.experiments.methods_table --model smollm2 --resume   # missing rows
    python -m course_lib.experiments.methods_table --model smollm2 --grid llm-compressor \
        --methods rtn,gptq,gptq+act --group-sizes 32 --tag llm-compressor   # lesson 06
    python -m course_lib.experiments.methods_table --model bundled --methods awq --bits 3 \
        --group-sizes 128 --option inputs=fp --tag awq-fp-inputs          # lesson 07

What a row is (the grid, the calibration, the scoring, the live slice) and how a lesson reads
the table are :mod:`course_lib.methods.table`'s; this module only runs the rows and writes the
JSON. Rows are written as they finish, so an interrupted run keeps what it measured
(``--resume`` measures only what is missing). A *variant* table (another grid, or a method's
options) is written to ``results/methods_<model>_<tag>.json`` and holds only the methods asked
for.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from course_lib import device
from course_lib import protocol as cprotocol
from course_lib.methods import calibration as cal
from course_lib.methods import table

PROTOCOL_KEYS = ("model", "convention", "calibration", "evaluation")


def write_table(model_name: str, path: Path | None = None, progress: bool = True,
                methods=table.METHODS, resume: bool = False, grid: str = "course",
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
    path = path or table.results_path(model_name, tag if variant else None)
    st = table.SETTINGS[model_name]
    t0 = time.perf_counter()
    model, reference = table.load_model(model_name)
    ref = reference(model, st["eval_windows"], st["eval_window"])
    ids = table.calibration_ids(model_name, st["calib_windows"], st["calib_window"])
    smol = model_name == "smollm2"
    base = {"bits_per_byte": ref.bits_per_byte}
    if model_name == "smollm2":
        base["perplexity"] = ref.perplexity
    out = {"model": model_name,
           "convention": table.CONVENTIONS[grid],
           "calibration": {"windows": st["calib_windows"], "tokens": st["calib_window"],
                           "text": "training split" if model_name == "bundled"
                           else f"calibration text of the {table.PROTOCOL!r} protocol "
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
    if previous is not None and (resume or (not variant
                                            and set(methods) != set(table.METHODS))):
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
            for m in (methods if variant else table.METHODS)]
    for bits, gs, m in tqdm(jobs, desc=model_name, disable=not progress):
        kept = _find_or_none(old, m, bits, gs)
        if m in methods and not (resume and kept is not None):
            new = table.row(model, ref, m, ids, bits, gs, spread=smol, **options)
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
        out["slice"] = table.slice_rows(model, reference, model_name,
                                        methods if variant else table.METHODS, **options)
    if smol and not variant:
        out["asymmetric"] = [table.row(model, ref, table.ASYM_METHOD, ids, b, table.GENERAL_GROUP,
                                       spread=True) for b in bits_list]
        _write(path, out)
        out["general_case"] = general_case(model, ids, st, table.GENERAL_BITS, progress)
    out["seconds_total"] = round(time.perf_counter() - t0, 1)     # this run (resumed: its part)
    _write(path, out)
    return out


def _protocol_record(st: dict) -> dict:
    return {"name": table.PROTOCOL, "text": "course_lib.data.clean_split()[1]",
            "n_windows": st["eval_windows"], "window_tokens": st["eval_window"],
            "scored_per_window": st["eval_window"] - 1,
            "calibration": "course_lib.data.clean_split()[0] (no 50-character run shared "
                           "with the evaluation text)",
            "spread": f"per-window figures; {cprotocol.LEVEL:.0%} bootstrap intervals over "
                      f"windows ({cprotocol.N_BOOT} resamples)"}


def general_case(model, ids, st: dict, bits_list=(4, 3), progress: bool = True) -> dict:
    """Every method (and asymmetric RTN) at group ``table.GENERAL_GROUP`` on SmolLM2 moved off
    its file's Q4_1 grid (``smollm.off_grid``), each scored against that moved model itself:
    what the table looks like on weights that are not already 4-bit (lesson 04's trap)."""
    from tqdm.auto import tqdm
    from course_lib import smollm
    smooth, rel = smollm.off_grid(model)
    gref = smollm.reference(smooth, st["eval_windows"], st["eval_window"],
                            protocol=table.PROTOCOL)
    jobs = [(b, m) for b in bits_list for m in table.METHODS + (table.ASYM_METHOD,)]
    rows = [table.row(smooth, gref, m, ids, b, table.GENERAL_GROUP, spread=True)
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
        return table.find(rows, method, bits, group_size)
    except KeyError:
        return None


def _write(path: Path, out: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m course_lib.experiments.methods_table",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(table.SETTINGS), default="bundled")
    p.add_argument("--methods", default=",".join(table.METHODS),
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
    print(table.format_table(out["rows"]))
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
