"""The Unsloth fast path: availability is reported honestly, unsloth is never imported by accident,
the GPU install file agrees with unsloth's own constraints, and the comparison code runs (its plain
TRL backend, on CPU with the tiny preset; the Unsloth backend needs a CUDA GPU and is refused here)."""
from __future__ import annotations

import csv
from pathlib import Path
import json
import subprocess
import sys
from importlib.machinery import ModuleSpec

import pytest

from labkit.device import CARDS, DeviceInfo

# unsloth 2026.10.9's Requires-Dist (its wheel's METADATA), the packages the lab's path uses.
UNSLOTH_2026_10_9 = [
    "torch<2.15.0,>=2.4.0",
    "bitsandbytes!=0.46.0,!=0.48.0,>=0.45.5",
    "datasets!=4.0.*,!=4.1.0,!=4.4.*,!=4.5.0,<5.0.0,>=3.4.1",
    "accelerate>=0.34.1",
    "peft!=0.11.0,>=0.18.0",
    "transformers!=4.53.0,!=4.54.0,!=4.55.0,!=4.55.1,!=4.57.0,!=4.57.4,!=4.57.5,!=5.0.0,!=5.1.0,<=5.17.0,>=4.52.4",
    "trl!=0.19.0,<=1.15.0,>=0.18.2",
    'triton>=3.0.0; "linux" in sys_platform',
    'xformers>=0.0.27.post2; sys_platform == "win32"',
    'unsloth[huggingface]; extra == "colab"',
]
CPU = DeviceInfo("cpu", "x86_64 CPU (2 cores)", None, None, bf16=False, fp16=False)
T4 = CARDS["t4"].device()


def _pins(path):
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def test_conflicts_name_the_package_its_version_and_the_range():
    from labkit.unsloth_path import requirement_conflicts

    found = requirement_conflicts(UNSLOTH_2026_10_9, {"trl": "1.16.0", "transformers": "5.17.0", "datasets": "5.2.0",
                                                      "torch": "2.13.0", "peft": "0.21.2"})
    assert len(found) == 2
    assert any(c.startswith("trl 1.16.0 (unsloth needs") and "<=1.15.0" in c for c in found)
    assert any(c.startswith("datasets 5.2.0") for c in found)
    # an excluded version inside the range is a conflict too
    assert requirement_conflicts(UNSLOTH_2026_10_9, {"datasets": "4.4.1"}) != []
    # requirements for other platforms, extras and unchecked packages are skipped
    assert requirement_conflicts(UNSLOTH_2026_10_9, {"torch": "2.13.0"}) == []


def test_the_gpu_install_file_satisfies_unsloth_and_the_main_one_does_not(repo_root):
    from labkit.unsloth_path import requirement_conflicts

    gpu = _pins(repo_root / "requirements-unsloth.txt")
    assert gpu["unsloth"] == "2026.10.9"  # the version whose constraints are copied above
    assert requirement_conflicts(UNSLOTH_2026_10_9, gpu) == []
    # trl 1.15.0's own Requires-Dist has datasets>=4.7.0 (and the bundle of scripts.unsloth_bundle carries 4.7.0)
    assert tuple(int(x) for x in gpu["datasets"].split(".")) >= (4, 7, 0) and gpu["trl"] == "1.15.0"
    main = _pins(repo_root / "requirements.txt")
    clashes = " ".join(requirement_conflicts(UNSLOTH_2026_10_9, main))
    assert "trl" in clashes and "transformers" in clashes and "datasets" in clashes


def test_no_gpu_means_skip_with_the_reason():
    from labkit.unsloth_path import unsloth_status

    status = unsloth_status(CPU)
    assert status.available is False
    assert "CUDA GPU" in status.reason and "x86_64 CPU" in status.reason


def test_gpu_without_unsloth_points_to_the_separate_install(monkeypatch):
    import labkit.unsloth_path as up

    monkeypatch.setattr(up.importlib.util, "find_spec", lambda name: None)
    status = up.unsloth_status(T4)
    assert not status.available and "requirements-unsloth.txt" in status.reason


