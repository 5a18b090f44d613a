"""Checkers of lesson 17 (your own model): the reference passes, every wrong answer is rejected by
the case built to catch it, the other right readings pass, the hints teach in steps, and the
references agree with the library and with the released models' published sizes."""
import pytest
import torch

from course_lib import checks, own_model
from course_lib.checks import check, lesson17

from checker_cases import rejected_on

checks.load_all()
IDS = ["17.count_parameters", "17.sequential_inputs", "17.choose_format"]


@pytest.fixture(autouse=True)
def learner_mode(monkeypatch):
    monkeypatch.setenv("COURSE_CHECKS", "learner")


@pytest.mark.parametrize("ex_id, wrong, label", [
    ("17.count_parameters", lesson17._wrong_cp_no_gqa, "9 query heads share 3"),
    ("17.count_parameters", lesson17._wrong_cp_head_always, "a tied head"),
    ("17.count_parameters", lesson17._wrong_cp_head_never, "UNTIED head"),
    ("17.count_parameters", lesson17._wrong_cp_no_norms, "SmolLM2-135M"),
    ("17.count_parameters", lesson17._wrong_cp_no_bias, "biases on q, k and v"),
    ("17.count_parameters", lesson17._wrong_cp_head_dim_derived, "head_dim 128"),
    ("17.count_parameters", lesson17._wrong_cp_no_qk_norm, "q/k norms"),
    ("17.count_parameters", lesson17._wrong_cp_two_matrices, "SmolLM2-135M"),
    ("17.count_parameters", lesson17._wrong_cp_tie_default_true, "no tie_word_embeddings"),
    ("17.count_parameters", lesson17._wrong_cp_no_final_norm, "SmolLM2-135M"),
    ("17.count_parameters", lesson17._wrong_cp_float, "SmolLM2-135M"),
    ("17.sequential_inputs", lesson17._wrong_si_fp, "QUANTIZED block i's output"),
    ("17.sequential_inputs", lesson17._wrong_si_outputs, "its input is x itself"),
    ("17.sequential_inputs", lesson17._wrong_si_all_on_x, "QUANTIZED block i's output"),
    ("17.sequential_inputs", lesson17._wrong_si_drop_last, "3 blocks"),
    ("17.sequential_inputs", lesson17._wrong_si_swapped_rope, "3 blocks"),
    ("17.sequential_inputs", lesson17._wrong_si_in_place, "changed its input"),
    ("17.sequential_inputs", lesson17._wrong_si_no_refusal, "no blocks"),
    ("17.choose_format", lesson17._wrong_cf_smallest, "the lowest KL wins"),
    ("17.choose_format", lesson17._wrong_cf_ignore_budget, "g32 rows are too big"),
    ("17.choose_format", lesson17._wrong_cf_strict, "W4 g64's bytes"),
    ("17.choose_format", lesson17._wrong_cf_biggest, "equal KL"),
    ("17.choose_format", lesson17._wrong_cf_perplexity, "lower perplexity"),
    ("17.choose_format", lesson17._wrong_cf_none, "nothing fits"),
    ("17.choose_format", lesson17._wrong_cf_tie_bigger, "equal KL"),
    ("17.choose_format", lesson17._wrong_cf_returns_row, "the lowest KL wins"),
])
def test_each_wrong_answer_is_rejected_by_its_case(ex_id, wrong, label):
    rejected_on(ex_id, wrong, label)


@pytest.mark.parametrize("ex_id", IDS)
def test_five_wrong_answers_and_the_reference_passes(ex_id):
    ex = checks.EXERCISES[ex_id]
    assert len(ex.wrong) >= 5 and check(ex_id, ex.reference, quiet=True)
    for right in ex.right:
        assert check(ex_id, right, quiet=True), right.__name__


@pytest.mark.parametrize("ex_id", IDS)
def test_hints_come_in_steps_and_the_first_asks_without_code(ex_id):
    steps = checks.EXERCISES[ex_id].hints
    assert len(steps) >= 3 and "?" in steps[0]
    for token in ("torch.", "return ", " = ", "(", "<="):
        assert token not in steps[0], (ex_id, token)


def test_an_unsolved_exercise_is_not_yet_implemented():
    def stub(*args):
        raise NotImplementedError("exercise: write this part")
    for ex_id in IDS:
        assert check(ex_id, stub, quiet=True).status == "not implemented"


