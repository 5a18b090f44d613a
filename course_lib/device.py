"""What machine is this? GPU detection, native formats and Triton's interpreter mode.

Taught in every notebook's first cell (``device.summary()``), and in lesson 09 (kernels).

On a machine without a CUDA GPU, Triton kernels can still run through the Triton
interpreter, but only if ``TRITON_INTERPRET=1`` is set *before* ``import triton``.
``ensure_triton_mode()`` does that, and ``kernels`` calls it before importing triton.
"""
from __future__ import annotations

import os
import platform
import re
import sys
from dataclasses import dataclass, field

# The oldest torch the course's code can run on: torch.float4_e2m1fn_x2 (lesson 01's FP4
# storage) appeared in torch 2.8. The course is tested with 2.13.0 (requirements.txt); a hosted
# notebook keeps its own torch if it is at least this (requirements-hosted.txt).
TORCH_FLOOR = (2, 8)

# Minimum CUDA compute capability for native maths in each format (lesson 09, lesson 12).
# FP8 tensor-core maths: Ada (8.9), Hopper (9.0), Blackwell (10.x, 12.x).
# FP4 (NVFP4 / MXFP4) tensor-core maths: Blackwell only (10.0+).
NATIVE_FORMAT_MIN_CC = {
    "fp32": (0, 0),
    "fp16": (7, 0),   # tensor cores from Volta
    "int8": (7, 5),   # INT8 tensor cores from Turing
    "bf16": (8, 0),   # Ampere
    "fp8": (8, 9),    # Ada, Hopper, Blackwell
    "fp4": (10, 0),   # Blackwell
}


@dataclass
class DeviceInfo:
    """What ``detect()`` found. ``kind`` is "cuda" or "cpu"."""
    kind: str
    name: str
    compute_capability: tuple[int, int] | None = None
    memory_gb: float | None = None
    cpu_count: int = 1
    triton_interpret: bool = False
    native_formats: list[str] = field(default_factory=list)

    @property
    def has_gpu(self) -> bool:
        return self.kind == "cuda"


def native_formats_for(compute_capability: tuple[int, int] | None) -> list[str]:
    """Formats whose matrix maths runs natively at this compute capability (lesson 09).

    ``None`` means a CPU: we list fp32 and bf16 (CPUs compute both, bf16 often emulated).
    """
    if compute_capability is None:
        return ["fp32", "bf16"]
    cc = compute_capability
    if not (isinstance(cc, (tuple, list)) and len(cc) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in cc)):
        raise ValueError(f"compute_capability must be a (major, minor) pair of whole numbers such "
                         f"as (8, 9), or None for a CPU; got {cc!r}")
    return [f for f, cc in NATIVE_FORMAT_MIN_CC.items() if tuple(compute_capability) >= cc]


