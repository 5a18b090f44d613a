"""course_lib.bench (counting, roofline, CPU timing) and the benchmark command kernels.bench."""
import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import json
import math

import pytest
import torch

from course_lib import bench, quant
from course_lib import hardware as hw
from kernels import bench as kbench
from kernels import bench_decode, bench_layers, bench_peers


# ---- counting and the roofline -------------------------------------------------------------

def test_linear_flops_and_bytes():
    assert bench.linear_flops(1, 4096, 4096) == 2 * 4096 * 4096
    # BF16 GEMV: weights 2 bytes each, x and y 2 bytes each
    assert bench.linear_bytes(1, 4096, 4096) == 2 * 4096 * 4096 + 2 * 4096 + 2 * 4096
    # INT4 with group-128 16-bit scales: 4 + 16/128 = 4.125 bits per weight
    w_only = bench.linear_bytes(1, 4096, 4096, 4, 0, 0, group_size=128) / (4096 * 4096)
    assert w_only * 8 == pytest.approx(4.125)
    with pytest.raises(ValueError, match="positive whole number"):
        bench.linear_bytes(0, 4, 4)


def test_arithmetic_intensity_decode_vs_prefill():
    ai_b1 = bench.arithmetic_intensity(1, 8192, 8192)           # BF16 GEMV: about 1 FLOP/byte
    assert ai_b1 == pytest.approx(1.0, rel=1e-3)
    assert bench.arithmetic_intensity(1, 8192, 8192, weight_bits=4) == pytest.approx(4.0, rel=1e-2)
    assert bench.arithmetic_intensity(2048, 8192, 8192) > 900    # prefill: compute-bound


def test_ridge_point_and_roofline_h100():
    from course_lib import hardware

    h100 = hardware.get_gpu("H100")
    ridge = bench.ridge_point(h100.bf16_tflops, h100.bandwidth_tbps * 1e3)
    assert ridge == pytest.approx(989 / 3.35, rel=1e-9)          # ~295 FLOP/byte
    assert bench.roofline_tflops(1.0, 989, 3350) == pytest.approx(3.35)
    assert bench.roofline_tflops(1e4, 989, 3350) == 989


@pytest.mark.parametrize("name,mem,expected", [
    ("NVIDIA H100 80GB HBM3", 85, "H100 SXM"), ("NVIDIA H100 PCIe", 85, "H100 PCIe"),
    ("NVIDIA A100-SXM4-40GB", 42, "A100 40GB"), ("NVIDIA A100-SXM4-80GB", 85, "A100 80GB"),
    ("NVIDIA H200", 150, "H200"), ("NVIDIA GeForce RTX 4090", 25, "RTX 4090"),
    ("NVIDIA L40S", 48, "L40S"), ("Tesla T4", 16, "T4"), ("NVIDIA RTX A4000", 16, None)])
def test_catalogue_lookup(name, mem, expected):
    gpu = bench.catalogue_gpu(name, mem)
    assert (gpu.name if gpu else None) == expected
    assert hw.catalogue_gpu(name, mem) is gpu      # the catalogue's own function, below bench


def test_plot_roofline_draws_points():
    import matplotlib
    matplotlib.use("Agg")
    ax = bench.plot_roofline([("bf16", 1.0, 2.0), ("w4a16", 4.0, 7.0)], 3350, 989, "H100 BF16")
    assert len(ax.get_lines()) >= 3 and ax.get_xscale() == "log"
    ax = bench.plot_roofline([("cpu", 1.0, 0.01)], 15.0)          # no peak: slope only
    assert ax.get_lines()


# ---- CPU timing -----------------------------------------------------------------------------

def test_compare_cpu_interleaves_and_counts():
    calls = []
    fns = {n: (lambda n=n: calls.append(n)) for n in "ABC"}
    samples = bench.compare_cpu(fns, warmup=1, repeats=3)
    assert calls[:3] == ["A", "B", "C"]                           # warm-up
    assert calls[3:] == ["A", "B", "C", "B", "C", "A", "C", "A", "B"]   # rotated each round
    assert all(len(v) == 3 and min(v) >= 0 for v in samples.values())
    with pytest.raises(ValueError, match="repeats"):
        bench.compare_cpu(fns, repeats=0)


def test_time_cpu_measures_sleep():
    import time
    assert 4.5 < bench.time_cpu(lambda: time.sleep(0.005), warmup=0, repeats=3) < 50


