"""The live dashboard of a GRPO run: :class:`LiveDashboard`, a TRL callback with reward and memory panels.

:class:`LiveDashboard` is a ``transformers.TrainerCallback``: pass it to TRL's ``GRPOTrainer``
(``callbacks=[dashboard]``) and it plots what the trainer logs at every logging step, or feed
it yourself from any loop with ``dashboard.log(step, metrics)`` (the nano loop does). It shows

- the reward (total and per reward function, ``rewards/<func>/mean``), ``reward_std`` and
  ``frac_reward_zero_std`` (the share of groups whose completions all scored the same, which
  therefore have zero advantage and teach nothing), the KL to the reference model (only logged
  when ``beta > 0``), the clip ratios, the entropy, the completion length and the loss;
- memory: what PyTorch's caching allocator holds (``allocated`` by live tensors, ``reserved``
  in total, the ``peak``), and what the whole GPU has in use according to NVML (so memory held
  outside PyTorch, by vLLM or another process, counts), as a gauge against a budget that turns
  amber at 75 % and red at 90 %. Without a CUDA GPU it shows this process's memory (RSS) and says so.

Where it runs decides how it draws (:func:`detect_frontend`): ipywidgets 8 in JupyterLab and
VS Code (an HTML card and eight small SVG charts, updated in place), a display handle updated
in place in Colab, and a tqdm progress bar with the latest numbers in a terminal.
``dashboard.save("run.png")`` and ``dashboard.figure`` give the same panels as a matplotlib figure.
At :meth:`LiveDashboard.close` that figure, as a PNG, replaces the live view: widget views do not
survive a save (reopened, they read "Error displaying widget: model not found"), images do; so do
the text bars of :func:`progress_bar`. A NaN or infinite metric is shown as such, never dropped
(a red "loss is NaN since step N"; the charts mark the steps).

Drawing costs time on the training thread, so updates are throttled: at most one every
``min_interval_s`` (two a second), and the charts only as often as keeps their cost under
``max_overhead`` of the wall time. The live charts are SVG that the browser draws
(:mod:`labkit.charts`); ``python -m labkit bench dashboard`` measures the whole overhead.
The memory readings come from :mod:`labkit.monitor`.

Used from ``04_lora_grpo_16gb.ipynb`` on, where it watches TRL's ``GRPOTrainer``.
"""
from __future__ import annotations

import base64
import fnmatch
import io
import math
import os
import random
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from transformers import TrainerCallback

from labkit.charts import (MAIN_SERIES, PALETTE, as_float, card_html, describe_number, gauge_html, mark_nonfinite,
                           budget_zones, reward_band, short_label, svg_chart, thin)
from labkit.memory import GIB
from labkit.monitor import MemorySnapshot, VRAMMonitor, gauge_level, memory_snapshot

__all__ = ["LiveDashboard", "detect_frontend", "progress_bar", "Panel", "PANELS", "GAUGE_COLOURS", "FRONTENDS",
           "simulated_run"]

FRONTENDS = ("auto", "widgets", "html", "text", "none")
GAUGE_COLOURS = {"green": "#2e9d4f", "amber": "#f0a202", "red": "#d64545"}


# ----------------------------------------------------------------------------- where it runs


