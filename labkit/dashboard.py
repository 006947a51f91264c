"""Live reward and VRAM widgets for a GRPO run: :class:`LiveDashboard` and :class:`VRAMMonitor`.

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

Drawing costs time on the training thread, so updates are throttled: at most one every
``min_interval_s`` (two a second), and the charts only as often as keeps their cost under
``max_overhead`` of the wall time. The live charts are SVG that the browser draws: building them
takes milliseconds, where re-rendering the same eight panels with matplotlib takes a few hundred
(``chart_update_ms`` and ``figure_render_s`` in ``results/dashboard_bench.json``, written by
``python -m labkit bench dashboard``, which measures the whole overhead).

:class:`VRAMMonitor` samples memory on a background thread and records phase marks
(``with monitor.phase("generation"): ...``) to plot where a step's memory goes.

Used from ``04_lora_grpo_16gb.ipynb`` on, where it watches TRL's ``GRPOTrainer``.
"""
from __future__ import annotations

import argparse
import fnmatch
import html
import io
import math
import os
import random
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import TrainerCallback

__all__ = [
    "LiveDashboard",
    "VRAMMonitor",
    "PhaseMark",
    "MemorySnapshot",
    "memory_snapshot",
    "gauge_level",
    "detect_frontend",
    "Panel",
    "PANELS",
    "GAUGE_COLOURS",
    "FRONTENDS",
    "simulated_run",
    "bench_cli",
]

_GIB = 1024**3
FRONTENDS = ("auto", "widgets", "html", "text", "none")
GAUGE_COLOURS = {"green": "#2e9d4f", "amber": "#f0a202", "red": "#d64545"}


# ----------------------------------------------------------------------------- memory readings


class _NVML:
    """NVML, initialised on first use; ``None`` answers wherever there is no NVIDIA driver."""

    def __init__(self):
        self._lock = threading.Lock()
        self._module = None  # the pynvml module once initialised, False when unavailable
        self._handles: dict[int, object] = {}

    def _handle(self, index: int):
        nvml = self._module
        # torch numbers the devices it sees (CUDA_VISIBLE_DEVICES, fastest first); NVML numbers
        # every device on the bus. The PCI address is the one name both agree on.
        if torch.cuda.is_initialized():
            props = torch.cuda.get_device_properties(index)
            bus = getattr(props, "pci_bus_id", None)
            if bus is not None:
                address = f"{getattr(props, 'pci_domain_id', 0):08x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
                try:
                    return nvml.nvmlDeviceGetHandleByPciBusId(address.encode())
                except Exception:  # noqa: BLE001 - fall back to the index below
                    pass
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        if index < len(visible) and visible[index].strip().isdigit():
            index = int(visible[index])
        return nvml.nvmlDeviceGetHandleByIndex(index)

    def memory(self, index: int) -> tuple[int, int] | None:
        """Return ``(used, total)`` bytes of GPU ``index`` over all processes, or ``None``."""
        with self._lock:
            if self._module is None:
                try:
                    import pynvml  # from the nvidia-ml-py package

                    pynvml.nvmlInit()
                    self._module = pynvml
                except Exception:  # noqa: BLE001 - no driver, no library: no NVML figures
                    self._module = False
            if self._module is False:
                return None
            if index not in self._handles:
                try:
                    self._handles[index] = self._handle(index)
                except Exception:  # noqa: BLE001 - a device NVML cannot see: ask no more
                    self._handles[index] = None
            if self._handles[index] is None:
                return None
            try:
                info = self._module.nvmlDeviceGetMemoryInfo(self._handles[index])
            except Exception:  # noqa: BLE001
                return None
            return int(info.used), int(info.total)


_nvml = _NVML()
_processes: dict[int, object] = {}
_host_total: list[int] = []
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _process():
    import psutil

    pid = os.getpid()  # a forked worker must not read its parent's figures
    if pid not in _processes:
        _processes[pid] = psutil.Process(pid)
    return _processes[pid]


def process_rss() -> int:
    """Return this process's resident memory in bytes."""
    # On Linux, /proc/self/statm costs ~5 us against psutil's ~50 us: it matters at 50 samples a second.
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return int(_process().memory_info().rss)


def _host_memory_total() -> int:
    if not _host_total:
        import psutil

        _host_total.append(int(psutil.virtual_memory().total))
    return _host_total[0]


