"""labkit.memory: the estimator against exact measurements on CPU, its properties, its commands."""
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.device import CARDS
from labkit.cli import estimate_cli
from labkit.monitor import saved_activation_bytes, state_bytes
from labkit.memory import GIB, estimate
from labkit.models import ARCHITECTURES, build_tiny_model, load_policy, lora_config
from labkit.memory import model_shape

LORA_RANK = 4


def _one_adamw_step(model, optimizer_name="adamw"):
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer_name == "adamw":
        optimizer = torch.optim.AdamW(params, lr=1e-3)
    else:
        import bitsandbytes as bnb

        optimizer = bnb.optim.AdamW8bit(params, lr=1e-3)
    input_ids = torch.randint(0, 200, (2, 12))
    model(input_ids=input_ids, labels=input_ids).loss.backward()
    optimizer.step()
    return optimizer


# ----------------------------------------------------------------------------- exact terms


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("method", ["full", "lora"])
def test_weights_gradients_and_adamw_states_equal_the_measured_bytes(arch, method):
    path = build_tiny_model(arch)
    model, _ = load_policy(path, method, peft_config=lora_config(LORA_RANK))
    optimizer = _one_adamw_step(model)
    measured = state_bytes(model, optimizer)
    est = estimate(path, method, precision="fp32", device="cpu", lora_rank=LORA_RANK)
    assert measured["weights"] == est.bytes["weights"]
    assert measured["gradients"] == est.bytes["gradients"] > 0
    assert measured["optimizer"] == est.bytes["optimizer"] > 0


@pytest.mark.parametrize("method", ["full", "lora"])
def test_8bit_adamw_states_equal_the_measured_bytes(tiny_model_path, method):
    pytest.importorskip("bitsandbytes")
    # rank 64: adapters big enough for 8-bit states
    model, _ = load_policy(tiny_model_path, method, peft_config=lora_config(64))
    measured = state_bytes(model, _one_adamw_step(model, "adamw_8bit"))
    est = estimate(tiny_model_path, method, precision="fp32", device="cpu", lora_rank=64, optim="adamw_8bit")
    assert measured["optimizer"] == est.bytes["optimizer"]
    assert est.bytes["optimizer"] < estimate(tiny_model_path, method, precision="fp32", device="cpu",
                                             lora_rank=64).bytes["optimizer"] / 2


def test_lora_trains_a_small_fraction_and_keeps_the_base_weights(tiny_model_path):
    full = estimate(tiny_model_path, "full", precision="fp32", device="cpu")
    lora = estimate(tiny_model_path, "lora", precision="fp32", device="cpu", lora_rank=LORA_RANK)
    assert lora.trainable_params < full.trainable_params / 5
    assert lora.bytes["weights"] > full.bytes["weights"]  # the base plus the adapters
    assert lora.bytes["gradients"] * 5 < full.bytes["gradients"]


# ----------------------------------------------------------------------------- activations


def _tiny_config(model_type, layers):
    from transformers import AutoConfig

    extra = {"head_dim": 24} if model_type == "qwen3" else {}
    return AutoConfig.for_model(model_type, vocab_size=300, hidden_size=64, intermediate_size=160,
                                num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                tie_word_embeddings=True, max_position_embeddings=512, **extra)


def _saved_by_layers(model_type, layers, method, precision, padded, batch=2, seq=24):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    # full fine-tuning keeps fp32 master weights under bf16 autocast (labkit.device.torch_dtype); LoRA a bf16 base
    dtype = torch.bfloat16 if precision == "bf16" and method != "full" else torch.float32
    model = AutoModelForCausalLM.from_config(_tiny_config(model_type, layers), dtype=dtype)
    if method == "lora":
        model = get_peft_model(model, lora_config(LORA_RANK))
    body = model.get_base_model().model if method == "lora" else model.model
    model.train()
    input_ids = torch.randint(0, 300, (batch, seq))
    attention_mask = torch.ones_like(input_ids)
    if padded:
        attention_mask[0, :3] = 0

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            return body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return saved_activation_bytes(forward, model)


