"""``python -m labkit bench tools-demo``: SmolLM2-135M-Instruct learns to use a calculator on a CPU (notebook 08).

The stages, on the same held-out word problems (:class:`labkit.tasks.WordProblems`, the fixed pool), each
evaluated greedily with the tool (:func:`labkit.tools.tool_rollouts`): the untrained model with the tool in
its prompt; after a short supervised warm-up on tool-use demonstrations (:func:`labkit.tools.warm_up`);
after GRPO with the calculator environment (TRL's ``environment_factory``); and the same GRPO run at
learning rate 0 (the control: the same warm-up, rollouts and steps, no update). Each stage reports the share
of replies that call the tool, the share with a well-formed call, and the right-answer rate; GRPO's change is
tested with McNemar's exact paired test. The run without the tool is notebook 04's recipe, recorded in
``results/smollm2_demo.json``. Writes ``results/tools_demo.json``.
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


def run(*, seed: int = 0, warm_up_steps: int = 3, warm_up_lr: float = 1e-3, steps: int = 6,
        learning_rate: float = 1e-3, eval_problems: int = 64, prompts_per_step: int = 2, num_generations: int = 8,
        max_completion_length: int = 96, control: bool = True, control_steps: int = 1, micro_batch: int = 4,
        temperature: float = 1.0,
        threads: int = 1, progress: bool = False, dashboard=None) -> dict:
    """Return the summary of the tool experiment (see the module docstring); nothing is written."""
    from datasets import Dataset

    from labkit.evaluate import mcnemar_test, paired_bootstrap, wilson_interval
    from labkit.lab import seed_everything
    from labkit.models import load_policy
    from labkit.presets import get_preset
    from labkit.tasks import WordProblems
    from labkit.tools import prepare_tool_tokenizer, tool_prompt, tool_rollouts, tool_scores, tool_trainer, warm_up
    from labkit.training import LogRecorder

    torch.set_num_threads(threads)
    preset = get_preset("cpu-smollm2")
    started, cpu_started, load_start = time.perf_counter(), time.process_time(), list(os.getloadavg())
    seed_everything(seed)
    model, tokenizer = load_policy(preset.model, "lora", precision="fp32", lora_rank=preset.lora_rank,
                                   lora_alpha=preset.lora_alpha, target_modules=list(preset.target_modules),
                                   gradient_checkpointing=False)
    prepare_tool_tokenizer(tokenizer)
    task = WordProblems()
    held_out = task.problems(eval_problems, split="test")
    held = Dataset.from_dict({"prompt": [tool_prompt(q) for q, _ in held_out], "answer": [a for _, a in held_out]})
    seconds, stages, examples = {}, {}, {}

    def evaluate(name):
        t = time.perf_counter()
        records = tool_rollouts(model, tokenizer, held, max_new_tokens=48)
        seconds[f"eval_{name}"] = time.perf_counter() - t
        stages[name] = tool_scores(records)
        examples[name] = [{"question": r["question"], "gold": r["gold"], "messages": r["messages"]} for r in records]
        if progress:
            print(name, {k: v for k, v in stages[name].items() if not isinstance(v, list)}, flush=True)

    evaluate("untrained")
    t = time.perf_counter()
    demos = task.problems(64, seed=seed + 1000)  # training problems, never the held-out pool
    warm_losses = warm_up(model, tokenizer, demos, steps=warm_up_steps, learning_rate=warm_up_lr, seed=seed)
    seconds["warm_up"] = time.perf_counter() - t
    evaluate("before_grpo")
    warm_state = {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}
    train = Dataset.from_dict({"prompt": [tool_prompt(q) for q, _ in task.problems(64, seed=seed)],
                               "answer": [a for _, a in task.problems(64, seed=seed)]})
    logs = {}
    for name, lr, n_steps in [("after_grpo", learning_rate, steps)] + ([("control_lr0", 0.0, control_steps)]
                                                                        if control else []):
        model.load_state_dict(warm_state, strict=False)
        recorder = LogRecorder(("reward", "reward_std", "rewards/right_answer_reward/mean",
                                "rewards/CalculatorEnv/mean", "tools/call_frequency", "tools/failure_frequency",
                                "completions/mean_length", "loss"))
        with tempfile.TemporaryDirectory(prefix="labkit-tools-") as folder:
            trainer = tool_trainer(model, tokenizer, train, folder, max_steps=n_steps, learning_rate=lr, seed=seed,
                                   micro_batch=micro_batch, temperature=temperature,
                                   num_generations=num_generations, prompts_per_step=prompts_per_step,
                                   max_completion_length=max_completion_length,
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
        after = stages[name]["right"]
        test = mcnemar_test(before, after)
        low, high = paired_bootstrap(before, after)[1:]
        comparisons[name] = {"right_answer_change_points": 100 * (sum(after) - sum(before)) / len(before),
                             "mcnemar_p": test.p_value, "gained": test.gained, "lost": test.lost,
                             "change_ci95_paired_bootstrap": [low, high]}
    n = len(held_out)
    return {
        "what": "SmolLM2-135M-Instruct learns to use a calculator tool (TRL 1.16 environment_factory) on one-step "
                "word problems; held-out figures, greedy, with the tool",
        "metrics": {"tool_call": "share of replies that write a <tool_call>",
                    "well_formed": "share with at least one call that parsed and ran without an error",
                    "right_answer": "share whose stated final answer is the gold number (right_answer_reward on the "
                                    "assistant's text; tool turns excluded)"},
        "held_out_problems": n, "stages": {k: {m: v for m, v in s.items()} for k, s in stages.items()},
        "right_answer_ci95": {k: list(wilson_interval(sum(s["right"]), n)) for k, s in stages.items()},
        "grpo_vs_before": comparisons,
        "control_note": "the control is the same pipeline (the same warm-up, GRPO rollouts and optimiser) at learning "
                        "rate 0 for control_steps steps: LoRA's weights do not move and greedy decoding is "
                        "deterministic, so it shows the pipeline changes nothing by itself; it is not a noise estimate "
                        "(McNemar's test is)",
        "without_tool": "notebook 04's recipe without the tool: results/smollm2_demo.json (16 steps of 4 prompts x 8)",
        "recipe": {"seed": seed, "warm_up_steps": warm_up_steps, "warm_up_batch": 4, "warm_up_lr": warm_up_lr,
                   "grpo_steps": steps, "learning_rate": learning_rate, "prompts_per_step": prompts_per_step,
                   "num_generations": num_generations, "max_completion_length": max_completion_length,
                   "max_tool_calling_iterations": 2, "lora_rank": preset.lora_rank, "micro_batch": micro_batch, "temperature": temperature,
                   "control_steps": control_steps if control else None,
                   "rewards": ["right_answer_reward", "CalculatorEnv.get_reward"]},
        "warm_up_losses": warm_losses, "train_logs": logs, "examples": {k: v[:6] for k, v in examples.items()},
        "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
        "seconds_detail": seconds, "threads": torch.get_num_threads(),
        "load_average_start": load_start, "load_average_end": list(os.getloadavg()),
        "provenance": provenance(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit bench tools-demo", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm-up-steps", type=int, default=3)
    parser.add_argument("--warm-up-lr", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-problems", type=int, default=64)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--no-control", action="store_true")
    parser.add_argument("--control-steps", type=int, default=1)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of GRPO's rollouts")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="default: results/tools_demo.json")
    args = parser.parse_args(argv)
    summary = run(seed=args.seed, warm_up_steps=args.warm_up_steps, warm_up_lr=args.warm_up_lr, steps=args.steps,
                  learning_rate=args.lr, eval_problems=args.eval_problems, prompts_per_step=args.prompts_per_step,
                  control=not args.no_control, control_steps=args.control_steps, micro_batch=args.micro_batch,
                  temperature=args.temperature,
                  threads=args.threads, progress=True)
    summary["command"] = "python -m labkit bench tools-demo " + " ".join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out) if args.out else results_dir() / "tools_demo.json"
    write_json(out, summary)
    for name, s in summary["stages"].items():
        print(f"{name:12s} tool call {s['tool_call']:.1%}  well formed {s['well_formed']:.1%}  "
              f"right {s['right_answer']:.1%}")
    for name, c in summary["grpo_vs_before"].items():
        print(f"{name}: {c['right_answer_change_points']:+.1f} points, McNemar p = {c['mcnemar_p']:.3g}")
    print(f"{summary['seconds']:.0f} s on {summary['threads']} thread(s) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
