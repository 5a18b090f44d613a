"""kernels/gpu_check.sh, run on this CPU machine with a stand-in Python that plays a GPU machine.

The script is the first thing a session with a GPU runs; it must bring its evidence back: a
lent machine returns only what is written under $OUT. The stand-in answers the script's
questions like a GPU machine would and records each command, so these tests check the
plumbing: the parts, $OUT, the summary (test summary first), failures reported, every test
file that behaves differently on a GPU in some group.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "kernels" / "gpu_check.sh"

STAND_IN = r"""#!/usr/bin/env bash
echo "$*" >>"$CALLS"
if [ "$1" = "-" ] && [ $# -eq 1 ]; then cat >/dev/null; echo "GPU: Stand-in H200, compute capability 9.0"; exit 0; fi
if [ "$1" = "-" ]; then exec "$REAL_PY" "$@"; fi
if [ "$1" = "-c" ]; then case "$2" in *get_device_capability*) echo 90;; esac; exit 0; fi
if [ "$1 $2" = "-m pytest" ]; then
  for a in "$@"; do case "$a" in --junitxml=*) xml=${a#--junitxml=};; esac; done
  if [ -n "$xml" ]; then
    fail=""; case "$*" in *"$FAIL_FILE"*) fail='<failure message="boom"/>';; esac
    printf '<testsuites><testsuite><testcase classname="tests.t" name="test_a">%s</testcase><testcase classname="tests.t" name="test_b"/></testsuite></testsuites>' "$fail" >"$xml"
    [ -z "$fail" ] || exit 1
  fi
  exit 0
fi
if [ "$1 $2" = "-m kernels.bench" ]; then
  while [ $# -gt 0 ]; do [ "$1" = "--out" ] && out=$2; shift; done
  echo '{"partial": false}' >"$out/bench_cuda_stand_in.json"; exit 0
fi
if [ "$1 $2" = "-m kernels.compile_check" ]; then
  while [ $# -gt 0 ]; do [ "$1" = "--json" ] && json=$2; shift; done
  echo '[]' >"$json"; exit 0
fi
exit 0
"""


def run(tmp_path, *args, fail_file="none", env_extra=None):
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PY": str(stand_in), "OUT": str(out), "CALLS": str(tmp_path / "calls"),
           "REAL_PY": sys.executable, "FAIL_FILE": fail_file, **(env_extra or {})}
    proc = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=60)
    calls = (tmp_path / "calls").read_text() if (tmp_path / "calls").exists() else ""
    return proc, out, calls


def test_a_part_must_be_chosen(tmp_path):
    proc, _, _ = run(tmp_path)
    assert proc.returncode == 2 and "choose a part" in proc.stdout


def test_tests_part_writes_its_evidence_under_out(tmp_path):
    proc, out, calls = run(tmp_path, "--part", "tests", fail_file="test_kernels_w8a16.py")
    assert proc.returncode == 1                                    # one group failed
    summary = (out / "summary.txt").read_text().splitlines()
    assert summary[1].startswith("GPU: Stand-in H200")
    assert re.match(r"tests: \d+ passed, 1 failed, 0 skipped", summary[2])    # test summary first
    assert "FAILED tests.t::test_a" in summary[3]
    assert any(line.startswith("tests w8a16: FAILED") for line in summary)
    assert (out / "tests.log").exists() and not list(out.glob("*.xml"))       # folded in
    assert "-- summary" in proc.stdout and proc.stdout.rstrip().endswith("evidence for lessons 09-11's claims)")
    # every group ran after the failure (no stop at the first), natively, autotuning off
    assert calls.count("-m pytest") == 8
    assert "--junitxml" in calls and " -x" not in calls


def test_every_gpu_sensitive_test_file_is_in_a_group():
    text = SCRIPT.read_text()
    grouped = set(re.findall(r"tests/(test_\w+\.py)", text))
    for name in grouped:
        assert (ROOT / "tests" / name).exists(), f"gpu_check.sh names a missing file {name}"
    gpu_sensitive = {p.name for p in (ROOT / "tests").glob("test_*.py")
                     if re.search(r"on_gpu\(\)|cuda", p.read_text())}
    gpu_sensitive -= {"test_gpu_check.py", "test_results_machine.py",   # no GPU branch of their own
                      "test_install_script.py"}   # reads the install files (Dockerfile.cuda by name)
    assert gpu_sensitive <= grouped, f"not run on a GPU: {sorted(gpu_sensitive - grouped)}"


def test_the_budget_leaves_groups_for_a_second_call(tmp_path):
    proc, out, calls = run(tmp_path, "--part", "tests", env_extra={"TEST_BUDGET_S": "0"})
    summary = (out / "summary.txt").read_text()
    assert "groups not run (budget 0s): w4a16 w8a16" in summary
    assert '--part tests --groups "w4a16 w8a16 launch' in summary
    assert calls.count("-m pytest") == 0
    proc, out, calls = run(tmp_path, "--part", "tests", "--groups", "launch")
    assert proc.returncode == 0 and "test_kernels_one_launch.py" in calls


@pytest.mark.parametrize("part,json_name", [("bench", "bench_cuda_stand_in.json"),
                                            ("compile", "compile_report_native.json")])
def test_bench_and_compile_parts_write_json_under_out(tmp_path, part, json_name):
    proc, out, calls = run(tmp_path, "--part", part)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / json_name).exists() and json_name in (out / "summary.txt").read_text()
    if part == "bench":
        assert "--separate --out" in calls
    else:
        assert "--arch 80 90 --report" in calls


def test_on_a_machine_without_a_gpu_it_says_so(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), "--part", "tests"], capture_output=True, text=True,
                          env={**os.environ, "PY": sys.executable, "OUT": str(tmp_path)}, timeout=120)
    if "GPU:" in proc.stdout:
        pytest.skip("this machine has a CUDA GPU")
    assert proc.returncode == 1 and "no CUDA GPU visible to torch" in proc.stdout + proc.stderr
