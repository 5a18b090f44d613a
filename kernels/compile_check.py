"""Compile every course kernel for real NVIDIA GPUs, without a GPU (lesson 09's kernels).

    python -m kernels.compile_check                 # Hopper (sm_90), one config per kernel
    python -m kernels.compile_check --arch 80 89 90 --all-configs   # every autotune config

The Triton interpreter checks the kernels' *numbers* on a CPU, but it accepts things a
GPU compiler rejects (shapes, dtypes, FP8 on an Ampere GPU). Triton can compile ahead of
time for a chosen GPU architecture with the ``ptxas`` that ships in its wheel, so this
checks the native path on a machine that has no GPU. It runs in its own process with
``COURSE_TRITON_AOT=1`` (it restarts itself that way), which keeps ``kernels`` out of
interpreter mode; ``tests/test_kernels_compile.py`` starts it.
Exit code 0 when everything expected to compile does; FP8 kernels are expected to fail
below compute capability 8.9, which the wrappers refuse anyway.
"""
from __future__ import annotations

import argparse
import os
import sys


def _reexec_for_aot(argv) -> None:
    """Restart this module with COURSE_TRITON_AOT=1 and without TRITON_INTERPRET."""
    if os.environ.get("COURSE_TRITON_AOT") == "1" and os.environ.get("TRITON_INTERPRET") != "1":
        return
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["COURSE_TRITON_AOT"] = "1"
    os.execve(sys.executable, [sys.executable, "-m", "kernels.compile_check", *argv], env)


def _jobs(arch: int, all_configs: bool):
    """(name, kernel, signature, constexprs, num_warps, num_stages, must_compile) tuples."""
    from kernels import fp8_w8a8, w4a16, w8a16

    pick = (lambda cfgs: cfgs) if all_configs else (lambda cfgs: cfgs[-1:])
    I = "i32"
    for act in (["*bf16", "*fp16", "*fp32"] if all_configs else ["*bf16"]):
        sig = dict(x_ptr=act, w_ptr="*i8", s_ptr="*fp32", y_ptr=act, M=I, N=I, K=I,
                   stride_xm=I, stride_wn=I, stride_ym=I)
        for cfg in pick(w8a16._GEMV_CONFIGS):
            for sk in (1, 2):
                yield ("w8a16_gemv", w8a16.w8a16_gemv_kernel, dict(sig, y_ptr="*fp32" if sk > 1 else act),
                       dict(BLOCK_N=32, SPLIT_K=sk, **cfg.kwargs), cfg.num_warps, cfg.num_stages, True)
        for cfg in pick(w8a16._GEMM_CONFIGS):
            yield ("w8a16_gemm", w8a16.w8a16_gemm_kernel, sig,
                   dict(DOT_FP32=act == "*fp32", **cfg.kwargs), cfg.num_warps, cfg.num_stages, True)
        for group in ((32, 64, 128) if all_configs else (128,)):
            for has_zero in (False, True):
                sig = dict(x_ptr=act, p_ptr="*u8", s_ptr="*fp16", z_ptr="*i32" if has_zero else "*fp32",
                           y_ptr=act, M=I, N=I, K=I, stride_xm=I, stride_pn=I, stride_sn=I, stride_ym=I)
                for cfg in pick(w4a16._GEMV_CONFIGS):
                    yield ("w4a16_gemv", w4a16.w4a16_gemv_kernel, sig,
                           dict(GROUP=group, BLOCK_N=16, SPLIT_K=1, HAS_ZERO=has_zero, **cfg.kwargs),
                           cfg.num_warps, cfg.num_stages, True)
                for defer in (False, True):
                    yield ("w4a16_gemv split-K", w4a16.w4a16_gemv_kernel, dict(sig, y_ptr="*fp32"),
                           dict(GROUP=group, BLOCK_N=8, SPLIT_K=4, HAS_ZERO=has_zero, GPI=2,
                                DEFER_SUM=defer), 4, 3, True)
                for cfg in pick(w4a16._GEMM_CONFIGS):
                    yield ("w4a16_gemm", w4a16.w4a16_gemm_kernel, sig,
                           dict(GROUP=group, HAS_ZERO=has_zero, DOT_FP32=act == "*fp32", **cfg.kwargs),
                           cfg.num_warps, cfg.num_stages, True)
        fp8_ok = arch >= 89
        yield ("quantize_rows_fp8", fp8_w8a8.quantize_rows_fp8_kernel,
               dict(x_ptr=act, xq_ptr="*fp8e4nv", xs_ptr="*fp32", K=I, stride_xm=I, stride_qm=I),
               dict(BLOCK_K=1024, ROUND_FIRST=False), 4, 3, fp8_ok)
        for cfg in pick(fp8_w8a8._GEMM_CONFIGS):
            yield ("fp8_gemm", fp8_w8a8.fp8_gemm_kernel,
                   dict(a_ptr="*fp8e4nv", as_ptr="*fp32", b_ptr="*fp8e4nv", bs_ptr="*fp32", y_ptr=act,
                        M=I, N=I, K=I, stride_am=I, stride_bn=I, stride_ym=I),
                   dict(cfg.kwargs), cfg.num_warps, cfg.num_stages, fp8_ok)


def check(archs=(90,), all_configs: bool = False, log=print) -> int:
    """Compile the kernels for each architecture; return the number of unexpected results."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    bad = 0
    for arch in archs:
        for name, fn, sig, consts, warps, stages, must in _jobs(arch, all_configs):
            # as a real launch with aligned pointers and sizes/strides divisible by 16 would
            # specialize (vectorized loads), M excepted (a batch of 1)
            attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(sig) if n != "M"}
            src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}},
                            constexprs=consts, attrs=attrs)
            try:
                triton.compile(src, target=GPUTarget("cuda", arch, 32),
                               options={"num_warps": warps, "num_stages": stages})
                ok, why = True, ""
            except Exception as err:  # noqa: BLE001  (reported, and counted when unexpected)
                ok, why = False, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            expected = ok == must
            bad += not expected
            verdict = ("ok" if ok else "refused (expected)") if expected else "UNEXPECTED"
            log(f"sm_{arch} {name:20s} {verdict:18s} {consts} warps={warps} stages={stages} {why}")
    return bad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", type=int, nargs="+", default=[90], help="e.g. 80 89 90")
    p.add_argument("--all-configs", action="store_true", help="every autotune config and dtype")
    args = p.parse_args(argv)
    _reexec_for_aot(sys.argv[1:] if argv is None else list(argv))
    import kernels

    assert not kernels.INTERPRET, "compile_check needs COURSE_TRITON_AOT=1"
    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        print("SKIPPED: this triton build has no NVIDIA backend")
        return 0
    bad = check(args.arch, args.all_configs)
    print(f"{bad} unexpected result(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
