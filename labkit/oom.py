"""A plan's memory against its card: before the run (:func:`preflight`), and when the run runs out (the OOM doctor).

Introduced in ``04_lora_grpo_16gb.ipynb``. Both weigh a change by the estimate (:func:`labkit.memory.estimate`, in TRL
1.16's units) and rank the changes that make a recipe fit with one function, :func:`fitting_changes`.

**Preflight**, before anything loads: :func:`estimate` of a :class:`labkit.presets.Plan` against its card, and when it
does not fit, the biggest cut applied, re-estimated and repeated until it fits (:func:`changes_until_fit`, which
validation's tool-round check calls too). ``python -m labkit train --dry-run`` prints it.

**The OOM doctor**, after: :func:`labkit.training.train_with_oom_doctor` runs ``trainer.train()`` and records the
phase; a CUDA out-of-memory error (hundreds of lines through accelerate, TRL and transformers) becomes
:class:`TrainingOutOfMemory`, whose message is an :class:`OOMReport` (:func:`explain_oom`):

- which step, and which phase of it: generation, scoring (rewards, old and reference log-probs), the loss's forward
  pass, the backward pass, the optimiser step;
- what was allocated and reserved, and what the failed allocation asked for;
- an ordered list of settings to change, only those that cut that phase's memory;
- the last checkpoint, which is kept (nothing is written after an OOM: the model and optimiser may be half updated),
  so the run resumes from there.

Why the phase matters. Each phase fills its own memory (:func:`phase_memory`, :data:`PHASE_MEMORY`, from the terms
of the estimate), so each has its own cure:

- **generation**: the KV cache of the whole generation batch, ``per_device_train_batch_size x steps_per_generation``
  sequences (``steps_per_generation`` defaults to ``gradient_accumulation_steps``; ``num_generations`` only groups
  them). Halving the per-device batch at double the accumulation keeps that batch, so it does nothing here.
- **scoring** (old / reference log-probs, rewards): a ``torch.no_grad()`` forward with gradient checkpointing
  switched off, ``per_device_train_batch_size`` sequences at a time, no saved activations (:func:`scoring_memory`):
  checkpointing cannot change it.
- the loss's **forward** and **backward** passes: the estimate's training phase, the activations autograd keeps and
  the LM head's tile of logits (TRL 1.16 computes Qwen's 151,936-entry logits in chunks of 4,096 tokens x 32,768
  entries) for ``per_device_train_batch_size`` sequences: checkpointing, a smaller per-device batch and shorter
  completions cut them.
- the **optimiser step**: the activations are freed by then; weights, reference, gradients and the AdamW states,
  allocated on the first step (:func:`optimizer_step_memory`).
- **setup**: what lives through every phase (weights, reference, optimiser states).

:func:`ordered_changes` offers only the changes that cut the memory of the phase that ran out.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

import torch

from labkit.device import detect_device
from labkit.environments import tool_rounds
from labkit.generation import continuous_footprint
from labkit.memory import (EIGHT_BIT_OPTIMS, GIB, PRECISION_BYTES, MemoryEstimate, fused_head, hidden_state_bytes,
                           model_shape)
from labkit.memory import estimate as estimate_memory
from labkit.models import DEFAULT_LORA_TARGETS, architecture_config, resolve_model
from labkit.presets import Plan, resolve_plan
from labkit.text import wrap

__all__ = ["PHASES", "PHASE_MEMORY", "flat_settings", "estimate", "phase_memory", "scoring_memory",
           "optimizer_step_memory", "Change", "candidate_changes", "fitting_changes", "ordered_changes",
           "changes_until_fit", "Preflight", "preflight", "OOMReport", "TrainingOutOfMemory", "is_oom", "explain_oom"]

PHASES = {
    "setup": "setup, before the first step (loading, optimiser creation)",
    "generation": "generation: sampling the completions (KV cache of the whole generation batch)",
    "scoring": "scoring: rewards and the old / reference log-probs of the completions (no_grad)",
    "forward": "the loss's forward pass (policy log-probs and logits of prompt + completion)",
    "backward": "the backward pass (activations and gradients)",
    "optimizer": "the optimiser step (AdamW states are allocated on the first one)",
    "between steps": "between steps (logging, saving a checkpoint)",
}
# Which memory each phase fills (phase_memory): an estimate's term, or scoring_memory, optimizer_step_memory, persistent
PHASE_MEMORY = {
    "generation": "generation_phase",
    "scoring": "scoring",
    "forward": "training_phase",
    "backward": "training_phase",
    "optimizer": "optimizer_step",
    "setup": "persistent",
}


def flat_settings(settings: dict) -> dict:
    """Return ``settings`` (a preset's ``to_dict()``, perhaps with changes at the top) with its ``config`` (GRPOConfig
    arguments) lifted to the top, under what is already there."""
    options = settings.get("config")
    return {**(options if isinstance(options, dict) else {}), **{k: v for k, v in settings.items() if k != "config"}}


# The estimator's arguments a recipe sets, under the same names (preset / GRPOConfig fields)
_ESTIMATE_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
                    "num_generations", "num_processes", "max_prompt_length", "max_completion_length", "optim", "beta",
                    "precision", "lora_rank", "lora_dropout", "prepare_model_for_kbit_training")


def _estimate_arguments(s: dict) -> dict:
    """Return :func:`labkit.memory.estimate`'s keyword arguments for flat settings ``s`` (:func:`flat_settings`): the
    one mapping from a recipe to the estimator, for a plan (:func:`estimate`) and for a run's settings
    (:func:`phase_memory`)."""
    kwargs = {k: s[k] for k in _ESTIMATE_FIELDS if s.get(k) is not None}
    if s.get("activation_checkpointing") is not None:
        kwargs["gradient_checkpointing"] = s["activation_checkpointing"]
    kwargs["lora_targets"] = list(s["target_modules"]) if s.get("target_modules") is not None else None
    return dict(kwargs, max_tool_calling_iterations=tool_rounds(s))  # a tool recipe's rounds (notebook 08)


def estimate(plan: Plan, *, device: str = "cuda", num_layers: int | None = None, num_processes: int = 1):
    """Return :func:`labkit.memory.estimate` for ``plan`` (``num_layers``: a shallower model of the same width;
    ``num_processes``: the processes whose completions one generation batch holds); with ``generation="continuous"``,
    its ``kv_cache`` is :func:`labkit.generation.continuous_footprint`."""
    s = {**flat_settings(plan.preset.to_dict()), **plan.config, "precision": plan.precision,
         "num_processes": num_processes}
    model = plan.shape_name  # by name for continuous batching's sizing below
    if num_layers:
        model = architecture_config(plan.shape_name, num_hidden_layers=num_layers)
        model._name_or_path = f"{plan.shape_name} ({num_layers} layers)"
    # the plan's shape, read once with it (validation checked its context)
    est = estimate_memory(model if num_layers else plan.shape, plan.method, device=device, padded=True,
                          **_estimate_arguments(s))
    if not s.get("use_transformers_continuous_batching"):
        return est
    # continuous batching: transformers' paged cache, mask and read buffers instead of generate's cache, and the
    # 16-bit copies TRL's cast makes of fp32 weights (grpo_trainer.py 1796-1800; the clock keeps the fp32 ones)
    terms, s = dict(est.bytes), est.settings
    fp32 = est.trainable_params if plan.adapter_dtype == torch.float32 else 0
    fp32 += plan.shape.params - plan.shape.quantisable_params if plan.preset.prepare_model_for_kbit_training else 0
    new = dict(kv_cache=continuous_footprint(model, s["generation_batch"], s["max_prompt_length"],
                                             s["max_completion_length"], 4 if plan.precision == "fp32" else 2)["total"],
               transients=2 * fp32 if plan.precision != "fp32" else 0)
    terms["generation_phase"] += sum(new.values()) - terms["kv_cache"] - terms["transients"]
    terms.update(new, total=max(terms["generation_phase"], terms["training_phase"]))
    return MemoryEstimate(terms, dict(s, generation="continuous"), est.trainable_params, est.total_params)


def phase_memory(settings: dict, phase: str | None) -> int | None:
    """Return the bytes ``phase`` fills (:data:`PHASE_MEMORY`) for ``settings`` (preset / GRPOConfig field names),
    from :func:`labkit.memory.estimate`, or None when it cannot estimate them (an unknown model). Any other
    phase (``between steps``, unknown): the whole step's peak.
    """
    s = flat_settings(settings)
    if not s.get("model") or not s.get("method"):
        return None
    kwargs = _estimate_arguments(s)
    try:  # the offline tiny models live in a folder; other names (hub ids, smollm2-135m) are in the catalogue
        name = resolve_model(s["model"]) if str(s["model"]).startswith("tiny:") else s["model"]
        est = estimate_memory(name, s["method"], **kwargs)
    except (KeyError, ValueError, TypeError, OSError):
        return None
    term = PHASE_MEMORY.get(phase or "", "total")
    if term == "persistent":
        return est.bytes["weights"] + est.bytes["reference"] + est.bytes["optimizer"]
    if term == "scoring":
        return scoring_memory(est, model=name, lora_targets=kwargs["lora_targets"],
                              use_vllm=bool(s.get("use_vllm") and s.get("vllm_importance_sampling_correction", True)),
                              num_iterations=s.get("num_iterations") or 1)
    if term == "optimizer_step":
        return optimizer_step_memory(est, optim=s.get("optim"))
    return est.bytes[term]


def optimizer_step_memory(est, optim: str | None = None) -> int:
    """Return the bytes live during ``optimizer.step()`` for the :class:`labkit.memory.MemoryEstimate` ``est``.

    ``weights + reference + gradients + optimizer`` (the AdamW states are allocated on the first step), plus, for
    ``optim="adamw_torch"`` on CUDA, torch's foreach AdamW's one moment-sized ``exp_avg_sq_sqrt`` (the gradients'
    size). The fused and the 8-bit optimisers update in place. No activations: the step follows the last backward
    pass, which has freed them, so checkpointing, the per-device batch and the completion length change nothing here.
    Sources: docs/references.md, "Scoring and the optimiser step".
    """
    terms = est.bytes
    foreach_temporary = terms["gradients"] if optim == "adamw_torch" and est.settings.get("device") == "cuda" else 0
    return terms["weights"] + terms["reference"] + terms["gradients"] + terms["optimizer"] + foreach_temporary


def scoring_memory(est, *, model=None, lora_targets=None, num_iterations: int = 1,
                   use_vllm: bool = False) -> int:
    """Return the bytes of the scoring phase (old and reference log-probs) for the estimate ``est`` of ``model``.

    TRL 1.16 scores the generation batch under ``torch.no_grad()`` with checkpointing switched off, ``B =
    per_device_train_batch_size`` sequences of ``S = max_prompt_length + max_completion_length`` tokens at a time,
    without a KV cache. It runs the policy only when the samples may be stale (``gradient_accumulation_steps %
    (steps_per_generation x num_iterations) != 0``) or vLLM generates (with ``vllm_importance_sampling_correction``,
    TRL's default), and the reference only when ``beta > 0``; otherwise scoring is the reward functions alone.
    It counts:

    - weights + reference + optimizer states, and the gradients of earlier micro-batches when a generation
      starts mid-accumulation;
    - one layer of a no-grad forward of ``B S`` tokens: the residual stream and SwiGLU's intermediates,
      ``B S (3 i + 2 h) hb`` as at the estimate's prefill, with PEFT's fp32 casts of the widest LoRA input; or, when
      larger, the fused LM head: the last hidden states (``B S h hb``), the ``N`` scored positions copied
      (``N h hb``, ``N`` as in :func:`labkit.memory.fused_head`), seven fp32 statistics per position and one tile;
      plus autocast's 16-bit copies of fp32 master weights.

    Only ``B`` and ``S`` change it. Not counted: the batch's token ids and log-probs (a few MiB), the reward
    functions' own memory. Sources, TRL's lines: docs/references.md, "Scoring and the optimiser step".
    """
    s, terms = est.settings, est.bytes
    accumulation, generate_every = s["gradient_accumulation_steps"], s["steps_per_generation"] * num_iterations
    memory = terms["weights"] + terms["reference"] + terms["optimizer"]
    if generate_every % accumulation:
        memory += terms["gradients"]
    if not (s["beta"] > 0 or accumulation % generate_every or use_vllm):
        return memory
    method, precision, device = s["method"], s["precision"], s.get("device", "cuda")
    shape = model_shape(s["model"] if model is None else model)  # a name, a folder or a config
    b = PRECISION_BYTES[precision]
    upcast = bool(s.get("prepare_model_for_kbit_training"))
    hb = hidden_state_bytes(method, precision, prepare_model_for_kbit_training=upcast)
    rb = 4 if s.get("fp32_master_weights") else hb  # the residual stream: fp32 under fp32 master weights
    batch, seq = s["per_device_train_batch_size"], s["max_prompt_length"] + s["max_completion_length"]
    tokens, h, i, V = batch * seq, shape.hidden_size, shape.intermediate_size, shape.vocab_size
    # PEFT casts a LoRA input to its fp32 adapters' dtype (as labkit.memory.estimate); its 4-bit layers do not
    casts = method == "lora"
    widest = max((n for n, _ in shape.lora_targets(lora_targets or DEFAULT_LORA_TARGETS)), default=0) if casts else 0
    layer = (tokens * ((2 if widest >= i else 3) * i * hb + 2 * h * rb)
             + tokens * widest * (4 + (5 if s["lora_dropout"] else 0)))  # the estimate's LoRA dropout
    if s.get("padded"):
        layer += tokens * seq * b  # SDPA's additive mask of one layer, (B, 1, S, S)
    scored, tile = fused_head(batch, s["max_completion_length"], seq, V, b, device)
    head = tokens * h * rb + scored * h * rb + scored * 7 * 4 + tile
    weight_copies = shape.linear_weight_params * b if s.get("fp32_master_weights") else 0
    return int(round(memory + max(layer, head) + weight_copies))


_SMALLER = {
    "Qwen/Qwen2.5-7B-Instruct": "Qwen/Qwen2.5-3B-Instruct",
    "Qwen/Qwen2.5-3B-Instruct": "Qwen/Qwen2.5-1.5B-Instruct",
    "Qwen/Qwen2.5-1.5B-Instruct": "Qwen/Qwen2.5-0.5B-Instruct",
    "meta-llama/Llama-3.2-3B-Instruct": "meta-llama/Llama-3.2-1B-Instruct",
}
# Which changes to try first, by the phase that ran out of memory; a kind missing from a list cannot help there
# (see ordered_changes).
_ORDER = {
    "generation": ["generation_batch", "generations", "completion", "optim", "method", "beta", "model"],
    "scoring": ["batch", "completion", "optim", "method", "beta", "model"],
    "forward": ["checkpointing", "batch", "completion", "optim", "method", "beta", "model"],
    "backward": ["checkpointing", "batch", "completion", "optim", "method", "beta", "model"],
    "optimizer": ["optim", "method", "beta", "model"],
    "setup": ["method", "optim", "beta", "model"],
}
_DEFAULT_ORDER = ["checkpointing", "batch", "generation_batch", "completion", "optim", "generations", "method",
                  "beta", "model"]


@dataclass(frozen=True)
class Change:
    """One setting change (``updates``: field -> new value, ``before``: the old values) and why it helps."""

    kind: str
    updates: dict
    before: dict
    why: str

    @property
    def moves(self) -> str:  # what changes (a value set to what it already was is not a move)
        return ", ".join(f"{k} {'(default)' if self.before.get(k) is None else repr(self.before.get(k))} -> {v!r}"
                         for k, v in self.updates.items() if self.before.get(k) != v)

    def __str__(self) -> str:
        return f"{self.moves}: {self.why}"


def _smaller_generation_batch(batch: int, steps: int, accumulation, processes: int, generations: int, **updates):
    """Return ``updates`` plus the settings that halve the generation batch with whole groups of ``generations``,
    keeping ``batch x steps`` a multiple of the groups (fewer steps, or half the per-device batch at twice the
    accumulation); None when there is none."""
    for new_batch, new_steps in ((batch, steps // 2), (batch // 2, steps)):
        if new_batch >= 1 and new_steps >= 1 and new_batch * new_steps * 2 == batch * steps \
                and (new_batch * processes * new_steps) % generations == 0:
            if new_batch != batch:
                updates.update(per_device_train_batch_size=new_batch, gradient_accumulation_steps=accumulation * 2)
            return {**updates, "steps_per_generation": new_steps}
    return None


def candidate_changes(settings: dict) -> list[Change]:
    """Return the changes that could cut memory for these settings (preset / GRPOConfig field names), unordered.

    In TRL 1.16's units (:func:`labkit.memory.generation_batch`, the module docstring):

    - ``generation_batch`` halves the generation batch (``steps_per_generation``, or the per-device
      batch at the same ``steps_per_generation``): the KV cache halves; prompts per step fall.
    - ``generations`` halves ``num_generations`` together with the generation batch, when the batch
      holds one prompt's group only (a smaller group cannot cut memory on its own).
    - ``batch`` halves ``per_device_train_batch_size`` and doubles the accumulation, keeping the
      generation batch: the training pass's activations halve, the KV cache does not.
    - ``completion``, ``checkpointing``, ``optim``, ``method``, ``model``, ``beta`` as named.

    Each keeps the run valid for TRL. Which of them cut the memory of the phase that ran out is
    decided by the estimator in :func:`ordered_changes`.
    """
    s = flat_settings(settings)
    out: list[Change] = []

    def add(kind, updates, why):
        out.append(Change(kind, updates, {k: s.get(k) for k in updates}, why))

    batch, accumulation = s.get("per_device_train_batch_size"), s.get("gradient_accumulation_steps")
    generations, processes = s.get("num_generations"), s.get("num_processes") or 1
    explicit_steps = s.get("steps_per_generation")
    steps = explicit_steps or accumulation
    if s.get("activation_checkpointing") is False:
        add("checkpointing", {"activation_checkpointing": True},
            "recompute activations in the backward pass: a large cut in activation memory for about 20-30 % speed")
    if batch and accumulation and batch > 1:
        updates = {"per_device_train_batch_size": batch // 2, "gradient_accumulation_steps": accumulation * 2}
        if explicit_steps:  # keep the generation batch: twice the steps of half the batch
            updates["steps_per_generation"] = explicit_steps * 2
        if batch % 2 == 0:
            add("batch", updates, "half the completions in each forward/backward pass (activations, LM-head "
                "buffers); the same generation batch and the same completions per optimiser step")
    if batch and steps and generations:
        smaller = _smaller_generation_batch(batch, steps, accumulation, processes, generations)
        if smaller is not None:
            add("generation_batch", smaller,
                "generate half the completions at once (KV cache of the generation batch halves); the same "
                "num_generations per prompt, fewer prompts per generation batch")
        elif generations >= 4 and generations % 2 == 0:
            halved = _smaller_generation_batch(batch, steps, accumulation, processes, generations // 2,
                                               num_generations=generations // 2)
            if halved is not None:
                add("generations", halved,
                    "the generation batch holds one prompt's group: a group half as large, generated at once, "
                    "halves the KV cache (noisier advantages)")
    completion = s.get("max_completion_length")
    if completion and completion > 128:
        shorter = max(128, int(completion * 2 / 3) // 64 * 64)
        add("completion", {"max_completion_length": shorter},
            "KV cache, activations and LM-head buffers all grow with completion length; longer answers get cut "
            "(watch completions/clipped_ratio)")
    optim = s.get("optim")
    if optim and optim not in EIGHT_BIT_OPTIMS:
        add("optim", {"optim": "adamw_bnb_8bit"}, "8-bit AdamW keeps about 2 bytes of state per trainable parameter, "
            "not 8 (fp32 moments) or 4 (bf16 moments): torch's AdamW keeps its two moments in the parameter's dtype")
    method = s.get("method")
    if method == "full":
        add("method", {"method": "lora"}, "train small adapters: no gradients or AdamW states for the frozen weights")
    elif method == "lora":
        add("method", {"method": "qlora"},
            "store the frozen Linear weights in 4 bits (about 0.5 byte per parameter instead of 2); activations "
            "and KV cache are unchanged (the training precision), unless prepare_model_for_kbit_training=True "
            "upcasts them to fp32")
    model = s.get("model")
    if model in _SMALLER:
        add("model", {"model": _SMALLER[model]}, "a smaller model of the same family")
    # With PEFT the reference is the base with its adapters off (TRL given a peft_config) or a frozen copy of the
    # adapter (given a PeftModel and beta > 0: trl/trainer/grpo_trainer.py 478-506): no second base, only its pass.
    if s.get("beta"):
        add("beta", {"beta": 0.0}, "beta = 0 drops the reference model (a second copy of the weights)"
            if method == "full" else "beta = 0 skips the reference log-probs in scoring (no KL term)")
    return out


def fitting_changes(settings: dict, memory, *, order: list[str] | None = None,
                    min_cut: float = 0.0) -> list[tuple[Change, float | None]]:
    """The one ranking of the changes that make a recipe fit, for preflight (by the step's estimate), the tool-round
    check (by the generation phase's: both :func:`changes_until_fit`) and the OOM doctor (by the
    failed phase's, :func:`ordered_changes`): ``[(change, memory(change))]`` of :func:`candidate_changes` (the
    kinds in ``order``) that cut ``memory(None)`` by more than ``min_cut``, all when it is None; in ``order``'s order,
    else the biggest cut first and another model last."""
    before = memory(None)
    ranked = []
    for change in candidate_changes(settings):
        if order is not None and change.kind not in order:
            continue
        after = None if before is None else memory(change)
        if before is None or (after is not None and after < before - min_cut):
            ranked.append((change, after))
    if order is not None:
        return sorted(ranked, key=lambda item: order.index(item[0].kind))
    return sorted(ranked, key=lambda item: (item[0].kind == "model", item[1] is None, item[1] or 0))


def ordered_changes(settings: dict, phase: str | None = None) -> list[Change]:
    """Return :func:`candidate_changes` that cut the memory of ``phase``, ordered for it (first = try first).

    Two filters. By kind (:data:`_ORDER`): no checkpointing and no smaller generation batch for scoring
    (TRL switches checkpointing off there, and scores ``per_device_train_batch_size`` sequences at a time),
    no checkpointing, smaller per-device batch or shorter completions for the optimiser step (the
    activations are freed by then). By estimate, when :func:`phase_memory` can estimate the settings:
    only changes that lower that phase's memory. So halving the per-device batch at double the
    accumulation (the same KV cache) is not offered for generation, and LoRA -> QLoRA not where it costs
    more than it saves (with ``prepare_model_for_kbit_training``, fp32 hidden states on a small model).
    Without an estimate the changes are ordered but not filtered by estimate.
    """
    flat = flat_settings(settings)
    memory = lambda change: phase_memory({**flat, **change.updates} if change else settings, phase)  # noqa: E731
    return [change for change, _ in fitting_changes(settings, memory, order=_ORDER.get(phase or "", _DEFAULT_ORDER))]


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
    changes: list = field(default_factory=list)  # [(Change, GiB after it alone)], biggest cut first
    plan: list = field(default_factory=list)  # [(Change, GiB after it and those above)] until it fits

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
            lines.append(f"{self.card}: {verdict} with a {self.margin_gib:.1f} GiB margin "  # the card names its GiB
                         f"({self.card_gib - self.estimate_gib:+.1f} GiB left).")
        if self.plan and not self.fits:
            fits = self.plan[-1][1] + self.margin_gib <= self.card_gib
            lines.append("Change, in this order" + (" until it fits" if fits else " (still not enough: a bigger card)")
                         + " (estimated total after each step):")
            lines += [f"  {i}. {change} -> about {after:.1f} GiB" for i, (change, after) in enumerate(self.plan, 1)]
        return wrap("\n".join(lines))


_TERMS = ("weights", "reference", "optimizer", "gradients", "activations", "logits", "kv_cache", "transients")


def _ranked_changes(plan, gib, before: float, num_processes: int = 1) -> list:
    """Return ``[(change, gib(plan with it))]`` for every candidate change that cuts ``before``, ``gib(plan)``, biggest
    cut first: the one ranking (:func:`fitting_changes`, the OOM doctor's too, by its failed phase)."""
    def after(change):
        try:
            return before if change is None else gib(plan.apply(change.updates))
        except (ValueError, KeyError):  # a change the estimator cannot model
            return None

    return fitting_changes({**plan.preset.to_dict(), "num_processes": num_processes}, after, min_cut=0.01)


def _step_gib(plan) -> float:
    return estimate(plan).total


def changes_until_fit(plan, limit: float, gib=_step_gib, before: float | None = None, *, num_processes: int = 1):
    """Return ``[(change, gib after it and those above)]``: the biggest cut of ``gib`` (the whole step's estimate
    unless it says otherwise), re-estimated, repeated until ``gib`` is at most ``limit`` or nothing cuts it; another
    model last (it changes what you train, not how). :func:`preflight` and the tool-round check offer these."""
    steps, before = [], gib(plan) if before is None else before
    while before > limit and (ranked := _ranked_changes(plan, gib, before, num_processes)):
        change, before = ranked[0]
        plan = plan.apply(change.updates)
        steps.append((change, before))
    return steps


def preflight(preset, device=None, *, card_gib: float | None = None, margin_gib: float = 1.0) -> Preflight:
    """Return a :class:`Preflight`: :func:`labkit.memory.estimate` for the preset's plan against the card.

    ``preset`` is a name, a :class:`Preset` or a :class:`labkit.presets.Plan`. On a GPU the plan is for
    ``device``; elsewhere for the card the preset is made for (:func:`labkit.presets.card_device`: a T4 preset in fp16).
    ``card_gib`` overrides the card's memory (plan for a 16 GB laptop from anywhere:
    ``preflight("laptop-16gb", card_gib=CARDS["rtx3080-laptop-16gb"].gib)``). When it does not fit, every
    candidate change is estimated alone and ranked by :func:`fitting_changes`
    (``changes``, the biggest cut first, another model last), and ``plan`` applies the
    biggest cut, re-estimates and repeats until the run fits: the settings to change first.
    """
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
    result = estimate(plan)
    total, breakdown = result.total, {k: result.bytes[k] / GIB for k in _TERMS if result.bytes.get(k)}
    report = Preflight(preset.name, preset.model, preset.method, card, card_gib, total, breakdown, margin_gib)
    if card_gib is not None and not report.fits:
        report.changes = _ranked_changes(plan, _step_gib, total)
        report.plan = changes_until_fit(plan, card_gib - margin_gib, before=total)
    return report


@dataclass
class OOMReport:
    """The OOM doctor's diagnosis: where it failed, what memory held, what to change, what is kept."""

    step: int
    max_steps: int | None
    phase: str
    error: str  # the first line of the original message
    tried_gib: float | None = None
    allocated_gib: float | None = None
    reserved_gib: float | None = None
    peak_allocated_gib: float | None = None
    total_gib: float | None = None
    changes: list = field(default_factory=list)
    checkpoint: str | None = None
    output_dir: str | None = None
    notes: list = field(default_factory=list)  # advice the estimator cannot check (vLLM server mode)

    def as_dict(self) -> dict:
        data = asdict(self)
        data["changes"] = [str(c) for c in self.changes]
        return data

    def __str__(self) -> str:
        of = f" of {self.max_steps}" if self.max_steps else ""
        lines = [f"Out of GPU memory at step {self.step}{of}, during {PHASES.get(self.phase, self.phase)}."]
        if self.allocated_gib is None:
            lines.append("  memory: no CUDA statistics on this device.")
        else:
            tried = f"tried to allocate {self.tried_gib:.2f} GiB; " if self.tried_gib is not None else ""
            total = f" of {self.total_gib:.1f} GiB" if self.total_gib else ""
            lines.append(f"  {tried}allocated {self.allocated_gib:.2f} GiB, reserved {self.reserved_gib:.2f} GiB, "
                         f"peak allocated {self.peak_allocated_gib:.2f} GiB{total}")
        if self.changes:
            lines.append("Change, in this order (one at a time, then re-run):")
            lines += [f"  {i}. {c}" for i, c in enumerate(self.changes, 1)]
        lines += [f"  Also: {note}" for note in self.notes]
        if self.reserved_gib is not None and self.allocated_gib is not None \
                and self.reserved_gib - self.allocated_gib > 0.5:
            lines.append("  Reserved >> allocated (fragmentation): set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                         "before Python starts.")
        if self.checkpoint:
            lines.append(f"Kept: {self.checkpoint}. Re-run the same command or cell to resume from it with the same "
                         "recipe: only the fields labkit.run.RESUMABLE_CHANGES lists (activation_checkpointing among them) "
                         "may change on resume; any other change needs a new output_dir.")
        else:
            lines.append("No checkpoint was written before the error: the run starts again from step 0.")
        lines.append("Restart the Python process (the kernel) before retrying: memory is fragmented after an OOM.")
        return wrap("\n".join(lines))


class TrainingOutOfMemory(RuntimeError):
    """Training ran out of GPU memory; ``str(error)`` and ``error.report`` are the OOM doctor's report."""

    def __init__(self, report: OOMReport):
        super().__init__(str(report))
        self.report = report


def is_oom(error: BaseException) -> bool:
    """Return True for CUDA (and other accelerators') out-of-memory errors, whatever raised them."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def _tried_gib(message: str) -> float | None:
    match = re.search(r"Tried to allocate ([\d.]+) ?([KMGT]i?B)", message)
    if not match:
        return None
    scale = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[match.group(2)[0]]
    return float(match.group(1)) * scale / GIB


def explain_oom(error: BaseException, *, phase: str = "unknown", step: int = 0, max_steps: int | None = None,
                settings: dict | None = None, checkpoint=None, output_dir=None) -> OOMReport:
    """Return the :class:`OOMReport` for an out-of-memory ``error`` raised during ``phase`` of ``step``.

    Call it while the failed step's tensors are still alive (inside the ``except`` block)
    for the allocated figures to show what filled the card.
    """
    import importlib.util

    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    report = OOMReport(step=step, max_steps=max_steps, phase=phase, error=message[:300],
                       tried_gib=_tried_gib(str(error)),
                       changes=ordered_changes(settings or {}, phase),
                       checkpoint=str(checkpoint) if checkpoint else None,
                       output_dir=str(output_dir) if output_dir else None)
    if phase == "generation" and importlib.util.find_spec("vllm") is not None:
        report.notes.append("with a second GPU, TRL's vLLM server mode (use_vllm=True, vllm_mode='server', "
                            "`trl vllm-serve` on the other card) moves generation and its KV cache off this card.")
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        index = torch.cuda.current_device()
        report.allocated_gib = torch.cuda.memory_allocated(index) / GIB
        report.reserved_gib = torch.cuda.memory_reserved(index) / GIB
        report.peak_allocated_gib = torch.cuda.max_memory_allocated(index) / GIB
        report.total_gib = torch.cuda.get_device_properties(index).total_memory / GIB
    return report


