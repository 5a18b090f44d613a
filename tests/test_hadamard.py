"""course_lib.hadamard (lesson 16): Sylvester, Paley, Kronecker products, the fast transform,
random sign flips, and compressed-tensors' random_hadamard_matrix beside them."""
import math
from pathlib import Path

import pytest
import torch

from course_lib import hadamard as Hd

ORDERS = [1, 2, 4, 8, 12, 20, 24, 48, 64, 144, 240, 576, 640, 1536]


def _is_hadamard(H: torch.Tensor) -> bool:
    n = H.shape[0]
    H = H.double()
    return bool((H.abs() == 1).all()) and torch.equal(H @ H.T,
                                                      n * torch.eye(n, dtype=torch.float64))


# ----------------------------------------------------------------------------- constructions
@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32, 64, 128, 256])
def test_sylvester_is_hadamard_symmetric_and_follows_the_bit_rule(n):
    H = Hd.sylvester(n)
    assert H.shape == (n, n) and H.dtype == torch.float32
    assert _is_hadamard(H) and torch.equal(H, H.T)
    i = torch.arange(n)
    parity = torch.tensor([[bin(int(a) & int(b)).count("1") % 2 for b in i] for a in i])
    assert torch.equal(H, (1 - 2 * parity).float())               # (-1)^popcount(i & j)


def test_paley12_from_the_squares_mod_11():
    assert Hd.quadratic_residues(11) == {1, 3, 4, 5, 9}
    H = Hd.paley12()
    assert H.shape == (12, 12) and _is_hadamard(H)
    assert torch.equal(H @ H.T, 12 * torch.eye(12))               # checked in float32 too
    assert not torch.equal(H, H.T)                                # not symmetric: fwht uses H^T
    Q = H[1:, 1:] - torch.eye(11)                                 # the Jacobsthal matrix
    assert torch.equal(Q, -Q.T)                                   # antisymmetric: 11 = 3 mod 4
    assert Q[0, 1] == 1 and Q[0, 2] == -1                         # 1 is a square, 2 is not


@pytest.mark.parametrize("q", [3, 7, 11, 19, 23, 43, 47])
def test_paley_orders(q):
    assert _is_hadamard(Hd.paley(q))


@pytest.mark.parametrize("q", [2, 5, 9, 13, 15, 1, 0, 11.0, True])
def test_paley_refuses_what_it_cannot_build(q):
    with pytest.raises(ValueError, match="prime q|whole number"):
        Hd.paley(q)


@pytest.mark.parametrize("n, split", [(64, ((), 64)), (576, ((12, 12), 4)), (1536, ((12,), 128)),
                                      (640, ((20,), 32)), (12, ((12,), 1)), (240, ((12, 20), 1))])
def test_factor_splits_the_models_sizes(n, split):
    assert Hd.factor(n) == split


@pytest.mark.parametrize("n", ORDERS)
def test_hadamard_is_hadamard_and_a_kronecker_product(n):
    H = Hd.hadamard(n, torch.float64)
    assert _is_hadamard(H)
    orders, m = Hd.factor(n)
    K = Hd.sylvester(m, torch.float64)
    for p in reversed(orders):
        K = torch.kron(Hd.paley(p - 1, torch.float64), K)
    assert torch.equal(H, K)


@pytest.mark.parametrize("n", [3, 6, 10, 28, 484, 0, -4, 12.0, True])
def test_hadamard_refuses_sizes_it_cannot_build_and_says_which_work(n):
    with pytest.raises(ValueError) as err:
        Hd.hadamard(n)
    msg = str(err.value)
    assert "whole number" in msg or ("576 = 12 x 12 x 4" in msg and "2^k" in msg)


# ----------------------------------------------------------------------------- fast transform
@pytest.mark.parametrize("n", ORDERS)
@pytest.mark.parametrize("lead", [(), (3,), (2, 5)])
def test_fwht_equals_the_matrix_product(n, lead):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(*lead, n, generator=g, dtype=torch.float64)
    H = Hd.hadamard(n, torch.float64)
    want = x @ H.T / math.sqrt(n)                                  # (..., n)
    got = Hd.fwht(x)
    assert got.shape == x.shape and got.dtype == torch.float64
    assert (got - want).abs().max() < 1e-12
    got32 = Hd.fwht(x.float())
    assert got32.dtype == torch.float32
    assert (got32.double() - want).abs().max() < 2e-6 * want.abs().max()
    xb = x.bfloat16()
    gotb = Hd.fwht(xb)
    assert gotb.dtype == torch.bfloat16
    wantb = xb.double() @ H.T / math.sqrt(n)                       # exact, from the bf16 input
    assert (gotb.double() - wantb).abs().max() <= 2 ** -8 * wantb.abs().max()   # one rounding


