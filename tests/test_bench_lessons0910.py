"""course_lib.bench helpers of lessons 09-10: op counting (launch overhead), the kernel list of a
call, the nibble layout and GEMV tile pictures. (tests/test_bench.py covers the rest of bench.)"""
from __future__ import annotations

import matplotlib
import pytest
import torch

from course_lib import bench

matplotlib.use("Agg")


def test_count_torch_ops_sees_compute_not_views():
    x = torch.randn(4, 8)
    ops = bench.count_torch_ops(lambda: (x.float().reshape(2, 16).t() * 2).sum())
    assert ops == ["mul", "sum"]                         # float() of fp32, reshape, t: no kernel
    assert bench.count_torch_ops(lambda: x.view(8, 4)) == []
    with pytest.raises(TypeError, match="fn must be a function to call with no arguments"):
        bench.count_torch_ops(x)


def test_the_first_w4a16_wrapper_is_recorded():
    import json

    rec = json.loads((bench.RESULTS / "launch_ops_first_h200_run.json").read_text())
    assert len(rec["w4a16_linear"]) == 8 and rec["w8a16_linear"] == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_cuda_kernels_launched_needs_a_gpu():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU; on a CPU use count_torch_ops"):
        bench.cuda_kernels_launched(lambda: None)


def test_nibbles_of_a_word():
    assert bench.nibbles_of_word(0x76543210) == list(range(8))
    assert bench.nibbles_of_word(-1) == [15] * 8                           # signed int32 accepted
    for bad in (2 ** 32, -2 ** 31 - 1, 1.5, True):
        with pytest.raises(ValueError, match="word must be a 32-bit integer"):
            bench.nibbles_of_word(bad)


def test_pictures_draw_and_refuse_bad_input():
    ax = bench.plot_nibble_layout(0xFEDCBA98)
    assert len(ax.patches) == 32 and "0xFEDCBA98" in ax.get_title()
    ax = bench.plot_gemv_tile(40, 100, 3, 16, 32, program=2, step=3)
    assert "8 x 4 weight tile" in ax.get_title()                          # the tails: 40-32, 100-96
    with pytest.raises(ValueError, match="program must be below 3 and step below 4"):
        bench.plot_gemv_tile(40, 100, 3, 16, 32, program=3)
    with pytest.raises(ValueError, match="block_n must be a whole number >= 1"):
        bench.plot_gemv_tile(40, 100, 3, 0, 32)
