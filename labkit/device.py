"""Which accelerator is here, and which precision to train in on it.

Introduced in ``00_setup.ipynb``; every training path (TRL's ``GRPOTrainer``, the nano
loop, the benchmarks) takes its precision from :func:`choose_precision`, so that
no path silently trains in bf16 on a CPU (TRL's ``GRPOConfig`` defaults to bf16, which
made a CPU step about 7x slower) or on a T4 (which has no bf16 at all).
"""
from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass

import torch

__all__ = [
    "DeviceInfo",
    "detect_device",
    "choose_precision",
    "precision_flags",
    "torch_dtype",
    "PRECISIONS",
]

PRECISIONS = ("bf16", "fp16", "fp32")
_GIB = 1024**3


@dataclass(frozen=True)
class DeviceInfo:
    """What :func:`detect_device` found: the kind of device and what it can do."""

    kind: str  # "cuda", "mps" or "cpu"
    name: str  # "NVIDIA GeForce RTX 3080 Laptop GPU", "Apple M2", "x86_64 CPU (2 cores)"
    total_memory_gib: float | None  # GPU memory; None on CPU and MPS (shared memory)
    compute_capability: tuple[int, int] | None  # (8, 6) for Ampere laptop cards, (7, 5) for a T4
    bf16: bool  # can it train in bfloat16 at full speed?
    fp16: bool  # can it train in float16 mixed precision?

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.kind)

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        mem = f", {self.total_memory_gib:.1f} GiB" if self.total_memory_gib else ""
        cc = f", sm_{self.compute_capability[0]}{self.compute_capability[1]}" if self.compute_capability else ""
        return f"{self.kind}: {self.name}{mem}{cc}"


def detect_device(prefer: str | None = None) -> DeviceInfo:
    """Return a :class:`DeviceInfo` for the best device here (cuda, then mps, then cpu).

    ``prefer="cpu"`` (or the environment variable ``LABKIT_DEVICE=cpu``) forces the CPU
    even when a GPU is present, which is what the lab's CPU mode and CI do.
    """
    prefer = prefer or os.environ.get("LABKIT_DEVICE") or None
    if prefer not in (None, "cuda", "mps", "cpu"):
        raise ValueError(f"prefer must be 'cuda', 'mps' or 'cpu', not {prefer!r}")
    if prefer in (None, "cuda") and torch.cuda.is_available():
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        capability = (props.major, props.minor)
        # bf16 tensor cores arrived with Ampere (sm_80). torch.cuda.is_bf16_supported() can
        # say True on older cards through emulation, which is slow: decide from the capability.
        return DeviceInfo(
            kind="cuda",
            name=props.name,
            total_memory_gib=props.total_memory / _GIB,
            compute_capability=capability,
            bf16=capability >= (8, 0),
            fp16=capability >= (6, 0),
        )
    if prefer == "cuda":
        raise RuntimeError("prefer='cuda' but torch sees no CUDA device (torch.cuda.is_available() is False)")
    mps = getattr(torch.backends, "mps", None)
    if prefer in (None, "mps") and mps is not None and mps.is_available():
        return DeviceInfo("mps", f"Apple {platform.machine()}", None, None, bf16=False, fp16=False)
    if prefer == "mps":
        raise RuntimeError("prefer='mps' but torch.backends.mps.is_available() is False")
    cores = os.cpu_count() or 1
    return DeviceInfo("cpu", f"{platform.machine()} CPU ({cores} cores)", None, None, bf16=False, fp16=False)


def choose_precision(info: DeviceInfo | None = None, asked: str | None = None) -> str:
    """Return ``"bf16"``, ``"fp16"`` or ``"fp32"``: the training precision on ``info`` (the one place it is decided).

    bf16 on Ampere or newer (no loss scaling needed), fp16 with loss scaling on older cards
    (a T4 is sm_75 and has no bf16), fp32 on CPU and Apple MPS. Never bf16 on a CPU. ``asked``
    (a preset's ``precision``) is returned when the device can do it; a precision it cannot do fails
    here, with what to change, instead of deep inside training. A plan calls this once
    (:func:`labkit.presets.resolve_plan`); everything after it reads ``plan.precision``.
    """
    info = info or detect_device()
    best = ("bf16" if info.bf16 else "fp16" if info.fp16 else "fp32") if info.kind == "cuda" else "fp32"
    if asked is None:
        return best
    _check_precision(asked)
    if asked == "bf16" and not info.bf16:
        raise ValueError(f"bf16 was asked for, but {info} has no bf16 support. "
                         f"Use precision={best!r} (or leave precision unset to choose automatically).")
    if asked == "fp16" and not info.fp16:
        raise ValueError(f"fp16 mixed precision was asked for, but {info} cannot train in fp16. "
                         f"Use precision={best!r}.")
    return asked


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")


def precision_flags(precision: str) -> dict:
    """Return ``{"bf16": bool, "fp16": bool}`` for ``GRPOConfig`` / ``TrainingArguments`` from a precision
    (:func:`choose_precision`'s)."""
    _check_precision(precision)
    return {"bf16": precision == "bf16", "fp16": precision == "fp16"}


def torch_dtype(precision: str, method: str = "full") -> torch.dtype:
    """Return the dtype to load a policy's weights in, for a training precision and method.

    - full fine-tuning: fp32 in every precision: 16-bit mixed precision computes under autocast and
      keeps fp32 master weights, gradients and AdamW moments (16 bytes a parameter). Pure bf16
      weights would halve that, but an AdamW step of a full fine-tuning learning rate rounds away on
      most of them (notebook 05, section 11); under fp16 the trainer refuses to unscale fp16
      gradients. TRL 1.16 also loads a model id in float32 unless told otherwise
      (trl/trainer/utils.py 1332).
    - LoRA/QLoRA under bf16 or fp16: the frozen base in that dtype; the small adapters train in
      fp32 (PEFT) or bf16 (QLoRA under bf16, TRL's cast).
    - fp32: fp32.
    """
    _check_precision(precision)
    if method == "full" or precision == "fp32":
        return torch.float32
    return torch.bfloat16 if precision == "bf16" else torch.float16
