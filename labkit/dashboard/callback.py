""":class:`LiveDashboard`: the thin TRL callback that feeds a :class:`RunRecord` and keeps one view of it up to date.

It holds no numbers of its own: ``dashboard.record`` has the steps, metrics, memory and the clock;
``dashboard.view`` draws them. The record is made when the dashboard is, and the view shows at once,
so a learner sees "preparing the run" during the model load and "generating completions, scoring,
updating (the first step is the slowest)" during the first step instead of an empty cell. transformers' own progress bar and its
"Step | Training Loss" table are a second clock: a trainer built by :func:`labkit.run.build_run` or
:func:`labkit.nano.trl_trainer` turns them off (``disable_tqdm=True``); with a ``GRPOTrainer`` of
your own, set ``disable_tqdm=True`` in its ``GRPOConfig`` (transformers' trainer.py adds its
``NotebookProgressCallback`` or ``ProgressCallback`` unless ``args.disable_tqdm``).
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from pathlib import Path

from transformers import TrainerCallback

from labkit.dashboard.live import FRONTENDS, NotebookView, TextView, Throttle, card, detect_frontend, static_output
from labkit.dashboard.picture import DPI, png_bytes
from labkit.dashboard.record import RunRecord

__all__ = ["LiveDashboard"]


class LiveDashboard(TrainerCallback):
    """The live dashboard of a GRPO run: ``GRPOTrainer(..., callbacks=[LiveDashboard(budget_gib=16)])``.

    From any loop: ``dashboard.log(step, {"reward": 0.4, ...})`` then ``dashboard.close()`` (or use it
    as a context manager). ``dashboard.save("run.png")`` writes the picture. Every argument but
    ``frontend``, ``min_interval_s``, ``max_overhead``, ``tick_s`` and ``autoshow`` goes to the
    :class:`RunRecord` (``title``, ``total_steps``, ``budget_gib``, ``thresholds``, ``device``,
    ``monitor``, ``clock``).

    Args:
        frontend: one of ``"auto"`` (:func:`detect_frontend`), ``"widgets"``, ``"html"``, ``"text"``, ``"none"``.
        min_interval_s: at most one redraw of the card per this many seconds (the ticker aside).
        max_overhead: the charts redraw only as often as keeps their cost under this fraction of the wall time.
        tick_s: in a notebook, the card (and its clock) is redrawn every ``tick_s`` seconds; ``None``: never.
        autoshow: show the view now, before the first step (else at :meth:`show`).
    """

    def __init__(self, *, title: str = "GRPO training", total_steps: int | None = None, frontend: str = "auto",
                 min_interval_s: float = 0.5, max_overhead: float = 0.01, tick_s: float | None = 1.0,
                 autoshow: bool = True, clock=time.perf_counter, **record_options):
        if frontend not in FRONTENDS:
            raise ValueError(f"frontend must be one of {FRONTENDS}, not {frontend!r}")
        throttle = Throttle(min_interval_s, max_overhead, clock)
        self.record = RunRecord(title, total_steps=total_steps, clock=clock, **record_options)
        self.record.status = "preparing the run (building the trainer, loading the model)"
        self.frontend = detect_frontend() if frontend == "auto" else frontend
        self.view = None
        if self.frontend in ("widgets", "html"):
            self.view = NotebookView(self.record, self.frontend, throttle, tick_s)
        elif self.frontend == "text":
            self.view = TextView(self.record, throttle)
        self.log_seconds = 0.0  # time the training thread spent in log() (the benchmark reads it)
        self._shown = False
        self._closed = False
        if autoshow:
            self.show()

    # ------------------------------------------------------------------ feeding the record

    def log(self, step=None, metrics: Mapping | None = None, **more) -> None:
        """Record ``metrics`` at ``step`` (see :meth:`RunRecord.add`) and redraw if a redraw is due."""
        started = time.perf_counter()
        with getattr(self.view, "lock", None) or contextlib.nullcontext():  # the clock's thread reads the record
            self.record.add(step, {**(metrics or {}), **more})
        if self.record.status.startswith("preparing"):
            self.record.status = "training"
        if self.view is not None and not self._closed:
            self.view.update()
        self.log_seconds += time.perf_counter() - started

    def status(self, text: str) -> None:
        """Say what the run is doing now ("evaluating", "saving"); every view shows it next to the clock."""
        self.record.status = text
        if self.view is not None and not self._closed and self._shown:
            self.view.update(force_plot=False)

    def show(self) -> None:
        """Display the view in the current cell's output; it then updates in place."""
        if self.view is not None and not self._shown:
            self._shown = True
            self.view.show()

    def render(self) -> None:
        """Redraw now, charts included, whatever the throttle says."""
        if self.view is not None and not self._closed:
            self.view.update(force_plot=True)

    def close(self) -> None:
        """Stop the clock and leave the saved picture and the summary (in a terminal, print the summary)."""
        if self._closed:
            return
        self.record.finish()
        if self.view is not None:
            self.view.close()
        self._closed = True

    def __enter__(self) -> "LiveDashboard":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ reading (all from the record)

    def summary(self) -> str:
        """Return the run's final line, ``"GRPO: 4 / 4 steps in 5 min 06 s"``: the clock the views show."""
        return self.record.summary()

    def html(self) -> str:
        """Return the card (progress, latest numbers, memory gauge) as HTML."""
        return card(self.record)

    def _repr_html_(self) -> str:
        return self.html()

    def static_output(self, dpi: int | None = None) -> dict:
        """Return what :meth:`close` leaves in the notebook: the picture (PNG) and the summary (text)."""
        return static_output(self.record, dpi)

    def save(self, path: str | os.PathLike, dpi: int = 120) -> Path:
        """Write the picture (every point up to the last step) as a PNG to ``path`` and return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png_bytes(self.record, dpi or DPI))
        return path

    # ------------------------------------------------------------------ TrainerCallback hooks

    def on_train_begin(self, args, state, control, **kwargs):
        if self.record.total_steps is None and getattr(state, "max_steps", 0):
            self.record.total_steps = int(state.max_steps)
        self.on_step_begin(args, state, control)

    def on_step_begin(self, args, state, control, **kwargs):
        first = getattr(state, "global_step", 0) == 0
        self.status("generating completions, scoring, updating" + (" (the first step is the slowest)" if first else ""))

    def on_step_end(self, args, state, control, **kwargs):
        if getattr(state, "is_world_process_zero", True):
            self.record.step_done(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if getattr(state, "is_world_process_zero", True):
            self.log(state.global_step, logs or {})

    def on_train_end(self, args, state, control, **kwargs):
        if getattr(state, "is_world_process_zero", True):
            self.close()
