"""What a Q4_K_M file holds (lesson 14): llama.cpp's per-tensor rule as course_lib.kmix states it,
checked against the types llama_model_quantize chose for SmolLM2, and the course's writer
giving llama.cpp's bytes for every tensor of the Q4_K_M mix from the same F16 file.

The engine comparisons skip with one line when llama-cpp-python is not built (`make engine`);
CI sets COURSE_REQUIRE_ENGINE=1, and then a missing engine fails instead."""
import os

import numpy as np
import pytest

from course_lib import engine, kmix, kquants
from course_lib import gguf_model as gm

needs_engine = pytest.mark.skipif(
    not engine.available() and not os.environ.get("COURSE_REQUIRE_ENGINE"),
    reason=engine.skip_reason())

SMOLLM_SHAPES = {"attn_q": (576, 576), "attn_k": (192, 576), "attn_v": (192, 576),
                 "attn_output": (576, 576), "ffn_gate": (1536, 576), "ffn_up": (1536, 576),
                 "ffn_down": (576, 1536)}


def test_use_more_bits_picks_14_of_30_layers():
    layers = [i for i in range(30) if kmix.use_more_bits(i, 30)]
    assert layers == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]


def test_q4_k_m_rule_on_smollm2_shapes():
    """Only ffn_down (1536 wide) keeps k-quants; everything else falls back: 180 tensors."""
    choices = {(i, k): kmix.llama_type("q4_k_m", f"blk.{i}.{k}.weight", s[1], 30)
               for i in range(30) for k, s in SMOLLM_SHAPES.items()}
    assert sum(c.fallback for c in choices.values()) == 180
    down = [choices[i, "ffn_down"].stored for i in range(30)]
    assert down.count("q6_k") == 14 and down.count("q4_k") == 16
    v = [choices[i, "attn_v"].stored for i in range(30)]
    assert v.count("q8_0") == 14 and v.count("q5_0") == 16
    assert {choices[i, k].stored for i in range(30)
            for k in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up")} == {"q5_0"}
    emb = kmix.llama_type("q4_k_m", "token_embd.weight", 576, 30)
    assert emb == kmix.Choice("q8_0", "q8_0", False)
    # a model with 4096-wide rows keeps the k-quants
    assert kmix.llama_type("q4_k_m", "blk.0.attn_v.weight", 4096, 32).stored == "q6_k"
    assert kmix.llama_type("q3_k_m", "blk.9.attn_q.weight", 576, 30).stored == "q4_0"


def test_untied_embedding_takes_the_base_type():
    """Without a tied head, llama.cpp's Q4_K_M leaves token_embd at the base type (and its
    fallback): only the head (output.weight) gets Q6_K."""
    assert kmix.llama_type("q4_k_m", "token_embd.weight", 4096, 32, tied=False) == \
        kmix.Choice("q4_k", "q4_k", False)
    assert kmix.llama_type("q4_k_m", "token_embd.weight", 576, 30, tied=False) == \
        kmix.Choice("q4_k", "q5_0", True)
    assert kmix.llama_type("q4_k_m", "output.weight", 4096, 32, tied=False).stored == "q6_k"


def test_where_the_bits_go():
    """SmolLM2's 6.17 bits per weight split by cause; the same rule on Llama-3.1-8B's shapes
    gives the 4.8944 that llama.cpp's tools/quantize/README.md reports for its Q4_K_M."""
    small = kmix.llama_shapes(30, 576, 1536, 192, 49152, tied=True)
    assert len(small) == 272
    parts = kmix.where_the_bits_go("q4_k_m", small, 30)
    assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"))
    assert round(parts["total"], 2) == 6.17 and parts["base"] == 4.5
    assert round(parts["head"], 2) == 0.84 and round(parts["fallbacks"], 2) == 0.60
    assert round(parts["upgrades"] + parts["norms"], 2) == 0.22
    big = kmix.llama_shapes(32, 4096, 14336, 1024, 128256, tied=False)
    big_parts = kmix.where_the_bits_go("q4_k_m", big, 32)
    assert round(big_parts["total"], 4) == 4.8944 and big_parts["fallbacks"] == 0
    with pytest.raises(ValueError, match="base type"):
        kmix.where_the_bits_go("q3_k_m", small, 30)
    with pytest.raises(ValueError, match="token_embd"):
        kmix.where_the_bits_go("q4_k_m", {}, 30)
    with pytest.raises(ValueError, match="hidden must be a whole number"):
        kmix.llama_shapes(30, 0, 1536, 192, 49152, tied=True)


def test_file_bytes_and_refusals():
    types = {"a": "q4_k", "b": "q5_0", "c": "f16"}
    shapes = {"a": (10, 512), "b": (3, 64), "c": (2, 8)}
    assert kmix.file_bytes(types, shapes) == 10 * 2 * 144 + 3 * 2 * 22 + 2 * 16
    with pytest.raises(ValueError, match="mix must be one of"):
        kmix.llama_type("q2_k", "blk.0.attn_q.weight", 576, 30)
    with pytest.raises(ValueError, match="not a Linear weight"):
        kmix.llama_type("q4_k_m", "blk.0.attn_norm", 576, 30)


@pytest.fixture(scope="module")
def f16_file(tmp_path_factory):
    from course_lib import export, smollm
    if not smollm.available():
        pytest.skip("SmolLM2 is not converted (make smollm)")
    m = smollm.load()
    for p in m.parameters():
        p.data = p.data.half().float()
    return export.export_gguf(m, tmp_path_factory.mktemp("kmix") / "f16.gguf", "f16")


def _tensors(path):
    return {t.name: (t.tensor_type.name.lower(), np.asarray(t.data).tobytes())
            for t in gm.open_gguf(path).tensors}


@needs_engine
def test_course_q4_k_m_is_llama_cpps_byte_for_byte(f16_file, tmp_path):
    theirs_path = engine.quantize_file(f16_file, tmp_path / "llama.gguf", "q4_k_m")
    rows = kmix.read_mix(theirs_path)
    s = kmix.summary(rows)
    assert round(s["bits_per_weight"], 2) == 6.17 and round(s["mib"], 1) == 98.9
    plan = kmix.plan("q4_k_m", f16_file)
    assert sum(c.fallback for c in plan.values()) == 180
    ours_path = kmix.write_mix(f16_file, tmp_path / "ours.gguf",
                               {n: c.stored for n, c in plan.items()})
    theirs, ours = _tensors(theirs_path), _tensors(ours_path)
    assert set(theirs) == set(ours)
    for name, (kind, raw) in theirs.items():
        assert ours[name][0] == kind, f"{name}: llama.cpp chose {kind}, the course {ours[name][0]}"
        assert ours[name][1] == raw, f"{name} ({kind}): bytes differ"


@needs_engine
@pytest.mark.parametrize("mix", ["q4_k_s", "q3_k_m"])
def test_rule_matches_llama_cpps_types(f16_file, tmp_path, mix):
    theirs = kmix.read_mix(engine.quantize_file(f16_file, tmp_path / f"{mix}.gguf", mix))
    plan = kmix.plan(mix, f16_file)
    for r in theirs:
        if r["name"] in plan:
            assert plan[r["name"]].stored == r["type"], r["name"]
    assert sum(c.fallback for c in plan.values()) == 180


def test_write_mix_refuses_a_quantized_source(tmp_path):
    from course_lib import smollm
    if not smollm.available():
        pytest.skip("SmolLM2 is not converted (make smollm)")
    with pytest.raises(ValueError, match="starts from an F16 file"):
        kmix.write_mix(smollm.gguf_path(), tmp_path / "x.gguf", {})
    with pytest.raises(ValueError, match="file_type must be one of"):
        kmix.write_mix(smollm.gguf_path(), tmp_path / "x.gguf", {}, file_type="q9")
    assert kquants.fits("q5_0", 576)
