"""One plan per preset (labkit.plan): resolved once, read by build_run, preflight, train --dry-run, the
estimator and the rehearsal; the precision decided in one place; the walk from build_run does not climb back.
"""
import ast
from pathlib import Path

import pytest
import torch

import labkit.device as dev
from labkit.plan import Plan, resolve_plan
from labkit.preflight import estimate, preflight
from labkit.presets import card_device, get_preset

PACKAGE = Path(__file__).resolve().parents[1] / "labkit"
CPU = dev.DeviceInfo("cpu", "x86_64 CPU (2 cores)", None, None, bf16=False, fp16=False)


def _function(module: str, name: str) -> ast.FunctionDef:
    tree = ast.parse((PACKAGE / module).read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def _called(node) -> list[str]:
    names = []
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            f = call.func
            names.append(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return names


def test_a_plan_says_everything_a_run_needs():
    plan = resolve_plan("qlora-3b")
    assert isinstance(plan, Plan) and plan.card.name == card_device("qlora-3b").name
    assert plan.precision == "bf16" and plan.compute_dtype == torch.bfloat16
    assert plan.quantization["bnb_4bit_quant_type"] == "nf4" and plan.lora["rank"] == 16
    assert plan.generation_batch_size == plan.config["per_device_train_batch_size"] * plan.steps_per_generation
    assert plan.shape.num_layers == 36
    t4 = resolve_plan("colab-t4")
    assert (t4.precision, t4.weight_dtype, dev.precision_flags(t4.precision)) == ("fp16", torch.float16,
                                                                                  {"bf16": False, "fp16": True})
    assert resolve_plan("cpu-tiny").precision == "fp32"  # a CPU preset trains in fp32


def test_preflight_dry_run_estimator_and_rehearsal_read_the_same_plan():
    plan = resolve_plan("colab-t4")
    report = preflight(plan)
    assert report.estimate_gib == pytest.approx(estimate(plan).total)
    from labkit.cards import CARDS

    assert report.card_gib == pytest.approx(CARDS["t4"].gib)
    # planning from a CPU gives the same figures as the plan of the preset's card (fp16 on a T4, not bf16)
    assert preflight("colab-t4", CPU).estimate_gib == pytest.approx(report.estimate_gib)
    assert estimate(plan).settings["precision"] == "fp16"


@pytest.mark.slow
def test_build_run_takes_a_plan(tmp_path):
    from labkit.run import build_run

    plan = resolve_plan(get_preset("cpu-tiny", train_limit=8), CPU)
    run = build_run(plan, tmp_path, disable_tqdm=True)
    args = run.trainer.args
    assert (args.bf16, args.fp16) == (False, False)
    assert args.generation_batch_size == plan.generation_batch_size
    assert run.model.peft_config["default"].r == plan.lora["rank"]


@pytest.mark.parametrize("module, function", [
    ("run.py", "build_run"), ("preflight.py", "preflight"), ("cli.py", "train_cli"), ("../bench/rehearse.py", "main"),
    ("../bench/rehearse.py", "rehearse"), ("preflight.py", "estimate"), ("unsloth_path.py", "load_unsloth_policy"),
    ("../bench/unsloth.py", "comparison_run"), ("../bench/preset.py", "bench_preset")])
def test_consumers_read_the_precision_from_the_plan(module, function):
    calls = _called(_function(module, function))
    assert not {"choose_precision", "torch_dtype", "adapter_dtype"} & set(calls), (module, function)


def test_build_run_resolves_the_preset_once_and_the_plan_does_not_climb_back():
    calls = _called(_function("run.py", "build_run"))
    assert calls.count("resolve_plan") == 1
    # labkit.plan sits over the recipe and under preflight, run and training (tests/test_layout.py's layers):
    # it imports only the device, the models, the model shapes, the presets and the generation paths (labkit.generation:
    # a recipe's GRPOConfig fields for its path, importing no labkit module at its top)
    tree = ast.parse((PACKAGE / "plan.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                and n.module.startswith("labkit")}
    assert imported <= {"labkit.device", "labkit.models", "labkit.shapes", "labkit.presets", "labkit.generation"}, imported
