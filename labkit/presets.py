"""Named, validated GRPO recipes that fit a card, and the run that trains one (resumably).

Introduced in ``04_lora_grpo_16gb.ipynb``; ``python -m labkit train --preset NAME`` runs
the same code from a shell (and under ``accelerate launch``).

A :class:`Preset` bundles everything a GSM8K GRPO run needs: the model, full / LoRA /
QLoRA and its adapter settings, the ``GRPOConfig`` knobs that decide memory
(``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``num_generations``,
``max_completion_length``, the optimiser, gradient checkpointing) and the reward set.
The precision is never part of a preset: :mod:`labkit.device` picks it for the card
(bf16 on Ampere+, fp16 on a T4, fp32 on a CPU) unless you ask for one, and asking for one
the card cannot do fails in :func:`validate`.

``laptop-16gb`` is the published recipe that made GRPO fit a 16 GB RTX 3080 Mobile
(REFERENCES.md): per-device batch 1, gradient accumulation 4, 4 generations, prompts up
to 256 tokens, completions up to 786, LoRA on q/k/o/up/down, 8-bit AdamW, gradient
checkpointing.

Prompt length. TRL 1.16's ``GRPOConfig`` has no ``max_prompt_length``: ``GRPOTrainer``
tokenises the whole chat-templated prompt and never truncates it. Cutting a maths question
would drop the question, so :func:`training_prompts` *filters* instead: prompts longer than
``max_prompt_length`` tokens (chat template included) are dropped from the training set
before training, and the number dropped is reported.

Resume. A run writes its preset to ``OUTPUT_DIR/labkit_preset.json`` and into every
checkpoint. :func:`resume_checkpoint` finds the last checkpoint and refuses to continue it
with a different recipe (:class:`ResumeMismatchError` names every difference).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Preset",
    "PRESETS",
    "PresetError",
    "ResumeMismatchError",
    "get_preset",
    "validate",
    "model_context_length",
    "Preflight",
    "preflight",
    "training_prompts",
    "reward_functions",
    "resolve_model",
    "Run",
    "build_run",
    "last_checkpoint",
    "resume_checkpoint",
    "save_preset",
    "load_saved_preset",
    "RESUMABLE_CHANGES",
    "PRESET_FILE",
    "train_cli",
    "bench_preset",
    "bench_preset_cli",
]

_GIB = 1024**3
PRESET_FILE = "labkit_preset.json"
# Fields a resumed run may change: they do not change what the run computes.
RESUMABLE_CHANGES = ("description", "save_steps", "save_total_limit", "gradient_checkpointing", "eval_batch_size",
                     "card_gib")
_EIGHT_BIT_OPTIMS = ("adamw_bnb_8bit", "paged_adamw_8bit", "adamw_8bit")
_OPTIMS = ("adamw_torch", "adamw_torch_fused", *_EIGHT_BIT_OPTIMS, "paged_adamw_32bit")
# The published 16 GB recipe's LoRA targets (attention q/k/o and MLP up/down).
RECIPE_TARGETS = ("q_proj", "k_proj", "o_proj", "up_proj", "down_proj")


class PresetError(ValueError):
    """A preset that cannot train on this machine; the message says what to change."""


class ResumeMismatchError(ValueError):
    """A checkpoint made with a different recipe than the one asked to continue it."""


@dataclass(frozen=True)
class Preset:
    """One GRPO recipe: model, adapter, the memory knobs of ``GRPOConfig``, rewards, checkpoints.

    ``per_device_train_batch_size`` counts *completions*, as TRL does: with batch 1,
    accumulation 4 and ``num_generations`` 4, one optimiser step sees one prompt and its
    four completions. ``model`` is a hub id, a local path, or ``"tiny:qwen2"`` /
    ``"tiny:llama"`` for the offline tiny models of the CPU mode.
    """

    name: str
    model: str
    method: str = "lora"  # "full", "lora" or "qlora"
    description: str = ""
    lora_rank: int = 16
    lora_alpha: int | None = None  # None: 2 x rank
    target_modules: tuple[str, ...] = RECIPE_TARGETS
    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 4
    num_generations: int = 4
    max_prompt_length: int = 256
    max_completion_length: int = 786
    learning_rate: float = 2e-4  # LoRA needs a larger rate than full fine-tuning (REFERENCES: about 2e-4)
    optim: str = "adamw_bnb_8bit"
    gradient_checkpointing: bool = True
    precision: str | None = None  # None: labkit.device chooses for the card
    beta: float = 0.0  # TRL's default: no KL term, no reference pass
    temperature: float = 1.0
    max_steps: int = 200
    save_steps: int | None = 25  # checkpoint every N optimiser steps; None: no checkpoints
    save_total_limit: int | None = 2
    # "gsm8k": labkit.rewards.gsm8k_rewards() (accuracy, format, tag count, with its weights);
    # or names X of labkit.rewards.X_reward ("accuracy", "format", "soft_format", ...).
    rewards: tuple[str, ...] = ("gsm8k",)
    reward_weights: tuple[float, ...] | None = None  # None: gsm8k's own weights, 1.0 for named rewards
    train_limit: int | None = None  # None: the whole GSM8K train split
    eval_batch_size: int = 32
    card_gib: float | None = 16.0  # the card the recipe is made for (None: no GPU)
    # Any other GRPOConfig field, passed to TRL as given ({"loss_type": "grpo", "num_iterations": 2}).
    # Fields the preset itself sets are refused here: change them through the preset's own field.
    trl_options: dict = field(default_factory=dict)

    def replace(self, **changes) -> "Preset":
        """Return a copy with ``changes`` (any field); lists become tuples."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise PresetError(f"unknown preset field(s) {unknown}; the fields are: {', '.join(self.field_names())}")
        for key in ("target_modules", "rewards", "reward_weights"):
            if isinstance(changes.get(key), (list, str)):
                value = changes[key]
                changes[key] = tuple(value.split(",")) if isinstance(value, str) else tuple(value)
        if changes.get("reward_weights") is not None:
            changes["reward_weights"] = tuple(float(w) for w in changes["reward_weights"])
        if "trl_options" in changes:
            changes["trl_options"] = dict(changes["trl_options"] or {})
        return dataclasses.replace(self, **changes)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict:
        """Return the preset as plain JSON-able values (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> "Preset":
        """Return the preset that :meth:`to_dict` wrote (unknown keys are an error)."""
        data = dict(data)
        name = data.pop("name")
        model = data.pop("model")
        return cls(name=name, model=model).replace(**data)

    @property
    def generation_batch_size(self) -> int:
        """Completions generated at once on one device: TRL's default ``batch x accumulation``."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def prompts_per_step(self) -> float:
        return self.generation_batch_size / self.num_generations


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            name="laptop-16gb",
            model="Qwen/Qwen2.5-1.5B-Instruct",
            method="lora",
            description="The published 16 GB laptop recipe (RTX 3080 Mobile): LoRA, batch 1 x 4, G=4, "
                        "256 + 786 tokens, 8-bit AdamW, gradient checkpointing.",
        ),
        Preset(
            name="colab-t4",
            model="Qwen/Qwen2.5-1.5B-Instruct",
            method="lora",
            description="Free Colab T4 (15 GB, no bf16: fp16 is chosen): the laptop recipe with shorter "
                        "completions (a T4 generates slowly) and a paged 8-bit AdamW for memory spikes.",
            max_completion_length=512,
            optim="paged_adamw_8bit",
            card_gib=15.0,
        ),
        Preset(
            name="qlora-3b",
            model="Qwen/Qwen2.5-3B-Instruct",
            method="qlora",
            description="A 3B model on a 16 GB card: the frozen base in 4-bit NF4 (QLoRA), LoRA adapters "
                        "trained in the card's precision, the laptop recipe otherwise.",
            optim="paged_adamw_8bit",
        ),
        Preset(
            name="cpu-tiny",
            model="tiny:qwen2",
            method="lora",
            description="The CPU mode: the offline tiny Qwen2-shaped model, the same recipe scaled down "
                        "(byte-level tokens make prompts longer, so max_prompt_length is larger).",
            lora_rank=8,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            num_generations=4,
            max_prompt_length=512,
            max_completion_length=32,
            learning_rate=1e-2,
            optim="adamw_torch",
            max_steps=8,
            save_steps=4,
            train_limit=64,
            eval_batch_size=16,
            card_gib=None,
        ),
    ]
}


