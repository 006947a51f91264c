"""GRPO Lab's helper package: the one place where the lab book's logic lives.

Notebooks teach and call ``labkit``; tests check it. Submodules are named after the
concepts they hold and are imported lazily, so ``import labkit`` is cheap and works
without torch (the structural notebook checks rely on that):

The data path, in the order a GRPO step runs it:

- ``labkit.data``       GSM8K (bundled, MIT) as conversational prompts
- ``labkit.tasks``      small verifiable tasks a tiny model can learn on CPU
- ``labkit.models``     tiny offline models, real policies (full / LoRA / QLoRA), the architecture catalogue
- ``labkit.rewards``    verifiable rewards: ``parse`` (answers, numbers), ``functions`` (the rewards), ``check``
- ``labkit.objective``  group advantages, KL estimators, the clipped GRPO loss, chunked log-probs
- ``labkit.nano``       a transparent GRPO loop built on those; ``labkit.warmup`` its supervised warm-up
- ``labkit.dashboard``  the live dashboard (a TRL callback); ``labkit.charts`` draws its SVG panels and the memory
  figures (an estimate against a card, the recorded peaks beside it)

Running it for real, on a card:

- ``labkit.device``     which accelerator is here, which precision to train in, and the cards the lab plans for
- ``labkit.training``   ``GRPOConfig`` for this device, ``GRPOTrainer``, checkpoint folders, a log recorder, the NaN
  guard, training with the OOM doctor
- ``labkit.presets``    named recipes that fit a card, each resolved once into a plan; ``validation`` checks it
- ``labkit.run``        a preset made concrete: prompts, rewards, trainer, checkpoints and resume
- ``labkit.evaluate``   GSM8K strict / lenient accuracy and format rate, before/after tables
- ``labkit.oom``        a plan's memory against its card: the preflight before the run, the OOM doctor after (an
  out-of-memory error becomes a short report of what to change, weighed by the memory each phase of a step fills)
- ``labkit.memory``     the VRAM estimator, from a model's shape
- ``labkit.monitor``    memory measured: RSS, peak RSS, the GPU through PyTorch and NVML, a sampler, a live model's
  bytes
- ``labkit.scale``      memory per GPU under DDP / ZeRO / offload; accelerate configs and launch commands
- ``labkit.unsloth_path`` the Unsloth fast path (GPU, its own environment)

Around them: ``labkit.lab`` (the run context: setup, seeds, where runs and results are),
``labkit.workshop`` (the pre-workshop checklist), ``labkit.colab`` (the install cell's work on Colab),
``labkit.demo`` (the main job), ``labkit.text`` (every printed sentence wrapped between words at one width) and
``labkit.cli`` (every ``python -m labkit`` command; ``labkit.options`` its ``KEY=VALUE`` parser).

Not in this package, by design: the measurements that write ``results/`` live in ``bench/`` beside it
(``python -m bench NAME``), and the maintainer's tools in ``scripts/`` (``python -m scripts.nbcheck``,
``python -m scripts.colab``). ``labkit`` never imports either.
"""
from __future__ import annotations

import importlib
import logging

# bitsandbytes logs at import time, on CPUs with AVX512-BF16, "Failed to load CPU gemm_4bit_forward from
# kernels-community: No module named 'kernels'" (bitsandbytes/backends/cpu/ops.py, the `has_avx512bf16()`
# branch): an optional kernel for 4-bit products on a CPU, whose pure-torch fallback it then uses. It is
# imported by every trainer path, not only QLoRA's: transformers/trainer_utils.py imports peft, whose
# helpers.py imports bitsandbytes. The message is the first line of `python -m labkit demo` on a fresh
# install and reads as a failure, so its logger is raised to ERROR here, before any import can emit it.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

__version__ = "0.2.0"

_SUBMODULES = (
    "charts",
    "cli",
    "colab",
    "dashboard",
    "data",
    "demo",
    "device",
    "evaluate",
    "lab",
    "memory",
    "models",
    "monitor",
    "nano",
    "objective",
    "options",
    "oom",
    "presets",
    "rewards",
    "run",
    "scale",
    "tasks",
    "training",
    "unsloth_path",
    "workshop",
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
