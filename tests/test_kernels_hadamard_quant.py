"""The fused Hadamard + INT4 kernel against plain torch (interpreter on CPU, native on a GPU).

Scales must equal the reference's bit for bit (same additions in the same order, then the same
two IEEE divisions); codes must be equal except where y / scale lies within float rounding of a
tie k + 1/2 (the kernel multiplies by an approximate 7 / max|z| instead of dividing twice per
value). Every mismatch is checked to be such a tie, and there are none or a handful per million.
"""
import math
import os
import subprocess
import sys

import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import pytest
import torch

from course_lib import quant
from course_lib.hadamard import fwht, random_signs
from course_lib.rotate import OnlineHadamard
from kernels import hadamard_quant as hq
from kernels._common import on_gpu

DEV = "cuda" if on_gpu() else "cpu"
SUPPORTED, WHY = hq.hadamard_quant_supported()
needs_kernel = pytest.mark.skipif(not SUPPORTED, reason=WHY)
TIE_TOLERANCE = 1e-5          # |y / scale - (k + 1/2)| below this: a tie within float rounding

# (tokens, n): SmolLM2's online sizes (1536 = 12 x 128, 64), the bundled model's FFN
# (640 = 20 x 32), 12 x 2^k, bare Paley (12), tiny (2); token counts that are not multiples of
# the block (64 tokens a program at n = 64, 2 at 1536, 4 at 640, 256 at 12)
SHAPES = [(300, 64), (1, 64), (5, 1536), (9, 640), (3, 768), (45, 12), (33, 2), (2, 4096)]
if on_gpu():
    SHAPES += [(4096, 1536), (36864, 64), (1000, 640), (3, 16384), (300, 12288)]


def _x(tokens, n, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed * 1000 + n)
    spread = torch.rand(tokens, 1, generator=g) * 10                   # tokens of many sizes
    return (torch.randn(tokens, n, generator=g) * spread).to(dtype)    # (tokens, n)


