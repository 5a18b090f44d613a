"""Exercises of lesson 16, "Rotations" (solutions/16_rotations.ipynb).

Four pieces the lesson then uses: a Hadamard matrix of SmolLM2's sizes from Sylvester's
construction and Kronecker products with the order-12 matrix, the fast Walsh-Hadamard transform
with butterflies, the weight a reader Linear has once its norm's scale is folded in and the
residual stream is rotated, and the Cayley map that keeps a learned rotation orthogonal. The
references are the library's (course_lib.hadamard, course_lib.spinquant), wrapped where the task
is narrower (only orders 12^a x 2^k; only powers of two).
"""
from __future__ import annotations

import math

import torch

from course_lib import hadamard, spinquant
from course_lib.checks import Case, Exercise, register


def _g(seed):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- 16.hadamard_12k

def _twelves(n):
    """(a, m) with n = 12^a * m and m a power of two, or ValueError."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a whole number >= 1; got {n!r}")
    a, m = 0, n
    while m % 12 == 0:
        a, m = a + 1, m // 12
    if not hadamard.is_pow2(m):
        raise ValueError(f"{n} is not 12^a x 2^k")
    return a, m


def hadamard_12k(n):
    """The reference: kron(paley12, ..., paley12, sylvester(2^k)) for n = 12^a 2^k (+-1)."""
    a, m = _twelves(n)
    H = hadamard.sylvester(m)
    for _ in range(a):
        H = torch.kron(hadamard.paley12(), H)
    return H


def _h12_cases():
    return [
        Case((1,), label="n = 1: [[1]]"),
        Case((8,), label="n = 8 = 2^3: Sylvester alone",
             hint="Start from [[1]] and double: [[H, H], [H, -H]]. Where does the minus sign go?"),
        Case((12,), label="n = 12: paley12() alone (no Sylvester factor, m = 1)"),
        Case((48,), label="n = 48 = 12 x 4: kron(paley12, sylvester(4)), the 12 OUTSIDE",
             hint="torch.kron(A, B) puts a copy of B, scaled by each entry of A, in A's place. "
                  "The task puts the 12 outside: torch.kron(paley12(), sylvester(m)), not the "
                  "other way round (that is a Hadamard matrix too, but another one)."),
        Case((576,), label="n = 576 = 12 x 12 x 4 (SmolLM2's hidden size)"),
        Case((1536,), label="n = 1536 = 12 x 128 (SmolLM2's FFN width)"),
        Case((40,), label="n = 40 = 5 x 8: raise ValueError", raises=ValueError,
             hint="After dividing out every 12, what is left must be a power of two; is 40 / 8 "
                  "= 5 one?"),
        Case((36,), label="n = 36 = 12 x 3: raise ValueError", raises=ValueError),
        Case((0,), label="n = 0: raise ValueError", raises=ValueError),
    ]


def _wrong_h12_kron_reversed(n):              # sylvester outside, the 12 inside
    a, m = _twelves(n)
    H = hadamard.sylvester(m)
    for _ in range(a):
        H = torch.kron(H, hadamard.paley12())
    return H


def _wrong_h12_normalised(n):                 # divides by sqrt(n): a rotation, not +-1
    return hadamard_12k(n) / math.sqrt(n)


def _wrong_h12_sign(n):                       # [[H, -H], [H, H]]: the minus in the wrong block
    a, m = _twelves(n)
    H = torch.ones(1, 1)
    while H.shape[0] < m:
        H = torch.cat([torch.cat([H, -H], 1), torch.cat([H, H], 1)], 0)
    for _ in range(a):
        H = torch.kron(hadamard.paley12(), H)
    return H


def _wrong_h12_transposed_paley(n):           # paley12().T: another Hadamard matrix of order 12
    a, m = _twelves(n)
    H = hadamard.sylvester(m)
    for _ in range(a):
        H = torch.kron(hadamard.paley12().T, H)
    return H


def _wrong_h12_no_refusal(n):                 # pads 40 -> 48 silently instead of refusing
    try:
        return hadamard_12k(n)
    except ValueError:
        return hadamard_12k(48) if n == 40 else hadamard_12k(12) if n == 36 else torch.ones(1, 1)


register(Exercise(
    id="16.hadamard_12k",
    title="a Hadamard matrix of order 12^a x 2^k: Sylvester, then Kronecker products with the "
          "order-12 matrix",
    reference=hadamard_12k,
    cases=_h12_cases,
    hint=["Two steps: how do you split n into 12s and a power of two, and how does a Kronecker "
          "product of two Hadamard matrices give a bigger one?",
          "Divide n by 12 while it divides; what is left, m, must be a power of two (else "
          "ValueError). Build sylvester(m) by doubling [[H, H], [H, -H]] from [[1]], then wrap "
          "it once per 12: H = torch.kron(paley12(), H).",
          "a = 0; m = n; while m % 12 == 0: a, m = a + 1, m // 12; refuse n < 1 and m not a "
          "power of two (m & (m - 1) != 0); H = torch.ones(1, 1); double it to m; then "
          "`for _ in range(a): H = torch.kron(hadamard.paley12(), H)`."],
    wrong=[_wrong_h12_kron_reversed, _wrong_h12_normalised, _wrong_h12_sign,
           _wrong_h12_transposed_paley, _wrong_h12_no_refusal],
    rtol=0, atol=0,
))


# ---------------------------------------------------------------- 16.fwht

def fwht_pow2(x):
    """The reference: x @ sylvester(n) / sqrt(n) along the last dim, n a power of two."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError("x must be a floating-point tensor")
    if x.dim() == 0 or not hadamard.is_pow2(x.shape[-1]):
        raise ValueError(f"the last dim must be a power of two; got {tuple(x.shape)}")
    return hadamard.fwht(x)


