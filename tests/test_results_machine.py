"""Every committed ``results/*.json`` says what it was computed on (issue 25 item 5): the CPU
(model name, the ISA flags that steer dispatch), torch and its BLAS, under ``"machine"``.

Numbers downstream of a rounding decision move with the CPU and BLAS (GPTQ's error feedback,
INT8/FP8 codes of activations, top-1): a committed figure without its machine cannot be told
apart from a bug when a learner's CPU gives another. Files written before the record existed
were retrofitted from what is known (marked ``"retrofitted": true``, with ``"recorded_by"``
naming the evidence; a CPU no record names says ``"not recorded"``). Writers are checked two
ways: the small ones are run here with their heavy parts replaced, and every writer's source
must call ``device.machine_record()``. No model is loaded.
"""
from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from course_lib import device

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
RECORD_KEYS = {"cpu", "arch", "isa_flags", "logical_cpus", "torch", "blas",
               "torch_cpu_capability", "torch_threads", "dispatch_env", "python"}


# ---- the committed files --------------------------------------------------------------------

def _machines(name: str, data: dict) -> list[tuple[str, dict]]:
    """(where, record) for every machine record a results file holds: the top-level one, or,
    for a file gathering several machines' runs (results/cpu_spread.json), one per run."""
    if "machine" in data:
        return [("machine", data["machine"])]
    runs = data.get("runs")
    if isinstance(runs, dict) and runs:
        return [(f"runs[{k!r}].machine", r.get("machine")) for k, r in runs.items()]
    return [("machine", None)]


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_every_results_file_records_its_machine(path):
    data = json.loads(path.read_text())
    assert isinstance(data, dict), f"{path.name}: a results file is a JSON object"
    for where, m in _machines(path.name, data):
        assert isinstance(m, dict), (f"{path.name} has no {where}: store device.machine_record() "
                                     "there (issue 25)")
        for key in ("cpu", "torch"):
            assert isinstance(m.get(key), str) and m[key], f"{path.name} {where}: no {key!r}"
        if m.get("retrofitted"):
            assert m.get("recorded_by", "").startswith("retrofitted (issue 25) from "), \
                f"{path.name} {where}: a retrofitted record names its evidence in recorded_by"
        else:   # written by a writer: the full record
            missing = RECORD_KEYS - set(m)
            assert not missing, f"{path.name} {where}: the record lacks {sorted(missing)}"
            assert m["cpu"] != "not recorded"


# ---- the record itself ----------------------------------------------------------------------

def _check_record(m: dict) -> None:
    assert RECORD_KEYS <= set(m), RECORD_KEYS - set(m)
    assert isinstance(m["cpu"], str) and m["cpu"]
    assert isinstance(m["arch"], str) and m["arch"]
    assert isinstance(m["isa_flags"], list) and set(m["isa_flags"]) <= set(device.ISA_FLAGS)
    assert m["logical_cpus"] is None or (isinstance(m["logical_cpus"], int) and m["logical_cpus"] >= 1)
    assert m["torch"] == torch.__version__
    assert isinstance(m["blas"], str)
    assert isinstance(m["torch_cpu_capability"], str)
    assert isinstance(m["torch_threads"], int) and m["torch_threads"] >= 1
    assert isinstance(m["dispatch_env"], dict) and set(m["dispatch_env"]) <= set(device.DISPATCH_VARS)
    assert isinstance(m["python"], str) and m["python"].count(".") >= 1


def test_machine_record_has_the_documented_keys(monkeypatch):
    for var in device.DISPATCH_VARS:
        monkeypatch.delenv(var, raising=False)
    m = device.machine_record()
    assert set(m) == RECORD_KEYS
    _check_record(m)
    assert m["dispatch_env"] == {} and m["torch_threads"] == torch.get_num_threads()
    assert json.loads(json.dumps(m)) == m                     # it goes into a JSON file as it is
    if sys.platform.startswith("linux") and Path("/proc/cpuinfo").exists():
        assert m["cpu"] == device._cpuinfo()[0] or not device._cpuinfo()[0]


