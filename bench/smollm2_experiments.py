"""``python -m bench smollm2-experiments``: one recipe trial of the real-model CPU experiment, recorded.

Each call trains SmolLM2-135M-Instruct with TRL's ``GRPOTrainer`` (through
:func:`labkit.demo.real_model_demo`, the ``cpu-smollm2`` preset with the given changes) for each
``--seeds`` and appends one record per seed to ``results/smollm2_experiments.json``: the settings,
the held-out right-answer rate before and after with the McNemar p, wall and CPU seconds and the
load average (the machine is shared: wall seconds depend on it, CPU seconds much less). Every trial
of the recipe search is recorded this way, kept or not, so the choice of the recipe can be read back.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import time

from bench import results_dir, write_json
from labkit.demo import real_model_demo
from labkit.lab import provenance
from labkit.tasks import SYSTEM_PROMPTS

__all__ = ["main", "append_experiment", "prompts_per_step"]


def prompts_per_step(preset: dict) -> int:
    """Prompts in one optimiser step of a recorded preset: its completions a step (micro-batch x accumulation, or
    steps_per_generation) over num_generations."""
    # a preset as recorded: its GRPOConfig arguments in "config", or (before) at the top and in "trl_options"
    preset = {**preset, **(preset.get("trl_options") or {}), **(preset.get("config") or {})}
    steps = preset.get("steps_per_generation") or preset.get("gradient_accumulation_steps", 1)
    return preset["per_device_train_batch_size"] * steps // preset["num_generations"]


def append_experiment(path, record: dict) -> None:
    """Append ``record`` to the JSON list at ``path`` under a file lock (trials may run side by side)."""
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        records = json.loads(path.read_text()) if path.exists() else []
        records.append(record)
        write_json(path, records)


def main(argv: list[str] | None = None) -> int:
    """Run one trial (each seed) and append its records; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m bench smollm2-experiments", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default=None, help="the trial's name in the results (required to run one)")
    parser.add_argument("--collect", default=None, metavar="JSON",
                        help="instead of training: append the runs a `bench smollm2-demo` recorded (its seeds and "
                             "control; named --name, default chosen-recipe), or one `labkit demo` run's summary.json, "
                             "as trials, so the search reads in one file")
    parser.add_argument("--note", default="", help="what the trial tests")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--lr", type=float, default=None, help="default: the preset's")
    parser.add_argument("--steps", type=int, default=None, help="default: the preset's")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (default: the preset's)")
    parser.add_argument("--generations", type=int, default=None, help="num_generations (default: the preset's)")
    parser.add_argument("--tokens", type=int, default=None, help="max_completion_length (default: the preset's)")
    parser.add_argument("--rewards", default=None, help="comma-separated reward names (default: the preset's)")
    parser.add_argument("--weights", default=None, help="comma-separated reward_weights")
    parser.add_argument("--prompt", choices=sorted(SYSTEM_PROMPTS), default=None,
                        help="the system prompt (default: the task's)")
    parser.add_argument("--lora-dropout", type=float, default=None, help="LoRA's dropout (default: the preset's)")
    parser.add_argument("--trl", nargs="*", default=[], help="GRPOConfig fields KEY=VALUE (scale_rewards=none)")
    parser.add_argument("--eval-problems", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="results folder (default results/)")
    parser.add_argument("--runs", default="runs/bench-smollm2-experiments")
    args = parser.parse_args(argv)
    if args.collect:
        return _collect(args)
    if not args.name:
        parser.error("--name is required to run a trial")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    command = ("python -m bench smollm2-experiments " + " ".join(argv or [])).strip()
    overrides: dict = {}
    generations = args.generations
    if args.generations is not None:
        overrides["num_generations"] = args.generations
    if args.prompts is not None:  # prompts a step: the preset's micro-batches, as many as they take
        from labkit.presets import get_preset

        base = get_preset("cpu-smollm2")
        completions = args.prompts * (generations or base.config["num_generations"])
        micro = base.config["per_device_train_batch_size"]
        if completions % micro:
            parser.error(f"--prompts x num_generations = {completions} completions, not a multiple of the preset's "
                         f"micro-batch of {micro}")
        overrides["gradient_accumulation_steps"] = completions // micro
    if args.tokens is not None:
        overrides["max_completion_length"] = args.tokens
    if args.rewards:
        overrides["rewards"] = tuple(args.rewards.split(","))
    if args.lora_dropout is not None:
        overrides["lora_dropout"] = args.lora_dropout
    if args.weights:
        overrides["reward_weights"] = tuple(float(w) for w in args.weights.split(","))
    trl = {}
    for item in args.trl:
        key, _, value = item.partition("=")
        trl[key] = json.loads(value) if value[:1].isdigit() or value in ("true", "false") else value
    overrides.update(trl)
    system_prompt = SYSTEM_PROMPTS[args.prompt] if args.prompt else None
    path = results_dir(args.out) / "smollm2_experiments.json"
    evaluations: dict = {}
    for seed in args.seeds:
        summary = real_model_demo("smollm2-135m", f"{args.runs}/{args.name}-seed{seed}", seed=seed,
                                  learning_rate=args.lr, steps=args.steps, eval_problems=args.eval_problems,
                                  threads=args.threads, progress=False, before=evaluations.get("before"), system_prompt=system_prompt,
                                  preset_overrides=overrides, command=command, evaluations=evaluations)
        preset = {**summary["preset"], **summary["preset"]["config"]}  # its fields and GRPOConfig arguments
        record = {
            "name": args.name, "note": args.note, "seed": seed, "command": command,
            "settings": {k: preset[k] for k in ("learning_rate", "max_steps", "per_device_train_batch_size",
                                                "gradient_accumulation_steps", "num_generations",
                                                "max_completion_length", "rewards",
                                                "reward_weights", "temperature", "beta", "config")}
                        | {"lora_dropout": preset["lora_dropout"],
                           "prompts_per_step": prompts_per_step(preset),
                           "system_prompt": summary["system_prompt"], "held_out_problems": args.eval_problems},
            **{k: summary[k] for k in ("right_number_before", "right_number_after", "rise_points", "mcnemar_p",
                                       "gained", "lost", "short_answer_before", "short_answer_after",
                                       "last_number_before", "last_number_after", "mean_words_before",
                                       "mean_words_after", "seconds", "cpu_seconds", "seconds_detail",
                                       "load_average_start", "load_average_end", "threads", "reward_per_step",
                                       "reward_std_per_step", "mean_length_per_step", "examples")},
            "before_reused": seed != args.seeds[0],
            "machine": "shared 2-core machine, busy (other jobs running): wall seconds are not idle figures",
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "provenance": provenance(),
        }
        append_experiment(path, record)
        print(f"{args.name} seed {seed}: right answers {summary['right_number_before']:.1%} -> "
              f"{summary['right_number_after']:.1%} ({summary['rise_points']:+.1f} points, p = "
              f"{summary['mcnemar_p']:.2g}) in {summary['seconds']:.0f} s wall, {summary['cpu_seconds']:.0f} s CPU, "
              f"load {summary['load_average_end'][0]:.1f}", flush=True)
    return 0


def _collect(args) -> int:
    demo = json.loads(open(args.collect).read())
    if "runs" not in demo:  # one `labkit demo` run's summary.json: one trial, named by --name
        demo = {"preset": demo["preset"], "runs": [demo], "control_lr0": [], "command": demo["command"],
                "system_prompt": demo.get("system_prompt"), "provenance": demo["provenance"]}
    path = results_dir(args.out) / "smollm2_experiments.json"
    preset = {**demo["preset"], **(demo["preset"].get("config") or demo["preset"].get("trl_options") or {})}
    settings = {k: preset.get(k) for k in ("learning_rate", "max_steps", "per_device_train_batch_size",
                                           "num_generations", "max_completion_length", "rewards", "reward_weights",
                                           "temperature", "beta", "config")}
    settings |= {"prompts_per_step": prompts_per_step(preset),
                 "system_prompt": demo.get("system_prompt"), "held_out_problems": len(demo["runs"][0]["right_before"])}
    name = args.name or "chosen-recipe"
    for tag, runs in ((name, demo["runs"]), (f"{name}-lr0-control", demo["control_lr0"])):
        for run in runs:
            record = {"name": tag, "note": f"recorded by `{demo['command']}` ({args.collect}), collected here",
                      "seed": run["seed"], "command": demo["command"],
                      "settings": settings | ({"learning_rate": 0.0} if tag.endswith("control") else {}),
                      **{k: run[k] for k in ("right_number_before", "right_number_after", "rise_points", "mcnemar_p",
                                             "gained", "lost", "short_answer_before", "short_answer_after",
                                             "last_number_before", "last_number_after", "mean_words_before",
                                             "mean_words_after", "seconds", "cpu_seconds", "seconds_detail",
                                             "load_average_start", "load_average_end", "threads", "reward_per_step",
                                             "reward_std_per_step", "mean_length_per_step", "examples")},
                      "machine": demo.get("machine", ""), "date": demo["provenance"]["date"],
                      "provenance": demo["provenance"]}
            append_experiment(path, record)
    print(f"appended {len(demo['runs']) + len(demo['control_lr0'])} runs of {args.collect} to {path}")
    return 0
