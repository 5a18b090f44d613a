"""course_lib.stream_gguf: GGUF written one decoder layer at a time, run in llama.cpp (lesson 17).

The checkpoints are test_own_model_gguf's constructed ones (random weights from transformers'
config classes, SmolLM2's tokenizer.json copied in, so the vocabulary is 49152 rows), saved
in bf16 as releases are. :func:`stream.quantize` writes the command's folder; from_packed
turns it into GGUF; the file's weights, read back with gguf_model's decoders, must equal the
folder's dequantized weights EXACTLY (tolerance 0: the same codes and scales, only the layout
changes), and llama.cpp's logits must match the course's own reading of the folder.

The logit tolerance, and why: llama.cpp multiplies a Q4_0 / Q8_0 weight by activations it has
rounded to Q8_0 blocks (8 bits per value, a scale per 32) and a BF16 head by activations
rounded to bf16 (``vec_dot_type`` Q8_0 and BF16 in ggml/src/ggml-cpu/ggml-cpu.c, lines 240-243
and 395-398, llama-cpp-python 0.3.36), and keeps its KV cache in fp16. On these models (largest |logit| about 0.9)
that measured 0.006-0.012 max |logit difference| across the cases below (about 1.3% of the
largest logit); the bound is 4% of the largest |logit|. A wrong row order, a lost norm or a
swapped scale moves the logits by their own size (the last test shows one).
"""
import errno
import os
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_own_model_gguf import build  # noqa: E402  (constructed checkpoints, SmolLM2 tokenizer)

from course_lib import engine, export, kquants, own_model as O, stream, stream_gguf  # noqa: E402
from course_lib import gguf_model as gm  # noqa: E402

pytest.importorskip("transformers")       # a course dependency: builds the checkpoints
torch.set_num_threads(1)
needs_engine = pytest.mark.skipif(not engine.available() and not os.environ.get(
    "COURSE_REQUIRE_ENGINE"), reason=engine.skip_reason())

GROUP = 32
IDS = torch.randint(0, 128, (4, 24), generator=torch.Generator().manual_seed(0))   # calibration
TOL = 0.04          # of the largest |logit|: measured up to 0.013 (see the module docstring)
#: (case, method, bits): llama with an untied head, qwen2's biases, qwen3's q/k norms, llama3's
#: RoPE factors and tied head; RTN and GPTQ at 4 bits, AWQ (its scales folded into the
#: weights before they are stored) once, GPTQ at 8 bits once.
PACKED = [("tinyllama", "rtn", 4), ("tinyllama", "gptq", 4), ("qwen2", "rtn", 4),
          ("qwen2", "gptq", 4), ("qwen3", "rtn", 4), ("qwen3", "gptq", 4),
          ("llama3", "gptq", 4), ("qwen2", "awq", 4), ("qwen2", "gptq", 8)]


def source(folder: Path, case: str, **over) -> Path:
    """A bf16 checkpoint of ``case`` with SmolLM2's tokenizer.json; returns its folder."""
    hf = build(folder / "fp32", case, **over)
    hf.to(torch.bfloat16).save_pretrained(folder / "src")
    shutil.copy(folder / "fp32" / "tokenizer.json", folder / "src")
    return folder / "src"


def packed_model(folder):
    """The course's own reading of the quantized folder: the whole model, each Linear
    dequantized in fp32 as GroupQuantLinear computes it (stream.load_packed)."""
    return stream.load_packed(folder)


