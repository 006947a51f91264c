"""The record of a run: :class:`RunRecord`, the one place that holds its steps, metrics, clock and memory.

Every view of the dashboard (the live card and charts, the saved picture, the terminal line) reads
the step counter, the elapsed time and the numbers from one :class:`RunRecord`, so they cannot
disagree: a view never counts steps or starts a clock of its own. The record also says what the run
is doing now (:attr:`RunRecord.status`: "preparing the run", "generating completions..."), so a
display can show it before the first, slowest step has produced a number. The status never repeats the
step counter: "3 / 8 steps done" is the only step number a view shows.
"""
from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping

from labkit.charts import as_float, describe_number
from labkit.memory import GIB
from labkit.monitor import MemorySnapshot, gauge_level, memory_snapshot

__all__ = ["RunRecord", "GAUGE_COLOURS", "format_seconds"]

GAUGE_COLOURS = {"green": "#2e9d4f", "amber": "#f0a202", "red": "#d64545"}
# The time left runs at the pace of the latest steps (at most this many), not of the whole run, so that it follows a
# machine whose other work changes during the run (issue 55: 04 took 65 min, not 9, as the load went from 3 to 9).
PACE_STEPS = 5


def format_seconds(seconds: float) -> str:
    """``75.4`` -> ``"75 s"``, ``306`` -> ``"5 min 06 s"``: whole seconds, rounded down, as every view prints them."""
    whole = int(seconds)
    return f"{whole} s" if whole < 120 else f"{whole // 60} min {whole % 60:02d} s"