def detect_frontend() -> str:
    """Return how this process can show a live dashboard: ``"widgets"``, ``"html"`` or ``"text"``.

    - ``"widgets"``: an IPython kernel (JupyterLab, Notebook 7, VS Code) and ipywidgets 8.
    - ``"html"``: Colab, or a kernel without ipywidgets: a display handle updated in place,
      which every notebook front end renders. (Colab draws ipywidgets 8 only through its
      separate custom widget manager, so the lab does not rely on it there.)
    - ``"text"``: a terminal, a script, or terminal IPython (no kernel to draw in).
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is None or getattr(shell, "kernel", None) is None:
        return "text"
    if "google.colab" in sys.modules:
        return "html"
    try:
        import ipywidgets
    except ModuleNotFoundError as exc:  # not installed: draw without widgets. A broken install still raises.
        if exc.name != "ipywidgets":
            raise
        return "html"
    return "widgets" if int(ipywidgets.__version__.split(".")[0]) >= 8 else "html"


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


# ----------------------------------------------------------------------------- what it plots


@dataclass(frozen=True)
class Panel:
    """One plot of the dashboard: the series (glob patterns over logged keys) it draws."""

    key: str
    title: str
    patterns: tuple[str, ...]
    empty_note: str = "waiting for data"  # before the first step
    absent_note: str = "not logged by this run"  # steps arrived, none with this metric


PANELS = (
    Panel("reward", "reward (band: ± reward_std)", ("reward", "rewards/*/mean")),
    Panel("spread", "reward spread", ("reward_std", "frac_reward_zero_std")),
    Panel("kl", "KL to the reference", ("kl",), absent_note="no KL logged:\nbeta = 0 (TRL's default)\n"
                                                         "loads no reference model"),
    Panel("clip", "clip ratio", ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")),
    Panel("entropy", "entropy (nats/token)", ("entropy",)),
    Panel("length", "completion length (tokens)", ("completions/mean_length",)),
    Panel("loss", "loss", ("loss",)),
    Panel("memory", "memory (GiB)", ("memory/*",)),
)

# The card's tiles: (label, logged key, format). Missing values show as a dash.
_TILES = (
    ("reward", "reward", "{:.3f}"),
    ("reward std", "reward_std", "{:.3f}"),
    ("zero-std groups", "frac_reward_zero_std", "{:.0%}"),
    ("KL", "kl", "{:.4f}"),
    ("clip (region)", "clip_ratio/region_mean", "{:.2%}"),
    ("entropy", "entropy", "{:.3f}"),
    ("length", "completions/mean_length", "{:.0f}"),
    ("loss", "loss", "{:.4f}"),
)


def _format(fmt: str, value: float) -> str:
    """Format a tile's value; NaN and infinities by name (``"{:.0%}".format(nan)`` would read "nan%")."""
    return fmt.format(value) if math.isfinite(value) else describe_number(value)


# ----------------------------------------------------------------------------- the dashboard


