"""Hadamard matrices from scratch and the fast Walsh-Hadamard transform (taught in lesson 16).

A Hadamard matrix H of order n has entries +-1 and orthogonal rows: H H^T = n I, so H / sqrt(n)
is a rotation (an orthogonal matrix). Multiplying a vector by it spreads every entry over all n
outputs with equal weight, which is why QuaRot, SpinQuant and QuIP# use it to remove outlier
channels before quantizing (lesson 16). Three constructions cover the sizes the course needs:

    sylvester(n)   n = 2^k:        H_2n = [[H_n, H_n], [H_n, -H_n]]
    paley(q)       order q + 1:    Paley's construction I, q a prime = 3 mod 4, from the squares
                                   mod q; paley12() = paley(11)
    hadamard(n)    products:       Kronecker products of the two (a Kronecker product of
                                   Hadamard matrices is one), split by factor(n)

SmolLM2's sizes: hidden 576 = 12 x 12 x 4, FFN 1536 = 12 x 128, head 64 = 2^6; the bundled
model's: 256, FFN 640 = 20 x 32 (paley(19)), head 32.

:func:`fwht` multiplies by H^T / sqrt(n) without building H: k rounds of butterflies
(a, b) -> (a + b, a - b) for the 2^k part, n log2(n) additions, and a p x p matmul on its own
axis per Paley factor p. :func:`random_hadamard` flips the sign of each row at random:
diag(s) H / sqrt(n), still orthogonal, one of 2^n different rotations (QuIP#'s "randomized
Hadamard").

**What compressed-tensors does** (version 0.20.1, read from
``compressed_tensors/transform/utils/hadamard.py``): ``random_hadamard_matrix(size, dtype, device,
gen)`` (line 53) draws signs with ``torch.randint(0, 2, (size,), generator=gen)`` (line 73, the
same draw as :func:`random_signs` for the same seed), and multiplies ``diag(signs)`` by a
Hadamard built in ``_matmul_hadU`` (line 120): it looks up the LARGEST order K stored in its
file ``hadamards.safetensors`` (int8 matrices of every order 4, 8, ..., 256 that is a multiple
of 4, plus 1 and 2, from N. J. A. Sloane's library) such that size / K is a power of two
(``_fetch_hadamard_divisor``, line 90: divisors sorted in reverse at line 112, test at line 114),
runs butterflies for the power-of-two part (lines 134-140) and multiplies by the stored K x K
matrix (line 148): the result is diag(s) (H_K kron sylvester(size / K))^T. It therefore
supports 576 (K = 144, times 4) and 1536 (K = 192, times 8), both with a stored matrix rather
than a Kronecker product of 12s, so its rotation differs from :func:`random_hadamard`'s there;
for a power of two from 64 up its stored matrices are Sylvester's and the two agree exactly
for the same seed (its stored order 32 is another Hadamard matrix, so at 32 they differ). It
refuses a size with no such K (``ValueError``, line 128; for example 4 x 11 x 11 = 484). Its
result is NOT orthogonal: the entries are +-1 (H H^T = size I) and the comment "normalize" at
line 150 is followed by no division; the division by sqrt(size) happens where the matrix is
used, ``HadamardTransform.forward`` in ``compressed_tensors/transform/factory/hadamard.py`` (the
scale at line 89, the division at line 107). Its default dtype is bfloat16, exact for +-1 entries.
``tests/test_hadamard.py`` checks these points against the installed package.
"""
from __future__ import annotations

import functools
import math

import torch

#: Largest order :func:`factor` tries for one Paley factor (orders above it come from Kronecker
#: products); far more than any model needs.
MAX_PALEY_ORDER = 1024


