"""The kernels compile for real NVIDIA GPUs (Ampere sm_80, Ada sm_89, Hopper sm_90), no GPU needed.

Runs ``python -m kernels.compile_check`` in its own process (ahead-of-time compilation with
the ptxas in Triton's wheel). FP8 kernels must be refused below sm_89.
"""
import subprocess
import sys

import pytest


def test_kernels_compile_for_ampere_ada_hopper():
    proc = subprocess.run([sys.executable, "-m", "kernels.compile_check", "--arch", "80", "89", "90"],
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    if "SKIPPED" in out:
        pytest.skip(out.strip().splitlines()[-1])
    assert proc.returncode == 0, out[-4000:]
    assert "0 unexpected result(s)" in out
    assert out.count("sm_90 fp8_gemm             ok") == 1
    assert "sm_80 fp8_gemm             refused (expected)" in out
