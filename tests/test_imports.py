"""The layers of course_lib/ and kernels/ (docs/architecture.md): imports only go down, no cycles.

Every module's imports are read from its source with ``ast``, function-level imports included
(a lazy import inside a function is still a dependency). A module may import modules of its own
layer or of a lower one; an import of a higher layer, or any cycle, fails here.

An import against the rule that must wait for another change can be listed in
``KNOWN_VIOLATIONS`` with what removes it: it is then reported as an expected failure (strict,
so the run fails once it is gone and its entry must be dropped); any other one fails.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("course_lib", "kernels")

# Bottom to top. A module belongs to the layer of the longest name equal to it or naming a
# package above it ("course_lib.methods" covers course_lib.methods.gptq); "course_lib" stands
# for the package's own __init__ only (course_lib.progress()), so a new module of course_lib
# must be given a layer. The same list, with what each layer holds and which lesson teaches
# each module, is docs/architecture.md.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("1 formats and quantizers", (
        "course_lib.paths", "course_lib.device", "course_lib.compare", "course_lib.spread",
        "course_lib.formats", "course_lib.quant",
        "course_lib.kquants",   # lesson 14
        "course_lib.hadamard")),   # lesson 16
    ("2 model, loaders and evaluation", (
        "course_lib.data", "course_lib.model", "course_lib.eval", "course_lib.protocol", "course_lib.qmodel",
        "course_lib.activations", "course_lib.gguf_model", "course_lib.smollm",
        "course_lib.kmix", "course_lib.imatrix",   # lesson 14
        "course_lib.train", "course_lib.validate", "course_lib.hardware",
        "course_lib.rotate", "course_lib.spinquant",   # lesson 16
        "course_lib.own_model",   # lesson 17
        "course_lib.preflight")),   # the pre-workshop check (make preflight)
    ("3 methods and the KV cache", (
        "course_lib.methods", "course_lib.kv", "course_lib.export",
        "course_lib.stream", "course_lib.quantize_own",   # lesson 17
        "course_lib.stream_gguf", "course_lib.own_kmix",  # lesson 17
        "course_lib.sensitivity", "course_lib.kmix_table",   # lesson 14
        "course_lib.rotation_table", "course_lib.export_rotated",   # lesson 16
        "course_lib.qat")),   # lesson 15
    ("4 timing and kernels", (
        "course_lib.bandwidth", "course_lib.bench", "kernels")),
    ("5 benchmarks", (
        "kernels.bench", "kernels.bench_layers", "kernels.bench_peers", "kernels.bench_decode",
        "kernels.bench_targets", "kernels.sweep_gemv", "kernels.compile_check", "kernels.pipes",
        "course_lib.guide", "course_lib.engine")),   # engine: lesson 13 (the engine branch)
    ("6 lessons' checks and widgets", (
        "course_lib.learner_progress", "course_lib.checks", "course_lib.widgets",
        "course_lib")),   # the package itself: course_lib.progress()
    # the commands that run the committed experiments and write results/ (issue 39): above
    # every reader, so no lesson's module, check or widget can import a writer
    ("7 the course's experiments", (
        "course_lib.experiments",)),
    ("8 the course's machinery", (
        "course_lib.authoring",)),
]

# Imports that break the rule but must wait for another change, {(importer, imported): what
# removes it}. Each is reported as an expected failure; when one is gone its test passes,
# which fails the run (strict): drop the entry. Any other upward import or cycle fails. None
# is left: llm_int8 <-> w8a8 went with methods/int8_common.py, the kernel files' imports of
# kernels.bench with Backend's move to kernels/_common.py (issue 21).
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {}


# ---- reading the imports ---------------------------------------------------------------------

def modules() -> dict[str, Path]:
    """Every module of the two packages: dotted name -> file."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The course modules ``module`` imports anywhere in its file: {module: first line}.
    ``from course_lib import data`` counts as importing ``course_lib.data``."""
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        if name.split(".")[0] in PACKAGES:
            while name not in known and "." in name:       # `import course_lib.x.attr`
                name = name.rpartition(".")[0]
            if name != module:
                found.setdefault(name, line)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else base, node.lineno)
    return found


def graph() -> dict[str, dict[str, int]]:
    known = modules()
    return {m: imports_of(m, p, known) for m, p in known.items()}


def layer_of(module: str) -> int:
    """The index of ``module``'s layer (0 = bottom); KeyError if no layer holds it."""
    best = None
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if module == name or (name != "course_lib" and module.startswith(name + ".")):
                if best is None or len(name) > len(best[1]):
                    best = (index, name)
    if best is None:
        raise KeyError(module)
    return best[0]


