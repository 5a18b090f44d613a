"""The bill: a catalogue of GPUs and models, and the calculators that price a model in
memory and in decode time (lesson 00, ``notebooks/00_the_bill.ipynb``).

Everything here is arithmetic on published figures; nothing is measured (for the
measured side see ``course_lib.bandwidth``). Units are in the names:

- memory in decimal gigabytes (``_gb``: 1 GB = 1e9 bytes, as GPU datasheets count),
- bandwidth in terabytes per second (``_tbps``: 1 TB/s = 1e12 bytes/s),
- times in milliseconds (``_ms``), throughput in tokens per second.

The sums, in one place:

    weight bytes         = parameters x bits per weight / 8
    KV bytes per token   = 2 (K and V) x layers x KV heads x head dim x bytes per value
    decode floor (ms)    = bytes read per token / (GPUs x bandwidth)
    batched step (ms)    = (weight bytes + KV bytes of every user) / (GPUs x bandwidth)
    servable             = weights + workspace + KV of the users fit in the usable memory

Sources are listed per entry (``GPU.source``, ``Model.source``). GPU compute figures are
*dense* (no 2:4 sparsity): datasheets often print the sparse figure, twice as large.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from numbers import Real

from course_lib import quant  # one source for scale overheads: quant.bits_per_weight (lesson 03)

GB = 1e9          # bytes in a (decimal) gigabyte, the unit of GPU datasheets
GIB = 2 ** 30     # bytes in a gibibyte, the unit many tools (nvidia-smi, vLLM logs) print
TB = 1e12         # bytes in a terabyte

USABLE_FRACTION = 0.9       # share of GPU memory a serving engine may use (vLLM's default 0.9)
DEFAULT_WORKSPACE_GB = 3.0  # per GPU: activations, CUDA graphs, communication buffers (assumed)
REALISTIC_EFFICIENCY = 0.7  # share of peak bandwidth a good decode kernel sustains (lesson 00)


# ---------------------------------------------------------------------------------------
# Checks on inputs
# ---------------------------------------------------------------------------------------

def _positive(name: str, value, allow_zero: bool = False) -> float:
    """Return ``value`` as a float, or raise ValueError saying what is wrong with it."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if value < 0 or (value == 0 and not allow_zero):
        need = "zero or more" if allow_zero else "greater than zero"
        raise ValueError(f"{name} must be {need}, got {value:g}")
    return value


def _fraction(name: str, value) -> float:
    """A share in (0, 1], or a ValueError saying so (2.0 would mean twice the GPU's memory)."""
    value = _positive(name, value)
    if value > 1:
        raise ValueError(f"{name} is a share of the whole, in (0, 1] (0.9 = 90%); got {value:g}")
    return value


