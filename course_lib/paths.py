"""Where the course's folders are (used by the learner's progress file and the authoring tools).

``ROOT`` is the course folder, the one holding ``notebooks/``, ``solutions/``, ``exercises/``,
``results/`` and ``course_lib/`` itself (the course is installed with ``pip install -e .``, so
the package stays inside it).
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["ROOT"]