def get_preset(name: str | Preset, **overrides) -> Preset:
    """Return the named preset with ``overrides`` applied (``model=...``, ``max_steps=...``)."""
    if isinstance(name, Preset):
        return name.replace(**overrides) if overrides else name
    if name not in PRESETS:
        raise PresetError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]


# --------------------------------------------------------------------------- validation


def resolve_model(model: str) -> str:
    """Return a loadable name for a preset's model: ``"tiny:qwen2"`` becomes the tiny model's path."""
    if model.startswith("tiny:"):
        from labkit.models import build_tiny_model

        return str(build_tiny_model(model.split(":", 1)[1]))
    return model


def model_context_length(model: str) -> int | None:
    """Return the model's context (``max_position_embeddings``) without downloading weights, or None.

    Looks in the architecture catalogue, then a local ``config.json``, then the hub's (or
    its cache's) config; returns None when none of them answers.
    """
    from labkit.models import architecture_config

    if model.startswith("tiny:"):
        model = resolve_model(model)
    try:
        return int(architecture_config(model).max_position_embeddings)
    except KeyError:
        pass
    config_file = Path(model) / "config.json"
    if config_file.exists():
        return json.loads(config_file.read_text()).get("max_position_embeddings")
    try:
        from transformers import AutoConfig

        return int(AutoConfig.from_pretrained(model).max_position_embeddings)
    except Exception:  # offline, unknown id, or a config without the field
        return None


def _num_processes(num_processes: int | None) -> int:
    return num_processes or int(os.environ.get("WORLD_SIZE", "1"))


# GRPOConfig fields that build_run sets from a preset's own fields (or that change the generation batch
# the batch rule and the preflight check): trl_options may not set them, so a recipe has one source.
_SET_BY_PRESET = {
    "seed": "--seed", "per_device_train_batch_size": "per_device_train_batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps", "num_generations": "num_generations",
    "max_completion_length": "max_completion_length", "max_prompt_length": "max_prompt_length",
    "learning_rate": "learning_rate", "optim": "optim", "beta": "beta", "temperature": "temperature",
    "max_steps": "max_steps", "save_steps": "save_steps", "save_strategy": "save_steps",
    "save_total_limit": "save_total_limit", "reward_weights": "reward_weights",
    "gradient_checkpointing": "gradient_checkpointing", "activation_checkpointing": "gradient_checkpointing",
    "gradient_checkpointing_kwargs": "gradient_checkpointing",
    "activation_checkpointing_kwargs": "gradient_checkpointing",
    "bf16": "precision", "fp16": "precision", "tf32": "precision", "model_init_kwargs": "model and method",
    "output_dir": "--output-dir", "steps_per_generation": "gradient_accumulation_steps",
    "generation_batch_size": "per_device_train_batch_size and gradient_accumulation_steps",
}


def _trl_option_errors(options: dict) -> list[str]:
    """Return what is wrong with a preset's ``trl_options``: unknown GRPOConfig fields, or ones the preset sets."""
    if not options:
        return []
    import difflib

    from trl import GRPOConfig

    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    errors = []
    for key in options:
        if key in _SET_BY_PRESET:
            errors.append(f"trl_options may not set {key!r}: the preset sets it from {_SET_BY_PRESET[key]}. "
                          f"Change that instead (python -m labkit train --set FIELD=VALUE).")
        elif key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            errors.append(f"trl_options: GRPOConfig (trl) has no field {key!r}.{hint}")
    return errors


