"""``python -m labkit bench tools-demo``: SmolLM2-135M-Instruct learns to use a calculator on a CPU (notebook 08).

Two arms, each from the same fresh model and LoRA initialisation, on the same held-out word problems
(:class:`labkit.tasks.WordProblems`, the fixed pool; by default ``numbers="large"``: three-digit sums and
two-digit products, the arithmetic a calculator is for):

- **tool**: evaluated greedily with the tool (:func:`labkit.tools.tool_rollouts`): the untrained model with the
  tool in its prompt; after a short supervised warm-up on tool-use demonstrations (:func:`labkit.tools.warm_up`);
  after GRPO with the calculator environment (TRL's ``environment_factory``); and the same GRPO run at learning
  rate 0 (the control: the same warm-up, rollouts and steps, no update);
- **no_tool**: the same run without the tool: no schema in the prompt, warm-up demonstrations that state the
  same answer without a call, the same GRPO steps with ``right_answer_reward`` alone.

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

from labkit.bench import results_dir, write_json
from labkit.lab import provenance

__all__ = ["main", "run"]


ARMS = ("tool", "no_tool")


def _arm(use_tool: bool, *, task, held_out, seed, warm_up_steps, warm_up_batch, warm_up_lr, steps, learning_rate,
         prompts_per_step, num_generations, max_completion_length, max_tool_calling_iterations, control,
         control_steps, micro_batch, temperature, progress, dashboard) -> dict:
    """Return one arm's figures: a fresh model, the untrained evaluation, the warm-up, GRPO, (the control)."""
    from datasets import Dataset

    from labkit.lab import seed_everything
    from labkit.models import load_policy
    from labkit.presets import get_preset
    from labkit.tools import (CalculatorEnv, NO_TOOL_SYSTEM_PROMPT, TOOL_SYSTEM_PROMPT, prepare_tool_tokenizer,
                              tool_prompt, tool_rollouts, tool_scores, tool_trainer, warm_up)
    from labkit.training import LogRecorder

    preset = get_preset("cpu-smollm2")
    started, cpu_started = time.perf_counter(), time.process_time()
    seed_everything(seed)  # the same LoRA initialisation in both arms
    model, tokenizer = load_policy(preset.model, "lora", precision="fp32", lora_rank=preset.lora_rank,
                                   lora_alpha=preset.lora_alpha, target_modules=list(preset.target_modules),
                                   gradient_checkpointing=False)
    prepare_tool_tokenizer(tokenizer)
    system = TOOL_SYSTEM_PROMPT if use_tool else NO_TOOL_SYSTEM_PROMPT
    held = Dataset.from_dict({"prompt": [tool_prompt(q, system) for q, _ in held_out],
                              "answer": [a for _, a in held_out]})
    seconds, stages, examples = {}, {}, {}

    def evaluate(name):
        t = time.perf_counter()
        records = tool_rollouts(model, tokenizer, held, max_new_tokens=48, use_tool=use_tool,
                                max_tool_calling_iterations=max_tool_calling_iterations)
        seconds[f"eval_{name}"] = time.perf_counter() - t
        stages[name] = tool_scores(records)
        examples[name] = [{"question": r["question"], "gold": r["gold"], "messages": r["messages"]} for r in records]
        if progress:
            print("tool" if use_tool else "no tool", name,
                  {k: v for k, v in stages[name].items() if not isinstance(v, list)}, flush=True)

    evaluate("untrained")
    t = time.perf_counter()
    demos = task.problems(64, seed=seed + 1000)  # training problems, never the held-out pool
    warm_losses = warm_up(model, tokenizer, demos, steps=warm_up_steps, batch_size=warm_up_batch,
                          learning_rate=warm_up_lr, seed=seed,
                          system_prompt=system, tool=use_tool)
    seconds["warm_up"] = time.perf_counter() - t
    evaluate("before_grpo")
    warm_state = {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}
    pairs = task.problems(64, seed=seed)
    train = Dataset.from_dict({"prompt": [tool_prompt(q, system) for q, _ in pairs], "answer": [a for _, a in pairs]})
    logs = {}
    keys = ("reward", "reward_std", "rewards/right_answer_reward/mean", "completions/mean_length", "loss")
    if use_tool:
        keys += ("rewards/CalculatorEnv/mean", "tools/call_frequency", "tools/failure_frequency")
    for name, lr, n_steps in [("after_grpo", learning_rate, steps)] + ([("control_lr0", 0.0, control_steps)]
                                                                        if control else []):
        model.load_state_dict(warm_state, strict=False)
        recorder = LogRecorder(keys)
        with tempfile.TemporaryDirectory(prefix="labkit-tools-") as folder:
            trainer = tool_trainer(model, tokenizer, train, folder, max_steps=n_steps, learning_rate=lr, seed=seed,
                                   env_factory=CalculatorEnv if use_tool else None,
                                   micro_batch=micro_batch, temperature=temperature,
                                   num_generations=num_generations, prompts_per_step=prompts_per_step,
                                   max_completion_length=max_completion_length,
                                   max_tool_calling_iterations=max_tool_calling_iterations,
                                   callbacks=[recorder] + ([dashboard] if dashboard is not None else []),
                                   disable_tqdm=not progress)
            t = time.perf_counter()
            trainer.train()
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
    """Return the paired change from verdicts ``before`` to ``after``: points, McNemar's test, the bootstrap interval."""
    from labkit.evaluate import paired_change

    paired = paired_change(before, after)
    return {"right_answer_change_points": paired.points, "mcnemar_p": paired.p_value, "gained": paired.gained,
            "lost": paired.lost, "change_ci95_paired_bootstrap": [paired.low, paired.high]}


