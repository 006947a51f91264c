"""``python -m bench generation-paths``: each generation path on a CPU, with the real model -> results/generation_paths.json.

Two questions for SmolLM2-135M-Instruct (notebook 04's CPU recipe, ``cpu-smollm2``), through TRL's ``GRPOTrainer``:

1. **The same tokens, and how fast.** One generation batch of the recipe (``--prompts`` training prompts, greedy),
   twice per path (``labkit.generation.PATHS`` that run on a CPU: ``generate``, ``continuous``, ``static-compiled``):
   the completions token for token against the default path's, completion tokens a second and ms per decode step
   of the second generation, and the first generation's extra seconds (compilation, for ``static-compiled``).
2. **The same learning.** The recipe trained twice from the same seed, with ``generate`` and with ``--learn-with``
   (default ``continuous``: on a CPU the default is itself the fastest path, so the run uses the fastest of the
   others), each evaluated on the same held-out problems (greedy): right-answer rate after each, the problems on
   which the two runs' verdicts differ, and the exact McNemar test and Newcombe's paired interval between them;
   then ``--learn-with`` alone from ``--other-seeds``. The paths draw their random numbers differently (continuous
   batching has its own seeded sampler), so the two runs of a seed see different completions, as two seeds do: the
   paired test says whether two trained models differ, not whether a path does; the recipe's own spread over seeds
   (``generate``, seeds 0-2: results/smollm2_demo.json) is what a path's results are read against.
3. **Where the paths part** (``--short-runs SEED ...``, alone: the other parts already recorded are kept). The
   recipe's first ``--short-steps`` steps with each path from each seed: TRL's mean completion length, the share cut
   at the token limit (``completions/clipped_ratio``) and the reward, step by step; and one model, its LoRA B
   matrices drawn at random so that the adapters act, sampled through both paths with TRL's settings: mean length,
   the share ended by EOS and the completions' mean token log-probability under the model's own forward pass (a
   path that sampled from another distribution would show it there).

Timings depend on the machine and on what else runs on it: the record says the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench import results_dir, write_json

__all__ = ["main", "compare_tokens", "compare_learning", "other_seed", "short_runs", "same_model_sampling"]

CPU_PATHS = ("generate", "continuous", "static-compiled")


def _prompt_batch(run, prompts: int) -> list[list[int]]:
    """Return the token ids of ``run``'s first ``prompts`` training prompts, each repeated ``num_generations`` times."""
    batch = [run.tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True)
             for r in run.train_dataset.select(range(prompts))]
    return [p["input_ids"] if hasattr(p, "keys") else p for p in batch] * run.preset.config["num_generations"]


def compare_tokens(prompts: int = 4, paths=CPU_PATHS, runs: str = "runs/bench-generation-paths") -> dict:
    """Return, per path, the greedy completions' agreement with ``generate`` and its speed (see the docstring)."""
    from labkit.presets import get_preset
    from labkit.run import build_run

    preset = get_preset("cpu-smollm2").replace(max_steps=1, save_strategy="no")
    rows, reference = {}, None
    for path in paths:
        run = build_run(preset.replace(generation=path), Path(runs) / path, print_logs=False,
                        generation_kwargs={"do_sample": False})
        batch = _prompt_batch(run, prompts)
        for _ in range(2):
            completions, _ = run.trainer._generate_single_turn(batch, None, {}, 1)
        completions = [list(map(int, c)) for c in completions]
        reference = completions if reference is None else reference
        summary = run.generation.summary()
        second = run.generation.calls[-1]
        rows[path] = dict(same_tokens_as_generate=completions == reference,
                          sequences_differing=sum(a != b for a, b in zip(completions, reference)),
                          sequences=len(completions), completion_tokens=second["tokens"],
                          tokens_per_second=round(second["tokens"] / second["seconds"], 1),
                          ms_per_decode_step=round(1000 * second["seconds"] / max(1, second["decode_steps"]), 1),
                          first_generation_s=round(run.generation.calls[0]["seconds"], 1),
                          second_generation_s=round(second["seconds"], 1),
                          first_extra_s=round(summary["first_extra_s"] or 0.0, 1),
                          graphs_compiled=[c["compiled"] for c in run.generation.calls])
        print(f"{path}: {rows[path]}", flush=True)
    return rows


