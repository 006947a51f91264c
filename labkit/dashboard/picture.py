"""The saved picture of a run: :func:`draw_figure` draws a :class:`RunRecord` as eight matplotlib panels.

The picture is what stays in a saved notebook (a PNG survives a save; a widget does not), so it is
drawn to be read as saved, at 100 % zoom: every label at least 9 px (:data:`MIN_FONT_PX`), the
total reward drawn under the per-function rewards (which carry markers, so a function equal to the
total stays visible), axes that cannot show impossible values (:attr:`Panel.floor`), and a panel
with one point so far (a one-step run) draws it as a dot and names its value in the legend, instead of an
empty frame or a "waiting" that a finished run would never end.
"""
from __future__ import annotations

import io
import math

from labkit.charts import MAIN_SERIES, PALETTE, mark_nonfinite, reward_band, budget_zones, short_label
from labkit.dashboard.panels import PANELS, one_point, overlap_note, panel_note, panel_series, series_label, tiles
from labkit.dashboard.record import GAUGE_COLOURS, RunRecord

__all__ = ["draw_figure", "png_bytes", "memory_replay_png", "FIGSIZE", "DPI", "MIN_FONT_PX", "FONT_PT"]

FIGSIZE = (12.0, 7.0)  # inches: 960 x 560 px at DPI, narrower than a JupyterLab output area (no downscaling)
DPI = 80  # of the PNG left in the notebook
MIN_FONT_PX = 9  # the smallest text allowed in the saved picture at 100 % zoom
LEGEND_ROW_PT = 16  # the height of one row of a legend above a panel (9.5 pt text and its spacing)
FONT_PT = {"tick": 9.5, "legend": 9.5, "note": 10, "title": 11, "suptitle": 12}  # 9.5 pt at 80 dpi = 10.6 px


