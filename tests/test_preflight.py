"""The pre-workshop check (course_lib.preflight): each failure path prints a clear line, the exit
code follows the FAIL lines, --json carries the same, and the real run here takes well under two
minutes. Probes are replaced with monkeypatch, so these tests need no broken machine."""
import json
import subprocess
import sys
import time

import pytest

from course_lib import preflight as pf
from course_lib.paths import ROOT

GIB = 2**30


def _line(check):
    text, _ = pf.report([check], {"os": "Linux", "arch": "x86_64", "cpu": "cpu", "logical_cpus": 2,
                                  "course": "/c", "progress_file": "p"}, 1.0)
    return text.splitlines()[1]


def test_old_python_fails_with_what_to_do(monkeypatch):
    monkeypatch.setattr(pf, "probe_python", lambda: ((3, 9, 6), "/usr/bin/python3"))
    c = pf.check_python()
    assert c.status == pf.FAIL
    assert "3.9.6" in c.detail and "3.11" in c.detail and "PYTHON=python3.11 make lab" in c.detail
    assert _line(c).startswith("FAIL  python")


def test_no_stamp_warns(monkeypatch):
    monkeypatch.setattr(pf, "probe_stamps", lambda: {})
    c = pf.check_setup()
    assert c.status == pf.WARN and "no setup stamp" in c.detail


def test_stamp_from_install_script_passes(monkeypatch):
    monkeypatch.setattr(pf, "probe_stamps", lambda: {"tools/install_course.sh": {"torch": "cpu"}})
    c = pf.check_setup()
    assert c.status == pf.PASS and "tools/install_course.sh" in c.detail


def test_missing_core_package_fails_and_names_it(monkeypatch):
    have = {n: pf._pins()[n] or "1.0" for n in pf._pins()}
    have["transformers"] = None
    monkeypatch.setattr(pf, "probe_packages", lambda: have)
    c = pf.check_packages()
    assert c.status == pf.FAIL and "transformers" in c.detail and "make setup" in c.detail


def test_other_version_warns_and_test_tools_are_optional(monkeypatch):
    pins = pf._pins()
    have = {n: pins[n] or "1.0" for n in pins}
    have["numpy"] = "2.0.0"
    have["playwright"] = None
    monkeypatch.setattr(pf, "probe_packages", lambda: have)
    c = pf.check_packages()
    assert c.status == pf.WARN and "numpy 2.0.0 (pinned 2.4.6)" in c.detail
    assert "playwright" not in c.detail
    have["numpy"] = pins["numpy"]
    c = pf.check_packages()
    assert c.status == pf.PASS and "playwright" in c.detail and "tests only" in c.detail


def test_old_torch_fails(monkeypatch):
    monkeypatch.setattr(pf, "probe_torch", lambda: {"version": "2.4.1", "cuda_build": None,
                                                     "cuda_available": False, "mps": False,
                                                     "threads": 2, "gpu": None})
    c = pf.check_torch()
    assert c.status == pf.FAIL and "older than 2.8" in c.detail


def test_cuda_build_without_gpu_warns_about_wasted_gigabytes(monkeypatch):
    monkeypatch.setattr(pf, "probe_torch", lambda: {"version": "2.13.0", "cuda_build": "13.0",
                                                     "cuda_available": False, "mps": False,
                                                     "threads": 2, "gpu": None})
    c = pf.check_torch()
    assert c.status == pf.WARN and "CUDA 13.0 build" in c.detail and "CPU-only" in c.detail


def test_torch_not_importable_fails(monkeypatch):
    def boom():
        raise ImportError("No module named 'torch'")
    monkeypatch.setattr(pf, "probe_torch", boom)
    c = pf.check_torch()
    assert c.status == pf.FAIL and "does not import" in c.detail


def test_smollm_not_converted_fails_with_the_command(monkeypatch):
    monkeypatch.setattr(pf, "probe_smollm", lambda: {"folder": "/m/smollm2", "converted": False})
    c = pf.check_smollm()
    assert c.status == pf.FAIL and "python -m course_lib.smollm convert" in c.detail


def test_smollm_damaged_fails_with_force(monkeypatch):
    monkeypatch.setattr(pf, "probe_smollm", lambda: {"folder": "/m", "converted": True,
                                                      "error": "ValueError: bad shape"})
    c = pf.check_smollm()
    assert c.status == pf.FAIL and "--force" in c.detail and "bad shape" in c.detail


def test_smollm_wrong_answer_warns(monkeypatch):
    monkeypatch.setattr(pf, "probe_smollm", lambda: {"folder": "/m", "converted": True,
                                                      "next_token": " London", "parameters": 1,
                                                      "seconds": 1.0})
    c = pf.check_smollm()
    assert c.status == pf.WARN and "' London'" in c.detail


