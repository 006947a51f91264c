"""labkit.explorer: labelled controls above a figure that is a plain image, redrawn in place."""
import ipywidgets as widgets
import matplotlib
import matplotlib.pyplot as plt
import pytest

from labkit.explorer import explore, figure_png

matplotlib.use("Agg")
PNG = b"\x89PNG\r\n\x1a\n"


def _draw(height, colour="tab:blue"):
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.bar([0], [height], color=colour)
    ax.set_ylim(0, 10)
    return ax  # an Axes is accepted as well as a Figure


def test_figure_png_is_a_png_and_closes_the_figure():
    ax = _draw(3)
    before = len(plt.get_fignums())
    assert figure_png(ax).startswith(PNG)
    assert len(plt.get_fignums()) == before - 1  # closed: the inline backend will not draw it again
    with pytest.raises(TypeError, match="matplotlib Figure or Axes"):
        figure_png("not a figure")


def test_moving_a_control_redraws_the_picture():
    height = widgets.IntSlider(value=2, min=0, max=10, description="height (units)")
    colour = widgets.Dropdown(options=["tab:blue", "tab:red"], description="colour")
    explorer = explore(_draw, {"height": height, "colour": colour})
    first = explorer.png
    assert first.startswith(PNG) and explorer.values() == {"height": 2, "colour": "tab:blue"}
    height.value = 9
    assert explorer.png != first and explorer.values()["height"] == 9
    second = explorer.png
    colour.value = "tab:red"
    assert explorer.png not in (first, second)
    assert plt.get_fignums() == []  # every drawing was closed after it became an image


def test_unlabelled_controls_and_a_broken_draw_are_refused_before_anything_shows(capsys):
    with pytest.raises(ValueError, match=r"\['height'\] have no description"):
        explore(_draw, {"height": widgets.IntSlider(value=2)})
    with pytest.raises(ValueError, match="at least one control"):
        explore(_draw, {})
    with pytest.raises(TypeError):  # draw() does not take 'width': fails on the first drawing
        explore(_draw, {"width": widgets.IntSlider(value=2, description="width")})
    assert "VBox" not in capsys.readouterr().out  # nothing was displayed


def test_the_saved_controls_say_what_they_are_without_a_kernel(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append((obj, kw)))
    explore(_draw, {"height": widgets.IntSlider(value=2, description="height (units)")})
    sentence = ("Controls: height (units). They need a running kernel: after reopening the notebook, run this cell "
                "to use them.")
    assert shown[0][0]["text/plain"] == sentence and shown[0][1] == {"raw": True}  # JupyterLab shows it after a save
    bundle, options = shown[1]
    assert options == {"raw": True} and "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == f"[{sentence}]"
    assert type(shown[2][0]).__name__ == "Image" and shown[2][1] == {"display_id": True}  # then the picture


def test_the_note_hides_only_a_failed_widget_view_in_its_own_cell():
    from labkit.explorer import note_bundle

    bundle = note_bundle("Controls: a <b> & c. Run this cell.")
    assert bundle["text/plain"] == "Controls: a <b> & c. Run this cell."
    html = bundle["text/html"]
    assert "a &lt;b&gt; &amp; c" in html and "<script" not in html  # escaped text; no script to be trusted
    note_class = html.split('class="')[1].split('"')[0]
    rule = html.split("<style>")[1].split("</style>")[0]
    # scoped to the cell that holds this note, and to the renderer's failure class (a live view's node lacks it)
    assert rule.startswith(f".jp-Cell:has(.{note_class}) ") and ".jp-OutputArea-output.jupyter-widgets" in rule
