"""course_lib.hardware (lesson 00): the source figures come out, bad input is refused,
and the bill widget reacts to its controls."""
import math

import pytest

from course_lib import hardware as hw

P70, P8 = 70.6e9, 8.03e9


# ---- catalogue -----------------------------------------------------------------------

def test_catalogue_has_the_gpus_and_models_the_course_uses():
    for name in ["H100 SXM", "H100 PCIe", "H200", "A100 40GB", "A100 80GB", "L40S", "RTX 4090",
                 "B200", "MI300X"]:
        g = hw.get_gpu(name)
        assert g.memory_gb > 0 and g.bandwidth_tbps > 0 and g.bf16_tflops > 0
        assert g.source and ("sparsity" in g.source or "dense" in g.source)
    for name in ["Llama 3.1 8B", "Llama 3.1 70B", "Llama 3.1 405B", "gpt-oss-20b", "gpt-oss-120b",
                 "Gemma 2 27B", "DeepSeek-V3"]:
        m = hw.get_model(name)
        assert m.params > 0 and m.layers > 0 and m.source


def test_datasheet_figures():
    h100 = hw.get_gpu("H100")                       # "H100" means the SXM part
    assert h100.name == "H100 SXM"
    assert (h100.memory_gb, h100.bandwidth_tbps, h100.bf16_tflops, h100.fp8_tflops) == (80, 3.35, 989, 1979)
    a100 = hw.get_gpu("a100-80gb")
    assert a100.bf16_tflops == 312 and a100.int8_tops == 624 and a100.fp8_tflops is None
    assert hw.get_gpu("L40S").fp8_tflops == 733
    assert hw.get_gpu("B200").fp4_tflops == 9000 and hw.get_gpu("B200").fp8_tflops == 4500
    assert hw.get_gpu("H100").fp4_tflops is None
    assert hw.get_gpu("MI300X").compute_capability is None and "CDNA" in hw.get_gpu("MI300X").arch
    # FP8 maths needs compute capability 8.9+: every GPU with an fp8 rate has it (or is AMD)
    for g in hw.GPUS.values():
        if g.compute_capability is not None:
            assert (g.fp8_tflops is not None) == (g.compute_capability >= (8, 9)), g.name


def test_moe_and_mla_models():
    oss = hw.get_model("gpt-oss-120b")
    assert oss.is_moe and oss.params_per_token == 5.13e9
    assert hw.weight_gb(oss, "bf16") == pytest.approx(234, abs=0.5)       # "about 234 GB"
    ds = hw.get_model("DeepSeek-V3")
    assert hw.model_kv_bytes_per_token(ds) == 61 * 576 * 2                 # latent, no factor 2
    assert not hw.get_model("70B").is_moe


# ---- weights -------------------------------------------------------------------------

@pytest.mark.parametrize("fmt, gb", [("bf16", 141), ("fp8", 71), ("int8", 71), ("int4", 35),
                                     ("int4_g128", 36)])
def test_70b_weights(fmt, gb):
    assert round(hw.weight_gb("Llama 3.1 70B", fmt)) == gb


def test_bits_per_weight_with_scales():
    assert hw.bits_per_weight("int4_g128") == 4.125 == hw.bits_with_scales(4, 128)
    assert hw.bits_per_weight("int4_g32") == 4.5 == hw.bits_with_scales(4, 32)
    assert hw.bits_per_weight("mxfp4") == 4.25 == hw.bits_with_scales(4, 32, scale_bits=8)
    assert hw.bits_per_weight("nvfp4") == 4.5 and hw.bits_per_weight("fp4") == 4.25
    assert hw.bits_per_weight(3.5) == 3.5
    assert hw.weight_gb_from_bits(P70, 4, 128) == pytest.approx(36.403, abs=1e-3)
    assert hw.weight_gb(P70, 4.125) == hw.weight_gb(P70, "INT4-G128")      # names are forgiving


# ---- decode floor and ceilings ---------------------------------------------------------

@pytest.mark.parametrize("fmt, ms", [("bf16", 42), ("int8", 21), ("int4", 11), ("int4_g128", 11)])
def test_70b_decode_floor_on_h100(fmt, ms):
    floor = hw.decode_floor_ms(hw.weight_bytes("70B", fmt), hw.get_gpu("H100").bandwidth_tbps)
    assert round(floor) == ms


