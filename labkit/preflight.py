"""A plan's memory, before anything loads: :func:`estimate` (the estimator of :mod:`labkit.memory`) and
:func:`preflight`, the estimate against the card with what to change first when it does not fit.

A reader of a :class:`labkit.presets.Plan`, beside the rehearsal (:mod:`bench.rehearse`) and the OOM doctor
(:mod:`labkit.oom`, whose candidate changes it ranks); ``python -m labkit train --dry-run`` prints it.
Introduced in ``04_lora_grpo_16gb.ipynb``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from labkit.device import detect_device
from labkit.generation import continuous_footprint
from labkit.memory import GIB, MemoryEstimate, estimate as _estimate_memory
from labkit.models import architecture_config
from labkit.oom import fitting_changes
from labkit.presets import Plan, resolve_plan
from labkit.text import wrap

__all__ = ["estimate", "Preflight", "preflight", "changes_until_fit"]


def estimate(plan: Plan, *, device: str = "cuda", num_layers: int | None = None, num_processes: int = 1):
    """Return :func:`labkit.memory.estimate` for ``plan`` (``num_layers``: a shallower model of the same width;
    ``num_processes``: the processes whose completions one generation batch holds); with ``generation="continuous"``,
    its ``kv_cache`` is :func:`labkit.generation.continuous_footprint`."""
    g, p = plan.config, plan.preset
    model = plan.shape_name  # by name for continuous batching's sizing below
    if num_layers:
        model = architecture_config(plan.shape_name, num_hidden_layers=num_layers)
        model._name_or_path = f"{plan.shape_name} ({num_layers} layers)"
    est = _estimate_memory(
        model if num_layers else plan.shape,  # the plan's shape, read once with it (validation checked its context)
        plan.method,
        per_device_train_batch_size=g["per_device_train_batch_size"],
        gradient_accumulation_steps=g["gradient_accumulation_steps"],
        steps_per_generation=plan.steps_per_generation, num_generations=g["num_generations"],
        max_prompt_length=p.max_prompt_length, max_completion_length=g["max_completion_length"],
        optim=g["optim"], gradient_checkpointing=g["activation_checkpointing"], beta=g["beta"],
        precision=plan.precision, lora_rank=p.lora_rank, lora_targets=list(p.target_modules),
        lora_dropout=p.lora_dropout, prepare_model_for_kbit_training=p.prepare_model_for_kbit_training,
        device=device, padded=True, num_processes=num_processes,
        max_tool_calling_iterations=p.tool_rounds)  # a tool recipe's (notebook 08)
    if not g.get("use_transformers_continuous_batching"):
        return est
    # continuous batching: transformers' paged cache, mask and read buffers instead of generate's cache, and the
    # 16-bit copies TRL's cast makes of fp32 weights (grpo_trainer.py 1796-1800; the clock keeps the fp32 ones)
    terms, s = dict(est.bytes), est.settings
    fp32 = est.trainable_params if plan.adapter_dtype == torch.float32 else 0
    fp32 += plan.shape.params - plan.shape.quantisable_params if p.prepare_model_for_kbit_training else 0
    new = dict(kv_cache=continuous_footprint(model, s["generation_batch"], s["max_prompt_length"],
                                             s["max_completion_length"], 4 if plan.precision == "fp32" else 2)["total"],
               transients=2 * fp32 if plan.precision != "fp32" else 0)
    terms["generation_phase"] += sum(new.values()) - terms["kv_cache"] - terms["transients"]
    terms.update(new, total=max(terms["generation_phase"], terms["training_phase"]))
    return MemoryEstimate(terms, dict(s, generation="continuous"), est.trainable_params, est.total_params)


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
    cut first: the one ranking (:func:`labkit.oom.fitting_changes`, the OOM doctor's too, by its failed phase)."""
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
    candidate change is estimated alone and ranked by :func:`labkit.oom.fitting_changes`
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
