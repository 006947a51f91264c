"""One plan per preset (labkit.presets.resolve_plan): resolved once, read by build_run, preflight, train --dry-run, the
estimator and the rehearsal; the precision decided in one place; the walk from build_run does not climb back.
"""
import ast
from pathlib import Path

import pytest
import torch

import labkit.device as dev
from labkit.oom import estimate, preflight
from labkit.presets import Plan, card_device, get_preset, resolve_plan

PACKAGE = Path(__file__).resolve().parents[1] / "labkit"
CPU = dev.DeviceInfo("cpu", "x86_64 CPU (2 cores)", None, None, bf16=False, fp16=False)


def test_a_plan_says_everything_a_run_needs():
    plan = resolve_plan("qlora-3b")
    assert isinstance(plan, Plan) and plan.card.name == card_device("qlora-3b").name
    assert plan.precision == "bf16" and plan.compute_dtype == torch.bfloat16
    # the libraries' own objects, as GRPOTrainer is handed them
    assert plan.quantization_config.bnb_4bit_quant_type == "nf4" and plan.quantization_config.load_in_4bit
    assert plan.quantization_config.bnb_4bit_compute_dtype == torch.bfloat16
    assert (plan.peft_config.r, plan.peft_config.lora_alpha, plan.peft_config.lora_dropout) == (16, 32, 0.05)
    assert set(plan.peft_config.target_modules) == set(get_preset("qlora-3b").target_modules)
    assert plan.model_init_kwargs == {"dtype": "bfloat16"}
    assert resolve_plan("laptop-16gb").quantization_config is None
    assert resolve_plan(get_preset("laptop-16gb", method="full")).peft_config is None
    assert plan.shape.num_layers == 36
    t4 = resolve_plan("colab-t4")
    assert (t4.precision, t4.weight_dtype, dev.precision_flags(t4.precision)) == ("fp16", torch.float16,
                                                                                  {"bf16": False, "fp16": True})
    assert resolve_plan("cpu-tiny").precision == "fp32"  # a CPU preset trains in fp32


@pytest.mark.parametrize("name, changes", [("qlora-3b", {}), ("tools-16gb", {}), ("cpu-tiny", {}),
                                           ("laptop-16gb", dict(steps_per_generation=2)),
                                           ("cpu-tiny", dict(steps_per_generation=1, gradient_accumulation_steps=4))])
def test_a_plans_generation_batch_is_what_grpo_config_resolves(name, changes, tmp_path):
    from trl import GRPOConfig

    plan = resolve_plan(name, **changes)
    batch = {k: plan.config[k] for k in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                         "steps_per_generation", "num_generations") if k in plan.config}
    config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **batch)
    assert (plan.preset.generation_batch_size, plan.preset.steps_per_generation) == (config.generation_batch_size,
                                                                       config.steps_per_generation)


def test_preflight_dry_run_estimator_and_rehearsal_read_the_same_plan():
    plan = resolve_plan("colab-t4")
    report = preflight(plan)
    assert report.estimate_gib == pytest.approx(estimate(plan).total)
    from labkit.device import CARDS

    assert report.card_gib == pytest.approx(CARDS["t4"].gib)
    # planning from a CPU gives the same figures as the plan of the preset's card (fp16 on a T4, not bf16)
    assert preflight("colab-t4", CPU).estimate_gib == pytest.approx(report.estimate_gib)
    assert estimate(plan).settings["precision"] == "fp16"


@pytest.mark.slow
def test_build_run_takes_a_plan(tmp_path):
    from labkit.run import build_run

    plan = resolve_plan(get_preset("cpu-tiny", train_limit=8, lora_dropout=0.0), CPU)
    run = build_run(plan, tmp_path, disable_tqdm=True)
    args = run.trainer.args
    assert (args.bf16, args.fp16) == (False, False)
    assert args.generation_batch_size == plan.preset.generation_batch_size
    adapter = run.model.peft_config["default"]
    assert (adapter.r, adapter.lora_dropout) == (plan.peft_config.r, 0.0)  # the preset's dropout, not PEFT's 0.05
    assert not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in run.model.modules())


RESOLVED_ONCE = {"labkit.models": ("resolve_model", "check_method"), "labkit.device": ("choose_precision",),
                 "labkit.memory": ("model_shape",)}