@pytest.mark.parametrize("fmt, tok_s", [("bf16", 209), ("int8", 417), ("int4_g128", 809)])
def test_8b_ceilings(fmt, tok_s):
    ceiling = hw.tokens_per_second_ceiling(hw.weight_bytes("8B", fmt), 3.35)
    assert round(ceiling) == tok_s
    realistic = hw.tokens_per_second_ceiling(hw.weight_bytes("8B", fmt), 3.35, efficiency=0.7)
    assert realistic == pytest.approx(0.7 * ceiling)


def test_bf16_on_two_gpus_equals_fp8_on_one():
    two = hw.decode_floor_ms(hw.weight_bytes("70B", "bf16"), 3.35, n_gpus=2)
    one = hw.decode_floor_ms(hw.weight_bytes("70B", "fp8"), 3.35)
    assert two == pytest.approx(one) and round(one) == 21


def test_64_user_step():
    kv = hw.kv_cache_gb("8B", 64 * 4096)
    assert kv == pytest.approx(34.36, abs=0.005)
    assert hw.kv_cache_gb("8B", 64 * 4096, "fp8") == pytest.approx(17.18, abs=0.005)
    bf16 = hw.batched_step_ms(hw.weight_bytes("8B"), kv * 1e9, 3.35)
    fp8 = hw.batched_step_ms(hw.weight_bytes("8B", "fp8"), kv / 2 * 1e9, 3.35)
    assert round(bf16, 1) == 15.1 and round(fp8, 1) == 7.5
    # the source's "about 4,250" and "about 8,500" are rounded to 50: half of that either side
    assert hw.batch_tokens_per_second(64, bf16) == pytest.approx(4250, abs=25)
    assert hw.batch_tokens_per_second(64, fp8) == pytest.approx(8500, abs=25)


# ---- KV cache and capacity ------------------------------------------------------------

