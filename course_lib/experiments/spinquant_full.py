"""Lesson 16's full-model learned rotation: SpinQuant's idea on the whole of SmolLM2, written to
``results/spinquant_<model>.json``.

    python -m course_lib.experiments.spinquant_full --model smollm2      # 11 min on 2 cores
    python -m course_lib.experiments.spinquant_full --model smollm2 --add-coherence  # +1-2 min
    python -m course_lib.experiments.spinquant_full --model bundled      # under a minute
    python -m course_lib.experiments.spinquant_full --model smollm2 --steps 2 --windows 1 \
        --rows a4 --seeds 0 --out /tmp/s.json                            # a smoke run

R1 is learned on the KL of the quantized model's next-token distribution from the float
model's, with every block Linear's input in INT4 and the weights in float
(``spinquant.train_rotation_model``: SpinQuant's W16A4 setting for a model whose weights GPTQ
quantizes afterwards), the rounding's gradient passed through the per-token scale as well,
starting from QuaRot's random Hadamard (seed 0), on the first 12 of the rotation table's 16
calibration windows, early-stopped on the other 4. A line search along the first gradient
(``spinquant.loss_along_gradient``) records whether the loss follows it. If a step beat the
start, the learned R1 replaces the random one in ``rotate.quarot`` and the rotation table's
rows (``course_lib.rotation_table``: ``--rows``, of ``a4``, ``w4a4``, ``w4a4-gptq``; ``a4`` by
default) are scored with each on the table's evaluation windows (the clean protocol for
SmolLM2), learned minus random window by window (``protocol.paired``); if early stopping kept
the start, the record says so and scores the random one only. The random Hadamard's own
spread comes beside it: the ``a4`` row with R1 from other seeds (SpinQuant's observation is
that random rotations differ). ``--add-coherence`` adds how far two batches' gradients agree,
with and without the scale's gradient (``spinquant.gradient_coherence``). Nothing that
chooses (training, early stopping, GPTQ) reads the evaluation text.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from course_lib import device, rotate, spinquant
from course_lib import protocol as cprotocol
from course_lib import rotation_table as rt
from course_lib.spinquant import COMMAND, DEFAULT_ROWS, ROWS, SEEDS, TRAIN


def _short(r: dict) -> dict:
    return {k: r[k] for k in ("perplexity", "kl_nats", "top1_agreement", "windows", "interval",
                              "seconds") if k in r}


def run(model_name: str = "smollm2", steps: int = TRAIN["steps"], lr: float = TRAIN["lr"],
        batch: int = TRAIN["batch"], n_windows: int | None = None, rows=DEFAULT_ROWS, seeds=SEEDS,
        path: Path | str | None = None, progress: bool = True,
        objective: str = TRAIN["objective"]) -> dict:
    """Train the rotation, score the rows, write the JSON (after each row)."""
    from tqdm.auto import tqdm
    rt._check_name(model_name)
    rows = [rt.get_row(r).name for r in rows]
    bad = [r for r in rows if r not in ROWS]
    if bad:
        raise ValueError(f"rows {bad}: this record scores only {', '.join(ROWS)}")
    if 0 not in seeds:
        raise ValueError("seeds must include 0: training starts from the seed-0 Hadamard")
    st = rt.SETTINGS[model_name]
    n_windows = st["eval_windows"] if n_windows is None else n_windows
    path = Path(path) if path is not None else spinquant.results_path(model_name)
    t0 = time.perf_counter()
    model = rt.load_model(model_name)
    calib = rt.calibration(model_name, st["calib_windows"], st["calib_window"])  # (16, T)
    n_train = len(calib) * 3 // 4                      # 12 of 16 train, 4 early-stop
    rot, hist = spinquant.train_rotation_model(
        model, calib[:n_train], calib[n_train:], steps=steps, lr=lr, batch=batch, seed=0,
        val_every=min(TRAIN["val_every"], steps), objective=objective,
        optimizer=TRAIN["optimizer"], progress=progress)
    Q = rot.matrix()                                                     # (D, D) float64
    ref = rt.reference(model, model_name, n_windows, st["eval_window"])
    out = {"model": model_name,
           "command": f"{COMMAND} --model {model_name}" + "".join(
               f" --{k} {v}" for k, v in (("steps", steps), ("lr", lr), ("batch", batch),
                                          ("objective", objective))
               if v != TRAIN[k]) + (f" --windows {n_windows}" if n_windows != st["eval_windows"]
                                    else ""),
           "what": "R1 learned on the whole model (spinquant.train_rotation_model) against "
                   "QuaRot's random Hadamard R1 (rotate.quarot), the rest of QuaRot's rotations "
                   "the same; each rotated model quantized as rotation_table's rows and scored "
                   "against the unquantized, unrotated model (lesson 16)",
           "protocol": {"name": rt.PROTOCOL if model_name == "smollm2" else "bundled",
                        "n_windows": n_windows, "window_tokens": st["eval_window"],
                        "calibration": f"rotation_table.calibration({model_name!r}, "
                                       f"{st['calib_windows']}, {st['calib_window']}): the first "
                                       f"{n_train} train R1, the rest early-stop it; GPTQ "
                                       f"reads all {len(calib)}",
                        "spread": "per-window figures and bootstrap intervals; learned minus "
                                  "random Hadamard by protocol.paired"},
           "training": {**TRAIN, "steps": steps, "lr": lr, "batch": batch,
                        "train_windows": n_train, "val_windows": len(calib) - n_train,
                        "parameterisation": "Q = random_hadamard(D, 0) @ cayley(skew(P)), "
                                            "SGD with momentum 0.9 on P, cosine to 0",
                        "objective": objective,
                        "loss": ("KL divergence from the float model's next-token distribution"
                                 if objective == "kl" else "next-token cross-entropy")
                                + " of the W16A4 model (INT4 per-token activations, float "
                                  "weights), calibration text",
                        **hist,
                        "moved_from_start": float((Q - rot.Q0_64).pow(2).sum().sqrt()
                                                  / rot.Q0_64.pow(2).sum().sqrt()),
                        "orthogonality_error": spinquant.orthogonality_error(Q)},
           "reference": {"perplexity": ref.perplexity},
           "machine": {**device.machine_record(), "threads": torch.get_num_threads()},
           "torch": torch.__version__, "rows": [], "seeds": []}
    out["line_search"] = spinquant.loss_along_gradient(model, calib[:batch],
                                                       calib[n_train:])
    bases = {"hadamard": rt.prepare(model, True, 0)}
    if hist["best_step"] > 0:
        bases["learned"] = rotate.quarot(model, 0, Q=Q)
    else:
        out["learned_skipped"] = ("early stopping kept step 0: no step lowered the validation "
                                  "windows' KL, so the learned R1 is the random Hadamard itself "
                                  "and is not scored again")
    memo: dict = {}

    def measure(base, row) -> dict:
        t = time.perf_counter()
        with torch.no_grad():
            r = rt.score(rt.quantize(base, row, calib, progress=progress, memo=memo), ref)
        r["seconds"] = round(time.perf_counter() - t, 2)
        return _short(r)

    for row in tqdm(rows, desc="scoring", disable=not progress):
        res = {"row": row, "what": rt.ROWS[row].what,
               **{k: measure(b, row) for k, b in bases.items()}}
        res["learned_minus_hadamard"] = (
            {k: cprotocol.paired(res["learned"]["windows"][k], res["hadamard"]["windows"][k])
             for k in ("kl_nats", "nll_nats")} if n_windows > 1 and "learned" in res else None)
        out["rows"].append(res)
        _write(path, out)
    memo.clear()
    if "a4" in rows:
        plain = measure(model, "a4")
        out["plain_a4"] = plain
        for s in tqdm(seeds, desc="random Hadamard seeds (a4)", disable=not progress):
            r = (next(x for x in out["rows"] if x["row"] == "a4")["hadamard"] if s == 0 else
                 measure(rt.prepare(model, True, s), "a4"))
            out["seeds"].append({"seed": s, **{k: r[k] for k in ("kl_nats", "perplexity",
                                                                  "top1_agreement")}})
    out["seconds_total"] = round(time.perf_counter() - t0, 1)
    _write(path, out)
    return out


def add_coherence(path: Path | str, model_name: str = "smollm2", windows: int = 6) -> dict:
    """Add to a record how coherent the training gradient is with and without the gradient
    through the quantizer's scale (``spinquant.gradient_coherence`` on the first ``windows``
    training windows, batches of 2): why the full-model run passes it."""
    path = Path(path)
    out = json.loads(path.read_text())
    model = rt.load_model(model_name)
    st = rt.SETTINGS[model_name]
    ids = rt.calibration(model_name, st["calib_windows"], st["calib_window"])[:windows]
    t = time.perf_counter()
    out["gradient_coherence"] = {
        "what": f"cosine between the R1 gradients (at the random Hadamard) of every two batches "
                f"of 2 of the first {windows} training windows",
        "scale_gradient": spinquant.gradient_coherence(model, ids, 2, True),
        "scale_detached": spinquant.gradient_coherence(model, ids, 2, False),
        "machine": {**device.machine_record(), "threads": torch.get_num_threads()},
        "seconds": round(time.perf_counter() - t, 1)}
    _write(path, out)
    return out


def _write(path: Path, out: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    tmp.replace(path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(rt.SETTINGS), default="smollm2")
    p.add_argument("--steps", type=int, default=TRAIN["steps"])
    p.add_argument("--lr", type=float, default=TRAIN["lr"])
    p.add_argument("--batch", type=int, default=TRAIN["batch"])
    p.add_argument("--objective", choices=("kl", "ce"), default=TRAIN["objective"])
    p.add_argument("--windows", type=int, default=None, help="evaluation windows")
    p.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                   help=f"a comma-separated subset of {', '.join(ROWS)}")
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    p.add_argument("--out", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--add-coherence", action="store_true",
                   help="only add the gradient-coherence check to the record at --out")
    a = p.parse_args(argv)
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    if a.add_coherence:
        path = a.out or spinquant.results_path(a.model)
        c = add_coherence(path, a.model)["gradient_coherence"]
        print(f"gradient coherence, scale gradient: {c['scale_gradient']}; detached: "
              f"{c['scale_detached']}")
        return
    out = run(a.model, a.steps, a.lr, a.batch, a.windows, a.rows.split(","),
              tuple(int(s) for s in a.seeds.split(",")), a.out, objective=a.objective)
    for r in out["rows"]:
        c = (r["learned_minus_hadamard"] or {}).get("kl_nats")
        learned = r.get("learned", r["hadamard"])
        print(f"{r['row']:10s} KL random {r['hadamard']['kl_nats']:.4f} learned "
              f"{learned['kl_nats']:.4f}" + (f"  diff {c['diff']:+.4f} [{c['interval'][0]:+.4f}, "
                                                   f"{c['interval'][1]:+.4f}] {c['a_better']}/"
                                                   f"{c['n_windows']}" if c else ""))
    print(f"written in {out['seconds_total']} s")


if __name__ == "__main__":
    main()
