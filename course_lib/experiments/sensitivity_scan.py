"""The writer of lesson 14's sensitivity scan, ``results/kquants_sensitivity_smollm2.json``:
:func:`course_lib.sensitivity.scan` over every Linear of SmolLM2, saved with the machine it ran
on (about 15 minutes on 2 cores).

    python -m course_lib.experiments.sensitivity_scan scan

What the scan measures, the allocation that reads it and the reader
(:func:`course_lib.sensitivity.load_scan`) are :mod:`course_lib.sensitivity`'s; this module only
runs it whole and writes the file (``python -m course_lib.experiments.kmix_table`` reads it
next).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from course_lib import sensitivity
from course_lib.sensitivity import CAL_WINDOWS, RESULTS_FILE, WINDOW, WINDOWS


def write(path: Path = RESULTS_FILE, **kw) -> dict:
    """The full scan (``kw`` go to :func:`course_lib.sensitivity.scan`), saved with the machine
    it ran on."""
    from course_lib import device
    torch.manual_seed(0)
    out = sensitivity.scan(**kw)
    out["machine"] = {**device.machine_record(), "cpus": os.cpu_count(),
                      "load_avg_1min": os.getloadavg()[0]}
    load = out["machine"]["load_avg_1min"]
    out["note"] = (f"1-minute load average {load:.1f} on {os.cpu_count()} CPUs when it finished"
                   + (": a shared machine, so the seconds are an upper bound; the KL values do "
                      "not depend on load" if load > 0.5 * (os.cpu_count() or 1) else ""))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out


def main(argv=None) -> None:
    import argparse
    p = argparse.ArgumentParser(prog="python -m course_lib.experiments.sensitivity_scan",
                                description="lesson 14's per-tensor sensitivity scan")
    p.add_argument("command", choices=["scan"])
    p.add_argument("--windows", type=int, default=WINDOWS)
    p.add_argument("--window", type=int, default=WINDOW)
    p.add_argument("--cal-windows", type=int, default=CAL_WINDOWS)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine "
                   "it was written on was shared)")
    a = p.parse_args(argv)
    for flag, v, least in (("--windows", a.windows, 1), ("--window", a.window, 2),
                           ("--cal-windows", a.cal_windows, 1), ("--threads", a.threads, 1)):
        if v < least:
            p.error(f"{flag} must be at least {least}; got {v}")
    torch.set_num_threads(a.threads)
    out = write(n_windows=a.windows, window=a.window, cal_windows=a.cal_windows)
    top = sorted(out["rows"], key=lambda r: -r["kl_mean"])[:10]
    for r in top:
        print(r["tensor"], r["format"], f"{r['kl_mean']:.5f}")
    print(f"{len(out['rows'])} tensors in {out['seconds']} s -> {RESULTS_FILE}")


if __name__ == "__main__":
    main()