def validate(preset: Preset, device=None, *, num_processes: int | None = None) -> list[str]:
    """Return warnings for ``preset`` on ``device``; raise :class:`PresetError` for what cannot work.

    Every error message says what to change. Checked before anything is loaded:

    - TRL's batch rule: the generation batch, ``per_device_train_batch_size x processes x
      steps_per_generation`` (``steps_per_generation`` = ``gradient_accumulation_steps`` by
      default), must be a multiple of ``num_generations``, so that each prompt's G
      completions land in one batch (``trl.GRPOConfig.__post_init__``); and G >= 2.
    - ``max_prompt_length + max_completion_length`` within the model's context.
    - the precision against the card (bf16 on a T4 or a CPU fails, via :mod:`labkit.device`).
    - QLoRA and 8-bit optimisers (bitsandbytes) need CUDA.
    """
    from labkit.device import detect_device, precision_flags

    device = device or detect_device()
    procs = _num_processes(num_processes)
    errors: list[str] = []
    warnings: list[str] = []
    p = preset

    if p.method not in ("full", "lora", "qlora"):
        errors.append(f"method must be 'full', 'lora' or 'qlora', not {p.method!r}.")
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "max_prompt_length",
                 "max_completion_length", "max_steps", "lora_rank", "eval_batch_size"):
        if getattr(p, name) < 1:
            errors.append(f"{name} must be at least 1, not {getattr(p, name)}.")
    if p.num_generations < 2:
        errors.append(f"num_generations must be at least 2 (the advantage compares completions of one prompt), "
                      f"not {p.num_generations}. Set num_generations=4.")
    elif min(p.per_device_train_batch_size, p.gradient_accumulation_steps) >= 1:
        per_step = p.per_device_train_batch_size * procs
        generation_batch = per_step * p.gradient_accumulation_steps
        if generation_batch % p.num_generations:
            g = p.num_generations
            accumulation = g // math.gcd(per_step, g)
            accumulation *= math.ceil(p.gradient_accumulation_steps / accumulation)
            errors.append(
                f"per_device_train_batch_size ({p.per_device_train_batch_size}) x processes ({procs}) x "
                f"gradient_accumulation_steps ({p.gradient_accumulation_steps}) = {generation_batch} completions per "
                f"generation batch, which must be a multiple of num_generations ({g}): TRL generates each prompt's "
                f"{g} completions in one batch. Set gradient_accumulation_steps={accumulation}, or "
                f"per_device_train_batch_size={g}, or num_generations to a divisor of {generation_batch}."
            )
    errors.extend(_trl_option_errors(p.trl_options))
    if p.learning_rate <= 0:
        errors.append(f"learning_rate must be positive, not {p.learning_rate}.")
    if p.beta < 0:
        errors.append(f"beta must be >= 0, not {p.beta}.")
    if p.optim not in _OPTIMS:
        errors.append(f"optim must be one of {', '.join(_OPTIMS)}, not {p.optim!r}.")
    if p.save_steps is not None and p.save_steps < 1:
        errors.append(f"save_steps must be at least 1 (or None for no checkpoints), not {p.save_steps}.")
    try:
        reward_functions(p)
    except ValueError as exc:
        errors.append(str(exc))

    context = model_context_length(p.model)
    total = p.max_prompt_length + p.max_completion_length
    if context is None:
        warnings.append(f"could not read {p.model}'s context length (offline?): prompt + completion length "
                        f"({total}) is unchecked.")
    elif total > context:
        errors.append(
            f"max_prompt_length ({p.max_prompt_length}) + max_completion_length ({p.max_completion_length}) = "
            f"{total} tokens, more than {p.model}'s context of {context}. Set max_completion_length to at most "
            f"{max(1, context - p.max_prompt_length)}."
        )

    try:
        precision_flags(device, p.precision)
    except ValueError as exc:
        errors.append(f"{exc} (preset field: precision)")
    if device.kind != "cuda":
        if p.method == "qlora":
            errors.append(f"QLoRA stores the frozen weights in 4-bit with bitsandbytes, which needs a CUDA GPU; "
                          f"this machine has {device}. Set method='lora' (or use the 'cpu-tiny' preset here).")
        if p.optim in _EIGHT_BIT_OPTIMS:
            errors.append(f"optim={p.optim!r} is a bitsandbytes 8-bit optimiser, which needs a CUDA GPU; this "
                          f"machine has {device}. Set optim='adamw_torch'.")
        if not p.model.startswith("tiny:"):
            warnings.append(f"{p.model} on {device}: expect hours per step. The 'cpu-tiny' preset is the CPU mode.")
    if p.save_steps is not None and p.save_steps > p.max_steps:
        warnings.append(f"save_steps ({p.save_steps}) > max_steps ({p.max_steps}): no checkpoint before the end, "
                        "so an interrupted run starts again from step 0.")
    if p.method == "full" and p.lora_rank != Preset.lora_rank:
        warnings.append("lora_rank is ignored with method='full'.")
    if errors:
        lines = "\n".join(f"- {e}" for e in errors)
        raise PresetError(f"preset {p.name!r} cannot run on {device}:\n{lines}")
    return warnings


# --------------------------------------------------------------------------- preflight


@dataclass
class Preflight:
    """What :func:`preflight` found: the estimate against the card, and what to change first."""

    preset: str
    model: str
    method: str
    card: str
    card_gib: float | None
    estimate_gib: float
    breakdown: dict
    margin_gib: float
    changes: list = field(default_factory=list)  # [(labkit.oom.Change, GiB after it alone)], biggest cut first
    plan: list = field(default_factory=list)  # [(labkit.oom.Change, GiB after it and those above)] until it fits

    @property
    def fits(self) -> bool | None:
        """True when the estimate plus the margin fits the card; None without a card to compare."""
        if self.card_gib is None:
            return None
        return self.estimate_gib + self.margin_gib <= self.card_gib

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in self.breakdown.items() if isinstance(v, (int, float)))
        lines = [f"preflight {self.preset}: {self.model} ({self.method}) needs about {self.estimate_gib:.1f} GiB "
                 f"(estimate: {parts})"]
        if self.card_gib is None:
            lines.append(f"{self.card}: no GPU memory to compare with.")
        else:
            verdict = "fits" if self.fits else "does NOT fit"
            lines.append(f"{self.card} has {self.card_gib:.1f} GiB: {verdict} with a {self.margin_gib:.1f} GiB margin "
                         f"({self.card_gib - self.estimate_gib:+.1f} GiB left).")
        if self.plan and not self.fits:
            fits = self.plan[-1][1] + self.margin_gib <= self.card_gib
            lines.append("Change, in this order" + (" until it fits" if fits else " (still not enough: a bigger card)")
                         + " (estimated total after each step):")
            lines += [f"  {i}. {change} -> about {after:.1f} GiB" for i, (change, after) in enumerate(self.plan, 1)]
        return "\n".join(lines)