def test_fwht_keeps_lengths_leaves_its_input_alone_and_inverts_for_powers_of_two():
    x = torch.randn(4, 7, 256, dtype=torch.float64)
    before = x.clone()
    y = Hd.fwht(x)
    assert torch.equal(x, before)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-12)
    assert torch.allclose(Hd.fwht(y), x, atol=1e-12)               # Sylvester: symmetric
    z = torch.randn(3, 12, dtype=torch.float64)
    back = Hd.fwht(z) @ Hd.paley12(torch.float64) / math.sqrt(12)  # H^T's inverse is H / 12
    assert torch.allclose(back, z, atol=1e-12)
    assert not torch.allclose(Hd.fwht(Hd.fwht(z)), z)              # Paley: not an involution


def test_butterflies_run_in_place():
    y = torch.randn(3, 64, dtype=torch.float64)
    want = y @ Hd.sylvester(64, torch.float64)
    ptr = y.data_ptr()
    out = Hd.butterflies_(y)
    assert out.data_ptr() == ptr and torch.allclose(y, want, atol=1e-12)
    with pytest.raises(ValueError, match="contiguous"):
        Hd.butterflies_(torch.randn(64, 3).T)
    with pytest.raises(ValueError, match="power of two"):
        Hd.butterflies_(torch.randn(3, 12))


def test_fwht_takes_a_non_contiguous_input():
    x = torch.randn(576, 3, dtype=torch.float64).T                     # (3, 576), strided
    assert not x.is_contiguous()
    assert torch.allclose(Hd.fwht(x), Hd.fwht(x.contiguous()), atol=1e-13)


def test_fwht_spreads_a_spike_evenly():
    x = torch.zeros(576)
    x[17] = 24.0
    y = Hd.fwht(x)
    assert torch.allclose(y.abs(), torch.ones(576), atol=1e-5)     # 24 / sqrt(576) = 1 each


@pytest.mark.parametrize("bad, kind, match", [
    (torch.tensor([1.0, float("nan"), 0.0, 2.0]), ValueError, "NaN or inf"),
    (torch.tensor([1.0, float("inf"), 0.0, 2.0]), ValueError, "NaN or inf"),
    (torch.ones(4, dtype=torch.int64), TypeError, "floating-point"),
    (torch.tensor(1.0), ValueError, "at least one dimension"),
    (torch.ones(3, 28), ValueError, "last dimension of x, here of size 28"),
    ([1.0, 2.0], TypeError, "torch tensor"),
])
def test_fwht_bad_input(bad, kind, match):
    with pytest.raises(kind, match=match):
        Hd.fwht(bad)


# ----------------------------------------------------------------------------- random rotations
def test_random_signs_are_plus_minus_one_and_seeded():
    s = Hd.random_signs(1536, 0)
    assert s.shape == (1536,) and set(s.tolist()) == {-1.0, 1.0}
    assert torch.equal(s, Hd.random_signs(1536, 0))
    assert not torch.equal(s, Hd.random_signs(1536, 1))
    assert abs(float(s.mean())) < 0.1
    with pytest.raises(ValueError, match="seed"):
        Hd.random_signs(8, 1.5)
    with pytest.raises(ValueError, match="whole number"):
        Hd.random_signs(0, 1)


@pytest.mark.parametrize("n", [64, 576, 640, 1536])
def test_random_hadamard_is_orthogonal_and_what_the_fast_transform_applies(n):
    Q = Hd.random_hadamard(n, 3, torch.float64)
    s = Hd.random_signs(n, 3, torch.float64)
    assert torch.equal(Q, s[:, None] * Hd.hadamard(n, torch.float64) / math.sqrt(n))
    assert Hd.orthogonality_error(Q) < 1e-13
    assert Hd.orthogonality_error(Hd.random_hadamard(n, 3)) < 1e-6          # float32
    x = torch.randn(5, n, dtype=torch.float64)
    assert torch.allclose(x @ Q.T, Hd.fwht(x) * s, atol=1e-12)


def test_a_bfloat16_rotation_is_off_by_its_rounding_of_one_over_sqrt_n():
    assert Hd.orthogonality_error(Hd.random_hadamard(576, 0, torch.bfloat16)) > 1e-3   # 1/24
    assert Hd.orthogonality_error(Hd.random_hadamard(64, 0, torch.bfloat16)) == 0.0    # 1/8 exact