@pytest.mark.parametrize("model_type", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("method, precision, padded", [
    ("full", "fp32", False), ("full", "bf16", True), ("lora", "fp32", True), ("lora", "bf16", False),
])
def test_activations_of_one_layer_equal_what_autograd_keeps(model_type, method, precision, padded):
    batch, seq = 2, 24
    one_layer = (_saved_by_layers(model_type, 3, method, precision, padded, batch, seq)
                 - _saved_by_layers(model_type, 2, method, precision, padded, batch, seq))

    def activations(layers):
        return estimate(_tiny_config(model_type, layers), method, per_device_train_batch_size=batch,
                        num_generations=batch, max_prompt_length=seq - 8, max_completion_length=8,
                        precision=precision, device="cpu", lora_rank=LORA_RANK,
                        gradient_checkpointing=False, padded=padded).bytes["activations"]

    assert activations(3) - activations(2) == one_layer


def test_activations_of_the_whole_body_match_autograd(tiny_model_path):
    model, _ = load_policy(tiny_model_path, "full")
    model.train()
    input_ids = torch.randint(0, 200, (4, 32))
    measured = saved_activation_bytes(
        lambda: model.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).last_hidden_state, model)
    est = estimate(tiny_model_path, "full", per_device_train_batch_size=4, num_generations=4, max_prompt_length=20,
                   max_completion_length=12, precision="fp32",
                   device="cpu", gradient_checkpointing=False)
    assert est.bytes["activations"] == measured


def test_checkpointing_keeps_one_hidden_state_per_layer():
    on = estimate("Qwen/Qwen2.5-1.5B-Instruct", "lora", gradient_checkpointing=True)
    off = estimate("Qwen/Qwen2.5-1.5B-Instruct", "lora", gradient_checkpointing=False)
    assert on.bytes["activations"] * 5 < off.bytes["activations"]


# ----------------------------------------------------------------------------- TRL's rules


def test_reference_model_only_with_beta_and_full_fine_tuning():
    name = "Qwen/Qwen2.5-0.5B-Instruct"
    assert estimate(name, "full", beta=0.0).bytes["reference"] == 0  # TRL's default: no reference model
    with_ref = estimate(name, "full", beta=0.04)
    assert with_ref.bytes["reference"] == with_ref.bytes["weights"]
    assert estimate(name, "lora", beta=0.04).bytes["reference"] == 0  # PEFT: no copy of the base (at most a "ref" adapter)


def test_qlora_stores_linear_weights_in_about_half_a_byte():
    shape = model_shape("Qwen/Qwen2.5-7B-Instruct")
    lora = estimate(shape.name, "lora", lora_rank=LORA_RANK)
    other = shape.params - shape.quantisable_params  # embeddings, norms, the untied LM head
    # TRL's QLoRA keeps them in the training precision (bf16: 2 bytes); PEFT's prepare_model_for_kbit_training
    # turns them into fp32 (4 bytes): 4.4 GB of Qwen2.5-7B's weights then
    for upcast, other_bytes in ((False, 2), (True, 4)):
        qlora = estimate(shape.name, "qlora", lora_rank=LORA_RANK, prepare_model_for_kbit_training=upcast)
        adapters = qlora.trainable_params * 2  # bf16 adapters under bf16: TRL casts them (labkit.models.adapter_dtype)
        linear_bytes = qlora.bytes["weights"] - adapters - other * other_bytes
        assert 0.5 < linear_bytes / shape.quantisable_params < 0.52
        assert qlora.bytes["weights"] < lora.bytes["weights"] / (1.9 if upcast else 2.6)
    with pytest.raises(ValueError, match="qlora"):
        estimate(shape.name, "lora", prepare_model_for_kbit_training=True)


def test_full_fine_tuning_keeps_fp32_master_weights_by_default():
    fp16 = estimate("Qwen/Qwen2.5-0.5B-Instruct", "full", precision="fp16")
    bf16 = estimate("Qwen/Qwen2.5-0.5B-Instruct", "full", precision="bf16")
    pure = estimate("Qwen/Qwen2.5-0.5B-Instruct", "full", precision="bf16", fp32_master_weights=False)
    # the recipe that learns: fp32 weights, gradients and AdamW moments under 16-bit autocast, 16 bytes a parameter,
    # in both precisions; pure bf16 (8 bytes) only when asked for, as a memory-only figure
    per_param = lambda e: sum(e.bytes[k] for k in ("weights", "gradients", "optimizer")) / e.total_params
    assert round(per_param(bf16), 3) == 16.0 == round(per_param(fp16), 3) and round(per_param(pure), 3) == 8.0
    assert bf16.bytes == fp16.bytes and bf16.settings["fp32_master_weights"] is True
    assert pure.settings["fp32_master_weights"] is False and pure.total < bf16.total


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="method"):
        estimate("Qwen/Qwen2.5-0.5B-Instruct", "dora")
    with pytest.raises(ValueError, match="multiple of num_generations"):
        estimate("Qwen/Qwen2.5-0.5B-Instruct", "lora", num_generations=3, gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match="cannot both be set"):
        estimate("Qwen/Qwen2.5-0.5B-Instruct", "lora", steps_per_generation=2, generation_batch_size=16)
    with pytest.raises(TypeError, match="per_device_batch.*renamed per_device_train_batch_size"):
        estimate("Qwen/Qwen2.5-0.5B-Instruct", "lora", per_device_batch=1)
    with pytest.raises(KeyError, match="catalogue"):
        estimate("gpt-5", "lora")
    for rounds in (-1, None, 1.5, True):
        with pytest.raises(ValueError, match="max_tool_calling_iterations must be a whole number"):
            estimate("Qwen/Qwen2.5-0.5B-Instruct", "lora", max_tool_calling_iterations=rounds)