def _estimate_model_name(preset: Preset) -> str:
    return resolve_model(preset.model) if preset.model.startswith("tiny:") else preset.model


def _estimate(preset: Preset, precision: str):
    """Return :func:`labkit.memory.estimate` for the preset (its batch counted in prompts, as there)."""
    from labkit.memory import estimate

    return estimate(
        _estimate_model_name(preset), preset.method,
        num_generations=preset.num_generations,
        per_device_batch=max(1, preset.generation_batch_size // preset.num_generations),
        gradient_accumulation_steps=preset.gradient_accumulation_steps,
        prompt_len=preset.max_prompt_length,
        completion_len=preset.max_completion_length,
        optimizer="adamw_8bit" if preset.optim in _EIGHT_BIT_OPTIMS else "adamw",
        gradient_checkpointing=preset.gradient_checkpointing,
        beta=preset.beta,
        precision=precision,
        lora_rank=preset.lora_rank,
        lora_targets=list(preset.target_modules),
    )


_TERMS = ("weights", "reference", "optimizer", "gradients", "activations", "logits", "kv_cache")


def _total_and_breakdown(result) -> tuple[float, dict]:
    return result.total, {k: result.bytes[k] / _GIB for k in _TERMS if result.bytes.get(k)}


def _ranked_changes(preset: Preset, precision: str) -> list:
    """Return ``[(change, GiB after it)]`` for every candidate change that cuts the estimate, biggest cut first."""
    from labkit.oom import candidate_changes

    total, _ = _total_and_breakdown(_estimate(preset, precision))
    ranked = []
    for change in candidate_changes(preset.to_dict()):
        try:
            after, _ = _total_and_breakdown(_estimate(preset.replace(**change.updates), precision))
        except (ValueError, KeyError):  # a change the estimator cannot model
            continue
        if after < total - 0.01:
            ranked.append((change, after))
    return sorted(ranked, key=lambda item: (item[0].kind == "model", item[1]))


def preflight(preset: Preset | str, device=None, *, card_gib: float | None = None, margin_gib: float = 1.0) -> Preflight:
    """Return a :class:`Preflight`: :func:`labkit.memory.estimate` for the preset against the card.

    ``card_gib`` overrides the detected card's memory (plan for a 16 GB laptop from
    anywhere: ``preflight("laptop-16gb", card_gib=16)``). When it does not fit, every
    candidate change of :func:`labkit.oom.candidate_changes` is estimated alone
    (``changes``, the biggest cut first, another model last), and ``plan`` applies the
    biggest cut, re-estimates and repeats until the run fits: the settings to change first.
    """
    from labkit.device import choose_precision, detect_device

    preset = get_preset(preset)
    device = device or detect_device()
    if card_gib is None:
        card_gib = device.total_memory_gib if device.kind == "cuda" else None
        card = str(device)
    else:
        card = f"a {card_gib:g} GiB card"
    if preset.precision:
        precision = preset.precision
    elif device.kind == "cuda":
        precision = choose_precision(device)
    else:  # planning for a GPU from here: the tiny models train in fp32, real ones on an Ampere+ card in bf16
        precision = "fp32" if preset.model.startswith("tiny:") else "bf16"
    total, breakdown = _total_and_breakdown(_estimate(preset, precision))
    report = Preflight(preset.name, preset.model, preset.method, card, card_gib, total, breakdown, margin_gib)
    if card_gib is not None and not report.fits:
        report.changes = _ranked_changes(preset, precision)
        # The plan: take the biggest cut, re-estimate, repeat until it fits. Another model comes last:
        # it changes what you train, not how.
        current, current_total = preset, total
        while current_total + margin_gib > card_gib:
            ranked = _ranked_changes(current, precision)
            if not ranked:
                break
            change, after = ranked[0]
            current, current_total = current.replace(**change.updates), after
            report.plan.append((change, after))
    return report


# --------------------------------------------------------------------------- data and rewards


def training_prompts(preset: Preset, tokenizer, *, split: str = "train", limit: int | None = None, seed: int = 0):
    """Return ``(dataset, dropped)``: GSM8K prompts at most ``max_prompt_length`` tokens, and how many were dropped.

    The length is the chat-templated prompt's, with the generation prompt, i.e. exactly what
    ``GRPOTrainer`` feeds the model. TRL 1.16 has no ``max_prompt_length``; filtering
    (rather than cutting the question short) keeps every prompt intact.
    """
    from labkit.data import load_gsm8k

    limit = limit if limit is not None else preset.train_limit
    dataset = load_gsm8k(split, seed=seed)
    # Measure only what may be kept: with a limit, a window a few times larger is plenty.
    window = dataset if limit is None else dataset.select(range(min(len(dataset), 4 * limit + 64)))
    lengths = [len(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"]) for p in window["prompt"]]
    if limit is not None and len(window) < len(dataset) and sum(n <= preset.max_prompt_length for n in lengths) < limit:
        window = dataset
        lengths = [len(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True,
                                                     return_dict=True)["input_ids"]) for p in window["prompt"]]
    keep, dropped = [], 0
    for index, n in enumerate(lengths):
        if limit is not None and len(keep) == limit:
            break
        if n <= preset.max_prompt_length:
            keep.append(index)
        else:
            dropped += 1
    if not keep:
        raise PresetError(f"every prompt is longer than max_prompt_length={preset.max_prompt_length} tokens; raise it.")
    kept = window.select(keep).add_column("prompt_length", [lengths[i] for i in keep])
    return kept, dropped


def reward_functions(preset: Preset) -> tuple[list, list[float]]:
    """Return ``(reward_funcs, reward_weights)`` for ``GRPOTrainer`` / ``GRPOConfig`` from :mod:`labkit.rewards`."""
    from labkit import rewards

    funcs, weights = [], []
    for name in preset.rewards:
        if name == "gsm8k":
            more, more_weights = rewards.gsm8k_rewards()
            funcs += more
            weights += more_weights
        elif f"{name}_reward" in rewards.__all__:
            funcs.append(getattr(rewards, f"{name}_reward"))
            weights.append(1.0)
        else:
            known = sorted(n.removesuffix("_reward") for n in rewards.__all__ if n.endswith("_reward"))
            raise ValueError(f"unknown reward {name!r}: use 'gsm8k' or any of {', '.join(known)}.")
    if not funcs:
        raise ValueError("rewards is empty: use rewards=('gsm8k',).")
    if preset.reward_weights is not None:
        if len(preset.reward_weights) != len(funcs):
            raise ValueError(f"reward_weights has {len(preset.reward_weights)} values for {len(funcs)} reward "
                             f"functions ({', '.join(f.__name__ for f in funcs)}).")
        weights = list(preset.reward_weights)
    return funcs, weights


# --------------------------------------------------------------------------- checkpoints and resume


def last_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """Return the newest complete ``checkpoint-N`` folder in ``output_dir`` (None when there is none).

    A folder without ``trainer_state.json`` was cut off while being written (the process
    died mid-save) and is skipped.
    """
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    found = []
    for path in folder.glob("checkpoint-*"):
        step = path.name.removeprefix("checkpoint-")
        if path.is_dir() and step.isdigit() and (path / "trainer_state.json").exists():
            found.append((int(step), path))
    return max(found)[1] if found else None


def save_preset(preset: Preset, folder: str | os.PathLike) -> Path:
    """Write ``preset`` (plus labkit's version) to ``folder/labkit_preset.json`` and return the path."""
    from labkit import __version__

    path = Path(folder) / PRESET_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"labkit": __version__, "preset": preset.to_dict()}, indent=2) + "\n")
    return path