# ----------------------------------------------------------------------------- argument checks
def _order(name: str, n) -> int:
    """``n`` if it is a whole number >= 1 (a bool or a float is refused)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be a whole number >= 1; got {n!r}")
    return n


def is_pow2(n: int) -> bool:
    """True when n is 1, 2, 4, 8, ..."""
    return n >= 1 and n & (n - 1) == 0


def _is_prime(q: int) -> bool:
    return q >= 2 and all(q % d for d in range(2, math.isqrt(q) + 1))


def _paley_orders(odd: int, twos: int) -> tuple[int, ...] | None:
    """Paley orders p_i = 2^a_i d_i (p_i - 1 a prime) with prod d_i = odd and sum a_i <= twos,
    smallest odd factor first; None if there are none."""
    if odd == 1:
        return ()
    for d in range(3, odd + 1, 2):
        if odd % d:
            continue
        a = 2                                # q = 2^a d - 1 = 3 mod 4 needs a >= 2
        while a <= twos and 2 ** a * d <= MAX_PALEY_ORDER:
            if _is_prime(2 ** a * d - 1):
                rest = _paley_orders(odd // d, twos - a)
                if rest is not None:
                    return (2 ** a * d,) + rest
                break
            a += 1
    return None


def factor(n: int) -> tuple[tuple[int, ...], int]:
    """(paley_orders, m) with n = prod(paley_orders) * m, m = 2^k, or a ValueError (lesson 16).

    Each Paley order is q + 1 for a prime q = 3 mod 4 (:func:`paley`); the smallest odd factors
    come first: 576 -> ((12, 12), 4), 1536 -> ((12,), 128), 640 -> ((20,), 32), 64 -> ((), 64).
    """
    _order("n", n)
    twos = (n & -n).bit_length() - 1                                     # n = odd * 2^twos
    odd = n >> twos
    orders = _paley_orders(odd, twos)
    if orders is None:
        raise ValueError(
            f"no Hadamard matrix of order {n} here: the course builds n = 2^k (Sylvester) times "
            f"Paley orders q + 1 (q a prime = 3 mod 4: 12, 20, 24, 44, 48, ...) as Kronecker "
            f"products, for example 64, 576 = 12 x 12 x 4, 640 = 20 x 32 and 1536 = 12 x 128. "
            f"Orders that are not multiples of 4 (other than 1 and 2) have no Hadamard matrix at "
            f"all; for another multiple of 4 (28, 484, ...), pad the dimension or use a stored "
            f"matrix (compressed-tensors' hadamards.safetensors holds every multiple of 4 up "
            f"to 256)")
    return orders, n // math.prod(orders)


def _check_tensor(name: str, x) -> torch.Tensor:
    """A floating-point tensor with no NaN or inf, or a clear error."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch tensor; got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (float32, float64, bfloat16, "
                        f"float16); got {x.dtype}: convert it with .float()")
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (the transform runs along the "
                         f"last one); got a scalar")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} holds NaN or inf; a rotation would spread them over every "
                         f"channel: find where they come from first")
    return x


# ----------------------------------------------------------------------------- constructions
def sylvester(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Sylvester's Hadamard matrix of order n = 2^k, entries +-1, (n, n) (lesson 16).

    H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]]; symmetric, and H H^T = n I.
    Entry (i, j) is (-1)^popcount(i & j): the sign of the parity of the bits i and j share.
    """
    _order("n", n)
    if not is_pow2(n):
        raise ValueError(f"Sylvester's construction gives orders 1, 2, 4, 8, ...; got {n}. "
                         f"For 12 x 2^k use hadamard(n)")
    H = torch.ones(1, 1, dtype=dtype)                                    # (1, 1)
    while H.shape[0] < n:
        H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)  # (2m, 2m)
    return H                                                             # (n, n)


def quadratic_residues(q: int) -> set[int]:
    """The nonzero squares mod a prime q: {x^2 mod q for x = 1..q-1} (lesson 16)."""
    return {x * x % q for x in range(1, q)}


def paley(q: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Paley's construction I: a Hadamard matrix of order q + 1 for a prime q = 3 mod 4 (lesson 16).

    The Jacobsthal matrix Q[i, j] = chi(j - i) (chi = +1 on a nonzero square mod q, -1 on a
    non-square, 0 at 0) is antisymmetric when q = 3 mod 4, with Q Q^T = q I - J. Bordered with
    ones, S = [[0, 1^T], [-1, Q]], and H = I + S satisfies H H^T = (q + 1) I.
    """
    _order("q", q)
    if q % 4 != 3 or not _is_prime(q):
        raise ValueError(f"Paley's construction I needs a prime q with q = 3 mod 4 (3, 7, 11, 19, "
                         f"23, ...); got {q}")
    return _paley(q).to(dtype)                                           # (q+1, q+1)


@functools.lru_cache(maxsize=16)
def _paley(q: int) -> torch.Tensor:
    """paley(q) in float64, built once (fwht uses it on every call; never written to)."""
    squares = quadratic_residues(q)
    chi = [0] + [1 if r in squares else -1 for r in range(1, q)]          # chi(r), r = 0..q-1
    Q = torch.tensor([[chi[(j - i) % q] for j in range(q)] for i in range(q)],
                     dtype=torch.float64)                                # (q, q) Jacobsthal
    S = torch.zeros(q + 1, q + 1, dtype=torch.float64)                   # (q+1, q+1)
    S[0, 1:], S[1:, 0], S[1:, 1:] = 1, -1, Q
    return torch.eye(q + 1, dtype=torch.float64) + S                     # (q+1, q+1)


