"""The fresh-process protocol of the memory benchmarks: ``python -m bench.worker KIND SPEC``.

A peak memory figure means something only in a process that measured nothing before: the parent
(:func:`run`) starts one worker per measurement, hands it a JSON spec, and reads one JSON line
back. The parent never touches CUDA, so its own context takes no memory from the measured run.
Kinds: ``probe`` (which device is here), ``build`` (save a catalogue architecture with random
weights), ``measure`` (:func:`bench.memory.measure_grpo`), ``chunked``
(:func:`bench.chunked_logps.measure_chunked`) and ``gpu`` (:func:`bench.gpu_measure.measure`).
"""
from __future__ import annotations

import importlib
import json
import os
import sys

__all__ = ["run", "KINDS"]

KINDS = {
    "probe": "bench.worker:probe",
    "build": "bench.worker:build",
    "measure": "bench.memory:measure_grpo",
    "chunked": "bench.chunked_logps:measure_chunked",
    "gpu": "bench.gpu_measure:measure",
}


def run(kind: str, spec: dict, timeout: float) -> dict:
    """Return the JSON answer of ``python -m bench.worker KIND SPEC``, run in a fresh process."""
    import subprocess

    env = dict(os.environ)
    # glibc otherwise serves large blocks from its heap after the first frees and keeps them: with a
    # fixed mmap threshold every tensor over 64 KiB is its own mapping, so RSS follows live memory.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    proc = subprocess.run([sys.executable, "-m", "bench.worker", kind, json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    answers = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not answers:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"status": "error", "error": " | ".join(tail)[-400:]}
    return json.loads(answers[-1])


def probe(spec: dict) -> dict:
    """Return the device this process sees (``spec["device"]``: cuda, cpu or None for the best one)."""
    from labkit.device import detect_device

    return {"status": "ok", "device": detect_device(spec["device"]).as_dict()}


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
