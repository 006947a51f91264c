"""Presets: every one validates on its card, every bad combination fails early and says what to change."""
import json
import math

import pytest

from labkit import device as dev
from labkit.device import CARDS
from labkit.oom import preflight
from labkit.presets import PRESETS, Preset, PresetError, get_preset
from labkit.validation import validate
from labkit.run import build_run, reward_functions, training_prompts

LAPTOP = CARDS["rtx3080-laptop-16gb"].device()
T4 = CARDS["t4"].device()
CPU = dev.DeviceInfo("cpu", "x86_64 CPU (2 cores)", None, None, bf16=False, fp16=False)
SMALL_CAP = 4.0  # GiB: a cap below every card of labkit.device.CARDS, so that preflight has to plan
MPS = dev.DeviceInfo("mps", "Apple arm64", None, None, bf16=False, fp16=False)
CARDS = {"laptop-16gb": LAPTOP, "laptop-16gb-published": LAPTOP, "colab-t4": T4, "qlora-3b": LAPTOP, "cpu-tiny": CPU, "cpu-smollm2": CPU, "cpu-tools": CPU, "workshop": T4,
         "tools-16gb": LAPTOP}


def test_every_preset_has_a_card_to_validate_on():
    assert set(CARDS) == set(PRESETS)


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_validates_on_its_card(name):
    assert validate(PRESETS[name], CARDS[name]) == []


def test_the_published_laptop_recipe_keeps_its_own_name_and_laptop_16gb_differs_only_in_its_batch():
    p = PRESETS["laptop-16gb-published"]
    # the published recipe's own figures (docs/references.md, "The 16 GB laptop recipe"): a pin to a source outside
    # this repository, which the preset must keep; the behaviour is in the replace(...) == p line below
    assert (p.config["per_device_train_batch_size"], p.config["gradient_accumulation_steps"], p.config["num_generations"]) == (1, 4, 4)
    assert (p.max_prompt_length, p.config["max_completion_length"]) == (256, 786)
    assert set(p.target_modules) == {"q_proj", "k_proj", "o_proj", "up_proj", "down_proj"}
    assert p.config["optim"] == "adamw_bnb_8bit" and p.config["activation_checkpointing"] and p.method == "lora"
    sized = PRESETS["laptop-16gb"]
    assert sized.config["per_device_train_batch_size"] > 1
    assert sized.replace(name=p.name, description=p.description, per_device_train_batch_size=1) == p
    assert PRESETS["qlora-3b"].method == "qlora" and "3B" in PRESETS["qlora-3b"].model


def test_sized_presets_are_the_largest_batch_their_recorded_rehearsal_fits_in_80_percent_of_the_card():
    """results/rehearsal.csv (python -m bench rehearsal) holds each sized preset at its current size,
    fitting with the allowance of labkit.device.sized_gib, and one step up (sizing rows) not fitting."""
    import csv
    from pathlib import Path

    from bench.rehearsal import SIZED
    from labkit.device import SIZING_TARGET, sizing_fits

    path = Path(__file__).resolve().parents[1] / "results" / "rehearsal.csv"
    rows = {r["name"]: r for r in csv.DictReader(path.open()) if r["status"] == "ok"}
    keys = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
            "max_prompt_length", "max_completion_length", "optim", "model", "method")
    for name in SIZED:
        p = PRESETS[name]
        row = rows[name]
        recipe = {**p.to_dict(), **p.config}
        assert {k: row[k] for k in keys} == {k: str(recipe[k]) for k in keys}, (name, "rehearse it again")
        assert float(row["card_gib"]) == p.card_gib and p.config["per_device_train_batch_size"] % p.config["num_generations"] == 0
        assert sizing_fits(float(row["rehearsed_peak_gib"]), p.card_gib), name
        assert float(row["sized_fraction_of_card"]) <= SIZING_TARGET, name
        step = p.config["per_device_train_batch_size"] + p.config["num_generations"]
        bigger = rows[f"{name}-batch{step}"]
        assert int(bigger["per_device_train_batch_size"]) == step
        assert not sizing_fits(float(bigger["rehearsed_peak_gib"]), p.card_gib), (name, step)
    assert int(rows["laptop-16gb-published"]["per_device_train_batch_size"]) == 1