class RunRecord:
    """Steps, metrics, memory and the clock of one run; what every dashboard view draws.

    ``add(step, metrics)`` records a logging step; ``status`` says what the run is doing now;
    ``finish()`` stops the clock, after which every view shows the same final time.

    Args:
        title: the run's name, shown by every view.
        total_steps: for "step 3 / 8" and the time left (TRL's ``max_steps`` when a trainer sets it).
        budget_gib: the memory gauge's budget; default the GPU's memory, or the machine's RAM on a CPU.
        thresholds: fractions of the budget where the gauge turns amber and red.
        device: whose memory to read (``"cuda"``, ``"cpu"``, a ``DeviceInfo``); default the GPU if any.
        monitor: a running :class:`labkit.monitor.VRAMMonitor`, whose per-phase peaks the card lists.
        clock: seconds as a float (``time.perf_counter``); tests pass a fake one.
    """

    def __init__(self, title: str = "GRPO training", *, total_steps: int | None = None,
                 budget_gib: float | None = None, thresholds: tuple[float, float] = (0.75, 0.90), device=None,
                 monitor=None, clock=time.perf_counter):
        if budget_gib is not None and budget_gib <= 0:
            raise ValueError(f"budget_gib must be positive, not {budget_gib}")
        gauge_level(1, 1, thresholds)  # validates the thresholds
        self.title = title
        self.total_steps = total_steps
        self.budget_gib = budget_gib
        self.thresholds = tuple(thresholds)
        self.device = device
        self.monitor = monitor
        self.clock = clock
        self.started = clock()  # the one clock: from the moment the record exists (model load included)
        self.finished: float | None = None
        self.status = "starting"
        self.step: int | None = None  # the last step done
        self.first_step: int | None = None
        self.pace: deque = deque(maxlen=PACE_STEPS + 1)  # (step, clock) of the latest steps: the time left's pace
        self.history: dict[str, tuple[list[int], list[float]]] = {}
        self.nonfinite: dict[str, tuple[int, float]] = {}  # name -> (first step, value) of a NaN or inf
        self.bad_steps: list = []  # step numbers that were not finite numbers (counted on instead)
        self.snapshot: MemorySnapshot | None = None

    # ------------------------------------------------------------------ writing

    def add(self, step=None, metrics: Mapping | None = None) -> int:
        """Record ``metrics`` and memory at ``step`` and return the step used.

        ``None`` and non-numeric values are skipped; NaN and infinities are kept (see :meth:`alerts`).
        ``step=None``, or a step that is not a finite number, continues from the last step.
        """
        number = as_float(step)
        if number is None or not math.isfinite(number):
            if step is not None:
                self.bad_steps.append(step)
            step = 0 if self.step is None else self.step + 1
        else:
            step = int(number)
        self.step_done(step)
        for name, value in (metrics or {}).items():
            number = as_float(value)
            if number is None:
                continue
            steps, values = self.history.setdefault(str(name), ([], []))
            steps.append(step)
            values.append(number)
            if not math.isfinite(number) and str(name) not in self.nonfinite:
                self.nonfinite[str(name)] = (step, number)
        self._add_memory(step)
        return step

    def step_done(self, step: int) -> None:
        """Move the step counter to ``step`` (a trainer's ``global_step`` after a step)."""
        if self.first_step is None:
            self.first_step = step
        self.step = step
        if not self.pace or self.pace[-1][0] != step:
            self.pace.append((step, self.clock()))

    def _add_memory(self, step: int) -> None:
        snap = self.snapshot = memory_snapshot(self.device)
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

    def finish(self, status: str = "finished") -> None:
        """Stop the clock (once): from now on every view shows the same final time; ``status`` says why."""
        if self.finished is None:
            self.finished = self.clock()
            self.status = status

    # ------------------------------------------------------------------ reading

    @property
    def elapsed(self) -> float:
        """Seconds since the record was made, up to :meth:`finish` once it was called."""
        return (self.finished if self.finished is not None else self.clock()) - self.started

    def steps_done(self) -> int:
        """Steps done so far (TRL counts from 1; a loop that counts from 0 has done ``step + 1``)."""
        if self.step is None:
            return 0
        return self.step + (1 if self.first_step == 0 else 0)

    def progress(self) -> str:
        """Return the one progress line every view shows: steps, time, what is happening."""
        total = f" / {self.total_steps}" if self.total_steps else ""
        text = f"{self.steps_done()}{total} steps done · {format_seconds(self.elapsed)}"
        if self.finished is None and self.total_steps and self.pace and self.steps_done() < self.total_steps:
            text += f" · about {format_seconds((self.total_steps - self.steps_done()) * self.seconds_per_step())} left"
        return f"{text} · {self.status}" if self.status else text

    def seconds_per_step(self) -> float:
        """Return the seconds a step takes at the pace of the latest :data:`PACE_STEPS` steps (the time left's pace);
        before a second step, the time since the record began over the steps done (model load included)."""
        (first, start), (last, end) = self.pace[0], self.pace[-1]
        if last > first:
            return (end - start) / (last - first)
        return self.elapsed / max(self.steps_done() - max((self.first_step or 0) - 1, 0), 1)

    def summary(self) -> str:
        """Return the final line: ``"GRPO: 4 / 4 steps in 5 min 06 s"``, with the clock's final reading."""
        total = f" / {self.total_steps}" if self.total_steps else ""
        return f"{self.title}: {self.steps_done()}{total} steps in {format_seconds(self.elapsed)}"

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

    def budget(self) -> float:
        """Return the gauge's budget in GiB: the one given, else the device's total memory."""
        if self.budget_gib is not None:
            return self.budget_gib
        return (self.snapshot or memory_snapshot(self.device)).total / GIB

    def gauge(self) -> dict:
        """Return the memory gauge: ``used_gib``, ``budget_gib``, ``fraction``, ``level``, ``colour``, ``label``."""
        snap = self.snapshot or memory_snapshot(self.device)
        budget = self.budget()
        used = snap.used / GIB
        level = gauge_level(used, budget, self.thresholds)
        return {"used_gib": used, "budget_gib": budget, "fraction": used / budget, "level": level,
                "colour": GAUGE_COLOURS[level], "label": snap.source, "gpu": snap.kind == "cuda"}
