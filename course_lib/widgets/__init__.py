"""Interactive widgets (ipywidgets), one module per lesson that uses them.

Each builder returns the widget box (so tests can drive it) and is named in its lesson.
"""
