"""The lab's main job, ``python -m labkit demo``: a model learns with GRPO on a laptop CPU, measured.

:func:`demo` runs the nano task of ``03_nano_grpo_cpu.ipynb`` end to end (warm-up from scratch,
held-out accuracy before, :func:`labkit.nano.nano_grpo`, accuracy after) and writes
``summary.json`` and ``demo.png``. :func:`real_model_demo` (``python -m labkit demo --model
smollm2-135m``, notebook 04's CPU mode) does the same for a real instruct model through TRL's
``GRPOTrainer``. ``python -m bench demo`` and ``bench smollm2-demo`` repeat them over seeds
and with the learning rate at 0 (the control) into ``results/``.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from labkit.evaluate import (dataset_questions, gsm8k_accuracy, held_out_scores, paired_change, pass_at_k,
                             sampled_pass_at_k, wilson_interval)
from labkit.lab import provenance, write_json
from labkit.nano import NanoConfig, plot_run, run_nano_grpo

__all__ = ["demo", "real_model_demo", "HeldOutCurve", "plot_real_model_demo", "plot_learning_curve"]


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
    paired = paired_change(before["greedy_right"], after["greedy_right"])
    n = before["samples"]
    curve = {when: [sum(pass_at_k(n, c, k) for c in e["right_per_problem"]) / len(e["right_per_problem"])
                    for k in range(1, n + 1)] for when, e in (("before", before), ("after", after))}
    return {
        "greedy_change": paired.change, "greedy_change_95ci": [paired.low, paired.high],
        "mcnemar": {"gained": paired.gained, "lost": paired.lost, "p_value": paired.p_value, "n": paired.n},
        "pass_at_k": {"k": list(range(1, n + 1)), **curve},
    }


# --------------------------------------------------------------------------- a real instruct model on a CPU


class HeldOutCurve(TrainerCallback):
    """A trainer callback: the held-out right-answer rate every ``every`` GRPO steps, written as it goes.

    After each evaluation it calls ``on_point(points, log_history)``; :func:`real_model_demo` uses
    that to write ``curve.json``, the log history and the pictures under its output folder, so a
    long run stopped half-way still leaves its curve. ``seconds`` of a point count from creation.
    """

    def __init__(self, dataset, tokenizer, *, every: int, max_new_tokens: int, batch_size: int, on_point=None):
        self.dataset, self.tokenizer, self.every = dataset, tokenizer, int(every)
        self.max_new_tokens, self.batch_size, self.on_point = max_new_tokens, batch_size, on_point
        self.points: list[dict] = []
        self.latest = None  # the last evaluation (labkit.evaluate.EvalResult)
        self.started, self.cpu_started = time.perf_counter(), time.process_time()

    def add(self, step: int, result, log_history=()) -> None:
        scores = held_out_scores(result)
        self.latest = result
        self.points.append({"step": step, "right_answer": scores["right_answer"], "right": scores["right"],
                            "short_answer": scores["short_answer"], "mean_words": scores["mean_words"],
                            "seconds": time.perf_counter() - self.started,
                            "cpu_seconds": time.process_time() - self.cpu_started,
                            "load_average": list(os.getloadavg())})
        if self.on_point is not None:
            self.on_point(self.points, list(log_history))

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.every and state.global_step % self.every == 0 and model is not None:
            result = gsm8k_accuracy(model, self.tokenizer, dataset=self.dataset, max_new_tokens=self.max_new_tokens,
                                    batch_size=self.batch_size, progress=False)
            self.add(state.global_step, result, state.log_history)
        return control


def real_model_demo(model: str = "smollm2-135m", out: str | os.PathLike = "runs/demo-smollm2", *, seed: int = 0,
                    learning_rate: float | None = None, steps: int | None = None, eval_problems: int = 96,
                    train_problems: int | None = None, threads: int | None = 2, progress: bool = True,
                    dashboard=None, command: str | None = None, eval_every: int | None = None,
                    pass_at_k_problems: int = 0, before=None, system_prompt: str | None = None,
                    preset_overrides: dict | None = None, keep_completions: bool = False,
                    evaluations: dict | None = None) -> dict:
    """Return the summary of GRPO on a real instruct model on a CPU, after writing ``out/summary.json`` and a plot.

    The ``cpu-smollm2`` preset (``preset_overrides`` change any of its fields) through the same
    calls notebook 04 makes on a GPU (:func:`labkit.models.load_policy` ->
    :func:`labkit.run.build_run` -> ``run.train()``), on :class:`labkit.tasks.WordProblems`
    (``system_prompt`` replaces the task's), rewarded by the preset's rewards
    (:func:`labkit.rewards.right_answer_reward`: the stated answer is the gold number).

    Held-out: the first ``eval_problems`` of the fixed pool (never trained on), answered greedily
    with the training budget (``max_completion_length``) before and after. The summary holds the
    right-answer rate (``right_number_before``, ``right_number_after``), each problem's verdict,
    the exact McNemar p and the paired (Newcombe) interval of the change, the short-answer rate
    and mean length beside it, examples (the question beside each before/after reply), the reward
    per step, wall and CPU seconds and the load average (a shared machine slows wall time, not
    CPU time). ``eval_every`` also evaluates every N steps and writes ``curve.json``,
    ``log_history.json``, ``learning_curve.png`` (and the dashboard's ``dashboard.png``) as
    training goes. ``pass_at_k_problems`` samples 8 replies for that many held-out problems
    before and after (pass@k, k = 1..8). ``before`` reuses an evaluation of the untrained model
    with the same prompt and budget (the experiments' bench saves the time); ``evaluations``, a
    dict, receives the ``"before"`` and ``"after"`` evaluations (:class:`labkit.evaluate.EvalResult`). ``threads``:
    torch's CPU threads (``None``: torch's default).
    """
    import tempfile

    from labkit.lab import seed_everything
    from labkit.monitor import peak_rss_bytes
    from labkit.presets import get_preset, resolve_plan
    from labkit.run import build_run
    from labkit.tasks import WordProblems
    from labkit.training import LogRecorder

    overrides = dict(preset_overrides or {}) | {"model": model, "seed": seed}
    if learning_rate is not None:
        overrides["learning_rate"] = learning_rate
    if steps is not None:
        overrides["max_steps"] = steps
    preset = get_preset("cpu-smollm2", **overrides)
    if threads:
        torch.set_num_threads(threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    load_start = list(os.getloadavg())
    started, cpu_started = time.perf_counter(), time.process_time()
    seed_everything(seed)
    policy, tokenizer = resolve_plan(preset).load_policy()  # a CPU preset's plan: fp32
    loaded_s = time.perf_counter() - started
    task = WordProblems() if system_prompt is None else WordProblems(system_prompt=system_prompt)
    held_out = task.dataset(eval_problems, split="test")
    budget = preset.config["max_completion_length"]
    evaluation = dict(dataset=held_out, max_new_tokens=budget, batch_size=preset.eval_batch_size, progress=progress)
    before = before if before is not None else gsm8k_accuracy(policy, tokenizer, **evaluation)
    if [r["gold"] for r in before.records] != list(held_out["answer"]) or before.max_new_tokens != budget:
        raise ValueError("`before` must evaluate the same held-out problems with the same budget")

    def sampled(when: str) -> dict:
        return sampled_pass_at_k(policy, tokenizer, held_out.select(range(pass_at_k_problems)), max_new_tokens=budget,
                                 temperature=preset.config["temperature"], seed=seed, progress=progress,
                                 desc=f"pass@k {when}")

    passes = {"before": sampled("before")} if pass_at_k_problems else {}
    train_problems = train_problems or max(64, preset.config["max_steps"] * int(preset.prompts_per_step))
    reward_keys = [f"rewards/{name}_reward/mean" for name in preset.rewards]
    recorder = LogRecorder(("reward", "reward_std", *reward_keys, "completions/mean_length", "loss"))
    callbacks = [recorder] + ([dashboard] if dashboard is not None else [])
    curve, questions = None, dataset_questions(held_out)
    if eval_every:
        def write_progress(points, log_history):
            write_json(out / "curve.json", {"every": eval_every, "held_out_problems": eval_problems,
                                            "metric": "held-out right-answer rate (greedy)", "points": points,
                                            "steps_planned": preset.config["max_steps"], "provenance": provenance()})
            write_json(out / "log_history.json", log_history)
            write_json(out / "latest_completions.json", {
                "step": points[-1]["step"],
                "completions": [{"question": q, "gold": r["gold"], "before": b["completion"], "now": r["completion"]}
                                for q, b, r in zip(questions, before.records, curve.latest.records)]})
            plot_learning_curve(points, recorder.values["reward"], out / "learning_curve.png",
                                title=f"{preset.model}, seed {seed}, learning rate {preset.config['learning_rate']:g}")
            if dashboard is not None and hasattr(dashboard, "save"):
                try:
                    dashboard.save(out / "dashboard.png")
                except Exception as exc:  # noqa: BLE001  a picture must never end an hour-long run
                    print(f"dashboard picture not saved: {exc}", file=sys.stderr)

        curve = HeldOutCurve(held_out, tokenizer, every=eval_every, max_new_tokens=budget,
                             batch_size=preset.eval_batch_size, on_point=write_progress)
        curve.add(0, before)
        callbacks.append(curve)
    with tempfile.TemporaryDirectory(prefix="labkit-demo-") as run_dir:
        run = build_run(preset, run_dir, model=policy, tokenizer=tokenizer,
                        train_dataset=task.dataset(train_problems, seed=seed), callbacks=callbacks,
                        print_logs=False, disable_tqdm=not progress or dashboard is not None)
        train_started = time.perf_counter()
        run.train(resume=False)
        train_s = time.perf_counter() - train_started
        log_history = list(run.trainer.state.log_history)
    after = gsm8k_accuracy(policy, tokenizer, **evaluation)
    if evaluations is not None:
        evaluations.update(before=before, after=after)
    if pass_at_k_problems:
        passes["after"] = sampled("after")
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    scores_before, scores_after = held_out_scores(before), held_out_scores(after)
    right_before, right_after = scores_before["right"], scores_after["right"]
    paired = paired_change(right_before, right_after)
    n = len(right_before)
    completions = [{"question": questions[i], "gold": held_out[i]["answer"], "before": before.records[i]["completion"],
                    "after": after.records[i]["completion"], "right_before": right_before[i],
                    "right_after": right_after[i]} for i in range(n)]
    flipped = [c for c in completions if c["right_before"] != c["right_after"]]
    examples = completions[:4] + [c for c in flipped if c not in completions[:4]][:4]
    summary = {
        "metric": (f"right answer: the share of {n} held-out word problems (a fixed pool, never trained on) whose "
                   f"greedy reply of at most {budget} tokens states the gold number (labkit.rewards."
                   "extract_stated_answer: an 'answer is N', else the result of the last '=', else the last number)"),
        "task": "one-step arithmetic word problems (labkit.tasks.WordProblems: +, -, x), not GSM8K",
        "system_prompt": task.system_prompt,
        "right_number_before": scores_before["right_answer"], "right_number_after": scores_after["right_answer"],
        "rise_points": 100 * (scores_after["right_answer"] - scores_before["right_answer"]),
        "right_number_before_ci95": list(wilson_interval(sum(right_before), n)),
        "right_number_after_ci95": list(wilson_interval(sum(right_after), n)),
        "mcnemar_p": paired.p_value, "gained": paired.gained, "lost": paired.lost,
        "change_ci95_paired": [paired.low, paired.high],  # Newcombe's (labkit.evaluate.paired_change)
        "short_answer_before": scores_before["short_answer"], "short_answer_after": scores_after["short_answer"],
        "cut_off_before": before.truncated_rate, "cut_off_after": after.truncated_rate,
        "last_number_before": scores_before["last_number"], "last_number_after": scores_after["last_number"],
        "mean_words_before": scores_before["mean_words"], "mean_words_after": scores_after["mean_words"],
        "right_before": right_before, "right_after": right_after,
        "seconds": seconds,
        # CPU time of this process (all its threads): what the run costs, whatever else the machine is doing
        "cpu_seconds": cpu_seconds,
        "load_average_start": load_start, "load_average_end": list(os.getloadavg()),
        "peak_rss_gib": round(peak_rss_bytes() / 2**30, 2),  # the whole run's (this process's) resident memory
        "seconds_detail": {"load": loaded_s, "eval_before": before.seconds, "train": train_s,
                           "eval_after": after.seconds},
        "steps": len(recorder.values["step_time"]),
        "reward_per_step": recorder.values["reward"],
        "reward_std_per_step": recorder.values["reward_std"],
        "mean_length_per_step": recorder.values["completions/mean_length"],
        "examples": examples,
        "seed": seed, "model": preset.model, "preset": preset.to_dict(), "threads": torch.get_num_threads(),
        "command": command or "labkit.demo.real_model_demo()",
        "provenance": provenance(),
    }
    if passes:
        summary["pass_at_k"] = passes
    if curve is not None:
        if curve.points[-1]["step"] != summary["steps"]:
            curve.add(summary["steps"], after, log_history)
        summary["curve"] = [{k: v for k, v in p.items() if k != "right"} for p in curve.points]
    if keep_completions:
        summary["completions"] = completions
    if eval_every:
        write_json(out / "log_history.json", log_history)
    write_json(out / "summary.json", summary)
    plot_real_model_demo(summary, out / "demo.png")
    return summary


def plot_learning_curve(points: list[dict], rewards: list[float], path: str | os.PathLike | None = None, *,
                        title: str = ""):
    """Return a figure: the mean reward per GRPO step and the held-out right-answer rate (Wilson 95 %) every N steps."""
    plt = _pyplot(path)
    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=80)
    if rewards:
        ax.plot(range(1, len(rewards) + 1), rewards, color="#bbbbbb", lw=0.8, label="training reward (mean of the step)")
    steps = [p["step"] for p in points]
    rates = [p["right_answer"] for p in points]
    bands = [wilson_interval(sum(p["right"]), len(p["right"])) for p in points]
    ax.fill_between(steps, [b[0] for b in bands], [b[1] for b in bands], color="#1f77b4", alpha=0.2, lw=0)
    ax.plot(steps, rates, "o-", color="#1f77b4", label="held-out right-answer rate (greedy, 95% Wilson)")
    ax.set(xlabel="GRPO step", ylabel="rate", ylim=(0, 1), title=title or "learning curve")
    ax.legend(loc="lower right", fontsize=8)
    return _finish(fig, path)


def plot_real_model_demo(summary: dict, path: str | os.PathLike | None = None):
    """Return a figure of :func:`real_model_demo`: the reward per GRPO step, and the held-out rates before/after."""
    plt = _pyplot(path)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), dpi=70)
    rewards = summary["reward_per_step"]
    left.plot(range(1, len(rewards) + 1), rewards, "o-", color="#2ca02c", ms=3)
    left.set(xlabel="GRPO step", ylabel="mean reward of the step", title="training reward")
    n = len(summary["right_before"])
    rates = [summary["right_number_before"], summary["right_number_after"]]
    errors = [[r - wilson_interval(round(r * n), n)[0] for r in rates],
              [wilson_interval(round(r * n), n)[1] - r for r in rates]]
    right.bar([0, 1], rates, yerr=errors, capsize=6, color=["#bbbbbb", "#1f77b4"], width=0.6)
    right.set(xticks=[0, 1], xticklabels=["before GRPO", "after GRPO"], ylim=(0, 1.05),
              ylabel="right answers (share)", title=f"{n} held-out word problems (greedy)")
    right.text(0.5, 1.0, f"McNemar p = {summary['mcnemar_p']:.2g}", ha="center", va="bottom", fontsize=9)
    rate = summary["preset"]["config"]["learning_rate"]
    fig.suptitle(f"{summary['model']}, seed {summary['seed']}, learning rate {rate:g}")
    return _finish(fig, path)


def _pyplot(path):
    """Return ``matplotlib.pyplot``, on the Agg backend when a figure goes to a file and pyplot is not loaded yet."""
    import matplotlib

    if path is not None and "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(fig, path):
    """Return ``fig`` laid out; with a ``path``, saved there and closed (no figure piles up in pyplot)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    if path is not None:
        fig.savefig(path, bbox_inches="tight")
        plt.close(fig)
    return fig
