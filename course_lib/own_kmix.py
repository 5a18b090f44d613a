"""A k-quant mix for your own checkpoint by measured sensitivity, one decoder layer at a time
(lesson 17, the capstone; the method is lesson 14's).

Lesson 14 chose SmolLM2's bits from a *full-model* scan (:mod:`course_lib.sensitivity`):
each Linear quantized alone, the KL of the whole model's next-token distribution measured on
calibration windows. Each of those numbers is a forward pass through every later layer and the
head, with the whole model in memory: fine for 135M parameters, not for an 8B model streamed
on a laptop. Here the same question is asked *inside one layer*, in the one pass
:mod:`course_lib.stream` makes over a checkpoint (:func:`scan`)::

    x = embed(calibration ids)                       # (n, T, D); the embedding is then let go
    for i in range(num_hidden_layers):
        block = own_model.load_layer(source, i)      # this layer's tensors only
        y = block(x)                                 # the float layer's output (n, T, D),
                                                     #   importance vectors captured on the way
        for each Linear W of the block, each format f its width allows:
            block with W -> roundtrip(W, f, importance)   # that tensor ALONE quantized
            e[W, f] = ||block(x) - y||^2 per token   # (n, T): the change of the residual stream
        x = y                                        # the FLOAT outputs feed the next layer

**The cost** of (W, f) is a mean over the calibration tokens t of ``e_t / ||h_t||^2``: the
squared change of the residual stream after the block, relative to the squared size of a
residual stream on the same token. Which residual stream ``h`` divides is the choice of
*measure* (:data:`MEASURES`):

- ``"token"`` (the default): ``h`` is this layer's own output ``y_t``, token by token: the
  relative change that the next layer's input RMSNorm sees (it divides each token by its own
  size). It assumes a relative change made in any layer reaches the output alike (the later
  layers read normalized inputs), so that a unit of cost weighs the same in every layer.
  A token whose residual stream is very large counts for little, as it does in the next
  layer.
- ``"final"``: ``h`` is the *last* layer's output on that token, known at the end of the same
  pass. It assumes a change made in layer i travels to the end along the residual connection
  unchanged, neither amplified nor damped by the later layers, up to the final RMSNorm.
- ``"layer"``: ``sum_t e_t / sum_t ||y_t||^2``, the mean squared change over the layer
  output's mean square, tokens pooled: the large tokens dominate both sums.

Every measure assumes what lesson 14's allocation assumes of the KL: the errors of tensors in
different layers *add* (no interaction). The float model's outputs feed the next layer (not
the quantized ones), so each tensor is measured alone against the float model, as lesson
14's scan measures it. A scan costs one block forward per (tensor, format), on the
calibration windows only (never evaluation text): for an 8B model on a laptop, restrict
``formats`` and use a few windows.

**Is the proxy any good?** ``python -m course_lib.own_kmix --validate`` runs :func:`scan` on
SmolLM2 on the windows lesson 14's committed scan used and compares each measure at the
4.5-bit format with that scan's full-model KL per tensor: Spearman rank correlation over the
210 Linears and per kind, and how many of the ten most sensitive tensors both name
(``results/own_kmix_smollm2.json``; about 6 minutes on one thread). Measured: ``"token"``
ranks the tensors as the KL does, Spearman +0.91 (+0.94 when rounded without the importance
vector, as the committed scan rounded), per kind +0.54 (ffn_up) to +0.88 (attn_k), 5 of the
top 10 (7 without the importance vector); ``"final"`` +0.58 and ``"layer"`` +0.45, each 1 to 3
of the top 10; lesson 14's weight-space proxy alone (:func:`course_lib.imatrix.
weighted_error`, no forward pass) +0.28. So a change is best judged relative to the token it
lands on, and the residual connection does not carry it unchanged to the head. SmolLM2's
packaged weights are Q4_1 and Q8_0 codes, so re-rounding them to Q4_1 (and Q5_1) costs
nothing: a fact of those weights, not of the measure.

**The mix** (:func:`plan`): lesson 14's greedy allocation (:func:`course_lib.sensitivity.
allocate`) over the measured costs under a byte budget for the whole file, the embedding and
head priced as llama.cpp's Q4_K_M prices them (:func:`course_lib.kmix.llama_type`), norms in
F32; beside it the same summary for Q4_K_M's own rule, so both can be compared at the same
bytes. The GGUF file itself is written by :mod:`course_lib.stream_gguf` from the plan's
``types`` and the scan's ``imatrix``.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from course_lib import imatrix as imx_lib
from course_lib import kmix, kquants, own_model, sensitivity, stream
from course_lib.methods import calibration as cal

#: the layer-local measures :func:`scan` computes (module docstring); the first is the default
MEASURES = ("token", "final", "layer")
#: llama.cpp mix whose rule prices the embedding and head, and that :func:`plan` compares with
REFERENCE_MIX = "q4_k_m"
#: GGUF kind of each Linear of a block (lesson 14's table, read backwards)
KIND_OF = {m: k for k, m in sensitivity.MODULES.items()}
RESULTS_FILE = Path(__file__).resolve().parent.parent / "results" / "own_kmix_smollm2.json"
COMMAND = "python -m course_lib.own_kmix --validate"
#: the label of lesson 14's weight-space proxy in the validation's figures
BASELINE = "lesson 14's weighted error (no forward pass)"
#: tokens of a window compared with the course's evaluation text (a shorter run of tokens may
#: occur in both texts by chance)
EVAL_RUN = 32


# ----------------------------------------------------------------------------- checks
def _formats(formats) -> tuple:
    if formats is None:
        return sensitivity.CANDIDATES
    if isinstance(formats, str):
        raise TypeError(f"formats must be a list of formats such as ('q4_k', 'q6_k'), not the "
                        f"string {formats!r} (it would be read one letter at a time)")
    try:
        out = tuple(formats)
    except TypeError:
        raise TypeError(f"formats must be None or a list of formats from "
                        f"{sensitivity.CANDIDATES}; got {type(formats).__name__}") from None
    bad = [f for f in out if f not in sensitivity.CANDIDATES]
    if bad or not out:
        raise ValueError(f"unknown format {bad[0]!r}: formats must come from "
                         f"{sensitivity.CANDIDATES}" if bad else
                         f"formats is empty: name at least one of {sensitivity.CANDIDATES}")
    return tuple(dict.fromkeys(out))


def _check_not_evaluation(ck, ids: torch.Tensor) -> None:
    """Refuse windows cut from the course's evaluation text (the clean split's second part,
    what :func:`course_lib.stream.eval_ids` reads): a scan that chooses bits must not see the
    text that scores the file. Skipped when the checkpoint has no tokenizer, or windows are
    shorter than :data:`EVAL_RUN` tokens (too short to tell the texts apart)."""
    if ck.tokenizer is None or ids.shape[1] < EVAL_RUN:
        return
    from course_lib import data
    ev = own_model.load_tokenizer(ck).encode(data.clean_split()[1])
    ev = np.asarray(ev, dtype=np.int64)
    if len(ev) < EVAL_RUN:
        return
    runs = np.lib.stride_tricks.sliding_window_view(ev, EVAL_RUN)             # (N, EVAL_RUN)
    starts = {tuple(r) for r in runs.tolist()}      # every run of EVAL_RUN tokens, any offset
    for w, row in enumerate(ids.numpy()):
        for s in range(0, ids.shape[1] - EVAL_RUN + 1, EVAL_RUN):
            if tuple(row[s:s + EVAL_RUN].tolist()) in starts:
                raise ValueError(f"ids window {w} holds {EVAL_RUN} tokens in a row of the "
                                 f"course's evaluation text (stream.eval_ids): the scan chooses "
                                 f"the bits, so it must read calibration text only; use "
                                 f"stream.calibration_ids(source)")


def _finite(t: torch.Tensor, what: str) -> None:
    if not torch.isfinite(t).all():
        raise ValueError(f"{what} holds NaN or inf: the checkpoint's weights (or the "
                         f"activations they make) are not finite; check the download, or load "
                         f"in float32")


# ----------------------------------------------------------------------------- the scan
def _importance_hooks(block) -> tuple[dict, list]:
    """Forward pre-hooks on each Linear of ``block`` accumulating ``imatrix.from_inputs`` of its
    inputs times the tokens seen (llama-imatrix's mean of x^2 per column, lesson 14)."""
    acc = {}

    def hook(name):
        def f(mod, inputs):
            x = inputs[0].detach()
            n = x.numel() // x.shape[-1]
            s, c = acc.get(name, (0.0, 0))
            acc[name] = (s + imx_lib.from_inputs(x).double() * n, c + n)
        return f
    handles = [m.register_forward_pre_hook(hook(n)) for n, m in cal.linears(block).items()]
    return acc, handles


def _token_sq(t: torch.Tensor) -> torch.Tensor:
    """Squared norm of each token's vector: (n, T, D) -> (n, T) float64."""
    return (t.double() ** 2).sum(-1)


def scan(source, ids: torch.Tensor, formats=None, progress: bool = True,
         round_f16: bool = False, plain_low: bool = False, batch_size: int = 16) -> dict:
    """Measured layer-local cost of every Linear of the checkpoint ``source`` in every format
    its width allows, in one pass holding one decoder layer (the module docstring; lesson 17).

    source: a checkpoint folder, a .gguf file or an opened :class:`own_model.Checkpoint`;
    ids: calibration windows (n, T) int64 (:func:`course_lib.stream.calibration_ids`; never
    evaluation text); formats: the candidates (default :data:`sensitivity.CANDIDATES`, each
    where the width allows it, :func:`sensitivity.candidates`); round_f16: round each weight
    (and the embedding rows) to fp16 first, as the course's F16 SmolLM2 reference does (the
    validation); plain_low: also measure the 4.5-bit format rounded *without* the importance
    vector, as lesson 14's committed scan rounded (the validation).

    Returns ``rows`` (one per Linear, in layer order: ``tensor`` GGUF name, ``layer``,
    ``kind``, ``shape`` (out, in), ``format`` the 4.5-bit format or None, ``cost`` {format:
    cost under :data:`MEASURES`[0]}, ``costs`` {measure: {format: cost}}, ``bytes`` {format:
    bytes}), ``imatrix`` {GGUF name: (in,) float32 numpy} (for the writer), ``tensors`` {GGUF
    name: (out, in)} of every 2-D weight of the file (embedding and head too), ``f32_weights``
    (the norms' and biases' weights, F32 in a GGUF file), ``n_layers``, ``tied``,
    ``measure``, ``windows`` [n, T] and ``seconds``.
    """
    t0 = time.perf_counter()
    formats = _formats(formats)
    for name, v in (("progress", progress), ("round_f16", round_f16), ("plain_low", plain_low)):
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be True or False; got {v!r}")
    stream._whole("batch_size", batch_size)
    ck = stream._open(source)
    cfg = ck.config
    if isinstance(ids, np.ndarray):
        ids = torch.from_numpy(ids)
    ids = stream._check_ids(ids, cfg, "calibration ids")
    _check_not_evaluation(ck, ids)
    L = cfg.num_hidden_layers
    x, cos, sin = stream.capture_inputs(ck, ids)                               # (n, T, D)
    if round_f16:
        x = x.half().float()                       # the embedding rows, rounded as the weights
    rows, imatrix, errs = [], {}, {}               # errs: tensor -> {format: (n, T) float64}
    y_sq = []                                      # per layer: ||y_t||^2 (n, T)
    bar = stream._bar(L, progress, "sensitivity, one layer at a time")
    with torch.no_grad():
        for i in range(L):
            block = own_model.load_layer(ck, i)
            for name, p in block.named_parameters():
                if round_f16:
                    p.data = p.data.half().float()
                _finite(p.data, f"layer {i}'s {name}")
            acc, handles = _importance_hooks(block)
            try:
                y = cal.run_block(block, x, cos, sin, batch_size)             # (n, T, D) float
            finally:
                for h in handles:
                    h.remove()
            _finite(y, f"layer {i}'s output")
            y_sq.append(_token_sq(y))
            for mod, lin in cal.linears(block).items():
                kind = KIND_OF.get(mod)
                if kind is None:
                    raise ValueError(f"layer {i} holds a Linear {mod!r} that is not one of a "
                                     f"llama layer's seven ({', '.join(KIND_OF)})")
                tensor = f"blk.{i}.{kind}.weight"
                w = lin.weight.data
                s, c = acc[mod]
                imp = (s / c).float()                                          # (in,)
                imatrix[tensor] = imp.numpy()
                out, cols = w.shape
                fmts = [f for f in sensitivity.candidates(cols) if f in formats]
                low = sensitivity.low_format(cols) if kquants.fits("q4_0", cols) else None
                errs[tensor] = {}
                todo = [(f, imp) for f in fmts]
                if plain_low and low is not None:
                    todo.append(("plain:" + low, None))
                for key, weighting in todo:
                    fmt = key.split(":")[-1]
                    lin.weight.data = sensitivity.roundtrip(w, fmt, weighting).to(w.dtype)
                    try:
                        y_q = cal.run_block(block, x, cos, sin, batch_size)
                    finally:
                        lin.weight.data = w
                    errs[tensor][key] = _token_sq(y_q - y)                     # (n, T)
                rows.append({"tensor": tensor, "layer": i, "kind": kind,
                             "shape": [out, cols], "format": low,
                             "bytes": {f: out * kquants.row_bytes(f, cols) for f in fmts}})
            x = y                                           # the float outputs feed layer i + 1
            del block, y
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    final_sq = _token_sq(x)                                                    # (n, T)
    for r in rows:
        e, ysq = errs.pop(r["tensor"]), y_sq[r["layer"]]
        r["costs"] = {m: {k: _measure(m, v, ysq, final_sq) for k, v in e.items()
                          if not k.startswith("plain:")} for m in MEASURES}
        if plain_low and r["format"] is not None:
            r["plain_low"] = {m: _measure(m, e["plain:" + r["format"]], ysq, final_sq)
                              for m in MEASURES}
        r["cost"] = r["costs"][MEASURES[0]]
    return {"rows": rows, "imatrix": imatrix, "tensors": _file_shapes(cfg),
            "f32_weights": _f32_weights(cfg),
            "n_layers": L, "tied": bool(cfg.tie_word_embeddings),
            "measure": MEASURES[0], "windows": list(ids.shape),
            "seconds": round(time.perf_counter() - t0, 1)}


def _measure(name: str, e: torch.Tensor, y_sq: torch.Tensor, final_sq: torch.Tensor) -> float:
    """One of :data:`MEASURES` from a tensor's per-token squared change e (n, T)."""
    if name == "final":
        return float((e / final_sq).mean())
    if name == "token":
        return float((e / y_sq).mean())
    return float(e.sum() / y_sq.sum())


def _file_shapes(cfg) -> dict:
    """{GGUF name: (out, in)} of every 2-D weight of a llama-layout GGUF file of ``cfg`` (the
    names of :func:`kmix.llama_shapes`)."""
    shapes = {"token_embd.weight": (cfg.vocab_size, cfg.hidden_size)}
    if not cfg.tie_word_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, cfg.hidden_size)
    for i in range(cfg.num_hidden_layers):
        for mod, (o, c) in own_model.linear_shapes(cfg).items():
            kind = next(k for m, k in KIND_OF.items() if m.endswith("." + mod))
            shapes[f"blk.{i}.{kind}.weight"] = (o, c)
    return shapes


