"""Lesson 12's library: the validation ladder (course_lib.validate) and choosing a scheme
(course_lib.guide). Expected values are worked out by hand or read from the JSON directly."""
import json
import math
from pathlib import Path

import pytest
import torch

from course_lib import device, guide, validate

device.ensure_triton_mode()   # running a model may import triton: interpreter mode first on a CPU

ROOT = Path(__file__).resolve().parent.parent


# ---- validate -----------------------------------------------------------------------------

@pytest.mark.parametrize("a, b, expected", [
    ([5, 6, 7], [5, 6, 9], 2), ([5, 6], [5, 6, 7], 2), ([1], [2], 0), ([4, 4], [4, 4], 2),
    ([], [3], 0), ([0, 0, 1, 2], [0, 0, 1, 3], 3),
])
def test_first_divergence_by_hand(a, b, expected):
    got = validate.first_divergence(torch.tensor(a, dtype=torch.long), torch.tensor(b, dtype=torch.long))
    assert got == expected and isinstance(got, int)


def test_first_divergence_refuses_bad_input():
    with pytest.raises(ValueError, match="1-D"):
        validate.first_divergence(torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="integer token ids"):
        validate.first_divergence(torch.tensor([1.0, 2.0]), torch.tensor([1, 2]))


def test_divergence_points_on_the_bundled_model():
    from course_lib import data, qmodel
    from course_lib.model import load_pretrained
    model = load_pretrained()
    prompts = data.to_tensor(data.heldout_text(2 * 64)).view(2, 64)        # (2, 64)
    ref_new = validate.continue_greedy(model, prompts, 20)                  # (2, 20)
    assert ref_new.shape == (2, 20)
    assert validate.divergence_points(ref_new, validate.continue_greedy(model, prompts, 20)) == [20, 20]
    w2, _ = qmodel.quantize_model(model, "int2", "per_channel", None)
    points = validate.divergence_points(ref_new, validate.continue_greedy(w2, prompts, 20))
    assert all(0 <= p < 20 for p in points)                               # 2 bits: it parts
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        validate.continue_greedy(model, prompts[0], 5)
    with pytest.raises(ValueError, match="same B"):
        validate.divergence_points(ref_new, ref_new[:1])


def test_mcnemar_by_hand():
    # 10 items: the variant loses 3 the reference had and wins 1 it missed
    ref = [1, 1, 1, 1, 1, 1, 0, 0, 1, 0]
    var = [0, 0, 0, 1, 1, 1, 1, 0, 1, 0]
    r = validate.mcnemar(ref, var)
    assert (r["n"], r["b"], r["c"]) == (10, 3, 1)
    assert r["change"] == pytest.approx(-0.2)
    assert r["p_value"] == pytest.approx(2 * (1 + 4) / 16)                 # P(X <= 1 | 4, 1/2) x 2
    assert validate.mcnemar(ref, ref)["p_value"] == 1.0                   # nothing discordant
    strong = validate.mcnemar([True] * 12 + [False] * 4, [False] * 12 + [False] * 4)
    assert strong["p_value"] == pytest.approx(2 / 2 ** 12)                # 12 flips, all one way
    assert validate.rung_sees("task", strong["p_value"])
    # paired vs unpaired: 8 items flip each way on 96 -> same accuracy, and the paired SE of
    # the change is sqrt(16/96)/sqrt(96), far below sqrt(2) x the binomial SE at p = 0.5
    a = [1] * 40 + [0] * 40 + [1] * 8 + [0] * 8
    b = [1] * 40 + [0] * 40 + [0] * 8 + [1] * 8
    r = validate.mcnemar(a, b)
    assert r["change"] == 0 and r["p_value"] == 1.0
    assert r["se_paired"] == pytest.approx((16 / 96) ** 0.5 / 96 ** 0.5)