def test_the_counts_are_the_published_ones():
    """The reference (own_model.count_parameters) on the released configs gives the counts their
    model cards state: Llama-3.1-8B 8,030,261,248 and SmolLM2-135M 134,515,008 (as
    tests/test_own_model.py), Mistral-7B-v0.1 7.24B, LLaMA-7B 6.74B, Qwen2.5-0.5B 0.49B with 0.36B
    outside the embedding, Qwen3-0.6B 0.6B with 0.44B outside it."""
    n = {k: lesson17.count_parameters(c) for k, c in lesson17.RELEASED.items()}
    assert n["Llama-3.1-8B"] == 8_030_261_248 and n["SmolLM2-135M"] == 134_515_008
    assert n["Mistral-7B-v0.1"] == 7_241_732_096
    assert lesson17.count_parameters(lesson17.LLAMA1_7B) == 6_738_415_616
    emb = {k: c["vocab_size"] * c["hidden_size"] for k, c in lesson17.RELEASED.items()}
    assert round(n["Qwen2.5-0.5B"] / 1e9, 2) == 0.49
    assert round((n["Qwen2.5-0.5B"] - emb["Qwen2.5-0.5B"]) / 1e9, 2) == 0.36
    assert round(n["Qwen3-0.6B"] / 1e9, 1) == 0.6
    assert round((n["Qwen3-0.6B"] - emb["Qwen3-0.6B"]) / 1e9, 2) == 0.44
    assert round(n["Llama-3.2-1B"] / 1e9, 2) == 1.24


def test_sequential_inputs_is_what_the_library_calibrates_on():
    """The reference feeds each block what calibration.quantize_blockwise feeds it (inputs=
    'quantized'): the same tensors, on a tiny model quantized by the same GPTQ step."""
    from course_lib.methods import calibration as cal
    from course_lib.model import LlamaModel, ModelConfig
    cfg = ModelConfig(**lesson17.TINY)
    model = LlamaModel(cfg).init_weights(0).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 10), generator=torch.Generator().manual_seed(0))
    seen = []

    def record(block, x, cos, sin):
        seen.append(x.clone())
        q = lesson17.gptq_block(block, x, cos, sin)
        block.load_state_dict(q.state_dict(), strict=False)     # the dequantized weights
    cal.quantize_blockwise(model, ids, record)
    cos, sin = model.rope(0, 10)
    with torch.no_grad():
        x0 = model.model.embed_tokens(ids)
    ours = lesson17.sequential_inputs(list(model.model.layers), x0, cos, sin,
                                      lesson17.gptq_block)
    assert len(ours) == len(seen) == cfg.num_hidden_layers
    for a, b in zip(ours, seen):
        assert torch.allclose(a, b, atol=1e-5)
    assert not torch.allclose(ours[1], model.model.layers[0](x0, cos, sin), atol=1e-3)


def test_choose_format_reads_the_committed_rows():
    """The case rows are the committed table's (rounded): the table's lowest-KL W4 g32 row is
    AWQ and its lowest-perplexity row GPTQ with act-order, the disagreement case 1 tests."""
    from course_lib.methods import table
    rows = [r for r in table.load_table("smollm2")["rows"] if (r["bits"], r["group_size"]) == (4, 32)]
    assert min(rows, key=lambda r: r["kl_nats"])["method"] == "awq"
    assert min(rows, key=lambda r: r["perplexity"])["method"] == "gptq+act"
    case_rows = {r["name"]: r for r in lesson17._cf_rows()}
    for r in rows:
        name = {"rtn": "RTN", "gptq": "GPTQ", "gptq+act": "GPTQ act-order", "awq": "AWQ"}[r["method"]]
        assert case_rows[f"{name} W4 g32"]["kl_nats"] == pytest.approx(r["kl_nats"], abs=6e-4)
    lin = 30 * own_model.count_parameters(own_model.own_config(lesson17.SMOLLM2_135M))["linear_per_layer"]
    assert case_rows["RTN W4 g32"]["bytes"] == int(lin * 4.5 / 8)
    with pytest.raises(ValueError, match="smallest"):
        lesson17.choose_format(lesson17._cf_rows(), 10)