def test_time_gpu_refuses_without_gpu():
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        bench.time_gpu(lambda: None)


# ---- torch's private CPU weight-only kernels (they change between releases) ---------------

def test_cpu_int8pack_matches_reference():
    from kernels.w8a16 import w8a16_reference

    torch.manual_seed(0)
    w, x = torch.randn(48, 64), torch.randn(3, 64)
    b = next(b for b in kbench.cpu_backends() if b.name.startswith("int8"))
    q, s = b.prepare(w)
    y = b.apply(x.to(b.act_dtype), (q, s))
    # the reference on the same bf16 activations, its result in bf16 as the kernel's: against the
    # fp32 x this used 68% of the tolerance (x's bf16 rounding, 0.054 off at |y| ~1.5); like for
    # like it is 0 on AVX-512, avx2 with 1 thread and default/SSE4_2, and at most one bf16 step
    # (2**-8, a fifth of rtol) where another order of summation rounds the other way
    ref = w8a16_reference(x.to(b.act_dtype), q, s.float())
    assert y.shape == (3, 48) and ref.dtype == y.dtype
    assert torch.allclose(y.float(), ref.float(), rtol=2e-2, atol=5e-2)


def test_cpu_int4pack_matches_course_lib_dequantize():
    torch.manual_seed(0)
    w, x = torch.randn(64, 256), torch.randn(2, 256)
    b = next(b for b in kbench.cpu_backends() if b.name.startswith("int4"))
    st = b.prepare(w)
    y = b.apply(x.to(torch.bfloat16), st)
    w_hat = quant.dequantize(quant.quantize(w, "int4", "per_group", 128))
    ref = x.to(torch.bfloat16).float() @ w_hat.T
    assert y.shape == (2, 64)
    assert (y.float() - ref).abs().max() < 0.05 * ref.abs().max()


# ---- the benchmark command ------------------------------------------------------------------

def _tiny_run(backends, **kw):
    return kbench.run(quick=True, layers=[("tiny", 128, 48)], batches=(1, 9), prefill_m=16,
                      backends=backends, timer="cpu",
                      decode_cfg={"n_layers": 1, "d": 128, "d_kv": 32, "d_ff": 256, "note": "tiny"},
                      repeats=1, log=lambda *a: None, **kw)


