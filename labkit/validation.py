"""The type and range of every recipe field, checked before any model loads (used by :func:`labkit.presets.validate`).

Each check returns one-line messages that name the field and say what to write instead:
the preset's own fields (:data:`_NUMBER_FIELDS`: whole numbers, numbers, their ranges; texts,
lists, booleans), the model name (an offline tiny model, an existing folder with a
``config.json``, or a well-formed hub id), secrets (never part of a recipe: :data:`SECRET_FIELDS`)
and the ``trl_options`` values: the types ``trl.GRPOConfig`` declares, the ranges and choices it
does not check itself (:data:`TRL_NUMBER_RANGES`, :data:`TRL_CHOICES`), and whatever a real
``GRPOConfig`` built from them refuses. Introduced with ``python -m labkit train --dry-run``
(``04_lora_grpo_16gb.ipynb``).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: labkit.presets imports this module
    from labkit.presets import Preset

__all__ = ["SECRET_FIELDS", "TRL_NUMBER_RANGES", "TRL_CHOICES", "field_errors", "trl_config_errors",
           "too_few_prompts"]


# Fields holding a credential: never accepted in a recipe (it is saved in the run folder and every
# checkpoint, and printed on a resume mismatch). TRL reads the token from the environment instead.
SECRET_FIELDS = {"hub_token": "HF_TOKEN"}

_INT, _FLOAT = "a whole number", "a number"
# field -> (kind, lowest, highest, None allowed). The upper bounds only refuse the absurd (a typo's
# extra zeros): every real recipe stays far below them.
_NUMBER_FIELDS = {
    "lora_rank": (_INT, 1, 4096, False),
    "per_device_train_batch_size": (_INT, 1, 4096, False),
    "gradient_accumulation_steps": (_INT, 1, 4096, False),
    "num_generations": (_INT, 2, 1024, False),
    "max_prompt_length": (_INT, 1, 1_048_576, False),
    "max_completion_length": (_INT, 1, 1_048_576, False),
    "max_steps": (_INT, 1, 10_000_000, False),
    "eval_batch_size": (_INT, 1, 4096, False),
    "save_steps": (_INT, 1, 10_000_000, True),
    "save_total_limit": (_INT, 1, 100_000, True),
    "train_limit": (_INT, 1, 10_000_000, True),
    "seed": (_INT, 0, 2**32 - 1, False),
    "learning_rate": (_FLOAT, 0.0, 1.0, False),  # > 0
    "beta": (_FLOAT, 0.0, 1000.0, False),  # >= 0
    "temperature": (_FLOAT, 0.0, 100.0, False),  # > 0
    "lora_alpha": (_FLOAT, 0.0, 100_000.0, True),  # > 0
    "card_gib": (_FLOAT, 0.0, 100_000.0, True),  # > 0
}
# Float fields whose lowest value is itself allowed (learning_rate 0: a control run, which validate warns about).
_ZERO_ALLOWED = {"beta", "seed", "learning_rate"}
_STRING_FIELDS = ("name", "model", "method", "description", "optim", "task")
TASKS = ("gsm8k", "word-problems")  # labkit.run.task_dataset knows these

# GRPOConfig fields that GRPOConfig itself does not check (TRL 1.16), checked here: (kind, low, high, low allowed).
# A value outside these ranges crashes after the model loads, or trains silently on nonsense.
TRL_NUMBER_RANGES = {
    "num_iterations": (_INT, 1, 1024, True),
    "steps_per_generation": (_INT, 1, 4096, True),  # 0 gave a generation batch of 0 completions
    "epsilon": (_FLOAT, 0.0, 10.0, False),
    "epsilon_high": (_FLOAT, 0.0, 10.0, False),
    "delta": (_FLOAT, 1.0, 1000.0, False),
    "top_p": (_FLOAT, 0.0, 1.0, False),
    "top_k": (_INT, 0, 1_000_000, True),
    "min_p": (_FLOAT, 0.0, 1.0, True),
    "repetition_penalty": (_FLOAT, 0.0, 100.0, False),
    "num_train_epochs": (_FLOAT, 0.0, 1_000_000.0, False),
    "max_grad_norm": (_FLOAT, 0.0, 1_000_000.0, True),
    "weight_decay": (_FLOAT, 0.0, 100.0, True),
    "warmup_ratio": (_FLOAT, 0.0, 1.0, True),
    "warmup_steps": (_FLOAT, 0, 10_000_000, True),
    "logging_steps": (_FLOAT, 0.0, 10_000_000.0, False),
    "adam_beta1": (_FLOAT, 0.0, 1.0, True),
    "adam_beta2": (_FLOAT, 0.0, 1.0, True),
    "adam_epsilon": (_FLOAT, 0.0, 1.0, False),
}
TRL_CHOICES = {
    "loss_type": ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"),
    "scale_rewards": ("group", "batch", "none"),
    "importance_sampling_level": ("token", "sequence"),
}


def _finite(value) -> bool:
    """True for an int (any size: ``math.isfinite(10**400)`` overflows) or a finite float."""
    return isinstance(value, int) or math.isfinite(value)


def _number_error(label: str, value, kind: str, low, high, low_allowed: bool, none_allowed: bool) -> str | None:
    """Return why ``value`` is not a valid ``kind`` in ``[low, high]`` (``(low, high]`` unless ``low_allowed``), or None."""
    if value is None:
        return None if none_allowed else f"{label} must be {kind}, not None."
    span = f"from {low:,} to {high:,}" if low_allowed else f"greater than {low:,} and at most {high:,}"
    what = f"{kind} {span}" + (" (or None)" if none_allowed else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind == _INT and not isinstance(value, int)):
        return f"{label} must be {what}, not {value!r}."
    if not _finite(value) or value > high or value < low or (value == low and not low_allowed):
        return f"{label} must be {what}, not {value!r}."
    return None


def _field_errors(p: "Preset") -> list[str]:
    """Return what is wrong with the preset's field types and ranges (each message names the field)."""
    errors = []
    for name, (kind, low, high, none_allowed) in _NUMBER_FIELDS.items():
        low_allowed = kind == _INT or name in _ZERO_ALLOWED
        value = getattr(p, name)
        error = _number_error(name, value, kind, low, high, low_allowed, none_allowed)
        if error and name == "num_generations" and isinstance(value, int) and value < 2:
            error = (f"num_generations must be at least 2 (the advantage compares completions of one prompt), "
                     f"not {value}. Set num_generations=4.")
        elif error:
            error += f" Set --set {name}=VALUE."
        if error:
            errors.append(error)
    for name in _STRING_FIELDS:
        value = getattr(p, name)
        if not isinstance(value, str) or (name != "description" and not value.strip()):
            errors.append(f"{name} must be a non-empty text, not {value!r}.")
    if isinstance(p.task, str) and p.task not in TASKS:
        errors.append(f"task must be one of {', '.join(TASKS)}, not {p.task!r}.")
    for name in ("gradient_checkpointing", "prepare_model_for_kbit_training"):
        if not isinstance(getattr(p, name), bool):
            errors.append(f"{name} must be true or false, not {getattr(p, name)!r}.")
    if p.precision is not None and p.precision not in ("bf16", "fp16", "fp32"):
        errors.append(f"precision must be bf16, fp16, fp32 or None (the card decides), not {p.precision!r}.")
    for name in ("target_modules", "rewards"):
        value = getattr(p, name)
        if not isinstance(value, tuple) or not value or not all(isinstance(v, str) and v.strip() for v in value):
            errors.append(f"{name} must be a comma-separated list of names, not {value!r}.")
    if p.reward_weights is not None:
        weights = p.reward_weights
        if not isinstance(weights, tuple) or not all(
                isinstance(w, (int, float)) and not isinstance(w, bool) and _finite(w) and abs(w) <= 1e6
                for w in weights):
            errors.append(f"reward_weights must be finite numbers (at most 1e6 in size), one per reward, not "
                          f"{weights!r}.")
        elif weights and not any(weights):
            errors.append("reward_weights are all 0: no reward would train anything. Set one to 1.")
    if not isinstance(p.trl_options, dict):
        errors.append(f"trl_options must be a dict of GRPOConfig fields, not {p.trl_options!r}.")
    else:
        errors.extend(_secret_errors(p.trl_options))
    if isinstance(p.model, str) and p.model.strip():
        errors.extend(_model_errors(p.model))
    return errors


