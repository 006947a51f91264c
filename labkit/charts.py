"""The lab's drawings: the live dashboard's SVG line charts, card of numbers and memory gauge, as HTML; and the memory
figures, an estimate's terms against a card (:func:`plot_breakdown`) and the peaks the lab recorded beside the
estimate (:func:`memory_columns`).

Why SVG text and not matplotlib for the live view: measured by ``python -m bench dashboard``
(``results/dashboard_bench.json``), eight matplotlib panels take about 240 ms a redraw and the same charts as SVG
about 2.5 ms; under the dashboard's 2 % budget matplotlib could redraw once every 12 s, the SVG charts every 0.5 s.
The saved picture, drawn once, is matplotlib's (:mod:`labkit.dashboard.picture`).
:func:`svg_chart` draws one panel; the helpers thin long series and choose round tick values.
:func:`card_html` and :func:`gauge_html` draw the card above the charts; :func:`mark_nonfinite` and
:func:`reward_band` are pieces of the matplotlib figure; :func:`band_points` and :func:`zone_bounds` serve both.
:func:`plot_breakdown` stacks an estimate's terms, phase by phase, under a card's memory (``05_full_vs_lora.ipynb``).
:func:`memory_columns` reads what ``python -m bench`` recorded in ``results/``: the estimate beside the rehearsed and
the measured peak (``04_lora_grpo_16gb.ipynb``); the measurements themselves are made by the ``bench`` folder beside
this package.
"""
from __future__ import annotations

import html
import math
import os

from labkit.device import Card, card as card_named
from labkit.memory import GIB, MemoryEstimate, gib

__all__ = ["svg_chart", "card_html", "gauge_html", "mark_nonfinite", "reward_band", "band_points", "budget_zones",
           "zone_bounds", "thin", "short_label", "as_float", "describe_number", "PALETTE", "LIVE_POINTS", "MAIN_SERIES",
           "plot_breakdown", "memory_columns"]


# TRL 1.16's tool metrics (trl/trainer/grpo_trainer.py lines 2312-2320): tool calls per rollout, and the share of calls
# that failed in TRL's sense (raised, or named no tool: lines 1976-1994). A tool's own refusal, an "error: ..." string it
# returns (the calculator's division by zero), is a successful call there: the label says "raised", not "errors".
_TOOL_LABELS = {"tools/call_frequency": "tool calls per rollout", "tools/failure_frequency": "tool calls that raised"}


def short_label(name: str) -> str:
    """``rewards/correctness/mean`` -> ``correctness``; ``clip_ratio/low_mean`` -> ``low``;
    ``tools/call_frequency`` -> ``tool calls per rollout``; ``tools/failure_frequency`` -> ``tool calls that raised``."""
    if name in _TOOL_LABELS:
        return _TOOL_LABELS[name]
    if name.startswith("rewards/") and name.endswith("/mean"):
        return name[len("rewards/"):-len("/mean")]
    if name.startswith("clip_ratio/"):
        return name.split("/", 1)[1].removesuffix("_mean")
    if name.startswith("memory/"):
        return name.split("/", 1)[1].replace("_", " ")
    return name


def as_float(value) -> float | None:
    """Return ``value`` as a float, or ``None`` when it is not a number (TRL logs ``None`` when no sample was valid).

    NaN and infinities are kept: a diverging run must show as one, never be dropped. An integer too
    large for a float (``10**400``) is an infinity of its sign.
    """
    if value is None or isinstance(value, (bool, str)):
        return None
    if hasattr(value, "item"):
        try:
            value = value.item()
        except (ValueError, RuntimeError):  # a tensor with more than one element
            return None
    try:
        return float(value)
    except OverflowError:  # float(10**400)
        return math.inf if value > 0 else -math.inf
    except (TypeError, ValueError):
        return None


def describe_number(value: float) -> str:
    """``nan`` -> ``"NaN"``, ``inf`` -> ``"+inf"``, ``-inf`` -> ``"-inf"``: how the dashboard names a non-finite value."""
    if math.isnan(value):
        return "NaN"
    return "+inf" if value > 0 else "-inf"


PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#17becf", "#7f7f7f")


LIVE_POINTS = 240  # points per series in the live charts; the saved figure keeps every point


MAIN_SERIES = ("reward", "memory/device_used", "memory/process_rss")  # drawn black and thick


