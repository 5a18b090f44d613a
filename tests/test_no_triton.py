"""The course where Triton is not installed (macOS, Windows), imitated on Linux by the blocker
``tools/no_triton/sitecustomize.py`` (``COURSE_NO_TRITON=1``; ``make test-no-triton`` runs the
lessons that way). Each check runs in a fresh interpreter, as a notebook kernel starts."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import importlib.util, json, sys
out = {"find_spec": importlib.util.find_spec("triton") is None}
try:
    import triton  # noqa: F401
    out["import"] = "imported"
except ModuleNotFoundError as err:
    out["import"] = str(err)
import torch
import torch.utils._triton as tt
out["torch_sees_triton"] = tt.has_triton_package()
import kernels
from kernels import w8a16
out["TRITON"], out["message"], out["interpret"] = kernels.TRITON, kernels.TRITON_MISSING, kernels.INTERPRET
out["source"] = kernels.source(w8a16.w8a16_gemv_kernel).splitlines()[1]
w_q, scale = w8a16.quantize_weight(torch.randn(40, 100))
x = torch.randn(3, 100)
out["reference"] = list(w8a16.w8a16_reference(x, w_q, scale).shape)
try:
    w8a16.w8a16_linear(x, w_q, scale)
    out["launch"] = "ran"
except kernels.TritonMissing as err:
    out["launch"] = str(err)
from kernels import fp8_w8a8
out["fp8_supported"] = list(fp8_w8a8.fp8_supported())
from course_lib.checks import check
def mine(x, w_q, scale):
    w8a16.w8a16_gemv_kernel[(1,)](x, w_q, scale)
r = check("09.w8a16_gemv", mine)
out["check"] = [r.status, bool(r), r.report]
print("RESULT" + json.dumps(out))
"""


def _probe(blocked: bool) -> dict:
    # learner mode: a failing check returns instead of raising; the probe imports triton
    # before kernels, so the interpreter is asked for up front
    env = dict(os.environ, COURSE_CHECKS="learner", TRITON_INTERPRET="1")
    env.pop("COURSE_NO_TRITON", None)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
             if p and "no_triton" not in p]
    if blocked:
        env["COURSE_NO_TRITON"] = "1"
        paths.insert(0, str(ROOT / "tools" / "no_triton"))
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT)])
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(line[len("RESULT"):])


def test_blocked_triton_is_not_found_and_the_kernels_say_why_in_one_line():
    out = _probe(blocked=True)
    assert out["find_spec"] and out["import"].startswith("No module named 'triton'")
    assert out["torch_sees_triton"] is False                # torch's own check agrees
    assert out["TRITON"] is False and out["interpret"] is False
    assert "\n" not in out["message"] and "COURSE_NO_TRITON=1" in out["message"]
    assert out["source"].startswith("def w8a16_gemv_kernel(")   # the lesson still shows it
    assert out["reference"] == [3, 40]                          # and its plain-torch reference
    assert out["launch"].endswith(out["message"]) and "cannot launch" in out["launch"]
    assert out["fp8_supported"] == [False, out["message"]]
    status, passed, report = out["check"]
    assert status == "skipped" and not passed and "\n" not in report
    assert report.endswith("skipped, " + out["message"])


def test_without_the_switch_triton_is_there():
    import importlib.util
    if importlib.util.find_spec("triton") is None:
        import pytest
        pytest.skip("Triton is not installed here")
    out = _probe(blocked=False)
    assert out["TRITON"] is True and out["message"] == "" and out["launch"] == "ran"
    assert out["check"][0] != "skipped"
