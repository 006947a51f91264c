"""Issue 32, reliability: a run killed (SIGKILL) while it saves a checkpoint resumes from the last complete one.

A ``cpu-tiny`` run in a subprocess saves a checkpoint every step; the test kills it the moment a new
``checkpoint-N`` folder appears, the moment its adapter appears and the moment its ``trainer_state.json``
appears, so that the kill lands before, during and at the end of the trainer writing the checkpoint. What a resumed run picks (:func:`labkit.training.last_checkpoint`)
must be the newest checkpoint that this test, independently, finds complete: every file the trainer writes
present and loadable, ``trainer_state.json`` (written last) included; labkit then copies the recipe into the checkpoint
whole or not at all (a kill there once left half a file, and the resume skipped a complete checkpoint for it:
``tests/test_resume_oom.py`` holds that case). In the end the run finishes with
every step trained once and logged once, its recipe and final adapter saved, and no lock left.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

STEPS = 5
# Every file transformers' Trainer._save_checkpoint writes for a LoRA run, trainer_state.json last.
FILES = ("adapter_model.safetensors", "adapter_config.json", "optimizer.pt", "scheduler.pt", "rng_state.pth",
         "trainer_state.json")


def _complete(checkpoint) -> bool:
    """True when every file of ``checkpoint`` is there and loads (the test's own rule, not labkit's)."""
    import torch
    from safetensors.torch import load_file

    if not all((checkpoint / name).is_file() for name in FILES):
        return False
    try:
        load_file(str(checkpoint / "adapter_model.safetensors"))
        for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
            torch.load(checkpoint / name, weights_only=False)
        json.loads((checkpoint / "adapter_config.json").read_text())
        step = json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]
    except Exception:  # noqa: BLE001  anything that does not load is not complete
        return False
    return checkpoint.name == f"checkpoint-{step}"


def _newest_complete(output_dir) -> int | None:
    steps = [int(p.name.split("-")[1]) for p in output_dir.glob("checkpoint-*") if _complete(p)]
    return max(steps, default=None)


def _start(output_dir, log):
    command = [sys.executable, "-m", "labkit", "train", "--preset", "cpu-tiny", "--max-steps", str(STEPS),
               "--save-steps", "1", "--train-limit", "8", "--set", "max_completion_length=4",
               "--output-dir", str(output_dir)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # the "resuming from" line reaches the log before the kill
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


def _resumed_from(text: str) -> int | None:
    found = re.findall(r"resuming from \S+checkpoint-(\d+) \(step", text)
    return int(found[-1]) if found else None


@pytest.mark.slow
def test_a_run_killed_while_saving_resumes_from_its_last_complete_checkpoint(tmp_path):
    output_dir = tmp_path / "run"
    kills = []  # (step, trigger, files of checkpoint-step when killed, newest complete checkpoint after the kill)
    expected = None  # the checkpoint the next process must resume from
    # When the folder appears (nothing written yet), when the adapter appears (the optimizer and the state not yet:
    # a 5 ms delay after the folder still found it empty, a 50 ms one found it complete), and when the state appears.
    for step, trigger in ((2, ""), (3, "adapter_model.safetensors"), (4, "trainer_state.json")):
        log_path = tmp_path / f"kill-{step}.log"
        with log_path.open("w") as log:
            process = _start(output_dir, log)
            folder = output_dir / f"checkpoint-{step}"
            deadline = time.monotonic() + 80
            while not (folder / trigger).exists():
                assert process.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "no checkpoint appeared"
                time.sleep(0.001)
            process.send_signal(signal.SIGKILL)
            process.wait()
        text = log_path.read_text()
        assert _resumed_from(text) == expected, (step, expected, text[-3000:])  # the last complete one, or none
        assert "Traceback" not in text
        expected = _newest_complete(output_dir)
        kills.append((step, trigger or "folder", sorted(p.name for p in folder.iterdir()) if folder.exists() else [], expected))
    print("killed at:", kills)

    log_path = tmp_path / "finish.log"
    with log_path.open("w") as log:
        assert _start(output_dir, log).wait(timeout=120) == 0, log_path.read_text()[-3000:]
    text = log_path.read_text()
    assert _resumed_from(text) == expected, (expected, text[-3000:])
    assert f"done: {STEPS} steps" in text

    # Nothing lost: the last checkpoint is complete at max_steps and has every step's log once, the recipe and
    # the final adapter are saved, the lock went with the run.
    last = output_dir / f"checkpoint-{STEPS}"
    assert _complete(last)
    history = json.loads((last / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in history if "loss" in h] == list(range(1, STEPS + 1))
    assert (output_dir / "final" / "adapter_model.safetensors").is_file()
    assert json.loads((output_dir / "labkit_preset.json").read_text())["preset"]["config"]["max_steps"] == STEPS
    assert not (output_dir / "labkit.lock").exists()
