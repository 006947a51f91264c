"""Memory measured: this process's RSS and peak, the GPU through PyTorch and NVML, a sampler, and exact counts of what a
live model holds.

What the dashboard's VRAM gauge reads (:func:`memory_snapshot`), the peak resident memory the CPU
benchmarks measure (:func:`reset_peak_rss`, :func:`peak_rss_bytes`), and :class:`VRAMMonitor`,
which samples memory on a background thread and records phase marks
(``with monitor.phase("generation"): ...``) to show where a step's memory goes. :func:`state_bytes` sums the
weights, gradients and optimiser states of a real model; :func:`saved_activation_bytes` counts what autograd keeps
for the backward pass of a forward: both exactly, on any device, and the tests hold the estimator to them
(``05_full_vs_lora.ipynb``). The *estimate* of that memory, from shapes alone, is :mod:`labkit.memory`. Used from
``04_lora_grpo_16gb.ipynb`` on.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from labkit.memory import GIB

__all__ = [
    "MemorySnapshot", "memory_snapshot", "gauge_level", "process_rss", "reset_peak_rss", "peak_rss_bytes",
    "PhaseMark", "VRAMMonitor", "state_bytes", "saved_activation_bytes",
]


class _NVML:
    """NVML, initialised on first use; ``None`` answers wherever there is no NVIDIA driver."""

    def __init__(self):
        self._lock = threading.Lock()
        self._module = None  # the pynvml module once initialised, False when unavailable
        self._handles: dict[int, object] = {}

    def _handle(self, index: int):
        nvml = self._module
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
        # A MIG slice (MIG-<uuid>) shares its parent GPU's bus address, so the bus lookup below would read
        # the whole card: look a UUID (MIG-... or GPU-...) up by UUID, which names the slice itself.
        if index < len(visible) and visible[index].startswith(("MIG-", "GPU-")):
            uuid = visible[index]
            try:
                return nvml.nvmlDeviceGetHandleByUUID(uuid.encode())
            except Exception:  # noqa: BLE001 - older drivers want a str
                return nvml.nvmlDeviceGetHandleByUUID(uuid)
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
        if index < len(visible) and visible[index].isdigit():
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


nvml_reader = _NVML()
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@functools.cache
def _process(pid: int):
    import psutil

    return psutil.Process(pid)


def process_rss() -> int:
    """Return this process's resident memory in bytes."""
    # On Linux, /proc/self/statm costs ~5 us against psutil's ~50 us: it matters at 50 samples a second.
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return int(_process(os.getpid()).memory_info().rss)  # by pid: a forked worker must not read its parent's


@functools.cache
def _host_memory_total() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


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
    else:
        device = torch.device(device)
        if device.type != "cuda":
            return None
        if not torch.cuda.is_available():
            raise RuntimeError(f"memory of {device} was asked for, but torch sees no CUDA device")
        if device.index is not None:
            return device.index
    # current_device() would create a CUDA context (hundreds of MB); only ask once one exists.
    return torch.cuda.current_device() if torch.cuda.is_initialized() else 0


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
    device_used, device_total = nvml_reader.memory(index) or (
        None, torch.cuda.get_device_properties(index).total_memory if torch.cuda.is_initialized() else None)
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
        nvml = nvml_reader.memory(self.index)
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

    @classmethod
    def from_record(cls, record: dict) -> "VRAMMonitor":
        """Return a stopped monitor holding a recorded run's samples and phase marks, to plot without its device.

        ``record`` is what ``python -m bench gpu`` keeps of a measured run
        (``results/gpu/dashboard_laptop-16gb.json``: ``label``, ``timeline``, ``phases``): notebooks 04 and 05
        replay a real 16 GB run's memory, phase by phase, on a CPU.
        """
        monitor = cls(device="cpu")
        monitor.kind = "cuda" if record["label"] == "torch allocated" else "cpu"
        timeline = record["timeline"]
        monitor.times = list(timeline["t"])
        monitor.used = [round(v * GIB) for v in timeline[record["label"]]]
        monitor.reserved = [round(v * GIB) for v in timeline.get("torch reserved", [])]
        monitor.device_used = [round(v * GIB) for v in timeline.get("whole GPU (NVML)", [])]
        monitor.phases = [PhaseMark(**mark) for mark in record["phases"]]
        return monitor

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
            out = {"t": list(self.times), self.label: [u / GIB for u in self.used]}
            if self.reserved:
                out["torch reserved"] = [r / GIB for r in self.reserved]
            if self.device_used and len(self.device_used) == len(self.times):
                out["whole GPU (NVML)"] = [d / GIB for d in self.device_used]
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
            row["peak_gib"] = max(row["peak_gib"], mark.peak_bytes / GIB)
            row["transient_gib"] += (mark.peak_bytes - mark.start_bytes) / GIB
            row["kept_gib"] += (mark.end_bytes - mark.start_bytes) / GIB
        for row in rows.values():
            row["transient_gib"] /= row["count"]
            row["kept_gib"] /= row["count"]
        return list(rows.values())

    def plot(self, step: int | None = None, figsize: tuple[float, float] = (12.0, 4.0), budget_gib: float | None = None):
        """Return a figure of where a step's memory goes: the timeline with its phases, and each phase's peak.

        ``step=None`` shows the whole run, ``step=-1`` the last step, ``step=k`` step ``k`` (counted from 0, as
        :meth:`phase` marks them); ``budget_gib`` draws the card's memory as a dashed line. The title counts steps
        as TRL and the dashboard do, from 1: ``step=1`` of a two-step run is "step 2 of 2".
        """
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        marks = self.phases
        steps = sorted({m.step for m in marks})
        series = self.timeline()
        t = series.pop("t")
        keep = range(len(t))
        if step is not None and marks:
            chosen = steps[step] if step < 0 else step
            marks = [m for m in marks if m.step == chosen]
            if not marks:
                raise ValueError(f"no phase was marked in step {step}; steps marked: {steps}")
            low, high = marks[0].start_s, marks[-1].end_s
            pad = 0.02 * max(high - low, 1e-6)
            keep = [i for i, x in enumerate(t) if low - pad <= x <= high + pad]
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
        if budget_gib:
            timeline_ax.axhline(budget_gib, color="red", ls="--", lw=1, label=f"the card: {budget_gib:g} GiB")
        timeline_ax.set_xlabel("seconds since the monitor started")
        timeline_ax.set_ylabel("GiB")
        where = ("whole run" if step is None else
                 f"step {steps.index(marks[0].step) + 1} of {len(steps)}" if marks else "")
        timeline_ax.set_title(f"memory over time ({where}); shaded: phases")
        timeline_ax.legend(fontsize=8, loc="upper left")
        timeline_ax.grid(alpha=0.3)
        rows: dict[str, list[float]] = {}  # name -> [peak, largest rise above the phase's start]
        for mark in marks:
            row = rows.setdefault(mark.name, [0.0, 0.0])
            row[0] = max(row[0], mark.peak_bytes / GIB)
            row[1] = max(row[1], (mark.peak_bytes - mark.start_bytes) / GIB)
        bars_ax.barh(list(rows), [peak for peak, _ in rows.values()], color=[colours[n] for n in rows])
        bars_ax.invert_yaxis()
        bars_ax.set_xlabel(f"peak {self.label} (GiB)")
        bars_ax.set_title("peak by phase (+ rise within it)")
        for y, (peak, rise) in enumerate(rows.values()):
            bars_ax.text(peak, y, f" {peak:.2f} (+{rise:.2f})", va="center", fontsize=8)
        bars_ax.set_xlim(0, 1.35 * max([peak for peak, _ in rows.values()] + [1e-3]))
        fig.tight_layout()
        return fig


