"""The commands that write ``results/`` live in ``course_lib/experiments/``, apart from what a
learner reads (issue 39): the readers they were split from keep no writer, no command and no
file write; nothing a lesson runs imports a writer; no text in the course still names a command
by its old module; and every command answers ``--help``.

``tests/test_imports.py`` puts ``course_lib.experiments`` above every reader (no module of the
library below it may import it); this file covers what the layers cannot see: a writer left
behind in its old module, and the notebooks, which no layer holds. The committed
``results/*.json`` keep the command they were written with (``qat_*.json`` say
``python -m course_lib.qat_tables``): records of what ran, not instructions, so they are not
read here.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: reader module -> the names that moved to its writer in course_lib/experiments/
MOVED = {
    "course_lib/methods/table.py": {          # -> experiments/methods_table.py
        "write_table", "general_case", "earlier_machine", "_check_protocol", "_protocol_record",
        "_find_or_none", "_write", "main", "_parse_option", "PROTOCOL_KEYS", "MACHINE_KEYS"},
    "course_lib/kmix_table.py": {             # -> experiments/kmix_table.py
        "write_table", "_load_note", "_mix_counts", "main"},
    "course_lib/sensitivity.py": {"write", "main"},   # -> experiments/sensitivity_scan.py
    "course_lib/rotation_table.py": {                  # -> experiments/rotation_table.py
        "write_table", "_general_case", "_protocol_record", "_write", "main", "COMMAND"},
    "course_lib/qat.py": {                    # experiments/qat_tables.py, moved whole
        "write_bundled", "write_smollm2", "rerun_exports", "export_check", "main"},
}
WRITERS = {"methods_table": "methods_table.py", "kmix_table": "kmix_table.py",
           "sensitivity_scan": "sensitivity_scan.py", "qat_tables": "qat_tables.py",
           "rotation_table": "rotation_table.py", "spinquant_full": "spinquant_full.py"}
#: the old commands; results/ is not searched (see the module docstring)
OLD_COMMAND = re.compile(
    r"-m\s+course_lib\.(?:methods\.table|kmix_table|qat_tables|sensitivity)\b"
    r"|course_lib\.(?:methods\.table|kmix_table|sensitivity)\s+(?:--|scan\b)"
    r"|\bcourse_lib\.qat_tables\b")


def _defined(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _writes(tree: ast.Module) -> list[str]:
    """Calls that write a file: ``.write_text``, ``.write_bytes``, ``json.dump``, ``np.save*``,
    ``torch.save``, ``open(..., "w")``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name in ("write_text", "write_bytes", "dump", "save", "savez", "savez_compressed"):
            found.append(f"{name}() at line {node.lineno}")
        elif name == "open" and any(isinstance(a, ast.Constant) and isinstance(a.value, str)
                                    and set(a.value) & set("wax") for a in node.args[1:2]):
            found.append(f"open(..., 'w') at line {node.lineno}")
    return found


@pytest.mark.parametrize("module", sorted(MOVED))
def test_a_reader_keeps_no_writer(module):
    src = (ROOT / module).read_text(encoding="utf-8")
    tree = ast.parse(src)
    left = sorted(MOVED[module] & _defined(tree))
    assert not left, f"{module} still defines {left}: they live in course_lib/experiments/"
    assert not _writes(tree), f"{module} writes a file: {_writes(tree)}"
    assert "__main__" not in src, f"{module} is a command again: commands live in experiments/"


def test_the_old_command_module_is_gone():
    assert not (ROOT / "course_lib" / "qat_tables.py").exists()


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_each_writer_is_in_experiments_and_writes(name):
    path = ROOT / "course_lib" / "experiments" / WRITERS[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert "main" in _defined(tree) and _writes(tree), f"{path} should be a command that writes"


def test_no_library_module_below_the_experiments_imports_one():
    """The layers say so (tests/test_imports.py); stated here by name."""
    import test_imports as layers
    rank = layers.layer_of("course_lib.experiments")
    bad = [(m, d) for m, deps in layers.graph().items() for d in deps
           if d.startswith("course_lib.experiments") and layers.layer_of(m) < rank]
    assert not bad, f"modules below course_lib.experiments import it: {bad}"


def _notebooks():
    return sorted(p for d in ("notebooks", "solutions", "exercises")
                  for p in (ROOT / d).glob("*.ipynb"))


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_notebook_imports_a_writer(path):
    """A lesson reads the committed files; running an experiment is a command, not a cell."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        src = "\n".join(line for line in "".join(cell["source"]).splitlines()
                        if not line.lstrip().startswith(("%", "!")))       # IPython magics
        for node in ast.walk(ast.parse(src)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [f"{node.module}.{a.name}" for a in node.names] \
                if isinstance(node, ast.ImportFrom) and node.module else []
            bad = [n for n in names if n.startswith("course_lib.experiments")]
            assert not bad, f"{path.name} cell {i} imports {bad}"


def _texts():
    files = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").rglob("*.md"))]
    for package in ("course_lib", "kernels", "tools", "tests"):
        files += sorted((ROOT / package).rglob("*.py"))
    return [p for p in files if p.resolve() != Path(__file__).resolve()] + _notebooks()


def test_no_text_names_an_old_command():
    stale = []
    for path in _texts():
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".ipynb":               # a command may break across two lines
            text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
        for m in OLD_COMMAND.finditer(text):
            stale.append(f"{path.relative_to(ROOT)}: {m.group(0)!r}")
    assert not stale, "old commands (now python -m course_lib.experiments.<module>):\n" + \
        "\n".join(stale)


def test_the_pattern_finds_the_old_commands():
    for old in ("python -m course_lib.methods.table --model bundled", "python -m\n"
                "course_lib.methods.table --model smollm2", "python -m course_lib.kmix_table",
                "python -m course_lib.sensitivity scan", "course_lib.qat_tables --model x",
                "from course_lib import qat_tables"):
        assert OLD_COMMAND.search(old.replace("from course_lib import qat_tables",
                                              "course_lib.qat_tables")), old
    for new in ("python -m course_lib.experiments.methods_table --model bundled",
                "python -m course_lib.experiments.sensitivity_scan scan",
                "course_lib.experiments.qat_tables", "course_lib.methods.table.load_table",
                "from course_lib import sensitivity", "course_lib.sensitivity.scan"):
        assert not OLD_COMMAND.search(new), new


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_each_command_answers_help(name, capsys):
    import importlib
    module = importlib.import_module(f"course_lib.experiments.{name}")
    with pytest.raises(SystemExit) as stop:
        module.main(["--help"])
    assert stop.value.code == 0
    assert f"python -m course_lib.experiments.{name}" in capsys.readouterr().out


def test_the_scan_writer_runs_the_readers_scan_and_records_the_machine(tmp_path, monkeypatch):
    """The writer reaches the algorithm through course_lib.sensitivity (one source for it)."""
    from course_lib import sensitivity
    from course_lib.experiments import sensitivity_scan
    seen = {}
    monkeypatch.setattr(sensitivity, "scan", lambda **kw: seen.update(kw) or
                        {"protocol": {"name": "clean"}, "seconds": 0.0, "rows": []})
    out = sensitivity_scan.write(tmp_path / "scan.json", n_windows=1, window=32)
    assert seen == {"n_windows": 1, "window": 32}
    saved = json.loads((tmp_path / "scan.json").read_text())
    assert saved == out and saved["machine"]["cpu"] and "load average" in saved["note"]
    assert sensitivity.load_scan(tmp_path / "scan.json") == saved       # the reader reads it