def _count(name: str, value) -> int:
    """A whole number >= 0 (a token count may be 0), or a ValueError."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) \
            or int(value) != value:
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be 0 or more, got {value}")
    return int(value)


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) \
            or int(value) != value:
        raise ValueError(f"{name} must be a whole number (no fractions: half a token or half "
                         f"a GPU does not exist), got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be 1 or more, got {value}")
    return int(value)


def _key(name: str) -> str:
    """Normalise a catalogue name: case, spaces, dashes, dots and underscores do not matter."""
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


def _lookup(kind: str, name: str, table: dict, aliases: dict | None = None):
    if not isinstance(name, str):
        raise ValueError(f"{kind} must be given by name (a string), got {name!r}")
    index = {_key(k): v for k, v in table.items()}
    index.update({_key(a): table[t] for a, t in (aliases or {}).items()})
    try:
        return index[_key(name)]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(table)}") from None


# ---------------------------------------------------------------------------------------
# Number formats: bits per weight, scales included
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Format:
    """A storage format for weights (or the KV cache), priced in bits per value."""
    name: str
    bits: float
    description: str


FORMATS: dict[str, Format] = {f.name: f for f in [
    Format("fp32", 32.0, "IEEE single precision"),
    Format("bf16", 16.0, "bfloat16, how most models are released"),
    Format("fp16", 16.0, "IEEE half precision"),
    Format("fp8", 8.0, "FP8 E4M3 (a per-tensor or per-channel scale adds next to nothing)"),
    Format("int8", 8.0, "8-bit integers (per-channel scales add next to nothing)"),
    Format("int4", 4.0, "4-bit integers, scales not counted"),
    Format("int4_g128", quant.bits_per_weight(4, 128), "INT4 with one 16-bit scale per 128 weights: 4 + 16/128"),
    Format("int4_g32", quant.bits_per_weight(4, 32), "INT4 with one 16-bit scale per 32 weights: 4 + 16/32"),
    Format("mxfp4", quant.bits_per_weight("mxfp4"), "OCP MXFP4: E2M1 values, one E8M0 scale per 32: 4 + 8/32"),
    Format("fp4", quant.bits_per_weight("mxfp4"), "FP4 E2M1 as shipped in MXFP4 blocks (gpt-oss): 4.25"),
    Format("nvfp4", quant.bits_per_weight("nvfp4"), "NVIDIA NVFP4: E2M1, one E4M3 scale per 16 (+ an FP32 tensor scale)"),
    Format("q4_k_m", quant.bits_per_weight("q4_k_m"), "llama.cpp GGUF Q4_K_M mix: 4.89 on Llama-3.1-8B, head included"),
]}
FORMAT_ALIASES = {"int4-g128": "int4_g128", "w4a16": "int4_g128", "int4-g32": "int4_g32",
                  "fp8_e4m3": "fp8", "e4m3": "fp8", "float8": "fp8", "float16": "fp16",
                  "bfloat16": "bf16", "float32": "fp32"}


def get_format(name: str) -> Format:
    """The ``Format`` called ``name`` (lesson 00). Unknown names list the known ones."""
    return _lookup("format", name, FORMATS, FORMAT_ALIASES)


def bits_per_weight(fmt) -> float:
    """Bits per stored value for a format name (``"int4_g128"`` -> 4.125) or a number of
    bits given directly (``4.5`` -> 4.5). Lesson 00."""
    if isinstance(fmt, str):
        return get_format(fmt).bits
    return _positive("bits per weight", fmt)


def bits_with_scales(bits: float, group_size: int | None = None, scale_bits: float = 16) -> float:
    """Bits per weight once each group of ``group_size`` weights carries a ``scale_bits`` scale:
    ``bits + scale_bits / group_size`` (4 + 16/128 = 4.125). ``None``: no group scales.
    Lessons 00 and 03."""
    bits = _positive("bits", bits)
    if group_size is None:
        return bits
    group_size = _positive_int("group_size", group_size)
    scale_bits = _positive("scale_bits", scale_bits, allow_zero=True)
    return quant.bits_per_weight(bits, group_size, scale_bits=scale_bits)


# ---------------------------------------------------------------------------------------
# The catalogue: GPUs
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GPU:
    """One accelerator's datasheet figures. Compute is dense (no sparsity), in TFLOPS
    (TOPS for INT8); ``None`` where the chip has no native tensor-core path for that format."""
    name: str
    memory_gb: float
    bandwidth_tbps: float
    bf16_tflops: float
    fp8_tflops: float | None
    int8_tops: float | None
    fp4_tflops: float | None
    compute_capability: tuple[int, int] | None  # CUDA compute capability; None for AMD
    arch: str
    source: str
    sms: int | None = None                  # streaming multiprocessors (None: not catalogued)
    boost_clock_ghz: float | None = None    # the datasheet's boost clock

    def usable_gb(self, usable_fraction: float = USABLE_FRACTION) -> float:
        """Memory a serving engine may fill: ``memory_gb x usable_fraction`` (80 -> 72 GB)."""
        return self.memory_gb * _fraction("usable_fraction", usable_fraction)

    def native_tflops(self, fmt: str) -> float | None:
        """Dense tensor-core rate for the maths of ``fmt``, or None if not native (lesson 12)."""
        name = get_format(fmt).name
        if name in ("bf16", "fp16"):
            return self.bf16_tflops
        if name == "fp8":
            return self.fp8_tflops
        if name == "int8":
            return self.int8_tops
        if name in ("fp4", "mxfp4", "nvfp4"):
            return self.fp4_tflops
        return None


_NV = "NVIDIA {} datasheet; dense figures (half of the 'with sparsity' column)"
GPUS: dict[str, GPU] = {g.name: g for g in [
    GPU("H100 SXM", 80, 3.35, 989, 1979, 1979, None, (9, 0), "Hopper",
        _NV.format("H100 Tensor Core GPU (SXM5)")),
    GPU("H100 PCIe", 80, 2.0, 756, 1513, 1513, None, (9, 0), "Hopper",
        _NV.format("H100 Tensor Core GPU (PCIe)")),
    GPU("H100 NVL", 94, 3.9, 835.5, 1670.5, 1670.5, None, (9, 0), "Hopper",
        _NV.format("H100 Tensor Core GPU (H100 NVL)") + "; its 1,671 BF16 / 3,341 FP8 are sparse"),
    GPU("H200", 141, 4.8, 989, 1979, 1979, None, (9, 0), "Hopper",
        _NV.format("H200 Tensor Core GPU (SXM)")),
    GPU("A100 40GB", 40, 1.555, 312, None, 624, None, (8, 0), "Ampere",
        _NV.format("A100 Tensor Core GPU (SXM4 40GB)")),
    GPU("A100 80GB", 80, 2.039, 312, None, 624, None, (8, 0), "Ampere",
        _NV.format("A100 Tensor Core GPU (SXM4 80GB)")),
    GPU("L40S", 48, 0.864, 362.05, 733, 733, None, (8, 9), "Ada Lovelace",
        _NV.format("L40S GPU")),
    GPU("RTX 4090", 24, 1.008, 165.2, 330.3, 660.6, None, (8, 9), "Ada Lovelace",
        "NVIDIA Ada Lovelace GPU Architecture whitepaper, GeForce RTX 4090 column "
        "(tensor maths with FP32 accumulate, dense)"),
    GPU("B200", 180, 8.0, 2250, 4500, 4500, 9000, (10, 0), "Blackwell",
        "NVIDIA HGX B200 / DGX B200 specifications: 8-GPU system figures divided by 8 "
        "(1,440 GB, 64 TB/s), dense = half the sparse figures (FP4 144 PF sparse -> 9 PF per GPU)"),
    GPU("T4", 16, 0.32, 65, None, 130, None, (7, 5), "Turing",
        "NVIDIA T4 Tensor Core GPU datasheet (Turing has no BF16: the 16-bit figure is FP16 with "
        "FP32 accumulate; no sparsity on Turing, so every figure is dense)"),
    GPU("MI300X", 192, 5.3, 1307.4, 2614.9, 2614.9, None, None, "AMD CDNA 3 (gfx942)",
        "AMD Instinct MI300X data sheet (dense, no sparsity)"),
]}
# SM counts and boost clocks (lessons 09-10: the issue budget), from the same datasheets and
# NVIDIA's architecture whitepapers (H100: 132 SMs SXM5, 114 PCIe; A100: 108; AD102 in the
# RTX 4090: 128; AD102 in the L40S: 142; TU104 in the T4: 40).
_SMS_CLOCK = {"H100 SXM": (132, 1.98), "H100 PCIe": (114, 1.755), "H100 NVL": (132, 1.785),
              "H200": (132, 1.98), "A100 40GB": (108, 1.41), "A100 80GB": (108, 1.41),
              "L40S": (142, 2.52), "RTX 4090": (128, 2.52), "T4": (40, 1.59)}
GPUS = {n: (replace(g, sms=_SMS_CLOCK[n][0], boost_clock_ghz=_SMS_CLOCK[n][1])
            if n in _SMS_CLOCK else g) for n, g in GPUS.items()}

GPU_ALIASES = {"H100": "H100 SXM", "H100 SXM5": "H100 SXM", "A100": "A100 80GB",
               "4090": "RTX 4090", "MI300": "MI300X", "Tesla T4": "T4"}


def get_gpu(name) -> GPU:
    """The ``GPU`` called ``name`` (``"H100"`` means the H100 SXM). Lesson 00."""
    if isinstance(name, GPU):
        return name
    return _lookup("GPU", name, GPUS, GPU_ALIASES)


# ---------------------------------------------------------------------------------------
# What limits a GEMV besides bytes: the issue budget and the bytes in flight (lessons 09-10)
# ---------------------------------------------------------------------------------------

# 32-bit float add/multiply/FMA results per clock per SM, by compute capability: the CUDA C++
# Programming Guide's "Arithmetic Instructions" throughput table. The A100 (8.0) has 64, not
# 128: only the consumer Ampere chips (8.6, 8.7) doubled their FP32 lanes.
FP32_LANES_PER_SM = {(7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128,
                     (9, 0): 128, (10, 0): 128, (12, 0): 128}
# Loaded DRAM latency assumed for Little's law: a round figure, "about a microsecond" on HBM
# under load (an idle load is faster, 0.5-0.7 us; a queue under full bandwidth is slower).
DEFAULT_LATENCY_US = 1.0


def catalogue_gpu(device_name: str, memory_gb: float | None = None):
    """The catalogue entry for a CUDA device name, or None.

    torch reports names such as "NVIDIA H100 80GB HBM3" or "NVIDIA A100-SXM4-40GB"; we map
    them onto the catalogue's names (lesson 10).
    """
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be the name torch reports (a string, e.g. "
                        f"torch.cuda.get_device_name(0)), got {type(device_name).__name__}")
    if memory_gb is not None:
        _positive("memory_gb", memory_gb)

    n = device_name.upper().replace("-", " ")
    table = [("H200", "H200"), ("H100 PCIE", "H100 PCIe"), ("H100 NVL", "H100 NVL"),
             ("H100", "H100 SXM"), ("L40S", "L40S"), ("4090", "RTX 4090"), ("B200", "B200"),
             ("MI300X", "MI300X")]
    for key, name in table:
        if key in n and name in GPUS:
            return GPUS[name]
    if "T4" in n.split():                                                 # "Tesla T4"
        return GPUS["T4"]
    if "A100" in n:
        small = "40GB" in n.replace(" ", "") or (memory_gb is not None and memory_gb < 60)
        return GPUS.get("A100 40GB" if small else "A100 80GB")
    return None


def _cc(compute_capability) -> tuple[int, int]:
    cc = compute_capability
    if not (isinstance(cc, (tuple, list)) and len(cc) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in cc)):
        raise ValueError(f"compute_capability must be a (major, minor) pair such as (9, 0), "
                         f"got {cc!r}")
    return int(cc[0]), int(cc[1])


def fp32_lanes_per_sm(compute_capability) -> int:
    """FP32 lanes of one SM (results per clock), e.g. (9, 0) -> 128, (8, 0) -> 64 (lesson 10).

    An unlisted newer capability takes the entry of the closest older one."""
    cc = _cc(compute_capability)
    known = [k for k in FP32_LANES_PER_SM if k <= cc]
    if not known:
        raise ValueError(f"no FP32 lane count for compute capability {cc[0]}.{cc[1]}: the "
                         f"catalogue starts at 7.0 (Volta); known: {sorted(FP32_LANES_PER_SM)}")
    return FP32_LANES_PER_SM[max(known)]


def issue_budget(sms: int, clock_ghz: float, bandwidth_tbps: float, lanes_per_sm: int) -> float:
    """Lane-instructions a GPU issues per byte it reads at full bandwidth (lesson 10):
    ``sms x lanes_per_sm x clock / bandwidth``.

    An H200: 132 x 128 x 1.98e9 / 4.8e12 -> 6.97. A kernel whose main loop needs more
    instructions per weight byte than this cannot stream its weights at full bandwidth; and
    since the ALU pipe's logic, shift and integer-add instructions run at half the issue rate
    (``kernels.pipes``), a dequantizing loop can hit that limit first.
    """
    sms = _positive_int("sms", sms)
    lanes = _positive_int("lanes_per_sm", lanes_per_sm)
    clock = _positive("clock_ghz", clock_ghz)
    bandwidth = _positive("bandwidth_tbps", bandwidth_tbps)
    return sms * lanes * clock * 1e9 / (bandwidth * TB)


def gpu_issue_budget(gpu, bandwidth_tbps: float | None = None) -> float:
    """``issue_budget`` of a catalogue GPU (its SMs, boost clock and the issue rate of 128
    lane-instructions per clock per SM), at its datasheet bandwidth or at ``bandwidth_tbps``
    (a measured one). Lesson 10. (Not the FP32 lanes: an A100 has 64 of those per SM, but it
    issues 128 lane-instructions a clock; ``kernels.pipes.loop_cost`` weighs each pipe.)"""
    gpu = get_gpu(gpu)
    if gpu.sms is None or gpu.boost_clock_ghz is None or gpu.compute_capability is None:
        raise ValueError(f"the catalogue has no SM count, clock or CUDA compute capability for "
                         f"{gpu.name}; catalogued: {', '.join(n for n, g in GPUS.items() if g.sms)}")
    bw = gpu.bandwidth_tbps if bandwidth_tbps is None else bandwidth_tbps
    return issue_budget(gpu.sms, gpu.boost_clock_ghz, bw, ISSUE_LANES_PER_SM)


# ---- the issue rate (lessons 09-10) ------------------------------------------------------
# An SM has 4 schedulers, each issuing one warp instruction (32 lanes) per clock: 128
# lane-instructions per clock on every architecture from Volta (7.0) on (NVIDIA's Volta,
# Ampere and Hopper architecture whitepapers). Each instruction also occupies the pipe that
# executes it, and some pipes are narrower than the issue: which opcode runs on which pipe, and
# how wide each pipe is, is kernels.pipes (from Nsight Compute's Profiling Guide, "Pipelines").
ISSUE_LANES_PER_SM = 128


def device_issue_budget(props, bandwidth_tbps: float) -> dict:
    """The issue budget of the GPU torch sees (lesson 10): SM count, compute capability and
    clock from ``torch.cuda.get_device_properties(0)`` (``clock_rate`` is in kHz; where torch
    does not report it, the catalogue's boost clock), the issue rate (128 lane-instructions per
    clock per SM), and the bandwidth you pass (measured, or the catalogue's). Returns the inputs and the budget.
    """
    for attr in ("multi_processor_count", "major", "minor", "name"):
        if not hasattr(props, attr):
            raise TypeError(f"props must be torch.cuda.get_device_properties(...), which has "
                            f"`{attr}`; got {type(props).__name__}")
    clock_khz = getattr(props, "clock_rate", 0) or 0
    clock_ghz = clock_khz / 1e6
    source = "torch (clock_rate)"
    if clock_ghz <= 0:
        gpu = catalogue_gpu(props.name)
        if gpu is None or gpu.boost_clock_ghz is None:
            raise ValueError(f"torch reports no clock for {props.name} and the catalogue has no "
                             f"entry for it: pass a GPU from the catalogue to gpu_issue_budget")
        clock_ghz, source = gpu.boost_clock_ghz, f"catalogue ({gpu.name} boost clock)"
    lanes = ISSUE_LANES_PER_SM
    budget = issue_budget(props.multi_processor_count, clock_ghz, bandwidth_tbps, lanes)
    return {"sms": props.multi_processor_count, "clock_ghz": clock_ghz, "clock_source": source,
            "lanes_per_sm": lanes, "bandwidth_tbps": bandwidth_tbps, "budget": budget}


def bytes_in_flight_per_sm(bandwidth_tbps: float, sms: int,
                           latency_us: float = DEFAULT_LATENCY_US) -> float:
    """Little's law (lesson 10): to keep ``bandwidth_tbps`` busy when each load takes
    ``latency_us`` to come back, ``bandwidth x latency`` bytes must be on their way at every
    moment; per SM, divide by the SM count. An H200 (4.8 TB/s, 132 SMs, 1 us) -> 36,364 B.
    """
    bandwidth = _positive("bandwidth_tbps", bandwidth_tbps)
    sms = _positive_int("sms", sms)
    latency = _positive("latency_us", latency_us)
    return bandwidth * TB * latency * 1e-6 / sms


def gemv_bytes_in_flight_per_sm(N: int, block_n: int, block_k: int, weight_bits: float,
                                sms: int, split_k: int = 1) -> float:
    """Weight bytes a GEMV without software pipelining has in flight per SM (lesson 10): each
    program waits for one (block_n x block_k) tile of weights at a time, and the grid's
    ``ceil(N / block_n) x split_k`` programs share ``sms`` SMs (all resident at once: a GEMV's
    grid is small). The first H200 run's W4A16 at 8192 x 28672 (block 32 x 256, 132 SMs) ->
    27.8 KB: less than the 36 KB Little's law asks.
    """
    for name, v in (("N", N), ("block_n", block_n), ("block_k", block_k), ("split_k", split_k)):
        _positive_int(name, v)
    bits = _positive("weight_bits", weight_bits)
    sms = _positive_int("sms", sms)
    programs = math.ceil(N / block_n) * split_k
    return programs * block_n * block_k * bits / 8 / sms


# Which course kernel runs from which compute capability, against what the hardware has
# (lessons 09, 10 and 12). "hardware": where the tensor cores of that format first appear;
# "course": where the course's Triton kernel runs natively. They differ for INT8 W8A8.
KERNEL_SUPPORT = {
    "w8a16": {"hardware": (7, 0), "course": (7, 5),
              "why": "a GEMV on the CUDA cores runs on any GPU Triton supports (sm_75 and newer); "
                     "its batch > 8 GEMM uses tensor cores (mma.sync) from sm_80"},
    "w4a16": {"hardware": (7, 0), "course": (7, 5),
              "why": "same as W8A16: CUDA-core GEMV everywhere, tensor-core GEMM from sm_80"},
    "int8_w8a8": {"hardware": (7, 5), "course": (8, 0),
                  "why": "Turing (7.5) has INT8 tensor cores (mma.sync m8n8k16 s8), but Triton 3.9 "
                         "emits tensor-core instructions for tl.dot only from sm_80, and its "
                         "fallback for older GPUs handles float operands only: compiling the "
                         "course's int8 tl.dot for sm_75 fails ('arith.extf' on an i8 tensor in "
                         "TritonGPUAccelerateMatmul; `python -m kernels.compile_check --arch 75 "
                         "--only int8_gemm`), so the kernel refuses below 8.0"},
    "fp8_w8a8": {"hardware": (8, 9), "course": (8, 9),
                 "why": "FP8 tensor cores appear with Ada (8.9); Hopper's wgmma takes FP8 from "
                        "64-row tiles"},
}


def kernel_support(kernel: str, compute_capability) -> dict:
    """Whether the hardware has the maths of ``kernel`` (a key of ``KERNEL_SUPPORT``) and
    whether the course's kernel runs natively at ``compute_capability``, with the reason they
    differ (lesson 09). A T4 (7.5) has INT8 tensor cores; the course's INT8 W8A8 refuses it."""
    if kernel not in KERNEL_SUPPORT:
        raise ValueError(f"unknown kernel {kernel!r}; known: {', '.join(KERNEL_SUPPORT)}")
    cc = _cc(compute_capability)
    entry = KERNEL_SUPPORT[kernel]
    return {"kernel": kernel, "hardware": cc >= entry["hardware"], "course": cc >= entry["course"],
            "why": entry["why"]}


# ---------------------------------------------------------------------------------------
# The catalogue: models
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Model:
    """The numbers of a model that set its bill.

    ``params`` counts every weight (what memory must hold); ``active_params`` is what one
    token reads in a mixture-of-experts model (None for a dense model: all of them).
    ``kv_latent_dim``: values cached per token per layer by multi-head latent attention
    (DeepSeek-V3), which replaces the ``2 x kv_heads x head_dim`` of ordinary attention.
    """
    name: str
    params: float
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    source: str
    active_params: float | None = None
    kv_latent_dim: int | None = None
    notes: str = ""

    @property
    def is_moe(self) -> bool:
        return self.active_params is not None

    @property
    def params_per_token(self) -> float:
        """Weights one token's decode step reads (all of them for a dense model)."""
        return self.active_params if self.is_moe else self.params

    def config(self) -> dict:
        """The attention part of a Hugging Face ``config.json`` for this model."""
        return {"num_hidden_layers": self.layers, "num_attention_heads": self.attention_heads,
                "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
                "hidden_size": self.hidden_size}


MODELS: dict[str, Model] = {m.name: m for m in [
    Model("Llama 3.1 8B", 8.03e9, 32, 32, 8, 128, 4096,
          "Meta Llama 3.1 model card (8.03B parameters) and config.json"),
    Model("Llama 3.1 70B", 70.6e9, 80, 64, 8, 128, 8192,
          "Meta Llama 3.1 model card and config.json; 70.55B in the checkpoint, 70.6B as the "
          "course's sources round it"),
    Model("Llama 3.1 405B", 405.9e9, 126, 128, 8, 128, 16384,
          "Meta Llama 3.1 model card (405B nominal; ~405.9B in the checkpoint) and config.json"),
    Model("Gemma 2 27B", 27.2e9, 46, 32, 16, 128, 4608,
          "Google Gemma 2 technical report and config.json (head_dim 128, not hidden/heads = 144)",
          notes="every other layer uses a 4,096-token sliding window: for longer contexts the KV "
                "figure here (all layers full) is an upper bound"),
    Model("gpt-oss-20b", 20.91e9, 24, 64, 8, 64, 2880,
          "OpenAI gpt-oss model card (20.91B total, 3.61B active) and config.json",
          active_params=3.61e9,
          notes="experts (90%+ of the weights) ship in MXFP4, the rest in BF16; every other layer "
                "attends to a 128-token window, so the KV figure (all layers full) is an upper bound"),
    Model("gpt-oss-120b", 116.83e9, 36, 64, 8, 64, 2880,
          "OpenAI gpt-oss model card (116.83B total, 5.13B active; checkpoint 60.8 GiB) and "
          "config.json", active_params=5.13e9,
          notes="experts ship in MXFP4, the rest in BF16; alternate layers use a 128-token "
                "sliding window, so the KV figure (all layers full) is an upper bound"),
    Model("DeepSeek-V3", 671e9, 61, 128, 128, 128, 7168,
          "DeepSeek-V3 technical report (671B total, 37B active; 61 layers; MLA with "
          "kv_lora_rank 512 and a 64-dim decoupled RoPE key) and config.json",
          active_params=37e9, kv_latent_dim=576,
          notes="MLA caches one 512-value latent (shared by K and V) plus one 64-value RoPE key "
                "per layer: 576 values, with no factor 2. The 14B multi-token-prediction module "
                "is not counted. Trained and released in FP8."),
]}
MODEL_ALIASES = {"8B": "Llama 3.1 8B", "70B": "Llama 3.1 70B", "405B": "Llama 3.1 405B",
                 "Llama 8B": "Llama 3.1 8B", "Llama 70B": "Llama 3.1 70B",
                 "Llama 405B": "Llama 3.1 405B", "Gemma 27B": "Gemma 2 27B",
                 "DeepSeek V3": "DeepSeek-V3"}


def get_model(name) -> Model:
    """The ``Model`` called ``name`` (``"70B"`` means Llama 3.1 70B). Lesson 00."""
    if isinstance(name, Model):
        return name
    return _lookup("model", name, MODELS, MODEL_ALIASES)


def _params(model) -> float:
    """Parameters of a model given by name, as a ``Model``, or as a plain count."""
    if isinstance(model, (str, Model)):
        return get_model(model).params
    return _positive("parameter count", model)


# ---------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------

def weight_gb_from_bits(params: float, bits: float, group_size: int | None = None,
                        scale_bits: float = 16) -> float:
    """Weights in decimal GB: ``params x (bits + scale_bits / group_size) / 8 / 1e9`` (lesson 00).

    70.6e9 parameters at 16 bits -> 141.2 GB; at 4 bits with group-128 16-bit scales -> 36.4 GB.
    """
    params = _positive("params", params)
    return params * bits_with_scales(bits, group_size, scale_bits) / 8 / GB


def weight_bytes(model, fmt="bf16") -> float:
    """Bytes to store every weight of ``model`` (a name, a ``Model`` or a parameter count)
    in ``fmt`` (a format name or bits per weight). Lesson 00."""
    return _params(model) * bits_per_weight(fmt) / 8


def weight_gb(model, fmt="bf16") -> float:
    """``weight_bytes`` in decimal GB (70B in bf16 -> 141.2). Lesson 00."""
    return weight_bytes(model, fmt) / GB


def bytes_read_per_token(model, fmt="bf16") -> float:
    """Weight bytes one token's decode step reads: all weights for a dense model, the
    active ones for a mixture of experts. Lesson 00."""
    if isinstance(model, (str, Model)):
        return get_model(model).params_per_token * bits_per_weight(fmt) / 8
    return weight_bytes(model, fmt)


def llama_q4_k_m_bits(layers: int, hidden: int, ffn: int, kv_dim: int, vocab: int) -> dict:
    """Size of llama.cpp's Q4_K_M mix for a Llama-architecture model with an untied output
    head, from its shapes alone (lesson 03): every tensor priced in the type
    ``kmix.llama_type`` gives it (``attn_v`` and ``ffn_down`` in Q6_K in the layers
    ``kmix.use_more_bits`` picks, the output head in Q6_K, the rest Q4_K, 32-block fallbacks
    where a row is not a multiple of 256 wide), the token embedding in Q4_K (llama.cpp leaves
    it at the mix's base type) and the norms in F32. ``kv_dim`` = KV heads x head dim.
    Not modelled: llama.cpp's extra rules for 70B-class models (``LLM_TYPE_70B``: attn_v
    Q4_K -> Q5_K), fused QKV tensors and experts (``src/llama-quant.cpp``, 0.3.36 sdist).

    Returns ``{"weights", "bytes", "bits_per_weight", "by_type": {type: weights}}``.
    Llama-3.1-8B (32, 4096, 14336, 1024, 128256) -> 8,030,261,248 weights, 4.58 GiB,
    4.8944 bits per weight: the figures llama.cpp's ``tools/quantize/README.md`` lists.
    """
    from course_lib import kmix, kquants

    layers, hidden, ffn = (_positive_int(n, v) for n, v in
                           (("layers", layers), ("hidden", hidden), ("ffn", ffn)))
    kv_dim, vocab = _positive_int("kv_dim", kv_dim), _positive_int("vocab", vocab)
    tensors = [("token_embd.weight", vocab, hidden), ("output.weight", vocab, hidden)]
    for i in range(layers):   # (name, rows, row width): a Linear weight is (out, in)
        tensors += [(f"blk.{i}.attn_q.weight", hidden, hidden),
                    (f"blk.{i}.attn_k.weight", kv_dim, hidden),
                    (f"blk.{i}.attn_v.weight", kv_dim, hidden),
                    (f"blk.{i}.attn_output.weight", hidden, hidden),
                    (f"blk.{i}.ffn_gate.weight", ffn, hidden),
                    (f"blk.{i}.ffn_up.weight", ffn, hidden),
                    (f"blk.{i}.ffn_down.weight", hidden, ffn)]
    by_type, total_bytes = {}, 0
    for name, rows, cols in tensors:
        if name == "token_embd.weight":
            fmt = "q4_k" if kquants.fits("q4_k", cols) else kmix.FALLBACK["q4_k"]
        else:
            fmt = kmix.llama_type("q4_k_m", name, cols, layers, tied=False).stored
        if fmt == "f16" or not kquants.fits(fmt, cols):
            raise ValueError(f"{name}: rows {cols} wide fit no k-quant or 32-block format")
        total_bytes += rows * kquants.row_bytes(fmt, cols)
        by_type[fmt] = by_type.get(fmt, 0) + rows * cols
    norms = (2 * layers + 1) * hidden                 # attn_norm, ffn_norm per layer; output_norm
    by_type["f32"] = norms
    total_bytes += 4 * norms
    weights = sum(by_type.values())
    return {"weights": weights, "bytes": total_bytes,
            "bits_per_weight": 8 * total_bytes / weights, "by_type": by_type}


# ---------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------

def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int,
                       bytes_per_value: float = 2.0) -> float:
    """KV-cache bytes per token: ``2 (K and V) x layers x kv_heads x head_dim x bytes``.

    Llama 3.1 70B (80 layers, 8 KV heads, head dim 128) in BF16 -> 327,680 B = 320 KiB.
    Lessons 00 and 11.
    """
    layers = _positive_int("layers", layers)
    kv_heads = _positive_int("kv_heads", kv_heads)
    head_dim = _positive_int("head_dim", head_dim)
    return 2 * layers * kv_heads * head_dim * _positive("bytes_per_value", bytes_per_value)


