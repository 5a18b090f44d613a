"""The writer of lesson 14's engine table, ``results/kquants_engine_smollm2.json``: every file
of the table (llama.cpp's Q4_K_M and Q3_K_M, the same mixes and Q4_0 with the course's
importance matrix, the course's own bit allocation at no more bytes) written, run in llama.cpp
and timed.

    python -m course_lib.experiments.sensitivity_scan scan   # first: the allocation's costs
    python -m course_lib.experiments.kmix_table              # about 15 minutes on 2 cores

What the table holds and how the lesson reads it (:func:`course_lib.kmix_table.load_table`,
the allocation :func:`course_lib.kmix_table.course_mix`) are :mod:`course_lib.kmix_table`'s;
this module only writes it.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from course_lib import engine, imatrix, kmix, sensitivity
from course_lib.kmix_table import (ALLOC_FORMATS, N_WINDOWS, PROTOCOL, Q4_0_IMX, Q4_0_IMX_NOTE,
                                   RESULTS_FILE, course_mix, linear_bytes)


def _mix_counts(pick: dict) -> dict:
    counts = {}
    for f in pick.values():
        counts[f] = counts.get(f, 0) + 1
    return counts


def write_table(n_windows: int = N_WINDOWS, calib_windows: int = 2, runs: int = 3,
                new_tokens: int = 32, threads: int | None = None, work_dir=None,
                path: Path = RESULTS_FILE) -> dict | None:
    """Every file of the table written, scored through the engine on ``n_windows`` windows of
    512 tokens against the course's F16 model, and timed (``runs`` interleaved decoding runs of
    ``new_tokens`` tokens each, every file in turn).

    ``work_dir`` keeps the files and the scores between calls: a call before the sensitivity
    scan exists scores the llama.cpp and importance-matrix rows and returns None; a call after
    it adds the course's mixes, times every file and writes ``path``."""
    import torch
    from course_lib import device, export, smollm
    from course_lib import eval as ceval
    from course_lib.methods import calibration as cal
    engine.require("llama_model_quantize")
    threads = threads or min(2, os.cpu_count() or 1)
    t_all = time.perf_counter()
    out_dir = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="kmix-table-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    cache_file = out_dir / "scores.json"
    cache = json.loads(cache_file.read_text()) if cache_file.exists() else {}
    try:
        model = sensitivity.f16_model()
        f16 = out_dir / "f16.gguf"
        if not f16.exists():
            export.export_gguf(model, f16, "f16")
        if (out_dir / "ref.pt").exists():
            ref = ceval.Reference(**torch.load(out_dir / "ref.pt"))
        else:
            ref = smollm.reference(model, n_windows, protocol=PROTOCOL)
            torch.save(dict(vars(ref)), out_dir / "ref.pt")
        if (out_dir / "imatrix.npz").exists():
            imx = dict(np.load(out_dir / "imatrix.npz"))
        else:
            imx = imatrix.gguf_names(imatrix.collect(
                model, cal.calibration_ids("smollm2", calib_windows, 512, protocol=PROTOCOL)))
            np.savez(out_dir / "imatrix.npz", **imx)
        del model
        files, notes = {"F16": f16}, {}

        def made(label, name, make):
            p = out_dir / name
            if not p.exists():
                make(p)
            files[label] = p

        made("Q4_0 (llama.cpp)", "q4_0.gguf",
             lambda p: engine.quantize_file(f16, p, "q4_0", threads=threads))
        q4_0 = {n: "q4_0" for n in kmix.plan("q4_k_m", f16)}
        q4_0["token_embd.weight"] = "q8_0"
        made(Q4_0_IMX, "q4_0_imx.gguf",
             lambda p: kmix.write_mix(f16, p, q4_0, imx, "q4_0"))
        notes[Q4_0_IMX] = {"note": Q4_0_IMX_NOTE}
        for mix in ("q4_k_m", "q3_k_m"):
            label = mix.upper()
            made(f"{label} (llama.cpp)", f"{mix}.gguf",
                 lambda p: engine.quantize_file(f16, p, mix, threads=threads))
            types = {n: c.stored for n, c in kmix.plan(mix, f16).items()}
            made(f"{label} + imatrix (course)", f"{mix}_imx.gguf",
                 lambda p: kmix.write_mix(f16, p, types, imx, mix))
        have_scan = sensitivity.RESULTS_FILE.exists()
        if have_scan:
            scan = sensitivity.load_scan()
            est = sensitivity.costs_from_scan(scan["rows"])[0]
            for mix in ("q4_k_m", "q3_k_m"):
                label = mix.upper()
                budget = linear_bytes(kmix.read_mix(files[f"{label} (llama.cpp)"]))
                for tag, formats, use_imx in (("", ALLOC_FORMATS, False),
                                              (" + imatrix", ALLOC_FORMATS, True),
                                              (" (Q4_1 allowed)", ALLOC_FORMATS + ("q4_1",),
                                               False)):
                    if mix == "q4_k_m" and "Q4_1" in tag:
                        continue
                    pick = course_mix(scan["rows"], budget, formats)
                    types = dict(pick, **{"token_embd.weight": "q8_0"})
                    name = f"course mix at {label}'s bytes{tag}"
                    made(name, f"mix_{mix}_{len(files)}.gguf",
                         lambda p: kmix.write_mix(f16, p, types, imx if use_imx else None, mix))
                    notes[name] = {"budget_linear_bytes": budget, "formats": _mix_counts(pick),
                                   "estimated_kl": sensitivity.estimated_cost(est, pick),
                                   "types": pick}
        rows = []
        for name, f in files.items():
            if name not in cache:
                mix_rows = kmix.read_mix(f)
                s = kmix.summary(mix_rows)
                r = {"file": name, "tensor_bytes": s["bytes"], "file_bytes": f.stat().st_size,
                     "mib": s["mib"], "bits_per_weight": s["bits_per_weight"],
                     "linear_bytes": linear_bytes(mix_rows),
                     "types": {t: c for t, (c, _) in s["by_type"].items()}}
                sc = engine.score(f, smollm.eval_ids(PROTOCOL), 512, n_windows, ref, threads)
                r.update({k: sc[k] for k in ("perplexity", "kl_nats", "top1_agreement",
                                             "windows")})
                cache[name] = r
                cache_file.write_text(json.dumps(cache, indent=1))
                print(name, {k: r[k] for k in ("mib", "perplexity", "kl_nats")}, flush=True)
            rows.append(dict(cache[name], **notes.get(name, {})))
        if not have_scan:
            print(f"{sensitivity.RESULTS_FILE} is missing: the course's mixes and the speed "
                  f"runs wait for `python -m course_lib.experiments.sensitivity_scan scan`")
            return None
        prompt = smollm.tokenizer().encode("The capital of France is")
        llms = {n: engine.load(f, threads=threads) for n, f in files.items()}
        samples = {n: [] for n in files}
        for _ in range(runs):
            for n in files:
                samples[n] += engine.decode_speed(llms[n], prompt, new_tokens, 1,
                                                  threads)["tokens_per_s"]
        del llms
        for r in rows:
            s = samples[r["file"]]
            r["tokens_per_s"] = {"runs": s, "median": statistics.median(s)}
        out = {"engine": f"llama-cpp-python=={engine.version()}",
               "protocol": {"name": PROTOCOL, "n_windows": n_windows, "window_tokens": 512,
                            "text": "the clean protocol's evaluation text (smollm.eval_ids"
                                    "('clean')), never read by the importance matrix or the "
                                    "scan, which choose",
                            "reference": "course fp32 LlamaModel, weights rounded to fp16",
                            "importance_matrix": {"windows": calib_windows, "tokens": 512,
                                                  "text": "calibration part of the reference "
                                                          "text of the clean protocol "
                                                          "(methods.calibration, seed 0)"},
                            "allocation": {"formats": list(ALLOC_FORMATS),
                                           "costs": "sensitivity scan (results/"
                                                    f"{sensitivity.RESULTS_FILE.name})"},
                            "speed": {"runs": runs, "new_tokens": new_tokens,
                                      "threads": threads, "interleaved": True}},
               "machine": {**device.machine_record(), "cpus": os.cpu_count(),
                           "engine_threads": threads, "load_avg_1min": os.getloadavg()[0]},
               "note": _load_note(os.getloadavg()[0], os.cpu_count() or 1),
               "seconds_last_call": round(time.perf_counter() - t_all, 1),
               "reference_perplexity": ref.perplexity, "rows": rows}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1) + "\n")
        return out
    finally:
        if not work_dir:
            shutil.rmtree(out_dir, ignore_errors=True)