def load_saved_preset(folder: str | os.PathLike) -> Preset | None:
    """Return the preset saved in ``folder`` (a run or a checkpoint), or None when there is none."""
    path = Path(folder) / PRESET_FILE
    if not path.exists():
        return None
    return Preset.from_dict(json.loads(path.read_text())["preset"])


def resume_checkpoint(output_dir: str | os.PathLike, preset: Preset, resume: bool | str = "auto") -> Path | None:
    """Return the checkpoint to resume from (None: start at step 0), after checking the recipe matches.

    ``resume="auto"`` resumes when there is a checkpoint; ``True`` requires one; ``False``
    refuses a folder that already holds checkpoints (stale ones would be resumed later by
    mistake); a path resumes that checkpoint. The saved preset (the checkpoint's copy, else
    the run's) must equal ``preset`` except for :data:`RESUMABLE_CHANGES`; otherwise
    :class:`ResumeMismatchError` lists every difference.
    """
    output_dir = Path(output_dir)
    if isinstance(resume, (str, os.PathLike)) and str(resume) != "auto":
        checkpoint = Path(resume)
        if not (checkpoint / "trainer_state.json").exists():
            raise FileNotFoundError(f"{checkpoint} is not a checkpoint (no trainer_state.json)")
    else:
        checkpoint = last_checkpoint(output_dir)
        if resume is False:
            if checkpoint is not None:
                raise ResumeMismatchError(
                    f"{output_dir} already holds checkpoints ({checkpoint.name}) from an earlier run. Resume it "
                    "(resume='auto'), or choose a new output_dir, or delete the old checkpoints."
                )
            return None
        if checkpoint is None:
            if resume is True:
                raise FileNotFoundError(f"resume=True but {output_dir} has no checkpoint to resume from")
            return None
    saved = load_saved_preset(checkpoint) or load_saved_preset(output_dir)
    if saved is None:
        raise ResumeMismatchError(
            f"{checkpoint} has no {PRESET_FILE}, so its recipe cannot be checked. Resume it with "
            "trainer.train(resume_from_checkpoint=...) yourself, or start a new output_dir."
        )
    now, before = preset.to_dict(), saved.to_dict()
    differences = [f"{k}: checkpoint {before.get(k)!r}, now {now.get(k)!r}"
                   for k in now if k not in RESUMABLE_CHANGES and now.get(k) != before.get(k)]
    if differences:
        lines = "\n".join(f"- {d}" for d in differences)
        raise ResumeMismatchError(
            f"{checkpoint} was trained with a different recipe than the one asked to continue it:\n{lines}\n"
            f"Continue with the saved recipe (labkit.presets.load_saved_preset({str(checkpoint)!r})), or start a "
            "new output_dir for the new recipe. Only these may change on resume: " + ", ".join(RESUMABLE_CHANGES)
        )
    return checkpoint


def _preset_callback(preset: Preset):
    from transformers import TrainerCallback

    class SavePresetCallback(TrainerCallback):
        """Copies the run's preset into every checkpoint, so a checkpoint says how it was made."""

        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                save_preset(preset, Path(args.output_dir) / f"checkpoint-{state.global_step}")

    return SavePresetCallback()


# --------------------------------------------------------------------------- the run