@pytest.fixture
def resolve_calls(monkeypatch):
    """Count the calls of the functions that decide a recipe's model path, method, precision and shape, wherever a
    labkit module imported them from."""
    from collections import Counter

    from conftest import replace_everywhere

    counts = Counter()

    def counting(name):
        def wrap(original):
            def counted(*args, **kwargs):
                counts[name] += 1
                return original(*args, **kwargs)
            return counted
        return wrap

    for home, names in RESOLVED_ONCE.items():
        for name in names:
            replace_everywhere(monkeypatch, home, name, counting(name), packages=("labkit",))
    return counts


@pytest.mark.parametrize("name", sorted(__import__("labkit.presets", fromlist=["PRESETS"]).PRESETS))
def test_checking_a_preset_on_its_card_resolves_it_once(name, resolve_calls):
    from labkit.validation import checked_plan

    try:
        plan, _ = checked_plan(get_preset(name), card_device(name) or CPU)
    except Exception:  # noqa: BLE001  a preset its own card refuses (none today) still resolved only once
        plan = None
    # the model path, the precision and the shape, once (check_method is counted on build_run below: a tool recipe's
    # fit check runs labkit.memory.estimate, which checks its own arguments)
    assert {n: resolve_calls[n] for n in ("resolve_model", "choose_precision", "model_shape")} == \
        dict(resolve_model=1, choose_precision=1, model_shape=1), name
    assert plan is not None


def test_readers_of_a_plan_decide_nothing_again(resolve_calls, capsys):
    """preflight, the estimator and the rehearsal read a plan as it is (a T4 plan made on this CPU stays fp16 in each);
    train --dry-run resolves its preset once, for the card it plans for."""
    from bench.rehearse import rehearse
    from labkit.cli import train_cli

    plan = resolve_plan("colab-t4")
    resolve_calls.clear()
    report, est = preflight(plan), estimate(plan)
    rehearsed = rehearse(plan, num_layers=1, generation=False, optimizer_steps=1)
    # no model path or precision decided again; the plan's shape read once, when first needed (check_method is the
    # estimator checking its own argument)
    assert {n: resolve_calls[n] for n in ("resolve_model", "choose_precision", "model_shape")} == \
        dict(resolve_model=0, choose_precision=0, model_shape=1)
    assert est.settings["precision"] == "fp16" and rehearsed.peak > 0 and report.card_gib == plan.card.total_memory_gib
    assert train_cli(["--preset", "colab-t4", "--dry-run"]) == 0
    assert {n: resolve_calls[n] for n in ("resolve_model", "choose_precision")} == dict(resolve_model=1,
                                                                                     choose_precision=1)
    assert "fp16" in capsys.readouterr().out


# README, "From a settings cell to GRPOTrainer, in four files": the labkit functions on the stack when each step
# runs, outermost first.
ROAD = {
    "Plan": ["run.py:build_run", "validation.py:checked_plan", "presets.py:resolve_plan"],
    "GRPOConfig": ["run.py:build_run", "training.py:grpo_config"],
    "GRPOTrainer": ["run.py:build_run", "training.py:build_trainer"],
}


def _labkit_stack() -> list[str]:
    import traceback

    return [f"{Path(f.filename).name}:{f.name}" for f in traceback.extract_stack()
            if Path(f.filename).parent == PACKAGE]


@pytest.fixture
def road(monkeypatch):
    """Record where a preset becomes its plan, TRL's GRPOConfig and TRL's GRPOTrainer: the labkit frames above each."""
    import trl

    seen = {name: [] for name in ROAD}

    def recording(name, original):
        def recorded(*args, **kwargs):
            seen[name].append(_labkit_stack())
            return original(*args, **kwargs)
        return recorded

    monkeypatch.setattr(Plan, "__init__", recording("Plan", Plan.__init__))
    monkeypatch.setattr(trl.GRPOConfig, "__post_init__", recording("GRPOConfig", trl.GRPOConfig.__post_init__))
    monkeypatch.setattr(trl.GRPOTrainer, "__init__", recording("GRPOTrainer", trl.GRPOTrainer.__init__))
    return seen


@pytest.mark.slow
def test_build_run_resolves_the_preset_once(tmp_path, resolve_calls, road):
    from labkit.run import build_run

    build_run(get_preset("cpu-tiny", train_limit=8), tmp_path, device=CPU, disable_tqdm=True)
    # 9643c8d's build_run ran resolve_model 4 times, choose_precision 3 and model_shape 2
    assert dict(resolve_calls) == dict(resolve_model=1, choose_precision=1, check_method=1, model_shape=1)
    # the road a newcomer reads: four files, each step once
    assert road == {name: [frames] for name, frames in ROAD.items()}, road


