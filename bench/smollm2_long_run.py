"""``python -m bench smollm2-long-run``: the CPU recipe for hundreds of steps, its learning curve recorded.

The ``cpu-smollm2`` recipe (:func:`labkit.demo.real_model_demo`) trained for ``--steps`` GRPO
steps with the held-out right-answer rate measured every ``--every`` steps. Everything is written
under ``results/smollm2_long_run/`` *as the run goes*, so a run stopped half-way is still usable:
``curve.json`` (the held-out rate at each point, with seconds, CPU seconds and load average),
``log_history.json`` (TRL's logs), ``learning_curve.png``, ``dashboard.png`` (the lab's
dashboard), ``latest_completions.json`` (each held-out question beside its reply before training
and now); at the end ``summary.json`` (with every before/after completion) and ``demo.png``.
Meant for the background of an idle machine (``nice -n 19``, one thread), not for CI.
"""
from __future__ import annotations

import argparse
import os

from bench import results_dir
from labkit.cli import print_real_demo_summary
from labkit.demo import real_model_demo

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the long run; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m bench smollm2-long-run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=20, help="held-out evaluation every N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=None, help="default: the cpu-smollm2 preset's")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="folder (default results/smollm2_long_run)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = results_dir(args.out or "results/smollm2_long_run")
    command = ("python -m bench smollm2-long-run " + " ".join(argv or [])).strip()
    dashboard = None
    try:
        from labkit.dashboard import LiveDashboard

        dashboard = LiveDashboard(title=f"SmolLM2-135M-Instruct, CPU, {args.steps} steps", total_steps=args.steps,
                                  frontend="none", autoshow=False)
    except Exception as exc:  # noqa: BLE001  the picture is a bonus; the curve is the record
        print(f"no dashboard picture: {exc}")
    summary = real_model_demo("smollm2-135m", out, seed=args.seed, learning_rate=args.lr, steps=args.steps,
                              eval_every=args.every, threads=args.threads, progress=False, dashboard=dashboard,
                              keep_completions=True, command=command)
    print_real_demo_summary(summary)
    print(f"wrote {out}")
    return 0
