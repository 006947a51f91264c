"""What a recipe may hold, on a card: :func:`validate` and the type and range of every field, before any model loads.

The layer above :mod:`labkit.presets` (the recipe and its plan) and the readers of a plan (the tool rounds' fit on the
card reads the plan's own :func:`labkit.oom.estimate`): pure functions of a preset's plan and a card, importing
nothing above. Each check returns one-line messages that name the field and say what to write instead: the preset's
own fields (:data:`_NUMBER_FIELDS`: whole numbers, numbers, their ranges; texts, lists, booleans), the model name (an
offline tiny model, an existing folder with a ``config.json``, or a well-formed hub id), and its ``config``
(:func:`config_errors`): no secrets (:data:`SECRET_FIELDS`), only names ``trl.GRPOConfig`` has, the types it declares,
the ranges and choices it does not check itself (:data:`TRL_NUMBER_RANGES`, :data:`TRL_CHOICES`), and whatever a real
``GRPOConfig`` built from them refuses. Introduced with ``python -m labkit train --dry-run`` (``04_lora_grpo_16gb.ipynb``).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path

from labkit.device import CARDS, SIZING_CONTEXT_GIB, detect_device
from labkit.generation import GENERATION_FIELDS, generation_problems
from labkit.memory import EIGHT_BIT_OPTIMS, GIB, OPTIMS, generation_batch
from labkit.models import LOCAL_MODELS, TINY_SHAPES, check_method
from labkit.presets import RECIPE_CONFIG, RECIPE_TARGETS, Plan, Preset, PresetError, resolve_plan
from labkit.rewards import named_rewards, task_errors
from labkit.tasks import WORD_PROBLEM_TASKS

__all__ = ["validate", "checked_plan", "SECRET_FIELDS", "TRL_NUMBER_RANGES", "TRL_CHOICES",
           "field_errors", "config_errors", "in_notebook_terms"]


# Fields holding a credential: never accepted in a recipe (it is saved in the run folder and every
# checkpoint, and printed on a resume mismatch). TRL reads the token from the environment instead.
SECRET_FIELDS = {"hub_token": "HF_TOKEN"}

_INT, _FLOAT = "a whole number", "a number"
# The preset's own number fields: field -> (kind, lowest, highest, None allowed). The upper bounds only refuse the
# absurd (a typo's extra zeros): every real recipe stays far below them.
_NUMBER_FIELDS = {
    "lora_rank": (_INT, 1, 4096, False),
    "max_prompt_length": (_INT, 1, 1_048_576, False),
    "eval_batch_size": (_INT, 1, 4096, False),
    "train_limit": (_INT, 1, 10_000_000, True),
    "lora_alpha": (_FLOAT, 0.0, 100_000.0, True),  # > 0
    "lora_dropout": (_FLOAT, 0.0, 0.9, False),  # >= 0
    "card_gib": (_FLOAT, 0.0, 100_000.0, True),  # > 0
}
# Float fields whose lowest value is itself allowed.
_ZERO_ALLOWED = {"lora_dropout"}
_STRING_FIELDS = ("name", "model", "method", "description", "generation")  # task: a name or a Dataset
TASKS = ("gsm8k", *WORD_PROBLEM_TASKS)  # labkit.run.task_dataset knows these

# GRPOConfig arguments whose range GRPOConfig itself does not check (TRL 1.16), checked here: (kind, low, high, low
# allowed); None is allowed where GRPOConfig's type allows it. A value outside these ranges crashes after the model
# loads, or trains silently on nonsense. The first ones are those the lab reads (the batch rule, the estimate).
TRL_NUMBER_RANGES = {
    "per_device_train_batch_size": (_INT, 1, 4096, True),
    "gradient_accumulation_steps": (_INT, 1, 4096, True),
    "num_generations": (_INT, 2, 1024, True),
    "max_completion_length": (_INT, 1, 1_048_576, True),
    "max_steps": (_INT, 1, 10_000_000, True),
    "save_steps": (_INT, 1, 10_000_000, True),
    "save_total_limit": (_INT, 1, 100_000, True),
    "seed": (_INT, 0, 2**32 - 1, True),
    "learning_rate": (_FLOAT, 0.0, 1.0, True),  # 0: a control run, which validate warns about
    "beta": (_FLOAT, 0.0, 1000.0, True),
    "temperature": (_FLOAT, 0.0, 100.0, False),
    "max_tool_calling_iterations": (_INT, 1, 64, True),
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
    "save_strategy": ("no", "steps", "epoch", "best"),
}
# What the recipe's own arguments may be, without asking TRL (RECIPE_CONFIG's names; TRL is asked about any other):
# true or false; None too (where GRPOConfig allows it and the lab, which reads them, has a use for it).
_RECIPE_BOOLS = ("activation_checkpointing",)
_RECIPE_NONE = ("save_total_limit", "activation_checkpointing_kwargs")


def _finite(value) -> bool:
    """True for an int (any size: ``math.isfinite(10**400)`` overflows) or a finite float."""
    return isinstance(value, int) or math.isfinite(value)


def _number_error(label: str, value, kind: str, low, high, low_allowed: bool, none_allowed: bool) -> str | None:
    """Return why ``value`` is not a valid ``kind`` in ``[low, high]`` (``(low, high]`` unless ``low_allowed``), or None."""
    if value is None:
        return None if none_allowed else f"{label} must be {kind}, not None."
    span = f"from {low:,} to {high:,}" if low_allowed else f"greater than {low:,} and at most {high:,}"
    what = f"{kind} {span}" + (" (or None)" if none_allowed else "")
    wrong_type = isinstance(value, bool) or not isinstance(value, (int, float)) or (
        kind == _INT and not isinstance(value, int))
    if wrong_type or not _finite(value) or not low <= value <= high or (value == low and not low_allowed):
        return f"{label} must be {what}, not {value!r}."
    return None


def field_errors(p: Preset) -> list[str]:
    """Return what is wrong with the preset's field types and ranges and its ``config`` (each message names the field
    or the ``GRPOConfig`` argument, and says what to set)."""
    errors = []
    for name, (kind, low, high, none_allowed) in _NUMBER_FIELDS.items():
        low_allowed = kind == _INT or name in _ZERO_ALLOWED
        error = _number_error(name, getattr(p, name), kind, low, high, low_allowed, none_allowed)
        if error:
            errors.append(error + f" Set --set {name}=VALUE.")
    for name in _STRING_FIELDS:
        value = getattr(p, name)
        if not isinstance(value, str) or (name != "description" and not value.strip()):
            errors.append(f"{name} must be a non-empty text, not {value!r}.")
    if p.card is not None and not (isinstance(p.card, str) and p.card in CARDS):
        errors.append(f"card must be one of {', '.join(CARDS)} (labkit.device.CARDS), or None for no GPU (card_gib "
                      f"alone: a card of that memory), not {p.card!r}.")
    if not isinstance(p.config, dict):
        return errors + [f"config must be a dict of GRPOConfig arguments (--set KEY=VALUE), not {p.config!r}."]
    errors.extend(config_errors(p.config))
    if isinstance(p.task, str) and p.task not in TASKS or p.task is None:
        errors.append(f"task must be one of {', '.join(TASKS)}, or your datasets.Dataset, not {p.task!r}.")
    elif not isinstance(p.task, str):  # your own dataset: its prompts, and every reward called on its first rows
        errors.extend(task_errors(p.task, p.rewards))
    errors.extend(_tool_errors(p))
    if not isinstance(p.prepare_model_for_kbit_training, bool):
        errors.append(f"prepare_model_for_kbit_training must be true or false, not {p.prepare_model_for_kbit_training!r}.")
    if p.precision is not None and p.precision not in ("bf16", "fp16", "fp32"):
        errors.append(f"precision must be bf16, fp16, fp32 or None (the card decides), not {p.precision!r}.")
    for name in ("target_modules", "rewards"):
        value = getattr(p, name)
        if not isinstance(value, tuple) or not value or not all(
                isinstance(v, str) and v.strip() or name == "rewards" and callable(v) for v in value):
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
    if isinstance(p.model, str) and p.model.strip():
        errors.extend(_model_errors(p.model))
    return errors


def _tool_errors(p: Preset, plan: Plan | None = None, procs: int = 1) -> list[str]:
    """Return what is wrong with the tool fields: an unknown environment, tool rounds without an environment; and,
    given the checked plan (its card, precision and shape, once every field is sound), tool rounds that cannot fit.

    A tool round is a new ``generate`` call (TRL 1.16's ``_tool_call_loop``): prompt + completion so far + tool turn,
    up to ``max_prompt_length + max_completion_length`` tokens prefilled from scratch, and ``max_completion_length``
    new tokens asked again, for every row of the generation batch (:func:`labkit.memory.estimate` with
    ``max_tool_calling_iterations``). Refused when that **estimated** generation phase plus the CUDA context
    (:data:`labkit.device.SIZING_CONTEXT_GIB`) is more than the card holds, with the changes that make it fit, ranked
    as preflight ranks them (:func:`labkit.oom.changes_until_fit`, by the generation phase); a model the
    estimator cannot read passes here (the preflight says so).
    """
    from labkit.environments import ENVIRONMENTS

    c = p.config
    rounds, length = c.get("max_tool_calling_iterations"), c["max_completion_length"]
    if _number_error("", rounds, *TRL_NUMBER_RANGES["max_tool_calling_iterations"], True):
        return []  # a bad value: config_errors says what is allowed, once
    if p.environment is None:
        if rounds is not None:
            return [f"max_tool_calling_iterations={rounds!r} must come with a tool environment "
                    f"(it needs one): set --set environment=NAME ({', '.join(ENVIRONMENTS)}), or remove "
                    "max_tool_calling_iterations."]
        return []
    if not isinstance(p.environment, str) or p.environment not in ENVIRONMENTS:
        return [f"environment must be one of {', '.join(ENVIRONMENTS)} (labkit.environments.ENVIRONMENTS) or None, "
                f"not {p.environment!r}."]
    if rounds is None:
        return ["max_tool_calling_iterations must be set for a tool recipe (it needs max_tool_calling_iterations: "
                "the tool rounds a rollout may take; TRL's default is no limit): "
                "set --set max_tool_calling_iterations=3."]
    device = plan.card if plan else None
    if device is None or device.kind != "cuda" or not device.total_memory_gib:
        return []
    from labkit.oom import changes_until_fit, estimate

    def generation_gib(changed: Plan) -> float:  # the plan's own estimate of the generation phase
        return estimate(changed, num_processes=procs).bytes["generation_phase"] / GIB

    try:
        needed = generation_gib(plan)
    except (ValueError, KeyError, OSError):  # a model the estimator cannot read, offline
        return []
    card = device.total_memory_gib
    if needed + SIZING_CONTEXT_GIB <= card:
        return []
    first_turn = generation_gib(plan.apply({"max_tool_calling_iterations": 0}))
    steps = changes_until_fit(plan, card - SIZING_CONTEXT_GIB, generation_gib, needed, num_processes=procs)
    moves = "; ".join(f"{step.moves} -> about {after:.1f} GiB" for step, after in steps)
    fits = steps and steps[-1][1] + SIZING_CONTEXT_GIB <= card
    change = ("Change (--set KEY=VALUE), biggest cut first as preflight ranks, a round's estimate after each: " + moves
              if fits else "No change of the settings fits it" + (f" (after {moves})" if steps else "")
              + ": a bigger card, or a shorter max_prompt_length")
    return [f"tool rounds: each of the {rounds} tool rounds generates again on prompt + "
            f"completion so far (up to {p.max_prompt_length} + {length} tokens, prefilled from scratch) and asks "
            f"{length} new tokens, for all {plan.preset.generation_batch_size} completions of the generation batch: "
            f"estimated {needed:.1f} GiB for the generation (the first turn alone {first_turn:.1f} GiB), more than "
            f"this card's {card:g} GiB with the CUDA context ({SIZING_CONTEXT_GIB:g} GiB). {change}."]


def _secret_errors(options: dict) -> list[str]:
    return [f"config may not hold {key!r}: a recipe is saved in the run folder and every checkpoint, and a "
            f"secret must never be. Set the {SECRET_FIELDS[key]} environment variable instead (TRL reads it there)."
            for key in options if key in SECRET_FIELDS]


def _model_errors(model: str) -> list[str]:
    """Return why ``model`` names no model: an unknown tiny model, a missing folder, a malformed hub id."""
    if model.startswith("tiny:"):
        arch = model.split(":", 1)[1]
        return [] if arch in TINY_SHAPES else [
            f"model {model!r}: no tiny model {arch!r}; the tiny models are " + ", ".join(f"tiny:{a}" for a in TINY_SHAPES)]
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


# GRPOConfig arguments a preset's config may not hold: the lab sets them from what the preset says elsewhere, so a
# recipe has one source for each.
_SET_ELSEWHERE = {
    "bf16": "precision", "fp16": "precision", "tf32": "precision", "model_init_kwargs": "model and method",
    "output_dir": "--output-dir", "reward_weights": "reward_weights (the preset's, beside its rewards)",
    "gradient_checkpointing": "activation_checkpointing (transformers 5 ignores this old name when "
                              "activation_checkpointing is set, as every recipe does)",
    "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs (transformers 5's name)",
    "generation_batch_size": "per_device_train_batch_size and gradient_accumulation_steps (or steps_per_generation=N: "
                             "generation batch = per_device_train_batch_size x N)",
    **{key: "generation (labkit.generation.PATHS)" for key in GENERATION_FIELDS},
}


def config_errors(config: dict) -> list[str]:
    """Return what is wrong with a preset's ``config`` (``GRPOConfig`` arguments), before any model loads.

    Refused: a secret, a name the lab sets from another field (:data:`_SET_ELSEWHERE`), a name ``GRPOConfig`` does not
    have; a type ``GRPOConfig`` does not declare; a range or choice TRL does not check itself
    (:data:`TRL_NUMBER_RANGES`, :data:`TRL_CHOICES`); and whatever a real ``GRPOConfig`` built from the config (in a
    temporary folder, on the CPU) refuses, in TRL's own words. The recipe's own names
    (:data:`labkit.presets.RECIPE_CONFIG`) are checked without TRL; any other name imports it.
    """
    errors = _secret_errors(config)
    errors += [f"config may not set {key!r}: the lab sets it from {where}. Change that instead (--set FIELD=VALUE)."
               for key, where in _SET_ELSEWHERE.items() if key in config]
    extra = sorted(set(config) - set(RECIPE_CONFIG) - set(SECRET_FIELDS) - set(_SET_ELSEWHERE))
    hints, known = {}, set(RECIPE_CONFIG)
    if extra:
        import difflib
        import typing

        from trl import GRPOConfig

        hints, known = typing.get_type_hints(GRPOConfig), {f.name for f in dataclasses.fields(GRPOConfig)}
        for key in extra:
            if key not in known:
                close = difflib.get_close_matches(key, sorted(known), n=3)
                hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
                errors.append(f"GRPOConfig (trl) has no argument {key!r}.{hint}")
    for key, value in config.items():
        if key not in known or key in SECRET_FIELDS or key in _SET_ELSEWHERE:
            continue
        allowed = set(typing.get_args(hints[key])) or {hints[key]} if key in hints else set()
        # the recipe's own names the lab reads itself: None only where it has a meaning (_RECIPE_NONE)
        none_allowed = key in _RECIPE_NONE if key in RECIPE_CONFIG else type(None) in allowed
        error = None
        if key in TRL_CHOICES:
            if value not in TRL_CHOICES[key] and not (key == "scale_rewards" and isinstance(value, bool)):
                error = f"{key} must be one of {', '.join(TRL_CHOICES[key])}, not {value!r}."
        elif key in TRL_NUMBER_RANGES:
            kind, low, high, low_allowed = TRL_NUMBER_RANGES[key]
            error = _number_error(key, value, kind, low, high, low_allowed, none_allowed)
            if error and key == "save_steps" and value is None:
                error += " For no checkpoints, set save_strategy=no."
            if error and key == "num_generations" and isinstance(value, int) and value < 2:
                error = (f"num_generations must be at least 2 (the advantage compares completions of one prompt), "
                         f"not {value}. Set num_generations=4.")
                errors.append(error)
                continue
        elif key in _RECIPE_BOOLS or bool in allowed and allowed <= {bool, type(None)}:
            if not isinstance(value, bool) and not (value is None and none_allowed):
                error = f"{key} must be true or false, not {value!r}."
        elif value is None:
            if not none_allowed:
                error = f"{key} may not be None."
        elif allowed & {int, float} and not allowed & {str, dict, list}:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value) or (
                    float not in allowed and not isinstance(value, int)):
                error = f"{key} must be {_INT if float not in allowed else _FLOAT}, not {value!r}."
        elif allowed and allowed <= {str, type(None)} and not isinstance(value, str):
            error = f"{key} must be a text, not {value!r}."
        if error:
            errors.append(f"{error} Set --set {key}=VALUE.")
    epsilon, high = config.get("epsilon", 0.2), config.get("epsilon_high")
    if not errors and high is not None and high < epsilon:
        errors.append(f"epsilon_high ({high}) must be at least epsilon ({epsilon}).")
    if errors or not extra:
        return errors
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        try:
            GRPOConfig(output_dir=folder, use_cpu=True, report_to="none", **config)
        except Exception as exc:  # noqa: BLE001  whatever TRL refuses, as one line
            errors.append(f"config {extra}: GRPOConfig refuses them: {' '.join(str(exc).split())}")
    return errors


def process_count(num_processes: int | None) -> int:
    return num_processes or int(os.environ.get("WORLD_SIZE", "1"))


def _target_module_errors(plan: Plan, warnings: list[str]) -> list[str]:
    """Return the LoRA ``target_modules`` that name no Linear layer of the model, when its shape is known offline."""
    p = plan.preset
    if p.method == "full":
        return []
    try:
        shape = plan.shape
    except Exception:  # noqa: BLE001  not in the catalogue nor a local folder: the names cannot be checked
        warnings.append(f"could not read {p.model}'s layers offline: target_modules {list(p.target_modules)} "
                        "are unchecked.")
        return []
    names = sorted({name for name, _, _ in shape.lora_modules})
    unknown = [t for t in p.target_modules if t not in names]
    if unknown:
        return [f"target_modules {unknown} name no Linear layer of {p.model}; its layers are {', '.join(names)}. "
                f"Set --set target_modules={','.join(t for t in RECIPE_TARGETS if t in names) or names[0]}."]
    return []


def in_notebook_terms(error: str, names: dict[str, str]) -> str:
    """Return ``error`` in a notebook's terms: for each preset field that ``names`` maps to the settings-cell variable
    that sets it (``{"max_steps": "MAX_STEPS"}``), the command line's ``--set max_steps=VALUE`` becomes
    ``MAX_STEPS = VALUE in the settings cell``; an error about such a field without that hint gets the variable."""
    for field, variable in names.items():
        hinted = re.sub(rf"--set {re.escape(field)}=(\S+?)(?=[.,;)]?(\s|$))", rf"{variable} = \1 in the settings cell",
                        error)
        if hinted != error:
            error = hinted
        elif re.match(rf"{re.escape(field)}\b", error):
            error += ("" if error.endswith(".") else ".") + f" Change {variable} in the settings cell."
    return error


def _error_message(name: str, device, errors: list[str], *, about_device: bool = True, names=None) -> str:
    """Return one line for one error, a list for several (a bad value is not the device's fault); ``names``: see
    :func:`in_notebook_terms`."""
    errors = [in_notebook_terms(e, names) for e in errors] if names else errors
    head = f"preset {name!r} cannot run on {device}" if about_device else f"preset {name!r} has a value it cannot use"
    if len(errors) == 1:
        return f"{head}: {errors[0]}"
    lines = "\n".join(f"- {e}" for e in errors)
    return f"{head}:\n{lines}"


def _under_fsdp() -> bool:
    """True inside ``accelerate launch`` with an FSDP config (accelerate sets ``ACCELERATE_USE_FSDP``)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true")


def validate(preset: Preset | Plan, device=None, *, num_processes: int | None = None, fsdp: bool | None = None,
             names: dict[str, str] | None = None) -> list[str]:
    """Return warnings for ``preset`` on ``device``; raise :class:`PresetError` for what cannot work
    (:func:`checked_plan`, without the plan it checked)."""
    return checked_plan(preset, device, num_processes=num_processes, fsdp=fsdp, names=names)[1]


def checked_plan(preset: Preset | Plan, device=None, *, num_processes: int | None = None, fsdp: bool | None = None,
                 names: dict[str, str] | None = None) -> tuple[Plan, list[str]]:
    """Return ``(plan, warnings)``: ``preset`` resolved for ``device`` (:func:`labkit.presets.resolve_plan`, once; a
    :class:`labkit.presets.Plan` as it is) and checked; raise :class:`PresetError` for what cannot work. The checks read
    the plan's model path, shape and precision, so nothing is worked out twice.

    Every error message says what to change: on the command line by default (``--set max_steps=VALUE``); in a
    notebook, ``names`` maps the preset fields its settings cell sets to their variables
    (``names={"max_steps": "MAX_STEPS"}``) and the message names the variable instead (:func:`in_notebook_terms`).
    A :class:`PresetError` shows as its message alone in IPython, without a traceback. Checked before anything is
    loaded:

    - TRL's batch rule: the generation batch, ``per_device_train_batch_size x processes x
      steps_per_generation`` (``steps_per_generation`` = ``gradient_accumulation_steps`` by
      default), must be a multiple of ``num_generations``, so that each prompt's G
      completions land in one batch (``trl.GRPOConfig.__post_init__``); and G >= 2.
    - ``max_prompt_length + max_completion_length`` within the model's context.
    - the precision against the card (bf16 on a T4 or a CPU fails, :func:`labkit.device.choose_precision`).
    - 8-bit optimisers (bitsandbytes) run on CUDA and on the CPU (bitsandbytes 0.50), not on MPS (QLoRA's 4-bit
      weights do; a warning says the lab has not tried them there); ``prepare_model_for_kbit_training`` only with QLoRA.
    - under FSDP (``fsdp=True``, or ``accelerate launch --config_file labkit/configs/fsdp.yaml``):
      no bitsandbytes 8-bit optimiser (it does not support FSDP's sharded parameters, bitsandbytes
      issue 1633) and no QLoRA (FSDP needs ``bnb_4bit_quant_storage`` equal to the compute dtype to
      shard 4-bit weights, which labkit's loader does not set): refused, saying what to set.
    - a tool recipe (notebook 08) on a card: each tool round generates again on prompt + completion so far and asks
      ``max_completion_length`` new tokens; when that round's estimated generation cannot fit the card, refused with
      the figure and the changes that make it fit (:func:`_tool_errors`).
    """
    plan = preset if isinstance(preset, Plan) else None
    p = plan.preset if plan else preset
    device = device or (plan.card if plan and plan.card else detect_device())
    procs = process_count(num_processes)
    errors: list[str] = []
    warnings: list[str] = []

    problems = field_errors(p)
    try:
        if not problems:  # a method of the wrong type is already named there
            check_method(p.method)
    except ValueError as exc:
        problems.append(f"{exc}.")
    if problems:  # wrong types, ranges or method: the plan and the checks below would trip over them
        raise PresetError(_error_message(p.name, device, problems, about_device=False, names=names))
    if plan is None or plan.card != device:  # the one resolution, for the card checked: path, shape, precision
        plan = resolve_plan(p, device)
    from labkit.training import too_few_prompts  # build_trainer's check; here: training loads transformers

    c = p.config
    batch, g = c["per_device_train_batch_size"], c["num_generations"]
    per_step = batch * procs
    completions = per_step * p.steps_per_generation  # the generation batch, all processes
    try:  # TRL's batch rule, written once: labkit.memory.generation_batch
        generation_batch(batch, c["gradient_accumulation_steps"], c.get("steps_per_generation"), None, g, procs)
    except ValueError as exc:  # the change that mends it: the steps a generation spans, or the batch, or G
        knob = "steps_per_generation" if "steps_per_generation" in c else "gradient_accumulation_steps"
        fix = g // math.gcd(per_step, g)
        fix *= math.ceil(c[knob] / fix)
        errors.append(f"{exc}. Set --set {knob}={fix}, or --set per_device_train_batch_size={g}, or num_generations "
                      f"to a divisor of {completions}.")
    else:
        if p.train_limit and (problem := too_few_prompts(p.train_limit, completions, g)):
            errors.append(f"train_limit: {problem} Set train_limit to at least {completions // g}, or lower the "
                          "batch (per_device_train_batch_size, gradient_accumulation_steps or steps_per_generation).")
    errors.extend(_target_module_errors(plan, warnings))
    if c["optim"] not in OPTIMS:
        errors.append(f"optim must be one of {', '.join(OPTIMS)}, not {c['optim']!r}.")
    try:
        named_rewards(p.rewards, p.reward_weights)
    except ValueError as exc:
        errors.append(f"rewards: {exc}")

    context = plan.context
    total = p.max_prompt_length + c["max_completion_length"]
    if context is None:
        warnings.append(f"could not read {p.model}'s context length (offline?): prompt + completion length "
                        f"({total}) is unchecked.")
    elif total > context:
        errors.append(
            f"max_prompt_length ({p.max_prompt_length}) + max_completion_length ({c['max_completion_length']}) = "
            f"{total} tokens, more than {p.model}'s context of {context}. Set max_completion_length to at most "
            f"{max(1, context - p.max_prompt_length)}."
        )

    if plan.precision_error:
        errors.append(f"{plan.precision_error} (preset field: precision)")
    if device.kind == "mps" and c['optim'] in EIGHT_BIT_OPTIMS:
        # bitsandbytes 0.50.2 registers its 8-bit optimiser kernel for CUDA, the CPU and XPU, not for MPS
        # (backends/{cuda,cpu,xpu}/ops.py); its 4-bit kernels do run there (backends/mps/ops.py).
        errors.append(f"optim={c['optim']!r} (bitsandbytes' 8-bit AdamW) has no kernel for {device} in bitsandbytes "
                      f"0.50: set optim='adamw_torch'.")
    if device.kind == "mps" and p.method == "qlora":
        warnings.append("QLoRA on Apple's MPS: bitsandbytes 0.50 has 4-bit kernels there (a compiled kernel on "
                        "macOS 26, a slower torch fallback before), but the lab has not run it on a Mac; "
                        "method='lora' is the tested path.")
    if p.prepare_model_for_kbit_training and p.method != "qlora":
        errors.append(f"prepare_model_for_kbit_training applies to 4-bit models (method='qlora') only, not "
                      f"method={p.method!r}. Set prepare_model_for_kbit_training=false or method='qlora'.")
    if fsdp if fsdp is not None else _under_fsdp():
        if c['optim'] in EIGHT_BIT_OPTIMS:
            errors.append(f"optim={c['optim']!r} (bitsandbytes 8-bit) does not support FSDP's sharded parameters "
                          "(bitsandbytes issue 1633). Under FSDP set optim='adamw_torch' (--set optim=adamw_torch), "
                          "or launch with DDP (labkit/configs/multi_gpu.yaml) to keep the 8-bit optimiser.")
        if p.method == "qlora":
            errors.append("QLoRA under FSDP needs bnb_4bit_quant_storage set to the compute dtype so that the 4-bit "
                          "weights can be sharded; labkit's loader does not set it. Set method='lora' under FSDP, or "
                          "launch QLoRA with DDP (labkit/configs/multi_gpu.yaml).")
    if device.kind != "cuda" and not p.model.startswith("tiny:") and p.model not in LOCAL_MODELS:
        warnings.append(f"{p.model} on {device}: expect hours per step. The 'cpu-smollm2' and 'cpu-tiny' "
                        "presets are the CPU mode.")
    if c["learning_rate"] == 0:
        warnings.append("learning_rate is 0: the policy will not change (a control run, as the demo's).")
    if p.checkpoint_every is not None and p.checkpoint_every > c["max_steps"]:
        warnings.append(f"save_steps ({p.checkpoint_every}) > max_steps ({c['max_steps']}): no checkpoint before the "
                        "end, so an interrupted run starts again from step 0.")
    if p.method == "full" and p.lora_rank != Preset.lora_rank:
        warnings.append("lora_rank is ignored with method='full'.")
    path_errors, path_warnings = generation_problems(p, device)
    errors.extend(path_errors)
    warnings.extend(path_warnings)
    if not errors:  # the estimate needs every field sound
        errors.extend(_tool_errors(p, plan, procs))
    if errors:
        raise PresetError(_error_message(p.name, device, errors, names=names))
    return plan, warnings