def cycles(edges: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def violations(edges: dict[str, dict[str, int]]) -> dict[tuple[str, str], str]:
    """Each import that breaks the rule, {(importer, imported): what is wrong, in words}: an
    import of a higher layer, or one of a module of its own layer in the same cycle (a cycle
    that crosses layers is reported by its upward import)."""
    out = {}
    for module, deps in sorted(edges.items()):
        for dep, line in sorted(deps.items()):
            if layer_of(dep) > layer_of(module):
                out[module, dep] = (f"{module} (layer {LAYERS[layer_of(module)][0]}) imports "
                                    f"{dep} (layer {LAYERS[layer_of(dep)][0]}) at line {line}")
    for cycle in cycles(edges):
        for module in sorted(cycle):
            for dep, line in sorted(edges[module].items()):
                if dep in cycle and layer_of(dep) >= layer_of(module):   # not the way down
                    out.setdefault((module, dep), f"{module} imports {dep} at line {line}, in "
                                                  f"the cycle {sorted(cycle)}")
    return out


# ---- the rules -------------------------------------------------------------------------------

def test_every_module_is_in_a_layer():
    missing = [m for m in modules() if _no_layer(m)]
    assert not missing, (f"{missing}: add each to a layer in tests/test_imports.py (LAYERS) and "
                         f"in docs/architecture.md")


def _no_layer(module: str) -> bool:
    try:
        layer_of(module)
    except KeyError:
        return True
    return False


def test_imports_only_go_down_and_never_in_a_circle():
    bad = [why for edge, why in violations(graph()).items() if edge not in KNOWN_VIOLATIONS]
    assert not bad, "imports that break the layers:\n" + "\n".join(bad)


@pytest.mark.parametrize("edge", [
    pytest.param(edge, id=f"{edge[0]}->{edge[1]}",
                 marks=pytest.mark.xfail(strict=True, reason=f"known: {why}"))
    for edge, why in KNOWN_VIOLATIONS.items()])
def test_known_violation_is_gone(edge):
    """An expected failure while the import is there; once it is gone this passes, and
    (strict) that fails the run: drop the entry from KNOWN_VIOLATIONS."""
    found = violations(graph())
    assert edge not in found, found.get(edge)


def test_the_architecture_page_names_every_module():
    """docs/architecture.md names each module (the lessons' checkers as one pattern)."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:course_lib|kernels)[\w.]*)`", page))
    wanted = [m for m in modules() if not re.fullmatch(r"course_lib\.checks\.lesson\d\d", m)]
    wanted += [n for _, names in LAYERS for n in names]
    missing = sorted({m for m in wanted if m not in named})
    assert not missing, f"docs/architecture.md does not name {missing}"
    assert "`course_lib.checks.lessonNN`" in page


# ---- the checker checks itself on small made-up graphs ------------------------------------------

def test_a_cycle_and_an_upward_import_are_found():
    edges = {"course_lib.quant": {"course_lib.model": 3},          # layer 1 -> layer 2: up
             "course_lib.model": {"course_lib.eval": 4},
             "course_lib.eval": {"course_lib.model": 9, "course_lib.formats": 2}}  # a cycle
    assert cycles(edges) == [frozenset({"course_lib.model", "course_lib.eval"})]
    found = violations(edges)
    assert set(found) == {("course_lib.quant", "course_lib.model"),
                          ("course_lib.model", "course_lib.eval"),
                          ("course_lib.eval", "course_lib.model")}
    assert found["course_lib.quant", "course_lib.model"] == (
        "course_lib.quant (layer 1 formats and quantizers) imports course_lib.model "
        "(layer 2 model, loaders and evaluation) at line 3")
    assert "in the cycle ['course_lib.eval', 'course_lib.model']" in found[
        "course_lib.eval", "course_lib.model"]
    assert cycles({"a": {"b": 1}, "b": {"c": 1}}) == []


def test_function_level_and_relative_imports_are_read(tmp_path):
    known = {"course_lib.methods.x": tmp_path / "x.py", "course_lib.methods": tmp_path,
             "course_lib.data": tmp_path, "course_lib.methods.y": tmp_path}
    src = ("from . import y\n"
           "def f():\n"
           "    from course_lib import data\n"
           "    import course_lib.data.something\n")
    (tmp_path / "x.py").write_text(src)
    assert imports_of("course_lib.methods.x", tmp_path / "x.py", known) == {
        "course_lib.methods.y": 1, "course_lib.data": 3}


def test_a_module_outside_every_layer_is_named():
    with pytest.raises(KeyError):
        layer_of("course_lib.brand_new")
    assert layer_of("course_lib.methods.gptq") == 2 and layer_of("course_lib") == 5
    assert layer_of("course_lib.authoring.book") == 7 and layer_of("kernels.bench") == 4
    assert layer_of("course_lib.experiments.qat_tables") == 6 and layer_of("course_lib.checks") == 5
    assert layer_of("course_lib.kmix_table") == 2         # the reader; its writer is layer 7
    assert layer_of("kernels.w8a16") == 3 and layer_of("kernels._common") == 3
    assert layer_of("kernels.bench_peers") == 4
