"""Exercises of lesson 06, "GPTQ" (solutions/06_gptq.ipynb)."""
from __future__ import annotations

import torch

from course_lib.checks import Case, Exercise, register
from course_lib.methods import calibration as cal
from course_lib.methods import gptq


#: the shared harness rejects answers that change their inputs in place (a wrong answer of
#: that kind is listed only where the harness can see it)
_HARNESS_SEES_MUTATION = int("mutates" in getattr(Exercise, "__dataclass_fields__", {}))


def _x(n, d, seed, spread=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x * (torch.rand(d, generator=g) * 3 + 0.1) if spread else x


# ---------------------------------------------------------------- 06.hessian

def _hessian_cases():
    x = _x(50, 8, 0)
    x_dead = x.clone()
    x_dead[:, 3] = 0
    return [
        Case((torch.tensor([[1.0, 2.0], [3.0, -1.0]]),), label="hand-checkable 2 tokens x 2 inputs"),
        Case((x,), label="50 tokens, 8 inputs of different sizes"),
        Case((x_dead,), label="an input that is always 0 (a dead input)"),
        Case((_x(1, 5, 1),), label="a single token"),
        Case((_x(300, 16, 2),), label="300 tokens: H must not grow with the number of tokens",
             hint="Is H a sum or a mean over the tokens? The task's H does not grow with their "
                  "number."),
        Case((x.to(torch.bfloat16),), label="bfloat16 inputs: computed in float32, not in "
             "bfloat16 and converted after",
             hint="Converting the result is too late: in which dtype did the products and their "
                  "sum happen? Convert x before multiplying."),
        Case((x.double(),), label="float64 inputs: H comes back float32 (the course "
             "accumulates in fp32)"),
        Case((torch.arange(4.0),), label="a 1-D vector: raise ValueError", raises=ValueError),
        Case((torch.tensor([[1.0, float("nan")], [0.0, 1.0]]),),
             label="a NaN in the inputs: raise ValueError (H would be NaN)", raises=ValueError),
    ]


def _ok(x):
    if x.dim() != 2 or not torch.isfinite(x).all():
        raise ValueError("x must be (tokens, in), finite")


def _wrong_h_no_two(x):           # forgot the factor 2 of the squared error's derivative
    _ok(x)
    return x.T @ x / x.shape[0]


def _wrong_h_sum(x):              # a sum, not a mean: grows with the calibration size
    _ok(x)
    return 2 * x.T @ x


def _wrong_h_tokens(x):           # X X^T over tokens: (N, N), not (in, in)
    _ok(x)
    return 2 * x @ x.T / x.shape[0]


def _wrong_h_diag(x):             # only the diagonal (no correlations between inputs)
    _ok(x)
    return torch.diag(2 * x.pow(2).mean(0))


def _wrong_h_input_dtype(x):      # H in the inputs' dtype (bf16 loses the small entries)
    _ok(x)
    return 2 * x.T @ x / x.shape[0]


def _wrong_h_cast_after(x):       # "returns float32", but the product was taken in bf16
    _ok(x)
    return (2 * x.T @ x / x.shape[0]).float()


def _right_h_float64(x):          # computed in float64, returned in float32: also right
    _ok(x)
    x = x.double()
    return (2 * x.T @ x / x.shape[0]).float()


def _wrong_h_nan_ok(x):           # lets a NaN through
    if x.dim() != 2:
        raise ValueError("x must be (tokens, in)")
    x = x.float()
    return 2 * x.T @ x / x.shape[0]


register(Exercise(
    id="06.hessian",
    title="the Hessian of a layer's squared output error, H = 2 X X^T / N",
    reference=gptq.hessian,
    cases=_hessian_cases,
    hint=["The error ||W X - W' X||^2 is a quadratic in each row of W'. What matrix multiplies "
          "that row on both sides, and which dimension of x should it be over: tokens or inputs?",
          "x holds one token per row, so X (in, N) of the paper is x.T: H = 2 * x.T @ x, divided "
          "by the number of tokens so its size does not depend on N.",
          "if x.dim() != 2 or not torch.isfinite(x).all(): raise ValueError(...); "
          "x = x.float() (before the product: converting the result is too late); "
          "return 2 * x.T @ x / x.shape[0]"],
    wrong=[_wrong_h_no_two, _wrong_h_sum, _wrong_h_tokens, _wrong_h_diag, _wrong_h_input_dtype,
           _wrong_h_nan_ok, _wrong_h_cast_after],
    right=[_right_h_float64],
    rtol=1e-4, atol=1e-5,
))


# ---------------------------------------------------------------- 06.dampen

def _dampen_cases():
    H = gptq.hessian(_x(200, 6, 3))
    Hd = H.clone()
    Hd[2, :] = 0
    Hd[:, 2] = 0
    return [
        Case((torch.diag(torch.tensor([1.0, 2.0, 3.0])), 0.1), label="diagonal H: mean diag 2"),
        Case((H, 0.01), label="a real H, 1% dampening"),
        Case((Hd, 0.01), label="input 2 is dead: its diagonal becomes 1 before dampening, and "
             "that 1 counts in the mean",
             hint="Which diagonal is the mean taken over: H as it came, or H after the dead "
                  "inputs got their 1?"),
        Case((H, 0.0), label="damp 0: only dead inputs change",
             hint="With damp 0, nothing is added: what still changes is the diagonal of inputs "
                  "that never fired (H[j, j] = 0 becomes 1)."),
        Case((torch.zeros(3, 3), 0.01), label="every input dead: identity, then 1% of its mean "
             "diagonal (1) added",
             hint="Which diagonal is the mean taken over: H as it came, or H after the dead "
                  "inputs got their 1?"),
        Case((H.double(), 0.01), label="a float64 H stays float64"),
        Case((H, -0.1), label="negative damp: raise ValueError", raises=ValueError),
        Case((H, float("nan")), label="damp NaN: raise ValueError", raises=ValueError),
    ]


def _damp_check(damp):
    if not damp >= 0:
        raise ValueError("damp must be >= 0")


def _wrong_damp_in_place(H, damp=0.01):      # changes the caller's H (no copy)
    _damp_check(damp)
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    return H + damp * torch.mean(torch.diag(H)) * torch.eye(H.shape[0], dtype=H.dtype)


def _wrong_damp_nan_ok(H, damp=0.01):        # `damp < 0` lets NaN through
    if damp < 0:
        raise ValueError("damp must be >= 0")
    H = H.clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    return H + damp * torch.mean(torch.diag(H)) * torch.eye(H.shape[0], dtype=H.dtype)


def _wrong_damp_absolute(H, damp=0.01):      # damp * I, not relative to H's size
    _damp_check(damp)
    H = H.clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    return H + damp * torch.eye(H.shape[0])


def _wrong_damp_no_dead(H, damp=0.01):       # dead inputs left at 0
    _damp_check(damp)
    return H + damp * torch.mean(torch.diag(H)) * torch.eye(H.shape[0])


def _wrong_damp_mean_before(H, damp=0.01):   # the mean taken before the dead inputs get 1
    _damp_check(damp)
    mean = torch.mean(torch.diag(H))
    H = H.clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    return H + damp * mean * torch.eye(H.shape[0], dtype=H.dtype)


def _wrong_damp_all_mean(H, damp=0.01):      # mean of every entry, not of the diagonal
    _damp_check(damp)
    H = H.clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    return H + damp * H.mean() * torch.eye(H.shape[0])


def _wrong_damp_everywhere(H, damp=0.01):    # added to every entry, not the diagonal
    _damp_check(damp)
    H = H.clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    return H + damp * torch.mean(torch.diag(H))


register(Exercise(
    id="06.dampen",
    title="dead inputs and dampening, so that H can be inverted",
    reference=gptq.dampen,
    cases=_dampen_cases,
    hint=["Two things can make H singular: an input that never fires (a zero row and column) "
          "and too few tokens. What does each fix add, and to which entries?",
          "First, where diag(H) == 0 set that diagonal entry to 1. Then add damp times the mean "
          "of that new diagonal (the 1s included) to the diagonal only (torch.eye).",
          "if not damp >= 0: raise ValueError(...)  (this refuses NaN too); H = H.clone(); "
          "dead = torch.diag(H) == 0; H[dead, dead] = 1; "
          "return H + damp * torch.diag(H).mean() * torch.eye(len(H), dtype=H.dtype)"],
    wrong=[_wrong_damp_absolute, _wrong_damp_no_dead, _wrong_damp_all_mean, _wrong_damp_everywhere,
           _wrong_damp_nan_ok, _wrong_damp_mean_before, *_HARNESS_SEES_MUTATION * [_wrong_damp_in_place]],
    rtol=1e-5, atol=1e-6,
))


# ---------------------------------------------------------------- 06.gptq_loop

def gptq_loop(W, U, bits=4, group_size=32):
    """Reference: the plain column loop, symmetric; returns (codes, scale)."""
    cal.check_group_size(W.shape[1], group_size)
    codes, scale, _ = gptq.gptq_plain(W, U, bits, group_size, True)
    return codes, scale


def _U(d, seed):
    x = _x(400, d, seed)
    x[:, : d // 2] += x[:, d // 2:]                    # correlated inputs
    return gptq.inverse_cholesky(gptq.dampen(gptq.hessian(x), 0.01))


def _U_correlated(d, seed, noise=0.3):
    """U of inputs that all move together: GPTQ's corrections are large."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(400, 1, generator=g) + noise * torch.randn(400, d, generator=g)
    return gptq.inverse_cholesky(gptq.dampen(gptq.hessian(x), 0.01))


def _loop_cases():
    g = torch.Generator().manual_seed(7)
    W_zero = torch.randn(3, 16, generator=g)
    W_zero[1] = 0                                      # an all-zero row
    return [
        Case((torch.randn(4, 16, generator=g), _U(16, 1), 4, 8), label="4 x 16, INT4, groups of 8"),
        Case((torch.randn(8, 32, generator=g), _U(32, 2), 3, 16), label="8 x 32, INT3, groups of 16"),
        Case((torch.randn(6, 16, generator=g), torch.eye(16), 4, 16),
             label="U = I: no compensation, so it must equal round-to-nearest",
             hint="With U the identity, a column's error feeds no later column: does your loop "
                  "reduce to round-to-nearest?"),
        Case((torch.randn(3, 24, generator=g) * 5, _U(24, 3), 2, 8), label="INT2, larger weights"),
        Case((torch.tensor([[7.0, 2.5, -0.5, 3.5, 1.5, -2.5, 0.5, 6.0]]), torch.eye(8), 4, 8),
             label="U = I, scale 1: exact .5 ties round half to even (2.5 -> 2, 3.5 -> 4)",
             hint="Exactly half-way between two codes: which way does the task round? Half to even "
                  "(np.round, torch.round, Python's round); floor(x + 0.5) and rounding away from "
                  "zero do not."),
        Case((W_zero, _U(16, 5), 4, 8), label="an all-zero row: scale 1, codes 0",
             hint="An all-zero group has a largest magnitude of 0: which scale keeps the "
                  "division away from 0 / 0 (no NaN back)?"),
        Case((torch.randn(4, 16, generator=torch.Generator().manual_seed(9)),
              _U_correlated(16, 9), 4, 16),
             label="strongly correlated inputs: the corrections push a later column past 7 "
                   "steps, and the codes must stay in -7..7",
             hint="After the corrections, is each code still clamped to -qmax..qmax?"),
        Case((torch.randn(2, 16, generator=g), _U(16, 4), 4, 6),
             label="group size 6 does not divide 16: raise ValueError", raises=ValueError),
    ]


def _loop(W, U, bits, gs, *, compensate=True, divide=True, use_col=False, static=False,
          sign=-1.0, lo=None, half_up=False, zero_guard=True, clone=True):
    if W.shape[1] % gs:
        raise ValueError("group size must divide the columns")
    W0 = W.clone()
    W = W.clone() if clone else W
    qmax = 2 ** (bits - 1) - 1
    codes = torch.zeros(W.shape, dtype=torch.int8)
    scale = torch.zeros(W.shape[0], W.shape[1] // gs)
    for j in range(W.shape[1]):
        g = j // gs
        if j % gs == 0:
            src = W0 if static else W
            s = src[:, j:j + gs].abs().amax(1) / qmax
            scale[:, g] = torch.where(s == 0, torch.ones_like(s), s) if zero_guard else s
        r = W[:, j] / scale[:, g]
        r = torch.floor(r + 0.5) if half_up else torch.round(r)
        q = torch.clamp(r, -qmax if lo is None else lo, qmax)
        codes[:, j] = q.to(torch.int8)
        err = W[:, j] - q * scale[:, g]
        if divide:
            err = err / U[j, j]
        if compensate:
            spread = U[j + 1:, j] if use_col else U[j, j + 1:]
            W[:, j + 1:] += sign * err[:, None] * spread[None, :]
    return codes, scale


def _wrong_loop_rtn(W, U, bits=4, group_size=32):        # no error compensation at all
    return _loop(W, U, bits, group_size, compensate=False)


def _wrong_loop_no_divide(W, U, bits=4, group_size=32):  # error not divided by U[j, j]
    return _loop(W, U, bits, group_size, divide=False)


def _wrong_loop_column(W, U, bits=4, group_size=32):     # column j of U, not row j
    return _loop(W, U, bits, group_size, use_col=True)


def _wrong_loop_sign(W, U, bits=4, group_size=32):       # added the error instead of subtracting
    return _loop(W, U, bits, group_size, sign=1.0)


def _wrong_loop_static(W, U, bits=4, group_size=32):     # scales from the original W
    return _loop(W, U, bits, group_size, static=True)


def _wrong_loop_clamp8(W, U, bits=4, group_size=32):     # clamps to -8..7, not -7..7
    return _loop(W, U, bits, group_size, lo=-2 ** (bits - 1))


def _wrong_loop_half_up(W, U, bits=4, group_size=32):    # floor(x + 0.5): ties go up
    return _loop(W, U, bits, group_size, half_up=True)


def _wrong_loop_zero_scale(W, U, bits=4, group_size=32): # an all-zero row keeps scale 0
    return _loop(W, U, bits, group_size, zero_guard=False)


def _wrong_loop_in_place(W, U, bits=4, group_size=32):   # forgot W.clone(): the caller's W
    return _loop(W, U, bits, group_size, clone=False)     # receives the corrections


register(Exercise(
    id="06.gptq_loop",
    title="GPTQ's inner loop: quantize a column, spread its error over the later columns",
    reference=gptq_loop,
    cases=_loop_cases,
    hint=["For each column j: which scale does it use (and when is a group's scale computed), "
          "what is the error, how much of it does each later column k take, and with which sign?",
          "At the first column of a group, scale = max|W[:, group]| / qmax of the columns *as "
          "they are now*. Quantize W[:, j]; err = (W[:, j] - q * scale) / U[j, j]; then "
          "W[:, j+1:] -= err[:, None] * U[j, j+1:][None, :] (row j of U, not column j).",
          "W = W.clone() first (the caller's W must not change); qmax = 2**(bits-1) - 1; codes "
          "int8 = clamp(torch.round(W[:, j] / s), -qmax, qmax) (torch.round sends .5 ties to the "
          "even level); an all-zero group gets scale 1; return (codes, scale), scale (rows, "
          "n_groups)"],
    wrong=[_wrong_loop_rtn, _wrong_loop_no_divide, _wrong_loop_column, _wrong_loop_sign,
           _wrong_loop_static, _wrong_loop_clamp8, _wrong_loop_half_up, _wrong_loop_zero_scale,
           *_HARNESS_SEES_MUTATION * [_wrong_loop_in_place]],
    rtol=1e-4, atol=1e-5,
))
