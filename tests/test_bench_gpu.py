"""``python -m bench gpu``: the command's logic on a CPU, and the GPU rows it recorded.

- no CUDA device: one line, exit 2, nothing written; ``--tiny`` never writes beside GPU rows;
- ``--tiny`` runs every part through ``build_run`` with two-layer models (what would break on a GPU breaks here);
- the budget: a row cut short is kept as "cut", rows that would not finish are listed as skipped;
- rows measured at today's settings are not measured again, a changed preset is;
- :class:`bench.gpu.PhasePeaks` names the phases in TRL's order;
- the recorded laptop-16gb run: the replayed timeline (notebooks 04 and 05) agrees with the measured row.
"""
import json
import subprocess
from pathlib import Path

import pytest

from bench import gpu, gpu_measure

RESULTS = Path(__file__).resolve().parents[1] / "results" / "gpu"


def _cuda_probe(total_gib=79.2):
    return {"status": "ok", "device": {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "total_memory_gib": total_gib,
                                       "compute_capability": [9, 0], "bf16": True, "fp16": True}}


def test_no_cuda_says_so_in_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "gpu"
    assert gpu.main(["--results", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no CUDA device" in err and "--tiny" in err
    assert not out.exists()


def test_tiny_never_writes_beside_gpu_rows(tmp_path, capsys):
    folder = tmp_path / "gpu"
    folder.mkdir()
    (folder / "measurements.json").write_text(json.dumps([{"name": "laptop-16gb", "status": "ok", "cuda": "13.0"}]))
    before = (folder / "measurements.json").read_text()
    assert gpu.main(["--tiny", "--results", str(folder)]) == 2
    assert "holds rows measured on a GPU" in capsys.readouterr().err
    assert (folder / "measurements.json").read_text() == before and not (folder / "measurements.csv").exists()


@pytest.mark.slow
def test_tiny_runs_presets_grid_and_qlora_through_build_run(tmp_path):
    out = tmp_path / "gpu"
    assert gpu.main(["--tiny", "--parts", "presets", "grid", "qlora", "doctor", "--results", str(out)]) == 0
    rows = json.loads((out / "measurements.json").read_text())
    # the doctor's capped rows need a GPU's phase peaks: on a CPU they say so, and only its base rows run
    doctor = [r for r in rows if r["part"] == "doctor" and "base" not in r["name"]]
    assert len(doctor) == 6 and all(r["status"] == "not isolated" and "not measured on a GPU" in r["error"]
                                    for r in doctor)
    rows = [r for r in rows if r not in doctor]
    assert [r["name"] for r in rows] == [*gpu.PRESET_ORDER, "qlora-3b-prepare-kbit", "doctor-lora-base",
                                         "doctor-full-base", "grid-Qwen2.5-0.5B-lora-bf16",
                                         "grid-Qwen2.5-0.5B-qlora-bf16"]
    # QLoRA both ways: TRL's loader (the preset) and labkit's with PEFT's fp32 upcast are both 4-bit
    assert {r["method"] for r in rows} == {"lora", "qlora", "full"}
    qlora = {r["name"]: r for r in rows if r["method"] == "qlora"}
    assert qlora["qlora-3b"]["loader"] == "trl" and qlora["qlora-3b-prepare-kbit"]["loader"] == "labkit-prepare-kbit"
    assert all(r["weights_4bit"] for r in qlora.values())
    assert qlora["qlora-3b-prepare-kbit"]["embedding_dtype"] == "float32"
    for row in rows:
        assert row["status"] == "ok", row.get("error")
        assert row["steps_done"] == 2
        # every completion forced to max_completion_length (min_new_tokens), the worst case on purpose
        assert row["completion_mean_length"] == gpu.TINY_SETTINGS["max_completion_length"]
        for phase in gpu.PHASE_ORDER:  # each phase of TRL's step was seen and timed
            assert row[f"{phase}_s"] is not None, (row["name"], phase)
        assert row["label"].startswith("CPU rehearsal") and row.get("peak_allocated_gib") is None
    header = (out / "measurements.csv").read_text().splitlines()[0].split(",")
    assert header == gpu.COLUMNS
    assert (out / "dashboard_laptop-16gb.png").stat().st_size > 10_000
    assert json.loads((out / "status.json").read_text())["this_run"][:len(gpu.PRESET_ORDER)] == list(gpu.PRESET_ORDER)


def test_a_row_cut_by_the_budget_is_kept_and_the_rest_is_listed(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_run(kind, spec, timeout):
        if kind == "probe":
            return _cuda_probe()
        calls.append((spec["name"], timeout))
        raise subprocess.TimeoutExpired("worker", timeout)

    import bench.worker as worker

    monkeypatch.setattr(worker, "run", fake_run)
    out = tmp_path / "gpu"
    # workshop (60 s expected) starts inside a 100 s budget and is cut; laptop-16gb (170 s) would not finish.
    code = gpu.main(["--parts", "presets", "--presets", "workshop", "laptop-16gb", "--budget-s", "100",
                     "--results", str(out)])
    assert code == 1
    assert [name for name, _ in calls] == ["workshop"] and calls[0][1] <= 100
    rows = json.loads((out / "measurements.json").read_text())
    assert [(r["name"], r["status"]) for r in rows] == [("workshop", "cut")]
    status = json.loads((out / "status.json").read_text())
    assert status["skipped_for_budget"] == ["laptop-16gb"]
    assert "workshop" in status["pending"] and "laptop-16gb" in status["pending"]
    assert "skipped (budget): laptop-16gb" in capsys.readouterr().out


def test_a_card_larger_than_the_device_is_refused(tmp_path, monkeypatch, capsys):
    import bench.worker as worker

    def fake_run(kind, spec, timeout):
        if kind == "probe":
            return _cuda_probe(total_gib=11.6)  # a 12 GB card cannot stand in for a 15.7 GiB one
        raise AssertionError("nothing may be measured")

    monkeypatch.setattr(worker, "run", fake_run)
    assert gpu.main(["--parts", "presets", "--presets", "laptop-16gb", "--results", str(tmp_path)]) == 1
    assert "refused: its card has 15.7 GiB, more than this device's 11.60 GiB" in capsys.readouterr().out


def test_rows_measured_at_todays_settings_are_not_measured_again(tmp_path):
    from labkit.presets import get_preset

    jobs = gpu.plan_jobs(("presets",), presets=("laptop-16gb", "workshop"))
    settings = get_preset("laptop-16gb").replace(precision="bf16").to_dict()
    rows = [{"name": "laptop-16gb", "status": "ok", "cuda": "13.0", "precision": "bf16", "settings": settings},
            # a row measured before the preset changed is measured again
            {"name": "workshop", "status": "ok", "cuda": "13.0", "precision": "fp16",
             "settings": get_preset("workshop").replace(precision="fp16", max_completion_length=128).to_dict()}]
    (tmp_path / "measurements.json").write_text(json.dumps(rows))
    assert [j["name"] for j in gpu.still_to_measure(jobs, tmp_path)] == ["workshop"]
    rows[0]["cuda"] = None  # a CPU row (--tiny) measures nothing
    (tmp_path / "measurements.json").write_text(json.dumps(rows))
    assert [j["name"] for j in gpu.still_to_measure(jobs, tmp_path)] == ["laptop-16gb", "workshop"]


def test_a_qlora_row_from_before_the_option_counts_as_prepare_model_for_kbit_training(tmp_path):
    """Before the preset option existed, labkit's QLoRA loader (loader "labkit") always ran PEFT's upcast: such a row
    is not a measurement of today's qlora-3b (TRL's loader), and is measured again."""
    from labkit.presets import get_preset

    jobs = gpu.plan_jobs(("presets",), presets=("qlora-3b",))
    old = get_preset("qlora-3b").replace(precision="bf16").to_dict()
    del old["prepare_model_for_kbit_training"]
    row = {"name": "qlora-3b", "status": "ok", "cuda": "13.0", "precision": "bf16", "settings": old}
    (tmp_path / "measurements.json").write_text(json.dumps([dict(row, loader="labkit")]))
    assert gpu.row_settings(dict(row, loader="labkit"))["prepare_model_for_kbit_training"] is True
    assert [j["name"] for j in gpu.still_to_measure(jobs, tmp_path)] == ["qlora-3b"]
    (tmp_path / "measurements.json").write_text(json.dumps([dict(row, loader="trl")]))
    assert gpu.still_to_measure(jobs, tmp_path) == []


def test_phase_peaks_follow_trls_step(monkeypatch):
    class Trainer:
        def __init__(self):
            self.callbacks = []

        def add_callback(self, callback):
            self.callbacks.append(callback)

        def _generate(self, prompts):
            return "completions"

        def compute_loss(self, model, inputs):
            return 0.0

    trainer = Trainer()
    peaks = gpu.PhasePeaks(cuda=False).install(trainer)
    state = type("State", (), {"global_step": 0})()
    for _ in range(2):  # two optimiser steps of two micro-batches
        trainer._generate([])
        for _ in range(2):
            trainer.compute_loss(None, None)
        trainer.callbacks[0].on_pre_optimizer_step(None, state, None)
        trainer.callbacks[0].on_optimizer_step(None, state, None)
    peaks.close()
    counts = {name: row["count"] for name, row in peaks.peaks.items()}
    assert counts == {"setup": 1, "generation": 2, "scoring": 2, "forward": 4, "backward": 4, "optimizer": 2,
                      "between steps": 2}


def test_the_recorded_timeline_agrees_with_the_measured_row():
    from labkit.memory import GIB
    from labkit.monitor import VRAMMonitor

    rows = {r["name"]: r for r in json.loads((RESULTS / "measurements.json").read_text())}
    row = rows["laptop-16gb"]
    assert row["status"] == "ok" and row["label"].startswith("measured on NVIDIA H100")
    monitor = VRAMMonitor.from_record(json.loads((RESULTS / "dashboard_laptop-16gb.json").read_text()))
    summary = {r["phase"]: r for r in monitor.phase_summary()}
    for phase in ("generation", "forward", "backward"):
        assert summary[phase]["peak_gib"] == pytest.approx(row[f"{phase}_allocated_gib"], abs=0.01)
    assert summary["generation"]["count"] == 2 and summary["backward"]["count"] == 8  # 2 steps x 4 micro-batches
    # the 20-a-second samples never exceed torch's exact peak, and come near it (spikes are short)
    assert 0.85 * row["peak_allocated_gib"] <= max(monitor.used) / GIB <= row["peak_allocated_gib"] + 1e-6


def test_every_measured_preset_row_fits_its_card_and_says_how_it_was_measured():
    from labkit.presets import card_device

    for row in json.loads((RESULTS / "measurements.json").read_text()):
        if row["part"] != "presets" or row["status"] not in ("ok", "oom"):
            continue
        card = card_device(row["name"])
        assert row["cap_gib"] + row["context_gib"] == pytest.approx(card.total_memory_gib)
        assert row["fits"] is (row["peak_with_context_gib"] <= card.total_memory_gib and row["status"] == "ok")
        assert row["driver"] and row["cuda"] and row["trl"] and row["bitsandbytes"] and row["date"]
        assert "random weights" in row["label"]


def test_the_memory_table_shows_a_measured_row_only_at_its_settings(tmp_path):
    import shutil

    from labkit.results import memory_columns

    repo = Path(__file__).resolve().parents[1] / "results"
    table = memory_columns(repo / "rehearsal.csv", None, kinds=("preset",)).set_index("row")
    column = "measured GiB (a real card, torch allocated)"
    rows = {r["name"]: r for r in json.loads((RESULTS / "measurements.json").read_text()) if r["status"] == "ok"}
    assert table.loc["laptop-16gb", column] == round(rows["laptop-16gb"]["peak_allocated_gib"], 2)
    assert table.loc["colab-t4", column] == "needs a GPU"  # not measured yet
    # the same name at other settings is not the same row
    (tmp_path / "gpu").mkdir()
    shutil.copy(repo / "rehearsal.csv", tmp_path / "rehearsal.csv")
    import pandas as pd

    measured = pd.read_csv(RESULTS / "measurements.csv")
    measured.loc[measured.name == "laptop-16gb", "per_device_train_batch_size"] = 12
    measured.to_csv(tmp_path / "gpu" / "measurements.csv", index=False)
    table = memory_columns(tmp_path / "rehearsal.csv", None, kinds=("preset",)).set_index("row")
    assert table.loc["laptop-16gb", column] == "needs a GPU"


def test_the_readme_and_docs_state_the_measured_figures():
    repo = Path(__file__).resolve().parents[1]
    readme, docs = (repo / "README.md").read_text(), (repo / "docs" / "gpu.md").read_text()
    latest = {r["name"]: r for r in json.loads((RESULTS / "measurements.json").read_text())}  # a re-measured row wins
    for row in latest.values():
        if row["part"] != "presets" or row["status"] != "ok":
            continue
        for figure in (f"{row['peak_allocated_gib']:.2f}", f"{row['peak_with_context_gib']:.2f}",
                       f"{row['estimate_error_pct']:+.1f} %", f"{row['rehearsal_error_pct']:+.1f} %"):
            assert figure in readme and figure in docs, (row["name"], figure)


def test_the_doctor_cap_sits_between_the_earlier_phases_and_the_target():
    base = {"phase_peaks_gib": {"setup": 3.0, "generation": 6.5, "scoring": 3.0, "forward": 7.8, "backward": 10.3,
                                "optimizer": 3.1}}
    assert gpu.doctor_cap(base, "generation") == pytest.approx(3.0 + 0.6 * 3.5)
    assert gpu.doctor_cap(base, "backward") == pytest.approx(7.8 + 0.6 * 2.5)
    assert gpu.doctor_cap(base, "optimizer") is None  # its peak is below the backward pass's: no cap isolates it
    assert gpu.doctor_cap(base, "scoring") is None


def test_the_doctor_part_runs_base_oom_and_fix_in_order(tmp_path, monkeypatch):
    import bench.worker as worker

    seen = []
    lora_peaks = {"setup": 3.0, "generation": 6.5, "scoring": 3.0, "forward": 7.8, "backward": 10.3, "optimizer": 3.1}
    full_peaks = {"setup": 2.0, "generation": 2.4, "scoring": 2.1, "forward": 3.5, "backward": 4.2, "optimizer": 3.9}

    def fake_run(kind, spec, timeout):
        if kind == "probe":
            return _cuda_probe()
        seen.append(spec)
        stage, target = spec["doctor"]["stage"], spec["doctor"].get("target")
        row = dict(part="doctor", name=spec["name"], cuda="13.0", precision="bf16", estimated_total_gib=8.0,
                   estimated_generation_gib=6.0, estimated_training_gib=8.0, wall_s=1.0,
                   settings=gpu.bench_preset(spec).replace(precision="bf16").to_dict())
        if stage == "base":
            peaks = lora_peaks if spec["name"] == "doctor-lora-base" else full_peaks
            row.update(status="ok", phase_peaks_gib=peaks, **{f"{p}_allocated_gib": v for p, v in peaks.items()})
        elif stage == "oom":
            row.update(status="oom", oom_phase=target, first_change={"per_device_train_batch_size": 12,
                                                                     "gradient_accumulation_steps": 8})
        else:
            assert spec["change"] == {"per_device_train_batch_size": 12, "gradient_accumulation_steps": 8}
            row.update(status="ok", estimated_generation_gib=4.5, estimated_training_gib=6.0,
                       **{f"{target}_allocated_gib": lora_peaks[target] - 2.0})
        return row

    monkeypatch.setattr(worker, "run", fake_run)
    assert gpu.main(["--parts", "doctor", "--results", str(tmp_path)]) == 0
    rows = {r["name"]: r for r in json.loads((tmp_path / "measurements.json").read_text())}
    # each OOM row was capped between the base's earlier phases and its target; the fix ran under the same cap
    caps = {s["name"]: s.get("cap") for s in seen}
    assert caps["doctor-generation-oom"] == caps["doctor-generation-fix"] == pytest.approx(3.0 + 0.6 * 3.5)
    assert caps["doctor-backward-oom"] == caps["doctor-backward-fix"] == pytest.approx(7.8 + 0.6 * 2.5)
    fix = rows["doctor-backward-fix"]
    assert fix["fits_after_first_change"] is True and fix["measured_fall_gib"] == pytest.approx(2.0)
    # predicted: the doctor's own memory model of the phase that ran out (labkit.phase_memory.phase_memory), before and after
    from labkit.phase_memory import phase_memory

    fall = (phase_memory(rows["doctor-lora-base"]["settings"], "backward")
            - phase_memory(fix["settings"], "backward")) / 1024**3
    assert fall > 0.5 and fix["predicted_fall_gib"] == pytest.approx(round(fall, 3))
    assert "'backward'" in fix["predicted_from"] and "'generation'" in rows["doctor-generation-fix"]["predicted_from"]
    # full fine-tuning's optimiser step peaked below its backward pass here: a finding, not a measurement
    assert rows["doctor-optimizer-oom"]["status"] == "not isolated"
    assert "no cap makes doctor-full-base fail in optimizer" in rows["doctor-optimizer-oom"]["error"]
    assert rows["doctor-optimizer-fix"]["status"] == "not isolated"
    assert not any(s["name"].startswith("doctor-optimizer") for s in seen)


def test_the_dashboards_peak_line_is_the_runs_peak_not_the_last_phases():
    from types import SimpleNamespace

    from labkit.memory import GIB
    from labkit.monitor import PhaseMark

    record = SimpleNamespace(history={"memory/peak": ([1, 2], [3.06, 3.06])})  # what the reset counters left
    marks = [PhaseMark("generation", 0, 0, 1, 0, 0, int(6.5 * GIB)), PhaseMark("backward", 0, 1, 2, 0, 0, int(10.2 * GIB)),
             PhaseMark("optimizer step", 0, 2, 3, 0, 0, int(3.0 * GIB)), PhaseMark("backward", 1, 3, 4, 0, 0,
                                                                                  int(10.3 * GIB))]
    gpu_measure._restore_peak_series(record, SimpleNamespace(phases=marks))
    assert record.history["memory/peak"][1] == pytest.approx([10.2, 10.3], abs=1e-6)