def assert_same_codes(x, q, s, seed=None, pack=False):
    """Scales bit for bit; codes equal except at ties within float rounding (then off by 1)."""
    qr, sr = hq.hadamard_quant_int4_reference(x.cpu(), seed, pack=pack)
    assert s.dtype == torch.float32 and q.dtype == (torch.uint8 if pack else torch.int8)
    assert torch.equal(s.cpu(), sr), f"scales differ: max rel {((s.cpu() - sr) / sr).abs().max()}"
    if pack:                                             # compare the codes themselves
        q, qr = quant.unpack_int4(q.cpu()), quant.unpack_int4(qr)
    q, qr = q.cpu(), qr.cpu()
    assert q.shape == qr.shape
    bad = q != qr
    if bad.any():
        u = hq.rotate_reference(x.cpu(), seed) / sr[..., None]         # the reference's y / scale
        tie = (u - u.floor() - 0.5).abs()
        assert float(tie[bad].max()) < TIE_TOLERANCE, "a code differs away from a tie"
        assert int((q.int() - qr.int()).abs().max()) == 1
        assert int(bad.sum()) <= max(2, q.numel() // 100_000), int(bad.sum())
    return int(bad.sum())


# ---------------------------------------------------------------------------- sizes

def test_layout_splits_sizes_as_course_lib_hadamard():
    assert {k: hq.layout(1536)[k] for k in ("P", "MM", "LOG_MM")} == {"P": 12, "MM": 128,
                                                                       "LOG_MM": 7}
    assert {k: hq.layout(640)[k] for k in ("P", "MM")} == {"P": 20, "MM": 32}
    assert {k: hq.layout(64)[k] for k in ("P", "MM", "NEG")} == {"P": 1, "MM": 64, "NEG": 0}
    # the sign pattern is paley(11)'s: bit 12 r + k set where H[r, k] = -1
    from course_lib.hadamard import paley12
    neg = hq.layout(1536)["NEG"]
    H = paley12()
    assert all(((neg >> (12 * r + k)) & 1) == (H[r, k] < 0) for r in range(12) for k in range(12))
    # blocks: about 4096 values a program, a chunk at least a warp wide
    assert (hq.block_rows(1536), hq.block_rows(64), hq.block_rows(640), hq.block_rows(12)) == (
        2, 64, 4, 256)
    assert all(1 <= hq.num_warps_for(n) <= 16 for n in (2, 12, 64, 640, 1536, 16384))


@pytest.mark.parametrize("n, match", [
    (28, "no Hadamard transform of size 28"),            # 4 x 7: no Paley split at all
    (44, "44 = 44 x 1 is not a size"),                   # Paley order 44 > 20
    (576, "12 x 12 x 4 is not a size.*fused into the weights"),   # two Paley factors
    (32768, "is not a size this kernel takes"),          # more than one program holds
    (1, "whole number >= 2"), (True, "whole number >= 2"), (64.0, "whole number >= 2")])
def test_layout_refuses_sizes_it_cannot_run_and_names_those_it_can(n, match):
    with pytest.raises(ValueError, match=match) as err:
        hq.layout(n)
    if n not in (1, True, 64.0):
        assert "1536" in str(err.value) and "12 x 2^k" in str(err.value)


# ---------------------------------------------------------------------------- numbers

@needs_kernel
@pytest.mark.parametrize("tokens, n", SHAPES)
def test_codes_and_scales_match_the_plain_torch_reference(tokens, n):
    x = _x(tokens, n).to(DEV)
    q, s = hq.hadamard_quant_int4(x)
    assert q.shape == (tokens, n) and s.shape == (tokens,)
    assert int(q.abs().max()) <= 7
    assert_same_codes(x, q, s)
    # and the codes times the scale give back the rotation, to half a step
    y = hq.rotate_reference(x.cpu())
    assert bool(((q.cpu().float() * s.cpu()[:, None] - y).abs() <= 0.5001 * s.cpu()[:, None]).all())


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens, n", [(70, 64), (5, 1536), (9, 640)])
def test_16_bit_inputs_are_rotated_in_fp32(dtype, tokens, n):
    x = _x(tokens, n, dtype, seed=1).to(DEV)
    q, s = hq.hadamard_quant_int4(x)
    assert_same_codes(x, q, s)


@needs_kernel
@pytest.mark.parametrize("n", [64, 1536])
def test_random_signs_give_online_hadamards_rotation(n):
    """seed=s rotates as course_lib.rotate.OnlineHadamard(n, s): fwht, then random_signs(n, s)."""
    x = _x(5, n, seed=2).to(DEV)
    q, s = hq.hadamard_quant_int4(x, seed=3)
    assert_same_codes(x, q, s, seed=3)
    y = OnlineHadamard(n, seed=3)(x.cpu().float())                     # (5, n)
    assert bool(((q.cpu().float() * s.cpu()[:, None] - y).abs() <= 0.5001 * s.cpu()[:, None]).all())
    plain, _ = hq.hadamard_quant_int4(x)
    flipped = random_signs(n, 3) < 0
    assert torch.equal(q.cpu()[:, flipped], -plain.cpu()[:, flipped])    # round(-v) = -round(v)
    assert torch.equal(q.cpu()[:, ~flipped], plain.cpu()[:, ~flipped])


@needs_kernel
@pytest.mark.parametrize("n", [64, 1536, 640])
def test_packed_codes_are_course_lib_pack_int4(n):
    x = _x(6, n, torch.bfloat16, seed=4).to(DEV)
    q, s = hq.hadamard_quant_int4(x)
    p, s2 = hq.hadamard_quant_int4(x, pack=True)
    assert p.dtype == torch.uint8 and p.shape == (6, n // 2) and torch.equal(s, s2)
    assert torch.equal(p.cpu(), quant.pack_int4(q.cpu()))             # element 2i: low nibble
    assert_same_codes(x, p, s2, pack=True)


@needs_kernel
def test_ties_round_half_to_even_like_course_lib_quant():
    """y with exact ties (dyadic values, n = 64: sqrt(n) = 8 divides exactly): scale 1 and
    7 / max|z| = 1/8 are exact, so the codes are course_lib.quant's: 3.5 -> 4, 2.5 -> 2."""
    y = torch.zeros(2, 64)
    y[0, :9] = torch.tensor([7.0, 3.5, -3.5, 2.5, -2.5, 0.5, -0.5, 1.5, -1.5])
    y[1, :5] = torch.tensor([3.5, 1.75, 0.25, 0.75, -1.25])            # scale 0.5: ties again
    x = fwht(y)                                                        # fwht(fwht(y)) == y here
    assert torch.equal(fwht(x), y)
    q, s = hq.hadamard_quant_int4(x.to(DEV))
    assert s.cpu().tolist() == [1.0, 0.5]
    assert q.cpu()[0, :9].tolist() == [7, 4, -4, 2, -2, 0, 0, 2, -2]
    assert q.cpu()[1, :5].tolist() == [7, 4, 0, 2, -2]
    assert torch.equal(q.cpu(), quant.quantize(y, "int4", "per_token").q)


@needs_kernel
def test_zero_rows_outliers_and_leading_dimensions():
    x = _x(2 * 3, 1536, seed=5).reshape(2, 3, 1536)                    # (B, T, F)
    x[0, 1] = 0.0                                                      # an all-zero token
    x[1, 2] = 0.01 * torch.randn(1536)
    x[1, 2, 700] = 1e4                                                 # one huge outlier
    q, s = hq.hadamard_quant_int4(x.to(DEV))
    assert q.shape == (2, 3, 1536) and s.shape == (2, 3)
    assert s.cpu()[0, 1].item() == 1.0 and not q.cpu()[0, 1].any()    # scale 1, codes 0
    assert_same_codes(x.reshape(6, 1536), q.reshape(6, 1536), s.reshape(6))
    # the rotation spreads the outlier over every channel: without it, per-token INT4 keeps
    # only the outlier (every other code 0); with it, every code is +-7 up to the noise
    plain = quant.quantize(x[1, 2], "int4", "per_token").q
    assert int((plain != 0).sum()) == 1
    assert int((q.cpu()[1, 2].abs() >= 6).sum()) > 1500


@needs_kernel
@pytest.mark.filterwarnings("ignore::RuntimeWarning")        # the interpreter's numpy on NaN
def test_nan_or_inf_makes_that_tokens_scale_nan_and_codes_zero():
    x = _x(5, 640, seed=6)
    x[1, 10] = float("nan")
    x[3, 0] = float("inf")
    q, s = hq.hadamard_quant_int4(x.to(DEV))
    s, q = s.cpu(), q.cpu()
    assert math.isnan(s[1]) and math.isnan(s[3]) and not q[1].any() and not q[3].any()
    ok = torch.tensor([0, 2, 4])
    assert_same_codes(x[ok], q[ok], s[ok])                            # the others untouched
    with pytest.raises(ValueError, match="NaN or inf"):
        hq.hadamard_quant_int4_reference(x)


@needs_kernel
def test_values_too_small_for_a_float32_scale():
    """max|y| / 7 below float32's smallest normal number: course_lib.quant refuses; the kernel
    treats the token as zero (scale 1, codes 0: an error below 1e-37)."""
    x = torch.zeros(2, 64)
    x[0, 3] = 1e-38
    q, s = hq.hadamard_quant_int4(x.to(DEV))
    assert s.cpu().tolist() == [1.0, 1.0] and not q.cpu().any()
    with pytest.raises(ValueError, match="smallest normal"):
        hq.hadamard_quant_int4_reference(x)


@needs_kernel
def test_no_tokens():
    q, s = hq.hadamard_quant_int4(torch.zeros(0, 64, device=DEV), pack=True)
    assert q.shape == (0, 32) and s.shape == (0,)
    q, s = hq.hadamard_quant_int4_reference(torch.zeros(0, 64))
    assert q.shape == (0, 64) and s.shape == (0,)


# ---------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("x, err, match", [
    (torch.zeros(2, 64, dtype=torch.float64), TypeError, "float16, bfloat16 or float32"),
    (torch.zeros(2, 64, dtype=torch.int8), TypeError, "float16, bfloat16 or float32"),
    ([[0.0] * 64], TypeError, "must be a torch.Tensor"),
    (torch.tensor(1.0), ValueError, "at least one dimension"),
    (torch.zeros(2, 100), ValueError, "no Hadamard transform of size 100"),
    (torch.zeros(2, 44), ValueError, "not a size this kernel takes")])
