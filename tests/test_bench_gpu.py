"""``python -m bench gpu``: the command's logic on a CPU, its plan, and the GPU rows it recorded.

- no CUDA device: one line, exit 2, nothing written; ``--tiny`` never writes beside GPU rows;
- ``--tiny`` runs rows through ``build_run`` with two-layer models, two processes at once, with the tool rounds
  forced, and a worker killed in the middle loses its own row only;
- the plan (``--plan``): every pending row of an H100 in one 10-minute run, its seconds from the recorded rows; a
  device that cannot hold many rows of the largest footprint runs fewer beside them and says so;
- side by side (fake workers): rows report memory only; the check falls back to one at a time when peaks differ;
  a row the planner's cap was short for is measured again alone; the budget cuts and skips; the doctor's order;
- the forced tool calls parse as TRL parses a real one, and the logits processor forces exactly the planned turns;
- rows measured at today's settings are not measured again, a changed preset is;
- :class:`bench.gpu.PhasePeaks` names the phases in TRL's order;
- the recorded laptop-16gb run: the replayed timeline (notebooks 04 and 05) agrees with the measured row.
"""
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from labkit.device import CARDS

from bench import gpu, gpu_cost, gpu_measure, gpu_plan, gpu_rows, gpu_run

RESULTS = Path(__file__).resolve().parents[1] / "results" / "gpu"


def _cuda_probe(total_gib=79.2):
    return {"status": "ok", "cpu_count": 16, "context_gib": 0.51, "nvml_per_process": False,
            "device": {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "total_memory_gib": total_gib,
                       "compute_capability": [9, 0], "bf16": True, "fp16": True}}


class FakeWorker:
    """What bench.worker.start returns, for a row that ends at once (or hangs until killed)."""

    def __init__(self, answer, hang=False):
        self._answer, self.hang, self.killed, self.t0 = answer, hang, False, time.monotonic()

    def poll(self):
        return self.killed or not self.hang

    def kill(self):
        self.killed = True

    def seconds(self):
        return time.monotonic() - self.t0

    def answer(self):
        return {"status": "error", "error": "the worker was killed by SIGKILL"} if self.killed else self._answer


def fake_row(spec, peak=2.0, **extra):
    """A row as bench.gpu_measure.measure answers it on a CUDA card."""
    row = dict(part=spec["part"], name=spec["name"], status="ok", cuda="13.0", precision="bf16", wall_s=1.0,
               peak_allocated_gib=peak, peak_reserved_gib=peak + 0.1, peak_card_gib=peak + 0.6, estimated_total_gib=peak,
               estimated_generation_gib=peak, estimated_training_gib=peak, estimate_error_pct=0.0,
               label="measured on NVIDIA H100 80GB HBM3, random weights, every completion at max_completion_length",
               generation_s=0.5, settings=gpu.bench_preset(spec).replace(precision="bf16").to_dict())
    row.update(extra)
    return row


@pytest.fixture()
def fake_device(monkeypatch):
    """Replace the device: the probe answers an H100, every worker answers ``answers(spec)`` (default: ok)."""
    import bench.worker as worker

    state = {"started": [], "answers": fake_row, "hang": set(), "probe": _cuda_probe()}

    def run(kind, spec, timeout):
        assert kind == "probe", kind
        return state["probe"]

    def start(kind, spec, env=None):
        state["started"].append(spec)
        return FakeWorker(state["answers"](spec), hang=spec["name"] in state["hang"])

    monkeypatch.setattr(worker, "run", run)
    monkeypatch.setattr(worker, "start", start)
    monkeypatch.setattr(gpu_run, "POLL_S", 0.01)
    monkeypatch.setattr(gpu, "_process_age_s", lambda: 0.0)  # the test's process started long before this run
    return state


def _seconds(monkeypatch, table, default=1.0):
    """Make the plan's expected seconds of each row ``table[name]`` (default ``default``)."""
    def seconds(self, job, shape):
        total = table.get(job["name"], table.get(job.get("twin_of"), default))
        return dict(start=0.0, setup=0.0, generation=total, training=0.0, total=total)

    monkeypatch.setattr(gpu_cost.SpeedModel, "seconds", seconds)