def test_a_preset_round_trips_through_json():
    p = get_preset("laptop-16gb", target_modules=["q_proj", "v_proj"], max_steps=7, loss_type="grpo", num_iterations=2)
    assert Preset.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert p.config["num_iterations"] == 2 and p.config["learning_rate"] == 2e-4  # the recipe's, with the changes
    assert p.target_modules == ("q_proj", "v_proj")
    assert validate(p, LAPTOP) is not None  # real GRPOConfig fields, not set by the preset: accepted


def test_a_recipe_saved_before_the_config_dict_loads_as_the_same_preset():
    """labkit before ``Preset.config`` saved the GRPOConfig arguments as fields, others in ``trl_options``,
    ``gradient_checkpointing`` under that name, ``save_steps=None`` for no checkpoints, and
    ``max_tool_calling_iterations=None`` without tools: a resume still reads such a file as the preset it was."""
    now = get_preset("cpu-tools", loss_type="grpo")
    old = {k: v for k, v in now.to_dict().items() if k != "config"}
    old.update({k: v for k, v in now.config.items()
                if k not in ("activation_checkpointing", "activation_checkpointing_kwargs", "save_strategy",
                             "save_steps", "loss_type")},
               gradient_checkpointing=False, save_steps=None, trl_options={"loss_type": "grpo"})
    assert Preset.from_dict(old) == now
    no_tools = {**old, "environment": None, "max_tool_calling_iterations": None}
    assert "max_tool_calling_iterations" not in Preset.from_dict(no_tools).config


# ----------------------------------------------------------------------------- bad combinations


@pytest.mark.parametrize("overrides, device, expected", [
    # TRL needs each prompt's G completions in one generation batch
    (dict(per_device_train_batch_size=1, gradient_accumulation_steps=3), LAPTOP, r"multiple of num_generations \(4\).*gradient_accumulation_steps=4"),
    (dict(per_device_train_batch_size=2, gradient_accumulation_steps=1, num_generations=8), LAPTOP,
     r"gradient_accumulation_steps=4"),
    (dict(num_generations=1), LAPTOP, r"num_generations must be at least 2"),
    # prompt + completion beyond the model's context (Qwen2.5: 32,768)
    (dict(max_completion_length=32_600), LAPTOP, r"context of 32768.*max_completion_length to at most 32512"),
    # precision the card cannot do
    (dict(precision="bf16"), T4, r"no bf16 support.*precision='fp16'"),
    (dict(precision="fp16"), CPU, r"cannot train in fp16"),
    # bitsandbytes 0.50's 8-bit optimisers run on CUDA and the CPU, not on Apple's MPS (its 4-bit weights do)
    (dict(), MPS, r"optim='paged_adamw_8bit' \(bitsandbytes' 8-bit AdamW\) has no kernel for mps.*optim='adamw_torch'"),
    (dict(method="lora"), MPS, r"optim='paged_adamw_8bit' \(bitsandbytes' 8-bit AdamW\).*optim='adamw_torch'"),
    (dict(method="lora", prepare_model_for_kbit_training=True), LAPTOP, r"method='qlora'\) only"),
    (dict(prepare_model_for_kbit_training="yes"), LAPTOP, r"prepare_model_for_kbit_training must be true or false"),
    (dict(method="dora"), LAPTOP, r"'full', 'lora' or 'qlora'"),
    (dict(optim="sgd"), LAPTOP, r"optim must be one of"),
    (dict(rewards=("accuracy", "vibes")), LAPTOP, r"unknown reward 'vibes'"),
    (dict(reward_weights=(1.0,)), LAPTOP, r"reward_weights has 1 values for 3 reward functions"),
    # other GRPOConfig arguments: only real ones, and none that the lab sets from another field
    (dict(loss_typ="grpo"), LAPTOP, r"no argument 'loss_typ'.*Did you mean 'loss_type'"),
    (dict(gradient_checkpointing=False), LAPTOP, r"may not set 'gradient_checkpointing'.*activation_checkpointing"),
    (dict(generation_batch_size=8), LAPTOP, r"may not set 'generation_batch_size'.*steps_per_generation"),
    # steps_per_generation may be set (the generation batch), but it must hold whole groups, as TRL says
    (dict(per_device_train_batch_size=1, steps_per_generation=3), LAPTOP, r"generation_batch_size \(3\) must be divisible by num_generations"),
    (dict(bf16=True), T4, r"may not set 'bf16'.*from precision"),
])
def test_bad_combinations_fail_with_what_to_change(overrides, device, expected):
    preset = get_preset("qlora-3b", **overrides)
    with pytest.raises(PresetError, match=expected):
        validate(preset, device)


