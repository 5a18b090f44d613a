"""Measure this machine's memory bandwidth with large copies (lesson 00; used again in 10).

Decode reads every weight once per token, so its floor is ``bytes / bandwidth``. The
datasheet gives a GPU's peak; this module measures what a plain copy reaches here:

- CPU: ``dst.copy_(src)`` on tensors much larger than the caches, timed with
  ``time.perf_counter``.
- GPU (only when CUDA exists): a device-to-device ``copy_`` timed with CUDA events.

A copy reads ``n`` bytes and writes ``n`` bytes, so each copy counts ``2 n`` bytes moved.
``measure_read_bandwidth`` only reads (a sum over the tensor), as a GEMV does with its
weights: a read stream often runs faster than a copy, so a GEMV can pass 100% of the copy
figure, and "% of read bandwidth" is the fairer yardstick for it (lesson 10).
After a warm-up (first touch of the pages, clock ramp-up) we keep the median of the
repeats: one noisy sample (another process, an interrupt) does not move it.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from numbers import Real

MB = 1e6  # bytes in a (decimal) megabyte


@dataclass
class BandwidthResult:
    """What ``measure_copy_bandwidth`` found; ``median_gbps`` is the figure to use."""
    device: str                 # "cpu", "cuda:0" or "mps"
    device_name: str            # e.g. "AMD EPYC" or "NVIDIA H100 80GB HBM3"
    bytes_per_copy: int         # size of the source tensor
    bytes_moved: int            # per copy: read + written = 2 x bytes_per_copy
    samples_gbps: list[float] = field(default_factory=list)

    def __post_init__(self):
        for name in ("bytes_per_copy", "bytes_moved"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a whole number of bytes, 1 or more; got {v!r}")
        if not self.samples_gbps:
            raise ValueError("samples_gbps is empty: time at least one copy (repeats >= 1)")
        bad = [g for g in self.samples_gbps
               if isinstance(g, bool) or not isinstance(g, Real) or not 0 < g < math.inf]
        if bad:
            raise ValueError(f"samples_gbps must be positive finite GB/s figures; got {bad[:3]} "
                             "(a copy that took 0 s: use a larger size_mb)")

    @property
    def median_gbps(self) -> float:
        """Median over the repeats, in GB/s (1 GB = 1e9 bytes)."""
        return statistics.median(self.samples_gbps)

    @property
    def median_tbps(self) -> float:
        """The same in TB/s, the unit of GPU datasheets and ``course_lib.hardware``."""
        return self.median_gbps / 1e3

    def __str__(self) -> str:
        lo, hi = min(self.samples_gbps), max(self.samples_gbps)
        head = (f"{self.device} ({self.device_name}): "
                f"{'read' if self.bytes_moved == self.bytes_per_copy else 'copy'} bandwidth "
                f"{self.median_gbps:.1f} GB/s median of {len(self.samples_gbps)} "
                f"(range {lo:.1f}-{hi:.1f}), ")
        if self.bytes_moved == self.bytes_per_copy:          # measure_read_bandwidth
            return head + f"{self.bytes_per_copy / MB:.0f} MB read per pass"
        return head + (f"{self.bytes_per_copy / MB:.0f} MB copied, {self.bytes_moved / MB:.0f} "
                       "MB moved per copy (read + write)")


def _check_device(device) -> None:
    if not isinstance(device, str) or device not in ("auto", "cpu", "cuda", "cuda:0", "mps"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'mps' (Apple's GPU), "
                         f"got {device!r}")


def _check(size_mb, repeats, warmup) -> tuple[float, int, int]:
    if isinstance(size_mb, bool) or not isinstance(size_mb, Real) or not size_mb > 0:
        raise ValueError(f"size_mb must be a positive number of megabytes, got {size_mb!r}")
    if size_mb > 1e5:
        raise ValueError(f"size_mb={size_mb} is over 100 GB; use a size that fits in memory "
                         "(a few times the last-level cache is enough)")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a whole number, 1 or more, got {repeats!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a whole number, 0 or more, got {warmup!r}")
    return float(size_mb), repeats, warmup


def _resolve(what: str, device, size_mb, repeats, warmup) -> tuple[str, float, int, int]:
    """The device to measure ("cpu", "cuda" or "mps"; "auto" never picks MPS), refused with a
    clear message where it is absent, and the checked sizes (default 256 MB on a CPU, 1 GB on
    a GPU)."""
    import torch

    from course_lib.device import require_gpu, require_mps

    _check_device(device)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = "cuda" if device.startswith("cuda") else device
    if device == "cuda":
        require_gpu(f"{what}(device='cuda')")
    elif device == "mps":
        require_mps(f"{what}(device='mps')")
    default_mb = 256 if device == "cpu" else 1024
    return (device, *_check(default_mb if size_mb is None else size_mb, repeats, warmup))


def _cpu_name() -> str:
    from course_lib.device import detect

    return detect().name


def _copy_tensors(size_mb: float, device: str):
    import torch

    n = max(1, int(size_mb * MB) // 4)                   # float32 elements
    src = torch.ones(n, dtype=torch.float32, device=device)   # (n,) pages touched now
    dst = torch.empty_like(src)                                # (n,)
    return src, dst, n * 4


MPS_NAME = "Apple GPU (MPS)"


def _host_seconds(fn, device: str) -> float:
    """Seconds of one ``fn()`` by the host clock, the device's queue drained either side."""
    from course_lib.device import synchronize

    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def _measure_host_timed(size_mb: float, repeats: int, warmup: int,
                        device: str = "cpu") -> BandwidthResult:
    """Copy timed by the host clock: the CPU, or Apple's GPU with a synchronize either side
    (MPS has no timing events the course relies on; untested by CI, which has no Mac)."""
    src, dst, nbytes = _copy_tensors(size_mb, device)
    for _ in range(warmup):
        dst.copy_(src)
    samples = [2 * nbytes / _host_seconds(lambda: dst.copy_(src), device) / 1e9
               for _ in range(repeats)]
    del src, dst
    return BandwidthResult(device, MPS_NAME if device == "mps" else _cpu_name(), nbytes,
                           2 * nbytes, samples)


