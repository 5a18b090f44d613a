"""How far do the course's live numbers move from one CPU to another?

A number downstream of a rounding decision (GPTQ's error feedback, INT8/FP8 codes of
activations, AWQ's grid search, perplexity after a quantized KV cache) depends on the order in
which a BLAS kernel adds things up, and that order changes with the CPU, its vector width, the
BLAS build and the thread count. A learner's laptop is never the machine that wrote
``results/``. This tool measures that spread on one machine by making it dispatch like others:

    python tools/cpu_spread.py                    # every probe, every setting -> results/cpu_spread.json
    python tools/cpu_spread.py --probes 06 08     # some probes (merged into the existing file)
    python tools/cpu_spread.py --settings base avx2  # some settings
    python tools/cpu_spread.py --show             # print the committed file's table

A *probe* runs a lesson notebook's own cells (asserts removed, so a value outside today's band
is recorded instead of stopping the run) in a fresh Jupyter kernel, up to the cells that compare
a live number with a committed one, and reads those numbers back. A *setting* is the environment
that kernel starts in: torch threads (``OMP_NUM_THREADS``), torch's vectorized kernels
(``ATEN_CPU_CAPABILITY``) and MKL's code path (``MKL_ENABLE_INSTRUCTIONS``).

For every quantity the file stores the live value under each setting, the committed value the
lesson compares it with, the spread between settings and the largest deviation from the committed
value. ``course_lib.spread`` holds the tolerance each lesson uses; ``tests/test_spread.py`` checks
that each is at least 3x the largest deviation stored here.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "cpu_spread.json"
MARK = "__CPU_SPREAD__"

# name -> environment that stands for another machine. "base" is this machine as it is.
SETTINGS = {
    "base": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx2_threads1": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                      "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    "threads1": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    "aten_default": {"ATEN_CPU_CAPABILITY": "default"},
    "mkl_sse42": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "aten_avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "mkl_avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}
SETTING_VARS = {k for env in SETTINGS.values() for k in env}   # cleared before each setting's own


@dataclass(frozen=True)
class Capture:
    """After code cell ``cell`` (0-based, code cells only, the hosted setup cell not counted) evaluate ``expr``: a dict of
    quantity name -> [live value, committed value]. A committed value of None marks a live
    number the lesson compares with a constant (course_lib.spread.BOUNDS)."""
    cell: int
    expr: str


@dataclass(frozen=True)
class Probe:
    notebook: str
    captures: tuple[Capture, ...]
    prelude: str = ""          # code run first in the kernel (e.g. to take a lesson's other branch)


# The quantity names are the keys of course_lib.spread.TOLERANCES.
PROBES = {
    "04": Probe("notebooks/04_a_real_model.ipynb", (
        Capture(11, '{"04 bundled W8 per-channel top-1": [by["W8 per-channel"]["top1_agreement"], None]}'),
        Capture(12, '{"04 bundled |W4 g128 - W4 per-channel| top-1": '
                    '[abs(w4g128["top1_agreement"] - w4pc["top1_agreement"]), None]}'),
        Capture(13, '{"04 bundled INT3 task drop / standard error": [abs(task_drop) / task_se, None]}'),
        Capture(22, '{"04 SmolLM2 reference perplexity": [sref.perplexity, '
                    'RTN["slice"]["reference_perplexity"]]}'),
        Capture(24, '{f"04 SmolLM2 {r[\'variant\']} {k}": [live[r["variant"]][k], r[k]] '
                    'for r in RTN["slice"]["rows"][1:] for k in ("perplexity", "kl_nats")}'),
    )),
    "05": Probe("notebooks/05_llm_int8.ipynb", (
        Capture(5, '{"05 bundled columns >= 6.0, all layers": [sum(r["n_columns"] for r in report), '
                   'sum(r["n_columns"] for r in saved["report"] if r["layer"] in acts)]}'),
    )),
    "06": Probe("notebooks/06_gptq.ipynb", (
        Capture(14, '{f"06 bundled {m} KL": [live[m]["kl_nats"], table.find(sl["rows"], m, '
                    'sl["bits"], sl["group_size"])["kl_nats"]] for m in live}'),
        Capture(16, '{f"06 SmolLM2 {m} KL": [sm_live[m]["kl_nats"], table.find(ssl["rows"], m, '
                    'ssl["bits"], ssl["group_size"])["kl_nats"]] for m in sm_live}'),
    )),
    "07": Probe("notebooks/07_awq.ipynb", (
        Capture(8, '{f"07 bundled {m} KL": [live[m]["kl_nats"], table.find(sl["rows"], m, '
                   'sl["bits"], sl["group_size"])["kl_nats"]] for m in live}'),
        Capture(13, '{f"07 SmolLM2 {m} KL": [sm_live[m]["kl_nats"], table.find(ssl["rows"], m, '
                    'ssl["bits"], ssl["group_size"])["kl_nats"]] for m in sm_live}'),
    )),
    "08": Probe("notebooks/08_smoothquant_w8a8.ipynb", (
        Capture(7, '{"08 bundled reference bits per byte": [ref.bits_per_byte, '
                   'saved["reference_bits_per_byte"]], '
                   '**{f"08 {r[\'variant\']} KL": [r["kl_nats"], by[r["variant"]]["kl_nats"]] '
                   'for r in live}}'),
    )),
    "11": Probe("notebooks/11_kv_cache.ipynb", (
        Capture(16, '{f"11 {f} {k}": [rows[f][0][k], stored["live"]["scores"][f][k]] '
                    'for f in kv.LIVE_FORMATS for k in ("ppl", "kl")}'),
    )),
    "12": Probe("notebooks/12_validate_and_choose.ipynb", (
        Capture(12, '({"12 SmolLM2 W4 g32 perplexity": [live["perplexity"], slice_w4["perplexity"]], '
                    '"12 SmolLM2 W4 g32 KL": [live["kl_nats"], slice_w4["kl_nats"]]} if HAVE_SMOLLM '
                    'else {"12 bundled W3 g128 RTN KL": [live["kl_nats"], stored["kl_nats"]]})'),
    )),
    # lesson 12 on a machine without SmolLM2: it recomputes the bundled model's row instead
    "12b": Probe("notebooks/12_validate_and_choose.ipynb", (
        Capture(12, '({"12 bundled W3 g128 RTN KL": [live["kl_nats"], stored["kl_nats"]]} '
                    'if not HAVE_SMOLLM else {})'),
    ), prelude="import course_lib.smollm as _sm\n_sm.available = lambda: False"),
    # solutions: live numbers against live numbers, with a margin
    "s05": Probe("solutions/05_llm_int8.ipynb", (
        Capture(8, '{"05 solution KL, decomposition / INT8 everywhere": '
                   '[r_mine["kl_nats"] / r_plain["kl_nats"], None]}'),
    )),
    "s06": Probe("solutions/06_gptq.ipynb", (
        Capture(9, '{"06 solution |your GPTQ - library| / library KL": '
                   '[abs(mine_kl - lib_kl) / lib_kl, None], '
                   '"06 solution your GPTQ / round-to-nearest KL": '
                   '[mine_kl / kl["round-to-nearest"], None]}'),
    )),
    "13": Probe("notebooks/13_ship_it.ipynb", (
        Capture(6, '({"13 engine F16 |perplexity / course reference - 1|": '
                   '[abs(ppl["F16"]["perplexity"] / ref.perplexity - 1), None], '
                   '"13 engine KL, Q4_0 GPTQ / Q4_0 RTN": '
                   '[ppl["Q4_0 GPTQ"]["kl_nats"] / ppl["Q4_0 RTN"]["kl_nats"], None]} '
                   'if HAVE_ENGINE else {})'),
    )),
    "14": Probe("notebooks/14_k_quants.ipynb", (
        Capture(17, '{f"14 SmolLM2 blk.{layer}.{kind} KL": [live_kl[layer, kind], '
                    'committed[f"blk.{layer}.{kind}.weight"]["kl_nats"][0]] '
                    'for layer, kind in live_kl}'),
        Capture(21, '({"14 engine course mix KL": [sc["kl_nats"], committed]} '
                    'if HAVE_ENGINE else {})'),
    )),
}


class _NoAsserts(ast.NodeTransformer):
    def visit_Assert(self, node):  # noqa: N802 (ast's naming)
        return ast.copy_location(ast.Pass(), node)


def without_asserts(source: str) -> str:
    """The cell's code with every ``assert`` replaced by ``pass`` (comments are lost)."""
    tree = _NoAsserts().visit(ast.parse(source))
    return ast.unparse(ast.fix_missing_locations(tree))