def test_a_tool_round_is_a_second_generate_call_over_prompt_and_completion():
    """TRL 1.16's _tool_call_loop generates again on prompt + completion so far + tool turn (up to P + C tokens,
    prefilled from scratch) and asks C new tokens again: a round's generation is a first turn whose prompt is P + C
    long, its cache growing toward P + 2C, for the whole generation batch; every round has that worst case, and the
    training pass (P + C tokens) does not change."""
    knobs = dict(per_device_train_batch_size=8, gradient_accumulation_steps=4, max_prompt_length=448,
                 max_completion_length=704, optim="adamw_bnb_8bit")
    no_tool = estimate("Qwen/Qwen2.5-1.5B-Instruct", "lora", **knobs)
    one, three = (estimate("Qwen/Qwen2.5-1.5B-Instruct", "lora", max_tool_calling_iterations=n, **knobs) for n in (1, 3))
    as_a_long_prompt = estimate("Qwen/Qwen2.5-1.5B-Instruct", "lora", **{**knobs, "max_prompt_length": 448 + 704})
    assert one.bytes["generation_phase"] == three.bytes["generation_phase"] == as_a_long_prompt.bytes["generation_phase"]
    assert three.bytes["generation_phase"] > 1.5 * no_tool.bytes["generation_phase"]
    assert three.bytes["training_phase"] == no_tool.bytes["training_phase"]
    assert three.settings["generation_tokens"] == 448 + 2 * 704 and no_tool.settings["generation_tokens"] == 448 + 704
    assert "tool rounds: up to 1856 tokens" in three.table() and "tool rounds" not in no_tool.table()


# ----------------------------------------------------------------------------- TRL's batch units


@pytest.mark.parametrize("batch, accumulation, steps, generation_batch_size, generations", [
    (1, 4, None, None, 4), (8, 1, None, None, 8), (4, 2, None, None, 4), (4, 4, 2, None, 8), (2, 4, None, 4, 2),
    (16, 1, None, None, 8), (2, 2, 4, None, 8),
])
def test_generation_batch_is_what_grpo_config_resolves(tmp_path, batch, accumulation, steps, generation_batch_size,
                                                       generations):
    from trl import GRPOConfig

    from labkit.memory import generation_batch

    config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=batch,
                        gradient_accumulation_steps=accumulation, steps_per_generation=steps,
                        generation_batch_size=generation_batch_size, num_generations=generations)
    spg, per_device = generation_batch(batch, accumulation, steps, generation_batch_size, generations)
    assert spg == config.steps_per_generation
    assert per_device == config.generation_batch_size  # one process: the global figure is the device's


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct"])
@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_num_generations_changes_no_memory_at_a_fixed_batch(model, method):
    """TRL 1.16: the generation batch is per_device_train_batch_size x steps_per_generation; G only groups it."""
    fixed = dict(per_device_train_batch_size=8, gradient_accumulation_steps=2)
    estimates = [estimate(model, method, num_generations=g, **fixed).bytes for g in (2, 4, 8, 16)]
    assert all(e == estimates[0] for e in estimates)


