"""What the dashboard shows, shared by its views: the panels (:data:`PANELS`), the card's tiles, the empty-panel notes.

A panel is a set of logged series (glob patterns over TRL's log keys), a title, and the range its
axis may show (a clip ratio or a length cannot be negative, so no view draws one below 0).
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

from labkit.charts import MAIN_SERIES, describe_number, short_label

__all__ = ["Panel", "PANELS", "TILES", "OPTIONAL_TILES", "panel_series", "panel_note", "one_point", "series_label", "overlap_note", "tiles",
           "format_value"]


@dataclass(frozen=True)
class Panel:
    """One plot of the dashboard: the series (glob patterns over logged keys) it draws."""

    key: str
    title: str
    patterns: tuple[str, ...]
    absent_note: str = "not logged by this run"  # steps arrived, none with this metric
    floor: float | None = None  # the axis never shows values below this (they cannot happen)


PANELS = (
    # a run with tools (TRL's environment_factory / tools=) also logs its tool calls per rollout and the share that
    # failed, drawn beside the rewards (notebook 08)
    Panel("reward", "reward (band: ± reward_std)", ("reward", "rewards/*/mean", "tools/call_frequency",
                                                    "tools/failure_frequency")),
    Panel("spread", "reward spread", ("reward_std", "frac_reward_zero_std"), floor=0.0),
    Panel("kl", "KL to the reference", ("kl",), absent_note="no KL logged:\nbeta = 0 (TRL's default)\n"
                                                         "loads no reference model", floor=0.0),
    Panel("clip", "clip ratio", ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"), floor=0.0),
    Panel("entropy", "entropy (nats/token)", ("entropy",), floor=0.0),
    Panel("length", "completion length (tokens)", ("completions/mean_length",), floor=0.0),
    Panel("loss", "loss", ("loss",)),
    Panel("memory", "memory (GiB)", ("memory/*",), floor=0.0),
)

# The card's tiles: (label, logged key, format). Missing values show as a dash.
TILES = (
    ("reward", "reward", "{:.3f}"),
    ("reward std", "reward_std", "{:.3f}"),
    ("zero-std groups", "frac_reward_zero_std", "{:.0%}"),
    ("KL", "kl", "{:.4f}"),
    ("clip (region)", "clip_ratio/region_mean", "{:.2%}"),
    ("entropy", "entropy", "{:.3f}"),
    ("length", "completions/mean_length", "{:.0f}"),
    ("loss", "loss", "{:.4f}"),
    # where a step's time goes (labkit.generation.GenerationClock, notebook 04): completion tokens a second, the
    # milliseconds of one decode step, and that speed as a share of the card's memory-bandwidth limit
    ("generation tok/s", "generation/tokens_per_second", "{:,.0f}"),
    ("ms / decode step", "generation/ms_per_decode_step", "{:.0f}"),
    ("of card's limit", "generation/bandwidth_share", "{:.1%}"),
)
# Tiles shown only once their key has been logged: a run on a CPU, or without labkit's clock, has no such figure,
# and a dash forever would read as a figure still to come.
OPTIONAL_TILES = {key for _, key, _ in TILES if key.startswith("generation/")}


def format_value(fmt: str, value: float) -> str:
    """Format a tile's value; NaN and infinities by name (``"{:.0%}".format(nan)`` would read "nan%")."""
    return fmt.format(value) if math.isfinite(value) else describe_number(value)


def panel_series(record, panel: Panel) -> list[str]:
    """Return the names of ``record``'s series that ``panel`` draws, the main one (the total) first."""
    names = [n for n in record.history if any(fnmatch.fnmatchcase(n, p) for p in panel.patterns)]
    return sorted(names, key=lambda n: n not in MAIN_SERIES)  # the total underneath, the parts drawn over it


def panel_note(record, panel: Panel, names: list[str]) -> str | None:
    """Return what a panel says instead of lines, or ``None`` when it has points to draw.

    Before the first step: "waiting for step 1" (a run that finished without one: "no step was logged");
    a metric this run never logs: the panel's ``absent_note``. From the first point on, the panel draws
    it, with its value (:func:`series_label`), whether the run goes on or has finished: a finished run
    never says "waiting".
    """
    if record.step is None:
        return "no step was logged" if record.finished is not None else "waiting for step 1"
    return None if names else panel.absent_note


def one_point(record, names: list[str]) -> bool:
    """Return whether every series of a panel has a single point so far (one step: a dot each, no line)."""
    return bool(names) and max(len(record.history[n][0]) for n in names) == 1


def series_label(record, name: str, with_value: bool = False) -> str:
    """Return a series' legend label: ``"correctness"``; ``with_value``: ``"correctness 0.375"``, its last value.

    A panel of single points labels each with its value: a dot alone does not say what it is.
    """
    label = short_label(name)
    return f"{label} {format_value('{:.4g}', record.latest(name))}" if with_value else label


def overlap_note(record, names: list[str]) -> str | None:
    """Return "low = high = region at every step" when a panel's series coincide (one line would hide the others)."""
    if len(names) > 1 and all(record.history[n] == record.history[names[0]] for n in names[1:]):
        return " = ".join(short_label(n) for n in names) + " at every step"
    return None


def tiles(record) -> list[tuple]:
    """Return the card's tiles as ``(label, key, shown text or None, finite)``."""
    out = []
    for label, key, fmt in TILES:
        if key in OPTIONAL_TILES and key not in record.history:
            continue
        value = record.latest(key)
        out.append((label, key, None if value is None else format_value(fmt, value),
                    value is None or math.isfinite(value)))
    return out
