"""Coded exercises of ``04_lora_grpo_16gb.ipynb`` and ``05_full_vs_lora.ipynb``: memory terms counted by hand.

- ``lora_param_count`` (04): the parameters LoRA adds, ``r (d_in + d_out)`` per adapted Linear layer,
  checked against PEFT's own count (``get_peft_model(...).get_nb_trainable_parameters()``) on real
  architectures built on the meta device;
- ``training_state_bytes`` (05): the bytes of weights, gradients and AdamW states a model holds after
  one optimiser step, predicted from its parameters, checked against what PyTorch allocates
  (:func:`labkit.monitor.state_bytes` after a real ``torch.optim.AdamW`` step), full and LoRA, fp32 and bf16;
- ``kv_cache_bytes`` (05): the KV cache of a batch, checked against the keys and values transformers'
  ``DynamicCache`` holds after a forward pass of the architecture (on the meta device: shapes, no memory);
- ``decode_limit`` (04b): the completion tokens a second a card's memory bandwidth allows, checked against
  :func:`labkit.generation.decode_limit` (arithmetic: no library counts it).

The references of the first three are the libraries' own numbers, not a formula of ours: a learner's formula
passes only if it counts what PyTorch, PEFT and transformers hold.
"""
from __future__ import annotations

import copy

import torch

from labkit.exercises import Case, Exercise, register

__all__ = ["LORA_PARAM_COUNT", "TRAINING_STATE_BYTES", "KV_CACHE_BYTES", "DECODE_LIMIT"]

_SOLUTIONS_04 = "docs/solutions/04_lora_grpo_16gb.md"
_SOLUTIONS_05 = "docs/solutions/05_full_vs_lora.md"


def _meta_model(name: str, dtype=torch.bfloat16):
    from labkit.models import build_architecture

    return build_architecture(name, device="meta", dtype=dtype)


# ----------------------------------------------------------------------------- lora_param_count


_PEFT_COUNTS: dict = {}  # PEFT's count per (architecture, rank, targets): a few seconds each on a CPU


def _peft_count(model, rank, target_modules):
    from peft import get_peft_model

    from labkit.models import lora_config

    key = (model.config.to_json_string(), rank, tuple(target_modules))
    if key not in _PEFT_COUNTS:
        adapted = get_peft_model(copy.deepcopy(model), lora_config(rank, target_modules=list(target_modules)))
        _PEFT_COUNTS[key] = adapted.get_nb_trainable_parameters()[0]
    return _PEFT_COUNTS[key]


def _lora_cases() -> list[Case]:
    recipe = ["q_proj", "k_proj", "o_proj", "up_proj", "down_proj"]
    every = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return [
        Case("Qwen2.5-0.5B-Instruct, rank 16, the 16 GB recipe's targets (q, k, o, up, down)",
             (_meta_model("Qwen/Qwen2.5-0.5B-Instruct"), 16, recipe)),
        Case("SmolLM2-135M-Instruct, rank 4, q_proj and v_proj only",
             (_meta_model("HuggingFaceTB/SmolLM2-135M-Instruct"), 4, ["q_proj", "v_proj"])),
        Case("Llama-3.2-1B-Instruct, rank 8, every attention and MLP projection",
             (_meta_model("meta-llama/Llama-3.2-1B-Instruct"), 8, every)),
    ]


def _adapted(model, targets):
    """Yield every Linear layer but the LM head whose name ends in one of ``targets``: the layers LoRA adapts."""
    head = model.get_output_embeddings()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module is not head and name.rsplit(".", 1)[-1] in set(targets):
            yield module


def _lora_every_linear(model, rank, targets):
    return sum(rank * (m.in_features + m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear))


LORA_PARAM_COUNT = register(Exercise(
    name="lora_param_count",
    reference=_peft_count,
    reference_name="PEFT's count: get_nb_trainable_parameters of the PeftModel, on the meta device",
    cases=_lora_cases,
    mistakes={
        "rank x d_in x d_out is a full update's size times r; LoRA trains two thin matrices, A (r x d_in) and "
        "B (d_out x r): r (d_in + d_out) per adapted layer":
            lambda model, rank, targets: sum(rank * m.in_features * m.out_features for m in _adapted(model, targets)),
        "only A (r x d_in) is counted: B (d_out x r) trains too":
            lambda model, rank, targets: sum(rank * m.in_features for m in _adapted(model, targets)),
        "every Linear layer is counted, the LM head included, not only the target_modules": _lora_every_linear,
        "no layer matched your target modules, so the count is 0: a name from model.named_modules() is the layer's "
        "whole path ('model.layers.0.self_attn.q_proj'), never equal to 'q_proj'; compare its last part, "
        "name.rsplit('.', 1)[-1]": lambda model, rank, targets: sum(
            rank * (m.in_features + m.out_features) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and n in targets),
    },
    nudge="LoRA adds two thin matrices to each targeted Linear layer, A (r x d_in) and B (d_out x r); other "
          "layers add nothing.",
    hint="walk model.named_modules(); for each torch.nn.Linear whose last name part (name.rsplit('.', 1)[-1]) "
         "is in target_modules, add rank * (module.in_features + module.out_features).",
    solution=f"{_SOLUTIONS_04}#exercise-lora_param_count",
))