def _f32_weights(cfg) -> int:
    """Weights of the 1-D tensors (norms, biases, q/k norms), which llama.cpp keeps in F32."""
    p = own_model.count_parameters(cfg)
    return cfg.num_hidden_layers * p["small_per_layer"] + p["final_norm"]


# ----------------------------------------------------------------------------- the plan
def _check_scan(result) -> dict:
    if not isinstance(result, dict) or \
            not {"rows", "tensors", "f32_weights", "n_layers", "tied"} <= set(result):
        raise TypeError(f"pass what own_kmix.scan returns (a dict with rows, tensors, "
                        f"f32_weights, n_layers, tied); got {type(result).__name__}")
    for i, r in enumerate(result["rows"]):
        if not isinstance(r, dict) or not {"tensor", "cost", "bytes"} <= set(r):
            raise ValueError(f"rows[{i}] must be a row of own_kmix.scan (tensor, cost, bytes); "
                             f"got {r!r:.80}")
        for f, c in r["cost"].items():
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) \
                    or c < 0:
                raise ValueError(f"rows[{i}] ({r['tensor']}): cost[{f!r}] must be a finite "
                                 f"number >= 0; got {c!r}")
    return result


def _tensor_bytes(fmt: str, shape) -> int:
    out, cols = shape
    return out * cols * 2 if fmt == "f16" else out * kquants.row_bytes(fmt, cols)