def _cuda_index(device=None) -> int | None:
    """Return the CUDA device index to read memory from, or ``None`` for the CPU."""
    kind = getattr(device, "kind", None)  # a labkit.device.DeviceInfo
    if kind is not None:
        device = kind
    if isinstance(device, int):
        return device
    if device is None:
        if os.environ.get("LABKIT_DEVICE") == "cpu" or not torch.cuda.is_available():
            return None
        # current_device() would create a CUDA context (hundreds of MB); only ask once one exists.
        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    device = torch.device(device)
    if device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        raise RuntimeError(f"memory of {device} was asked for, but torch sees no CUDA device")
    return device.index if device.index is not None else (torch.cuda.current_device() if torch.cuda.is_initialized() else 0)


@dataclass(frozen=True)
class MemorySnapshot:
    """What :func:`memory_snapshot` read, in bytes. GPU fields are ``None`` without a GPU (or NVML)."""

    kind: str  # "cuda" or "cpu"
    allocated: int | None  # torch.cuda.memory_allocated: held by live tensors
    reserved: int | None  # torch.cuda.memory_reserved: held by PyTorch's caching allocator
    peak: int | None  # torch.cuda.max_memory_allocated since the start (or the last reset)
    device_used: int | None  # NVML: in use on the whole GPU, every process (vLLM too) and the driver
    device_total: int | None  # NVML (or torch) total memory of the GPU
    process_rss: int  # psutil: this process's resident memory
    host_total: int  # psutil: the machine's RAM

    @property
    def used(self) -> int:
        """Bytes the gauge shows: NVML's whole-GPU figure, else torch's reserved, else RSS on a CPU."""
        if self.device_used is not None:
            return self.device_used
        if self.reserved is not None:
            return self.reserved
        return self.process_rss

    @property
    def total(self) -> int:
        """Bytes the device has: GPU memory, or the machine's RAM on a CPU."""
        return self.device_total or self.host_total

    @property
    def source(self) -> str:
        """Return what :attr:`used` measures, in words."""
        if self.device_used is not None:
            return "GPU memory in use (NVML, all processes)"
        if self.reserved is not None:
            return "GPU memory reserved by PyTorch (no NVML)"
        return "No CUDA GPU: this process's memory (RSS)"


def memory_snapshot(device=None) -> MemorySnapshot:
    """Return a :class:`MemorySnapshot` of ``device`` (default: the CUDA GPU if any, else the CPU).

    Cheap (tens of microseconds) and never creates a CUDA context: before CUDA is initialised
    torch's allocator figures are 0 and NVML still reports the whole GPU.
    """
    rss = process_rss()
    host_total = _host_memory_total()
    index = _cuda_index(device)
    if index is None:
        return MemorySnapshot("cpu", None, None, None, None, None, rss, host_total)
    allocated = int(torch.cuda.memory_allocated(index))
    reserved = int(torch.cuda.memory_reserved(index))
    peak = int(torch.cuda.max_memory_allocated(index))
    nvml = _nvml.memory(index)
    if nvml is not None:
        device_used, device_total = nvml
    else:
        device_used = None
        device_total = torch.cuda.get_device_properties(index).total_memory if torch.cuda.is_initialized() else None
    return MemorySnapshot("cuda", allocated, reserved, peak, device_used, device_total, rss, host_total)


def gauge_level(used: float, budget: float, thresholds: tuple[float, float] = (0.75, 0.90)) -> str:
    """Return ``"green"``, ``"amber"`` or ``"red"``: how full ``used`` makes a ``budget``.

    ``used / budget < thresholds[0]`` is green, below ``thresholds[1]`` amber, else red (over
    budget included). Amber means little room for a longer completion or a bigger group; red,
    that the next long batch may run out of memory.
    """
    if budget <= 0:
        raise ValueError(f"budget must be positive, not {budget}")
    amber, red = thresholds
    if not 0 < amber < red:
        raise ValueError(f"thresholds must satisfy 0 < amber < red, not {thresholds}")
    fraction = used / budget
    return "red" if fraction >= red else "amber" if fraction >= amber else "green"


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
    except ImportError:
        return "html"
    return "widgets" if int(ipywidgets.__version__.split(".")[0]) >= 8 else "html"


# ----------------------------------------------------------------------------- what it plots


@dataclass(frozen=True)
class Panel:
    """One plot of the dashboard: the series (glob patterns over logged keys) it draws."""

    key: str
    title: str
    patterns: tuple[str, ...]
    empty_note: str = "waiting for data"