def _secret_errors(options: dict) -> list[str]:
    return [f"trl_options may not hold {key!r}: a recipe is saved in the run folder and every checkpoint, and a "
            f"secret must never be. Set the {SECRET_FIELDS[key]} environment variable instead (TRL reads it there)."
            for key in options if key in SECRET_FIELDS]


def _model_errors(model: str) -> list[str]:
    """Return why ``model`` names no model: an unknown tiny model, a missing folder, a malformed hub id."""
    import re

    if model.startswith("tiny:"):
        from labkit.models import _TINY_SHAPES

        arch = model.split(":", 1)[1]
        return [] if arch in _TINY_SHAPES else [
            f"model {model!r}: no tiny model {arch!r}; the tiny models are " + ", ".join(f"tiny:{a}" for a in _TINY_SHAPES)]
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            return [f"model {model!r} is a local path without a config.json: point --model at a saved model folder."]
        return []
    if model.startswith(("/", ".", "~", "\\")) or model.count("/") > 1 or "\\" in model:
        return [f"model {model!r}: no such folder. Give a saved model folder or a hub id such as "
                "'Qwen/Qwen2.5-1.5B-Instruct'."]
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", model):
        return [f"model {model!r} is neither a folder nor a hub id (like 'Qwen/Qwen2.5-1.5B-Instruct')."]
    return []


