"""llama.cpp against the course (lesson 13): the GGUF writer byte for byte against llama.cpp's
own quantizer, the engine's logits against the course's LlamaModel, GPTQ on the Q4_0 grid
against round-to-nearest on the same grid, and the engine wrapper's refusals.

Skipped with one line when llama-cpp-python is not built (`make engine`); CI sets
COURSE_REQUIRE_ENGINE=1, and then a missing engine fails instead."""
import copy
import math
import os

import numpy as np
import pytest
import torch

from course_lib import device, engine, export, smollm
from course_lib import eval as ceval
from course_lib import gguf_model as gm

if not engine.available():
    if os.environ.get("COURSE_REQUIRE_ENGINE"):
        raise RuntimeError("COURSE_REQUIRE_ENGINE is set but " + engine.skip_reason())
    pytest.skip(engine.skip_reason(), allow_module_level=True)

device.ensure_triton_mode()   # before smollm.load imports triton (the bandwidth probe needs it)
torch.set_num_threads(1)
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def model16():
    """SmolLM2 with every weight rounded to fp16: what an F16 file holds, exactly."""
    m = smollm.load()
    for p in m.parameters():
        p.data = p.data.half().float()
    return m


@pytest.fixture(scope="module")
def files(model16, tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    return {fmt: export.export_gguf(model16, d / f"smollm2_{fmt}.gguf", fmt)
            for fmt in ("f16", "q8_0", "q4_0", "q4_1")}


def _tensors(path):
    return {t.name: (t.tensor_type.name, np.asarray(t.data).tobytes())
            for t in gm.open_gguf(path).tensors}


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1"])
def test_writer_is_bit_exact_against_llama_cpps_quantizer(files, tmp_path, fmt):
    """From the same F16 weights, llama_model_quantize and the course's writer give the same
    bytes for every tensor both put in the same format (llama.cpp picks Q8_0 for SmolLM2's tied
    embedding: 576 columns do not fit its preferred Q6_K's blocks of 256)."""
    theirs = _tensors(engine.quantize_file(files["f16"], tmp_path / "llama.gguf", fmt))
    ours = _tensors(files[fmt])
    assert set(theirs) == set(ours)
    linears = [n for n in ours if n.startswith("blk.") and ours[n][0] == fmt.upper()]
    assert len(linears) == 7 * 30
    for name, (kind, raw) in ours.items():
        assert theirs[name][0] == kind, f"{name}: llama.cpp chose {theirs[name][0]}, we {kind}"
        assert theirs[name][1] == raw, f"{name} ({kind}): bytes differ"


@pytest.fixture(scope="module")
def window_ids():
    return smollm.eval_ids()[:128]


def test_engine_logits_agree_with_the_course_model(model16, files, window_ids):
    """F16: the engine computes what the course computes, up to fp16 activations inside its
    matmuls and its fp16 KV cache: top-1 identical almost everywhere, KL tiny. The quantized
    files add llama.cpp's 8-bit activations (Q8_0 blocks) inside the Q4/Q8 dot products: a
    larger but still small difference, measured against the course model with the same
    weights."""
    ids = window_ids
    with torch.no_grad():
        ours = torch.log_softmax(model16(ids[None])[0].float(), -1)          # (T, V)
    theirs = torch.log_softmax(engine.logits(files["f16"], ids), -1)
    kl, top1 = ceval.kl_and_top1(ours, theirs)
    assert kl < 2e-3 and top1 > 0.97, (kl, top1)
    qm = copy.deepcopy(model16)
    for name, mod in qm.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in f".{name}":
            mod.weight.data = gm.quantize_q4_0(mod.weight.data).dequantize()
    emb = qm.model.embed_tokens.weight
    emb.data = gm.quantize_q8_0(emb.data).dequantize()
    with torch.no_grad():
        ours_q = torch.log_softmax(qm(ids[None])[0].float(), -1)
    theirs_q = torch.log_softmax(engine.logits(files["q4_0"], ids), -1)
    kl_q, top1_q = ceval.kl_and_top1(ours_q, theirs_q)
    kl_ref, _ = ceval.kl_and_top1(ours, ours_q)                              # Q4_0's own cost
    assert kl_q < 0.05 and top1_q > 0.9, (kl_q, top1_q)
    assert kl_q < kl_ref / 3, "the engine's difference must be far below the format's own loss"


def test_engine_generates_paris_from_the_f16_file(files):
    tok = smollm.tokenizer()
    new = engine.generate(files["f16"], tok.encode(PROMPT), 3)
    assert "Paris" in tok.decode(new)


def test_gptq_on_the_q4_0_grid_beats_rtn_through_the_engine(model16, files, tmp_path):
    """GPTQ on the first 8 of 30 blocks, the writer's RTN on the rest (a file mixing both, as
    llama.cpp reads it) against RTN everywhere: GPTQ's codes alone lower the KL. Lesson 13's
    notebook checks the whole model through the engine."""
    from course_lib.methods import calibration as cal
    from course_lib.methods import gptq
    ids = cal.calibration_ids("smollm2", 4, 256)
    qg, _ = gptq.gptq_model(model16, ids, 4, 32, grid="q4_0", act_order=True, n_blocks=8)
    path = export.export_gguf(qg, tmp_path / "gptq.gguf", "q4_0")
    ref = smollm.reference(model16, 1)
    rtn = engine.score(files["q4_0"], smollm.eval_ids(), 512, 1, ref)
    g = engine.score(path, smollm.eval_ids(), 512, 1, ref)
    print(f"KL RTN {rtn['kl_nats']:.4f}, GPTQ on 8 blocks {g['kl_nats']:.4f}")
    assert g["kl_nats"] < 0.95 * rtn["kl_nats"], (g, rtn)


def test_speed_and_prediction_helpers(files):
    s = engine.decode_speed(files["q4_0"], [1, 2, 3], new_tokens=4, runs=2, threads=1)
    assert len(s["tokens_per_s"]) == 2 and s["min"] <= s["median"] <= s["max"]
    assert s["threads"] == 1
    n = engine.bytes_per_token(files["q4_0"])
    assert 0.25 * files["q4_0"].stat().st_size < n <= files["q4_0"].stat().st_size
    assert engine.predicted_tokens_per_s(1e9, 10.0) == pytest.approx(10.0)


def test_speed_limits_measure_both_limits(files):
    models = {k: engine.load(files[k], threads=1) for k in ("q8_0", "q4_0")}
    lines = []
    out = engine.speed_limits(models, {k: files[k] for k in models}, threads=(1,), new_tokens=4,
                              runs=2, prompt_tokens=16, progress=lines.append)
    assert out["threads"] == [1] and out["bandwidth_gbps"][1] > 0
    for k in models:
        row = out["rows"][k]
        assert row["bytes_per_token"] == engine.bytes_per_token(files[k])
        r = row[1]
        assert len(r["decode"]) == 2 and r["min"] <= r["median"] <= r["max"]
        assert r["memory_limit"] == pytest.approx(out["bandwidth_gbps"][1] * 1e9 / row["bytes_per_token"])
        assert r["compute_limit"] > 0
        assert r["limit"] == ("memory" if r["memory_limit"] < r["compute_limit"] else "compute")
    assert len(lines) == 3 and "read bandwidth" in lines[0]
    engine.set_threads(models["q4_0"], 2)
    assert models["q4_0"].n_threads == 2
    with pytest.raises(ValueError, match="at least 16 prompt tokens"):
        engine.prefill_speed(models["q4_0"], [1, 2, 3])
    with pytest.raises(ValueError, match="same keys"):
        engine.speed_limits(models, {"q8_0": files["q8_0"]})


def test_q8_activation_rules_differ_only_at_ties():
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1], x[0, 2] = 127.0, 2.5, -3.5          # amax 127: 127/max = 1, d = 1
    q_cpu, d = engine.q8_codes_cpu(x)
    q_ref = gm.quantize_q8_0(x).codes
    assert q_cpu[0, :3].tolist() == [127, 2, -4]          # halves to even
    assert q_ref[0, :3].tolist() == [127, 3, -4]          # halves away from zero
    assert float(d[0, 0]) == 1.0
    m = torch.nn.Sequential(torch.nn.Linear(32, 4))
    with engine.q8_activations(m, "cpu"):
        y_cpu = m(x)
    with engine.q8_activations(m, "ref"):
        y_ref = m(x)
    assert not torch.equal(y_cpu, y_ref)
    with pytest.raises(ValueError, match="multiple of 32"):
        engine.q8_codes_cpu(torch.zeros(2, 33))
    with pytest.raises(ValueError, match="rule must be"):
        engine.q8_activations(m, "avx")


