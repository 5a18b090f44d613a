"""Self-checking exercises: ``check(exercise_id, fn)`` (every lesson's exercise notebook).

Each exercise is registered once, in ``course_lib/checks/lessonNN.py``, with

- a reference implementation (the library's own code: one source per algorithm),
- cases: many inputs, edge cases included (each with a label a learner can read),
- hints in steps (``hint`` a string or a list): the first says what to think about and never
  gives the answer; later steps come with ``hint(exercise_id, level=2)``. A failure quotes the
  hint of the case that failed: ``Case.hint`` (a hint written for that case, a step number, or
  ``""`` for none), else the first step,
- plausible wrong implementations, which ``tests/test_checks.py`` feeds to the checker
  to prove that it rejects each one.

``check`` runs the learner's function on every case and prints what passed. On a failure
it shows the input, the expected and the actual value, and the hint for that case. When the
learner's function raises, the failure names the exception and the line of the learner's own
code it came from (the deepest frame outside course_lib and the installed packages); when a
case expects an exception (``Case.raises``) and the function returned or raised another one,
the failure says which exception the task asks for. Every case also compares
the arguments after the call with a copy taken before it: a function that changes its input
in place (a tensor, an array, a list or dict, a module's weights) fails, naming the argument,
unless the exercise says that changing it is its job (``Exercise.mutates``). When the function
raises ``NotImplementedError`` (an unsolved exercise) it prints "not yet implemented" and
does not raise, so unsolved notebooks still run top to bottom.

A check that passes in learner mode is recorded for ``course_lib.progress()`` (which
exercises this learner has passed; not in the course's solutions notebooks, whose passes are
not the learner's) in ``course_lib.learner_progress``, a module below this one:
it keeps the file and draws the table from the titles it is given, and never imports the checks.

The environment variable ``COURSE_CHECKS`` makes checks strict for CI:
``learner`` (default) never raises; ``exercises`` raises on a wrong answer but not on an
unsolved one; ``solutions`` raises unless the answer passes; ``grading`` (nbgrader's
autograder) raises unless the answer passes, so an unsolved exercise scores zero.

Under nbgrader the mode is ``grading`` whatever ``COURSE_CHECKS`` says: nbgrader sets
``NBGRADER_EXECUTION`` (to ``autograde`` or ``validate``) while it runs a notebook, and its
kernels inherit it (nbgrader 0.9.6, ``converters/autograde.py`` and ``validator.py``; its FAQ,
https://nbgrader.readthedocs.io/en/stable/user_guide/faq.html, "Can I modify the notebook
behavior during autograding or validation?"). So a blank submission scores 0 in any nbgrader
course, the course's generated config or nbgrader's defaults; a kernel exercise that cannot
run there (no Triton on the grading machine) fails too, saying why, instead of being skipped.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import math
import os
import pkgutil
import sys
import sysconfig
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from course_lib import learner_progress
from course_lib.compare import cmp


@dataclass
class Case:
    """One input to an exercise. ``raises``: the learner's function must raise this type.
    ``hint``: what a failure on this case quotes: a hint written for this case (str, said as
    hint level 1 is: what to think about), the number of one of the exercise's hint steps,
    ``""`` for no hint, or None for the default: on a case that expects an exception, a hint
    that names it (the task's sentence on refusals is the one to reread); on any other case,
    the exercise's first step."""
    args: tuple
    kwargs: dict = field(default_factory=dict)
    label: str = ""
    raises: type[BaseException] | None = None
    hint: str | int | None = None


@dataclass
class Exercise:
    """An exercise: reference, cases, hint and known wrong answers (see module docstring)."""
    id: str
    title: str
    reference: Callable
    cases: Callable[[], list[Case]]
    hint: str | list[str]
    wrong: list[Callable] = field(default_factory=list)
    rtol: float = 1e-5
    atol: float = 1e-8
    check_dtype: bool = True
    signed_zero: bool = False   # -0.0 and +0.0 differ (formats with a sign bit on zero)
    int_results: bool = False   # where the reference returns an int, the answer must be one
    float_results: bool = False  # where the reference returns a float, the answer must be a
                                 # Python float (np.float64 is one), not a 0-d tensor nor a
                                 # float32/float16 numpy scalar
    mutates: tuple[str, ...] = ()  # arguments the exercise asks to change in place (by name
                                   # as in the reference's signature); every other argument
                                   # must come back unchanged
    right: list[Callable] = field(default_factory=list)  # other readings of the task that are
                                   # also right (another precision, another order of exact
                                   # steps): tests/test_checks.py proves the checker passes each
    slack: Callable | None = None  # slack(*args, **kwargs) -> an absolute tolerance per element
                                   # of the answer, added to rtol/atol, for a computation the
                                   # task allows in lower precision (a 16-bit product): an
                                   # answer the plain tolerance refuses passes when every
                                   # element is within it

    @property
    def hints(self) -> list[str]:
        """The hint steps, first (what to think about) to last (closest to code)."""
        return [self.hint] if isinstance(self.hint, str) else list(self.hint)


EXERCISES: dict[str, Exercise] = {}
_LOADED = False


def register(ex: Exercise) -> Exercise:
    """Add an exercise to the registry (called by the ``lessonNN`` modules)."""
    if ex.id in EXERCISES:
        raise ValueError(f"exercise id {ex.id!r} registered twice")
    EXERCISES[ex.id] = ex
    return ex


def load_all() -> dict[str, Exercise]:
    """Import every ``course_lib/checks/lesson*.py`` once, so all exercises are registered."""
    global _LOADED
    if not _LOADED:
        for mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
            if mod.startswith("lesson"):
                importlib.import_module(f"{__name__}.{mod}")
        _LOADED = True
    return EXERCISES


def _short(x: Any, limit: int = 300) -> str:
    if hasattr(x, "detach"):
        t = x.detach().cpu()
        body = np.array2string(t.float().numpy(), threshold=12, precision=5, edgeitems=3)
        s = f"tensor(shape={tuple(t.shape)}, dtype={t.dtype}) {body}"
    elif isinstance(x, np.ndarray):
        body = np.array2string(x, threshold=12, precision=5, edgeitems=3)
        s = f"array(shape={x.shape}, dtype={x.dtype}) {body}"
    elif isinstance(x, (tuple, list)) and len(x) <= 8:
        inner = ", ".join(_short(v, limit // 2) for v in x)
        s = f"({inner})" if isinstance(x, tuple) else f"[{inner}]"
    else:
        s = repr(x)
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def compare_answer(expected, actual, rtol: float, atol: float, check_dtype: bool,
                   signed_zero: bool = False, int_results: bool = False,
                   float_results: bool = False) -> str | None:
    """None when ``actual`` matches ``expected``; otherwise what is wrong, in words."""
    more = dict(signed_zero=signed_zero, int_results=int_results, float_results=float_results)
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"expected a dict, got {type(actual).__name__}"
        if set(expected) != set(actual):
            return f"expected keys {sorted(expected)}, got {sorted(actual)}"
        for k in expected:
            p = compare_answer(expected[k], actual[k], rtol, atol, check_dtype, **more)
            if p:
                return f"[{k!r}] {p}"
        return None
    if isinstance(expected, tuple):
        if not isinstance(actual, (tuple, list)):
            return f"expected a tuple of {len(expected)} values, got {type(actual).__name__}"
        if len(actual) != len(expected):
            return f"expected a tuple of {len(expected)} values, got {len(actual)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            p = compare_answer(e, a, rtol, atol, check_dtype, **more)
            if p:
                return f"item {i}: {p}"
        return None
    if isinstance(expected, (str, bool, np.bool_)) or expected is None:
        if type(expected) is bool or isinstance(expected, np.bool_):
            ok = isinstance(actual, (bool, np.bool_)) and bool(actual) == bool(expected)
        else:
            ok = actual == expected
        return None if ok else f"expected {expected!r}, got {actual!r}"
    if actual is None:
        return "your function returned None (did you forget `return`?)"
    if (int_results and isinstance(expected, (int, np.integer))
            and not isinstance(actual, (int, np.integer))):
        return f"expected a whole number (int), got {type(actual).__name__} {actual!r}"
    if (float_results and isinstance(expected, (float, np.floating))
            and not isinstance(actual, float)):          # np.float64 is a float; float32 is not
        return (f"expected a Python float, got {type(actual).__name__} {_short(actual, 80)} "
                f"(wrap it in float(...))")
    result = cmp("answer", expected, actual, rtol=rtol, atol=atol, check_dtype=check_dtype,
                 signed_zero=signed_zero)
    if result:
        return None
    return result.problem + _number_kind_note(expected, actual)


def _number_kind_note(expected, actual) -> str:
    """Where a Python number is expected and a tensor or a NumPy scalar of lower precision came
    back, say so: "expected 0.4, got 0.4" alone would leave the learner guessing."""
    if not isinstance(expected, float):
        return ""
    if hasattr(actual, "detach"):
        kind = f"a torch tensor ({actual.dtype})"
    elif isinstance(actual, (np.ndarray, np.generic)) and not isinstance(actual, float):
        what = "array" if isinstance(actual, np.ndarray) else "scalar"
        kind = f"a NumPy {what} ({actual.dtype})"
    else:
        return ""
    return (f" (your answer is {kind}; the answer is a Python number: compute in float64 "
            f"and return float(...))")


# ---- inputs changed in place ------------------------------------------------------------------

def _changed(before: Any, after: Any) -> str | None:
    """None when ``after`` holds what ``before`` held; otherwise where it differs, in words.

    Looks inside tensors, arrays, lists, tuples, dicts, dataclasses and torch modules (their
    ``state_dict``), and compares numbers, strings and None held in them; other objects are
    taken as unchanged.
    """
    if hasattr(before, "detach") and hasattr(before, "dtype"):            # torch.Tensor
        if not (hasattr(after, "detach") and hasattr(after, "dtype")):
            return f"it became a {type(after).__name__}"
        return _changed_values(before.detach().cpu(), after.detach().cpu())
    if isinstance(before, np.ndarray):
        if not isinstance(after, np.ndarray):
            return f"it became a {type(after).__name__}"
        return _changed_values(before, after)
    if hasattr(before, "state_dict") and hasattr(before, "parameters"):   # torch.nn.Module
        b, a = before.state_dict(), after.state_dict()
        if list(b) != list(a):
            return f"its parameters changed: {sorted(set(b) ^ set(a))[:4]}"
        for k in b:
            p = _changed(b[k], a[k])
            if p:
                return f"its {k!r} {p}"
        return None
    if isinstance(before, (list, tuple)):
        if type(after) is not type(before) or len(after) != len(before):
            return f"its length went from {len(before)} to {len(after)}"
        for i, (b, a) in enumerate(zip(before, after)):
            p = _changed(b, a)
            if p:
                return f"its item {i} {p}" if not p.startswith("its ") else f"item {i}: {p}"
        return None
    if isinstance(before, dict):
        if list(after) != list(before):
            gone, new = set(before) - set(after), set(after) - set(before)
            return (f"its keys changed (removed {sorted(map(str, gone))}, added "
                    f"{sorted(map(str, new))})")
        for k in before:
            p = _changed(before[k], after[k])
            if p:
                return f"its [{k!r}] {p}"
        return None
    if dataclasses.is_dataclass(before) and not isinstance(before, type):
        for f in dataclasses.fields(before):
            p = _changed(getattr(before, f.name), getattr(after, f.name, None))
            if p:
                return f"its .{f.name} {p}"
        return None
    if before is None or isinstance(before, (bool, int, float, complex, str, bytes, np.generic)):
        same = type(after) is type(before) and (
            before == after or (before != before and after != after))      # NaN stays NaN
        return None if same else f"changed from {before!r} to {after!r}"
    return None


def _changed_values(b, a) -> str | None:
    """Shape, dtype and values (NaN equal to NaN) of two tensors or two arrays."""
    if tuple(b.shape) != tuple(a.shape):
        return f"changed shape from {tuple(b.shape)} to {tuple(a.shape)}"
    if str(b.dtype) != str(a.dtype):
        return f"changed dtype from {b.dtype} to {a.dtype}"
    if hasattr(b, "numpy"):                                 # torch: compare in float64 numpy
        import torch
        try:
            b, a = b.to(torch.float64).numpy(), a.to(torch.float64).numpy()
        except (RuntimeError, TypeError):                  # complex, packed or exotic dtypes
            return None if torch.equal(b, a) else "changed its values"
    if b.dtype.kind in "fc":
        diff = ~((b == a) | (np.isnan(b) & np.isnan(a)))
    elif b.dtype.kind in "biu":
        diff = b != a
    else:
        return None if np.array_equal(b, a) else "changed its values"
    if not diff.any():
        return None
    where = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.ndim else ()
    return (f"changed {int(diff.sum())} of {diff.size} values (first at index "
            f"{tuple(int(i) for i in where)}: {b[where].item()!r} became {a[where].item()!r})")


def _arg_names(fn: Callable, n_args: int) -> list[str]:
    """The names of ``fn``'s first ``n_args`` positional parameters (``argument 3`` where
    there is no name to give: ``*args``, builtins)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(n_args):
        p = params[i] if i < len(params) else None
        if p is None or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY):
            names.append(f"argument {i + 1}")
            params = params[:i]                             # *args swallows the rest
        else:
            names.append(p.name)
    return names


def changed_inputs(fn: Callable, before: tuple, after: tuple, allowed: tuple[str, ...] = (),
                   reference: Callable | None = None) -> str | None:
    """None when the call ``fn(*args, **kwargs)`` left its arguments as they were; otherwise
    a message naming the first argument it changed in place (every exercise's ``check``).

    ``before`` and ``after`` are ``(args, kwargs)``: a deep copy taken before the call and the
    objects the call received. Arguments named in ``allowed`` (names of ``reference``'s
    parameters, or of ``fn``'s when no reference is given) may change.
    """
    (b_args, b_kw), (a_args, a_kw) = before, after
    names = _arg_names(fn, len(b_args))
    spec_names = _arg_names(reference, len(b_args)) if reference is not None else names
    for i, b in enumerate(b_args):
        if spec_names[i] in allowed or names[i] in allowed:
            continue
        p = _changed(b, a_args[i])
        if p:
            return _in_place_message(names[i], p, b)
    for k in b_kw:
        if k not in allowed:
            p = _changed(b_kw[k], a_kw[k])
            if p:
                return _in_place_message(k, p, b_kw[k])
    return None


def _in_place_message(name: str, what: str, value: Any) -> str:
    if hasattr(value, "detach"):
        how = f"{name}.clone()"
    elif isinstance(value, np.ndarray):
        how = f"{name}.copy()"
    else:
        how = f"copy.deepcopy({name})"
    return (f"your function changed its input `{name}` in place ({what}); work on a copy "
            f"({how}) or build a new result instead of writing into `{name}`")


def _within_slack(ex: Exercise, case: Case, expected, actual) -> bool:
    """True when ``actual`` has the right kind, shape and dtype and each element is within
    rtol/atol plus the exercise's per-element ``slack`` for this case (``Exercise.slack``)."""
    from course_lib.compare import to_numpy
    if compare_answer(expected, actual, ex.rtol, math.inf, ex.check_dtype, ex.signed_zero,
                      ex.int_results, ex.float_results) is not None:
        return False                                  # not a matter of tolerance
    slack = ex.slack(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
    e, a = to_numpy(expected), to_numpy(actual)
    extra = np.broadcast_to(to_numpy(slack), e.shape)
    with np.errstate(invalid="ignore"):
        ok = (e == a) | (np.isfinite(e) & np.isfinite(a)
                         & (np.abs(e - a) <= ex.atol + ex.rtol * np.abs(e) + extra))
    return bool(ok.all())


# ---- where the learner's code raised -------------------------------------------------------

_COURSE_LIB = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_COURSE_PACKAGES = tuple(os.path.join(os.path.dirname(_COURSE_LIB), name)
                         for name in ("course_lib", "kernels"))      # the course's own code


def _library_roots() -> tuple[str, ...]:
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path))
    return tuple(sorted(roots))


_LIBRARY_ROOTS = _library_roots()


def _library_name(filename: str) -> str:
    """The package a frame's file belongs to ("torch", "numpy", "course_lib.kquants",
    "kernels.w8a16"), or "" when the file is the learner's (a notebook cell, a script of
    theirs)."""
    if filename.startswith("<") and filename != "<stdin>":
        return "" if filename.startswith(("<ipython-input", "<string")) else "python"
    path = os.path.realpath(filename)
    if any(path.startswith(package + os.sep) for package in _COURSE_PACKAGES):
        rel = os.path.relpath(path, os.path.dirname(_COURSE_LIB))
        return os.path.splitext(rel)[0].replace(os.sep, ".")
    parts = path.split(os.sep)
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            i = parts.index(marker)
            return os.path.splitext(parts[i + 1])[0] if i + 1 < len(parts) else marker
    if any(path.startswith(root + os.sep) for root in _LIBRARY_ROOTS):
        return os.path.splitext(os.path.basename(path))[0]
    return ""


def _cell_name(filename: str) -> str:
    """How Jupyter names the cell a file stands for ("Cell In[7]"), else the file's name."""
    shell = sys.modules.get("IPython")
    try:
        ip = shell.get_ipython() if shell is not None else None
        named = ip.compile.format_code_name(filename) if ip is not None else None
    except Exception:                                   # no shell, an older IPython
        named = None
    return " ".join(named) if named else os.path.basename(filename)


def where_raised(err: BaseException) -> str:
    """Where in the learner's own code ``err`` came from: the deepest frame of its traceback
    outside course_lib and the installed packages, as "line 3 of Cell In[7], in `f`: code",
    with the package it was raised inside, if any; "" when no frame of theirs is in it."""
    frames = traceback.extract_tb(err.__traceback__)
    mine = [i for i, f in enumerate(frames) if not _library_name(f.filename)]
    if not mine:
        return ""
    i = mine[-1]
    f = frames[i]
    text = f"line {f.lineno} of {_cell_name(f.filename)}, in `{f.name}`"
    if f.line:
        text += f": {f.line.strip()}"
    if i + 1 < len(frames):
        text += f" (raised inside {_library_name(frames[-1].filename)}, called from there)"
    return text


def _raised(err: BaseException) -> str:
    """The exception in one line, and where the learner's code raised it."""
    what = traceback.format_exception_only(type(err), err)[-1].strip()
    where = where_raised(err)
    return what + (f"\n    where:    {where}" if where else "")


@dataclass
class CheckResult:
    """What ``check`` found; truthy only when every case passed."""
    exercise_id: str
    status: str  # "passed", "failed", "not implemented", "skipped" (a kernel, without Triton)
    passed: int = 0
    total: int = 0
    report: str = ""

    def __bool__(self) -> bool:
        return self.status == "passed"

    def __repr__(self) -> str:
        return f"CheckResult({self.exercise_id!r}, {self.status!r}, {self.passed}/{self.total})"


NBGRADER_ENV = "NBGRADER_EXECUTION"   # set by nbgrader while it autogrades or validates


def _mode() -> str:
    """The checks' mode: ``COURSE_CHECKS`` (``learner`` by default), or ``grading`` whenever
    nbgrader runs the notebook (see the module's docstring)."""
    mode = os.environ.get("COURSE_CHECKS", "learner")
    if mode not in ("learner", "exercises", "solutions", "grading"):
        raise ValueError(f"COURSE_CHECKS={mode!r}: use learner, exercises, solutions or grading")
    if os.environ.get(NBGRADER_ENV):
        return "grading"
    return mode


def _exercise(exercise_id: str) -> Exercise:
    exercises = load_all()
    if exercise_id not in exercises:
        raise KeyError(f"unknown exercise {exercise_id!r}; known: {', '.join(sorted(exercises))}")
    return exercises[exercise_id]


def _first_hint(ex: Exercise) -> str:
    more = len(ex.hints) - 1
    tail = f" (more: hint({ex.id!r}, level=2))" if more else ""
    return ex.hints[0] + tail


def case_label(case: Case) -> str:
    """The label a learner reads: a case that expects an exception says which, even where its
    label does not ("0 parameters: raise ValueError")."""
    if case.raises is None or case.raises.__name__ in case.label:
        return case.label
    return f"{case.label}: raise {case.raises.__name__}" if case.label else \
        f"raise {case.raises.__name__}"


def case_hint(ex: Exercise, case: Case) -> str:
    """The hint a failure on ``case`` quotes ("" for none): see ``Case.hint``."""
    if case.hint is None and case.raises is not None:
        name = case.raises.__name__
        return (f"the task asks for {name} on an input like this one: reread its sentence on "
                f"what to refuse, and raise {name} (not another exception, not a return "
                f"value) for it (the exercise's steps: hint({ex.id!r}), then level=2)")
    if case.hint is None:
        return _first_hint(ex)
    if isinstance(case.hint, str):
        more = f" (the exercise's steps: hint({ex.id!r}), then level=2)" if case.hint else ""
        return case.hint + more
    if isinstance(case.hint, bool) or not 1 <= case.hint <= len(ex.hints):
        raise ValueError(f"{ex.id}: a case names hint step {case.hint!r}; the exercise has "
                         f"steps 1..{len(ex.hints)}")
    n = case.hint
    more = f" (next: hint({ex.id!r}, level={n + 1}))" if n < len(ex.hints) else ""
    return f"step {n}: {ex.hints[n - 1]}{more}"


class HintText(str):
    """The text ``hint`` printed. Jupyter shows a cell's last value too; this one it leaves
    out (``_ipython_display_`` shows nothing), so a hint appears once."""

    def _ipython_display_(self) -> None:
        return None


def hint(exercise_id: str, level: int = 1) -> HintText:
    """Print hint step ``level`` (1 = what to think about) of an exercise, once, and return its
    text (every lesson)."""
    ex = _exercise(exercise_id)
    if not isinstance(level, int) or isinstance(level, bool) or level < 1:
        raise ValueError(f"level must be a whole number >= 1, got {level!r}")
    steps = ex.hints
    if level > len(steps):
        text = f"{exercise_id} has {len(steps)} hint step(s); here is the last:\n{steps[-1]}"
    else:
        more = (f"  (next: hint({exercise_id!r}, level={level + 1}))" if level < len(steps) else "")
        text = f"{exercise_id} hint {level}/{len(steps)}: {steps[level - 1]}{more}"
    print(text)
    return HintText(text)


def check(exercise_id: str, fn: Callable, quiet: bool = False) -> CheckResult:
    """Run ``fn`` on every case of exercise ``exercise_id`` and say what passed (every lesson)."""
    ex = _exercise(exercise_id)
    cases = ex.cases()
    say = (lambda *a: None) if quiet else print
    for i, case in enumerate(cases):
        label = case_label(case)
        where = f"case {i + 1}/{len(cases)}" + (f" ({label})" if label else "")
        shown_input = _short(case.args if not case.kwargs else (case.args, case.kwargs))
        args, kwargs = copy.deepcopy((case.args, case.kwargs))   # the learner's own copy
        before = copy.deepcopy((args, kwargs))                    # what they held before
        try:
            actual = fn(*args, **kwargs)
        except NotImplementedError:
            report = f"{exercise_id} ({ex.title}): not yet implemented. Hint: {_first_hint(ex)}"
            say(report)
            if _mode() in ("solutions", "grading"):
                raise AssertionError(report)
            return CheckResult(exercise_id, "not implemented", 0, len(cases), report)
        except Exception as err:  # the learner's code raised: say what and where
            missing = _triton_missing(err)
            if missing:          # a kernel exercise where Triton is not installed: say why
                report = f"{exercise_id} ({ex.title}): skipped, {missing}"
                say(report)
                if _mode() == "grading":      # no pass without a run: grade where Triton runs
                    raise AssertionError(f"{report}; this exercise cannot be graded on this "
                                         f"machine (install Triton, or grade on Linux)")
                return CheckResult(exercise_id, "skipped", 0, len(cases), report)
            if case.raises is not None and isinstance(err, case.raises):
                problem = changed_inputs(fn, before, (args, kwargs), ex.mutates, ex.reference)
                if not problem:
                    continue
            elif case.raises is not None:
                problem = (f"expected your function to raise {case.raises.__name__} for this "
                           f"input, but it raised {_raised(err)}")
            else:
                problem = f"your function raised {_raised(err)}"
        else:
            problem = changed_inputs(fn, before, (args, kwargs), ex.mutates, ex.reference)
            if not problem and case.raises is not None:
                problem = (f"expected your function to raise {case.raises.__name__} for this "
                           f"input, but it returned {_short(actual, 120)}")
            elif not problem:
                expected = ex.reference(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
                problem = compare_answer(expected, actual, ex.rtol, ex.atol, ex.check_dtype,
                                         ex.signed_zero, ex.int_results, ex.float_results)
                if problem and ex.slack is not None and _within_slack(ex, case, expected,
                                                                       actual):
                    problem = None
                if problem:
                    problem += f"\n    expected: {_short(expected)}\n    actual:   {_short(actual)}"
        if problem:
            quoted = case_hint(ex, case)
            if case.hint is None and case.raises is None and _is_about_the_kind(problem):
                quoted = (f"the values may well be right; the kind of answer is not: reread "
                          f"the task's sentence on what to return (its type, dtype, a Python "
                          f"number or a tensor) (the exercise's steps: hint({exercise_id!r}), "
                          f"then level=2)")
            report = (f"{exercise_id} ({ex.title}): {where} FAILED\n    input:    {shown_input}\n"
                      f"    problem:  {problem}\n" + (f"    hint:     {quoted}\n" if quoted else "")
                      + f"    ({i} of {len(cases)} cases passed before this one)")
            say(report)
            if _mode() != "learner":
                raise AssertionError(report)
            return CheckResult(exercise_id, "failed", i, len(cases), report)
    labels = ", ".join(case_label(c) for c in cases if c.label)
    report = f"{exercise_id} ({ex.title}): all {len(cases)} cases passed" + (
        f" (including: {labels})" if labels else "")
    say(report)
    if _mode() == "learner":
        _record_pass(exercise_id, len(cases))
    return CheckResult(exercise_id, "passed", len(cases), len(cases), report)


_KIND_PROBLEMS = ("expected dtype", "expected a Python float", "expected a whole number",
                  "expected a torch.Tensor", "expected a numpy.ndarray", "expected a number",
                  "expected a dict", "expected a tuple", "your function returned None")


def _is_about_the_kind(problem: str) -> bool:
    """Whether a failure is about what kind of object came back (its type or dtype), not its
    values: then the exercise's first hint step, about the algorithm, is not the one to quote."""
    first = problem.split("\n", 1)[0]
    while first.startswith(("item ", "[")):                  # "item 1: ...", "['mae'] ..."
        first = first.split(": ", 1)[-1] if first.startswith("item ") else \
            first.split("] ", 1)[-1]
    return first.startswith(_KIND_PROBLEMS)


def _triton_missing(err: BaseException) -> str:
    """The one-line reason when ``err`` is a Triton kernel that could not launch because Triton
    is not installed here (macOS, Windows; ``kernels.TritonMissing``), else ''."""
    stand_in = sys.modules.get("kernels._triton")      # loaded only where a kernel was used
    if stand_in is not None and isinstance(err, stand_in.TritonMissing):
        return str(err).split(": ", 1)[-1]
    return ""


def _record_pass(exercise_id: str, cases: int) -> None:
    """Note a pass in the learner's progress file (``course_lib.progress()``); a file that
    cannot be written costs the learner nothing but a note. A pass in the course's solutions
    notebook is the course's answer, not the learner's: it is not recorded."""
    if learner_progress.solutions_notebook():
        print("(not counted in your progress: this is the solutions notebook; your own "
              "exercises/ notebook counts)")
        return
    try:
        learner_progress.record_pass(exercise_id, cases)
    except (OSError, ValueError) as err:
        print(f"(progress not saved: {err})")


def yours_or_library(result: "CheckResult", yours: Callable, library: Callable,
                     what: str) -> Callable:
    """The learner's function when its ``check`` passed, else the library's, saying which
    (every exercise notebook: the learner's piece is then used by a later cell)."""
    if result:
        print(f"{what}: using YOUR function (it passed its check)")
        return yours
    print(f"{what}: your function has not passed its check yet, so the library's is used")
    return library


__all__ = ["yours_or_library", "Case", "Exercise", "register", "check", "hint", "HintText",
           "case_hint", "case_label", "load_all", "EXERCISES", "CheckResult", "compare_answer",
           "changed_inputs", "where_raised"]
