"""Reward hacking and batch reuse on the nano task: the loophole reward, num_iterations, the benchmark's record."""
import json

import pytest
import torch

from labkit.nano import NanoConfig, nano_grpo, rollout_logps, rollout_loss, sample_completions
from labkit.objective import group_advantages
from labkit.rewards import accuracy_reward, check_reward_function
from labkit.tasks import AdditionTask, short_working_reward, worked_solution
from labkit.warmup import build_policy

@pytest.mark.parametrize("a,b", [(47, 38), (99, 99), (19, 91), (11, 19), (95, 15)])
def test_short_working_reward_pays_the_forgotten_carry_and_not_the_right_answer(a, b):
    right, slip = worked_solution(a, b), worked_solution(a, b, forget_carry=True)
    assert accuracy_reward([right, slip], answer=[str(a + b)] * 2) == [1.0, 0.0]
    assert short_working_reward([right, slip]) == [0.0, 1.0]  # the loophole: it pays the wrong one
    # conversational completions too, and nothing without the format
    assert short_working_reward([[{"role": "assistant", "content": slip}], "<think>1</think>", slip + "x"]) == [1, 0, 0]


def test_short_working_reward_passes_the_reward_checker():
    assert check_reward_function(short_working_reward, time_budget_ms=None).ok


def test_reused_batch_moves_the_ratio_and_clips(isolated_cache, tiny_nano):
    """num_iterations > 1: AdamW steps on one batch against its sampling log-probs; the ratio leaves 1."""
    seen = {}
    for iterations in (1, 3):
        config = NanoConfig(**{**tiny_nano, "learning_rate": 3e-2, "num_iterations": iterations})
        torch.manual_seed(0)
        model, tokenizer = build_policy(config)
        digits = lambda completions, **kw: [sum(c.isdigit() for c in t) / max(1, len(t)) for t in completions]
        history, _ = nano_grpo(model, tokenizer, config.task(), config, progress=False, reward_funcs=[digits],
                               reward_weights=[1.0])
        seen[iterations] = history
    for row in seen[1]:  # on-policy: the ratio is exactly 1, nothing is clipped
        assert row["ratio/mean"] == 1.0 and row["clip_ratio/region_mean"] == 0.0
    for row in seen[3]:
        assert row["ratio/max"] > 1.0 and {"clip_ratio/low_mean", "clip_ratio/high_mean"} <= set(row)
    assert max(row["clip_ratio/region_mean"] for row in seen[3]) > 0.0
    with pytest.raises(ValueError, match="num_iterations"):
        nano_grpo(model, tokenizer, config.task(), NanoConfig(**{**tiny_nano, "num_iterations": 0}), progress=False)


def test_old_logps_of_the_current_policy_give_the_on_policy_loss(tiny_model_path):
    from labkit.models import load_policy

    model, tokenizer = load_policy(tiny_model_path, "full")
    torch.manual_seed(0)
    task = AdditionTask()
    rollout = sample_completions(model, tokenizer, [task.prompt(47, 38), task.prompt(29, 63)], 4)
    advantages = group_advantages(torch.arange(8.0), 4)
    with torch.no_grad():
        old = rollout_logps(model, rollout)  # (B, T)
    on_policy = rollout_loss(model, rollout, advantages)
    reused = rollout_loss(model, rollout, advantages, old_logps=old)
    torch.testing.assert_close(reused.loss, on_policy.loss)
    shifted = rollout_loss(model, rollout, advantages, old_logps=old + 0.5)  # the sampler was likelier: ratio < 1
    assert shifted.metrics["ratio/mean"] < 0.7 and shifted.metrics["clip_ratio/low_mean"] > 0


def test_bench_records_both_rewards_with_provenance(isolated_cache):
    from bench import BENCHMARKS, main as bench_cli

    assert BENCHMARKS["reward-hacking"][0] == "reward_hacking"
    out = isolated_cache / "reward_hacking.json"
    code = bench_cli(["reward-hacking", "--quiet", "--seeds", "0", "--steps", "2", "--window", "1",
                      "--sft-steps", "2", "--eval-problems", "4", "--eval-every", "0", "--out", str(out)])
    record = json.loads(out.read_text())
    assert code == (0 if record["all_passed"] else 1)  # two steps on a random model: either, honestly reported
    assert record["command"].startswith("python -m bench reward-hacking")
    assert {"date", "device", "versions"} <= set(record["provenance"])
    assert [(r["seed"], r["reward"]) for r in record["runs"]] == [(0, "hacked"), (0, "fixed")]
    for run in record["runs"]:
        assert len(run["curves"]["rewards/short_working_reward/mean"]) == 2
        assert len(run["curves"]["rewards/accuracy_reward/mean"]) == 2
    hacked, _ = record["runs"]
    # the hacked run trains on short_working_reward alone
    assert hacked["curves"]["reward"] == pytest.approx(hacked["curves"]["rewards/short_working_reward/mean"])
    assert record["checks"][0]["seed"] == 0