def quiet(f, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # a quantized GGUF warns when opened
        return f(*a, **kw)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """{(case, method, bits, rest): (folder, GGUFReport)}, built lazily."""
    cache = {}

    def get(case, method, bits, rest="stored"):
        key = (case, method, bits, rest)
        if key not in cache:
            d = tmp_path_factory.mktemp(f"{case}_{method}{bits}_{rest}")
            src = source(d, case)
            q = stream.quantize(src, d / "q", method, bits, GROUP, ids=IDS,
                                progress=False).folder
            cache[key] = q, stream_gguf.from_packed(q, d / "q.gguf", rest=rest,
                                                    progress=False)
        return cache[key]
    return get


def _ids(seed=2, n=12):
    return torch.randint(0, 49152, (n,), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- from_packed
@pytest.mark.parametrize("case,method,bits", PACKED)
def test_the_gguf_holds_the_folders_codes_and_scales_exactly(converted, case, method, bits):
    folder, rep = converted(case, method, bits)
    r = stream._reader(folder)
    reader = gm.open_gguf(rep.path)
    arch = export.gguf_architecture_of(r.config)
    assert gm.read_metadata(rep.path)[0][2] == arch
    got = {}
    for t in reader.tensors:
        if t.name == gm.ROPE_FREQS:
            continue
        name, v = gm.decode_tensor(t, arch, r.config)          # q/k rows back in HF order
        got[name] = v
    kind = "q4_0" if bits == 4 else "q8_0"
    for i in range(r.config.num_hidden_layers):
        for k, want in r.layer(i).state_dict().items():
            v = got[f"model.layers.{i}.{k}"]
            if k.endswith("proj.weight"):
                assert isinstance(v, gm.BlockQuantized) and v.kind == kind, k
                v = v.dequantize()
            assert torch.equal(v, want.float()), (case, i, k)
    for k, want in r.outer().items():                          # BF16 in the folder and file
        assert torch.equal(got[k], want.float()), k
    assert rep.types["token_embd.weight"] == "bf16" and rep.rest.endswith("exact")
    assert ("output.weight" in rep.types) == (case == "tinyllama")
    # and own_model reads the file as the same model
    back = quiet(O.layer_state, quiet(O.open_checkpoint, rep.path), 1)
    assert all(torch.equal(back[k], v.float()) for k, v in r.layer(1).state_dict().items())


@needs_engine
@pytest.mark.parametrize("case,method,bits", PACKED)
def test_llama_cpp_runs_the_file_as_the_course_runs_the_folder(converted, case, method, bits):
    folder, rep = converted(case, method, bits)
    ids = _ids()
    theirs = engine.logits(rep.path, ids)
    with torch.no_grad():
        ours = packed_model(folder)(ids[None])[0]
    d, top = (theirs - ours).abs().max().item(), ours.abs().max().item()
    print(f"{case} {method} W{bits}: llama.cpp vs the course's folder, max |logit difference| "
          f"{d:.2e} (largest |logit| {top:.2f})")
    assert d < TOL * top, (case, method, bits, d, top)


def test_llama_rest_is_llama_quantizes_choice(converted):
    """rest="llama": an untied token embedding in the file's type (Q4_0), the head Q8_0 (rows
    of 64 are not a multiple of 256, so not Q6_K); a tied embedding plays the head's part.
    Each is kquants' rounding (llama.cpp's) of the folder's bf16 values."""
    for case, emb, head in (("tinyllama", "q4_0", "q8_0"), ("qwen2", "q8_0", None)):
        folder, rep = converted(case, "rtn", 4, "llama")
        assert rep.types["token_embd.weight"] == emb and rep.types.get("output.weight") == head
        assert "rounded" in rep.rest
        outer = stream._reader(folder).outer()
        reader = gm.open_gguf(rep.path)
        for gname, hname in (("token_embd.weight", "model.embed_tokens.weight"),
                             ("output.weight", "lm_head.weight")):
            if rep.types.get(gname) is None:
                continue
            t = next(t for t in reader.tensors if t.name == gname)
            w = outer[hname].float()
            want = kquants.dequantize(kquants.quantize(w, rep.types[gname]), rep.types[gname],
                                      w.shape[1])
            got = gm.decode_tensor(t, "llama", None, keep_blocks=False)[1].numpy()
            assert np.array_equal(got, want), (case, gname)
    assert stream_gguf._rest_kind("llama", "output.weight", (10, 512), "bf16", 4, False) == "q6_k"
    assert stream_gguf._rest_kind("llama", "output.weight", (10, 512), "bf16", 8, False) == "q8_0"
    assert stream_gguf._rest_kind("stored", "output.weight", (10, 512), "f16", 4, False) == "f16"


@needs_engine
def test_llama_rest_runs_in_llama_cpp(converted):
    folder, rep = converted("tinyllama", "rtn", 4, "llama")
    ids = _ids()
    model = quiet(O.load, quiet(O.open_checkpoint, rep.path))      # the file's own weights
    with torch.no_grad():
        ours = model(ids[None])[0]
    d, top = (engine.logits(rep.path, ids) - ours).abs().max().item(), ours.abs().max().item()
    print(f"rest=llama: llama.cpp vs the course reading the file, {d:.2e} (largest {top:.2f})")
    assert d < TOL * top


def test_the_file_is_written_one_layer_at_a_time(tmp_path, monkeypatch):
    """The folder's tensors are read in file order: the embedding, layer 0's, layer 1's, the
    norm (and head); never two layers in one read."""
    src = source(tmp_path, "tinyllama")
    q = stream.quantize(src, tmp_path / "q", "rtn", 4, GROUP, progress=False).folder
    reads, real = [], stream._read

    def spy(folder, weight_map, names):
        reads.append(sorted({n.split(".")[2] if n.startswith("model.layers.") else n
                             for n in names}))
        return real(folder, weight_map, names)
    monkeypatch.setattr(stream, "_read", spy)
    stream_gguf.from_packed(q, tmp_path / "q.gguf", progress=False)
    assert reads == [["model.embed_tokens.weight"], ["0"], ["1"],
                     ["lm_head.weight", "model.norm.weight"]]


# ----------------------------------------------------------------------------- from_checkpoint
def _mixed_types(cfg, tied: bool) -> dict:
    """A mix of q4_k, q6_k, q8_0 and q4_0 over every 2-D weight, as a sensitivity plan might
    give (all widths here are multiples of 256)."""
    kinds = ("q4_k", "q6_k", "q8_0", "q4_0")
    types, j = {}, 0
    for i in range(cfg.num_hidden_layers):
        for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                  "ffn_down"):
            types[f"blk.{i}.{n}.weight"] = kinds[j % 4]
            j += 1
    types["token_embd.weight"] = "q8_0"
    if not tied:
        types["output.weight"] = "q6_k"
    return types


@pytest.mark.parametrize("case", ["tinyllama", "qwen3"])
def test_from_checkpoint_writes_a_mix_llama_cpp_runs(tmp_path, monkeypatch, case):
    """Rows 256 wide (k-quants need it). The q/k gain stays 1 here: at width 256 the gain of 8
    makes attention so sharp that llama.cpp's 8-bit activations alone move the logits by up to
    9% of the largest (measured, an all-Q8_0 file: 8%, an F16 file: 0.5%); at gain 1 they
    measured 1.0-2.0% for every format and the mix (rounding the course's activations to Q8_0
    on the F16 file moves its logits by the same 1.5%), under the 4% bound. The row order is
    checked exactly by the read-back and, at gain 8, by the folder tests above."""
    import test_own_model_gguf
    monkeypatch.setattr(test_own_model_gguf, "QK_GAIN", 1.0)
    src = source(tmp_path, case, hidden_size=256, intermediate_size=512, head_dim=64)
    ck = O.open_checkpoint(src)
    cfg = ck.config
    types = _mixed_types(cfg, cfg.tie_word_embeddings)
    g = torch.Generator().manual_seed(3)
    imatrix = {"blk.1.ffn_down.weight": torch.rand(512, generator=g).numpy() + 0.1}
    rep = stream_gguf.from_checkpoint(src, tmp_path / "mix.gguf", types, imatrix,
                                      progress=False)
    assert {k: v for k, v in rep.types.items() if k in types} == types
    assert rep.types["blk.0.attn_norm.weight"] == "f32"
    # each weight is kquants' rounding of the checkpoint's values (llama.cpp's bytes)
    reader = gm.open_gguf(rep.path)
    arch = export.gguf_architecture_of(cfg)
    for i in range(cfg.num_hidden_layers):
        state = O.layer_state(ck, i)
        for t in reader.tensors:
            if not t.name.startswith(f"blk.{i}.") or t.name not in types:
                continue
            name, v = gm.decode_tensor(t, arch, cfg, keep_blocks=False)
            w = state[name.split(".", 3)[3]]
            fmt = types[t.name]
            want = kquants.dequantize(kquants.quantize(w, fmt, imatrix.get(t.name)), fmt,
                                      w.shape[1])
            assert np.array_equal(v.numpy(), want), t.name
    if not engine.available() and not os.environ.get("COURSE_REQUIRE_ENGINE"):
        pytest.skip(engine.skip_reason())
    model = quiet(O.load, quiet(O.open_checkpoint, rep.path))    # the same dequantized weights
    ids = _ids(4)
    with torch.no_grad():
        ours = model(ids[None])[0]
    d, top = (engine.logits(rep.path, ids) - ours).abs().max().item(), ours.abs().max().item()
    print(f"{case} mix: llama.cpp vs the course model of the same weights {d:.2e} "
          f"(largest |logit| {top:.2f})")
    assert d < TOL * top


# ----------------------------------------------------------------------------- refusals
def test_bad_input_is_refused_and_leaves_nothing(tmp_path):
    src = source(tmp_path, "tinyllama")
    q = stream.quantize(src, tmp_path / "q", "rtn", 4, GROUP, progress=False).folder
    out = tmp_path / "m.gguf"
    stream_gguf.from_packed(q, out, progress=False)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        stream_gguf.from_packed(q, out, progress=False)
    stream_gguf.from_packed(q, out, overwrite=True, progress=False)
    with pytest.raises(ValueError, match=r"\.gguf"):
        stream_gguf.from_packed(q, tmp_path / "m.bin", progress=False)
    # a type the row width does not allow: refused, not changed
    with pytest.raises(ValueError, match="multiple of 256"):
        stream_gguf.from_checkpoint(src, tmp_path / "k.gguf", {"blk.0.attn_q.weight": "q4_k"})
    with pytest.raises(ValueError, match="no tensor 'blk.9.attn_q.weight'"):
        stream_gguf.from_checkpoint(src, tmp_path / "k.gguf", {"blk.9.attn_q.weight": "q8_0"})
    with pytest.raises(ValueError, match="1-D tensor"):
        stream_gguf.from_checkpoint(src, tmp_path / "k.gguf", {"blk.0.attn_norm.weight": "q8_0"})
    with pytest.raises(ValueError, match="must be one of"):
        stream_gguf.from_checkpoint(src, tmp_path / "k.gguf", {"blk.0.attn_q.weight": "q3"})
    # folders that are not the command's output
    with pytest.raises(ValueError, match="not quantized"):
        stream_gguf.from_packed(src, tmp_path / "k.gguf")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="quantize_own"):
        stream_gguf.from_packed(tmp_path / "empty", tmp_path / "k.gguf")
    # a group GGUF's 32-weight blocks cannot hold, and scales fp16 does not hold exactly
    q16 = stream.quantize(src, tmp_path / "q16", "rtn", 4, 16, progress=False).folder
    with pytest.raises(ValueError, match="not a multiple of 32"):
        stream_gguf.from_packed(q16, tmp_path / "k.gguf")
    q32 = stream.quantize(src, tmp_path / "q32", "rtn", 4, GROUP, progress=False,
                          dtype=torch.float32).folder
    with pytest.raises(ValueError, match="not exact in fp16"):
        stream_gguf.from_packed(q32, tmp_path / "k.gguf", progress=False)
    assert not (tmp_path / "k.gguf").exists() and not list(tmp_path.glob(".*.partial"))