def test_the_recipe_does_not_climb_back():
    # labkit.presets (the recipe and its plan) sits under its checks, preflight, run and training
    # (tests/test_layout.py's layers): it imports only the device and the cards, the models, their shapes (labkit.memory),
    # the generation paths (labkit.generation: a recipe's GRPOConfig fields for its path, importing no labkit module at
    # its top), the tool environments (labkit.environments: the tool rounds a recipe's environment takes) and how a
    # sentence is printed (labkit.text: a refusal's message in a notebook)
    tree = ast.parse((PACKAGE / "presets.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                and n.module.startswith("labkit")}
    assert imported <= {"labkit.device", "labkit.models", "labkit.memory",
                        "labkit.generation", "labkit.environments", "labkit.text"}, imported


def test_the_presets_lora_dropout_reaches_the_estimate():
    """LoRA's dropout keeps a mask and an input copy in every adapted layer: a preset without it needs less."""
    with_dropout = estimate(resolve_plan("laptop-16gb"))
    without = estimate(resolve_plan(get_preset("laptop-16gb", lora_dropout=0.0)))
    assert without.bytes["activations"] < with_dropout.bytes["activations"]
    assert without.bytes["weights"] == with_dropout.bytes["weights"]


@pytest.mark.slow
def test_your_own_dataset_and_reward_train_through_build_run(tmp_path):
    """Issue 53 item 5: a Dataset with a prompt column and a reward function, as GRPOTrainer takes them."""
    from datasets import Dataset

    from labkit.run import build_run, eval_prompts, load_saved_preset

    task = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"What is {i} + 2?"}] for i in range(20)],
                              "answer": [str(i + 2) for i in range(20)]})
    seen = []

    def exact(completions, answer, **kwargs):
        seen.append(list(answer))
        return [1.0 if c[0]["content"].strip() == a else 0.0 for c, a in zip(completions, answer)]

    preset = get_preset("cpu-tiny", task=task, rewards=exact, max_steps=2, save_strategy="no", train_limit=None)
    run = build_run(preset, tmp_path, print_logs=False)
    assert len(seen) == 1  # the check before the model: one call on the first rows, as TRL calls it
    assert len(run.trainer.train_dataset) == 20
    run.train()
    assert run.trainer.state.global_step == 2 and len(seen) > 1
    assert set(sum(seen[1:], [])) <= set(task["answer"])  # TRL passed the dataset's own column
    assert "rewards/exact/mean" in run.trainer.state.log_history[0]
    assert load_saved_preset(tmp_path).to_dict()["rewards"] == ["your function exact"]
    with pytest.raises(ValueError, match="no held-out split"):
        eval_prompts(preset)


def test_a_plan_with_a_change_keeps_what_the_change_does_not_reach(resolve_calls):
    plan = resolve_plan("qlora-3b")
    assert plan.shape.num_layers == 36
    resolve_calls.clear()
    smaller = plan.apply({"per_device_train_batch_size": 8, "lora_rank": 8, "steps_per_generation": 2})
    # the settings, the LoRA config and TRL's arguments follow; the model path, shape and precision stay as decided
    assert (smaller.preset.config["per_device_train_batch_size"], smaller.preset.generation_batch_size) == (8, 16)
    assert smaller.config["steps_per_generation"] == 2 and smaller.peft_config.r == 8 and plan.peft_config.r == 16
    assert (smaller.model_path, smaller.precision, smaller.card) == (plan.model_path, plan.precision, plan.card)
    assert smaller.shape is plan.shape and smaller.quantization_config is plan.quantization_config
    assert dict(resolve_calls) == {}
    # a new model, method or precision is a new resolution
    other = plan.apply({"model": "Qwen/Qwen2.5-1.5B-Instruct", "method": "lora"})
    assert other.shape.num_layers == 28 and other.quantization_config is None and other.card == plan.card
    assert resolve_calls["resolve_model"] == resolve_calls["choose_precision"] == 1
    assert estimate(smaller).total < estimate(plan).total


def test_the_spy_on_precision_decisions_sees_one_outside_a_plan(decided_outside_a_plan):  # as good as its tests
    import labkit.presets
    from labkit.device import torch_dtype

    labkit.presets.resolve_plan(get_preset("cpu-tiny"), CPU)  # through the module: this file's own name is not spied on
    assert not decided_outside_a_plan
    torch_dtype("fp32", "lora")
    assert dict(decided_outside_a_plan) == {"torch_dtype": 1}