def _train(path: str, seed: int, folder: str, eval_problems: int, before=None) -> tuple[dict, dict]:
    """Train the CPU recipe with generation ``path`` from ``seed`` into ``folder``; return its figures and the
    evaluations (``before``: an evaluation of the untrained model to reuse)."""
    from labkit.demo import real_model_demo
    from labkit.evaluate import held_out_scores

    evals: dict = {}
    start = time.perf_counter()
    summary = real_model_demo("smollm2-135m", folder, seed=seed, eval_problems=eval_problems, progress=False,
                              before=before, evaluations=evals, preset_overrides={"generation": path})
    scores = held_out_scores(evals["after"])
    print(f"{path}, seed {seed}: right answers {summary['right_number_before']:.1%} -> {scores['right_answer']:.1%}",
          flush=True)
    return dict(right_answer_before=summary["right_number_before"], right_answer_after=scores["right_answer"],
                right=scores["right"], mcnemar_p_before_after=summary["mcnemar_p"],
                seconds=round(time.perf_counter() - start), reward_per_step=summary["reward_per_step"],
                mean_length_per_step=summary["mean_length_per_step"], cut_off_after=summary["cut_off_after"]), evals


def compare_learning(path: str = "continuous", eval_problems: int = 96, runs: str = "runs/bench-generation-paths",
                     seed: int = 0) -> dict:
    """Train the CPU recipe with ``generate`` and with ``path`` from ``seed``; return both held-out results and the
    paired test between the two trained models."""
    from labkit.evaluate import paired_change

    trained, evals = {}, {}
    for name in ("generate", path):  # the untrained model is evaluated once, for both
        trained[name], evals = _train(name, seed, f"{runs}/learn-{name}", eval_problems, evals.get("before"))
    a, b = trained["generate"]["right"], trained[path]["right"]
    change = paired_change(a, b)  # "before" = the default path's run, "after" = the other path's
    return dict(paths=["generate", path], seed=seed, runs=trained, problems=len(a),
                verdicts_differ=change.gained + change.lost, mcnemar_p=change.p_value, change_points=round(change.points, 1),
                change_interval_points=[round(100 * change.low, 1), round(100 * change.high, 1)])


def other_seed(path: str, seed: int, eval_problems: int = 96, runs: str = "runs/bench-generation-paths") -> dict:
    """Train the CPU recipe with ``path`` from another ``seed``: the two paths draw different random numbers, so one
    pair of runs is two draws; results/smollm2_demo.json holds the recipe's seeds 0-2 with ``generate``."""
    figures, _ = _train(path, seed, f"{runs}/learn-{path}-seed{seed}", eval_problems)
    return dict(path=path, seed=seed, **figures)


def short_runs(seeds, steps: int = 6, paths=("generate", "continuous"),
               runs: str = "runs/bench-generation-paths") -> list[dict]:
    """Train the CPU recipe for ``steps`` steps per path and seed; return TRL's length, cut-off share and reward."""
    import shutil

    from labkit.presets import get_preset
    from labkit.run import build_run

    rows = []
    for seed in seeds:
        for path in paths:
            folder = Path(runs) / f"short-{path}-seed{seed}"
            shutil.rmtree(folder, ignore_errors=True)  # a fresh run, never a resumed one
            preset = get_preset("cpu-smollm2").replace(max_steps=steps, save_strategy="no", generation=path, seed=seed)
            run = build_run(preset, folder, print_logs=False)
            start = time.perf_counter()
            run.trainer.train()
            logs = [h for h in run.trainer.state.log_history if "completions/mean_length" in h]
            rows.append(dict(path=path, seed=seed, seconds=round(time.perf_counter() - start),
                             mean_length=[round(h["completions/mean_length"], 2) for h in logs],
                             cut_off=[round(h["completions/clipped_ratio"], 3) for h in logs],
                             reward=[round(h["reward"], 3) for h in logs]))
            print(f"{path}, seed {seed}: cut off {rows[-1]['cut_off']}", flush=True)
    return rows