def test_qlora_on_mps_is_allowed_with_a_warning():
    """bitsandbytes 0.50.2 registers its 4-bit kernels for MPS (backends/mps/ops.py), not its 8-bit optimiser."""
    warnings = validate(get_preset("qlora-3b", optim="adamw_torch"), MPS)
    assert any("QLoRA on Apple's MPS" in w and "not run it on a Mac" in w for w in warnings)


def test_tiny_context_is_checked_too():
    with pytest.raises(PresetError, match=r"context of 2048.*at most 1536"):
        validate(get_preset("cpu-tiny", max_completion_length=4000), CPU)


def test_config_refuses_every_argument_the_lab_sets_from_another_field():
    """What build_run passes beyond the preset's config (the generation path's fields, the reward weights, the
    precision, how the model loads) has one source: a config that sets it too is refused, naming the source."""
    from labkit.presets import grpo_arguments
    from labkit.validation import config_errors

    preset = PRESETS["laptop-16gb"].replace(generation="static-compiled")
    elsewhere = set(grpo_arguments(preset)) - set(preset.config)
    assert elsewhere, "the generation path sets arguments of its own"
    for key in elsewhere | {"reward_weights", "model_init_kwargs", "bf16", "fp16", "gradient_checkpointing"}:
        assert any(f"may not set {key!r}" in e for e in config_errors({**preset.config, key: None})), key
    assert config_errors(preset.config) == []


def test_unknown_preset_and_field():
    with pytest.raises(PresetError, match="choose from"):
        get_preset("desktop-4090")
    misspelt = get_preset("cpu-tiny", num_generation=4)  # not a preset field: a GRPOConfig argument, checked by TRL's names
    with pytest.raises(PresetError, match="has no argument 'num_generation'. Did you mean 'num_generations'"):
        validate(misspelt, CPU)


@pytest.mark.parametrize("processes", [1, 2])
def test_batch_rule_agrees_with_trl(tmp_path, processes):
    """validate() refuses exactly the (batch, accumulation, G) that GRPOConfig itself refuses."""
    from trl import GRPOConfig

    checked = 0
    for batch in (1, 2, 3, 4):
        for accumulation in (1, 2, 3, 4):
            for generations in (2, 3, 4, 8):
                preset = get_preset("cpu-tiny", per_device_train_batch_size=batch,
                                    gradient_accumulation_steps=accumulation, num_generations=generations)
                try:
                    validate(preset, CPU, num_processes=processes)
                    ours = True
                except PresetError:
                    ours = False
                if processes == 1:
                    try:
                        GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=batch,
                                   gradient_accumulation_steps=accumulation, num_generations=generations,
                                   use_cpu=True, bf16=False, report_to="none")
                        theirs = True
                    except ValueError:
                        theirs = False
                else:  # TRL's rule with world_size processes: (batch x processes x accumulation) % G == 0
                    theirs = (batch * processes * accumulation) % generations == 0
                assert ours == theirs, (batch, accumulation, generations, processes)
                checked += 1
    assert checked == 64


# ----------------------------------------------------------------------------- preflight


