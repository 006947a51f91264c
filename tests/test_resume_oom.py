"""Resume after an interruption, and the OOM doctor: a simulated CUDA OOM becomes a short report."""
import json

import pytest
import torch
from transformers import TrainerCallback

from labkit import device as dev
from labkit.oom import (OOMReport, TrainingOutOfMemory, candidate_changes, explain_oom, ordered_changes)
from labkit.presets import get_preset
from labkit.run import ResumeMismatchError, build_run, resume_checkpoint, save_preset
from labkit.training import last_checkpoint

CPU = dev.DeviceInfo("cpu", "x86_64 CPU (2 cores)", None, None, bf16=False, fp16=False)
PRESET = get_preset("cpu-tiny", max_steps=5, save_steps=2, train_limit=24, max_completion_length=16)
OOM_MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15.57 GiB of which "
               "1.12 GiB is free. Including non-PyTorch memory, this process has 14.44 GiB memory in use.")


class Disconnect(Exception):
    """Stands in for a Colab disconnect: the process stops mid-run."""


class StopAfter(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Disconnect(f"gone after step {self.step}")


class StepsSeen(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def _trainable(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


# ----------------------------------------------------------------------------- resume


@pytest.mark.slow
def test_interrupted_run_resumes_at_its_checkpoint_and_ends_where_an_uninterrupted_run_does(tmp_path):
    straight = build_run(PRESET, tmp_path / "straight", device=CPU, disable_tqdm=True)
    assert straight.train().global_step == 5

    interrupted = build_run(PRESET, tmp_path / "run", device=CPU, disable_tqdm=True, callbacks=[StopAfter(3)])
    with pytest.raises(Disconnect):
        interrupted.train()
    assert last_checkpoint(tmp_path / "run").name == "checkpoint-2"  # step 3 was done but never saved

    seen = StepsSeen()
    resumed = build_run(PRESET, tmp_path / "run", device=CPU, disable_tqdm=True, callbacks=[seen])
    result = resumed.train()  # resume="auto"
    assert seen.steps == [3, 4, 5] and result.global_step == 5
    logged = [h["step"] for h in resumed.trainer.state.log_history if "loss" in h]
    assert logged == [1, 2, 3, 4, 5]
    # Same data order, same RNG (restored from the checkpoint): the very same adapter weights.
    a, b = _trainable(straight.model), _trainable(resumed.model)
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)


def test_a_changed_recipe_is_refused_on_resume(tmp_path):
    save_preset(PRESET, tmp_path)
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text('{"global_step": 2}')
    assert resume_checkpoint(tmp_path, PRESET) == checkpoint
    with pytest.raises(ResumeMismatchError, match=r"num_generations: checkpoint 4, now 2[\s\S]*new output_dir"):
        resume_checkpoint(tmp_path, PRESET.replace(num_generations=2, per_device_train_batch_size=2))
    # memory-only settings may change: gradient checkpointing is what an OOM report may ask for
    assert resume_checkpoint(tmp_path, PRESET.replace(activation_checkpointing=False)) == checkpoint
    with pytest.raises(ResumeMismatchError, match="already holds checkpoints"):
        resume_checkpoint(tmp_path, PRESET, resume=False)


def test_resume_modes_and_half_written_checkpoints(tmp_path):
    assert resume_checkpoint(tmp_path, PRESET) is None  # nothing yet: start at step 0
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        resume_checkpoint(tmp_path, PRESET, resume=True)
    save_preset(PRESET, tmp_path)
    for step in (2, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2}')
    # checkpoint-4 has no trainer_state.json: the process died while writing it
    assert last_checkpoint(tmp_path).name == "checkpoint-2"


def test_a_run_killed_while_copying_its_recipe_into_a_checkpoint_resumes_from_that_checkpoint(tmp_path, monkeypatch):
    # the trainer has written checkpoint-3 whole; the kill lands while labkit copies the recipe into it (the run's
    # SavePresetCallback, after trainer_state.json): the checkpoint keeps no half file, and resumes with the run's copy
    import os

    save_preset(PRESET, tmp_path)
    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text('{"global_step": 3}')

    def killed(*args):
        raise KeyboardInterrupt  # the process dies between writing and renaming

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        save_preset(PRESET, checkpoint)
    monkeypatch.undo()
    assert not (checkpoint / "labkit_preset.json").exists()
    assert resume_checkpoint(tmp_path, PRESET) == checkpoint  # not skipped for a damaged recipe
    save_preset(PRESET, checkpoint)  # and a save that finishes leaves the file whole
    assert json.loads((checkpoint / "labkit_preset.json").read_text())["preset"]["name"] == PRESET.name


def test_a_checkpoint_without_a_saved_recipe_is_not_resumed_blindly(tmp_path):
    (tmp_path / "checkpoint-1").mkdir()
    (tmp_path / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": 1}')
    with pytest.raises(ResumeMismatchError, match="cannot be checked"):
        resume_checkpoint(tmp_path, PRESET)


# ----------------------------------------------------------------------------- the OOM doctor


class OOMAtStep(TrainerCallback):
    """Arms a patched method to raise a CUDA OOM once step ``step`` has begun."""

    def __init__(self, step):
        self.step, self.armed = step, False

    def on_step_begin(self, args, state, control, **kwargs):
        self.armed = state.global_step + 1 >= self.step


def _patch_to_oom(monkeypatch, obj, name, trigger, when=lambda: True):
    original = getattr(obj, name)

    def failing(*args, **kwargs):
        if trigger.armed and when():
            raise torch.OutOfMemoryError(OOM_MESSAGE)
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, name, failing)


@pytest.mark.slow
def test_oom_in_the_loss_forward_becomes_a_report_and_keeps_the_checkpoint(tmp_path, monkeypatch):
    trigger = OOMAtStep(3)
    run = build_run(PRESET, tmp_path, device=CPU, disable_tqdm=True, callbacks=[trigger])
    base = run.model.get_base_model()
    # The loss's forward runs with gradients on; generation and scoring run under no_grad.
    _patch_to_oom(monkeypatch, base, "forward", trigger, when=torch.is_grad_enabled)
    with pytest.raises(TrainingOutOfMemory) as caught:
        run.train()
    report = caught.value.report
    assert (report.step, report.max_steps, report.phase) == (3, 5, "forward")
    assert report.tried_gib == pytest.approx(2.0)
    assert report.checkpoint.endswith("checkpoint-2")
    kept = tmp_path / "checkpoint-2"
    assert (kept / "adapter_model.safetensors").exists() and (kept / "trainer_state.json").exists()
    assert last_checkpoint(tmp_path) == kept  # nothing was written after the OOM
    # first the cut for the forward pass: checkpointing is already on, so a smaller per-device batch
    assert report.changes[0].updates == {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4}
    text = str(caught.value)
    assert text.startswith("Out of GPU memory at step 3 of 5, during the loss's forward pass")
    assert "Traceback" not in text and len(text.splitlines()) < 20
    assert caught.value.__context__ is None and caught.value.__cause__ is None  # no chained raw traceback
    saved = json.loads((tmp_path / "oom_report.json").read_text())
    assert saved["phase"] == "forward" and saved["changes"][0].startswith("per_device_train_batch_size 4 -> 2")
    # Run.explain_oom (notebook 04, section 8): the same report for the run's latest step, 2, the one it kept
    shown = run.explain_oom(torch.OutOfMemoryError(OOM_MESSAGE), phase="forward").as_dict()
    assert shown == {**saved, "step": 2, "output_dir": str(tmp_path)}, (shown, saved)
    # the patched trainer methods are gone again: the same trainer trains normally once the fault is cleared
    assert "compute_loss" not in run.trainer.__dict__ and "_generate" not in run.trainer.__dict__

    monkeypatch.undo()
    seen = StepsSeen()
    resumed = build_run(PRESET, tmp_path, device=CPU, disable_tqdm=True, callbacks=[seen])
    assert resumed.train().global_step == 5 and seen.steps == [3, 4, 5]


@pytest.mark.slow
def test_oom_during_generation_puts_completion_length_first(tmp_path, monkeypatch):
    trigger = OOMAtStep(1)
    preset = PRESET.replace(max_completion_length=256)  # never generated: the first generate() fails
    run = build_run(preset, tmp_path, device=CPU, disable_tqdm=True, callbacks=[trigger])
    _patch_to_oom(monkeypatch, run.model.get_base_model(), "generate", trigger)
    with pytest.raises(TrainingOutOfMemory) as caught:
        run.train()
    report = caught.value.report
    assert (report.step, report.phase, report.checkpoint) == (1, "generation", None)
    # cpu-tiny generates 4 x 2 completions at once (steps_per_generation = accumulation): first, fewer at once
    assert report.changes[0].updates == {"steps_per_generation": 1}
    # cpu-tiny's 512-token prompts make the prefill the larger moment of generation (labkit.memory.estimate: the
    # peak is the larger of prefill and the end of decoding): a shorter completion would not lower it, so the
    # doctor, which offers only changes that lower the phase, leaves it out
    assert not any("max_completion_length" in c.updates for c in report.changes)
    assert "batch" not in {c.kind for c in report.changes}  # half the batch, twice the steps: the same KV cache
    assert "starts again from step 0" in str(report)


@pytest.mark.slow
def test_other_errors_pass_through_untouched(tmp_path, monkeypatch):
    run = build_run(PRESET, tmp_path, device=CPU, disable_tqdm=True)

    def broken(*args, **kwargs):
        raise ValueError("not a memory problem")

    monkeypatch.setattr(run.model.get_base_model(), "generate", broken)
    with pytest.raises(ValueError, match="not a memory problem"):
        run.train()
    assert not (tmp_path / "oom_report.json").exists()


def test_changes_depend_on_the_phase_and_skip_what_is_already_done():
    settings = dict(model="Qwen/Qwen2.5-1.5B-Instruct", method="full", per_device_train_batch_size=4,
                    gradient_accumulation_steps=2, num_generations=8, max_completion_length=786,
                    optim="adamw_torch", activation_checkpointing=False, beta=0.04)
    first = {phase: ordered_changes(settings, phase)[0].kind
             for phase in ("generation", "forward", "backward", "optimizer", "scoring", "setup")}
    assert first == {"generation": "generations", "forward": "checkpointing", "backward": "checkpointing",
                     "optimizer": "optim", "scoring": "batch", "setup": "method"}
    kinds = {c.kind: c for c in candidate_changes(settings)}
    assert kinds["batch"].updates == {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4}
    # the generation batch (4 x 2 = 8) holds one prompt's group of 8: a group of 4, generated 4 at a time
    assert kinds["generations"].updates == {"num_generations": 4, "steps_per_generation": 1}
    assert kinds["model"].updates == {"model": "Qwen/Qwen2.5-0.5B-Instruct"}
    assert kinds["beta"].updates == {"beta": 0.0} and kinds["method"].updates == {"method": "lora"}
    done = dict(settings, method="qlora", beta=0.0, per_device_train_batch_size=1, gradient_accumulation_steps=16,
                optim="paged_adamw_8bit", activation_checkpointing=True, num_generations=2, max_completion_length=128)
    assert {c.kind: c.updates for c in candidate_changes(done)} == {
        "generation_batch": {"steps_per_generation": 8}, "model": {"model": "Qwen/Qwen2.5-0.5B-Instruct"}}


def _phase_bytes(preset, precision, phase):
    """The memory ``phase`` fills for ``preset``, by labkit.memory.estimate (through preflight's own call)."""
    from labkit.oom import estimate as _estimate, scoring_memory
    from labkit.presets import resolve_plan

    result = _estimate(resolve_plan(preset.replace(precision=precision)))
    est = result.bytes
    if phase == "generation":
        return est["generation_phase"]
    if phase == "setup":
        return est["weights"] + est["reference"] + est["optimizer"]
    if phase == "optimizer":  # after the backward pass: no activations
        return est["weights"] + est["reference"] + est["gradients"] + est["optimizer"]
    if phase == "scoring":  # a no-grad forward of per_device_train_batch_size sequences (tests/test_oom_phases.py)
        return scoring_memory(result, lora_targets=list(preset.target_modules),
                              num_iterations=preset.config.get("num_iterations", 1))
    return est["training_phase"]


_PHASES = ("generation", "scoring", "forward", "backward", "optimizer", "setup")


@pytest.mark.parametrize("name", ["laptop-16gb", "colab-t4", "qlora-3b", "workshop", "cpu-smollm2", "cpu-tiny"])
@pytest.mark.parametrize("variant", ["as is", "full, no checkpointing", "bigger batch"])
def test_the_doctor_never_offers_a_change_that_leaves_the_phase_unchanged(name, variant):
    """For every preset and phase, each change offered lowers that phase's memory by labkit.memory.estimate."""
    from labkit.presets import PRESETS

    preset = PRESETS[name]
    if variant == "full, no checkpointing":
        preset = preset.replace(method="full", optim="adamw_torch", activation_checkpointing=False, beta=0.04)
    elif variant == "bigger batch":
        preset = preset.replace(per_device_train_batch_size=preset.config["num_generations"] * 2, gradient_accumulation_steps=2)
    for precision in ("bf16", "fp16"):
        settings = {**preset.to_dict(), "precision": precision}
        for phase in _PHASES:
            before = _phase_bytes(preset, precision, phase)
            for change in ordered_changes(settings, phase):
                after = _phase_bytes(preset.replace(**change.updates), precision, phase)
                assert after < before, (name, variant, precision, phase, str(change))


def test_the_doctor_offers_no_batch_halving_for_generation_and_qlora_only_where_it_saves():
    """The two rules the issue names: at fixed generation batch the KV cache stays; QLoRA can cost more (0.5B)."""
    from labkit.memory import estimate
    from labkit.presets import PRESETS

    laptop = {**PRESETS["laptop-16gb"].to_dict(), "per_device_train_batch_size": 4, "precision": "bf16"}
    generation = [c.kind for c in ordered_changes(laptop, "generation")]
    assert "batch" not in generation and "generation_batch" in generation
    assert "batch" in [c.kind for c in ordered_changes(laptop, "forward")]
    # Qwen2.5-0.5B with LoRA (workshop, fp16 on a T4): QLoRA is offered for the forward pass exactly when the
    # estimator says its training pass is smaller (with fp32 hidden states it was not); the weights alone shrink
    workshop = {**PRESETS["workshop"].to_dict(), **PRESETS["workshop"].config, "precision": "fp16"}
    knobs = dict(per_device_train_batch_size=workshop["per_device_train_batch_size"],
                 gradient_accumulation_steps=workshop["gradient_accumulation_steps"],
                 num_generations=workshop["num_generations"], max_prompt_length=workshop["max_prompt_length"],
                 max_completion_length=workshop["max_completion_length"], optim=workshop["optim"],
                 gradient_checkpointing=workshop["activation_checkpointing"], beta=workshop["beta"],
                 precision="fp16", lora_rank=workshop["lora_rank"], lora_targets=list(workshop["target_modules"]))
    qlora_saves = (estimate(workshop["model"], "qlora", **knobs).bytes["training_phase"]
                   < estimate(workshop["model"], "lora", **knobs).bytes["training_phase"])
    assert ("method" in [c.kind for c in ordered_changes(workshop, "forward")]) == qlora_saves
    assert "method" in [c.kind for c in ordered_changes(workshop, "setup")]


def test_explain_oom_reads_the_failed_allocation():
    report = explain_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB. ..."),
                         phase="backward", step=7, max_steps=200, settings={"activation_checkpointing": False})
    assert isinstance(report, OOMReport) and report.tried_gib == pytest.approx(0.5)
    assert report.changes[0].kind == "checkpointing"
    assert "step 7 of 200, during the backward pass" in str(report)
    assert explain_oom(RuntimeError("CUDA error: out of memory"), phase="x").tried_gib is None


def test_the_newest_checkpoint_is_transformers_choice_until_it_is_damaged(tmp_path):
    # transformers lists the checkpoint-N folders (trainer_utils.sort_checkpoints); labkit adds the checks.
    # transformers' get_last_checkpoint (Trainer.train(resume_from_checkpoint=True)) takes the highest step as it is.
    from transformers.trainer_utils import get_last_checkpoint

    for step in (2, 10, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (tmp_path / "checkpoint-3-old").mkdir()  # not a checkpoint-N name: passed over
    (tmp_path / "checkpoint-3-old" / "trainer_state.json").write_text('{"global_step": 3}')
    (tmp_path / "checkpoint-12.tar").write_text("")  # a file, not a folder
    assert last_checkpoint(tmp_path) == tmp_path / "checkpoint-10" == tmp_path / get_last_checkpoint(str(tmp_path))
    (tmp_path / "checkpoint-10" / "trainer_state.json").write_text('{"global_step": 1')  # cut short
    skipped = []
    assert last_checkpoint(tmp_path, skipped=skipped) == tmp_path / "checkpoint-4"
    assert [(path.name, why.split()[0]) for path, why in skipped] == [("checkpoint-10", "trainer_state.json")]
    assert get_last_checkpoint(str(tmp_path)).endswith("checkpoint-10")  # transformers would resume from it
    assert last_checkpoint(tmp_path / "missing") is None and last_checkpoint(tmp_path / "checkpoint-2") is None