def kv_bytes_per_token_from_config(config: dict, bytes_per_value: float = 2.0) -> float:
    """KV bytes per token from a Hugging Face style ``config.json`` dict (lesson 00).

    Reads ``num_hidden_layers`` and ``num_key_value_heads`` (missing -> equal to
    ``num_attention_heads``: plain multi-head attention) and ``head_dim`` (missing ->
    ``hidden_size // num_attention_heads``), as transformers does.
    """
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict like a config.json, got {type(config).__name__}")
    missing = [k for k in ("num_hidden_layers", "num_attention_heads") if k not in config]
    if missing:
        raise ValueError(f"config lacks {missing}; it has {sorted(config)}")
    heads = _positive_int("num_attention_heads", config["num_attention_heads"])
    kv_heads = config.get("num_key_value_heads")
    if kv_heads is None:
        kv_heads = heads                            # plain multi-head attention
    kv_heads = _positive_int("num_key_value_heads", kv_heads)
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads "
                         f"{kv_heads}: grouped-query attention shares each KV head among a whole "
                         f"number of query heads; check the config")
    head_dim = config.get("head_dim")
    if head_dim is None:
        if "hidden_size" not in config:
            raise ValueError("config has neither head_dim nor hidden_size to derive it from")
        if config["hidden_size"] % heads:
            raise ValueError(f"hidden_size {config['hidden_size']} is not a multiple of "
                             f"num_attention_heads {heads}, so head_dim cannot be derived; "
                             f"this config needs an explicit head_dim")
        head_dim = config["hidden_size"] // heads
    return kv_bytes_per_token(config["num_hidden_layers"], kv_heads, head_dim, bytes_per_value)


