"""One preset resolved once into a plan: what a run trains, in which precision, with which settings.

The layer above :mod:`labkit.presets` (the recipe), below its checks (:mod:`labkit.validation`, which reads the
plan), the readers of a plan (:mod:`labkit.preflight`, :mod:`bench.rehearse`) and :func:`labkit.run.build_run`.
:func:`resolve_plan` turns a preset (a name or a :class:`labkit.presets.Preset`), for one card, into a
:class:`Plan` that says everything the rest of the lab needs, decided in one place:

- the model: the name the preset gives, the path ``from_pretrained`` loads (:func:`labkit.models.resolve_model`),
  its shape (:class:`labkit.shapes.ModelShape`, from the architecture catalogue or a saved config);
- the method (full / LoRA / QLoRA), the **precision** (:func:`labkit.device.choose_precision`, called
  once here: bf16 on Ampere or newer, fp16 on a T4, fp32 on a CPU; or the preset's own) and the dtypes
  that follow from it: the weights', the autocast compute dtype, the trainable adapters';
- the libraries' own objects: PEFT's ``LoraConfig`` (``peft_config``: LoRA, QLoRA), transformers'
  ``BitsAndBytesConfig`` (``quantization_config``: QLoRA) and how ``from_pretrained`` loads the model
  (``model_init_kwargs``), exactly what ``GRPOTrainer`` is handed;
- the ``GRPOConfig`` arguments the preset sets, in TRL's names (``config``, :func:`grpo_arguments`), with
  TRL's derived ``steps_per_generation`` and ``generation_batch_size`` as properties. The ``GRPOConfig`` itself is
  built from them on the machine that trains (:func:`labkit.training.grpo_config`): transformers refuses a bf16
  ``TrainingArguments`` on a machine without a bf16 GPU, so a plan for another card cannot hold one;
- the card: a :class:`labkit.device.DeviceInfo` (the machine's, or the one the preset is made for).

``build_run``, ``preflight``, ``train --dry-run``, the estimator (:func:`labkit.preflight.estimate`) and
the rehearsal (:mod:`bench.rehearse`) all read a plan, so what the rehearsal rehearses is what
``build_run`` would run, by construction. Introduced in ``04_lora_grpo_16gb.ipynb``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from labkit.device import DeviceInfo, choose_precision, torch_dtype
from labkit.generation import generation_arguments
from labkit.models import LOCAL_MODELS, adapter_dtype, load_policy, lora_config, quantization_config, resolve_model
from labkit.shapes import ModelShape, model_shape
from labkit.presets import Preset, card_device, get_preset

__all__ = ["Plan", "resolve_plan", "grpo_arguments"]

_COMPUTE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# A plan without a GPU (a CPU preset, or a CPU machine) trains in fp32.
_NO_GPU = DeviceInfo("cpu", "no GPU", None, None, bf16=False, fp16=False)


@dataclass(frozen=True)
class Plan:
    """A preset resolved for one card: see the module docstring. Build it with :func:`resolve_plan`."""

    preset: Preset  # the recipe it was resolved from
    model: str  # the preset's model name ("Qwen/Qwen2.5-1.5B-Instruct", "smollm2-135m", "tiny:qwen2")
    model_path: str  # what from_pretrained loads (a hub id or a local folder)
    shape_name: str  # the name the shape is read from (a catalogue entry or a saved folder)
    method: str
    precision: str  # "bf16", "fp16" or "fp32": decided here, nowhere else
    weight_dtype: torch.dtype  # the policy's weights as loaded (the frozen base for LoRA)
    compute_dtype: torch.dtype  # autocast's (and bitsandbytes' 4-bit matmul's) dtype
    adapter_dtype: torch.dtype | None  # trainable LoRA weights: fp32 (PEFT), QLoRA per adapter_dtype()
    quantization_config: object | None  # transformers.BitsAndBytesConfig (QLoRA), what GRPOTrainer is handed
    peft_config: object | None  # peft.LoraConfig (LoRA, QLoRA), what GRPOTrainer is handed
    config: dict = field(default_factory=dict)  # the GRPOConfig arguments build_run passes: grpo_arguments(preset)
    card: DeviceInfo | None = None
    # why the card cannot train in the preset's own precision (choose_precision's message), or None; the plan keeps
    # the precision asked, so that it can still be estimated (a T4 in bf16), and validate() refuses it
    precision_error: str | None = None

    @cached_property
    def shape(self) -> ModelShape:
        """The model's shape, read once (the catalogue or a saved config); raises when neither knows the model."""
        return model_shape(self.shape_name)

    @property
    def per_device_train_batch_size(self) -> int:
        return self.config["per_device_train_batch_size"]

    @property
    def steps_per_generation(self) -> int:
        """TRL's default: ``steps_per_generation = gradient_accumulation_steps`` (``GRPOConfig.__post_init__``)."""
        return self.config.get("steps_per_generation") or self.config["gradient_accumulation_steps"]

    @property
    def generation_batch_size(self) -> int:
        """Completions generated at once on one device: TRL's ``per_device_train_batch_size x steps_per_generation``."""
        return self.config["per_device_train_batch_size"] * self.steps_per_generation

    @property
    def model_init_kwargs(self) -> dict:
        """How ``from_pretrained`` loads the model: ``GRPOConfig``'s ``model_init_kwargs`` (the weights' dtype)."""
        return {"dtype": str(self.weight_dtype).removeprefix("torch.")}

    def load_policy(self, **kwargs):
        """Return ``(model, tokenizer)``: the plan's model loaded as it trains (:func:`labkit.models.load_policy` with
        the plan's path, method, precision, ``peft_config`` and checkpointing); ``kwargs`` go to ``load_policy``."""
        p = self.preset
        return load_policy(self.model_path, self.method, precision=self.precision, peft_config=self.peft_config,
                           gradient_checkpointing=p.gradient_checkpointing,
                           prepare_model_for_kbit_training=p.prepare_model_for_kbit_training, **kwargs)

    @property
    def loss_type(self) -> str:
        return self.config.get("loss_type", "dapo")  # TRL 1.16's default

    def describe(self) -> str:
        c = self.config
        return (f"{self.preset.name}: {self.model} {self.method} in {self.precision} "
                f"(weights {str(self.weight_dtype).removeprefix('torch.')}), "
                f"per_device_train_batch_size={c['per_device_train_batch_size']}, "
                f"gradient_accumulation_steps={c['gradient_accumulation_steps']}, "
                f"generation_batch_size={self.generation_batch_size}, num_generations={c['num_generations']}, "
                f"max_completion_length={c['max_completion_length']}, optim={c['optim']}, "
                f"generation={self.preset.generation}" + (f" on {self.card}" if self.card else ""))


