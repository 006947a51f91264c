"""One preset resolved once into a plan: what a run trains, in which precision, with which settings.

A :class:`labkit.presets.Preset` is a recipe: names and knobs. :func:`resolve` turns it, for one
card, into a :class:`Plan` that says everything the rest of the lab needs, decided in one place:

- the model: the name the preset gives, the path ``from_pretrained`` loads, its shape
  (:class:`labkit.memory.ModelShape`, from the architecture catalogue or a saved config);
- the method (full / LoRA / QLoRA), the **precision** (bf16 on Ampere or newer, fp16 on a T4, fp32 on a
  CPU; or the preset's own) and the dtypes that follow from it: the weights', the autocast compute
  dtype, the trainable adapters';
- the bitsandbytes 4-bit config (QLoRA) and the PEFT LoRA config, as keyword arguments;
- the ``GRPOConfig`` values the preset sets, in TRL's names, with TRL's derived
  ``steps_per_generation`` and ``generation_batch_size``;
- the card: a :class:`labkit.device.DeviceInfo` (the machine's, or the one the preset is made for).

:func:`labkit.presets.resolve_plan` resolves a preset (by name, for the machine's card or the one it is
made for) with :func:`resolve`. ``build_run``, ``preflight``, ``train --dry-run``, the estimator
(:func:`estimate`) and the rehearsal (:mod:`labkit.rehearsal`) all read a plan, so what the rehearsal rehearses is what ``build_run``
would run, by construction. Introduced in ``04_lora_grpo_16gb.ipynb``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from labkit.device import DeviceInfo, choose_precision, torch_dtype
from labkit.memory import ModelShape, estimate as _estimate_memory, model_shape
from labkit.models import LOCAL_MODELS, adapter_dtype, quantization_settings, resolve_model

__all__ = ["Plan", "resolve", "estimate", "plan_precision", "grpo_arguments"]

_COMPUTE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Plan:
    """A preset resolved for one card: see the module docstring. Build it with :func:`resolve`."""

    preset: object  # the labkit.presets.Preset it was resolved from
    model: str  # the preset's model name ("Qwen/Qwen2.5-1.5B-Instruct", "smollm2-135m", "tiny:qwen2")
    model_path: str  # what from_pretrained loads (a hub id or a local folder)
    shape_name: str  # the name the shape is read from (a catalogue entry or a saved folder)
    method: str
    precision: str  # "bf16", "fp16" or "fp32": decided here, nowhere else
    weight_dtype: torch.dtype  # the policy's weights as loaded (the frozen base for LoRA)
    compute_dtype: torch.dtype  # autocast's (and bitsandbytes' 4-bit matmul's) dtype
    adapter_dtype: torch.dtype | None  # trainable LoRA weights: fp32 (PEFT), QLoRA per adapter_dtype()
    quantization: dict | None  # transformers.BitsAndBytesConfig keyword arguments (QLoRA)
    lora: dict | None  # labkit.models.lora_config keyword arguments (LoRA, QLoRA)
    grpo: dict = field(default_factory=dict)  # GRPOConfig values the preset sets, in TRL's names, and derived ones
    config: dict = field(default_factory=dict)  # the GRPOConfig arguments build_run passes: grpo_arguments(preset)
    card: DeviceInfo | None = None

    @property
    def shape(self) -> ModelShape:
        return model_shape(self.shape_name)

    @property
    def per_device_train_batch_size(self) -> int:
        return self.grpo["per_device_train_batch_size"]

    @property
    def generation_batch_size(self) -> int:
        """Completions generated at once on one device: TRL's ``per_device_train_batch_size x steps_per_generation``."""
        return self.grpo["generation_batch_size"]

    def describe(self) -> str:
        g = self.grpo
        return (f"{self.preset.name}: {self.model} {self.method} in {self.precision} "
                f"(weights {str(self.weight_dtype).removeprefix('torch.')}), "
                f"per_device_train_batch_size={g['per_device_train_batch_size']}, "
                f"gradient_accumulation_steps={g['gradient_accumulation_steps']}, "
                f"generation_batch_size={g['generation_batch_size']}, num_generations={g['num_generations']}, "
                f"max_completion_length={g['max_completion_length']}, optim={g['optim']}"
                + (f" on {self.card}" if self.card else ""))