def test_preflight_agrees_with_the_memory_estimate():
    from labkit.memory import estimate

    report = preflight("laptop-16gb-published", LAPTOP)
    direct = estimate("Qwen/Qwen2.5-1.5B-Instruct", "lora", num_generations=4, per_device_train_batch_size=1,
                      gradient_accumulation_steps=4, max_prompt_length=256, max_completion_length=786,
                      optim="adamw_bnb_8bit",
                      gradient_checkpointing=True, beta=0.0, precision="bf16", lora_rank=16,
                      lora_targets=list(PRESETS["laptop-16gb-published"].target_modules),
                      padded=True)  # TRL always passes a padding mask (the plan's estimate, as the rehearsal runs)
    assert math.isclose(report.estimate_gib, direct.total, rel_tol=1e-9)
    assert report.fits is True and report.changes == []
    assert "fits" in str(report)


@pytest.mark.parametrize("name", ["laptop-16gb", "colab-t4", "qlora-3b", "workshop", "cpu-tiny"])
def test_preflight_is_unchanged_when_only_num_generations_changes(name):
    """TRL 1.16: G groups a generation batch of per_device_train_batch_size x steps_per_generation completions."""
    preset = get_preset(name, per_device_train_batch_size=8, gradient_accumulation_steps=2)
    reports = [preflight(preset.replace(num_generations=g), LAPTOP) for g in (2, 4, 8, 16)]
    assert all(r.estimate_gib == reports[0].estimate_gib and r.breakdown == reports[0].breakdown for r in reports)


def test_steps_per_generation_sets_the_generation_batch_of_a_preset():
    preset = get_preset("laptop-16gb", per_device_train_batch_size=4, gradient_accumulation_steps=4)
    fewer = preset.replace(steps_per_generation=1)
    assert (preset.generation_batch_size, fewer.generation_batch_size) == (16, 4)
    assert fewer.config == {**preset.config, "steps_per_generation": 1} and validate(fewer, LAPTOP) == []
    assert preflight(fewer, LAPTOP).breakdown["kv_cache"] < preflight(preset, LAPTOP).breakdown["kv_cache"]


def test_preflight_that_does_not_fit_plans_changes_until_it_fits():
    # full fine-tuning with TRL 1.16's batch defaults (8 completions of 512 tokens) and no checkpointing
    preset = get_preset("laptop-16gb", method="full", per_device_train_batch_size=8, gradient_accumulation_steps=1,
                        num_generations=8, max_completion_length=512, optim="adamw_torch",
                        activation_checkpointing=False)
    report = preflight(preset, LAPTOP, card_gib=SMALL_CAP)
    assert report.fits is False
    afters = [after for change, after in report.changes if change.kind != "model"]
    assert afters == sorted(afters) and all(after < report.estimate_gib for _, after in report.changes)
    # fp32 master weights, gradients and AdamW moments (16 bytes a parameter) dominate: LoRA cuts most, then
    # checkpointing (the activations)
    assert [change.kind for change, _ in report.changes[:2]] == ["method", "checkpointing"]
    plan = [after for _, after in report.plan]
    assert plan == sorted(plan, reverse=True) and plan[-1] + report.margin_gib <= SMALL_CAP < plan[-2] + report.margin_gib
    # each plan step is the estimate of all the changes so far, applied together
    applied = preset
    for change, _ in report.plan:
        applied = applied.replace(**change.updates)
    assert math.isclose(preflight(applied, LAPTOP, card_gib=SMALL_CAP).estimate_gib, plan[-1])
    assert preflight(applied, LAPTOP, card_gib=SMALL_CAP).fits
    text = str(report)
    assert "does NOT fit" in text and "until it fits" in text and "activation_checkpointing False -> True" in text


def test_preflight_without_a_gpu_has_nothing_to_compare():
    report = preflight("cpu-tiny", CPU)
    assert report.fits is None and report.estimate_gib > 0


# ----------------------------------------------------------------------------- prompts and rewards


