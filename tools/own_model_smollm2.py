"""Lesson 17's command on SmolLM2, every method, each output run where it is served: the
compressed-tensors folder loaded by transformers, the GGUF file run by llama.cpp.

    python tools/own_model_smollm2.py [--threads 2] [--windows 4] [--window 256]

For each method (rtn, gptq, awq: a folder and its ``--gguf`` file; kmix: a GGUF file only) it
runs ``python -m course_lib.quantize_own`` on the course's SmolLM2 folder, in-process, with its
evaluation on 2 held-out windows of 256 tokens, then checks on the first of those windows:

- llama.cpp (llama-cpp-python) running the GGUF file against the course's own reading of the
  same weights (``stream.load_packed`` for a folder's file; ``own_model.load`` of the GGUF
  file for the mix): KL and top-1 agreement, and the largest logit difference;
- transformers (compressed-tensors installed) loading the folder against ``stream.load_packed``:
  the largest logit difference.

It writes ``results/own_model_smollm2.json`` with the figures, the command lines, the seconds
and the machine. SmolLM2 here was expanded from a Q4_1 file (lesson 04), so the mix's plan is
the degenerate one lesson 17 explains; the figures check that the files run, not which method
is best (``results/methods_smollm2.json`` does that).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = ROOT / "results" / "own_model_smollm2.json"
METHODS = ("rtn", "gptq", "awq", "kmix")


def _quiet_load(path):
    from course_lib import own_model
    with warnings.catch_warnings():                 # "a quantized GGUF keeps its grid": known
        warnings.simplefilter("ignore")
        return own_model.load(path)


def _compare(ours, theirs) -> dict:
    """KL(ours || theirs), top-1 agreement and the largest logit difference, (T, V) logits."""
    import torch
    from course_lib import eval as ceval
    kl, top1 = ceval.kl_and_top1(torch.log_softmax(ours.float(), -1),
                                 torch.log_softmax(theirs.float(), -1))
    return {"kl_nats": kl, "top1_agreement": top1,
            "max_abs_logit_diff": float((ours - theirs).abs().max()),
            "max_abs_logit": float(ours.abs().max())}


def run(threads: int, windows: int, window: int) -> dict:
    import torch
    from course_lib import device, engine, quantize_own, smollm, stream
    torch.set_num_threads(threads)
    src = smollm.model_dir()
    ck = stream._open(src)
    held = stream.eval_ids(ck, None, 2, 256)[0]                                 # (256,)
    work = Path(tempfile.mkdtemp(prefix="own_model_smollm2_"))
    out = {"what": __doc__.split("\n\n")[0], "source": str(src.relative_to(ROOT)),
           "check_window": "stream.eval_ids(SmolLM2, None, 2, 256)[0]: the course's held-out text",
           "protocol": {"name": "clean", "calibration": "data.clean_split()[0], the command's "
                        "default", "evaluation": "data.clean_split()[1] (the command's default "
                        "and the check window): no 50-character run shared with the calibration"},
           "machine": device.machine_record(), "threads": threads, "rows": []}
    for m in METHODS:
        gguf = work / f"{m}.gguf"
        args = [str(src), "--method", m, "--windows", str(windows), "--window", str(window),
                "--eval-windows", "2", "--eval-window", "256", "--gguf", str(gguf),
                "--no-progress", "--threads", str(threads)]
        if m != "kmix":
            args += ["--group-size", "64", "--out", str(work / m)]
        t0 = time.perf_counter()
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            rc = quantize_own.main(args)
        seconds = time.perf_counter() - t0
        text = log.getvalue()
        if rc != 0:
            raise RuntimeError(f"quantize_own {m} exited {rc}:\n{text}")
        row = {"method": m, "command": "python -m course_lib.quantize_own " + " ".join(
                   a.replace(str(work), "OUT").replace(str(ROOT) + "/", "") for a in args),
               "seconds": round(seconds, 1), "gguf_bytes": gguf.stat().st_size,
               "command_evaluation": [ln for ln in text.splitlines()
                                      if ln.startswith(("perplexity", "KL(ref", "top-1"))]}
        with torch.no_grad():
            course = (stream.load_packed(work / m) if m != "kmix" else _quiet_load(gguf))
            ours = course(held[None])[0]
        if engine.available():
            row["llama_cpp"] = _compare(ours, engine.logits(str(gguf), held))
        else:
            row["llama_cpp"] = {"not_run": engine.skip_reason()}
        if m != "kmix":
            try:
                from transformers import AutoModelForCausalLM
                hf = AutoModelForCausalLM.from_pretrained(str(work / m), dtype=torch.float32)
                with torch.no_grad():
                    theirs = hf(held[None]).logits[0]
                row["transformers"] = _compare(ours, theirs)
            except ImportError as e:
                row["transformers"] = {"not_run": str(e)}
        out["rows"].append(row)
        print(m, json.dumps({k: v for k, v in row.items() if k != "command"}, indent=None),
              flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--windows", type=int, default=4, help="calibration windows")
    p.add_argument("--window", type=int, default=256, help="tokens per calibration window")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    out = run(a.threads, a.windows, a.window)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["command"] = "python tools/own_model_smollm2.py " + " ".join(argv or sys.argv[1:])
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
