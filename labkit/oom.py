"""The OOM doctor: a CUDA out-of-memory error during GRPO training, explained in a few lines.

Introduced in ``04_lora_grpo_16gb.ipynb``. :func:`train_with_oom_doctor` runs
``trainer.train()`` with a :class:`PhaseTracker` attached. When the card runs out of
memory, the raw traceback (hundreds of lines through accelerate, TRL and transformers)
becomes :class:`TrainingOutOfMemory`, whose message is an :class:`OOMReport`:

- which step, and which phase of it: generation, scoring (rewards, old and reference
  log-probs), the loss's forward pass, the backward pass, the optimiser step;
- what was allocated and reserved, and what the failed allocation asked for;
- an ordered list of settings to change, only those that cut that phase's memory;
- the last checkpoint, which is kept (nothing is written after an OOM: the model and
  optimiser may be half updated), so the run resumes from there.

Why the phase matters. Each phase holds its own memory (:func:`labkit.phase_memory.phase_memory`, from the
terms of :func:`labkit.memory.estimate`, in TRL 1.16's units), so each has its own cure:

- **generation**: the KV cache of the whole generation batch, ``per_device_train_batch_size x
  steps_per_generation`` sequences (``steps_per_generation`` defaults to
  ``gradient_accumulation_steps``; ``num_generations`` only groups them). Halving the per-device
  batch at double the accumulation keeps that batch, so it does nothing here.
- **scoring** (old / reference log-probs, rewards): a ``torch.no_grad()`` forward with gradient
  checkpointing switched off, ``per_device_train_batch_size`` sequences at a time, no saved
  activations (:func:`labkit.phase_memory.scoring_memory`): checkpointing cannot change it.
- the loss's **forward** and **backward** passes: the activations autograd keeps and the LM head's
  tile of logits (TRL 1.16 computes Qwen's 151,936-entry logits in chunks of 4,096 tokens x 32,768
  entries) for ``per_device_train_batch_size`` sequences: checkpointing, a smaller per-device batch
  and shorter completions cut them.
- the **optimiser step**: the activations are freed by then; weights, reference, gradients and the
  AdamW states, allocated on the first step (:func:`labkit.phase_memory.optimizer_step_memory`).

:func:`ordered_changes` offers only the changes that cut the memory of the phase that ran out.

NaN. The same wrapper installs :class:`NaNGuard` and turns NaN logits met by sampling into
:class:`NonFiniteTraining`, whose message says what to change (on a T4: fp16 overflow; QLoRA with
``prepare_model_for_kbit_training=True``, or fp32) at the step where it first happens.
"""
from __future__ import annotations

import functools
import gc
import json
import math
import re
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import TrainerCallback

from labkit.memory import EIGHT_BIT_OPTIMS, GIB
from labkit.phase_memory import flat_settings, phase_memory
from labkit.training import last_checkpoint

__all__ = [
    "PHASES",
    "Change",
    "candidate_changes",
    "fitting_changes",
    "ordered_changes",
    "OOMReport",
    "report_text",
    "TrainingOutOfMemory",
    "PhaseTracker",
    "is_oom",
    "explain_oom",
    "settings_from_trainer",
    "train_with_oom_doctor",
    "NonFiniteTraining",
    "NaNGuard",
    "non_finite_advice",
]