def test_no_triton_warns_and_says_what_lessons_do(monkeypatch):
    monkeypatch.setattr(pf, "probe_triton", lambda: {"installed": False, "why": "Triton not installed"})
    c = pf.check_triton()
    assert c.status == pf.WARN and "lessons 09-11" in c.detail


def test_no_engine_warns_with_both_routes(monkeypatch):
    monkeypatch.setattr(pf, "probe_engine", lambda: {"installed": False, "why": "No module named 'llama_cpp'"})
    c = pf.check_engine()
    assert c.status == pf.WARN
    assert "lessons 13-14" in c.detail and "make engine" in c.detail and "ENGINE_WHEELS" in c.detail
    assert "CMake" in c.detail


def test_memory_below_lesson_04_fails(monkeypatch):
    monkeypatch.setattr(pf, "probe_memory", lambda: {"total": 3 * GIB, "available": 2 * GIB})
    monkeypatch.setattr(pf, "probe_lesson_memory", lambda: {"04_a_real_model": 4 * GIB, "13_ship_it": GIB})
    c = pf.check_memory()
    assert c.status == pf.FAIL and "lesson 04 peaked at 4.0 GiB" in c.detail
    assert "05-16" in c.detail


def test_memory_below_a_later_lesson_warns_and_names_it(monkeypatch):
    monkeypatch.setattr(pf, "probe_memory", lambda: {"total": 5 * GIB, "available": 5 * GIB})
    monkeypatch.setattr(pf, "probe_lesson_memory", lambda: {"04_a_real_model": 4 * GIB,
                                                             "13_ship_it": 6 * GIB})
    c = pf.check_memory()
    assert c.status == pf.WARN and "lesson 13 at 6.0 GiB" in c.detail and "lesson(s) 13" in c.detail


def test_memory_busy_warns(monkeypatch):
    monkeypatch.setattr(pf, "probe_memory", lambda: {"total": 8 * GIB, "available": 2 * GIB})
    monkeypatch.setattr(pf, "probe_lesson_memory", lambda: {"04_a_real_model": 3 * GIB})
    c = pf.check_memory()
    assert c.status == pf.WARN and "close other programs" in c.detail


def test_memory_enough_passes(monkeypatch):
    monkeypatch.setattr(pf, "probe_memory", lambda: {"total": 16 * GIB, "available": 12 * GIB})
    monkeypatch.setattr(pf, "probe_lesson_memory", lambda: {"04_a_real_model": 4 * GIB})
    assert pf.check_memory().status == pf.PASS


def test_disk_full_fails(monkeypatch):
    monkeypatch.setattr(pf, "probe_disk", lambda: {"path": "/m", "free": GIB // 10, "total": 10 * GIB})
    c = pf.check_disk()
    assert c.status == pf.FAIL and "0.1 GiB free" in c.detail


def test_a_broken_probe_is_a_fail_line_not_a_crash(monkeypatch):
    def boom():
        raise RuntimeError("probe exploded")
    monkeypatch.setattr(pf, "probe_disk", boom)
    monkeypatch.setattr(pf, "probe_smollm", lambda: {"folder": "/m", "converted": False})
    results = pf.run_checks()
    disk = [c for c in results if c.name == "disk"][0]
    assert disk.status == pf.FAIL and "probe exploded" in disk.detail


def test_report_exit_code_follows_fail_lines():
    ok = pf.Check("python", pf.PASS, "fine")
    warn = pf.Check("triton", pf.WARN, "absent")
    bad = pf.Check("smollm2", pf.FAIL, "not converted")
    machine = {"os": "Linux", "arch": "x86_64", "cpu": "c", "logical_cpus": 2, "course": "/c",
               "progress_file": "p"}
    text, code = pf.report([ok, warn], machine, 3.0)
    assert code == 0 and "READY: no check failed, 1 warning" in text
    text, code = pf.report([ok, warn, bad], machine, 3.0)
    assert code == 1 and "NOT READY" in text and "smollm2" in text.splitlines()[-1]


def test_lesson_memory_file_is_read():
    """results/lesson_memory.json, when committed, gives the peaks the memory check compares with."""
    if not pf.MEMORY_FILE.exists():
        pytest.skip("results/lesson_memory.json not written yet")
    peaks = pf.probe_lesson_memory()
    assert "04_a_real_model" in peaks and peaks["04_a_real_model"] > 2**30


def test_real_run_under_two_minutes_and_json():
    """The check itself, on this machine, as a learner runs it."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "course_lib.preflight", "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=180)
    took = time.perf_counter() - t0
    assert took < 120, f"the pre-workshop check took {took:.0f} s"
    data = json.loads(p.stdout)
    names = [c["name"] for c in data["checks"]]
    assert names == ["python", "setup", "packages", "torch", "smollm2", "triton", "engine",
                     "memory", "disk"]
    assert p.returncode == (0 if data["ready"] else 1)
    assert all(c["status"] in ("PASS", "WARN", "FAIL") for c in data["checks"])
