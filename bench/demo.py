"""``python -m bench demo``: the main job over several seeds, and its learning-rate-0 control -> results/."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from labkit.cli import demo_config, demo_parser, print_demo_summary
from labkit.demo import demo
from labkit.nano import NanoConfig

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """``python -m bench demo``: the main job for several seeds, and with learning rate 0, -> results/.

    Writes ``results/demo_seeds.json`` (each seed's accuracy before and after, seconds and
    provenance; passes when every seed rises by ``--min-rise`` points in under
    ``--max-seconds``) and ``results/demo_ablation_lr0.json`` (the same seeds with the policy
    update switched off). Each run's folder (summary and plot) is under ``--runs``.
    """
    from bench import results_dir, write_json
    from labkit.lab import provenance

    parser = demo_parser("python -m bench demo", main.__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ablation-seeds", type=int, nargs="*", default=None,
                        help="seeds of the learning-rate-0 ablation (default: --seeds; none: skip it)")
    parser.add_argument("--min-rise", type=float, default=20.0, help="points of accuracy each seed must gain")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="wall time each run must stay under")
    parser.add_argument("--out", default=None, help="results folder (default results/)")
    parser.add_argument("--runs", default="runs/bench-demo", help="folder for each run's summary and plot")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    command = ("python -m bench demo " + " ".join(argv or [])).strip()
    folder = results_dir(args.out)

    def runs(lr: float, seeds: list[int], tag: str) -> list[dict]:
        records = []
        for seed in seeds:
            config = dataclasses.replace(demo_config(args, seed), learning_rate=lr)
            summary = demo(config, Path(args.runs) / f"{tag}-seed{seed}", progress=not args.quiet, command=command)
            print_demo_summary(summary)
            batch_accuracy = summary["curve"]["rewards/accuracy_reward/mean"]
            records.append({
                **{key: summary[key] for key in (
                    "seed", "accuracy_before", "accuracy_after", "rise_points", "greedy_accuracy_before",
                    "greedy_accuracy_after", "carry_rate_before", "carry_rate_after", "seconds", "seconds_detail",
                    "seconds_per_grpo_step", "threads", "greedy_change", "greedy_change_95ci", "mcnemar",
                    "pass_at_k")},
                # right answers in the training batches, first and last 10 GRPO steps: the run sampled and
                # scored (and, with a learning rate, learned) on its way
                "train_accuracy_first10": sum(batch_accuracy[:10]) / len(batch_accuracy[:10]),
                "train_accuracy_last10": sum(batch_accuracy[-10:]) / len(batch_accuracy[-10:]),
            })
            if lr != 0:
                plot_path = folder / f"demo_seed{seed}.png"
                import shutil

                shutil.copyfile(Path(args.runs) / f"{tag}-seed{seed}" / "demo.png", plot_path)
        return records

    config = dataclasses.asdict(demo_config(args, 0)) | {"seed": None}
    common = {"command": command, "accuracy_metric": _metric_text(args)}
    seeds = runs(args.lr, args.seeds, "grpo")
    passed = all(r["rise_points"] >= args.min_rise and r["seconds"] < args.max_seconds for r in seeds)
    record = {"benchmark": "demo", **common, "config": config, "min_rise_points": args.min_rise,
              "max_seconds": args.max_seconds, "runs": seeds, "all_passed": passed, "provenance": provenance()}
    path = write_json(folder / "demo_seeds.json", record)
    print(f"{'PASS' if passed else 'FAIL'}: every seed +{args.min_rise:g} points in < {args.max_seconds:g} s; "
          f"wrote {path}")
    ablation_seeds = args.seeds if args.ablation_seeds is None else args.ablation_seeds
    if ablation_seeds:
        ablation = runs(0.0, ablation_seeds, "lr0")
        record = {"benchmark": "demo ablation: learning rate 0 (GRPO runs, the policy never changes)", **common,
                  "config": config | {"learning_rate": 0.0},
                  "note": ("every step samples, scores and computes the loss and gradients, but AdamW with "
                           "learning rate 0 leaves the weights as the warm-up left them; evaluation samples "
                           "with a fixed seed, so an unchanged policy scores exactly the same"),
                  "runs": ablation, "max_abs_change_points": max(abs(r["rise_points"]) for r in ablation),
                  "provenance": provenance()}
        path = write_json(folder / "demo_ablation_lr0.json", record)
        print(f"ablation (lr 0): largest change {record['max_abs_change_points']:.1f} points; wrote {path}")
    return 0 if passed else 1


def _metric_text(args) -> str:
    return (f"held-out pass@1: right answers among {NanoConfig.eval_samples} completions sampled at temperature "
            f"{NanoConfig.temperature} for each of {args.eval_problems} held-out problems")
