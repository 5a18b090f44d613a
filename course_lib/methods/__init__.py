"""Quantization methods from the papers, one small module per method (lessons 05-08).

Each module's docstring names the lesson that teaches it and the paper it follows. They build
on ``course_lib.qmodel`` (swapping Linears), ``course_lib.activations`` (calibration inputs)
and ``course_lib.eval`` (what a method costs in quality). Import the module you need, e.g.
``from course_lib.methods import gptq``.
"""
