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

__all__ = ["Lab", "setup", "quiet_library_noise", "seed_everything", "resolve_mode", "package_versions", "provenance", "write_json", "MODES",
           "repo_root", "results_dir", "runs_dir", "new_run_dir", "busy_note", "cpu_threads", "busy_cores", "share_cpu", "data_dir", "NOTEBOOK_TIMES", "read_notebook_times", "record_notebook_time",
           "notebook_time_label", "T4_STEP_SECONDS", "workshop_estimate", "CheckItem", "workshop_checklist",
           "hf_cache_has_weights", "COLAB_KEEP", "requirement_name", "colab_requirements", "colab_install"]

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
    threads: int | None = None  # torch's CPU threads in CPU mode (share_cpu: fewer when other work loads the CPU)

    @property
    def cpu_mode(self) -> bool:
        return self.mode == "cpu"

    def pick(self, cpu, real):
        """Return ``cpu`` in CPU mode and ``real`` in real mode: ``lab.pick(cpu=4, real=8)``."""
        return cpu if self.cpu_mode else real

    def summary(self) -> str:
        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items() if v and k in ("torch", "transformers", "trl", "peft"))
        busy = busy_note()
        cores = os.cpu_count() or 1
        if self.threads is not None and self.threads < cores:
            busy = (busy + "; " if busy else "") + (
                f"torch computes with {self.threads} of {cores} threads, leaving the cores other work keeps busy "
                "to it (threads that outnumber free cores wait for each other)")
        return (f"GRPO Lab | mode: {self.mode} | device: {self.device} | precision: {self.precision} | "
                f"seed: {self.seed}\n{versions}" + (f"\nnote: {busy}" if busy else ""))

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
    # bitsandbytes' "Failed to load CPU gemm_4bit_forward from kernels-community" (an optional CPU kernel it
    # falls back from): silenced first in labkit/__init__.py, at import time, because bitsandbytes prints it when
    # it is imported, before any setup() could run (see there); set again here for a caller that reset it.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    # transformers 5 deprecated `model.is_gradient_checkpointing`, which TRL and PEFT still read; the
    # FutureWarning points at a line in site-packages, not at anything the learner wrote or can change.
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    # The same rename, for the enable/disable calls TRL 1.16 makes when it builds a trainer on a model with
    # gradient checkpointing (notebook 06's comparison run): again TRL's call, not the learner's.
    warnings.filterwarnings("ignore", message=r"`gradient_checkpointing_(enable|disable)` is deprecated",
                            category=FutureWarning)
    # TRL 1.16 warns, every time a trainer is built with environment_factory (trl/trainer/grpo_trainer.py lines
    # 618-625), that the feature is experimental: notebook 08 says so in its text, and a red box per trainer would
    # look like an error. Only that message: TRL's other experimental notices still show.
    warnings.filterwarnings("ignore", message=r"You are using 'environment_factory', which is an experimental feature",
                            category=UserWarning)
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
    if resolved == "cpu":
        lab.threads = share_cpu()
    if verbose:
        print(lab.summary())
    return lab


def cpu_threads(load: float, cores: int) -> int:
    """Return how many torch threads to compute with when other work keeps ``load`` cores busy (the 1-minute load
    average) out of ``cores``: one thread fewer for each core taken, at least one, all of them when idle.

    Threads that outnumber the free cores wait for each other at every parallel operation: on 2 cores at a
    load of about 4, notebook 03's warm-up steps took 2.4-2.8 s with 2 threads and 0.28 s with 1 (issue 33).
    A load under 0.75 counts as idle (background noise, not a competing job).
    """
    return max(1, min(cores, cores - int(load + 0.25)))


def busy_cores(interval_s: float = 0.5) -> float:
    """Return how many cores other processes keep busy now: the CPU use of the whole machine over ``interval_s``
    (psutil), while this process waits. Not the load average: that lags a minute behind, so a notebook that
    just finished (or the tests before this one) would still count as other work."""
    import psutil

    return psutil.cpu_percent(interval=interval_s) / 100 * (psutil.cpu_count() or 1)


