"""The nano task and loop (labkit.tasks, labkit.nano): rewards, the update's direction, TRL parity, the main job."""
import copy
import json
import random
import re

import pytest
import torch

from labkit.cli import demo_cli
from labkit.nano import (NanoConfig, Rollout, evaluate_held_out, nano_grpo, rollout_loss, run_nano_grpo,
                         sample_completions, calculate_rewards, trl_trainer)
from labkit.objective import group_advantages
from labkit.rewards import accuracy_reward, format_reward
from labkit.tasks import AdditionTask, carries, worked_solution

# ----------------------------------------------------------------------------- the task


@pytest.mark.parametrize("a,b", [(47, 38), (85, 47), (19, 91), (99, 99), (11, 99)])
def test_worked_solutions_are_scored_by_labkit_rewards(a, b):
    right = worked_solution(a, b)
    slip = worked_solution(a, b, forget_carry=True)
    assert accuracy_reward([right, slip], answer=[str(a + b)] * 2) == [1.0, 0.0]
    assert format_reward([right, slip]) == [1.0, 1.0]  # the slip is well formed, only wrong
    assert carries(right) and not carries(slip)


def test_worked_solution_reads_column_by_column():
    assert worked_solution(47, 38) == "<think>7+8=15 4+3+1=8</think>\n<answer>85</answer>"
    assert worked_solution(47, 38, forget_carry=True) == "<think>7+8=15 4+3=7</think>\n<answer>75</answer>"
    with pytest.raises(ValueError):
        worked_solution(7, 38)


def test_problems_carry_and_test_split_is_held_out():
    task = AdditionTask()
    train = set(task.problems(5000, seed=0))
    test = task.problems(729, seed=1, split="test")
    assert len(set(test)) == 729 and not train & set(test)
    assert all(a % 10 + b % 10 >= 10 for a, b in train | set(test))
    assert task.problems(20, seed=3, split="test") == task.problems(20, seed=3, split="test")
    with pytest.raises(ValueError):
        task.problems(1, seed=0, split="validation")


def test_sloppy_teacher_forgets_at_its_rate():
    task, rng = AdditionTask(forget_carry=0.6), random.Random(0)
    slips = [not carries(task.teacher_solution(47, 38, rng)) for _ in range(4000)]
    assert sum(slips) / len(slips) == pytest.approx(0.6, abs=0.03)


def test_prompt_uses_the_chat_template(tiny_model_path):
    from labkit.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_path)
    text = tokenizer.apply_chat_template(AdditionTask.prompt(47, 38), tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\n47+38=?<|im_end|>\n<|im_start|>assistant\n"
    dataset = AdditionTask().dataset(8, seed=0)
    assert set(dataset.column_names) == {"prompt", "answer"}
    a, b = map(int, re.findall(r"\d+", dataset[0]["prompt"][0]["content"]))
    assert dataset[0]["answer"] == str(a + b)


# ----------------------------------------------------------------------------- the loop's pieces


def _teacher_rollout(tokenizer, task, pairs, G):
    """A rollout of teacher completions: in each group some carry (right) and some forget (wrong)."""
    texts = [tokenizer.apply_chat_template(task.prompt(a, b), tokenize=False, add_generation_prompt=True)
             for a, b in pairs]
    encoded = tokenizer(texts, return_tensors="pt", padding=True)
    completions = [worked_solution(a, b, forget_carry=g % 2 == 1) for a, b in pairs for g in range(G)]
    ids = [tokenizer(c + tokenizer.eos_token)["input_ids"] for c in completions]
    width = max(map(len, ids))
    completion_ids = torch.full((len(ids), width), tokenizer.pad_token_id)
    completion_mask = torch.zeros(len(ids), width, dtype=torch.long)
    for i, row in enumerate(ids):
        completion_ids[i, :len(row)] = torch.tensor(row)
        completion_mask[i, :len(row)] = 1
    return Rollout(encoded["input_ids"].repeat_interleave(G, 0), encoded["attention_mask"].repeat_interleave(G, 0),
                   completion_ids, completion_mask, completions)


def test_score_sums_rewards_with_weights():
    rewards, per_function = calculate_rewards([worked_solution(47, 38), worked_solution(47, 38, forget_carry=True), "junk"],
                                  ["85"] * 3)
    assert rewards.tolist() == [1.5, 0.5, 0.0]
    assert per_function == {"accuracy_reward": [1.0, 0.0, 0.0], "format_reward": [1.0, 1.0, 0.0]}


def test_sampled_rollout_masks_after_the_first_eos(tiny_model_path):
    from labkit.models import load_policy

    model, tokenizer = load_policy(tiny_model_path, "full")
    torch.manual_seed(0)
    rollout = sample_completions(model, tokenizer, [AdditionTask.prompt(47, 38)] * 2, 3, max_completion_length=12)
    assert rollout.completion_ids.shape[0] == rollout.prompt_ids.shape[0] == 6 and len(rollout.completions) == 6
    for ids, mask in zip(rollout.completion_ids, rollout.completion_mask):
        eos = (ids == tokenizer.eos_token_id).nonzero()
        kept = int(mask.sum())
        assert kept == (int(eos[0]) + 1 if len(eos) else ids.numel())
        assert mask[:kept].all() and not mask[kept:].any()


def test_rollout_entropy_is_the_entropy_a_forward_pass_gives(tiny_model_path):
    from labkit.models import load_policy
    from labkit.objective import token_entropy

    model, tokenizer = load_policy(tiny_model_path, "full")
    torch.manual_seed(0)
    rollout = sample_completions(model, tokenizer, [AdditionTask.prompt(47, 38)] * 2, 3, max_completion_length=12,
                                 temperature=0.7, entropy=True)
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], 1)
    T = rollout.completion_ids.size(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -T - 1:-1] / 0.7  # (B, T, V)
    expected = (token_entropy(logits) * rollout.completion_mask).sum() / rollout.completion_mask.sum()
    assert rollout.entropy == pytest.approx(expected.item(), rel=1e-3) and rollout.entropy > 0
    assert sample_completions(model, tokenizer, [AdditionTask.prompt(1, 2)], 2, max_completion_length=4).entropy is None


