"""Triton, or a stand-in where it is not installed (macOS, Windows): lessons 09-11.

Every kernel file imports ``triton`` and ``tl`` from here. Where Triton imports, they are the
real modules. Where it does not (the package index has Triton wheels for Linux only, or
``COURSE_NO_TRITON=1`` imitates that on Linux), they are small stand-ins that let the kernel
files load: ``@triton.jit`` keeps the Python function (so ``kernels.source`` still prints the
kernel), ``triton.Config``/``autotune`` keep their settings (so the launch plans and compile
reports still read), ``triton.cdiv`` still divides, and launching a kernel raises
``TritonMissing`` with one line that says why. The plain-torch references never need Triton.
"""
from __future__ import annotations

from course_lib.device import triton_status

AVAILABLE, WHY_MISSING = triton_status()


class TritonMissing(RuntimeError):
    """A Triton kernel was launched where Triton is not installed (or is blocked)."""


def interpreter_problem(triton_version: str, numpy_version: str, interpreting: bool) -> str | None:
    """Why Triton's interpreter cannot run the course's kernels here, or None.

    Triton 3.6's interpreter calls ``int()`` on one-element NumPy arrays, which NumPy 2.4 made
    an error: 100 of the course's 129 kernel tests failed that way (NumPy 2.3.5 passed them
    all; Triton 3.9 works with NumPy 2.4). Older Triton versions are treated alike.
    """
    import re

    def major_minor(v: str) -> tuple[int, int]:
        parts = [int(p) for p in re.findall(r"\d+", v)[:2]]
        return (parts + [0, 0])[0], (parts + [0, 0])[1]

    if interpreting and major_minor(triton_version) <= (3, 6) and major_minor(numpy_version) >= (2, 4):
        return (f"Triton {triton_version}'s interpreter does not work with NumPy {numpy_version} "
                f"(NumPy 2.4 refuses int() of an array, which that interpreter relies on): install "
                f"'numpy<2.4' or a newer Triton (the course is tested with 3.9). Until then kernels "
                f"are shown (source, plain-torch reference, compile report), not launched")
    return None


if AVAILABLE:
    try:
        import triton  # noqa: F401
        import triton.language as tl  # noqa: F401
    except ImportError as err:       # installed but broken: the course goes on without it
        AVAILABLE = False
        WHY_MISSING = (f"Triton is installed but does not import ({err}): kernels are shown "
                       f"(source, plain-torch reference, compile report), not launched")
if AVAILABLE:
    import os as _os

    import numpy as _np

    _problem = interpreter_problem(triton.__version__, _np.__version__,
                                   _os.environ.get("TRITON_INTERPRET") == "1")
    if _problem:                     # the interpreter would fail on every kernel: say so once
        AVAILABLE, WHY_MISSING = False, _problem
if not AVAILABLE:
    import math
    import types

    class _Kernel:
        """What ``@triton.jit`` (or ``autotune``) makes of a function here: the function, kept."""

        def __init__(self, fn, **settings):
            self.fn = fn
            self.__name__ = getattr(fn, "__name__", "kernel")
            self.__doc__ = getattr(fn, "__doc__", None)
            self.__module__ = getattr(fn, "__module__", __name__)
            for key, value in settings.items():
                setattr(self, key, value)

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise TritonMissing(f"{self.__name__} cannot launch: {WHY_MISSING}")
            return launch

        def __call__(self, *args, **kwargs):
            raise TritonMissing(f"{self.__name__} cannot run: {WHY_MISSING}")

        def run(self, *args, **kwargs):
            raise TritonMissing(f"{self.__name__} cannot run: {WHY_MISSING}")

    def _jit(fn=None, **settings):
        if fn is None:
            return lambda f: _Kernel(f, **settings)
        return _Kernel(fn, **settings)

    def _autotune(configs, key, **settings):
        return lambda fn: _Kernel(fn, configs=list(configs), key=list(key), **settings)

    def _heuristics(values):
        return lambda fn: _Kernel(fn, values=dict(values))

    class _Config:
        """``triton.Config``: the meta-parameters and launch settings of one configuration."""

        def __init__(self, kwargs, num_warps=4, num_stages=3, num_ctas=1, maxnreg=None,
                     pre_hook=None, **more):
            self.kwargs = dict(kwargs)
            self.num_warps, self.num_stages, self.num_ctas = num_warps, num_stages, num_ctas
            self.maxnreg, self.pre_hook = maxnreg, pre_hook
            self.__dict__.update(more)

        def all_kwargs(self):
            return {**self.kwargs, "num_warps": self.num_warps, "num_stages": self.num_stages}

        def __repr__(self):
            return f"Config({self.kwargs}, num_warps={self.num_warps}, num_stages={self.num_stages})"

    class _Constexpr:
        """``tl.constexpr``: a compile-time constant (here only a value with a name)."""

        def __init__(self, value=None):
            self.value = value

        def __repr__(self):
            return f"constexpr[{self.value!r}]"

    class _Placeholder:
        """Any other ``tl`` name (a dtype, a function): only ever used inside a kernel body."""

        def __init__(self, name):
            self._name = name

        def __repr__(self):
            return f"tl.{self._name}"

        def __call__(self, *args, **kwargs):
            raise TritonMissing(f"tl.{self._name} needs Triton: {WHY_MISSING}")

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Placeholder(f"{self._name}.{name}")

    class _Language(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Placeholder(name)

    def _next_power_of_2(n: int) -> int:
        return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()

    tl = _Language("triton.language (stand-in: Triton is not installed)")
    tl.constexpr = _Constexpr
    triton = types.SimpleNamespace(
        __version__=None, language=tl, jit=_jit, autotune=_autotune, heuristics=_heuristics,
        Config=_Config, cdiv=lambda a, b: -(-a // b), next_power_of_2=_next_power_of_2,
        __doc__="stand-in for triton: " + WHY_MISSING)
    del math

__all__ = ["AVAILABLE", "WHY_MISSING", "TritonMissing", "triton", "tl"]