# ----------------------------------------------------------------------------- training_state_bytes


def _measured_state_bytes(model):
    from labkit.monitor import state_bytes

    model = copy.deepcopy(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.grad = torch.zeros_like(p)  # what backward leaves: one gradient per trainable parameter
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    optimizer.step()  # AdamW allocates its states on its first step
    return state_bytes(model, optimizer)


def _tiny(method: str, dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    from labkit.models import build_tiny_model, lora_config

    config = AutoConfig.from_pretrained(build_tiny_model("qwen2"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if method == "lora":
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(4, dropout=0.0))
    return model


def _state_cases() -> list[Case]:
    return [
        Case("the tiny model, full fine-tuning, fp32", (_tiny("full", torch.float32),)),
        Case("the tiny model, full fine-tuning, bf16 weights", (_tiny("full", torch.bfloat16),)),
        Case("the tiny model, LoRA rank 4 on an fp32 base", (_tiny("lora", torch.float32),)),
        Case("the tiny model, LoRA rank 4 on a bf16 base (PEFT keeps the adapters in fp32)",
             (_tiny("lora", torch.bfloat16),)),
    ]


def _by_hand(model, *, moment_bytes=None, frozen_grads=False, step_counter=True):
    weights = gradients = optimizer = 0
    for p in model.parameters():
        size = p.numel() * p.element_size()
        weights += size
        if p.requires_grad or frozen_grads:
            gradients += size
        if p.requires_grad:
            optimizer += 2 * p.numel() * (moment_bytes or p.element_size()) + (4 if step_counter else 0)
    return {"weights": weights, "gradients": gradients, "optimizer": optimizer}


TRAINING_STATE_BYTES = register(Exercise(
    name="training_state_bytes",
    reference=_measured_state_bytes,
    reference_name="the bytes PyTorch holds after one torch.optim.AdamW step, measured by labkit.monitor.state_bytes",
    cases=_state_cases,
    mistakes={
        "the AdamW moments are counted at 4 bytes (fp32) each: torch's AdamW keeps them in the parameter's "
        "dtype, so 2 x 2 bytes for a bf16 parameter": lambda m: _by_hand(m, moment_bytes=4),
        "frozen parameters are given gradients: only parameters with requires_grad=True get a .grad "
        "(with LoRA, the adapters only)": lambda m: _by_hand(m, frozen_grads=True),
        "AdamW's step counter is missing: it keeps a 4-byte step tensor for every trainable tensor, beside "
        "its two moments": lambda m: _by_hand(m, step_counter=False),
    },
    nudge="go parameter tensor by tensor: every one holds its weight; only trainable ones also hold a gradient "
          "and AdamW's states, in the parameter's own dtype.",
    hint="loop over model.parameters() (tied weights come once): every parameter has its weight "
         "(numel x element_size); trainable ones (requires_grad) also a gradient of the same size and two AdamW "
         "moments of the same dtype, plus a 4-byte step counter per tensor.",
    solution=f"{_SOLUTIONS_05}#exercise-training_state_bytes",
))


# ----------------------------------------------------------------------------- kv_cache_bytes

_DTYPES = {2: torch.bfloat16, 4: torch.float32}


def _cached_bytes(config, batch_size, seq_len, bytes_per_element):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # shapes only: a 0.5B model costs no memory here
        model = AutoModelForCausalLM.from_config(config, dtype=_DTYPES[bytes_per_element])
        input_ids = torch.zeros(batch_size, seq_len, dtype=torch.long)
        cache = model(input_ids=input_ids, use_cache=True).past_key_values
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def _kv_cases() -> list[Case]:
    from labkit.models import architecture_config

    return [
        Case("Qwen2.5-0.5B-Instruct (14 query heads, 2 KV heads), 8 sequences of 768 tokens, bf16",
             (architecture_config("Qwen/Qwen2.5-0.5B-Instruct"), 8, 768, 2)),
        Case("Llama-3.2-1B-Instruct, 4 sequences of 1,024 tokens, fp32",
             (architecture_config("meta-llama/Llama-3.2-1B-Instruct"), 4, 1024, 4)),
        Case("Qwen3-0.6B (head_dim 128, not hidden_size / heads = 64), 16 sequences of 512 tokens, bf16",
             (architecture_config("Qwen/Qwen3-0.6B"), 16, 512, 2)),
    ]


def _kv(config, batch, seq, b, *, heads=None, head_dim=None, tensors=2):
    heads = heads or config.num_key_value_heads
    head_dim = head_dim or getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return tensors * config.num_hidden_layers * heads * head_dim * b * batch * seq


KV_CACHE_BYTES = register(Exercise(
    name="kv_cache_bytes",
    reference=_cached_bytes,
    reference_name="transformers' DynamicCache after a forward pass: keys and values of every layer",
    cases=_kv_cases,
    # the head size first: on Qwen3 it halves the result just as a missing factor 2 would, and the
    # first case (Qwen2.5, no head_dim) already catches a missing factor 2
    mistakes={
        "the head size is taken as hidden_size // num_attention_heads: read config.head_dim when the config has "
        "one (Qwen3's is 128, not 64)": lambda c, n, s, b: _kv(c, n, s, b,
                                                             head_dim=c.hidden_size // c.num_attention_heads),
        "the cache holds keys AND values: a factor 2 is missing": lambda c, n, s, b: _kv(c, n, s, b, tensors=1),
        "num_attention_heads is used: with grouped-query attention the cache stores only the "
        "num_key_value_heads key/value heads": lambda c, n, s, b: _kv(c, n, s, b, heads=c.num_attention_heads),
    },
    nudge="each layer caches a key and a value per KV head, per token, per sequence; check where the config "
          "keeps the head size.",
    hint="2 (keys and values) x num_hidden_layers x num_key_value_heads x head_dim x bytes_per_element x "
         "batch_size x seq_len; head_dim is config.head_dim when set, else hidden_size // num_attention_heads.",
    solution=f"{_SOLUTIONS_05}#exercise-kv_cache_bytes",
))


# ----------------------------------------------------------------------------- decode_limit (04b)

_GB = 1e9  # bandwidth is sold in decimal GB/s


def _decode_cases() -> list[Case]:
    # (weights in bytes, KV bytes per token, batch, mean context, bandwidth in bytes a second)
    return [
        Case("Qwen2.5-1.5B in bf16 (3.09 GB), 96 sequences, mean context 649 tokens, an H100 (3,350 GB/s)",
             (3.087e9, 28_672, 96, 649, 3350 * _GB)),
        Case("the same model, 4 sequences (the published 16 GB recipe), an RTX 3080 Laptop GPU (448 GB/s)",
             (3.087e9, 28_672, 4, 649, 448 * _GB)),
        Case("SmolLM2-135M in bf16 (0.27 GB; 30 layers x 3 KV heads x 64 x 2 x 2 bytes = 23,040 a token), 32 sequences, "
             "mean context 140 tokens, a T4 (320 GB/s)", (0.269e9, 23_040, 32, 140, 320 * _GB)),
    ]


def _decode_limit(weight_bytes, kv_bytes_per_token, batch, mean_context, bandwidth):
    from labkit.generation import decode_limit

    return decode_limit(weight_bytes, kv_bytes_per_token, batch, mean_context, bandwidth)


DECODE_LIMIT = register(Exercise(
    name="decode_limit",
    reference=_decode_limit,
    reference_name="labkit.generation.decode_limit",
    cases=_decode_cases,
    mistakes={
        "this is decode steps a second: each step makes one token for every sequence of the batch, so multiply by "
        "the batch": lambda w, kv, n, c, bw: bw / (w + n * c * kv),
        "the KV cache is read too: every sequence's keys and values, mean_context tokens each, on every step":
            lambda w, kv, n, c, bw: n * bw / w,
        "each sequence has its own KV cache: the cache read per step grows with the batch":
            lambda w, kv, n, c, bw: n * bw / (w + c * kv),
        "the weights are read once per step for the whole batch, not once per sequence: that is what makes a "
        "larger batch nearly free": lambda w, kv, n, c, bw: n * bw / (n * w + n * c * kv),
    },
    nudge="count the bytes one decode step must read, and the tokens that one step makes.",
    hint="one step reads weight_bytes + batch x mean_context x kv_bytes_per_token bytes and makes batch tokens: "
         "tokens a second = batch x bandwidth / those bytes.",
    solution="docs/solutions/04b_where_the_time_goes.md#exercise-decode_limit",
))
