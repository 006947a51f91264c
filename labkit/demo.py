"""The lab's main job, ``python -m labkit demo``: a model learns with GRPO on a laptop CPU, measured.

:func:`demo` runs the nano task of ``03_nano_grpo_cpu.ipynb`` end to end (warm-up from scratch,
held-out accuracy before, :func:`labkit.nano.nano_grpo`, accuracy after) and writes
``summary.json`` and ``demo.png``. ``python -m labkit bench demo`` repeats it over seeds and with
the learning rate at 0 (the control) into ``results/``.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from labkit.lab import provenance, write_json
from labkit.nano import NanoConfig, plot_run, run_nano_grpo

__all__ = ["demo"]
def demo(config: NanoConfig | None = None, out: str | os.PathLike = "runs/demo", *, progress: bool = True,
         command: str | None = None) -> dict:
    """Return the main job's summary after writing ``out/summary.json`` and ``out/demo.png``.

    Warms the tiny model up from scratch (no cache: the time counts), evaluates held-out
    accuracy, runs :func:`nano_grpo`, evaluates again, and records the figures with their
    provenance (:func:`labkit.lab.provenance`).
    """
    config = config or NanoConfig()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result = run_nano_grpo(config, reuse_warm_up=False, progress=progress)
    seconds = time.perf_counter() - started
    plot_run(result.history, result.evals, out / "demo.png", title=f"nano GRPO, seed {config.seed}")
    summary = {
        "accuracy_before": result.accuracy_before,
        "accuracy_after": result.accuracy_after,
        "rise_points": 100 * (result.accuracy_after - result.accuracy_before),
        "greedy_accuracy_before": result.before.get("greedy_accuracy"),
        "greedy_accuracy_after": result.after.get("greedy_accuracy"),
        "carry_rate_before": result.before["carry_rate"],
        "carry_rate_after": result.after["carry_rate"],
        "format_before": result.before["format"],
        "format_after": result.after["format"],
        "seconds": seconds,
        "seconds_detail": result.seconds,
        "seconds_per_grpo_step": result.seconds_per_step,
        "seed": config.seed,
        "accuracy_metric": (f"held-out pass@1: right answers among {config.eval_samples} completions sampled at "
                            f"temperature {config.temperature} for each of {config.eval_problems} held-out problems "
                            "(never trained on), after the warm-up (before) and after GRPO (after)"),
        "task": "two-digit addition with a carry; warm-up on a teacher that forgets the carry "
                f"in {config.forget_carry:.0%} of its worked examples",
        "parameters": result.parameters,
        "config": result.config,
        "evals": result.evals,
        "curve": {name: result.curve(name) for name in ("reward", "rewards/accuracy_reward/mean", "carry_rate",
                                                        "loss", "step_time")},
        "command": command or "labkit.demo.demo()",
        "threads": torch.get_num_threads(),
        "provenance": provenance(),
    }
    write_json(out / "summary.json", summary)
    return summary
