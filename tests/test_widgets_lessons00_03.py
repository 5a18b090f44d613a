"""The widgets and plots of lessons 00-03: they compute what the library computes, and refuse
bad input with a message that says what to do."""
import math

import numpy as np
import pytest

import ipywidgets  # noqa: F401  (a required package of the course: fail, never skip)
import matplotlib

matplotlib.use("Agg")

from course_lib import hardware as hw  # noqa: E402
from course_lib import quant  # noqa: E402
from course_lib.widgets import bill, playground  # noqa: E402
from course_lib.widgets import formats as wf  # noqa: E402


def test_step_parts_add_up_to_the_batched_step():
    parts = bill.step_parts_ms("Llama 3.1 8B", "bf16", "H100 SXM", 4096, batches=(1, 64))
    kv64 = hw.kv_cache_gb("Llama 3.1 8B", 64 * 4096) * 1e9
    step = hw.batched_step_ms(hw.weight_bytes("Llama 3.1 8B"), kv64, 3.35)
    assert parts["weights_ms"][0] == parts["weights_ms"][1]           # read once per step
    assert parts["weights_ms"][1] + parts["kv_ms"][1] == pytest.approx(step)
    assert parts["kv_ms"][1] == pytest.approx(64 * parts["kv_ms"][0])  # one cache per user
    assert round(step, 1) == 15.1                                      # lesson 00's 64-user step
    fig = bill.plot_step_vs_batch()
    assert len(fig.axes) == 2


@pytest.mark.parametrize("call, words", [
    (lambda: bill.step_parts_ms("Llama 3.1 8B", batches=()), "batches is empty"),
    (lambda: bill.step_parts_ms("Llama 3.1 8B", batches=(0, 4)), "batch must be 1 or more"),
    (lambda: bill.step_parts_ms("Llama 3.1 8B", context=-5), "context must be 1 or more"),
    (lambda: bill.plot_floor_vs_bits(measured_gbps=-1), "measured_gbps must be greater than zero"),
    (lambda: bill.bill_widget(batch=0), "batch must be 1 or more"),
    (lambda: bill.bill_widget(context=123), "not on the widget's slider"),
    (lambda: bill.bill_widget(model="GPT-7"), "unknown model"),
    (lambda: playground.playground_stats(fmt="fp7"), "unknown playground format"),
    (lambda: playground.playground_stats(outlier=math.nan), "outlier is a multiple"),
    (lambda: playground.playground_stats(outlier=-2.0), "outlier is a multiple"),
    (lambda: playground.playground_stats(x=np.ones(8)), "2-D"),
    (lambda: playground.playground_weights(rows=0), "rows must be a whole number"),
    (lambda: playground.playground_weights(std=-1.0), "std must be a positive number"),
    (lambda: wf.bit_explorer("fp7"), "unknown number format"),
])
def test_refuses_bad_input(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_bill_widget_reads_what_plan_computes():
    box = bill.bill_widget(model="Llama 3.1 70B", fmt="fp8", gpu="H100 SXM", batch=1, context=8000)
    assert "fits, but not servable" in box.result.value
    box.controls["n_gpus"].value = 2
    assert "servable" in box.result.value and "not servable" not in box.result.value


def test_playground_stats_match_the_library():
    s = playground.playground_stats("int", 4, "per_group", 32, outlier=10.0)
    x_hat = quant.fake_quantize(s["x"], "int4", "per_group", 32)
    assert s["mae"] == pytest.approx(quant.mae(s["x"], x_hat))
    assert s["bits_per_weight"] == 4.5
    assert s["levels_outlier_group"].max() > 5 * s["levels_ordinary_group"].max()


def test_bit_explorer_decodes_flipped_bits():
    box = wf.bit_explorer("fp8_e4m3", 1.0)
    buttons = box.controls["bits"]
    for i, b in enumerate(buttons):
        b.value = bool((0x7E >> (7 - i)) & 1)
    assert "<b>448</b>" in box.result.value
