"""The Unsloth fast path: load a preset's policy through ``FastLanguageModel``, and measure it against plain TRL.

Introduced in ``06_unsloth.ipynb``. Unsloth (``pip install unsloth``) replaces parts of a model's
forward and backward pass with Triton kernels, adds its own gradient checkpointing (which offloads
the checkpointed activations to CPU RAM) and can generate with vLLM (``fast_inference=True``). It
needs a CUDA GPU, and its releases pin older libraries than the lab's (``unsloth`` 2026.10 requires
``trl<=1.15``, ``transformers<=5.17``, ``datasets<5``): it lives in its own environment,
``requirements-unsloth.txt``, never in the lab's main one.

- :func:`unsloth_status` says whether this machine can run the Unsloth path, and if not, why
  (no CUDA GPU, unsloth not installed, installed versions outside unsloth's declared ranges). It
  never imports unsloth: importing it patches transformers and TRL for the whole process.
- :func:`load_unsloth_policy` loads a :class:`labkit.presets.Preset`'s model with 4-bit weights
  (QLoRA presets) or 16-bit ones (LoRA presets), LoRA adapters of the preset's rank on its target
  modules, and Unsloth's gradient checkpointing.
- :func:`read_comparison` and :func:`comparison_summary` read what the measurement recorded.

The measurement itself sits beside the package: ``python -m bench unsloth`` (:mod:`bench.unsloth`) trains one
preset for a few steps through plain TRL (notebook 04's :func:`labkit.run.build_run`) and through Unsloth, each in
a fresh process, and appends their rows to ``results/unsloth_vs_trl.csv``.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

__all__ = [
    "BACKENDS",
    "COMPARISON_TARGETS",
    "RESULTS_FILE",
    "UnslothStatus",
    "unsloth_status",
    "requirement_conflicts",
    "load_unsloth_policy",
    "require_unsloth",
    "read_comparison",
    "comparison_summary",
]

BACKENDS = ("trl", "unsloth")
# The LoRA targets of the comparison, for both arms: all seven projections. Unsloth fuses its MLP kernel
# only when gate, up and down all have adapters, and its QKV kernel only with q, k and v; the 16 GB
# recipe's five (q/k/o/up/down) would switch most of its fused kernels off and compare it unfairly.
COMPARISON_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RESULTS_FILE = "unsloth_vs_trl.csv"
# The packages whose versions unsloth pins and the lab's code path depends on.
_CHECKED = ("torch", "trl", "transformers", "datasets", "peft", "accelerate", "bitsandbytes")


@dataclass(frozen=True)
class UnslothStatus:
    """What :func:`unsloth_status` found: can the Unsloth path run here, and if not, why."""

    available: bool
    reason: str
    version: str | None = None
    conflicts: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.reason


def _applies(req, active: set[str]) -> bool:
    """Return whether requirement ``req`` applies here with any of the ``active`` extras."""
    return req.marker is None or any(req.marker.evaluate({"extra": e}) for e in active)


def _active_extras(requirements: list, extras) -> set[str]:
    """Return ``extras`` plus every extra they pull in through unsloth's own ``unsloth[...]`` requirements."""
    active, changed = {""} | set(extras), True
    while changed:
        changed = False
        for req in requirements:
            if req.name.lower() != "unsloth" or not req.extras:
                continue
            if _applies(req, active) and not req.extras <= active:
                active |= req.extras
                changed = True
    return active


