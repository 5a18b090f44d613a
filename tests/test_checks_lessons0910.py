"""Lessons 09 and 10's checkers reject the held-out kinds of wrong answers of issue 19 (input
modified in place, wrong dtype, NaN/zero/negative inputs accepted, off-by-one, duplicated
rows), and the library functions they use refuse bad input clearly.

Every registered wrong answer is also fed to its checker by ``tests/test_checks.py``; the
cases here name the kinds one by one.
"""
from __future__ import annotations

import copy

import pytest
import torch

from course_lib import bench
from course_lib.checks import EXERCISES, check, load_all
from course_lib.checks import lesson09, lesson10

load_all()


def _rejected(ex_id, fn) -> bool:
    return check(ex_id, fn, quiet=True).status == "failed"


@pytest.mark.parametrize("ex_id", ["09.w8a16_gemv", "09.arithmetic_intensity",
                                   "09.unpack_int4_bits", "09.magic_unpack16",
                                   "10.layer_floor_ms", "10.floor_speedup", "10.gain_by_batch"])
def test_each_exercise_has_held_out_kinds(ex_id):
    ex = EXERCISES[ex_id]
    assert len(ex.wrong) >= 5, f"{ex_id}: {len(ex.wrong)} wrong answers"
    assert any(c.raises for c in ex.cases()), f"{ex_id}: no bad input the answer must refuse"


def test_magic_unpack_covers_every_code_in_every_position():
    words = lesson09._every_code_everywhere()                             # (32,)
    u = (words[:, None] >> torch.arange(0, 32, 4, dtype=torch.int32)) & 0xF   # (32, 8)
    for j in range(8):
        assert set(u[:, j].tolist()) == set(range(16)), f"nibble {j} misses a code"
    got = lesson09.magic_unpack16_reference(words, torch.float16)
    assert got.dtype == torch.float16 and got.shape == (256,)
    assert torch.equal(got.float(), (u - 8).flatten().float())


@pytest.mark.parametrize("kind, fn", [
    ("wrong shift order", lesson09._wrong_magic_shift_order),
    ("zero point forgotten", lesson09._wrong_magic_no_zero_point),
    ("fp16 constant with a bf16 view", lesson09._wrong_magic_fp16_constant_in_bf16),
    ("bf16 constant with an fp16 view", lesson09._wrong_magic_bf16_constant_in_fp16),
    ("wrong dtype (float32)", lesson09._wrong_magic_float32_result),
    ("no mask", lesson09._wrong_magic_shift_no_mask),
    ("two's complement read", lesson09._wrong_magic_twos_complement),
])
def test_magic_unpack_rejects(kind, fn):
    assert _rejected("09.magic_unpack16", fn), kind


def test_dtype_kinds_are_rejected():
    assert _rejected("09.unpack_int4_bits", lesson09._wrong_returns_float64)
    assert _rejected("09.w8a16_gemv", lesson09._wrong_output_dtype)


def test_nan_zero_negative_inputs_must_be_refused():
    assert _rejected("09.arithmetic_intensity", lesson09._wrong_no_checks)
    assert _rejected("10.layer_floor_ms", lesson10._floor_zero_peak_as_none)
    assert _rejected("10.layer_floor_ms", lesson10._floor_nan_passes)
    assert _rejected("10.floor_speedup", lesson10._speedup_zero_rate_as_none)
    assert _rejected("10.gain_by_batch", lesson10._gain_no_time_checks)


def test_off_by_one_and_duplicates_are_rejected():
    assert _rejected("09.arithmetic_intensity", lesson09._wrong_groups_rounded_up)   # ceil groups
    assert _rejected("09.unpack_int4_bits", lesson09._wrong_no_mask_top_nibble)      # bit 31
    assert _rejected("10.gain_by_batch", lesson10._gain_last_row_wins)               # tie in M
    assert _rejected("09.w8a16_gemv", lesson09._wrong_first_token_only)              # batch > 1


# ---- input modified in place: the shared harness compares the caller's inputs before and
# after each call (issue 19)

def _unpack_flips_in_place(words, signed=True):
    """XORs the caller's words (+8 to every nibble) instead of a copy of them."""
    if signed:
        words ^= -0x77777778
    out = lesson09.unpack_int4_bits_reference(words, False)
    return out - 8.0 if signed else out


def _gain_sorts_in_place(result, fmt, layer_kn):
    result["layers"].sort(key=lambda r: (r["M"], r["K"]))
    return bench.gain_by_batch(result, fmt, layer_kn)


def _magic_in_place(words, dtype=torch.bfloat16):
    out = lesson09.magic_unpack16_reference(words, dtype)
    words.zero_()
    return out


def test_in_place_answers_give_right_values():
    """The values are right: only a check of the inputs can catch these."""
    w = lesson09._every_byte()
    assert torch.equal(_unpack_flips_in_place(w.clone()), lesson09.unpack_int4_bits_reference(w))
    res = lesson10._planted_gpu_result()
    assert _gain_sorts_in_place(copy.deepcopy(res), "w8a16", (8192, 28672)) == \
        bench.gain_by_batch(res, "w8a16", (8192, 28672))


@pytest.mark.parametrize("ex_id, fn", [("09.unpack_int4_bits", _unpack_flips_in_place),
                                       ("10.gain_by_batch", _gain_sorts_in_place),
                                       ("09.magic_unpack16", _magic_in_place)])
def test_in_place_mutation_is_rejected(ex_id, fn):
    assert _rejected(ex_id, fn)


# ---- the library function behind 10.gain_by_batch refuses bad input clearly

def test_gain_by_batch_refuses_bad_input():
    res = lesson10._planted_gpu_result()
    assert list(bench.gain_by_batch(lesson10._shuffled(), "w4a16 g128", (8192, 28672))) == [1, 4, 16, 64]
    with pytest.raises(ValueError, match=r"the time of 'w4a16 g128' is 0.0, not a positive number"):
        bench.gain_by_batch(lesson10._with_time(16, "w4a16 g128", 0.0), "w4a16 g128", (8192, 28672))
    with pytest.raises(ValueError, match="two decode rows for batch 4"):
        bench.gain_by_batch(lesson10._duplicated(4), "w4a16 g128", (8192, 28672))
    with pytest.raises(ValueError, match="no decode rows for layer 1024x4096"):
        bench.gain_by_batch(res, "w8a16", (1024, 4096))
    with pytest.raises(ValueError, match="format 'fp8 w8a8' was not measured"):
        bench.gain_by_batch(res, "fp8 w8a8", (8192, 28672))
    with pytest.raises(ValueError, match=r"layer_kn must be a \(K, N\) pair"):
        bench.gain_by_batch(res, "w8a16", 8192)
