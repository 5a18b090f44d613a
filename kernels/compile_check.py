"""Compile every course kernel for real NVIDIA GPUs, without a GPU (lessons 09-10).

    python -m kernels.compile_check                        # every architecture, default configs
    python -m kernels.compile_check --arch 90 --report     # + instructions per weight byte
    python -m kernels.compile_check --arch 80 89 90 --all-configs   # every autotune config
                                                                    # (many minutes)

The Triton interpreter checks the kernels' *numbers* on a CPU, but it accepts things a
GPU compiler rejects (shapes, dtypes, FP8 on an Ampere GPU) and says nothing about speed.
Triton compiles ahead of time for a chosen GPU architecture with the ``ptxas`` in its
wheel, so this checks the native path on a machine that has no GPU, and reads the
compiled code:

* **shared memory** of each configuration against the architecture's limit (a tile that
  does not fit compiles fine and fails only at launch; the autotuner skips such configs,
  but a default config, used with autotuning off, must fit everywhere);
* **instructions per weight byte**: PTX instructions in the kernel's main loop, times the
  threads of a program, divided by the weight bytes one trip of the loop reads. A GPU
  issues about 10 of them (lane-instructions) per byte an H100 streams from memory
  (``issue_budget``): a kernel above that is instruction-bound, not memory-bound;
  Int-to-float conversions (``cvt.rn.f32.s32``) are counted apart: a GPU issues them at
  a fraction of the FP32 rate (16 against 128 per clock and SM on Hopper and Ampere);
* **the pipes** (``pipe_report``): the SASS main loop's instructions sorted by the pipe
  that executes them (``kernels.pipes``, from Nsight Compute's pipeline descriptions and
  NVIDIA's forum answers: LOP3/SHF/IADD3/PRMT on the 64-lane ALU pipe, IMAD on the FMA pipe
  (fmaheavy), FP32 and, from sm_86, packed FP16 on the FMA pipes, conversions on the XU;
  tensor-core, memory and control instructions cost only their issue slot), per weight
  byte, and read against ``REPORT_GPU[arch]``: an SM issues 128 lane-instructions a clock
  but runs ALU ones at 64, so the dequantization's LOP3/SHF cost twice their issue slot.
  The report gives each limit's cost, the pipe-weighted cost (the largest), the bottleneck
  and the share of read bandwidth it allows;
* **matrix instruction**: which tensor-core instruction ``tl.dot`` became (``wgmma`` with
  e4m3 operands is FP8 maths on Hopper; ``mma.sync`` with f16 operands is not);
* **registers and spills** (``cuobjdump --dump-resource-usage``; spills go to local memory).

It runs in its own process with ``COURSE_TRITON_AOT=1`` (it restarts itself that way),
which keeps ``kernels`` out of interpreter mode; ``tests/test_kernels_compile.py`` starts it.
Exit code 0 when everything expected to compile does, and every default config fits.
FP8 kernels are expected to fail below compute capability 8.9 (the wrappers refuse there).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter

# One line per kernel file. Each has ``compile_jobs(arch, all_configs) -> [CompileJob]``.
KERNEL_MODULES = [
    "kernels.w8a16",
    "kernels.w4a16",
    "kernels.fp8_w8a8",
    "kernels.w8a8_int8",
    "kernels.decode_attention",
    "kernels.hadamard_quant",
]

# Turing (T4), Ampere (A100; A10/RTX 30), Ada (L4/RTX 40), Hopper, consumer Blackwell (RTX 50)
ARCHS = (75, 80, 86, 89, 90, 120)

# Shared memory one thread block may use (the opt-in maximum), in bytes. Source: CUDA C++
# Programming Guide, "Technical Specifications per Compute Capability".
SHARED_LIMIT = {75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024, 89: 99 * 1024,
                90: 227 * 1024, 100: 227 * 1024, 120: 99 * 1024}


def issue_budget(bandwidth_tbps: float = 3.35, sms: int = 132, lanes_per_sm: int = 128,
                 clock_ghz: float = 1.98) -> float:
    """Lane-instructions a GPU can issue per byte it reads at full bandwidth.

    Defaults: an H100 SXM (132 SMs, 4 schedulers x 32 lanes each, 1.98 GHz boost, 3.35
    TB/s) -> about 10. A kernel that needs more per weight byte cannot reach bandwidth.
    """
    return sms * lanes_per_sm * clock_ghz * 1e9 / (bandwidth_tbps * 1e12)


def _reexec_for_aot(argv) -> None:
    """Restart this module with COURSE_TRITON_AOT=1 and without TRITON_INTERPRET."""
    if os.environ.get("COURSE_TRITON_AOT") == "1" and os.environ.get("TRITON_INTERPRET") != "1":
        return
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["COURSE_TRITON_AOT"] = "1"
    os.execve(sys.executable, [sys.executable, "-m", "kernels.compile_check", *argv], env)


def jobs_for(arch: int, all_configs: bool = False, only=None):
    """Every registered kernel file's CompileJobs for one architecture."""
    out = []
    for name in KERNEL_MODULES:
        mod = importlib.import_module(name)
        for job in mod.compile_jobs(arch, all_configs):
            if only is None or any(o in job.name for o in only):
                out.append(job)
    return out