def test_a_full_disk_mid_write_leaves_nothing(tmp_path, monkeypatch):
    src = source(tmp_path, "qwen2")
    q = stream.quantize(src, tmp_path / "q", "rtn", 4, GROUP, progress=False).folder
    from gguf import GGUFWriter
    real, n = GGUFWriter.write_tensor_data, []

    def full(self, tensor, *a, **kw):
        n.append(1)
        if len(n) == 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, tensor, *a, **kw)
    monkeypatch.setattr(GGUFWriter, "write_tensor_data", full)
    with pytest.raises(OSError, match="filled up") as e:
        stream_gguf.from_packed(q, tmp_path / "m.gguf", progress=False)
    assert e.value.errno == errno.ENOSPC
    assert not (tmp_path / "m.gguf").exists() and not list(tmp_path.glob(".*.partial"))


@needs_engine
def test_a_wrong_row_order_would_show(converted, tmp_path, monkeypatch):
    """The logit comparison is not vacuous: the same folder written with llama's q/k rows in
    Hugging Face's order gives llama.cpp logits far outside the tolerance."""
    folder, rep = converted("tinyllama", "rtn", 4)
    monkeypatch.setattr(export, "rope_row_order", lambda name, cfg: None)
    bad = stream_gguf.from_packed(folder, tmp_path / "bad.gguf", progress=False)
    ids = _ids()
    with torch.no_grad():
        ours = packed_model(folder)(ids[None])[0]
    good = (engine.logits(rep.path, ids) - ours).abs().max().item()
    wrong = (engine.logits(bad.path, ids) - ours).abs().max().item()
    print(f"right order {good:.2e}, wrong order {wrong:.2e}")
    assert wrong > 3 * TOL * ours.abs().max().item() and wrong > 10 * good