def test_bad_activations_are_refused_with_a_message(x, err, match):
    for fn in (hq.hadamard_quant_int4, hq.hadamard_quant_int4_reference):
        if fn is hq.hadamard_quant_int4 and not SUPPORTED:
            continue
        with pytest.raises(err, match=match):
            fn(x)


@needs_kernel
def test_bad_seed_and_pack_are_refused():
    x = torch.zeros(2, 64, device=DEV)
    for seed in (True, 1.5, "0"):
        with pytest.raises(ValueError, match="seed must be None"):
            hq.hadamard_quant_int4(x, seed=seed)
    with pytest.raises(ValueError, match="pack must be True or False"):
        hq.hadamard_quant_int4(x, pack=1)
    with pytest.raises(ValueError, match="power-of-two part of n to be at least 2"):
        hq.hadamard_quant_int4(torch.zeros(2, 12, device=DEV), pack=True)


@pytest.mark.skipif(on_gpu(), reason="checks the refusal on a machine without a GPU")
def test_benchmark_refuses_without_a_gpu():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        hq.benchmark()


def test_bytes_moved_counts_one_read_and_one_write():
    b = hq.bytes_moved(4096, 1536, torch.bfloat16)
    assert b == {"read": 4096 * 1536 * 2, "written": 4096 * 1536 + 4096 * 4,
                 "total": 4096 * 1536 * 3 + 4096 * 4}
    assert hq.bytes_moved(10, 64, torch.float32, pack=True)["written"] == 10 * 32 + 40
    with pytest.raises(TypeError, match="dtype must be one of"):
        hq.bytes_moved(1, 64, torch.float64)


