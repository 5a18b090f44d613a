"""The bad inputs a learner can give the library, each refused with a message that says what is
wrong and what to do (or, where the input is fine after all, answered)."""
import json
import os

import numpy as np
import pytest
import torch

from course_lib import eval as ceval
from course_lib import gguf_model, guide, hardware, kv, learner_progress, quant, smollm, validate
from course_lib.methods import calibration as cal
from course_lib.methods import table
from course_lib.model import load_pretrained


def test_a_q4_1_block_past_fp16s_range_is_refused_with_the_reason():
    w = torch.zeros(2, 64)
    w[1, 40], w[1, 41] = 7e5, -7e5                      # block 3: d = 93,333 > 65,504
    with pytest.raises(ValueError, match=r"block 3 \(row 1\).*beyond fp16's range.*inf"):
        gguf_model.quantize_q4_1(w)
    ok = gguf_model.quantize_q4_1(torch.full((1, 32), 6e4))   # within range: still quantized
    assert torch.isfinite(ok.dequantize()).all()


@pytest.mark.parametrize("fmt, symmetric", [("int8", True), ("int4", False)])
def test_float32_subnormals_are_refused_not_zeroed(fmt, symmetric):
    x = np.full(8, 1e-44, dtype=np.float32)            # scale 1e-44/127 flushes to 0 in float32
    with pytest.raises(ValueError, match="smallest normal number.*Multiply x by a power of two"):
        quant.quantize(x, fmt, "per_tensor", symmetric=symmetric)
    with pytest.raises(ValueError, match="smallest normal"):
        quant.absmax_quantize(np.array([2e-40, 1e-40], dtype=np.float32), 8)
    q = quant.quantize(x.astype(np.float64), fmt, "per_tensor", symmetric=symmetric)
    assert np.abs(q.q.astype(int)).max() > 0           # the float64 copy the message suggests
    quant.quantize(np.zeros(4, np.float32), fmt, "per_tensor", symmetric=symmetric)  # all zero: fine


def test_half_a_token_is_refused():
    with pytest.raises(ValueError, match="tokens_per_conversation must be a whole number.*half "
                                         "a token"):
        hardware.conversations_that_fit(80, 0.9, 10.0, 327680, 4096.5)
    with pytest.raises(ValueError, match="whole number"):
        hardware.conversations_that_fit(80, 0.9, 10.0, 327680, True)
    assert hardware.conversations_that_fit(80, 0.9, 10.0, 327680, np.int64(4096)) == 46


def test_group_quant_linear_names_the_groups_it_needs():
    codes = torch.zeros(4, 64, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"scale has shape \(4, 3\).*need .*\(4, 2\) \(64 / 32 = "
                                         r"2 groups\)"):
        cal.GroupQuantLinear(codes, torch.ones(4, 3), None, 4, 32)
    with pytest.raises(ValueError, match=r"zero has shape \(4, 1\)"):
        cal.GroupQuantLinear(codes, torch.ones(4, 2), torch.zeros(4, 1, dtype=torch.int32), 4, 32)
    with pytest.raises(ValueError, match="group_size must be a whole number that divides the 64"):
        cal.GroupQuantLinear(codes, torch.ones(4, 2), None, 4, 48)
    assert cal.GroupQuantLinear(codes, torch.ones(4, 2), None, 4, 32).weight.shape == (4, 64)


def test_format_table_of_nothing():
    with pytest.raises(ValueError, match="non-empty list of rows, each a dict as "
                                         r"load_table\(...\)\['rows'\]"):
        table.format_table([])
    assert hardware.format_table([], ["a", "bb"]).splitlines() == ["a  bb", "-  --"]
    with pytest.raises(ValueError, match="headers a non-empty list of column names"):
        hardware.format_table([], [])


def test_kv_calibrate_on_one_token():
    model = load_pretrained()
    with pytest.raises(ValueError, match="at least 2 token ids"):
        kv.calibrate(model, torch.tensor([5]))
    with pytest.raises(ValueError, match=r"got shape \(1, 1\); a \(1, T\) batch: pass ids\[0\]"):
        kv.calibrate(model, torch.tensor([[5]]))


