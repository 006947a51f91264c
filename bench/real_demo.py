"""``python -m bench smollm2-demo``: GRPO on a real instruct model on a CPU, 3 seeds and a learning-rate-0 control."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench import results_dir, write_json
from labkit.cli import print_real_demo_summary
from labkit.lab import provenance

__all__ = ["main", "KEPT"]

KEPT = ("seed", "right_number_before", "right_number_after", "rise_points", "mcnemar_p", "gained", "lost",
        "right_number_before_ci95", "right_number_after_ci95", "change_ci95_paired", "cut_off_before",
        "cut_off_after", "short_answer_before",
        "short_answer_after", "last_number_before", "last_number_after", "mean_words_before", "mean_words_after",
        "seconds", "cpu_seconds", "seconds_detail", "load_average_start", "load_average_end", "steps",
        "reward_per_step", "reward_std_per_step", "mean_length_per_step", "threads", "right_before", "right_after",
        "examples")


def _argv(args, seed: int, lr, tag: str) -> tuple[list[str], Path]:
    out = Path(args.runs) / f"{tag}-seed{seed}"
    argv = [sys.executable, "-m", "labkit", "demo", "--model", args.model, "--seed", str(seed), "--out", str(out),
            "--threads", str(args.threads), "--quiet"]
    if lr is not None:
        argv += ["--lr", repr(lr)]
    steps = args.control_steps if tag == "lr0" and args.control_steps is not None else args.steps
    if steps is not None:
        argv += ["--steps", str(steps)]
    return argv, out


def _reusable(args, seed: int, lr, tag: str) -> dict | None:
    """Return the summary an earlier identical run left in its folder (same command line and recipe), or None."""
    from labkit.presets import Preset, get_preset

    argv, out = _argv(args, seed, lr, tag)
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    steps = args.control_steps if tag == "lr0" and args.control_steps is not None else args.steps
    changes = {k: v for k, v in (("learning_rate", lr), ("max_steps", steps)) if v is not None}
    expected = get_preset("cpu-smollm2", model=args.model, seed=seed, **changes)

    def recipe(preset):  # the recipe, less its description and where it saves
        out = {k: v for k, v in preset.to_dict().items() if k != "description"}
        out["config"] = {k: v for k, v in out["config"].items() if not k.startswith("save_")}
        return out

    same_command = summary.get("command", "").split() == ["python", "-m", "labkit", "demo", *argv[4:]]
    return summary if same_command and recipe(Preset.from_dict(summary["preset"])) == recipe(expected) else None


def _run(args, seed: int, lr, tag: str, command: str) -> tuple[subprocess.Popen, Path]:
    argv, out = _argv(args, seed, lr, tag)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)
    log = open(out / "run.log", "w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), out


def main(argv: list[str] | None = None) -> int:
    """``python -m bench smollm2-demo``: :func:`labkit.demo.real_model_demo` for several seeds, and the control.

    Each run is ``python -m labkit demo --model smollm2-135m --seed N`` in its own process
    (``--jobs`` at a time, ``--threads`` torch threads each). Writes ``results/smollm2_demo.json``:
    each seed's held-out right-answer rate before and after GRPO with the exact McNemar p and
    the paired (Newcombe) interval of the change, the short-answer rate and mean length beside
    it, wall and CPU seconds with the load average, and the same pipeline with learning rate 0
    (the control). Passes when the mean rise is at least ``--min-rise`` points, every seed rises
    at least ``--min-seed-rise`` with McNemar p below ``--alpha``, the control moves at most
    ``--max-control`` points and every run's CPU time is under ``--max-seconds``.
    """
    parser = argparse.ArgumentParser(prog="python -m bench smollm2-demo", description=main.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--control-seeds", type=int, nargs="*", default=[0], help="learning rate 0 (default: seed 0)")
    parser.add_argument("--lr", "--learning-rate", dest="lr", type=float, default=None,
                        help="default: the cpu-smollm2 preset's")
    parser.add_argument("--steps", type=int, default=None, help="default: the cpu-smollm2 preset's")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (1: a busy machine)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process")
    parser.add_argument("--min-rise", type=float, default=15.0)
    parser.add_argument("--min-seed-rise", type=float, default=10.0)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--max-control", type=float, default=0.0)
    parser.add_argument("--max-seconds", type=float, default=900.0, help="CPU seconds per run (15 minutes)")
    parser.add_argument("--control-steps", type=int, default=None,
                        help="steps of the control runs (default: --steps); with learning rate 0 every step leaves the "
                             "weights as they are, so fewer steps make the same control")
    parser.add_argument("--reuse", action="store_true",
                        help="use a run's summary.json left in --runs by an identical earlier command (same command "
                             "line, same recipe) instead of running it again; the record says which were reused")
    parser.add_argument("--runs", default="runs/bench-smollm2", help="folder for each run's summary and plot")
    parser.add_argument("--out", default=None, help="results folder (default results/)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    command = ("python -m bench smollm2-demo " + " ".join(argv or [])).strip()
    started = time.perf_counter()
    plan = [(seed, args.lr, "grpo") for seed in args.seeds] + [(seed, 0.0, "lr0") for seed in args.control_seeds]
    running, done, reused, failed = [], {}, [], []
    if args.reuse:
        for seed, lr, tag in list(plan):
            summary = _reusable(args, seed, lr, tag)
            if summary is not None:
                plan.remove((seed, lr, tag))
                done[(tag, seed)] = summary
                reused.append(f"{tag}-seed{seed}")
                print(f"reusing {tag} seed {seed}: {summary['command']}")
    while plan or running:
        while plan and len(running) < max(1, args.jobs):
            seed, lr, tag = plan.pop(0)
            running.append((seed, tag, *_run(args, seed, lr, tag, command)))
        time.sleep(5)
        for item in list(running):
            seed, tag, process, out = item
            if process.poll() is None:
                continue
            running.remove(item)
            if process.returncode != 0:
                print(f"{tag} seed {seed} failed (exit {process.returncode}); see {out / 'run.log'}", file=sys.stderr)
                failed.append(f"{tag}-seed{seed}")
                continue
            summary = json.loads((out / "summary.json").read_text())
            print_real_demo_summary(summary)
            done[(tag, seed)] = summary
    if failed:
        print(f"FAIL: {', '.join(failed)} did not finish (their run.log says why); nothing recorded", file=sys.stderr)
        return 1
    # .get: "cut_off_*" (replies cut at the budget) is absent from summaries written before it was added
    trained = [{k: done[("grpo", s)].get(k) for k in KEPT} for s in args.seeds]
    control = [{k: done[("lr0", s)].get(k) for k in KEPT} for s in args.control_seeds]
    mean_rise = sum(r["rise_points"] for r in trained) / len(trained)
    control_move = max((abs(r["rise_points"]) for r in control), default=0.0)
    per_seed_ok = all(r["rise_points"] >= args.min_seed_rise and r["mcnemar_p"] < args.alpha for r in trained)
    passed = (mean_rise >= args.min_rise and per_seed_ok and control_move <= args.max_control
              and all(r["cpu_seconds"] < args.max_seconds for r in trained + control))
    last = done[("grpo", args.seeds[-1])]
    record = {
        "benchmark": "GRPO on a real instruct model on a CPU (labkit.demo.real_model_demo): right answers",
        "command": command, "metric": last["metric"], "task": last["task"], "system_prompt": last["system_prompt"],
        "preset": last["preset"] | {"seed": None},
        "runs": trained, "control_lr0": control,
        "mean_rise_points": mean_rise, "control_max_move_points": control_move,
        "criteria": {"min_mean_rise_points": args.min_rise, "min_rise_points_every_seed": args.min_seed_rise,
                     "mcnemar_alpha_every_seed": args.alpha, "max_control_move_points": args.max_control,
                     "max_cpu_seconds_per_run": args.max_seconds},
        "passed": passed,
        "machine": (f"a shared 2-core machine, busy (load average in each run); {args.jobs} runs at once with "
                    f"{args.threads} torch thread(s) each: wall seconds are not idle figures, CPU seconds are closer"),
        "control_steps": args.control_steps if args.control_steps is not None else last["steps"],
        "note": ("the control is the same pipeline with learning rate 0: LoRA's B matrices start at zero and greedy "
                 "decoding is deterministic, so an unchanged policy scores exactly the same; it shows the pipeline "
                 "changes nothing by itself, it is not a noise estimate (the McNemar test per seed is)"),
        "reused_runs": reused, "run_commands": {f"{tag}-seed{seed}": summary["command"]
                                                for (tag, seed), summary in done.items()},
        "seconds_total": time.perf_counter() - started, "provenance": provenance(),
    }
    path = write_json(results_dir(args.out) / "smollm2_demo.json", record)
    _plot(record, path.with_suffix(".png"))
    seeds = ", ".join(f"{r['rise_points']:+.1f} p={r['mcnemar_p']:.2g}" for r in trained)
    print(f"{'PASS' if passed else 'FAIL'}: mean rise {mean_rise:+.1f} points ({seeds}), control moved "
          f"{control_move:.1f}; wrote {path}")
    return 0 if passed else 1


def _plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit.evaluate import wilson_interval

    runs = [(f"seed {r['seed']}", r) for r in record["runs"]] + [(f"lr 0, seed {r['seed']}", r)
                                                                  for r in record["control_lr0"]]
    fig, ax = plt.subplots(figsize=(8, 3.4), dpi=80)
    for i, (label, r) in enumerate(runs):
        n = len(r["right_before"])
        for dx, key, colour in ((-0.18, "before", "#bbbbbb"), (0.18, "after", "#1f77b4")):
            k = sum(r[f"right_{key}"])
            low, high = wilson_interval(k, n)
            ax.bar(i + dx, k / n, width=0.36, color=colour, yerr=[[k / n - low], [high - k / n]], capsize=4,
                   label=f"{key} GRPO" if i == 0 else None)
        ax.text(i, 1.0, f"p={r['mcnemar_p']:.2g}", ha="center", fontsize=8)
    ax.set(xticks=range(len(runs)), xticklabels=[label for label, _ in runs], ylim=(0, 1.08),
           ylabel="held-out right answers", title=f"SmolLM2-135M-Instruct, {len(record['runs'][0]['right_before'])} "
                                                  "held-out word problems (greedy, 95% Wilson)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