def run_probe(key: str) -> dict:
    """Run one probe in a fresh kernel in this process's environment; return its quantities."""
    import nbformat
    from nbclient import NotebookClient

    probe = PROBES[key]
    nb = nbformat.read(ROOT / probe.notebook, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"      # the lesson's own code cells:
            and "course-setup" not in c.metadata.get("tags", [])]   # not the hosted setup cell
    last = max(c.cell for c in probe.captures)
    by_cell = {c.cell: c for c in probe.captures}
    # the lessons' band checks record instead of stopping, like the asserts removed below
    cells = [nbformat.v4.new_code_cell(
        "import course_lib.spread as _spread\n_spread.check = lambda name, live, committed: 0.0\n"
        + probe.prelude)]
    for i, cell in enumerate(code[:last + 1]):
        cells.append(nbformat.v4.new_code_cell(without_asserts(cell.source)))
        if i in by_cell:
            cells.append(nbformat.v4.new_code_cell(
                f"import json as _j\nprint({MARK!r} + _j.dumps({by_cell[i].expr}))"))
    run = nbformat.v4.new_notebook(cells=cells, metadata=nb.metadata)
    NotebookClient(run, timeout=500, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / Path(probe.notebook).parent)}}).execute()
    found = {}
    for cell in run.cells:
        for out in cell.get("outputs", []):
            for line in out.get("text", "").splitlines():
                if line.startswith(MARK):
                    found.update(json.loads(line[len(MARK):]))
    return found