def test_prompts_over_the_limit_are_dropped_and_counted():
    from labkit.models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    preset = get_preset("cpu-tiny", max_prompt_length=400, train_limit=40)
    kept, dropped = training_prompts(preset, tokenizer)
    assert len(kept) == 40 and dropped > 0
    assert max(kept["prompt_length"]) <= 400
    # brute force over the same (shuffled) order: the first 40 short-enough prompts, and the drops among them
    from labkit.data import load_gsm8k

    rows = load_gsm8k("train", seed=0).select(range(200))
    lengths = [len(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"]) for p in rows["prompt"]]
    short = [i for i, n in enumerate(lengths) if n <= 400][:40]
    assert kept["question"] == [rows[i]["question"] for i in short]
    assert dropped == short[-1] + 1 - 40


def test_default_rewards_are_labkits_gsm8k_set():
    from labkit.rewards import gsm8k_rewards

    funcs, weights = reward_functions(PRESETS["laptop-16gb"])
    assert (funcs, weights) == tuple(map(list, gsm8k_rewards()))
    funcs, weights = reward_functions(get_preset("cpu-tiny", rewards=("accuracy", "format"), reward_weights=(1, 0.5)))
    assert [f.__name__ for f in funcs] == ["accuracy_reward", "format_reward"] and weights == [1.0, 0.5]


# ----------------------------------------------------------------------------- the run and the command


@pytest.mark.slow
def test_run_config_carries_the_preset(tmp_path):
    preset = get_preset("cpu-tiny", train_limit=8, save_steps=3)
    run = build_run(preset, tmp_path, device=CPU, disable_tqdm=True)
    args = run.trainer.args
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.num_generations) == (4, 2, 4)
    assert args.max_completion_length == 32 and args.generation_batch_size == 8
    assert args.activation_checkpointing is True and args.save_steps == 3
    assert args.bf16 is False and args.fp16 is False
    assert args.reward_weights == [1.0, 0.5, 0.25]
    assert hasattr(run.model, "peft_config") and run.model.peft_config["default"].r == 8
    assert args.loss_type == "dapo"  # TRL's default, until the preset's config says otherwise:
    other = build_run(preset.replace(**{"loss_type": "grpo", "epsilon_high": 0.28}), tmp_path / "b",
                      device=CPU, disable_tqdm=True)
    assert (other.trainer.args.loss_type, other.trainer.args.epsilon_high) == ("grpo", 0.28)


@pytest.mark.slow
def test_train_command_trains_saves_and_refuses_a_changed_recipe(tmp_path, capsys):
    from labkit.cli import train_cli

    out = tmp_path / "run"
    common = ["--preset", "cpu-tiny", "--output-dir", str(out), "--train-limit", "8", "--save-steps", "1"]
    assert train_cli(common + ["--max-steps", "2", "--set", "max_completion_length=8"]) == 0
    assert (out / "final" / "adapter_model.safetensors").exists()
    assert (out / "checkpoint-2" / "labkit_preset.json").exists()
    # same recipe, same command: checkpoint-2 reached max_steps, so the run is finished and nothing changes
    assert train_cli(common + ["--max-steps", "2", "--set", "max_completion_length=8"]) == 0
    assert "is finished" in capsys.readouterr().out
    # another recipe in the same folder: a clear error, exit code 2
    assert train_cli(common + ["--max-steps", "2", "--set", "max_completion_length=16"]) == 2
    assert "max_completion_length: checkpoint 8, now 16" in capsys.readouterr().err
    # so does a changed GRPOConfig option: it is part of the saved recipe
    assert train_cli(common + ["--max-steps", "2", "--set", "max_completion_length=8",
                               "--config", "loss_type=grpo"]) == 2
    assert "loss_type: checkpoint None, now 'grpo'" in capsys.readouterr().err


def test_train_command_dry_run_and_bad_preset(capsys):
    from labkit.cli import train_cli

    assert train_cli(["--preset", "cpu-tiny", "--dry-run"]) == 0
    assert "preflight cpu-tiny" in capsys.readouterr().out
    assert train_cli(["--preset", "cpu-tiny", "--dry-run", "--set", "num_generations=3"]) == 2
    assert "gradient_accumulation_steps=3" in capsys.readouterr().err
    assert train_cli(["--list"]) == 0
    assert train_cli(["--preset", "cpu-tiny", "--dry-run", "--config", "loss_type=grpo", "num_iterations=2"]) == 0
    assert train_cli(["--preset", "cpu-tiny", "--dry-run", "--config", "num_iteration=2"]) == 2
    assert "no argument 'num_iteration'. Did you mean 'num_iterations'" in capsys.readouterr().err
    assert train_cli(["--preset", "cpu-tiny", "--dry-run", "--config", "loss_type"]) == 2
    assert "--config takes KEY=VALUE" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_smoke_on_cpu_forces_full_length_completions(tmp_path, decided_outside_a_plan):
    from bench.preset import main as bench_preset_cli

    assert bench_preset_cli(["--preset", "cpu-tiny", "--steps", "2", "--results", str(tmp_path)]) == 0
    # bench.preset runs on a GPU in practice, and this CPU run is the same code: it reads the precision and its dtypes
    # from the plans it resolves (the preset's, then its stand-in model's), never decides them by itself
    assert not decided_outside_a_plan
    import json

    record = json.loads((tmp_path / "preset_cpu-tiny.json").read_text())
    assert record["steps_done"] == 2 and record["seconds_per_step"] > 0
    assert record["completion_mean_length"] == PRESETS["cpu-tiny"].config["max_completion_length"]
    assert record["peak_allocated_gib"] is None and "no CUDA" in record["note"]
    assert record["provenance"]["versions"]["trl"]
    assert (tmp_path / "presets.csv").read_text().count("\n") == 2


# ----------------------------------------------------------------------------- bitsandbytes on CPU, QLoRA dtypes


def test_qlora_and_8bit_adamw_are_accepted_on_cpu():
    # bitsandbytes 0.50 runs NF4 weights and 8-bit AdamW on a CPU: the real presets' recipes validate there.
    assert validate(get_preset("qlora-3b"), CPU) is not None
    assert validate(get_preset("laptop-16gb"), CPU) is not None
    assert validate(get_preset("colab-t4", model="smollm2-135m"), CPU) == []


def test_qlora_adapters_train_in_a_dtype_the_precision_supports(tmp_path):
    """TRL 1.16 casts a 4-bit model's adapters to bf16; under fp16 AMP (a T4) the grad scaler then fails."""
    import torch

    from labkit.models import adapter_dtype, match_adapter_dtype

    assert adapter_dtype("fp16") == torch.float32 and adapter_dtype("fp32") == torch.float32
    assert adapter_dtype("bf16") == torch.bfloat16
    preset = get_preset("cpu-tiny", method="qlora", optim="adamw_bnb_8bit", train_limit=8, max_steps=1,
                        save_strategy="no")
    run = build_run(preset, tmp_path, device=CPU, disable_tqdm=True)
    assert run.model.is_loaded_in_4bit
    trainable = {name: p.dtype for name, p in run.model.named_parameters() if p.requires_grad}
    assert trainable and set(trainable.values()) == {torch.float32}, trainable
    # What TRL does on its own (the reason for the cast), and what a T4 needs:
    for p in run.model.parameters():
        if p.requires_grad:
            p.data = p.data.to(torch.bfloat16)
    assert match_adapter_dtype(run.model, "fp16") == len(trainable)
    assert {p.dtype for p in run.model.parameters() if p.requires_grad} == {torch.float32}
    run.train()  # a real step: 4-bit base, fp32 adapters, bitsandbytes' 8-bit AdamW, all on the CPU
    assert run.trainer.state.global_step == 1


# ----------------------------------------------------------------------------- caps and card sizes

GIB = 1024**3
# total_memory as PyTorch reports it: a Linux 16 GB card, a Windows 16 GB laptop card, a T4 (two drivers).
REPORTED = {"16 GB (Linux)": 16_374 * 1024**2, "16 GB laptop (Windows)": 16_077 * 1024**2,
            "T4": 15_102 * 1024**2, "T4 (older driver)": 15_095 * 1024**2,
            "16 GB, a little less": 16_000 * 1024**2}  # below card_gib: the default cap falls back to the card


@pytest.mark.parametrize("card", REPORTED)
def test_every_gpu_presets_card_and_default_cap_fit_the_card_it_names(card, monkeypatch):
    import torch

    from bench import preset as bench

    total = REPORTED[card]
    names = ["colab-t4"] if card.startswith("T4") else ["laptop-16gb", "qlora-3b"]
    for name in names:
        if "less" not in card:
            assert PRESETS[name].card_gib * GIB <= total, (name, card)
            assert 0 < bench.card_cap_fraction(PRESETS[name].card_gib, total) <= 1
    # The command's default cap on a mocked card of that size: the preset's card, applied without an error.
    applied = []

    class Props:
        total_memory = total

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f: applied.append(f))
    monkeypatch.setattr(bench, "_random_weights_model", stop)  # stop before anything loads
    device = T4 if card.startswith("T4") else LAPTOP
    for name in names:
        with pytest.raises(Stop):
            bench.bench_preset(name, device=device)
    assert len(applied) == len(names) and all(0 < f <= 1 for f in applied)
    # An explicit 16 GiB cap on a card that reports less is refused, naming the card's figure.
    with pytest.raises(ValueError, match=r"more than this card's .* GiB .*leave --cap-gib out"):
        bench.card_cap_fraction(16.0, total)


