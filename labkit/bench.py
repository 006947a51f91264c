"""Benchmarks: ``python -m labkit bench NAME [options]`` records figures under ``results/``.

Speed and memory targets are checked here, by commands that write what they measured
(with :func:`labkit.lab.provenance`: device, versions, date), never by timed tests.
"""
from __future__ import annotations

import csv
import importlib
import json
import sys
from pathlib import Path

__all__ = ["BENCHMARKS", "results_dir", "write_json", "append_csv", "bench_cli"]

# name -> ("module:function", help). Each function takes argv and returns an exit code.
BENCHMARKS = {
    "memory": ("labkit.memory:bench_memory_cli", "measure peak memory of real GRPO steps -> results/memory.csv"),
    "chunked-logps": ("labkit.memory:bench_chunked_cli", "peak memory of chunked vs full log-probs -> results/"),
    "rewards": ("labkit.rewards:bench_cli", "worst-case reward time on adversarial inputs -> results/"),
    "dashboard": ("labkit.dashboard:bench_cli", "dashboard overhead per training step -> results/"),
    "preset": ("labkit.presets:bench_preset_cli",
               "GRPO steps of a preset (random weights, full-length completions) under a GPU memory cap -> results/"),
    "unsloth": ("labkit.unsloth_path:bench_unsloth_cli",
                "plain TRL vs Unsloth on one preset (GPU, Unsloth environment) -> results/unsloth_vs_trl.csv"),
    "demo": ("labkit.nano:bench_demo_cli", "the main job over several seeds -> results/"),
    "full-vs-lora": ("labkit.memory:bench_full_vs_lora_cli",
                     "full-parameter vs LoRA GRPO on the CPU nano task (3 seeds, LR sweep) -> results/full_vs_lora.json"),
}


def results_dir(path: str | Path | None = None) -> Path:
    """Return the results folder (``results/`` in the current directory unless given), created."""
    folder = Path(path or "results")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_json(path: str | Path, record: dict) -> Path:
    """Write ``record`` as indented JSON to ``path`` and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    return path


def append_csv(path: str | Path, rows: list[dict]) -> Path:
    """Append ``rows`` to a CSV file, writing the header when the file is new."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    fields = list(rows[0]) if rows else []
    if not new:
        with path.open() as fh:
            header = next(csv.reader(fh), [])
        missing = [f for f in fields if f not in header]
        if missing:
            raise ValueError(f"{path} has columns {header}; these rows add {missing}. Write to a new file.")
        fields = header
    with path.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        if new:
            writer.writeheader()
        writer.writerows(rows)
    return path


def bench_cli(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m labkit bench NAME [options]\n\nbenchmarks:")
        for name, (_, help_) in BENCHMARKS.items():
            print(f"  {name:<14} {help_}")
        return 0
    name = argv[0]
    if name not in BENCHMARKS:
        print(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    module_name, func_name = BENCHMARKS[name][0].split(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        print(f"benchmark {name!r} is not available in this version of labkit ({exc})", file=sys.stderr)
        return 2
    return int(func(argv[1:]) or 0)