def reset_peak_rss() -> bool:
    """Reset the kernel's record of this process's peak resident memory; return False where it cannot.

    Linux (>= 4.0) can, through ``/proc/self/clear_refs``. macOS and Windows cannot: there the
    peak counts from the start of the process, which is why the benchmarks measure in a fresh one.
    """
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Return this process's peak resident memory in bytes, since its start or :func:`reset_peak_rss`.

    Linux: ``VmHWM`` from ``/proc/self/status``. macOS: ``getrusage``'s ``ru_maxrss``, which macOS
    reports in bytes (Linux in KiB). Raises ``RuntimeError`` on a system that offers neither.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import resource
    except ImportError as exc:  # Windows
        raise RuntimeError(f"cannot read the peak resident memory on {sys.platform}: "
                           "no /proc and no getrusage; run the CPU memory benchmarks on Linux or macOS") from exc
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def state_bytes(model, optimizer=None) -> dict:
    """Return ``{"weights", "gradients", "optimizer"}``: bytes held by a model's tensors, measured.

    Weights: every parameter once (tied weights once; bitsandbytes 4-bit weights by their packed
    storage plus quantisation constants). Gradients: every ``.grad`` that exists. Optimizer: every
    tensor in ``optimizer.state`` (once, however many parameters share it). The counterpart of
    :func:`labkit.memory.estimate`'s exact terms; ``05_full_vs_lora.ipynb`` compares the two.
    """
    weights = gradients = 0
    for p in model.parameters():  # tied weights once: parameters() skips repeats
        weights += p.numel() * p.element_size()
        quant_state = getattr(p, "quant_state", None)
        if quant_state is not None:
            weights += sum(t.numel() * t.element_size() for t in _tensors_of(quant_state))
        if p.grad is not None:
            gradients += p.grad.numel() * p.grad.element_size()
    states = {id(value): value for state in (optimizer.state.values() if optimizer is not None else ())
              for value in state.values() if isinstance(value, torch.Tensor)}
    return {"weights": weights, "gradients": gradients,
            "optimizer": sum(t.numel() * t.element_size() for t in states.values())}


def _tensors_of(quant_state):
    found = []
    for value in vars(quant_state).values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif hasattr(value, "absmax"):  # nested state of double quantisation
            found.extend(_tensors_of(value))
    return found


def saved_activation_bytes(forward, exclude=None) -> int:
    """Return the bytes of the tensors autograd keeps for the backward pass of ``forward()``.

    Every tensor saved for backward is counted once, by its storage. ``exclude`` is a model (its
    parameters and buffers) or an iterable of tensors not to count, so that what remains is
    activation memory (the token ids an embedding keeps included). Gradient checkpointing hides
    what a checkpointed layer keeps from these hooks: measure without it. Used to check the
    activation formula of :func:`labkit.memory.estimate` (``05_full_vs_lora.ipynb``, ``tests/test_memory.py``).
    """
    from torch.autograd.graph import saved_tensors_hooks

    if isinstance(exclude, torch.nn.Module):
        exclude = [*exclude.parameters(), *exclude.buffers()]
    owned = {t.untyped_storage().data_ptr() for t in (exclude or ())}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in owned and storage.nbytes():
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    return sum(kept.values())