def _fwht_cases():
    x64 = torch.randn(3, 64, generator=_g(0))
    spike = torch.zeros(2, 16)
    spike[0, 5] = 4.0
    spike[1, 0] = 1.0
    return [
        Case((torch.tensor([1.0, 2.0]),), label="n = 2: (a + b, a - b) / sqrt(2)",
             hint="The smallest transform: one butterfly (a, b) -> (a + b, a - b). Is the result "
                  "divided by sqrt(n), as the task asks, so that lengths are kept?"),
        Case((torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]),),
             label="n = 8, one vector: three rounds, h = 1, 2, 4",
             hint="Each round pairs i with i + h for the indices i whose bit h is clear, and h "
                  "doubles: 1, 2, 4. Does your loop change h?"),
        Case((spike,), label="one spike per row: spread evenly over all 16 channels"),
        Case((x64,), label="a batch of 3 tokens, n = 64"),
        Case((torch.randn(2, 3, 32, generator=_g(1)),), label="3-D input (2, 3, 32): the "
             "transform runs along the last dim only"),
        Case((torch.randn(4, 128, generator=_g(2)).double(),), label="float64 in: float64 out",
             hint="The result keeps x's dtype."),
        Case((torch.randn(1, 1, generator=_g(3)),), label="n = 1: the identity"),
        Case((torch.randn(2, 12, generator=_g(4)),), label="n = 12: raise ValueError",
             raises=ValueError),
    ]