def test_loaded_weights_accepts_a_format_name_or_says_so():
    assert guide.loaded_weights_gib(8e9, "fp8") == guide.loaded_weights_gib(8e9, 8)
    assert guide.loaded_weights_gib(8e9, "int4_g128") == guide.loaded_weights_gib(8e9, 4.125)
    with pytest.raises(ValueError, match="or a format name course_lib.hardware knows; 'fp7' is "
                                         "neither"):
        guide.loaded_weights_gib(8e9, "fp7")


def test_bench_ratio_wants_three_numbers():
    with pytest.raises(ValueError, match=r"layer shape \(K, N, M\).*got \(4096, 4096\)"):
        guide.bench_ratio({"layers": []}, "w8a16", (4096, 4096))
    with pytest.raises(ValueError, match="layer shape"):
        guide.bench_ratio(None, "w8a16", (4096, 4096))
    assert guide.bench_ratio(None, "w8a16", (4096, 4096, 1)) is None


def test_an_empty_generation_is_a_prefix():
    assert validate.first_divergence([], [5, 6, 7]) == 0
    assert validate.first_divergence([5, 6], []) == 0
    assert validate.first_divergence((), ()) == 0
    with pytest.raises(TypeError, match="integer token ids"):
        validate.first_divergence([0.5], [1])


def test_bits_from_logprobs_says_to_wrap_numpy_arrays():
    lp = np.log(np.full((4, 3), 1 / 3))
    tgt = np.array([0, 1, 2, 0])
    with pytest.raises(TypeError, match=r"must be torch tensors.*torch.from_numpy"):
        ceval.bits_from_logprobs(lp, tgt)
    bits = ceval.bits_from_logprobs(torch.from_numpy(lp), torch.from_numpy(tgt))
    assert bits == pytest.approx(np.log2(3))


@pytest.mark.parametrize("text, words", [
    ("{not json", "is not valid JSON"),
    ('{"passed": 5}', "does not hold a progress record"),
    ('{"passed": {"my exercise": {"at": "2026-12-01T10:00:00", "cases": 3}}}',
     "'my exercise' is not an exercise id"),
    ('{"passed": {"02.zero_point": {"at": "yesterday", "cases": 3}}}', "is damaged"),
    ('{"passed": {"02.zero_point": {"at": "2026-12-01T10:00:00", "cases": true}}}', "is damaged"),
])
def test_a_hand_edited_progress_file(tmp_path, text, words):
    p = tmp_path / "progress.json"
    p.write_text(text)
    with pytest.raises(ValueError, match=f"{words}.*progress\\(reset=True\\)"):
        learner_progress.load(p)


def test_an_unwritable_progress_file_says_where_to_put_it(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(learner_progress.tempfile, "mkstemp", refuse)
    with pytest.raises(OSError, match=r"cannot write your progress to .*Permission denied.*"
                                      r"COURSE_PROGRESS_FILE"):
        learner_progress.record_pass("02.zero_point", 3, tmp_path / "p.json")


def test_a_check_that_cannot_save_progress_still_passes(tmp_path, monkeypatch, capsys):
    from course_lib import checks
    monkeypatch.setenv("COURSE_CHECKS", "learner")
    monkeypatch.setenv("COURSE_PROGRESS_FILE", str(tmp_path / "p.json"))
    monkeypatch.setattr(learner_progress.tempfile, "mkstemp",
                        lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "denied")))
    assert checks.check("02.zero_point", quant.zero_point)
    assert "progress not saved: cannot write your progress" in capsys.readouterr().out


def test_load_pretrained_given_a_file_says_so(tmp_path):
    f = tmp_path / "weights.safetensors"
    f.write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="is a file; pass the checkpoint \\*folder\\*"):
        load_pretrained(f)
    with pytest.raises(NotADirectoryError, match="is a file; pass the folder"):
        smollm.load_blocks(f)
    assert os.path.exists(f)