PANELS = (
    Panel("reward", "reward (band: ± reward_std)", ("reward", "rewards/*/mean")),
    Panel("spread", "reward spread", ("reward_std", "frac_reward_zero_std")),
    Panel("kl", "KL to the reference", ("kl",), "no KL logged:\nbeta = 0 (TRL's default)\nloads no reference model"),
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


def _short_label(name: str) -> str:
    """``rewards/correctness/mean`` -> ``correctness``; ``clip_ratio/low_mean`` -> ``low``."""
    if name.startswith("rewards/") and name.endswith("/mean"):
        return name[len("rewards/"):-len("/mean")]
    if name.startswith("clip_ratio/"):
        return name.split("/", 1)[1].removesuffix("_mean")
    if name.startswith("memory/"):
        return name.split("/", 1)[1].replace("_", " ")
    return name


def _as_float(value) -> float | None:
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


def _gib(n: int | None) -> float | None:
    return None if n is None else n / _GIB


# ----------------------------------------------------------------------------- live charts (SVG)

_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#17becf", "#7f7f7f")
_LIVE_POINTS = 240  # points per series in the live charts; the saved figure keeps every point
_MAIN_SERIES = ("reward", "memory/device_used", "memory/process_rss")  # drawn black and thick


def _thin(steps: list, values: list, limit: int = _LIVE_POINTS) -> tuple[list, list]:
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


def _svg_chart(key: str, title: str, lines: list[tuple], *, band=None, zones=(), hline=None,
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
                 figsize: tuple[float, float] = (13.0, 5.6), autoshow: bool = True, clock=time.perf_counter):
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

        ``None``, NaN and non-numeric values are skipped, so a series has a point only where a
        value was logged. ``step=None`` continues from the last step.
        """
        started = self._clock()
        if self._start is None:
            self._start = started
        if step is None:
            step = 0 if self.step is None else self.step + 1
        step = int(step)
        if self._first_step is None:
            self._first_step = step
        self.step = step
        for name, value in {**(metrics or {}), **more}.items():
            number = _as_float(value)
            if number is not None:
                steps, values = self.history.setdefault(str(name), ([], []))
                steps.append(step)
                values.append(number)
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
                values[-1] = value / _GIB
            else:
                steps.append(step)
                values.append(value / _GIB)

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """Return ``(steps, values)`` recorded for ``name`` (empty lists if never logged)."""
        steps, values = self.history.get(name, ([], []))
        return list(steps), list(values)

    def latest(self, name: str, default=None):
        """Return the last value logged for ``name``, or ``default``."""
        values = self.history.get(name, ((), ()))[1]
        return values[-1] if values else default

    def gauge(self) -> dict:
        """Return the memory gauge: ``used_gib``, ``budget_gib``, ``fraction``, ``level``, ``colour``, ``label``."""
        snap = self.snapshot or memory_snapshot(self.device)
        budget = self.budget_gib if self.budget_gib is not None else snap.total / _GIB
        used = snap.used / _GIB
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
        elif self._handle is not None:
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
            display(self._widgets["box"])
        elif self.frontend == "html":
            from IPython.display import HTML, display

            if self._html_payload is None:
                self._html_payload = f'<div class="labkit-dashboard">{self.html()}</div>'
            self._handle = display(HTML(self._html_payload), display_id=True)
        elif self.frontend == "text":
            self._update_text(card=True)

    def close(self) -> None:
        """Draw the final state (charts included) and close the progress bar; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self.frontend in ("widgets", "html") and self.step is not None:
            self.render()
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
                parts.append(f"{label}={fmt.format(value)}")
        g = self.gauge()
        where = "GPU" if g["gpu"] else "no CUDA GPU, RSS"
        parts.append(f"mem({where})={g['used_gib']:.1f}/{g['budget_gib']:.1f}GiB[{g['level']}]")
        return " ".join(parts) if short else f"{self.title}: {self._progress()} | " + " ".join(parts)

    def html(self) -> str:
        """Return the card: progress, the latest numbers and the memory gauge, as HTML."""
        tiles = []
        for label, key, fmt in _TILES:
            value = self.latest(key)
            shown = fmt.format(value) if value is not None else "—"
            tiles.append(
                f'<div class="labkit-tile" data-key="{html.escape(key)}" style="min-width:88px;padding:4px 8px;'
                f'border-radius:6px;background:#f3f4f6"><div style="font-size:11px;color:#555">{html.escape(label)}'
                f'</div><div style="font-size:16px;font-weight:600;font-variant-numeric:tabular-nums">{shown}</div></div>')
        return (
            '<div class="labkit-card" style="font-family:system-ui,sans-serif;color:#111;background:#fff;'
            'border:1px solid #ddd;border-radius:8px;padding:8px 10px;max-width:1040px">'
            f'<div class="labkit-progress" style="font-size:14px;margin-bottom:6px"><b>{html.escape(self.title)}</b>'
            f' · {html.escape(self._progress())}</div>'
            f'<div style="display:flex;flex-wrap:wrap;gap:6px;margin-bottom:8px">{"".join(tiles)}</div>'
            f"{self._gauge_html()}</div>")

    def _gauge_html(self) -> str:
        g = self.gauge()
        snap = self.snapshot or memory_snapshot(self.device)
        budget = g["budget_gib"] * _GIB
        colour = g["colour"]
        if snap.kind == "cuda":
            # stacked: live tensors, the rest of PyTorch's cache, then everything else on the GPU
            allocated = snap.allocated or 0
            reserved = max(snap.reserved or 0, allocated)
            rest = max(snap.used - reserved, 0)
            parts = [(allocated, 1.0, "torch allocated"), (reserved - allocated, 0.6, "torch cached"),
                     (rest, 0.3, "outside torch (CUDA context, vLLM, other processes)")]
            detail = (f"torch allocated {_gib(snap.allocated):.2f} · reserved {_gib(snap.reserved):.2f} · "
                      f"peak {_gib(snap.peak):.2f} GiB")
            if snap.device_used is not None:
                detail += f" · whole GPU {_gib(snap.device_used):.2f} / {_gib(snap.device_total):.1f} GiB (NVML)"
            elif snap.device_total:
                detail += f" · GPU total {_gib(snap.device_total):.1f} GiB (NVML unavailable)"
        else:
            parts = [(snap.process_rss, 1.0, "process RSS")]
            detail = f"no CUDA GPU in use · machine RAM {_gib(snap.host_total):.1f} GiB"
        segments, filled = [], 0.0
        for size, opacity, label in parts:
            width = max(min(size / budget, 1.0 - filled), 0.0)
            filled += width
            segments.append(f'<div title="{html.escape(label)}" style="width:{width:.2%};background:{colour};'
                            f'opacity:{opacity}"></div>')
        phases = ""
        if self.monitor is not None and self.monitor.phases:
            last = self.monitor.last_step_peaks()
            peaks = " · ".join(f"{name} {value / _GIB:.2f}" for name, value in last.items())
            phases = (f'<div class="labkit-phases" style="font-size:12px;color:#444">last step\'s peak by phase '
                      f'({self.monitor.label}, GiB): {html.escape(peaks)}</div>')
        over = " · over budget" if g["fraction"] > 1 else ""
        amber, red = self.thresholds
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

    def _repr_html_(self) -> str:
        return self.html()

    def _panel_series(self, panel: Panel) -> list[str]:
        return [n for n in self.history if any(fnmatch.fnmatchcase(n, p) for p in panel.patterns)]

    def charts_html(self) -> str:
        """Return the live charts: one SVG per panel of :data:`PANELS`, as HTML (at most 240 points a line)."""
        charts = []
        for panel in PANELS:
            lines, colours = [], iter(_PALETTE)
            for name in self._panel_series(panel):
                steps, values = _thin(*self.history[name])
                main = name in _MAIN_SERIES
                lines.append((name, _short_label(name), steps, values, "#000" if main else next(colours, "#777"),
                              2.0 if main else 1.3, name.startswith("rewards/")))
            extra = {}
            if panel.key == "reward" and "reward" in self.history and "reward_std" in self.history:
                std = dict(zip(*self.history["reward_std"]))
                steps, mean = _thin(*self.history["reward"])
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
            charts.append(_svg_chart(panel.key, panel.title, lines, note=panel.empty_note, **extra))
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
        fig.subplots_adjust(left=0.045, right=0.99, top=0.87, bottom=0.09, wspace=0.3, hspace=0.5)
        for panel, ax in zip(PANELS, grid.flat):
            ax.set_title(panel.title, fontsize=10)
            ax.tick_params(labelsize=8)
            ax.xaxis.set_major_locator(MaxNLocator(5, integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(5))
            ax.grid(alpha=0.3)
            note = ax.text(0.5, 0.5, panel.empty_note, transform=ax.transAxes, ha="center", va="center",
                           fontsize=9, color="#777")
            self._extras[f"note:{panel.key}"] = note
            self._axes[panel.key] = ax
        for ax in grid[1]:
            ax.set_xlabel("step", fontsize=9)
        self._extras["suptitle"] = fig.suptitle("", x=0.01, ha="left", fontsize=11)
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
                    if name in _MAIN_SERIES:
                        style = {"lw": 2.0, "color": "black"}  # the total: per-function lines are dashed
                    (line,) = ax.plot([], [], label=_short_label(name), **style)
                    self._lines[(panel.key, name)] = line
                    added = True
                steps, values = self.history[name]
                line.set_data(steps, values)
            if panel.key == "reward":
                self._draw_reward_band(ax)
            if panel.key == "memory":
                self._draw_budget(ax)
            self._extras[f"note:{panel.key}"].set_visible(not names)
            if added and len(names) > 1:
                ax.legend(fontsize=7, loc="best", framealpha=0.6)
            ax.relim()
            band = self._extras.get("band") if panel.key == "reward" else None
            if band is not None:  # relim() only looks at lines: make room for the band too
                ax.update_datalim(band.get_paths()[0].vertices)
            ax.autoscale_view()
            if panel.key == "memory":
                top = max([self._budget_gib() * 1.08] + [max(v) * 1.1 for n, (_, v) in self.history.items()
                                                         if n.startswith("memory/") and v])
                ax.set_ylim(0, top)
        progress = self._progress()
        self._extras["suptitle"].set_text(f"{self.title} · {progress}")
        return self._figure

    def _draw_reward_band(self, ax) -> None:
        old = self._extras.pop("band", None)
        if old is not None:
            old.remove()
        if "reward" not in self.history or "reward_std" not in self.history:
            return
        std = dict(zip(*self.history["reward_std"]))
        points = [(s, v, std[s]) for s, v in zip(*self.history["reward"]) if s in std]
        if points:
            steps, mean, spread = zip(*points)
            self._extras["band"] = ax.fill_between(steps, [m - d for m, d in zip(mean, spread)],
                                                   [m + d for m, d in zip(mean, spread)], color="black",
                                                   alpha=0.1, lw=0)

    def _budget_gib(self) -> float:
        if self.budget_gib is not None:
            return self.budget_gib
        return (self.snapshot or memory_snapshot(self.device)).total / _GIB

    def _draw_budget(self, ax) -> None:
        budget = self._budget_gib()
        if self._extras.get("budget_value") == budget:
            return
        for key in ("zone_green", "zone_amber", "zone_red", "budget_line"):
            if key in self._extras:
                self._extras.pop(key).remove()
        amber, red = self.thresholds
        for key, low, high in (("zone_green", 0, amber), ("zone_amber", amber, red), ("zone_red", red, 1.0)):
            self._extras[key] = ax.axhspan(low * budget, high * budget, color=GAUGE_COLOURS[key[5:]], alpha=0.08, lw=0)
        self._extras["budget_line"] = ax.axhline(budget, color=GAUGE_COLOURS["red"], lw=1, ls=":")
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


# ----------------------------------------------------------------------------- the memory timeline


@dataclass(frozen=True)
class PhaseMark:
    """One phase of one step, as :meth:`VRAMMonitor.phase` recorded it (times in s, memory in bytes)."""

    name: str
    step: int
    start_s: float
    end_s: float
    start_bytes: int
    end_bytes: int
    peak_bytes: int


class VRAMMonitor:
    """Sample memory on a background thread and mark phases, to see where a step's memory goes.

    ``with VRAMMonitor() as monitor:`` starts the sampler; inside the loop, wrap each part of a
    step in ``with monitor.phase("generation"): ...``. On a GPU it samples
    ``torch.cuda.memory_allocated`` (the tensors a phase holds), ``memory_reserved`` and NVML's
    whole-GPU figure; on a CPU the process's RSS. A step is counted each time the first phase
    name comes round again (or pass ``step=`` to :meth:`phase`).

    Every phase is sampled as it starts and ends, and every ``interval_s`` (20 a second by
    default; ``sampler_cpu_s`` in ``results/dashboard_bench.json`` is what that cost) in between. A phase's peak is the largest sample inside
    it; on a GPU it is also raised to torch's exact ``max_memory_allocated`` when that grew during
    the phase, so spikes shorter than the sampling interval are not missed.
    """

    def __init__(self, interval_s: float = 0.05, device=None, max_samples: int = 200_000):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, not {interval_s}")
        self.interval_s = interval_s
        self.max_samples = max_samples
        self.index = _cuda_index(device)
        self.kind = "cpu" if self.index is None else "cuda"
        self.times: list[float] = []  # seconds since start
        self.used: list[int] = []  # allocated (GPU) or RSS (CPU), bytes
        self.reserved: list[int] = []  # GPU only
        self.device_used: list[int] = []  # GPU with NVML only
        self.phases: list[PhaseMark] = []
        self.sampler_cpu_s = 0.0  # CPU time the sampler thread used
        self._lock = threading.Lock()
        self._open: dict[int, list] = {}  # id -> [running peak]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.perf_counter()
        self._step = -1
        self._first_phase: str | None = None

    @property
    def label(self) -> str:
        return "torch allocated" if self.kind == "cuda" else "process RSS"

    def _read(self) -> tuple[int, int | None, int | None]:
        if self.index is None:
            return process_rss(), None, None
        nvml = _nvml.memory(self.index)
        return (int(torch.cuda.memory_allocated(self.index)), int(torch.cuda.memory_reserved(self.index)),
                None if nvml is None else nvml[0])

    def sample(self) -> int:
        """Take one sample now and return its main reading in bytes."""
        used, reserved, device_used = self._read()
        with self._lock:
            self.times.append(time.perf_counter() - self._t0)
            self.used.append(used)
            if reserved is not None:
                self.reserved.append(reserved)
            if device_used is not None:
                self.device_used.append(device_used)
            for peak in self._open.values():
                peak[0] = max(peak[0], used)
            if len(self.times) >= self.max_samples:  # keep every other sample, sample half as often
                for series in (self.times, self.used, self.reserved, self.device_used):
                    del series[1::2]
                self.interval_s *= 2
        return used

    def _run(self) -> None:
        started = time.thread_time()
        while not self._stop.wait(self.interval_s):
            self.sample()
        self.sampler_cpu_s += time.thread_time() - started

    def start(self) -> "VRAMMonitor":
        """Start the sampler thread (``with VRAMMonitor() as m`` does it) and return the monitor."""
        if self._thread is not None:
            return self
        self._t0 = time.perf_counter()
        self._stop.clear()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="labkit-vram-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the sampler thread, after one last sample."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._thread = None
        self.sample()

    def __enter__(self) -> "VRAMMonitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @contextmanager
    def phase(self, name: str, step: int | None = None) -> Iterator[None]:
        """Mark the code inside the ``with`` block as phase ``name`` of the current step."""
        if step is None:
            if self._first_phase is None:
                self._first_phase = name
            if name == self._first_phase:
                self._step += 1
            step = max(self._step, 0)
        else:
            self._step = step
        exact_before = torch.cuda.max_memory_allocated(self.index) if self.index is not None else None
        start_s = time.perf_counter() - self._t0
        peak = [0]
        with self._lock:
            self._open[id(peak)] = peak
        start_bytes = self.sample()
        try:
            yield
        finally:
            end_bytes = self.sample()
            with self._lock:
                self._open.pop(id(peak), None)
            top = max(peak[0], start_bytes, end_bytes)
            if exact_before is not None:
                exact_after = torch.cuda.max_memory_allocated(self.index)
                if exact_after > exact_before:  # this phase set a new all-time peak: torch knows it exactly
                    top = max(top, exact_after)
            self.phases.append(PhaseMark(name, step, start_s, time.perf_counter() - self._t0,
                                         start_bytes, end_bytes, int(top)))

    def last_step_peaks(self) -> dict[str, int]:
        """Return ``{phase: peak bytes}`` for the last step marked (cheap: reads only that step)."""
        peaks: dict[str, int] = {}
        marks = self.phases
        for mark in reversed(marks):
            if mark.step != marks[-1].step:
                break
            peaks[mark.name] = max(peaks.get(mark.name, 0), mark.peak_bytes)
        return dict(reversed(list(peaks.items())))

    def timeline(self) -> dict[str, list[float]]:
        """Return ``{"t": seconds, label: GiB, ...}``: the samples so far."""
        with self._lock:
            out = {"t": list(self.times), self.label: [u / _GIB for u in self.used]}
            if self.reserved:
                out["torch reserved"] = [r / _GIB for r in self.reserved]
            if self.device_used and len(self.device_used) == len(self.times):
                out["whole GPU (NVML)"] = [d / _GIB for d in self.device_used]
        return out

    def phase_summary(self) -> list[dict]:
        """Return one row per phase name, in order: count, seconds, peak and what the phase adds.

        ``peak_gib`` is the largest reading in any occurrence; ``transient_gib`` the mean rise from
        the phase's start to its peak (memory it needs while it runs, such as activations or the
        KV cache); ``kept_gib`` the mean change from start to end (memory it leaves behind).
        """
        rows: dict[str, dict] = {}
        for mark in self.phases:
            row = rows.setdefault(mark.name, {"phase": mark.name, "count": 0, "seconds": 0.0, "peak_gib": 0.0,
                                              "transient_gib": 0.0, "kept_gib": 0.0})
            row["count"] += 1
            row["seconds"] += mark.end_s - mark.start_s
            row["peak_gib"] = max(row["peak_gib"], mark.peak_bytes / _GIB)
            row["transient_gib"] += (mark.peak_bytes - mark.start_bytes) / _GIB
            row["kept_gib"] += (mark.end_bytes - mark.start_bytes) / _GIB
        for row in rows.values():
            row["transient_gib"] /= row["count"]
            row["kept_gib"] /= row["count"]
        return list(rows.values())

    def plot(self, step: int | None = None, figsize: tuple[float, float] = (12.0, 4.0)):
        """Return a figure of where a step's memory goes: the timeline with its phases, and each phase's peak.

        ``step=None`` shows the whole run, ``step=-1`` the last step, ``step=k`` step ``k``.
        """
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        marks = self.phases
        if step is not None and marks:
            steps = sorted({m.step for m in marks})
            chosen = steps[step] if step < 0 else step
            marks = [m for m in marks if m.step == chosen]
            if not marks:
                raise ValueError(f"no phase was marked in step {step}; steps marked: {steps}")
        series = self.timeline()
        t = series.pop("t")
        if marks and step is not None:
            low, high = marks[0].start_s, marks[-1].end_s
            pad = 0.02 * max(high - low, 1e-6)
            keep = [i for i, x in enumerate(t) if low - pad <= x <= high + pad]
        else:
            keep = list(range(len(t)))
        fig = Figure(figsize=figsize)
        FigureCanvasAgg(fig)
        timeline_ax, bars_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1]})
        names = list(dict.fromkeys(m.name for m in marks))
        colours = {name: f"C{i % 10}" for i, name in enumerate(names)}
        labelled = set()
        for mark in marks:
            timeline_ax.axvspan(mark.start_s, mark.end_s, color=colours[mark.name], alpha=0.18, lw=0,
                                label=None if mark.name in labelled else mark.name)
            labelled.add(mark.name)
        for label, values in series.items():
            timeline_ax.plot([t[i] for i in keep], [values[i] for i in keep], label=label,
                             lw=1.8 if label == self.label else 1.0, color="black" if label == self.label else None)
        timeline_ax.set_xlabel("seconds since the monitor started")
        timeline_ax.set_ylabel("GiB")
        where = "whole run" if step is None else f"step {marks[0].step}" if marks else ""
        timeline_ax.set_title(f"memory over time ({where}); shaded: phases")
        timeline_ax.legend(fontsize=8, loc="upper left")
        timeline_ax.grid(alpha=0.3)
        rows: dict[str, list[float]] = {}  # name -> [peak, largest rise above the phase's start]
        for mark in marks:
            row = rows.setdefault(mark.name, [0.0, 0.0])
            row[0] = max(row[0], mark.peak_bytes / _GIB)
            row[1] = max(row[1], (mark.peak_bytes - mark.start_bytes) / _GIB)
        bars_ax.barh(list(rows), [peak for peak, _ in rows.values()], color=[colours[n] for n in rows])
        bars_ax.invert_yaxis()
        bars_ax.set_xlabel(f"peak {self.label} (GiB)")
        bars_ax.set_title("peak by phase (+ rise within it)")
        for y, (peak, rise) in enumerate(rows.values()):
            bars_ax.text(peak, y, f" {peak:.2f} (+{rise:.2f})", va="center", fontsize=8)
        bars_ax.set_xlim(0, 1.35 * max([peak for peak, _ in rows.values()] + [1e-3]))
        fig.tight_layout()
        return fig


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


