"""The lab's foundation: device and precision, tiny models, the catalogue, GSM8K, TRL on CPU."""
import math

import pytest
import torch

from labkit.device import CARDS
from labkit import device as dev
from labkit.data import GSM8K_SIZES, gold_answer, load_gsm8k
from labkit.models import (ARCHITECTURES, build_architecture, build_tiny_model, count_parameters, load_policy,
                           lora_config, tiny_tokenizer)

T4 = CARDS["t4"].device()
A100 = CARDS["a100-80gb"].device()
CPU = dev.DeviceInfo("cpu", "x86_64 CPU (2 cores)", None, None, bf16=False, fp16=False)


# ----------------------------------------------------------------------------- device


@pytest.mark.parametrize("info, precision, flags", [
    (A100, "bf16", {"bf16": True, "fp16": False}),
    (T4, "fp16", {"bf16": False, "fp16": True}),
    (CPU, "fp32", {"bf16": False, "fp16": False}),
])
def test_precision_follows_the_device(info, precision, flags):
    assert dev.choose_precision(info) == precision
    assert dev.precision_flags(dev.choose_precision(info)) == flags


@pytest.mark.parametrize("info", [T4, CPU])
def test_bf16_is_refused_where_the_device_has_none(info):
    with pytest.raises(ValueError, match="no bf16 support"):
        dev.choose_precision(info, "bf16")


def test_this_machine_is_detected_and_never_bf16_on_cpu():
    info = dev.detect_device("cpu")
    assert info.kind == "cpu" and not info.bf16
    assert dev.precision_flags(dev.choose_precision(info)) == {"bf16": False, "fp16": False}


def test_weights_dtype_keeps_fp32_masters_for_full_fine_tuning():
    assert dev.torch_dtype("fp16", "full") == torch.float32 == dev.torch_dtype("bf16", "full")
    assert dev.torch_dtype("fp16", "lora") == torch.float16 == dev.torch_dtype("fp16", "qlora")
    assert dev.torch_dtype("bf16", "lora") == torch.bfloat16 == dev.torch_dtype("bf16", "qlora")
    assert dev.torch_dtype("fp32", "lora") == torch.float32


def test_grpo_config_takes_precision_from_the_device(tmp_path):
    from labkit.training import grpo_config

    args = grpo_config(tmp_path, device=CPU, num_generations=2, per_device_train_batch_size=2)
    assert args.bf16 is False and args.fp16 is False and args.use_cpu is True
    with pytest.raises(TypeError, match="precision="):
        grpo_config(tmp_path, device=CPU, bf16=True)


# ----------------------------------------------------------------------------- tokenizer and tiny models


@pytest.mark.parametrize("text", ["", "plain ascii", "Janet’s ducks — 16 eggs, $2 each 🦆", "<think>2+2</think>\n<answer>4</answer>"])
def test_tiny_tokenizer_round_trips_any_text(text):
    tok = tiny_tokenizer()
    assert tok.decode(tok(text)["input_ids"]) == text


def test_tiny_tokenizer_chat_template_is_chatml():
    tok = tiny_tokenizer()
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.convert_tokens_to_ids("<answer>") != tok.unk_token_id


def test_tiny_model_is_cached_and_deterministic(tiny_model_path):
    assert build_tiny_model("qwen2") == tiny_model_path  # second call reuses the folder
    a, _ = load_policy(tiny_model_path, "full")
    b, _ = load_policy(tiny_model_path, "full")
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert 50_000 < count_parameters(a)["total"] < 1_000_000


def test_lora_policy_trains_only_adapters(tiny_model_path):
    model, _ = load_policy(tiny_model_path, "lora", peft_config=lora_config(4), gradient_checkpointing=True)
    counts = count_parameters(model)
    assert 0 < counts["trainable"] < counts["total"] / 2
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_prepare_model_for_kbit_training_is_for_qlora_only(tiny_model_path):
    with pytest.raises(ValueError, match="method='qlora' only"):
        load_policy(tiny_model_path, "lora", prepare_model_for_kbit_training=True)


def test_unknown_method_is_refused(tiny_model_path):
    with pytest.raises(ValueError, match="'full', 'lora' or 'qlora'"):
        load_policy(tiny_model_path, "dora")


# ----------------------------------------------------------------------------- catalogue


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_catalogue_reproduces_published_parameter_counts(name):
    model = build_architecture(name, device="meta")
    total = count_parameters(model)["total"] / 1e9
    assert math.isclose(total, ARCHITECTURES[name]["params_b"], rel_tol=0.005), (name, total)


def test_catalogue_short_names_and_unknown_names():
    assert build_architecture("qwen2.5-0.5b").config.hidden_size == 896
    with pytest.raises(KeyError, match="catalogue has"):
        build_architecture("gpt-5")


def test_random_architecture_is_saved_with_the_byte_tokenizer(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.preset import save_random_architecture

    path = save_random_architecture("HuggingFaceTB/SmolLM2-135M-Instruct", tmp_path, dtype=torch.float32)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    assert count_parameters(model)["total"] == count_parameters(
        build_architecture("HuggingFaceTB/SmolLM2-135M-Instruct"))["total"]
    assert (model.config.pad_token_id, model.config.eos_token_id) == (tokenizer.pad_token_id, tokenizer.eos_token_id)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.bos_token_id is None and model.dtype == torch.float32


# ----------------------------------------------------------------------------- GSM8K


@pytest.mark.parametrize("split", ["train", "test"])
def test_gsm8k_sizes_and_gold_answers_are_numbers(split):
    data = load_gsm8k(split)
    assert len(data) == GSM8K_SIZES[split]
    for answer in data["answer"]:
        assert math.isfinite(float(answer)), answer
        assert "," not in answer


def test_gsm8k_prompt_is_conversational_and_limit_works():
    data = load_gsm8k("test", limit=5)
    assert len(data) == 5
    roles = [m["role"] for m in data[0]["prompt"]]
    assert roles == ["system", "user"]
    assert "<answer>" in data[0]["prompt"][0]["content"]
    assert data[0]["answer"] == "18"


def test_gsm8k_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match="'train' or 'test'"):
        load_gsm8k("validation")
    with pytest.raises(ValueError, match="'bundled' or 'hub'"):
        load_gsm8k("test", source="kaggle")


def test_gold_answer_parsing():
    assert gold_answer("so 3+4=7\n#### 7") == "7"
    assert gold_answer("...\n#### 1,200") == "1200"
    with pytest.raises(ValueError):
        gold_answer("no marker here")


# ----------------------------------------------------------------------------- TRL on CPU


@pytest.mark.slow
def test_two_grpo_steps_with_lora_on_cpu(tiny_model_path, tmp_path):
    from labkit.training import build_trainer, grpo_config

    model, tokenizer = load_policy(tiny_model_path, "lora", peft_config=lora_config(4))
    dataset = load_gsm8k("train", limit=8)

    def length_parity(completions, **kwargs):  # any reward with spread works: this is about plumbing
        return [float(len(c[0]["content"]) % 2) for c in completions]

    args = grpo_config(tmp_path, max_steps=2, per_device_train_batch_size=4, num_generations=4,
                       max_completion_length=16, learning_rate=1e-2, beta=0.04)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer = build_trainer(model, [length_parity], dataset, args, tokenizer=tokenizer)
    result = trainer.train()
    assert result.global_step == 2
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logged) == 2 and all("kl" in h for h in logged)
    changed = [n for n, p in trainer.model.named_parameters() if n in before and not torch.equal(p, before[n])]
    assert changed, "no LoRA weight moved in two steps"
