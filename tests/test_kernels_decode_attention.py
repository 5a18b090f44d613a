"""Decode attention over BF16/FP8/INT8 caches against the plain-torch reference
(interpreter on CPU, native on GPU): ragged lengths, grouped-query heads, split-K."""
import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import math
import re

import pytest
import torch

from course_lib import kv
from course_lib.compare import cmp
from kernels._common import on_gpu
from kernels.decode_attention import (benchmark_rows, compile_jobs, decode_attention,
                                      decode_attention_reference, dequantize_cache,
                                      quantize_cache, split_plan, target_met)

DEV = "cuda" if on_gpu() else "cpu"
FORMATS = ["bf16", "fp8", "fp8_tensor", "int8"]
# (B, H, K, S, hd, lengths): MHA, GQA 3:1 (SmolLM2), 4:1, MQA; head dims 64, 32, 24 (not a
# power of two); lengths of 1, of exactly a block, of the whole cache, ragged
CASES = [(1, 4, 4, 20, 32, [20]),
         (3, 9, 3, 70, 64, [70, 1, 33]),
         (4, 8, 2, 48, 32, [16, 17, 48, 5]),
         (2, 4, 1, 40, 24, [40, 39])]


def _case(B, H, K, S, hd, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, hd, generator=g)
    k = torch.randn(B, K, S, hd, generator=g)
    k[..., 3] *= 8                               # a key outlier channel, as real keys have
    v = torch.randn(B, K, S, hd, generator=g)
    return q.to(DEV), k.to(DEV), v.to(DEV), torch.tensor(lengths, device=DEV)