# ---------------------------------------------------------------------------- reading PTX

def _instructions(lines) -> list[str]:
    """PTX instruction lines (no labels, directives, comments or braces), predicates dropped."""
    out = []
    for x in lines:
        x = x.strip()
        if not x or x.startswith(("//", ".", "$", "{", "}")) or not x.endswith(";"):
            continue
        out.append(re.sub(r"^@!?%p\d+\s+", "", x))
    return out


def main_loop(ptx: str) -> list[str] | None:
    """The PTX instructions of the kernel's main loop: the innermost loop that loads from
    global memory (LLVM marks loop headers "Loop Header"). None if there is none."""
    lines = ptx.splitlines()
    best = None
    for i, line in enumerate(lines):
        m = re.match(r"^(\$L__BB\d+_\d+):.*Loop Header", line)
        if not m:
            continue
        pat = re.compile(r"bra(\.uni)?\s+" + re.escape(m.group(1)) + ";")
        ends = [j for j in range(i, len(lines)) if pat.search(lines[j])]
        if not ends:
            continue
        body = _instructions(lines[i + 1:ends[-1] + 1])
        loads = ("ld.global", "cp.async.ca", "cp.async.cg", "cp.async.bulk")
        if any(x.startswith(loads) for x in body) and (best is None or len(body) < len(best)):
            best = body
    return best


def mma_kind(ptx: str) -> str:
    """Which matrix instruction the kernel uses: 'wgmma e4m3', 'mma.sync bf16', or 'none'."""
    m = re.search(r"wgmma\.mma_async\S*?\.(e4m3|e5m2|bf16|f16|tf32|s8)", ptx)
    if m:
        return f"wgmma {m.group(1)}"
    m = re.search(r"mma\.sync\.aligned\.m\d+n\d+k\d+\S*?\.(e4m3|e5m2|bf16|f16|tf32|s8)", ptx)
    if m:
        return f"mma.sync {m.group(1)}"
    return "none"


def _cuobjdump() -> str | None:
    import triton
    cand = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return cand if os.path.exists(cand) else shutil.which("cuobjdump")


