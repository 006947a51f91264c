"""The views a running dashboard draws: :class:`NotebookView` (card + SVG charts) and :class:`TextView` (a terminal bar).

Both read everything (step, clock, numbers, status) from one :class:`RunRecord`; where the process runs decides
which one is used (:func:`detect_frontend`). While a run is live, the notebook view's card is redrawn every
``tick_s`` seconds by a small thread, so the clock moves during a long step; the charts follow the
throttle (:class:`Throttle`) so that drawing stays under ``max_overhead`` of the wall time; between
cells the clock waits. At :meth:`NotebookView.close` the live view is replaced by the saved picture (a
PNG and the summary), because widget views do not survive a save and images do; a cell that raises
mid-run (IPython's ``post_run_cell`` sees the error) closes it too, saying what stopped the run.
"""
from __future__ import annotations

import base64
import sys
import threading
import time

from labkit.charts import MAIN_SERIES, PALETTE, band_points, card_html, gauge_html, svg_chart, thin, zone_bounds
from labkit.dashboard.panels import PANELS, one_point, panel_note, panel_series, series_label, tiles
from labkit.dashboard.picture import png_bytes
from labkit.dashboard.record import GAUGE_COLOURS, RunRecord
from labkit.monitor import memory_snapshot

__all__ = ["detect_frontend", "progress_bar", "NotebookView", "TextView", "card", "charts", "static_output",
           "FRONTENDS"]

FRONTENDS = ("auto", "widgets", "html", "text", "none")


def detect_frontend() -> str:
    """Return how this process can show a live dashboard: ``"widgets"``, ``"html"`` or ``"text"``.

    ``"html"`` (a display updated in place, no widget): Colab (which draws ipywidgets 8 only through a
    separate widget manager), a kernel without ipywidgets, and a kernel that offers subshells (ipykernel 7:
    "kernel subshells" in its ``kernel_info``). JupyterLab 4.6 sends a widget's messages over a subshell
    (its setting ``commsOverSubshells``, default ``perCommTarget``): the first widget opened in a cell makes it
    ask the kernel for one on the control channel, whose busy and idle statuses the status bar then shows
    as the kernel's, "Idle" until the cell ends (issue 46 item 9). A display opens no comm. ``"widgets"``:
    a kernel with ipywidgets 8 and no subshells; ``"text"``: a terminal, a script, or terminal IPython.
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is None or getattr(shell, "kernel", None) is None:
        return "text"
    if "google.colab" in sys.modules or "kernel subshells" in _kernel_features(shell.kernel):
        return "html"
    try:
        import ipywidgets
    except ModuleNotFoundError as exc:  # not installed: draw without widgets. A broken install still raises.
        if exc.name != "ipywidgets":
            raise
        return "html"
    return "widgets" if int(ipywidgets.__version__.split(".")[0]) >= 8 else "html"


def _kernel_features(kernel) -> list:
    """Return the ``supported_features`` of a kernel's ``kernel_info`` (ipykernel 7), or ``[]``."""
    try:
        return list(kernel.kernel_info.get("supported_features", []))
    except Exception:  # noqa: BLE001 - an older or foreign kernel object: no features to go by
        return []


def progress_bar(iterable=None, *, desc: str = "", total: int | None = None, enabled: bool = True, **kwargs):
    """Return a tqdm bar that stays readable after a save: in a kernel, text on stdout redrawn in place.

    tqdm.auto's widget bar reads "Error displaying widget: model not found" once the notebook is
    reopened, and a bar on stderr sits in a red box that looks like an error. In a terminal: tqdm's
    usual bar on stderr. ``enabled=False`` draws nothing.
    """
    from tqdm.std import tqdm

    in_kernel = detect_frontend() != "text"
    options = {"file": sys.stdout, "ncols": 100} if in_kernel else {"file": sys.stderr, "dynamic_ncols": True}
    options.update(kwargs)
    return tqdm(iterable, desc=desc, total=total, disable=not enabled, leave=True, **options)


def card(record: RunRecord) -> str:
    """Return the card as HTML: the progress line, the latest numbers and the memory gauge."""
    snap = record.snapshot or memory_snapshot(record.device)
    gauge = gauge_html(snap, record.gauge(), record.thresholds, record.monitor)
    return card_html(record.title, record.progress(), tiles(record), record.alerts(), gauge, GAUGE_COLOURS["red"])


