"""course_lib.export: compressed-tensors pack-quantized checkpoints, loaded back by transformers."""
import json

import pytest
import torch

from course_lib import device, export
from course_lib.methods import calibration as cal
from course_lib.methods import gptq
from course_lib.model import load_pretrained

device.ensure_triton_mode()   # transformers may import triton: interpreter mode first on a CPU
import transformers  # noqa: E402  (test dependencies of the course: fail, never skip)
import compressed_tensors  # noqa: E402,F401


@pytest.fixture(scope="module")
def model():
    return load_pretrained()


def test_pack_int32_matches_the_documented_layout():
    codes = torch.arange(16).view(2, 8)                                     # 0..15
    packed = export.pack_int32(codes, 4)
    assert packed.shape == (2, 1) and packed.dtype == torch.int32
    assert int(packed[0, 0]) == sum(j << (4 * j) for j in range(8))          # first lowest
    assert int(packed[1, 0]) == sum((8 + j) << (4 * j) for j in range(8)) - 2 ** 32
    rows = export.pack_int32(torch.arange(16).view(8, 2) % 16, 4, dim=0)    # along the rows
    assert rows.shape == (1, 2)


def test_pack_int32_agrees_with_compressed_tensors():
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    q = torch.randint(-8, 8, (16, 64), generator=torch.Generator().manual_seed(0)).to(torch.int8)
    assert torch.equal(export.pack_int32(q.long() + 8, 4), pack_to_int32(q, 4))
    assert torch.equal(export.pack_int32(q.long() + 8, 4, dim=0), pack_to_int32(q, 4, 0))


def test_byte_tokenizer_ids_are_the_bytes(tmp_path):
    from tokenizers import Tokenizer
    (tmp_path / "tokenizer.json").write_text(json.dumps(export.byte_tokenizer_json()))
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "def f(x):\n    return 'é' * 2\t"
    ids = tok.encode(text).ids
    assert ids == list(text.encode("utf-8"))
    assert tok.get_vocab_size() == 256 and tok.decode(ids) == text