def sass_main_loop(cubin: bytes) -> list[str] | None:
    """The machine instructions (SASS) of the main loop: the innermost backward branch
    whose body loads from global memory. ptxas fuses and removes PTX instructions (an AND
    and an OR become one LOP3; the movs of masked loads disappear), so this is closer to
    what the GPU issues than the PTX count. None when cuobjdump is missing."""
    tool = _cuobjdump()
    if not tool:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    ins, index = [], {}
    for line in out.splitlines():
        m = re.match(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            index[int(m.group(1), 16)] = len(ins)
            ins.append(m.group(2))
    best = None
    for i, x in enumerate(ins):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", x)
        start = index.get(int(m.group(1), 16)) if m else None
        if start is not None and start <= i:                 # a backward branch: a loop
            body = [y for y in ins[start:i + 1] if not y.startswith("NOP")]
            if any("LDG" in y for y in body) and (best is None or len(body) < len(best)):
                best = body
    return best


def _opcode(sass_line: str) -> str:
    """A SASS line's opcode without its guard predicate or modifiers: '@!P0 LDGSTS.E.BYPASS
    [...]' -> 'LDGSTS'."""
    words = sass_line.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def resource_usage(cubin: bytes) -> dict:
    """{'regs': n, 'local_bytes': n} from cuobjdump (Triton's wheel ships it), or {}."""
    tool = None
    try:
        from triton.backends.nvidia import compiler as nv
        tool = nv.get_ptxas().path.replace("ptxas", "cuobjdump") if hasattr(nv, "get_ptxas") else None
    except Exception:  # noqa: BLE001  (older/newer Triton: look on PATH instead)
        tool = None
    if not tool or not os.path.exists(tool):
        import triton
        cand = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        tool = cand if os.path.exists(cand) else shutil.which("cuobjdump")
    if not tool:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                             text=True).stdout
    m_reg, m_loc = re.search(r"REG:(\d+)", out), re.search(r"LOCAL:(\d+)", out)
    if not m_reg:
        return {}
    return {"regs": int(m_reg.group(1)), "local_bytes": int(m_loc.group(1)) if m_loc else 0}


# ---------------------------------------------------------------------------- the pipes

# The GPU each architecture's report is read against: its SMs, clock and bandwidth.
REPORT_GPU = {75: "T4", 80: "A100 80GB", 89: "L40S", 90: "H200"}


def pipe_report(sass: list[str], threads: int, weight_bytes: int, arch: int) -> dict | None:
    """The main loop's lane-instructions per weight byte, per instruction class, and what the
    pipe model of ``kernels.pipes`` makes of them on ``REPORT_GPU[arch]`` (lessons 09-10).

    A warp instruction counts 32 lane-instructions, so each SASS line is worth ``threads``
    lane-instructions per loop trip; divided by the weight bytes of a trip. The budget is the
    catalogue GPU's issue budget (``course_lib.hardware.gpu_issue_budget``). None for an
    architecture without a report GPU.
    """
    from course_lib import hardware as hw
    from kernels import pipes

    if arch not in REPORT_GPU:
        return None
    counts = Counter(pipes.sass_class(y) for y in sass)
    per_byte = {"total": len(sass) * threads / weight_bytes}
    per_byte.update({c: counts.get(c, 0) * threads / weight_bytes for c in pipes.SASS_CLASSES})
    gpu = hw.get_gpu(REPORT_GPU[arch])
    model = pipes.loop_cost(per_byte, gpu.compute_capability, hw.gpu_issue_budget(gpu))
    return {"gpu": gpu.name, "model": pipes.MODEL,
            "per_weight_byte": {k: round(v, 2) for k, v in per_byte.items()},
            "cost": {k: round(v, 2) for k, v in model["cost"].items()},
            "budget": round(model["budget"], 2), "pipe_weighted": round(model["pipe_weighted"], 2),
            "bottleneck": model["bottleneck"],
            "bandwidth_fraction": round(model["bandwidth_fraction"], 3)}


# ---------------------------------------------------------------------------- compile

