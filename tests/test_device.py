"""course_lib.device: detection, native formats, Triton interpreter mode."""
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
        assert "No CUDA GPU" in out and "interpreter" in out


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
