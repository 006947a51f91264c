"""Interactive figures that survive saving: labelled controls above a figure redrawn in place as an image.

``ipywidgets.interact`` draws its figure inside a widget, and a widget needs a live kernel: after
the notebook is saved and reopened, or opened by someone else, it reads "Error displaying widget"
and the picture is gone. :func:`explore` draws the figure as a plain PNG output instead, updated
in place through a display id, so the saved notebook keeps the last picture the learner made.
The controls themselves come back when the cell runs again. Used by the clipping explorer of
``01_grpo_objective.ipynb`` and the memory estimator of ``05_full_vs_lora.ipynb``.
"""
from __future__ import annotations

import io
from typing import Callable

__all__ = ["figure_png", "explore", "Explorer", "note_bundle"]


def figure_png(figure, dpi: int = 90) -> bytes:
    """Return a matplotlib ``Figure`` (or the figure of an ``Axes``) as PNG bytes, and close it.

    Closed, so that the inline backend does not draw it a second time at the end of the cell.
    """
    import matplotlib.pyplot as plt

    figure = getattr(figure, "figure", figure)  # an Axes gives its figure
    if not hasattr(figure, "savefig"):
        raise TypeError(f"expected a matplotlib Figure or Axes, got {type(figure).__name__}")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


class Explorer:
    """What :func:`explore` shows: ``controls`` (name -> widget), the figure's display handle and the last PNG."""

    def __init__(self, draw: Callable, controls: dict, dpi: int):
        self.draw, self.controls, self.dpi = draw, controls, dpi
        self.handle = None  # set by explore() once the picture is shown
        self.redraw()  # the first picture: a draw that fails, fails here, before anything is shown

    def values(self) -> dict:
        """The controls' current values, by name: the keyword arguments ``draw`` is called with."""
        return {name: control.value for name, control in self.controls.items()}

    def redraw(self, change=None) -> None:
        """Draw the figure for the current values and replace the picture in place."""
        from IPython.display import Image

        self.png = figure_png(self.draw(**self.values()), self.dpi)
        if self.handle is not None:
            self.handle.update(Image(self.png))


# JupyterLab's widget renderer gives its own node the class "jupyter-widgets" only when it fails (a live view puts
# the class on the control inside it): in a cell that carries the note, a failed view is hidden, leaving the note.
_HIDE_FAILED_VIEW = ("<style>.jp-Cell:has(.labkit-widget-note) "
                     ".jp-OutputArea-output.jupyter-widgets{display:none}</style>")


def note_bundle(sentence: str) -> dict:
    """Return a display bundle for ``sentence``, the note beside controls that need a running kernel.

    As HTML in JupyterLab it also hides the cell's "Error displaying widget: model not found" after
    a reopen: a style rule, no script (JupyterLab's sanitiser keeps ``<style>``, and asks before
    running a script in a notebook it does not trust); as plain text everywhere else.
    """
    from html import escape

    return {"text/plain": sentence,
            "text/html": f'<div class="labkit-widget-note">{escape(sentence)}</div>{_HIDE_FAILED_VIEW}'}


def explore(draw: Callable, controls: dict, *, dpi: int = 90) -> Explorer:
    """Display ``controls`` and, below them, the figure ``draw(**values)`` returns; redraw it when one moves.

    ``controls`` maps each keyword argument of ``draw`` to an ipywidgets control; every control
    needs a ``description`` (a learner cannot use an unlabelled slider: refused). ``draw`` returns
    a matplotlib ``Figure`` or ``Axes``. The picture is a PNG output, not a widget, so it survives
    saving and reopening the notebook.
    """
    import ipywidgets as widgets
    from IPython.display import Image, display

    if not controls:
        raise ValueError("explore needs at least one control: {name: ipywidgets control}")
    unlabelled = [name for name, control in controls.items() if not str(getattr(control, "description", "")).strip()]
    if unlabelled:
        raise ValueError(f"controls {unlabelled} have no description: give each a description=... with its unit, "
                         "so the learner knows what it sets")
    explorer = Explorer(draw, controls, dpi)
    box = widgets.VBox(list(controls.values()))
    bundle = box._repr_mimebundle_()
    names = ", ".join(str(control.description) for control in controls.values())
    sentence = f"Controls: {names}. They need a running kernel: after reopening the notebook, run this cell to use them."
    # Shown as text above the controls, live and after a save: JupyterLab draws a saved widget view as
    # "Error displaying widget: model not found" and never shows the text/plain fallback below.
    display(note_bundle(sentence), raw=True)
    bundle["text/plain"] = f"[{sentence}]"  # where no widget manager runs (GitHub, nbviewer): the same sentence
    display(bundle, raw=True)
    explorer.handle = display(Image(explorer.png), display_id=True)
    for control in controls.values():
        control.observe(explorer.redraw, names="value")
    return explorer
