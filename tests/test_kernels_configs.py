"""Every autotune configuration, the one-program small batch, and the accumulator form of
tl.dot: checks that hold on a CPU (the interpreter) and, unchanged, natively on a GPU.

On a CPU the interpreter ignores num_warps and num_stages, so each *distinct* block
configuration runs once on small shapes; on a GPU every configuration of every list runs
(tests/gpu_check.sh runs this file natively).
"""
import ast
import importlib
import inspect

import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import pytest
import torch

from course_lib.compare import cmp
from kernels import compile_check, fp8_w8a8, w4a16, w8a16
from kernels._common import GEMV_MAX_M, distinct_configs, on_gpu

DEV = "cuda" if on_gpu() else "cpu"


def _configs(configs):
    return list(configs) if on_gpu() else distinct_configs(configs)


def _ids(configs):
    return [f"{c.kwargs}-w{c.num_warps}s{c.num_stages}" for c in configs]


def _weights(N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, K, generator=g) / K ** 0.5                    # (N, K)


def _x(M, K, seed=1):
    return torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).to(DEV)


W8_GEMV, W8_GEMM = _configs(w8a16._GEMV_CONFIGS), _configs(w8a16._GEMM_CONFIGS)
W4_GEMV, W4_GEMM = _configs(w4a16._GEMV_CONFIGS), _configs(w4a16._GEMM_CONFIGS)
W4_DOT = _configs(w4a16._DOT_CONFIGS)
FP8_GEMM = _configs(fp8_w8a8._GEMM_CONFIGS)


def test_interpreter_covers_every_block_configuration():
    # the distinct block shapes are few: the CPU runs all of them below
    assert len(distinct_configs(w8a16._GEMV_CONFIGS)) == 3
    assert len(distinct_configs(w4a16._GEMV_CONFIGS)) == 3
    for mod in (w8a16, w4a16, fp8_w8a8):
        for d in distinct_configs(mod._GEMM_CONFIGS):
            assert any(c.kwargs == d.kwargs for c in mod._GEMM_CONFIGS)


