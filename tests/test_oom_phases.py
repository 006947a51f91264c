"""The OOM doctor's phases: each change it offers lowers the memory of the phase that ran out.

Scoring runs under no_grad with gradient checkpointing switched off, and the optimiser step comes after
the backward pass has freed the activations, so neither phase is the training pass's memory (issue 31).
Figures come from labkit.memory.estimate, never hard-coded, so they follow the estimator's changes.
"""
import pytest
import torch

from labkit.device import CARDS
from labkit.memory import estimate
from labkit.oom import candidate_changes, optimizer_step_memory, ordered_changes, phase_memory, preflight, scoring_memory
from labkit.oom import estimate as _estimate
from labkit.presets import PRESETS, resolve_plan
from labkit.training import non_finite_advice

PHASES = ("generation", "scoring", "forward", "backward", "optimizer")
# Realistic settings: the 16 GB laptop preset (with and without a KL term), full fine-tuning of the same model
# with torch's AdamW and no checkpointing, and QLoRA on the 3B model (bf16, and fp16 with a KL term, a T4).
SETTINGS = {
    "laptop-16gb": (PRESETS["laptop-16gb"], "bf16"),
    "laptop-16gb, beta 0.04": (PRESETS["laptop-16gb"].replace(beta=0.04), "bf16"),
    "full, adamw_torch": (PRESETS["laptop-16gb"].replace(method="full", optim="adamw_torch", beta=0.04,
                                                         activation_checkpointing=False, per_device_train_batch_size=8),
                          "bf16"),
    "qlora-3b": (PRESETS["qlora-3b"], "bf16"),
    "qlora-3b, fp16, beta 0.04": (PRESETS["qlora-3b"].replace(beta=0.04), "fp16"),
}


def _peak(preset, precision, phase):
    """The peak of ``phase`` for ``preset``, from the terms of labkit.memory.estimate (preflight's own call)."""
    est = _estimate(resolve_plan(preset.replace(precision=precision)))
    terms = est.bytes
    if phase == "generation":
        return terms["generation_phase"]
    if phase in ("forward", "backward"):
        return terms["training_phase"]
    if phase == "optimizer":  # the activations are gone: what optimizer.step() has live
        return terms["weights"] + terms["reference"] + terms["gradients"] + terms["optimizer"]
    return scoring_memory(est, lora_targets=list(preset.target_modules),
                          num_iterations=preset.config.get("num_iterations", 1))


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_change_offered_lowers_the_peak_of_its_phase(name):
    preset, precision = SETTINGS[name]
    settings = {**preset.to_dict(), "precision": precision}
    for phase in PHASES:
        before = _peak(preset, precision, phase)
        for change in ordered_changes(settings, phase):
            after = _peak(preset.replace(**change.updates), precision, phase)
            assert after < before, (name, phase, str(change))


@pytest.mark.parametrize("name", list(SETTINGS))
def test_no_activation_cure_for_the_optimizer_step_and_no_checkpointing_for_scoring(name):
    preset, precision = SETTINGS[name]
    settings = {**preset.to_dict(), "precision": precision}
    optimizer = {c.kind for c in ordered_changes(settings, "optimizer")}
    assert not optimizer & {"checkpointing", "batch", "completion"}, optimizer
    assert "checkpointing" not in {c.kind for c in ordered_changes(settings, "scoring")}


def test_the_full_setting_has_the_activation_cures_where_they_help():
    """Not vacuous: the cures left out above are candidates here, and the training pass gets them."""
    preset, precision = SETTINGS["full, adamw_torch"]
    settings = {**preset.to_dict(), "precision": precision}
    assert {"checkpointing", "batch", "completion"} <= {c.kind for c in candidate_changes(settings)}
    assert [c.kind for c in ordered_changes(settings, "backward")][:3] == ["checkpointing", "batch", "completion"]
    assert [c.kind for c in ordered_changes(settings, "scoring")][:2] == ["batch", "completion"]
    assert [c.kind for c in ordered_changes(settings, "optimizer")][0] == "optim"


def test_beta_zero_is_offered_for_a_lora_run_only_where_it_helps_scoring():
    """With PEFT the reference is the base model with the adapters off: beta = 0 skips its pass, nothing else."""
    preset, precision = SETTINGS["laptop-16gb, beta 0.04"]
    settings = {**preset.to_dict(), "precision": precision}
    offered = {phase for phase in PHASES if "beta" in {c.kind for c in ordered_changes(settings, phase)}}
    assert offered == {"scoring"}