def test_machine_record_names_dispatch_settings_and_falls_back(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    monkeypatch.setattr(device, "_cpuinfo", lambda: ("", []))     # no /proc/cpuinfo
    m = device.machine_record()
    assert m["dispatch_env"]["ATEN_CPU_CAPABILITY"] == "avx2"
    assert m["dispatch_env"]["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert m["cpu"] and m["isa_flags"] == []


# ---- the writers ----------------------------------------------------------------------------

# module file -> the functions that write (or build) a results record
WRITERS = {
    "course_lib/experiments/methods_table.py": ["write_table"],   # lessons 06, 07, 12
    "course_lib/smollm.py": ["write_rtn_table", "benchmark"],
    "course_lib/engine.py": ["write_table"],
    "course_lib/experiments/qat_tables.py": ["write_bundled", "write_smollm2",
                                             "rerun_exports"],   # lesson 15
    "course_lib/kv.py": ["run"],
    "course_lib/own_kmix.py": ["validate"],   # lesson 17
    "course_lib/methods/w8a8.py": ["main", "add_sweep"],
    "course_lib/methods/llm_int8.py": ["main"],
    "course_lib/methods/gptq.py": ["benchmark_layer"],
    "course_lib/authoring/workshop.py": ["machine"],
    "kernels/bench.py": ["_run", "main"],
    "kernels/bench_layers.py": ["write_results"],
    "kernels/compile_check.py": ["main"],
    "kernels/sweep_gemv.py": ["sweep", "main"],
    "kernels/decode_attention.py": ["main"],
    "course_lib/experiments/sensitivity_scan.py": ["write"],   # lesson 14
    "course_lib/experiments/kmix_table.py": ["write_table"],   # lesson 14
    "course_lib/experiments/rotation_table.py": ["write_table"],   # lesson 16
    "course_lib/experiments/spinquant_full.py": ["run", "add_coherence"],   # lesson 16
}
# modules that write JSON and mention results/ but write no results file
NOT_WRITERS = {
    "course_lib/authoring/exercises.py": "writes notebooks",
    "course_lib/stream.py": "writes the learner's quantized checkpoint (config.json, index); "
                            "its docstring names results/stream_1b.json, which "
                            "tools/stream_1b.py writes",
    "course_lib/preflight.py": "prints its report (--json) to stdout; only reads "
                               "results/lesson_memory.json",
    "course_lib/authoring/notebook_timer.py": "writes the timer's log lines; workshop.py turns "
                                              "them into results/notebook_times.json",
}


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.FunctionDef)}


def _calls_machine_record(fn: ast.FunctionDef) -> bool:
    for n in ast.walk(fn):
        if isinstance(n, ast.Call):
            f = n.func
            if (isinstance(f, ast.Attribute) and f.attr == "machine_record") or \
                    (isinstance(f, ast.Name) and f.id == "machine_record"):
                return True
    return False


@pytest.mark.parametrize("module, func", [(m, f) for m, fs in WRITERS.items() for f in fs])
def test_each_writer_stores_the_machine_record(module, func):
    fns = _functions(ROOT / module)
    assert func in fns, f"{module} has no {func}(): update WRITERS"
    assert _calls_machine_record(fns[func]), \
        f"{module}:{func}() writes a results record without device.machine_record()"


def test_every_json_writer_is_listed():
    """A new module that writes JSON next to results/ is either a writer checked above or says
    why not."""
    for package in ("course_lib", "kernels"):
        for path in sorted((ROOT / package).rglob("*.py")):
            src = path.read_text()
            rel = path.relative_to(ROOT).as_posix()
            if "json.dump" in src and "results" in src:
                assert rel in WRITERS or rel in NOT_WRITERS, \
                    f"{rel} writes JSON and mentions results/: add it to WRITERS (with a " \
                    "machine record) or NOT_WRITERS (with why)"


def test_gptq_benchmark_records_the_host():
    from course_lib.methods import gptq
    r = gptq.benchmark_layer(d=32, n_tokens=32, batch=16, group_size=16, device="cpu",
                             warmup=False)
    _check_record(r["machine"])


def test_workshop_timing_record_keeps_its_fields(tmp_path):
    from course_lib.authoring import workshop
    log = tmp_path / "t.jsonl"
    log.write_text(json.dumps({"notebook": "notebooks/a.ipynb", "wall_s": 2.0, "kernel_cpu_s": 1.0,
                               "cells": 3, "failed": 0, "load_average": [0.5, 0.5, 0.5],
                               "omp_num_threads": "1"}) + "\n")
    m = workshop.times_from_log(log)["machine"]
    _check_record(m)
    assert m["platform"] and m["logical_cpus"] == os.cpu_count()   # what the tables read


def _methods_stubs(monkeypatch, table):
    from course_lib.methods import calibration as cal
    monkeypatch.setattr(table, "load_model",
                        lambda name: (None, lambda m, n, w: SimpleNamespace(bits_per_byte=1.5)))
    monkeypatch.setattr(cal, "calibration_ids", lambda *a: None)
    monkeypatch.setattr(table, "row", lambda model, ref, m, ids, bits, gs, **o:
                        {"method": m, "bits": bits, "group_size": gs, "kl": 0.1})
    monkeypatch.setattr(table, "slice_rows", lambda *a, **o: {"rows": []})