def _summary(types: dict, shapes: dict, f32: int, costs: dict) -> dict:
    """bytes, bits per weight (llama.cpp's: all tensor bits over all weights), the tensors per
    format, and the estimated cost (the sum of the Linears' costs; None when a format was not
    measured) of the 2-D weights in ``types`` and ``f32`` weights of norms in F32."""
    total = sum(_tensor_bytes(types[n], s) for n, s in shapes.items()) + 4 * f32
    weights = sum(math.prod(s) for s in shapes.values()) + f32
    by_type = {}
    for t in types.values():
        by_type[t] = by_type.get(t, 0) + 1
    est = 0.0
    for n, c in costs.items():
        if types[n] not in c:
            est = None
            break
        est += c[types[n]]
    return {"bytes": total, "bits_per_weight": 8 * total / weights,
            "estimated_cost": est, "by_type": dict(sorted(by_type.items()))}


def plan(result: dict, bits_per_weight: float | None = None,
         budget_bytes: int | None = None) -> dict:
    """A mix from a :func:`scan`: {GGUF name: format} for every 2-D weight, under a budget for
    the whole file's tensors (lesson 14's greedy allocation, :func:`sensitivity.allocate`, over
    the measured costs). Give ``bits_per_weight`` (llama.cpp's: all tensor bits over all
    weights) or ``budget_bytes``, or neither: the bytes of Q4_K_M's rule on this model, so
    the two are compared at the same size.

    The embedding and head take the type llama.cpp's Q4_K_M gives them (:func:`kmix.
    llama_type`), the norms and biases F32, a Linear no format fits F16; the Linears share the
    rest. Returns ``types``, ``bytes``, ``bits_per_weight``, ``estimated_cost`` (the sum of the
    chosen costs), ``by_type``, ``budget_bytes``, and ``q4_k_m``: the same summary (and types)
    for Q4_K_M's rule. ValueError when even every Linear at its smallest format does not fit,
    naming that smallest file."""
    result = _check_scan(result)
    shapes, L, tied = result["tensors"], result["n_layers"], result["tied"]
    f32 = result["f32_weights"]
    weights = sum(math.prod(s) for s in shapes.values()) + f32
    if bits_per_weight is not None and budget_bytes is not None:
        raise ValueError("give bits_per_weight or budget_bytes, not both")
    if bits_per_weight is not None:
        bpw = sensitivity._number(bits_per_weight, "bits_per_weight")
        if bpw <= 0:
            raise ValueError(f"bits_per_weight must be > 0; got {bits_per_weight!r}")
        budget = int(bpw * weights // 8)
    elif budget_bytes is not None:
        budget = sensitivity._whole(budget_bytes, "budget_bytes")
    else:
        budget = None
    rows = {r["tensor"]: r for r in result["rows"]}
    fixed = {}                                 # 2-D weights outside the allocation: their types
    for n, s in shapes.items():
        if n not in rows or not rows[n]["bytes"]:
            fixed[n] = kmix.llama_type(REFERENCE_MIX, n, s[1], L, tied).stored \
                if n not in rows else "f16"
    costs = {n: r["cost"] for n, r in rows.items() if r["bytes"]}
    sizes = {n: r["bytes"] for n, r in rows.items() if r["bytes"]}
    ref = {n: kmix.llama_type(REFERENCE_MIX, n, s[1], L, tied).stored for n, s in shapes.items()}
    q4km = {**_summary(ref, shapes, f32, costs), "types": ref}
    if budget is None:
        budget = q4km["bytes"]
    fixed_bytes = sum(_tensor_bytes(t, shapes[n]) for n, t in fixed.items()) + 4 * f32
    least = fixed_bytes + sensitivity.smallest(sizes)
    if budget < least:
        raise ValueError(f"no mix fits {budget:,} bytes ({8 * budget / weights:.3f} bits per "
                         f"weight): the smallest is {least:,} bytes ({8 * least / weights:.3f} "
                         f"bits per weight: every Linear at its smallest format, the embedding "
                         f"and head as {REFERENCE_MIX.upper()}, norms F32)")
    pick = sensitivity.allocate(costs, sizes, budget - fixed_bytes)
    types = {n: (pick[n] if n in pick else fixed[n]) for n in shapes}
    return {**_summary(types, shapes, f32, costs), "types": types, "budget_bytes": budget,
            "q4_k_m": q4km}


# ----------------------------------------------------------------------------- validation
def _ranks(v) -> np.ndarray:
    """Ranks 1..n of v, ties given their mean rank (as scipy.stats.rankdata)."""
    v = np.asarray(v, dtype=np.float64)
    order = np.argsort(v, kind="mergesort")
    r = np.empty(len(v))
    r[order] = np.arange(1, len(v) + 1)
    _, inv = np.unique(v, return_inverse=True)
    sums = np.bincount(inv, weights=r)
    counts = np.bincount(inv)
    return (sums / counts)[inv]


def spearman(a, b) -> float:
    """Spearman's rank correlation of two sequences of numbers (Pearson's on their ranks)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError(f"spearman needs two 1-D sequences of one length >= 2; got "
                         f"{a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("spearman: the sequences hold NaN or inf")
    ra, rb = _ranks(a) - (len(a) + 1) / 2, _ranks(b) - (len(b) + 1) / 2
    den = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def top_overlap(a: dict, b: dict, k: int = 10) -> int:
    """How many of the ``k`` largest of {name: value} ``a`` are among the k largest of ``b``."""
    top = lambda d: set(sorted(d, key=lambda n: -d[n])[:k])    # noqa: E731
    return len(top(a) & top(b))


def agreement(rows: list[dict], key: str = "cost_low") -> dict:
    """Spearman (overall and per kind) and the top-10 overlap of ``rows[i][key]`` against
    ``rows[i]['committed_kl']`` (the validation file's rows)."""
    out = {"spearman": spearman([r[key] for r in rows], [r["committed_kl"] for r in rows]),
           "per_kind": {}}
    for kind in sensitivity.KINDS:
        sub = [r for r in rows if r["kind"] == kind]
        if len(sub) >= 2:
            out["per_kind"][kind] = spearman([r[key] for r in sub],
                                             [r["committed_kl"] for r in sub])
    out["top10_overlap"] = top_overlap({r["tensor"]: r[key] for r in rows},
                                       {r["tensor"]: r["committed_kl"] for r in rows})
    return out


def validate(out: Path = RESULTS_FILE, progress: bool = True) -> dict:
    """Scan SmolLM2 on lesson 14's scan windows and compare each measure with the committed
    full-model KL (module docstring); write ``out``."""
    from course_lib import device, smollm
    t0 = time.perf_counter()
    committed = sensitivity.load_scan()
    p = committed["protocol"]
    windows = sensitivity.scan_windows(p["n_windows"], p["window_tokens"])
    ids = windows[:, :-1]                 # the positions the committed KL was measured at
    res = scan(smollm.model_dir(), ids, progress=progress, round_f16=True, plain_low=True)
    kl = {r["tensor"]: r for r in committed["rows"]}
    rows = []
    for r in res["rows"]:
        c = kl[r["tensor"]]
        if c["format"] != r["format"]:
            raise ValueError(f"{r['tensor']}: the committed scan used {c['format']}, this one "
                             f"{r['format']}")
        rows.append({"tensor": r["tensor"], "layer": r["layer"], "kind": r["kind"],
                     "shape": r["shape"], "format": r["format"], "committed_kl": c["kl_mean"],
                     "cost": r["cost"], "costs": r["costs"], "plain_low": r["plain_low"],
                     "bytes": r["bytes"]})
    figures = {}
    for m in MEASURES:
        for label, get in ((m, lambda r: r["costs"][m][r["format"]]),
                           (f"{m}, rounded without imatrix", lambda r: r["plain_low"][m])):
            for r in rows:
                r["cost_low"] = get(r)
            figures[label] = agreement(rows)
    # the baseline: lesson 14's cheap proxy, the importance-weighted weight error (no forward
    # pass), from the committed scan's own rows
    base = [{**r, "cost_low": kl[r["tensor"]]["weighted_error"][r["format"]]} for r in rows]
    figures[BASELINE] = agreement(base)
    for r in rows:
        del r["cost_low"]
    mix = plan(res)
    record = {
        "command": COMMAND,
        "what": "layer-local sensitivity (course_lib.own_kmix.scan, one decoder layer in "
                "memory) against lesson 14's full-model KL per tensor "
                "(results/kquants_sensitivity_smollm2.json), at the 4.5-bit format the "
                "committed scan quantized each tensor to",
        "protocol": {"name": sensitivity.PROTOCOL,
                     "windows": "sensitivity.scan_windows(): the committed scan's calibration "
                                "windows, its positions 0..T-2 (the KL's)",
                     "n_windows": p["n_windows"], "tokens": p["window_tokens"] - 1,
                     "reference": "SmolLM2 layer by layer (own_model.load_layer), weights "
                                  "rounded to fp16 as sensitivity.f16_model",
                     "importance": "collected in the same pass on the same windows "
                                   "(imatrix.from_inputs per Linear)",
                     "inputs": "each layer runs on the float model's outputs"},
        "measure": res["measure"],
        "figures": figures,
        "note": "measures (own_kmix.MEASURES, module docstring): 'token' divides each token's "
                "squared change by that token's squared residual stream after the layer, "
                "'final' by the one after the last layer, 'layer' pools the tokens; 'rounded "
                "without imatrix' rounds the 4.5-bit format as the committed scan did (no "
                "importance vector), the others with it, as the plan's file would. SmolLM2's "
                "packaged weights are Q4_1/Q8_0 codes: Q4_1 and Q5_1 re-round them at no cost, "
                "so the plan at Q4_K_M's bytes keeps most tensors in Q4_1 and has nothing left "
                "to buy with the rest of the budget (a fact of these weights, not of a float "
                "checkpoint).",
        "plan_at_q4_k_m_bytes": {k: mix[k] for k in ("bytes", "bits_per_weight",
                                                     "estimated_cost", "by_type")},
        "q4_k_m": {k: mix["q4_k_m"][k] for k in ("bytes", "bits_per_weight", "estimated_cost",
                                                 "by_type")},
        "scan_seconds": res["seconds"],
        "seconds": round(time.perf_counter() - t0, 1),
        "machine": device.machine_record(),
        "rows": rows}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(out)
    return record


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m course_lib.own_kmix", description=__doc__.split(
        "\n")[0])
    ap.add_argument("--validate", action="store_true",
                    help=f"scan SmolLM2 and compare with lesson 14's full-model KL; writes "
                         f"{RESULTS_FILE.relative_to(RESULTS_FILE.parent.parent)}")
    ap.add_argument("--out", type=Path, default=RESULTS_FILE)
    a = ap.parse_args(argv)
    if not a.validate:
        ap.print_help()
        return 2
    torch.set_num_threads(1)
    rec = validate(a.out)
    for label, f in rec["figures"].items():
        kinds = ", ".join(f"{k} {v:+.2f}" for k, v in f["per_kind"].items())
        print(f"{label:<32} Spearman {f['spearman']:+.3f}  top-10 overlap "
              f"{f['top10_overlap']}/10  per kind: {kinds}")
    print(f"wrote {a.out} in {rec['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