def run(*, seed: int = 0, numbers: str = "large", arms=ARMS, warm_up_steps: int = 8, warm_up_batch: int = 4,
        warm_up_lr: float = 1e-3,
        steps: int = 6, learning_rate: float = 3e-4, eval_problems: int = 64, prompts_per_step: int = 2,
        num_generations: int = 8, max_completion_length: int = 96, max_tool_calling_iterations: int = 2,
        control: bool = True, control_steps: int = 1,
        micro_batch: int = 4, temperature: float = 1.0, threads: int = 1, progress: bool = False,
        dashboard=None) -> dict:
    """Return the summary of the tool experiment (see the module docstring); nothing is written."""
    from labkit.evaluate import wilson_interval
    from labkit.presets import get_preset
    from labkit.tasks import NUMBER_RANGES, WordProblems

    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ValueError(f"arms must be some of {ARMS}, not {list(arms)}")
    torch.set_num_threads(threads)
    started, cpu_started, load_start = time.perf_counter(), time.process_time(), list(os.getloadavg())
    task = WordProblems(numbers=numbers)
    held_out = task.problems(eval_problems, split="test")
    settings = dict(task=task, held_out=held_out, seed=seed, warm_up_steps=warm_up_steps, warm_up_batch=warm_up_batch,
                    warm_up_lr=warm_up_lr,
                    steps=steps, learning_rate=learning_rate, prompts_per_step=prompts_per_step,
                    num_generations=num_generations, max_completion_length=max_completion_length,
                    max_tool_calling_iterations=max_tool_calling_iterations, control_steps=control_steps,
                    micro_batch=micro_batch, temperature=temperature,
                    progress=progress, dashboard=dashboard)
    results = {arm: _arm(arm == "tool", control=control and arm == "tool", **settings) for arm in arms}
    n = len(held_out)
    for arm in results.values():
        arm["right_answer_ci95"] = {k: list(wilson_interval(sum(s["right"]), n)) for k, s in arm["stages"].items()}
    tool_vs_no_tool = {}
    if len(results) == 2:
        for stage in ("untrained", "before_grpo", "after_grpo"):
            tool_vs_no_tool[stage] = _paired(results["no_tool"]["stages"][stage]["right"],
                                             results["tool"]["stages"][stage]["right"])
    preset = get_preset("cpu-smollm2")
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
        "recipe": {"seed": seed, "warm_up_steps": warm_up_steps, "warm_up_batch": warm_up_batch,
                   "warm_up_lr": warm_up_lr,
                   "grpo_steps": steps, "learning_rate": learning_rate, "prompts_per_step": prompts_per_step,
                   "num_generations": num_generations, "max_completion_length": max_completion_length,
                   "max_tool_calling_iterations": max_tool_calling_iterations, "lora_rank": preset.lora_rank,
                   "micro_batch": micro_batch,
                   "temperature": temperature, "control_steps": control_steps if control else None,
                   "rewards": {"tool": ["right_answer_reward", "CalculatorEnv.get_reward"],
                               "no_tool": ["right_answer_reward"]}},
        "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
        "threads": torch.get_num_threads(),
        "load_average_start": load_start, "load_average_end": list(os.getloadavg()),
        "provenance": provenance(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit bench tools-demo", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--numbers", choices=("small", "large"), default="large",
                        help="the word problems' numbers (labkit.tasks.NUMBER_RANGES); default: large")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, some of {ARMS}")
    parser.add_argument("--warm-up-steps", type=int, default=8)
    parser.add_argument("--warm-up-batch", type=int, default=4, help="demonstrations per warm-up step")
    parser.add_argument("--warm-up-lr", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--lr", type=float, default=3e-4, help="GRPO's learning rate (the warm-up's is --warm-up-lr)")
    parser.add_argument("--eval-problems", type=int, default=64)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--max-tool-calling-iterations", type=int, default=2,
                        help="tool rounds per completion (GRPOConfig.max_tool_calling_iterations), in GRPO and in "
                             "the evaluation")
    parser.add_argument("--no-control", action="store_true")
    parser.add_argument("--control-steps", type=int, default=1)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of GRPO's rollouts")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="default: results/tools_demo.json")
    args = parser.parse_args(argv)
    summary = run(seed=args.seed, numbers=args.numbers, arms=tuple(a for a in args.arms.split(",") if a),
                  warm_up_steps=args.warm_up_steps, warm_up_batch=args.warm_up_batch, warm_up_lr=args.warm_up_lr,
                  steps=args.steps,
                  learning_rate=args.lr, eval_problems=args.eval_problems, prompts_per_step=args.prompts_per_step,
                  max_tool_calling_iterations=args.max_tool_calling_iterations,
                  control=not args.no_control, control_steps=args.control_steps, micro_batch=args.micro_batch,
                  temperature=args.temperature,
                  threads=args.threads, progress=True)
    summary["command"] = "python -m labkit bench tools-demo " + " ".join(argv if argv is not None else sys.argv[1:])
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