@dataclass
class Run:
    """A preset made concrete: the trainer, its data, and where its checkpoints go."""

    preset: Preset
    trainer: object  # trl.GRPOTrainer
    tokenizer: object
    train_dataset: object
    dropped_prompts: int
    output_dir: Path
    warnings: list = field(default_factory=list)

    @property
    def model(self):
        return self.trainer.model

    def train(self, resume: bool | str = "auto"):
        """Return TRL's ``TrainOutput`` after training, resumed from the last checkpoint when there is one.

        An out-of-memory error becomes :class:`labkit.oom.TrainingOutOfMemory`, whose message
        is the OOM doctor's short report; the checkpoints already written are kept.
        """
        from labkit.oom import train_with_oom_doctor

        checkpoint = resume_checkpoint(self.output_dir, self.preset, resume)
        if self.trainer.args.should_save:
            save_preset(self.preset, self.output_dir)
        if checkpoint is not None and _is_main_process():
            print(f"resuming from {checkpoint} (step {checkpoint.name.removeprefix('checkpoint-')})")
        return train_with_oom_doctor(self.trainer, resume_from_checkpoint=str(checkpoint) if checkpoint else None,
                                     settings=self.preset.to_dict())

    def save(self, folder: str | os.PathLike | None = None) -> Path:
        """Save the trained adapter (or model) and the tokenizer to ``folder`` (``OUTPUT_DIR/final``)."""
        folder = Path(folder or self.output_dir / "final")
        self.trainer.save_model(str(folder))
        if self.trainer.args.should_save:
            self.tokenizer.save_pretrained(str(folder))
            save_preset(self.preset, folder)
        return folder


def _is_main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _grpo_settings(preset: Preset, seed: int) -> dict:
    """Return the ``GRPOConfig`` fields a preset's own fields set (every key is in :data:`_SET_BY_PRESET`)."""
    return dict(
        seed=seed,
        per_device_train_batch_size=preset.per_device_train_batch_size,
        gradient_accumulation_steps=preset.gradient_accumulation_steps,
        num_generations=preset.num_generations,
        max_completion_length=preset.max_completion_length,
        learning_rate=preset.learning_rate,
        optim=preset.optim,
        activation_checkpointing=preset.gradient_checkpointing,
        # Non-reentrant checkpointing works with frozen inputs; LoRA still needs build_run's input-grad fix.
        activation_checkpointing_kwargs={"use_reentrant": False} if preset.gradient_checkpointing else None,
        beta=preset.beta,
        temperature=preset.temperature,
        max_steps=preset.max_steps,
        save_strategy="steps" if preset.save_steps else "no",
        save_steps=preset.save_steps or 500,
        save_total_limit=preset.save_total_limit,
    )


def build_run(preset: Preset | str, output_dir: str | os.PathLike, *, device=None, model=None, tokenizer=None,
              train_dataset=None, callbacks=None, seed: int = 0, num_processes: int | None = None,
              print_logs: bool = True, **config_overrides) -> Run:
    """Return a :class:`Run`: the preset validated, its prompts filtered, a ``GRPOTrainer`` built.

    ``model`` (with ``tokenizer``) is a policy you already loaded (for example with
    :func:`labkit.models.load_policy`, to evaluate it first); without one, full and LoRA
    runs hand the model's path to TRL, which loads it (the right way under ``accelerate
    launch``, where each process or shard loads its part), and QLoRA runs load it with
    :func:`labkit.models.load_policy`. ``config_overrides`` go to ``GRPOConfig``
    (``logging_steps=5``, ``disable_tqdm=True``, ``generation_kwargs=...``).
    ``print_logs=False`` drops transformers' printing of every log line and its progress bar
    (a :class:`labkit.dashboard.LiveDashboard` shows both).
    """
    from labkit.device import choose_precision, detect_device, torch_dtype
    from labkit.models import load_policy, load_tokenizer, lora_config
    from labkit.training import build_trainer, grpo_config

    preset = get_preset(preset)
    device = device or detect_device()
    warnings = validate(preset, device, num_processes=num_processes)
    precision = preset.precision or choose_precision(device)
    name = resolve_model(preset.model)
    output_dir = Path(output_dir)

    settings = _grpo_settings(preset, seed)
    reward_funcs, settings["reward_weights"] = reward_functions(preset)
    settings.update(preset.trl_options)
    settings.update(config_overrides)
    peft_config = None
    if model is None and preset.method in ("full", "lora"):
        # TRL loads the model from its path (per process under accelerate); with a peft_config and
        # gradient checkpointing it calls enable_input_require_grads() itself.
        settings["model_init_kwargs"] = {"dtype": str(torch_dtype(precision, preset.method)).removeprefix("torch.")}
        if _num_processes(num_processes) > 1:  # each process loads a whole copy (DDP) or its shard (FSDP, ZeRO-3)
            settings["model_init_kwargs"]["device_map"] = None
        tokenizer = tokenizer or load_tokenizer(name)
        if preset.method == "lora":
            peft_config = lora_config(preset.lora_rank, preset.lora_alpha, target_modules=list(preset.target_modules))
        model = name
    args = grpo_config(output_dir, device=device, precision=preset.precision, **settings)
    if model is None:  # qlora: 4-bit loading goes through labkit (prepare_model_for_kbit_training, input grads)
        model, tokenizer = load_policy(name, "qlora", precision=precision, lora_rank=preset.lora_rank,
                                       lora_alpha=preset.lora_alpha, target_modules=list(preset.target_modules),
                                       gradient_checkpointing=preset.gradient_checkpointing)
    elif not isinstance(model, str):
        if tokenizer is None:
            raise ValueError("pass the tokenizer together with a loaded model")
        if preset.gradient_checkpointing and hasattr(model, "peft_config"):
            # The classic LoRA pitfall: with checkpointing and a frozen embedding, nothing entering a
            # checkpointed block requires grad and the adapters get no gradient at all.
            model.enable_input_require_grads()
    dropped = 0
    if train_dataset is None:
        train_dataset, dropped = training_prompts(preset, tokenizer, seed=seed)
    callbacks = [*(callbacks or []), _preset_callback(preset)]
    trainer = build_trainer(model, reward_funcs, train_dataset, args, tokenizer=tokenizer,
                            peft_config=peft_config, callbacks=callbacks)
    if not print_logs:
        from transformers import PrinterCallback, ProgressCallback

        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
    return Run(preset, trainer, tokenizer, train_dataset, dropped, output_dir, warnings)


# --------------------------------------------------------------------------- command line


