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
The topics repeat one another (the same grammar rules, tables and paragraphs appear under several
keys), so cutting them into calibration and evaluation text takes care:

- :func:`clean_split` (the "clean" protocol): topics that share a run of 50 characters, verbatim,
  are linked, and linked topics stay together (:func:`linked_topics`); the largest group
  calibrates, the rest evaluates. No run of 50 characters of one part occurs in the other
  (tests/test_protocol.py), so what a method fits on calibration text is never scored.
- :func:`topics_split` (the first protocol, "v1"): topics sorted by key, even positions
  calibrate, odd positions evaluate. Every topic is on one side, but the *text* is not disjoint:
  :func:`topics_overlap` measures the share of the evaluation half's characters inside some run
  of ``run`` characters (100 by default) found verbatim in the calibration half, 24.1% for the
  bundled snapshot (a test keeps it between 20% and 30%), and three of that protocol's first 8
  windows of SmolLM2 tokens overlap (one almost entirely). Tables measured on it say so in their
  ``protocol`` field until they are rerun.

Because a learner's Python may differ from the one the model was trained on, the evaluation text
is *bundled*: ``course_lib/data/heldout_eval.txt`` holds a fixed slice (tens of KB) of the held-out
modules, so every machine evaluates the same bytes. :func:`heldout_text` returns it.
"""
from __future__ import annotations

import functools
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
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                  or max_bytes < 1):
        raise ValueError(f"max_bytes must be None (all of it) or a whole number >= 1; "
                         f"got {max_bytes!r}")
    b = HELDOUT_FILE.read_bytes()
    return b if max_bytes is None else b[:max_bytes]


def to_tensor(b: bytes) -> torch.Tensor:
    """Bytes -> int64 token ids (byte-level tokenizer), shape (N,)."""
    if isinstance(b, str):
        b = b.encode("utf-8")
    if not isinstance(b, (bytes, bytearray)):
        raise TypeError(f"to_tensor takes bytes (or str); got {type(b).__name__}")
    if len(b) == 0:
        raise ValueError("to_tensor got empty text: there are no tokens to make (give at least "
                         "one byte)")
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
    """(calibration, evaluation) text of the first protocol ("v1"): topics sorted by key, even
    positions calibrate, odd positions evaluate, each part joined with blank lines (lesson 04).
    The two parts share verbatim text (:func:`topics_overlap`: 24%); :func:`clean_split` is the
    protocol that replaces it."""
    items = list(topics().values())
    return TOPIC_SEPARATOR.join(items[0::2]), TOPIC_SEPARATOR.join(items[1::2])


#: Two topics that share a run of this many characters, verbatim, are the same text for the
#: clean split: they go to the same side. 50 characters is about 12 tokens; shorter shared runs
#: are stock phrases ("the following", a grammar rule's name), longer ones are copied passages.
CLEAN_RUN = 50


@functools.lru_cache(maxsize=4)
def linked_topics(run: int = CLEAN_RUN) -> tuple[tuple[str, ...], ...]:
    """The topics in groups that must not be split (lesson 04): two topics are linked
    when some run of ``run`` characters occurs verbatim in both, and a group is everything linked
    to everything else through such links (connected components). Groups are sorted largest
    (in characters) first, each group's keys sorted."""
    run = _check_run(run)
    t = topics()
    keys = list(t)
    parent = list(range(len(keys)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_owner: dict[str, int] = {}                  # a run of text -> first topic holding it
    for i, k in enumerate(keys):
        text = t[k]
        for j in range(len(text) - run + 1):
            owner = first_owner.setdefault(text[j:j + run], i)
            if owner != i:
                parent[root(i)] = root(owner)
    groups: dict[int, list[str]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(root(i), []).append(k)
    size = lambda g: sum(len(t[k]) for k in g)                    # noqa: E731
    return tuple(tuple(sorted(g)) for g in sorted(groups.values(), key=lambda g: (-size(g), g)))


@functools.lru_cache(maxsize=2)
def clean_split(run: int = CLEAN_RUN) -> tuple[str, str]:
    """(calibration, evaluation) text of the clean protocol (lesson 04): the largest
    group of :func:`linked_topics` calibrates, every other group evaluates, each part's topics
    in key order joined with blank lines. No run of ``run`` characters of one part occurs in the
    other (tests/test_protocol.py checks it at 50 and 100 characters), so what a method fits on
    calibration text is never scored. With the bundled snapshot: 368 KB of calibration text
    (about 87,000 SmolLM2 tokens) and 96 KB of evaluation text (about 23,000 tokens, 45 windows
    of 512)."""
    groups = linked_topics(run)
    if len(groups) < 2:
        raise ValueError(f"every topic is linked to every other by runs of {run} characters: "
                         f"no clean split exists at that run; use a longer run")
    t = topics()
    calib = set(groups[0])
    return (TOPIC_SEPARATOR.join(v for k, v in t.items() if k in calib),
            TOPIC_SEPARATOR.join(v for k, v in t.items() if k not in calib))


# ----------------------------------------------------------------------------- overlap
def _check_run(run) -> int:
    if isinstance(run, bool) or not isinstance(run, int) or run < 1:
        raise ValueError(f"run must be a whole number of characters >= 1 (100 by default); "
                         f"got {run!r}")
    return run


@functools.lru_cache(maxsize=4)
def _runs(reference: str, run: int) -> frozenset:
    """Every run of ``run`` consecutive characters of ``reference`` (built once per text)."""
    return frozenset(reference[i:i + run] for i in range(len(reference) - run + 1))


def overlap_mask(text: str, reference: str, run: int = 100) -> torch.Tensor:
    """(len(text),) bool: True for each character of ``text`` that lies inside some run of
    ``run`` consecutive characters also found, verbatim, in ``reference`` (lesson 05)."""
    run = _check_run(run)
    for v, what in ((text, "text"), (reference, "reference")):
        if not isinstance(v, str):
            raise TypeError(f"{what} must be a str (decode bytes first); got {type(v).__name__}")
    if not text:
        raise ValueError("text is empty: there is nothing whose overlap to measure")
    mask = torch.zeros(len(text), dtype=torch.bool)
    if len(text) < run or len(reference) < run:
        return mask
    seen = _runs(reference, run)
    starts = torch.tensor([text[i:i + run] in seen for i in range(len(text) - run + 1)])
    if bool(starts.any()):
        # character c is covered when a matching run starts in (c - run, c]
        cover = torch.cumsum(torch.nn.functional.pad(starts.int(), (0, run - 1)), 0)
        cover = cover - torch.nn.functional.pad(cover, (run, 0))[:len(cover)]
        mask = cover > 0
    return mask


def verbatim_overlap(text: str, reference: str, run: int = 100) -> float:
    """Share of the characters of ``text`` inside a run of ``run`` characters that occurs
    verbatim in ``reference`` (0: nothing shared, 1: all of it) (lesson 05)."""
    return float(overlap_mask(text, reference, run).float().mean())


def topics_overlap(run: int = 100) -> float:
    """:func:`verbatim_overlap` of the evaluation half of :func:`topics_split` against its
    calibration half (lesson 05 states it)."""
    calib, evaluation = topics_split()
    return verbatim_overlap(evaluation, calib, run)


def overlap_free_windows(window_texts, reference: str, n: int, run: int = 100,
                         max_overlap: float = 0.0) -> list[int]:
    """Indices of the first ``n`` windows whose text shares at most ``max_overlap`` of its
    characters with ``reference`` in runs of ``run`` characters (lesson 05; the check that a
    ranking of methods does not depend on text the calibration has seen).

    window_texts: one decoded string per evaluation window, in order."""
    run = _check_run(run)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a whole number of windows >= 1; got {n!r}")
    if not (isinstance(max_overlap, (int, float)) and 0 <= max_overlap <= 1):
        raise ValueError(f"max_overlap is a fraction in [0, 1] (0.05 for 5%, not 5); got "
                         f"{max_overlap!r}")
    window_texts = list(window_texts)
    if not window_texts:
        raise ValueError("window_texts is empty: pass one decoded string per evaluation window")
    free = [i for i, t in enumerate(window_texts)
            if verbatim_overlap(t, reference, run) <= max_overlap]
    if len(free) < n:
        raise ValueError(f"only {len(free)} of {len(window_texts)} windows share at most "
                         f"{max_overlap:.0%} of their text with the reference; asked for {n}: "
                         f"allow more overlap or use shorter windows")
    return free[:n]