def _est(**overrides):
    settings = dict(per_device_train_batch_size=8, gradient_accumulation_steps=4, num_generations=8,
                    max_prompt_length=256, max_completion_length=512, optim="adamw_bnb_8bit", beta=0.04,
                    gradient_checkpointing=True, precision="bf16")
    settings.update(overrides)
    method = settings.pop("method", "lora")
    return estimate(settings.pop("model", "Qwen/Qwen2.5-1.5B-Instruct"), method, **settings)


def test_scoring_is_a_no_grad_forward_of_the_per_device_batch():
    est = _est()
    persistent = est.bytes["weights"] + est.bytes["reference"] + est.bytes["optimizer"]
    scoring = scoring_memory(est)
    # TRL switches checkpointing off and runs no_grad: checkpointing changes nothing
    assert scoring_memory(_est(gradient_checkpointing=False)) == scoring
    # the generation batch (8 x 4 or 8 x 2 sequences) is scored per_device_train_batch_size sequences at a time
    assert scoring_memory(_est(gradient_accumulation_steps=2)) == scoring
    # a generation every 2 of 4 micro-batches starts mid-accumulation: the gradients of the first two are alive
    assert scoring_memory(_est(steps_per_generation=2)) == scoring + est.bytes["gradients"]
    assert scoring_memory(_est(per_device_train_batch_size=16)) > scoring
    assert scoring_memory(_est(max_completion_length=256)) < scoring
    # no saved activations: far below the training pass without checkpointing
    assert persistent < scoring < _est(gradient_checkpointing=False).bytes["training_phase"]
    # beta = 0 with aligned steps: TRL runs no forward pass in scoring (rewards only)
    unscored = _est(beta=0.0)
    assert scoring_memory(unscored) == unscored.bytes["weights"] + unscored.bytes["optimizer"]
    # samples that may be stale (accumulation 4, a generation every 3 micro-batches): the policy's old log-probs,
    # with the gradients of earlier micro-batches alive (a generation starts mid-accumulation)
    stale = _est(beta=0.0, per_device_train_batch_size=8, steps_per_generation=3)
    assert scoring_memory(stale) > stale.bytes["weights"] + stale.bytes["optimizer"] + stale.bytes["gradients"]


def _step_temporaries(kind: str) -> tuple[int, int]:
    """Return (peak bytes a second AdamW step allocates, bytes of the gradients), measured on a real model here."""
    from bench.fake_tensors import LiveBytes

    class Allocated(LiveBytes):  # every storage an op creates, counted while alive; .item() reads real values
        def _masked(self, func, args):
            return None

    torch.manual_seed(0)
    params = list(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 64)).parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-3, **{kind: True})
    optimizer.step()  # the first step creates the states
    with Allocated() as live:
        live.phase = "step"
        optimizer.step()
    return live.peaks.get("step", (0,))[0], sum(p.grad.numel() * p.grad.element_size() for p in params)


def test_the_optimizer_step_adds_what_torchs_adamw_allocates_and_no_activations():
    # measured: torch's foreach AdamW holds one moment-sized temporary (exp_avg_sq's square root), the fused one none
    (foreach, gradients), (fused, _) = _step_temporaries("foreach"), _step_temporaries("fused")
    assert (foreach, fused) == (gradients, 0)
    # the doctor counts that temporary for adamw_torch on CUDA (foreach is torch's default there), not on a CPU
    est = _est(method="full", optim="adamw_torch", beta=0.04)
    step = optimizer_step_memory(est, optim="adamw_torch")
    assert step - optimizer_step_memory(est, optim="adamw_torch_fused") == est.bytes["gradients"]
    on_cpu = _est(method="full", optim="adamw_torch", beta=0.04, device="cpu")
    assert optimizer_step_memory(on_cpu, optim="adamw_torch") == optimizer_step_memory(on_cpu, optim="adamw_torch_fused")
    # the activations are freed before the step: checkpointing, the per-device batch and the length change nothing
    assert step < est.bytes["training_phase"] + est.bytes["gradients"]
    for changed in (dict(gradient_checkpointing=False), dict(per_device_train_batch_size=2),
                    dict(max_completion_length=128)):
        assert optimizer_step_memory(_est(method="full", optim="adamw_torch", beta=0.04, **changed),
                                     optim="adamw_torch") == step