def _naive(q, k, v, lengths):
    """Attention written out by hand, head by head (independent of both implementations)."""
    q, k, v = q.cpu(), k.cpu(), v.cpu()          # written out on the CPU, in float64
    B, H, hd = q.shape
    rep = H // k.shape[1]
    out = torch.empty(B, H, hd)
    for b in range(B):
        L = int(lengths[b])
        for h in range(H):
            s = (k[b, h // rep, :L].double() @ q[b, h].double()) / math.sqrt(hd)     # (L,)
            out[b, h] = (torch.softmax(s, 0) @ v[b, h // rep, :L].double()).float()
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}H{c[1]}K{c[2]}S{c[3]}hd{c[4]}")
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("split,dot", [(1, 0), (3, 0), (1, 1), (3, 1)])
def test_kernel_matches_reference(case, fmt, split, dot):
    if on_gpu() and dot == 1:
        dot = 2                                   # the GPU's path: tl.dot in bf16
    q, k, v, lens = _case(*case)
    cache = quantize_cache(k, v, fmt)
    expected = decode_attention_reference(q, *cache[:2], lens, *cache[2:])
    tol = (2e-2, 2e-2) if dot == 2 else (1e-4, 1e-5)
    res = cmp(fmt, expected, decode_attention(q, *cache[:2], lens, *cache[2:], split=split,
                                              dot=dot), rtol=tol[0], atol=tol[1])
    assert res, str(res)


@pytest.mark.parametrize("fmt", FORMATS)
def test_reference_is_attention_over_the_dequantized_cache(fmt):
    q, k, v, lens = _case(*CASES[1])
    cache = quantize_cache(k, v, fmt)
    kd, vd = dequantize_cache(*cache)
    assert torch.allclose(decode_attention_reference(q, *cache[:2], lens, *cache[2:]).cpu(),
                          _naive(q, kd, vd, lens), atol=1e-5)
    # and quantization error stays small: 8-bit cache vs the exact fp32 attention
    err = (_naive(q, kd, vd, lens) - _naive(q, k, v, lens)).abs().max()
    assert err < {"bf16": 0.02, "fp8": 0.2, "fp8_tensor": 0.3, "int8": 0.05}[fmt]


def test_reads_the_cache_kv_stores():
    """The kernel reads course_lib.kv's int8 codes and scales directly."""
    q, k, v, lens = _case(2, 6, 2, 30, 32, [30, 12])
    (kq, ks), (vq, vs) = kv.quantize_int8_per_token(k), kv.quantize_int8_per_token(v)
    expected = _naive(q, kv.dequantize_int8_per_token(kq, ks),
                      kv.dequantize_int8_per_token(vq, vs), lens)
    # dot=0: products summed in fp32 (exact to 1e-5) on every device; the default on a GPU,
    # tl.dot in bf16 on the tensor cores, rounds q, k, v and the weights to 8 bits of mantissa
    y = decode_attention(q, kq, vq, lens, ks, vs, dot=0)
    assert torch.allclose(y.cpu(), expected, atol=1e-5)
    y = decode_attention(q, kq, vq, lens, ks, vs)
    assert torch.allclose(y.cpu(), expected, atol=2e-2 if on_gpu() else 1e-5)


def test_block_sizes_and_half_precision_queries():
    q, k, v, lens = _case(3, 9, 3, 70, 64, [70, 1, 33])
    cache = quantize_cache(k, v, "int8")
    ref = decode_attention_reference(q, *cache[:2], lens, *cache[2:])
    for bs in (16, 32):
        assert torch.allclose(decode_attention(q, *cache[:2], lens, *cache[2:], block_s=bs,
                                               split=2, dot=0), ref, atol=1e-5)
    yh = decode_attention(q.half(), *cache[:2], lens, *cache[2:])
    # fp16 output (2**-11 relative); on a GPU the default tl.dot runs in bf16 (2**-8)
    assert yh.dtype == torch.float16
    assert torch.allclose(yh.float(), ref, atol=2e-2 if on_gpu() else 5e-3)


def test_bad_inputs_say_what_to_do():
    q, k, v, lens = _case(2, 4, 2, 10, 16, [10, 3])
    kq, vq, ks, vs = quantize_cache(k, v, "int8")
    with pytest.raises(ValueError, match="head dimension 16 but the cache 8"):
        decode_attention(q, k[..., :8], v[..., :8], lens)
    with pytest.raises(ValueError, match="lengths must lie in 1..10"):
        decode_attention(q, k, v, torch.tensor([11, 3]))
    with pytest.raises(ValueError, match="lengths must lie in 1..10"):
        decode_attention(q, k, v, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="needs k_scale and v_scale"):
        decode_attention(q, kq, vq, lens)
    with pytest.raises(ValueError, match="one per token and head"):
        decode_attention(q, kq, vq, lens, ks[:, :, :5], vs)
    with pytest.raises(TypeError, match="float8_e4m3fn or int8 cache"):
        decode_attention(q, k.to(torch.int16), v.to(torch.int16), lens)
    with pytest.raises(ValueError, match="not a multiple"):
        decode_attention(q[:, :3], k, v, lens)
    with pytest.raises(ValueError, match="takes no scales"):
        decode_attention(q, k, v, lens, ks, vs)


def test_split_plan_fills_a_132_sm_gpu(monkeypatch):
    import kernels.decode_attention as da

    monkeypatch.setattr(da, "on_gpu", lambda: True)
    monkeypatch.setattr(da, "num_sms", lambda: 132)
    assert split_plan(64, 8, 8192, 64) == 1          # 512 programs: enough
    assert split_plan(1, 8, 8192, 64) == 32          # 8 programs want 33; 8192 / (4 x 64) caps it
    assert split_plan(1, 8, 512, 64) == 2            # short context: >= 4 steps per slice


def test_benchmark_rows_without_a_gpu_are_not_measured():
    if on_gpu():
        pytest.skip("a GPU is here: the rows are measured")
    res = benchmark_rows(contexts=(1024, 32768), batches=(1, 64))
    assert res["measured"] is False and "not measured" in res["why_not"]
    assert [(r["context"], r["batch"]) for r in res["rows"]] == [(1024, 1), (1024, 64),
                                                                 (32768, 1), (32768, 64)]
    assert all(r["ms"] is None for r in res["rows"])
    assert res["target"]["met"] is None                 # not measured is not "failed"
    fake = [{"batch": 8, "context": 8192, "measured": True, "speedup_fp8": 1.5, "speedup_int8": 1.1},
            {"batch": 64, "context": 32768, "measured": True, "speedup_fp8": 1.2, "speedup_int8": 1.35},
            {"batch": 1, "context": 32768, "measured": True, "speedup_fp8": 0.9, "speedup_int8": 0.9}]
    assert target_met(fake)["met"] is True and target_met(fake)["worst"] == 1.35
    fake[1]["speedup_int8"] = 1.25
    assert target_met(fake)["met"] is False
    # bytes a step reads at batch 64, 32k: 2 x 64 x 8 x 32768 x 128 x 2 = 8.6 GB per layer
    assert res["rows"][-1]["kv_bytes_bf16"] == 2 * 64 * 8 * 32768 * 128 * 2


def test_compile_jobs_cover_every_format():
    jobs = compile_jobs(80)
    assert {j.name for j in jobs} == {"decode_attn_bf16", "decode_attn_fp8", "decode_attn_int8",
                                      "decode_attn_combine"}
    assert {j.min_cc for j in jobs if j.name == "decode_attn_fp8"} == {89}   # FP8 needs sm_89+
    assert {j.min_cc for j in jobs if j.name != "decode_attn_fp8"} == {0}
    assert compile_jobs(75)[0].signature["q_ptr"] == "*fp16"                # no BF16 on Turing
    assert len(compile_jobs(90, all_configs=True)) > len(jobs)


def test_compiles_ahead_of_time_for_turing_ampere_hopper():
    """kernels.compile_check on this kernel (registered in its KERNEL_MODULES); no GPU needed."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "kernels.compile_check", "--arch", "75", "80",
                           "90", "--only", "decode_attn"], capture_output=True, text=True,
                          timeout=900)
    out = proc.stdout + proc.stderr
    if "SKIPPED" in out:
        pytest.skip(out.strip().splitlines()[-1])
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r"sm_80 decode_attn_fp8 +refused \(expected\)", out)
    assert re.search(r"sm_90 decode_attn_fp8 +ok", out)
    assert re.search(r"sm_75 decode_attn_int8 +ok", out)
    assert "UNEXPECTED" not in out and "TOO MUCH SHARED" not in out