def paley12(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The order-12 Hadamard matrix from the squares mod 11 ({1, 3, 4, 5, 9}), (12, 12) (lesson 16).

    Not symmetric (H^T is another Hadamard matrix); H H^T = 12 I.
    """
    return paley(11, dtype)


def hadamard(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A Hadamard matrix of order n, entries +-1, (n, n): Kronecker products (lesson 16).

    kron(paley(p1 - 1), ..., sylvester(2^k)) for :func:`factor`'s split of n:
    576 = 12 x 12 x 4, 1536 = 12 x 128, 640 = 20 x 32, 64 = 64. A size with no such split
    raises ValueError naming the sizes that work.
    """
    orders, m = factor(n)
    H = sylvester(m, dtype)                                              # (2^k, 2^k)
    for p in reversed(orders):
        H = torch.kron(paley(p - 1, dtype), H)                           # (p m', p m')
    return H                                                             # (n, n)


# ----------------------------------------------------------------------------- the fast transform
def butterflies_(y: torch.Tensor) -> torch.Tensor:
    """y @ sylvester(m) along the last dim (m = 2^k), IN PLACE, unnormalised (lesson 16).

    Round h = 1, 2, 4, ...: each pair (i, i + h) with bit h of i clear becomes (a + b, a - b).
    k rounds of m additions: m log2(m) in all, and half a row of scratch per round.
    """
    m = y.shape[-1]
    if not is_pow2(m) or not y.is_contiguous():
        raise ValueError(f"butterflies_ works in place on a contiguous tensor whose last dim is a "
                         f"power of two; got shape {tuple(y.shape)}, contiguous={y.is_contiguous()}"
                         f" (use y.contiguous(); for other sizes use fwht)")
    h = 1
    while h < m:
        v = y.view(*y.shape[:-1], m // (2 * h), 2, h)                    # (..., m/2h, 2, h)
        a = v[..., 0, :].clone()                                         # (..., m/2h, h)
        b = v[..., 1, :]                                                 # a view into y
        v[..., 0, :].add_(b)                                             # a + b
        b.neg_().add_(a)                                                 # a - b
        h *= 2
    return y


def fwht(x: torch.Tensor) -> torch.Tensor:
    """The fast Walsh-Hadamard transform along x's last dim: x @ hadamard(n).T / sqrt(n)
    (lesson 16).

    x: (..., n) with n a size :func:`factor` splits -> (..., n), same dtype. Orthogonal
    (lengths are kept). The 2^k part runs as butterflies (:func:`butterflies_`), each Paley
    factor p (12 for SmolLM2) as a p x p matmul on its own axis. float16 / bfloat16 inputs are
    computed in float32 and rounded once at the end; float64 stays float64. For n = 2^k the
    matrix is symmetric and fwht(fwht(x)) = x; with a Paley factor it is not.
    """
    _check_tensor("x", x)
    n = x.shape[-1]
    try:
        orders, m = factor(n)
    except ValueError as e:
        raise ValueError(f"fwht runs along the last dimension of x, here of size {n}: "
                         f"{e}") from None
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    lead = x.shape[:-1]
    y = x.to(work).reshape(-1, n).clone(memory_format=torch.contiguous_format)  # (N, n) a copy
    y = butterflies_(y.view(-1, m)).view(-1, n)                          # 2^k part, (N, n)
    outer = 1                                                            # product of axes done
    for p in orders:                                                     # axis of factor p
        Hp = _paley(p - 1).to(device=y.device, dtype=work)               # (p, p)
        y = Hp @ y.view(-1, p, n // (outer * p))                         # (N outer, p, rest)
        outer *= p
    return (y.reshape(-1, n) / math.sqrt(n)).to(x.dtype).reshape(*lead, n)  # (..., n)


# ----------------------------------------------------------------------------- random rotations
def random_signs(n: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """n independent +-1 signs, (n,), from ``seed`` (lesson 16).

    The draw is torch.randint(0, 2, (n,)) * 2 - 1 on a generator seeded with ``seed``: the same
    signs compressed-tensors' ``random_hadamard_matrix`` draws with such a generator.
    """
    _order("n", n)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be a whole number; got {seed!r}")
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (n,), generator=g) * 2 - 1).to(dtype)    # (n,)


def random_hadamard(n: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """diag(random_signs(n, seed)) @ hadamard(n) / sqrt(n): an orthogonal (n, n) (lesson 16).

    Built in float64 and rounded once to ``dtype``. x @ random_hadamard(n, s).T equals
    fwht(x) * random_signs(n, s), which is how a model applies it without the matrix.
    """
    s = random_signs(n, seed, torch.float64)                             # (n,)
    H = hadamard(n, torch.float64)                                       # (n, n)
    return (s[:, None] * H / math.sqrt(n)).to(dtype)                     # (n, n)


def orthogonality_error(Q: torch.Tensor) -> float:
    """max |Q Q^T - I|, computed in float64: 0 for an exact rotation (lesson 16)."""
    Q = Q.detach().double()
    eye = torch.eye(Q.shape[0], dtype=torch.float64, device=Q.device)
    return float((Q @ Q.T - eye).abs().max())
