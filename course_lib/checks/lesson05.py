"""Exercises of lesson 05, "LLM.int8()" (solutions/05_llm_int8.ipynb).

References are ``course_lib.methods.llm_int8``'s own functions (one source per algorithm).
"""
from __future__ import annotations

import torch

from course_lib.checks import Case, Exercise, register
from course_lib.methods import llm_int8


def _x(M, K, seed, scale=1.0):
    return scale * torch.randn(M, K, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- 05.quantize_rows

def _rows_cases():
    ties = torch.tensor([[1.27, -0.635, 0.005, 0.015], [2.54, 0.03, -0.01, 0.0]])
    planted = _x(6, 32, 3)
    planted[:, 5] = 60.0                                   # a planted outlier feature
    return [
        Case((ties,), label="by hand: scales 0.01 and 0.02, ties round to even"),
        Case((_x(8, 64, 0),), label="random activations (8 tokens, 64 features)"),
        Case((torch.zeros(2, 5),), label="all-zero rows: scale 1, codes 0",
             hint="An all-zero group has a largest magnitude of 0: which scale keeps the "
                  "division away from 0 / 0 (no NaN back)?"),
        Case((_x(3, 16, 1) * 1e-4,), label="tiny values: the scale shrinks with them"),
        Case((planted,), label="a planted outlier column sets every row's scale"),
        Case((_x(4, 1, 2),), label="one feature per row: every code is +-127"),
        Case((torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -2.5, 3.5]]),),
             label="exact ties (scale 1): round half to even, 0.5 -> 0, 2.5 -> 2, 3.5 -> 4",
             hint="Exactly half-way between two codes: which way does the task round? Half to even "
                  "(np.round, torch.round, Python's round); floor(x + 0.5) and rounding away from "
                  "zero do not."),
        Case((_x(5, 12, 7).double(),), label="float64 input: the scale is still float32"),
        Case((_x(6, 32, 9).bfloat16(),), label="bfloat16 activations: computed in float32 "
             "(a bfloat16 max / 127 rounds to 8 bits)",
             hint="Converting the result is too late: in which dtype were the maxima divided (or raised to a power)? Convert to float32 first."),
        Case((_nan_rows(),), label="a NaN in x: raise ValueError", raises=ValueError),
    ]


def _nan_rows():
    x = _x(3, 8, 8)
    x[1, 4] = float("nan")
    return x


def _wrong_rows_128(x):                                  # divided by 128, not 127
    s = x.abs().amax(1) / 128
    s = torch.where(s == 0, torch.ones_like(s), s)
    return torch.round(x / s[:, None]).clamp(-127, 127).to(torch.int8), s


def _wrong_rows_columns(x):                              # one scale per column, not per row
    s = x.abs().amax(0) / 127
    s = torch.where(s == 0, torch.ones_like(s), s)
    return torch.round(x / s[None, :]).clamp(-127, 127).to(torch.int8), s


def _wrong_rows_truncate(x):                             # truncated instead of rounded
    s = x.abs().amax(1) / 127
    s = torch.where(s == 0, torch.ones_like(s), s)
    return (x / s[:, None]).trunc().clamp(-127, 127).to(torch.int8), s


def _wrong_rows_zero_scale(x):                           # an all-zero row gets scale 0
    s = x.abs().amax(1) / 127
    q = torch.round(x / s.clamp_min(1e-30)[:, None]).clamp(-127, 127).to(torch.int8)
    return q, s


def _wrong_rows_in_bf16(x):                              # scale computed in x's bf16, cast after
    if not torch.isfinite(x).all():
        raise ValueError("NaN or inf")
    s = x.abs().amax(1) / 127
    s = torch.where(s == 0, torch.ones_like(s), s)
    return torch.round(x / s[:, None]).clamp(-127, 127).to(torch.int8), s.float()


def _wrong_rows_half_up(x):                              # ties rounded up, not to even
    s = x.abs().amax(1) / 127
    s = torch.where(s == 0, torch.ones_like(s), s)
    return torch.floor(x / s[:, None] + 0.5).clamp(-127, 127).to(torch.int8), s.float()


def _wrong_rows_input_dtype(x):                          # the scale in x's dtype
    s = x.abs().amax(1) / 127
    s = torch.where(s == 0, torch.ones_like(s), s)
    return torch.round(x / s[:, None]).clamp(-127, 127).to(torch.int8), s


