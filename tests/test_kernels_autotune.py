"""How a kernel is launched: autotuned on a GPU, a fixed config with autotuning off, or the
interpreter's small config; and (on a GPU) that the autotuned kernels give right answers."""
import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import pytest
import torch

import kernels._common as common
from course_lib.compare import cmp
from kernels import fp8_w8a8, w4a16, w8a16


def test_choose_picks_tuned_fixed_or_interpreter(monkeypatch):
    cfg = w8a16._GEMV_DEFAULT
    monkeypatch.setattr(common, "on_gpu", lambda: True)
    monkeypatch.setenv("COURSE_KERNELS_AUTOTUNE", "1")
    assert common.choose("tuned", "raw", cfg, {"BLOCK_K": 32}) == ("tuned", {})
    monkeypatch.setenv("COURSE_KERNELS_AUTOTUNE", "0")
    kernel, meta = common.choose("tuned", "raw", cfg, {"BLOCK_K": 32})
    assert kernel == "raw" and meta == {"BLOCK_K": 128, "num_warps": 4, "num_stages": 3}
    monkeypatch.setattr(common, "on_gpu", lambda: False)
    assert common.choose("tuned", "raw", cfg, {"BLOCK_K": 32}) == ("raw", {"BLOCK_K": 32})


@pytest.mark.parametrize("mod", [w8a16, w4a16, fp8_w8a8])
def test_fixed_gpu_configs_are_in_the_autotune_lists(mod):
    for name in ("_GEMV_DEFAULT", "_GEMM_DEFAULT"):
        if not hasattr(mod, name):
            continue
        d = getattr(mod, name)
        configs = getattr(mod, name.replace("DEFAULT", "CONFIGS"))
        assert any(c.kwargs == d.kwargs and c.num_warps == d.num_warps
                   and c.num_stages == d.num_stages for c in configs), f"{mod.__name__}.{name}"


@pytest.mark.skipif(not common.on_gpu(), reason="autotuning needs a GPU")
@pytest.mark.parametrize("M", [1, 16])
def test_autotuned_kernels_match_references(M, monkeypatch):
    monkeypatch.setenv("COURSE_KERNELS_AUTOTUNE", "1")
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(3000, 4096, device="cuda", generator=g) / 64           # (N, K)
    x = torch.randn(M, 4096, device="cuda", generator=g).to(torch.bfloat16)
    w_q, s = w8a16.quantize_weight(w)
    assert cmp("w8a16", w8a16.w8a16_reference(x, w_q, s), w8a16.w8a16_linear(x, w_q, s),
               rtol=1.6e-2, atol=1e-1)
    wt = w4a16.quantize_weight(w, 128)
    assert cmp("w4a16", w4a16.w4a16_reference(x, wt), w4a16.w4a16_linear(x, wt),
               rtol=1.6e-2, atol=1e-1)
    if fp8_w8a8.fp8_supported()[0]:
        wq8, ws8 = fp8_w8a8.quantize_weight(w, fast=True)
        assert cmp("fp8", fp8_w8a8.fp8_w8a8_reference(x, wq8, ws8),
                   fp8_w8a8.fp8_w8a8_linear(x, wq8, ws8), rtol=1.6e-2, atol=1e-1)
