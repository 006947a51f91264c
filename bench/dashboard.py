"""``python -m bench dashboard``: what the live dashboard and the memory sampler cost per step, on a made-up run
(:func:`simulated_run`, which the dashboard's tests feed it too)."""
from __future__ import annotations

import argparse
import io
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

from labkit.dashboard import LiveDashboard
from labkit.dashboard.live import charts
from labkit.dashboard.picture import png_bytes
from labkit.monitor import VRAMMonitor

__all__ = ["main", "simulated_run"]


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


def _bench_once(frontend: str, step_s: float, steps: int, monitor_interval_s: float) -> dict:
    import contextlib

    dashboard = LiveDashboard(title=f"bench {frontend}", total_steps=steps, frontend=frontend, autoshow=False,
                              tick_s=None)
    phases = (("generation", 0.6), ("scoring", 0.05), ("backward", 0.3), ("optimizer step", 0.05))
    work_s = 0.0
    started = time.perf_counter()
    quiet = contextlib.redirect_stderr(io.StringIO()) if frontend == "text" else contextlib.nullcontext()
    with quiet, VRAMMonitor(interval_s=monitor_interval_s) as monitor:
        dashboard.record.monitor = monitor
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
    view = dashboard.view
    renders = view.throttle.render_seconds if view is not None else []
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
        "card_updates": view.card_updates if view is not None else 0,
        "plot_renders": view.plot_renders if view is not None else 0,
        "plot_render_ms_mean": round(1000 * sum(renders) / len(renders), 1) if renders else None,
        "plot_render_ms_max": round(1000 * max(renders), 1) if renders else None,
        "seconds_between_chart_updates": round(view.throttle.plot_interval, 2) if frontend not in ("text", "none") else None,
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m bench dashboard``: the dashboard's and the monitor's cost per training step.

    Simulated steps (sleeps standing in for GPU work, split into the four phases) are fed to a
    :class:`LiveDashboard` while a :class:`VRAMMonitor` samples. ``overhead`` is the time spent in
    ``dashboard.log`` (chart updates included) plus the sampler thread's CPU time, over the steps'
    own time; ``run_overhead`` adds the final update of ``close()``. Also times one
    ``dashboard.save()`` (the matplotlib figure), which is not part of the loop. Writes ``results/dashboard_bench.json`` with :func:`labkit.lab.provenance`.
    """
    from bench import results_dir, write_json
    from labkit.lab import provenance

    parser = argparse.ArgumentParser(prog="python -m bench dashboard", description=main.__doc__,
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
    png_bytes(board.record)
    figure_render_s = time.perf_counter() - started  # what a live matplotlib view would pay per update
    started = time.perf_counter()
    for _ in range(10):
        charts(board.record)
    chart_update_ms = 100 * (time.perf_counter() - started)  # the live SVG charts, 200 steps, per update
    record = {
        "benchmark": "dashboard",
        "command": " ".join(["python -m bench dashboard", *(argv or [])]),
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