def test_no_cuda_says_so_in_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "gpu"
    assert gpu.main(["--results", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no CUDA device" in err and "--tiny" in err and "--plan" in err
    assert not out.exists()


def test_tiny_never_writes_beside_gpu_rows(tmp_path, capsys):
    folder = tmp_path / "gpu"
    folder.mkdir()
    (folder / "measurements.json").write_text(json.dumps([{"name": "laptop-16gb", "status": "ok", "cuda": "13.0"}]))
    before = (folder / "measurements.json").read_text()
    assert gpu.main(["--tiny", "--results", str(folder)]) == 2
    assert "holds rows measured on a GPU" in capsys.readouterr().err
    assert (folder / "measurements.json").read_text() == before and not (folder / "measurements.csv").exists()


def _full_disk_for(real, row_name):
    """``gpu_run.write_rows`` that finds the disk full when it writes the row ``row_name`` (its other writes go on)."""
    import errno

    def write(results, rows, *, replace=False):
        if any(r["name"] == row_name for r in rows) and not replace:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(results, rows, replace=replace)

    return write


def _kill_worker_of(row_name, seen, stop):
    """Kill (SIGKILL) the worker process measuring ``row_name`` as soon as it exists, until ``stop`` is set (the run
    ended): one row, nothing else. No deadline: on a loaded CPU the row may start minutes into the run."""
    import psutil

    while not stop.is_set() and not seen:
        for child in psutil.Process().children(recursive=True):
            try:
                cmdline = " ".join(child.cmdline())
            except psutil.Error:
                continue
            if "bench.worker" in cmdline and f'"name": "{row_name}"' in cmdline:
                os.kill(child.pid, signal.SIGKILL)
                seen.append(child.pid)
                return
        time.sleep(0.05)


@pytest.mark.slow
def test_tiny_runs_two_at_once_forces_tool_rounds_and_a_killed_worker_loses_its_row_only(tmp_path):
    out = tmp_path / "gpu"
    killed, stop = [], threading.Event()
    killer = threading.Thread(target=_kill_worker_of, args=("grid-Qwen2.5-0.5B-qlora-bf16", killed, stop), daemon=True)
    killer.start()
    code = gpu.main(["--tiny", "--parts", "presets", "qlora", "grid", "--presets", "laptop-16gb", "qlora-3b",
                     "tools-16gb", "--results", str(out)])
    stop.set()
    killer.join(timeout=5)
    assert killed and code == 1  # a row broke: the exit code says so
    rows = {r["name"]: r for r in json.loads((out / "measurements.json").read_text())}
    assert set(rows) == {"laptop-16gb", "qlora-3b", "tools-16gb", "qlora-3b-prepare-kbit",
                         "grid-Qwen2.5-0.5B-lora-bf16", "grid-Qwen2.5-0.5B-lora-bf16-beside",
                         "grid-Qwen2.5-0.5B-qlora-bf16"}
    dead = rows.pop("grid-Qwen2.5-0.5B-qlora-bf16")
    alone = rows.pop("grid-Qwen2.5-0.5B-lora-bf16")  # the side-by-side check's row, alone first
    assert alone["status"] == "ok" and alone["side_by_side"] == 0
    assert dead["status"] == "error" and "killed by SIGKILL" in dead["error"]
    for row in rows.values():  # the kill took that row only
        assert row["status"] == "ok", (row["name"], row.get("error"))
        assert row["steps_done"] == 2
        for phase in gpu.PHASE_ORDER:  # each phase of TRL's step was seen
            assert row.get(f"{phase}_s") is not None or row["seconds_beside"][f"{phase}_s"] is not None
        assert row["label"].startswith("CPU rehearsal") and row.get("peak_allocated_gib") is None
    # two processes at once: every row ran beside another, and says so (memory only: no seconds in the columns)
    assert all(row["side_by_side"] >= 1 and row["generation_s"] is None and row["seconds_beside"]["wall_s"]
               for row in rows.values())
    # every completion forced to max_completion_length, the worst case on purpose
    assert rows["laptop-16gb"]["completion_mean_length"] == gpu.TINY_SETTINGS["max_completion_length"]
    # QLoRA both ways: TRL's loader (the preset) and labkit's with PEFT's fp32 upcast, both 4-bit
    assert rows["qlora-3b"]["loader"] == "trl" and rows["qlora-3b-prepare-kbit"]["loader"] == "labkit-prepare-kbit"
    assert rows["qlora-3b"]["weights_4bit"] and rows["qlora-3b-prepare-kbit"]["embedding_dtype"] == "float32"
    # the tool rounds, forced: every completion called the calculator in each of the recipe's 3 rounds, and the
    # last round's prompt held prompt + nearly the whole budget (TRL drops a round that would pass it)
    tools = rows["tools-16gb"]
    assert tools["tool_rounds"] == 3 and tools["forced_tools"]["tool_rounds_seen"] == 3
    assert tools["forced_tools"]["generate_calls"] == 2 * 4  # 2 steps x (the first turn + 3 rounds)
    budget, prompt = gpu.TINY_TOOL_COMPLETION, gpu.TINY_SETTINGS["max_prompt_length"]
    assert prompt + budget - 30 <= tools["longest_prompt_tokens"] <= prompt + budget
    header = (out / "measurements.csv").read_text().splitlines()[0].split(",")
    assert header == gpu.COLUMNS
    assert (out / "dashboard_laptop-16gb.png").stat().st_size > 10_000
    # what a maintainer copies back from the GPU machine: the files named in RESULT_FILES
    assert {p.name for p in out.iterdir()} <= set(gpu.RESULT_FILES)
    status = json.loads((out / "status.json").read_text())
    assert status["at_once"] == 2 and "grid-Qwen2.5-0.5B-qlora-bf16" in status["this_run"]
    assert "s in all, 2 at once" in (out / "runs.log").read_text()  # the plan, printed first, is in the log too


@pytest.mark.slow
def test_tiny_survives_a_failed_twin_and_a_full_disk_with_every_other_row_kept(tmp_path, monkeypatch):
    import bench.worker as worker

    start = worker.start

    def failing_twin(kind, spec, env=None):  # the twin's worker fails: a preset that does not exist
        return start(kind, dict(spec, preset="no-such-preset") if spec.get("twin_of") else spec, env)

    monkeypatch.setattr(worker, "start", failing_twin)
    monkeypatch.setattr(gpu_run, "write_rows", _full_disk_for(gpu_run.write_rows, "workshop"))
    out = tmp_path / "gpu"
    assert gpu.main(["--tiny", "--parts", "presets", "--presets", "workshop", "laptop-16gb", "--results", str(out)]) == 1
    rows = {r["name"]: r for r in json.loads((out / "measurements.json").read_text())}
    twin = f"{gpu_plan.CHECK_ROW}-beside"
    assert set(rows) == {gpu_plan.CHECK_ROW, twin, "laptop-16gb"} and rows[twin]["status"] == "error"
    assert rows["laptop-16gb"]["status"] == "ok" and rows[gpu_plan.CHECK_ROW]["status"] == "ok"
    status = json.loads((out / "status.json").read_text())
    assert status["not_written"] == ["workshop"] and "workshop" in status["this_run"]
    assert status["side_by_side_check"]["passed"] is None and status["at_once"] == 2


def _plan(argv, capsys):
    assert gpu.main(["--plan", *argv]) == 0
    return capsys.readouterr().out


def _entries(text):
    """The plan's rows: name -> (start, end, at once, GiB)."""
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > 5 and parts[0].isdigit() and parts[1].isdigit() and "(probe:" not in line and "(imports:" not in line:
            rows[parts[4]] = (float(parts[0]), float(parts[1]), parts[2], float(parts[3]))
    return rows


@pytest.mark.parametrize("device_gib", [80, 140])
def test_the_plan_counts_the_imports_and_keeps_its_disk_under_20_gb(device_gib, capsys):
    text = _plan(["--device-gib", str(device_gib)], capsys)
    last = text.strip().splitlines()[-1]
    total, at_once = int(last.split()[0]), int(last.split()[4])
    assert last == f"{total} s in all, {at_once} at once" and total <= 540 and at_once >= 4
    lines = text.splitlines()
    imports = next(line for line in lines if "(imports: the budget counts them)" in line).split()
    assert imports[:2] == ["0", f"{gpu_plan.IMPORT_S:.0f}"]  # the budget's clock starts at the process's start
    rows = _entries(text)
    # the check first, alone, after the imports and the probe; its twin beside the others; nothing past the budget
    check = gpu_plan.CHECK_ROW
    assert rows[check][2] == "alone" and rows[check][0] == gpu_plan.IMPORT_S + gpu_plan.PROBE_S
    assert rows[f"{check}-beside"][0] >= rows[check][1]
    assert max(end for _, end, _, _ in rows.values()) <= 540
    assert "laptop-16gb" in rows and "saves the dashboard" in next(line for line in lines if " laptop-16gb " in line)
    # at no moment does the plan hold more memory than the card (less the 1 GiB kept free)
    for t in {start for start, *_ in rows.values()}:
        held = sum(gib for start, end, _, gib in rows.values() if start <= t < end)
        assert held <= device_gib - gpu_plan.RESERVE_GIB + 1e-6, t
    disk = next(line for line in lines if line.startswith("  disk: random-weight folders"))
    peak = float(disk.split("ends: ")[1].split(" GB")[0])
    assert 0 < peak <= 20 and "of the 20 GB it may use" in disk


def test_the_disk_peak_counts_each_shared_folder_once_and_deletes_it_after_its_last_row():
    jobs = [dict(name=n) for n in ("a1", "b1", "a2", "c1")]
    folders = {"a1": ("A", 8.0), "a2": ("A", 8.0), "b1": ("B", 6.0), "c1": ("C", 10.0)}
    one = {n: 1.0 for n in folders}
    plan = gpu_plan.simulate([], jobs, [], footprints=one, expected={"a1": 10, "b1": 10, "a2": 20, "c1": 10},
                             device_gib=100, at_once=4, budget_s=1000, slowdown=1.0, start_s=0, folders=folders,
                             disk_gb=20)
    starts = {e["name"]: e["start"] for e in plan["entries"]}
    # A (8 GB, two rows) and B (6) fit 20 GB together; C (10) waits until B's only row ends and frees its folder
    assert starts["a1"] == starts["b1"] == starts["a2"] == 0 and starts["c1"] == 10
    assert plan["disk_peak_gb"] == 18.0  # A + C: A counted once though two rows load it


def test_a_row_whose_folder_is_larger_than_the_disk_is_refused_with_the_figures(capsys):
    text = _plan(["--parts", "grid", "--disk-gb", "4"], capsys)
    assert "refused: grid-Qwen2.5-3B-full-bf16: its random-weight folder needs 6.2 GB of disk, more than the 4.0 GB free" in text
    assert "grid-Qwen2.5-0.5B-lora-bf16-beside" in _entries(text)  # what fits still runs


def test_the_plan_for_an_h200_runs_more_at_once_and_sooner(capsys):
    h100, h200 = _plan(["--device-gib", "79.1"], capsys), _plan(["--device-gib", "139"], capsys)
    left = [len(_entries(text)) for text in (h100, h200)]
    at_once = [int(text.strip().splitlines()[-1].split()[4]) for text in (h100, h200)]
    assert left[1] >= left[0] and at_once[1] >= at_once[0] and "a card of 139 GiB" in h200


def test_a_cap_that_cannot_fit_n_processes_runs_fewer_and_says_so(capsys):
    text = _plan(["--device-gib", "40", "--at-once", "4", "--parts", "presets"], capsys)
    assert "at most 4 rows at once (as asked)" in text
    assert "the device fits only 2 of its largest rows (16.2 GiB each) at once, so fewer run beside those" in text
    rows = {n: r for n, r in _entries(text).items() if not n.startswith("grid")}
    for t in {start for start, *_ in rows.values()}:  # never 3 presets of 16.2 GiB on 39 GiB
        assert sum(1 for start, end, *_ in rows.values() if start <= t < end) <= 2


def test_the_plans_seconds_come_from_the_recorded_rows():
    from labkit.presets import Preset

    rows = [r for r in json.loads((RESULTS / "measurements.json").read_text()) if r["status"] == "ok"]
    model = gpu_cost.SpeedModel.from_rows(rows)
    assert set(model.fitted_on) == {r["name"] for r in rows if not r.get("side_by_side")}
    for row in rows:  # each recorded row, from its shape: generation within 5 %, the row within 10 %
        shape = gpu_cost.preset_shape(Preset.from_dict(row["settings"]), row["settings"]["name"],
                                      precision=row["precision"])
        seconds = model.seconds({}, shape)
        assert seconds["generation"] == pytest.approx(row["generation_s"], rel=0.05), row["name"]
        assert seconds["total"] - seconds["start"] == pytest.approx(row["wall_s"], rel=0.1), row["name"]
    # about 80 ms a decoding step whatever the batch: 24x the batch costs a few per cent more
    laptop = gpu_cost.preset_shape(Preset.from_dict(rows[0]["settings"]), "laptop-16gb", precision="bf16")
    small = dict(laptop, generation_batch=4)
    assert 70 < model.step_ms(small) < model.step_ms(laptop) < 1.15 * model.step_ms(small) < 100
    assert 10 < model.start_s < 30  # the gap between recorded rows: a worker's start


def test_the_docs_pictures_are_rendered_here_from_the_saved_record(tmp_path, capsys):
    import shutil

    results, docs = tmp_path / "gpu", tmp_path / "docs"
    results.mkdir()
    assert gpu._pictures(results, docs) == 2 and "run python -m bench gpu on a GPU first" in capsys.readouterr().err
    shutil.copy(RESULTS / "dashboard_laptop-16gb.json", results)
    (results / "dashboard_laptop-16gb.png").write_bytes(b"\x89PNG saved on the GPU machine")
    assert gpu._pictures(results, docs) == 0
    assert (docs / "gpu_memory_laptop-16gb.png").read_bytes()[:4] == b"\x89PNG"
    assert (docs / "gpu_dashboard_laptop-16gb.png").read_bytes() == b"\x89PNG saved on the GPU machine"
    assert "no browser" in capsys.readouterr().out


def test_the_scheduler_lets_small_rows_pass_but_never_starve_a_large_one():
    jobs = [dict(name="a"), dict(name="big"), dict(name="small1"), dict(name="small2")]
    footprints = {"a": 40.0, "big": 60.0, "small1": 10.0, "small2": 25.0}
    expected = {"a": 100.0, "big": 50.0, "small1": 40.0, "small2": 200.0}
    plan = gpu_plan.simulate([], jobs, [], footprints=footprints, expected=expected, device_gib=81.0, at_once=8,
                             budget_s=1000, slowdown=1.0)
    starts = {e["name"]: e["start"] for e in plan["entries"]}
    # "big" waits for "a"'s 40 GiB (80 free then, 20 beside it); small1 ends before then and passes; small2 fits
    # now but would hold 25 GiB past then: it waits
    assert starts["small1"] == starts["a"] and starts["big"] == starts["a"] + 100 and starts["small2"] >= starts["big"]


def test_side_by_side_rows_report_memory_only(tmp_path, fake_device, monkeypatch):
    _seconds(monkeypatch, {})
    assert gpu.main(["--parts", "grid", "--results", str(tmp_path)]) == 0
    rows = {r["name"]: r for r in json.loads((tmp_path / "measurements.json").read_text())}
    check = rows[gpu_plan.CHECK_ROW]
    assert check["side_by_side"] == 0 and check["wall_s"] == 1.0 and check["generation_s"] == 0.5  # alone: timed
    beside = [r for r in rows.values() if r["side_by_side"]]
    assert len(beside) == 12 and all(r["side_by_side_check"] == "passed" for r in beside)
    for row in beside:
        assert row["generation_s"] is None and row["wall_s"] is None and row["seconds_beside"]["wall_s"] == 1.0
        assert row["label"].endswith("its seconds are not timings")
    specs = {s["name"]: s for s in fake_device["started"]}
    assert all(s["cap_from"] == "planner" and s["cap"] >= 1.5 for s in specs.values())  # grid rows: no cap of their own
    assert specs[f"{gpu_plan.CHECK_ROW}-beside"]["side_by_side"] and not specs[gpu_plan.CHECK_ROW]["side_by_side"]
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["side_by_side_check"]["passed"] is True
    assert "measures what alone does" in status["side_by_side_check"]["verdict"]
    csv_header = (tmp_path / "measurements.csv").read_text().splitlines()[0].split(",")
    assert "side_by_side" in csv_header and "cap_from" in csv_header


def test_the_check_falls_back_to_one_at_a_time_when_side_by_side_changes_the_cards_memory(tmp_path, fake_device,
                                                                                           monkeypatch):
    _seconds(monkeypatch, {})
    # the allocator's peaks agree to the byte (each process counts its own tensors); the card's figure does not
    fake_device["answers"] = lambda spec: fake_row(spec, peak_card_gib=2.65 if spec["name"].endswith("-beside") else 2.6)
    assert gpu.main(["--parts", "grid", "--results", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "measurements.json").read_text())
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["side_by_side_check"]["passed"] is False and "+1.92 %" in status["side_by_side_check"]["verdict"]
    # the first wave ran side by side and counts as not measured (a later run measures it again); every row
    # started after the verdict ran alone
    failed = {r["name"] for r in rows if r.get("side_by_side_check") == "failed"}
    alone = [r["name"] for r in rows if r["side_by_side"] == 0 and r["name"] != gpu_plan.CHECK_ROW]
    assert f"{gpu_plan.CHECK_ROW}-beside" in failed and alone
    assert all(r["name"] in failed or r["side_by_side"] == 0 for r in rows)
    assert failed.isdisjoint(gpu.measured_rows(tmp_path)) and set(alone) <= set(gpu.measured_rows(tmp_path))


def test_the_check_fails_when_generation_beside_others_is_slower_than_the_limit(tmp_path, fake_device, monkeypatch):
    _seconds(monkeypatch, {})
    fake_device["answers"] = lambda spec: fake_row(spec, generation_s=1.5 if spec["name"].endswith("-beside") else 0.5)
    assert gpu.main(["--parts", "grid", "--results", str(tmp_path)]) == 0
    check = json.loads((tmp_path / "status.json").read_text())["side_by_side_check"]
    assert check["passed"] is False and check["slowdown"] == 3.0 and "more than x 2.5" in check["verdict"]


def test_a_failed_twin_costs_its_row_only_and_the_rest_stays_side_by_side(tmp_path, fake_device, monkeypatch):
    _seconds(monkeypatch, {})
    fake_device["answers"] = lambda spec: (dict(status="error", error="the worker was killed by SIGKILL")
                                           if spec["name"].endswith("-beside") else fake_row(spec))
    assert gpu.main(["--parts", "grid", "--results", str(tmp_path)]) == 1  # a row broke: the exit code says so
    rows = {r["name"]: r for r in json.loads((tmp_path / "measurements.json").read_text())}
    assert rows[f"{gpu_plan.CHECK_ROW}-beside"]["status"] == "error" and len(rows) == 13
    beside = [r for r in rows.values() if r["side_by_side"] and r["status"] == "ok"]
    assert len(beside) == 11 and not any(r.get("side_by_side_check") == "failed" for r in beside)
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["side_by_side_check"]["passed"] is None and status["skipped_for_budget"] == []


def test_a_failed_write_costs_that_row_only_and_the_status_is_written(tmp_path, fake_device, monkeypatch):
    _seconds(monkeypatch, {})
    monkeypatch.setattr(gpu_run, "write_rows", _full_disk_for(gpu_run.write_rows, "grid-Qwen2.5-1.5B-lora-bf16"))
    assert gpu.main(["--parts", "grid", "--results", str(tmp_path)]) == 1
    rows = {r["name"] for r in json.loads((tmp_path / "measurements.json").read_text())}
    assert "grid-Qwen2.5-1.5B-lora-bf16" not in rows and len(rows) == 12  # every other row kept
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["not_written"] == ["grid-Qwen2.5-1.5B-lora-bf16"]
    assert "grid-Qwen2.5-1.5B-lora-bf16" in status["this_run"]


def test_the_budget_counts_from_the_process_start(tmp_path, fake_device, monkeypatch):
    _seconds(monkeypatch, {}, default=10.0)
    monkeypatch.setattr(gpu, "_process_age_s", lambda: 95.0)  # the imports took 95 s of a 100 s budget
    assert gpu.main(["--parts", "grid", "--budget-s", "100", "--results", str(tmp_path)]) == 1
    assert fake_device["started"] == []  # no 10-s row fits the 5 s left
    assert len(json.loads((tmp_path / "status.json").read_text())["skipped_for_budget"]) == 13


def test_fits_counts_the_cards_memory_outside_the_allocator():
    card = CARDS["rtx3080-laptop-16gb"].gib  # 15.7
    row = dict(status="ok", peak_allocated_gib=14.0, peak_reserved_gib=15.0, context_gib=0.5, cap_gib=card - 0.5,
               peak_card_gib=16.1, estimated_total_gib=14.0, estimated_generation_gib=14.0,
               estimated_training_gib=14.0)
    # reserved + context (15.5) is within the card (15.7); what the card held (cuBLAS, bitsandbytes...) is not
    assert gpu_measure._compare(row)["fits"] is False
    assert gpu_measure._compare(dict(row, peak_card_gib=15.6))["fits"] is True


def test_generation_only_rows_generate_in_train_mode_and_count_cuda_graph_recordings():
    from torch._dynamo.utils import counters

    from bench import gpu_speed

    class Model:
        training = False

        def train(self):
            self.training = True

    class Trainer:
        args = type("Args", (), {"generation_batch_size": 4})()
        num_generations, model = 2, Model()

        def _tokenize_prompts(self, prompts):
            return prompts, None, None

        def _generate_single_turn(self, *args):  # as a StaticCache made anew at every call: graphs recorded again
            counters["inductor"]["cudagraph_recorded_non_static_inputs"] += 3

    trainer = Trainer()
    calls = gpu_measure.watch_generations(trainer)
    peaks = type("Peaks", (), {"phase": None})()
    run = type("Run", (), {"trainer": trainer})()
    spec = {"speed": {"generations": ["unmerged", "unmerged", "unmerged"]}}
    gpu_speed.generate_only(run, spec, [{"prompt": "p"}], peaks)
    columns = gpu_measure.generation_columns(calls)
    assert columns == {"generation_mode": "train", "cudagraph_recorded_after_first": 6}


def test_continuous_batchings_planned_step_grows_with_the_batch_squared():
    from labkit.presets import get_preset

    shape = gpu_cost.preset_shape(get_preset("laptop-16gb", generation="continuous"), "laptop-16gb", precision="bf16")
    model = gpu_cost.SpeedModel()
    generate = model.step_ms(dict(shape, path="generate"))
    assert model.step_ms(shape) > generate  # the packed attention comes on top of generate's step
    small = dict(shape, generation_batch=8)
    assert model.continuous_ms(shape) == pytest.approx(model.continuous_ms(small) * (96 / 8) ** 2)


def test_a_row_the_planners_cap_was_short_for_is_measured_again_alone(tmp_path, fake_device, monkeypatch):
    _seconds(monkeypatch, {})

    def answers(spec):
        if spec["name"] == "grid-Qwen2.5-3B-full-bf16" and spec.get("cap") is not None:
            return fake_row(spec, status="oom", oom_phase="backward")
        return fake_row(spec)

    fake_device["answers"] = answers
    assert gpu.main(["--parts", "grid", "--results", str(tmp_path)]) == 0
    rows = [r for r in json.loads((tmp_path / "measurements.json").read_text())
            if r["name"] == "grid-Qwen2.5-3B-full-bf16"]
    assert [r["status"] for r in rows] == ["over planner cap", "ok"] and "not a finding" in rows[0]["error"]
    assert rows[1]["side_by_side"] == 0
    assert [s.get("cap") for s in fake_device["started"] if s["name"] == "grid-Qwen2.5-3B-full-bf16"][1] is None


def test_a_row_cut_by_the_budget_is_kept_and_the_rest_is_listed(tmp_path, fake_device, monkeypatch, capsys):
    # workshop (1 s expected) starts inside a 3 s budget and hangs: it is cut; laptop-16gb (100 s) cannot finish
    _seconds(monkeypatch, {"workshop": 1.0, "laptop-16gb": 100.0, gpu_plan.CHECK_ROW: 0.5})
    fake_device["hang"] = {"workshop"}
    code = gpu.main(["--parts", "presets", "--presets", "workshop", "laptop-16gb", "--budget-s", "3",
                     "--results", str(tmp_path)])
    assert code == 1
    rows = {r["name"]: r for r in json.loads((tmp_path / "measurements.json").read_text())}
    assert rows["workshop"]["status"] == "cut" and "stopped at the budget" in rows["workshop"]["error"]
    assert "laptop-16gb" not in rows and "laptop-16gb" not in {s["name"] for s in fake_device["started"]}
    status = json.loads((tmp_path / "status.json").read_text())
    assert "laptop-16gb" in status["skipped_for_budget"] and "workshop" in status["pending"]
    assert "skipped (budget or disk): laptop-16gb" in capsys.readouterr().out


def test_a_card_larger_than_the_device_is_refused(tmp_path, fake_device, capsys):
    fake_device["probe"] = _cuda_probe(total_gib=11.6)  # a 12 GB card cannot stand in for a 15.7 GiB one
    assert gpu.main(["--parts", "presets", "--presets", "laptop-16gb", "--results", str(tmp_path)]) == 1
    assert "refused: its card has 15.7 GiB, more than this device's 11.60 GiB" in capsys.readouterr().out
    assert not any(s["name"] == "laptop-16gb" for s in fake_device["started"])


# --- the forced tool calls -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tool_tokenizer():
    from bench import forced_tools
    from labkit.environments import CalculatorEnv, environment_tools
    from labkit.models import tiny_tokenizer

    tools = environment_tools(CalculatorEnv())
    return forced_tools.prepare(tiny_tokenizer(), tools), tools


def test_the_forced_call_is_the_templates_own_and_parses_as_trl_parses_a_call(tool_tokenizer):
    from bench import forced_tools
    from labkit.environments import safe_calculate

    tokenizer, tools = tool_tokenizer
    text, ids = forced_tools.forced_call(tokenizer, tools)
    assert text == ('<tool_call>\n{"name": "calculate", "arguments": {"expression": "12 * (3 + 4)"}}\n'
                    '</tool_call>') and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.convert_tokens_to_ids("<tool_call>") == ids[0]  # one token, as in Qwen2.5's vocabulary
    assert safe_calculate(forced_tools.FORCED_EXPRESSION) == "84"
    with pytest.raises(ValueError, match="does not parse back"):
        forced_tools.forced_call(tokenizer, tools, expression="</tool_call>")  # cut short where TRL cuts it


def test_tool_prompts_are_exactly_max_prompt_length_with_the_schema(tool_tokenizer):
    from bench import forced_tools

    tokenizer, tools = tool_tokenizer
    data = forced_tools.tool_prompts(tokenizer, tools, 3, 448)  # tools-16gb's prompt, schema included
    ids = tokenizer.apply_chat_template(data["prompt"][0], tools=tools, add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"]
    assert len(ids) == 448 and len(data) == 3 and data["answer"][0] == "84"
    assert '"name": "calculate"' in tokenizer.decode(ids)  # the schema is there, as one token of the bench's


def test_the_processor_forces_each_planned_call_and_nothing_in_the_last_turn():
    import torch

    from bench.forced_tools import ForcedToolCalls

    header, response, call, eos = [1, 2], 9, [5, 6, 7], 8  # ids: an assistant header, <tool_response>, a call
    processor = ForcedToolCalls(call + [eos], rounds=2, budget=20, turn_tokens=3, header_ids=header,
                                response_id=response, structural=[9])
    # round 0: a 3-token prompt ending with the header; round 1 would start after one tool turn (9 in it)
    prompts = torch.tensor([[0, 4, 1, 2], [4, 1, 2, 3]])
    processor.begin(prompts, torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))
    # row 0: nothing written yet: 10 // 2 ... free = 1 x (20 // 2) - 0 - 4 - 3 = 3 sampled tokens, then the call
    # row 1: one token already after the header: 2 free tokens
    assert processor.plans == [3, 2] and processor.longest_prompt == 4
    written, sequence = [], prompts
    for _ in range(8):
        scores = processor(sequence, torch.zeros(2, 12))
        picked = scores.argmax(dim=1)
        free = torch.isinf(scores).all(dim=1) == False  # noqa: E712
        written.append([int(t) if torch.isinf(scores[r]).sum() > 1 else None for r, t in enumerate(picked)])
        assert free.all() and torch.isinf(scores[:, 9]).all()  # the structural id is never sampled
        sequence = torch.cat([sequence, torch.full((2, 1), 3)], dim=1)
    assert [w[0] for w in written] == [None, None, None, 5, 6, 7, 8, None]
    assert [w[1] for w in written] == [None, None, 5, 6, 7, 8, None, None]
    # the last turn (every round's tool turn is in the prompt): nothing forced
    done = torch.tensor([[1, 2, 3, 9, 3, 9, 1, 2]])
    processor.begin(done, torch.ones_like(done))
    assert processor.plans == [None] and processor.rounds_seen == 2
    scores = processor(done, torch.zeros(1, 12))
    assert torch.isinf(scores).sum() == 1  # only the structural id


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

    from labkit.charts import memory_columns

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
    # a cap above every earlier phase's peak and below the target's: the target is the first phase to run out
    assert 3.0 < gpu_rows.doctor_cap(base, "generation") < 6.5
    assert 7.8 < gpu_rows.doctor_cap(base, "backward") < 10.3
    assert gpu_rows.doctor_cap(base, "optimizer") is None  # its peak is below the backward pass's: no cap isolates it
    assert gpu_rows.doctor_cap(base, "scoring") is None


def test_the_doctor_part_runs_base_oom_and_fix_in_order(tmp_path, fake_device):
    lora_peaks = {"setup": 3.0, "generation": 6.5, "scoring": 3.0, "forward": 7.8, "backward": 10.3, "optimizer": 3.1}
    full_peaks = {"setup": 2.0, "generation": 2.4, "scoring": 2.1, "forward": 3.5, "backward": 4.2, "optimizer": 3.9}

    def answers(spec):
        if "doctor" not in spec:  # the side-by-side check's row and its twin
            return fake_row(spec)
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

    fake_device["answers"] = answers
    seen = fake_device["started"]
    assert gpu.main(["--parts", "doctor", "--results", str(tmp_path)]) == 0
    rows = {r["name"]: r for r in json.loads((tmp_path / "measurements.json").read_text())}
    # each capped row started only after the row its cap comes from had ended
    order = [s["name"] for s in seen]
    for target, base in gpu.DOCTOR_TARGETS[:2]:
        assert order.index(base) < order.index(f"doctor-{target}-oom") < order.index(f"doctor-{target}-fix")
    # each OOM row was capped between the base's earlier phases and its target; the fix ran under the same cap
    caps = {s["name"]: s.get("cap") for s in seen}
    assert caps["doctor-generation-oom"] == caps["doctor-generation-fix"] == pytest.approx(3.0 + 0.6 * 3.5)
    assert caps["doctor-backward-oom"] == caps["doctor-backward-fix"] == pytest.approx(7.8 + 0.6 * 2.5)
    fix = rows["doctor-backward-fix"]
    assert fix["fits_after_first_change"] is True and fix["measured_fall_gib"] == pytest.approx(2.0)
    # predicted: the doctor's own memory model of the phase that ran out (labkit.oom.phase_memory), before and after
    from labkit.oom import phase_memory

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


# --- the speed part (bench.gpu_speed) ------------------------------------------------------------------------------

SPEED_ORDER = ["speed-generate", "speed-static-compiled", "speed-continuous", "speed-peft-merged",
               "speed-sweep-static-compiled-b8", "speed-sweep-static-compiled-b32", "speed-sweep-generate-b8",
               "speed-sweep-generate-b32", "speed-sweep-static-compiled-b96", "speed-sweep-generate-b96"]


def test_the_speed_rows_set_each_path_through_the_recipe_most_valuable_first():
    from labkit.generation import GENERATION_FIELDS

    jobs = gpu.plan_jobs(("speed",))
    assert [j["name"] for j in jobs] == SPEED_ORDER
    for job in jobs:
        preset = gpu.bench_preset(job)
        assert preset.name == "laptop-16gb" and preset.method == "lora" and job["cap"] == "card"
        assert preset.generation == job["generation"] and not set(job.get("config", {})) & set(GENERATION_FIELDS)
        full = job["speed"]["mode"] == "full step"
        assert preset.config["max_completion_length"] == (786 if full else 256) and job["steps"] == 2
        if job["name"].startswith("speed-sweep-"):
            assert preset.generation_batch_size == int(job["name"].rsplit("-b", 1)[1])  # 8, 32, 96
            assert preset.config["gradient_accumulation_steps"] == 4 and preset.config["num_generations"] == 4
        else:
            assert preset.generation_batch_size == 96
    assert jobs[3]["speed"]["generations"] == ["unmerged", "merged", "unmerged"]
    # --tiny: one compiled row (a tiny compile takes about 30 s on a CPU), the rest as on a GPU
    tiny = [j["name"] for j in gpu.plan_jobs(("speed",), tiny=True)]
    assert tiny == [n for n in SPEED_ORDER if not n.startswith("speed-sweep-static-compiled")]


def test_the_speed_plan_fits_one_call_and_says_what_it_guesses(capsys):
    text = _plan(["--parts", "speed"], capsys)
    rows = _entries(text)
    assert list(rows)[:2] == SPEED_ORDER[:2]  # the first paths' full steps, alone, in order
    assert all(at_once == "alone" for _, _, at_once, _ in rows.values())
    assert max(end for _, end, _, _ in rows.values()) <= 540
    line = {name: next(l for l in text.splitlines() if f" {name} " in l) for name in rows}
    assert "2 x 786 decode steps x 8" in line["speed-generate"]  # the recorded ~80 ms a step
    assert "static-compiled: a guess" in line["speed-static-compiled"] and "compile 90 s (a guess" in \
        line["speed-static-compiled"]
    assert "left for a later run (past the budget): " in text
    assert "pending, never measured here: speed-vllm: " in text and "supports vLLM 0.22-0.31" in text
    # a smaller budget drops rows from the end; a larger one plans them all
    assert list(_entries(_plan(["--parts", "speed", "--budget-s", "360"], capsys)))[0] == SPEED_ORDER[0]
    every = _plan(["--parts", "speed", "--budget-s", "3000"], capsys)
    assert list(_entries(every)) == SPEED_ORDER and "generation only" in every
    continuous = next(l for l in every.splitlines() if " speed-continuous " in l)
    assert "ms of packed attention (batch squared)" in continuous


def test_a_measured_path_replaces_the_guess(capsys):
    from labkit.presets import get_preset

    row = dict(part="speed", name="speed-static-compiled", generation="static-compiled", cuda="13.0", status="ok",
               speed_mode="full step", ms_per_decode_step=12.5, compile_s=70.0)
    model = gpu_cost.SpeedModel.from_rows([row])
    shape = gpu_cost.preset_shape(get_preset("laptop-16gb", generation="static-compiled"), "laptop-16gb")
    assert model.step_ms(shape) == 12.5 and model.compile_s == 70.0
    assert model.step_ms_from(shape) == "static-compiled, measured"
    seconds = model.seconds({}, shape)
    assert seconds["generation"] == pytest.approx(70.0 + 2 * (model.overhead_s + 786 * 12.5 / 1000))


def test_a_budget_cut_drops_the_speed_rows_from_the_end(tmp_path, fake_device, monkeypatch):
    _seconds(monkeypatch, {}, default=100.0)
    clock = {"now": 0.0}

    class FakeTime:  # bench.gpu's clock: each row takes its expected 100 s
        @staticmethod
        def monotonic():
            return clock["now"]

    def answers(spec):
        clock["now"] += 100.0
        return fake_row(spec, generation=spec["generation"], ms_per_decode_step=80.0)

    monkeypatch.setattr(gpu, "time", FakeTime)
    fake_device["answers"] = answers
    assert gpu.main(["--parts", "speed", "--budget-s", "350", "--results", str(tmp_path)]) == 1  # rows skipped
    assert [s["name"] for s in fake_device["started"]] == SPEED_ORDER[:3]
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["skipped_for_budget"] == SPEED_ORDER[3:]
    assert "vLLM is not in the offline bundle" in status["not built yet"]["speed-vllm"]
    rows = json.loads((tmp_path / "measurements.json").read_text())
    assert [r["name"] for r in rows] == SPEED_ORDER[:3] and all(r["side_by_side"] == 0 for r in rows)


def test_old_rows_stay_readable_with_the_new_columns_empty(tmp_path):
    import csv

    old = {"name": "laptop-16gb", "part": "presets", "status": "ok", "generation_tokens_per_s": 1142.6}
    gpu_rows.write_rows(tmp_path, [old])
    with (tmp_path / "measurements.csv").open() as fh:
        row = next(csv.DictReader(fh))
    assert row["generation_tokens_per_s"] == "1142.6"
    assert all(row[k] == "" for k in ("ms_per_decode_step", "bandwidth_share", "compile_s", "laptop_limit_tokens_per_s"))


@pytest.mark.slow
def test_tiny_runs_the_speed_rows_with_their_figures(tmp_path):
    out = tmp_path / "gpu"
    assert gpu.main(["--tiny", "--parts", "speed", "--results", str(out)]) == 0
    rows = {r["name"]: r for r in json.loads((out / "measurements.json").read_text())}
    assert list(rows) == [j["name"] for j in gpu.plan_jobs(("speed",), tiny=True)]
    for name, row in rows.items():
        assert row["status"] == "ok" and not row.get("error"), (name, row.get("error"))
        assert row["side_by_side"] == 0 and row["generation"] == row["settings"]["generation"]
        for key in ("generation_tokens_per_s", "ms_per_decode_step", "first_extra_s", "laptop_limit_tokens_per_s",
                    "completion_mean_length"):
            assert row[key] is not None and row[key] >= 0, (name, key)
        assert row["bandwidth_share"] is None  # a CPU is no card of labkit.device.CARDS: no bandwidth to share
        assert row["generation_calls"] == (3 if name == "speed-peft-merged" else 2)
        assert row["label"].startswith("CPU rehearsal") and "random weights" in row["label"]
        assert "timings: bound by the host; a laptop's differ" in row["label"]
        assert "laptop_limit_tokens_per_s is an estimate" in row["label"]
        if row["speed_mode"] == "full step":  # a GRPO step: every phase timed
            assert row["steps_done"] == 2 and all(row[f"{p}_s"] is not None for p in gpu.PHASE_ORDER)
        else:
            assert row["forward_s"] is None and row["generation_s"] is not None
    assert rows["speed-static-compiled"]["compile_s"] > 1  # inductor compiled the decode step in the first generation
    assert all(r["compile_s"] is None for n, r in rows.items() if n != "speed-static-compiled")
    assert rows["speed-peft-merged"]["merged_tokens_per_s"] > 0
    continuous = rows["speed-continuous"]
    assert "continuous batching drops min_new_tokens" in continuous["label"]
    assert f"mean length {continuous['completion_mean_length']}" in continuous["label"]
    assert [rows[f"speed-sweep-generate-b{b}"]["generation_batch_size"] for b in (8, 32, 96)] == [8, 32, 96]
    header = (out / "measurements.csv").read_text().splitlines()[0].split(",")
    assert header == gpu.COLUMNS and "ms_per_decode_step" in header and "laptop_limit_tokens_per_s" in header
    status = json.loads((out / "status.json").read_text())
    assert "vLLM is not in the offline bundle" in status["not built yet"]["speed-vllm"]
    assert "pending, never measured here: speed-vllm" in (out / "runs.log").read_text()
