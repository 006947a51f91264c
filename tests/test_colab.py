"""Installing the lab on Colab never replaces what Colab ships, and says when to restart.

COLAB_SHIPS holds the packages of a Colab GPU runtime that the lab depends on or that the kernel needs,
at Colab's versions. Source: github.com/googlecolab/backend-info, pip-freeze.gpu.txt (the runtime's
`pip freeze`; the snapshot read for this list has torch 2.11.0+cu128, Python 3.12, packages dated
mid-2026). Refresh it from that file when Colab moves on.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.lab import COLAB_KEEP, colab_install, colab_requirements, requirement_name

REPO = Path(__file__).resolve().parents[1]

COLAB_SHIPS = {
    "torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0", "numpy": "2.0.2", "pandas": "2.2.2",
    "scipy": "1.16.3", "matplotlib": "3.10.0", "ipykernel": "6.17.1", "ipython": "7.34.0", "ipywidgets": "7.7.1",
    "widgetsnbextension": "3.6.10", "jupyterlab-widgets": "3.0.16", "jupyter-client": "7.4.9",
    "jupyter-core": "5.9.1", "jupyter-server": "2.14.0", "notebook": "6.5.7", "tornado": "6.5.1",
    "pyzmq": "26.2.1", "traitlets": "5.7.1", "psutil": "5.9.5", "tqdm": "4.67.3", "requests": "2.32.4",
    "nvidia-ml-py": "13.610.43",
    # Colab ships these too, at versions the lab cannot use: requirements-colab.txt upgrades them on purpose
    # (and the install cell asks for a restart if one was already imported).
    "transformers": "5.9.0", "peft": "0.19.1", "accelerate": "1.13.0", "datasets": "4.0.0",
}
UPGRADED_ON_PURPOSE = {"transformers", "peft", "accelerate", "datasets"}
# Light packages whose Colab versions the dry run holds fixed (torch and the Jupyter stack would mean
# downloading them; the static test covers them).
DRY_RUN_HELD = ("numpy", "pandas", "tqdm", "psutil", "requests")
LAB_LIBRARIES = ("trl", "transformers", "peft", "accelerate", "datasets", "bitsandbytes", "math-verify")


def _pins(path):
    out = {}
    for line in (REPO / path).read_text().splitlines():
        name = requirement_name(line)
        if name:
            out[name] = line.split("#", 1)[0].strip()
    return out


def test_colab_requirements_never_pin_a_package_colab_ships():
    pinned = set(_pins("requirements-colab.txt"))
    clashes = sorted((pinned & set(COLAB_SHIPS)) - UPGRADED_ON_PURPOSE)
    assert not clashes, f"requirements-colab.txt pins {clashes}, which Colab ships: leave Colab's"
    assert not {n for n in pinned if n.startswith("jupyter") or n in COLAB_KEEP}
    assert not COLAB_KEEP & UPGRADED_ON_PURPOSE


def test_colab_requirements_hold_the_lab_libraries_at_the_tested_versions():
    colab, lock = _pins("requirements-colab.txt"), _pins("requirements.txt")
    for name in LAB_LIBRARIES:
        assert name in colab, f"{name} is missing from requirements-colab.txt"
        assert colab[name] == lock[name], f"{name}: {colab[name]!r} differs from the lock {lock[name]!r}"


def test_every_kept_package_is_one_colab_ships():  # COLAB_KEEP is not a list of guesses
    assert COLAB_KEEP - {"jupyterlab", "google-colab"} <= set(COLAB_SHIPS)


def _dry_run(requirements: Path, tmp_path) -> tuple[int, str, list]:
    constraints = tmp_path / "colab-constraints.txt"
    constraints.write_text("".join(f"{name}=={COLAB_SHIPS[name]}\n" for name in DRY_RUN_HELD))
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
                           "-r", str(requirements), "-c", str(constraints)], capture_output=True, text=True)
    installs = json.loads(report.read_text())["install"] if report.exists() else []
    return proc.returncode, proc.stderr, [(i["metadata"]["name"], i["metadata"]["version"]) for i in installs]


def _skip_if_offline(returncode, stderr):
    if returncode and not re.search(r"ResolutionImpossible|conflict", stderr, re.I):
        pytest.skip(f"the package index cannot be reached: {stderr.strip().splitlines()[-1:]}")


@pytest.mark.slow
def test_installing_on_colab_changes_nothing_colab_ships(tmp_path):
    """pip's own resolver, with Colab's versions of the light shipped packages held fixed: it must succeed,
    and install nothing Colab ships at any other version than Colab's."""
    returncode, stderr, installs = _dry_run(REPO / "requirements-colab.txt", tmp_path)
    _skip_if_offline(returncode, stderr)
    assert returncode == 0, stderr[-3000:]
    changed = [(name, version) for name, version in installs
               if requirement_name(name) in COLAB_SHIPS and requirement_name(name) not in UPGRADED_ON_PURPOSE
               and version != COLAB_SHIPS[requirement_name(name)]]
    assert not changed, f"installing requirements-colab.txt would replace Colab's {changed}"


@pytest.mark.slow
def test_the_dry_run_catches_a_requirement_that_moves_a_colab_package(tmp_path):  # the check above can fail
    bad = tmp_path / "bad.txt"
    bad.write_text("pandas==2.1.4\n")
    returncode, stderr, installs = _dry_run(bad, tmp_path)
    _skip_if_offline(returncode, stderr)
    assert returncode != 0


def test_unsloth_requirements_keep_colabs_stack_when_installed_on_colab():
    keep, kept = colab_requirements(REPO / "requirements-unsloth.txt")
    assert {"torch", "pandas", "ipykernel", "ipywidgets", "matplotlib", "jupyterlab"} <= set(kept)
    assert "unsloth" in {requirement_name(line) for line in keep}


def test_colab_install_uses_no_deps_for_labkit_and_asks_for_a_restart_only_when_needed(tmp_path, monkeypatch, capsys):
    (tmp_path / "requirements-colab.txt").write_text("# comment\ntrl==1.16.0\npandas==2.2.2\n")
    calls = []
    versions = iter([{"trl": "1.0.0"}, {"trl": "1.16.0"}])
    monkeypatch.setattr("labkit.lab.package_versions", lambda names: next(versions))

    def fake_run(command, check):
        calls.append(command)
        installed = Path(command[command.index("-r") + 1]).read_text() if "-r" in command else ""
        assert "pandas" not in installed
    monkeypatch.delitem(sys.modules, "trl", raising=False)
    assert colab_install(tmp_path, run=fake_run) is False
    assert calls[1][-3:] == ["--no-deps", "-e", str(tmp_path)]
    out = capsys.readouterr().out
    assert "keeping Colab's own pandas" in out and "No restart needed" in out

    versions = iter([{"trl": "1.0.0"}, {"trl": "1.16.0"}])
    monkeypatch.setitem(sys.modules, "trl", object())
    assert colab_install(tmp_path, run=fake_run) is True
    assert "RESTART NEEDED: trl" in capsys.readouterr().out


def test_every_install_cell_clones_the_same_pinned_release_and_shows_errors():
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        source = "".join(json.loads(path.read_text())["cells"][1]["source"])
        assert f'LABKIT_REF = "v{version}"' in source, f"{path.name}: LABKIT_REF is not v{version}"
        assert "/dev/null" not in source and "|| true" not in source and " -q" not in source, path.name
        assert "colab_install(" in source and "requirements.txt" not in source.replace("requirements-", "")