def _wrong_rows_nan_passes(x):                           # NaN -> code 0, silently
    s = x.abs().nan_to_num(0).amax(1) / 127
    s = torch.where(s == 0, torch.ones_like(s), s).float()
    return torch.round(x.nan_to_num(0) / s[:, None]).clamp(-127, 127).to(torch.int8), s


register(Exercise(
    id="05.quantize_rows",
    title="INT8 with one absmax scale per row (per token / per output channel)",
    reference=llm_int8.quantize_rows,
    cases=_rows_cases,
    hint=["Each row gets its own scale, chosen so that the row's largest |value| lands exactly "
          "on the largest INT8 code. What happens to a row that is all zeros?",
          "scale = x.abs().amax(dim=1) / 127, replaced by 1.0 where it is 0; "
          "q = round(x / scale[:, None]) clamped to [-127, 127], as int8.",
          "torch.round rounds halves to even, as the reference does. Return (q, scale) with "
          "q int8 (rows, K) and scale float32 (rows,), whatever x's dtype; raise ValueError "
          "when x holds NaN or inf (torch.isfinite)."],
    wrong=[_wrong_rows_128, _wrong_rows_columns, _wrong_rows_truncate, _wrong_rows_zero_scale,
           _wrong_rows_half_up, _wrong_rows_input_dtype, _wrong_rows_nan_passes, _wrong_rows_in_bf16],
    rtol=1e-6, atol=0,
))


# ---------------------------------------------------------------- 05.outlier_columns

def _cols_cases():
    x = _x(10, 20, 4)
    x[3, 7] = 9.0
    x[8, 2] = -12.0                                        # negative outliers count too
    x[5, 15] = 6.0                                         # exactly the threshold: counts
    x[:, 11] = 5.999                                       # just below: does not
    row_outlier = _x(6, 8, 5)
    row_outlier[2, :] = 7.0                                # one token crossing in every column
    return [
        Case((x, 6.0), label="planted outliers, one negative, one exactly 6.0"),
        Case((x, 10.0), label="a higher threshold keeps only |-12|"),
        Case((_x(16, 32, 6), 6.0), label="nothing crosses: an empty index tensor"),
        Case((row_outlier, 6.0), label="one token crossing everywhere: every column",
             hint="A column is an outlier if ANY token crosses there: which dimension of x do you "
                  "reduce over?"),
        Case((x, 0.0), label="threshold 0: raise ValueError", raises=ValueError),
        Case((x, -6.0), label="a negative threshold: raise ValueError", raises=ValueError),
        Case((x, float("nan")), label="a NaN threshold: raise ValueError", raises=ValueError),
        Case((_nan_rows(), 6.0), label="a NaN in x: raise ValueError", raises=ValueError),
    ]


def _wrong_cols_strict(x, threshold=6.0):                # > instead of >=
    if threshold <= 0:
        raise ValueError("threshold must be positive")
    return torch.nonzero((x.abs() > threshold).any(0)).flatten()


def _wrong_cols_rows(x, threshold=6.0):                  # rows (tokens), not columns
    if threshold <= 0:
        raise ValueError("threshold must be positive")
    return torch.nonzero((x.abs() >= threshold).any(1)).flatten()


def _wrong_cols_no_abs(x, threshold=6.0):                # forgot the negative side
    if threshold <= 0:
        raise ValueError("threshold must be positive")
    return torch.nonzero((x >= threshold).any(0)).flatten()


def _wrong_cols_mask(x, threshold=6.0):                  # a boolean mask, not indices
    if threshold <= 0:
        raise ValueError("threshold must be positive")
    return (x.abs() >= threshold).any(0)


def _wrong_cols_nan_threshold(x, threshold=6.0):         # `threshold <= 0` lets NaN through
    if threshold <= 0 or not bool(torch.isfinite(x).all()):
        raise ValueError("threshold must be positive and x finite")
    return torch.nonzero((x.abs() >= threshold).any(0)).flatten()


def _wrong_cols_nan_x(x, threshold=6.0):                 # a NaN column silently stays INT8
    if not threshold > 0:
        raise ValueError("threshold must be positive")
    return torch.nonzero((x.abs() >= threshold).any(0)).flatten()