def _parse_value(text: str):
    lowered = text.lower()
    if lowered in ("none", "null"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _overrides(pairs: list[str], option: str = "--set") -> dict:
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise PresetError(f"{option} takes KEY=VALUE, not {pair!r}")
        key, value = pair.split("=", 1)
        out[key.strip()] = _parse_value(value.strip())
    return out


def _train_parser():
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m labkit train",
        description="Train GRPO on GSM8K with a named preset; re-run the same command to resume after an interruption.",
    )
    parser.add_argument("--preset", default=None, help=f"one of: {', '.join(PRESETS)}")
    parser.add_argument("--list", action="store_true", help="list the presets and exit")
    parser.add_argument("--model", help="override the preset's model (hub id or local path)")
    parser.add_argument("--output-dir", help="where checkpoints and the final adapter go (default runs/PRESET)")
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--save-steps", type=int)
    parser.add_argument("--train-limit", type=int)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override any preset field")
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                        help="any other GRPOConfig field, e.g. loss_type=grpo num_iterations=2 (kept in the recipe)")
    parser.add_argument("--resume", default="auto", help="auto (default), yes, no, or a checkpoint path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true", help="validate and run the preflight check, then exit")
    return parser


def train_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit train --preset NAME [...]``: validate, preflight, train (resuming), save.

    Works as a plain script under ``accelerate launch ... -m labkit train --preset NAME``.
    Exit codes: 0 done, 2 a preset or resume error (message says what to change), 3 out of memory.
    """
    from labkit.device import detect_device
    from labkit.oom import TrainingOutOfMemory

    args = _train_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.list or not args.preset:
        for preset in PRESETS.values():
            print(f"{preset.name:<12} {preset.model} ({preset.method}): {preset.description}")
        return 0 if args.list else 2
    main = _is_main_process()
    try:
        overrides = _overrides(args.set)
        if args.config:
            overrides["trl_options"] = {**overrides.get("trl_options", {}), **_overrides(args.config, "--config")}
        for key in ("model", "max_steps", "save_steps", "train_limit"):
            if getattr(args, key) is not None:
                overrides[key] = getattr(args, key)
        preset = get_preset(args.preset, **overrides)
        if "LOCAL_RANK" in os.environ:  # accelerate launch: one GPU per process
            import torch

            if torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = detect_device()
        for warning in validate(preset, device):
            print("warning:", warning, file=sys.stderr) if main else None
        if main:
            print(f"preset {preset.name}: {preset.description}")
            try:
                print(preflight(preset, device))
            except ImportError as exc:  # labkit.memory missing in a partial install
                print(f"(no preflight memory check: {exc})")
        if args.dry_run:
            return 0
        resume = {"auto": "auto", "yes": True, "no": False}.get(args.resume, args.resume)
        output_dir = Path(args.output_dir or Path("runs") / preset.name)
        resume_checkpoint(output_dir, preset, resume)  # a changed recipe fails here, before loading anything
        run = build_run(preset, output_dir, device=device, seed=args.seed)
        if main and run.dropped_prompts:
            print(f"dropped {run.dropped_prompts} prompts longer than {preset.max_prompt_length} tokens; "
                  f"training on {len(run.train_dataset)}")
        result = run.train(resume=resume)
        final = run.save()
        if main:
            print(f"done: {result.global_step} steps; saved to {final}")
        return 0
    except TrainingOutOfMemory as exc:
        print(exc, file=sys.stderr)
        return 3
    except (PresetError, ResumeMismatchError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------- benchmark


def _random_weights_model(preset: Preset, folder: Path, precision: str) -> str:
    """Return a loadable path for the preset's model: its architecture with random weights, saved to ``folder``
    (:func:`labkit.models.save_random_architecture`), or the tiny model's path."""
    import torch

    from labkit.device import torch_dtype
    from labkit.models import save_random_architecture

    if preset.model.startswith("tiny:"):
        return resolve_model(preset.model)
    dtype = torch_dtype(precision, "lora" if preset.method == "qlora" else preset.method)
    # Random init is much faster on a GPU; the weights are saved and freed before the measured run starts.
    return save_random_architecture(preset.model, folder, dtype=dtype,
                                    device="cuda" if torch.cuda.is_available() else "cpu")