def share_cpu() -> int:
    """Set torch's thread count to :func:`cpu_threads` for the cores other work keeps busy now and return it
    (CPU mode). Called by :func:`setup`, before the kernel computes anything. Lowers the count only (a learner's
    own ``torch.set_num_threads`` above it is left alone)."""
    import torch

    threads = cpu_threads(busy_cores(), os.cpu_count() or 1)
    if threads < torch.get_num_threads():
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def write_json(path: str | Path, record: dict) -> Path:
    """Write ``record`` as indented JSON to ``path`` and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    return path


# --------------------------------------------------------------------------- where the lab's files are


def repo_root() -> Path | None:
    """Return the repository folder that holds this ``labkit`` (with ``results/``), or None for an installed copy.

    Notebooks find ``results/`` through here, so they work from any working directory (Colab's
    ``/content``, a ``jupyter lab`` started at the repository root or inside ``notebooks/``).
    """
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "results").is_dir() else None


def results_dir() -> Path:
    """Return the folder of recorded figures: ``LABKIT_RESULTS``, else the repository's ``results/``, else ``./results``."""
    if os.environ.get("LABKIT_RESULTS"):
        return Path(os.environ["LABKIT_RESULTS"])
    root = repo_root()
    return root / "results" if root is not None else Path.cwd() / "results"


def runs_dir() -> Path:
    """Return the folder where runs are written: ``LABKIT_RUNS``, else the repository's ``runs/``, else ``./runs``.

    One place a learner can find (and delete) every run's checkpoints and evaluations; ``runs/`` is
    in ``.gitignore``. Notebooks 03 and 04 write there instead of temporary folders that pile up unseen.
    """
    if os.environ.get("LABKIT_RUNS"):
        return Path(os.environ["LABKIT_RUNS"])
    root = repo_root()
    return root / "runs" if root is not None else Path.cwd() / "runs"


def new_run_dir(name: str) -> Path:
    """Return a new, empty folder ``runs/<name>-<date>-<time>`` (a run that must not resume an older one)."""
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(100):
        path = runs_dir() / (f"{name}-{stamp}" + (f"-{n}" if n else ""))
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free run folder for {name!r} under {runs_dir()}")


def busy_note() -> str | None:
    """Return a sentence when other work loads this machine's CPUs (load average over the core count), else None.

    The notebooks' times are measured on an idle machine; a busy one stretches them roughly by the
    load over the cores (issue 26: 8-9 min instead of about 3 at a load average of 5-6 on 2 cores).
    """
    if not hasattr(os, "getloadavg"):
        return None
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load < 1.2 * cores:  # a notebook's own threads keep the load near the core count
        return None
    return (f"this machine is busy (load average {load:.1f} on {cores} cores): the times the notebooks state "
            f"are for an idle machine; expect up to about {load / cores:.1f}x as long")


def data_dir() -> Path:
    """Return the package's bundled data folder (GSM8K, ``architectures.json``): it travels with ``labkit``."""
    return Path(__file__).resolve().parent / "data"


# --------------------------------------------------------------------------- notebook run times

NOTEBOOK_TIMES = "notebook_times.json"


def read_notebook_times(path: str | Path | None = None) -> dict:
    """Return ``{notebook file name: record}`` from ``results/notebook_times.json`` (empty when there is none)."""
    path = Path(path) if path else results_dir() / NOTEBOOK_TIMES
    if not path.exists():
        return {}
    return json.loads(path.read_text()).get("notebooks", {})


