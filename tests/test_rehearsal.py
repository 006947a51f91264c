"""The rehearsal (bench.rehearse, bench.fake_tensors) counts what it claims, and the estimator stays within +-10 % of it.

Fast rows rehearse every GPU preset at full width, vocabulary, batch and lengths but two decoder layers
(against the estimate of the same two-layer model); the slow rows rehearse the presets at full depth.
"""

import csv
from pathlib import Path

import pytest
import torch

from labkit.oom import estimate
from labkit.presets import PRESETS
from labkit.presets import resolve_plan as resolve
from bench.fake_tensors import EMULATED, LiveBytes
from bench.rehearse import rehearse

GPU_PRESETS = sorted(name for name, p in PRESETS.items() if p.card_gib is not None)


def test_live_bytes_counts_each_storage_once_and_frees_it():
    from torch._subclasses.fake_tensor import FakeTensorMode

    tracker = LiveBytes()
    with FakeTensorMode(), tracker:
        tracker.start("a", "activations")
        x = torch.empty(1000, 1000)  # 4 MB
        view, alias = x[10:], x.view(-1)  # same storage: counted once
        assert tracker.current == 4_000_000
        y = x * 2
        assert tracker.current == 8_000_000
        del x, view, alias
        assert tracker.current == 8_000_000 - 4_000_000
        del y
        assert tracker.current == 0
    assert tracker.peaks["a"][0] == 8_000_000


def test_dropout_keeps_a_bool_mask_and_the_fused_head_is_compact_only_inside_the_rehearsal():
    import trl.trainer.utils as trl_utils

    from bench.fake_tensors import cuda_behaviours

    assert not trl_utils._use_triton(torch.device("cpu"))
    with cuda_behaviours():
        assert trl_utils._use_triton(torch.device("cpu"))
        drop = torch.nn.Dropout(0.1).train()
        x = torch.randn(64, requires_grad=True)
        out = drop(x)
        assert out.grad_fn.name() == "NativeDropoutBackward0"
    assert not trl_utils._use_triton(torch.device("cpu"))
    assert torch.nn.functional.scaled_dot_product_attention.__name__ == "scaled_dot_product_attention"


def test_every_emulation_cites_a_library_line_and_nothing_rehearsed_reads_as_measured():
    for what, where in EMULATED:
        assert ".py:" in where, what
    # what a rehearsal prints, and every row the lab recorded (python -m bench rehearsal), say fake tensors, never measured
    report = rehearse(resolve("colab-t4"), num_layers=1, generation=False, optimizer_steps=1).report()
    assert report.startswith("rehearsed (fake tensors): colab-t4") and "measured" not in report
    assert "the CUDA context" in report and "fragmentation" in report  # what a card adds, named as not counted
    rows = list(csv.DictReader((Path(__file__).resolve().parents[1] / "results" / "rehearsal.csv").open()))
    assert rows and all("fake tensors" in r["figure"] and "measured" not in r["figure"] for r in rows)


def test_the_plan_decides_the_precision_from_the_card():
    assert resolve("laptop-16gb").precision == "bf16"
    assert resolve("colab-t4").precision == "fp16"  # a T4 has no bf16
    assert resolve("colab-t4").weight_dtype == torch.float16
    assert resolve("qlora-3b").adapter_dtype == torch.bfloat16
    assert resolve("qlora-3b", precision="fp16").adapter_dtype == torch.float32


def _ratios(name, num_layers):
    plan = resolve(name)
    result = rehearse(plan, num_layers=num_layers)
    est = estimate(plan, num_layers=num_layers)
    training = max(result.phases[p]["peak"] for p in ("training", "optimizer"))
    return (est.bytes["total"] / result.peak, est.bytes["generation_phase"] / result.phases["generation"]["peak"],
            est.bytes["training_phase"] / training)


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_estimator_within_10_percent_of_the_rehearsal_two_layers(name):
    total, generation, training = _ratios(name, num_layers=2)
    assert 0.9 <= total <= 1.1, (name, total)
    assert 0.9 <= generation <= 1.1, (name, "generation", generation)
    assert 0.9 <= training <= 1.1, (name, "training", training)


@pytest.mark.slow
@pytest.mark.parametrize("name", GPU_PRESETS)
def test_estimator_within_10_percent_of_the_rehearsal_full_depth(name):
    total, generation, training = _ratios(name, num_layers=None)
    assert 0.9 <= total <= 1.1, (name, total)
    assert 0.9 <= generation <= 1.1, (name, "generation", generation)
    assert 0.9 <= training <= 1.1, (name, "training", training)


def test_the_generation_phase_is_the_larger_of_prefill_and_the_end_of_decoding_not_their_sum():
    """The prefill's working set is freed before the KV cache reaches its full length (the rehearsal showed the sum
    1.32x too high at per_device_train_batch_size=16): while the prefill is the larger moment, longer completions
    leave the generation phase unchanged; once decoding's full-length cache is larger, they grow it."""
    from labkit.memory import estimate as memory_estimate

    def generation(completion):
        return memory_estimate("Qwen/Qwen2.5-1.5B-Instruct", "lora", per_device_train_batch_size=16,
                               gradient_accumulation_steps=4, max_prompt_length=256, max_completion_length=completion,
                               optim="adamw_bnb_8bit").bytes["generation_phase"]

    assert generation(64) == generation(128)  # the prefill (its fp32 LoRA casts, the MLP's working set) is larger
    assert generation(4096) > generation(2048) > generation(128)  # the full-length KV cache is larger


@pytest.mark.parametrize("batch", [4, 16])
def test_estimator_follows_the_rehearsed_generation_phase_at_large_batches_two_layers(batch):
    plan = resolve("laptop-16gb", per_device_train_batch_size=batch)
    result = rehearse(plan, num_layers=2)
    ratio = estimate(plan, num_layers=2).bytes["generation_phase"] / result.phases["generation"]["peak"]
    assert 0.9 <= ratio <= 1.1, (batch, ratio)


def test_the_rehearsal_runs_a_tool_recipes_rounds_as_trl_does_two_layers():
    """Each tool round is rehearsed as a new generate call over prompt + completion, asking max_completion_length new
    tokens: the generation phase of tools-16gb is a round's, larger than the same step's without the tool."""
    tools = resolve("tools-16gb")
    with_rounds = rehearse(tools, num_layers=2, optimizer_steps=1)
    first_turn = rehearse(resolve("tools-16gb", environment=None, max_tool_calling_iterations=None), num_layers=2,
                          optimizer_steps=1)
    assert with_rounds.settings["max_tool_calling_iterations"] == 3
    assert with_rounds.phases["generation"]["peak"] > 1.5 * first_turn.phases["generation"]["peak"]
    assert any("3 tool round(s)" in note and "1152 + 704 tokens" in note for note in with_rounds.notes)
    ratio = estimate(tools, num_layers=2).bytes["generation_phase"] / with_rounds.phases["generation"]["peak"]
    assert 0.9 <= ratio <= 1.1, ratio


def test_rehearse_command_refuses_bad_input_before_building_anything(capsys):
    from bench.rehearse import main

    assert main(["--preset", "no-such-preset"]) == 2
    assert "unknown preset" in capsys.readouterr().err
    assert main(["--preset", "cpu-tiny"]) == 2  # a CPU preset: nothing to rehearse on a card
    assert "--set card=rtx3080-laptop-16gb" in capsys.readouterr().err
    assert main(["--preset", "laptop-16gb", "--set", "per_device_train_batch_size"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
