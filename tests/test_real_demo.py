"""The CPU mode's real-model experiment: word problems, the short-answer reward, the preset and the demo command."""
import json
import math

import pytest

from labkit.rewards import short_answer_reward
from labkit.tasks import SHORT_ANSWER_PROMPT, WordProblems


def test_held_out_word_problems_are_fixed_and_never_trained_on():
    task = WordProblems()
    test = task.problems(200, split="test")
    assert test == WordProblems().problems(200, seed=7, split="test")  # the same whatever the seed
    held_out = {q for q, _ in test}
    for seed in (0, 1, 2):
        train = task.problems(300, seed=seed)
        assert not held_out & {q for q, _ in train}
    assert task.problems(5, seed=0) != task.problems(5, seed=1)
    with pytest.raises(ValueError, match="held-out pool has 200"):
        task.problems(201, split="test")


def test_word_problem_answers_are_right():
    for question, answer in WordProblems().problems(60, seed=3):
        numbers = [int(w) for w in question.replace(".", " ").replace("?", " ").split() if w.isdigit()]
        a, b = numbers
        expected = a + b if "more" in question else a - b if "away" in question else a * b
        assert answer == str(expected), question


def test_word_problem_prompts_carry_the_short_answer_instruction():
    row = WordProblems().dataset(2, seed=0)[0]
    assert row["prompt"][0] == {"role": "system", "content": SHORT_ANSWER_PROMPT}
    assert row["prompt"][1]["role"] == "user" and row["answer"].isdigit()


@pytest.mark.parametrize("text, reward", [
    ("Ava has 16 coins.", 1.0),
    ("16", 1.0),
    ("She has 16 coins in total now, which is lots", 1.0),  # 10 words
    ("She has 16 coins in total now, which is a lot", 0.0),  # 11 words
    ("Ava has eight coins.", 0.0),  # no number stated
    ("", 0.0),
    ("   ", 0.0),
    ("Ava has 8 bags with 2 coins each, so she has 8 * 2 = 16 coins in total.", 0.0),
])
def test_short_answer_reward(text, reward):
    assert short_answer_reward([text]) == [reward]
    assert short_answer_reward([[{"role": "assistant", "content": text}]]) == [reward]


def test_cpu_smollm2_preset_plans_on_a_cpu(capsys):
    from labkit.cli import train_cli

    assert train_cli(["--preset", "cpu-smollm2", "--dry-run"]) == 0
    out = capsys.readouterr()
    assert "cpu-smollm2" in out.out and "expect hours" not in out.err


def test_demo_refuses_a_model_no_package_ships(capsys):
    from labkit.cli import demo_cli

    assert demo_cli(["--model", "gpt-5"]) == 2
    assert "choose from smollm2-135m" in capsys.readouterr().err


def test_demo_refuses_nano_options_for_the_real_model(capsys):
    from labkit.cli import demo_cli

    assert demo_cli(["--model", "smollm2-135m", "--sft-steps", "3"]) == 2
    assert "belong to the nano task" in capsys.readouterr().err


def test_demo_refuses_a_pass_at_k_beyond_the_held_out_pool(capsys):
    from labkit.cli import demo_cli

    assert demo_cli(["--model", "smollm2-135m", "--pass-at-k", "500"]) == 2
    assert "--pass-at-k must be from 0 to 200" in capsys.readouterr().err


def test_cpu_smollm2_preset_rewards_the_stated_right_answer():
    from labkit.presets import get_preset

    from labkit.run import reward_functions

    preset = get_preset("cpu-smollm2")
    (reward, *_), _ = reward_functions(preset)  # the stated answer, right or wrong, is what the first reward pays
    assert reward(["Ava has 16 coins."], answer=["16"]) == [1.0]
    assert reward(["Ava has 61 coins."], answer=["16"]) == [0.0]
    assert preset.config["learning_rate"] > 0  # a training run, not the learning-rate-0 control


def test_held_out_table_shows_wilson_intervals_and_the_paired_test():
    from labkit.evaluate import held_out_table

    summary = {"right_before": [False] * 24, "right_after": [False] * 22 + [True, True]}
    table = held_out_table(summary)
    row = table.iloc[0]
    assert row["before"] == 0.0 and row["before 95% CI"] != "[0.000, 0.000]"  # never zero-width at 0 of 24
    assert row["problems"] == 24 and 0.0 < float(row["McNemar p"]) <= 1.0
    assert "word problems" in table.index[0]