def torch_version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as "2.13.0+cpu" or "2.9.0a0+git1234"."""
    m = re.match(r"^(\d+)\.(\d+)", str(version))
    if not m:
        raise ValueError(f"not a torch version: {version!r} (expected something like '2.13.0')")
    return int(m.group(1)), int(m.group(2))


def check_torch_version(version: str | None = None) -> str:
    """Raise a clear error when torch is older than the course's code needs (``TORCH_FLOOR``);
    return the version checked (lesson 00's hosted-install cell, every ``summary()``)."""
    if version is None:
        import torch
        version = torch.__version__
    if torch_version_tuple(version) < TORCH_FLOOR:
        floor = ".".join(map(str, TORCH_FLOOR))
        raise RuntimeError(
            f"torch {version} is older than the course needs (torch>={floor}: its FP4 and FP8 "
            f"dtypes). Upgrade it (pip install 'torch>={floor}'), or install the course's own "
            f"pinned environment (make setup) instead of the hosted one.")
    return str(version)


def mps_available() -> bool:
    """Apple Silicon's GPU through torch's Metal backend (MPS). Untested by the course's CI,
    which has no Mac: the paths that use it are kept small and guarded."""
    import torch

    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def require_mps(what: str) -> None:
    """Raise a clear error when an Apple-GPU path is called where torch has no MPS (lessons 00, 10)."""
    if not mps_available():
        raise RuntimeError(
            f"{what} needs Apple Silicon's GPU through torch's MPS backend, and this machine has "
            "none (torch.backends.mps.is_available() is False). Use device='cpu', or 'cuda' on "
            "an NVIDIA GPU.")


def synchronize(device: str) -> None:
    """Wait for the device's queued work (a CPU runs eagerly: nothing to wait for)."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def triton_status() -> tuple[bool, str]:
    """(True, "") when Triton can be imported here; else (False, one line saying why).

    Triton has wheels for Linux only (x86_64, aarch64): on macOS and Windows it is not
    installed, and lessons 09-11 show the kernels' source, their plain-torch references and the
    committed compile reports instead of launching them. ``COURSE_NO_TRITON=1`` makes a Linux
    machine behave the same way (tests: ``make test-no-triton``).
    """
    import importlib.util

    blocked = os.environ.get("COURSE_NO_TRITON") == "1"
    try:
        found = importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        found = False
    if found and not blocked:
        return True, ""
    why = ("blocked (COURSE_NO_TRITON=1, as on macOS or Windows)" if blocked else
           "not installed (the package index has Triton wheels for Linux only)")
    return False, (f"Triton {why}: kernels are shown (source, plain-torch reference, compile "
                   f"report), not launched")


def _cuda_available() -> bool:
    import torch  # imported here so `import course_lib.device` stays cheap

    return torch.cuda.is_available()


def ensure_triton_mode() -> bool:
    """Put Triton in interpreter mode when there is no CUDA GPU; return True if interpreting.

    Must run before ``import triton``. If triton was already imported without the variable
    on a CPU machine, kernels would fail later with "0 active drivers": we raise now instead,
    with what to do.
    """
    if _cuda_available():
        return os.environ.get("TRITON_INTERPRET") == "1"
    if os.environ.get("TRITON_INTERPRET") != "1":
        if "triton" in sys.modules:
            raise RuntimeError(
                "triton was imported before course_lib could set TRITON_INTERPRET=1, and this "
                "machine has no CUDA GPU, so Triton kernels cannot launch. Restart the kernel and "
                "import course_lib (or kernels) before triton, or set TRITON_INTERPRET=1 yourself "
                "before importing triton."
            )
        os.environ["TRITON_INTERPRET"] = "1"
    return True


def detect() -> DeviceInfo:
    """Detect the GPU (name, compute capability, memory) or its absence (every notebook)."""
    import torch

    interpret = ensure_triton_mode()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        cc = (props.major, props.minor)
        return DeviceInfo(
            kind="cuda",
            name=props.name,
            compute_capability=cc,
            memory_gb=props.total_memory / 1e9,
            cpu_count=os.cpu_count() or 1,
            triton_interpret=interpret,
            native_formats=native_formats_for(cc),
        )
    name = platform.processor() or platform.machine() or "CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return DeviceInfo(
        kind="cpu",
        name=name,
        cpu_count=os.cpu_count() or 1,
        triton_interpret=interpret,
        native_formats=native_formats_for(None),
    )


def require_gpu(what: str) -> None:
    """Raise a clear error when a GPU-only path is called on a CPU machine (lessons 09-10)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{what} needs a CUDA GPU and this machine has none. On a CPU, use the plain-torch "
            "reference or the Triton interpreter on small shapes (TRITON_INTERPRET=1), as the "
            "lesson's CPU cells do."
        )


