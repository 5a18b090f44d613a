"""course_lib.bandwidth (lesson 00): copy bandwidth is measured, plausible and quick."""
import time

import pytest
import torch

from course_lib.bandwidth import BandwidthResult, measure_copy_bandwidth, measure_read_bandwidth


def test_cpu_copy_bandwidth_is_plausible_and_quick():
    t0 = time.perf_counter()
    r = measure_copy_bandwidth("cpu", size_mb=64, repeats=5, warmup=1)
    assert time.perf_counter() - t0 < 10
    assert isinstance(r, BandwidthResult) and r.device == "cpu" and r.device_name
    assert len(r.samples_gbps) == 5 and all(s > 0 for s in r.samples_gbps)
    # a copy of 64 MB reads and writes it: 128 MB moved
    assert r.bytes_per_copy == 64_000_000 and r.bytes_moved == 2 * r.bytes_per_copy
    # any machine that runs this course moves more than 0.2 GB/s and less than 10 TB/s
    assert 0.2 < r.median_gbps < 10_000
    assert min(r.samples_gbps) <= r.median_gbps <= max(r.samples_gbps)
    assert r.median_tbps == pytest.approx(r.median_gbps / 1e3)
    assert "GB/s" in str(r)


def test_default_size_reaches_past_the_cache():
    r = measure_copy_bandwidth("cpu", repeats=1, warmup=0)
    assert r.bytes_per_copy >= 128e6


@pytest.mark.parametrize("kwargs,message", [
    ({"size_mb": 0}, "size_mb must be a positive number"),
    ({"size_mb": -5}, "size_mb must be a positive number"),
    ({"size_mb": float("nan")}, "size_mb must be a positive number"),
    ({"size_mb": "big"}, "size_mb must be a positive number"),
    ({"size_mb": True}, "size_mb must be a positive number"),
    ({"size_mb": float("inf")}, "over 100 GB"),
    ({"size_mb": 1e9}, "over 100 GB"),
    ({"repeats": 0}, "repeats must be a whole number, 1 or more"),
    ({"repeats": 2.5}, "repeats must be a whole number, 1 or more"),
    ({"repeats": True}, "repeats must be a whole number, 1 or more"),
    ({"warmup": -1}, "warmup must be a whole number, 0 or more"),
    ({"warmup": 0.5}, "warmup must be a whole number, 0 or more"),
    ({"device": "tpu"}, "device must be 'auto', 'cpu', 'cuda' or 'mps'"),
    ({"device": 0}, "device must be 'auto', 'cpu', 'cuda' or 'mps'"),
])
@pytest.mark.parametrize("measure", ["copy", "read"])
def test_bad_arguments_are_refused(kwargs, message, measure):
    from course_lib.bandwidth import measure_read_bandwidth

    fn = measure_copy_bandwidth if measure == "copy" else measure_read_bandwidth
    with pytest.raises(ValueError, match=message):
        fn(**{"device": "cpu", **kwargs})


def test_a_result_refuses_figures_that_cannot_be_bandwidths():
    ok = BandwidthResult("cpu", "x", 4, 8, [1.0, 3.0, 2.0])
    assert ok.median_gbps == 2.0 and ok.median_tbps == 0.002      # the middle of three
    with pytest.raises(ValueError, match="samples_gbps is empty"):
        BandwidthResult("cpu", "x", 4, 8, [])
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive finite GB/s"):
            BandwidthResult("cpu", "x", 4, 8, [1.0, bad])
    with pytest.raises(ValueError, match="bytes_per_copy must be a whole number"):
        BandwidthResult("cpu", "x", 0, 8, [1.0])
    with pytest.raises(ValueError, match="bytes_moved must be a whole number"):
        BandwidthResult("cpu", "x", 4, 8.5, [1.0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_cuda_without_a_gpu_says_so():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        measure_copy_bandwidth("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_copy_bandwidth():
    r = measure_copy_bandwidth("cuda", size_mb=256, repeats=5)
    assert r.device == "cuda:0" and 50 < r.median_gbps < 20_000


def test_read_bandwidth_counts_bytes_once_and_refuses_bad_input():
    from course_lib.bandwidth import measure_read_bandwidth

    r = measure_read_bandwidth("cpu", size_mb=32, repeats=3, warmup=1)
    assert r.bytes_per_copy == 32_000_000 and r.bytes_moved == r.bytes_per_copy   # read only
    assert len(r.samples_gbps) == 3 and 0.2 < r.median_gbps < 10_000
    with pytest.raises(ValueError, match="size_mb"):
        measure_read_bandwidth("cpu", size_mb=0)
    with pytest.raises(ValueError, match="device"):
        measure_read_bandwidth("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            measure_read_bandwidth("cuda")


# ---- Apple Silicon's GPU (MPS): untested on a Mac by CI; here, the refusals and the shared code

@pytest.mark.parametrize("fn", [measure_copy_bandwidth, measure_read_bandwidth])
def test_mps_without_an_apple_gpu_is_refused_clearly(fn, monkeypatch):
    from course_lib import device
    monkeypatch.setattr(device, "mps_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"needs Apple Silicon's GPU .* Use device='cpu'"):
        fn("mps")


def test_auto_never_picks_mps(monkeypatch):
    from course_lib import device
    monkeypatch.setattr(device, "mps_available", lambda: True)
    assert measure_read_bandwidth("auto", size_mb=8, repeats=2).device in ("cpu", "cuda:0")


def test_host_timed_copy_synchronizes_around_every_timed_copy(monkeypatch):
    from course_lib import bandwidth, device
    calls = []
    monkeypatch.setattr(device, "synchronize", lambda d: calls.append(d))
    r = bandwidth._measure_host_timed(8, 3, 1, "cpu")
    assert calls == ["cpu"] * 6 and len(r.samples_gbps) == 3 and r.bytes_moved == 2 * r.bytes_per_copy


def test_read_result_says_read_not_copy():
    r = measure_read_bandwidth("cpu", size_mb=8, repeats=2)
    assert "read bandwidth" in str(r) and "read per pass" in str(r) and "copy" not in str(r)
    assert "copy bandwidth" in str(measure_copy_bandwidth("cpu", size_mb=8, repeats=2))