def plan_precision(preset, card: DeviceInfo | None) -> str:
    """Return the training precision: the preset's own, else the card's (:func:`labkit.device.choose_precision`).

    Planning for a GPU preset from a CPU uses the card the preset is made for (a T4 preset gets fp16).
    """
    if preset.precision:
        return preset.precision
    if card is None or card.kind == "cpu":
        return "fp32"
    return choose_precision(card)


def _shape_name(preset, model_path: str) -> str:
    if preset.model in LOCAL_MODELS:  # a packaged model has its hub twin's shape
        return LOCAL_MODELS[preset.model].get("hub_id", model_path)
    return model_path if preset.model.startswith("tiny:") else preset.model


def resolve(preset, card: DeviceInfo | None) -> Plan:
    """Return the :class:`Plan` of ``preset`` (a :class:`labkit.presets.Preset`) on ``card``.

    ``card`` is the machine's device (``labkit.device.detect_device()``) or the card the preset is made
    for (:func:`labkit.presets.card_device`); None or a CPU trains in fp32. Use
    :func:`labkit.presets.resolve_plan` to resolve a preset by name.
    """
    precision = plan_precision(preset, card)
    model_path = resolve_model(preset.model)
    method = preset.method
    compute = _COMPUTE[precision]
    quantization = quantization_settings(precision) if method == "qlora" else None
    lora = None
    if method in ("lora", "qlora"):
        lora = dict(rank=preset.lora_rank, alpha=preset.lora_alpha, target_modules=list(preset.target_modules))
    config = grpo_arguments(preset)
    # TRL's default: steps_per_generation = gradient_accumulation_steps (GRPOConfig.__post_init__)
    steps_per_generation = config.get("steps_per_generation") or config["gradient_accumulation_steps"]
    grpo = dict(
        config,
        steps_per_generation=steps_per_generation,
        generation_batch_size=config["per_device_train_batch_size"] * steps_per_generation,
        max_prompt_length=preset.max_prompt_length,  # labkit's prompt filter; GRPOConfig has no such field
        loss_type=config.get("loss_type", "dapo"),  # TRL 1.16's default
        bf16=precision == "bf16",
        fp16=precision == "fp16",
    )
    return Plan(preset=preset, model=preset.model, model_path=model_path,
                shape_name=_shape_name(preset, model_path), method=method, precision=precision,
                weight_dtype=torch_dtype(precision, method), compute_dtype=compute,
                adapter_dtype=(adapter_dtype(precision) if method == "qlora" else torch.float32) if lora else None,
                quantization=quantization, lora=lora, grpo=grpo, config=config, card=card)


def grpo_arguments(preset) -> dict:
    """Return the ``GRPOConfig`` arguments ``preset`` sets: its fields in TRL's names, then its ``trl_options``.

    The one mapping from a preset to TRL: :func:`labkit.run.build_run` passes these (with the
    precision flags of :func:`labkit.training.grpo_config` and the reward weights) and the plan's
    estimate and rehearsal read them. Every key a preset field sets is in ``labkit.presets._SET_BY_PRESET``.
    """
    return dict(
        seed=preset.seed,
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
        **preset.trl_options,
    )


def estimate(plan: Plan, *, device: str = "cuda", num_layers: int | None = None):
    """Return :func:`labkit.memory.estimate` for ``plan`` (``num_layers``: a shallower model of the same width)."""
    from labkit.models import architecture_config

    g, p = plan.grpo, plan.preset
    model = plan.shape_name
    if num_layers:
        model = architecture_config(plan.shape_name, num_hidden_layers=num_layers)
        model._name_or_path = f"{plan.shape_name} ({num_layers} layers)"
    return _estimate_memory(
        model, plan.method,
        per_device_train_batch_size=g["per_device_train_batch_size"],
        gradient_accumulation_steps=g["gradient_accumulation_steps"],
        steps_per_generation=g["steps_per_generation"], num_generations=g["num_generations"],
        max_prompt_length=g["max_prompt_length"], max_completion_length=g["max_completion_length"],
        optim=g["optim"], gradient_checkpointing=g["activation_checkpointing"], beta=g["beta"],
        precision=plan.precision, lora_rank=p.lora_rank, lora_targets=list(p.target_modules),
        prepare_model_for_kbit_training=p.prepare_model_for_kbit_training, device=device, padded=True)
