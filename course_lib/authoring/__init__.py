"""The course's machinery: what builds, stamps, grades and times the course (for authors and
instructors). A learner reading the library can skip this folder; nothing here is taught, and
nothing in the rest of ``course_lib`` imports it (``tests/test_imports.py``).

- ``exercises``       ``exercises/`` generated from ``solutions/`` (the exercise generator)
- ``nbmeta``          slide and nbgrader metadata stamped into the notebooks
- ``grading``         an nbgrader course folder, one assignment per lesson
- ``render``, ``book`` every notebook executed; the static HTML book
- ``notebook_timer``  a pytest plugin that times each notebook of a test run
- ``workshop``        the README's and the instructor's kit's tables, from measurements

    make exercises       # python -m course_lib.authoring.nbmeta, .exercises, .workshop doc
    make book            # python -m course_lib.authoring.book
    make render          # python -m course_lib.authoring.render
    make notebook-times  # pytest -p course_lib.authoring.notebook_timer, then .workshop times/doc
    python -m course_lib.authoring.grading COURSE_DIR   # an nbgrader course folder
"""