def _shape_name(model: str, model_path: str) -> str:
    if model in LOCAL_MODELS:  # a packaged model has its hub twin's shape
        return LOCAL_MODELS[model].get("hub_id", model_path)
    return model_path if model.startswith("tiny:") else model


def resolve_plan(preset: Preset | str | Plan, device: DeviceInfo | None = None, **overrides) -> Plan:
    """Return the :class:`Plan` of ``preset`` (a name or a :class:`Preset`, with ``overrides``; a Plan as it is).

    ``device`` is the card the run will use (``build_run`` passes the machine's); None plans for the card
    the preset is made for (:func:`labkit.presets.card_device`); a CPU preset, or a CPU, trains in fp32.
    The one place a preset becomes a run's settings and precision.
    """
    if isinstance(preset, Plan) and not overrides:
        return preset
    preset = get_preset(preset.preset if isinstance(preset, Plan) else preset, **overrides)
    card = device if device is not None else card_device(preset)
    # The card's precision, or the preset's own where the card can do it; where it cannot, the preset's as asked
    # with the reason, which validate() reports (a plan may still estimate a T4 in bf16).
    try:
        precision, precision_error = choose_precision(card or _NO_GPU, preset.precision), None
    except ValueError as exc:
        precision, precision_error = preset.precision, str(exc)
    model_path = resolve_model(preset.model)
    method = preset.method
    lora = method in ("lora", "qlora")
    return Plan(preset=preset, model=preset.model, model_path=model_path,
                shape_name=_shape_name(preset.model, model_path), method=method, precision=precision,
                weight_dtype=torch_dtype(precision, method), compute_dtype=_COMPUTE[precision],
                adapter_dtype=(adapter_dtype(precision) if method == "qlora" else torch.float32) if lora else None,
                quantization_config=quantization_config(precision) if method == "qlora" else None,
                peft_config=lora_config(preset.lora_rank, preset.lora_alpha, preset.lora_dropout,
                                        list(preset.target_modules)) if lora else None,
                config=grpo_arguments(preset), card=card, precision_error=precision_error)


def grpo_arguments(preset) -> dict:
    """Return the ``GRPOConfig`` arguments ``preset`` sets: its fields in TRL's names, then its ``trl_options``.

    The one mapping from a preset to TRL: :func:`labkit.run.build_run` passes these (with the
    precision flags of :func:`labkit.training.grpo_config` and the reward weights) and the plan's
    estimate and rehearsal read them. Every key a preset field sets is in ``labkit.validation._SET_BY_PRESET``.
    """
    # trl_options last, and over the fields: one that a field sets is refused by labkit.validation, which reads
    # this plan, so building it must not fail first
    return {**dict(
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
        **({"max_tool_calling_iterations": preset.max_tool_calling_iterations} if preset.environment else {}),
        **generation_arguments(preset),  # the generation path's fields (labkit.generation)
    ), **preset.trl_options}