def test_gpu_with_unsloth_in_the_wrong_environment_reports_the_conflicts(monkeypatch):
    import labkit.unsloth_path as up

    real_version = up.metadata.version
    monkeypatch.setattr(up.importlib.util, "find_spec",
                        lambda name: ModuleSpec("unsloth", None) if name == "unsloth" else None)
    monkeypatch.setattr(up.metadata, "version", lambda name: "2026.10.9" if name == "unsloth" else real_version(name))
    monkeypatch.setattr(up.metadata, "requires", lambda name: UNSLOTH_2026_10_9)
    status = up.unsloth_status(T4)  # this venv has trl 1.16, transformers 5.23, datasets 5.2
    assert not status.available and status.version == "2026.10.9"
    assert any(c.startswith("trl ") for c in status.conflicts) and "fresh environment" in status.reason
    assert "unsloth" not in sys.modules  # checked from metadata; never imported

    monkeypatch.setattr(up, "requirement_conflicts", lambda: [])
    ok = up.unsloth_status(T4)
    assert ok.available and ok.reason == f"unsloth 2026.10.9 on cuda: Tesla T4, {T4.total_memory_gib:.1f} GiB, sm_75"


def test_loading_through_unsloth_is_refused_here_with_the_reason():
    from labkit.unsloth_path import load_unsloth_policy, unsloth_status

    with pytest.raises(RuntimeError) as info:
        load_unsloth_policy("colab-t4")
    assert str(info.value) == unsloth_status().reason
    assert "unsloth" not in sys.modules