def _fixed_length_prompts(tokenizer, n: int, length: int):
    """Return ``n`` conversational prompts of exactly ``length`` tokens (chat template included)."""
    from datasets import Dataset

    from labkit.data import load_gsm8k

    overhead = len(tokenizer.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=True)["input_ids"])
    questions = load_gsm8k("train", limit=n)
    prompts, answers = [], []
    for row in questions:
        text = (row["question"] + " ") * 20
        ids = tokenizer(text.encode("ascii", "ignore").decode(), add_special_tokens=False)["input_ids"]
        content = tokenizer.decode(ids[: max(0, length - overhead)])
        prompts.append([{"role": "user", "content": content}])
        answers.append(row["answer"])
    got = len(tokenizer.apply_chat_template(prompts[0], add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"])
    if got != length:
        raise RuntimeError(f"built a {got}-token prompt, wanted {length}")
    return Dataset.from_dict({"prompt": prompts, "answer": answers})


def bench_preset(preset: Preset | str, *, steps: int = 5, cap_gib: float | None = 16.0, min_spare_gib: float = 1.0,
                 device=None, workdir: str | os.PathLike | None = None) -> dict:
    """Return the figures of ``steps`` GRPO steps of ``preset`` on its architecture with random weights.

    Worst case on purpose: every prompt is exactly ``max_prompt_length`` tokens and every
    completion runs to ``max_completion_length`` (``min_new_tokens`` forbids an early stop).
    On CUDA the process is capped at ``cap_gib`` (``torch.cuda.set_per_process_memory_fraction``)
    and the record says whether the peak reserved memory left ``min_spare_gib`` to spare.
    Seconds per step and tokens per second leave out the first step (warm-up). On a CPU the
    memory figures are None: this is a smoke test of the command, not a measurement.
    """
    import torch
    from transformers import TrainerCallback

    from labkit.device import choose_precision, detect_device
    from labkit.lab import provenance
    from labkit.oom import TrainingOutOfMemory

    preset = get_preset(preset)
    device = device or detect_device()
    precision = preset.precision or choose_precision(device)
    cuda = device.kind == "cuda"
    if cuda and cap_gib is not None:
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        if cap_gib * _GIB > total:
            raise ValueError(f"cap_gib={cap_gib} is more than this card's {total / _GIB:.1f} GiB")
        torch.cuda.set_per_process_memory_fraction(cap_gib * _GIB / total)
    record = {"preset": preset.name, "model": preset.model, "method": preset.method, "precision": precision,
              "steps": steps, "cap_gib": cap_gib if cuda else None, "min_spare_gib": min_spare_gib,
              "weights": "random (labkit.models.build_architecture)" if not preset.model.startswith("tiny:") else "tiny",
              "prompt_tokens": preset.max_prompt_length, "completion_tokens": preset.max_completion_length,
              "settings": preset.to_dict()}
    times, tokens, lengths = [], [], []

    class Meter(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "step_time" in logs:
                times.append(float(logs["step_time"]))
                tokens.append(float(logs.get("num_tokens", float("nan"))))
                lengths.append(float(logs.get("completions/mean_length", float("nan"))))

    owned = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="labkit-bench-"))
    try:
        model_path = _random_weights_model(preset, workdir / "model", precision)
        bench = preset.replace(model=model_path, max_steps=steps, save_steps=None)
        from labkit.models import load_tokenizer

        tokenizer = load_tokenizer(model_path)
        n = max(8, steps * math.ceil(bench.prompts_per_step) * 2)
        dataset = _fixed_length_prompts(tokenizer, n, bench.max_prompt_length)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        run = build_run(bench, workdir / "run", device=device, tokenizer=tokenizer, train_dataset=dataset,
                        callbacks=[Meter()], disable_tqdm=True,
                        generation_kwargs={"min_new_tokens": bench.max_completion_length})
        start = time.perf_counter()
        try:
            run.train(resume=False)
            record["oom"] = None
        except TrainingOutOfMemory as exc:
            record["oom"] = str(exc.report)
        record["wall_seconds"] = round(time.perf_counter() - start, 2)
    finally:
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)
    record["steps_done"] = len(times)
    timed = times[1:] if len(times) > 1 else times
    record["seconds_per_step"] = round(sum(timed) / len(timed), 3) if timed else None
    if len(tokens) > 1:
        record["tokens_per_second"] = round((tokens[-1] - tokens[0]) / sum(times[1:]), 1)
    elif tokens:
        record["tokens_per_second"] = round(tokens[0] / times[0], 1)
    else:
        record["tokens_per_second"] = None
    record["tokens_counted"] = "prompt + completion tokens (TRL's num_tokens) per second of step time, first step left out"
    record["completion_mean_length"] = round(sum(lengths) / len(lengths), 1) if lengths else None
    if record["seconds_per_step"] and lengths:
        completion_tokens = record["completion_mean_length"] * bench.generation_batch_size
        record["completion_tokens_per_second"] = round(completion_tokens / record["seconds_per_step"], 1)
    if cuda:
        record["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / _GIB, 3)
        record["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / _GIB, 3)
        if cap_gib is not None:
            record["spare_gib"] = round(cap_gib - record["peak_reserved_gib"], 3)
            record["fits"] = record["oom"] is None and record["spare_gib"] >= min_spare_gib
    else:
        record.update(peak_allocated_gib=None, peak_reserved_gib=None, spare_gib=None, fits=None,
                      note="no CUDA: a smoke test of the command; memory is not measured and the cap not applied")
    record["provenance"] = provenance(device)
    return record


def bench_preset_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit bench preset --preset NAME --cap-gib 16``: GRPO steps of a preset under a memory cap.

    Writes ``results/preset_NAME.json`` and appends a row to ``results/presets.csv``.
    Exit code 0 when it ran (and, on CUDA, fit with the spare asked for), 1 otherwise.
    """
    import argparse

    from labkit.bench import append_csv, results_dir, write_json

    parser = argparse.ArgumentParser(prog="python -m labkit bench preset", description=bench_preset_cli.__doc__)
    parser.add_argument("--preset", required=True, help=f"one of: {', '.join(PRESETS)}")
    parser.add_argument("--model", help="another catalogue architecture (default: the preset's)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--cap-gib", type=float, default=16.0, help="per-process GPU memory cap (CUDA only)")
    parser.add_argument("--min-spare-gib", type=float, default=1.0)
    parser.add_argument("--results", default="results", help="results folder")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    preset = get_preset(args.preset, **({"model": args.model} if args.model else {}))
    record = bench_preset(preset, steps=args.steps, cap_gib=args.cap_gib, min_spare_gib=args.min_spare_gib)
    folder = results_dir(args.results)
    write_json(folder / f"preset_{preset.name}.json", record)
    row = {k: record.get(k) for k in ("preset", "model", "method", "precision", "steps_done", "cap_gib",
                                      "peak_allocated_gib", "peak_reserved_gib", "spare_gib", "fits",
                                      "seconds_per_step", "tokens_per_second", "completion_tokens_per_second",
                                      "completion_mean_length")}
    row.update(device=record["provenance"]["device"], date=record["provenance"]["date"],
               torch=record["provenance"]["versions"].get("torch"), trl=record["provenance"]["versions"].get("trl"))
    append_csv(folder / "presets.csv", [row])
    print(json.dumps({k: v for k, v in record.items() if k not in ("settings", "provenance")}, indent=2))
    if record.get("oom"):
        print(record["oom"], file=sys.stderr)
    return 0 if record["oom"] is None and record.get("fits") is not False and record["steps_done"] == args.steps else 1


if __name__ == "__main__":  # python -m labkit.presets bench ... (until labkit.bench lists "preset")
    _argv = sys.argv[1:]
    if _argv[:1] == ["bench"]:
        raise SystemExit(bench_preset_cli(_argv[1:]))
    raise SystemExit(train_cli(_argv[1:] if _argv[:1] == ["train"] else _argv))