def _kill_tree(pid: int) -> None:
    """Kill a process and everything it started (its Jupyter kernel included)."""
    import psutil

    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    for p in parent.children(recursive=True) + [parent]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _child(key: str, setting: str, timeout: float = 600, tries: int = 2) -> dict:
    """Run ``run_probe`` in a subprocess started with the setting's environment. A kernel that
    stops answering (seen once in ~40 runs on a loaded machine) is killed and the probe retried."""
    env = {k: v for k, v in os.environ.items() if k not in SETTING_VARS}
    env.update(SETTINGS[setting])
    env.setdefault("COURSE_CHECKS", "solutions")
    env["COURSE_PROGRESS_FILE"] = str(Path(tempfile.gettempdir()) / "cpu_spread_progress.json")
    env.setdefault("MPLBACKEND", "Agg")
    for attempt in range(1, tries + 1):
        with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
            code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'tools')!r}); "
                    f"import cpu_spread; "
                    f"json.dump(cpu_spread.run_probe({key!r}), open({out.name!r}, 'w'))")
            proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT)
            try:
                if proc.wait(timeout=timeout) == 0:
                    return json.load(open(out.name))
                print(f"  attempt {attempt} failed: exit {proc.returncode}", flush=True)
            except subprocess.TimeoutExpired:
                print(f"  attempt {attempt}: no answer in {timeout:.0f} s, killed", flush=True)
                _kill_tree(proc.pid)
    raise RuntimeError(f"probe {key} under {setting} failed {tries} times")


def summarize(values: dict[str, float], committed: float | None) -> dict:
    """Spread between settings and the largest deviation from the committed value (relative)."""
    vals = list(values.values())
    lo, hi = min(vals), max(vals)
    ref = values.get("base", vals[0])
    out = {"values": values, "committed": committed, "spread_abs": hi - lo,
           "spread_rel": (hi - lo) / abs(ref) if ref else 0.0}
    if committed:
        out["max_dev_from_committed_rel"] = max(abs(v - committed) for v in vals) / abs(committed)
    return out


def measure(probes: list[str], settings: list[str], path: Path = OUT, log=print) -> dict:
    """Each probe under each setting, the file updated after every run (a crash keeps the rest)."""
    data = {}
    for key in probes:
        for s in settings:
            t0 = time.perf_counter()
            log(f"probe {key} ({PROBES[key].notebook}) under {s} {SETTINGS[s] or '(as it is)'}",
                flush=True)
            found = _child(key, s)
            seconds = round(time.perf_counter() - t0, 1)
            log(f"  {seconds} s: " + ", ".join(f"{n} {v[0]:.6g}" for n, v in found.items()), flush=True)
            data = save(s, found, {f"{key}/{s}": seconds}, path)
    return data


