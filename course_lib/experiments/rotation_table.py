"""Lesson 16's rotation tables: every row of :mod:`course_lib.rotation_table` without and with
QuaRot's rotation, written to ``results/rotation_<model>.json``.

    python -m course_lib.experiments.rotation_table --model bundled          # 1-3 minutes
    python -m course_lib.experiments.rotation_table --model smollm2          # about an hour
    python -m course_lib.experiments.rotation_table --model smollm2 --resume # rows still missing
    python -m course_lib.experiments.rotation_table --model smollm2 --windows 1 --out /tmp/s.json

What each row is, how it is built and scored, and the reader (``load_table``) live in
:mod:`course_lib.rotation_table`; this module measures and writes. Rows are written as they
finish; ``--resume`` keeps rows measured under the same protocol and rotation seed.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from course_lib import device
from course_lib.rotation_table import (BUNDLED_NOTE, GENERAL_ROWS, GRID_NOTE, PROTOCOL, ROWS,
                                       SEED, SETTINGS, WEIGHT_BITS, WEIGHT_GROUP, _check_name,
                                       calibration, format_table, get_row, live_slice,
                                       load_model, measure_row, prepare, reference,
                                       results_path)
from course_lib import protocol as cprotocol

#: The command that writes the tables (recorded in each file).
COMMAND = "python -m course_lib.experiments.rotation_table"


def _protocol_record(model_name: str, st: dict) -> dict:
    spread = (f"per-window figures; {cprotocol.LEVEL:.0%} bootstrap intervals over windows "
              f"({cprotocol.N_BOOT} resamples); rotated minus plain by protocol.paired")
    if model_name == "smollm2":
        return {"name": PROTOCOL, "text": "course_lib.data.clean_split()[1]",
                "n_windows": st["eval_windows"], "window_tokens": st["eval_window"],
                "scored_per_window": st["eval_window"] - 1,
                "calibration": {"text": "course_lib.data.clean_split()[0] (no 50-character run "
                                        "shared with the evaluation text)",
                                "windows": st["calib_windows"], "tokens": st["calib_window"],
                                "smoothquant_windows": st["smooth_windows"]},
                "spread": spread}
    return {"name": "bundled", "text": "course_lib.data.heldout_text() (the methods table's "
                                       "evaluation text)",
            "n_windows": st["eval_windows"], "window_tokens": st["eval_window"],
            "scored_per_window": st["eval_window"],
            "calibration": {"text": "the training split (methods.calibration."
                                    "bundled_calibration_text)",
                            "windows": st["calib_windows"], "tokens": st["calib_window"],
                            "smoothquant_windows": st["smooth_windows"]},
            "spread": spread}


def _write(path: Path, out: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    tmp.replace(path)


def write_table(model_name: str, path: Path | str | None = None, rows=None,
                n_windows: int | None = None, calib_windows: int | None = None,
                resume: bool = False, general: bool = True, progress: bool = True,
                seed: int = SEED) -> dict:
    """Measure every row without and with the rotation and write the JSON (after every row, so
    an interrupted run keeps what it measured). ``rows``: a subset (default all);
    ``n_windows`` / ``calib_windows``: fewer windows than the settings (a smoke run);
    ``resume``: keep the rows already in the file when it was measured under the same
    protocol and seed; ``general``: SmolLM2's weight rows on the model moved off its grid."""
    from tqdm.auto import tqdm
    _check_name(model_name)
    st = dict(SETTINGS[model_name])
    for what, v in (("n_windows", n_windows), ("calib_windows", calib_windows)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{what} must be a whole number >= 1; got {v!r}")
    if n_windows is not None:
        st["eval_windows"] = n_windows
    if calib_windows is not None:
        st["calib_windows"] = calib_windows
        st["smooth_windows"] = min(st["smooth_windows"], calib_windows)
    todo = [get_row(r) for r in (ROWS if rows is None else rows)]
    if not todo:
        raise ValueError(f"rows is empty: name at least one of {', '.join(ROWS)}")
    names = [r.name for r in todo]
    path = Path(path) if path is not None else results_path(model_name)
    t0 = time.perf_counter()
    model = load_model(model_name)
    record = _protocol_record(model_name, st)
    # resume, or a subset of rows: the file's other rows are kept (same protocol and seed only)
    previous = (json.loads(path.read_text()) if path.exists() and (resume or rows is not None)
                else None)
    if previous is not None and (previous.get("protocol") != record
                                 or previous.get("rotation", {}).get("seed") != seed):
        raise ValueError(f"{path} was measured under another protocol or rotation seed "
                         f"({previous.get('protocol')}, seed "
                         f"{previous.get('rotation', {}).get('seed')}): its rows cannot be kept "
                         f"beside new ones; rerun every row without --resume or --rows")
    kept = {r["row"]: r for r in (previous or {}).get("rows", [])}
    ref = reference(model, model_name, st["eval_windows"], st["eval_window"])
    calib_ids = calibration(model_name, st["calib_windows"], st["calib_window"])
    bases = {"plain": model, "rotated": prepare(model, True, seed)}
    memo: dict = {}                      # each base's GPTQ model, shared by the GPTQ rows
    command = f"{COMMAND} --model {model_name}" + "".join(
        f" --{flag} {v}" for flag, v in (("windows", n_windows), ("calib-windows", calib_windows),
                                          ("rows", rows and ",".join(names)))
        if v is not None) + (" --resume" if resume else "")
    out = {"model": model_name, "command": command,
           "what": "each row without and with QuaRot's rotation (rotate.quarot), scored against "
                   "the unquantized, unrotated model (lesson 16)",
           "protocol": record,
           "rotation": {"function": f"course_lib.rotate.quarot(model, seed={seed})",
                        "seed": seed, "steps": bases["rotated"].rotation_steps},
           "conventions": {
               "weights_group": f"W{WEIGHT_BITS} g{WEIGHT_GROUP}: symmetric, scale = absmax / 7, "
                                f"codes -7..7, fp32 scales (lesson 06's course grid)",
               "weights_per_channel": "one absmax scale per output channel (quant.quantize "
                                      "per_channel)",
               "activations": "one absmax scale per token, computed on the fly (quant.quantize "
                              "per_token); every Linear of the decoder blocks, embeddings and "
                              "head kept in float",
               "mxfp4": "quant.quantize_mxfp4: blocks of 32 along the input, E8M0 scales",
               "nvfp4": "quant.quantize_nvfp4: blocks of 16, E4M3 scales; the FP32 scale per "
                        "tensor for weights, per token for activations",
               "kv4": f"kv.minmax_quantize over each token's head ({model.config.head_dim} "
                      f"channels): asymmetric INT4, fp16 scale and minimum, every token read "
                      f"quantized",
               "kv4-kivi": "kv.PerQueryEmulation(config, 'kivi4'): lesson 11's KIVI-4, R = 128",
               "smoothquant": "methods.smoothquant.smooth_model on the reference groups (the two "
                              "norms), maxima from the first smoothquant_windows calibration "
                              "windows"},
           "note": GRID_NOTE if model_name == "smollm2" else BUNDLED_NOTE,
           "reference": {"perplexity": ref.perplexity, "bits_per_byte": ref.bits_per_byte},
           "machine": {**device.machine_record(), "threads": torch.get_num_threads()},
           "torch": torch.__version__,
           "rows": []}
    old_machine = (previous or {}).get("machine", {})
    order = [r for r in ROWS.values() if r.name in names or r.name in kept]
    bar = tqdm(order, desc=f"rotation table ({model_name})", disable=not progress)
    for row in bar:
        bar.set_postfix_str(row.name)
        if row.name in names and not (resume and row.name in kept):
            out["rows"].append(measure_row(bases, row, ref, calib_ids, st["smooth_windows"],
                                           progress, memo))
        else:
            out["rows"].append(kept[row.name])
            if any(old_machine.get(k) != out["machine"].get(k)      # kept from another machine
                   for k in ("cpu", "torch", "blas", "torch_threads")):
                out["machine"]["earlier_rows_machine"] = old_machine.get(
                    "earlier_rows_machine", old_machine)
        _write(path, out)
    memo.clear()                         # the GPTQ models are not needed any more
    if model_name == "smollm2" and general:
        _general_case(model, st, calib_ids, seed, progress, names, resume,
                      (previous or {}).get("general_case"), path, out)
    elif (previous or {}).get("general_case") is not None:     # not measured now: kept
        out["general_case"] = previous["general_case"]
    old_slice, sl = (previous or {}).get("slice"), st["slice"]
    if old_slice is not None and (old_slice.get("n_windows"), old_slice.get("window"),
                                  [r["row"] for r in old_slice.get("rows", [])]) == \
            (sl["n_windows"], sl["window"], list(sl["rows"])):
        out["slice"] = old_slice
    else:
        out["slice"] = live_slice(model, model_name, seed=seed, rotated=bases["rotated"])
    out["seconds_total"] = round(time.perf_counter() - t0, 1)
    _write(path, out)
    return out


def _general_case(model, st, calib_ids, seed, progress, names, resume, previous, path,
                  out) -> None:
    """out["general_case"]: the weight rows on SmolLM2 moved off its Q4_1 grid, scored against
    that moved model (rows not asked for, or kept by ``resume``, are copied from ``previous``)."""
    from tqdm.auto import tqdm
    from course_lib import smollm
    kept = {r["row"]: r for r in (previous or {}).get("rows", [])}
    todo = [n for n in GENERAL_ROWS if n in names and not (resume and n in kept)]
    if not todo and previous is not None:
        out["general_case"] = previous
        return
    moved, rel = smollm.off_grid(model)
    gref = reference(moved, "smollm2", st["eval_windows"], st["eval_window"])
    res = {"what": "SmolLM2's block Linears moved off Q4_1's grid by Gaussian noise of 1/sqrt(12) "
                   "of each block's step (smollm.off_grid, seed 0), every row scored against "
                   "that moved model itself: a stand-in for float-trained weights",
           "noise_rms_over_weight_rms": rel,
           "reference": {"perplexity": gref.perplexity, "bits_per_byte": gref.bits_per_byte},
           "rows": []}
    bases = {"plain": moved, "rotated": prepare(moved, True, seed)}
    memo: dict = {}
    out["general_case"] = res
    for name in tqdm([n for n in GENERAL_ROWS if n in todo or n in kept],
                     desc="off-grid model", disable=not progress):
        res["rows"].append(measure_row(bases, ROWS[name], gref, calib_ids,
                                       st["smooth_windows"], progress, memo)
                           if name in todo else kept[name])
        _write(path, out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(SETTINGS), default="bundled")
    p.add_argument("--rows", default=None, help=f"a comma-separated subset of: {', '.join(ROWS)}")
    p.add_argument("--windows", type=int, default=None,
                   help="evaluation windows (default: the model's setting; 1 for a smoke run)")
    p.add_argument("--calib-windows", type=int, default=None,
                   help="calibration windows for GPTQ (default: the model's setting)")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows already in the JSON (same protocol and seed)")
    p.add_argument("--no-general", action="store_true",
                   help="SmolLM2: skip the weight rows on the model moved off its grid")
    p.add_argument("--out", default=None, help="write here instead of results/")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    a = p.parse_args(argv)
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    out = write_table(a.model, a.out, None if a.rows is None else a.rows.split(","),
                      a.windows, a.calib_windows, a.resume, not a.no_general)
    print(format_table(out["rows"]))
    if "general_case" in out:
        print("off its grid:")
        print(format_table(out["general_case"]["rows"]))
    print(f"written in {out['seconds_total']} s")


if __name__ == "__main__":
    main()
