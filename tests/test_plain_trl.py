"""The plain-TRL cells of notebooks 03 and 04 build the same run as labkit does.

Each test runs the notebook's own cell (extracted by its id, so the code tested is the code a learner copies)
and compares its ``GRPOConfig`` field by field with the one labkit builds: ``labkit.nano.trl_trainer`` for 03,
``labkit.run.build_run`` for every preset for 04 (its actual ``GRPOConfig``, captured where it hands it to
``GRPOTrainer``), and the LoRA and 4-bit settings with those labkit passes to PEFT and bitsandbytes.
"""
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
WHERE = ("output_dir", "logging_dir")  # where each one writes: different by design


def cell_source(notebook: str, cell_id: str) -> str:
    cells = json.loads((REPO / "notebooks" / notebook).read_text())["cells"]
    (cell,) = [c for c in cells if c.get("id") == cell_id]
    return "".join(cell["source"])


def differences(plain, built, skip=()) -> dict:
    a, b = plain.to_dict(), built.to_dict()
    keys = (set(a) | set(b)) - set(WHERE) - set(skip)
    return {k: (a.get(k), b.get(k)) for k in sorted(keys) if a.get(k) != b.get(k)}


def test_differences_can_fail():
    from trl import GRPOConfig

    def config(**kwargs):
        return GRPOConfig(**{"output_dir": "a", "num_generations": 8, "report_to": "none", "use_cpu": True,
                             "bf16": False, **kwargs})

    assert differences(config(), config(output_dir="b")) == {}
    assert set(differences(config(), config(num_generations=4))) == {"num_generations"}


def test_03_plain_trl_cell_equals_trl_trainer(isolated_cache, tiny_nano):
    from labkit.nano import NanoConfig, trl_trainer

    config = NanoConfig(**{**tiny_nano, "num_generations": 4, "num_prompts": 2})
    built = trl_trainer(config, isolated_cache / "labkit")
    namespace = {"torch": torch, "tempfile": tempfile, "trl_config": config, "task": config.task()}
    exec(cell_source("03_nano_grpo_cpu.ipynb", "b7c2e4b4"), namespace)
    plain = namespace["plain_trainer"]
    assert differences(namespace["plain_args"], built.args) == {}
    assert [f.__name__ for f in plain.reward_funcs] == [f.__name__ for f in built.reward_funcs]
    assert plain.model.config._name_or_path == built.model.config._name_or_path
    assert len(plain.train_dataset) == len(built.train_dataset)
    # the cell really is what the notebook compares: a changed field shows up
    namespace["trl_config"] = NanoConfig(**{**tiny_nano, "num_generations": 4, "num_prompts": 2, "beta": 0.04})
    exec(cell_source("03_nano_grpo_cpu.ipynb", "b7c2e4b4"), namespace)
    assert set(differences(namespace["plain_args"], built.args)) == {"beta"}


def _lora_fields(config) -> dict:
    fields = config.to_dict()
    fields["target_modules"] = set(fields["target_modules"])  # the order does not matter to PEFT
    return fields


class _Recorder:
    """Stands in for GRPOTrainer: keeps what it was given, loads nothing."""

    def __init__(self, model=None, reward_funcs=None, args=None, **kwargs):
        self.model, self.reward_funcs, self.args, self.kwargs = model, reward_funcs, args, kwargs


def _built_by_labkit(preset, output_dir, monkeypatch, tokenizer):
    """Return (GRPOConfig, peft LoraConfig or None, load_policy kwargs or None) as build_run makes them."""
    import labkit.models
    import labkit.training
    from labkit.run import build_run

    seen = {}

    def build_trainer(model, reward_funcs, train_dataset, args, *, tokenizer=None, peft_config=None, callbacks=None,
                      eval_dataset=None):
        seen.update(model=model, reward_funcs=reward_funcs, args=args, peft_config=peft_config)
        return SimpleNamespace(model=SimpleNamespace(), remove_callback=lambda *a: None)

    def load_policy(name, method, **kwargs):  # QLoRA: labkit loads the 4-bit model itself
        seen["load_policy"] = dict(name=name, method=method, **kwargs)
        return SimpleNamespace(), tokenizer

    monkeypatch.setattr(labkit.training, "build_trainer", build_trainer)
    monkeypatch.setattr(labkit.models, "load_policy", load_policy)
    build_run(preset, output_dir, tokenizer=tokenizer, train_dataset=[{"prompt": [], "answer": "1"}], seed=0)
    return seen


def _labkit_bnb_config(monkeypatch, precision):
    """Return the BitsAndBytesConfig labkit.models.load_policy asks transformers for (nothing is loaded)."""
    import transformers

    from labkit.models import load_policy

    class Captured(Exception):
        pass

    def from_pretrained(name, **kwargs):
        raise Captured(kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    with pytest.raises(Captured) as info:
        load_policy("Qwen/Qwen2.5-3B-Instruct", "qlora", precision=precision)
    return info.value.args[0]["quantization_config"]


@pytest.mark.parametrize("name", ["workshop", "laptop-16gb", "colab-t4", "qlora-3b", "cpu-smollm2", "cpu-tiny"])
def test_04_plain_trl_cell_equals_build_run(name, tmp_path, monkeypatch, tiny_model_path):
    import trl

    from labkit.models import load_tokenizer
    from labkit.presets import get_preset

    preset = get_preset(name)
    tokenizer = load_tokenizer(tiny_model_path)
    if preset.method == "qlora":
        from labkit.device import choose_precision, detect_device

        expected_bnb = _labkit_bnb_config(monkeypatch, choose_precision(detect_device()))
    seen = _built_by_labkit(preset, tmp_path / "labkit", monkeypatch, tokenizer)
    monkeypatch.setattr(trl, "GRPOTrainer", _Recorder)
    namespace = {"preset": preset, "SEED": 0, "OUTPUT_DIR": tmp_path, "train_dataset": [],
                 "lab": SimpleNamespace(cpu_mode=True)}
    exec(cell_source("04_lora_grpo_16gb.ipynb", "c4a7d2e8"), namespace)
    plain = namespace["plain_trainer"]
    if preset.method == "qlora":
        # labkit loads the 4-bit model itself (load_policy) and hands it over; plain TRL loads it by name,
        # so only the plain GRPOConfig says how to load it
        assert differences(namespace["args"], seen["args"], skip=("model_init_kwargs",)) == {}
        from labkit.models import lora_config  # what load_policy gives PEFT

        loaded = seen["load_policy"]
        assert _lora_fields(plain.kwargs["peft_config"]) == _lora_fields(
            lora_config(loaded["lora_rank"], loaded["lora_alpha"], target_modules=loaded["target_modules"]))
        assert plain.kwargs["quantization_config"].to_dict() == expected_bnb.to_dict()
    else:
        assert differences(namespace["args"], seen["args"]) == {}
        assert _lora_fields(plain.kwargs["peft_config"]) == _lora_fields(seen["peft_config"])
        assert plain.kwargs["quantization_config"] is None
        assert plain.model == seen["model"]  # the same name or folder, loaded by TRL
    assert [f.__name__ for f in plain.reward_funcs] == [f.__name__ for f in seen["reward_funcs"]]