# ----------------------------------------------------------------------------- planning a GPU run without a GPU


@pytest.mark.parametrize("name, card, precision", [("laptop-16gb", "RTX 3080 Laptop", "bf16"),
                                                   ("colab-t4", "Tesla T4", "fp16"),
                                                   ("qlora-3b", "RTX 3080 Laptop", "bf16")])
def test_dry_run_of_a_gpu_preset_without_a_gpu_plans_for_the_presets_card(name, card, precision, capsys,
                                                                          monkeypatch):
    from labkit import cli
    from labkit.presets import card_device

    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    device = card_device(name)
    assert device.kind == "cuda" and card in device.name and device.total_memory_gib == PRESETS[name].card_gib
    assert dev.choose_precision(device) == precision
    assert cli.train_cli(["--preset", name, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"planning for the preset's card, cuda: {device.name}" in out
    assert f"{device.name}, {PRESETS[name].card_gib:.1f} GiB" in out and "fits" in out
    # and what cannot work on that card still fails, as it would there
    assert cli.train_cli(["--preset", name, "--dry-run", "--set", "precision=bf16"]) == (2 if precision == "fp16" else 0)


def _gpu_commands(repo_root):
    """Every ``python -m labkit train`` and ``python -m bench memory`` command line in the README and notebooks 04-07."""
    import json as _json
    import re as _re
    import shlex

    texts = [(repo_root / "README.md").read_text()]
    for path in sorted((repo_root / "notebooks").glob("0[4-7]_*.ipynb")):
        texts += ["".join(c["source"]) for c in _json.loads(path.read_text())["cells"]]
    found = []
    for text in texts:
        for line in _re.findall(r"(?:accelerate launch[^`\n]*?-m labkit|python -m labkit|python -m) (train[^`\n#\"]*|bench memory[^`\n#\"]*)",
                                text):
            words = shlex.split(line.replace("\\n", " "))
            if not any(w.isupper() and w.isalpha() for w in words):  # "--preset NAME": a placeholder, not a command
                found.append(words)
    return found


def test_the_gpu_commands_of_the_readme_and_notebooks_dry_run_here(repo_root, capsys, monkeypatch):
    from labkit import cli
    from bench import memory as bench_memory

    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    commands = _gpu_commands(repo_root)
    trains = [c for c in commands if c[0] == "train" and "--preset" in c]
    assert len(trains) >= 3 and any(c[0:2] == ["bench", "memory"] for c in commands)
    import importlib.util

    for command in commands:
        if command[0] == "train" and "--preset" in command and "generation=vllm" in command \
                and importlib.util.find_spec("vllm") is None:  # vLLM is taught, never installed here
            capsys.readouterr()
            assert cli.train_cli([*command[1:], "--dry-run"]) == 2, command
            refusal = capsys.readouterr().err
            assert "vLLM is not installed" in refusal and refusal.count("\n- ") == 0, (command, refusal)
        elif command[0] == "train" and "--preset" in command:
            assert cli.train_cli([*command[1:], "--dry-run"]) == 0, command
        elif command[0:2] == ["bench", "memory"]:
            assert bench_memory.main([*command[2:], "--dry-run"]) == 0, command
    capsys.readouterr()
