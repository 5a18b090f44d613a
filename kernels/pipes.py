"""Which pipe of an SM runs each SASS instruction, and what a main loop costs (lessons 09-10).

An SM has 4 schedulers, each issuing one warp instruction (32 lanes) a clock: 128
lane-instructions per clock (``course_lib.hardware.issue_budget`` turns that into a budget
per byte read). Each instruction also occupies the pipe that executes it, and most pipes
are narrower than the issue. Where each instruction goes, from NVIDIA's own descriptions:

* Nsight Compute's Profiling Guide (v2026.1.0, section 2.3.6 "Pipelines",
  https://docs.nvidia.com/nsight-compute/ProfilingGuide/index.html#pipelines; the metrics
  ``smsp__inst_executed_pipe_alu``, ``_fma``, ``_fmaheavy``, ``_fp16``, ``_xu``): **alu**
  runs most bit manipulation and logic and the integer instructions *excluding IMAD and
  IMUL*; **fma** runs FP32 FADD/FMUL/FFMA *and* IMUL/IMAD and integer dot products; on GA10x
  (and later) fma is a logical pipe made of **fmaheavy** (FP32, FP16x2, IMAD/IMUL, integer dot
  products) and **fmalite** (FP32 and FP16x2 only); **fp16** runs the packed FP16x2
  instructions on Volta, Turing and GA100 only; **xu** runs int-to-float and float-to-int
  conversions (and transcendentals).
* An NVIDIA engineer's answer on NVIDIA's developer forum ("Separate CUDA core pipeline for
  FP16 and FP32?", https://forums.developer.nvidia.com/t/separate-cuda-core-pipeline-for-fp16-and-fp32/302018/7):
  on GA100 (sm_80) the FMA pipe takes IMAD, IDP and FP32, and a pipe shared with the tensor
  cores and FP64 takes FP16; on GA10x (sm_86) and GH100 (sm_90) fmaheavy takes IMAD, IDP and
  FP32, fmalite FP32, and FP16x2 instructions are dual-issued to both.

Widths (lane-instructions per clock per SM): alu and fmaheavy and fmalite 16 lanes per
scheduler (64 per SM), so a warp instruction holds one of them for 2 clocks; the CUDA C++
Programming Guide's "Throughput of Native Arithmetic Instructions" table agrees (32-bit
integer add, shift, logic and multiply-add: 64 per SM on 7.5-9.0; FP32: 64 on 7.5 and 8.0,
128 on 8.6, 8.9 and 9.0; type conversions: 16). Packed FP16x2 (two results per lane) from the
non-tensor FP16 rates: 2x FP32 on the T4 and H100/H200, 4x on the A100, 1x on GA102/AD102
(their architecture whitepapers), so an HFMA2 warp instruction takes 2, 1, 2 (sm_75, sm_80's
own fp16 pipe, sm_86/89) and 1 (sm_90) clocks of its pipes. PRMT (byte permute) and the FP32
compare/min/max/select instructions are not named in those sources; they are counted where
they were before (PRMT on alu, the FP32 ones on fma), which over-counts rather than hides.
Compute capability 10.0 and 12.0 (Blackwell) are not modelled: their ALU is partly inside
fmaheavy (the same Nsight Compute section), and no course report reads them.

``COST[cc][pipe][class]``: clocks (issue slots) one warp instruction of that class holds the
pipe. A loop's cost of a pipe is the sum over classes of (lane-instructions per weight byte)
x that number; the issue itself costs the total; the largest is the loop's *pipe-weighted*
cost, and the loop can stream at full bandwidth only if that fits the issue budget.
"""
from __future__ import annotations

MODEL = "kernels.pipes 2 (Nsight Compute pipelines: IMAD on fma/fmaheavy, FP16x2 on fma from sm_86)"

# SASS opcode (before the first dot) -> instruction class. Unlisted opcodes (tensor core,
# memory, control, uniform datapath) cost only their issue slot.
SASS_CLASSES = {
    "alu": ("IADD3", "IADD", "LOP3", "LOP", "SHF", "SHL", "SHR", "PRMT", "ISETP", "LEA", "SEL",
            "IMNMX", "IABS", "BFE", "BFI", "SGXT", "POPC", "FLO", "BMSK", "VIADD", "VIMNMX"),
    "imad": ("IMAD", "IMUL", "IDP", "IDP4A"),
    "fp32": ("FFMA", "FADD", "FMUL", "FMNMX", "FSET", "FSETP", "FSEL", "FCHK"),
    "fp16x2": ("HFMA2", "HADD2", "HMUL2", "HMNMX2", "HSET2", "HSETP2"),
    "conversion": ("I2F", "F2I", "F2F", "I2I", "F2FP", "I2FP", "F2IP"),
}
CLASS_OF = {op: c for c, ops in SASS_CLASSES.items() for op in ops}

