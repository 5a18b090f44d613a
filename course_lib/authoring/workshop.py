"""The workshop kit's figures, read from measurements, never typed: notebook run times from a
test run, exercises and their difficulty from ``solutions/``, GPU figures from
``results/bench_cuda_*.json``. They fill the generated tables of ``docs/instructors.md`` and
the lessons table of ``README.md`` (``tests/test_workshop.py`` fails when a table is stale).

    make notebook-times        # a timed test run of every notebook, then the two commands below
    python -m course_lib.authoring.workshop times --log /tmp/times.jsonl [--note "..."]
                               # the timer plugin's log -> results/notebook_times.json
    python -m course_lib.authoring.workshop doc          # rewrite the generated tables
    python -m course_lib.authoring.workshop doc --check  # exit 1 if a table is stale

A generated table sits between ``<!-- BEGIN GENERATED: name -->`` and
``<!-- END GENERATED: name -->``; edit the prose around it, not the table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

from course_lib.paths import ROOT

TIMES = ROOT / "results" / "notebook_times.json"
DOCS = {"instructors": ROOT / "docs" / "instructors.md", "readme": ROOT / "README.md"}
FOLDERS = ("notebooks", "solutions", "exercises")
# Lessons that are being written: listed in the tables until their notebook lands.
PLANNED = {"12_validate_and_choose": "12 · Validate and choose"}
CHECK_CALL = re.compile(r'check\(\s*"(\d{2}\.[A-Za-z0-9_]+)"')
# Difficulty from the size of the reference solution (code lines, comments and blanks left out).
DIFFICULTY = ((4, "★ warm-up"), (9, "★★ core"), (10**9, "★★★ stretch"))


# ---- reading the notebooks -----------------------------------------------------------------

def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def lesson_stems() -> list[str]:
    """Every lesson's file stem (``00_the_bill``...), the planned ones included, in order."""
    stems = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")} | set(PLANNED)
    return sorted(stems)


def title(stem: str) -> str:
    """A lesson's title: its notebook's first ``# `` heading, or the planned title."""
    path = ROOT / "notebooks" / f"{stem}.ipynb"
    if not path.exists():
        return PLANNED[stem]
    for cell in _cells(path):
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return stem


def reading_minutes(stem: str) -> int | None:
    """The lesson's reading time by the rule its header states
    (``course_lib.authoring.reading_time``: prose, its code, printed source); None if unwritten."""
    from course_lib.authoring import reading_time
    if not (ROOT / "notebooks" / f"{stem}.ipynb").exists():
        return None
    return reading_time.lesson_time(stem).reading_minutes


def exercise_minutes(stem: str) -> int | None:
    """The time its exercises take by the same rule (None: no lesson yet)."""
    from course_lib.authoring import reading_time
    if not (ROOT / "notebooks" / f"{stem}.ipynb").exists():
        return None
    return reading_time.lesson_time(stem).exercise_minutes


def exercises(stem: str) -> list[dict]:
    """The checked exercises of a lesson's solution notebook, in order: id, title (from the
    checker registry), solution code lines (the blocks before its ``check`` call), difficulty."""
    from course_lib import checks

    path = ROOT / "solutions" / f"{stem}.ipynb"
    if not path.exists():
        return []
    registry = checks.load_all()
    found: dict[str, int] = {}
    lines = 0
    from course_lib.authoring.reading_time import solution_code_lines

    for cell in _cells(path):
        source = "".join(cell["source"])
        lines += solution_code_lines(cell)
        if cell["cell_type"] == "code":
            for m in CHECK_CALL.finditer(source):
                found[m.group(1)] = found.get(m.group(1), 0) + lines
                lines = 0
    out = []
    for ex_id, n in found.items():
        label = next(d for limit, d in DIFFICULTY if n <= limit)
        out.append({"id": ex_id, "title": registry[ex_id].title if ex_id in registry else "",
                    "solution_lines": n, "difficulty": label})
    return out


# ---- the timing record ---------------------------------------------------------------------

