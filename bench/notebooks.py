"""``python -m bench notebooks [NAME ...]``: each notebook run end to end in CPU mode, as a learner runs it,
with its wall time and its kernel's peak memory -> ``results/notebook_times.json``.

The figures the README's table and each notebook's header state ("about 11 min", "needs 3 GiB of RAM") come
from here. A notebook runs through papermill (the CI's way) in a temporary folder; a thread reads the resident
memory of this process's children (the kernel and anything it starts) 20 times a second and keeps the peak.
How busy the machine was is recorded with each row (the cores other work kept busy before the run, the load
average after it): a figure taken beside another job is slower (issue 33: 3 to 10 times on 2 cores) and says so.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

from labkit.lab import busy_cores, provenance, results_dir, write_json
from labkit.memory import GIB

__all__ = ["main", "execute_cpu_mode", "run_notebook", "KernelMemory", "NOTEBOOK_TIMES", "read_notebook_times",
           "record_notebook_time", "notebook_time_label"]

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


NOTEBOOK_TIMES = "notebook_times.json"


def read_notebook_times(path: str | Path | None = None) -> dict:
    """Return ``{notebook file name: record}`` from ``results/notebook_times.json`` (empty when there is none)."""
    path = Path(path) if path else results_dir() / NOTEBOOK_TIMES
    if not path.exists():
        return {}
    return json.loads(path.read_text()).get("notebooks", {})


def record_notebook_time(name: str, seconds: float, *, note: str = "", peak_kernel_rss_gib: float | None = None,
                         path: str | Path | None = None) -> Path:
    """Record that notebook ``name`` ran end to end in CPU mode in ``seconds`` (and its kernel's peak resident
    memory), with provenance; return the file.

    Written by ``python -m bench notebooks``; the README's notebook table and each notebook's header
    state :func:`notebook_time_label` of these figures (a test checks).
    """
    path = Path(path) if path else results_dir() / NOTEBOOK_TIMES
    record = json.loads(path.read_text()) if path.exists() else {}
    record["command"] = "python -m bench notebooks NN"
    record.setdefault("notebooks", {})[name] = {
        "seconds": round(float(seconds), 1),
        "mode": "cpu",
        "note": note,
        **({"peak_kernel_rss_gib": peak_kernel_rss_gib} if peak_kernel_rss_gib is not None else {}),
        # the 1-minute load average as the notebook ended: its own threads count, other work shows above the cores
        "load_average_end": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "provenance": provenance(),
    }
    record["notebooks"] = dict(sorted(record["notebooks"].items()))
    return write_json(path, record)


def notebook_time_label(seconds: float) -> str:
    """Return how the README and the notebook headers state a CPU run time: ``"under 1 min"`` or ``"about N min"``."""
    if seconds < 60:
        return "under 1 min"
    return f"about {max(1, round(seconds / 60))} min"


class KernelMemory:
    """The peak resident memory of this process's children (a notebook's kernel), read every ``every_s`` seconds."""

    def __init__(self, every_s: float = 0.05):
        import psutil

        self._me, self.every_s, self.peak_bytes = psutil.Process(), every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="labkit-kernel-memory", daemon=True)

    def _watch(self) -> None:
        import psutil

        while not self._stop.wait(self.every_s):
            total = 0
            for child in self._me.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:  # a child that ended between the listing and the reading
                    pass
            self.peak_bytes = max(self.peak_bytes, total)

    def __enter__(self) -> "KernelMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def execute_cpu_mode(path: Path, workdir: Path, *, timeout_s: int) -> Path:
    """Execute notebook ``path`` as CI does: papermill, parameters ``MODE="cpu"``, offline, its runs under
    ``workdir``, from its own folder (notebooks read results/ and docs/ relative to themselves), at most
    ``timeout_s`` per cell. Return the executed copy (``workdir / path.name``); a failing cell raises."""
    import papermill

    env_before = dict(os.environ)
    os.environ.update({"LABKIT_MODE": "cpu", "MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1",
                       "LABKIT_RUNS": str(workdir / "runs")})  # the notebooks' runs/ folders, not the repository's
    try:
        papermill.execute_notebook(str(path), str(workdir / path.name), parameters={"MODE": "cpu"},
                                   cwd=str(path.parent), kernel_name="python3", progress_bar=False,
                                   execution_timeout=timeout_s)
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    return workdir / path.name


def run_notebook(path: Path, workdir: Path, *, timeout_s: int = 1800) -> dict:
    """Run one notebook in CPU mode (:func:`execute_cpu_mode`) and return its row: time, kernel peak, error."""
    before = busy_cores()
    started = time.perf_counter()
    error = None
    try:
        with KernelMemory() as memory:
            execute_cpu_mode(path, workdir, timeout_s=timeout_s)
    except Exception as exc:  # noqa: BLE001 - a failing notebook is a row that says so, and the next one runs
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    seconds = time.perf_counter() - started
    return {"notebook": path.name, "seconds": round(seconds, 1), "minutes": round(seconds / 60, 1),
            "peak_kernel_rss_gib": round(memory.peak_bytes / GIB, 2), "ok": error is None, "error": error,
            "busy_cores_before": round(before, 2), "load_average_after": round(os.getloadavg()[0], 2),
            "cores": os.cpu_count()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench notebooks", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebooks to run, by name or prefix (04, 04_lora_grpo_16gb); "
                                                 "default: all of them, in order")
    parser.add_argument("--note", default="", help="on what machine, and how busy it was (recorded with each row; "
                                                   "the cores other work kept busy are added)")
    parser.add_argument("--out", default=None, help="JSON file (default results/notebook_times.json); rows of "
                                                    "other notebooks already there are kept")
    args = parser.parse_args(argv)
    import importlib.util

    if importlib.util.find_spec("papermill") is None:
        print("bench notebooks runs each notebook with papermill, which is not installed: "
              "pip install -e \".[dev]\" (or pip install papermill)")
        return 2
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    if args.names:
        def matches(p, n):
            return n in (p.stem, p.name) or p.stem.startswith(n)

        unknown = [n for n in args.names if not any(matches(p, n) for p in paths)]
        if unknown:
            print(f"no notebook matches {unknown}; choose from {', '.join(p.stem for p in paths)}")
            return 2
        paths = [p for p in paths if any(matches(p, n) for n in args.names)]
    out = Path(args.out) if args.out else results_dir() / NOTEBOOK_TIMES
    failed = 0
    with tempfile.TemporaryDirectory(prefix="labkit-notebooks-") as tmp:
        for path in paths:
            print(f"{path.name}: running in CPU mode ...", flush=True)
            row = run_notebook(path, Path(tmp))
            busy = (f"other work kept {row['busy_cores_before']:.1f} of {row['cores']} cores busy as it started, "
                    f"load average {row['load_average_after']:.1f} as it ended")
            print(f"  {row['minutes']} min, the kernel's peak {row['peak_kernel_rss_gib']} GiB, "
                  f"{'ok' if row['ok'] else row['error']} ({busy})", flush=True)
            if not row["ok"]:
                failed += 1
                continue  # a failed run's time is not the notebook's: the recorded row stays as it was
            record_notebook_time(path.name, row["seconds"], note="; ".join(x for x in (args.note, busy) if x),
                                 peak_kernel_rss_gib=row["peak_kernel_rss_gib"], path=out)
    print(f"written {out}")
    return 1 if failed else 0