# ----------------------------------------------------------------------------- benchmark


def _bench_once(frontend: str, step_s: float, steps: int, monitor_interval_s: float) -> dict:
    import contextlib

    dashboard = LiveDashboard(title=f"bench {frontend}", total_steps=steps, frontend=frontend, autoshow=False)
    phases = (("generation", 0.6), ("scoring", 0.05), ("backward", 0.3), ("optimizer step", 0.05))
    work_s = 0.0
    started = time.perf_counter()
    quiet = contextlib.redirect_stderr(io.StringIO()) if frontend == "text" else contextlib.nullcontext()
    with quiet, VRAMMonitor(interval_s=monitor_interval_s) as monitor:
        dashboard.monitor = monitor
        for step, logs in simulated_run(steps):
            t0 = time.perf_counter()
            for name, share in phases:  # the step's work: sleeping stands in for GPU time
                with monitor.phase(name):
                    time.sleep(step_s * share)
            work_s += time.perf_counter() - t0
            dashboard.log(step, logs)
        t0 = time.perf_counter()
        dashboard.close()
        close_s = time.perf_counter() - t0
    wall_s = time.perf_counter() - started
    renders = dashboard.render_seconds
    return {
        "frontend": frontend,
        "step_s": step_s,
        "steps": steps,
        "wall_s": round(wall_s, 3),
        "work_s": round(work_s, 3),
        "log_s": round(dashboard.log_seconds, 4),
        "close_s": round(close_s, 4),
        "sampler_cpu_s": round(monitor.sampler_cpu_s, 4),
        "samples": len(monitor.times),
        # per step, as training goes: every log() call (updates and figure renders included) and the sampler
        "overhead": round((dashboard.log_seconds + monitor.sampler_cpu_s) / work_s, 5),
        # the whole run, with the one final render close() draws
        "run_overhead": round((dashboard.log_seconds + close_s + monitor.sampler_cpu_s) / work_s, 5),
        "card_updates": dashboard.card_updates,
        "plot_renders": dashboard.plot_renders,
        "plot_render_ms_mean": round(1000 * sum(renders) / len(renders), 1) if renders else None,
        "plot_render_ms_max": round(1000 * max(renders), 1) if renders else None,
        "seconds_between_chart_updates": round(dashboard._plot_interval, 2) if frontend != "text" else None,
    }