def test_orthogonality_error():
    assert Hd.orthogonality_error(torch.eye(5)) == 0.0
    assert Hd.orthogonality_error(2 * torch.eye(5)) == 3.0
    assert Hd.orthogonality_error(Hd.hadamard(12)) == 11.0          # unnormalised: H H^T = 12 I


# ----------------------------------------------------------------------------- compressed-tensors
@pytest.fixture(scope="module")
def ct_hadamard():
    """compressed-tensors' module, or a skip (only these tests need it)."""
    return pytest.importorskip("compressed_tensors.transform.utils.hadamard",
                               reason="compressed-tensors is not installed (pip install "
                                      "compressed-tensors==0.20.1); its comparison is skipped")


def _ct(ct_hadamard, n: int, seed: int) -> torch.Tensor:
    return ct_hadamard.random_hadamard_matrix(n, torch.float64,
                                              gen=torch.Generator().manual_seed(seed))


def test_compressed_tensors_version_and_the_lines_the_docstring_cites(ct_hadamard):
    import compressed_tensors
    assert compressed_tensors.__version__.startswith("0.20.1"), (
        f"course_lib/hadamard.py cites compressed-tensors 0.20.1 line by line; "
        f"{compressed_tensors.__version__} is installed: re-read its source, update the docstring")
    utils = Path(ct_hadamard.__file__).read_text().splitlines()
    factory = (Path(ct_hadamard.__file__).parents[1] / "factory" / "hadamard.py").read_text() \
        .splitlines()
    assert utils[52].startswith("def random_hadamard_matrix(")             # line 53
    assert "torch.randint(low=0, high=2" in utils[72]                       # line 73
    assert utils[89].startswith("def _fetch_hadamard_divisor(")            # line 90
    assert "reverse=True" in utils[111] and "is_pow2(n // divisor)" in utils[113]  # 112, 114
    assert utils[119].startswith("def _matmul_hadU(")                      # line 120
    assert "raise ValueError" in utils[127]                                 # line 128
    assert "hadK.view(1, K, K)" in utils[147]                               # line 148
    assert utils[149].strip() == "# normalize" and "sqrt" not in utils[150]  # 150: no division
    assert "sqrt()" in factory[88] and "/ self._scale" in factory[106]       # lines 89, 107


@pytest.mark.parametrize("n, K", [(576, 144), (1536, 192)])
def test_compressed_tensors_supports_576_and_1536_with_a_stored_matrix(ct_hadamard, n, K):
    M = _ct(ct_hadamard, n, 7)
    stored = ct_hadamard._fetch_hadamard_divisor(n, torch.float64)
    assert stored.shape == (K, K) and _is_hadamard(stored)
    s = Hd.random_signs(n, 7, torch.float64)                                # the same signs
    assert torch.equal(M, s[:, None] * torch.kron(stored, Hd.sylvester(n // K, torch.float64)).T)
    assert _is_hadamard(M)                                                  # +-1 entries:
    assert Hd.orthogonality_error(M) == n - 1                               # NOT orthogonal
    assert Hd.orthogonality_error(M / math.sqrt(n)) < 1e-13                 # after / sqrt(n)
    assert not torch.equal(M / math.sqrt(n), Hd.random_hadamard(n, 7, torch.float64))
    assert not torch.equal(stored, Hd.hadamard(K, torch.float64))           # another matrix
    bf = ct_hadamard.random_hadamard_matrix(n, gen=torch.Generator().manual_seed(7))
    assert bf.dtype == torch.bfloat16 and torch.equal(bf.double(), M)       # exact in bf16


@pytest.mark.parametrize("n", [64, 128, 256, 512, 1024])
def test_compressed_tensors_equals_ours_for_powers_of_two_from_64(ct_hadamard, n):
    ours = Hd.random_hadamard(n, 5, torch.float64)
    assert torch.equal(_ct(ct_hadamard, n, 5) / math.sqrt(n), ours)


def test_compressed_tensors_order_32_is_another_matrix_and_484_is_refused_by_both(ct_hadamard):
    M = _ct(ct_hadamard, 32, 5)
    assert _is_hadamard(M)
    assert not torch.equal(M / math.sqrt(32), Hd.random_hadamard(32, 5, torch.float64))
    with pytest.raises(ValueError, match="484"):
        ct_hadamard.random_hadamard_matrix(484, torch.float64)
    with pytest.raises(ValueError, match="484"):
        Hd.hadamard(484)
