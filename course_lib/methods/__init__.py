"""Quantization methods from the papers, one small module per method (lessons 05-08).

Each module's docstring names the lesson that teaches it and the paper it follows. They build
on ``course_lib.qmodel`` (swapping Linears), ``course_lib.activations`` (calibration inputs)
and ``course_lib.eval`` (what a method costs in quality). Import the module you need, e.g.
``from course_lib.methods import gptq``.
"""


import copy as _copy


def swap_linears(model, make, skip=("lm_head", "embed_tokens"), only=None, inplace=False):
    """Replace every ``nn.Linear`` of ``model`` by ``make(name, linear)`` (lessons 05 and 08).

    The same mechanism as :func:`course_lib.qmodel.quantize_model`, for layers that quantize
    activations too (``Int8Linear``, ``W8A8Linear``). ``skip``: name fragments left alone (the
    output head by default); ``only``: if given, only names containing one of these fragments.
    A copy is changed unless ``inplace``. Returns ``(model, names of the replaced layers)``.
    """
    import torch.nn as nn

    if isinstance(skip, str) or isinstance(only, str):
        raise TypeError("skip and only take a list of name fragments, e.g. skip=['lm_head']")
    if not inplace:
        model = _copy.deepcopy(model)
    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not targets:
        raise ValueError("this model has no nn.Linear layers to replace")
    done = []
    for name, lin in targets:
        if any(s in name for s in skip) or (only is not None and not any(o in name for o in only)):
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, make(name, lin))
        done.append(name)
    if only is not None and not done:
        raise ValueError(f"no layer name contains any of {list(only)}; names look like "
                         f"{[n for n, _ in targets[:4]]}")
    return model, done