def test_methods_table_records_the_machine_and_the_earlier_rows_one(tmp_path, monkeypatch):
    from course_lib.experiments import methods_table
    from course_lib.methods import table
    _methods_stubs(monkeypatch, table)          # the writer reaches them through the reader
    path = tmp_path / "methods.json"
    out = methods_table.write_table("bundled", path=path, progress=False, group_sizes=(32,),
                            bits_list=(4,))
    saved = json.loads(path.read_text())["machine"]
    _check_record(saved)
    assert saved["threads"] == torch.get_num_threads() and "earlier_rows_machine" not in saved
    assert out["machine"] == saved
    # rows kept from a file another CPU wrote: its record comes along
    other = {**saved, "cpu": "Some Other CPU", "isa_flags": ["avx2"]}
    data = json.loads(path.read_text())
    data["machine"] = other
    path.write_text(json.dumps(data))
    methods_table.write_table("bundled", path=path, progress=False, methods=("rtn",),
                      group_sizes=(32,), bits_list=(4,))
    again = json.loads(path.read_text())["machine"]
    assert again["cpu"] == saved["cpu"] and again["earlier_rows_machine"]["cpu"] == "Some Other CPU"
    assert methods_table.earlier_machine(saved, saved) is None
    assert methods_table.earlier_machine(None, saved) is None


def test_smollm_speed_record(tmp_path, monkeypatch):
    from course_lib import smollm
    monkeypatch.setattr(smollm, "convert", lambda verbose=False: None)
    monkeypatch.setattr(smollm, "load", lambda: (lambda ids: ids))
    monkeypatch.setattr(smollm, "eval_ids", lambda: torch.zeros(256, dtype=torch.long))
    out = smollm.benchmark(repeats=1, tokens=16, path=tmp_path / "speed.json")
    m = json.loads((tmp_path / "speed.json").read_text())["machine"]
    _check_record(m)
    assert m["cores"] == os.cpu_count() and "load_average_1min" in m and out["machine"] == m


def test_kv_sweep_record(tmp_path, monkeypatch):
    from course_lib import kv
    monkeypatch.setattr(kv, "_load", lambda name: (None, torch.zeros(64), torch.zeros(64)))
    monkeypatch.setattr(kv, "calibrate", lambda model, ids: None)
    monkeypatch.setattr(kv, "shape_of", lambda model: (2, 1, 8))
    monkeypatch.setattr(kv, "eval_windows", lambda ids, context, n: [None])
    monkeypatch.setattr(kv, "window_scores", lambda *a, **k: {})
    monkeypatch.setattr(kv, "by_position", lambda scores, bins: {"bf16": [0.0]})
    monkeypatch.setattr(kv, "per_window", lambda scores, formats: {})
    kv.run("tiny", context=32, n_windows=1, formats=("bf16",), out=tmp_path / "kv.json",
           log=lambda *a: None)
    _check_record(json.loads((tmp_path / "kv.json").read_text())["machine"])


def test_w8a8_table_record_names_reused_rows_machine(tmp_path, monkeypatch):
    from course_lib.methods import w8a8
    ref = SimpleNamespace(bits_per_byte=1.25, perplexity=3.0)
    monkeypatch.setattr(w8a8, "ROOT", tmp_path)
    monkeypatch.setattr(w8a8, "bundled_setup", lambda: (None, ref, None))
    monkeypatch.setattr(w8a8, "score_variants", lambda model, ref, calib, reuse=(), spread=False: list(reuse))
    monkeypatch.setattr(w8a8, "eval_windows", lambda ref: {"n_windows": 1})
    path = tmp_path / "results" / "w8a8_bundled.json"
    path.parent.mkdir()
    older = {"cpu": "Some Other CPU", "torch": "0.0"}
    path.write_text(json.dumps({"setup": dict(w8a8.BUNDLED), "reference_bits_per_byte": 1.25,
                                "rows": [{"kind": "w8a8"}], "eval_windows": {"n_windows": 1},
                                "alpha_sweep": {"static": []}, "machine": older}))
    assert w8a8.main(["--no-sweep", "--reuse"]) == 0
    out = json.loads(path.read_text())
    _check_record(out["machine"])
    assert out["machine"]["reused_rows_machine"] == older and out["alpha_sweep_machine"] == older


def test_bench_result_and_writer_record_the_host(tmp_path, monkeypatch):
    from kernels import bench as kbench
    from kernels import bench_layers
    monkeypatch.setattr(kbench, "_copy_bandwidth", lambda dev, quick: 1.0)
    monkeypatch.setattr(kbench, "_read_bandwidth", lambda dev, quick: 1.0)
    monkeypatch.setattr(kbench, "time_layers", lambda *a, **k: None)
    monkeypatch.setattr(kbench, "decode_tokens_per_s", lambda *a, **k: {})
    monkeypatch.setattr(kbench, "evaluate_targets", lambda *a, **k: [])
    result = kbench.run(quick=True, layers=[("tiny", 128, 48)], batches=(1,), prefill_m=0,
                        backends=kbench.cpu_backends(probe=False), timer="cpu",
                        decode_cfg={"n_layers": 1, "d": 128, "d_kv": 32, "d_ff": 256,
                                    "note": "tiny"}, repeats=1, log=lambda *a: None)
    _check_record(result["machine"])
    assert result["device"]["kind"] in ("cpu", "cuda")          # the device record stays
    bare = {k: v for k, v in result.items() if k != "machine"}
    path = bench_layers.write_results(bare, tmp_path)
    _check_record(json.loads(path.read_text())["machine"])
