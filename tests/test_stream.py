"""course_lib.stream and the command course_lib.quantize_own: a learner's checkpoint quantized one
decoder layer at a time (lesson 17).

The checkpoints are test_own_model's constructed ones (random weights from transformers' config
classes, nothing downloaded), saved in bf16 as releases are, so the course's fp32 model of the
file holds exactly the stored values. Streamed and whole-model quantization must then agree
EXACTLY (tolerance 0): they call the same block functions on the same tensors in the same
order with the same batch sizes; only where the other layers live differs.
"""
import errno
import gc
import json
import weakref

import pytest
import torch

from course_lib import device, eval as ceval, export, own_model as O, protocol, quantize_own, \
    stream
from course_lib.methods import awq, calibration as cal, gptq

device.ensure_triton_mode()   # transformers may import triton: interpreter mode first on a CPU
transformers = pytest.importorskip("transformers")
from test_own_model import BASE, CASES, build  # noqa: E402  (the same constructed checkpoints)

torch.set_num_threads(1)
V = BASE["vocab_size"]
GROUP = 32                     # divides every Linear's inputs in every case (64, 96, 128)


def tokenizer_json(path, n=V):
    """A word-level tokenizer: word ``t<i>`` is id i, anything else id 0."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(n)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))


def make(folder, case, **kw):
    """A bf16 checkpoint of ``case`` with a tokenizer.json; returns the folder."""
    hf = build(folder / "fp32", case)
    hf.to(torch.bfloat16).save_pretrained(folder / "src", **kw)
    tokenizer_json(folder / "src" / "tokenizer.json")
    return folder / "src"


def words(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return " ".join(f"t{int(i)}" for i in torch.randint(1, V, (n,), generator=g))


IDS = torch.randint(0, V, (4, 24), generator=torch.Generator().manual_seed(0))


def whole(src, method, bits=4, **kw):
    """The whole-model path: own_model.load, then the course's method on all of it."""
    m = O.load(src)
    if method == "rtn":
        return cal.rtn_model(m, bits, GROUP, scale_dtype=torch.bfloat16)
    if method == "gptq":
        return gptq.gptq_model(m, IDS, bits, GROUP, act_order=True,
                               scale_dtype=torch.bfloat16, **kw)[0]
    return awq.awq_model(m, IDS, bits, GROUP, scale_dtype=torch.bfloat16, **kw)[0]


def tensors(folder):
    from safetensors.torch import load_file
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