def test_one_update_makes_right_answers_more_likely(tiny_model_path):
    """The step's direction: one update widens the log-probability margin of right over wrong completions."""
    from labkit.models import load_policy

    model, tokenizer = load_policy(tiny_model_path, "full")
    task, G = AdditionTask(), 4
    rollout = _teacher_rollout(tokenizer, task, [(47, 38), (29, 63)], G)
    rewards, _ = calculate_rewards(rollout.completions, [str(a + b) for a, b in [(47, 38), (29, 63)] for _ in range(G)])
    advantages = group_advantages(rewards, G)
    assert (advantages[0::2] > 0).all() and (advantages[1::2] < 0).all()

    from labkit.objective import per_token_logps

    def seq_logps():
        with torch.no_grad():
            ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
            mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], 1)
            logps = per_token_logps(model, ids, mask, rollout.completion_ids.size(1))
        return (logps * rollout.completion_mask).sum(1)

    before = seq_logps()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    rollout_loss(model, rollout, advantages).loss.backward()
    optimizer.step()
    margin_before = before[0::2] - before[1::2]  # (right - wrong) in each pair of the same prompt
    margin_after = seq_logps()[0::2] - seq_logps()[1::2]
    assert (margin_after > margin_before).all()


def digit_share(completions, **kwargs):
    """A reward an untrained model already varies on: the share of digits in its text."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def test_nano_grpo_updates_only_with_a_learning_rate(isolated_cache, tiny_nano):
    from labkit.warmup import build_policy

    for lr in (0.0, 1e-3):
        config = NanoConfig(**{**tiny_nano, "learning_rate": lr})
        model, tokenizer = build_policy(config)
        start = copy.deepcopy(model.state_dict())
        seen = []
        history, evals = nano_grpo(model, tokenizer, config.task(), config, progress=False,
                                   reward_funcs=[digit_share], reward_weights=[1.0],
                                   callback=lambda step, metrics: seen.append(step))
        assert len(history) == config.max_steps and evals == [] and seen == [1, 2]
        assert {"loss", "reward", "frac_reward_zero_std", "rewards/digit_share/mean", "carry_rate",
                "clip_ratio/region_mean", "completions/mean_length", "entropy"} <= set(history[0])
        assert all(0 < row["entropy"] < 20 for row in history)  # nats: logged every step (the dashboard's panel)
        assert history[0]["frac_reward_zero_std"] < 1  # the batch has signal
        same = all(torch.equal(start[k], v) for k, v in model.state_dict().items())
        assert same == (lr == 0.0)


def test_evaluate_does_not_disturb_training_randomness(tiny_model_path):
    from labkit.models import load_policy

    model, tokenizer = load_policy(tiny_model_path, "full")
    problems = AdditionTask().problems(4, seed=0, split="test")
    torch.manual_seed(1)
    first = evaluate_held_out(model, tokenizer, AdditionTask(), problems, samples=2, max_completion_length=8, greedy=False)
    marker = torch.rand(1)
    torch.manual_seed(1)
    again = evaluate_held_out(model, tokenizer, AdditionTask(), problems, samples=2, max_completion_length=8, greedy=False)
    assert first == again and torch.equal(marker, torch.rand(1))
    # per-problem counts for pass@k and paired tests: they add up to the accuracy
    assert len(first["right_per_problem"]) == 4 and all(0 <= c <= 2 for c in first["right_per_problem"])
    assert sum(first["right_per_problem"]) / 8 == pytest.approx(first["accuracy"])
    greedy = evaluate_held_out(model, tokenizer, AdditionTask(), problems, samples=2, max_completion_length=8)
    assert sum(greedy["greedy_right"]) / 4 == pytest.approx(greedy["greedy_accuracy"])


# ----------------------------------------------------------------------------- the nano loss is TRL's loss


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_first_step_loss_matches_trl(tiny_model_path, tmp_path, beta):
    """Feed one batch through TRL's GRPOTrainer and through the nano loop's pieces: same advantages, loss, gradients."""
    from labkit.models import load_tokenizer

    task, G = AdditionTask(), 4
    config = NanoConfig(num_prompts=2, num_generations=G, beta=beta, max_steps=1)
    trainer = trl_trainer(config, tmp_path, model=str(tiny_model_path), train_size=8)
    tokenizer = load_tokenizer(tiny_model_path)
    pairs = [(47, 38), (29, 63)]
    fixed = _teacher_rollout(tokenizer, task, pairs, G)

    def generate_fixed(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        # TRL's rows are already repeated G times; return the teacher completions in the same order.
        return [row[mask.bool()].tolist() for row, mask in zip(fixed.completion_ids, fixed.completion_mask)], None

    trainer._generate_single_turn = generate_fixed
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop, which this test skips
    inputs = [{"prompt": task.prompt(a, b), "answer": task.answer(a, b)} for a, b in pairs for _ in range(G)]
    model = trainer.model
    model.train()
    batch = trainer._generate_and_score_completions(inputs)
    assert torch.equal(batch["completion_ids"], fixed.completion_ids)

    reference = copy.deepcopy(model).eval() if beta else None
    rollout = Rollout(batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], batch["completion_mask"],
                      tokenizer.batch_decode(batch["completion_ids"], skip_special_tokens=True))
    rewards, _ = calculate_rewards(rollout.completions, [a["answer"] for a in inputs])
    advantages = group_advantages(rewards, G)
    torch.testing.assert_close(advantages, batch["advantages"])
    assert advantages.abs().sum() > 1  # a batch with signal: the test compares something

    trl_loss = trainer.compute_loss(model, batch)
    trl_loss.backward()
    trl_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    nano = rollout_loss(model, rollout, advantages, ref_model=reference, beta=beta, epsilon=config.epsilon,
                        loss_type=config.loss_type, temperature=config.temperature)
    nano.loss.backward()
    torch.testing.assert_close(nano.loss, trl_loss.detach())
    assert trl_grads
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, trl_grads[name], rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- whole runs


def test_run_nano_grpo_with_lora_reports_trainable_parameters(isolated_cache, tiny_nano):
    result = run_nano_grpo({**tiny_nano, "method": "lora", "lora_rank": 2}, progress=False)
    assert 0 < result.parameters["trainable"] < result.parameters["total"]
    assert len(result.curve("reward")) == tiny_nano["max_steps"] and result.seconds_per_step > 0
    assert 0.0 <= result.accuracy_before <= 1.0 and 0.0 <= result.accuracy_after <= 1.0
    assert [e["step"] for e in result.evals] == [0, tiny_nano["max_steps"]]
    again = run_nano_grpo({**tiny_nano, "method": "full"}, progress=False)  # reuses the cached warm-up
    assert again.warm_up_losses == result.warm_up_losses
    assert again.parameters["trainable"] == again.parameters["total"]
    with pytest.raises(ValueError):
        run_nano_grpo({**tiny_nano, "method": "qlora"}, progress=False)


def test_demo_cli_writes_summary_and_plot(isolated_cache):
    out = isolated_cache / "demo"
    code = demo_cli(["--quiet", "--seed", "3", "--sft-steps", "2", "--steps", "2", "--eval-problems", "4",
                     "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("accuracy_before", "accuracy_after", "seconds", "seed", "provenance", "config", "curve"):
        assert key in summary
    assert summary["seed"] == 3 and summary["config"]["max_steps"] == 2
    assert (out / "demo.png").stat().st_size > 1000
    # the paired statistics, recomputed from the per-problem verdicts the summary keeps
    from labkit.evaluate import mcnemar_test, pass_at_k

    before, after = summary["per_problem"]["before"], summary["per_problem"]["after"]
    assert len(before["greedy_right"]) == len(after["greedy_right"]) == 4
    test = mcnemar_test(before["greedy_right"], after["greedy_right"])
    assert summary["mcnemar"] == {"gained": test.gained, "lost": test.lost, "p_value": test.p_value, "n": 4}
    samples = summary["config"]["eval_samples"]
    assert summary["pass_at_k"]["k"] == list(range(1, samples + 1))
    assert summary["pass_at_k"]["before"][0] == pytest.approx(summary["accuracy_before"])  # pass@1 = accuracy
    assert summary["pass_at_k"]["after"][-1] == pytest.approx(
        sum(pass_at_k(samples, c, samples) for c in after["right_per_problem"]) / 4)
    assert all(a <= b + 1e-12 for a, b in zip(summary["pass_at_k"]["after"], summary["pass_at_k"]["after"][1:]))
    assert "right_per_problem" not in summary["evals"][0]


def test_completion_mask_keeps_tokens_up_to_the_first_eos():
    from labkit.nano import completion_mask

    ids = torch.tensor([[5, 6, 2, 7, 2], [5, 6, 7, 8, 9], [2, 2, 2, 2, 2]])  # EOS = 2
    assert completion_mask(ids, 2).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