def machine() -> dict:
    """This machine, as the timing record names it: ``device.machine_record()`` (CPU model, ISA
    flags, torch, BLAS, threads) plus the platform string."""
    from course_lib import device
    try:
        rec = device.machine_record()
    except ImportError:       # no torch: what the CPU and Python say
        name, flags = device._cpuinfo()
        rec = {"cpu": name or platform.processor() or platform.machine(),
               "arch": platform.machine(), "isa_flags": [f for f in device.ISA_FLAGS if f in flags],
               "logical_cpus": os.cpu_count(), "torch": "", "python": platform.python_version()}
    return {**rec, "platform": platform.platform()}


def times_from_log(log: Path, note: str = "") -> dict:
    """The timer plugin's JSON lines (course_lib.authoring.notebook_timer) -> the timing record. The last
    line of a notebook wins; a notebook with a failed cell is refused (time a passing run)."""
    rows = [json.loads(l) for l in Path(log).read_text().splitlines() if l.strip()]
    if not rows:
        raise ValueError(f"{log} holds no notebook timings: run pytest with "
                         "-p course_lib.authoring.notebook_timer and NOTEBOOK_TIMES_LOG set")
    notebooks = {}
    for r in rows:
        if r["failed"]:
            raise ValueError(f"{r['notebook']} had {r['failed']} failing cells in that run: "
                             "time a run that passes")
        notebooks[r["notebook"]] = {k: r[k] for k in ("wall_s", "kernel_cpu_s", "cells")}
    loads = [r["load_average"][0] for r in rows]
    return {"schema": 1,
            "how": "pytest with nbval over the notebooks, one kernel per notebook "
                   "(course_lib.authoring.notebook_timer): wall_s from the first cell's setup (kernel "
                   "start) to the kernel's shutdown; kernel_cpu_s the kernel process's user + "
                   "system CPU seconds",
            "measured": time.strftime("%Y-%m-%d", time.localtime(Path(log).stat().st_mtime)),
            "omp_num_threads": rows[0].get("omp_num_threads", ""),
            "load_average_1min": {"min": min(loads), "max": max(loads)},
            "note": note, "machine": machine(), "notebooks": dict(sorted(notebooks.items()))}


def load_times() -> dict | None:
    return json.loads(TIMES.read_text()) if TIMES.exists() else None


# ---- tables ---------------------------------------------------------------------------------

def _t(times: dict | None, folder: str, stem: str, key: str = "kernel_cpu_s") -> float | None:
    rec = (times or {}).get("notebooks", {}).get(f"{folder}/{stem}.ipynb")
    return None if rec is None else rec[key]


def _s(x: float | None) -> str:
    return "not measured yet" if x is None else f"{x:.0f} s"


def busy_note(times: dict) -> str:
    """A warning when the timed run shared its machine (load above the number of CPUs)."""
    load, cpus = times["load_average_1min"]["max"], times["machine"]["logical_cpus"] or 1
    if load <= cpus:
        return ""
    return (f" (these were measured on a busy machine, load average up to {load:.0f} on "
            f"{cpus} CPUs: upper bounds)")


def lessons_table(times: dict | None) -> str:
    """README: each lesson with its reading time, its CPU run time and its exercises."""
    rows = ["| lesson | notebook | reading | CPU time to run | exercises | exercise time |",
            "| --- | --- | --- | --- | --- | --- |"]
    for stem in lesson_stems():
        minutes, ex_minutes = reading_minutes(stem), exercise_minutes(stem)
        exists = (ROOT / "notebooks" / f"{stem}.ipynb").exists()
        rows.append(f"| {title(stem)} | `{stem}.ipynb`{'' if exists else ' (being written)'} | "
                    f"{f'~{minutes} min' if minutes else '-'} | "
                    f"{_s(_t(times, 'notebooks', stem))} | {len(exercises(stem)) or '-'} | "
                    f"{f'~{ex_minutes} min' if ex_minutes else '-'} |")
    if times:
        m = times["machine"]
        threads = ("one torch thread" if times["omp_num_threads"] == "1"
                   else f"OMP_NUM_THREADS={times['omp_num_threads'] or 'unset'}")
        rows += ["", f"Reading and exercise times: the rule each lesson's header states "
                     f"(`course_lib.authoring.reading_time`): prose at 200 words a minute, the "
                     f"lesson's own code at 20 lines a minute, library and kernel source it "
                     f"prints for study at 5; each exercise 5 minutes plus 2 a line of its "
                     f"solution. CPU time: the notebook's kernel, "
                     f"measured in a test run ({times['measured']}, {m['cpu']}, {threads}), summed "
                     f"over its threads; on an idle machine a notebook's wall time is at most "
                     f"this, plus a few seconds to start the kernel and drive it{busy_note(times)}. Solutions and exercise notebooks, and how busy the "
                     f"machine was: [docs/instructors.md](docs/instructors.md#how-long-each-notebook-runs-measured)."]
    return "\n".join(rows)