@pytest.mark.skipif(not on_gpu(), reason="times the native kernel: needs a CUDA GPU")
def test_benchmark_reports_achieved_bandwidth():
    rows = hq.benchmark(shapes=((4096, 1536), (4096 * 9, 64)))
    assert len(rows) == 4
    for r in rows:
        assert r["gbps"] > 0 and r["copy_gbps"] > 0 and r["ms"] > 0
        assert r["gbps"] == round(r["bytes"]["total"] / (r["ms"] * 1e-3) / 1e9, 1)


# ---------------------------------------------------------------------------- compile check

def test_compile_jobs_are_registered_and_well_formed():
    from kernels import compile_check
    assert "kernels.hadamard_quant" in compile_check.KERNEL_MODULES
    jobs = hq.compile_jobs(90)
    assert [j.name for j in jobs] == ["hadamard_quant 1536", "hadamard_quant 1536 packed",
                                      "hadamard_quant 64 packed", "hadamard_quant 640"]
    assert all(j.default and j.min_cc == 0 for j in jobs)
    assert hq.compile_jobs(75)[0].signature["x_ptr"] == "*fp16"          # no BF16 on Turing
    every = hq.compile_jobs(90, all_configs=True)
    assert len(every) == 3 * 2 * len(jobs) and sum(j.default for j in every) == 2 * len(jobs)


def test_compiles_for_turing_ampere_ada_hopper_without_spills():
    """Triton's own ptxas compiles the default jobs for sm_75/80/89/90 (no GPU needed): every
    one fits the architecture's shared memory, with no register spills."""
    import kernels
    if not kernels.TRITON:
        pytest.skip("Triton is not installed here (or COURSE_NO_TRITON=1 blocks it)")
    code = ("import json\nfrom kernels import compile_check as cc\n"
            "bad, recs = cc.check([75, 80, 89, 90], report=True, only=['hadamard_quant'], "
            "log=lambda *a: None)\nprint('JSON' + json.dumps([bad, recs], default=str))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["COURSE_TRITON_AOT"] = "1"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=1500)
    if "No module named 'triton" in proc.stderr:
        pytest.skip("Triton (with its NVIDIA backend) is not installed here")
    import json
    line = [l for l in proc.stdout.splitlines() if l.startswith("JSON")]
    assert line, proc.stderr[-3000:]
    bad, recs = json.loads(line[0][4:])
    assert bad == 0 and len(recs) == 4 * 4
    for r in recs:
        assert r["compiled"] and r["shared_fits"], r
        assert r["local_bytes"] == 0, (r["arch"], r["name"], "spills")
        assert r["regs"] <= 255 and r["mma"] == "none", r