def draw_figure(record: RunRecord, *, dpi: int = DPI, figsize: tuple[float, float] = FIGSIZE):
    """Return ``(figure, {panel key: Axes})``: every panel of :data:`PANELS` drawn from ``record``.

    A plain ``matplotlib.figure.Figure`` (never pyplot's, so nothing is shown twice in a notebook).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    if min(FONT_PT.values()) * dpi / 72 < MIN_FONT_PX:
        raise ValueError(f"at {dpi} dpi the smallest text would be under {MIN_FONT_PX} px: use dpi >= 70")
    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    grid = fig.subplots(2, 4)
    axes, legend_rows = {}, {}
    for panel, ax in zip(PANELS, grid.flat):
        axes[panel.key] = ax
        names = panel_series(record, panel)
        note = panel_note(record, panel, names)
        ax.set_xlabel("step", fontsize=FONT_PT["tick"], labelpad=1)
        ax.tick_params(labelsize=FONT_PT["tick"])
        ax.xaxis.set_major_locator(MaxNLocator(5, integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(5))
        ax.grid(alpha=0.3)
        pad = 6
        if note is not None:
            ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", fontsize=FONT_PT["note"],
                    color="#555")
            ax.set_xticks([])
            ax.set_yticks([])
        else:
            single = one_point(record, names)  # one step so far: dots, each named with its value
            _draw_lines(ax, record, panel.key, names, with_values=single)
            same = overlap_note(record, names)
            if same:  # the lines lie on each other: say so rather than let one hide the rest
                ax.text(0.5, 0.62, _fit_note(same), transform=ax.transAxes, ha="center", va="center",
                        fontsize=FONT_PT["note"], color="#555")
            if len(names) > 1 or single:  # above the plot, under the title: a legend inside the axes covers the lines
                columns = 1 if max(len(series_label(record, n, single)) for n in names) > 12 else min(len(names), 2)
                ax.legend(fontsize=FONT_PT["legend"], loc="lower left", bbox_to_anchor=(0.0, 1.0),
                          ncol=columns, frameon=False, borderaxespad=0.1, handlelength=2.0, columnspacing=0.8)
                legend_rows[panel.key] = math.ceil(len(names) / columns)
                pad += LEGEND_ROW_PT * legend_rows[panel.key]
            _limit_axis(ax, record, panel, names)
        ax.set_title(panel.title, fontsize=FONT_PT["title"], pad=pad)
    numbers = {key: f"{label} {shown}" for label, key, shown, _ in tiles(record) if shown is not None}
    timing = [numbers.pop(k).removeprefix("generation ") for k in list(numbers) if k.startswith("generation/")]
    lines = [f"{record.title} · {record.progress()}", "last step: " + " · ".join(numbers.values())]
    if timing:  # where the step's time goes: a line of its own
        lines.append("generation: " + " · ".join(timing))
    fig.suptitle("\n".join(lines), x=0.01, y=0.99, ha="left", va="top", fontsize=FONT_PT["suptitle"])
    alerts = record.alerts()
    line = 0.3 / figsize[1]  # one line of the title, as a fraction of the height
    if alerts:
        fig.text(0.01, 0.99 - len(lines) * line, "\n".join(alerts), ha="left", va="top", fontsize=FONT_PT["suptitle"],
                 fontweight="bold", color=GAUGE_COLOURS["red"])
    # The space above each row of panels holds a title and two legend rows; a panel with more (a run with tools
    # logs four reward series) gets more, instead of a legend printed over the title and the numbers above it.
    keys = [panel.key for panel in PANELS]
    more = [max(0, max((legend_rows.get(k, 0) for k in row), default=0) - 2) * LEGEND_ROW_PT / 72
            for row in (keys[:4], keys[4:])]  # inches
    top = 0.99 - (len(lines) + len(alerts)) * line - 0.09 - more[0] / figsize[1]
    bottom = 0.07
    height = (top - bottom) * figsize[1]  # inches for two rows of axes and the gap between them
    gap = 0.75 * height / 2.75 + more[1]  # hspace 0.75 with two legend rows at most, plus the extra rows
    fig.subplots_adjust(left=0.05, right=0.99, bottom=bottom, top=top, wspace=0.32, hspace=2 * gap / (height - gap))
    return fig, axes


NOTE_CHARS = 28  # the widest line of a note inside a panel (10 pt at 80 dpi): wider runs over the tick labels


def _fit_note(text: str) -> str:
    """Return ``text`` in lines of at most :data:`NOTE_CHARS` characters, broken at " = " and before "at every step"
    ("reward = right_answer_reward at every step" ran across the neighbouring tick labels on one line)."""
    head, tail = (text[:-len(" at every step")], "at every step") if text.endswith(" at every step") else (text, "")
    lines = [""]
    for part in head.split(" = "):
        joined = f"{lines[-1]} = {part}" if lines[-1] else part
        if lines[-1] and len(joined) > NOTE_CHARS:
            lines[-1] += " ="
            lines.append(part)
        else:
            lines[-1] = joined
    return "\n".join(lines + ([tail] if tail else []))


def _draw_lines(ax, record: RunRecord, key: str, names: list[str], with_values: bool = False) -> None:
    colours = iter(PALETTE)
    for name in names:
        steps, values = record.history[name]
        finite = [v if math.isfinite(v) else math.nan for v in values]  # NaN or inf: a gap, marked in red
        label = series_label(record, name, with_values)
        if name in MAIN_SERIES:  # the total, thick and underneath: the parts drawn over it stay visible
            alone = sum(math.isfinite(v) for v in values) == 1  # a line of one point draws nothing: a dot
            ax.plot(steps, finite, color="black", lw=2.6, alpha=0.55, zorder=2, label=label,
                    marker="o" if alone else None, ms=7)
        else:
            ax.plot(steps, finite, color=next(colours, "#777"), lw=1.5, marker="o", ms=3.5, zorder=3,
                    ls="--" if name.startswith("rewards/") else "-", label=label)
    mark_nonfinite(ax, {short_label(n): record.history[n] for n in names}, GAUGE_COLOURS["red"])
    if key == "reward" and "reward" in record.history and "reward_std" in record.history:
        band = reward_band(ax, record.history["reward"], record.history["reward_std"])
        if band is not None:  # autoscale only looks at lines: make room for the band too
            ax.update_datalim(band.get_paths()[0].vertices)
    if key == "memory":
        budget_zones(ax, record.budget(), record.thresholds, GAUGE_COLOURS)


def _limit_axis(ax, record: RunRecord, panel, names: list[str]) -> None:
    ax.autoscale_view()
    low, high = ax.get_ylim()
    steps = {s for n in names for s in record.history[n][0]}
    if len(steps) == 1:  # every point at one step: that step's tick only, and an axis as wide as the values
        step, = steps
        ax.set_xlim(step - 1, step + 1)
        ax.set_xticks([step])
        ys = [v for n in names for v in record.history[n][1] if math.isfinite(v)] or [0.0]
        span = max(max(ys) - min(ys), max(abs(v) for v in ys)) or 1.0
        middle = (max(ys) + min(ys)) / 2
        low, high = middle - 0.56 * span, middle + 0.56 * span
    if panel.key == "memory":
        tops = [max(v) * 1.1 for n, (_, v) in record.history.items() if n.startswith("memory/") and v]
        low, high = 0.0, max([record.budget() * 1.08] + tops)
    elif panel.floor is not None and low < panel.floor:
        low = panel.floor
    if high - low < 1e-9:  # a flat line at the floor (a clip ratio of 0 throughout)
        high = low + 1.0 if low == 0 else low + abs(low) * 0.1
    ax.set_ylim(low, high)
    ax.ticklabel_format(axis="y", useOffset=False)  # "0.0526", never "+5.26e-2" beside tiny offsets


def png_bytes(record: RunRecord, dpi: int = DPI) -> bytes:
    """Return :func:`draw_figure`'s picture of ``record`` as PNG bytes."""
    fig, _ = draw_figure(record, dpi=dpi)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def memory_replay_png(record: dict, *, step: int | None = -1, figsize: tuple[float, float] = (12.0, 4.0),
                      dpi: int = 90) -> bytes:
    """Return a PNG of a recorded run's memory, phase by phase, replayed without its device.

    ``record`` is what ``python -m bench gpu`` keeps of a measured run's dashboard
    (``results/gpu/dashboard_laptop-16gb.json``): :meth:`labkit.monitor.VRAMMonitor.from_record` rebuilds the
    monitor and :meth:`~labkit.monitor.VRAMMonitor.plot` draws ``step`` (-1: the last) against the card's
    budget. Notebook 04 shows a real 16 GB run's memory this way on a CPU.
    """
    from labkit.explorer import figure_png
    from labkit.monitor import VRAMMonitor

    figure = VRAMMonitor.from_record(record).plot(step=step, budget_gib=record["budget_gib"], figsize=figsize)
    return figure_png(figure, dpi)