def bench_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit bench dashboard``: the dashboard's and the monitor's cost per training step.

    Simulated steps (sleeps standing in for GPU work, split into the four phases) are fed to a
    :class:`LiveDashboard` while a :class:`VRAMMonitor` samples. ``overhead`` is the time spent in
    ``dashboard.log`` (chart updates included) plus the sampler thread's CPU time, over the steps'
    own time; ``run_overhead`` adds the final update of ``close()``. Also times one
    ``dashboard.save()`` (the matplotlib figure), which is not part of the loop. Writes ``results/dashboard_bench.json`` with :func:`labkit.lab.provenance`.
    """
    from labkit.bench import results_dir, write_json
    from labkit.lab import provenance

    parser = argparse.ArgumentParser(prog="python -m labkit bench dashboard", description=bench_cli.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step-s", type=float, nargs="+", default=[0.1, 1.0],
                        help="simulated step times in seconds (default: 0.1 1.0)")
    parser.add_argument("--seconds", type=float, default=30.0, help="run each configuration about this long")
    parser.add_argument("--frontends", nargs="+", default=["widgets", "text"], choices=["widgets", "html", "text"])
    parser.add_argument("--monitor-interval-s", type=float, default=0.05, help="VRAMMonitor's default")
    parser.add_argument("--target", type=float, default=0.02, help="per-step overhead to stay under (default 2%%)")
    parser.add_argument("--out", default=None, help="output JSON (default results/dashboard_bench.json)")
    args = parser.parse_args(argv)

    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None

    runs = []
    for frontend in args.frontends:
        for step_s in args.step_s:
            steps = max(5, round(args.seconds / step_s))
            row = _bench_once(frontend, step_s, steps, args.monitor_interval_s)
            runs.append(row)
            renders = (f", {row['plot_renders']} chart updates of ~{row['plot_render_ms_mean']:.1f} ms"
                       if row["plot_renders"] else "")
            print(f"{frontend:>7}  step {step_s:5.2f} s x {steps:4d}: overhead {row['overhead']:.2%} per step, "
                  f"{row['run_overhead']:.2%} with the final render (log {row['log_s']:.3f} s, close "
                  f"{row['close_s']:.3f} s, sampler {row['sampler_cpu_s']:.3f} s CPU{renders})", flush=True)
    worst = max(row["overhead"] for row in runs)
    import tempfile

    board = LiveDashboard(frontend="none")
    for step, logs in simulated_run(200):
        board.log(step, logs)
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        board.save(Path(folder) / "run.png")
        save_s = time.perf_counter() - started  # the first figure of the process: matplotlib's import included
    started = time.perf_counter()
    board._png()
    figure_render_s = time.perf_counter() - started  # what a live matplotlib view would pay per update
    started = time.perf_counter()
    for _ in range(10):
        board.charts_html()
    chart_update_ms = 100 * (time.perf_counter() - started)  # the live SVG charts, 200 steps, per update
    record = {
        "benchmark": "dashboard",
        "command": " ".join(["python -m labkit bench dashboard", *(argv or [])]),
        "what": "time the training thread spends in LiveDashboard.log (chart updates included) plus the "
                "VRAMMonitor sampler's CPU time, as a fraction of simulated step time (sleep stands in for GPU "
                "work); run_overhead adds the one final render of close()",
        "target_overhead": args.target,
        "worst_overhead": worst,
        "passed": worst < args.target,
        "save_png_s": round(save_s, 3),
        "figure_render_s": round(figure_render_s, 3),
        "chart_update_ms": round(chart_update_ms, 2),
        "load_average_before": [round(x, 2) for x in load_before] if load_before else None,
        "load_average_after": [round(x, 2) for x in os.getloadavg()] if load_before else None,
        "runs": runs,
        "provenance": provenance(),
    }
    out = Path(args.out) if args.out else results_dir() / "dashboard_bench.json"
    write_json(out, record)
    print(f"worst per-step overhead {worst:.2%} (target < {args.target:.0%}) -> {out}")
    return 0 if record["passed"] else 1