def test_importing_the_module_is_cheap():
    code = ("import sys, labkit.unsloth_path as u; u.unsloth_status(); "
            "print(sorted(m for m in ('unsloth', 'trl', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_bench_command_refuses_the_unsloth_backend_without_a_gpu(tmp_path, capsys):
    from bench.unsloth import main as bench_unsloth_cli

    assert bench_unsloth_cli(["--results", str(tmp_path)]) == 2
    assert "CUDA GPU" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing recorded


def test_read_comparison_is_none_until_something_is_measured(tmp_path):
    from labkit.unsloth_path import read_comparison

    assert read_comparison(tmp_path / "unsloth_vs_trl.csv") is None


@pytest.mark.slow
def test_the_plain_trl_backend_runs_in_its_own_process_and_is_recorded(tmp_path):
    """The comparison's plumbing end to end, on CPU: one backend, a fresh process, a JSON record, a CSV row."""
    from bench.unsloth import bench_unsloth
    from labkit.unsloth_path import RESULTS_FILE, read_comparison

    records = bench_unsloth("cpu-tiny", backends=("trl",), steps=2, eval_limit=4, results=tmp_path, timeout_s=300)
    assert len(records) == 1
    record = records[0]
    assert record["backend"] == "trl" and record["steps_done"] == 2
    assert record["lora_dropout"] == 0.05  # read from the trained model's PEFT config (the lab's default)
    assert record["seconds_per_step"] > 0 and record["eval_n"] == 4
    assert all(0 <= record[k] <= 1 for k in ("strict_accuracy", "lenient_accuracy", "format_rate"))
    assert record["peak_allocated_gib"] is None and "no CUDA" in record["note"]  # never a made-up GPU figure
    assert record["provenance"]["device"].startswith("cpu")
    saved = json.loads((tmp_path / "unsloth_vs_trl_trl.json").read_text())
    assert saved["seconds_per_step"] == record["seconds_per_step"]
    with open(tmp_path / RESULTS_FILE) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 1 and rows[0]["backend"] == "trl" and rows[0]["device"].startswith("cpu")
    assert rows[0]["peak_allocated_gib"] == ""
    table = read_comparison(tmp_path / RESULTS_FILE)
    assert list(table["backend"]) == ["trl"]


def test_the_summary_keeps_gpu_rows_and_pairs_backends():
    """A hand-made table (a fixture, not a measurement): CPU rows are dropped, the newest GPU row per backend kept."""
    import pandas as pd

    from labkit.unsloth_path import comparison_summary

    rows = [
        dict(backend="trl", preset="colab-t4", method="qlora", device="cpu: x86_64 CPU", peak_allocated_gib=None,
             seconds_per_step=1.0),
        dict(backend="trl", preset="colab-t4", method="qlora", device="cuda: Tesla T4", peak_allocated_gib=8.0,
             seconds_per_step=20.0),
        dict(backend="trl", preset="colab-t4", method="qlora", device="cuda: Tesla T4", peak_allocated_gib=6.0,
             seconds_per_step=16.0),
    ]
    latest, ratio = comparison_summary(pd.DataFrame(rows))
    assert len(latest) == 1 and latest.iloc[0]["peak_allocated_gib"] == 6.0 and ratio is None
    rows.append(dict(backend="unsloth", preset="colab-t4", method="qlora", device="cuda: Tesla T4",
                     peak_allocated_gib=3.0, seconds_per_step=8.0))
    latest, ratio = comparison_summary(pd.DataFrame(rows))
    assert sorted(latest["backend"]) == ["trl", "unsloth"]
    assert ratio.loc[("colab-t4", "qlora"), "peak_allocated_gib"] == 0.5
    assert ratio.loc[("colab-t4", "qlora"), "seconds_per_step"] == 0.5
    assert comparison_summary(pd.DataFrame(rows[:1]))[0].empty
    assert comparison_summary(None) == (None, None)


class _FakeFastLanguageModel:
    """A stand-in for unsloth.FastLanguageModel (unsloth needs a CUDA GPU): records the calls, loads with PEFT.

    It checks the lab's plumbing around Unsloth (what the preset passes in, what happens to the model
    after), not Unsloth itself; nothing it produces is recorded as a figure.
    """

    calls: list = []

    @classmethod
    def from_pretrained(cls, model_name, **kwargs):
        from transformers import AutoModelForCausalLM

        from labkit.models import load_tokenizer

        cls.calls.append(("from_pretrained", model_name, kwargs))
        tokenizer = load_tokenizer(model_name)
        return AutoModelForCausalLM.from_pretrained(model_name, dtype=kwargs["dtype"]), tokenizer

    @classmethod
    def get_peft_model(cls, model, **kwargs):
        from peft import LoraConfig, get_peft_model

        cls.calls.append(("get_peft_model", kwargs))
        config = LoraConfig(r=kwargs["r"], lora_alpha=kwargs["lora_alpha"], lora_dropout=kwargs["lora_dropout"],
                            target_modules=kwargs["target_modules"], task_type="CAUSAL_LM")
        return get_peft_model(model, config)

    @classmethod
    def for_inference(cls, model):
        cls.calls.append(("for_inference",))


@pytest.mark.slow
def test_the_unsloth_backend_passes_the_preset_through_and_trains(monkeypatch, decided_outside_a_plan):
    """The Unsloth backend's code path with a stand-in loader: the preset's settings reach FastLanguageModel, and the
    precision and dtypes it loads in are the plan's (this code runs on a GPU in practice: on this CPU, the same code)."""
    import types

    import labkit.unsloth_path as up
    from labkit.models import resolve_model
    from labkit.presets import get_preset

    fake = types.ModuleType("unsloth")
    fake.FastLanguageModel = _FakeFastLanguageModel
    _FakeFastLanguageModel.calls = []
    monkeypatch.setitem(sys.modules, "unsloth", fake)
    import bench.unsloth

    for module in (up, bench.unsloth):  # the loader's check and the comparison's
        monkeypatch.setattr(module, "require_unsloth", lambda: up.UnslothStatus(True, "stand-in", "0+fake"))

    record = bench.unsloth.comparison_run("cpu-tiny", "unsloth", steps=2, eval_limit=4)
    preset = get_preset("cpu-tiny")
    (_, name, load), (_, peft), (inference,) = _FakeFastLanguageModel.calls
    assert name == resolve_model(preset.model)
    assert load["max_seq_length"] == preset.max_prompt_length + preset.config["max_completion_length"]
    assert load["load_in_4bit"] is False and load["use_exact_model_name"] is True
    assert str(load["dtype"]) == "torch.float32"  # the trainer's precision on a CPU
    assert peft["r"] == preset.lora_rank and peft["lora_alpha"] == 2 * preset.lora_rank
    # Both arms on all seven projections, where Unsloth's fused QKV and MLP kernels apply (not the recipe's five)
    assert peft["target_modules"] == list(up.COMPARISON_TARGETS) and peft["lora_dropout"] == 0.0
    assert {"gate_proj", "up_proj", "down_proj", "q_proj", "k_proj", "v_proj"} <= set(peft["target_modules"])
    assert record["target_modules"] == ",".join(up.COMPARISON_TARGETS)
    assert peft["use_gradient_checkpointing"] == "unsloth"
    assert inference == "for_inference"
    assert record["backend"] == "unsloth" and record["unsloth"] == "0+fake" and record["steps_done"] == 2
    assert record["lora_dropout"] == 0.0 and record["eval_n"] == 4
    assert not decided_outside_a_plan


def test_caps_declared_under_an_extra_are_conflicts_too():
    """Unsloth puts its trl / transformers / datasets caps under an extra: skipping extras found nothing."""
    from labkit.unsloth_path import requirement_conflicts

    requirements = [
        "unsloth_zoo>=2026.10.1",
        "torch>=2.4.0",
        'trl!=0.19.0,<=1.15.0,>=0.18.2; extra == "huggingface"',
        'transformers<=5.17.0,>=4.52.4; extra == "huggingface"',
        'datasets<5.0.0,>=3.4.1; extra == "huggingface"',
        'unsloth[huggingface]; extra == "colab"',
        'torch==2.4.0; extra == "cu121-torch240"',  # an install variant nobody asked for: not checked
        'triton>=3.0.0; "linux" in sys_platform and extra == "huggingface"',
    ]
    main = {"trl": "1.16.0", "transformers": "5.23.0", "datasets": "5.2.0", "torch": "2.13.0"}
    clashes = " ".join(requirement_conflicts(requirements, main))
    assert "trl 1.16.0" in clashes and "transformers 5.23.0" in clashes and "datasets 5.2.0" in clashes
    assert "torch" not in clashes
    assert requirement_conflicts(requirements, {"trl": "1.15.0", "transformers": "5.17.0", "datasets": "4.3.0",
                                                "torch": "2.13.0"}) == []
    # extras pulled in through unsloth[...]: asking for "colab" brings "huggingface"'s caps
    assert requirement_conflicts(requirements, main, extras=("colab",)) != []
    assert requirement_conflicts(requirements, main, extras=()) == []  # the old behaviour, for contrast


# --- the measured comparison (python -m bench unsloth --random-weights): its plumbing on a CPU ----------------

def test_the_rows_come_in_pairs_on_the_cards_cap_with_all_seven_projections():
    from bench.unsloth_measure import row_specs
    from labkit.unsloth_path import COMPARISON_TARGETS

    specs = row_specs("workshop")
    assert [s["name"] for s in specs] == ["workshop-qlora-trl", "workshop-qlora-unsloth", "workshop-lora-trl",
                                          "workshop-lora-unsloth"]  # QLoRA's pair first: Unsloth's usual path
    assert all(s["cap"] == "card" and not s["tiny"] and s["steps"] == 3 for s in specs)
    assert all(s["overrides"]["target_modules"] == list(COMPARISON_TARGETS) for s in specs)
    tiny = row_specs("workshop", ("lora",), ("trl",), steps=2, tiny=True)
    assert len(tiny) == 1 and tiny[0]["cap"] is None and tiny[0]["overrides"]["max_completion_length"] == 8


def test_without_cuda_the_measured_comparison_says_so_in_one_line(tmp_path, capsys):
    from bench.unsloth import main as bench_unsloth_cli

    assert bench_unsloth_cli(["--random-weights", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("no CUDA GPU here") and "--tiny" in err
    assert not list(tmp_path.iterdir())


def test_a_row_past_the_budget_never_starts(tmp_path):
    from bench.unsloth_measure import bench_loaders, row_specs

    said = []
    assert bench_loaders(row_specs("workshop"), tmp_path, budget_s=0, say=said.append) == []
    assert said == ["skipped (budget): workshop-qlora-trl, workshop-qlora-unsloth, workshop-lora-trl, "
                    "workshop-lora-unsloth"]
    assert not (tmp_path / "unsloth_vs_trl.csv").exists()


def test_a_row_that_breaks_comes_back_as_an_error_row_with_its_reason():
    from bench.unsloth_measure import run_row

    row, output = run_row({"name": "x", "preset": "no-such-recipe", "loader": "trl", "overrides": {}, "steps": 2,
                           "cap": None, "tiny": True}, timeout_s=300)
    assert row["status"] == "error" and "no-such-recipe" in row["error"]
    assert "Traceback" in output  # the log keeps where it broke; the row keeps one line


@pytest.mark.slow
def test_the_measured_comparison_rehearses_on_a_cpu_with_the_trl_side(tmp_path):
    """``--tiny``: each row in a fresh process, a CSV row and a JSON record each; Unsloth skipped in one line."""
    out = subprocess.run([sys.executable, "-m", "bench", "unsloth", "--random-weights", "--tiny", "--methods", "lora",
                          "--steps", "2", "--results", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "skipped the Unsloth side: Unsloth's GRPO path needs a CUDA GPU" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr
    with open(tmp_path / "unsloth_vs_trl.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["name"], r["loader"], r["status"], r["steps_done"]) for r in rows] == [
        ("workshop-lora-trl", "trl", "ok", "2")]
    assert float(rows[0]["seconds_per_step"]) > 0 and rows[0]["steps_timed"] == "1"
    assert rows[0]["peak_allocated_gib"] == "" and rows[0]["label"].startswith("CPU rehearsal")  # nothing made up
    assert float(rows[0]["estimated_total_gib"]) > 0 and rows[0]["lora_dropout"] == "0.05"
    records = json.loads((tmp_path / "unsloth_vs_trl.json").read_text())
    assert len(records) == 1 and records[0]["seconds_per_step"] == float(rows[0]["seconds_per_step"])
    assert "skipped the Unsloth side" in (tmp_path / "unsloth_runs.log").read_text()


@pytest.mark.slow
def test_the_unsloth_row_loads_the_random_weight_folder_through_fast_language_model(monkeypatch):
    """The Unsloth row's code path with a stand-in loader: FastLanguageModel gets the saved folder (the config and
    random weights), not a hub id; the trainer gets its model; the row names the loader."""
    import os
    import types

    import labkit.unsloth_path as up
    from bench.unsloth_measure import measure_loader, row_specs

    class Loader(_FakeFastLanguageModel):
        folders = []

        @classmethod
        def from_pretrained(cls, model_name, **kwargs):
            cls.folders.append(sorted(os.listdir(model_name)))  # read while it exists: measure() removes it after
            return super().from_pretrained(model_name, **kwargs)

    fake = types.ModuleType("unsloth")
    fake.FastLanguageModel = Loader
    _FakeFastLanguageModel.calls = []
    monkeypatch.setitem(sys.modules, "unsloth", fake)
    monkeypatch.setattr(up, "unsloth_status", lambda device=None: up.UnslothStatus(True, "stand-in", "0+fake"))
    monkeypatch.setattr(up, "require_unsloth", lambda: up.UnslothStatus(True, "stand-in", "0+fake"))

    spec = row_specs("workshop", ("lora",), ("unsloth",), steps=2, tiny=True)[0]
    row = measure_loader(spec)
    assert row["status"] == "ok", row.get("error")
    (_, folder, load), (_, peft) = _FakeFastLanguageModel.calls
    assert Path(folder).name.endswith("-tiny") and {"config.json", "model.safetensors", "tokenizer.json"} <= set(Loader.folders[0])
    assert load["use_exact_model_name"] is True and load["fast_inference"] is False and load["load_in_4bit"] is False
    assert peft["target_modules"] == list(up.COMPARISON_TARGETS) and peft["use_gradient_checkpointing"] == "unsloth"
    assert row["loader"] == "unsloth" and row["steps_done"] == 2 and row["lora_dropout"] == 0.0
    assert row["seconds_per_step"] > 0 and row["fast_inference"] is False and row["loaders_see"] == "no CUDA"


def test_under_a_cap_the_loaders_see_the_capped_cards_free_memory(monkeypatch):
    """Unsloth sizes its GRPO loss's chunks from torch.cuda.mem_get_info: under a 16 GiB cap on an 80 GiB card it must
    see what a 16 GiB card would have free, not the 70 GiB the driver reports (a fake CUDA: no GPU here)."""
    import contextlib

    import torch

    from bench.unsloth_measure import _free_memory_of_the_card

    gib = 2 ** 30
    driver = lambda device=None: (70 * gib, 80 * gib)  # noqa: E731
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", driver)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 1 * gib)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: 0.2, raising=False)
    with contextlib.ExitStack() as stack:
        assert _free_memory_of_the_card(stack) == "the capped card's free memory"
        assert torch.cuda.mem_get_info() == (15 * gib, 16 * gib)  # the cap (16) less PyTorch's reserved (1)
    assert torch.cuda.mem_get_info is driver  # put back when the row ends
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: 1.0)
    with contextlib.ExitStack() as stack:
        assert _free_memory_of_the_card(stack) == "the device's free memory"  # no cap: nothing to change
        assert torch.cuda.mem_get_info is driver
