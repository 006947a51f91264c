"""``python -m bench tools-demo``: SmolLM2-135M-Instruct learns to use a calculator on a CPU (notebook 08).

GRPO's recipe is a preset, by default ``cpu-tools`` (notebook 08's CPU mode), and GRPO runs through
:func:`labkit.run.build_run`, the road ``python -m labkit train --preset cpu-tools`` takes. Two arms, each from
the same fresh model and LoRA initialisation, on the same held-out word problems (:class:`labkit.tasks.WordProblems`,
the fixed pool of the preset's task; ``cpu-tools``: ``word-problems-large``, three-digit sums and two-digit
products, the arithmetic a calculator is for):

- **tool**: evaluated greedily with the tool (:func:`labkit.tools.tool_rollouts`): the untrained model with the
  tool in its prompt; after a short supervised warm-up on tool-use demonstrations (:func:`labkit.tools.warm_up`,
  not part of a preset); after GRPO with the preset (TRL's ``environment_factory`` with the calculator); and the
  same GRPO run at learning rate 0 (the control: the same warm-up, rollouts and steps, no update);
- **no_tool**: the same run without the tool: the preset with ``environment=None``, no schema in the prompt,
  warm-up demonstrations that state the same answer without a call, ``right_answer_reward`` alone.

Each stage reports the share of replies that call the tool, the share with a well-formed call, and the
right-answer rate; GRPO's change and the tool's advantage are tested with McNemar's exact paired test.
Writes ``results/tools_demo.json``.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import results_dir, write_json
from labkit.lab import provenance

__all__ = ["main", "run"]


ARMS = ("tool", "no_tool")


def _arm(use_tool: bool, recipe, *, task, held_out, warm_up_steps, warm_up_batch, warm_up_lr, control, control_steps,
         progress, dashboard) -> dict:
    """Return one arm's figures: a fresh model, the untrained evaluation, the warm-up, GRPO through
    :func:`labkit.run.build_run` with ``recipe`` (without its environment in the no-tool arm), (the control)."""
    from datasets import Dataset

    from labkit.lab import seed_everything
    from labkit.presets import resolve_plan
    from labkit.run import build_run, task_dataset
    from labkit.environments import NO_TOOL_SYSTEM_PROMPT, TOOL_SYSTEM_PROMPT, prepare_tool_tokenizer, tool_prompt
    from labkit.tools import tool_rollouts, tool_scores, warm_up
    from labkit.training import LogRecorder

    seed = recipe.config["seed"]
    if not use_tool:  # the same recipe without the tool: no environment, no schema in the prompt, the same reward
        recipe = recipe.replace(environment=None, max_tool_calling_iterations=None)
    started, cpu_started = time.perf_counter(), time.process_time()
    seed_everything(seed)  # the same LoRA initialisation in both arms
    model, tokenizer = resolve_plan(recipe).load_policy()  # a CPU preset's plan: fp32
    prepare_tool_tokenizer(tokenizer)
    system = TOOL_SYSTEM_PROMPT if use_tool else NO_TOOL_SYSTEM_PROMPT
    held = Dataset.from_dict({"prompt": [tool_prompt(q, system) for q, _ in held_out],
                              "answer": [a for _, a in held_out]})
    rounds = recipe.config.get("max_tool_calling_iterations") or 0
    seconds, stages, examples = {}, {}, {}

    def evaluate(name):
        t = time.perf_counter()
        records = tool_rollouts(model, tokenizer, held, max_new_tokens=48, use_tool=use_tool,
                                max_tool_calling_iterations=rounds)
        seconds[f"eval_{name}"] = time.perf_counter() - t
        stages[name] = tool_scores(records)
        examples[name] = [{"question": r["question"], "gold": r["gold"], "messages": r["messages"]} for r in records]
        if progress:
            print("tool" if use_tool else "no tool", name,
                  {k: v for k, v in stages[name].items() if not isinstance(v, list)}, flush=True)

    evaluate("untrained")
    t = time.perf_counter()
    demos = task.problems(64, seed=seed + 1000)  # training problems, never the held-out pool nor GRPO's prompts
    warm_losses = warm_up(model, tokenizer, demos, steps=warm_up_steps, batch_size=warm_up_batch,
                          learning_rate=warm_up_lr, seed=seed, system_prompt=system, tool=use_tool)
    seconds["warm_up"] = time.perf_counter() - t
    evaluate("before_grpo")
    warm_state = {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}
    train = None
    if not use_tool:  # the tool arm's prompts come from build_run (the preset's task with the tool prompt)
        rows = task_dataset(recipe.task, "train", seed=seed, limit=recipe.train_limit)
        train = Dataset.from_dict({"prompt": [tool_prompt(p[-1]["content"], system) for p in rows["prompt"]],
                                   "answer": rows["answer"]})
    logs = {}
    keys = ("reward", "reward_std", "rewards/right_answer_reward/mean", "completions/mean_length", "loss")
    if use_tool:
        keys += ("rewards/CalculatorEnv/mean", "tools/call_frequency", "tools/failure_frequency")
    runs = [("after_grpo", recipe)]
    if control:
        runs.append(("control_lr0", recipe.replace(learning_rate=0.0, max_steps=control_steps)))
    for name, grpo_recipe in runs:
        model.load_state_dict(warm_state, strict=False)
        recorder = LogRecorder(keys)
        with tempfile.TemporaryDirectory(prefix="labkit-tools-") as folder:
            run = build_run(grpo_recipe, folder, model=model, tokenizer=tokenizer, train_dataset=train,
                            callbacks=[recorder] + ([dashboard] if dashboard is not None else []),
                            print_logs=False, disable_tqdm=not progress)
            t = time.perf_counter()
            run.trainer.train()
            seconds[f"train_{name}"] = time.perf_counter() - t
        model.eval()
        logs[name] = {k: v for k, v in recorder.values.items()}
        evaluate(name)
    before = stages["before_grpo"]["right"]
    comparisons = {}
    for name in [n for n in ("after_grpo", "control_lr0") if n in stages]:
        comparisons[name] = _paired(before, stages[name]["right"])
    return {"system_prompt": system, "stages": stages, "grpo_vs_before": comparisons, "warm_up_losses": warm_losses,
            "train_logs": logs, "examples": {k: v[:6] for k, v in examples.items()},
            "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
            "seconds_detail": seconds,
            "seconds_warm_up_and_grpo": seconds["warm_up"] + seconds["train_after_grpo"]}


def _paired(before, after) -> dict:
    """Return the paired change from verdicts ``before`` to ``after``: points, McNemar's test, Newcombe's interval."""
    from labkit.evaluate import paired_change

    paired = paired_change(before, after)
    return {"right_answer_change_points": paired.points, "mcnemar_p": paired.p_value, "gained": paired.gained,
            "lost": paired.lost, "change_ci95_paired": [paired.low, paired.high]}


def run(*, recipe="cpu-tools", arms=ARMS, warm_up_steps: int = 8, warm_up_batch: int = 4, warm_up_lr: float = 1e-3,
        eval_problems: int = 64, control: bool = True, control_steps: int = 1, threads: int = 1,
        progress: bool = False, dashboard=None) -> dict:
    """Return the summary of the tool experiment (see the module docstring); nothing is written.

    ``recipe``: GRPO's recipe, a preset or its name (default ``cpu-tools``, notebook 08's CPU mode), checked by
    :func:`labkit.validation.validate` before any model loads; its ``task`` picks the word problems' numbers and
    its ``seed`` the run's. The warm-up is not part of a preset: ``warm_up_*``.
    """
    from labkit.evaluate import wilson_interval
    from labkit.presets import get_preset
    from labkit.tasks import NUMBER_RANGES, WORD_PROBLEM_TASKS, WordProblems
    from labkit.validation import validate

    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ValueError(f"arms must be some of {ARMS}, not {list(arms)}")
    recipe = get_preset(recipe)
    if not recipe.environment:
        raise ValueError(f"the recipe {recipe.name!r} has no tool environment: bench tools-demo compares a tool "
                         "recipe (cpu-tools) with the same recipe without its tool")
    numbers = WORD_PROBLEM_TASKS.get(recipe.task)
    if numbers is None:
        raise ValueError(f"the recipe's task must be word-problems-large or word-problems (the experiment scores "
                         f"their held-out pool), not {recipe.task!r}")
    validate(recipe, None)  # a bad field stops here, before a model loads
    c = recipe.config
    torch.set_num_threads(threads)
    started, cpu_started, load_start = time.perf_counter(), time.process_time(), list(os.getloadavg())
    task = WordProblems(numbers=numbers)
    held_out = task.problems(eval_problems, split="test")
    settings = dict(task=task, held_out=held_out, warm_up_steps=warm_up_steps, warm_up_batch=warm_up_batch,
                    warm_up_lr=warm_up_lr, control_steps=control_steps, progress=progress, dashboard=dashboard)
    results = {arm: _arm(arm == "tool", recipe, control=control and arm == "tool", **settings) for arm in arms}
    n = len(held_out)
    for arm in results.values():
        arm["right_answer_ci95"] = {k: list(wilson_interval(sum(s["right"]), n)) for k, s in arm["stages"].items()}
    tool_vs_no_tool = {}
    if len(results) == 2:
        for stage in ("untrained", "before_grpo", "after_grpo"):
            tool_vs_no_tool[stage] = _paired(results["no_tool"]["stages"][stage]["right"],
                                             results["tool"]["stages"][stage]["right"])
    return {
        "what": "SmolLM2-135M-Instruct learns to use a calculator tool (TRL 1.16 environment_factory) on one-step "
                f"word problems ({numbers} numbers), against the same run without the tool; held-out figures, greedy",
        "metrics": {"tool_call": "share of replies that write a <tool_call>",
                    "well_formed": "share with at least one call that parsed and ran without an error",
                    "right_answer": "share whose stated final answer is the gold number (right_answer_reward on the "
                                    "assistant's text; tool turns excluded)"},
        "numbers": numbers, "number_ranges": NUMBER_RANGES[numbers],
        "held_out_problems": n, "arms": results,
        "tool_vs_no_tool": tool_vs_no_tool,
        "tool_vs_no_tool_note": "paired on the same held-out problems: the tool arm's verdict against the no-tool arm's, "
                                "stage by stage (change in points = tool minus no tool; McNemar's exact test)",
        "control_note": "the control is the tool arm's pipeline (the same warm-up, GRPO rollouts and optimiser) at "
                        "learning rate 0 for control_steps steps: LoRA's weights do not move and greedy decoding is "
                        "deterministic, so it shows the pipeline changes nothing by itself; it is not a noise estimate "
                        "(McNemar's test is)",
        "recipe": {"preset": recipe.name, "seed": c["seed"], "warm_up_steps": warm_up_steps,
                   "warm_up_batch": warm_up_batch, "warm_up_lr": warm_up_lr, "grpo_steps": c["max_steps"],
                   "learning_rate": c["learning_rate"], "prompts_per_step": int(recipe.prompts_per_step),
                   "num_generations": c["num_generations"], "max_completion_length": c["max_completion_length"],
                   "max_tool_calling_iterations": c.get("max_tool_calling_iterations"), "lora_rank": recipe.lora_rank,
                   "micro_batch": c["per_device_train_batch_size"], "temperature": c["temperature"],
                   "control_steps": control_steps if control else None,
                   "rewards": {"tool": ["right_answer_reward", "CalculatorEnv.get_reward"],
                               "no_tool": ["right_answer_reward"]}},
        "preset": recipe.to_dict(),
        "road": "GRPO through labkit.run.build_run with the preset (python -m labkit train --preset cpu-tools takes "
                "the same road); the no-tool arm with environment=None and the no-tool prompt",
        "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
        "threads": torch.get_num_threads(),
        "load_average_start": load_start, "load_average_end": list(os.getloadavg()),
        "provenance": provenance(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench tools-demo", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="cpu-tools", help="GRPO's recipe, a tool preset (default: cpu-tools)")
    parser.add_argument("--set", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                        help="change preset fields, in GRPOConfig's names: --set max_steps=6 learning_rate=3e-4 "
                             "task=word-problems (small numbers) seed=1")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, some of {ARMS}")
    parser.add_argument("--warm-up-steps", type=int, default=8)
    parser.add_argument("--warm-up-batch", type=int, default=4, help="demonstrations per warm-up step")
    parser.add_argument("--warm-up-lr", type=float, default=1e-3)
    parser.add_argument("--eval-problems", type=int, default=64)
    parser.add_argument("--no-control", action="store_true")
    parser.add_argument("--control-steps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="default: results/tools_demo.json")
    args = parser.parse_args(argv)
    from labkit.options import UsageError, parse_pairs
    from labkit.presets import PresetError, get_preset

    try:
        recipe = get_preset(args.preset, **parse_pairs("--set", args.set))
        summary = run(recipe=recipe, arms=tuple(a for a in args.arms.split(",") if a),
                      warm_up_steps=args.warm_up_steps, warm_up_batch=args.warm_up_batch, warm_up_lr=args.warm_up_lr,
                      eval_problems=args.eval_problems, control=not args.no_control, control_steps=args.control_steps,
                      threads=args.threads, progress=True)
    except (PresetError, UsageError, ValueError) as error:
        print(f"bench tools-demo: {error}")
        return 2
    summary["command"] = "python -m bench tools-demo " + " ".join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out) if args.out else results_dir() / "tools_demo.json"
    write_json(out, summary)
    for arm, figures in summary["arms"].items():
        for name, s in figures["stages"].items():
            print(f"{arm:8s} {name:12s} tool call {s['tool_call']:.1%}  well formed {s['well_formed']:.1%}  "
                  f"right {s['right_answer']:.1%}")
        for name, c in figures["grpo_vs_before"].items():
            print(f"{arm:8s} {name}: {c['right_answer_change_points']:+.1f} points, McNemar p = {c['mcnemar_p']:.3g}")
        print(f"{arm:8s} {figures['seconds']:.0f} s (warm-up + GRPO {figures['seconds_warm_up_and_grpo']:.0f} s)")
    for stage, c in summary["tool_vs_no_tool"].items():
        print(f"tool - no tool, {stage}: {c['right_answer_change_points']:+.1f} points, McNemar p = {c['mcnemar_p']:.3g}")
    print(f"{summary['seconds']:.0f} s on {summary['threads']} thread(s) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
