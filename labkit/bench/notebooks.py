"""``python -m labkit bench notebooks [NAME ...]``: each notebook run end to end in CPU mode, as a learner runs it,
with its wall time and its kernel's peak memory -> ``results/notebook_times.json``.

The figures the README's table and each notebook's header state ("about 11 min", "needs 3 GiB of RAM") come
from here. A notebook runs through papermill (the CI's way) in a temporary folder; a thread reads the resident
memory of this process's children (the kernel and anything it starts) 20 times a second and keeps the peak.
How busy the machine was is recorded with each row (the cores other work kept busy before the run, the load
average after it): a figure taken beside another job is slower (issue 33: 3 to 10 times on 2 cores) and says so.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

from labkit.lab import busy_cores
from labkit.memory import GIB

__all__ = ["main", "execute_cpu_mode", "run_notebook", "KernelMemory"]

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


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
    parser = argparse.ArgumentParser(prog="python -m labkit bench notebooks", description=__doc__.split("\n\n")[0])
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
    from labkit.lab import NOTEBOOK_TIMES, record_notebook_time, results_dir

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
