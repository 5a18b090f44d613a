"""Peak memory and seconds per layer of streamed quantization (course_lib.stream) against the
whole-model path, on a constructed checkpoint of Llama-3.2-1B's shapes (lesson 17).

    python tools/stream_1b.py [--threads 1] [--windows 4] [--window 256] [--keep]

1. Writes a random checkpoint with Llama-3.2-1B's shapes (hidden 2048, 16 layers, ffn 8192,
   32 heads, 8 KV heads, vocab 128256, tied head, llama3 RoPE scaling; config.json as in
   meta-llama/Llama-3.2-1B) to /tmp/stream_1b/llama-1b-shapes as bf16 safetensors shards with
   an index (about 2.5 GB; never committed), one shard at a time.
2. Runs each measurement in its own Python process, so ``ru_maxrss`` (the peak resident set of
   that process) is that path's alone: streamed RTN and GPTQ (course_lib.stream.quantize,
   writing the checkpoint as it goes) and the whole-model path (own_model.load in fp32, then
   calibration.rtn_model or gptq.gptq_model, then export.export_compressed).
3. Writes results/stream_1b.json: every figure, the machine and its load average before and
   after each process (other jobs share the CPUs: the seconds carry that noise), and the
   projection to Llama-3-8B's shapes with its assumptions.

Calibration uses random token ids (4 windows of 256 by default): the weights are random, so a
text would mean nothing; memory and time depend on the shapes and the token count only.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = ROOT / "results" / "stream_1b.json"
WORK = Path("/tmp/stream_1b")
CKPT = WORK / "llama-1b-shapes"

#: meta-llama/Llama-3.2-1B's config.json (huggingface.co/meta-llama/Llama-3.2-1B/blob/main/
#: config.json): the shapes and RoPE settings; weights here are random.
LLAMA_32_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "attention_bias": False, "mlp_bias": False, "bos_token_id": 128000,
    "eos_token_id": 128001}
#: meta-llama/Meta-Llama-3-8B's shapes (its config.json): the projection's target.
LLAMA_3_8B = {**LLAMA_32_1B, "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "head_dim": 128, "max_position_embeddings": 8192,
              "tie_word_embeddings": False, "rope_scaling": None}


def build(folder: Path = CKPT) -> Path:
    """Write the random bf16 checkpoint, one shard per decoder layer plus one for the
    embedding and final norm, tensor by tensor (never the model in memory)."""
    import torch
    from safetensors.torch import save_file
    from course_lib import own_model
    if (folder / own_model.INDEX_NAME).exists():
        own_model.open_checkpoint(folder)
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    cfg = own_model.own_config(LLAMA_32_1B)
    L, D, F_, V = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    wm = {}
    name = lambda k: f"model-{k + 1:05d}-of-{L + 1:05d}.safetensors"   # noqa: E731
    for i in range(L):
        sd = {}
        for lin, (o, n) in own_model.linear_shapes(cfg).items():
            part = "self_attn" if lin in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            sd[f"model.layers.{i}.{part}.{lin}.weight"] = rnd(o, n)
        for nm in ("input_layernorm", "post_attention_layernorm"):
            sd[f"model.layers.{i}.{nm}.weight"] = (1 + rnd(D, std=0.1).float()).to(torch.bfloat16)
        save_file(sd, str(folder / name(i)), metadata={"format": "pt"})
        wm.update({k: name(i) for k in sd})
        del sd
    sd = {"model.embed_tokens.weight": rnd(V, D),
          "model.norm.weight": torch.ones(D, dtype=torch.bfloat16)}
    save_file(sd, str(folder / name(L)), metadata={"format": "pt"})
    wm.update({k: name(L) for k in sd})
    (folder / "config.json").write_text(json.dumps(LLAMA_32_1B, indent=2) + "\n")
    (folder / own_model.INDEX_NAME).write_text(json.dumps({"weight_map": wm}, indent=1))
    from tokenizers import Tokenizer, models, pre_tokenizers   # a stand-in tokenizer.json
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(1000)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    own_model.open_checkpoint(folder)
    return folder


# ----------------------------------------------------------------------------- one measurement
def child(mode: str, threads: int, windows: int, window: int) -> dict:
    """One measurement in this process: ``stream-rtn``, ``stream-gptq``, ``whole-rtn``,
    ``whole-gptq``. Returns the figures (printed as the last line of JSON)."""
    import torch
    torch.set_num_threads(threads)
    import psutil
    from course_lib import export, own_model, stream
    from course_lib.methods import calibration as cal, gptq
    proc = psutil.Process()
    rss_start = proc.memory_info().rss
    path, method = mode.split("-")
    ck = own_model.open_checkpoint(CKPT)
    ids = torch.randint(0, 1000, (windows, window), generator=torch.Generator().manual_seed(0))
    out = WORK / f"out-{mode}"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    r = {"mode": mode, "method": method, "path": path, "bits": 4, "group_size": 128,
         "act_order": method == "gptq", "threads": threads,
         "calibration": None if method == "rtn" else [windows, window],
         "rss_after_imports_gb": round(rss_start / 1e9, 3)}
    if path == "stream":
        rep = stream.quantize(ck, out, method, 4, 128, ids=ids, progress=False)
        r.update(seconds_per_layer=[round(s, 2) for s in rep.seconds_per_layer],
                 seconds_inputs=round(rep.seconds_inputs, 2),
                 peak_rss_per_layer_gb=[round(b / 1e9, 3) for b in rep.peak_rss_per_layer],
                 bytes_written=rep.bytes_written)
    else:
        m = own_model.load(ck)                                   # fp32, every layer
        t_load = time.perf_counter() - t0
        t1 = time.perf_counter()
        if method == "rtn":
            qm = cal.rtn_model(m, 4, 128, scale_dtype=torch.bfloat16)
        else:
            qm, _ = gptq.gptq_model(m, ids, 4, 128, act_order=True,
                                    scale_dtype=torch.bfloat16)
        t_method = time.perf_counter() - t1
        del m
        t2 = time.perf_counter()
        export.export_compressed(qm, out, tokenizer_json=CKPT / "tokenizer.json")
        L = ck.config.num_hidden_layers
        r.update(seconds_load=round(t_load, 2), seconds_method=round(t_method, 2),
                 seconds_export=round(time.perf_counter() - t2, 2),
                 seconds_per_layer_mean=round(t_method / L, 2),
                 bytes_written=sum(p.stat().st_size for p in out.glob("*.safetensors")))
    r["seconds_total"] = round(time.perf_counter() - t0, 2)
    if "seconds_per_layer" in r:
        s = r["seconds_per_layer"]
        r["seconds_per_layer_mean"] = round(sum(s) / len(s), 2)
    r["peak_rss_gb"] = round(stream.peak_rss_bytes() / 1e9, 3)
    shutil.rmtree(out, ignore_errors=True)
    return r


def run_child(mode: str, a) -> dict:
    load_before = [round(x, 2) for x in os.getloadavg()]
    cmd = [sys.executable, __file__, "--child", mode, "--threads", str(a.threads),
           "--windows", str(a.windows), "--window", str(a.window)]
    print(f"running {mode} ...", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode:
        return {"mode": mode, "error": (p.stderr or p.stdout)[-2000:],
                "returncode": p.returncode, "load_average_before": load_before}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["load_average_before"] = load_before
    r["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(r), flush=True)
    return r


# ----------------------------------------------------------------------------- projection
def projection(results: dict, windows: int, window: int) -> dict:
    """Peak memory and time at Llama-3-8B's shapes from the measured 1B figures."""
    from course_lib import own_model
    c1, c8 = own_model.own_config(LLAMA_32_1B), own_model.own_config(LLAMA_3_8B)
    p1, p8 = own_model.count_parameters(c1), own_model.count_parameters(c8)
    out = {"target": "Llama-3-8B shapes (hidden 4096, 32 layers, ffn 14336, 32 heads, 8 KV "
                     "heads, vocab 128256, untied head)",
           "parameters_8b": p8["total"], "parameters_1b": p1["total"],
           "linear_parameters_per_layer": {"1b": p1["linear_per_layer"],
                                           "8b": p8["linear_per_layer"]}}
    ratio_lin = p8["linear_per_layer"] / p1["linear_per_layer"]
    for method in ("rtn", "gptq"):
        s = results.get(f"stream-{method}", {})
        if "peak_rss_gb" not in s:
            continue
        n, T = (windows, window) if method == "gptq" else (1, 1)
        model1 = sum(own_model.method_memory(c1, method, "layer", n, T).values()) / 1e9
        model8 = sum(own_model.method_memory(c8, method, "layer", n, T).values()) / 1e9
        base = s["rss_after_imports_gb"]
        # the measured peak above the interpreter's own, against the bill's estimate of it
        fitted = (s["peak_rss_gb"] - base) / model1
        prof = s.get("peak_rss_per_layer_gb")
        where = None
        if prof:
            k = prof.index(max(prof))
            where = f"after layer {k}" if k < len(prof) - 1 else \
                "while the tensors outside the layers were written"
        out[f"stream-{method}"] = {
            "peak_reached": where,
            "bill_layer_estimate_gb": {"1b": round(model1, 3), "8b": round(model8, 3)},
            "measured_over_bill_1b": round(fitted, 3),
            "projected_peak_rss_gb": round(base + fitted * model8, 2),
            "projected_seconds_per_layer": round(s["seconds_per_layer_mean"] * ratio_lin, 1),
            "projected_seconds_total": round(s["seconds_per_layer_mean"] * ratio_lin
                                             * c8.num_hidden_layers, 0)}
        w = results.get(f"whole-{method}", {})
        if "peak_rss_gb" in w:
            model1w = sum(own_model.method_memory(c1, method, "whole", n, T).values()) / 1e9
            model8w = sum(own_model.method_memory(c8, method, "whole", n, T).values()) / 1e9
            f = (w["peak_rss_gb"] - w["rss_after_imports_gb"]) / model1w
            out[f"whole-{method}"] = {
                "bill_whole_estimate_gb": {"1b": round(model1w, 3), "8b": round(model8w, 3)},
                "measured_over_bill_1b": round(f, 3),
                "projected_peak_rss_gb": round(w["rss_after_imports_gb"] + f * model8w, 1)}
    out["why_the_whole_path_exceeds_its_bill"] = (
        "own_model.method_memory's 'whole' counts the fp32 model once; the path measured holds "
        "it twice (rtn_model and quantize_blockwise quantize a copy.deepcopy of the model) and "
        "export_compressed then builds a bf16 state dict beside them: hence about 2.4x")
    out["assumptions"] = [
        "peak memory = the interpreter's resident set after imports (measured) + the bill's "
        "estimate for the path (own_model.method_memory at 8B's shapes, the same calibration "
        "tokens) times the ratio measured/estimated at 1B; that ratio carries what the bill "
        "leaves out (the bf16 copy read from the file, allocator slack, the packed output of a "
        "layer) and assumes it scales with the estimate",
        "seconds per layer scale with the Linear parameters of one layer (8B / 1B = "
        f"{ratio_lin:.2f}): true of RTN and of GPTQ's column loop and Hessians; GPTQ's Cholesky "
        "factorizations grow with in_features cubed (ffn 14336 vs 8192: 5.4x for down_proj), "
        "so GPTQ's projection is a lower bound",
        "the same machine, threads and load; 32 layers instead of 16. The streamed peak "
        "grows slowly over the layers (ru_maxrss after each layer, peak_rss_per_layer_gb: "
        "allocator slack from the temporaries of one layer's quantization and packing), so "
        "twice the layers may add a little more than the 1B run shows",
        "the untied 8B head (128256 x 4096, 1.05 GB in bf16) is written once at the end and "
        "does not change the per-layer peak; the embedding (the same size) is read once, in "
        "its stored bf16, for the calibration inputs"]
    return out