def times_table(times: dict | None) -> str:
    """Instructors: every notebook's measured time (kernel CPU seconds, and wall in that run)."""
    if times is None:
        return "_No timing record yet: run `make notebook-times`._"
    rows = ["| lesson | lesson notebook | solutions | exercises | lesson: wall in that run |",
            "| --- | --- | --- | --- | --- |"]
    measured = {f: [] for f in FOLDERS}
    stems = lesson_stems()
    for stem in stems:
        cells = []
        for f in FOLDERS:
            x = _t(times, f, stem)
            if x is not None:
                measured[f].append(x)
            cells.append(_s(x))
        rows.append(f"| {title(stem)} | " + " | ".join(cells)
                    + f" | {_s(_t(times, 'notebooks', stem, 'wall_s'))} |")

    def total(xs):
        if not xs:
            return "-"
        return f"**{sum(xs):.0f} s**" + ("" if len(xs) == len(stems) else f" ({len(xs)} of {len(stems)})")

    rows.append("| **all** | " + " | ".join(total(measured[f]) for f in FOLDERS) + " | |")
    m = times["machine"]
    load = times["load_average_1min"]
    rows += ["", f"Measured {times['measured']} on {m['cpu']} ({m['logical_cpus']} logical CPUs), "
                 f"Python {m['python']}, torch {m['torch']}, OMP_NUM_THREADS="
                 f"{times['omp_num_threads'] or 'unset'}; 1-minute load average "
                 f"{load['min']:.1f}-{load['max']:.1f} during the run."
                 + (f" {times['note']}" if times.get("note") else "")]
    return "\n".join(rows)