def test_run_cpu_backends_writes_json(tmp_path):
    result = _tiny_run(kbench.cpu_backends())
    assert result["device"]["kind"] in ("cpu", "cuda") and result["versions"]["torch"]
    assert result["copy_bandwidth_gbps"] is None or result["copy_bandwidth_gbps"] > 0
    assert [r["M"] for r in result["layers"]] == [1, 9, 16]
    row = result["layers"][0]
    # bytes by hand for M=1, N=48, K=128: weights + 16-bit scales (one per row per group) + x + y
    assert {n: v["bytes"] for n, v in row["results"].items()} == {
        "fp32": 48 * 128 * 4 + 128 * 4 + 48 * 4,
        "bf16": 48 * 128 * 2 + 128 * 2 + 48 * 2,
        "int8 (_weight_int8pack_mm)": 48 * 128 + 48 * 2 + 128 * 2 + 48 * 2,
        "int4 g128 (_weight_int4pack_mm_for_cpu)": 48 * 128 // 2 + 48 * 2 + 128 * 2 + 48 * 2}
    # every ratio and rate is derived from the row's own timings, against the named baseline
    for r in result["layers"]:
        ms = {n: v["ms"] for n, v in r["results"].items()}
        assert r["baseline"] == "fp32"
        for n, v in r["results"].items():
            assert v["ratio_vs_baseline"] == pytest.approx(ms["fp32"] / ms[n], rel=1e-12)
            assert v["ratio_vs_bf16"] == pytest.approx(ms["bf16"] / ms[n], rel=1e-12)
            assert v["gbps"] == pytest.approx(v["bytes"] / (ms[n] * 1e-3) / 1e9, rel=1e-12)
            assert v["tflops"] == pytest.approx(2 * r["M"] * 48 * 128 / (ms[n] * 1e-3) / 1e12,
                                                rel=1e-12)
    dec = result["decode"]["results"]
    for n, v in dec.items():
        assert v["tokens_per_s"] == pytest.approx(1e3 / v["ms_per_step"], rel=1e-12)
        assert v["ratio_vs_baseline"] == pytest.approx(v["tokens_per_s"] / dec["fp32"]["tokens_per_s"],
                                                       rel=1e-12)
    assert set(result["decode"]["results"]) == {b.name for b in kbench.cpu_backends()}
    gpu_targets = [t for t in result["targets"] if not t["id"].startswith("cpu_")]
    assert len(gpu_targets) == 9 and all(t["met"] is None for t in gpu_targets)  # not measured
    cpu = [t for t in result["targets"] if t["id"] == "cpu_quick_under_60s"]
    assert result["device"]["kind"] != "cpu" or (cpu and cpu[0]["met"] is True)
    path = kbench.write_results(result, tmp_path)
    assert kbench.load_results(path)["layers"] == json.loads(path.read_text())["layers"]


def test_run_gpu_backends_through_the_interpreter():
    """The GPU code path (Triton kernels) on tiny shapes, timed with the CPU timer."""
    from kernels.fp8_w8a8 import fp8_supported

    with_fp8 = fp8_supported()[0]                                 # the interpreter counts as yes
    result = _tiny_run(kbench.gpu_backends(with_fp8=with_fp8))
    names = set(result["layers"][0]["results"])
    assert names == {"bf16", "w8a16", "w4a16 g128", "int8 w8a8"} | ({"fp8 w8a8"} if with_fp8 else set())
    for r in result["layers"]:
        for v in r["results"].values():
            assert v["ms"] > 0 and math.isfinite(v["gbps"])


def test_targets_met_and_missed():
    def row(kn, M, fmt_ratio):
        return {"K": kn[0], "N": kn[1], "M": M,
                "results": {f: {"ratio_vs_baseline": r, "gbps": 3000.0 * r / 3}
                            for f, r in fmt_ratio.items()}}
    rows = [row((8192, 28672), 1, {"bf16": 1.0, "w4a16 g128": 3.0, "w8a16": 1.5}),
            row((4096, 4096), 1, {"w4a16 g128": 2.1}),
            row((8192, 8192), 4096, {"int8 w8a8": 1.6, "fp8 w8a8": 1.9})]
    t = {x["id"]: x for x in kbench.evaluate_targets(rows, None, 3350.0, True, False)}
    assert t["w4a16_b1_70b_mlp"]["met"] is True and t["w8a16_b1_70b_mlp"]["met"] is False
    assert t["w4a16_b1_4096"]["met"] is True
    assert t["fp8_prefill_m4096"]["met"] is None and t["decode_w4a16_b1"]["value"] is None
    assert t["int8_prefill_m4096"]["value"] == 1.6 and t["int8_prefill_m4096"]["met"] is True
    assert t["bf16_gemv_read_bw"]["value"] == pytest.approx(1000 / 3350)


def test_device_slug():
    assert kbench.device_slug("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3"


def test_clone_makes_independent_weight_copies():
    from kernels.w4a16 import quantize_weight

    wt = quantize_weight(torch.randn(8, 64), 32, symmetric=False)
    copy = bench_layers._clone(wt)
    assert copy.packed is not wt.packed and torch.equal(copy.packed, wt.packed)
    assert copy.group_size == 32 and torch.equal(copy.zero, wt.zero)
    assert bench_layers._state_bytes(wt) == 8 * 32 + 8 * 2 * 2 + 8 * 2 * 4     # uint8 + fp16 + int32
    pair = (torch.zeros(3, dtype=torch.int8), torch.zeros(3))
    assert bench_layers._state_bytes(bench_layers._clone(pair)) == 3 + 12


def test_time_gpu_graph_refuses_without_gpu():
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        bench.time_gpu_graph([lambda: None])


def test_tables_render():
    result = _tiny_run(kbench.cpu_backends())
    text = kbench.layer_table(result, "decode")
    assert "tiny" in text and "fp32" in text and "1.00x" in text and len(text.splitlines()) == 2 + 3
    assert kbench.layer_table(result, "nothing") == "(no rows)"
    assert kbench.targets_table(result).count("not measured") == 9


def test_cpu_threads_are_set_and_restored():
    before = torch.get_num_threads()
    result = _tiny_run(kbench.cpu_backends(), threads=1)
    assert torch.get_num_threads() == before
    if result["device"]["kind"] == "cpu":
        assert result["cpu_threads"] == 1


def test_layer_floor_and_speedup():
    # batch 1 on an H100: memory-bound, BF16 bytes / bandwidth
    t = bench.layer_floor_ms(1, 28672, 8192)
    assert t == pytest.approx(bench.linear_bytes(1, 28672, 8192) / 3.35e12 * 1e3)
    # prefill: compute-bound, 2MNK / 989 TFLOPS
    assert bench.layer_floor_ms(4096, 28672, 8192) == pytest.approx(2 * 4096 * 28672 * 8192 / 989e12 * 1e3)
    assert bench.layer_floor_ms(4096, 28672, 8192, peak_tflops=None) < bench.layer_floor_ms(4096, 28672, 8192)
    assert bench.floor_speedup(1, 28672, 8192, 4, 128) == pytest.approx(3.88, abs=0.01)
    assert bench.floor_speedup(4096, 28672, 8192, 4, 128) == pytest.approx(1.0)
    assert bench.floor_speedup(4096, 28672, 8192, 8, 8192, fmt_tflops=1979) == pytest.approx(1979 / 989)
    with pytest.raises(ValueError, match="bandwidth"):
        bench.layer_floor_ms(1, 8, 8, bandwidth_gbps=0)


def test_checkpoints_leave_partial_results(tmp_path):
    seen = []

    def checkpoint(partial):
        seen.append((partial["partial"], len(partial["layers"])))
        kbench.write_results(partial, tmp_path)

    result = _tiny_run(kbench.cpu_backends(), checkpoint=checkpoint)
    assert seen == [(True, 1), (True, 2), (True, 3)]
    assert result["partial"] is False and result["decode"]["results"]
    saved = kbench.load_results(next(tmp_path.glob("bench_*.json")))
    assert saved["partial"] is True and len(saved["layers"]) == 3     # the last checkpoint


def test_broken_private_op_is_skipped_with_a_note():
    good = kbench.cpu_backends(probe=False)
    assert [b.name for b in kbench.usable_backends(good, log=lambda *a: None)] == [b.name for b in good]

    def broken(x, st):
        raise RuntimeError("aten::_weight_int4pack_mm_for_cpu: no such op")

    wrong = kbench.Backend("wrong", lambda w: w, lambda x, w: 2 * (x @ w.T), torch.float32, 32, None)
    missing = kbench.Backend("missing", lambda w: w, broken, torch.float32, 32, None)
    notes = []
    kept = kbench.usable_backends(good[:1] + [wrong, missing], log=notes.append)
    assert [b.name for b in kept] == ["fp32"]
    assert "skipping wrong: ValueError: relative error" in notes[0]
    assert "skipping missing: RuntimeError" in notes[1]


def test_group_size_must_divide_k_and_rates_must_be_positive():
    # group 100 does not divide 4096: a fractional number of scales per row was counted silently
    for gs in (100, 0, -128, 1.5, True):
        with pytest.raises(ValueError, match="group_size"):
            bench.linear_bytes(1, 4096, 4096, 4, group_size=gs)
    with pytest.raises(ValueError, match="group_size"):
        bench.arithmetic_intensity(1, 4096, 4096, 4, group_size=100)
    assert bench.linear_bytes(1, 4096, 4096, 8, group_size=4096) > 0      # per channel
    for bw in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="bandwidth_gbps"):
            bench.layer_floor_ms(1, 8, 8, bandwidth_gbps=bw)
    for peak in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="peak_tflops"):
            bench.layer_floor_ms(1, 8, 8, peak_tflops=peak)
    with pytest.raises(ValueError, match="peak_tflops"):
        bench.floor_speedup(1, 4096, 4096, 4, 128, fmt_tflops=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")
@pytest.mark.parametrize("module", ["w8a16", "w4a16", "fp8_w8a8"])
def test_kernel_benchmarks_refuse_a_cpu_with_a_clear_message(module):
    import importlib
    mod = importlib.import_module(f"kernels.{module}")
    with pytest.raises(RuntimeError, match="GPU|interpreter|FP8"):
        mod.benchmark(shapes=((64, 64),), batches=(1,))
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        bench.speedup_vs_bf16("x", lambda w: w, lambda x, w: x, ((64, 64),), (1,))


# ---- where each backend runs, and its output checked before timing -------------------------

def test_cpu_backends_get_cpu_tensors_even_on_a_gpu_machine():
    """gpu_check.sh runs these tests on a GPU: CPU-only ops must never see CUDA tensors."""
    cpu = kbench.cpu_backends(probe=False)
    assert all(b.device == "cpu" for b in cpu)
    assert kbench.placement(cpu, gpu=True) == ("cpu", "cpu")
    assert all(kbench.backend_device(b, "cuda") == "cpu" for b in cpu)
    gpu = kbench.gpu_backends(with_fp8=False)
    assert kbench.placement(gpu, gpu=True) == ("cuda", "gpu")
    assert kbench.placement(None, gpu=False) == ("cpu", "cpu")
    assert all(kbench.backend_device(b, "cuda") == "cuda" for b in gpu)


def test_every_output_is_checked_before_timing():
    wrong = kbench.Backend("wrong", lambda w: w, lambda x, w: 2 * (x @ w.T), torch.float32, 32,
                           None, device="cpu")
    notes = []
    rows = kbench.time_layers(kbench.cpu_backends(probe=False)[:2] + [wrong], [("tiny", 64, 24)],
                              (1, 3), "cpu", "cpu", repeats=1, log=notes.append)
    for r in rows:
        assert r["results"]["fp32"]["output_ok"] and r["results"]["fp32"]["check_rel_err"] < 1e-6
        assert r["results"]["bf16"]["output_ok"]
        assert r["results"]["wrong"]["output_ok"] is False
        assert r["results"]["wrong"]["check_rel_err"] == pytest.approx(1.0, rel=1e-4)
    assert sum("WRONG OUTPUT: wrong" in n for n in notes) == 1          # once per layer


def test_tolerance_follows_the_format():
    b = kbench.cpu_backends(probe=False)
    assert [x.tolerance() for x in b] == [0.02, 0.02, 0.08, 0.3]


def test_fp16_baseline_below_compute_capability_8():
    names = [b.name for b in kbench.gpu_backends(False, torch.float16)]
    assert names[0] == "fp16" and all(b.act_dtype == torch.float16
                                      for b in kbench.gpu_backends(False, torch.float16))
    # without Triton (macOS, Windows) the INT8 kernel lists itself nowhere: it could not launch
    assert [b.name for b in kbench.gpu_backends(True)] == ["bf16", "w8a16", "w4a16 g128", "fp8 w8a8"] + (
        ["int8 w8a8"] if kernels.TRITON else [])


def test_gpu_backend_registry_is_one_line_per_kernel_file():
    import inspect
    src = inspect.getsource(kbench)
    block = src[src.index("GPU_KERNEL_MODULES = ["):]
    block = block[:block.index("]")]
    assert [l.strip() for l in block.splitlines()[1:]] == [f'"{m}",' for m in kbench.GPU_KERNEL_MODULES]


def test_decode_stack_is_sized_from_free_memory():
    per_layer = (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096) * 2   # bytes in bf16
    assert kbench.decode_layers_that_fit(4096, 1024, 14336, 32, free_bytes=80e9) == 32
    assert kbench.decode_layers_that_fit(4096, 1024, 14336, 32, free_bytes=14e9) == \
        int(0.5 * 14e9 // per_layer)                                          # a 16 GB T4: 16
    assert kbench.decode_layers_that_fit(4096, 1024, 14336, 32, free_bytes=1e8) == 1


def test_fp8_rowwise_peer_pads_a_decode_batch():
    """torch._scaled_mm needs multiples of 16 rows; the peer pads a batch of 3 and cuts."""
    w, x = torch.randn(32, 64), torch.randn(3, 64)
    try:
        y = bench_peers._fp8_rowwise(x, bench_peers._fp8_rowwise_prepare(w))
    except (RuntimeError, NotImplementedError) as err:      # not every CPU build has it
        pytest.skip(f"torch._scaled_mm row-wise unavailable here: {err}")
    assert y.shape == (3, 32)
    assert ((y.float() - x @ w.T).norm() / (x @ w.T).norm()).item() < 0.08


def test_results_say_what_each_timing_field_means():
    result = _tiny_run(kbench.cpu_backends())
    assert "launch overhead" in result["fields"]["ms_eager"]
    assert result["read_bandwidth_gbps"] > 0


# ---- bad input: every public function says what it wanted ---------------------------------

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("call,error,message", [
    (lambda: bench.linear_flops(0, 8, 8), ValueError, "M must be a whole number >= 1"),
    (lambda: bench.linear_flops(1, 2.5, 8), ValueError, "N must be a whole number >= 1"),
    (lambda: bench.linear_flops(1, 8, True), ValueError, "K must be a whole number >= 1"),
    (lambda: bench.linear_flops(1, 8, NAN), ValueError, "K must be a whole number >= 1"),
    (lambda: bench.linear_bytes(1, 8, 8, weight_bits=0), ValueError, "weight_bits must be a finite number > 0"),
    (lambda: bench.linear_bytes(1, 8, 8, weight_bits=NAN), ValueError, "weight_bits must be a finite number > 0"),
    (lambda: bench.linear_bytes(1, 8, 8, act_bytes=-2), ValueError, "act_bytes must be a finite number >= 0"),
    (lambda: bench.linear_bytes(1, 8, 8, out_bytes=INF), ValueError, "out_bytes must be a finite number >= 0"),
    (lambda: bench.linear_bytes(1, 8, 8, group_size=4, scale_bytes=-1), ValueError, "scale_bytes must be"),
    (lambda: bench.linear_bytes(1, "8", 8), ValueError, "N must be a positive whole number"),
    (lambda: bench.arithmetic_intensity(1, 8, -8), ValueError, "K must be a whole number >= 1"),
    (lambda: bench.achieved_gbps(1e6, 0), ValueError, "ms must be a finite number > 0"),
    (lambda: bench.achieved_gbps(-1, 1.0), ValueError, "n_bytes must be a finite number >= 0"),
    (lambda: bench.achieved_tflops(1e9, NAN), ValueError, "ms must be a finite number > 0"),
    (lambda: bench.achieved_tflops(-1e9, 1.0), ValueError, "flops must be a finite number >= 0"),
    (lambda: bench.ridge_point(0, 3350), ValueError, "peak_tflops must be a finite number > 0"),
    (lambda: bench.ridge_point(989, -1), ValueError, "bandwidth_gbps must be a finite number > 0"),
    (lambda: bench.roofline_tflops(0, 989, 3350), ValueError, "intensity must be a finite number > 0"),
    (lambda: bench.roofline_tflops(1.0, INF, 3350), ValueError, "peak_tflops must be"),
    (lambda: bench.roofline_tflops(1.0, 989, NAN), ValueError, "bandwidth_gbps must be"),
    (lambda: bench.floor_speedup(1, 8, 8, 0), ValueError, "weight_bits must be a finite number > 0"),
    (lambda: bench.floor_speedup(1, 8, 8, 4, base_tflops=-1), ValueError, "peak_tflops must be a positive"),
    (lambda: bench.median_ms([]), ValueError, "no timings"),
    (lambda: bench.median_ms([1.0, NAN]), ValueError, r"each timing \(ms\) must be a finite number >= 0"),
    (lambda: bench.median_ms([-1.0]), ValueError, r"each timing \(ms\) must be"),
    (lambda: bench.time_cpu(42), TypeError, "fn must be a function"),
    (lambda: bench.time_cpu(lambda: None, warmup=True), ValueError, "warmup must be a whole number >= 0"),
    (lambda: bench.time_cpu(lambda: None, repeats=2.0), ValueError, "repeats must be a whole number >= 1"),
    (lambda: bench.compare_cpu({}), ValueError, "at least one function"),
    (lambda: bench.compare_cpu([lambda: None]), ValueError, r"as \{name: function\}"),
    (lambda: bench.compare_cpu({"a": None}), TypeError, r"fns\['a'\] must be a function"),
    (lambda: bench.compare_cpu({"a": lambda: None}, budget_s=0), ValueError, "budget_s must be"),
    (lambda: bench.compare_cpu({"a": lambda: None}, warmup=-1), ValueError, "warmup must be"),
    (lambda: bench.time_gpu(None), TypeError, "fn must be a function"),
    (lambda: bench.time_gpu(lambda: None, rep_ms=0), ValueError, "rep_ms must be a finite number > 0"),
    (lambda: bench.time_gpu_graph([]), ValueError, "at least one function"),
    (lambda: bench.time_gpu_graph(["f"]), TypeError, "each of fns must be a function"),
    (lambda: bench.time_gpu_graph([lambda: None], min_calls=0), ValueError, "min_calls must be a whole number >= 1"),
    (lambda: bench.time_gpu_graph([lambda: None], replays=1.5), ValueError, "replays must be a whole number >= 1"),
    (lambda: bench.speedup_vs_bf16("", lambda w: w, lambda x, w: x, ((64, 64),), (1,)), ValueError, "label must be"),
    (lambda: bench.speedup_vs_bf16("x", "prep", lambda x, w: x, ((64, 64),), (1,)), TypeError, "prepare must be"),
    (lambda: bench.speedup_vs_bf16("x", lambda w: w, lambda x, w: x, (), (1,)), ValueError, "at least one"),
    (lambda: bench.speedup_vs_bf16("x", lambda w: w, lambda x, w: x, ((64,),), (1,)), ValueError, r"pair \(K in, N out\)"),
    (lambda: bench.speedup_vs_bf16("x", lambda w: w, lambda x, w: x, ((64, 0),), (1,)), ValueError, "N must be a whole number"),
    (lambda: bench.speedup_vs_bf16("x", lambda w: w, lambda x, w: x, ((64, 64),), (0,)), ValueError, "batch M must be"),
    (lambda: bench.catalogue_gpu(None), TypeError, "device_name must be the name torch reports"),
    (lambda: bench.catalogue_gpu("NVIDIA A100", memory_gb=0), ValueError, "memory_gb must be"),
    (lambda: bench.plot_roofline([("x", 1.0, 1.0)], 0), ValueError, "bandwidth_gbps must be"),
    (lambda: bench.plot_roofline([("x", 1.0, 1.0)], 100, peak_tflops=-5), ValueError, "peak_tflops must be"),
    (lambda: bench.plot_roofline([("x", 1.0)], 100), ValueError, r"\(label, intensity, TFLOP/s\)"),
    (lambda: bench.plot_roofline([("x", 0.0, 1.0)], 100), ValueError, "intensity of 'x' must be"),
    (lambda: bench.plot_roofline([("x", 1.0, NAN)], 100), ValueError, "TFLOP/s of 'x' must be"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_input_is_refused_with_what_to_pass(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_rates_from_hand_computed_values():
    # 1 GB in 1 ms is 1000 GB/s; 2 TFLOP in 2 s (2000 ms) is 1 TFLOP/s
    assert bench.achieved_gbps(1e9, 1.0) == pytest.approx(1000.0)
    assert bench.achieved_tflops(2e12, 2000.0) == pytest.approx(1.0)
    assert bench.median_ms([3.0, 1.0, 2.0]) == 2.0 and bench.median_ms([0.0]) == 0.0
    assert bench.linear_flops(2.0, 3, 4) == 48.0                  # whole floats are accepted


# ---- the GPU timers' fallbacks (run on a CPU with the GPU calls replaced) ------------------

def test_cuda_graph_capture_falls_back_to_eager_and_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("checks the fallback taken when capture fails (no CUDA here)")
    calls = []
    step = lambda: calls.append(1)                                  # noqa: E731
    fn, graphed = bench_decode._cuda_graph(step)
    assert fn is step and graphed is False and len(calls) == 3   # warm-up ran, capture failed
    assert "CUDA graph capture failed, timing eagerly" in capsys.readouterr().out


def test_layer_timer_uses_the_graph_time_or_falls_back_to_eager(monkeypatch, capsys):
    class Props:
        L2_cache_size = 2 ** 20                                   # 1 MiB
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    monkeypatch.setattr(kbench.bench, "time_gpu", lambda fn: 2.5)
    b = kbench.cpu_backends(probe=False)[0]                        # fp32: 8 x 16 x 4 = 512 bytes
    states, xs = {b.name: b.prepare(torch.randn(8, 16))}, {b.name: torch.randn(1, 16)}
    seen = []

    def graph(fns):
        seen.append(len(fns))
        return 1.25
    monkeypatch.setattr(kbench.bench, "time_gpu_graph", graph)
    ms, extra = bench_layers._time_gpu_layer([b], states, xs)
    # enough weight copies to overflow 3x the L2 cache (3 MiB / 512 B), capped at 64
    assert seen == [64] and ms == {b.name: 1.25}
    assert extra[b.name] == {"ms_eager": 2.5, "cuda_graph": True, "weight_copies": 64}

    def broken(fns):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(kbench.bench, "time_gpu_graph", broken)
    ms, extra = bench_layers._time_gpu_layer([b], states, xs)
    assert ms == {b.name: 2.5}                                      # the eager time, recorded as such
    assert extra[b.name] == {"ms_eager": 2.5, "cuda_graph": False, "weight_copies": 1}
    assert "CUDA graph timing failed, eager time used: RuntimeError" in capsys.readouterr().out


def test_gemv_sweep_refuses_without_a_gpu():
    """kernels.sweep_gemv times launch plans on a GPU only, and says what to run instead."""
    import subprocess
    import sys

    from kernels._common import on_gpu
    if on_gpu():
        pytest.skip("a GPU is present: the sweep would run for minutes")
    r = subprocess.run([sys.executable, "-m", "kernels.sweep_gemv"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr and "kernels.bench" in r.stderr


@pytest.mark.parametrize("symmetric", [True, False])
def test_torch_int4_kernels_read_the_course_codes_exactly(symmetric):
    """tinygemm's w = (u - 8) * scale + zero against the course's w = (q - z) * s: the
    mapping (kbench.int4pack_params) checked through torch's CPU int4 kernel in fp32."""
    from kernels import w4a16

    g = torch.Generator().manual_seed(4)
    w, x = torch.randn(48, 256, generator=g), torch.randn(3, 256, generator=g)
    wt = w4a16.quantize_weight(w, 128, symmetric)
    u, sz = kbench.int4pack_params(wt)
    assert u.min() >= 0 and u.max() <= 15 and sz.shape == (2, 48, 2)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u, 1)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 128, sz)
    ref = w4a16.w4a16_reference(x, wt)
    assert torch.allclose(y, ref, rtol=1e-5, atol=1e-4), (y - ref).abs().max()


def test_gpu_only_peers_stay_off_a_cpu():
    assert kbench.gemlite_backends() == []
    if not torch.cuda.is_available():
        assert kbench.separating_measurements is not None
        with pytest.raises(RuntimeError, match="GPU"):
            kbench.separating_measurements()


# ---- Apple Silicon's GPU (MPS): the synchronized timer and the 16-bit linear timings

def test_compare_cpu_calls_sync_around_each_timed_call():
    calls = []
    out = bench.compare_cpu({"a": lambda: None, "b": lambda: None}, warmup=1, repeats=3,
                            sync=lambda: calls.append(1))
    assert len(calls) == 2 * 2 * 3 and all(len(v) == 3 for v in out.values())


def test_compare_mps_refuses_without_an_apple_gpu(monkeypatch):
    from course_lib import device
    monkeypatch.setattr(device, "mps_available", lambda: False)
    with pytest.raises(RuntimeError, match="compare_mps needs Apple Silicon's GPU"):
        bench.compare_mps({"a": lambda: None})


def test_time_linears_on_the_cpu_counts_bytes_and_flops():
    out = bench.time_linears("cpu", 256, 128, batches=(1, 4), dtypes=("float16",), repeats=3)
    assert out["refused"] == [] and [(r["M"], r["dtype"]) for r in out["rows"]] == [(1, "float16"), (4, "float16")]
    r = out["rows"][1]
    assert r["bytes"] == 256 * 128 * 2 + 4 * 256 * 2 + 4 * 128 * 2
    assert r["gbps"] == pytest.approx(r["bytes"] / r["ms"] / 1e6)
    assert r["tflops"] == pytest.approx(2 * 4 * 256 * 128 / r["ms"] / 1e9)


def test_time_linears_lists_a_dtype_the_device_refuses(monkeypatch):
    import torch.nn.functional as F
    real = F.linear

    def picky(x, w, *a):
        if x.dtype == torch.bfloat16:
            raise RuntimeError("bfloat16 is not supported here\nsecond line")
        return real(x, w, *a)
    monkeypatch.setattr(F, "linear", picky)
    out = bench.time_linears("cpu", 64, 64, batches=(1,), repeats=2)
    assert [r["dtype"] for r in out["rows"]] == ["float16"]
    assert out["refused"] == [{"dtype": "bfloat16", "error": "RuntimeError: bfloat16 is not supported here"}]


@pytest.mark.parametrize("kw, match", [({"device": "cuda"}, "device must be 'cpu' or 'mps'"),
                                       ({"dtypes": ("float32",)}, "16-bit torch dtypes"),
                                       ({"dtypes": ("fp16",)}, "16-bit torch dtypes"),
                                       ({"batches": (0,)}, "each batch")])
def test_time_linears_bad_input(kw, match):
    args = {"device": "cpu", "K": 64, "N": 64, **kw}
    with pytest.raises(ValueError, match=match):
        bench.time_linears(**args)
