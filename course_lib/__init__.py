"""course_lib: the shared library of *Quantization, Hands On*.

Every public function names, in its docstring, the notebook that teaches it.
Modules (each imported on demand, so `import course_lib` stays cheap):

- ``device``   what machine this is; Triton interpreter mode on a CPU (every notebook)
- ``compare``  one comparison helper: exact / allclose / max abs diff / SQNR
- ``checks``   self-checking exercises: ``check(exercise_id, fn)``; ``progress()`` below
- ``hardware`` catalogue of GPUs and models; memory and decode-floor calculators (lesson 00)
- ``bandwidth`` this machine's measured copy bandwidth (lessons 00, 10)
- ``formats``  number formats bit by bit (lesson 01)
- ``quant``    quantizers, block formats, packing, error metrics (lessons 02-03)
- ``data``     the texts: the bundled model's corpus, SmolLM2's reference text (lesson 04)
- ``model``, ``eval``, ``activations``, ``qmodel`` the bundled model and its tooling (lesson 04);
  ``train`` retrains it (``make model``)
- ``smollm``, ``gguf_model`` the real LLM (SmolLM2-135M) from its GGUF file; its text (lesson 04)
- ``methods``  quantization methods from the papers, one module each (lessons 05-08)
- ``export``   a compressed-tensors checkpoint a serving engine loads (lessons 06-07)
- ``kv``       quantized KV caches, their byte accounting and quality by position (lesson 11)
- ``bench``    timing and the roofline (lessons 00, 09, 10)
- ``validate`` the validation ladder: KL/top-1, a task, long generations (lesson 12)
- ``guide``    the measured summary read from results/, which GPUs compute which formats,
               the decision rule, the serving commands, the common-mistakes quiz (lesson 12)
- ``widgets``  the interactive widgets, one module per lesson that has one
- ``learner_progress`` which exercises this learner has passed: ``course_lib.progress()``
- ``paths``    where the course folder is (``ROOT``)
- ``experiments`` the commands that run the committed experiments and write results/ JSON
  (methods, sensitivity, engine and QAT tables); the lessons read those files through the
  modules above
- ``authoring`` the course's machinery, not taught: the exercise generator, slide and nbgrader
  metadata, grading, the rendered book, the run-time tables (for authors and instructors)

The layers, bottom to top, and the rule that imports only go down: ``docs/architecture.md``
(``tests/test_imports.py`` holds the code to it).
"""
__version__ = "0.1.0"


def progress(reset: bool = False, path=None):
    """Which exercises you have passed, a table per lesson (every exercise notebook);
    ``reset=True`` starts again. See ``course_lib.learner_progress``."""
    from course_lib.checks import load_all
    from course_lib.learner_progress import progress_table

    titles = {exercise_id: ex.title for exercise_id, ex in load_all().items()}
    return progress_table(titles, reset=reset, path=path)