@pytest.mark.parametrize("cfg", W8_GEMV, ids=_ids(W8_GEMV))
@pytest.mark.parametrize("M,split_k", [(1, 1), (5, 2)])
def test_w8a16_every_gemv_config(cfg, M, split_k):
    w_q, s = w8a16.quantize_weight(_weights(40, 300))
    x = _x(M, 300)
    y = w8a16.w8a16_linear(x, w_q.to(DEV), s.to(DEV), config=cfg, split_k=split_k)
    assert cmp("w8a16", w8a16.w8a16_reference(x, w_q.to(DEV), s.to(DEV)), y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cfg", W8_GEMM, ids=_ids(W8_GEMM))
def test_w8a16_every_gemm_config(cfg):
    w_q, s = w8a16.quantize_weight(_weights(40, 96))
    x = _x(20, 96)
    y = w8a16.w8a16_linear(x, w_q.to(DEV), s.to(DEV), config=cfg)
    assert cmp("w8a16", w8a16.w8a16_reference(x, w_q.to(DEV), s.to(DEV)), y, rtol=1e-4, atol=1e-4)


def _w4(N, K, G, symmetric):
    wt = w4a16.quantize_weight(_weights(N, K), G, symmetric)
    to = lambda t: None if t is None else t.to(DEV)  # noqa: E731
    return w4a16.W4A16Weight(to(wt.packed), to(wt.scale), to(wt.zero), G)


@pytest.mark.parametrize("cfg", W4_GEMV, ids=_ids(W4_GEMV))
@pytest.mark.parametrize("M,G,symmetric,split_k", [(1, 32, True, 1), (6, 64, False, 2),
                                                   (3, 128, True, 1)])
def test_w4a16_every_gemv_config(cfg, M, G, symmetric, split_k):
    wt = _w4(24, 512, G, symmetric)
    x = _x(M, 512)
    y = w4a16.w4a16_linear(x, wt, config=cfg, split_k=split_k)
    assert cmp("w4a16", w4a16.w4a16_reference(x, wt), y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cfg", W4_GEMM, ids=_ids(W4_GEMM))
@pytest.mark.parametrize("symmetric", [True, False])
def test_w4a16_every_gemm_config(cfg, symmetric):
    wt = _w4(40, 128, 64, symmetric)
    x = _x(20, 128)
    y = w4a16.w4a16_linear(x, wt, config=cfg, force_gemm=True)
    assert cmp("w4a16", w4a16.w4a16_reference(x, wt), y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cfg", W4_DOT, ids=_ids(W4_DOT))
@pytest.mark.parametrize("M,symmetric,split_k", [(1, True, 1), (16, False, 2)])
def test_w4a16_every_dot_config(cfg, M, symmetric, split_k):
    wt = _w4(40, 256, 64, symmetric)
    x = _x(M, 256)
    y = w4a16.w4a16_linear(x, wt, config=cfg, split_k=split_k)
    assert cmp("w4a16", w4a16.w4a16_reference(x, wt), y, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not fp8_w8a8.fp8_supported()[0], reason=fp8_w8a8.fp8_supported()[1])
@pytest.mark.parametrize("cfg", FP8_GEMM, ids=_ids(FP8_GEMM))
def test_fp8_every_gemm_config(cfg):
    w_q, ws = fp8_w8a8.quantize_weight(_weights(40, 256))
    x = _x(20, 256)
    xq, xs = fp8_w8a8.quantize_activations(x.cpu())
    y = fp8_w8a8.fp8_gemm(xq.to(DEV), xs.to(DEV), w_q.to(DEV), ws.to(DEV), torch.float32,
                          config=cfg)
    exact = (xq.float() @ w_q.float().T) * xs[:, None] * ws[None, :]   # (M, N)
    bound = (xq.float().abs() @ w_q.float().abs().T) * xs[:, None] * ws[None, :]
    assert torch.all((y.cpu() - exact).abs() <= 2 ** -13 * bound + 1e-6)


# ---- one program for the whole small batch ------------------------------------------------

class _Recorder:
    """Stands in for a kernel: records each launch grid, then launches the real kernel."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("mod,name", [(w8a16, "w8a16_gemv_kernel"), (w4a16, "w4a16_gemv_kernel")])
@pytest.mark.parametrize("M", [1, 4, GEMV_MAX_M])
def test_one_program_covers_the_whole_small_batch(mod, name, M, monkeypatch):
    """The GEMV grid has no token axis: (blocks of N, K splits). A grid of (M, ...) would
    read and dequantize every weight once per token."""
    real_choose = mod.choose
    rec = {}

    def choose(tuned, raw, *a, **kw):
        kernel, meta = real_choose(tuned, raw, *a, **kw)
        rec["r"] = _Recorder(kernel)
        return rec["r"], meta

    monkeypatch.setattr(mod, "choose", choose)
    N, K = 40, 256
    if mod is w8a16:
        w_q, s = w8a16.quantize_weight(_weights(N, K))
        x = _x(M, K)
        y = w8a16.w8a16_linear(x, w_q.to(DEV), s.to(DEV), block_n=16, kernel="gemv")
        ref = w8a16.w8a16_reference(x, w_q.to(DEV), s.to(DEV))
    else:
        wt = _w4(N, K, 32, True)
        x = _x(M, K)
        y = w4a16.w4a16_linear(x, wt, block_n=16, kernel="gemv")
        ref = w4a16.w4a16_reference(x, wt)
    assert rec["r"].kernel is getattr(mod, name) or getattr(rec["r"].kernel, "fn", None) is getattr(mod, name)
    assert rec["r"].grids == [(3, 1)]                    # ceil(40 / 16) blocks, no split
    assert cmp(name, ref, y, rtol=1e-4, atol=1e-4)


# ---- the accumulator form of tl.dot ------------------------------------------------------

def _dot_calls(module):
    tree = ast.parse(inspect.getsource(module))
    calls, aug = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "dot" \
                and getattr(node.func.value, "id", None) == "tl":
            calls.append(node)
        if isinstance(node, ast.AugAssign) and isinstance(node.value, ast.Call) \
                and getattr(node.value.func, "attr", None) == "dot":
            aug.append(node)
    return calls, aug


@pytest.mark.parametrize("name", compile_check.KERNEL_MODULES)
def test_every_tl_dot_uses_the_accumulator_form(name):
    """acc = tl.dot(a, b, acc), never acc += tl.dot(a, b): on Hopper the second becomes a
    zero-initialized wgmma plus a separate addition every K step."""
    module = importlib.import_module(name)
    calls, aug = _dot_calls(module)
    assert not aug, f"{name}: `+= tl.dot(...)` at line(s) {[n.lineno for n in aug]}"
    lines, first = inspect.getsourcelines(module)
    for c in calls:
        fresh = "# fresh product" in lines[c.lineno - 1]   # e.g. attention scores q @ k^T
        assert fresh or len(c.args) >= 3 or any(k.arg == "acc" for k in c.keywords), \
            f"{name}:{c.lineno}: tl.dot without an accumulator argument"
