"""The fresh-process protocol of the memory benchmarks: ``python -m bench.worker KIND SPEC``.

A peak memory figure means something only in a process that measured nothing before: the parent
(:func:`run`) starts one worker per measurement, hands it a JSON spec, and reads one JSON line
back. The parent never touches CUDA, so its own context takes no memory from the measured run.
Kinds: ``probe`` (which device is here; on CUDA also the context one process costs, measured alone),
``build`` (save a catalogue architecture with random weights), ``measure`` (:func:`bench.memory.measure_grpo`),
``chunked`` (:func:`bench.chunked_logps.measure_chunked`) and ``gpu`` (:func:`bench.gpu_measure.measure`).

:func:`run` waits for its worker; :func:`start` returns a :class:`Running` worker at once, so that
``python -m bench gpu`` can run several side by side, each in its own process: its answer goes to a file
(never a pipe that a chatty worker could fill), and a worker that dies or is killed loses only its own row.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["run", "start", "Running", "KINDS"]

KINDS = {
    "probe": "bench.worker:probe",
    "build": "bench.worker:build",
    "measure": "bench.memory:measure_grpo",
    "chunked": "bench.chunked_logps:measure_chunked",
    "gpu": "bench.gpu_measure:measure",
}


def _environment(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    # glibc otherwise serves large blocks from its heap after the first frees and keeps them: with a
    # fixed mmap threshold every tensor over 64 KiB is its own mapping, so RSS follows live memory.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


class Running:
    """A worker process started by :func:`start`: :meth:`poll` it, read its :meth:`answer`, or :meth:`kill` it."""

    def __init__(self, kind: str, spec: dict, env: dict | None = None):
        self.kind, self.spec = kind, spec
        self._folder = Path(tempfile.mkdtemp(prefix="labkit-worker-"))
        self._out = (self._folder / "stdout").open("w")
        self._err = (self._folder / "stderr").open("w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.worker", kind, json.dumps(spec)],
                                     env=_environment(env), stdout=self._out, stderr=self._err, text=True)
        self.pid = self.proc.pid

    def poll(self) -> bool:
        """Return True once the worker has ended (answered, crashed or been killed)."""
        return self.proc.poll() is not None

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def kill(self) -> None:
        """End this worker (and only it) now."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def answer(self) -> dict:
        """Return the worker's JSON answer, or ``{"status": "error", "error": ...}`` saying how it ended."""
        code = self.proc.wait()
        self._out.close()
        self._err.close()
        out = (self._folder / "stdout").read_text(errors="replace")
        err = (self._folder / "stderr").read_text(errors="replace")
        for path in (self._folder / "stdout", self._folder / "stderr"):
            path.unlink(missing_ok=True)
        self._folder.rmdir()
        answers = [line for line in out.splitlines() if line.startswith("{")]
        if code == 0 and answers:
            return json.loads(answers[-1])
        if code < 0:  # a signal: -9 is SIGKILL (the kernel's OOM killer, or someone's kill -9)
            how = f"the worker was killed by {signal.Signals(-code).name}"
        else:
            how = f"the worker exited with code {code}"
        tail = (err or out).strip().splitlines()[-5:]
        return {"status": "error", "error": (how + (": " + " | ".join(tail) if tail else ""))[-400:]}


def start(kind: str, spec: dict, env: dict | None = None) -> Running:
    """Start ``python -m bench.worker KIND SPEC`` in a fresh process and return it at once (``env``: variables to set)."""
    return Running(kind, spec, env)


def run(kind: str, spec: dict, timeout: float) -> dict:
    """Return the JSON answer of ``python -m bench.worker KIND SPEC``, run in a fresh process.

    Raises ``subprocess.TimeoutExpired`` (after killing the worker) when it runs past ``timeout`` seconds.
    """
    worker = start(kind, spec)
    try:
        worker.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.answer()  # closes and removes its files
        raise
    return worker.answer()


def probe(spec: dict) -> dict:
    """Return the device this process sees (``spec["device"]``: cuda, cpu or None for the best one).

    On CUDA, also the memory one process's CUDA context takes outside PyTorch's allocator (``context_gib``:
    ``mem_get_info``'s used memory less PyTorch's reserved, read while nothing else runs, which is why the
    parent probes before it starts any row), and whether NVML lists this process's own memory
    (``nvml_per_process``: then a row measured beside others reads its own context there).
    """
    from labkit.device import detect_device

    device = detect_device(spec["device"])
    answer = {"status": "ok", "device": device.as_dict(), "cpu_count": os.cpu_count()}
    if device.kind == "cuda":
        import torch

        from bench.gpu_measure import process_gpu_bytes

        torch.empty(1, device="cuda")  # the context exists from here on
        free, total = torch.cuda.mem_get_info()
        answer["context_gib"] = (total - free - torch.cuda.memory_reserved()) / 2 ** 30
        answer["nvml_per_process"] = process_gpu_bytes() is not None
    return answer


def build(spec: dict) -> dict:
    """Save catalogue architecture ``spec["model"]`` with random weights in ``spec["dtype"]`` to ``spec["folder"]``."""
    import torch

    from bench.preset import save_random_architecture

    save_random_architecture(spec["model"], spec["folder"], dtype=getattr(torch, spec["dtype"]))
    return {"status": "ok"}


def _main(argv: list[str]) -> dict:
    if len(argv) != 2 or argv[0] not in KINDS:
        raise SystemExit("bench.worker runs the benchmarks' worker processes (kinds: "
                         f"{', '.join(KINDS)}); use python -m bench memory | chunked-logps instead")
    module_name, func_name = KINDS[argv[0]].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    try:
        return func(json.loads(argv[1]))
    except Exception as exc:  # reported to the parent, which records the failure
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:400]}


if __name__ == "__main__":
    print(json.dumps(_main(sys.argv[1:])), flush=True)