def test_kv_per_token():
    assert hw.model_kv_bytes_per_token("70B") == 327_680 == 320 * 1024
    assert hw.model_kv_bytes_per_token("70B", "fp8") == 160 * 1024
    assert hw.model_kv_bytes_per_token("8B") == 128 * 1024
    assert hw.kv_bytes_per_token(80, 8, 128, 2) == 327_680
    assert hw.kv_cache_gb("70B", 8000) == pytest.approx(2.6, abs=0.05)      # the source's 8k
    cfg = hw.get_model("Gemma 2 27B").config()
    assert hw.kv_bytes_per_token_from_config(cfg) == 2 * 46 * 16 * 128 * 2
    del cfg["head_dim"], cfg["num_key_value_heads"]                          # plain MHA fallback
    assert hw.kv_bytes_per_token_from_config(cfg) == 2 * 46 * 32 * (4608 // 32) * 2


def test_llama_q4_k_m_bits():
    # Llama-3.1-8B's shapes (config.json) give llama.cpp's own figures for its Q4_K_M file
    # (tools/quantize/README.md, llama-cpp-python 0.3.36: 4.8944 bits/weight, 4.58 GiB)
    m = hw.llama_q4_k_m_bits(layers=32, hidden=4096, ffn=14336, kv_dim=1024, vocab=128256)
    assert m["weights"] == 8_030_261_248
    assert round(m["bits_per_weight"], 4) == 4.8944
    assert round(m["bytes"] / 2**30, 2) == 4.58
    assert round(m["bits_per_weight"], 2) == hw.bits_per_weight("q4_k_m")
    # the head (128256 x 4096) plus attn_v and ffn_down in 16 of 32 layers are Q6_K
    assert m["by_type"]["q6_k"] == 128256 * 4096 + 16 * (1024 * 4096 + 4096 * 14336)
    assert sum(m["by_type"].values()) == m["weights"]
    # a row width that is no multiple of 256 falls back to a 32-block format (Q4_K -> Q5_0)
    odd = hw.llama_q4_k_m_bits(layers=2, hidden=96, ffn=160, kv_dim=32, vocab=100)
    assert "q5_0" in odd["by_type"] and "q4_k" not in odd["by_type"]
    for bad in (0, 2.5, True, "32"):
        with pytest.raises(ValueError, match="layers must be"):
            hw.llama_q4_k_m_bits(layers=bad, hidden=4096, ffn=14336, kv_dim=1024, vocab=128256)
    with pytest.raises(ValueError, match="fit no"):
        hw.llama_q4_k_m_bits(layers=2, hidden=100, ffn=160, kv_dim=32, vocab=100)


def test_conversations_that_fit():
    kv70 = hw.model_kv_bytes_per_token("70B")
    # the source: 70B FP8 leaves 9.4 GB on an 80 GB H100: 7 users at 4,096 tokens, 14 with FP8 KV
    assert hw.conversations_that_fit(80, 1.0, 70.6, kv70, 4096) == 7
    assert hw.conversations_that_fit(80, 1.0, 70.6, kv70 / 2, 4096) == 14
    assert hw.conversations_that_fit(80, 0.9, 141.2, kv70, 8000) == 0
    assert hw.get_gpu("H100").usable_gb() == pytest.approx(72)


def test_gpus_per_replica_and_servable():
    assert hw.gpus_per_replica("70B", "bf16", "H100") == 4
    assert hw.gpus_per_replica("70B", "fp8", "H100") == 2
    p = hw.plan("70B", "fp8", "H100", batch=1, context=4096)
    assert p.fits and not p.servable                      # fits is not servable
    assert hw.plan("70B", "bf16", "H100", n_gpus=4, batch=16).servable
    assert hw.plan("70B", "bf16", "MI300X").servable      # 192 GB holds a BF16 70B whole
    assert hw.gpus_per_replica("DeepSeek-V3", "fp8", "H100") is None  # 671 GB > 8 x 72 GB
    assert hw.gpus_per_replica("DeepSeek-V3", "fp8", "H200") == 8
    assert "NOT servable" in p.summary()


def test_plan_notes_missing_native_maths():
    assert any("no native fp8" in n for n in hw.plan("8B", "fp8", "A100 80GB").notes)
    assert not any("native" in n for n in hw.plan("8B", "fp8", "H100").notes)


# ---- errors ---------------------------------------------------------------------------

def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match="unknown GPU 'V100'.*H100 SXM"):
        hw.get_gpu("V100")
    with pytest.raises(ValueError, match="unknown model.*Llama 3.1 70B"):
        hw.get_model("Llama 2 70B")
    with pytest.raises(ValueError, match="unknown format 'int3'.*int4_g128"):
        hw.weight_gb("70B", "int3")


@pytest.mark.parametrize("call", [
    lambda: hw.weight_gb(0, "bf16"),
    lambda: hw.weight_gb(-1e9, "bf16"),
    lambda: hw.weight_gb(1e9, 0),
    lambda: hw.weight_gb(1e9, -4),
    lambda: hw.weight_gb_from_bits(1e9, 4, 0),
    lambda: hw.decode_floor_ms(1e9, 0),
    lambda: hw.decode_floor_ms(0, 3.35),
    lambda: hw.decode_floor_ms(1e9, 3.35, n_gpus=0),
    lambda: hw.decode_floor_ms(1e9, math.nan),
    lambda: hw.tokens_per_second_ceiling(1e9, 3.35, efficiency=1.5),
    lambda: hw.kv_bytes_per_token(0, 8, 128),
    lambda: hw.kv_bytes_per_token(80, 8, 128, 0),
    lambda: hw.conversations_that_fit(80, 0.9, 10, 327680, 0),
    lambda: hw.conversations_that_fit(80, 1.5, 10, 327680, 100),
    lambda: hw.plan("70B", batch=0),
    lambda: hw.plan("70B", context=-5),
    lambda: hw.kv_cache_gb("70B", -1),
    lambda: hw.weight_gb(True, "bf16"),
    lambda: hw.kv_bytes_per_token_from_config({"num_hidden_layers": 2}),
    # head_dim cannot be derived: 8 // 3 = 2 was used silently; 0 heads divided by zero
    lambda: hw.kv_bytes_per_token_from_config({"num_hidden_layers": 2, "num_attention_heads": 3,
                                               "hidden_size": 8}),
    lambda: hw.kv_bytes_per_token_from_config({"num_hidden_layers": 2, "num_attention_heads": 0,
                                               "hidden_size": 8}),
])
def test_bad_sizes_are_refused(call):
    with pytest.raises(ValueError, match=r"must be|not a multiple|lacks|share"):
        call()