def record_notebook_time(name: str, seconds: float, *, note: str = "", peak_kernel_rss_gib: float | None = None,
                         path: str | Path | None = None) -> Path:
    """Record that notebook ``name`` ran end to end in CPU mode in ``seconds`` (and its kernel's peak resident
    memory), with provenance; return the file.

    Written by ``python -m labkit bench notebooks``; the README's notebook table and each notebook's header
    state :func:`notebook_time_label` of these figures (a test checks).
    """
    path = Path(path) if path else results_dir() / NOTEBOOK_TIMES
    record = json.loads(path.read_text()) if path.exists() else {}
    record["command"] = "python -m labkit bench notebooks NN"
    record.setdefault("notebooks", {})[name] = {
        "seconds": round(float(seconds), 1),
        "mode": "cpu",
        "note": note,
        **({"peak_kernel_rss_gib": peak_kernel_rss_gib} if peak_kernel_rss_gib is not None else {}),
        # the 1-minute load average as the notebook ended: its own threads count, other work shows above the cores
        "load_average_end": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "provenance": provenance(),
    }
    record["notebooks"] = dict(sorted(record["notebooks"].items()))
    return write_json(path, record)


def notebook_time_label(seconds: float) -> str:
    """Return how the README and the notebook headers state a CPU run time: ``"under 1 min"`` or ``"about N min"``."""
    if seconds < 60:
        return "under 1 min"
    return f"about {max(1, round(seconds / 60))} min"


# --------------------------------------------------------------------------- the workshop preset's time on a T4

# Published seconds per GRPO step on a free Colab T4 (docs/references.md#t4-step-times). Not our measurements.
T4_STEP_SECONDS = {
    "unsloth_qwen2.5-3b_vllm": {
        "seconds_per_step": 24.0, "params_b": 3.1, "num_generations": 8, "completion_tokens": 200, "vllm": True,
        "source": "Unsloth's saved Colab T4 notebook (unslothai/notebooks): 250 steps in 1 h 40 min",
    },
    "trl_qwen2-7b_qlora": {
        "seconds_per_step": 94.0, "params_b": 7.6, "num_generations": 8, "completion_tokens": 256, "vllm": False,
        "source": "TRL's T4 notebook (huggingface/trl examples/notebooks/grpo_trl_lora_qlora.ipynb): 500 steps in ~13 h",
    },
}
# Not published: an allowance for the install, the ~1 GB model download and loading, in minutes. An assumption.
_SETUP_ALLOWANCE_MIN = 10.0


def workshop_estimate(preset="workshop", eval_questions: int = 100, eval_passes: int = 2) -> dict:
    """Return the ESTIMATED minutes notebook 04 takes on a free T4 with ``preset``, and what the estimate rests on.

    No GPU run has been measured yet: this is arithmetic on published T4 step times
    (:data:`T4_STEP_SECONDS`), to be replaced by a measured figure. Per step, the upper figure is
    Unsloth's 3B step (24 s; vLLM, 200 tokens), the smallest published T4 GRPO step and for a model 6x
    larger; the lower one is TRL's 7B QLoRA step without vLLM (94 s, G = 8, 256 tokens) scaled by
    parameter count (decoding is bound by reading the weights). An evaluation batch generates as long
    as one step does, so ``eval_passes x ceil(eval_questions / eval_batch_size)`` batches count as steps.
    """
    import math

    from labkit.presets import get_preset

    p = get_preset(preset)
    catalogue = json.loads((data_dir() / "architectures.json").read_text())
    params_b = catalogue.get(p.model, {}).get("params_b")
    trl = T4_STEP_SECONDS["trl_qwen2-7b_qlora"]
    upper_step = T4_STEP_SECONDS["unsloth_qwen2.5-3b_vllm"]["seconds_per_step"]
    if params_b is None:
        raise ValueError(f"{p.model} is not in labkit/data/architectures.json: its size (params_b) is unknown")
    lower_step = trl["seconds_per_step"] * params_b / trl["params_b"]
    eval_batches = eval_passes * math.ceil(eval_questions / p.eval_batch_size)
    units = p.max_steps + eval_batches
    upper = units * upper_step / 60 + _SETUP_ALLOWANCE_MIN
    lower = units * lower_step / 60 + _SETUP_ALLOWANCE_MIN
    return {
        "preset": p.name, "model": p.model, "max_steps": p.max_steps, "num_generations": p.num_generations,
        "max_completion_length": p.max_completion_length, "eval_questions": eval_questions,
        "eval_batches": eval_batches, "seconds_per_step_low": round(lower_step, 1),
        "seconds_per_step_high": upper_step, "setup_allowance_min": _SETUP_ALLOWANCE_MIN,
        "minutes_low": round(lower), "minutes_high": round(upper), "status": "estimate",
        "note": "ESTIMATE from published T4 step times, not a measurement; replace with a measured notebook 04 run "
                "on a T4 when one exists.",
        "sources": {k: v["source"] for k, v in T4_STEP_SECONDS.items()},
    }


