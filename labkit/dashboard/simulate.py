"""A made-up GRPO run for demos, tests and the benchmark: :func:`simulated_run` (nothing is trained)."""
from __future__ import annotations

import random
from collections.abc import Iterator

__all__ = ["simulated_run"]


def simulated_run(steps: int = 60, *, seed: int = 0, reward_funcs: tuple[str, ...] = ("correctness", "format"),
                  beta: float = 0.04) -> Iterator[tuple[int, dict]]:
    """Yield ``(step, logs)`` shaped like TRL's ``GRPOTrainer`` logs, from made-up numbers.

    For demos, tests and the benchmark only: nothing is trained. Rewards rise noisily, the
    format reward first; ``kl`` appears only when ``beta > 0``; like TRL, some values are ``None``
    (a reward function that scored nothing) and some keys are missing on some steps.
    """
    rng = random.Random(seed)
    for step in range(1, steps + 1):
        progress = step / steps
        fmt = min(1.0, 0.15 + 1.6 * progress + rng.gauss(0, 0.06))
        correct = max(0.0, min(1.0, 0.08 + 0.55 * progress ** 1.5 + rng.gauss(0, 0.05)))
        per_func = dict(zip(reward_funcs, (correct, fmt, 0.5)))
        logs = {f"rewards/{name}/mean": per_func.get(name, 0.5) for name in reward_funcs}
        logs.update({f"rewards/{name}/std": abs(rng.gauss(0.3, 0.05)) for name in reward_funcs})
        logs["reward"] = sum(logs[f"rewards/{name}/mean"] for name in reward_funcs)
        logs["reward_std"] = abs(rng.gauss(0.55 - 0.2 * progress, 0.04))
        logs["frac_reward_zero_std"] = max(0.0, min(1.0, 0.5 - 0.3 * progress + rng.gauss(0, 0.05)))
        if beta > 0:
            logs["kl"] = 0.03 * progress * (1 + rng.gauss(0, 0.1))
        logs["entropy"] = 1.8 - 0.6 * progress + rng.gauss(0, 0.03)
        logs["completions/mean_length"] = 180 - 70 * progress + rng.gauss(0, 6)
        logs["completions/clipped_ratio"] = max(0.0, 0.2 - 0.15 * progress)
        logs["loss"] = rng.gauss(0, 0.02) + beta * logs.get("kl", 0.0)
        logs["grad_norm"] = abs(rng.gauss(0.6, 0.1))
        logs["learning_rate"] = 1e-6 * (1 - progress)
        logs["step_time"] = abs(rng.gauss(1.0, 0.05))
        if step % 4:  # TRL only logs clip ratios when the importance ratio moved
            logs.update({"clip_ratio/low_mean": 0.002 * progress, "clip_ratio/high_mean": 0.004 * progress,
                         "clip_ratio/region_mean": 0.006 * progress})
        if step % 7 == 0:  # a batch where a reward function scored nothing: TRL logs None
            logs[f"rewards/{reward_funcs[0]}/mean"] = None
        yield step, logs
