"""The writer of lesson 15's committed tables: ``python -m course_lib.experiments.qat_tables
--model bundled`` and ``--model smollm2`` (``results/qat_bundled.json``,
``results/qat_smollm2.json``; lesson 15 reads them with ``course_lib.qat.load_results``).

bundled: quantization-aware training of the bundled model at INT4, INT3, INT2 (group 32) and
ternary from its pretrained checkpoint, beside round-to-nearest and GPTQ at the same bits, with
a learning curve per setting and the short run lesson 15 repeats live (a few minutes per
setting on an idle 2-core CPU). smollm2: SmolLM2 tuned block by block at 3 and 2 bits beside
RTN, GPTQ and AWQ, each model also written as GGUF Q4_0 and run in llama.cpp. The settings are
``course_lib.qat.SETTINGS``; the method is in :mod:`course_lib.qat` (this module drives the
engine of lesson 13 too, and only writes).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path

import torch
import torch.nn as nn

from course_lib import qat
from course_lib.methods import calibration as cal
from course_lib.qat import (PROTOCOL, SETTINGS, _scores, bits_per_weight, bundled_run,
                            bundled_slice, label, results_path, smollm2_slice, ternary_rtn,
                            to_container)


def _write(path: Path, out: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")


def export_check(qmodel: nn.Module, model: nn.Module, n_windows: int = 2,
                 folder: Path | None = None) -> dict:
    """A frozen SmolLM2 QAT model (3 or 2 bits, group 32) through GGUF's Q4_0 and llama.cpp
    (lesson 15): the codes in 4-bit containers with fp16 steps (:func:`to_container`), written
    by ``export.export_gguf``, scored by the engine and by the course on the same windows
    (perplexity, KL from the float model, top-1). Without the engine, the course side only."""
    import tempfile
    from course_lib import engine, export, smollm
    from course_lib import eval as ceval
    from course_lib.gguf_model import quantize_q8_0
    ref = smollm.reference(model, n_windows, protocol=PROTOCOL)
    boxed = to_container(qmodel, 4, 32, torch.float16)
    folder = Path(folder or tempfile.mkdtemp(prefix="qat-gguf-"))
    path = export.export_gguf(boxed, folder / "qat_q4_0.gguf", "q4_0", overwrite=True)
    course = copy.deepcopy(boxed)
    emb = course.model.embed_tokens.weight
    emb.data = quantize_q8_0(emb.data).dequantize()              # the file's Q8_0 embedding
    c = ceval.compare(course, ref)
    out = {"file_bytes": path.stat().st_size, "n_windows": n_windows,
           "course": {k: round(float(c[k]), 6) for k in ("perplexity", "kl_nats",
                                                          "top1_agreement")}}
    if engine.available():
        e = engine.score(path, smollm.eval_ids(PROTOCOL), 512, n_windows, ref)
        out["engine"] = {k: round(float(e[k]), 6) for k in ("perplexity", "kl_nats",
                                                             "top1_agreement")}
    else:
        out["engine"] = None
    path.unlink()
    return out


def write_bundled(path: Path | None = None, progress: bool = True) -> dict:
    """QAT of the bundled model at INT4, INT3, INT2 (group 32) and ternary, beside RTN and GPTQ
    at the same bits, with learning curves: ``results/qat_bundled.json``."""
    from course_lib import data, device
    from course_lib import eval as ceval
    from course_lib.methods import gptq
    from course_lib.model import load_pretrained
    st = SETTINGS["bundled"]
    t0 = time.perf_counter()
    model = load_pretrained()
    corpus = data.to_tensor(cal.bundled_calibration_text())
    W = st["eval_window"]
    ref = ceval.reference(model, data.heldout_text(st["eval_windows"] * W + 1), window=W)
    ref_curve = ceval.reference(model, data.heldout_text(st["curve_windows"] * W + 1), window=W)
    ids = cal.calibration_ids("bundled", st["calib_windows"], st["calib_window"])
    out = {"model": "bundled",
           "protocol": {k: v for k, v in st.items() if k != "slice"} | {
               "loss": "KL from the float model's next-byte distribution (distillation)",
               "train_text": "random windows of the training split (course_lib.data)",
               "eval_text": "held-out text, non-overlapping windows",
               "grid": "symmetric group-wise INT, codes -qmax..qmax (lessons 02-03); ternary: "
                       "{-1, 0, 1} x mean|W| per tensor (BitNet b1.58)",
               "quantized": "every Linear of the decoder blocks; embeddings and head kept",
               "optimizer": "AdamW (0.9, 0.95), no weight decay, cosine to 0.1 of the lr, "
                            "gradient norm clipped at 1"},
           "machine": {**device.machine_record(), "threads": torch.get_num_threads()},
           "baseline": {"bits_per_byte": round(ref.bits_per_byte, 6)},
           "rows": [], "curves": {}, "slice": None}
    for bits in st["bits"]:
        if bits == "ternary":
            out["rows"].append({"method": "rtn", "bits": bits, "group_size": None,
                                "bits_per_weight": bits_per_weight(bits, 0),
                                **_scores(ternary_rtn(model), ref)})
        else:
            out["rows"].append({"method": "rtn", "bits": bits, "group_size": st["group_size"],
                                "bits_per_weight": bits_per_weight(bits, st["group_size"]),
                                **_scores(cal.rtn_model(model, bits, st["group_size"]), ref)})
            g, secs = gptq.gptq_model(model, ids, bits, st["group_size"])
            out["rows"].append({"method": "gptq", "bits": bits, "group_size": st["group_size"],
                                "bits_per_weight": bits_per_weight(bits, st["group_size"]),
                                "seconds": round(secs, 1), **_scores(g, ref)})
        q, curve = bundled_run(model, bits, st, corpus, ref_curve, progress=progress)
        out["rows"].append({"method": "qat", "bits": bits,
                            "group_size": None if bits == "ternary" else st["group_size"],
                            "bits_per_weight": bits_per_weight(bits, st["group_size"]),
                            "seconds": round(curve.seconds, 1), **_scores(q, ref)})
        out["curves"][label(bits)] = {"loss": [[s, round(v, 6)] for s, v in curve.loss],
                                      "heldout": [[s, h] for s, h in curve.heldout]}
        _write(path or results_path("bundled"), out)
    out["slice"] = bundled_slice(model, corpus)
    out["seconds_total"] = round(time.perf_counter() - t0, 1)
    out["command"] = "python -m course_lib.experiments.qat_tables --model bundled"
    out["load_avg_1min_at_end"] = round(os.getloadavg()[0], 1)
    _write(path or results_path("bundled"), out)
    return out


def _smollm2_qat(model: nn.Module, ids, bits: int, progress: bool = True, log=None):
    """SmolLM2 tuned block by block at ``bits`` with ``SETTINGS["smollm2"]``: (model, s)."""
    st = SETTINGS["smollm2"]
    return qat.blockwise_qat(model, ids, bits, st["group_size"], steps=st["steps"], lr=st["lr"],
                             scale_lr=st["scale_lr"], batch=st["batch"], n_blocks=st["n_blocks"],
                             progress=progress, log=log)


def write_smollm2(path: Path | None = None, progress: bool = True) -> dict:
    """SmolLM2 tuned block by block at 3 and 2 bits (group 32) beside RTN, GPTQ (with and
    without act-order) and AWQ at the same bits on the lesson 04 protocol:
    ``results/qat_smollm2.json``. The 3-bit GPTQ and AWQ rows are the committed ones of
    ``results/methods_smollm2.json`` (same grid, calibration and evaluation), said so in
    each row; the 2-bit ones are measured here."""
    from course_lib import device, smollm
    from course_lib.methods import awq, gptq
    from course_lib.methods import table
    st = SETTINGS["smollm2"]
    t0 = time.perf_counter()
    model = smollm.load()
    ref = smollm.reference(model, st["eval_windows"], st["eval_window"], protocol=PROTOCOL)
    ids = cal.calibration_ids("smollm2", st["calib_windows"], st["calib_window"],
                              protocol=PROTOCOL)
    committed = table.load_table("smollm2")
    if committed.get("protocol", {}).get("name") != PROTOCOL:
        raise RuntimeError(f"results/methods_smollm2.json was not measured on the {PROTOCOL!r} "
                           f"protocol: rerun python -m course_lib.experiments.methods_table "
                           f"--model smollm2 first (this table copies its GPTQ and AWQ rows)")
    ptq_ids = cal.calibration_ids("smollm2", committed["calibration"]["windows"],
                                  committed["calibration"]["tokens"],
                                  protocol=PROTOCOL)                    # lesson 06's
    gs = st["group_size"]
    out = {"model": "smollm2",
           "protocol": {k: v for k, v in st.items() if k != "slice"} | {
               "loss": "relative MSE of each block's outputs against the float block's on "
                       "the float model's activations (OmniQuant / EfficientQAT)",
               "inputs": "each block's inputs come from the blocks already tuned",
               "learned": "a step per group of 32 (LSQ) and the block's weights",
               "grid": "symmetric group-wise INT, codes -qmax..qmax (lessons 02-03)",
               "quantized": "every Linear of the decoder blocks; embeddings and head kept",
               "calibration": f"calibration text of the {PROTOCOL!r} protocol "
                              "(course_lib.smollm.PROTOCOLS; never the evaluation text): "
                              "calib_windows x calib_window tokens for QAT; GPTQ and AWQ use "
                              "lesson 06's 16 x 512 (their committed rows)",
               "name": PROTOCOL,
               "spread": "per-window figures; 95% bootstrap intervals over windows "
                         "(course_lib.protocol)"},
           "machine": {**device.machine_record(), "threads": torch.get_num_threads()},
           "baseline": {"bits_per_byte": round(ref.bits_per_byte, 6),
                        "perplexity": round(ref.perplexity, 4)},
           "rows": [], "block_losses": {}, "slice": None}
    path = path or results_path("smollm2")
    for bits in st["bits"]:
        base = {"bits": bits, "group_size": gs, "bits_per_weight": bits_per_weight(bits, gs)}
        out["rows"].append({"method": "rtn", **base,
                            **_scores(cal.rtn_model(model, bits, gs), ref, spread=True)})
        out["rows"].append({"method": table.ASYM_METHOD, **base,        # lesson 04's trap
                            "bits_per_weight": bits_per_weight(bits, gs) + bits / gs,
                            **_scores(cal.rtn_model(model, bits, gs, symmetric=False), ref,
                                      spread=True)})
        for method in ("gptq", "gptq+act", "awq"):
            if bits != 3 and method not in st["methods_2bit"]:
                continue                            # not measured below 3 bits (time)
            try:
                old = table.find(committed["rows"], method, bits, gs)
                out["rows"].append({"method": method, **base, "seconds": old["seconds"],
                                    **{k: round(old[k], 6) for k in ("bits_per_byte",
                                       "perplexity", "kl_nats", "top1_agreement")},
                                    **{k: old[k] for k in ("windows", "interval") if k in old},
                                    "source": "results/methods_smollm2.json (measured on "
                                              f"{committed['machine'].get('cpu', '?')})"})
                continue
            except KeyError:
                pass
            if method == "awq":
                qm, secs = awq.awq_model(model, ptq_ids, bits, gs, progress=progress)
            else:
                qm, secs = gptq.gptq_model(model, ptq_ids, bits, gs,
                                           act_order=method == "gptq+act", progress=progress)
            out["rows"].append({"method": method, **base, "seconds": round(secs, 1),
                                **_scores(qm, ref, spread=True)})
            _write(path, out)
        log: list = []
        qm, secs = _smollm2_qat(model, ids, bits, progress, log)
        out["rows"].append({"method": "qat-blockwise", **base, "seconds": round(secs, 1),
                            **_scores(qm, ref, spread=True)})
        out["block_losses"][label(bits)] = [[round(v, 6) for v in (b[0], b[-1])] for b in log]
        _write(path, out)
        out.setdefault("export_q4_0", {})[label(bits)] = export_check(qm, model,
                                                                      st["export_windows"])
        _write(path, out)
    out["slice"] = smollm2_slice(model)
    out["seconds_total"] = round(time.perf_counter() - t0, 1)
    out["command"] = "python -m course_lib.experiments.qat_tables --model smollm2"
    out["load_avg_1min_at_end"] = round(os.getloadavg()[0], 1)
    _write(path, out)
    return out


def rerun_exports(path: Path | None = None, progress: bool = True) -> dict:
    """Only the GGUF Q4_0 export check of ``results/qat_smollm2.json``, e.g. on a machine
    that has the engine (``make engine``) when the table was written without it: each
    committed QAT model is trained again (same settings; its generators are seeded), its
    scores must equal the committed row's (else the file is left alone and this raises),
    and ``export_q4_0`` is rewritten with the engine's scores beside the course's."""
    from course_lib import device, smollm
    st = SETTINGS["smollm2"]
    path = path or results_path("smollm2")
    out = json.loads(path.read_text())
    model = smollm.load()
    ref = smollm.reference(model, st["eval_windows"], st["eval_window"], protocol=PROTOCOL)
    ids = cal.calibration_ids("smollm2", st["calib_windows"], st["calib_window"],
                              protocol=PROTOCOL)
    exports = {}
    for bits in st["bits"]:
        row = next(r for r in out["rows"] if r["method"] == "qat-blockwise" and r["bits"] == bits)
        qm, _ = _smollm2_qat(model, ids, bits, progress)
        again = _scores(qm, ref)
        for k in ("perplexity", "kl_nats", "top1_agreement"):
            # the same CPU type and thread count reproduce a run; 0.5% leaves room for
            # another dispatch (lesson 15's slice: 0.23% between AVX-512 and AVX2)
            if abs(again[k] - row[k]) > 5e-3 * abs(row[k]):
                raise RuntimeError(f"{label(bits)} QAT {k} {again[k]:.6f} does not reproduce "
                                   f"the committed {row[k]:.6f}: rerun the whole table "
                                   "(python -m course_lib.experiments.qat_tables --model smollm2)")
        exports[label(bits)] = export_check(qm, model, st["export_windows"])
    out["export_q4_0"] = exports
    out["export_rerun"] = {"command": "python -m course_lib.experiments.qat_tables "
                                      "--model smollm2 --export-only",
                           "machine": {**device.machine_record(),
                                       "threads": torch.get_num_threads()}}
    _write(path, out)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m course_lib.experiments.qat_tables",
                                description="Quantization-aware training tables (lesson 15)")
    p.add_argument("--model", choices=sorted(SETTINGS), default="bundled")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--export-only", action="store_true",
                   help="smollm2: only the GGUF/llama.cpp export check (rerun_exports)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.export_only:
        if a.model != "smollm2":
            p.error("--export-only applies to --model smollm2")
        out = rerun_exports()
        print(json.dumps(out["export_q4_0"], indent=1))
        return
    out = write_bundled() if a.model == "bundled" else write_smollm2()
    for r in out["rows"]:
        print(f"{r['method']:>5} {label(r['bits']):>8}  KL {r['kl_nats']:.4f}  top-1 "
              f"{r['top1_agreement']:.4f}  bpb {r['bits_per_byte']:.4f}  ppl {r['perplexity']:.3f}")
    print(f"written in {out['seconds_total']} s")


if __name__ == "__main__":
    main()