# --------------------------------------------------------------------------- the pre-workshop checklist


@dataclass
class CheckItem:
    """One line of :func:`workshop_checklist`: what was checked, whether it is fine (None: could not tell), why."""

    name: str
    ok: bool | None
    detail: str

    def __str__(self) -> str:
        mark = {True: "ok  ", False: "FIX ", None: "?   "}[self.ok]
        return f"[{mark}] {self.name}: {self.detail}"


def hf_cache_has_weights(model: str, cache: str | Path | None = None) -> bool:
    """Return True when the Hugging Face cache holds a snapshot of ``model`` with its weights (``*.safetensors``)."""
    if cache is None:
        from huggingface_hub import constants

        cache = constants.HF_HUB_CACHE
    snapshots = Path(cache) / f"models--{model.replace('/', '--')}" / "snapshots"
    return any(snapshots.glob("*/*.safetensors"))


def _hub_reachable(timeout: float = 5.0) -> bool:
    import urllib.request

    try:  # an anonymous HEAD request: no token is read or sent
        urllib.request.urlopen(urllib.request.Request("https://huggingface.co", method="HEAD"), timeout=timeout)
        return True
    except OSError:
        return False


def workshop_checklist(preset: str | None = None, *, online: bool | None = None, min_free_gib: float = 5.0) -> list:
    """Return the pre-workshop checklist as :class:`CheckItem` lines: install, device, mode, disk, weights.

    ``preset`` defaults to what notebook 04 picks here (``workshop`` on a GPU, ``cpu-tiny`` without).
    ``online``: None asks the hub (unless ``HF_HUB_OFFLINE`` is set). The weights check reads the
    local Hugging Face cache only; offline, it says what to download at home. No token is read or printed.
    """
    import shutil

    from labkit.device import detect_device

    items = []
    versions = package_versions()
    missing = [name for name in ("torch", "transformers", "trl", "peft", "accelerate", "datasets") if not versions[name]]
    items.append(CheckItem("install", not missing, "missing " + ", ".join(missing) + ": run the README's install"
                           if missing else ", ".join(f"{k} {versions[k]}" for k in ("torch", "transformers", "trl", "peft"))))
    device = detect_device()
    items.append(CheckItem("device", True, f"{device}" + ("" if device.kind == "cuda" else
                                                          " (no CUDA GPU: CPU mode; the GPU steps run on Colab)")))
    try:
        mode = resolve_mode("auto", device)
        items.append(CheckItem("mode", True, f"{mode} (LABKIT_MODE={os.environ.get('LABKIT_MODE', 'unset')})"))
    except (ValueError, RuntimeError) as exc:
        items.append(CheckItem("mode", False, str(exc)))
        mode = "cpu"
    from huggingface_hub import constants

    cache = Path(constants.HF_HUB_CACHE)
    probe = next((p for p in (cache, *cache.parents) if p.exists()), Path.cwd())
    free_gib = shutil.disk_usage(probe).free / 2**30
    items.append(CheckItem("free disk", free_gib >= min_free_gib, f"{free_gib:.1f} GiB free at {probe} "
                           f"(need {min_free_gib:g} GiB for the workshop model and runs)"))
    if preset is None:
        preset = "workshop" if device.kind == "cuda" else "cpu-tiny"
    from labkit.presets import get_preset

    model = get_preset(preset).model
    if model.startswith("tiny:"):
        items.append(CheckItem("weights", True, f"preset {preset}: {model} is built on this machine, nothing to "
                               "download (the GPU preset is 'workshop': python -m labkit check --preset workshop)"))
        return items
    cached = hf_cache_has_weights(model, cache)
    if online is None:
        online = os.environ.get("HF_HUB_OFFLINE", "0") not in ("1", "true", "True") and _hub_reachable()
    download = f"hf download {model}"  # huggingface_hub >= 1.0; older releases: huggingface-cli download
    if cached:
        items.append(CheckItem("weights", True, f"preset {preset}: {model} is in the Hugging Face cache ({cache})"))
    elif online:
        items.append(CheckItem("weights", False, f"preset {preset}: {model} is not cached yet; the hub is reachable: "
                               f"run `{download}` now, before the workshop's shared network"))
    else:
        items.append(CheckItem("weights", None, f"preset {preset}: {model} is not in the cache and the hub cannot be "
                               f"checked (offline); at home, run `{download}`"))
    return items


