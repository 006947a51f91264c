"""GRPO Lab's helper package: the one place where the lab book's logic lives.

Notebooks teach and call ``labkit``; tests check it. Submodules are named after the
concepts they hold and are imported lazily, so ``import labkit`` is cheap and works
without torch (the structural notebook checks rely on that):

- ``labkit.device``     which accelerator is here and which precision to train in
- ``labkit.models``     tiny offline models, real policies (full / LoRA / QLoRA), the architecture catalogue
- ``labkit.data``       GSM8K (bundled, MIT) as conversational prompts
- ``labkit.objective``  group advantages, KL estimators, the clipped GRPO loss
- ``labkit.rewards``    verifiable reward functions with TRL's calling convention
- ``labkit.dashboard``  live reward and VRAM widgets
- ``labkit.memory``     the VRAM estimator, measured peaks, chunked log-probs, full vs LoRA
- ``labkit.presets``    named recipes that fit a card, preflight, resumable runs, ``python -m labkit train``
- ``labkit.evaluate``   GSM8K strict / lenient accuracy and format rate, before/after tables
- ``labkit.oom``        the OOM doctor: an out-of-memory error becomes a short report of what to change
- ``labkit.scale``      memory per GPU under DDP / ZeRO / offload; accelerate configs and launch commands
- ``labkit.unsloth_path`` the Unsloth fast path (GPU, its own environment) and its comparison with plain TRL
- ``labkit.nano``       a transparent GRPO loop and the CPU demo task
- ``labkit.tasks``      small verifiable tasks a tiny model can learn on CPU
- ``labkit.nbcheck``    structural checks of the lab's notebooks
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = (
    "bench",
    "dashboard",
    "data",
    "device",
    "evaluate",
    "lab",
    "memory",
    "models",
    "nano",
    "nbcheck",
    "objective",
    "oom",
    "presets",
    "rewards",
    "scale",
    "tasks",
    "training",
    "unsloth_path",
)

__all__ = ["setup", "__version__", *_SUBMODULES]


def setup(seed: int = 0, mode: str = "auto", *, verbose: bool = True):
    """Return the lab's context (mode, device, precision) after seeding everything.

    Every notebook calls this once, right after ``import labkit``. See
    :func:`labkit.lab.setup` for the details.
    """
    from labkit.lab import setup as _setup

    return _setup(seed=seed, mode=mode, verbose=verbose)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"labkit.{name}")
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