def same_model_sampling(prompts: int = 8, lora_b_std: float = 0.02, repeats: int = 2,
                        runs: str = "runs/bench-generation-paths") -> dict:
    """Sample ``prompts`` x 8 completions ``repeats`` times per path from one model whose LoRA B matrices are drawn
    at random (std ``lora_b_std``); return each draw's mean length, EOS-ended share and mean token log-probability."""
    import torch

    from labkit.presets import get_preset
    from labkit.run import build_run

    preset = get_preset("cpu-smollm2").replace(max_steps=1, save_strategy="no", generation="continuous")
    run = build_run(preset, Path(runs) / "same-model", print_logs=False)
    trainer, model = run.trainer, run.trainer.model
    batch = _prompt_batch(run, prompts)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, lora_b_std)

    def mean_log_prob(prompt, completion) -> float:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].float()
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None]).mean().item()

    draws = {"generate": [], "continuous": []}
    for _ in range(repeats):
        for path in draws:
            trainer.use_transformers_continuous_batching = path == "continuous"
            completions, _ = trainer._generate_single_turn(batch, None, {}, 1)
            completions = [list(map(int, c)) for c in completions]
            model.eval()  # the log-probabilities without LoRA's dropout; TRL generates in training mode
            log_probs = [mean_log_prob(p, c) for p, c in zip(batch, completions)]
            model.train()
            n = len(completions)
            draws[path].append(dict(completions=n, mean_length=round(sum(map(len, completions)) / n, 2),
                                    ended_by_eos=round(sum(c[-1] in trainer.eos_token_ids for c in completions) / n, 3),
                                    mean_token_log_prob=round(sum(log_probs) / n, 3)))
            print(f"{path}: {draws[path][-1]}", flush=True)
    return dict(prompts=prompts, lora_b_std=lora_b_std, draws=draws)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench generation-paths", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4, help="training prompts in the generation batch (x 8)")
    parser.add_argument("--learn-with", default="continuous", choices=CPU_PATHS[1:])
    parser.add_argument("--eval-problems", type=int, default=96)
    parser.add_argument("--other-seeds", type=int, nargs="*", default=[1],
                        help="more runs of --learn-with alone, from these seeds (results/smollm2_demo.json has generate's)")
    parser.add_argument("--skip-learning", action="store_true",
                        help="only the tokens and the speed (minutes); a learning comparison already recorded is kept")
    parser.add_argument("--short-runs", type=int, nargs="+", default=None, metavar="SEED",
                        help="only part 3, from these seeds; the parts already recorded are kept")
    parser.add_argument("--short-steps", type=int, default=6)
    parser.add_argument("--out", default=None, help="results folder (default results/)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from labkit.lab import provenance

    path = results_dir(args.out) / "generation_paths.json"
    command = "python -m bench generation-paths " + " ".join(argv or [])
    if args.short_runs:
        record = json.loads(path.read_text()) if path.exists() else {}
        record["where_paths_part"] = dict(
            command=command, load_average_start=list(os.getloadavg()), steps=args.short_steps,
            runs=short_runs(args.short_runs, args.short_steps), same_model=same_model_sampling(),
            load_average_end=list(os.getloadavg()), date=time.strftime("%Y-%m-%d %H:%M:%S"), provenance=provenance())
        write_json(path, record)
        print(f"wrote {path}")
        return 0
    record = dict(command=command, load_average_start=list(os.getloadavg()), tokens=compare_tokens(args.prompts))
    if not args.skip_learning:
        record["learning"] = compare_learning(args.learn_with, args.eval_problems)
        record["other_seeds"] = [other_seed(args.learn_with, seed, args.eval_problems) for seed in args.other_seeds]
    elif path.exists():  # the tokens and speeds again (on an idle machine, say): the learning runs kept
        old = json.loads(path.read_text())
        kept = ("learning", "other_seeds", "history", "where_paths_part")
        record.update({k: v for k, v in old.items() if k.startswith(kept)})
    record.update(load_average_end=list(os.getloadavg()), date=time.strftime("%Y-%m-%d %H:%M:%S"),
                  machine=f"{os.cpu_count()} CPU cores", provenance=provenance())
    write_json(path, record)
    print(f"wrote {path}")
    return 0
