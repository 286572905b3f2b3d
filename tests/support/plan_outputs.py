"""Saved outputs of Lab 08's planner form, made here without a kernel: what a notebook holds after
the form's cell ran and was saved (the static page, then the widget's view), with the widget state
a saving front end (JupyterLab with "save widget state", nbclient, ``nbconvert --execute``) keeps.

For the browser test (reopening a saved notebook) and the HTML-export checks.
"""

from __future__ import annotations

import nbformat


def saved_form_cells(*forms, sources: list[str] | None = None):
    """One code cell per form, with the outputs its display makes in a notebook; and the widget
    state of every form but the last (the last is a form whose state was not saved)."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    from ipywidgets.embed import dependency_state

    InteractiveShell.instance()
    cells = []
    for k, form in enumerate(forms):
        with capture_output() as shown:
            form._ipython_display_()
        source = sources[k] if sources else repr(form)
        cell = nbformat.v4.new_code_cell(source)
        cell.outputs = [
            nbformat.v4.new_output("display_data", data=o.data, metadata=o.metadata)
            for o in shown.outputs
        ]
        cells.append(cell)
    kept = dependency_state(list(forms[:-1]))
    state = {"version_major": 2, "version_minor": 0, "state": kept}
    assert forms[-1].model_id not in kept
    return cells, {"application/vnd.jupyter.widget-state+json": state}