def _measure_cuda(size_mb: float, repeats: int, warmup: int) -> BandwidthResult:
    import torch

    src, dst, nbytes = _copy_tensors(size_mb, "cuda")
    for _ in range(warmup):
        dst.copy_(src)
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3             # elapsed_time is in ms
        samples.append(2 * nbytes / seconds / 1e9)
    name = torch.cuda.get_device_name(0)
    del src, dst
    torch.cuda.empty_cache()
    return BandwidthResult("cuda:0", name, nbytes, 2 * nbytes, samples)


def measure_copy_bandwidth(device: str = "auto", size_mb: float | None = None,
                           repeats: int = 7, warmup: int = 2) -> BandwidthResult:
    """Measure copy bandwidth on this machine (lesson 00).

    ``device``: ``"cpu"``, ``"cuda"``, ``"mps"`` (Apple Silicon's GPU, asked for explicitly:
    ``"auto"`` never picks it), or ``"auto"`` (the CUDA GPU when there is one).
    ``size_mb``: megabytes copied each time; default 256 on a CPU (well past a 32 MB L3
    cache, so RAM is measured, not cache) and 1024 on a GPU. On a 2-core CPU the default
    takes about a second.
    """
    device, size_mb, repeats, warmup = _resolve("measure_copy_bandwidth", device, size_mb,
                                                repeats, warmup)
    if device == "cuda":
        return _measure_cuda(size_mb, repeats, warmup)
    return _measure_host_timed(size_mb, repeats, warmup, device)


def _measure_read(size_mb: float, repeats: int, warmup: int, device: str) -> BandwidthResult:
    import torch

    n = max(1, int(size_mb * MB) // 4)
    src = torch.ones(n, dtype=torch.float32, device=device)             # (n,) pages touched
    nbytes = n * 4
    cuda = device.startswith("cuda")
    for _ in range(warmup):
        src.sum()
    samples = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            src.sum()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:                                   # the host clock: the CPU, or MPS synchronized
            seconds = _host_seconds(src.sum, device)
        samples.append(nbytes / seconds / 1e9)
    name = torch.cuda.get_device_name(0) if cuda else MPS_NAME if device == "mps" else _cpu_name()
    del src
    if cuda:
        torch.cuda.empty_cache()
    return BandwidthResult("cuda:0" if cuda else device, name, nbytes, nbytes, samples)


def measure_read_bandwidth(device: str = "auto", size_mb: float | None = None,
                           repeats: int = 7, warmup: int = 2) -> BandwidthResult:
    """Measure read-only bandwidth: ``src.sum()`` over a large tensor (lesson 10).

    Counts ``n`` bytes per pass (nothing is written but one number). Same defaults and
    checks as ``measure_copy_bandwidth``.
    """
    device, size_mb, repeats, warmup = _resolve("measure_read_bandwidth", device, size_mb,
                                                repeats, warmup)
    return _measure_read(size_mb, repeats, warmup, device)


__all__ = ["BandwidthResult", "measure_copy_bandwidth", "measure_read_bandwidth"]