def test_from_checkpoint_takes_a_gguf_source(converted, tmp_path):
    """A GGUF file as the source (own_model decodes it): its metadata and tokenizer are copied,
    each weight is rounded again from the decoded values (Q8_0 of the folder's Q4_0 weights)."""
    _, rep = converted("qwen2", "rtn", 4)
    ck = quiet(O.open_checkpoint, rep.path)
    types = {n: "q8_0" for n, k in rep.types.items() if k == "q4_0"}
    out = stream_gguf.from_checkpoint(ck, tmp_path / "q8.gguf", types, progress=False)
    meta = {k: v for k, _, v, _ in gm.read_metadata(out.path)}
    src = {k: v for k, _, v, _ in gm.read_metadata(rep.path)}
    assert meta["tokenizer.ggml.tokens"] == src["tokenizer.ggml.tokens"]
    assert meta["general.file_type"] == stream_gguf.FILE_TYPES["q8_0"]
    back = quiet(O.layer_state, quiet(O.open_checkpoint, out.path), 0)
    w = O.layer_state(ck, 0)["mlp.up_proj.weight"]
    assert np.array_equal(back["mlp.up_proj.weight"].numpy(),
                          kquants.dequantize(kquants.quantize(w, "q8_0"), "q8_0", w.shape[1]))