def test_error_says_what_is_wrong():
    with pytest.raises(ValueError, match="bandwidth_tbps must be greater than zero, got 0"):
        hw.decode_floor_ms(1e9, 0)


# ---- tables and the widget ------------------------------------------------------------

def test_tables_and_floor_table():
    assert "H100 SXM" in hw.gpu_table() and "DeepSeek-V3" in hw.model_table()
    rows = hw.decode_floor_table(3.35, ["70B"], ["bf16"])
    assert rows[0][0] == "Llama 3.1 70B" and round(rows[0][2]) == 42


def test_bill_widget_reacts_to_every_control():
    from course_lib.widgets.bill import bill_widget      # ipywidgets is required: no skip

    w = bill_widget(model="Llama 3.1 70B", fmt="bf16", gpu="H100 SXM", batch=1, context=8000)
    first = w.result.value
    assert "141.2 GB" in first and "does not fit" in first
    changes = {"fmt": "fp8", "kv_format": "fp8", "gpu": "H200", "n_gpus": 2, "batch": 64,
               "context": 32768, "model": "Llama 3.1 8B"}
    for name, value in changes.items():
        before = w.result.value
        w.controls[name].value = value
        assert w.result.value != before, f"changing {name} did not change the readout"
    assert "Llama 3.1 8B" in w.result.value and "fp8" in w.result.value


def test_bill_widget_shows_servable_verdicts():
    from course_lib.widgets.bill import bill_widget      # ipywidgets is required: no skip

    w = bill_widget(fmt="fp8", batch=1, context=4096)
    assert "fits, but not servable" in w.result.value
    w.controls["n_gpus"].value = 2
    assert ">servable<" in w.result.value


def test_floor_plot_has_a_line_per_model_and_panel():
    import matplotlib
    matplotlib.use("Agg")
    from course_lib.widgets.bill import plot_floor_vs_bits

    fig = plot_floor_vs_bits(["8B", "70B"], measured_gbps=20.0)
    assert len(fig.axes) == 2 and all(len(ax.lines) >= 2 for ax in fig.axes)
    y_gpu = fig.axes[0].lines[1].get_ydata()[-1]                 # 70B at 16 bits on an H100
    assert y_gpu == pytest.approx(42.1, abs=0.1)
    with pytest.raises(ValueError, match="measured_gbps must be greater than zero"):
        plot_floor_vs_bits(["8B"], measured_gbps=0)


def test_memory_bar_shows_overflow():
    from course_lib.widgets.bill import memory_bar_html

    ok = memory_bar_html(hw.plan("70B", "int4_g128", "H100"))
    too_big = memory_bar_html(hw.plan("70B", "bf16", "H100"))
    assert "weights: 36.4 GB" in ok and "title='free'" in ok and "border:1px solid #888888" in ok
    assert "weights: 141.2 GB" in too_big and "title='free'" not in too_big
    assert "border:1px solid #b3154f" in too_big


# ---- bad input is refused, saying what to do (issue 13, item 9) ----------------------------