@pytest.mark.slow
def test_real_model_demo_runs_trl_on_smollm2_and_the_control_changes_nothing(tmp_path):
    """One GRPO step with learning rate 0 through the same calls as notebook 04: real completions,
    a summary with every promised field, and an unchanged policy scores exactly as before."""
    from labkit.demo import real_model_demo

    summary = real_model_demo("smollm2-135m", tmp_path, seed=0, learning_rate=0.0, steps=1, eval_problems=4,
                              train_problems=8, progress=False, threads=1, eval_every=1)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["metric"].startswith("right answer") and (tmp_path / "demo.png").stat().st_size > 1000
    for key in ("right_number_before", "right_number_after", "short_answer_before", "short_answer_after"):
        assert 0.0 <= saved[key] <= 1.0
    assert saved["right_before"] == saved["right_after"] and saved["mean_words_before"] == saved["mean_words_after"]
    assert saved["mcnemar_p"] == 1.0 and saved["rise_points"] == 0.0  # nothing changed: nothing to test
    assert saved["steps"] == 1 and len(saved["reward_per_step"]) == 1 and math.isfinite(saved["seconds"])
    assert saved["cpu_seconds"] > 0 and len(saved["load_average_start"]) == 3 and saved["task"].startswith("one-step arithmetic word problems")
    # the learning curve is written as the run goes: the held-out rate at step 0 and after step 1
    curve = json.loads((tmp_path / "curve.json").read_text())
    assert [p["step"] for p in curve["points"]] == [0, 1] and (tmp_path / "learning_curve.png").exists()
    assert json.loads((tmp_path / "log_history.json").read_text())
    # real language, not bytes from a random model; each example keeps its question beside both replies
    for example in saved["examples"]:
        assert example["question"].endswith("?") and example["gold"].isdigit()
        text = example["before"]
        assert len(text.split()) >= 2 and sum(c.isalpha() for c in text) > len(text) / 3, text
    assert summary["provenance"]["versions"]["trl"]


def test_experiments_collect_a_demo_bench_and_a_single_run(tmp_path):
    """Every trial of the recipe search reads in one file: a 3-seed bench with its control, or one run's summary."""
    from bench.smollm2_experiments import main

    keys = ("right_number_before", "right_number_after", "rise_points", "mcnemar_p", "gained", "lost",
            "short_answer_before", "short_answer_after", "last_number_before", "last_number_after", "mean_words_before",
            "mean_words_after", "seconds", "cpu_seconds", "seconds_detail", "load_average_start", "load_average_end",
            "threads", "reward_per_step", "reward_std_per_step", "mean_length_per_step", "examples")
    preset = {"learning_rate": 1e-3, "max_steps": 24, "per_device_train_batch_size": 16, "num_generations": 8,
              "max_completion_length": 24, "rewards": ["right_answer"], "reward_weights": None, "temperature": 1.0,
              "beta": 0.0, "trl_options": {}}
    run = {"seed": 0, "right_before": [True, False], **{k: 0.5 for k in keys}}
    provenance = {"date": "2026-11-24"}
    summary = {**run, "preset": preset, "command": "python -m labkit demo --model smollm2-135m",
               "system_prompt": "short", "provenance": provenance}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    bench = {"preset": preset, "runs": [run, {**run, "seed": 1}], "control_lr0": [{**run, "rise_points": 0.0}],
             "command": "python -m bench smollm2-demo", "provenance": provenance}
    (tmp_path / "demo.json").write_text(json.dumps(bench))
    assert main(["--collect", str(tmp_path / "summary.json"), "--name", "two-prompts", "--out", str(tmp_path)]) == 0
    assert main(["--collect", str(tmp_path / "demo.json"), "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "smollm2_experiments.json").read_text())
    assert [(r["name"], r["seed"]) for r in records] == [("two-prompts", 0), ("chosen-recipe", 0), ("chosen-recipe", 1),
                                                         ("chosen-recipe-lr0-control", 0)]
    assert records[0]["settings"]["prompts_per_step"] == 2 and records[3]["settings"]["learning_rate"] == 0.0
    from bench.smollm2_experiments import prompts_per_step

    # the chosen recipe in micro-batches (4 completions x 8 accumulation steps, G = 8): 4 prompts a step, not 4 // 8
    assert prompts_per_step({**preset, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 8}) == 4