def charts(record: RunRecord) -> str:
    """Return the live charts: one SVG per panel of :data:`PANELS` (at most 240 points a line)."""
    out = []
    for panel in PANELS:
        names = panel_series(record, panel)
        note = panel_note(record, panel, names)
        single = note is None and one_point(record, names)  # one step so far: dots, each labelled with its value
        lines, colours, extra = [], iter(PALETTE), {"floor": panel.floor, "legend": True if single else None}
        for name in names if note is None else []:
            steps, values = thin(*record.history[name])
            main = name in MAIN_SERIES
            lines.append((name, series_label(record, name, with_value=single), steps, values,
                          "#000" if main else next(colours, "#777"), 3.0 if main else 1.5, name.startswith("rewards/")))
        if lines and panel.key == "reward" and "reward_std" in record.history:
            extra["band"] = band_points(thin(*record.history["reward"]), record.history["reward_std"])
        if lines and panel.key == "memory":
            budget = record.budget()
            extra["zones"] = zone_bounds(budget, record.thresholds, GAUGE_COLOURS)
            extra["hline"] = (budget, GAUGE_COLOURS["red"])
            extra["ylim"] = (0, max([budget * 1.08] + [max(line[3]) * 1.1 for line in lines]))
        out.append(svg_chart(panel.key, panel.title, lines, note=note or "", **extra))
    return ('<div class="labkit-charts" style="display:flex;flex-wrap:wrap;gap:4px;max-width:1060px">'
            + "".join(out) + "</div>")