@pytest.mark.parametrize("call, words", [
    (lambda: hw.plan("Llama 3.1 8B", usable_fraction=2.0), r"usable_fraction is a share .* got 2"),
    (lambda: hw.plan("Llama 3.1 8B", usable_fraction=0), "usable_fraction must be greater than zero"),
    (lambda: hw.get_gpu("H100").usable_gb(1.5), "share of the whole"),
    (lambda: hw.plan("Llama 3.1 8B", workspace_gb=math.nan), "workspace_gb must be a finite number"),
    (lambda: hw.plan("Llama 3.1 8B", batch=0), "batch must be 1 or more"),
    (lambda: hw.plan("Llama 3.1 8B", context=2.5), "context must be a whole number"),
    (lambda: hw.kv_cache_gb("Llama 3.1 8B", 2.5), "tokens must be a whole number"),
    (lambda: hw.kv_cache_gb("Llama 3.1 8B", -1), "tokens must be 0 or more"),
    (lambda: hw.kv_bytes_per_token_from_config({"num_hidden_layers": 2, "num_attention_heads": 4,
                                                "num_key_value_heads": 0, "hidden_size": 64}),
     "num_key_value_heads must be 1 or more"),
    (lambda: hw.kv_bytes_per_token_from_config({"num_hidden_layers": 2, "num_attention_heads": 4,
                                                "num_key_value_heads": 3, "hidden_size": 64}),
     "not a multiple of num_key_value_heads"),
    (lambda: hw.kv_bytes_per_token_from_config({"num_hidden_layers": 2.5, "num_attention_heads": 4,
                                                "hidden_size": 64}), "layers must be a whole number"),
    (lambda: hw.gpus_per_replica("Llama 3.1 8B", choices=()), "choices is empty"),
    (lambda: hw.gpus_per_replica("Llama 3.1 8B", choices=(0, 2)), "tensor-parallel size"),
    (lambda: hw.decode_floor_table(1.0, formats=()), "formats is empty"),
    (lambda: hw.decode_floor_table(0.0), "bandwidth_tbps must be greater than zero"),
    (lambda: hw.format_table([(1, 2, 3)], ["a", "b"]), "2 headers but a row has 3"),
    (lambda: hw.tokens_per_second_ceiling(1e9, 3.35, efficiency=1.2), "efficiency is a share"),
    (lambda: hw.weight_gb_from_bits(1e9, -4), "bits must be greater than zero"),
    (lambda: hw.weight_gb_from_bits(1e9, math.nan), "bits must be a finite number"),
    (lambda: hw.weight_gb_from_bits(1e9, 4, 2.5), "group_size must be a whole number"),
    (lambda: hw.weight_bytes(-1.0), "parameter count must be greater than zero"),
    (lambda: hw.conversations_that_fit(80, 1.5, 30, 1e5, 8000), "usable_fraction is a share"),
    (lambda: hw.get_gpu(3.35), "must be given by name"),
])
def test_refuses_bad_input(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_plan_of_a_mixture_of_experts_reads_active_weights_per_user():
    m = hw.get_model("gpt-oss-120b")
    one = hw.plan(m, "mxfp4", "H100 SXM", batch=1, context=4096)
    big = hw.plan(m, "mxfp4", "H100 SXM", batch=64, context=4096)
    active_bytes = m.active_params * hw.bits_per_weight("mxfp4") / 8
    assert one.floor_ms == pytest.approx(active_bytes / 3.35e12 * 1e3)
    kv_64 = hw.model_kv_bytes_per_token(m) * 64 * 4096
    all_bytes = m.params * hw.bits_per_weight("mxfp4") / 8       # 64 users touch every expert
    assert big.step_ms == pytest.approx((all_bytes + kv_64) / 3.35e12 * 1e3)


# ---- issue budget, Little's law, what the course's kernels support (lessons 09-10) -------

def test_issue_budget_from_the_catalogue():
    # the H200 figures of the first GPU run: 132 SMs x 128 lanes x 1.98 GHz / 4.8 TB/s
    assert hw.gpu_issue_budget("H200") == pytest.approx(132 * 128 * 1.98e9 / 4.8e12)
    assert 6.9 < hw.gpu_issue_budget("H200") < 7.0
    assert hw.gpu_issue_budget("H100") == pytest.approx(9.99, abs=0.01)
    # an A100 SM has 64 FP32 lanes, not 128 (CUDA programming guide, compute capability 8.0)
    assert hw.fp32_lanes_per_sm((8, 0)) == 64 and hw.fp32_lanes_per_sm((8, 6)) == 128
    # the issue rate (128 lane-instructions a clock per SM), not the A100's 64 FP32 lanes
    assert hw.gpu_issue_budget("A100") == pytest.approx(108 * 128 * 1.41e9 / 2.039e12)
    # a measured bandwidth replaces the datasheet's: lower bandwidth, more instructions per byte
    assert hw.gpu_issue_budget("H200", 4.11) > hw.gpu_issue_budget("H200")
    assert hw.fp32_lanes_per_sm((12, 1)) == 128                           # newer: closest older


def test_issue_budget_refuses_bad_input():
    with pytest.raises(ValueError, match="sms must be 1 or more"):
        hw.issue_budget(0, 1.98, 4.8, 128)
    with pytest.raises(ValueError, match="bandwidth_tbps must be greater than zero"):
        hw.issue_budget(132, 1.98, 0, 128)
    with pytest.raises(ValueError, match="clock_ghz must be a finite number"):
        hw.issue_budget(132, float("nan"), 4.8, 128)
    with pytest.raises(ValueError, match=r"no FP32 lane count for compute capability 6.1"):
        hw.fp32_lanes_per_sm((6, 1))
    with pytest.raises(ValueError, match=r"compute_capability must be a \(major, minor\) pair"):
        hw.fp32_lanes_per_sm("9.0")
    with pytest.raises(ValueError, match="no SM count, clock or CUDA compute capability for MI300X"):
        hw.gpu_issue_budget("MI300X")


def test_device_issue_budget_reads_torch_properties():
    from types import SimpleNamespace

    h200 = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132,
                           clock_rate=1_980_000)                           # kHz, as CUDA reports it
    got = hw.device_issue_budget(h200, 4.8)
    assert got["budget"] == pytest.approx(hw.gpu_issue_budget("H200"))
    assert got["lanes_per_sm"] == 128 and got["clock_source"].startswith("torch")
    t4 = SimpleNamespace(name="Tesla T4", major=7, minor=5, multi_processor_count=40, clock_rate=0)
    got = hw.device_issue_budget(t4, 0.32)                                 # no clock: catalogue's
    assert got["clock_ghz"] == 1.59 and got["lanes_per_sm"] == 128 and "catalogue" in got["clock_source"]
    unknown = SimpleNamespace(name="Some GPU", major=9, minor=0, multi_processor_count=10, clock_rate=0)
    with pytest.raises(ValueError, match="torch reports no clock for Some GPU"):
        hw.device_issue_budget(unknown, 1.0)
    with pytest.raises(TypeError, match="torch.cuda.get_device_properties"):
        hw.device_issue_budget({"name": "H200"}, 4.8)