class LiveDashboard(TrainerCallback):
    """Live plots of a GRPO run's metrics and memory; a ``transformers.TrainerCallback``.

    With TRL: ``GRPOTrainer(..., callbacks=[LiveDashboard(budget_gib=16)])``. From any loop:
    ``dashboard.log(step, {"reward": 0.4, "kl": 0.01, ...})`` then ``dashboard.close()`` (or use
    it as a context manager). ``dashboard.save("run.png")`` writes the panels as a PNG.

    Args:
        title: shown above the numbers and the charts.
        total_steps: for the progress and the time left (TRL's ``max_steps`` when not given).
        budget_gib: the memory budget of the gauge, e.g. 16 for a 16 GB card; default: the
            GPU's total memory, or the machine's RAM on a CPU.
        thresholds: fractions of the budget where the gauge turns amber and red.
        frontend: one of :data:`FRONTENDS`; ``"auto"`` asks :func:`detect_frontend`.
        device: whose memory to show (``"cuda"``, ``"cpu"``, a ``DeviceInfo``); default: the GPU if any.
        monitor: a running :class:`VRAMMonitor`, whose per-phase peaks the card then lists.
        min_interval_s: at most one update of the display per this many seconds.
        max_overhead: the charts are redrawn only as often as keeps their cost under this fraction
            of the wall time (the numbers and the gauge update regardless).
        dpi, figsize: of the matplotlib figure that :meth:`save` writes.
        autoshow: display the dashboard at its first update (else call :meth:`show`).
    """

    def __init__(self, *, title: str = "GRPO training", total_steps: int | None = None,
                 budget_gib: float | None = None, thresholds: tuple[float, float] = (0.75, 0.90),
                 frontend: str = "auto", device=None, monitor: "VRAMMonitor | None" = None,
                 min_interval_s: float = 0.5, max_overhead: float = 0.01, dpi: int = 80,
                 figsize: tuple[float, float] = (13.0, 6.4), autoshow: bool = True, clock=time.perf_counter):
        if frontend not in FRONTENDS:
            raise ValueError(f"frontend must be one of {FRONTENDS}, not {frontend!r}")
        if not 0 < max_overhead <= 1:
            raise ValueError(f"max_overhead is a fraction of wall time in (0, 1], not {max_overhead}")
        if budget_gib is not None and budget_gib <= 0:
            raise ValueError(f"budget_gib must be positive, not {budget_gib}")
        gauge_level(1, 1, thresholds)  # validates the thresholds
        self.title = title
        self.total_steps = total_steps
        self.budget_gib = budget_gib
        self.thresholds = tuple(thresholds)
        self.frontend = detect_frontend() if frontend == "auto" else frontend
        self.device = device
        self.monitor = monitor
        self.min_interval_s = min_interval_s
        self.max_overhead = max_overhead
        self.dpi = dpi
        self.figsize = figsize
        self.autoshow = autoshow
        self._clock = clock
        self.history: dict[str, tuple[list[int], list[float]]] = {}
        self.step: int | None = None
        self.nonfinite: dict[str, tuple[int, float]] = {}  # name -> (first step, value) of a NaN or inf
        self.bad_steps: list = []  # step numbers that were not finite numbers (counted on instead)
        self.snapshot: MemorySnapshot | None = None
        # what updating cost: counts and seconds spent (the benchmark reads these)
        self.card_updates = 0
        self.plot_renders = 0
        self.render_seconds: list[float] = []
        self.log_seconds = 0.0
        self._start: float | None = None
        self._first_step: int | None = None
        self._last_card = -math.inf
        self._last_plot = -math.inf
        self._plot_interval = min_interval_s
        self._plot_stale = False
        self._shown = False
        self._closed = False
        self._figure = None
        self._axes: dict[str, object] = {}
        self._lines: dict[tuple[str, str], object] = {}
        self._extras: dict[str, object] = {}
        self._widgets = None
        self._handle = None  # the "html" front end's display handle
        self._html_payload: str | None = None
        self._last_charts = ""
        self._bar = None
        if self.frontend == "widgets":
            self._ensure_widgets()  # imports ipywidgets now, not inside the first timed update

    # ------------------------------------------------------------------ recording

    def log(self, step: int | None = None, metrics: Mapping | None = None, **more) -> None:
        """Record ``metrics`` (and memory) at ``step`` and update the display if an update is due.

        ``None`` and non-numeric values are skipped, so a series has a point only where a value
        was logged. NaN and infinite values are kept (a diverging run must look like one): see
        :meth:`alerts`. ``step=None`` (or a step that is not a finite number) continues from the
        last step.
        """
        started = self._clock()
        if self._start is None:
            self._start = started
        number = as_float(step)
        if number is None or not math.isfinite(number):
            if step is not None:
                self.bad_steps.append(step)
            step = 0 if self.step is None else self.step + 1
        else:
            step = int(number)
        if self._first_step is None:
            self._first_step = step
        self.step = step
        for name, value in {**(metrics or {}), **more}.items():
            number = as_float(value)
            if number is not None:
                name = str(name)
                steps, values = self.history.setdefault(name, ([], []))
                steps.append(step)
                values.append(number)
                if not math.isfinite(number) and name not in self.nonfinite:
                    self.nonfinite[name] = (step, number)
        self._record_memory(step)
        self._plot_stale = True
        self._maybe_update(started)
        self.log_seconds += self._clock() - started

    def _record_memory(self, step: int) -> None:
        snap = memory_snapshot(self.device)
        self.snapshot = snap
        if snap.kind == "cuda":
            readings = {"memory/allocated": snap.allocated, "memory/reserved": snap.reserved,
                        "memory/peak": snap.peak, "memory/device_used": snap.device_used}
        else:
            readings = {"memory/process_rss": snap.process_rss}
        for name, value in readings.items():
            if value is None:
                continue
            steps, values = self.history.setdefault(name, ([], []))
            if steps and steps[-1] == step:  # TRL logs the run's summary at the last step again
                values[-1] = value / GIB
            else:
                steps.append(step)
                values.append(value / GIB)

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """Return ``(steps, values)`` recorded for ``name`` (empty lists if never logged)."""
        steps, values = self.history.get(name, ([], []))
        return list(steps), list(values)

    def latest(self, name: str, default=None):
        """Return the last value logged for ``name``, or ``default``."""
        values = self.history.get(name, ((), ()))[1]
        return values[-1] if values else default

    def alerts(self) -> list[str]:
        """Return one line per metric that was ever NaN or infinite: ``"loss is NaN since step 12"``."""
        lines = []
        for name, (step, value) in self.nonfinite.items():
            steps, values = self.history[name]
            if not math.isfinite(values[-1]):
                lines.append(f"{name} is {describe_number(values[-1])} since step {step}")
            else:
                lines.append(f"{name} was {describe_number(value)} at step {step} (finite again at step {steps[-1]})")
        if self.bad_steps:
            lines.append(f"{len(self.bad_steps)} step number(s) were not finite ({self.bad_steps[0]!r}); "
                         "counted on from the previous step")
        return lines

    def gauge(self) -> dict:
        """Return the memory gauge: ``used_gib``, ``budget_gib``, ``fraction``, ``level``, ``colour``, ``label``."""
        snap = self.snapshot or memory_snapshot(self.device)
        budget = self.budget_gib if self.budget_gib is not None else snap.total / GIB
        used = snap.used / GIB
        level = gauge_level(used, budget, self.thresholds)
        return {"used_gib": used, "budget_gib": budget, "fraction": used / budget, "level": level,
                "colour": GAUGE_COLOURS[level], "label": snap.source, "gpu": snap.kind == "cuda"}

    # ------------------------------------------------------------------ throttled updates

    def _maybe_update(self, now: float) -> None:
        if self.frontend == "none":
            return
        if self.frontend == "text":
            self._update_text(card=now - self._last_card >= self.min_interval_s)
            return
        if now - self._last_plot >= self._plot_interval:
            self.render()
        elif now - self._last_card >= self.min_interval_s:
            self._push(plot=False)

    def render(self) -> None:
        """Update the display now, charts included, whatever the throttle says."""
        if self.frontend == "none":
            return
        if self.frontend == "text":
            self._update_text(card=True)
            return
        started = self._clock()
        self._push(plot=True)
        cost = self._clock() - started
        self.render_seconds.append(cost)
        # The next redraw waits long enough that drawing stays under max_overhead of the wall time.
        # The first one pays one-off costs (imports, the first comm message): not a guide.
        if self.plot_renders > 1:
            self._plot_interval = max(self.min_interval_s, cost / self.max_overhead)
        self._last_plot = self._clock()

    def _push(self, plot: bool) -> None:
        card = self.html()
        charts = self.charts_html() if plot else None
        if self.frontend == "widgets":
            self._ensure_widgets()
            self._widgets["card"].value = card
            if charts is not None:
                self._widgets["plot"].value = charts
        else:  # "html": one display handle, replaced in place
            if charts is not None:
                self._last_charts = charts
            self._html_payload = f'<div class="labkit-dashboard">{card}{self._last_charts}</div>'
        if not self._shown and self.autoshow:
            self.show()
        elif self._handle is not None and self.frontend == "html":
            from IPython.display import HTML

            self._handle.update(HTML(self._html_payload))
        self.card_updates += 1
        self.plot_renders += int(plot)
        self._last_card = self._clock()

    def _update_text(self, card: bool) -> None:
        if self._bar is None:
            from tqdm.std import tqdm  # the terminal bar, whatever tqdm.auto would guess

            self._bar = tqdm(total=self.total_steps, desc=self.title, unit="step", dynamic_ncols=True,
                             file=sys.stderr)
        if card:
            self._bar.set_postfix_str(self.text_summary(short=True), refresh=False)
            self.card_updates += 1
            self._last_card = self._clock()
        if self.step is not None:  # TRL counts steps from 1; a loop may count from 0
            done = self.step + (1 if self._first_step == 0 else 0)
            self._bar.update(done - self._bar.n)  # tqdm redraws at most every 0.1 s

    def _ensure_widgets(self) -> None:
        if self._widgets is not None:
            return
        import ipywidgets as widgets

        card = widgets.HTML(layout=widgets.Layout(width="100%"))
        plot = widgets.HTML(layout=widgets.Layout(width="100%"))
        plot.add_class("labkit-dashboard-plot")
        box = widgets.VBox([card, plot], layout=widgets.Layout(max_width="1080px"))
        box.add_class("labkit-dashboard")
        self._widgets = {"card": card, "plot": plot, "box": box}

    def show(self) -> None:
        """Display the dashboard in the current cell's output (it then updates in place)."""
        self._shown = True
        if self.frontend == "widgets":
            from IPython.display import display

            self._ensure_widgets()
            self._handle = display(self._widgets["box"], display_id=True)  # close() swaps in the static figure
        elif self.frontend == "html":
            from IPython.display import HTML, display

            if self._html_payload is None:
                self._html_payload = f'<div class="labkit-dashboard">{self.html()}</div>'
            self._handle = display(HTML(self._html_payload), display_id=True)
        elif self.frontend == "text":
            self._update_text(card=True)

    def static_output(self, dpi: int | None = None) -> dict:
        """Return the mime bundle that replaces the live view at :meth:`close`: the figure (PNG) and the summary (text).

        Images and text are saved with the notebook and render when it is reopened; widget views do not.
        """
        return {"image/png": base64.b64encode(self._png(dpi)).decode("ascii"), "text/plain": self.text_summary()}

    def close(self) -> None:
        """Draw the final state and leave it as a static figure (:meth:`static_output`); in a terminal, print the summary."""
        if self._closed:
            return
        self._closed = True
        if self.frontend in ("widgets", "html") and self.step is not None:
            self.render()
            if self._handle is not None:
                self._handle.update(self.static_output(), raw=True)
                if self._widgets is not None:
                    for widget in self._widgets.values():
                        widget.close()  # the view is gone; free the models in the kernel
                    self._widgets = None
        elif self.frontend == "text" and self._bar is not None:
            self._update_text(card=True)
            self._bar.refresh()
            self._bar.close()
            print(self.text_summary(), file=sys.stderr)

    def __enter__(self) -> "LiveDashboard":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ text and HTML

    def _elapsed(self) -> float:
        return 0.0 if self._start is None else self._clock() - self._start

    def _progress(self) -> str:
        if self.step is None:
            return "waiting for the first step"
        elapsed = self._elapsed()
        text = f"step {self.step}" + (f" / {self.total_steps}" if self.total_steps else "")
        text += f" · {elapsed:.0f} s elapsed"
        done = self.step - (self._first_step or 0)
        if self.total_steps and done > 0 and self.step < self.total_steps:
            left = (self.total_steps - self.step) * elapsed / done
            text += f" · ~{left:.0f} s left"
        return text

    def text_summary(self, short: bool = False) -> str:
        """Return one line with the latest numbers and memory (the terminal's view)."""
        parts = []
        for label, key, fmt in _TILES[:4] if short else _TILES:
            value = self.latest(key)
            if value is not None:
                parts.append(f"{label}={_format(fmt, value)}")
        g = self.gauge()
        where = "GPU" if g["gpu"] else "no CUDA GPU, RSS"
        parts.append(f"mem({where})={g['used_gib']:.1f}/{g['budget_gib']:.1f}GiB[{g['level']}]")
        if short:
            return " ".join(parts)
        return f"{self.title}: {self._progress()} | " + " ".join(parts) + "".join(f" | {a}" for a in self.alerts())

    def html(self) -> str:
        """Return the card: progress, the latest numbers and the memory gauge, as HTML."""
        tiles = [(label, key, None if self.latest(key) is None else _format(fmt, self.latest(key)),
                  self.latest(key) is None or math.isfinite(self.latest(key))) for label, key, fmt in _TILES]
        gauge = gauge_html(self.snapshot or memory_snapshot(self.device), self.gauge(), self.thresholds,
                           self.monitor, GAUGE_COLOURS["red"])
        return card_html(self.title, self._progress(), tiles, self.alerts(), gauge, GAUGE_COLOURS["red"])

    def _repr_html_(self) -> str:
        return self.html()

    def _note(self, panel: Panel) -> str:
        """What an empty panel says: still waiting, or the run does not log this metric."""
        return panel.empty_note if self.step is None else panel.absent_note

    def _panel_series(self, panel: Panel) -> list[str]:
        return [n for n in self.history if any(fnmatch.fnmatchcase(n, p) for p in panel.patterns)]

    def charts_html(self) -> str:
        """Return the live charts: one SVG per panel of :data:`PANELS`, as HTML (at most 240 points a line)."""
        charts = []
        for panel in PANELS:
            lines, colours = [], iter(PALETTE)
            for name in self._panel_series(panel):
                steps, values = thin(*self.history[name])
                main = name in MAIN_SERIES
                lines.append((name, short_label(name), steps, values, "#000" if main else next(colours, "#777"),
                              2.0 if main else 1.3, name.startswith("rewards/")))
            extra = {}
            if panel.key == "reward" and "reward" in self.history and "reward_std" in self.history:
                std = dict(zip(*self.history["reward_std"]))
                steps, mean = thin(*self.history["reward"])
                kept = [(s, m, std[s]) for s, m in zip(steps, mean) if s in std]
                extra["band"] = ([s for s, _, _ in kept], [m - d for _, m, d in kept], [m + d for _, m, d in kept])
            if panel.key == "memory" and lines:
                budget = self._budget_gib()
                amber, red = self.thresholds
                extra["zones"] = ((0, amber * budget, GAUGE_COLOURS["green"]),
                                  (amber * budget, red * budget, GAUGE_COLOURS["amber"]),
                                  (red * budget, budget, GAUGE_COLOURS["red"]))
                extra["hline"] = (budget, GAUGE_COLOURS["red"])
                extra["ylim"] = (0, max([budget * 1.08] + [max(line[3]) * 1.1 for line in lines]))
            charts.append(svg_chart(panel.key, panel.title, lines, note=self._note(panel), **extra))
        return ('<div class="labkit-charts" style="display:flex;flex-wrap:wrap;gap:4px;max-width:1060px">'
                + "".join(charts) + "</div>")

    # ------------------------------------------------------------------ the figure

    @property
    def figure(self):
        """The panels as a matplotlib ``Figure`` (a plain one, never pyplot's), up to the last step."""
        return self.draw()

    @property
    def axes(self) -> dict:
        """``{panel key: Axes}`` for every panel of :data:`PANELS`."""
        self.draw()
        return dict(self._axes)

    def _build_figure(self):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        fig = Figure(figsize=self.figsize, dpi=self.dpi)
        FigureCanvasAgg(fig)
        grid = fig.subplots(2, 4)
        fig.subplots_adjust(left=0.045, right=0.99, top=0.83, bottom=0.08, wspace=0.3, hspace=0.6)
        for panel, ax in zip(PANELS, grid.flat):
            ax.set_title(panel.title, fontsize=10, pad=4)
            ax.set_xlabel("step", fontsize=8, labelpad=1)
            ax.tick_params(labelsize=8)
            ax.xaxis.set_major_locator(MaxNLocator(5, integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(5))
            ax.grid(alpha=0.3)
            note = ax.text(0.5, 0.5, panel.empty_note, transform=ax.transAxes, ha="center", va="center",
                           fontsize=9, color="#777")
            self._extras[f"note:{panel.key}"] = note
            self._axes[panel.key] = ax
        self._extras["suptitle"] = fig.suptitle("", x=0.01, y=0.99, ha="left", va="top", fontsize=11)
        self._extras["alerts"] = fig.text(0.01, 0.99, "", ha="left", va="top", fontsize=11, fontweight="bold",
                                          color=GAUGE_COLOURS["red"])
        self._figure = fig

    def draw(self):
        """Return the figure after bringing every line up to date with :attr:`history`."""
        if self._figure is None:
            self._build_figure()
        for panel in PANELS:
            ax = self._axes[panel.key]
            names = self._panel_series(panel)
            added = False
            for name in names:
                line = self._lines.get((panel.key, name))
                if line is None:
                    style = {"lw": 1.3, "ls": "--" if name.startswith("rewards/") else "-"}
                    if name in MAIN_SERIES:
                        style = {"lw": 2.0, "color": "black"}  # the total: per-function lines are dashed
                    (line,) = ax.plot([], [], label=short_label(name), **style)
                    self._lines[(panel.key, name)] = line
                    added = True
                steps, values = self.history[name]
                line.set_data(steps, [v if math.isfinite(v) else math.nan for v in values])  # NaN: a gap
            self._draw_nonfinite(ax, panel, names)
            if panel.key == "reward":
                self._draw_reward_band(ax)
            if panel.key == "memory":
                self._draw_budget(ax)
            note = self._extras[f"note:{panel.key}"]
            note.set_text(self._note(panel))
            note.set_visible(not names)
            ax.tick_params(labelbottom=bool(names), labelleft=bool(names))  # no axis numbers without data
            if added and len(names) > 1:
                # above the plot, under the title: a legend inside the axes covers the lines
                ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=min(len(names), 3),
                          frameon=False, borderaxespad=0.1, handlelength=1.6, columnspacing=0.8)
                ax.set_title(panel.title, fontsize=10, pad=4 + 10 * math.ceil(len(names) / 3))
            ax.relim()
            band = self._extras.get("band") if panel.key == "reward" else None
            if band is not None:  # relim() only looks at lines: make room for the band too
                ax.update_datalim(band.get_paths()[0].vertices)
            ax.autoscale_view()
            if panel.key == "memory":
                top = max([self._budget_gib() * 1.08] + [max(v) * 1.1 for n, (_, v) in self.history.items()
                                                         if n.startswith("memory/") and v])
                ax.set_ylim(0, top)
        numbers = [f"{label} {_format(fmt, self.latest(key))}" for label, key, fmt in _TILES
                   if self.latest(key) is not None]
        self._extras["suptitle"].set_text(f"{self.title} · {self._progress()}\nlast step: " + " · ".join(numbers))
        alerts = self.alerts()
        line = 0.27 / self._figure.get_figheight()  # one 11-point line, as a fraction of the height
        self._extras["alerts"].set_text("\n".join(alerts))
        self._extras["alerts"].set_y(0.99 - 2 * line)
        self._figure.subplots_adjust(top=0.99 - (2 + len(alerts)) * line - 0.06)
        return self._figure

    def _draw_nonfinite(self, ax, panel: Panel, names: list[str]) -> None:
        for artist in self._extras.pop(f"bad:{panel.key}", []):
            artist.remove()
        self._extras[f"bad:{panel.key}"] = mark_nonfinite(
            ax, {short_label(name): self.history[name] for name in names}, GAUGE_COLOURS["red"])

    def _draw_reward_band(self, ax) -> None:
        old = self._extras.pop("band", None)
        if old is not None:
            old.remove()
        if "reward" in self.history and "reward_std" in self.history:
            self._extras["band"] = reward_band(ax, self.history["reward"], self.history["reward_std"])

    def _budget_gib(self) -> float:
        if self.budget_gib is not None:
            return self.budget_gib
        return (self.snapshot or memory_snapshot(self.device)).total / GIB

    def _draw_budget(self, ax) -> None:
        budget = self._budget_gib()
        if self._extras.get("budget_value") != budget:
            for artist in self._extras.pop("budget", []):
                artist.remove()
            self._extras["budget"] = budget_zones(ax, budget, self.thresholds, GAUGE_COLOURS)
            self._extras["budget_value"] = budget

    def _png(self, dpi: int | None = None) -> bytes:
        fig = self.draw()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi or self.dpi)
        return buffer.getvalue()

    def save(self, path: str | os.PathLike, dpi: int = 120) -> Path:
        """Write the panels (every point up to the last step) as a PNG to ``path`` and return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self._png(dpi))
        return path

    # ------------------------------------------------------------------ TrainerCallback hooks

    def on_train_begin(self, args, state, control, **kwargs):
        if self.total_steps is None and getattr(state, "max_steps", 0):
            self.total_steps = int(state.max_steps)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if getattr(state, "is_world_process_zero", True):
            self.log(state.global_step, logs or {})

    def on_train_end(self, args, state, control, **kwargs):
        if getattr(state, "is_world_process_zero", True):
            self.close()


# ----------------------------------------------------------------------------- a simulated run


def simulated_run(steps: int = 60, *, seed: int = 0, reward_funcs: tuple[str, ...] = ("correctness", "format"),
                  beta: float = 0.04) -> Iterator[tuple[int, dict]]:
    """Yield ``(step, logs)`` shaped like TRL's ``GRPOTrainer`` logs, from made-up numbers.

    For demos, tests and the benchmark only: nothing is trained. Rewards rise noisily, the
    format reward first; ``kl`` appears only when ``beta > 0``; like TRL, some values are ``None``
    (a reward function that scored nothing) and some keys are missing on some steps.
    """
    rng = random.Random(seed)
    for step in range(1, steps + 1):
        progress = step / steps
        fmt = min(1.0, 0.15 + 1.6 * progress + rng.gauss(0, 0.06))
        correct = max(0.0, min(1.0, 0.08 + 0.55 * progress ** 1.5 + rng.gauss(0, 0.05)))
        per_func = dict(zip(reward_funcs, (correct, fmt, 0.5)))
        logs = {f"rewards/{name}/mean": per_func.get(name, 0.5) for name in reward_funcs}
        logs.update({f"rewards/{name}/std": abs(rng.gauss(0.3, 0.05)) for name in reward_funcs})
        logs["reward"] = sum(logs[f"rewards/{name}/mean"] for name in reward_funcs)
        logs["reward_std"] = abs(rng.gauss(0.55 - 0.2 * progress, 0.04))
        logs["frac_reward_zero_std"] = max(0.0, min(1.0, 0.5 - 0.3 * progress + rng.gauss(0, 0.05)))
        if beta > 0:
            logs["kl"] = 0.03 * progress * (1 + rng.gauss(0, 0.1))
        logs["entropy"] = 1.8 - 0.6 * progress + rng.gauss(0, 0.03)
        logs["completions/mean_length"] = 180 - 70 * progress + rng.gauss(0, 6)
        logs["completions/clipped_ratio"] = max(0.0, 0.2 - 0.15 * progress)
        logs["loss"] = rng.gauss(0, 0.02) + beta * logs.get("kl", 0.0)
        logs["grad_norm"] = abs(rng.gauss(0.6, 0.1))
        logs["learning_rate"] = 1e-6 * (1 - progress)
        logs["step_time"] = abs(rng.gauss(1.0, 0.05))
        if step % 4:  # TRL only logs clip ratios when the importance ratio moved
            logs.update({"clip_ratio/low_mean": 0.002 * progress, "clip_ratio/high_mean": 0.004 * progress,
                         "clip_ratio/region_mean": 0.006 * progress})
        if step % 7 == 0:  # a batch where a reward function scored nothing: TRL logs None
            logs[f"rewards/{reward_funcs[0]}/mean"] = None
        yield step, logs