ISSUE_LANES_PER_SM = 128
_XU = {"conversion": 8}                  # 16 lanes per SM: 8 clocks a warp instruction
COST = {
    # Turing: FP32 and IMAD share the 64-lane FMA pipe; FP16x2 its own pipe, 2x FP32's results
    (7, 5): {"alu": {"alu": 2}, "fma": {"fp32": 2, "imad": 2}, "fp16": {"fp16x2": 2}, "xu": _XU},
    # GA100: the same, but its FP16 pipe (shared with tensor and FP64) gives 4x FP32's results
    (8, 0): {"alu": {"alu": 2}, "fma": {"fp32": 2, "imad": 2}, "fp16": {"fp16x2": 1}, "xu": _XU},
    # GA10x/AD10x: fmaheavy + fmalite (128 FP32 lanes); IMAD only on fmaheavy; FP16x2 on both,
    # at the FP32 rate in results, i.e. 2 clocks of each per warp instruction
    (8, 6): {"alu": {"alu": 2}, "fma": {"fp32": 1, "imad": 1, "fp16x2": 2},
             "fmaheavy": {"imad": 2, "fp16x2": 2}, "xu": _XU},
    # GH100: as GA10x, FP16x2 at twice FP32's results: 1 clock of each FMA pipe
    (9, 0): {"alu": {"alu": 2}, "fma": {"fp32": 1, "imad": 1, "fp16x2": 1},
             "fmaheavy": {"imad": 2, "fp16x2": 1}, "xu": _XU},
}
COST[(8, 9)] = COST[(8, 6)]


def sass_class(instruction: str) -> str | None:
    """The class of one SASS instruction ("alu", "imad", "fp32", "fp16x2", "conversion"), or
    None for one that costs only its issue slot.

    ``"LOP3.LUT R4, R2, 0xf000f, R5, 0xea, !PT"`` -> "alu"; ``"@P0 IMAD.WIDE R2, R3, 0x2, R4"``
    -> "imad"; ``"HMMA.16816.F32.BF16 ..."`` -> None.
    """
    if not isinstance(instruction, str) or not instruction.strip():
        raise ValueError("instruction must be one SASS instruction as cuobjdump prints it, "
                         "e.g. 'LOP3.LUT R4, R2, 0xf000f, R5, 0xea, !PT'")
    words = instruction.split()
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return CLASS_OF.get(op.split(".")[0])


def pipe_costs(compute_capability) -> dict:
    """``COST`` of one compute capability: {pipe: {class: clocks per warp instruction}}."""
    cc = compute_capability
    if not (isinstance(cc, (tuple, list)) and len(cc) == 2 and all(isinstance(v, int) for v in cc)):
        raise ValueError(f"compute_capability must be a (major, minor) pair such as (9, 0), got {cc!r}")
    cc = tuple(cc)
    if cc not in COST:
        raise ValueError(f"no pipe model for compute capability {cc[0]}.{cc[1]}: modelled "
                         f"{sorted(COST)} (Blackwell's pipes differ; see this module's docstring)")
    return {p: dict(c) for p, c in COST[cc].items()}


def lanes_per_sm(compute_capability) -> dict:
    """{pipe: {class: lane-instructions per clock per SM}}: 128 / clocks (lesson 10's table)."""
    return {p: {c: ISSUE_LANES_PER_SM / v for c, v in cls.items()}
            for p, cls in pipe_costs(compute_capability).items()}


def loop_cost(per_byte: dict, compute_capability, budget: float) -> dict:
    """Which limit a main loop hits first: the issue or one pipe (lessons 09-10).

    per_byte: lane-instructions per weight byte, {"total": t, "alu": a, "imad": i, "fp32": f,
    "fp16x2": h, "conversion": c} (``kernels.compile_check`` counts them from the SASS);
    budget: lane-instructions the issue allows per byte read at full bandwidth
    (``course_lib.hardware.gpu_issue_budget``). Returns each limit's cost in issue slots per
    byte (``cost``), the largest (``pipe_weighted``), its name (``bottleneck``) and
    ``bandwidth_fraction`` = min(1, budget / pipe_weighted).
    """
    total = per_byte.get("total")
    if not isinstance(total, (int, float)) or total <= 0:
        raise ValueError(f"per_byte['total'] must be a positive number of lane-instructions per "
                         f"weight byte, got {total!r}")
    if not isinstance(budget, (int, float)) or budget <= 0:
        raise ValueError(f"budget must be positive, got {budget!r}")
    for k, v in per_byte.items():
        if k != "total" and (k not in SASS_CLASSES or not isinstance(v, (int, float)) or v < 0):
            raise ValueError(f"per_byte[{k!r}] = {v!r}: keys are 'total' and {sorted(SASS_CLASSES)}, "
                             f"values >= 0")
    cost = {"issue": float(total)}
    for pipe, classes in pipe_costs(compute_capability).items():
        cost[pipe] = sum(per_byte.get(c, 0.0) * clocks for c, clocks in classes.items())
    bottleneck = max(cost, key=cost.get)
    return {"cost": cost, "pipe_weighted": cost[bottleneck], "bottleneck": bottleneck,
            "budget": budget, "bandwidth_fraction": min(1.0, budget / cost[bottleneck])}
