"""The course's texts: the bundled model's corpus (the Python standard library's own source) and
the English reference text SmolLM2 is measured on (lesson 04).

The split is fixed and documented, so a retrain on any machine holds out the same modules:

- corpus: every ``*.py`` file under the running Python's stdlib folder, except those inside a
  ``test``, ``tests``, ``idle_test``, ``site-packages`` or ``__pycache__`` folder;
- held out (never trained on): files whose ``sha256(relative path)`` is 0 mod 16, except the
  trivially predictable ones (:data:`NEVER_HELD_OUT`: codec tables such as ``encodings/cp1252.py``
  and generated data modules), which stay in training;
- training: everything else.

The real LLM (SmolLM2-135M) is measured on English prose: the Python language reference topics
(``pydoc_data.topics``, PSF licence), bundled as a fixed snapshot in
``course_lib/data/pydoc_topics.json`` because their content changes between Python versions.
:func:`topics_split` cuts them as llm-compressor-style calibration scripts do: topics sorted by
key, even positions for calibration, odd positions for evaluation, each part joined with blank
lines.

Because a learner's Python may differ from the one the model was trained on, the evaluation text
is *bundled*: ``course_lib/data/heldout_eval.txt`` holds a fixed slice (tens of KB) of the held-out
modules, so every machine evaluates the same bytes. :func:`heldout_text` returns it.
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import torch

DATA_DIR = Path(__file__).parent / "data"
HELDOUT_FILE = DATA_DIR / "heldout_eval.txt"
TOPICS_FILE = DATA_DIR / "pydoc_topics.json"
TOPIC_SEPARATOR = "\n\n"

EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
HOLDOUT_MODULUS = 16
#: Path prefixes that are never held out (tables and generated data: too easy to predict).
NEVER_HELD_OUT = ("encodings/", "pydoc_data/", "html/entities.py", "stringprep.py",
                  "lib2to3/fixes/", "unicodedata")
FILE_SEPARATOR = b"\n\n"
#: Bytes per held-out file in the bundled evaluation text, and the file's total cap.
EVAL_BYTES_PER_FILE = 2048
EVAL_TOTAL_BYTES = 65536


def stdlib_dir() -> Path:
    """The running Python's standard-library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_corpus(root: str | Path | None = None) -> list[str]:
    """Sorted relative paths of the corpus files (see the module docstring for the rules)."""
    root = Path(root) if root is not None else stdlib_dir()
    if not root.is_dir():
        raise FileNotFoundError(f"stdlib folder {root} not found")
    out = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        if EXCLUDED_DIRS.intersection(rel.parts[:-1]):
            continue
        out.append(rel.as_posix())
    return sorted(out)


def is_held_out(rel_path: str) -> bool:
    """True when a corpus file belongs to the held-out (evaluation) split."""
    if rel_path.startswith(NEVER_HELD_OUT):
        return False
    h = int.from_bytes(hashlib.sha256(rel_path.encode()).digest()[:8], "big")
    return h % HOLDOUT_MODULUS == 0


def split(root: str | Path | None = None) -> tuple[list[str], list[str]]:
    """(train paths, held-out paths), both sorted."""
    files = list_corpus(root)
    held = [f for f in files if is_held_out(f)]
    return [f for f in files if not is_held_out(f)], held


def read_bytes(paths: list[str], root: str | Path | None = None) -> bytes:
    """Concatenate files (in the given order) with a blank line between them."""
    root = Path(root) if root is not None else stdlib_dir()
    return FILE_SEPARATOR.join((root / p).read_bytes() for p in paths)


def make_eval_text(held: list[str], root: str | Path | None = None) -> bytes:
    """The bundled evaluation text: from each held-out file, a slice from its middle, cut at line
    boundaries, up to EVAL_BYTES_PER_FILE bytes; at most EVAL_TOTAL_BYTES in all."""
    root = Path(root) if root is not None else stdlib_dir()
    parts, total = [], 0
    for p in held:
        b = (root / p).read_bytes()
        start = max(0, len(b) // 2 - EVAL_BYTES_PER_FILE // 2)
        start = b.find(b"\n", start) + 1 if start else 0
        chunk = b[start:start + EVAL_BYTES_PER_FILE]
        chunk = chunk[: chunk.rfind(b"\n") + 1] if b"\n" in chunk else chunk
        if total + len(chunk) > EVAL_TOTAL_BYTES:
            break
        parts.append(chunk)
        total += len(chunk) + len(FILE_SEPARATOR)
    return FILE_SEPARATOR.join(parts)


def heldout_text(max_bytes: int | None = None) -> bytes:
    """The bundled held-out evaluation bytes (the same on every machine), optionally truncated."""
    if not HELDOUT_FILE.exists():
        raise FileNotFoundError(f"{HELDOUT_FILE} is missing; reinstall the course or run "
                                "`python -m course_lib.train --eval-text-only`.")
    b = HELDOUT_FILE.read_bytes()
    return b if max_bytes is None else b[:max_bytes]


def to_tensor(b: bytes) -> torch.Tensor:
    """Bytes -> int64 token ids (byte-level tokenizer), shape (N,)."""
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).long()


def unigram_bits_per_byte(train: bytes, test: bytes) -> float:
    """Baseline: cross-entropy of ``test`` under the byte frequencies of ``train`` (add-one)."""
    if len(test) == 0:
        raise ValueError("test text is empty: there is nothing to score (the mean would be NaN)")
    counts = torch.bincount(to_tensor(train), minlength=256).double() + 1
    logp = (counts / counts.sum()).log2()
    return float(-logp[to_tensor(test)].mean())


def compressor_bits_per_byte(text: bytes) -> dict[str, float]:
    """Baselines: bits per byte of ``text`` compressed on its own by gzip -9, bzip2 -9, xz -9e.

    A general-purpose compressor is also a (adaptive) predictive model of the bytes, so its output
    size is a fair yardstick for a language model's bits per byte (lesson 04).
    """
    import bz2
    import gzip
    import lzma
    if len(text) == 0:
        raise ValueError("text is empty: bits per byte of nothing is undefined")
    sizes = {"gzip -9": len(gzip.compress(text, 9)), "bzip2 -9": len(bz2.compress(text, 9)),
             "xz -9e": len(lzma.compress(text, preset=9 | lzma.PRESET_EXTREME))}
    return {k: 8 * v / len(text) for k, v in sizes.items()}


# ----------------------------------------------------------------------------- English text
def topics() -> dict[str, str]:
    """The bundled snapshot of the Python reference topics: {key: text}, sorted by key."""
    import json
    if not TOPICS_FILE.exists():
        raise FileNotFoundError(f"{TOPICS_FILE} is missing; reinstall the course (it ships in "
                                "course_lib/data)")
    return dict(sorted(json.loads(TOPICS_FILE.read_text(encoding="utf-8"))["topics"].items()))


def topics_split() -> tuple[str, str]:
    """(calibration, evaluation) text: topics sorted by key, even positions calibrate, odd
    positions evaluate, each part joined with blank lines (lesson 04; used by lessons 05-08, 11)."""
    items = list(topics().values())
    return TOPIC_SEPARATOR.join(items[0::2]), TOPIC_SEPARATOR.join(items[1::2])