def summary(info: DeviceInfo | None = None) -> DeviceInfo:
    """Print what this machine is and what it computes natively (first cell of every notebook)."""
    import torch

    if info is not None and not isinstance(info, DeviceInfo):
        raise TypeError(f"info must be a DeviceInfo from device.detect(), or None to detect "
                        f"this machine; got {type(info).__name__}")
    info = info or detect()
    check_torch_version()
    print(f"Python {platform.python_version()}, torch {torch.__version__}")
    triton_ok, triton_why = triton_status()
    if info.has_gpu:
        cc = ".".join(map(str, info.compute_capability))
        print(f"GPU: {info.name}, compute capability {cc}, {info.memory_gb:.0f} GB")
        print("Triton: native kernels on the GPU" if triton_ok else triton_why)
    else:
        print(f"No CUDA GPU: running on the CPU ({info.name}, {info.cpu_count} cores)")
        if mps_available():
            print("Apple GPU (MPS) found: lessons 00 and 10 also time torch on it (these paths are "
                  "untested by the course's CI, which has no Mac)")
        print("Triton: interpreter mode (TRITON_INTERPRET=1): correct but slow, never timed"
              if triton_ok else triton_why)
        print("GPU-only cells will say what they skip.")
    print("Native matrix maths here:", ", ".join(info.native_formats))
    missing = [f for f in ("fp8", "fp4") if f not in info.native_formats]
    if missing:
        print("Emulated (not native) here:", ", ".join(missing),
              "(FP8 needs compute capability 8.9+, FP4 needs Blackwell 10.0+)")
    return info


# ---- what a computed number depends on (docs/cpu_dispatch.md) ------------------------------

# The CPU features that change which kernels torch and its BLAS dispatch to, and so the order
# in which sums are taken: the numbers downstream of a rounding decision move with them.
ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni",
             "amx_tile", "amx_bf16", "amx_int8", "neon", "asimd", "sve")
# Environment variables that make one machine dispatch like another (docs/cpu_dispatch.md).
DISPATCH_VARS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
                 "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _cpuinfo() -> tuple[str, list[str]]:
    """(model name, flags) from /proc/cpuinfo on Linux, from sysctl on macOS; ('', []) where
    neither answers."""
    name, flags = "", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not name:
                    name = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = value.split()
    except OSError:
        pass
    if sys.platform == "darwin" and not name:
        name = _sysctl("machdep.cpu.brand_string")
        flags = (_sysctl("machdep.cpu.features") + " " + _sysctl("machdep.cpu.leaf7_features")
                 ).lower().replace("avx1.0", "avx").replace(".", "_").split()
        if platform.machine() == "arm64":     # Advanced SIMD is part of every Apple core
            flags += ["neon", "asimd"]
    return name, flags


def _sysctl(key: str) -> str:
    import subprocess
    try:
        return subprocess.run(["sysctl", "-n", key], capture_output=True, text=True,
                              timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_record() -> dict:
    """What a committed number was computed on: CPU model and the ISA flags that steer dispatch,
    torch and its BLAS, the CPU capability torch's kernels run at, threads, and any dispatch
    variables set. Every writer of ``results/*.json`` stores this under ``"machine"``."""
    import torch

    name, flags = _cpuinfo()
    config = torch.__config__.show()
    blas = next((part.split("=", 1)[1] for part in config.replace(",", " ").split()
                 if part.startswith("BLAS_INFO=")), "")
    mkl = next((line.strip(" -") for line in config.splitlines() if "Math Kernel Library" in line), "")
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # an older torch
        capability = ""
    return {
        "cpu": name or platform.processor() or platform.machine(),
        "arch": platform.machine(),
        "isa_flags": [f for f in ISA_FLAGS if f in flags],
        "logical_cpus": os.cpu_count(),
        "torch": torch.__version__,
        "blas": blas + (f" ({mkl})" if mkl else ""),
        "torch_cpu_capability": capability,
        "torch_threads": torch.get_num_threads(),
        "dispatch_env": {k: os.environ[k] for k in DISPATCH_VARS if k in os.environ},
        "python": platform.python_version(),
    }
