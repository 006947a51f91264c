"""Issue 14: runs that cannot go wrong silently.

Every bad value is refused by ``validate`` (so by ``train --dry-run``) with exit code 2 and one line
naming the field; secrets are never saved or printed; a finished run stays finished; one run per
folder; a damaged checkpoint is skipped for the newest intact one; the demo and the estimator check
their inputs the same way.
"""
import dataclasses
import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labkit import device as dev
from labkit.device import CARDS
from labkit.cli import demo_cli, estimate_cli, train_cli
from labkit.models import resolve_model
from labkit.presets import PresetError, get_preset
from labkit.validation import TRL_CHOICES, TRL_NUMBER_RANGES, validate
from labkit.validation import _NUMBER_FIELDS
from labkit.run import (PRESET_FILE, ResumeMismatchError, RunLock, RunLockedError, finished_run, load_saved_preset,
                        resume_checkpoint, save_preset)
from labkit.training import checkpoint_problem

CPU = dev.DeviceInfo("cpu", "x86_64 CPU (2 cores)", None, None, bf16=False, fp16=False)
TINY = get_preset("cpu-tiny", max_steps=4, save_steps=2)


def _dry_run(capsys, *args):
    code = train_cli(["--preset", "cpu-tiny", "--dry-run", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _refused(capsys, field, *args):
    code, _, err = _dry_run(capsys, *args)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("warning:")]
    assert code == 2, (args, err)
    assert len(lines) == 1 and lines[0].startswith("error:") and field in lines[0], (args, err)
    assert "Traceback" not in err
    return lines[0]


# ----------------------------------------------------------------------------- 5: every bad value, before loading


@pytest.mark.parametrize("field, args", [
    ("learning_rate", ["--set", "learning_rate=inf"]), ("learning_rate", ["--set", "learning_rate=nan"]),
    ("beta", ["--set", "beta=nan"]), ("beta", ["--set", "beta=inf"]),
    ("temperature", ["--set", "temperature=0"]), ("temperature", ["--set", "temperature=-1"]),
    ("temperature", ["--set", "temperature=nan"]),
    ("loss_type", ["--config", "loss_type=bogus"]), ("num_iterations", ["--config", "num_iterations=-1"]),
    ("num_iterations", ["--config", "num_iterations=0"]), ("epsilon", ["--config", "epsilon=-1"]),
    ("reward_weights", ["--set", "reward_weights=nan,1,1"]), ("lora_alpha", ["--set", "lora_alpha=-3"]),
    ("activation_checkpointing", ["--set", "activation_checkpointing=maybe"]),
    ("train_limit", ["--set", "train_limit=-1"]), ("train_limit", ["--train-limit", "0"]),
    ("num_generations", ["--set", "num_generations=4.5"]), ("lora_rank", ["--set", "lora_rank=abc"]),
    ("model", ["--set", "model=123"]), ("model", ["--set", "model=/nonexistent"]),
    ("target_modules", ["--set", "target_modules=nope"]), ("seed", ["--seed", "-1"]),
    ("output-dir", ["--output-dir", ""]),
])
def test_the_issues_bad_values_are_refused_by_dry_run_in_one_line(capsys, field, args):
    _refused(capsys, field, *args)


def test_an_output_dir_that_is_a_file_is_refused(capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    _refused(capsys, "is a file", "--output-dir", str(tmp_path / "f"))
    _refused(capsys, "is a file", "--output-dir", str(tmp_path / "f" / "run"))


def test_target_modules_unknown_offline_are_a_warning():
    warnings = validate(get_preset("laptop-16gb", model="someone/unknown-model", target_modules=("q_proj",),
                                   optim="adamw_torch", method="lora"), CPU)
    assert any("target_modules" in w and "unchecked" in w for w in warnings)


# ----------------------------------------------------------------------------- 5: the property


def _invalid_for(kind, low, high, low_allowed, none_allowed):
    """Return invalid words for a numeric field: wrong type, NaN, inf, negative, absurdly large, zero where refused."""
    values = ["abc", "nan", "inf", "-inf", "-1", "true", repr(high * 10)]
    if not none_allowed:
        values.append("none")
    if kind == "a whole number":
        values.append("2.5")
    if not low_allowed:
        values.append(repr(low))
    return values


_FIELDS = {name: _invalid_for(kind, low, high, kind == "a whole number" or name in ("lora_dropout",),
                             none_allowed)
           for name, (kind, low, high, none_allowed) in _NUMBER_FIELDS.items()}
_FIELDS.update({
    "activation_checkpointing": ["maybe", "1", "none", "2.5"], "precision": ["bf32", "1", "true"],
    "prepare_model_for_kbit_training": ["maybe", "1", "none", "true"],  # true: a LoRA preset, not QLoRA
    "model": ["123", "/nonexistent/x", "a/b/c", "tiny:gpt9", "none"], "method": ["dora", "1", "none"],
    "optim": ["sgd", "1", "none"], "target_modules": ["nope", "1", "q_proj,xx"], "rewards": ["vibes", "1"],
    "reward_weights": ["nan,1,1", "abc", "inf,1,1", "0,0,0", "1"], "name": ["1", "none"], "description": ["1"],
    "task": ["chess", "1", "none"], "environment": ["abacus", "1"],
    "generation": ["vllm2", "1", "none", "static"], "card": ["h100", "1", "true"],
})
_CONFIG = {name: _invalid_for(kind, low, high, low_allowed, True)
           for name, (kind, low, high, low_allowed) in TRL_NUMBER_RANGES.items()}
_CONFIG.update({name: [v for v in ("bogus", "1", "none") if v not in choices] for name, choices in TRL_CHOICES.items()})
_CONFIG.update({"mask_truncated_completions": ["maybe", "2"], "gradient_checkpointing": ["false"], "hub_token": ["hf_x"],
                "num_iteration": ["2"], "bf16": ["true"]})
_VALID = {"lora_rank": ["4", "16"], "learning_rate": ["1e-4", "0.5"], "beta": ["0", "0.04"], "temperature": ["0.7"],
          "num_generations": ["2", "8"], "max_steps": ["1", "100"], "train_limit": ["2", "none"],
          "lora_alpha": ["32", "none", "8.5"], "lora_dropout": ["0", "0.05"], "target_modules": ["q_proj,v_proj", "down_proj"],
          "activation_checkpointing": ["false", "true"], "seed": ["0", "7"], "save_steps": ["3"],
          "save_strategy": ["no", "steps"],
          "prepare_model_for_kbit_training": ["false"], "generation": ["generate", "continuous"], "card": ["none", "t4"]}
_VALID_CONFIG = {"loss_type": ["grpo", "dr_grpo"], "num_iterations": ["1", "2"], "epsilon": ["0.2", "0.1"],
                 "top_p": ["0.9", "1"], "scale_rewards": ["none", "batch"], "mask_truncated_completions": ["true"]}


@pytest.mark.parametrize("value", ["abc", "-1", "0", "nan"])
def test_a_bad_card_size_on_a_gpu_preset_is_a_value_error_not_a_crash(capsys, value):
    # Found by the property below (CI, stop 20): the dry run planned for the preset's card before checking card_gib.
    code = train_cli(["--preset", "laptop-16gb", "--dry-run", "--set", f"card_gib={value}"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "card_gib must be a number greater than 0" in err and "has a value it cannot use" in err


@pytest.mark.parametrize("field, args", [
    # Found by tests/test_fuzz.py: an int past float's range crashed math.isfinite (OverflowError, a traceback).
    ("learning_rate", ["--set", "learning_rate=1" + "0" * 400]), ("seed", ["--set", "seed=1" + "0" * 400]),
    ("reward_weights", ["--set", "reward_weights=1" + "0" * 400]),
    ("top_k", ["--config", "top_k=1" + "0" * 400]), ("max_grad_norm", ["--config", "max_grad_norm=-1" + "0" * 400]),
    # ... a steps_per_generation that is not a whole number crashed the batch rule (TypeError); 0 was accepted
    # (a generation batch of 0 completions).
    ("steps_per_generation", ["--config", "steps_per_generation=abc"]),
    ("steps_per_generation", ["--config", "steps_per_generation=0"]),
    ("steps_per_generation", ["--config", "steps_per_generation=2.5"]),
    # ... a batch too big for the prompts named only train_limit, not the field that was changed.
    ("gradient_accumulation_steps", ["--set", "gradient_accumulation_steps=4095"]),
])
def test_values_the_fuzzer_found_are_refused_in_one_line(capsys, field, args):
    _refused(capsys, field, *args)


def test_a_set_trl_options_is_refused_with_config(capsys):
    # found by tests/test_fuzz.py: train_cli merged --config into a --set trl_options that was not a dict
    _refused(capsys, "trl_options", "--set", "trl_options=1", "--config", "loss_type=grpo")


def test_repeated_set_and_config_groups_add_up(capsys, monkeypatch):
    # found by tests/test_fuzz.py: a second --set or --config group silently replaced the first
    from labkit.presets import Preset

    seen, replace = [], Preset.replace

    def recording(self, **changes):
        seen.append(changes)
        return replace(self, **changes)

    monkeypatch.setattr(Preset, "replace", recording)
    code, _, err = _dry_run(capsys, "--set", "max_steps=3", "--config", "loss_type=grpo", "--set", "save_steps=2",
                            "--config", "num_iterations=2")
    assert code == 0, err
    merged = next(c for c in seen if "loss_type" in c)
    assert (merged["max_steps"], merged["save_steps"], merged["loss_type"], merged["num_iterations"]) == (3, 2, "grpo", 2)


def test_every_preset_field_and_trl_range_is_covered_by_the_property():
    from labkit.presets import Preset

    # config: the GRPOConfig arguments, below
    assert {f.name for f in dataclasses.fields(Preset)} - set(_FIELDS) == {"config"}
    assert set(TRL_NUMBER_RANGES) | set(TRL_CHOICES) <= set(_CONFIG)


def test_the_recipe_arguments_checked_without_trl_are_judged_as_trl_would():
    """A config of the recipe's own names is checked without importing TRL: the same verdicts as with it."""
    import typing

    from trl import GRPOConfig

    from labkit.presets import RECIPE_CONFIG
    from labkit.validation import _RECIPE_BOOLS, _RECIPE_NONE, config_errors

    hints = typing.get_type_hints(GRPOConfig)
    assert set(_RECIPE_NONE) <= {k for k in RECIPE_CONFIG if type(None) in typing.get_args(hints[k])}
    assert {k for k in RECIPE_CONFIG if hints[k] is bool or set(typing.get_args(hints[k])) == {bool, type(None)}
            } - {"activation_checkpointing_kwargs"} >= set(_RECIPE_BOOLS)
    # a value refused without TRL is refused with it (an extra argument makes config_errors ask TRL)
    for key, bad in [("activation_checkpointing", "maybe"), ("save_total_limit", "x"), ("max_steps", None)]:
        alone = config_errors({**RECIPE_CONFIG, key: bad})
        asked = config_errors({**RECIPE_CONFIG, key: bad, "loss_type": "grpo"})
        assert alone and asked and alone[0] == asked[0], (key, alone, asked)


_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_SETTINGS
@given(data=st.data())
def test_property_invalid_set_values_are_refused_by_dry_run(capsys, data):
    field = data.draw(st.sampled_from(sorted(_FIELDS)), label="field")
    value = data.draw(st.sampled_from(_FIELDS[field]), label="value")
    _refused(capsys, field, "--set", f"{field}={value}")


@_SETTINGS
@given(data=st.data())
def test_property_invalid_config_values_are_refused_by_dry_run(capsys, data):
    field = data.draw(st.sampled_from(sorted(_CONFIG)), label="field")
    value = data.draw(st.sampled_from(_CONFIG[field]), label="value")
    _refused(capsys, field.rstrip("s") if field == "num_iteration" else field, "--config", f"{field}={value}")


@_SETTINGS
@given(data=st.data())
def test_property_valid_values_pass(capsys, data):
    field = data.draw(st.sampled_from(sorted(_VALID)), label="field")
    option = data.draw(st.sampled_from(_VALID[field]), label="value")
    config = data.draw(st.sampled_from(sorted(_VALID_CONFIG)), label="config")
    config_value = data.draw(st.sampled_from(_VALID_CONFIG[config]), label="config value")
    code, out, err = _dry_run(capsys, "--set", f"{field}={option}", "--config", f"{config}={config_value}")
    assert code == 0, err
    assert "preflight cpu-tiny" in out


# ----------------------------------------------------------------------------- 2: secrets


def test_a_secret_on_the_command_line_is_refused_and_never_echoed(capsys):
    line = _refused(capsys, "hub_token", "--config", "hub_token=hf_SECRETVALUE")
    assert "hf_SECRETVALUE" not in line and "HF_TOKEN" in line


def test_a_secret_from_python_is_refused_and_never_saved(tmp_path):
    preset = TINY.replace(**{"hub_token": "hf_SECRETVALUE"})
    with pytest.raises(PresetError, match="HF_TOKEN") as info:
        validate(preset, CPU)
    assert "hf_SECRETVALUE" not in str(info.value)
    save_preset(preset, tmp_path)  # a preset that skipped validate: still never written
    assert "hf_SECRETVALUE" not in (tmp_path / PRESET_FILE).read_text()
    from labkit.run import build_run

    with pytest.raises(PresetError, match="HF_TOKEN"):
        build_run(TINY, tmp_path / "run", device=CPU, hub_token="hf_SECRETVALUE")


def test_a_resume_mismatch_never_prints_a_secret(tmp_path):
    saved = TINY.replace(**{"hub_token": "hf_OLDSECRET"})
    (tmp_path / PRESET_FILE).write_text(json.dumps({"preset": saved.to_dict()}))  # an old run's file
    _checkpoint(tmp_path, 2)
    with pytest.raises(ResumeMismatchError) as info:
        resume_checkpoint(tmp_path, TINY.replace(**{"hub_token": "hf_NEWSECRET"}))
    assert "SECRET" not in str(info.value)


# ----------------------------------------------------------------------------- 4: seed and lock


def _checkpoint(folder, step, preset=TINY):
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    save_preset(preset, path)
    return path


def test_the_seed_is_part_of_the_recipe(tmp_path):
    save_preset(TINY, tmp_path)
    _checkpoint(tmp_path, 2)
    with pytest.raises(ResumeMismatchError, match="seed: checkpoint 0, now 1"):
        resume_checkpoint(tmp_path, TINY.replace(seed=1))
    assert load_saved_preset(tmp_path).config["seed"] == 0


def test_a_run_folder_is_locked_and_a_stale_lock_is_taken_over(tmp_path, capsys):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "labkit.lock").write_text(f"{child.pid}\n")
        with pytest.raises(RunLockedError, match=f"pid {child.pid}"):
            with RunLock(tmp_path):
                pass
    finally:
        child.kill()
        child.wait()
    with RunLock(tmp_path):  # the holder is dead now: taken over, with a message
        assert (tmp_path / "labkit.lock").read_text().strip() == str(os.getpid())
        with RunLock(tmp_path):  # re-entrant in one process
            pass
        assert (tmp_path / "labkit.lock").exists()
    assert not (tmp_path / "labkit.lock").exists()
    assert "taking over" in capsys.readouterr().err


# ----------------------------------------------------------------------------- 1: a finished run stays finished


def test_a_finished_run_is_reported_and_not_trained_again(tmp_path, capsys):
    save_preset(TINY, tmp_path)
    _checkpoint(tmp_path, 2)
    assert finished_run(tmp_path, TINY) is None
    _checkpoint(tmp_path, 4)
    assert "finished" in finished_run(tmp_path, TINY)
    args = ["--preset", "cpu-tiny", "--max-steps", "4", "--save-steps", "2", "--output-dir", str(tmp_path)]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert train_cli(args) == 0
    assert "is finished" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no final/, no checkpoint-5


@pytest.mark.slow
def test_rerunning_a_finished_command_changes_nothing(tmp_path, capsys):
    args = ["--preset", "cpu-tiny", "--max-steps", "2", "--save-steps", "1", "--train-limit", "8",
            "--set", "max_completion_length=8", "--output-dir", str(tmp_path)]
    assert train_cli(args) == 0
    final = tmp_path / "final" / "adapter_model.safetensors"
    stamp = final.stat().st_mtime_ns
    assert train_cli(args) == 0
    assert "is finished" in capsys.readouterr().out
    assert final.stat().st_mtime_ns == stamp and not (tmp_path / "checkpoint-3").exists()
    state = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2


# ----------------------------------------------------------------------------- 6: damaged checkpoints


@pytest.mark.parametrize("damage", ["adapter", "optimizer", "state", "recipe"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, capsys, damage):
    import torch
    from safetensors.torch import save_file

    save_preset(TINY, tmp_path)
    for step in (2, 4):
        path = _checkpoint(tmp_path, step)
        save_file({"w": torch.zeros(64, 64)}, str(path / "adapter_model.safetensors"))
        torch.save({"state": torch.zeros(64)}, path / "optimizer.pt")
    newest = tmp_path / "checkpoint-4"
    if damage == "adapter":
        data = (newest / "adapter_model.safetensors").read_bytes()
        (newest / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "optimizer":
        data = (newest / "optimizer.pt").read_bytes()
        (newest / "optimizer.pt").write_bytes(data[: len(data) // 2])
    elif damage == "state":
        (newest / "trainer_state.json").write_text('{"global_step": 4, ')
    else:
        (newest / PRESET_FILE).write_text("{not json")
    problem = checkpoint_problem(newest)
    assert problem and problem.split()[0] in ("adapter_model.safetensors", "optimizer.pt", "trainer_state.json",
                                              PRESET_FILE)
    assert checkpoint_problem(tmp_path / "checkpoint-2") is None
    assert resume_checkpoint(tmp_path, TINY) == tmp_path / "checkpoint-2"
    err = capsys.readouterr().err
    assert "skipping" in err and "checkpoint-4" in err and problem in err
    # a damaged checkpoint named explicitly: a message naming the file, not a traceback
    with pytest.raises(ResumeMismatchError, match=problem.split()[0].replace(".", r"\.")):
        resume_checkpoint(tmp_path, TINY, resume=str(newest))


def test_a_malformed_recipe_names_the_file(tmp_path):
    (tmp_path / PRESET_FILE).write_text('{"preset": {"name": "x"}}')
    with pytest.raises(ResumeMismatchError, match=PRESET_FILE):
        load_saved_preset(tmp_path)


# ----------------------------------------------------------------------------- 7: the demo's inputs


@pytest.mark.parametrize("args, option", [
    (["--steps", "0"], "--steps"), (["--steps", "-1"], "--steps"), (["--sft-steps", "-1"], "--sft-steps"),
    (["--num-generations", "1"], "--num-generations"), (["--num-generations", "0"], "--num-generations"),
    (["--eval-problems", "0"], "--eval-problems"), (["--seed", "-1"], "--seed"), (["--beta", "-1"], "--beta"),
    (["--beta", "nan"], "--beta"), (["--lr", "inf"], "--lr"),
])
def test_demo_refuses_bad_inputs_in_one_line(capsys, tmp_path, args, option):
    assert demo_cli([*args, "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {option} ") and "\n" not in err
    assert not (tmp_path / "d").exists()


def test_demo_refuses_an_out_that_is_a_file(capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    assert demo_cli(["--out", str(tmp_path / "f")]) == 2
    assert "is a file" in capsys.readouterr().err


# ----------------------------------------------------------------------------- 9: the estimator


@pytest.mark.parametrize("args, expected", [
    (["--beta", "-1"], "beta"), (["--beta", "nan"], "beta"), (["--num-generations", "1"], "num_generations"),
    (["--max-completion-length", "40000"], "context of 32768"),
])
def test_estimate_refuses_bad_settings(capsys, args, expected):
    assert estimate_cli(["--model", "Qwen/Qwen2.5-0.5B-Instruct", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and expected in err


# ----------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_during_training_says_where_to_resume(tmp_path, capsys, monkeypatch):
    import labkit.run

    save_preset(TINY, tmp_path)
    _checkpoint(tmp_path, 2)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(labkit.run, "build_run", interrupted)
    code = train_cli(["--preset", "cpu-tiny", "--max-steps", "4", "--save-steps", "2", "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err
    assert "interrupted" in err and "checkpoint-2" in err
    assert not (tmp_path / "labkit.lock").exists()  # the lock went with it


def test_full_fine_tuning_keeps_fp32_master_weights_in_every_precision():
    """Full fine-tuning loads fp32 weights under 16-bit autocast (the recipe that learns, notebook 05 section 11),
    and the estimator counts them so: 16 bytes a parameter for weights, gradients and AdamW moments."""
    import torch

    from labkit.memory import estimate
    from labkit.presets import resolve_plan
    from labkit.memory import model_shape

    ampere, t4 = CARDS["rtx3080-laptop-16gb"].device(), CARDS["t4"].device()
    for card, precision in ((ampere, "bf16"), (t4, "fp16")):
        plan = resolve_plan(get_preset("laptop-16gb", method="full", learning_rate=1e-6), card)
        assert (plan.precision, plan.weight_dtype) == (precision, torch.float32)
        assert plan.compute_dtype != torch.float32  # autocast computes in 16 bits
    lora = resolve_plan(get_preset("laptop-16gb"), ampere)
    assert lora.weight_dtype == torch.bfloat16  # a frozen base needs no master copy
    name = "Qwen/Qwen2.5-1.5B-Instruct"
    params = model_shape(name).params
    masters = estimate(name, "full", precision="bf16", optim="adamw_torch")
    pure = estimate(name, "full", precision="bf16", optim="adamw_torch", fp32_master_weights=False)
    assert masters.settings["fp32_master_weights"] and not pure.settings["fp32_master_weights"]
    per_param = (masters.bytes["weights"] + masters.bytes["gradients"] + masters.bytes["optimizer"]) / params
    assert 15.99 < per_param < 16.01
    assert 7.99 < (pure.bytes["weights"] + pure.bytes["gradients"] + pure.bytes["optimizer"]) / params < 8.01
    assert not any("rounds away" in w for w in validate(get_preset("laptop-16gb", method="full"), ampere))


# ----------------------------------------------------------------------------- a run that would train nothing


@pytest.mark.parametrize("preset, limit, needed", [("cpu-tiny", 1, 2), ("laptop-16gb", 8, 24), ("qlora-3b", 23, 24)])
def test_fewer_prompts_than_one_generation_batch_are_refused_before_loading(preset, limit, needed):
    # Found by CI at stop 27: resizing laptop-16gb to 24 x 4 left a test's 8 prompts short of one generation
    # batch, and TRL's sampler, which drops a batch that is not full, trained 0 steps with only a logged warning.
    with pytest.raises(PresetError, match=f"train_limit: {limit} training prompts give no training step") as err:
        validate(get_preset(preset, train_limit=limit), CPU)
    assert f"takes {needed} prompts" in str(err.value) and f"at least {needed}" in str(err.value)
    validate(get_preset(preset, train_limit=needed, model="tiny:qwen2"), CPU)  # one full batch is enough


def test_the_prompt_rule_is_trls_sampler():
    # the rule is TRL's own: RepeatSampler yields nothing for fewer prompts than a chunk, and all of one chunk
    from trl.trainer.utils import RepeatSampler

    from labkit.training import too_few_prompts

    for prompts, generation_batch, generations in [(8, 96, 4), (24, 96, 4), (1, 8, 4), (2, 8, 4), (3, 16, 8)]:
        sampler = RepeatSampler(list(range(prompts)), mini_repeat_count=generations,
                                batch_size=generation_batch // generations)
        assert (len(list(sampler)) == 0) == bool(too_few_prompts(prompts, generation_batch, generations))


def test_build_trainer_refuses_a_dataset_that_gives_no_step(tmp_path):
    from labkit.data import load_gsm8k
    from labkit.training import build_trainer, grpo_config

    args = grpo_config(tmp_path, device=CPU, max_steps=1, per_device_train_batch_size=8, num_generations=2)
    with pytest.raises(ValueError, match="3 training prompts give no training step: .* takes 4 prompts"):
        build_trainer("unused", [len], load_gsm8k("train", limit=3), args)


# ----------------------------------------------------------------------------- issue 55 item 8: a notebook's settings

NOTEBOOK_04_NAMES = {"model": "MODEL", "max_steps": "MAX_STEPS", "generation": "GENERATION"}  # 04's settings cell


@pytest.mark.parametrize("setting, value, expected", [
    ("MAX_STEPS", -1, "Set MAX_STEPS = VALUE in the settings cell."),
    ("MAX_STEPS", "ten", "Set MAX_STEPS = VALUE in the settings cell."),
    ("MODEL", "/no/such/folder", "Change MODEL in the settings cell."),
    ("MODEL", "tiny:gpt9", "Change MODEL in the settings cell."),
    ("GENERATION", "fast", "Change GENERATION in the settings cell."),
])
def test_a_bad_notebook_setting_is_one_line_naming_its_variable_without_a_traceback(capsys, setting, value, expected):
    """Notebook 04's cells: the settings cell, then get_preset and validate as its cell 14 calls them, in IPython."""
    from IPython.core.interactiveshell import InteractiveShell

    field = {v: k for k, v in NOTEBOOK_04_NAMES.items()}[setting]
    resolve_model(get_preset("cpu-smollm2").model)  # converted before, as notebook 04's earlier cells convert it:
    capsys.readouterr()  # a cold cache's first conversion prints its progress, which is not the message
    shell = InteractiveShell.instance()
    try:
        result = shell.run_cell(f"from labkit.presets import get_preset\nfrom labkit.validation import validate\n"
                                f"{setting} = {value!r}\npreset = get_preset('cpu-smollm2', {field}={setting})\n"
                                f"validate(preset, names={NOTEBOOK_04_NAMES!r})")
    finally:
        InteractiveShell.clear_instance()
    from labkit.text import TEXT_WIDTH

    assert isinstance(result.error_in_exec, PresetError)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    message = " ".join(" ".join(lines).split())  # the message alone, wrapped between words
    assert message == f"PresetError: {' '.join(str(result.error_in_exec).split())}", lines
    assert message.endswith(expected) and all(len(line) <= TEXT_WIDTH for line in lines), lines
    assert "--set" not in message and "Traceback" not in message and "validation.py" not in message


def test_the_command_line_keeps_its_own_wording(capsys):
    line = _refused(capsys, "max_steps", "--set", "max_steps=-1")
    assert line.endswith("Set --set max_steps=VALUE.") and "settings cell" not in line
    with pytest.raises(PresetError, match=r"Set --set max_steps=VALUE\.$"):
        validate(TINY.replace(max_steps=-1), CPU)  # names=None: the command line's terms