def _load_note(load: float, cpus: int) -> str:
    """What the load at the end of the run says about its tokens/s."""
    head = (f"1-minute load average {load:.1f} on {cpus} cores at the end; perplexity, KL and "
            "top-1 do not depend on the load")
    if load <= cpus + 0.5:              # the engine's own threads (one per core), little else
        return head + "; tokens/s were measured on an otherwise idle machine (interleaved runs)"
    return head + ("; tokens/s do, and are comparable between rows of this run only "
                   "(interleaved runs): rerun on an idle machine for speed")


def main(argv=None) -> None:
    import argparse
    p = argparse.ArgumentParser(prog="python -m course_lib.experiments.kmix_table",
                                description="lesson 14's engine table")
    p.add_argument("--windows", type=int, default=N_WINDOWS)
    p.add_argument("--calib-windows", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--work-dir", default=None, help="keep files and scores here between runs")
    a = p.parse_args(argv)
    out = write_table(a.windows, a.calib_windows, a.runs, a.new_tokens, work_dir=a.work_dir)
    if out is None:
        return
    for r in out["rows"]:
        print(f"{r['file']:42s} {r['mib']:7.2f} MiB {r['bits_per_weight']:.2f} bpw "
              f"ppl {r['perplexity']:.3f} KL {r['kl_nats']:.4f} top1 {r['top1_agreement']:.3f} "
              f"{r['tokens_per_s']['median']:.1f} tok/s")


if __name__ == "__main__":
    main()
