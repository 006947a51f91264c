"""``python -m bench full-vs-lora``: full-parameter vs LoRA GRPO on the CPU nano task -> results/."""
from __future__ import annotations

import argparse
import os

from labkit.memory import estimate

__all__ = ["main"]


def _nano_record(result, part: str, label: str) -> dict:
    """One run of :func:`labkit.nano.run_nano_grpo`, with its optimizer-state bytes, as a JSON-able dict."""
    from labkit.nano import NanoConfig
    from labkit.warmup import warm_up_path

    config = result.config
    # The AdamW states of the trainable parameters, counted exactly as tests/test_memory.py checks against
    # a real optimizer: 2 moments x 4 bytes (fp32) per trainable parameter + a 4-byte step per tensor.
    path = warm_up_path(NanoConfig(**config), progress=False)
    states = estimate(str(path), config["method"], precision="fp32", device="cpu", lora_rank=config["lora_rank"],
                      lora_dropout=0.0).bytes["optimizer"]
    tail = result.curve("reward")[-10:]
    return dict(
        part=part, label=label, method=config["method"],
        lora_rank=config["lora_rank"] if config["method"] == "lora" else None,
        learning_rate=config["learning_rate"], seed=config["seed"],
        accuracy_before=result.accuracy_before, final_accuracy=result.accuracy_after,
        final_greedy_accuracy=result.after.get("greedy_accuracy"),
        train_reward_last10=sum(tail) / len(tail), seconds_per_step=result.seconds_per_step,
        trainable_params=result.parameters["trainable"], total_params=result.parameters["total"],
        optimizer_state_bytes=states,
        curve=result.curve("reward"), accuracy_curve=result.curve("rewards/accuracy_reward/mean"),
        evals=[{"step": e["step"], "accuracy": e["accuracy"]} for e in result.evals],
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m bench full-vs-lora``: full-parameter vs LoRA GRPO on the CPU nano task -> results/.

    1. A learning-rate sweep (``--sweep-seed``) for full fine-tuning and for LoRA of the first rank.
       Each method's rate is chosen by its mean *training* reward over the last 10 steps (never by
       the held-out accuracy reported afterwards).
    2. The comparison: full, and LoRA at each of ``--ranks``, at the chosen rates, for every seed of
       ``--seeds``: reward curves, held-out accuracy (pass@1) before and after, seconds per GRPO step,
       trainable parameters and AdamW state bytes.

    Writes ``results/full_vs_lora.json``; ``05_full_vs_lora.ipynb`` plots it. The task and every
    other knob are :class:`labkit.nano.NanoConfig`'s defaults (the main job's).
    """
    import dataclasses
    import time

    import torch

    from bench import results_dir, write_json
    from labkit.lab import provenance
    from labkit.nano import NanoConfig, run_nano_grpo

    parser = argparse.ArgumentParser(prog="python -m bench full-vs-lora", description=main.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--learning-rates", type=float, nargs="+", default=[3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2])
    parser.add_argument("--sweep-seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=NanoConfig.max_steps)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; 1 keeps the seconds per step comparable on a shared machine")
    parser.add_argument("--out", default=None, help="JSON file (default results/full_vs_lora.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    base = dataclasses.replace(NanoConfig(), max_steps=args.max_steps)
    started = time.perf_counter()
    runs = []

    def run(part, label, **changes):
        result = run_nano_grpo(dataclasses.replace(base, **changes), progress=False)
        record = _nano_record(result, part, label)
        runs.append(record)
        print(f"{part:<10} {label:<10} lr {record['learning_rate']:<7g} seed {record['seed']}: held-out "
              f"{record['accuracy_before']:.3f} -> {record['final_accuracy']:.3f}, train reward (last 10) "
              f"{record['train_reward_last10']:.3f}, {record['seconds_per_step']:.2f} s/step", flush=True)
        return record

    chosen = {}
    for method in ("full", "lora"):
        label = "full" if method == "full" else f"lora r={args.ranks[0]}"
        sweep = [run("lr_sweep", label, method=method, lora_rank=args.ranks[0], learning_rate=lr, seed=args.sweep_seed)
                 for lr in args.learning_rates]
        chosen[method] = max(sweep, key=lambda r: r["train_reward_last10"])["learning_rate"]
    print(f"chosen learning rates (best training reward): {chosen}")
    for seed in args.seeds:
        run("comparison", "full", method="full", learning_rate=chosen["full"], seed=seed)
        for rank in args.ranks:
            run("comparison", f"lora r={rank}", method="lora", lora_rank=rank, learning_rate=chosen["lora"], seed=seed)
    record = dict(
        benchmark="full vs LoRA GRPO on the nano task (two-digit addition with a carry, CPU)",
        command=("python -m bench full-vs-lora " + " ".join(argv or [])).strip(),
        settings=dict(task="labkit.nano: two-digit addition, sloppy-teacher warm-up, then GRPO",
                      config=dataclasses.asdict(base) | {"seed": None, "method": None, "learning_rate": None},
                      seeds=args.seeds, ranks=args.ranks, learning_rates=args.learning_rates,
                      sweep_seed=args.sweep_seed, chosen_learning_rates=chosen, threads=args.threads,
                      selection="each method's rate with the best mean training reward over the last 10 steps",
                      accuracy="held-out pass@1 (labkit.nano.evaluate_held_out)",
                      optimizer_state_bytes="AdamW, fp32: 2 x 4 bytes per trainable parameter + 4 per tensor"),
        runs=runs, seconds_total=round(time.perf_counter() - started, 1), provenance=provenance(),
    )
    out = write_json(args.out or results_dir() / "full_vs_lora.json", record)
    print(f"wrote {out} ({record['seconds_total']:.0f} s)")
    return 0