def static_output(record: RunRecord, dpi: int | None = None) -> dict:
    """Return the mime bundle a closed dashboard leaves: the picture (PNG) and the summary line (text)."""
    png = png_bytes(record) if dpi is None else png_bytes(record, dpi)
    return {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": f"{record.summary()} | {text_line(record)}"}


def text_line(record: RunRecord, short: bool = False) -> str:
    """Return the latest numbers and memory in one line (the terminal's view)."""
    parts = [f"{label}={shown}" for label, _, shown, _ in tiles(record)[:4 if short else None] if shown is not None]
    g = record.gauge()
    where = "GPU" if g["gpu"] else "no CUDA GPU, RSS"
    parts.append(f"mem({where})={g['used_gib']:.1f}/{g['budget_gib']:.1f}GiB[{g['level']}]")
    if short:
        return " ".join(parts)
    return f"{record.title}: {record.progress()} | " + " ".join(parts) + "".join(f" | {a}" for a in record.alerts())


class Throttle:
    """When to redraw: the card at most every ``min_interval_s``; the charts as rarely as keeps them under ``max_overhead``."""

    def __init__(self, min_interval_s: float = 0.5, max_overhead: float = 0.01, clock=time.perf_counter):
        if not 0 < max_overhead <= 1:
            raise ValueError(f"max_overhead is a fraction of wall time in (0, 1], not {max_overhead}")
        self.min_interval_s, self.max_overhead, self.clock = min_interval_s, max_overhead, clock
        self.plot_interval = min_interval_s
        self.last_card = self.last_plot = -float("inf")
        self.render_seconds: list[float] = []

    def due(self) -> str | None:
        """Return ``"plot"``, ``"card"`` or ``None``: what an update now should redraw."""
        now = self.clock()
        if now - self.last_plot >= self.plot_interval:
            return "plot"
        return "card" if now - self.last_card >= self.min_interval_s else None

    def plotted(self, cost: float) -> None:
        """Note a chart redraw that took ``cost`` seconds; the next waits long enough to stay under budget."""
        self.render_seconds.append(cost)
        if len(self.render_seconds) > 1:  # the first pays one-off costs (imports, the first comm message)
            self.plot_interval = max(self.min_interval_s, cost / self.max_overhead)
        self.last_plot = self.last_card = self.clock()


class NotebookView:
    """The live card and charts in a notebook (``"widgets"`` or ``"html"``), then the saved picture."""

    def __init__(self, record: RunRecord, frontend: str, throttle: Throttle, tick_s: float | None = 1.0):
        self.record, self.frontend, self.throttle, self.tick_s = record, frontend, throttle, tick_s
        self.card_updates = self.plot_renders = 0
        self.widgets = None
        self.handle = None
        self.payload = None
        self._charts = ""
        self.lock = threading.RLock()
        self._ticker = None
        self._closed = threading.Event()
        self._idle = threading.Event()  # set when the cell that feeds the view has ended: the clock waits
        self._shell = None
        if frontend == "widgets":
            import ipywidgets as widgets  # now, not inside the first timed update

            box = widgets.VBox([widgets.HTML(layout=widgets.Layout(width="100%")),
                                widgets.HTML(layout=widgets.Layout(width="100%"))],
                               layout=widgets.Layout(max_width="1080px"))
            box.children[1].add_class("labkit-dashboard-plot")
            box.add_class("labkit-dashboard")
            self.widgets = {"card": box.children[0], "plot": box.children[1], "box": box}

    def show(self) -> None:
        """Display the view in the current cell's output (it then updates in place) and start the clock's ticker."""
        from IPython.display import HTML, display

        with self.lock:
            self.push(plot=True)
            shown = self.widgets["box"] if self.widgets is not None else HTML(self.payload)
            self.handle = display(shown, display_id=True)
        if self.tick_s and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="labkit-dashboard-clock", daemon=True)
            self._ticker.start()
        from IPython import get_ipython

        self._shell = get_ipython()
        if self._shell is not None and hasattr(self._shell, "events"):
            self._shell.events.register("post_run_cell", self._cell_ended)

    def _cell_ended(self, result) -> None:
        """The cell ended: nothing feeds the view until the next log(). A cell that raised (an out-of-memory
        error mid-run) leaves the picture of the run so far, not a live view that a save would lose."""
        self._idle.set()
        error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        if error is not None:
            self.record.finish(f"stopped by {type(error).__name__}")
            self.close()

    def _tick(self) -> None:
        while not self._closed.wait(self.tick_s):
            if self._idle.is_set():
                continue
            try:
                self.push(plot=False)
            except Exception:  # noqa: BLE001 - a clock that cannot redraw (the front end went away) stops;
                return  # training goes on, and the next log() still updates the view

    def update(self, force_plot: bool = False) -> None:
        """Redraw what the throttle says is due (the charts too if ``force_plot``)."""
        self._idle.clear()
        due = "plot" if force_plot else self.throttle.due()
        if due is not None:
            self.push(plot=due == "plot")

    def push(self, plot: bool) -> None:
        """Send the card (and the charts if ``plot``) to the notebook."""
        with self.lock:
            if self._closed.is_set():
                return
            started = self.throttle.clock()
            if plot:
                self._charts = charts(self.record)
            html = card(self.record)
            if self.widgets is not None:
                self.widgets["card"].value = html
                if plot:
                    self.widgets["plot"].value = self._charts
            else:
                self.payload = (f'<div class="labkit-dashboard">{html}<div class="labkit-dashboard-plot">'
                                f'{self._charts}</div></div>')
                if self.handle is not None:
                    from IPython.display import HTML

                    self.handle.update(HTML(self.payload))
            self.card_updates += 1
            self.plot_renders += int(plot)
            if plot:
                self.throttle.plotted(self.throttle.clock() - started)
            else:
                self.throttle.last_card = self.throttle.clock()

    def close(self) -> None:
        """Replace the live view by the saved picture (:func:`static_output`) and free the widgets."""
        with self.lock:
            if self._closed.is_set():
                return
            self._closed.set()
            if self._shell is not None:
                try:
                    self._shell.events.unregister("post_run_cell", self._cell_ended)
                except ValueError:  # already gone
                    pass
            if self.handle is not None:
                self.handle.update(static_output(self.record), raw=True)
            if self.widgets is not None:
                for widget in self.widgets.values():
                    widget.close()  # the view is gone; free the models in the kernel
                self.widgets = None


class TextView:
    """A tqdm bar on stderr with the latest numbers; the summary line at :meth:`close`."""

    def __init__(self, record: RunRecord, throttle: Throttle):
        self.record, self.throttle = record, throttle
        self.card_updates = self.plot_renders = 0
        self.bar = None

    def show(self) -> None:
        self.update(force_plot=True)

    def update(self, force_plot: bool = False) -> None:
        if self.bar is None:
            from tqdm.std import tqdm  # the terminal bar, whatever tqdm.auto would guess

            self.bar = tqdm(total=self.record.total_steps, desc=self.record.title, unit="step", dynamic_ncols=True,
                            file=sys.stderr)
        if force_plot or self.throttle.due() is not None:
            self.bar.set_postfix_str(text_line(self.record, short=True), refresh=False)
            self.card_updates += 1
            self.throttle.last_card = self.throttle.clock()
        self.bar.update(self.record.steps_done() - self.bar.n)  # tqdm redraws at most every 0.1 s

    def close(self) -> None:
        if self.bar is not None:
            self.update(force_plot=True)
            self.bar.refresh()
            self.bar.close()
            self.bar = None
            print(f"{self.record.summary()} | {text_line(self.record)}", file=sys.stderr)