register(Exercise(
    id="05.outlier_columns",
    title="the columns that go through the 16-bit matmul",
    reference=llm_int8.outlier_columns,
    cases=_cols_cases,
    hint=["A feature column is an outlier column if *any* token has a magnitude at or above "
          "the threshold there. Which dimension of x (tokens, features) do you reduce over?",
          "(x.abs() >= threshold).any(dim=0) is a (features,) mask; turn it into ascending "
          "int64 indices with torch.nonzero(mask).flatten(). Raise ValueError unless "
          "threshold > 0 (NaN is not), and when x holds NaN or inf."],
    wrong=[_wrong_cols_strict, _wrong_cols_rows, _wrong_cols_no_abs, _wrong_cols_mask,
           _wrong_cols_nan_threshold, _wrong_cols_nan_x],
))


# ---------------------------------------------------------------- 05.mixed_int8_matmul

def _mixed_case(M, N, K, seed, outlier_cols=(), label="", threshold=6.0):
    x = _x(M, K, seed)
    for j, c in enumerate(outlier_cols):
        x[j % M::2, c] = 20.0 + 10 * j                     # planted outlier features
    w = _x(N, K, seed + 100) / K ** 0.5
    w_q, w_scale = llm_int8.quantize_rows(w)
    return Case((x, w_q, w_scale, threshold), label=label)


def _mixed_cases():
    all_out = _x(3, 6, 9, 10.0)
    all_out = all_out.sign() * (all_out.abs() + 7)
    w_q, ws = llm_int8.quantize_rows(_x(4, 6, 10))
    refused = _mixed_case(4, 6, 16, 4)
    zero_row = _x(4, 10, 11)
    zero_row[:, 3] = 30.0
    zero_row[2] = 0.0                                      # a padding token
    w_q8, ws8 = llm_int8.quantize_rows(_x(5, 10, 12))
    nan_x = refused.args[0].clone()
    nan_x[1, 2] = float("nan")
    quiet_w = _x(6, 24, 13)
    quiet_w[:, 7] = 0.01                                   # the outlier feature's weights: tiny
    quiet_q, quiet_s = llm_int8.quantize_rows(quiet_w / 24 ** 0.5)
    loud_x = _x(8, 24, 14)
    loud_x[:, 7] = 400.0                                   # a huge outlier feature
    return [
        _mixed_case(8, 12, 32, 0, (), "no outliers: plain vector-wise INT8"),
        _mixed_case(8, 12, 32, 1, (3,), "one planted outlier feature"),
        _mixed_case(9, 7, 40, 2, (0, 17, 39), "three planted outlier features, at the edges too"),
        _mixed_case(5, 6, 24, 3, (4,), "a lower threshold sends more columns to 16-bit",
                    threshold=1.5),
        Case((all_out, w_q, ws, 6.0), label="every column crosses: all 16-bit",
             hint="If every column is an outlier, what is left for the INT8 side, and does your "
                  "code work with no column there?"),
        Case((loud_x, quiet_q, quiet_s, 6.0),
             label="an outlier feature of 400 whose weights are small: the INT8 scales must "
                   "leave it out",
             hint="Over which columns are the per-token INT8 scales taken: all of x, or only "
                  "the columns that go through INT8?"),
        Case(refused.args[:3] + (0.0,), label="threshold 0: raise ValueError", raises=ValueError),
        Case((zero_row, w_q8, ws8, 6.0), label="a token that is all zeros (and an outlier column)",
             hint="An all-zero token's INT8 scale: 1, not 0 (0 / 0 is NaN)."),
        Case((refused.args[0].double(),) + refused.args[1:3] + (6.0,),
             label="float64 x: the result is float32"),
        Case((nan_x,) + refused.args[1:3] + (6.0,), label="a NaN in x: raise ValueError",
             raises=ValueError),
    ]


def _reference_mixed(x, w_q, w_scale, threshold=6.0):
    return llm_int8.mixed_int8_matmul(x, w_q, w_scale, threshold)


def _wrong_mixed_scale_all(x, w_q, w_scale, threshold=6.0):   # x's scale over every column
    cols = llm_int8.outlier_columns(x, threshold)
    keep = torch.ones(x.shape[1], dtype=torch.bool)
    keep[cols] = False
    s = x.abs().amax(1) / 127
    s = torch.where(s == 0, torch.ones_like(s), s)
    xq = torch.round(x[:, keep] / s[:, None]).clamp(-127, 127)
    y = (xq @ w_q[:, keep].float().T) * s[:, None] * w_scale[None, :]
    return y + x[:, cols] @ (w_q[:, cols].float() * w_scale[:, None]).T


def _wrong_mixed_dropped(x, w_q, w_scale, threshold=6.0):     # forgot the 16-bit part
    return llm_int8.mixed_int8_matmul(x, w_q, w_scale, threshold, outliers="zero")