def main(argv=None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--modes", default="stream-rtn,stream-gptq,whole-rtn,whole-gptq")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--keep", action="store_true", help="keep the checkpoint in /tmp")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--reproject", action="store_true",
                   help="recompute only the projection of the existing --out")
    p.add_argument("--merge", action="store_true",
                   help="rerun only --modes and replace their entries in the existing --out")
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.threads, a.windows, a.window)))
        return None
    if a.reproject:
        doc = json.loads(Path(a.out).read_text())
        cal_ = doc["results"]["stream-gptq"]["calibration"]
        doc["projection_8b"] = projection(doc["results"], *cal_)
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
        return doc
    from course_lib import device
    t0 = time.perf_counter()
    build()
    build_s = time.perf_counter() - t0
    import psutil
    results, free, old = {}, {}, None
    if a.merge:
        old = json.loads(Path(a.out).read_text())
        results, free = old["results"], old["available_memory_before_gb"]
    for mode in a.modes.split(","):
        free[mode] = round(psutil.virtual_memory().available / 1e9, 2)
        results[mode] = run_child(mode, a)
        results[mode]["date"] = time.strftime("%Y-%m-%d %H:%M")
    doc = {
        "what": "Streamed quantization (course_lib.stream.quantize: one decoder layer in "
                "memory, each written as it finishes) against the whole-model path "
                "(own_model.load in fp32 + the method + export.export_compressed), W4 g128 "
                "symmetric, bf16 scales, on a random checkpoint with Llama-3.2-1B's shapes",
        "command": (old["command"] + "; then " if old else "") +
                   "python tools/stream_1b.py " + " ".join(argv or sys.argv[1:]),
        "checkpoint": {"shapes": "Llama-3.2-1B (config.json of meta-llama/Llama-3.2-1B)",
                       "weights": "random N(0, 0.02) in bf16, norms 1 + N(0, 0.1)",
                       "stored_bytes": sum(f.stat().st_size for f in CKPT.glob("*.safetensors")),
                       "seconds_to_write": round(build_s, 1) if not old else
                       old["checkpoint"]["seconds_to_write"]},
        "calibration": f"{a.windows} windows x {a.window} random token ids (memory and time "
                       f"depend on the shapes and the token count, not on the text)",
        "peak_rss": "ru_maxrss of each measurement's own process (getrusage, Linux: KB): the "
                    "largest resident set it reached, imports included",
        "results": results,
        "available_memory_before_gb": free,
        "projection_8b": projection(results, a.windows, a.window),
        "machine": device.machine_record(),
        "note": "the machine's 2 CPU cores are shared with other jobs (load average before and "
                "after each process is recorded with it): seconds are upper bounds of what an "
                "idle machine gives; memory figures do not depend on the load",
        "date": time.strftime("%Y-%m-%d"),
    }
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"written to {a.out}")
    if not a.keep:
        shutil.rmtree(CKPT, ignore_errors=True)
    return doc


if __name__ == "__main__":
    main()
