"""The roofline widget (lessons 09-10): its figures, and that moving a control changes them."""
import pytest

from course_lib.widgets.roofline import roofline_rows, roofline_widget


def test_rows_on_h100_batch_1_and_prefill():
    rows = {r["format"]: r for r in roofline_rows("H100 SXM", 8192, 28672, 1)}
    w4 = rows["W4A16 (int4, group 128)"]
    assert w4["bound"] == "memory" and w4["speedup"] == pytest.approx(3.88, abs=0.01)
    assert rows["BF16"]["intensity"] == pytest.approx(1.0, rel=1e-3)
    pre = {r["format"]: r for r in roofline_rows("H100 SXM", 8192, 28672, 4096)}
    assert pre["W4A16 (int4, group 128)"]["speedup"] == pytest.approx(1.0)
    assert pre["FP8 W8A8"]["speedup"] == pytest.approx(1979 / 989) and pre["FP8 W8A8"]["bound"] == "compute"


def test_no_fp8_on_an_a100():
    rows = {r["format"]: r for r in roofline_rows("A100 80GB", 4096, 4096, 1)}
    assert rows["FP8 W8A8"]["native"] is False and rows["BF16"]["native"] is True


def test_widget_updates_when_controls_move():
    box = roofline_widget()
    before = box.result.value
    assert "3.88x" in before and "ridge 295" in before
    box.controls["batch"].value = 4096
    assert box.result.value != before and "compute" in box.result.value
    box.controls["gpu"].value = "A100 80GB"
    assert "no FP8 maths" in box.result.value
    box.controls["layer"].value = "8B k/v_proj"
    assert "4096 in x 1024 out" in box.result.value


def test_widget_refuses_values_its_controls_do_not_hold():
    with pytest.raises(ValueError, match="is not one of the widget's layers"):
        roofline_widget(layer="9B q_proj")
    with pytest.raises(ValueError, match="is not on the widget's slider"):
        roofline_widget(batch=3)


def test_t4_baseline_is_fp16():
    from course_lib.widgets import roofline

    rows = roofline.roofline_rows("T4", 8192, 28672, 1)
    assert rows[0]["format"] == "FP16" and rows[-1] == {"format": "FP8 W8A8", "native": False}
    assert roofline.sixteen_bit("H100") == "BF16" and "FP16 TFLOPS" in roofline.roofline_html("T4", "70B gate/up_proj", 1)