# --------------------------------------------------------------------------- installing on Colab

# Packages a Colab runtime ships and the lab must never replace there: swapping ipykernel, tornado or pyzmq
# under a running kernel crashes it; torch is Colab's CUDA build; the rest are the notebook front end and the
# scientific stack Colab's own tools import. (tests/test_colab.py keeps Colab's full preinstalled list.)
COLAB_KEEP = frozenset({
    "torch", "torchvision", "torchaudio", "numpy", "pandas", "scipy", "matplotlib", "ipykernel", "ipython",
    "ipywidgets", "widgetsnbextension", "jupyterlab-widgets", "jupyter-client", "jupyter-core", "jupyter-server",
    "jupyterlab", "notebook", "tornado", "pyzmq", "traitlets", "google-colab", "psutil", "tqdm", "requests",
})


def requirement_name(line: str) -> str | None:
    """Return the normalised package name of a requirements line (``"Foo_Bar>=1"`` -> ``"foo-bar"``), or None."""
    import re

    match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line.split("#", 1)[0])
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else None


def colab_requirements(path: str | Path) -> tuple[list[str], list[str]]:
    """Return ``(lines to install, names kept as Colab ships them)`` from a requirements file."""
    keep, dropped = [], []
    for line in Path(path).read_text().splitlines():
        name = requirement_name(line)
        if name is None:
            continue
        (dropped if name in COLAB_KEEP or name.startswith("jupyter") else keep).append(line.split("#", 1)[0].strip())
    return keep, [requirement_name(line) for line in dropped]


def colab_install(repo: str | Path, requirements: str = "requirements-colab.txt", *, run=None) -> bool:
    """Install what Colab lacks from ``repo/requirements``, then labkit itself; return True if a restart is needed.

    Used by every notebook's install cell on Colab. Never touches :data:`COLAB_KEEP` (they are filtered
    out, and labkit is installed with ``--no-deps``); pip's output and errors are shown as they come.
    A restart is needed when a package whose version changed was already imported in this kernel.
    ``run`` replaces ``subprocess.run`` in tests.
    """
    import subprocess
    import tempfile

    run = run or subprocess.run
    repo = Path(repo)
    lines, kept = colab_requirements(repo / requirements)
    watched = [requirement_name(line) for line in lines]
    before = package_versions(watched)
    if kept:
        print(f"keeping Colab's own {', '.join(kept)} (not installed from {requirements})")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write("\n".join(lines) + "\n")
    run([sys.executable, "-m", "pip", "install", "-r", handle.name], check=True)
    run([sys.executable, "-m", "pip", "install", "--no-deps", "-e", str(repo)], check=True)
    after = package_versions(watched)
    changed = {name: (before[name], after[name]) for name in watched if before[name] != after[name]}
    imported = sorted(name for name in changed if name.replace("-", "_") in sys.modules)
    for name, (old, new) in changed.items():
        print(f"{name}: {old or 'not installed'} -> {new}")
    if imported:
        print(f"RESTART NEEDED: {', '.join(imported)} changed after this kernel imported it. "
              "Runtime > Restart session, then run the notebook from the top (this cell then finds everything in place).")
        return True
    print("No restart needed: nothing that changed had been imported yet.")
    return False