def save(setting: str, found: dict, seconds: dict, path: Path = OUT) -> dict:
    """Merge one run's quantities ({name: [live, committed]}) under ``setting`` into the file."""
    sys.path.insert(0, str(ROOT))
    from course_lib import device

    old = json.loads(path.read_text()) if path.exists() else {}
    machine = device.machine_record()
    runs = old.get("runs", {})
    run = runs.setdefault(machine["cpu"], {"machine": machine, "quantities": {}, "seconds": {}})
    run["machine"] = machine
    for name, (live, committed) in found.items():
        prev = run["quantities"].get(name, {}).get("values", {})
        run["quantities"][name] = summarize({**prev, setting: live}, committed)
    run["seconds"].update(seconds)
    out = {"what": "live numbers the lessons compare with committed ones, recomputed under settings "
                   "that make this machine dispatch like others (tools/cpu_spread.py)",
           "settings": SETTINGS, "runs": runs}
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out


def show(data: dict) -> None:
    for cpu, run in data["runs"].items():
        print(f"== {cpu} (torch {run['machine']['torch']}, {run['machine']['blas'][:40]})")
        print(f"{'quantity':70s} {'committed':>10s} {'min':>10s} {'max':>10s} {'spread':>7s} {'vs comm.':>8s}")
        for name, q in sorted(run["quantities"].items()):
            v = list(q["values"].values())
            dev = q.get("max_dev_from_committed_rel")
            print(f"{name[:70]:70s} {q['committed'] or 0:10.5g} {min(v):10.5g} {max(v):10.5g} "
                  f"{q['spread_rel']:7.2%} {'' if dev is None else f'{dev:8.2%}'}")


DOC = ROOT / "docs" / "cpu_dispatch.md"
BEGIN, END = "<!-- BEGIN GENERATED: cpu_spread -->", "<!-- END GENERATED: cpu_spread -->"


def markdown_table(data: dict) -> str:
    """The doc's table: per machine and quantity, committed, min-max over settings, spread
    between settings, largest deviation from the committed value, and the band the lesson uses."""
    sys.path.insert(0, str(ROOT))
    from course_lib import spread

    lines = []
    for cpu, run in data["runs"].items():
        m = run["machine"]
        lines += [f"**{cpu}** ({m['arch']}, {', '.join(m['isa_flags'])}; torch {m['torch']}, "
                  f"{m['blas'].split(' (')[0]}, torch CPU capability {m['torch_cpu_capability']}, "
                  f"{m['logical_cpus']} CPUs). Settings (the environment of each run, tools/cpu_spread.py): "
                  f"{', '.join(sorted(data['settings']))}; the count in brackets says how many "
                  "a quantity was run under (3 = base, avx2 and aten_default).", "",
                  "| quantity | class | committed | live, min - max (settings) | spread between "
                  "settings | largest deviation from committed | band (or bound) |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for name, q in sorted(run["quantities"].items()):
            v = list(q["values"].values())
            if name in spread.BANDS:
                b = spread.BANDS[name]
                cls, lim = b.kind, f"{b.rel:.2%}" + (f" + {b.abs_:g}" if b.abs_ else "")
            else:
                op, bound = spread.BOUNDS.get(name, ("?", float("nan")))
                cls, lim = "vs a constant", f"{op} {bound:g}"
            dev = q.get("max_dev_from_committed_rel")
            comm = "-" if q["committed"] is None else f"{q['committed']:.5g}"
            dev_txt = "-" if dev is None else f"{dev:.2%}"
            spread_txt = (f"{q['spread_rel']:.2%}" if name in spread.BANDS
                          else f"{q.get('spread_abs', max(v) - min(v)):.3g} (absolute)")
            lines.append(f"| {name.replace('|', chr(92) + '|')} | {cls} | {comm} "
                         f"| {min(v):.5g} - {max(v):.5g} ({len(v)}) | {spread_txt} | {dev_txt} | {lim} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_doc(data: dict, path: Path = DOC) -> None:
    text = path.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{markdown_table(data)}{END}{tail}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--probes", nargs="*", default=list(PROBES), choices=list(PROBES))
    p.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--show", action="store_true", help="print the stored table and stop")
    p.add_argument("--doc", action="store_true",
                   help="rewrite docs/cpu_dispatch.md's generated table from the stored file")
    a = p.parse_args(argv)
    if a.show or a.doc:
        data = json.loads(a.out.read_text())
        show(data)
        if a.doc:
            write_doc(data)
        return 0
    show(measure(a.probes, a.settings, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
