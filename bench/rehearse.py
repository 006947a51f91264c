"""``python -m bench rehearse --preset NAME``: a GPU dress rehearsal without a GPU, TRL's real GRPO step at full
scale on fake tensors.

PyTorch's ``FakeTensorMode`` runs a model's real code with tensors that carry a shape, a dtype and a
device but no data: nothing is computed and nothing is allocated, yet every tensor the step creates
is seen, with its dtype and shape checked by PyTorch's meta kernels. :func:`rehearse` uses that to
run, for a :class:`labkit.presets.Plan`, the step ``build_run`` would run on the card:

1. the policy at full size, built on the meta device from the architecture catalogue, set up in the
   order TRL uses (QLoRA: 4-bit linear layers, and ``prepare_model_for_kbit_training`` when the preset
   asks; PEFT's LoRA; non-reentrant checkpointing; input grads; TRL's bf16 cast of a 4-bit model's adapters and labkit's
   fix of it; TRL's fused LM head), then materialised as fake tensors, embeddings re-tied;
2. **generation**: prefill plus a fixed-length decoding loop to ``max_completion_length`` with
   transformers' KV cache and sampling buffers, under ``no_grad`` (``generate`` itself needs values); a tool
   recipe then runs each of its ``max_tool_calling_iterations`` rounds as TRL does, a new ``generate`` call on
   prompt + completion + tool turn (``max_prompt_length + max_completion_length`` tokens at worst) asking
   ``max_completion_length`` new tokens again (:func:`bench.fake_tensors.generate`);
3. **training**: TRL 1.16's own ``GRPOTrainer._compute_loss`` (log-probs through the fused LM head,
   the loss type's aggregation) and backward, for two micro-batches (micro-batches 3 and later repeat
   the second's allocations), GradScaler under fp16, gradient clipping, the optimiser step (8-bit AdamW
   from bitsandbytes included), twice.

A :class:`bench.fake_tensors.LiveBytes` dispatch mode counts the bytes of every storage alive (each storage once) and
records the peak of each phase with a breakdown. What it does not count and which CUDA behaviours it
reproduces on CPU fake tensors (fake ``"cuda"`` tensors cannot run a backward pass without a driver)
are listed in :data:`NOT_COUNTED` and :data:`EMULATED`, each with the library line it mirrors.
Every figure is **rehearsed (fake tensors)**, never measured. Notebooks 04 and 05 read what it recorded
(:func:`labkit.charts.memory_columns`). The tools it runs with are :mod:`bench.fake_tensors`.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field

import torch

from bench.fake_tensors import (EMULATED, LABEL, NOT_COUNTED, LiveBytes, cuda_behaviours, fake_policy, generate,
                                loss_context, optimizer_for)
from labkit.memory import GIB

__all__ = ["Rehearsal", "rehearse", "main", "LABEL"]


# --------------------------------------------------------------------------- the result


@dataclass
class Rehearsal:
    """What :func:`rehearse` returns: the peak live bytes of each phase, with its breakdown by category."""

    plan: object
    phases: dict  # phase -> {"peak": bytes, "breakdown": {category: bytes}}
    settings: dict
    seconds: float
    cpu_seconds: float
    notes: list = field(default_factory=list)

    @property
    def peak(self) -> int:
        return max(p["peak"] for p in self.phases.values())

    @property
    def peak_gib(self) -> float:
        return self.peak / GIB

    def phase_gib(self, phase: str) -> float:
        return self.phases[phase]["peak"] / GIB

    def table(self) -> str:
        cats = sorted({c for p in self.phases.values() for c in p["breakdown"]},
                      key=lambda c: _ORDER.index(c) if c in _ORDER else 99)
        lines = [f"{'phase':<11}{'peak GiB':>9}  " + "  ".join(f"{c:>12}" for c in cats)]
        for name, p in self.phases.items():
            lines.append(f"{name:<11}{p['peak'] / GIB:>9.3f}  "
                         + "  ".join(f"{p['breakdown'].get(c, 0) / GIB:>12.3f}" for c in cats))
        return "\n".join(lines)

    def report(self) -> str:
        lines = [f"{LABEL}: {self.plan.describe()}", "", "peak live bytes per phase, GiB (" + LABEL + "):",
                 self.table(), "",
                 f"peak {self.peak_gib:.3f} GiB ({LABEL}); {self.seconds:.1f} s wall, {self.cpu_seconds:.1f} s CPU"]
        lines += ["", "not counted:"] + [f"  - {what}" for what in NOT_COUNTED]
        lines += ["", "CUDA behaviours emulated on CPU fake tensors (library line mirrored):"]
        lines += [f"  - {what} [{where}]" for what, where in EMULATED]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


_ORDER = ["weights", "gradients", "optimizer", "kv_cache", "activations", "generation"]


def rehearse(plan, *, generation: bool = True, optimizer_steps: int = 2, num_layers: int | None = None) -> Rehearsal:
    """Rehearse one GRPO step of ``plan`` (a :class:`labkit.presets.Plan`, a preset or its name) on fake tensors.

    Returns a :class:`Rehearsal`: phases ``generation`` (prefill + decode with the KV cache), ``training``
    (forward and backward of the micro-batches) and ``optimizer`` (clipping and the optimiser step),
    each with its peak live bytes and the breakdown by category at that peak. ``num_layers`` rehearses a
    shallower model of the same width (compare it with ``labkit.oom.estimate(plan, num_layers=...)``).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from labkit.presets import resolve_plan

    plan = resolve_plan(plan)
    if plan.card is None or plan.card.kind != "cuda":
        raise ValueError(f"{plan.preset.name} is a CPU preset: the rehearsal rehearses a GPU run "
                         "(give it a card: --set card=rtx3080-laptop-16gb, a key of labkit.device.CARDS)")
    g = plan.config
    micro, gen_batch = g["per_device_train_batch_size"], plan.preset.generation_batch_size
    prompt_len, completion_len = plan.preset.max_prompt_length, g["max_completion_length"]
    tool_rounds = plan.preset.tool_rounds  # the estimate's rule, once
    started, cpu_started = time.perf_counter(), time.process_time()
    tracker = LiveBytes()
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with cuda_behaviours():
        model = fake_policy(plan, fake, tracker, num_layers=num_layers)
    trainable = [p for p in model.parameters() if p.requires_grad]
    ctx, args = loss_context(plan, model)
    optimizer = optimizer_for(plan, trainable)
    scaler = torch.amp.GradScaler("cpu") if plan.precision == "fp16" else None
    notes = []
    with cuda_behaviours(), fake, tracker:
        model.train()
        for step in range(optimizer_steps):
            last = step == optimizer_steps - 1
            if generation and last:  # with the optimiser states alive, as in every step after the first
                tracker.start("generation", "generation")
                turn_peaks = generate(model, plan, tracker, gen_batch, prompt_len, completion_len, tool_rounds)
            tracker.start("training", "activations")
            tracker.true_count = micro * completion_len  # every completion token is scored
            for _ in range(min(2, g["gradient_accumulation_steps"]) if last else 1):
                inputs = dict(prompt_ids=torch.zeros((micro, prompt_len), dtype=torch.long),
                              prompt_mask=torch.ones((micro, prompt_len), dtype=torch.long),
                              completion_ids=torch.zeros((micro, completion_len), dtype=torch.long),
                              completion_mask=torch.ones((micro, completion_len), dtype=torch.int),
                              advantages=torch.zeros((micro,), dtype=torch.float32),
                              num_items_in_batch=torch.tensor(float(gen_batch * completion_len)))
                loss = ctx.compute_loss(model, inputs)
                (scaler.scale(loss) if scaler else loss).backward()  # accelerate/accelerator.py:2857
                del loss, inputs
            tracker.true_count = None
            tracker.start("optimizer", "optimizer")
            if scaler is not None:
                scaler.unscale_(optimizer)  # accelerate/accelerator.py:3047 (clip_grad_norm_ unscales first)
            if args.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(trainable, args.max_grad_norm)
            if scaler is not None:  # found_inf.item() reads 0: the step runs (torch/amp/grad_scaler.py:371)
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            for state in optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        tracker.label(value, "optimizer")
            optimizer.zero_grad(set_to_none=True)
    notes.append("the first optimiser step runs one micro-batch (it creates the gradients and the optimiser "
                 "states); generation and two micro-batches run in the last step, when both exist")
    if g["gradient_accumulation_steps"] > 2:
        notes.append(f"micro-batches 3 to {g['gradient_accumulation_steps']} of a step repeat the second's "
                     f"allocations and are not run again")
    if generation and tool_rounds:
        notes.append(f"generation: the first turn peaked at {turn_peaks[0] / GIB:.3f} GiB; {tool_rounds} tool round(s), "
                     f"each a generate call over {prompt_len + completion_len} + {completion_len} tokens for "
                     f"{gen_batch} sequences, at {tracker.peaks['generation'][0] / GIB:.3f} GiB (the phase's peak)")
    if generation and completion_len > 2:
        notes.append(f"decoding steps 2 to {completion_len - 1} are not run one by one: the KV cache is grown to "
                     f"their length with one DynamicCache.update per layer; the last step runs in full")
    phases = {name: {"peak": peak, "breakdown": {k: v for k, v in breakdown.items() if v}}
              for name, (peak, breakdown) in tracker.peaks.items() if name != "setup"}
    settings = dict(model=plan.model, method=plan.method, precision=plan.precision, optim=g["optim"],
                    per_device_train_batch_size=micro, gradient_accumulation_steps=g["gradient_accumulation_steps"],
                    generation_batch_size=gen_batch, num_generations=g["num_generations"],
                    max_prompt_length=prompt_len, max_completion_length=completion_len,
                    max_tool_calling_iterations=tool_rounds,
                    activation_checkpointing=g["activation_checkpointing"], loss_type=plan.loss_type,
                    trainable_params=sum(p.numel() for p in trainable), num_layers=num_layers)
    return Rehearsal(plan, phases, settings, time.perf_counter() - started, time.process_time() - cpu_started,
                     notes)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench rehearse --preset NAME [--set KEY=VALUE ...]``: :func:`rehearse`.

    Prints the plan, the rehearsed peak of each phase with its breakdown, what is not counted and which
    CUDA behaviours are emulated, and the estimate preflight makes for the same plan. Exit 2 on a bad preset.
    """
    from labkit.options import UsageError, parse_pairs
    from labkit.presets import PRESETS, PresetError, get_preset
    from labkit.validation import validate

    parser = argparse.ArgumentParser(
        prog="python -m bench rehearse",
        description="Run a GPU preset's GRPO step (TRL 1.16's own code) at full size on fake tensors and print the "
                    "peak live memory of each phase: rehearsed, not measured.")
    parser.add_argument("--preset", required=True, help=f"one of: {', '.join(PRESETS)}")
    parser.add_argument("--set", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                        help="override any preset field")
    parser.add_argument("--no-generation", action="store_true", help="skip the generation phase")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        from labkit.presets import resolve_plan
        from labkit.oom import estimate

        preset = get_preset(args.preset, **parse_pairs("--set", args.set))
        plan = resolve_plan(preset)
        if plan.card is None or plan.card.kind != "cuda":
            raise PresetError(f"{preset.name} is a CPU preset (card=None): the rehearsal rehearses a GPU run; "
                              "give it a card with --set card=rtx3080-laptop-16gb (a key of labkit.device.CARDS)")
        for warning in validate(preset, plan.card):
            print(f"warning: {warning}")
    except (PresetError, UsageError, KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = rehearse(plan, generation=not args.no_generation)
    print(result.report())
    est = estimate(plan)
    rows = [("generation", est.bytes["generation_phase"]), ("training", est.bytes["training_phase"]),
            ("peak", est.bytes["total"])]
    print("\npreflight's estimate (labkit.memory.estimate) vs the rehearsal, GiB:")
    print(f"{'phase':<11}{'estimated':>10}{'rehearsed':>11}{'ratio':>8}")
    for name, value in rows:
        rehearsed = result.peak if name == "peak" else max(
            result.phases[p]["peak"] for p in (("training", "optimizer") if name == "training" else (name,))
            if p in result.phases)
        print(f"{name:<11}{value / GIB:>10.3f}{rehearsed / GIB:>11.3f}{value / rehearsed:>8.3f}")
    card = plan.card.total_memory_gib
    print(f"\ncard {card:g} GiB: rehearsed peak {result.peak_gib:.2f} GiB = {100 * result.peak_gib / card:.0f} % "
          f"of it ({LABEL}; add the CUDA context and fragmentation, about 1 GiB, before comparing with a card)")
    return 0