PHASES = {
    "setup": "setup, before the first step (loading, optimiser creation)",
    "generation": "generation: sampling the completions (KV cache of the whole generation batch)",
    "scoring": "scoring: rewards and the old / reference log-probs of the completions (no_grad)",
    "forward": "the loss's forward pass (policy log-probs and logits of prompt + completion)",
    "backward": "the backward pass (activations and gradients)",
    "optimizer": "the optimiser step (AdamW states are allocated on the first one)",
    "between steps": "between steps (logging, saving a checkpoint)",
}
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
    check (by the generation phase's: both :func:`labkit.preflight.changes_until_fit`) and the OOM doctor (by the
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
        return report_text(lines)


def report_text(lines: list[str]) -> str:
    """Return a report's ``lines`` wrapped between words at 100 characters, a numbered change's lines under its text:
    JupyterLab cuts a long printed line mid-word (this report, and :class:`labkit.preflight.Preflight`'s)."""
    return "\n".join(textwrap.fill(line, 100, break_long_words=False, break_on_hyphens=False,
                                    subsequent_indent=" " * len(re.match(r"\s*(\d+\. )?", line).group(0)))
                     for line in lines)


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


class PhaseTracker:
    """Records which phase of which step is running, by wrapping the trainer's phase methods.

    ``_generate`` (TRL: sampling) marks generation, its return marks scoring; ``compute_loss``
    marks the forward pass, its return the backward pass; the optimiser callbacks mark the
    optimiser step. A trainer without one of these methods just reports a coarser phase.
    """

    def __init__(self):
        self.phase = "setup"
        self.step = 0
        self._trainer = None
        self._callback = None

    def install(self, trainer) -> "PhaseTracker":
        tracker = self

        def wrap(original, start, end):
            @functools.wraps(original)
            def wrapped(*args, **kwargs):
                tracker.phase = start
                result = original(*args, **kwargs)
                tracker.phase = end
                return result

            return wrapped

        for name, start, end in (("_generate", "generation", "scoring"), ("compute_loss", "forward", "backward")):
            original = getattr(trainer, name, None)
            if original is not None:
                setattr(trainer, name, wrap(original, start, end))

        class _Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                tracker.step = state.global_step + 1

            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                tracker.phase = "optimizer"

            def on_optimizer_step(self, args, state, control, **kwargs):
                tracker.phase = "between steps"

            def on_step_end(self, args, state, control, **kwargs):
                tracker.phase = "between steps"

        self._trainer, self._callback = trainer, _Callback()
        trainer.add_callback(self._callback)
        return self

    def uninstall(self) -> None:
        if self._trainer is None:
            return
        for name in ("_generate", "compute_loss"):
            self._trainer.__dict__.pop(name, None)  # back to the class's method
        self._trainer.remove_callback(self._callback)
        self._trainer = None


def settings_from_trainer(trainer) -> dict:
    """Return the memory-relevant settings of a ``GRPOTrainer`` under preset field names."""
    args, model = trainer.args, trainer.model
    if getattr(model, "is_loaded_in_4bit", False) or getattr(getattr(model, "base_model", None), "is_loaded_in_4bit", False):
        method = "qlora"
    elif hasattr(model, "peft_config"):
        method = "lora"
    else:
        method = "full"
    optim = getattr(args.optim, "value", args.optim)
    settings = {
        "model": getattr(getattr(model, "config", None), "_name_or_path", None),
        "method": method,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        # TRL resolves the default (= gradient_accumulation_steps); only a value set on purpose is kept
        "steps_per_generation": (args.steps_per_generation
                                 if args.steps_per_generation != args.gradient_accumulation_steps else None),
        "num_generations": args.num_generations,
        "num_processes": getattr(args, "world_size", 1) or 1,
        "max_completion_length": args.max_completion_length,
        "optim": optim,
        "activation_checkpointing": bool(args.activation_checkpointing),
        "beta": args.beta,
        "precision": _trainer_precision(args),
        "num_iterations": getattr(args, "num_iterations", 1),
    }
    if method == "qlora" and hasattr(model, "get_input_embeddings"):  # PEFT's upcast leaves fp32 embeddings
        dtype = getattr(getattr(model.get_input_embeddings(), "weight", None), "dtype", None)
        settings["prepare_model_for_kbit_training"] = dtype == torch.float32 and settings["precision"] != "fp32"
    peft_config = getattr(model, "peft_config", None)
    if isinstance(peft_config, dict) and peft_config:
        adapter = next(iter(peft_config.values()))
        settings["lora_rank"] = getattr(adapter, "r", None)
        targets = getattr(adapter, "target_modules", None)
        if targets and not isinstance(targets, str):
            settings["target_modules"] = sorted(targets)
    return settings


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


class NonFiniteTraining(RuntimeError):
    """NaN or inf in generation or in the loss's diagnostics; the message says what to change."""


# What torch.multinomial says when sampling meets NaN / inf probabilities (NaN logits).
_NAN_SAMPLING = "probability tensor contains either"


def non_finite_advice(where: str, *, precision: str | None, step: int, checkpoint=None) -> str:
    """Return the message of :class:`NonFiniteTraining`: where NaN/inf appeared and what to change.

    Under fp16 (a T4) the usual cause is overflow: Qwen2.5 in pure fp16 is known to overflow to NaN
    or print "!!!!" (Qwen issues 761, 826, 868). The fix on a T4: QLoRA with
    ``prepare_model_for_kbit_training=True`` (PEFT upcasts embeddings and norms, so the residual stream
    is fp32 and cannot pass fp16's 65,504; the 4-bit matmuls still compute in fp16, bitsandbytes/nn/modules.py
    626-637, so a layer's own output can still overflow: not yet tried on a T4; QLoRA as TRL builds it keeps
    fp16 hidden states), or fp32 for a small model; bf16 on Ampere or newer.
    """
    lines = [f"NaN/inf at step {step}, in {where}."]
    if precision == "fp16":
        lines.append("Under fp16 (a T4) this is overflow: Qwen2.5 in pure fp16 is known to overflow (Qwen issues "
                     "761, 826, 868). Change: method='qlora' with prepare_model_for_kbit_training=True (PEFT "
                     "upcasts the embeddings and norms: the residual stream is fp32 and cannot pass fp16's 65,504, though each "
                     "4-bit matmul still computes in fp16; "
                     "--set method=qlora prepare_model_for_kbit_training=true), or precision='fp32' for a small "
                     "model (slower); bf16 on an Ampere or newer card.")
    else:
        lines.append("Change: a lower learning_rate (--set learning_rate=...), or check the reward functions for "
                     "NaN; with beta > 0, a smaller beta.")
    if checkpoint is not None:
        lines.append(f"The last checkpoint before it is {checkpoint}; a changed recipe needs a new output_dir.")
    return "\n".join(lines)


def _trainer_precision(args) -> str:
    return "fp16" if getattr(args, "fp16", False) else "bf16" if getattr(args, "bf16", False) else "fp32"


class NaNGuard(TrainerCallback):
    """Stops training at the first NaN/inf in the logged loss diagnostics, with :class:`NonFiniteTraining`.

    ``entropy`` and ``kl`` (TRL's logs) NaN mean NaN logits: raised at once. The loss itself is
    filtered by transformers (``logging_nan_inf_filter``), so it is not relied on. ``grad_norm``
    may be inf for a few steps under fp16 while the grad scaler finds its scale (those steps are
    skipped, which is harmless): raised after ``patience`` non-finite norms in a row.
    """

    def __init__(self, patience: int = 5):
        self.patience, self.bad_norms = patience, 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        where = None
        for key in ("loss", "entropy", "kl", "reward"):
            value = logs.get(key)
            if isinstance(value, (int, float)) and not math.isfinite(value):
                where = f"the logged {key}"
                break
        norm = logs.get("grad_norm")
        if isinstance(norm, (int, float)):
            self.bad_norms = 0 if math.isfinite(norm) else self.bad_norms + 1
            if self.bad_norms >= self.patience:
                where = f"the gradients ({self.bad_norms} steps in a row with grad_norm {norm})"
        if where:
            raise NonFiniteTraining(non_finite_advice(where, precision=_trainer_precision(args), step=state.global_step,
                                                      checkpoint=last_checkpoint(args.output_dir)))


def train_with_oom_doctor(trainer, *, resume_from_checkpoint=None, settings: dict | None = None):
    """Return ``trainer.train(...)``'s ``TrainOutput``; an OOM becomes :class:`TrainingOutOfMemory`.

    The report is also written to ``OUTPUT_DIR/oom_report.json``. The exception is raised
    after the failed step's frames are released and the CUDA cache is emptied, so the
    notebook's kernel gets its memory back; its message is the report, not a traceback.
    """
    tracker = PhaseTracker().install(trainer)
    if not any(isinstance(c, NaNGuard) for c in trainer.callback_handler.callbacks):
        trainer.add_callback(NaNGuard())
    report = None
    try:
        return trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    except BaseException as error:
        if isinstance(error, RuntimeError) and _NAN_SAMPLING in str(error):
            # NaN logits reached torch.multinomial: say what to change instead of a sampling traceback.
            raise NonFiniteTraining(non_finite_advice(
                "generation (sampling met NaN/inf probabilities: the logits were NaN)",
                precision=_trainer_precision(trainer.args), step=tracker.step,
                checkpoint=last_checkpoint(trainer.args.output_dir))) from None
        if not is_oom(error):
            raise
        output_dir = trainer.args.output_dir
        # What the trainer runs with (precision, steps_per_generation), then the recipe's own fields on top.
        known = {**settings_from_trainer(trainer),
                 **{k: v for k, v in flat_settings(settings or {}).items() if v is not None}}
        report = explain_oom(error, phase=tracker.phase, step=tracker.step, max_steps=trainer.state.max_steps,
                             settings=known,
                             checkpoint=last_checkpoint(output_dir), output_dir=output_dir)
    finally:
        tracker.uninstall()
    # Out of the except block: the traceback (and the failed step's tensors) is gone.
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if trainer.args.should_save:
        path = Path(report.output_dir) / "oom_report.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    raise TrainingOutOfMemory(report)