def _butterflies(x, normalise):
    y = x.clone()
    n = y.shape[-1]
    h = 1
    while h < n:
        v = y.view(*y.shape[:-1], n // (2 * h), 2, h)
        a, b = v[..., 0, :].clone(), v[..., 1, :].clone()
        v[..., 0, :], v[..., 1, :] = a + b, a - b
        h *= 2
    return normalise(y, n)


def _wrong_fwht_no_norm(x):
    fwht_pow2(x)
    return _butterflies(x, lambda y, n: y)


def _wrong_fwht_by_n(x):
    fwht_pow2(x)
    return _butterflies(x, lambda y, n: y / n)


def _wrong_fwht_h_fixed(x):                   # every round pairs neighbours (h stays 1)
    fwht_pow2(x)
    y = x.clone()
    n = y.shape[-1]
    for _ in range(int(math.log2(n))):
        v = y.view(*y.shape[:-1], n // 2, 2, 1)
        a, b = v[..., 0, :].clone(), v[..., 1, :].clone()
        v[..., 0, :], v[..., 1, :] = a + b, a - b
    return y / math.sqrt(n)


def _wrong_fwht_float32(x):                   # computes and returns float32 always
    fwht_pow2(x)
    return _butterflies(x.float(), lambda y, n: y / math.sqrt(n))


def _wrong_fwht_first_dim(x):                 # transforms along dim 0 for 2-D inputs
    fwht_pow2(x)
    if x.dim() == 2 and hadamard.is_pow2(x.shape[0]):
        return fwht_pow2(x.T.contiguous()).T
    return fwht_pow2(x)


def _right_fwht_matrix(x):                    # the matrix product: O(n^2), but the same numbers
    fwht_pow2(x)
    n = x.shape[-1]
    return x @ hadamard.sylvester(n, x.dtype).T / math.sqrt(n)


register(Exercise(
    id="16.fwht",
    title="the fast Walsh-Hadamard transform: log2(n) rounds of butterflies",
    reference=fwht_pow2,
    cases=_fwht_cases,
    hint=["What does one round do to a pair of entries, and how far apart are the partners in "
          "round 1, 2, 3?",
          "Work on a copy y = x.clone(). With h = 1, 2, 4, ... < n: view y as (..., n / 2h, 2, "
          "h); the two slices [..., 0, :] and [..., 1, :] are the partners a and b: write "
          "a + b and a - b back (copy a first). Divide by sqrt(n) at the end.",
          "y = x.clone(); h = 1; while h < n: v = y.view(*y.shape[:-1], n // (2 * h), 2, h); "
          "a = v[..., 0, :].clone(); b = v[..., 1, :].clone(); v[..., 0, :] = a + b; "
          "v[..., 1, :] = a - b; h *= 2. Return y / math.sqrt(n); raise ValueError when n is "
          "not a power of two."],
    wrong=[_wrong_fwht_no_norm, _wrong_fwht_by_n, _wrong_fwht_h_fixed, _wrong_fwht_float32,
           _wrong_fwht_first_dim],
    right=[_right_fwht_matrix],
    rtol=1e-5, atol=1e-6,
))


# ---------------------------------------------------------------- 16.fold_rotate

def fold_rotate(g, W, Q):
    """The reference: W diag(g) Q, a reader's weight (out, D) after fold_norms and R1."""
    for name, t, dim in (("g", g, 1), ("W", W, 2), ("Q", Q, 2)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != dim:
            raise ValueError(f"{name} must be a {dim}-D floating-point tensor")
    if W.shape[1] != g.shape[0] or tuple(Q.shape) != (g.shape[0], g.shape[0]):
        raise ValueError("g (D,), W (out, D) and Q (D, D) must agree on D")
    return (W * g) @ Q


def _fr_cases():
    D = 16
    g = 1 + 0.5 * torch.randn(D, generator=_g(0))
    Q = hadamard.random_hadamard(D, 1)
    return [
        Case((torch.ones(D), torch.eye(D), Q), label="g = 1, W = I: the result is Q itself",
             hint="With no scale and W = I, x W'^T must equal (x Q)... which matrix is W' "
                  "then: Q or Q^T?"),
        Case((g, torch.eye(D), torch.eye(D)), label="Q = I, W = I: the result is diag(g)"),
        Case((g, torch.randn(D, D, generator=_g(2)), torch.eye(D)),
             label="Q = I, a square W: g scales W's COLUMNS (its inputs), not its rows",
             hint="The norm multiplies the INPUT channel j by g[j]; which index of W (out, D) "
                  "meets input channel j?"),
        Case((g, torch.randn(8, D, generator=_g(3)), Q), label="a q_proj-like W (8, 16)"),
        Case((g.double(), torch.randn(40, D, generator=_g(4)).double(),
              hadamard.random_hadamard(D, 5, torch.float64)), label="float64, W (40, 16)"),
        Case((g, torch.randn(8, 12, generator=_g(6)), Q), label="W's 12 columns do not match "
             "g's 16: raise ValueError", raises=ValueError),
    ]


def _wrong_fr_rows(g, W, Q):                  # scales the rows (outputs)
    fold_rotate(g, W, Q)
    return (g[:, None] * W) @ Q if W.shape[0] == g.shape[0] else (W * g) @ Q


def _wrong_fr_qt(g, W, Q):                    # Q^T: the writers' side
    fold_rotate(g, W, Q)
    return (W * g) @ Q.T


def _wrong_fr_no_g(g, W, Q):
    fold_rotate(g, W, Q)
    return W @ Q


def _wrong_fr_rotate_then_scale(g, W, Q):     # W Q diag(g): the scale after the rotation
    fold_rotate(g, W, Q)
    return (W @ Q) * g


def _wrong_fr_divide(g, W, Q):                # W diag(1/g): undoes the norm instead
    fold_rotate(g, W, Q)
    return (W / g) @ Q


register(Exercise(
    id="16.fold_rotate",
    title="a reader's weight after the norm fold and the residual rotation: W diag(g) Q",
    reference=fold_rotate,
    cases=_fr_cases,
    hint=["The layer computed (x / rms(x) * g) W^T. After the change the norm has no scale and "
          "its input is x Q. Which W' gives the same output, and on which side of W does each "
          "factor go?",
          "First fold: W diag(g) multiplies column j of W by g[j] (W * g broadcasts g over the "
          "rows). Then the inputs arrive as x Q (rms is unchanged), so the weight must be "
          "multiplied by Q on the right: (x Q)(W' )^T with W' = W diag(g) Q.",
          "Check shapes (g (D,), W (out, D), Q (D, D); ValueError otherwise) and return "
          "(W * g) @ Q."],
    wrong=[_wrong_fr_rows, _wrong_fr_qt, _wrong_fr_no_g, _wrong_fr_rotate_then_scale,
           _wrong_fr_divide],
    rtol=1e-5, atol=1e-6,
))


# ---------------------------------------------------------------- 16.cayley

def _skew_of(n, seed, size=1.0, dtype=torch.float32):
    return spinquant.skew(torch.randn(n, n, generator=_g(seed)) * size).to(dtype)


def _cayley_cases():
    t = 0.5
    return [
        Case((torch.zeros(4, 4),), label="A = 0: the identity",
             hint="What is (I - 0)^-1 (I + 0)? Build I with torch.eye of A's size and dtype."),
        Case((torch.tensor([[0.0, -t], [t, 0.0]]),),
             label="2 x 2, t = 0.5: the rotation by 2 atan(0.5), [[0.6, -0.8], [0.8, 0.6]]",
             hint="(I - A)^-1 (I + A), not (I + A)^-1 (I - A) (that is its transpose, the "
                  "rotation the other way). Which factor is inverted?"),
        Case((_skew_of(8, 0),), label="a random skew-symmetric 8 x 8"),
        Case((_skew_of(64, 1, 0.1),), label="64 x 64, small entries: close to I"),
        Case((_skew_of(16, 2, 3.0, torch.float64),), label="float64 16 x 16, large entries",
             hint="Keep A's dtype for I (torch.eye(n, dtype=A.dtype))."),
        Case((torch.randn(4, 4, generator=_g(3)),), label="not skew-symmetric: raise ValueError",
             raises=ValueError,
             hint="The task refuses an A with A^T != -A (only a skew-symmetric A gives a "
                  "rotation). Test torch.allclose(A.T, -A) first."),
        Case((torch.zeros(3, 4),), label="not square: raise ValueError", raises=ValueError),
    ]


def cayley_checked(A):
    """The reference: spinquant.cayley, refusing a non-square or non-skew A with ValueError."""
    if not isinstance(A, torch.Tensor) or A.dim() != 2 or A.shape[0] != A.shape[1]:
        raise ValueError("A must be a square matrix")
    return spinquant.cayley(A)


def _eye(A):
    return torch.eye(A.shape[0], dtype=A.dtype)


def _wrong_cayley_inverse_other(A):           # (I + A)^-1 (I - A): the transpose
    cayley_checked(A)
    return torch.linalg.solve(_eye(A) + A, _eye(A) - A)


def _wrong_cayley_exp(A):                     # the exponential map: orthogonal, another rotation
    cayley_checked(A)
    return torch.linalg.matrix_exp(A)


def _wrong_cayley_no_inverse(A):              # (I - A)(I + A)... no inverse: not orthogonal
    cayley_checked(A)
    return (_eye(A) - A) @ (_eye(A) + A)


def _wrong_cayley_no_check(A):                # accepts any A
    if A.dim() != 2 or A.shape[0] != A.shape[1]:
        raise ValueError("A must be square")
    return torch.linalg.solve(_eye(A) - A, _eye(A) + A)


def _wrong_cayley_float32(A):                 # always float32
    cayley_checked(A)
    A32 = A.float()
    return torch.linalg.solve(_eye(A32) - A32, _eye(A32) + A32)


def _right_cayley_commuted(A):                # (I + A)(I - A)^-1: the factors commute
    cayley_checked(A)
    return torch.linalg.solve((_eye(A) - A).T, (_eye(A) + A).T).T


register(Exercise(
    id="16.cayley",
    title="the Cayley map: a skew-symmetric matrix to a rotation",
    reference=cayley_checked,
    cases=_cayley_cases,
    hint=["Which matrices are skew-symmetric, and why does (I - A)^-1 (I + A) of one come out "
          "orthogonal? Where does the inverse go?",
          "Refuse a non-square A and one with A^T != -A (ValueError). Then I = torch.eye(n, "
          "dtype=A.dtype) and solve (I - A) Q = (I + A) for Q: one linear solve, no explicit "
          "inverse needed.",
          "if A.dim() != 2 or A.shape[0] != A.shape[1] or not torch.allclose(A.T, -A): raise "
          "ValueError(...); I = torch.eye(A.shape[0], dtype=A.dtype); return "
          "torch.linalg.solve(I - A, I + A)"],
    wrong=[_wrong_cayley_inverse_other, _wrong_cayley_exp, _wrong_cayley_no_inverse,
           _wrong_cayley_no_check, _wrong_cayley_float32],
    right=[_right_cayley_commuted],
    rtol=1e-5, atol=1e-6,
))