@pytest.mark.parametrize("symmetric", [True, False])
def test_transformers_loads_the_export_and_matches_the_course_model(model, tmp_path, symmetric):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    ids = cal.calibration_ids("bundled", 8, 128)
    qm, _ = gptq.gptq_model(model, ids, 4, 32, symmetric=symmetric,
                            scale_dtype=torch.bfloat16)
    folder = export.export_compressed(qm, tmp_path / "ckpt")
    cfg = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert cfg["format"] == "pack-quantized" and cfg["ignore"] == ["lm_head"]
    assert cfg["config_groups"]["group_0"]["weights"]["symmetric"] is symmetric
    kwargs = {}
    if not symmetric:   # compressed-tensors 0.20.1 loads asymmetric checkpoints only this way
        from transformers import CompressedTensorsConfig
        kwargs["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    text = "import os\n\ndef walk(path):\n    for name in os.listdir(path):\n"
    x = torch.tensor([tok.encode(text)])
    assert x[0].tolist() == list(text.encode())
    # the course's model with the same codes and the checkpoint's (bf16) head and embeddings
    course = qm
    for name, p in course.named_parameters():
        if "layers" not in name or "norm" in name:
            p.data = p.data.to(torch.bfloat16).float()
    for block in course.model.layers:
        for n in ("input_layernorm", "post_attention_layernorm"):
            w = getattr(block, n).weight
            w.data = w.data.to(torch.bfloat16).float()
        if not symmetric:   # dequantize=True computes (q - zp) * scale in the scale's dtype
            for m in block.modules():
                if isinstance(m, cal.GroupQuantLinear):
                    m.weight.data = m.weight.data.to(torch.bfloat16).float()
    with torch.no_grad():
        ours, theirs = course(x), hf(x).logits
    assert (ours - theirs).abs().max() < 1e-3, float((ours - theirs).abs().max())
    # chaotic (argmax; the codes come from GPTQ): closest top-2 gap 0.0016..0.0126 against
    # logits <= 1.2e-5 apart on AVX-512, avx2 with 1 thread and default/SSE4_2
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_export_refuses_what_the_format_cannot_hold(model, tmp_path):
    with pytest.raises(ValueError, match="no GroupQuantLinear"):
        export.export_compressed(model, tmp_path / "a")
    with pytest.raises(ValueError, match="4- or 8-bit"):
        export.export_compressed(cal.rtn_model(model, 3, 32, scale_dtype=torch.bfloat16),
                                 tmp_path / "b")
    with pytest.raises(ValueError, match="not quantized"):
        export.export_compressed(cal.rtn_model(model, 4, 32, scale_dtype=torch.bfloat16,
                                               n_blocks=2), tmp_path / "c")
    with pytest.raises(ValueError, match="representable"):
        export.export_compressed(cal.rtn_model(model, 4, 32), tmp_path / "d")
    with pytest.raises(ValueError, match="0..15"):
        export.pack_int32(torch.tensor([[16, 0]]), 4)
    with pytest.raises(ValueError, match="Q4_1 grid.*export_gguf"):     # a float minimum per block
        export.export_compressed(cal.rtn_model(model, 4, 32, grid="q4_1"), tmp_path / "e")
    assert not (tmp_path / "e").exists()


def test_export_helpers_refuse_bad_arguments(tmp_path):
    codes = torch.zeros(2, 8, dtype=torch.int64)
    for bad, message in [((codes, 3), "4- or 8-bit codes"), ((codes, True), "4- or 8-bit codes"),
                         ((codes.float(), 4), "2-D integer tensor"),
                         ((codes[0], 4), "2-D integer tensor"),
                         ((codes.numpy(), 4), "2-D integer tensor"),
                         ((codes[:, :0], 4), "non-empty")]:
        with pytest.raises(ValueError, match=message):
            export.pack_int32(*bad)
    with pytest.raises(ValueError, match="dim is the axis to pack along, 0 or 1"):
        export.pack_int32(codes, 4, dim=2)
    for bits, gs, sym, error, message in [(5, 128, True, ValueError, r"bits must be one of \(4, 8\)"),
                                          (4, 0, True, ValueError, "group_size must be a whole number"),
                                          (4, 64.0, True, ValueError, "group_size must be a whole number"),
                                          (4, 64, "yes", TypeError, "symmetric must be True or False")]:
        with pytest.raises(error, match=message):
            export.quantization_config(bits, gs, sym)
    afile = tmp_path / "model.safetensors"
    afile.write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="vLLM serves the exported"):
        export.vllm_command(afile)
    with pytest.raises(TypeError, match="folder must be the exported checkpoint's folder"):
        export.vllm_command(5)
    assert export.vllm_command(tmp_path) == f"vllm serve {tmp_path} --dtype bfloat16 --max-model-len 256"
    with pytest.raises(NotADirectoryError, match="writes a checkpoint"):
        export.export_compressed(torch.nn.Linear(2, 2), afile)
    with pytest.raises(TypeError, match="floating-point torch dtype"):
        export.export_compressed(torch.nn.Linear(2, 2), tmp_path / "x", dtype=torch.int8)
    with pytest.raises(FileNotFoundError, match="tokenizer_json .* is not a file"):
        export.export_compressed(torch.nn.Linear(2, 2), tmp_path / "x", tokenizer_json=tmp_path / "no")


def test_export_replaces_an_older_sharded_checkpoint(model, tmp_path):
    """Issue 19: no stale shards or index beside the new files; other files are left alone."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    stale = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
             "model.safetensors.index.json", "generation_config.json"]
    for name in stale:
        (folder / name).write_text("old")
    (folder / "NOTES.md").write_text("mine")
    qm = cal.rtn_model(model, 4, 32, scale_dtype=torch.bfloat16)
    with pytest.raises(FileExistsError, match="already holds a checkpoint.*overwrite=True"):
        export.export_compressed(qm, folder)                  # never replaced without the flag
    assert sorted(p.name for p in folder.iterdir()) == sorted(stale + ["NOTES.md"])
    export.export_compressed(qm, folder, overwrite=True)
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["NOTES.md", "config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"]
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]


def test_a_refused_export_leaves_nothing_behind(model, tmp_path):
    fp32 = cal.rtn_model(model, 4, 32)                        # fp32 scales: refused for bf16
    with pytest.raises(ValueError, match="scale_dtype"):
        export.export_compressed(fp32, tmp_path / "new")
    assert list(tmp_path.iterdir()) == []
    old = tmp_path / "old"
    old.mkdir()
    (old / "model.safetensors").write_text("old")
    with pytest.raises(ValueError, match="scale_dtype"):
        export.export_compressed(fp32, old, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["old"]
    assert (old / "model.safetensors").read_text() == "old"
