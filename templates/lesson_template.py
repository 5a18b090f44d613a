# The lesson template (percent format: convert with `python tools/py2nb.py`).
# Every lesson in notebooks/ follows it; tests/test_notebooks_clean.py checks the parts.
# Exercises live in solutions/NN_*.ipynb (with ### BEGIN/END SOLUTION blocks); exercises/
# is generated from them with `make exercises`.

# %% [markdown]
# # NN · Title
#
# **Learning objectives.** After this lesson you can:
# 1. ...
# 2. ...
#
# *Time: about N minutes to read (W words at 200 a minute), more with the exercises; the
# notebook runs in under S seconds on a laptop CPU. GPU cells are optional and say what they
# skip.* (W: the markdown's word count, which tests/test_reading_time.py checks; S: measured)

# %% [markdown]
# What this machine is (every notebook starts here): the GPU, or its absence, and which
# formats it computes natively.

# %%
from course_lib import device
info = device.summary()

# %% [markdown]
# ## 1. First idea
# One idea per cell; a markdown cell before each code cell says what it will show.
# Every number is computed, and where it comes from the source material an `assert`
# shows agreement.

# %%
# computed figure, then: assert abs(value - source_value) < tolerance

# %% [markdown]
# ## Exercises
# Open `exercises/NN_title.ipynb` (solutions in `solutions/NN_title.ipynb`). Each exercise
# checks itself with `course_lib.checks.check`.

# %% [markdown]
# ## Summary
# - ...
#
# ## Check yourself
# 1. A question?
#    <details><summary>Answer</summary>The answer.</details>
