"""What a user would run instead of the course's kernels: one part of the benchmark
``python -m kernels.bench`` (lessons 09-10).

- on a CPU (``cpu_backends``): fp32 ``F.linear`` (the baseline), bf16, and torch's weight-only
  CPU kernels ``_weight_int8pack_mm`` and ``_weight_int4pack_mm_for_cpu``, fed the course's own
  codes (``int4pack_params`` maps W4A16 onto torch's int4 convention exactly);
- on a GPU (``peer_backends``): torch's int4 tinygemm, gpt-fast-style int8 weight-only
  compiled with gpt-fast's settings, row-wise FP8 ``torch._scaled_mm``, and gemlite when
  ``make gpu-bundle`` put it in ``third_party/``.

Each is a ``kernels._common.Backend``; private torch ops change between releases, so each is
probed before use (``usable_backends``) and left out with a note when it fails.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import kernels
from course_lib.paths import ROOT
from kernels._common import Backend
from kernels.bench_layers import usable_backends


# ---------------------------------------------------- on a CPU: torch's weight-only kernels

def _cpu_int8_prepare(w):
    from kernels.w8a16 import quantize_weight

    q, s = quantize_weight(w)
    return q.contiguous(), s.to(torch.bfloat16)   # bf16 x and scales: its fast path


def int4pack_params(wt) -> tuple[torch.Tensor, torch.Tensor]:
    """The course's W4A16 weight in torch's int4 kernels' terms (tinygemm convention).

    torch's ``_weight_int4pack_mm`` (CUDA) and ``_weight_int4pack_mm_for_cpu`` compute
    w = (u - 8) * scale + zero with unsigned codes u in 0..15 and (scale, zero) per group
    and output row. The course stores w = (q - z) * s (z = 0 with signed codes q in -8..7):
    u = q + 8 and zero = 0 when symmetric; u = q and zero = (8 - z) * s with zero points.
    Returns (u (N, K) int32, scales_and_zeros (K/G, N, 2) fp32); exact up to the dtype the
    caller casts them to.
    """
    from course_lib import quant

    signed = wt.zero is None
    q = quant.unpack_int4(wt.packed, signed=signed).to(torch.int32)     # (N, K)
    u = q + 8 if signed else q                                          # (N, K) 0..15
    s = wt.scale.float()                                                # (N, K/G)
    zero = torch.zeros_like(s) if signed else (8 - wt.zero.float()) * s  # (N, K/G)
    return u.contiguous(), torch.stack([s.T, zero.T], dim=-1).contiguous()   # (K/G, N, 2)


def _cpu_int4_prepare(w, group_size=128):
    """torch's CPU int4 layout from the course's own W4A16 codes (``int4pack_params``)."""
    from kernels.w4a16 import quantize_weight

    u, sz = int4pack_params(quantize_weight(w.float(), group_size))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u, 1)
    return packed, sz.to(torch.bfloat16), group_size


def cpu_backends(probe: bool = True, log=print) -> list[Backend]:
    """fp32 (baseline), bf16, and torch's weight-only int8 and int4 CPU kernels.

    The two weight-only kernels are private torch ops that change between releases: with
    ``probe`` each backend is first tried on a small layer against the fp32 result, and one
    that fails or disagrees is left out with a note instead of stopping the lesson.
    """
    backends = [
        Backend("fp32", lambda w: w.float().contiguous(), lambda x, w: F.linear(x, w),
                torch.float32, 32, None, baseline=True, device="cpu"),
        Backend("bf16", lambda w: w.to(torch.bfloat16).contiguous(), lambda x, w: F.linear(x, w),
                torch.bfloat16, 16, None, device="cpu"),
        Backend("int8 (_weight_int8pack_mm)", _cpu_int8_prepare,
                lambda x, st: torch.ops.aten._weight_int8pack_mm(x, st[0], st[1]),
                torch.bfloat16, 8, "per_channel", device="cpu"),
        Backend("int4 g128 (_weight_int4pack_mm_for_cpu)", _cpu_int4_prepare,
                lambda x, st: torch.ops.aten._weight_int4pack_mm_for_cpu(x, st[0], st[2], st[1]),
                torch.bfloat16, 4, 128, device="cpu"),
    ]
    return usable_backends(backends, log) if probe else backends


# --------------------------------------------------------- on a GPU: what a user would pick

def _cuda_int4_prepare(w, group_size=128):
    """torch's CUDA int4 (tinygemm) layout: two codes a byte, high nibble first, then
    ``_convert_weight_to_int4pack`` with 8 inner k-tiles (what gpt-fast and torchao use)."""
    from kernels.w4a16 import quantize_weight

    u, sz = int4pack_params(quantize_weight(w.float(), group_size))
    u8 = (u[:, ::2] << 4 | u[:, 1::2]).to(torch.uint8)                   # (N, K/2)
    packed = torch.ops.aten._convert_weight_to_int4pack(u8.contiguous(), 8)
    return packed, sz.to(w.dtype if w.dtype != torch.float32 else torch.bfloat16), group_size


def _int8_weight_only_prepare(w):
    from kernels.w8a16 import quantize_weight

    q, s = quantize_weight(w)
    return q.contiguous(), s.to(torch.bfloat16)


def _int8_weight_only(x, q, s):
    """gpt-fast's int8 weight-only linear: convert W to x's dtype, matmul, scale the rows."""
    return F.linear(x, q.to(x.dtype)) * s.to(x.dtype)


def _fp8_rowwise_prepare(w):
    from kernels.fp8_w8a8 import quantize_weight

    q, s = quantize_weight(w, fast=True)
    return q.contiguous(), s.float().reshape(1, -1)                     # (N, K), (1, N)


def _fp8_quantize_rows(x):
    """Per-token FP8 of x padded to a multiple of 16 rows (``_scaled_mm`` needs that)."""
    from kernels.fp8_w8a8 import FP8_DTYPE, FP8_MAX

    pad = (-x.shape[0]) % 16
    xp = F.pad(x, (0, 0, 0, pad)) if pad else x                         # (M + pad, K)
    amax = xp.float().abs().amax(dim=1, keepdim=True)                   # (M + pad, 1)
    xs = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (xp.float() / xs).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), xs


def _fp8_rowwise(x, st, quantize=_fp8_quantize_rows):
    """torch._scaled_mm with per-token and per-channel scales (what vLLM-style FP8 does);
    its operands need multiples of 16 rows, so a decode batch is padded (cost included).
    ``quantize``: the activation quantization (eager, or ``torch.compile``d into one kernel)."""
    q, ws = st
    xq, xs = quantize(x)
    y = torch._scaled_mm(xq, q.t(), scale_a=xs, scale_b=ws, out_dtype=x.dtype)
    return y[:x.shape[0]]


# gpt-fast's inductor settings (generate.py): coordinate-descent tuning of the generated
# kernels; compiled with fullgraph and no dynamic shapes
GPT_FAST_INDUCTOR = {"coordinate_descent_tuning": True, "fx_graph_cache": True}


def compiled_kernel_count(fn, *args) -> int | None:
    """Kernels inductor generated for one compiled call of ``fn`` (1 = fully fused), or
    None when this torch does not say."""
    try:
        from torch._inductor import metrics
    except ImportError:
        return None
    metrics.reset()
    fn(*args)
    return getattr(metrics, "generated_kernel_count", None)


def _gpt_fast_int8():
    """The gpt-fast int8 weight-only peer: compiled with gpt-fast's settings, and checked
    on a small layer that inductor fused it into one kernel; the name says which."""
    import torch._inductor.config as ic

    for key, value in GPT_FAST_INDUCTOR.items():
        if hasattr(ic, key):
            setattr(ic, key, value)
    if hasattr(ic, "triton") and hasattr(ic.triton, "unique_kernel_names"):
        ic.triton.unique_kernel_names = True
    compiled = torch.compile(_int8_weight_only, dynamic=False, fullgraph=True)
    name = "int8 wo (torch.compile, gpt-fast settings)"
    if torch.cuda.is_available():
        q = torch.randint(-127, 128, (256, 512), dtype=torch.int8, device="cuda")
        s = torch.rand(256, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)
        n = compiled_kernel_count(compiled, x, q, s)
        name += "" if n == 1 else f" [not fused: {n} kernels]"
    return name, compiled


def peer_backends(act_dtype: torch.dtype = torch.bfloat16, with_fp8: bool = True) -> list[Backend]:
    """What a user would run instead of the course's kernels (GPU benchmark, lesson 10):
    torch's own int4 kernel (tinygemm ``_weight_int4pack_mm``, the course's codes mapped
    exactly by ``int4pack_params``), gpt-fast-style int8 weight-only (``torch.compile``
    with gpt-fast's settings, labelled unfused when inductor did not fuse it), with FP8
    maths ``torch._scaled_mm`` row-wise FP8 with its activation quantization compiled, and
    gemlite (W4A16 g128) when ``make gpu-bundle`` put it in ``third_party/``. Each is
    probed before use and left out with a note when this torch or GPU cannot run it."""
    name, compiled = _gpt_fast_int8()
    out = [Backend("int4 g128 (torch _weight_int4pack_mm)", _cuda_int4_prepare,
                   lambda x, st: torch.ops.aten._weight_int4pack_mm(x, st[0], st[2], st[1]),
                   act_dtype, 4, 128),
           Backend(name, _int8_weight_only_prepare, lambda x, st: compiled(x, *st),
                   act_dtype, 8, "per_channel")]
    if with_fp8:
        quant = torch.compile(_fp8_quantize_rows, dynamic=False)
        out.append(Backend("fp8 rowwise (_scaled_mm, compiled quantization)",
                           _fp8_rowwise_prepare, lambda x, st: _fp8_rowwise(x, st, quant),
                           act_dtype, 8, "per_channel"))
    out += gemlite_backends(act_dtype)
    return out


GEMLITE_DIR = ROOT / "third_party" / "gemlite"   # ``make gpu-bundle`` (git-ignored)


def gemlite_backends(act_dtype: torch.dtype = torch.bfloat16) -> list[Backend]:
    """gemlite W4A16 g128 when its bundled copy is there and a GPU is (its import touches
    CUDA: never on a CPU). The course's codes map exactly: w = (u - zero) * scale with
    u = q + 8 and zero = 8 (symmetric)."""
    if not (torch.cuda.is_available() and not kernels.INTERPRET and GEMLITE_DIR.is_dir()):
        return []
    if str(GEMLITE_DIR) not in sys.path:
        sys.path.insert(0, str(GEMLITE_DIR))
    try:
        from gemlite.core import DType, GemLiteLinear
    except Exception as e:  # noqa: BLE001  (an optional peer: say why, go on)
        print(f"  gemlite not usable: {type(e).__name__}: {e}")
        return []

    def prepare(w, G=128):
        from course_lib import quant
        from kernels.w4a16 import quantize_weight

        wt = quantize_weight(w.float(), G)
        u = (quant.unpack_int4(wt.packed, signed=True).to(torch.int16) + 8).to(torch.uint8)
        N, K = u.shape
        dt = DType.BF16 if act_dtype == torch.bfloat16 else DType.FP16
        layer = GemLiteLinear(W_nbits=4, group_size=G, in_features=K, out_features=N,
                              input_dtype=dt, output_dtype=dt)
        s = wt.scale.to(act_dtype)
        layer.pack(u.to(w.device), s.to(w.device), torch.full_like(s, 8).to(w.device), None)
        return layer

    return [Backend("int4 g128 (gemlite)", prepare, lambda x, layer: layer(x), act_dtype, 4, 128)]