def model_kv_bytes_per_token(model, kv_format="bf16") -> float:
    """KV bytes per token for a catalogue model in ``kv_format`` (``"bf16"``, ``"fp8"``, or
    bits). Multi-head latent attention (DeepSeek-V3) caches ``layers x kv_latent_dim``
    values instead of ``2 x layers x kv_heads x head_dim``. Lessons 00 and 11."""
    m = get_model(model)
    value_bytes = bits_per_weight(kv_format) / 8
    if m.kv_latent_dim is not None:
        return m.layers * m.kv_latent_dim * value_bytes
    return kv_bytes_per_token(m.layers, m.kv_heads, m.head_dim, value_bytes)


def kv_cache_gb(model, tokens: int, kv_format="bf16") -> float:
    """KV cache in decimal GB for ``tokens`` tokens in total (all users together). Lesson 00."""
    tokens = _count("tokens", tokens)
    return model_kv_bytes_per_token(model, kv_format) * tokens / GB


def conversations_that_fit(gpu_memory_gb: float, usable_fraction: float, weight_gb: float,
                           kv_bytes_per_token: float, tokens_per_conversation: int) -> int:
    """Whole conversations whose KV cache fits next to the weights on one GPU (lesson 00):
    ``floor((gpu_memory_gb x usable_fraction - weight_gb) x 1e9 / (kv_bytes_per_token x
    tokens_per_conversation))``, and 0 when the weights leave no room.

    70B KV (327,680 B/token), 8,000 tokens (2.62 GB) each, an 80 GB H100 at 90% (72 GB)
    holding 36.4 GB of INT4 group-128 weights -> 13.
    """
    memory = _positive("gpu_memory_gb", gpu_memory_gb)
    fraction = _fraction("usable_fraction", usable_fraction)
    weights = _positive("weight_gb", weight_gb, allow_zero=True)
    per_conversation = (_positive("kv_bytes_per_token", kv_bytes_per_token)
                        * _positive_int("tokens_per_conversation", tokens_per_conversation))
    free_bytes = (memory * fraction - weights) * GB
    if free_bytes <= 0:
        return 0
    return int(free_bytes // per_conversation)


# ---------------------------------------------------------------------------------------
# Decode time
# ---------------------------------------------------------------------------------------

def decode_floor_ms(weight_bytes: float, bandwidth_tbps: float, n_gpus: int = 1) -> float:
    """The fastest one token can be: every weight read once, ``weight_bytes / (n_gpus x
    bandwidth)``, in ms. With tensor parallelism each GPU reads its share at the same time.

    141.2e9 B on one H100 (3.35 TB/s) -> 42.1 ms. Lesson 00.
    """
    weight_bytes = _positive("weight_bytes", weight_bytes)
    bandwidth = _positive("bandwidth_tbps", bandwidth_tbps)
    n_gpus = _positive_int("n_gpus", n_gpus)
    return weight_bytes / (n_gpus * bandwidth * TB) * 1e3


def tokens_per_second_ceiling(weight_bytes: float, bandwidth_tbps: float, n_gpus: int = 1,
                              efficiency: float = 1.0) -> float:
    """One user's decode-speed ceiling, ``1000 / decode_floor_ms``, at ``efficiency`` x peak
    bandwidth (1.0: the datasheet figure; 0.7: a realistic kernel). Lesson 00.

    Llama 3.1 8B in BF16 (16.06 GB) on an H100 -> 209 tokens/s at peak.
    """
    efficiency = _fraction("efficiency", efficiency)
    return 1e3 / decode_floor_ms(weight_bytes, bandwidth_tbps * efficiency, n_gpus)


def batched_step_ms(weight_bytes: float, kv_bytes: float, bandwidth_tbps: float,
                    n_gpus: int = 1) -> float:
    """One decode step for a whole batch: the weights once plus every user's KV cache,
    ``(weight_bytes + kv_bytes) / (n_gpus x bandwidth)``, in ms. Lesson 00.

    Llama 3.1 8B, 64 users x 4,096 tokens: (16.06 + 34.36) GB / 3.35 TB/s -> 15.1 ms.
    """
    weight_bytes = _positive("weight_bytes", weight_bytes)
    kv_bytes = _positive("kv_bytes", kv_bytes, allow_zero=True)
    bandwidth = _positive("bandwidth_tbps", bandwidth_tbps)
    n_gpus = _positive_int("n_gpus", n_gpus)
    return (weight_bytes + kv_bytes) / (n_gpus * bandwidth * TB) * 1e3


def batch_tokens_per_second(batch: int, step_ms: float) -> float:
    """Tokens per second for the batch: one token per user per step. Lesson 00."""
    return _positive_int("batch", batch) / _positive("step_ms", step_ms) * 1e3


# ---------------------------------------------------------------------------------------
# A serving plan: fits, servable, how many GPUs, how fast
# ---------------------------------------------------------------------------------------

@dataclass
class Plan:
    """What ``plan`` worked out for one replica (all memory figures in decimal GB)."""
    model: str
    fmt: str
    gpu: str
    n_gpus: int
    batch: int
    context: int
    kv_format: str
    weights_gb: float          # the whole model
    kv_gb: float               # every user's cache at full context
    workspace_gb: float        # per GPU
    usable_gb_per_gpu: float
    need_gb_per_gpu: float     # weights/n + kv/n + workspace
    fits: bool                 # the weights alone fit in the GPUs' memory
    servable: bool             # weights + workspace + KV fit in the usable memory
    max_conversations: int     # at this context, in what is left after weights and workspace
    floor_ms: float            # one user, weights only, at peak bandwidth
    tokens_per_s_peak: float
    tokens_per_s_realistic: float
    step_ms: float             # the whole batch, weights + KV, at peak bandwidth
    batch_tokens_per_s: float
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """A few lines in words (the widget shows the same)."""
        verdict = ("servable" if self.servable else
                   "fits, but NOT servable" if self.fits else "does NOT fit")
        return "\n".join([
            f"{self.model} in {self.fmt} on {self.n_gpus} x {self.gpu}: {verdict}",
            f"  weights {self.weights_gb:.1f} GB, KV cache {self.kv_gb:.1f} GB "
            f"({self.batch} x {self.context:,} tokens, {self.kv_format}), "
            f"workspace {self.workspace_gb:.1f} GB per GPU",
            f"  per GPU: need {self.need_gb_per_gpu:.1f} GB of {self.usable_gb_per_gpu:.1f} GB usable;"
            f" room for {self.max_conversations} conversations of {self.context:,} tokens",
            f"  one user: floor {self.floor_ms:.1f} ms/token -> {self.tokens_per_s_peak:.0f} tok/s "
            f"at peak, {self.tokens_per_s_realistic:.0f} at {REALISTIC_EFFICIENCY:.0%}",
            f"  batch of {self.batch}: step {self.step_ms:.1f} ms -> "
            f"{self.batch_tokens_per_s:,.0f} tok/s",
        ] + [f"  note: {n}" for n in self.notes])


def plan(model, fmt="bf16", gpu="H100 SXM", batch: int = 1, context: int = 4096,
         kv_format="bf16", n_gpus: int = 1, workspace_gb: float = DEFAULT_WORKSPACE_GB,
         usable_fraction: float = USABLE_FRACTION) -> Plan:
    """Price one replica: memory per GPU, fits vs servable, decode floor and batch step
    (lesson 00, the bill widget).

    Tensor parallelism over ``n_gpus`` splits weights and KV cache evenly. For a mixture of
    experts a batched step reads at most ``batch x active`` weights, never more than all.
    """
    m, g = get_model(model), get_gpu(gpu)
    batch, context = _positive_int("batch", batch), _positive_int("context", context)
    n_gpus = _positive_int("n_gpus", n_gpus)
    workspace = _positive("workspace_gb", workspace_gb, allow_zero=True)
    fmt_name = fmt if isinstance(fmt, str) else f"{bits_per_weight(fmt):g} bits"
    kv_name = kv_format if isinstance(kv_format, str) else f"{bits_per_weight(kv_format):g} bits"
    w_gb = weight_gb(m, fmt)
    kv_token = model_kv_bytes_per_token(m, kv_format)
    kv_gb = kv_token * batch * context / GB
    usable = g.usable_gb(usable_fraction)
    need = (w_gb + kv_gb) / n_gpus + workspace
    room_gb = (usable - workspace) * n_gpus - w_gb
    max_conv = max(0, int(room_gb * GB // (kv_token * context))) if room_gb > 0 else 0
    read_1 = bytes_read_per_token(m, fmt)
    read_b = min(weight_bytes(m, fmt), read_1 * batch)
    floor = decode_floor_ms(read_1, g.bandwidth_tbps, n_gpus)
    step = batched_step_ms(read_b, kv_gb * GB, g.bandwidth_tbps, n_gpus)
    notes = []
    if m.notes:
        notes.append(m.notes)
    if fmt_name in ("fp8", "fp4", "mxfp4", "nvfp4") and g.native_tflops(fmt_name) is None:
        notes.append(f"{g.name} has no native {fmt_name} maths: weights are unpacked to 16-bit "
                     "(memory and decode bandwidth saved, compute not)")
    return Plan(m.name, fmt_name, g.name, n_gpus, batch, context, kv_name, w_gb, kv_gb,
                workspace, usable, need, w_gb / n_gpus <= g.memory_gb, need <= usable, max_conv,
                floor, 1e3 / floor, 1e3 / floor * REALISTIC_EFFICIENCY, step,
                batch_tokens_per_second(batch, step), notes)


def gpus_per_replica(model, fmt="bf16", gpu="H100 SXM", batch: int = 1, context: int = 4096,
                     kv_format="bf16", workspace_gb: float = DEFAULT_WORKSPACE_GB,
                     usable_fraction: float = USABLE_FRACTION,
                     choices: tuple[int, ...] = (1, 2, 4, 8)) -> int | None:
    """Fewest GPUs (tensor-parallel sizes in ``choices``) on which ``batch`` conversations of
    ``context`` tokens are servable; None when even the largest is not enough. Lesson 00.

    Llama 3.1 70B on H100s: 4 in bf16, 2 in fp8.
    """
    choices = [_positive_int("a tensor-parallel size in choices", n) for n in choices]
    if not choices:
        raise ValueError("choices is empty: give the tensor-parallel sizes to try, e.g. (1, 2, 4, 8)")
    for n in sorted(choices):
        if plan(model, fmt, gpu, batch, context, kv_format, n, workspace_gb,
                usable_fraction).servable:
            return n
    return None


def decode_floor_table(bandwidth_tbps: float, models=None, formats=("bf16", "fp8", "int4_g128"),
                       ) -> list[tuple[str, str, float, float]]:
    """Rows ``(model, format, floor_ms, tokens_per_s)`` for one user at ``bandwidth_tbps``
    (e.g. this machine's measured bandwidth; lesson 00). MoE models read their active weights."""
    if not formats:
        raise ValueError("formats is empty: name at least one, e.g. ('bf16', 'int4_g128')")
    _positive("bandwidth_tbps", bandwidth_tbps)
    rows = []
    for name in models or MODELS:
        for fmt in formats:
            floor = decode_floor_ms(bytes_read_per_token(name, fmt), bandwidth_tbps)
            rows.append((get_model(name).name, fmt, floor, 1e3 / floor))
    return rows


def format_table(rows, headers) -> str:
    """Plain-text table (no pandas needed): numbers to 4 significant figures, big ones with commas."""
    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, (int, float)):
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.4g}"
        if isinstance(v, tuple):
            return ".".join(map(str, v))
        return str(v)
    if isinstance(rows, (str, bytes)) or not hasattr(rows, "__iter__") or \
            isinstance(headers, (str, bytes)) or not hasattr(headers, "__len__") or not headers:
        raise ValueError(f"format_table(rows, headers): rows a list of rows (each a list or "
                         f"tuple of values), headers a non-empty list of column names; got "
                         f"rows={rows!r:.60}, headers={headers!r:.60}")
    rows = list(rows)
    bad = [r for r in rows if len(r) != len(headers)]
    if bad:
        raise ValueError(f"format_table: {len(headers)} headers but a row has {len(bad[0])} "
                         f"values: {bad[0]!r}")
    text = [[cell(v) for v in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in text]) for i, h in enumerate(headers)]
    line = lambda vals: "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                                  for i, (v, w) in enumerate(zip(vals, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in text])