def test_the_batch_knobs_change_what_they_multiply():
    model = "Qwen/Qwen2.5-1.5B-Instruct"
    base = estimate(model, "lora", per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4)
    # half the per-device batch, twice the accumulation: the same generation batch (KV cache), half the activations
    halved = estimate(model, "lora", per_device_train_batch_size=2, gradient_accumulation_steps=4, num_generations=4)
    assert halved.bytes["kv_cache"] == base.bytes["kv_cache"] and halved.settings["generation_batch"] == 8
    assert halved.bytes["activations"] < base.bytes["activations"]
    # fewer steps per generation: a smaller generation batch (KV cache), the same training pass
    fewer = estimate(model, "lora", per_device_train_batch_size=4, gradient_accumulation_steps=2,
                     steps_per_generation=1, num_generations=4)
    assert fewer.bytes["kv_cache"] < base.bytes["kv_cache"]
    assert fewer.bytes["activations"] == base.bytes["activations"] and fewer.bytes["logits"] == base.bytes["logits"]
    # generation_batch_size says the same as steps_per_generation, in completions
    assert estimate(model, "lora", per_device_train_batch_size=4, gradient_accumulation_steps=2,
                    generation_batch_size=4, num_generations=4).bytes == fewer.bytes


# ----------------------------------------------------------------------------- properties

_BASE = dict(num_generations=2, per_device_train_batch_size=4, max_prompt_length=64, max_completion_length=128,
             lora_rank=8)
_KNOBS = {
    "per_device_train_batch_size": st.sampled_from([2, 4, 6, 8, 16]),
    "steps_per_generation": st.integers(1, 8),
    "max_prompt_length": st.integers(0, 2048),
    "max_completion_length": st.integers(1, 4096),
    "lora_rank": st.integers(1, 256),
}


@settings(max_examples=60, deadline=None)
@given(knob=st.sampled_from(sorted(_KNOBS)), data=st.data(),
       model=st.sampled_from(sorted(ARCHITECTURES)), method=st.sampled_from(["full", "lora", "qlora"]),
       checkpointing=st.booleans(), optimizer=st.sampled_from(["adamw", "adamw_8bit"]),
       device=st.sampled_from(["cuda", "cpu"]), beta=st.sampled_from([0.0, 0.04]))
def test_estimate_grows_with_every_size_knob(knob, data, model, method, checkpointing, optimizer, device, beta):
    small, large = sorted((data.draw(_KNOBS[knob], label="one"), data.draw(_KNOBS[knob], label="other")))
    common = dict(_BASE, gradient_checkpointing=checkpointing, optim=optimizer, device=device, beta=beta)
    a = estimate(model, method, **{**common, knob: small})
    b = estimate(model, method, **{**common, knob: large})
    for term in ("total", "activations", "logits", "optimizer", "gradients"):
        assert b.bytes[term] >= a.bytes[term], (term, knob, small, large)
    # Generation's own share grows; kv_cache alone need not: LoRA's fp32 input casts are counted in transients when
    # the prefill is the larger moment, so a longer prompt that moves the peak to the prefill can shrink kv_cache
    # while kv_cache + transients grows (Llama-3.2-3B, LoRA, max_prompt_length 58 -> 149, hypothesis found it)
    assert (b.bytes["kv_cache"] + b.bytes["transients"] >= a.bytes["kv_cache"] + a.bytes["transients"]), (knob, small, large)


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(sorted(ARCHITECTURES)), method=st.sampled_from(["full", "lora", "qlora"]),
       num_generations=st.sampled_from([2, 4, 8, 16]), completion_len=st.integers(16, 2048))
def test_memory_savers_never_cost_memory(model, method, num_generations, completion_len):
    kwargs = dict(per_device_train_batch_size=num_generations, num_generations=num_generations,
                  max_completion_length=completion_len, max_prompt_length=128)
    base = estimate(model, method, gradient_checkpointing=False, optim="adamw", **kwargs)
    assert estimate(model, method, gradient_checkpointing=True, **kwargs).total <= base.total
    assert estimate(model, method, gradient_checkpointing=False, optim="adamw_8bit", **kwargs).total <= base.total
    if method != "full":  # a trainable head adds TRL's fp32 (V, h) accumulator, which can outweigh short logits
        assert estimate(model, method, gradient_checkpointing=False, logits="full", **kwargs).total >= base.total
    if method == "full":  # LoRA saves weights-sized terms (its activations are larger: dropout masks, adapter inputs)
        lora = estimate(model, "lora", gradient_checkpointing=False, **kwargs)
        assert lora.bytes["gradients"] + lora.bytes["optimizer"] < (base.bytes["gradients"]
                                                                    + base.bytes["optimizer"]) / 10