def study_table() -> str:
    """Instructors: each lesson's reading and exercise time by the headers' rule."""
    from course_lib.authoring import reading_time as rt
    rows = ["| lesson | prose words | its code lines | printed source lines | reading | "
            "exercises | exercise time | total |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for stem in lesson_stems():
        if not (ROOT / "notebooks" / f"{stem}.ipynb").exists():
            rows.append(f"| {title(stem)} | - | - | - | - | - | - | - |")
            continue
        t = rt.lesson_time(stem)
        total = t.reading_minutes + t.exercise_minutes
        rows.append(f"| {title(stem)} | {t.words:,} | {t.code_lines} | {t.source_lines} | "
                    f"{t.reading_minutes} min | {t.exercises} | {t.exercise_minutes} min | "
                    f"{_h_mm(total)} |")
    rows += ["", f"Reading: prose at {rt.WORDS_PER_MINUTE} words a minute, the lesson's own code "
                 f"at {rt.CODE_LINES_PER_MINUTE} lines a minute, printed library and kernel "
                 f"source at {rt.SOURCE_LINES_PER_MINUTE}; exercises: "
                 f"{rt.EXERCISE_BASE_MINUTES} minutes each plus "
                 f"{rt.EXERCISE_MINUTES_PER_LINE} a line of solution "
                 f"(`course_lib.authoring.reading_time`, which also writes each lesson's header)."]
    return "\n".join(rows)


def exercises_table() -> str:
    """Instructors: each lesson's checked exercises with their difficulty."""
    rows = ["| lesson | exercise (`check` id) | what the learner writes | solution lines | difficulty |",
            "| --- | --- | --- | --- | --- |"]
    for stem in lesson_stems():
        for i, ex in enumerate(exercises(stem)):
            rows.append(f"| {title(stem) if i == 0 else ''} | `{ex['id']}` | {ex['title']} | "
                        f"{ex['solution_lines']} | {ex['difficulty']} |")
        if not exercises(stem):
            rows.append(f"| {title(stem)} | - | (no solution notebook yet) | - | - |")
    return "\n".join(rows)


# ---- the agendas -----------------------------------------------------------------------------
# A room's pace, from the same rule as the lesson headers: the instructor walks through a lesson
# live in a third of its reading time (they read it aloud and skip what the room does not need
# in full, e.g. the printed kernel source), then the room does the exercises named here, each
# in the time the rule gives it. A block is rounded up to 5 minutes. The instructor chooses the
# exercises; the clock follows from them.
WALKTHROUGH_FRACTION = 3          # walk-through = reading time / 3
ROUND_TO = 5                      # minutes
# (kind, what, exercises done in the room | minutes)
AGENDAS: dict[str, list[tuple]] = {
    "half_day": [
        ("fixed", "Welcome; everyone runs `make lab` and opens lesson 00 (fix stragglers now, in pairs)", 10),
        ("lesson", "00_the_bill", ["00.weight_gb", "00.decode_floor_ms"]),
        ("lesson", "01_number_formats", ["01.bf16_bits"]),
        ("lesson", "02_absmax_and_zero_points", ["02.absmax_quantize", "02.dequantize"]),
        ("break", "break (lesson 04 peaks at about 4 GiB: on 8 GB laptops start its Run All now, a few at a time; on a shared server stagger it by rows)", 15),
        ("lesson", "03_outliers_and_block_scales", ["03.groupwise_quantize", "03.remove_outliers"]),
        ("lesson", "04_a_real_model", ["04.kl_top1"]),
        ("fixed", "Wrap-up: what GPTQ, AWQ and W8A8 add (lessons 06-08 as a demo), lesson 12's "
                  "decision guide, lesson 13's SmolLM2 in llama.cpp on the instructor's machine "
                  "(engine built beforehand with `make engine`)", 15),
    ],
    "day_1": [
        ("fixed", "Welcome and setup check", 10),
        ("lesson", "00_the_bill", ["00.weight_gb", "00.conversations_that_fit"]),
        ("lesson", "01_number_formats", ["01.decode_e4m3"]),
        ("lesson", "02_absmax_and_zero_points", ["02.absmax_quantize", "02.zero_point"]),
        ("break", "break", 15),
        ("lesson", "03_outliers_and_block_scales", ["03.groupwise_quantize", "03.mxfp4_block"]),
        ("lesson", "04_a_real_model", ["04.kl_top1"]),
        ("break", "lunch", 45),
        ("lesson", "05_llm_int8", ["05.outlier_columns"]),
        ("lesson", "06_gptq", ["06.hessian", "06.gptq_loop"]),
        ("break", "break", 15),
        ("lesson", "07_awq", ["07.scales"]),
    ],
    "day_2": [
        ("fixed", "Recap of day 1; everyone checks the engine is installed (`make preflight`; built at home with `make engine`, or from the USB stick with `make engine ENGINE_WHEELS=<folder>`: lessons 13-14 need it)", 10),
        ("lesson", "08_smoothquant_w8a8", ["08.smoothing_factors", "08.fold_scales"]),
        ("lesson", "09_kernels", ["09.unpack_int4_bits"]),
        ("break", "break", 15),
        ("lesson", "10_measure_decode_speed", ["10.layer_floor_ms"]),
        ("lesson", "11_kv_cache", ["11.kivi_bytes"]),
        ("break", "lunch", 45),
        ("lesson", "12_validate_and_choose", ["12.mistakes_quiz"]),
        ("lesson", "13_ship_it", ["13.pack_q4_0"]),
        ("break", "break", 15),
        ("lesson", "14_k_quants", ["14.importance"]),
        ("lesson", "15_quantization_aware_training", ["15.ste"]),
        ("lesson", "16_rotations", ["16.hadamard_12k"]),
        ("lesson", "17_your_own_model", ["17.count_parameters"]),
    ],
}
AGENDA_TITLES = {"half_day": "Half day: from the bill to a real model",
                 "day_1": "Two days, day 1: formats to GPTQ and AWQ",
                 "day_2": "Two days, day 2: W8A8, kernels, the KV cache, shipping, below 4 bits, rotations, your own model"}


def walkthrough_minutes(stem: str) -> int:
    """A lesson's live walk-through: its reading time by the rule / WALKTHROUGH_FRACTION, rounded up."""
    from course_lib.authoring import reading_time as rt
    return -(-rt.lesson_time(stem).reading_minutes // WALKTHROUGH_FRACTION)


def _round_up(minutes: float) -> int:
    return -(-int(round(minutes)) // ROUND_TO) * ROUND_TO


def agenda_blocks(name: str) -> list[dict]:
    """One agenda's blocks with their minutes by the rule: start, what, exercises, minutes."""
    from course_lib.authoring import reading_time as rt
    blocks, clock = [], 0
    for kind, what, extra in AGENDAS[name]:
        if kind != "lesson":
            blocks.append({"start": clock, "what": what, "exercises": [], "minutes": extra,
                           "walkthrough": None, "work": None})
            clock += extra
            continue
        known = {e["id"]: e for e in exercises(what)}
        missing = [x for x in extra if x not in known]
        if missing:
            raise ValueError(f"agenda {name!r}: {missing} are not exercises of {what} "
                             f"(its exercises: {sorted(known)})")
        walk = walkthrough_minutes(what)
        work = sum(rt.one_exercise_minutes(known[x]["solution_lines"]) for x in extra)
        minutes = _round_up(walk + work)
        blocks.append({"start": clock, "what": title(what), "exercises": list(extra),
                       "minutes": minutes, "walkthrough": walk, "work": work})
        clock += minutes
    blocks.append({"start": clock, "what": "end", "exercises": [], "minutes": 0,
                   "walkthrough": None, "work": None})
    return blocks


def _h_mm(minutes: int) -> str:
    """A duration: 435 -> '7 h 15'."""
    return f"{minutes // 60} h {minutes % 60:02d}"


def _hm(minutes: int) -> str:
    return f"{minutes // 60}:{minutes % 60:02d}"


def agenda_table(name: str) -> str:
    """Instructors: one agenda, its clock computed from the reading-time rule."""
    blocks = agenda_blocks(name)
    total = blocks[-1]["start"]
    lessons = [b for b in blocks if b["walkthrough"] is not None]
    rows = [f"**{AGENDA_TITLES[name]}**: {_h_mm(total)}, "
            f"{len(lessons)} lessons.", "",
            "| time | block | exercises in the room | minutes: walk-through + exercises -> block |",
            "| --- | --- | --- | --- |"]
    for b in blocks:
        if b["walkthrough"] is None:
            rows.append(f"| {_hm(b['start'])} | {b['what']} | | {b['minutes'] or ''} |")
        else:
            rows.append(f"| {_hm(b['start'])} | **{b['what']}** | "
                        + ", ".join(f"`{x}`" for x in b["exercises"])
                        + f" | {b['walkthrough']} + {b['work']} -> {b['minutes']} |")
    return "\n".join(rows)


def agendas_rule() -> str:
    from course_lib.authoring import reading_time as rt
    return (f"Each lesson block: a live walk-through in 1/{WALKTHROUGH_FRACTION} of the "
            f"lesson's reading time (rounded up), then the exercises named, each at its time by the rule "
            f"({rt.EXERCISE_BASE_MINUTES} minutes plus {rt.EXERCISE_MINUTES_PER_LINE} a line "
            f"of solution); the sum rounded up to {ROUND_TO} minutes. The other exercises are "
            "homework.")


def course_in_a_room() -> str:
    """Instructors: what the whole course takes a room by the agendas' rule (why two days)."""
    from course_lib.authoring import reading_time as rt
    walk = shortest = 0
    for stem in lesson_stems():
        if not (ROOT / "notebooks" / f"{stem}.ipynb").exists():
            continue
        walk += walkthrough_minutes(stem)
        shortest += min((rt.one_exercise_minutes(e["solution_lines"]) for e in exercises(stem)),
                        default=0)
    return (f"By this rule the whole course's walk-throughs take {_h_mm(walk)}, "
            f"and its shortest exercise in each lesson {_h_mm(shortest)} "
            f"more: {_h_mm(walk + shortest)} before a break, "
            "more than one day a room can keep.")


GPU_SCHEMES = ("w8a16", "w4a16 g128", "fp8 w8a8", "int8 w8a8")


def gpu_table() -> str:
    """Instructors: the course's kernels against BF16 on each GPU measured (results/bench_cuda_*)."""
    parts = []
    for path in sorted((ROOT / "results").glob("bench_cuda_*.json")):
        d = json.loads(path.read_text())
        v = d["versions"]
        parts += [f"**{d['device']['name']}** (`{path.relative_to(ROOT)}`, "
                  f"{d['created_utc'][:10]}, torch {v['torch']}, Triton {v['triton']}"
                  f"{', quick run' if d.get('quick') else ''}; read bandwidth measured "
                  f"{d['read_bandwidth_gbps']:,.0f} GB/s). Speed-up over BF16 "
                  "(above 1 is faster), BF16 time in µs:", "",
                  "| layer (K x N) | batch M | BF16 µs | " + " | ".join(GPU_SCHEMES) + " |",
                  "| --- | --- | --- | " + " | ".join("---" for _ in GPU_SCHEMES) + " |"]
        for layer in d["layers"]:
            r = layer["results"]
            parts.append(f"| {layer['layer']} ({layer['K']} x {layer['N']}) | {layer['M']} | "
                         f"{r['bf16']['ms'] * 1e3:,.1f} | "
                         + " | ".join(f"{r[s]['ratio_vs_baseline']:.2f}" if s in r else "-"
                                      for s in GPU_SCHEMES) + " |")
        dec = d.get("decode", {}).get("results", {})
        if dec:
            parts.append("| decode step, 8 Llama-8B layers | 1 | "
                         f"{dec['bf16']['ms_per_step'] * 1e3:,.0f} | "
                         + " | ".join(f"{dec[s]['ratio_vs_baseline']:.2f}" if s in dec else "-"
                                      for s in GPU_SCHEMES) + " |")
        parts.append("")
    return "\n".join(parts).strip() or "_No GPU benchmark in results/ yet._"


# ---- the documents ---------------------------------------------------------------------------

def sections(times: dict | None) -> dict[str, dict[str, str]]:
    """Each document's generated tables, by name."""
    return {"instructors": {"study": study_table(), "times": times_table(times),
                            "exercises": exercises_table(), "gpu": gpu_table(),
                            **{f"agenda_{name}": agenda_table(name) for name in AGENDAS},
                            "agenda_rule": agendas_rule(), "agenda_course": course_in_a_room()},
            "readme": {"lessons": lessons_table(times)}}


def fill(text: str, tables: dict[str, str], where: str = "") -> str:
    """Replace each generated block of ``text`` with its table; refuse a missing marker."""
    for name, table in tables.items():
        pattern = re.compile(rf"(<!-- BEGIN GENERATED: {name} -->\n)(?:.*?\n)?(<!-- END GENERATED: {name} -->)",
                             re.S)
        if not pattern.search(text):
            raise ValueError(f"{where}: no '<!-- BEGIN GENERATED: {name} -->' ... "
                             f"'<!-- END GENERATED: {name} -->' block to fill")
        text = pattern.sub(lambda m: m.group(1) + table + "\n" + m.group(2), text)
    return text


def stale_documents(times: dict | None = None) -> list[str]:
    """The documents whose generated tables differ from what the records say now."""
    times = load_times() if times is None else times
    out = []
    for doc, tables in sections(times).items():
        text = DOCS[doc].read_text()
        if fill(text, tables, str(DOCS[doc])) != text:
            out.append(str(DOCS[doc].relative_to(ROOT)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("times", help="timer log -> results/notebook_times.json")
    t.add_argument("--log", type=Path, required=True)
    t.add_argument("--note", default="")
    d = sub.add_parser("doc", help="rewrite the generated tables")
    d.add_argument("--check", action="store_true", help="exit 1 if a table is stale")
    args = parser.parse_args(argv)
    if args.cmd == "times":
        record = times_from_log(args.log, args.note)
        TIMES.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        print(f"{len(record['notebooks'])} notebooks -> {TIMES.relative_to(ROOT)}")
        return 0
    if args.check:
        stale = stale_documents()
        if stale:
            print(f"stale: {stale}; run python -m course_lib.authoring.workshop doc")
        return 1 if stale else 0
    times = load_times()
    for doc, tables in sections(times).items():
        DOCS[doc].write_text(fill(DOCS[doc].read_text(), tables, str(DOCS[doc])))
        print(f"wrote {DOCS[doc].relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
