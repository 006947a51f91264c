"""The production path: TRL's ``GRPOTrainer``, configured for this device.

Every notebook that trains through TRL builds its configuration with :func:`grpo_config`,
which takes the precision from :func:`labkit.device.choose_precision` (never bf16 on a CPU, never
bf16 on a T4) and fills in what a lesson needs (logging every step, no external
reporting). :class:`NaNGuard` stops a run at the first NaN or inf with what to change (:func:`non_finite_advice`);
:func:`train_with_oom_doctor` runs ``trainer.train()`` with both guards: a :class:`PhaseTracker` records which phase
of which step runs, so that an out-of-memory error becomes the OOM doctor's report (:mod:`labkit.oom`).
Introduced in ``00_setup.ipynb``; used from notebook 03 on.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import json
import math
import os
import struct
import zipfile
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import sort_checkpoints

from labkit.models import write_whole
from labkit.oom import TrainingOutOfMemory, explain_oom, flat_settings, is_oom

__all__ = ["grpo_config", "build_trainer", "too_few_prompts", "last_checkpoint", "checkpoint_problem",
           "checkpoint_step", "LogRecorder", "NonFiniteTraining", "non_finite_advice", "NaNGuard", "nan_in_sampling",
           "args_precision", "PhaseTracker", "settings_from_trainer", "train_with_oom_doctor"]


def grpo_config(output_dir: str | os.PathLike, *, device=None, precision: str | None = None, plan=None,
                **overrides):
    """Return a ``trl.GRPOConfig`` whose precision and device flags match this machine.

    ``overrides`` are any ``GRPOConfig`` fields (``num_generations=4``, ``beta=0.04``, ...).
    Setting ``bf16``/``fp16`` directly is refused: pass ``precision="fp16"`` instead, which
    is checked against the device (a T4 asked for bf16 fails here, before training). ``plan``, a checked
    :class:`labkit.presets.Plan` (``build_run``'s), gives its precision, decided and checked there, for ``device``.
    """
    from trl import GRPOConfig

    from labkit.device import choose_precision, detect_device, precision_flags

    for flag in ("bf16", "fp16"):
        if flag in overrides:
            raise TypeError(f"pass precision='{flag}' instead of {flag}=...: the lab checks it against the device")
    device = device or detect_device()
    flags = precision_flags(plan.precision if plan is not None else choose_precision(device, precision))
    defaults = dict(
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=device.kind == "cpu",
        # TRL's default optimiser is the fused AdamW (transformers' training_args.py 806-811), which steps on a CPU
        # too (torch 2.13); the CPU mode keeps the plain loop that its recorded results were made with.
        optim="adamw_torch_fused" if device.kind == "cuda" else "adamw_torch",
        # Recompute activations in the backward pass on a GPU (memory is the constraint there);
        # transformers 5 renamed gradient_checkpointing to activation_checkpointing.
        activation_checkpointing=device.kind == "cuda",
        dataloader_pin_memory=device.kind == "cuda",
    )
    defaults.update(overrides)
    # transformers 5.17 (the Unsloth environment, requirements-unsloth.txt) has no
    # activation_checkpointing yet: pass its older name there.
    if "activation_checkpointing" not in {f.name for f in dataclasses.fields(GRPOConfig)}:
        for new, old in (("activation_checkpointing", "gradient_checkpointing"),
                         ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs")):
            if new in defaults:
                defaults[old] = defaults.pop(new)
    return GRPOConfig(output_dir=str(output_dir), **flags, **defaults)


def build_trainer(model, reward_funcs, train_dataset, args, *, tokenizer=None, peft_config=None,
                  callbacks=None, eval_dataset=None, quantization_config=None, environment_factory=None):
    """Return a ``trl.GRPOTrainer`` for ``model`` (a path, hub id or loaded model).

    ``environment_factory`` (a tool recipe: :data:`labkit.environments.ENVIRONMENTS`) goes to TRL, which makes
    one environment per rollout and runs the tool calls (notebook 08).

    ``quantization_config`` (QLoRA: :func:`labkit.models.quantization_config`) goes to TRL, which loads
    a model given by name with it (trl/trainer/grpo_trainer.py 336-348).

    A model that was built in memory must be saved and passed as a path when ``beta > 0``:
    TRL then reloads the reference model from that name.
    """
    from trl import GRPOTrainer

    if hasattr(train_dataset, "__len__"):  # an IterableDataset has no length to check
        problem = too_few_prompts(len(train_dataset), args.generation_batch_size, args.num_generations)
        if problem:
            raise ValueError(f"{problem} Use more prompts, or lower per_device_train_batch_size or steps_per_generation.")
    if args.beta > 0 and not isinstance(model, (str, os.PathLike)) and peft_config is None \
            and not hasattr(model, "peft_config"):
        name = getattr(getattr(model, "config", None), "_name_or_path", "")
        if not name or not os.path.exists(name) and "/" not in name:
            raise ValueError(
                "beta > 0 needs a reference model, which GRPOTrainer reloads from the policy's name, but this "
                "model was built in memory. Save it first (model.save_pretrained(path)) and pass the path."
            )
    kwargs = dict(model=model if not isinstance(model, os.PathLike) else str(model), reward_funcs=reward_funcs,
                  args=args, train_dataset=train_dataset, eval_dataset=eval_dataset, callbacks=callbacks,
                  peft_config=peft_config, processing_class=tokenizer)
    if quantization_config is not None:
        kwargs["quantization_config"] = quantization_config
    if environment_factory is not None:
        kwargs["environment_factory"] = environment_factory
    return GRPOTrainer(**kwargs)


def too_few_prompts(prompts: int, generation_batch_size: int, num_generations: int) -> str | None:
    """Say why ``prompts`` prompts give no training step, or return None when they give at least one.

    TRL's ``RepeatSampler`` hands out prompts in chunks of ``generation_batch_size // num_generations``
    and drops a chunk that is not full (trl/trainer/grpo_trainer.py ``_get_train_sampler``;
    trl/trainer/utils.py ``RepeatSampler.__iter__``). With fewer prompts than one chunk the trainer
    finds no batch and stops at step 0 with only a logged warning: a run that silently trains nothing.
    """
    needed = generation_batch_size // max(num_generations, 1)
    if prompts >= needed:
        return None
    return (f"{prompts} training prompts give no training step: one generation batch of {generation_batch_size} "
            f"completions takes {needed} prompts ({num_generations} completions each), and TRL's sampler drops a "
            "batch that is not full, so the run would stop at step 0.")


def last_checkpoint(output_dir: str | os.PathLike, *, skipped: list | None = None) -> Path | None:
    """Return the newest intact ``checkpoint-N`` folder in ``output_dir`` (None when there is none).

    A folder without ``trainer_state.json`` was cut off while being written (the process
    died mid-save) and is passed over silently. A newer checkpoint that is damaged (a file cut
    short, a malformed JSON file: :func:`checkpoint_problem`) is skipped too, and
    ``(path, why)`` is appended to ``skipped`` so the caller can say which and why.

    transformers finds and orders the folders (``trainer_utils.sort_checkpoints``, by step number); labkit adds
    the checks. ``trainer_utils.get_last_checkpoint``, what ``Trainer.train(resume_from_checkpoint=True)``
    resumes from, is the highest step whatever its state: it cannot skip a checkpoint cut short for the one before.
    """
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    for path in map(Path, reversed(sort_checkpoints(str(folder)))):  # the newest step first
        if not path.name.removeprefix("checkpoint-").isdigit() or not (path / "trainer_state.json").exists():
            continue
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        if skipped is not None:
            skipped.append((path, problem))
    return None


def checkpoint_step(checkpoint: str | os.PathLike) -> int | None:
    """Return the ``global_step`` a checkpoint's ``trainer_state.json`` records, or None when unreadable."""
    try:
        step = json.loads((Path(checkpoint) / "trainer_state.json").read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return "is cut short (no header)"
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            return "is cut short (its header is incomplete)"
        try:
            header = json.loads(handle.read(length))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return "has a malformed header"
    if size < 8 + length + end:
        return f"is cut short ({size:,} bytes of {8 + length + end:,})"
    return None


def checkpoint_problem(checkpoint: str | os.PathLike) -> str | None:
    """Return what is damaged in a checkpoint folder (naming the file), or None when it looks intact.

    Cheap checks that need no torch: ``trainer_state.json`` and every other JSON file parse (the
    state with its ``global_step``), every ``.safetensors`` file holds the bytes its header
    promises, and every ``.pt`` / ``.pth`` / ``.bin`` file (torch's zip format) has its zip
    directory, which sits at the end of the file and goes first when a write is cut short.
    """
    folder = Path(checkpoint)
    for path in sorted(folder.iterdir()):
        if not path.is_file():
            continue
        name = path.name
        try:
            if name.endswith(".json"):
                data = json.loads(path.read_text())
                if name == "trainer_state.json" and checkpoint_step(folder) is None:
                    return f"{name} has no global_step" if isinstance(data, dict) else f"{name} is not a JSON object"
            elif name.endswith(".safetensors"):
                problem = _safetensors_problem(path)
                if problem:
                    return f"{name} {problem}"
            elif name.endswith((".pt", ".pth", ".bin")) and not zipfile.is_zipfile(path):
                return f"{name} is cut short or not a torch file"
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return f"{name} is unreadable ({type(exc).__name__}: {exc})"
    return None


class LogRecorder(TrainerCallback):
    """A trainer callback that keeps TRL's per-step logs of ``keys``: ``recorder.values["step_time"]``, ...

    One value per training step (a log that has ``step_time``), NaN where a key is missing, so the
    lists stay aligned. The benchmarks read seconds per step, tokens and rewards from it.
    """

    def __init__(self, keys=("step_time",)):
        self.keys = tuple(dict.fromkeys(("step_time", *keys)))
        self.values: dict[str, list[float]] = {key: [] for key in self.keys}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "step_time" in logs:
            for key in self.keys:
                value = logs.get(key)
                self.values[key].append(math.nan if value is None else float(value))


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


def args_precision(args) -> str:
    """Return the precision ("fp16", "bf16" or "fp32") that a trainer's arguments train in."""
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
            raise NonFiniteTraining(non_finite_advice(where, precision=args_precision(args), step=state.global_step,
                                                      checkpoint=last_checkpoint(args.output_dir)))


def nan_in_sampling(error: BaseException, args, step: int) -> NonFiniteTraining | None:
    """Return the :class:`NonFiniteTraining` for ``error`` when it is torch's sampling meeting NaN/inf probabilities
    (NaN logits in generation), else None. ``args``: the trainer's arguments (their precision and output_dir)."""
    if not (isinstance(error, RuntimeError) and _NAN_SAMPLING in str(error)):
        return None
    return NonFiniteTraining(non_finite_advice("generation (sampling met NaN/inf probabilities: the logits were NaN)",
                                               precision=args_precision(args), step=step,
                                               checkpoint=last_checkpoint(args.output_dir)))


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

        def in_phase(original, start, end):
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
                setattr(trainer, name, in_phase(original, start, end))

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
        "precision": args_precision(args),
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
        non_finite = nan_in_sampling(error, trainer.args, tracker.step)
        if non_finite is not None:  # NaN logits reached torch.multinomial: what to change, not a sampling traceback
            raise non_finite from None
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
        write_whole(Path(report.output_dir) / "oom_report.json", json.dumps(report.as_dict(), indent=2) + "\n")
    raise TrainingOutOfMemory(report)
