"""Lesson 12: the decision guide. What limits you, which GPU, how big a model, how many
conversations of how many tokens -> the recommended weight scheme and KV-cache format, the
reasons, and the course's measured evidence behind them.

``decision_widget(rule=...)`` returns an ipywidgets box. The rule is
``course_lib.guide.choose_scheme`` unless a learner's own function (exercise 12.choose_scheme)
is passed; the reasons and the evidence come from ``course_lib.guide.recommend``, which reads
them from the results/ files (one source: nothing is retyped here).
"""
from __future__ import annotations

import html

from course_lib import guide
from course_lib import hardware as hw

#: Model sizes on the slider, in billions of parameters (SmolLM2-135M to Llama 3.1 405B).
SIZES_B = [0.135, 1.0, 3.0, 8.03, 14.0, 27.2, 70.6, 120.0, 405.9]
#: Batch sizes (conversations decoded together) and context lengths on the sliders.
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]
CONTEXTS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
LIMIT_LABELS = {"memory": "memory (the model must fit, with room for users)",
                "decode": "decode speed (tokens per second of the users decoded together)",
                "prefill": "prefill throughput (long prompts, big batches)",
                "accuracy": "accuracy (quality first)"}


def recommendation_html(limit: str, gpu: str, params: float, results: dict | None = None,
                        rule=guide.choose_scheme, batch: int = 1, context: int = 4096) -> str:
    """The readout for one choice: scheme, KV cache, reasons, evidence (lesson 12)."""
    r = guide.recommend(limit, gpu, params, results, rule=rule, batch=batch, context=context)
    reasons = "".join(f"<li>{html.escape(x)}</li>" for x in r["reasons"])
    evidence = "".join(f"<li>{html.escape(x)}</li>" for x in r["evidence"]) or \
        "<li>no measurement in results/ bears on this choice</li>"
    kv = " + <code>--kv-cache-dtype fp8</code>" if r["kv_cache"] == "fp8" else ""
    return (f"<b>Recommended: {html.escape(r['description'])}</b>{kv}"
            f"<br><i>reasons</i><ul>{reasons}</ul><i>measured evidence (this course)</i>"
            f"<ul>{evidence}</ul><small>Then validate on your own tasks (section 1's ladder) "
            f"and keep the BF16 checkpoint as the rollback.</small>")


def decision_widget(rule=guide.choose_scheme, limit: str = "decode", gpu: str = "H100 SXM",
                    size_b: float = 8.03, results: dict | None = None, batch: int = 1,
                    context: int = 4096):
    """Build the decision guide (lesson 12). Returns a ``VBox``; ``controls`` holds the
    inputs and ``result`` the HTML readout, so a test can drive it."""
    import ipywidgets as W

    results = guide.load_results() if results is None else results
    style = {"description_width": "130px"}
    layout = W.Layout(width="560px")
    controls = {
        "limit": W.Dropdown(options=[(v, k) for k, v in LIMIT_LABELS.items()], value=limit,
                            description="what limits you", style=style, layout=layout),
        "gpu": W.Dropdown(options=list(hw.GPUS), value=hw.get_gpu(gpu).name,
                          description="GPU", style=style, layout=layout),
        "size": W.SelectionSlider(options=[(f"{s:g}B", s) for s in SIZES_B], value=size_b,
                                  description="model size", style=style, layout=layout,
                                  continuous_update=False),
        "batch": W.SelectionSlider(options=BATCHES, value=batch, description="conversations",
                                   style=style, layout=layout, continuous_update=False),
        "context": W.SelectionSlider(options=[(f"{c:,}", c) for c in CONTEXTS], value=context,
                                     description="tokens each", style=style, layout=layout,
                                     continuous_update=False),
    }
    result = W.HTML()

    def update(_change=None):
        result.value = recommendation_html(controls["limit"].value, controls["gpu"].value,
                                           controls["size"].value * 1e9, results, rule,
                                           controls["batch"].value, controls["context"].value)

    for c in controls.values():
        c.observe(update, names="value")
    update()
    box = W.VBox([*controls.values(), result])
    box.controls, box.result = controls, result
    return box
