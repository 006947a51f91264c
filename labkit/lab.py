"""The lab's run context: one call that seeds everything and decides the mode.

Every notebook starts with ``lab = labkit.setup(seed=SEED, mode=MODE)``. The mode is

- ``"cpu"``: tiny models built locally, bundled data, a few minutes on a laptop with no
  GPU and no internet (what CI runs);
- ``"real"``: real instruct models from the Hugging Face hub on a GPU;
- ``"auto"`` (the default): ``"real"`` when a CUDA GPU is present, else ``"cpu"``. The
  environment variable ``LABKIT_MODE`` overrides ``"auto"`` (CI sets ``LABKIT_MODE=cpu``).

The same cells run in both modes; only the sizes differ, chosen with :meth:`Lab.pick`.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from importlib import metadata

__all__ = ["Lab", "setup", "quiet_library_noise", "seed_everything", "resolve_mode", "package_versions", "provenance", "write_json", "MODES"]

MODES = ("auto", "cpu", "real")
_REPORTED_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes",
                      "ipywidgets", "matplotlib", "unsloth")


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every GPU) with ``seed``."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    os.environ["PYTHONHASHSEED"] = str(seed)


def resolve_mode(mode: str = "auto", device=None) -> str:
    """Return ``"cpu"`` or ``"real"`` for a requested ``mode`` on ``device`` (a :class:`DeviceInfo`)."""
    from labkit.device import detect_device

    if mode not in MODES:
        raise ValueError(f"MODE must be one of {MODES}, not {mode!r}")
    if mode == "auto":
        mode = os.environ.get("LABKIT_MODE", "auto")
        if mode not in MODES:
            raise ValueError(f"LABKIT_MODE must be one of {MODES}, not {mode!r}")
    device = device or detect_device()
    if mode == "auto":
        return "real" if device.kind == "cuda" else "cpu"
    if mode == "real" and device.kind != "cuda":
        raise RuntimeError(
            f"MODE='real' trains real instruct models and needs a CUDA GPU, but this machine has {device}. "
            "Set MODE='cpu' (or 'auto') to run the same notebook on tiny local models, or open it in Colab "
            "with a GPU runtime (Runtime > Change runtime type > T4 GPU)."
        )
    return mode


def package_versions(names=_REPORTED_PACKAGES) -> dict[str, str | None]:
    """Return ``{package: version or None}`` for the packages the lab depends on."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def provenance(device=None) -> dict:
    """Return where and when a figure was produced: date, device, platform, package versions.

    Every figure the lab records under ``results/`` carries this, so a number always says
    on what device, with which versions, and when it was measured.
    """
    from labkit.device import detect_device

    device = device or detect_device()
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {k: v for k, v in package_versions().items() if v is not None},
    }


@dataclass
class Lab:
    """The context :func:`setup` returns: the mode, the device and the precision to train in."""

    mode: str
    seed: int
    device: object  # labkit.device.DeviceInfo
    precision: str
    versions: dict = field(default_factory=dict)

    @property
    def cpu_mode(self) -> bool:
        return self.mode == "cpu"

    def pick(self, cpu, real):
        """Return ``cpu`` in CPU mode and ``real`` in real mode: ``lab.pick(cpu=4, real=8)``."""
        return cpu if self.cpu_mode else real

    def precision_flags(self) -> dict:
        """Return the ``bf16``/``fp16`` flags for ``GRPOConfig`` on this lab's device."""
        from labkit.device import precision_flags

        return precision_flags(self.device, self.precision)

    def summary(self) -> str:
        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items() if v and k in ("torch", "transformers", "trl", "peft"))
        return (f"GRPO Lab | mode: {self.mode} | device: {self.device} | precision: {self.precision} | "
                f"seed: {self.seed}\n{versions}")

    def __repr__(self) -> str:
        return self.summary()


def quiet_library_noise() -> None:
    """Silence the libraries' messages that are not the learner's business (each filter says why).

    Only these messages, matched by logger or by text: every other warning still shows. In a
    notebook they would sit in red stderr boxes that look like errors, or, for progress bars,
    in widgets that read "Error displaying widget: model not found" once the notebook is saved.
    """
    import logging
    import warnings

    # tokenizers warns, in every forked process, that it turns its parallelism off after a fork.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # bitsandbytes (imported by TRL and PEFT) logs at import time, on CPUs with AVX512-BF16, "Failed to
    # load CPU gemm_4bit_forward from kernels-community ... pip install kernels": an optional kernel for
    # 4-bit matrix products on a CPU, which the lab never runs (QLoRA needs a GPU). Installing it is pointless.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    # transformers 5 deprecated `model.is_gradient_checkpointing`, which TRL and PEFT still read; the
    # FutureWarning points at a line in site-packages, not at anything the learner wrote or can change.
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    from transformers.utils import logging as transformers_logging

    # transformers' "Loading weights" / "Writing model shards" bars: the lab loads and saves small models
    # many times (seconds each), and in a notebook each bar is a widget that does not survive a save.
    transformers_logging.disable_progress_bar()


def setup(seed: int = 0, mode: str = "auto", *, verbose: bool = True) -> Lab:
    """Return a :class:`Lab` after seeding everything and choosing the mode.

    Also silences the library messages that only distract in a lesson (:func:`quiet_library_noise`).
    """
    from labkit.device import choose_precision, detect_device

    quiet_library_noise()
    device = detect_device("cpu" if (mode == "cpu" or os.environ.get("LABKIT_MODE") == "cpu") else None)
    resolved = resolve_mode(mode, device)
    seed_everything(seed)
    lab = Lab(mode=resolved, seed=seed, device=device, precision=choose_precision(device), versions=package_versions())
    if verbose:
        print(lab.summary())
    return lab


def write_json(path: str | Path, record: dict) -> Path:
    """Write ``record`` as indented JSON to ``path`` and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    return path