def test_littles_law_and_the_first_h200_gemv():
    # 4.8 TB/s x 1 us over 132 SMs: about 36 KB per SM must be on its way
    assert hw.bytes_in_flight_per_sm(4.8, 132) == pytest.approx(4.8e12 * 1e-6 / 132)
    assert round(hw.bytes_in_flight_per_sm(4.8, 132) / 1e3) == 36
    # the first run's W4A16 GEMV: 896 programs of 32 x 256 INT4 weights (4 KB) on 132 SMs
    w4_big = hw.gemv_bytes_in_flight_per_sm(28672, 32, 256, 4, 132)
    assert w4_big == pytest.approx(896 * 4096 / 132) and w4_big < hw.bytes_in_flight_per_sm(4.8, 132)
    assert round(hw.gemv_bytes_in_flight_per_sm(4096, 8, 256, 4, 132) / 1e3) == 4
    assert hw.gemv_bytes_in_flight_per_sm(100, 32, 64, 8, 1) == 4 * 32 * 64    # ceil(100/32) = 4
    with pytest.raises(ValueError, match="block_n must be 1 or more"):
        hw.gemv_bytes_in_flight_per_sm(4096, 0, 256, 4, 132)
    with pytest.raises(ValueError, match="latency_us must be greater than zero"):
        hw.bytes_in_flight_per_sm(4.8, 132, latency_us=0)


def test_t4_and_what_the_course_kernels_support():
    t4 = hw.get_gpu("Tesla T4")
    assert t4.compute_capability == (7, 5) and t4.fp8_tflops is None and t4.int8_tops == 130
    assert (t4.sms, t4.boost_clock_ghz) == (40, 1.59)
    # the hardware has INT8 tensor cores from Turing; the course's Triton kernel needs 8.0
    int8 = hw.kernel_support("int8_w8a8", (7, 5))
    assert int8["hardware"] and not int8["course"] and "sm_80" in int8["why"]
    assert hw.kernel_support("int8_w8a8", (8, 0))["course"]
    assert hw.kernel_support("w4a16", (7, 5))["course"]
    assert not hw.kernel_support("fp8_w8a8", (8, 0))["hardware"]
    with pytest.raises(ValueError, match="unknown kernel 'int4_w4a4'; known: w8a16"):
        hw.kernel_support("int4_w4a4", (9, 0))
    # the catalogue agrees with the kernel's own refusal threshold
    from kernels import w8a8_int8

    assert tuple(w8a8_int8.INT8_MIN_CC) == hw.KERNEL_SUPPORT["int8_w8a8"]["course"]