def requirement_conflicts(requirements: list[str] | None = None, installed: dict | None = None,
                          extras=("huggingface",)) -> list[str]:
    """Return the installed packages outside unsloth's declared ranges: ``["trl 1.16.0 (unsloth needs <=1.15.0,...)"]``.

    ``requirements`` defaults to unsloth's own ``Requires-Dist`` (from its installed metadata);
    ``installed`` maps package name to version and defaults to what is installed here. Only the
    packages the lab's training path uses are checked (torch, trl, transformers, datasets, peft,
    accelerate, bitsandbytes); requirements whose environment marker does not apply are skipped.
    Unsloth declares its trl / transformers / datasets caps under an extra (``huggingface``), which
    its GRPO path needs: requirements under ``extras`` (and the extras those pull in through
    ``unsloth[...]``) count as applying, so those caps are checked too.
    """
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version

    if requirements is None:
        requirements = metadata.requires("unsloth") or []
    requirements = [Requirement(text) for text in requirements]
    active = _active_extras(requirements, extras)
    if installed is None:
        installed = {}
        for name in _CHECKED:
            try:
                installed[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                pass
    conflicts = []
    for req in requirements:
        name = req.name.lower().replace("_", "-")
        if name not in _CHECKED or name not in installed or not _applies(req, active):
            continue
        try:
            ok = req.specifier.contains(Version(installed[name]), prereleases=True)
        except InvalidVersion:
            continue
        if not ok:
            conflicts.append(f"{name} {installed[name]} (unsloth needs {req.specifier})")
    return conflicts


def unsloth_status(device=None) -> UnslothStatus:
    """Return an :class:`UnslothStatus`: whether the Unsloth path can run on this machine, and why not.

    Checked in order, without importing unsloth: a CUDA GPU (Unsloth's GRPO path runs Triton
    kernels; its CPU fallback only covers supervised fine-tuning), unsloth installed, and the
    installed torch / TRL / transformers / datasets inside unsloth's declared ranges.
    """
    from labkit.device import detect_device

    device = device or detect_device()
    if device.kind != "cuda":
        return UnslothStatus(False, f"Unsloth's GRPO path needs a CUDA GPU (its kernels are written in Triton); "
                                    f"this machine has {device}.")
    if importlib.util.find_spec("unsloth") is None:
        return UnslothStatus(False, "unsloth is not installed in this environment. It pins older TRL and "
                                    "transformers than the lab, so install it in a separate one: "
                                    "`pip install -r requirements-unsloth.txt -e .` (or run notebook 06's "
                                    "install cell on Colab).")
    version = metadata.version("unsloth")
    conflicts = tuple(requirement_conflicts())
    if conflicts:
        return UnslothStatus(False, f"unsloth {version} is installed, but these versions are outside its "
                                    f"declared ranges: {'; '.join(conflicts)}. Reinstall from "
                                    "requirements-unsloth.txt in a fresh environment.", version, conflicts)
    return UnslothStatus(True, f"unsloth {version} on {device}", version)


def require_unsloth():
    status = unsloth_status()
    if not status.available:
        raise RuntimeError(status.reason)
    return status


def load_unsloth_policy(preset, *, fast_inference: bool = False, gpu_memory_utilization: float = 0.5,
                        lora_dropout: float = 0.0, seed: int = 0):
    """Return ``(model, tokenizer)``: the preset's policy loaded by Unsloth's ``FastLanguageModel``, with LoRA.

    The settings :func:`labkit.run.build_run` gives plain TRL: 4-bit NF4 weights for a
    ``qlora`` preset (16-bit for ``lora``), LoRA of the preset's rank (alpha = 2 x rank unless
    set) on its target modules, the precision the trainer will use (the preset's, else
    :mod:`labkit.device`'s choice for the card: fp16 on a T4). One deliberate difference: LoRA
    dropout is 0 (the lab's is ``labkit.models.LORA_DROPOUT``, 0.05), because Unsloth's fused LoRA kernels apply only
    without dropout; the comparison records each backend's dropout. Unsloth's own gradient
    checkpointing (``"unsloth"``) replaces the trainer's when the preset checkpoints.
    ``fast_inference=True`` starts a vLLM engine in this process for generation (needs ``vllm``),
    taking ``gpu_memory_utilization`` of the card. The exact model id is loaded
    (``use_exact_model_name=True``), not one of Unsloth's pre-quantised copies, so both backends
    start from the same checkpoint. Raises ``RuntimeError`` (with the reason) where Unsloth cannot run.
    """
    require_unsloth()
    import unsloth  # noqa: F401  (first: it patches transformers and TRL as it loads)
    from unsloth import FastLanguageModel

    from labkit.device import detect_device
    from labkit.presets import get_preset, resolve_plan

    preset = get_preset(preset)
    if preset.method not in ("lora", "qlora"):
        raise ValueError(f"the Unsloth path trains LoRA adapters: use a 'lora' or 'qlora' preset, not {preset.method!r}")
    plan = resolve_plan(preset, detect_device())  # the precision and dtypes build_run's GRPOConfig will use
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=plan.model_path,
        max_seq_length=preset.max_prompt_length + preset.config["max_completion_length"],
        dtype=plan.weight_dtype,
        load_in_4bit=preset.method == "qlora",
        fast_inference=fast_inference,
        max_lora_rank=preset.lora_rank,
        gpu_memory_utilization=gpu_memory_utilization,
        use_exact_model_name=True,
        random_state=seed,
    )
    model = FastLanguageModel.get_peft_model(
        model,
        r=plan.peft_config.r,  # the plan's LoRA, as build_run hands it to TRL (alpha = 2 x rank unless set)
        lora_alpha=plan.peft_config.lora_alpha,
        target_modules=list(preset.target_modules),  # in the preset's order (PEFT's LoraConfig keeps a set)
        lora_dropout=lora_dropout,
        use_gradient_checkpointing="unsloth" if preset.config["activation_checkpointing"] else False,
        random_state=seed,
    )
    tokenizer.padding_side = "left"  # decoder-only generation pads on the left
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def read_comparison(path: str | os.PathLike = Path("results") / RESULTS_FILE):
    """Return the measured comparison as a ``pandas.DataFrame`` (one row per backend and run), or None if none is recorded."""
    import pandas as pd

    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return None
    return pd.read_csv(path)


def comparison_summary(frame):
    """Return ``(latest, ratio)`` from a :func:`read_comparison` table: GPU rows only, newest per backend.

    ``latest`` keeps, for each (preset, method, backend), the last row measured on a CUDA device
    with a memory figure (CPU rows are smoke tests and measure no memory); ``ratio`` is Unsloth's
    peak allocated memory and seconds per step divided by plain TRL's, per (preset, method) where
    both were measured (below 1: Unsloth uses less), or None when no pair exists yet.
    """
    if frame is None:
        return None, None
    gpu = frame[frame["device"].astype(str).str.startswith("cuda") & frame["peak_allocated_gib"].notna()]
    if gpu.empty:
        return gpu, None
    latest = gpu.groupby(["preset", "method", "backend"], as_index=False).last()
    values = ["peak_allocated_gib", "seconds_per_step"]
    wide = latest.pivot_table(index=["preset", "method"], columns="backend", values=values)
    if not {"trl", "unsloth"} <= set(latest["backend"]):
        return latest, None
    ratio = (wide.xs("unsloth", axis=1, level=1) / wide.xs("trl", axis=1, level=1)).dropna(how="all").round(3)
    return latest, ratio if not ratio.empty else None


