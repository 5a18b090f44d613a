"""Make ``import triton`` fail, as on a Mac or Windows, when ``COURSE_NO_TRITON=1``.

Python imports ``sitecustomize`` at start-up from the first folder of ``sys.path`` that has one,
so putting this folder on ``PYTHONPATH`` switches the blocker on in every process of a test run:
pytest itself and each notebook kernel nbval starts (``conftest.py`` does both when the variable
is set; ``make test-no-triton`` sets it). Every finder on ``sys.meta_path`` is wrapped so that
``triton`` and its submodules are simply not found: ``import triton`` raises
``ModuleNotFoundError`` and ``importlib.util.find_spec("triton")`` returns None, exactly as where
the package is not installed (torch's own "is Triton there?" checks then say no, too). A finder
added to ``sys.meta_path`` after start-up is not wrapped: none of the course's packages adds one.
"""
import os
import sys

BLOCKED = ("triton",)


def _blocked(name: str) -> bool:
    return any(name == b or name.startswith(b + ".") for b in BLOCKED)


class _HideTriton:
    """A meta-path finder wrapper that finds nothing under ``triton`` and defers the rest."""

    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if _blocked(name):
            return None
        find = getattr(self.inner, "find_spec", None)
        return find(name, path, target) if find else None

    def invalidate_caches(self):
        if hasattr(self.inner, "invalidate_caches"):
            self.inner.invalidate_caches()

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


def install() -> None:
    """Hide Triton from this process (idempotent); a Triton already imported is an error."""
    if sys.meta_path and all(isinstance(f, _HideTriton) for f in sys.meta_path):
        return
    loaded = [m for m in sys.modules if _blocked(m)]
    if loaded:
        raise RuntimeError(f"COURSE_NO_TRITON=1, but {loaded[0]} was imported before the blocker "
                           f"was installed: set the variable before Python starts")
    sys.meta_path[:] = [f if isinstance(f, _HideTriton) else _HideTriton(f) for f in sys.meta_path]


if os.environ.get("COURSE_NO_TRITON") == "1":
    install()
