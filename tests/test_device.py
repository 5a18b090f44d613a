"""course_lib.device: detection, native formats, Triton interpreter mode, Triton's absence,
the torch floor of a hosted install, Apple's GPU (MPS)."""
import os

import pytest
import torch

from course_lib import device


def test_native_formats_by_compute_capability():
    assert "fp8" not in device.native_formats_for((8, 0))      # A100
    assert "fp8" in device.native_formats_for((8, 9))          # L40S, RTX 4090
    assert "fp8" in device.native_formats_for((9, 0))          # H100
    assert "fp4" not in device.native_formats_for((9, 0))
    assert "fp4" in device.native_formats_for((10, 0))         # B200
    assert device.native_formats_for(None) == ["fp32", "bf16"]


def test_detect_and_summary(capsys):
    info = device.summary()
    out = capsys.readouterr().out
    assert info.has_gpu == torch.cuda.is_available()
    if not info.has_gpu:
        assert info.triton_interpret and os.environ["TRITON_INTERPRET"] == "1"
        assert "No CUDA GPU" in out
        triton_ok, why = device.triton_status()
        if triton_ok:
            assert "interpreter" in out
        else:   # macOS, Windows, or COURSE_NO_TRITON=1: one line says so
            assert [l for l in out.splitlines() if l.startswith("Triton")] == [why]


def test_triton_status_says_why_in_one_line(monkeypatch):
    monkeypatch.setenv("COURSE_NO_TRITON", "1")
    ok, why = device.triton_status()
    assert not ok and "\n" not in why and "COURSE_NO_TRITON=1" in why and "not launched" in why
    monkeypatch.delenv("COURSE_NO_TRITON")
    import importlib.util
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)     # as on a Mac
    ok, why = device.triton_status()
    assert not ok and "Triton wheels for Linux only" in why and "\n" not in why


def test_torch_floor_of_the_hosted_install():
    assert device.check_torch_version() == torch.__version__           # this torch passes
    assert device.torch_version_tuple(torch.__version__) >= device.TORCH_FLOOR
    assert device.torch_version_tuple("2.13.0+cpu") == (2, 13)
    assert device.torch_version_tuple("2.10.0a0+git7b3c") == (2, 10)
    floor = ".".join(map(str, device.TORCH_FLOOR))
    assert device.check_torch_version(floor + ".0") == floor + ".0"
    with pytest.raises(RuntimeError, match=r"torch 2\.7\.1 is older than the course needs \(torch>=2\.8"):
        device.check_torch_version("2.7.1")
    with pytest.raises(ValueError, match="not a torch version"):
        device.torch_version_tuple("nightly")
    # the floor is the first torch with the dtypes the course's code names
    assert hasattr(torch, "float4_e2m1fn_x2") and hasattr(torch, "float8_e8m0fnu")


def test_mps_is_reported_only_where_torch_has_it(monkeypatch, capsys):
    assert device.mps_available() == bool(torch.backends.mps.is_available())
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    if not torch.cuda.is_available():
        device.summary()
        assert "Apple GPU (MPS) found" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")
def test_gpu_only_path_on_cpu_says_what_to_do():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        device.require_gpu("the FP8 GEMM")


def test_bad_arguments_say_what_to_pass():
    for cc in [(9,), "8.9", (8.9, 0), (8, -1), (True, 0)]:
        with pytest.raises(ValueError, match=r"\(major, minor\) pair of whole numbers"):
            device.native_formats_for(cc)
    assert device.native_formats_for([8, 9]) == device.native_formats_for((8, 9))
    with pytest.raises(TypeError, match="info must be a DeviceInfo"):
        device.summary("cpu")


def test_render_refuses_what_is_not_a_notebook(tmp_path):
    from course_lib.authoring import render
    with pytest.raises(FileNotFoundError, match=r"is not a notebook file \(\.ipynb\) that exists"):
        render.render(tmp_path / "missing.ipynb", tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="is not a notebook file"):
        render.render(tmp_path / "notes.txt", tmp_path)
    nb = tmp_path / "n.ipynb"
    nb.write_text("{}")
    for t in (0, 2.5, True):
        with pytest.raises(ValueError, match="timeout_s is the seconds a cell may run"):
            render.render(nb, tmp_path, timeout_s=t)