# ----------------------------------------------------------------------------- the same codes
@pytest.mark.parametrize("case", ["llama3", "tinyllama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("method", ["rtn", "gptq", "awq"])
def test_streamed_methods_write_what_the_whole_model_path_exports(tmp_path, case, method):
    src = make(tmp_path, case)
    rep = stream.quantize(src, tmp_path / "out", method, 4, GROUP, ids=IDS, progress=False)
    ref = export.export_compressed(whole(src, method), tmp_path / "whole",
                                   tokenizer_json=src / "tokenizer.json")
    a, b = tensors(rep.folder), tensors(ref)
    assert set(a) == set(b)
    diff = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
    assert not diff, f"{case} {method}: {len(diff)} tensors differ, e.g. {diff[:3]}"
    # one shard per layer and one per tensor outside the layers, as the index says
    index = json.loads((rep.folder / O.INDEX_NAME).read_text())["weight_map"]
    outer = 2 if CASES[case][2].get("tie_word_embeddings") else 3   # embedding, norm, head
    assert len(set(index.values())) == O.own_config(src).num_hidden_layers + outer
    assert set(index) == set(a)
    assert len(rep.seconds_per_layer) == 2 and len(rep.peak_rss_per_layer) == 3
    assert rep.peak_rss_bytes >= max(rep.peak_rss_per_layer) > 0
    assert f"{method.upper()}" in rep.table() and str(rep.folder) in str(rep)
    assert not list(tmp_path.glob(".out.partial-*"))


def test_eight_bits_and_the_llm_compressor_grid(tmp_path):
    src = make(tmp_path, "qwen2")
    rep = stream.quantize(src, tmp_path / "o", "gptq", 8, GROUP, ids=IDS, progress=False,
                          grid="llm-compressor", damp=0.05)
    m = gptq.gptq_model(O.load(src), IDS, 8, GROUP, act_order=True, damp=0.05,
                        scale_dtype=torch.bfloat16, grid="llm-compressor")[0]
    ref = export.export_compressed(m, tmp_path / "w", tokenizer_json=src / "tokenizer.json")
    a, b = tensors(rep.folder), tensors(ref)
    assert all(torch.equal(a[k], b[k]) for k in b)
    cfg = json.loads((rep.folder / "config.json").read_text())["quantization_config"]
    assert cfg["config_groups"]["group_0"]["weights"]["num_bits"] == 8


def test_unpack_inverts_pack():
    u = torch.randint(0, 16, (6, 40), generator=torch.Generator().manual_seed(1))
    assert torch.equal(stream.unpack_int32(export.pack_int32(u, 4), 4, n=40), u)
    u8 = torch.randint(0, 256, (8, 12), generator=torch.Generator().manual_seed(2))
    assert torch.equal(stream.unpack_int32(export.pack_int32(u8, 8, dim=0), 8, dim=0, n=8), u8)


# ----------------------------------------------------------------------------- one layer at a time
def test_one_layer_is_read_and_held_at_a_time(tmp_path, monkeypatch):
    """The tensors are read in order: the embedding, layer 0's, layer 1's ..., the rest; when
    layer i is read, layer i - 1's block is gone (garbage-collected) and its shard written."""
    import safetensors
    src = make(tmp_path, "tinyllama", max_shard_size="20KB")
    ck = O.open_checkpoint(src)
    out = tmp_path / "out"
    real_open, real_load = safetensors.safe_open, O.load_layer
    reads, alive = [], []

    class Spy:
        def __init__(self, path, framework="pt", device="cpu"):
            self.h = real_open(path, framework=framework, device=device)

        def __enter__(self):
            self.h.__enter__()
            return self

        def __exit__(self, *a):
            return self.h.__exit__(*a)

        def keys(self):
            return self.h.keys()

        def get_tensor(self, name):
            reads.append(name)
            return self.h.get_tensor(name)

    def load_layer(source, i, dtype=torch.float32):
        gc.collect()
        assert all(r() is None for r in alive), f"a block is still held when layer {i} is read"
        staged = list(tmp_path.glob(".out.partial-*/model-*.safetensors"))
        assert len(staged) == i, f"layer {i} read with {len(staged)} shards written"
        block = real_load(source, i, dtype)
        alive.append(weakref.ref(block))
        return block

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    monkeypatch.setattr(O, "load_layer", load_layer)
    stream.quantize(ck, out, "gptq", 4, GROUP, ids=IDS, progress=False)
    layer = [int(k.split(".")[2]) if k.startswith("model.layers.") else None for k in reads]
    assert reads[0] == "model.embed_tokens.weight"
    inner = layer[1:layer.index(None, 1)]
    assert inner == sorted(inner) and set(inner) == {0, 1}
    assert all(x is None for x in layer[layer.index(None, 1):])


# ----------------------------------------------------------------------------- loaded elsewhere
@pytest.mark.parametrize("case", ["llama3", "qwen2", "qwen3"])
def test_transformers_loads_the_folder_with_the_course_models_logits(tmp_path, case):
    from transformers import AutoModelForCausalLM
    src = make(tmp_path, case)
    rep = stream.quantize(src, tmp_path / "out", "gptq", 4, GROUP, ids=IDS, progress=False)
    hf = AutoModelForCausalLM.from_pretrained(rep.folder, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    course = whole(src, "gptq")
    x = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        d = (hf(x).logits - course(x)).abs().max().item()
    print(f"{case}: max |logit difference| transformers vs the course = {d:.2e}")
    assert d < 1e-4, d      # fp32 on both sides, exact weights: only summation order differs


def test_evaluate_agrees_with_a_whole_model_computation(tmp_path):
    src = make(tmp_path, "qwen3")
    rep = stream.quantize(src, tmp_path / "out", "gptq", 4, GROUP, ids=IDS, progress=False)
    ids = stream.eval_ids(src, words(400, seed=3), n_windows=3, window=20)
    got = stream.evaluate(src, rep.folder, ids, progress=False)
    # the whole models, scored as smollm.reference scores SmolLM2 (window - 1 predictions each)
    flat = ids.reshape(-1)
    ref = ceval.reference(O.load(src), flat, window=19, stride=20)
    q = whole(src, "gptq")
    lp = ceval.logprobs(q, flat, 19, stride=20)
    w = protocol.window_scores(ref, lp)
    for mine, theirs in (("kl_nats", "kl_nats"), ("top1_agreement", "top1_agreement"),
                         ("nll_quantized", "nll_nats")):
        assert got["windows"][mine] == pytest.approx(w[theirs], rel=1e-4, abs=1e-7), mine
    assert got["perplexity"]["reference"] == pytest.approx(ref.perplexity, rel=1e-5)
    assert got["perplexity"]["quantized"] == pytest.approx(
        ceval.perplexity_from_logprobs(lp, ref.targets), rel=1e-5)
    # export_compressed's single-file folder of the same model reads the same
    folder = export.export_compressed(q, tmp_path / "whole", tokenizer_json=src / "tokenizer.json")
    assert stream.evaluate(src, folder, ids, progress=False)["windows"] == got["windows"]
    asym = gptq.gptq_model(O.load(src), IDS, 4, GROUP, symmetric=False,
                           scale_dtype=torch.bfloat16)[0]
    export.export_compressed(asym, tmp_path / "asym", tokenizer_json=src / "tokenizer.json")
    with pytest.raises(ValueError, match="symmetric int4/int8"):
        stream.evaluate(src, tmp_path / "asym", ids, progress=False)
    # the reference scored against itself: KL 0, full agreement
    same = stream.evaluate(src, src, ids, progress=False)
    assert same["kl_nats"] == pytest.approx(0, abs=1e-7) and same["top1_agreement"] == 1.0


# ----------------------------------------------------------------------------- text and windows
def test_calibration_and_evaluation_windows(tmp_path):
    src = make(tmp_path, "smollm")
    text = words(300)
    a = stream.calibration_ids(src, text, n_windows=4, window=32, seed=1)
    assert a.shape == (4, 32) and a.dtype == torch.int64 and int(a.min()) >= 1
    f = tmp_path / "mine.txt"
    f.write_text(text)
    assert torch.equal(stream.calibration_ids(src, f, 4, 32, seed=1), a)
    assert torch.equal(stream.calibration_ids(src, str(f), 4, 32, seed=1), a)
    e = stream.eval_ids(src, text, n_windows=2, window=16)
    toks = O.load_tokenizer(src).encode(text)
    assert e.reshape(-1).tolist() == toks[:32]          # the first windows, in order
    # the course's texts (English: the word-level tokenizer maps it to id 0, which is enough
    # to check which part is read)
    from course_lib import data
    cal_text, eval_text = data.clean_split()
    n_cal = len(O.load_tokenizer(src).encode(cal_text))
    with pytest.raises(ValueError, match=f"course's calibration text.*{n_cal:,} tokens"):
        stream.calibration_ids(src, None, n_windows=10_000, window=64)
    x, cos, sin = stream.capture_inputs(src, a)
    m = O.load(src)
    assert torch.equal(x, m.model.embed_tokens(a)) and torch.equal(cos, m.rope(0, 32)[0])


def test_short_text_is_refused_with_the_counts(tmp_path):
    src = make(tmp_path, "smollm")
    with pytest.raises(ValueError, match=r"holds 50 tokens.*8 windows of 16 tokens need 128.*"
                                         r"--windows 3 fit"):
        stream.calibration_ids(src, words(50), n_windows=8, window=16)
    with pytest.raises(ValueError, match=r"--eval-windows 0 fit"):
        stream.eval_ids(src, words(5), n_windows=1, window=16)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        stream.calibration_ids(src, str(tmp_path / "missing.txt"), 1, 16)
    with pytest.raises(ValueError, match="context of 256"):
        stream.calibration_ids(src, words(50), 1, 512)
    with pytest.raises(ValueError, match="empty"):
        stream.calibration_ids(src, "   ", 1, 16)


# ----------------------------------------------------------------------------- refusals
def test_an_existing_output_is_refused_unless_overwrite(tmp_path):
    src = make(tmp_path, "smollm")
    out = tmp_path / "out"
    stream.quantize(src, out, "rtn", 4, GROUP, progress=False)
    first = tensors(out)
    with pytest.raises(FileExistsError, match="already exists.*--overwrite"):
        stream.quantize(src, out, "rtn", 4, GROUP, progress=False)
    stream.quantize(src, out, "rtn", 8, GROUP, progress=False, overwrite=True)
    assert not torch.equal(tensors(out)["model.layers.0.mlp.up_proj.weight_packed"],
                           first["model.layers.0.mlp.up_proj.weight_packed"])
    with pytest.raises(ValueError, match="source checkpoint's folder"):
        stream.quantize(src, src / "q", "rtn", 4, GROUP, progress=False, overwrite=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        stream.quantize(src, tmp_path / "file", "rtn", progress=False, group_size=GROUP)


@pytest.mark.parametrize("existing", [False, True])
def test_a_full_disk_mid_write_leaves_nothing_half_written(tmp_path, monkeypatch, existing):
    src = make(tmp_path, "tinyllama")
    out = tmp_path / "out"
    if existing:
        stream.quantize(src, out, "rtn", 4, GROUP, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()} if existing else None
    real, calls = stream._write_shard, []

    def full(tensors, path):
        calls.append(path)
        if len(calls) == 2:                               # layer 1's shard
            path.write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        real(tensors, path)

    monkeypatch.setattr(stream, "_write_shard", full)
    with pytest.raises(OSError, match="filled up while writing layer 1.*nothing was left") as e:
        stream.quantize(src, out, "gptq", 4, GROUP, ids=IDS, progress=False,
                        overwrite=existing)
    assert e.value.errno == errno.ENOSPC
    assert not list(tmp_path.glob(".out.partial-*"))
    if existing:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before   # untouched
    else:
        assert not out.exists()


def test_too_little_disk_is_refused_before_any_work(tmp_path, monkeypatch):
    import shutil
    src = make(tmp_path, "smollm")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 10))
    with pytest.raises(OSError, match="needs about .* has 0.00 GB free"):
        stream.quantize(src, tmp_path / "out", "rtn", 4, GROUP, progress=False)
    assert not (tmp_path / "out").exists()


def test_bad_arguments_say_what_to_do(tmp_path):
    src = make(tmp_path, "smollm")
    out = tmp_path / "out"
    cases = [
        (dict(method="hqq"), ValueError, "method must be one of"),
        (dict(bits=3), ValueError, "bits must be one of"),
        (dict(group_size=48), ValueError, r"does not divide .* divide every Linear.*\[32\]"),
        (dict(method="gptq", n_grid=5), TypeError, r"gptq takes no \['n_grid'\]"),
        (dict(method="rtn", grid="q4_0"), ValueError, "GGUF"),
        (dict(method="gptq", ids=torch.full((2, 8), V)), ValueError, "another model"),
        (dict(method="gptq", ids=torch.zeros(8, dtype=torch.long)), ValueError, "windows"),
        (dict(dtype=torch.int8), TypeError, "dtype"),
    ]
    for kw, exc, says in cases:
        kw = {"group_size": GROUP, "progress": False, **kw}
        with pytest.raises(exc, match=says):
            stream.quantize(src, out, **kw)
    assert not out.exists()
    with pytest.raises(ValueError, match="different models"):
        other = make(tmp_path / "b", "qwen3")
        stream.evaluate(src, other, IDS, progress=False)


# ----------------------------------------------------------------------------- the command
def test_command_help_names_the_options(capsys):
    with pytest.raises(SystemExit) as e:
        quantize_own.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for s in ("--method", "{rtn,gptq,awq,kmix}", "--bits", "--group-size", "--calib", "--eval",
              "--windows", "--overwrite", "--bpw", "examples:", "exit status"):
        assert s in text, s


def test_command_end_to_end(tmp_path, capsys, monkeypatch):
    src = make(tmp_path, "qwen2")
    (tmp_path / "calib.txt").write_text(words(600, seed=1))
    (tmp_path / "held.txt").write_text(words(200, seed=2))
    args = [str(src), "--method", "gptq", "--group-size", str(GROUP), "--out",
            str(tmp_path / "out"), "--calib", str(tmp_path / "calib.txt"), "--windows", "4",
            "--window", "32", "--eval", str(tmp_path / "held.txt"), "--eval-windows", "2",
            "--eval-window", "32", "--no-progress", "--threads", "1"]
    assert quantize_own.main(args) == 0
    text = capsys.readouterr().out
    for s in ("Qwen2ForCausalLM", "bytes per format", "GPTQ act-order, W4 g32", "perplexity",
              "KL(ref || quantized)", "top-1 agreement", "vllm serve", "peak resident memory"):
        assert s in text, s
    # the same again: refused, with exit status 2 and the reason
    assert quantize_own.main(args) == 2
    assert "already exists" in capsys.readouterr().err
    # a calibration text too short, and a method that does not fit in memory
    (tmp_path / "short.txt").write_text(words(20))
    bad = args[:args.index("--calib") + 1] + [str(tmp_path / "short.txt")] + \
        args[args.index("--calib") + 2:] + ["--overwrite"]
    assert quantize_own.main(bad) == 2
    assert "holds 20 tokens" in capsys.readouterr().err
    monkeypatch.setattr(O, "free_memory_bytes", lambda: 1000)
    assert quantize_own.main(args + ["--overwrite"]) == 1
    assert "does NOT fit" in capsys.readouterr().out


# ----------------------------------------------------------------------------- --gguf
def test_command_writes_a_gguf_file_and_says_how_to_run_it(tmp_path, capsys):
    """--gguf: the folder written again as GGUF (stream_gguf.from_packed, tested in
    tests/test_stream_gguf.py), with the llama.cpp commands beside the vLLM one."""
    from test_stream_gguf import source         # a checkpoint with SmolLM2's tokenizer.json
    src = source(tmp_path, "qwen2")
    gguf = tmp_path / "m.gguf"
    args = [str(src), "--method", "rtn", "--group-size", str(GROUP), "--out",
            str(tmp_path / "out"), "--no-eval", "--gguf", str(gguf), "--no-progress",
            "--threads", "1"]
    assert quantize_own.main(args) == 0
    text = capsys.readouterr().out
    for s in ("vllm serve", f"llama-cli -m {gguf}", f"llama-server -m {gguf}", "Q4_0 x14",
              "GGUF file"):
        assert s in text, s
    assert gguf.is_file() and (tmp_path / "out" / "config.json").is_file()
    with pytest.raises(SystemExit):
        quantize_own.main(["--help"])
    assert "--gguf FILE" in capsys.readouterr().out


def test_command_refuses_gguf_settings_before_any_work(tmp_path, capsys):
    from test_stream_gguf import source
    src = source(tmp_path, "qwen2")
    base = [str(src), "--method", "rtn", "--out", str(tmp_path / "out"), "--no-eval",
            "--no-progress", "--threads", "1"]
    # a group GGUF's 32-weight blocks cannot hold
    assert quantize_own.main(base + ["--group-size", "16", "--gguf", str(tmp_path / "a.gguf")]) \
        == 2
    assert "not a multiple of 32" in capsys.readouterr().err
    # an existing file, without --overwrite
    (tmp_path / "b.gguf").write_bytes(b"old")
    assert quantize_own.main(base + ["--group-size", "32", "--gguf", str(tmp_path / "b.gguf")]) \
        == 2
    assert "exists" in capsys.readouterr().err
    # a tokenizer llama.cpp's GGUF does not carry (a word-level one)
    src2 = make(tmp_path / "w", "qwen2")
    assert quantize_own.main([str(src2), "--method", "rtn", "--group-size", "32", "--out",
                              str(tmp_path / "out2"), "--no-eval", "--gguf",
                              str(tmp_path / "c.gguf")]) == 2
    assert "tokenizer cannot be written" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()
    assert (tmp_path / "b.gguf").read_bytes() == b"old"


def test_command_kmix_writes_a_mix_by_measured_sensitivity(tmp_path, capsys):
    """--method kmix: own_kmix's scan on the calibration text, its plan at a budget, the GGUF
    written by stream_gguf.from_checkpoint, the file's weights scored against the source."""
    from test_stream_gguf import source
    from course_lib import kmix
    src = source(tmp_path, "qwen2")
    (tmp_path / "calib.txt").write_text(words(600, seed=1))
    (tmp_path / "held.txt").write_text(words(200, seed=2))
    gguf = tmp_path / "mix.gguf"
    args = [str(src), "--method", "kmix", "--gguf", str(gguf), "--bpw", "8.47",
            "--calib", str(tmp_path / "calib.txt"), "--windows", "2", "--window", "32",
            "--eval", str(tmp_path / "held.txt"), "--eval-windows", "2", "--eval-window", "32",
            "--no-progress", "--threads", "1"]
    assert quantize_own.main(args) == 0
    text = capsys.readouterr().out
    for s in ("KMIX", "the course's mix", "llama.cpp Q4_K_M", "KL(ref || quantized)",
              f"llama-cli -m {gguf}"):
        assert s in text, s
    rows = kmix.read_mix(gguf)
    types = {r["type"] for r in rows if "blk." in r["name"] and r["name"].endswith(".weight")
             and len(r["shape"]) == 2}
    # a mix: the budget buys some tensors more bits (the tokenizer's 49,152-row embedding
    # takes most of a tiny model's bytes: 8.43 bits per weight with every Linear at its
    # smallest format, 8.50 with every Linear in Q8_0; 8.47 buys some upgrades, not all)
    assert len(types) >= 2
    # llama.cpp's bits per weight: every tensor's bits over every weight, within the budget
    assert 8 * sum(r["bytes"] for r in rows) / sum(r["weights"] for r in rows) <= 8.47
    # kmix writes a GGUF only: --out refused, --gguf required; --bpw belongs to kmix
    assert quantize_own.main(args + ["--out", str(tmp_path / "o")]) == 2
    assert "drop --out" in capsys.readouterr().err
    assert quantize_own.main([a for a in args if a not in ("--gguf", str(gguf))]) == 2
    assert "give --gguf FILE" in capsys.readouterr().err
    assert quantize_own.main([str(src), "--method", "rtn", "--out", str(tmp_path / "o"),
                              "--bpw", "5"]) == 2
    assert "--bpw is the budget of --method kmix" in capsys.readouterr().err
    assert quantize_own.main(args) == 2                        # the file exists
    assert "exists" in capsys.readouterr().err


def test_the_committed_smollm2_run_of_every_method():
    """results/own_model_smollm2.json (tools/own_model_smollm2.py): the command on SmolLM2 with
    each method, its GGUF file run by llama.cpp and its folder loaded by transformers, each
    against the course's own reading of the same weights on a held-out window."""
    import json
    from course_lib.paths import ROOT
    path = ROOT / "results" / "own_model_smollm2.json"
    if not path.exists():
        pytest.skip("results/own_model_smollm2.json is not here")
    d = json.loads(path.read_text())
    rows = {r["method"]: r for r in d["rows"]}
    assert set(rows) == {"rtn", "gptq", "awq", "kmix"} and d["machine"]["cpu"]
    for m, r in rows.items():
        # llama.cpp rounds the activations that meet a quantized weight to 8 bits: measured
        # KL 0.0008-0.0036, top-1 0.957-0.984 against the course on the same weights
        assert r["llama_cpp"]["kl_nats"] < 0.02 and r["llama_cpp"]["top1_agreement"] > 0.9, m
        if m != "kmix":          # transformers computes what the course computes, in fp32
            assert r["transformers"]["max_abs_logit_diff"] < 1e-3, m
            assert r["transformers"]["top1_agreement"] == 1.0, m
        assert "--gguf" in r["command"] and f"--method {m}" in r["command"]
    # calibrated methods beat round-to-nearest on the command's own held-out scoring
    kl = {m: float(r["command_evaluation"][1].split()[3]) for m, r in rows.items()}
    assert kl["gptq"] < 0.5 * kl["rtn"] and kl["awq"] < 0.5 * kl["rtn"]
    assert kl["kmix"] < 1e-4    # SmolLM2's Q4_1 grid again: the mix keeps it, at no cost
    assert rows["kmix"]["gguf_bytes"] < rows["rtn"]["gguf_bytes"]