def test_phase_memory_passes_prepare_model_for_kbit_training_through():
    settings = {**PRESETS["qlora-3b"].to_dict(), "precision": "fp16", "beta": 0.04}
    upcast = {**settings, "prepare_model_for_kbit_training": True}
    for phase in ("generation", "scoring", "forward"):  # fp32 hidden states cost more in every activation phase
        assert phase_memory(upcast, phase) > phase_memory(settings, phase), phase


def test_the_advice_texts_follow_trl():
    laptop = {**PRESETS["laptop-16gb"].to_dict(), "optim": "adamw_torch"}
    kinds = {c.kind: c for c in candidate_changes(laptop)}
    assert "not 8 (fp32 moments) or 4 (bf16 moments)" in kinds["optim"].why
    assert "4 bits" in kinds["method"].why and "unless prepare_model_for_kbit_training=True" in kinds["method"].why
    advice = non_finite_advice("the logged entropy", precision="fp16", step=3)
    first, fp32, bf16 = (advice.index(s) for s in ("method='qlora' with prepare_model_for_kbit_training=True",
                                                   "precision='fp32'", "bf16"))
    assert first < fp32 < bf16 and "65,504" in advice


def test_settings_from_trainer_reads_peft_upcast_and_num_iterations():
    """A QLoRA model whose embeddings are fp32 under fp16 went through prepare_model_for_kbit_training."""
    from types import SimpleNamespace

    import torch

    from labkit.training import settings_from_trainer

    args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=2,
                           num_generations=4, world_size=1, max_completion_length=256, optim="paged_adamw_8bit",
                           activation_checkpointing=True, beta=0.0, fp16=True, bf16=False, num_iterations=2)
    for dtype, upcast in ((torch.float32, True), (torch.float16, False)):
        embeddings = torch.nn.Embedding(8, 4).to(dtype)
        model = SimpleNamespace(is_loaded_in_4bit=True, get_input_embeddings=lambda e=embeddings: e,
                                config=SimpleNamespace(_name_or_path="Qwen/Qwen2.5-3B-Instruct"))
        settings = settings_from_trainer(SimpleNamespace(args=args, model=model))
        assert settings["method"] == "qlora" and settings["num_iterations"] == 2
        assert settings["prepare_model_for_kbit_training"] is upcast


def test_notebook_04s_symptom_table_and_the_doctor_agree():
    """Each OOM row of notebook 04's table names what the doctor offers for that phase, and what it says will not
    help is what the doctor never offers there (a learner reads the table, the doctor prints the advice)."""
    import json
    from pathlib import Path

    cells = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / "04_lora_grpo_16gb.ipynb").read_text())
    table = next("".join(c["source"]) for c in cells["cells"] if "| OOM in **generation**" in "".join(c["source"]))
    rows = {phase: next(line for line in table.splitlines() if line.startswith("| OOM") and f"**{phase}**" in line)
            for phase in PHASES}
    words = {"checkpointing": "gradient checkpointing", "batch": "per_device_train_batch_size",
             "completion": "max_completion_length", "optim": "8-bit AdamW", "generation_batch": "steps_per_generation"}
    full = SETTINGS["full, adamw_torch"][0]
    laptop = PRESETS["laptop-16gb"].replace(activation_checkpointing=False, optim="adamw_torch", beta=0.04)
    for phase, row in rows.items():
        fix = row.split(" | ")[-1]
        offered = {c.kind for preset in (full, laptop)
                   for c in ordered_changes({**preset.to_dict(), "precision": "bf16"}, phase)}
        for kind, word in words.items():
            if kind in offered:
                assert word in fix and f"not {word}" not in fix, (phase, kind, fix)
            elif f"not {word}" not in fix:
                assert word not in fix.split(";")[0], (phase, kind, "first advice not offered by the doctor")
        for kind, word in words.items():
            if f"not {word}" in fix:
                assert kind not in offered, (phase, kind)


def test_scoring_runs_the_policy_under_vllm_importance_sampling():
    """TRL 1.16 computes the old log-probs whenever vLLM generates with its importance-sampling correction (the
    default), even when the samples are fresh (trl/trainer/grpo_trainer.py, lines 2642-2645)."""
    settings = {**PRESETS["laptop-16gb"].to_dict(), "precision": "bf16"}
    quiet = phase_memory(settings, "scoring")
    assert phase_memory({**settings, "use_vllm": True}, "scoring") > quiet
    assert phase_memory({**settings, "use_vllm": True, "vllm_importance_sampling_correction": False},
                        "scoring") == quiet