def test_engine_refusals(files, tmp_path):
    with pytest.raises(ValueError, match="fmt must be one of"):
        engine.quantize_file(files["f16"], tmp_path / "x.gguf", "q4_k")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        engine.quantize_file(files["f16"], files["q8_0"], "q8_0")
    with pytest.raises(ValueError, match="differ from src"):
        engine.quantize_file(files["f16"], files["f16"], "q8_0", overwrite=True)
    with pytest.raises(RuntimeError, match="allow_requantize=True"):
        engine.quantize_file(files["q4_1"], tmp_path / "twice.gguf", "q4_0")
    assert list(tmp_path.iterdir()) == []                    # nothing half-written
    with pytest.raises(FileNotFoundError, match="does not exist"):
        engine.load(tmp_path / "none.gguf")
    with pytest.raises(ValueError, match="1-D sequence"):
        engine.logits(files["q8_0"], torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="0..49151"):
        engine.logits(files["q8_0"], [49152])
    with pytest.raises(ValueError, match="threads"):
        engine.decode_speed(files["q8_0"], [1], threads=0)
    with pytest.raises(ValueError, match="positive finite"):
        engine.predicted_tokens_per_s(0, 10.0)


def test_absent_engine_says_how_to_build_it(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_llama(name, *a, **k):
        if name == "llama_cpp":
            raise ImportError("no module")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_llama)
    with pytest.raises(ImportError, match="make engine"):
        engine.require()
    assert not engine.available() and "make engine" in engine.skip_reason()


def test_score_keeps_each_window_apart(model16, files):
    """engine.score's per-window figures (lesson 14's spread): two windows of the clean
    protocol's evaluation text, each figure a window's mean, their mean the overall one."""
    ids = smollm.eval_ids("clean")
    ref = smollm.reference(model16, 2, 256, protocol="clean")
    s = engine.score(files["q4_0"], ids, 256, 2, ref)
    w = s["windows"]
    assert len(w["kl_nats"]) == len(w["top1_agreement"]) == len(w["nll_nats"]) == 2
    assert sum(w["kl_nats"]) / 2 == pytest.approx(s["kl_nats"], rel=1e-6)
    assert sum(w["top1_agreement"]) / 2 == pytest.approx(s["top1_agreement"], rel=1e-6)
    assert math.exp(sum(w["nll_nats"]) / 2) == pytest.approx(s["perplexity"], rel=1e-6)
    assert w["kl_nats"][0] != w["kl_nats"][1]            # two texts, two figures