def _trl_config_errors(p: "Preset") -> list[str]:
    """Return what is wrong with the ``trl_options`` values: types from GRPOConfig, ranges TRL does not check.

    A ``trl.GRPOConfig`` is built with the options (in a temporary folder, on the CPU) so that
    whatever TRL and transformers refuse is refused here, as one line, before any model loads.
    """
    if not p.trl_options:
        return []
    import tempfile
    import typing

    from trl import GRPOConfig

    hints = typing.get_type_hints(GRPOConfig)
    errors = []
    for key, value in p.trl_options.items():
        label = f"trl_options {key} (--config {key}=VALUE)"
        if key in TRL_CHOICES:
            if value not in TRL_CHOICES[key] and not (key == "scale_rewards" and isinstance(value, bool)):
                errors.append(f"{label} must be one of {', '.join(TRL_CHOICES[key])}, not {value!r}.")
            continue
        hint = hints.get(key)
        allowed = set(typing.get_args(hint)) or {hint}
        none_allowed = type(None) in allowed
        if key in TRL_NUMBER_RANGES:
            kind, low, high, low_allowed = TRL_NUMBER_RANGES[key]
            error = _number_error(label, value, kind, low, high, low_allowed, none_allowed)
            if error:
                errors.append(error)
            continue
        if value is None:
            if not none_allowed:
                errors.append(f"{label} may not be None.")
        elif bool in allowed and allowed <= {bool, type(None)}:
            if not isinstance(value, bool):
                errors.append(f"{label} must be true or false, not {value!r}.")
        elif allowed & {int, float} and not allowed & {str, dict, list}:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value) or (
                    float not in allowed and not isinstance(value, int)):
                errors.append(f"{label} must be {_INT if float not in allowed else _FLOAT}, not {value!r}.")
        elif allowed <= {str, type(None)} and not isinstance(value, str):
            errors.append(f"{label} must be a text, not {value!r}.")
    epsilon = p.trl_options.get("epsilon", 0.2)
    high = p.trl_options.get("epsilon_high")
    if not errors and high is not None and high < epsilon:
        errors.append(f"trl_options epsilon_high ({high}) must be at least epsilon ({epsilon}).")
    if errors:
        return errors
    settings = dict(per_device_train_batch_size=p.per_device_train_batch_size, num_generations=p.num_generations,
                    gradient_accumulation_steps=p.gradient_accumulation_steps)
    with tempfile.TemporaryDirectory() as folder:
        try:
            GRPOConfig(output_dir=folder, use_cpu=True, report_to="none", **settings, **p.trl_options)
        except Exception as exc:  # noqa: BLE001  whatever TRL refuses, as one line
            message = " ".join(str(exc).split())
            errors.append(f"trl_options {sorted(p.trl_options)}: GRPOConfig refuses them: {message}")
    return errors


field_errors = _field_errors
trl_config_errors = _trl_config_errors


def too_few_prompts(prompts: int, generation_batch_size: int, num_generations: int) -> str | None:
    """Say why ``prompts`` prompts give no training step, or return None when they give at least one.

    TRL's ``RepeatSampler`` hands out prompts in chunks of ``generation_batch_size // num_generations``
    and drops a chunk that is not full (trl/trainer/grpo_trainer.py ``_get_train_sampler``;
    trl/trainer/utils.py ``RepeatSampler.__iter__``). With fewer prompts than one chunk the trainer
    finds no batch and stops at step 0 with only a logged warning: a run that silently trains nothing.
    """
    needed = generation_batch_size // max(num_generations, 1)
    if prompts >= needed:
        return None
    return (f"{prompts} training prompts give no training step: one generation batch of {generation_batch_size} "
            f"completions takes {needed} prompts ({num_generations} completions each), and TRL's sampler drops a "
            "batch that is not full, so the run would stop at step 0.")