@pytest.mark.parametrize("rounds", [3, None])
def test_the_doctor_weighs_a_tool_recipes_generation_with_its_tool_rounds(rounds):
    """Review low (issue 54): the doctor's phase model left the tool rounds out (tools-16gb's generation 4.97 GiB in the
    doctor, 8.14 in preflight). Both now read them; None is TRL's "no limit" (sys.maxsize), at least one round, where
    preflight counted it as none."""
    preset = PRESETS["tools-16gb"].replace(max_tool_calling_iterations=rounds)
    without = PRESETS["tools-16gb"].replace(environment=None, max_tool_calling_iterations=None)
    doctor = phase_memory(preset.to_dict(), "generation")
    assert doctor == _estimate(resolve_plan(preset)).bytes["generation_phase"]
    assert doctor > phase_memory(without.to_dict(), "generation") * 1.3  # a round prefills prompt + reply + tool turn


def test_the_report_wraps_between_words_at_100_characters():
    """JupyterLab's output area breaks a long printed line mid-word ("fp3 / 2 moments", seen in notebook 04's
    section 8): the report wraps itself, a numbered change's lines under its text, no word cut."""
    from labkit.oom import Change, OOMReport

    why = ("generate half the completions at once (KV cache of the generation batch halves); the same "
           "num_generations per prompt, fewer prompts per generation batch")
    report = OOMReport(step=3, max_steps=16, phase="generation", error="x", tried_gib=1.0, allocated_gib=10.0,
                       reserved_gib=12.0, peak_allocated_gib=11.0, total_gib=15.7,
                       changes=[Change("generation", {"steps_per_generation": 4}, {}, why)],
                       checkpoint="runs/04_cpu-smollm2-20261203-220017/checkpoint-16", output_dir="runs/x", notes=[])
    text = str(report)
    assert max(len(line) for line in text.splitlines()) <= 100, text
    assert why.split() == " ".join(text.split("1. steps_per_generation (default) -> 4: ")[1].split()).split(
        " Reserved")[0].split(), text  # every word of the change, whole and in order
    change = text.splitlines()[text.splitlines().index(next(l for l in text.splitlines() if "1. " in l)) + 1]
    assert change.startswith(" " * 5) and not change.startswith(" " * 6), text  # under the change's text


def test_one_ranking_serves_preflight_and_the_doctor():
    """labkit.oom.fitting_changes: the biggest cut first and another model last, or the phase's order; only cuts
    larger than min_cut; every candidate, unmeasured, when the recipe itself cannot be estimated."""
    from labkit.oom import fitting_changes

    settings = {**PRESETS["laptop-16gb"].replace(optim="adamw_torch", beta=0.04).to_dict(), "precision": "bf16"}
    cuts = {"model": 9.0, "optim": 2.0, "completion": 1.0, "beta": 0.005}  # GiB each change saves; others nothing

    def memory(change):
        return 10.0 - (cuts.get(change.kind, 0.0) if change else 0.0)

    ranked = fitting_changes(settings, memory, min_cut=0.01)
    assert [(c.kind, after) for c, after in ranked] == [("optim", 8.0), ("completion", 9.0), ("model", 1.0)]
    phase = fitting_changes(settings, memory, order=["completion", "beta", "optim"])
    assert [c.kind for c, _ in phase] == ["completion", "beta", "optim"]  # the order given, every cut kept
    unknown = fitting_changes(settings, lambda change: None, order=["completion", "optim"])
    assert [(c.kind, after) for c, after in unknown] == [("completion", None), ("optim", None)]
    # preflight ranks with it: the laptop recipe with fp32 AdamW moments on a quarter of a T4 offers 8-bit AdamW
    report = preflight(PRESETS["laptop-16gb"].replace(optim="adamw_torch", beta=0.04), card_gib=CARDS["t4"].gib / 4)
    kinds, afters = [c.kind for c, _ in report.changes], [after for c, after in report.changes if c.kind != "model"]
    assert "optim" in kinds and afters == sorted(afters) and kinds[len(afters):] in ([], ["model"])