def compile_job(job, arch: int):
    """Compile one CompileJob for ``sm_<arch>``; returns Triton's compiled kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # as a real launch with aligned pointers and sizes/strides divisible by 16 would
    # specialize (vectorized loads), M excepted (a batch of 1)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(job.signature) if n != "M"}
    src = ASTSource(fn=job.kernel, signature={**job.signature,
                                               **{k: "constexpr" for k in job.constexprs}},
                    constexprs=job.constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": job.num_warps, "num_stages": job.num_stages})


def check(archs=ARCHS, all_configs: bool = False, report: bool = False, only=None,
          log=print) -> tuple[int, list[dict]]:
    """Compile the kernels for each architecture.

    Returns (number of unexpected results, one record per compiled job). Unexpected: a
    kernel that fails to compile where it should (or compiles where it should not), and a
    *default* configuration that needs more shared memory than the architecture has.
    """
    bad, records = 0, []
    for arch in archs:
        limit = SHARED_LIMIT.get(arch)
        for job in jobs_for(arch, all_configs, only):
            must = arch >= job.min_cc
            rec = {"arch": arch, "name": job.name, "constexprs": job.constexprs,
                   "num_warps": job.num_warps, "num_stages": job.num_stages,
                   "default": job.default, "rows": job.rows}
            try:
                k = compile_job(job, arch)
                ok, why = True, ""
            except Exception as err:  # noqa: BLE001  (reported, and counted when unexpected)
                ok, why = False, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            rec.update(compiled=ok, error=why or None)
            expected = ok == must
            verdict = ("ok" if ok else "refused (expected)") if expected else "UNEXPECTED"
            extra = ""
            if ok:
                shared = int(k.metadata.shared)
                fits = limit is None or shared <= limit
                rec.update(shared_bytes=shared, shared_fits=fits, mma=mma_kind(k.asm["ptx"]))
                if not fits:
                    verdict = "TOO MUCH SHARED" if job.default else "skipped at launch"
                    expected = expected and not job.default
                extra = f" shared {shared / 1024:.0f} KB" + ("" if fits else f" > {limit // 1024} KB")
                extra += f" mma={rec['mma']}"
                if report:
                    loop = main_loop(k.asm["ptx"])
                    threads = 32 * job.num_warps
                    if loop and job.weight_bytes_per_step:
                        per_byte = len(loop) * threads / job.weight_bytes_per_step
                        i2f = sum(1 for x in loop if re.match(r"cvt\.rn\.f32\.[su](8|16|32)", x))
                        i2f_per_byte = i2f * threads / job.weight_bytes_per_step
                        rec.update(loop_instructions=len(loop),
                                   instructions_per_weight_byte=round(per_byte, 2),
                                   int_to_float_per_weight_byte=round(i2f_per_byte, 2),
                                   loop_top=Counter(x.split()[0] for x in loop).most_common(5))
                        extra += (f" loop {len(loop)} instr, {per_byte:.2f} per weight byte"
                                  f" ({i2f_per_byte:.2f} int-to-float)")
                    sass = sass_main_loop(k.asm["cubin"])
                    if sass and job.weight_bytes_per_step:
                        per_sass = len(sass) * threads / job.weight_bytes_per_step
                        rec.update(sass_instructions_per_weight_byte=round(per_sass, 2),
                                   sass_cp_async_in_loop=any("LDGSTS" in y for y in sass),
                                   sass_int_to_float_in_loop=sum(
                                       1 for y in sass if y.split()[0].startswith("I2F")),
                                   sass_loop_opcodes=dict(Counter(
                                       _opcode(y) for y in sass).most_common()))
                        extra += (f" (SASS {per_sass:.2f}, cp.async "
                                  f"{'yes' if rec['sass_cp_async_in_loop'] else 'no'}, I2F "
                                  f"{rec['sass_int_to_float_in_loop']})")
                        model = pipe_report(sass, threads, job.weight_bytes_per_step, arch)
                        if model:
                            rec.update(pipes=model)
                            extra += (f" pipes {model['per_weight_byte']} -> {model['gpu']}: "
                                      f"{model['pipe_weighted']:.2f} pipe-weighted vs budget "
                                      f"{model['budget']:.2f} ({model['bottleneck']}), "
                                      f"{100 * model['bandwidth_fraction']:.0f}% of bandwidth")
                    rec.update(resource_usage(k.asm["cubin"]))
                    if "regs" in rec:
                        extra += f" regs {rec['regs']} spill {rec['local_bytes']} B"
            bad += not expected
            records.append(rec)
            cfg = {k_: v for k_, v in job.constexprs.items()}
            log(f"sm_{arch} {job.name:20s} {verdict:18s} {cfg} warps={job.num_warps} "
                f"stages={job.num_stages}{' (default)' if job.default else ''}{extra} {why}")
    return bad, records


# ---------------------------------------------------------------------------- launch plans

# (K in, N out) of the benchmark's layers: an 8B model's MLP up-projection and attention
BENCH_SHAPES = ((8192, 28672), (4096, 4096))
# every Llama-3.1 8B and 70B layer shape the benchmark times: the split rule's test bed (M = 1)
LLAMA_SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096), (4096, 1024), (8192, 8192),
                (8192, 28672))


def plan_jobs(arch: int, M: int, K: int, N: int, sms: int):
    """[(name, CompileJob, plan)] of the decode launch plans the wrappers use on a GPU with
    ``sms`` SMs, for the weight-only kernels at batch M (bf16 activations, group 128)."""
    import triton.language as tl
    from kernels import w4a16, w8a16
    from kernels._common import CompileJob

    from kernels._common import fill_plan

    def fill(tiles, steps_of, p):
        f = fill_plan(tiles, N, steps_of, sms)           # the rule dot_plan applied, explained
        assert f["config"].kwargs["BLOCK_N"] == p["BLOCK_N"] and f["rule"]["SPLIT_K"] == p["SPLIT_K"]
        return {**p, "rule": f["rule"], "fills": f["fills"], "why": f["why"]}

    out = []
    p = w4a16.dot_plan(M, N, K, 128, sms=sms)
    consts = {k: v for k, v in p.items() if k not in ("num_warps", "num_stages")}
    sig = next(j for j in w4a16.compile_jobs(arch) if j.name == "w4a16_dot").signature
    consts.update(GROUP=128, HAS_ZERO=False, W_DTYPE=tl.bfloat16, USE_ASM=arch >= 80,
                  DOT_FP32=False)
    steps = (K // 128) // p["UNITS_PER_STEP"]             # group 128: one unit a group
    p = fill(w4a16._DOT_DECODE_TILES, lambda c: (K // 128) // c.kwargs["UNITS_PER_STEP"], p)
    out.append(("w4a16_dot", CompileJob("w4a16_dot", w4a16.w4a16_dot_kernel, sig, consts,
                                        p["num_warps"], p["num_stages"],
                                        weight_bytes_per_step=w4a16._dot_step_bytes(
                                            {**p, "GROUP": 128})), p, steps))
    p8 = w8a16.dot_plan(M, N, K, sms=sms)
    consts = {k: v for k, v in p8.items() if k not in ("num_warps", "num_stages")}
    p8 = fill(w8a16._DECODE_TILES, lambda c: -(-K // c.kwargs["BLOCK_K"]), p8)
    sig = next(j for j in w8a16.compile_jobs(arch) if j.name == "w8a16_gemm").signature
    consts.update(DOT_FP32=False)
    out.append(("w8a16_dot", CompileJob("w8a16_dot", w8a16.w8a16_gemm_kernel, sig, consts,
                                        p8["num_warps"], p8["num_stages"],
                                        weight_bytes_per_step=p8["BLOCK_N"] * p8["BLOCK_K"]),
                p8, -(-K // p8["BLOCK_K"])))
    return out


def bytes_in_flight(plan: dict, N: int, M: int, trips: int, step_bytes: int, shared: int,
                    regs: int, sms: int, arch: int) -> dict:
    """Weight bytes in flight per SM under a launch plan (Little's law, lesson 10).

    Each program keeps ``min(num_stages - 1, trips a slice)`` loop steps of weights loading
    ahead (cp.async); an SM holds as many programs as the grid gives it and its shared
    memory and registers allow. Averaged over all SMs (idle ones count as zero).
    """
    tiles = -(-N // plan["BLOCK_N"]) * -(-M // plan["BLOCK_M"])
    programs = tiles * plan["SPLIT_K"]
    threads = 32 * plan["num_warps"]
    fit = min(SHARED_LIMIT.get(arch, 99 * 1024) // max(shared, 1),
              65536 // max(regs * threads, 1), 32)
    resident = min(programs, fit * sms)
    ahead = min(plan["num_stages"] - 1, -(-trips // plan["SPLIT_K"]))
    per_sm = resident * ahead * step_bytes / sms
    return dict(programs=programs, resident_per_sm_max=fit, steps_ahead=ahead,
                step_bytes=step_bytes, bytes_in_flight_per_sm=int(per_sm))


def plan_report(arch: int = 90, sms: int = 132, log=print) -> list[dict]:
    """The decode plans at the benchmark shapes (M = 1 and 16) and every Llama 8B/70B layer
    shape (M = 1): the tile and split rule's factors (``kernels._common.fill_plan`` and
    ``split_plan``; ``fills``: at least one program per SM, else ``why`` not), the waves, the
    trips per program, the bytes of weights in flight per SM (an H200/H100 has 132 SMs;
    the target is >= 32 KB, about bandwidth x latency per SM, or all a small layer allows),
    and the SASS instructions per weight byte and pipe model of the plan's tile."""
    records, cache = [], {}
    shapes = [(K, N, M) for K, N in BENCH_SHAPES for M in (1, 16)]
    shapes += [(K, N, 1) for K, N in LLAMA_SHAPES if (K, N) not in BENCH_SHAPES]
    for K, N, M in shapes:
        for name, job, plan, trips in plan_jobs(arch, M, K, N, sms):
            key = (name, tuple(sorted(job.constexprs.items(), key=str)), job.num_warps,
                   job.num_stages)
            if key not in cache:
                k = compile_job(job, arch)
                threads = 32 * job.num_warps
                sass = sass_main_loop(k.asm["cubin"])
                loop = {}
                if sass:
                    loop = dict(sass_instructions_per_weight_byte=round(
                        len(sass) * threads / job.weight_bytes_per_step, 2))
                    model = pipe_report(sass, threads, job.weight_bytes_per_step, arch)
                    if model:
                        loop["pipes"] = model
                cache[key] = (int(k.metadata.shared),
                              resource_usage(k.asm["cubin"]).get("regs", 0), loop)
            shared, regs, loop = cache[key]
            rec = dict(arch=arch, sms=sms, name=name, M=M, K=K, N=N, plan=plan,
                       shared_bytes=shared, regs=regs, **loop,
                       **bytes_in_flight(plan, N, M, trips, job.weight_bytes_per_step,
                                         shared, regs, sms, arch))
            records.append(rec)
            r = plan["rule"]
            log(f"plan sm_{arch} {name:10s} M={M:2d} {K}x{N}: BLOCK_N={plan['BLOCK_N']} "
                f"warps {plan['num_warps']} split-K {plan['SPLIT_K']}, {rec['programs']} programs "
                f"({r['waves']} waves of 2 per SM), {r['trips']} trips each, "
                f"{rec['steps_ahead']} steps x {rec['step_bytes'] // 1024} KB ahead: "
                f"{rec['bytes_in_flight_per_sm'] / 1024:.1f} KB in flight per SM; rule: busy "
                f"{r['busy']} x steady {r['steady']} x even {r['even']} = {r['score']}"
                + (f"; SASS {loop['sass_instructions_per_weight_byte']} per weight byte, "
                   f"pipe-weighted {loop['pipes']['pipe_weighted']}" if "pipes" in loop else "")
                + ("" if plan["fills"] else f"; fewer programs than SMs: {plan['why']}"))
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", type=int, nargs="+", default=list(ARCHS), help="e.g. 80 89 90")
    p.add_argument("--all-configs", action="store_true", help="every autotune config and dtype")
    p.add_argument("--report", action="store_true",
                   help="instructions per weight byte in the main loop, registers, spills")
    p.add_argument("--only", nargs="+", help="kernels whose name contains one of these")
    p.add_argument("--json", help="also write the records to this file")
    args = p.parse_args(argv)
    _reexec_for_aot(sys.argv[1:] if argv is None else list(argv))
    import kernels

    assert not kernels.INTERPRET, "compile_check needs COURSE_TRITON_AOT=1"
    if not kernels.TRITON:
        print(f"SKIPPED: {kernels.TRITON_MISSING}")
        return 0
    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        print("SKIPPED: this triton build has no NVIDIA backend")
        return 0
    bad, records = check(args.arch, args.all_configs, args.report, args.only)
    plans = plan_report(90) if args.report and 90 in args.arch else []
    if args.json:
        import triton
        with open(args.json, "w") as f:
            cmd = "python -m kernels.compile_check " + " ".join(argv if argv is not None else sys.argv[1:])
            from course_lib import device
            from kernels import pipes
            json.dump({"command": cmd, "triton": triton.__version__,
                       "machine": device.machine_record(),   # compiled here, for --arch
                       "issue_budget_h100": round(issue_budget(), 2),
                       "pipe_model": pipes.MODEL,
                       "records": records, "launch_plans": plans}, f, indent=1, default=str)
            f.write("\n")
    print(f"{bad} unexpected result(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