def gpu_table() -> str:
    """The GPU catalogue as text (lesson 00)."""
    rows = [(g.name, g.memory_gb, g.bandwidth_tbps, g.bf16_tflops, g.fp8_tflops, g.int8_tops,
             g.fp4_tflops, g.compute_capability or g.arch) for g in GPUS.values()]
    return format_table(rows, ["GPU", "GB", "TB/s", "BF16 TF", "FP8 TF", "INT8 TOPS", "FP4 TF",
                               "cc / arch"])


def model_table() -> str:
    """The model catalogue as text, with BF16 weights and KV per token (lesson 00)."""
    rows = [(m.name, m.params / 1e9, (m.active_params or m.params) / 1e9, m.layers, m.kv_heads,
             m.head_dim, weight_gb(m, "bf16"), model_kv_bytes_per_token(m) / 1024)
            for m in MODELS.values()]
    return format_table(rows, ["model", "params B", "active B", "layers", "KV heads", "head dim",
                               "BF16 GB", "KV KiB/token"])


__all__ = [
    "GB", "GIB", "TB", "USABLE_FRACTION", "DEFAULT_WORKSPACE_GB", "REALISTIC_EFFICIENCY",
    "Format", "FORMATS", "get_format", "bits_per_weight", "bits_with_scales",
    "GPU", "GPUS", "get_gpu", "catalogue_gpu", "Model", "MODELS", "get_model",
    "weight_gb_from_bits", "weight_bytes", "weight_gb", "bytes_read_per_token", "llama_q4_k_m_bits",
    "kv_bytes_per_token", "kv_bytes_per_token_from_config", "model_kv_bytes_per_token",
    "kv_cache_gb", "conversations_that_fit", "decode_floor_ms", "tokens_per_second_ceiling",
    "batched_step_ms", "batch_tokens_per_second", "Plan", "plan", "gpus_per_replica",
    "decode_floor_table", "format_table", "gpu_table", "model_table",
    "FP32_LANES_PER_SM", "DEFAULT_LATENCY_US", "fp32_lanes_per_sm", "issue_budget",
    "ISSUE_LANES_PER_SM",
    "gpu_issue_budget", "device_issue_budget", "bytes_in_flight_per_sm",
    "gemv_bytes_in_flight_per_sm", "KERNEL_SUPPORT", "kernel_support",
]