@settings(max_examples=20, deadline=None)
@given(layers=st.integers(1, 12), hidden=st.sampled_from([64, 128, 256]), extra_layers=st.integers(1, 8))
def test_estimate_grows_with_the_model(layers, hidden, extra_layers):
    from labkit.models import architecture_config

    def total(n):
        config = architecture_config("qwen2.5-0.5b", num_hidden_layers=n, hidden_size=hidden,
                                     num_attention_heads=hidden // 64, num_key_value_heads=1)
        return estimate(config, "full", num_generations=4).total

    assert total(layers + extra_layers) > total(layers)


# ----------------------------------------------------------------------------- commands


def test_estimate_cli_prints_a_table_and_json(capsys):
    assert estimate_cli(["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--method", "lora", "--num-generations", "8"]) == 0
    table = capsys.readouterr().out
    assert "activations" in table and "total" in table and "16 GB" in table
    assert estimate_cli(["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--method", "lora", "--num-generations", "8",
                         "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    expected = estimate("Qwen/Qwen2.5-1.5B-Instruct", "lora", num_generations=8).total
    assert answer["total_gib"] == pytest.approx(expected, abs=1e-3)
    assert estimate_cli(["--model", "gpt-5"]) == 2


def test_estimate_cli_reads_a_saved_model_folder(tiny_model_path, capsys):
    assert estimate_cli(["--model", str(tiny_model_path), "--json", "--precision", "fp32", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["total_gib"] * GIB > 0


def test_bench_memory_refuses_qlora_without_cuda(capsys):
    from bench.memory import main as bench_memory_cli

    assert bench_memory_cli(["--preset", "none", "--model", "qwen2.5-0.5b", "--method", "qlora", "--device", "cpu"]) == 2
    assert "CUDA" in capsys.readouterr().err


def test_bench_memory_dry_run_lists_at_least_eight_gpu_configurations(capsys):
    from bench.memory import main as bench_memory_cli

    assert bench_memory_cli(["--preset", "gpu", "--dry-run", "--device", "cpu"]) == 0  # predictions only
    lines = [line for line in capsys.readouterr().out.splitlines() if "predicted" in line]
    assert len(lines) >= 8


# ----------------------------------------------------------------------------- chunked log-probs


def test_chunked_log_probs_match_at_qwens_vocabulary():
    from labkit.objective import token_logps_from_hidden

    torch.manual_seed(0)
    vocab, hidden_size = 151_936, 32  # Qwen's vocabulary; 3 sequences x 5 tokens, the benchmark scaled down
    weight = (torch.randn(vocab, hidden_size) * 0.05).requires_grad_()
    hidden = torch.randn(3, 5, hidden_size, requires_grad=True)  # (B, T, H)
    targets = torch.randint(0, vocab, (3, 5))  # (B, T)
    weights = torch.randn(3, 5)
    results = []
    for chunk_size in (None, 4, 7):
        logps = token_logps_from_hidden(hidden, weight, targets, chunk_size=chunk_size)  # (B, T)
        grads = torch.autograd.grad((logps * weights).sum(), (hidden, weight))
        results.append((logps, *grads))
    for logps, grad_hidden, grad_weight in results[1:]:
        torch.testing.assert_close(logps, results[0][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grad_hidden, results[0][1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grad_weight, results[0][2], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- through TRL


@pytest.mark.slow
def test_trl_trainer_state_equals_the_estimate(tiny_model_path, tmp_path):
    """Two real GRPO steps: TRL's optimizer and the policy hold exactly the estimated bytes."""
    from datasets import Dataset

    from labkit.training import build_trainer, grpo_config

    model, tokenizer = load_policy(tiny_model_path, "lora", peft_config=lora_config(LORA_RANK))
    dataset = Dataset.from_dict({"prompt": ["abcdefgh"] * 8})

    def length_reward(completions, **kwargs):
        return [float(len(c)) for c in completions]

    args = grpo_config(tmp_path, max_steps=2, per_device_train_batch_size=4, num_generations=4,
                       max_completion_length=8, learning_rate=1e-3)
    trainer = build_trainer(model, [length_reward], dataset, args, tokenizer=tokenizer)
    trainer.train()
    measured = state_bytes(trainer.model, trainer.optimizer)
    est = estimate(tiny_model_path, "lora", precision="fp32", device="cpu", lora_rank=LORA_RANK)
    assert measured["weights"] == est.bytes["weights"]
    assert measured["optimizer"] == est.bytes["optimizer"]


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_qlora_hidden_states_are_in_the_dtype_the_estimator_counts(tiny_model_path, precision):
    """A real 4-bit model (bitsandbytes NF4 on the CPU) under its precision's autocast: as TRL builds it, QLoRA's
    residual stream and KV cache are in the training precision, like LoRA's; with prepare_model_for_kbit_training
    they are fp32 (fp32 norms and embeddings, 4-bit layers returning their input's dtype). The estimator must count
    that."""
    pytest.importorskip("bitsandbytes")
    from labkit.memory import adapter_bytes, hidden_state_bytes

    seen = {}
    for method, upcast in (("lora", False), ("qlora", False), ("qlora", True)):
        model, _ = load_policy(tiny_model_path, method, precision=precision, peft_config=lora_config(LORA_RANK),
                               prepare_model_for_kbit_training=upcast)
        input_ids = torch.randint(0, 200, (1, 8))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = model(input_ids=input_ids, output_hidden_states=True, use_cache=True)
        layer = out.past_key_values.layers[0]
        found = {out.hidden_states[1].dtype, out.hidden_states[-1].dtype, layer.keys.dtype, layer.values.dtype}
        assert len(found) == 1, found
        seen[method, upcast] = next(iter(found))
        assert seen[method, upcast].itemsize == hidden_state_bytes(method, precision, upcast), (method, upcast, found)
    assert seen["qlora", True] == torch.float32
    assert seen["qlora", False] == seen["lora", False] == (torch.bfloat16 if precision == "bf16" else torch.float32)
    # and the terms that hold hidden states grow with them: the upcast's KV cache is twice TRL's QLoRA's under bf16
    est = {upcast: estimate(tiny_model_path, "qlora", precision=precision, device="cpu", lora_rank=LORA_RANK,
                            prepare_model_for_kbit_training=upcast) for upcast in (False, True)}
    ratio = hidden_state_bytes("qlora", precision, True) / hidden_state_bytes("qlora", precision)
    assert est[True].bytes["kv_cache"] / est[False].bytes["kv_cache"] == pytest.approx(ratio, rel=0.35)
    assert adapter_bytes("qlora", "bf16") == 2 and adapter_bytes("qlora", "fp16") == 4 == adapter_bytes("lora", "bf16")


def test_bench_memory_refuses_a_card_that_other_processes_fill(monkeypatch, capsys):
    from bench import memory as bench_memory

    t4 = CARDS["t4"].device().as_dict()
    kinds = []

    def fake_run(kind, spec, timeout=None):  # the workers: a probe that finds a T4; anything else stops the run
        kinds.append(kind)
        if kind == "probe":
            return {"status": "ok", "device": t4}
        raise KeyboardInterrupt("stop before measuring")

    monkeypatch.setattr(bench_memory.worker, "run", fake_run)
    monkeypatch.setattr(bench_memory, "card_busy_gib", lambda index=0: 6.2)  # e.g. a notebook kernel's model
    assert bench_memory.main(["--preset", "gpu"]) == 2
    assert "already holds 6.2 GiB" in capsys.readouterr().err and kinds == ["probe"]
    monkeypatch.setattr(bench_memory, "card_busy_gib", lambda index=0: 0.4)  # an idle kernel's CUDA context
    with pytest.raises(KeyboardInterrupt):
        bench_memory.main(["--preset", "gpu"])
    assert kinds[-1] != "probe"  # a free card: it went on to build and measure


def test_notebook_05s_count_by_hand_holds_on_a_t4(repo_root):
    """Notebook 05's by-hand cell, run with a T4's precision: fp16 full fine-tuning keeps fp32 weights."""
    import json as _json

    import pandas as pd

    import labkit
    from labkit.device import choose_precision

    t4 = CARDS["t4"].device()
    precision = choose_precision(t4)
    assert precision == "fp16"
    policy = "Qwen/Qwen2.5-0.5B-Instruct"
    est = estimate(policy, "full", precision=precision)  # what load_policy holds there (fp32 masters)
    exact = pd.DataFrame([dict(method="full", term=t, measured_bytes=est.bytes[t])
                          for t in ("weights", "gradients", "optimizer")])
    cells = _json.loads((repo_root / "notebooks/05_full_vs_lora.ipynb").read_text())["cells"]
    by_hand = next("".join(c["source"]) for c in cells if "by_hand = " in "".join(c["source"]))
    exec(by_hand, {"labkit": labkit, "model_shape": model_shape, "policy": policy, "precision": precision,
                   "exact": exact, "print": lambda *a: None})
