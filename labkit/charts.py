"""Small SVG line charts for the live dashboard: built in milliseconds, drawn by the browser.

Re-rendering eight matplotlib panels takes a few hundred milliseconds a step; building the same
charts as SVG text takes a few (``chart_update_ms`` in ``results/dashboard_bench.json``).
:func:`svg_chart` draws one panel; the helpers thin long series and choose round tick values.
"""
from __future__ import annotations

import html
import math

__all__ = ["svg_chart", "thin", "short_label", "as_float", "PALETTE", "LIVE_POINTS", "MAIN_SERIES"]
def short_label(name: str) -> str:
    """``rewards/correctness/mean`` -> ``correctness``; ``clip_ratio/low_mean`` -> ``low``."""
    if name.startswith("rewards/") and name.endswith("/mean"):
        return name[len("rewards/"):-len("/mean")]
    if name.startswith("clip_ratio/"):
        return name.split("/", 1)[1].removesuffix("_mean")
    if name.startswith("memory/"):
        return name.split("/", 1)[1].replace("_", " ")
    return name


def as_float(value) -> float | None:
    """Return ``value`` as a finite float, or ``None`` (TRL logs ``None`` when no sample was valid)."""
    if value is None or isinstance(value, (bool, str)):
        return None
    if hasattr(value, "item"):
        try:
            value = value.item()
        except (ValueError, RuntimeError):  # a tensor with more than one element
            return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


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


def svg_chart(key: str, title: str, lines: list[tuple], *, band=None, zones=(), hline=None,
               ylim=None, note: str = "waiting for data") -> str:
    """Return an inline SVG line chart: ``lines`` are ``(name, label, steps, values, colour, width, dashed)``.

    ``band`` is ``(steps, low, high)``, shaded; ``zones`` ``(low, high, colour)`` horizontal bands;
    ``hline`` ``(y, colour)`` a dashed line. Each line carries ``data-series`` and ``data-points``.
    """
    width, height, left, right, top, bottom = 260, 165, 44, 8, 20, 18
    plot_w, plot_h = width - left - right, height - top - bottom
    out = [f'<svg class="labkit-panel" data-panel="{key}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" style="background:#fff;font-family:system-ui,'
           f'sans-serif;font-size:9px">',
           f'<text x="{width / 2}" y="12" text-anchor="middle" font-size="11" font-weight="600">'
           f"{html.escape(title)}</text>",
           f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#bbb"/>']
    if not lines:
        rows = note.split("\n")
        for i, row in enumerate(rows):
            y = top + plot_h / 2 + (i - (len(rows) - 1) / 2) * 12
            out.append(f'<text class="labkit-note" x="{left + plot_w / 2}" y="{y:.1f}" text-anchor="middle" '
                       f'fill="#777" font-size="10">{html.escape(row)}</text>')
        return "".join(out) + "</svg>"
    xs = [x for line in lines for x in line[2]]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if ylim is not None:
        y0, y1 = ylim
    else:
        ys = [y for line in lines for y in line[3]]
        if band is not None:
            ys += list(band[1]) + list(band[2])
        y0, y1 = min(ys), max(ys)
        # a flat series (entropy barely moving) still gets readable, distinct tick labels
        span = max(y1 - y0, 0.01 * max(abs(y0), abs(y1))) or 1.0
        middle = (y0 + y1) / 2
        y0, y1 = middle - 0.56 * span, middle + 0.56 * span

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
    for tick in _nice_ticks(x0, x1):
        if tick != int(tick):
            continue
        x = sx(tick)
        out.append(f'<text x="{x:.1f}" y="{height - 5}" text-anchor="middle" fill="#444">{int(tick)}</text>')
    if band is not None and band[0]:
        upper = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(band[0], band[2]))
        lower = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(reversed(band[0]), reversed(band[1])))
        out.append(f'<polygon class="labkit-band" points="{upper} {lower}" fill="#000" fill-opacity="0.08"/>')
    if hline is not None and y0 <= hline[0] <= y1:
        y = sy(hline[0])
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="{hline[1]}" '
                   f'stroke-dasharray="3,3"/>')
    for name, label, steps, values, colour, line_width, dashed in lines:
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(steps, values))
        dash = ' stroke-dasharray="5,3"' if dashed else ""
        out.append(f'<polyline data-series="{html.escape(name)}" data-points="{len(steps)}" points="{points}" '
                   f'fill="none" stroke="{colour}" stroke-width="{line_width}"{dash}/>')
    if len(lines) > 1:
        legend_w = 24 + 5.5 * max(len(line[1]) for line in lines)
        out.append(f'<rect x="{left + 2}" y="{top + 2}" width="{legend_w:.0f}" height="{10 * len(lines) + 4}" '
                   f'fill="#fff" fill-opacity="0.8"/>')
        for i, (_, label, _, _, colour, line_width, dashed) in enumerate(lines):
            y = top + 9 + 10 * i
            dash = ' stroke-dasharray="4,2"' if dashed else ""
            out.append(f'<line x1="{left + 5}" x2="{left + 17}" y1="{y - 3}" y2="{y - 3}" stroke="{colour}" '
                       f'stroke-width="{line_width}"{dash}/><text x="{left + 20}" y="{y}" fill="#222">'
                       f"{html.escape(label)}</text>")
    return "".join(out) + "</svg>"
