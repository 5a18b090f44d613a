"""Lesson 14's engine table: llama.cpp's Q4_K_M and Q3_K_M against the same mixes with the
course's importance matrix, Q4_0 with and without it (with it: every Linear still Q4_0, see
``Q4_0_IMX``), and the course's own bit allocation at no more bytes, all run in llama.cpp:
bytes, bits per weight, perplexity, KL, top-1, tokens/s.

The table is ``results/kquants_engine_smollm2.json`` (:func:`load_table`), written by
``python -m course_lib.experiments.kmix_table`` (about 15 minutes on 2 cores, after
``python -m course_lib.experiments.sensitivity_scan scan``); the lesson reads it when the
engine is missing and checks a slice of it when the engine is there. This module holds what
the table is and the allocation the lesson recomputes (:func:`course_mix`).
"""
from __future__ import annotations

import json
from pathlib import Path

from course_lib import kmix, sensitivity

RESULTS_FILE = Path(__file__).resolve().parent.parent / "results" / "kquants_engine_smollm2.json"
LINEAR_KINDS = sensitivity.KINDS
#: formats the course's allocation may use. Q4_1 is left out: SmolLM2's weights come from a
#: Q4_1 file, so Q4_1 would reproduce them exactly, a property of this checkpoint, not of the
#: format (the table has one row with it allowed, to show the effect).
ALLOC_FORMATS = ("q4_0", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")
#: The Q4_0 row with the course's importance matrix keeps every Linear in Q4_0, which is not
#: what ``llama-quantize --imatrix ... Q4_0`` writes: with an importance matrix it stores the
#: ffn_down of the first n_layers/8 layers (SmolLM2: 0-2) as Q4_1 (llama.cpp's
#: src/llama-quant.cpp, lines 660-666, llama-cpp-python 0.3.36). Q4_1 would come close to
#: giving back this checkpoint's weights (they came from a Q4_1 file), so the row keeps Q4_0 to
#: compare the scale search alone, at equal bytes; its label says so.
Q4_0_IMX = "Q4_0 + imatrix, all Q4_0 (course)"
Q4_0_IMX_NOTE = ("every Linear Q4_0; llama-quantize --imatrix would store the ffn_down of the "
                 "first n_layers/8 layers (here blk.0-2) as Q4_1 (src/llama-quant.cpp lines "
                 "660-666, llama-cpp-python 0.3.36)")


def linear_bytes(rows: list[dict]) -> int:
    """Bytes of a file's decoder Linears (read_mix rows): what the allocation redistributes."""
    return sum(r["bytes"] for r in rows if (kmix.layer_kind(r["name"]) or (0, ""))[1]
               in LINEAR_KINDS)


def course_mix(scan_rows: list[dict], budget: int, formats=ALLOC_FORMATS) -> dict:
    """The greedy allocation of the scan's tensors under ``budget`` bytes, over ``formats``."""
    costs, sizes = sensitivity.costs_from_scan(scan_rows)
    costs = {t: {f: c for f, c in cs.items() if f in formats} for t, cs in costs.items()}
    sizes = {t: {f: b for f, b in ss.items() if f in formats} for t, ss in sizes.items()}
    return sensitivity.allocate(costs, sizes, budget)


#: The table's protocol: the clean split; the importance matrix and the sensitivity scan read its
#: calibration text, every file is scored on its first N_WINDOWS evaluation windows, each window
#: kept apart (per-window figures: a comparison's spread, course_lib.protocol.paired).
PROTOCOL, N_WINDOWS = "clean", 8


def load_table(path: Path = RESULTS_FILE) -> dict:
    """The committed engine table."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} is missing: run `python -m "
                                f"course_lib.experiments.kmix_table`")
    return json.loads(Path(path).read_text())