def thin(steps: list, values: list, limit: int = LIVE_POINTS) -> tuple[list, list]:
    """Return at most about ``limit`` evenly spaced points of a series, always with the last one."""
    n = len(steps)
    if n <= limit:
        return steps, values
    index = list(range(0, n, math.ceil(n / limit)))
    if index[-1] != n - 1:
        index.append(n - 1)
    return [steps[i] for i in index], [values[i] for i in index]


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Return round tick values (steps of 1, 2, 2.5 or 5 times a power of ten) between ``low`` and ``high``."""
    if not high > low:
        return [low]
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if raw <= m * magnitude * (1 + 1e-9))
    first = math.ceil(low / step - 1e-9)
    return [k * step for k in range(first, math.floor(high / step + 1e-9) + 1)]


def _tick_label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        return f"{value:.0e}"
    return f"{value:.4g}"


def _legend_rows(labels: list[str], width: float) -> list[list[int]]:
    """Flow legend entries (their indices) into rows no wider than ``width`` pixels."""
    rows, used = [[]], 0.0
    for i, label in enumerate(labels):
        item = 20 + 5.2 * len(label)
        if rows[-1] and used + item > width:
            rows.append([])
            used = 0.0
        rows[-1].append(i)
        used += item
    return rows


def svg_chart(key: str, title: str, lines: list[tuple], *, band=None, zones=(), hline=None,
              ylim=None, floor: float | None = None, note: str = "waiting for data", legend: bool | None = None) -> str:
    """Return an inline SVG line chart: ``lines`` are ``(name, label, steps, values, colour, width, dashed)``.

    ``band`` is ``(steps, low, high)``, shaded; ``zones`` ``(low, high, colour)`` horizontal bands;
    ``hline`` ``(y, colour)`` a dashed line; ``floor`` the lowest value the axis may show (0 for a
    ratio or a length). Lines are drawn in order (pass the total first: the parts stay visible over it). Each line carries ``data-series``, ``data-points`` (the
    points drawn) and ``data-nonfinite`` (NaN or infinite values, which cannot be drawn: each gets a red
    mark at its step along the top edge, labelled with the first one's value and step). A series with a single
    finite point (the first step) is a dot (``<circle class="labkit-point">``): a one-point polyline draws nothing.
    With more than one line, or ``legend=True``, the legend sits between the title and the plot, never over the
    lines. With every point at one step, the x axis shows that step only and the y axis spans the values'
    size (0.0526 on 0.02-0.08, not on 0.0523-0.0529).
    """
    width, height, left, right, bottom = 260, 180, 44, 8, 28
    if legend is None:
        legend = len(lines) > 1
    legend = _legend_rows([line[1] for line in lines], width - left - right) if legend and lines else []
    top = 20 + 11 * len(legend)
    plot_w, plot_h = width - left - right, height - top - bottom
    out = [f'<svg class="labkit-panel" data-panel="{key}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" style="background:#fff;font-family:system-ui,'
           f'sans-serif;font-size:9px">',
           f'<text x="{width / 2}" y="12" text-anchor="middle" font-size="11" font-weight="600">'
           f"{html.escape(title)}</text>",
           f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#bbb"/>',
           f'<text class="labkit-xlabel" x="{left + plot_w / 2}" y="{height - 3}" text-anchor="middle" fill="#444">'
           "step</text>"]
    if not lines:
        rows = note.split("\n")
        for i, row in enumerate(rows):
            y = top + plot_h / 2 + (i - (len(rows) - 1) / 2) * 12
            out.append(f'<text class="labkit-note" x="{left + plot_w / 2}" y="{y:.1f}" text-anchor="middle" '
                       f'fill="#777" font-size="10">{html.escape(row)}</text>')
        return "".join(out) + "</svg>"
    xs = [x for line in lines for x in line[2]]
    x0, x1 = min(xs), max(xs)
    one_step = x1 == x0
    if one_step:
        x0, x1 = x0 - 1, x1 + 1
    if ylim is not None:
        y0, y1 = ylim
    else:
        ys = [y for line in lines for y in line[3] if math.isfinite(y)]
        if band is not None:
            ys += [y for y in list(band[1]) + list(band[2]) if math.isfinite(y)]
        y0, y1 = (min(ys), max(ys)) if ys else (0.0, 1.0)
        # a flat series (entropy barely moving) still gets readable, distinct tick labels; values at one step
        # only: an axis as wide as the values are large
        span = (max(y1 - y0, max(abs(y0), abs(y1))) if one_step else
                max(y1 - y0, 0.01 * max(abs(y0), abs(y1)))) or 1.0
        middle = (y0 + y1) / 2
        y0, y1 = middle - 0.56 * span, middle + 0.56 * span
        if floor is not None and y0 < floor:
            y0, y1 = floor, max(y1, floor + (1.0 if floor == 0 and y1 <= floor else 0.0))

    def sx(x):
        return left + (x - x0) / (x1 - x0) * plot_w

    def sy(y):
        return top + plot_h - (y - y0) / (y1 - y0) * plot_h

    for low, high, colour in zones:
        a, b = sy(min(high, y1)), sy(max(low, y0))
        if b > a:
            out.append(f'<rect x="{left}" y="{a:.1f}" width="{plot_w}" height="{b - a:.1f}" fill="{colour}" '
                       f'fill-opacity="0.1"/>')
    for tick in _nice_ticks(y0, y1):
        y = sy(tick)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{left - 3}" y="{y + 3:.1f}" text-anchor="end" fill="#444">{_tick_label(tick)}</text>')
    for tick in [xs[0]] if one_step else _nice_ticks(x0, x1):
        if tick != int(tick):
            continue
        x = sx(tick)
        out.append(f'<text x="{x:.1f}" y="{top + plot_h + 11}" text-anchor="middle" fill="#444">{int(tick)}</text>')
    if band is not None and band[0]:
        kept = [(x, lo, hi) for x, lo, hi in zip(*band) if math.isfinite(lo) and math.isfinite(hi)]
        if kept:
            upper = " ".join(f"{sx(x):.1f},{sy(hi):.1f}" for x, _, hi in kept)
            lower = " ".join(f"{sx(x):.1f},{sy(lo):.1f}" for x, lo, _ in reversed(kept))
            out.append(f'<polygon class="labkit-band" points="{upper} {lower}" fill="#000" fill-opacity="0.08"/>')
    if hline is not None and y0 <= hline[0] <= y1:
        y = sy(hline[0])
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="{hline[1]}" '
                   f'stroke-dasharray="3,3"/>')
    bad_marks = []
    for name, label, steps, values, colour, line_width, dashed in lines:
        finite = [(x, y) for x, y in zip(steps, values) if math.isfinite(y)]
        bad = [(x, y) for x, y in zip(steps, values) if not math.isfinite(y)]
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in finite)
        dash = ' stroke-dasharray="5,3"' if dashed else ""
        out.append(f'<polyline data-series="{html.escape(name)}" data-points="{len(finite)}" '
                   f'data-nonfinite="{len(bad)}" points="{points}" fill="none" stroke="{colour}" '
                   f'stroke-width="{line_width}"{dash}/>')
        if len(finite) == 1:  # the first step: a dot, which a one-point polyline would not draw
            (x, y), = finite
            out.append(f'<circle class="labkit-point" data-series="{html.escape(name)}" cx="{sx(x):.1f}" '
                       f'cy="{sy(y):.1f}" r="{1.5 + line_width / 2:.1f}" fill="{colour}"/>')
        if bad:
            bad_marks.append((label, bad))
    for label, bad in bad_marks:
        for x, _ in bad:
            out.append(f'<line class="labkit-nonfinite" x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{top}" '
                       f'y2="{top + 6}" stroke="#d64545" stroke-width="2"/>')
        x, y = bad[0]
        out.append(f'<text class="labkit-nonfinite-label" x="{left + plot_w - 3}" y="{top + 16}" text-anchor="end" '
                   f'fill="#d64545" font-weight="600">{html.escape(label)} {describe_number(y)} at step {x}</text>')
    for row_number, row in enumerate(legend):
        x = left
        y = 20 + 11 * row_number + 7
        for i in row:
            _, label, _, _, colour, line_width, dashed = lines[i]
            dash = ' stroke-dasharray="4,2"' if dashed else ""
            out.append(f'<line x1="{x + 2}" x2="{x + 14}" y1="{y - 3}" y2="{y - 3}" stroke="{colour}" '
                       f'stroke-width="{line_width}"{dash}/><text class="labkit-legend" x="{x + 17}" y="{y}" '
                       f'fill="#222">{html.escape(label)}</text>')
            x += 20 + 5.2 * len(label)
    return "".join(out) + "</svg>"


def card_html(title: str, progress: str, tiles: list[tuple], alerts: list[str], gauge: str, red: str) -> str:
    """Return the dashboard's card: title and progress, red ``alerts``, ``tiles`` ``(label, key, shown, finite)``, the gauge."""
    cells = []
    for label, key, shown, finite in tiles:
        colour = "" if finite else f"color:{red};"
        cells.append(
            f'<div class="labkit-tile" data-key="{html.escape(key)}" data-finite="{str(finite).lower()}" '
            f'style="min-width:88px;padding:4px 8px;border-radius:6px;background:#f3f4f6">'
            f'<div style="font-size:11px;color:#555">{html.escape(label)}</div>'
            f'<div style="font-size:16px;font-weight:600;font-variant-numeric:tabular-nums;{colour}">'
            f'{"—" if shown is None else html.escape(shown)}</div></div>')
    warnings = "".join(f'<div class="labkit-alert" style="color:{red};font-weight:600;font-size:13px;'
                       f'margin-bottom:4px">⚠ {html.escape(line)}</div>' for line in alerts)
    return (
        '<div class="labkit-card" style="font-family:system-ui,sans-serif;color:#111;background:#fff;'
        'border:1px solid #ddd;border-radius:8px;padding:8px 10px;max-width:1040px">'
        f'<div class="labkit-progress" style="font-size:14px;margin-bottom:6px"><b>{html.escape(title)}</b>'
        f' · {html.escape(progress)}</div>{warnings}'
        f'<div style="display:flex;flex-wrap:wrap;gap:6px;margin-bottom:8px">{"".join(cells)}</div>{gauge}</div>')


def gauge_html(snap, g: dict, thresholds: tuple[float, float], monitor=None) -> str:
    """Return the memory gauge as HTML: ``snap`` a ``MemorySnapshot``, ``g`` what ``RunRecord.gauge()`` returns."""
    budget = g["budget_gib"] * GIB
    colour = g["colour"]
    if snap.kind == "cuda":
        # stacked: live tensors, the rest of PyTorch's cache, then everything else on the GPU
        allocated = snap.allocated or 0
        reserved = max(snap.reserved or 0, allocated)
        rest = max(snap.used - reserved, 0)
        parts = [(allocated, 1.0, "torch allocated"), (reserved - allocated, 0.6, "torch cached"),
                 (rest, 0.3, "outside torch (CUDA context, vLLM, other processes)")]
        detail = (f"torch allocated {gib(snap.allocated):.2f} · reserved {gib(snap.reserved):.2f} · "
                  f"peak {gib(snap.peak):.2f} GiB")
        if snap.device_used is not None:
            detail += f" · whole GPU {gib(snap.device_used):.2f} / {gib(snap.device_total):.1f} GiB (NVML)"
        elif snap.device_total:
            detail += f" · GPU total {gib(snap.device_total):.1f} GiB (NVML unavailable)"
    else:
        parts = [(snap.process_rss, 1.0, "process RSS")]
        detail = f"no CUDA GPU in use · machine RAM {gib(snap.host_total):.1f} GiB"
    segments, filled = [], 0.0
    for size, opacity, label in parts:
        width = max(min(size / budget, 1.0 - filled), 0.0)
        filled += width
        segments.append(f'<div title="{html.escape(label)}" style="width:{width:.2%};background:{colour};'
                        f'opacity:{opacity}"></div>')
    phases = ""
    if monitor is not None and monitor.phases:
        last = monitor.last_step_peaks()
        peaks = " · ".join(f"{name} {value / GIB:.2f}" for name, value in last.items())
        phases = (f'<div class="labkit-phases" style="font-size:12px;color:#444">last step\'s peak by phase '
                  f'({monitor.label}, GiB): {html.escape(peaks)}</div>')
    over = " · over budget" if g["fraction"] > 1 else ""
    amber, red = thresholds
    return (
        f'<div class="labkit-gauge labkit-gauge--{g["level"]}" data-level="{g["level"]}" '
        f'data-fraction="{g["fraction"]:.4f}">'
        f'<div class="labkit-gauge-label" style="font-size:13px;margin-bottom:3px">'
        f'<b>{html.escape(g["label"])}</b>: {g["used_gib"]:.2f} / {g["budget_gib"]:.1f} GiB budget '
        f'(<span style="color:{colour};font-weight:700">{g["fraction"]:.0%}{over}</span>)</div>'
        f'<div class="labkit-gauge-track" style="position:relative;display:flex;height:14px;background:#e5e7eb;'
        f'border-radius:7px;overflow:hidden">{"".join(segments)}'
        f'<div style="position:absolute;left:{amber:.0%};top:0;bottom:0;border-left:1px dashed #888"></div>'
        f'<div style="position:absolute;left:{red:.0%};top:0;bottom:0;border-left:1px dashed #888"></div></div>'
        f'<div class="labkit-gauge-detail" style="font-size:12px;color:#444;margin-top:3px">{html.escape(detail)}'
        f"</div>{phases}</div>")


def mark_nonfinite(ax, series: dict, colour: str) -> list:
    """Mark, on matplotlib ``ax``, every step where a series ``{label: (steps, values)}`` is NaN or infinite.

    A red vertical line per such step (the first 50) and a label naming the first; returns the artists.
    """
    artists = []
    for label, (steps, values) in series.items():
        bad = [(s, v) for s, v in zip(steps, values) if not math.isfinite(v)]
        for step, _ in bad[:50]:
            artists.append(ax.axvline(step, color=colour, lw=1, alpha=0.5))
        if bad:
            step, value = bad[0]
            artists.append(ax.text(0.98, 0.95, f"{label} {describe_number(value)} at step {step}", transform=ax.transAxes,
                                   ha="right", va="top", fontsize=8, color=colour, fontweight="bold"))
    return artists


def band_points(reward: tuple[list, list], reward_std: tuple[list, list]) -> tuple[list, list, list]:
    """Return ``(steps, mean - std, mean + std)`` at the steps where both ``(steps, values)`` series were logged."""
    std = dict(zip(*reward_std))
    kept = [(s, m - std[s], m + std[s]) for s, m in zip(*reward) if s in std]
    return [s for s, _, _ in kept], [low for _, low, _ in kept], [high for _, _, high in kept]


def reward_band(ax, reward: tuple[list, list], reward_std: tuple[list, list]):
    """Shade mean +/- std on ``ax`` at the steps where both were logged; return the artist (or ``None``)."""
    steps, low, high = band_points(reward, reward_std)
    return ax.fill_between(steps, low, high, color="black", alpha=0.1, lw=0) if steps else None


def zone_bounds(budget: float, thresholds: tuple[float, float], colours: dict) -> list[tuple[float, float, str]]:
    """Return the green, amber and red zones of a memory ``budget`` as ``(low, high, colour)``, in its units."""
    amber, red = thresholds
    return [(0, amber * budget, colours["green"]), (amber * budget, red * budget, colours["amber"]),
            (red * budget, budget, colours["red"])]


def budget_zones(ax, budget: float, thresholds: tuple[float, float], colours: dict) -> list:
    """Shade green, amber and red zones of a memory ``budget`` on ``ax`` and draw the budget line; return the artists."""
    artists = [ax.axhspan(low, high, color=colour, alpha=0.08, lw=0)
               for low, high, colour in zone_bounds(budget, thresholds, colours)]
    return artists + [ax.axhline(budget, color=colours["red"], lw=1, ls=":")]


_STACK = {  # phase -> terms from bottom to top, with colours that stay the same in every plot
    "generation": ("weights", "reference", "optimizer", "kv_cache", "transients"),
    "training": ("weights", "reference", "optimizer", "gradients", "activations", "logits"),
}
_COLOURS = {"weights": "#4c72b0", "reference": "#8172b3", "optimizer": "#dd8452", "kv_cache": "#937860",
            "gradients": "#c44e52", "transients": "#8c8c8c", "activations": "#55a868", "logits": "#da8bc3"}


def plot_breakdown(estimates, labels=None, *, card="rtx3080-laptop-16gb", ax=None):
    """Return a matplotlib ``Axes``: stacked bars of each estimate's two phases against a card's memory.

    ``estimates`` is one :class:`MemoryEstimate` or a list; each gets a pair of bars (generation,
    training), stacked term by term in GiB, and a dashed line marks what ``card`` (a key of
    :data:`labkit.device.CARDS`, or a :class:`labkit.device.Card`) reports to PyTorch: a card sold as
    16 GB reports about 15.7 GiB, not 14.9. Used by the interactive estimator of ``05_full_vs_lora.ipynb``.
    """
    import matplotlib.pyplot as plt

    if isinstance(estimates, MemoryEstimate):
        estimates = [estimates]

    card = card if isinstance(card, Card) else card_named(card)
    labels = labels or [f"{e.settings['method']} {e.settings['per_device_train_batch_size']}x"
                        f"{e.settings['steps_per_generation']}" for e in estimates]
    if ax is None:
        _, ax = plt.subplots(figsize=(4.6 + 2 * len(estimates), 4), layout="constrained")
    positions, ticks, shown = [], [], set()
    for k, est in enumerate(estimates):
        for j, phase in enumerate(("generation", "training")):
            x = 2.6 * k + j
            bottom = 0.0
            for term in _STACK[phase]:
                height = est.bytes[term] / GIB
                if height <= 0:
                    continue
                ax.bar(x, height, bottom=bottom, color=_COLOURS[term], width=0.8,
                       label=term if term not in shown else None)
                shown.add(term)
                bottom += height
            positions.append(x)
            ticks.append(f"{labels[k]}\n{phase}" if len(estimates) > 1 else phase)
    # the card's line is named in the legend, which sits beside the bars: a label on the plot covered a bar
    ax.axhline(card.gib, color="black", linestyle="--", linewidth=1, label=f"{card.sold_as} card ({card.gib:g} GiB)")
    ax.set_xticks(positions, ticks, fontsize=9)
    ax.set_ylabel("GiB")
    if len(estimates) == 1:
        ax.set_xlabel(labels[0], fontsize=9)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return ax


def memory_columns(rehearsal_csv, memory_csv=None, kinds=("preset", "grid", "unsloth"), gpu_csv=None):
    """Return a table of peak memory in three columns: estimated, rehearsed (fake tensors), measured.

    ``rehearsal_csv`` is what ``python -m bench rehearsal`` writes. Measured peaks come from
    ``gpu_csv`` (default: ``gpu/measurements.csv`` beside ``rehearsal_csv``, written by
    ``python -m bench gpu``: the same preset or grid row at the same settings, on a real card) and
    from ``memory_csv`` (``python -m bench memory``: the same model, method, precision, G and
    completion length). The measured column is torch's ``max_memory_allocated``, the tensors the other two
    columns count; where nothing was measured it says a GPU is needed.
    """
    import pandas as pd

    if not os.path.exists(rehearsal_csv):
        return pd.DataFrame({"missing": [f"{rehearsal_csv}: run python -m bench rehearsal"]})
    rows = pd.read_csv(rehearsal_csv)
    rows = rows[(rows.status == "ok") & rows.kind.isin(kinds)]
    measured = {}
    if memory_csv is not None and os.path.exists(memory_csv):
        gpu = pd.read_csv(memory_csv)
        for _, m in gpu[(gpu.get("device_kind") == "cuda") & (gpu.get("status") == "ok")].iterrows():
            key = (m.model, m.method, m.precision, int(m.num_generations), int(m.completion_len))
            measured[key] = round(float(m.measured_peak_gib), 2)
    settings = ["model", "method", "precision", "per_device_train_batch_size", "gradient_accumulation_steps",
                "num_generations", "max_completion_length"]
    def same(value) -> str:  # 24 and 24.0 (a column with a blank reads as floats) are the same setting
        try:
            number = float(value)
            return str(int(number)) if number.is_integer() else str(number)
        except (TypeError, ValueError):
            return str(value)

    gpu_csv = gpu_csv or os.path.join(os.path.dirname(str(rehearsal_csv)), "gpu", "measurements.csv")
    by_name = {}
    if os.path.exists(gpu_csv):
        gpu = pd.read_csv(gpu_csv)
        for _, m in gpu[gpu.status == "ok"].dropna(subset=["peak_allocated_gib"]).iterrows():
            # a QLoRA row loaded by labkit ran PEFT's fp32 upcast (before 2026-11-26 the only QLoRA loader)
            upcast = str(m.get("loader")) in ("labkit", "labkit-prepare-kbit")
            by_name[m["name"]] = ((*(same(m[k]) for k in settings), upcast), round(float(m.peak_allocated_gib), 2))

    def measured_gib(row):
        found = by_name.get(row["name"])
        upcast = str(row.get("prepare_model_for_kbit_training", False)) == "True"
        if found and found[0] == (*(same(row[k]) for k in settings), upcast):
            return found[1]
        key = (row.model, row.method, row.precision, int(row.num_generations), int(row.max_completion_length))
        return measured.get(key, "needs a GPU")

    table = pd.DataFrame({
        "row": rows.name,
        "model": rows.model.str.split("/").str[-1],
        "method": rows.method,
        "precision": rows.precision,
        "G x len": [f"{g} x {c}" for g, c in zip(rows.num_generations, rows.max_completion_length)],
        "estimated GiB": rows.estimated_total_gib.round(2),
        "rehearsed GiB (fake tensors, full scale)": rows.rehearsed_peak_gib.round(2),
        "measured GiB (a real card, torch allocated)": [measured_gib(row) for _, row in rows.iterrows()],
    })
    return table.reset_index(drop=True)