def test_mcnemar_refuses_bad_input():
    with pytest.raises(ValueError, match="same items"):
        validate.mcnemar([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="empty"):
        validate.mcnemar([], [])
    with pytest.raises(ValueError, match="True/False"):
        validate.mcnemar([0.7, 0.2], [1, 0])                               # scores, not hits
    with pytest.raises(TypeError, match="list of True/False"):
        validate.mcnemar("1011", "1001")


def test_rung_values_refused_when_out_of_range():
    with pytest.raises(ValueError, match="fraction"):
        validate.rung_sees("top1", 97.0, n=100)                           # a percent
    with pytest.raises(ValueError, match=">= 0"):
        validate.rung_sees("kl", -1e-3)
    with pytest.raises(ValueError, match="finite"):
        validate.rung_sees("kl", float("nan"))
    with pytest.raises(ValueError, match="a fraction: 0.42"):
        validate.binomial_se(42, 96)
    with pytest.raises(ValueError, match="n_new"):
        validate.continue_greedy(None, torch.zeros(1, 4, dtype=torch.long), 0)


def test_binomial_se_and_rung_rules():
    assert validate.binomial_se(0.5, 100) == pytest.approx(0.05)             # sqrt(.25 / 100)
    with pytest.raises(ValueError, match="whole number"):
        validate.binomial_se(0.5, 0)
    with pytest.raises(ValueError, match="proportion"):
        validate.binomial_se(1.5, 10)
    assert validate.rung_sees("kl", 1e-3) and not validate.rung_sees("kl", 1e-8)
    assert validate.rung_sees("top1", 0.999, n=2000)          # 2 of 2,000 positions disagree
    assert not validate.rung_sees("top1", 1.0, n=2000)
    # task: the p-value of the paired test
    assert validate.rung_sees("task", 0.01) and not validate.rung_sees("task", 0.2)
    with pytest.raises(ValueError, match="p-value"):
        validate.rung_sees("task", 38.0)
    assert validate.rung_sees("generation", 31.5, n_new=64)
    assert not validate.rung_sees("generation", 64, n_new=64)
    with pytest.raises(ValueError, match="unknown rung"):
        validate.rung_sees("ppl", 1.0)
    with pytest.raises(ValueError, match="needs n"):
        validate.rung_sees("top1", 0.9)


# ---- guide: reading results ---------------------------------------------------------------

def test_summary_rows_are_read_not_retyped():
    results = guide.load_results()
    rows = guide.summary_rows(results, "smollm2")
    raw_methods = json.loads((ROOT / "results" / "methods_smollm2.json").read_text())
    awq = next(r for r in raw_methods["rows"] if (r["method"], r["bits"], r["group_size"]) == ("awq", 4, 32))
    assert guide.find_row(rows, "W4A16 INT4 g32, AWQ")["kl"] == awq["kl_nats"]
    raw_kv = json.loads((ROOT / "results" / "kv_smollm2.json").read_text())
    assert guide.find_row(rows, "KV cache KIVI 2-bit")["top1"] == raw_kv["overall"]["kivi2"]["top1"]
    bench = json.loads((ROOT / "results" / "bench_cuda_nvidia_h200_quick.json").read_text())
    layer = next(l for l in bench["layers"] if (l["K"], l["N"], l["M"]) == (8192, 8192, 4096))
    fp8 = guide.find_row(rows, "W8A8 FP8")
    assert fp8["prefill_x"] == layer["results"]["fp8 w8a8"]["ratio_vs_baseline"]
    assert fp8["e2e_x"] == bench["decode"]["results"]["fp8 w8a8"]["ratio_vs_baseline"]
    assert "W8A16" in guide.format_summary(rows) and len(guide.summary_rows(results, "bundled")) >= 10
    with pytest.raises(KeyError, match="no summary row"):
        guide.find_row(rows, "NVFP4")
    with pytest.raises(ValueError, match="unknown model"):
        guide.summary_rows(results, "llama")


def test_missing_files_drop_rows_and_a_cpu_bench_is_not_a_gpu_bench(tmp_path):
    src = ROOT / "results"
    for name in ("w8a8_smollm2.json", "bench_cpu_amd_epyc.json"):
        (tmp_path / name).write_text((src / name).read_text())
    results = guide.load_results(tmp_path)
    assert guide.gpu_bench(results) == (None, None)
    assert guide.newest_bench(results, "cpu")[0] == "bench_cpu_amd_epyc.json"
    rows = guide.summary_rows(results, "smollm2")
    assert {r["source"] for r in rows} == {"w8a8_smollm2.json"}
    assert all(r["prefill_x"] is None for r in rows)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        guide.load_results(tmp_path / "nope")


def test_bench_ratio_none_when_not_measured():
    _, bench = guide.gpu_bench(guide.load_results())
    assert guide.bench_ratio(bench, "bf16", (8192, 28672, 1)) == 1.0
    assert guide.bench_ratio(bench, "nvfp4", (8192, 28672, 1)) is None
    assert guide.bench_ratio(bench, "bf16", (1, 2, 3)) is None and guide.bench_ratio(None, "bf16", (1, 2, 3)) is None


# ---- guide: hardware, the rule, serving, quiz ------------------------------------------------

def test_support_rows_follow_the_catalogue():
    by = {r["gpu"]: r for r in guide.support_rows()}
    assert by["A100 80GB"]["fp8"] is None and by["A100 80GB"]["int8"] == 624
    assert by["H100 SXM"]["fp8"] == 1979 and by["H100 SXM"]["fp4"] is None
    assert by["B200"]["fp4"] == 9000 and by["L40S"]["cc"] == (8, 9)
    assert "16-bit" in guide.format_support()


@pytest.mark.parametrize("limit, gpu, params, batch, context, answer", [
    ("prefill", "A100 80GB", 8.03e9, 1, 4096, ("int8_w8a8", "bf16")),    # no FP8 maths on Ampere
    ("prefill", "RTX 4090", 8.03e9, 1, 4096, ("fp8_w8a8", "bf16")),      # Ada has it
    ("memory", "H100", 70.6e9, 1, 4096, ("w4a16", "bf16")),   # 70.6 + 1.3 + 3 GB > 72 GB
    ("memory", "B200", 70.6e9, 1, 4096, ("fp8_w8a8", "bf16")),
    ("accuracy", "H100", 8.03e9, 1, 4096, ("bf16", "bf16")),
    ("accuracy", "RTX 4090", 8.03e9, 8, 8192, ("w8a16", "bf16")),  # 16.06 + 8.6 + 3 > 21.6 GB
    ("decode", "MI300X", 405.9e9, 1, 4096, ("w4a16", "bf16")),     # 8-bit 405B: no room
    # decode follows the measurement (W8A8 1.68x, W4A16 0.62x on the H200), not the bytes
    ("decode", "H200", 70.6e9, 1, 4096, ("fp8_w8a8", "bf16")),
    ("decode", "A100 80GB", 8.03e9, 1, 4096, ("int8_w8a8", "bf16")),
    # the cache: FP8 at long contexts and large batches, never for accuracy
    ("decode", "H100", 8.03e9, 64, 4096, ("fp8_w8a8", "fp8")),     # 34 GB of BF16 cache
    ("accuracy", "H200", 8.03e9, 64, 4096, ("bf16", "bf16")),
    ("memory", "H100", 8.03e9, 1, 131072, ("fp8_w8a8", "fp8")),    # 17.2 GB >= 0.25 x 16.06
])
def test_choose_scheme_by_hand(limit, gpu, params, batch, context, answer):
    assert guide.choose_scheme(limit, gpu, params, batch, context) == answer


def test_choose_scheme_at_the_memory_boundary():
    # H100: 72 GB usable - 3 GB workspace - the cache = the room 8-bit weights may take
    kv = guide.kv_bytes_per_token_for(30e9) * 4096 / 1e9                     # 70B-shaped: 1.34 GB
    edge = (72 - 3 - kv) * 1e9
    assert guide.choose_scheme("memory", "H100", edge * 0.999) == ("fp8_w8a8", "bf16")
    assert guide.choose_scheme("memory", "H100", edge * 1.001) == ("w4a16", "bf16")
    # the batch alone moves a model across the boundary
    assert guide.choose_scheme("memory", "H100", 60e9, 1, 4096)[0] == "fp8_w8a8"
    assert guide.choose_scheme("memory", "H100", 60e9, 8, 4096)[0] == "w4a16"


def test_kv_choice_follows_the_cache_share():
    # 8B: 131,072 B/token; a quarter of 16.06 GB of BF16 weights is 4.0 GB = 30,630 tokens
    assert guide.kv_bytes_per_token_for(8.03e9) == 131072
    assert guide.kv_bytes_per_token_for(70.6e9) == 327680
    assert guide.choose_kv_cache("decode", 8.03e9, 1, 30630) == "bf16"
    assert guide.choose_kv_cache("decode", 8.03e9, 1, 30640) == "fp8"
    assert guide.choose_kv_cache("accuracy", 8.03e9, 64, 131072) == "bf16"


def test_choose_scheme_refuses_bad_input():
    with pytest.raises(ValueError, match="unknown limit"):
        guide.choose_scheme("speed", "H100", 8e9)
    with pytest.raises(ValueError, match="parameter count"):
        guide.choose_scheme("decode", "H100", -1)
    with pytest.raises(ValueError, match="parameter count"):
        guide.choose_scheme("decode", "H100", float("nan"))
    with pytest.raises(ValueError, match="unknown GPU"):
        guide.choose_scheme("decode", "H300", 8e9)
    with pytest.raises(ValueError, match="batch must be a whole number"):
        guide.choose_scheme("decode", "H100", 8e9, 0)
    with pytest.raises(ValueError, match="context must be a whole number"):
        guide.choose_scheme("decode", "H100", 8e9, 1, 4096.5)


def test_recommend_gives_reasons_and_read_evidence():
    r = guide.recommend("decode", "H200", 8.03e9)
    assert r["scheme"] == "fp8_w8a8" and r["weights_gb"] == pytest.approx(8.03)
    bench = json.loads((ROOT / "results" / "bench_cuda_nvidia_h200_quick.json").read_text())
    layer = next(l for l in bench["layers"] if (l["K"], l["N"], l["M"]) == (8192, 28672, 1))
    w4 = layer["results"]["w4a16 g128"]["ratio_vs_baseline"]
    assert any(f"w4a16 g128 {w4:.2f}x" in e and "rebuilt" in e for e in r["evidence"])
    r = guide.recommend("decode", "A100 40GB", 70.6e9, batch=16, context=8192)
    assert (r["scheme"], r["kv_cache"]) == ("w4a16", "fp8")
    assert any("Triton W4A16" in e and "bench_cuda" in e for e in r["evidence"])
    sweep = json.loads((ROOT / "results" / "sweep_gemv_nvidia_h200.json").read_text())
    best = max(x["speedup_vs_bf16"] for x in sweep["rows"] if x["kernel"] == "w4a16" and "ms" in x)
    assert guide.best_swept(guide.load_results())[1]["speedup_vs_bf16"] == best
    prep = sweep["shapes"][0]["w4a16_activation_prep_ms"] * 1e3
    assert any(f"{best:.2f}x BF16" in e and f"{prep:.0f} us" in e for e in r["evidence"])
    assert not any("instruction count" in e for e in r["evidence"])       # issue 18: not shown
    r = guide.recommend("prefill", "A100", 70.6e9, batch=8, context=32768)
    assert r["scheme"] == "int8_w8a8" and r["kv_cache"] == "fp8"
    assert any("without smoothing" in e for e in r["evidence"])
    assert any("uses 1.0" in x for x in r["reasons"])
    assert any("FP4 tensor cores" in x for x in guide.recommend("memory", "B200", 8e9)["reasons"])
    with pytest.raises(ValueError, match="the rule must return"):
        guide.recommend("decode", "H100", 8e9, rule=lambda *a: "int3")
    with pytest.raises(ValueError, match="the rule must return"):
        guide.recommend("decode", "H100", 8e9, rule=lambda *a: "bf16")      # the old, 1-value rule


def test_loaded_weights_match_the_source():
    # seed 000: ~8.5 GiB for the FP8 8B model (embeddings and head in BF16), ~15 in BF16
    fp8 = guide.loaded_weights_gib(8.03e9, 8, 2 * 128_256 * 4096)
    assert round(fp8, 1) == 8.5 and round(guide.loaded_weights_gib(8.03e9, 16)) == 15
    with pytest.raises(ValueError, match="kept_16bit_params"):
        guide.loaded_weights_gib(1e9, 8, 2e9)


def test_serving_table_says_what_each_engine_changes():
    text = guide.serving_text()
    assert "--quantization fp8" in text and "--kv-cache-dtype fp8" in text
    by_cmd = {s["command"].split()[-1] if s["engine"] != "vLLM" else s["command"]: s for s in guide.SERVING}
    static = next(s for s in guide.SERVING if s["command"].endswith("Instruct-FP8"))
    assert "STATIC" in static["changes"] and "per token" not in static["changes"].split("Nothing")[0]
    dynamic = next(s for s in guide.SERVING if "FP8-dynamic --kv-cache-dtype fp8" in s["command"])
    assert "per token" in dynamic["changes"] and "scale of 1.0" in dynamic["changes"]
    engines = {s["engine"] for s in guide.SERVING}
    assert engines == {"vLLM", "SGLang", "llama.cpp"} and by_cmd
    assert "--kv-cache-dtype fp8_e4m3" in text and "-ctk q8_0 -ctv q8_0" in text and "-fa" in text
    assert "Q4_K_M" in text and "Q8_0.gguf" in text and "lesson 13" in text
    assert guide.Q8_0_BITS == 8.5
    recipe = guide.LLM_COMPRESSOR_RECIPE
    assert "GPTQModifier" in recipe and "W4A16" in recipe and "SmolLM2" in recipe
    compile(recipe, "recipe", "exec")                                      # valid Python


def test_quiz_answers_are_options_and_balanced():
    for q, (question, options, answer) in guide.QUIZ.items():
        assert answer in options and guide.quiz_answer(q) == answer and question
    letters = [guide.quiz_answer(q) for q in guide.QUIZ]
    assert max(letters.count(x) for x in set(letters)) <= 2              # no letter dominates
    with pytest.raises(KeyError, match="unknown question"):
        guide.quiz_answer("q0")


def test_decision_widget_updates_and_takes_a_rule():
    from course_lib.widgets.decision import decision_widget
    box = decision_widget()
    assert "FP8 W8A8" in box.result.value and "bench_cuda" in box.result.value
    assert "kv-cache-dtype" not in box.result.value.split("reasons")[0]
    box.controls["batch"].value = 64
    assert "<code>--kv-cache-dtype fp8</code>" in box.result.value      # 64 users: FP8 cache
    box.controls["limit"].value = "prefill"
    box.controls["gpu"].value = "A100 80GB"
    assert "INT8 W8A8" in box.result.value
    box.controls["limit"].value = "accuracy"
    box.controls["size"].value = 405.9
    assert "W8A16" in box.result.value
    mine = decision_widget(rule=lambda limit, gpu, params, batch, context: ("bf16", "bf16"))
    assert "BF16, not quantized" in mine.result.value


def test_task_hits_are_the_items_of_completion_accuracy():
    from course_lib import data, eval as ceval
    from course_lib.model import load_pretrained
    model, text = load_pretrained(), data.heldout_text()
    hits = validate.task_hits(model, text, n=8)
    assert len(hits) == 8 and all(isinstance(h, bool) for h in hits)
    assert sum(hits) / 8 == ceval.completion_accuracy(model, text, n=8)
    assert validate.mcnemar(hits, hits)["p_value"] == 1.0


def test_guide_refuses_bad_input():
    with pytest.raises(ValueError, match="batch must be a whole number"):
        guide.recommend("decode", "H100", 8e9, {}, batch=-2)
    with pytest.raises(ValueError, match="context must be a whole number"):
        guide.choose_kv_cache("decode", 8e9, 1, 0)
    with pytest.raises(ValueError, match="unknown limit"):
        guide.choose_kv_cache("latency", 8e9)
    with pytest.raises(ValueError, match="parameter count"):
        guide.kv_bytes_per_token_for(0)
    with pytest.raises(ValueError, match="bits per weight"):
        guide.loaded_weights_gib(8e9, 0)
    with pytest.raises(ValueError, match="bits per weight"):
        guide.loaded_weights_gib(8e9, 800)                                # bits, not a percent


# ---------------------------------------------------------------- the KL tail and flips (issue 38)

def test_kl_tail_by_hand():
    """Two positions over a vocabulary of 2: one unchanged, one whose top-1 flips."""
    ref = torch.log(torch.tensor([[0.9, 0.1], [0.6, 0.4]], dtype=torch.float64))
    var = torch.log(torch.tensor([[0.9, 0.1], [0.3, 0.7]], dtype=torch.float64))
    r = validate.kl_tail(ref, var, targets=torch.tensor([0, 1]))
    kl1 = 0.6 * math.log(0.6 / 0.3) + 0.4 * math.log(0.4 / 0.7)
    assert r["n"] == 2 and r["flips"] == 1 and r["flip_rate"] == 0.5 == r["top1_agreement"]
    assert r["kl_max"] == pytest.approx(kl1) and r["kl_mean"] == pytest.approx(kl1 / 2)
    assert r["kl_q99"] == pytest.approx(0.99 * kl1) and r["kl_q999"] == pytest.approx(0.999 * kl1)
    assert r["dp_mean"] == pytest.approx(0.15) and r["dp_max"] == pytest.approx(0.3)
    assert r["dp_min"] == pytest.approx(0.0) and r["dp_rms"] == pytest.approx(math.sqrt(0.045))


def test_kl_tail_sees_what_the_mean_hides():
    """One bad position in 1,000: the mean barely moves, the maximum and 99.9% show it."""
    g = torch.Generator().manual_seed(0)
    ref = torch.log_softmax(torch.randn(1000, 50, generator=g), -1)
    var = ref.clone()
    var[7] = torch.log_softmax(-ref[7] * 3, -1)                 # one position turned upside down
    r = validate.kl_tail(ref, var)
    assert r["flips"] == 1 and r["kl_q99"] == 0 and r["kl_max"] > 500 * r["kl_mean"]
    assert r["kl_q999"] > 0 and "dp_mean" not in r


def test_kl_tail_refuses_bad_input():
    lp = torch.log_softmax(torch.zeros(3, 4), -1)
    with pytest.raises(ValueError, match="same positions"):
        validate.kl_tail(lp, lp[:2])
    with pytest.raises(ValueError, match="not log-probabilities"):
        validate.kl_tail(lp, torch.zeros(3, 4) + 5)
    with pytest.raises(ValueError, match=r"\(N, V\)"):
        validate.kl_tail(lp[0], lp[0])
    with pytest.raises(ValueError, match="targets must be"):
        validate.kl_tail(lp, lp, targets=torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="targets span"):
        validate.kl_tail(lp, lp, targets=torch.tensor([0, 1, 9]))