def _wrong_mixed_twice(x, w_q, w_scale, threshold=6.0):       # outliers in both paths
    cols = llm_int8.outlier_columns(x, threshold)
    y = llm_int8.mixed_int8_matmul(x, w_q, w_scale, threshold, outliers="int8")
    return y + x[:, cols] @ (w_q[:, cols].float() * w_scale[:, None]).T


def _wrong_mixed_raw_weight(x, w_q, w_scale, threshold=6.0):  # 16-bit part without w's scale
    cols = llm_int8.outlier_columns(x, threshold)
    y = llm_int8.mixed_int8_matmul(x, w_q, w_scale, threshold, outliers="zero")
    return y + x[:, cols] @ w_q[:, cols].float().T


def _wrong_mixed_zero_row(x, w_q, w_scale, threshold=6.0):    # all-zero token: 0/0 = NaN
    cols = llm_int8.outlier_columns(x, threshold)
    keep = torch.ones(x.shape[1], dtype=torch.bool)
    keep[cols] = False
    s = x[:, keep].abs().amax(1) / 127
    xq = torch.round(x[:, keep] / s[:, None]).clamp(-127, 127)
    y = (xq.double() @ w_q[:, keep].double().T).float() * s[:, None] * w_scale[None, :]
    return y + x[:, cols] @ (w_q[:, cols].float() * w_scale[:, None]).T


def _wrong_mixed_input_dtype(x, w_q, w_scale, threshold=6.0):  # result in x's dtype
    return llm_int8.mixed_int8_matmul(x, w_q, w_scale, threshold).to(x.dtype)


def _mixed_16bit(dtype):
    """The task read with a 16-bit product in ``dtype`` (float16 or bfloat16): right too."""
    def mixed(x, w_q, w_scale, threshold=6.0):
        y = llm_int8.mixed_int8_matmul(x, w_q, w_scale, threshold, outliers="zero")
        cols = llm_int8.outlier_columns(x, threshold)
        w_hat = w_q[:, cols].float() * w_scale[:, None]
        return y + (x[:, cols].to(dtype) @ w_hat.to(dtype).T).float()
    mixed.__name__ = f"mixed_with_a_{dtype}_product".replace("torch.", "")
    return mixed


def _slack_16bit(x, w_q, w_scale, threshold=6.0):
    """What a 16-bit outlier product may add to the error, per output: each of x's and W's
    values rounded to bfloat16 (8 bits: relative error 2^-9), n products summed, the result
    rounded, bounded by (n + 3) * 2^-8 * (|x_O| @ |W_O|.T) (twice the bound, for margin).
    0 where no column crosses: the INT8 side is checked as tightly as before."""
    cols = llm_int8.outlier_columns(x, threshold)
    w_out = w_q[:, cols].float() * torch.as_tensor(w_scale).reshape(-1, 1).float()
    return (len(cols) + 3) * 2.0 ** -8 * (x[:, cols].float().abs() @ w_out.abs().T)


register(Exercise(
    id="05.mixed_int8_matmul",
    title="LLM.int8()'s mixed-precision decomposition",
    reference=_reference_mixed,
    cases=_mixed_cases,
    hint=["Split the input features in two sets: the outlier columns (16-bit side) and the "
          "rest (INT8 side). Each output is the sum of both partial products. Which columns "
          "should the per-token INT8 scales be computed over?",
          "cols = outlier_columns(x, threshold); keep = the other columns. INT8 side: "
          "quantize_rows(x[:, keep]) -> (xq, xs); acc = xq @ w_q[:, keep].T in integers; "
          "scale by xs[:, None] * w_scale[None, :].",
          "16-bit side: x[:, cols] @ (w_q[:, cols].float() * w_scale[:, None]).T (in float32; "
          "in float16 or bfloat16, as on a GPU, passes too). Add the two; "
          "return float32 (M, N) whatever x's dtype. If every column crosses, the INT8 side is "
          "all zeros; an all-zero token needs a scale of 1, not 0."],
    wrong=[_wrong_mixed_scale_all, _wrong_mixed_dropped, _wrong_mixed_twice,
           _wrong_mixed_raw_weight, _wrong_mixed_zero_row, _wrong_mixed_input_dtype],
    right=[_mixed_16bit(torch.float16), _mixed_16bit(torch.bfloat16)],
    rtol=1e-4, atol=1e-5, slack=_slack_16bit,
))
