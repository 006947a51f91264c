"""The lab's main job, ``python -m labkit demo``: a model learns with GRPO on a laptop CPU, measured.

:func:`demo` runs the nano task of ``03_nano_grpo_cpu.ipynb`` end to end (warm-up from scratch,
held-out accuracy before, :func:`labkit.nano.nano_grpo`, accuracy after) and writes
``summary.json`` and ``demo.png``. :func:`real_model_demo` (``python -m labkit demo --model
smollm2-135m``, notebook 04's CPU mode) does the same for a real instruct model through TRL's
``GRPOTrainer``. ``python -m labkit bench demo`` and ``bench smollm2-demo`` repeat them over seeds
and with the learning rate at 0 (the control) into ``results/``.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

from labkit.lab import provenance, write_json
from labkit.nano import NanoConfig, plot_run, run_nano_grpo

__all__ = ["demo", "real_model_demo", "short_answer_scores", "plot_real_model_demo"]
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
        **_paired_statistics(result.before, result.after),
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
        "evals": [{k: v for k, v in e.items() if k not in _PER_PROBLEM} for e in result.evals],
        "per_problem": {when: {k: e[k] for k in _PER_PROBLEM} for when, e in (("before", result.before),
                                                                              ("after", result.after))},
        "curve": {name: result.curve(name) for name in ("reward", "rewards/accuracy_reward/mean", "carry_rate",
                                                        "loss", "step_time")},
        "command": command or "labkit.demo.demo()",
        "threads": torch.get_num_threads(),
        "provenance": provenance(),
    }
    write_json(out / "summary.json", summary)
    return summary


_PER_PROBLEM = ("right_per_problem", "greedy_right")


def _paired_statistics(before: dict, after: dict) -> dict:
    """Return the paired before/after statistics of two :func:`labkit.nano.evaluate_held_out` results.

    The same held-out problems are scored twice, so the comparison is paired: the exact McNemar test and a
    paired-bootstrap interval of the change in greedy accuracy (one verdict per problem), and pass@k for
    k = 1..samples before and after (Chen et al.'s unbiased estimator, averaged over problems).
    """
    from labkit.evaluate import mcnemar_test, paired_bootstrap, pass_at_k

    test = mcnemar_test(before["greedy_right"], after["greedy_right"])
    change, low, high = paired_bootstrap(before["greedy_right"], after["greedy_right"])
    n = before["samples"]
    curve = {when: [sum(pass_at_k(n, c, k) for c in e["right_per_problem"]) / len(e["right_per_problem"])
                    for k in range(1, n + 1)] for when, e in (("before", before), ("after", after))}
    return {
        "greedy_change": change, "greedy_change_95ci": [low, high],
        "mcnemar": {"gained": test.gained, "lost": test.lost, "p_value": test.p_value, "n": test.n},
        "pass_at_k": {"k": list(range(1, n + 1)), **curve},
    }


# --------------------------------------------------------------------------- a real instruct model on a CPU


def short_answer_scores(result) -> dict:
    """Return the held-out figures of an evaluation of :class:`labkit.tasks.WordProblems`.

    ``result`` is :func:`labkit.evaluate.gsm8k_accuracy`'s answer on the word problems (greedy).
    ``short_answer`` is the metric GRPO trains for (:func:`labkit.rewards.short_answer_reward`:
    1-10 words and a number); ``right_number`` (the last number equals the gold one) and
    ``mean_words`` are reported beside it, never trained for.
    """
    from labkit.rewards import short_answer_reward

    texts = [r["completion"] for r in result.records]
    n = len(texts)
    return {
        "short_answer": sum(short_answer_reward(texts)) / n,
        "right_number": result.lenient_accuracy,
        "mean_words": sum(len(t.split()) for t in texts) / n,
        "n": n,
    }


def real_model_demo(model: str = "smollm2-135m", out: str | os.PathLike = "runs/demo-smollm2", *, seed: int = 0,
                    learning_rate: float | None = None, steps: int | None = None, eval_problems: int = 48,
                    train_problems: int = 64, threads: int | None = 1, progress: bool = True, dashboard=None,
                    command: str | None = None) -> dict:
    """Return the summary of GRPO on a real instruct model on a CPU, after writing ``out/summary.json`` and a plot.

    The ``cpu-smollm2`` preset through the same calls notebook 04 makes on a GPU
    (:func:`labkit.models.load_policy` -> :func:`labkit.run.build_run` -> ``run.train()``), on
    :class:`labkit.tasks.WordProblems`: the model is asked to answer in at most 10 words, and the
    reward (:func:`labkit.rewards.short_answer_reward`) pays 1 for a reply of 1-10 words that
    states a number. Held-out: ``eval_problems`` problems never trained on, answered greedily
    before and after; the summary holds the share of short answers (``before``, ``after``), the
    share with the right number and the mean length beside it, a few completions before and
    after, the reward per step and the seconds. ``threads=1`` keeps a 2-core laptop responsive
    and the seconds comparable on a busy machine (``None``: torch's default).
    """
    import tempfile

    from labkit.evaluate import gsm8k_accuracy
    from labkit.lab import seed_everything
    from labkit.models import load_policy
    from labkit.presets import get_preset
    from labkit.run import build_run
    from labkit.tasks import WordProblems
    from labkit.training import LogRecorder

    overrides = {"model": model, "seed": seed}
    if learning_rate is not None:
        overrides["learning_rate"] = learning_rate
    if steps is not None:
        overrides["max_steps"] = steps
    preset = get_preset("cpu-smollm2", **overrides)
    if threads:
        torch.set_num_threads(threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started, cpu_started = time.perf_counter(), time.process_time()
    seed_everything(seed)
    policy, tokenizer = load_policy(preset.model, preset.method, precision="fp32", lora_rank=preset.lora_rank,
                                    lora_alpha=preset.lora_alpha, target_modules=list(preset.target_modules),
                                    gradient_checkpointing=preset.gradient_checkpointing)
    loaded_s = time.perf_counter() - started
    task = WordProblems()
    held_out = task.dataset(eval_problems, split="test")
    evaluation = dict(dataset=held_out, max_new_tokens=32, batch_size=preset.eval_batch_size, progress=progress)
    before = gsm8k_accuracy(policy, tokenizer, **evaluation)
    recorder = LogRecorder(("reward", "rewards/short_answer_reward/mean", "completions/mean_length", "loss"))
    callbacks = [recorder] + ([dashboard] if dashboard is not None else [])
    with tempfile.TemporaryDirectory(prefix="labkit-demo-") as run_dir:
        run = build_run(preset, run_dir, model=policy, tokenizer=tokenizer,
                        train_dataset=task.dataset(train_problems, seed=seed), callbacks=callbacks,
                        print_logs=False, disable_tqdm=not progress or dashboard is not None)
        train_started = time.perf_counter()
        run.train(resume=False)
        train_s = time.perf_counter() - train_started
    after = gsm8k_accuracy(policy, tokenizer, **evaluation)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    scores_before, scores_after = short_answer_scores(before), short_answer_scores(after)
    examples = [{"question": held_out[i]["prompt"][-1]["content"], "gold": held_out[i]["answer"],
                 "before": before.records[i]["completion"], "after": after.records[i]["completion"]}
                for i in range(min(4, eval_problems))]
    summary = {
        "metric": (f"short answers: the share of {eval_problems} held-out word problems (never trained on) whose "
                   "greedy reply has 1-10 words and states a number, as the system prompt asks; the behaviour "
                   "GRPO trains, not arithmetic (right_number is reported beside it, never trained for)"),
        "before": scores_before["short_answer"], "after": scores_after["short_answer"],
        "rise_points": 100 * (scores_after["short_answer"] - scores_before["short_answer"]),
        "right_number_before": scores_before["right_number"], "right_number_after": scores_after["right_number"],
        "mean_words_before": scores_before["mean_words"], "mean_words_after": scores_after["mean_words"],
        "seconds": seconds,
        # CPU time of this process (all its threads): what the run costs, whatever else the machine is doing
        "cpu_seconds": cpu_seconds,
        "seconds_detail": {"load": loaded_s, "eval_before": before.seconds, "train": train_s,
                           "eval_after": after.seconds},
        "steps": len(recorder.values["step_time"]),
        "reward_per_step": recorder.values["reward"],
        "mean_length_per_step": recorder.values["completions/mean_length"],
        "examples": examples,
        "seed": seed, "model": preset.model, "preset": preset.to_dict(), "threads": torch.get_num_threads(),
        "command": command or "labkit.demo.real_model_demo()",
        "provenance": provenance(),
    }
    write_json(out / "summary.json", summary)
    plot_real_model_demo(summary, out / "demo.png")
    return summary


def plot_real_model_demo(summary: dict, path: str | os.PathLike | None = None):
    """Return a figure of :func:`real_model_demo`: the reward per GRPO step, and held-out figures before/after."""
    import matplotlib

    if path is not None and "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), dpi=70)
    rewards = summary["reward_per_step"]
    left.plot(range(1, len(rewards) + 1), rewards, "o-", color="#2ca02c")
    left.set(xlabel="GRPO step", ylabel="mean reward of the group", ylim=(-0.02, 1.02),
             title="training: short answers with a number")
    labels = ["short answer\n(trained)", "right number\n(not trained)"]
    before = [summary["before"], summary["right_number_before"]]
    after = [summary["after"], summary["right_number_after"]]
    x = range(len(labels))
    right.bar([i - 0.2 for i in x], before, width=0.4, label="before GRPO", color="#bbbbbb")
    right.bar([i + 0.2 for i in x], after, width=0.4, label="after GRPO", color="#1f77b4")
    right.set(xticks=list(x), xticklabels=labels, ylim=(0, 1.05), ylabel="share of held-out problems",
              title="held-out problems (greedy)")
    right.legend(loc="upper center", fontsize=9, ncol=2, bbox_to_anchor=(0.5, -0.25))
    fig.suptitle(f"{summary['model']}, seed {summary['seed']}")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, bbox_inches="tight")
        plt.close(fig)
    return fig
