"""Shared test set-up: offline and CPU, whatever the machine."""
import os

# Before anything imports huggingface_hub: tests never touch the hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("LABKIT_MODE", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_model_path():
    """Path of the tiny Qwen2-shaped model (built once, then reused from labkit's cache)."""
    from labkit.models import build_tiny_model

    return build_tiny_model("qwen2")


@pytest.fixture()
def isolated_cache(tmp_path, monkeypatch):
    """A fresh labkit cache (LABKIT_CACHE) for one test: warm-ups and models are built anew inside tmp_path."""
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path


@pytest.fixture()
def tiny_nano() -> dict:
    """NanoConfig settings for a nano run of seconds: 2 warm-up steps, 2 GRPO steps of 2 prompts x 4, 4 held-out problems."""
    return dict(sft_steps=2, sft_batch_size=8, max_steps=2, num_prompts=2, num_generations=4, eval_problems=4,
                eval_samples=2, eval_every=0)


@pytest.fixture
def offline_pip():
    """Return ``make(index, asked)``: a stand-in for the bundles' ``pip download`` (``scripts.gpu_bundle.pip_download``)
    that copies ``NAME-VERSION-*.whl`` from the local folder ``index`` and records each call's specs in ``asked``:
    the bundle tests never reach the network."""
    import shutil

    def make(index: Path, asked: list):
        def download(specs, dest):
            asked.append(list(specs))
            for spec in specs:
                name, version = spec.split("==")
                for wheel in Path(index).glob(f"{name}-{version}-*.whl"):
                    shutil.copyfile(wheel, Path(dest) / wheel.name)

        return download

    return make


@pytest.fixture
def run_with_stub_python3():
    """Return ``run(root, command, pyarrow_version, shown)``, which runs a bundle's install command (bash) in ``root``
    with a stub ``python3`` first on PATH and returns ``(process, calls)``.

    ``python3 -m pip ...`` and ``python3 -m bench ...`` are written to ``root/calls.txt`` (bench's line followed by
    ``shown``, bash text such as ``PYTHONPATH=$PYTHONPATH``), not run; anything else (the pyarrow probe) runs in this
    interpreter, which finds a fake pyarrow of ``pyarrow_version`` first.
    """
    import stat
    import subprocess
    import sys

    def run(root: Path, command: str, pyarrow_version: str, shown: str = "PYTHONPATH=$PYTHONPATH"):
        fake = root / "fakepyarrow" / "pyarrow"
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text(f"__version__ = {pyarrow_version!r}\n")
        stub_dir = root / "bin"
        stub_dir.mkdir()
        stub = stub_dir / "python3"
        stub.write_text(f"""#!/bin/bash
if [ "$1" = -m ] && [ "$2" = pip ]; then echo "pip $*" >> {root}/calls.txt; exit 0; fi
if [ "$1" = -m ] && [ "$2" = bench ]; then echo "bench $* {shown}" >> {root}/calls.txt; exit 0; fi
exec {sys.executable} "$@"
""")
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
        env = {**os.environ, "PATH": f"{stub_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(fake.parent)}
        proc = subprocess.run(["bash", "-c", command], cwd=root, env=env, capture_output=True, text=True, timeout=60)
        calls = (root / "calls.txt").read_text().splitlines() if (root / "calls.txt").exists() else []
        return proc, calls

    return run



def replace_everywhere(monkeypatch, home: str, name: str, replacement, packages=("labkit", "bench")) -> None:
    """Replace function ``name`` of module ``home`` with ``replacement(original)`` in every loaded module of
    ``packages`` that holds the original (its home, and each module that imported it by name)."""
    import importlib
    import sys

    original = getattr(importlib.import_module(home), name)
    new = replacement(original)
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".")[0] in packages and getattr(module, name, None) is original:
            monkeypatch.setattr(module, name, new)


@pytest.fixture()
def decided_outside_a_plan(monkeypatch):
    """Count the calls of the functions that decide a precision or a dtype (``choose_precision``, ``torch_dtype``,
    ``adapter_dtype``) made while no :func:`labkit.presets.resolve_plan` runs, wherever a labkit or bench module took
    them from: a reader of a plan that decides one again shows up here."""
    import importlib
    from collections import Counter

    counts, depth = Counter(), [0]

    def deciding(name):
        def wrap(original):
            def counted(*args, **kwargs):
                if not depth[0]:
                    counts[name] += 1
                return original(*args, **kwargs)
            return counted
        return wrap

    def resolving(original):
        def inside(*args, **kwargs):
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1
        return inside

    importlib.import_module("labkit.presets")  # every module below is loaded before its names are replaced

    for home, name in (("labkit.device", "choose_precision"), ("labkit.device", "torch_dtype"),
                       ("labkit.models", "adapter_dtype")):
        replace_everywhere(monkeypatch, home, name, deciding(name))
    replace_everywhere(monkeypatch, "labkit.presets", "resolve_plan", resolving)
    return counts
