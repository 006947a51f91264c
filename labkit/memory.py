"""Where the memory of a GRPO step goes: an estimator, exact counters, and the benchmarks that check it.

Introduced in ``05_full_vs_lora.ipynb``. One GRPO step has two phases that never overlap:

1. **generation**: the policy samples ``num_generations`` completions for each prompt with a
   KV cache, under ``torch.no_grad()``;
2. **training**: forward and backward over prompt + completion tokens, then the optimizer step.

Weights, the reference model and the optimizer states live through both, so

``peak = weights + reference + optimizer + max(generation, gradients + activations + logits)``

:func:`estimate` computes every term from the architecture's shapes (any entry of
:data:`labkit.models.ARCHITECTURES`, a transformers config, or a saved model folder).
:func:`state_bytes` and :func:`saved_activation_bytes` measure the same quantities on a real
model, exactly, on any device; the tests hold the estimator to them. ``python -m labkit bench
memory`` measures peaks of real TRL GRPO steps (GPU: ``torch.cuda.max_memory_allocated``; CPU:
peak resident memory of a fresh process) and ``python -m labkit bench chunked-logps`` measures
what chunking the LM head saves.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
from dataclasses import dataclass, field

__all__ = [
    "GIB",
    "METHODS",
    "OPTIMIZERS",
    "ModelShape",
    "MemoryEstimate",
    "model_shape",
    "estimate",
    "plot_breakdown",
    "state_bytes",
    "saved_activation_bytes",
    "estimate_cli",
    "bench_memory_cli",
    "bench_chunked_cli",
    "bench_full_vs_lora_cli",
]

GIB = 1024**3
METHODS = ("full", "lora", "qlora")
OPTIMIZERS = ("adamw", "adamw_8bit")
_PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

# bitsandbytes NF4 with double quantisation (what labkit.models.load_policy asks for): 4 bits a weight,
# one 8-bit absmax per block of 64 weights, one fp32 absmax per 256 of those blocks.
QLORA_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)
# bitsandbytes' 8-bit optimisers: tensors under 4,096 elements keep 32-bit states; others keep two
# uint8 states and one fp32 absmax per 256-element block for each.
_BNB_MIN_8BIT_SIZE = 4096
_BNB_BLOCK = 256
# TRL 1.16's fused LM head (trl.kernels.chunked_logprob): tiles of 4,096 tokens x 32,768 vocabulary entries.
_TRL_TOKEN_CHUNK = 4096
_TRL_VOCAB_CHUNK = 32768
# On CPU the tile is folded by torch ops (trl.kernels.chunked_logprob._backward_tile): the tile, y, z,
# log_p, p, grad, the one-hot mask and two products live at once. Measured: 1.033 MiB per scored token
# at 32,768 columns in fp32 = 8.25 tiles.
_CPU_TILE_COPIES = 8.25


# --------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class ModelShape:
    """The numbers :func:`estimate` needs from an architecture (see :func:`model_shape`)."""

    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    qk_norm: bool  # Qwen3 normalises queries and keys per head
    params: int  # total parameters, tied weights once
    param_numels: tuple[int, ...]  # every parameter tensor (tied once), for per-tensor optimiser states
    quantisable_params: int  # weights of nn.Linear layers other than the LM head: what QLoRA stores in 4 bits
    linear_weight_params: int  # same layers; what fp16 autocast casts to half precision in each forward
    lora_modules: tuple[tuple[str, int, int], ...] = field(repr=False)  # (name suffix, in, out) per Linear

    def lora_targets(self, targets) -> list[tuple[int, int]]:
        """Return ``[(in_features, out_features), ...]`` of the Linear layers a LoRA with ``targets`` adapts."""
        wanted = set(targets)
        return [(i, o) for name, i, o in self.lora_modules if name in wanted]

    def lora_params(self, rank: int, targets) -> int:
        """Return the number of LoRA parameters: ``rank x (in + out)`` for every adapted Linear."""
        return sum(rank * (i + o) for i, o in self.lora_targets(targets))


def _config_of(model):
    """Return ``(name, transformers config)`` for a catalogue name, a saved folder, a config or a model."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(model, PretrainedConfig):
        return getattr(model, "_name_or_path", "") or model.model_type, model
    if hasattr(model, "config") and isinstance(model.config, PretrainedConfig):
        return model.config._name_or_path or model.config.model_type, model.config
    name = str(model)
    if os.path.isdir(name):
        return name, AutoConfig.from_pretrained(name)
    from labkit.models import architecture_config

    return name, architecture_config(name)


@functools.lru_cache(maxsize=64)
def _shape_from_json(name: str, config_json: str) -> ModelShape:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dict = json.loads(config_json)
    config = AutoConfig.for_model(config_dict.pop("model_type"), **config_dict)
    with torch.device("meta"):  # shapes only: no memory is allocated
        meta = AutoModelForCausalLM.from_config(config)
    text = config.get_text_config()
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    seen, numels = set(), []
    for p in meta.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            numels.append(p.numel())
    lm_head = meta.get_output_embeddings()
    modules, linear = [], 0
    for module_name, module in meta.named_modules():
        if isinstance(module, torch.nn.Linear) and module is not lm_head:
            modules.append((module_name.rsplit(".", 1)[-1], module.in_features, module.out_features))
            linear += module.weight.numel()
    attention = meta.model.layers[0].self_attn
    return ModelShape(
        name=name,
        model_type=config.model_type,
        num_layers=text.num_hidden_layers,
        hidden_size=text.hidden_size,
        intermediate_size=text.intermediate_size,
        num_heads=heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        vocab_size=text.vocab_size,
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        qk_norm=hasattr(attention, "q_norm"),
        params=sum(numels),
        param_numels=tuple(numels),
        quantisable_params=linear,
        linear_weight_params=linear,
        lora_modules=tuple(modules),
    )


def model_shape(model) -> ModelShape:
    """Return the :class:`ModelShape` of ``model``: a catalogue name, a saved folder, a config or a model.

    The architecture is built on PyTorch's ``meta`` device, so counting the parameters of a 7B
    model costs no memory. Results are cached per configuration.
    """
    name, config = _config_of(model)
    config_dict = config.to_dict()
    for key in ("_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype"):
        config_dict.pop(key, None)
    return _shape_from_json(name, json.dumps(config_dict, sort_keys=True, default=str))


# --------------------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class MemoryEstimate:
    """What :func:`estimate` returns: the memory of one GRPO step, term by term.

    ``bytes`` holds each term in bytes (exact integers for weights, gradients and optimizer
    states); the attributes of the same names give GiB. ``generation_phase`` and
    ``training_phase`` are the peaks of the two phases; ``total`` is the larger of them.
    """

    bytes: dict
    settings: dict
    trainable_params: int
    total_params: int

    def __getattr__(self, name):
        terms = object.__getattribute__(self, "bytes")
        if name in terms:
            return terms[name] / GIB
        raise AttributeError(name)

    def as_dict(self) -> dict:
        """Return every term in GiB (keys ending in ``_gib``), with the settings and parameter counts."""
        out = {f"{k}_gib": round(v / GIB, 4) for k, v in self.bytes.items()}
        out.update(trainable_params=self.trainable_params, total_params=self.total_params, **self.settings)
        return out

    def table(self) -> str:
        """Return the breakdown as a plain-text table (what ``python -m labkit estimate`` prints)."""
        rows = [
            ("weights", "policy weights"),
            ("reference", "reference model (beta > 0, full fine-tuning only)"),
            ("optimizer", "optimizer states"),
            ("kv_cache", "generation: KV cache + prefill working set"),
            ("gradients", "gradients of the trainable parameters"),
            ("activations", "activations kept for the backward pass"),
            ("logits", "LM-head / log-prob buffers"),
        ]
        lines = [f"{'term':<12} {'GiB':>8}  what"]
        lines += [f"{key:<12} {self.bytes[key] / GIB:>8.3f}  {what}" for key, what in rows]
        lines += [
            f"{'generation':<12} {self.bytes['generation_phase'] / GIB:>8.3f}  phase 1 = weights + reference + optimizer + kv_cache",
            f"{'training':<12} {self.bytes['training_phase'] / GIB:>8.3f}  phase 2 = weights + reference + optimizer + gradients + activations + logits",
            f"{'total':<12} {self.total:>8.3f}  peak = max(generation, training)",
        ]
        return "\n".join(lines)


def _layer_activation_bytes(shape: ModelShape, *, method: str, act_bytes: int, autocast_adapters: bool,
                            device: str, lora_rank: int, lora_targets, lora_dropout: float, padded: bool,
                            seq_len: int) -> tuple[float, float]:
    """Return ``(bytes per token, bytes per layer)`` that autograd keeps for one decoder layer.

    Counted from what each operation saves for its backward (checked against
    :func:`saved_activation_bytes` on CPU in the tests). ``b`` is the activation dtype's size.
    """
    b = act_bytes
    h, i = shape.hidden_size, shape.intermediate_size
    q = shape.num_heads * shape.head_dim
    kv = shape.num_kv_heads * shape.head_dim
    full = method == "full"
    # RMSNorm upcasts to fp32: pow and mul keep the fp32 input (4h) and rsqrt (4); the
    # weight multiply keeps the normalised input (b*h) only when the norm weight trains.
    norm = 4 * h + 4 + (b * h if full else 0)
    per_token = 2 * norm
    if full:
        # Inputs of the trainable projections, kept for their weight gradients: q/k/v share
        # one input, gate/up share one, down_proj's input is the gated product. o_proj's input
        # is the attention output, already kept by SDPA (same storage).
        per_token += b * h + b * h + b * i
    if shape.qk_norm:  # RMSNorm over each head of the queries and keys
        per_token += 4 * q + 4 * shape.num_heads + 4 * kv + 4 * shape.num_kv_heads
        if full:
            per_token += b * (q + kv)
    # SDPA (flash / memory-efficient kernels) keeps q, k, v, its output and the log-sum-exp
    # (fp32, one per head). With a padding mask transformers repeats the K/V heads, and SDPA
    # keeps the mask turned into an additive bias of shape (batch, 1, S, S) in every layer.
    kv_kept = q if padded else kv
    per_token += b * (q + 2 * kv_kept + q) + 4 * shape.num_heads
    if padded:
        per_token += b * seq_len
    # SwiGLU: the gate projection's output (for SiLU), SiLU's output and the up projection's
    # output (for the product).
    per_token += 3 * b * i
    per_layer = 0.0
    if method in ("lora", "qlora"):
        targets = shape.lora_targets(lora_targets)
        layer_targets = targets[: len(targets) // max(shape.num_layers, 1)]
        for in_f, out_f in layer_targets:
            # PEFT's adapters are fp32 (autocast_adapter_dtype). Dropout keeps its mask: a bool per
            # element with CUDA's fused kernel, a float mask in the adapter dtype on CPU. lora_A keeps
            # its input: the dropout output, or its autocast copy in the compute dtype.
            adapter_input = b if autocast_adapters else 4
            if lora_dropout > 0:
                mask = 1 if device == "cuda" else 4
                per_token += (mask + adapter_input) * in_f
            else:
                per_token += adapter_input * in_f if autocast_adapters else 0
            per_token += b * lora_rank  # lora_A's output, kept by lora_B
            if autocast_adapters:  # autocast's half-precision copies of A and B, kept for backward
                per_layer += b * lora_rank * (in_f + out_f)
        if lora_dropout == 0 and not autocast_adapters:
            # Without dropout or casts lora_A keeps the input tensor itself, shared by the projections
            # that read it: the two norm outputs and the gated product (o_proj's input is SDPA's output).
            per_token += b * (h + h + i)
    return per_token, per_layer


def estimate(model, method: str = "lora", *, num_generations: int = 8, per_device_batch: int = 1,
             prompt_len: int = 256, completion_len: int = 512, optimizer: str = "adamw",
             gradient_checkpointing: bool = True, beta: float = 0.0, precision: str = "bf16",
             lora_rank: int = 16, lora_targets=None, lora_dropout: float = 0.05,
             gradient_accumulation_steps: int = 1, device: str = "cuda", padded: bool = False,
             logits: str = "fused") -> MemoryEstimate:
    """Return a :class:`MemoryEstimate`: the peak memory of one GRPO step of TRL 1.16, term by term.

    ``per_device_batch`` prompts, each with ``num_generations`` completions, so generation runs
    ``B_gen = per_device_batch x num_generations`` sequences at once and each forward/backward
    ``B = B_gen / gradient_accumulation_steps`` sequences (TRL's ``per_device_train_batch_size``)
    of ``S = prompt_len + completion_len`` tokens. ``P`` parameters (tied weights once), ``P_t``
    trainable ones; ``w`` the bytes of a weight and ``b`` of an activation (``precision``: bf16/fp16
    2, fp32 4; fp16 full fine-tuning keeps fp32 master weights). Layers ``L``, hidden ``h``,
    MLP ``i``, vocabulary ``V``, KV heads x head size ``kv``.

    - **weights** ``= P w`` (full, LoRA base); LoRA adds ``P_lora x 4`` (PEFT keeps adapters in
      fp32); QLoRA stores the ``nn.Linear`` weights in NF4, ``0.5 + 1/64 + 1/4096`` bytes each
      (4-bit codes, double-quantised absmax), and ``prepare_model_for_kbit_training`` turns every
      other weight (embeddings, norms) into fp32: 4 bytes.
    - **reference** ``= P w`` when ``beta > 0`` and ``method == "full"``; 0 with ``beta = 0`` (TRL's
      default: no reference model) and with PEFT (the reference is the base with adapters disabled).
    - **gradients** ``= P_t x (bytes of a trainable weight)``.
    - **optimizer**: ``adamw``: torch's AdamW keeps two moments *in the parameter's dtype*
      (``2 P_t w``; 8 bytes a parameter for fp32 parameters, 4 for a model loaded in bf16) plus a
      4-byte step counter per tensor. ``adamw_8bit`` (bitsandbytes): 2 bytes a parameter plus one
      fp32 absmax per 256 per moment; tensors under 4,096 elements keep 32-bit moments.
    - **activations**: what autograd keeps for the backward pass of each decoder layer, per token
      (see the source of ``_layer_activation_bytes``: RMSNorm's fp32 copies, the projections'
      inputs, SDPA's q/k/v/output, SwiGLU's three ``i``-wide tensors, LoRA's dropout masks and
      inputs), times ``B S`` tokens and ``L`` layers. With gradient checkpointing each layer keeps
      only its input (``b h`` per token) and one layer is recomputed at a time:
      ``L b h B S + layer(B S)``.
    - **logits**: TRL 1.16's fused LM head never builds the ``(B, S, V)`` logits: it keeps the
      hidden states it scores (``N h b``), a tile of ``min(N, 4096) x min(V, 32768)`` logits and,
      in the backward pass, an fp32 gradient for the hidden states (``N h 4``) and, when the head
      trains (full fine-tuning), an fp32 accumulator for its weight (``V h 4``). ``N = B C``
      completion tokens on CUDA (Triton scores only those), ``B (S - 1)`` on CPU, where TRL's
      torch fallback also keeps about 8 fp32 temporaries of the tile's size.
      ``logits="full"`` instead counts a plain implementation: logits, their log-softmax and their
      gradient, ``3 N V b`` with ``N = B (C + 1)``.
    - **kv_cache** ``= 2 L kv b B_gen S`` (keys and values of every layer), plus the prefill's
      largest intermediate (``B_gen x prompt_len x (3 i + 2 h) x b``) and the sampling buffers.

    ``peak = weights + reference + optimizer + max(kv_cache, gradients + activations + logits)``.
    Gradients and activations are added: with gradient accumulation the gradients of earlier
    micro-batches are alive during the next backward; with one micro-batch it is an upper bound.
    Not counted: the CUDA context (about 0.3-0.5 GiB outside PyTorch's allocator) and allocator
    fragmentation; leave about 1 GiB of headroom. Introduced in ``05_full_vs_lora.ipynb``.
    """
    from labkit.models import DEFAULT_LORA_TARGETS

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, not {optimizer!r}")
    if precision not in _PRECISION_BYTES:
        raise ValueError(f"precision must be one of {tuple(_PRECISION_BYTES)}, not {precision!r}")
    if logits not in ("fused", "full"):
        raise ValueError(f"logits must be 'fused' (TRL 1.16) or 'full', not {logits!r}")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', not {device!r}")
    if method == "qlora" and precision == "fp32":
        raise ValueError("QLoRA computes in half precision: use precision='bf16' (or 'fp16' on a T4)")
    for knob, value in dict(num_generations=num_generations, per_device_batch=per_device_batch,
                            completion_len=completion_len, lora_rank=lora_rank,
                            gradient_accumulation_steps=gradient_accumulation_steps).items():
        if value < 1:
            raise ValueError(f"{knob} must be at least 1, not {value}")
    if prompt_len < 0:
        raise ValueError(f"prompt_len must be at least 0, not {prompt_len}")
    generation_batch = per_device_batch * num_generations
    if generation_batch % gradient_accumulation_steps:
        raise ValueError(f"per_device_batch x num_generations ({generation_batch}) must be divisible by "
                         f"gradient_accumulation_steps ({gradient_accumulation_steps})")
    micro_batch = generation_batch // gradient_accumulation_steps
    shape = model_shape(model)
    targets = list(lora_targets or DEFAULT_LORA_TARGETS)
    b = _PRECISION_BYTES[precision]
    # Weight dtype of the policy as labkit.device.torch_dtype chooses it.
    w = 4 if precision == "fp32" or (precision == "fp16" and method == "full") else 2
    seq = prompt_len + completion_len
    h, V, L = shape.hidden_size, shape.vocab_size, shape.num_layers
    kv = shape.num_kv_heads * shape.head_dim

    # --- weights, gradients, optimizer: exact
    if method == "full":
        trainable_numels = list(shape.param_numels)
        weights = shape.params * w
        trainable_bytes = w
    else:
        lora = shape.lora_targets(targets)
        trainable_numels = [n for i, o in lora for n in (lora_rank * i, lora_rank * o)]
        adapters = sum(trainable_numels)
        if not trainable_numels:
            raise ValueError(f"no Linear layer of {shape.name} is called any of {targets}")
        trainable_bytes = 4
        if method == "lora":
            weights = shape.params * w + adapters * 4
        else:
            other = shape.params - shape.quantisable_params
            weights = math.ceil(shape.quantisable_params * QLORA_BYTES_PER_PARAM) + other * 4 + adapters * 4
    trainable = sum(trainable_numels)
    gradients = trainable * trainable_bytes
    if optimizer == "adamw":
        optimizer_bytes = 2 * trainable * trainable_bytes + 4 * len(trainable_numels)
    else:
        optimizer_bytes = sum(
            2 * n + 2 * 4 * math.ceil(n / _BNB_BLOCK) if n >= _BNB_MIN_8BIT_SIZE else 2 * 4 * n
            for n in trainable_numels
        )
        if any(n >= _BNB_MIN_8BIT_SIZE for n in trainable_numels):
            optimizer_bytes += 2 * 256 * 4  # the two 256-entry quantisation maps, shared by every tensor
    reference = shape.params * w if (beta > 0 and method == "full") else 0

    # --- activations of one forward/backward over micro_batch x seq tokens
    tokens = micro_batch * seq
    autocast_adapters = method != "full" and b < 4
    per_token, per_layer = _layer_activation_bytes(
        shape, method=method, act_bytes=b, autocast_adapters=autocast_adapters, device=device,
        lora_rank=lora_rank, lora_targets=targets, lora_dropout=lora_dropout, padded=padded, seq_len=seq)
    layer = per_token * tokens + per_layer
    final_norm = (4 * h + 4 + (b * h if method == "full" else 0)) * tokens
    input_ids = 8 * tokens if method == "full" else 0  # the embedding's gradient needs the token ids
    rotary = 2 * seq * shape.head_dim * b  # RoPE's cos and sin, shared by the batch and the layers
    if gradient_checkpointing:
        activations = L * b * h * tokens + layer + final_norm + input_ids
    else:
        activations = L * layer + final_norm + input_ids + rotary
    if precision == "fp16" and method == "full":
        activations += shape.linear_weight_params * 2  # autocast's fp16 copies of the fp32 master weights

    # --- the LM head and log-probabilities
    head_trains = method == "full"
    if logits == "fused":
        scored = micro_batch * completion_len if device == "cuda" else micro_batch * (seq - 1)
        tile = min(scored, _TRL_TOKEN_CHUNK) * min(V, _TRL_VOCAB_CHUNK) * b
        if device == "cpu":  # without Triton, TRL folds each tile with torch ops: fp32 temporaries of its size
            tile = min(scored, _TRL_TOKEN_CHUNK) * min(V, _TRL_VOCAB_CHUNK) * 4 * _CPU_TILE_COPIES
        logits_bytes = scored * h * b + scored * 16 + tile + scored * h * (4 + b)
        if head_trains:
            logits_bytes += V * h * 4
    else:
        scored = micro_batch * (completion_len + 1)
        logits_bytes = 3 * scored * V * b

    # --- generation
    kv_cache = 2 * L * kv * b * generation_batch * seq
    kv_cache += generation_batch * prompt_len * (3 * shape.intermediate_size + 2 * h) * b
    kv_cache += generation_batch * V * (b + 3 * 4)  # last-position logits, their fp32 copy, sampling buffers

    persistent = weights + reference + optimizer_bytes
    generation_phase = persistent + kv_cache
    training_phase = persistent + gradients + activations + logits_bytes
    terms = dict(weights=weights, reference=reference, gradients=gradients, optimizer=optimizer_bytes,
                 activations=activations, logits=logits_bytes, kv_cache=kv_cache,
                 generation_phase=generation_phase, training_phase=training_phase,
                 total=max(generation_phase, training_phase))
    terms = {k: int(round(v)) for k, v in terms.items()}
    settings = dict(model=shape.name, method=method, num_generations=num_generations,
                    per_device_batch=per_device_batch, prompt_len=prompt_len, completion_len=completion_len,
                    optimizer=optimizer, gradient_checkpointing=gradient_checkpointing, beta=beta,
                    precision=precision, lora_rank=lora_rank if method != "full" else None,
                    gradient_accumulation_steps=gradient_accumulation_steps, device=device, padded=padded,
                    logits=logits)
    return MemoryEstimate(bytes=terms, settings=settings, trainable_params=trainable, total_params=shape.params)



_STACK = {  # phase -> terms from bottom to top, with colours that stay the same in every plot
    "generation": ("weights", "reference", "optimizer", "kv_cache"),
    "training": ("weights", "reference", "optimizer", "gradients", "activations", "logits"),
}
_COLOURS = {"weights": "#4c72b0", "reference": "#8172b3", "optimizer": "#dd8452", "kv_cache": "#937860",
            "gradients": "#c44e52", "activations": "#55a868", "logits": "#da8bc3"}


def plot_breakdown(estimates, labels=None, *, card_gb: float = 16.0, ax=None):
    """Return a matplotlib ``Axes``: stacked bars of each estimate's two phases against a card's memory.

    ``estimates`` is one :class:`MemoryEstimate` or a list; each gets a pair of bars (generation,
    training), stacked term by term in GiB, and a dashed line marks ``card_gb`` (a card sold as
    16 GB holds 14.9 GiB). Used by the interactive estimator of ``05_full_vs_lora.ipynb``.
    """
    import matplotlib.pyplot as plt

    if isinstance(estimates, MemoryEstimate):
        estimates = [estimates]
    labels = labels or [f"{e.settings['method']} G={e.settings['num_generations']}" for e in estimates]
    if ax is None:
        _, ax = plt.subplots(figsize=(2.6 + 2 * len(estimates), 4))
    positions, ticks, shown = [], [], set()
    for k, est in enumerate(estimates):
        for j, phase in enumerate(("generation", "training")):
            x = 2.6 * k + j
            bottom = 0.0
            for term in _STACK[phase]:
                height = est.bytes[term] / GIB
                if height <= 0:
                    continue
                ax.bar(x, height, bottom=bottom, color=_COLOURS[term], width=0.8,
                       label=term if term not in shown else None)
                shown.add(term)
                bottom += height
            positions.append(x)
            ticks.append(f"{labels[k]}\n{phase}" if len(estimates) > 1 else phase)
    limit = card_gb * 1e9 / GIB
    ax.axhline(limit, color="black", linestyle="--", linewidth=1)
    ax.text(positions[-1] + 0.5, limit, f" {card_gb:g} GB card", va="bottom", ha="right", fontsize=8)
    ax.set_xticks(positions, ticks, fontsize=7)
    ax.set_ylabel("GiB")
    if len(estimates) == 1:
        ax.set_xlabel(labels[0], fontsize=8)
    ax.legend(fontsize=7, loc="upper left")
    return ax


# --------------------------------------------------------------------------- exact measurements


def state_bytes(model, optimizer=None) -> dict:
    """Return ``{"weights", "gradients", "optimizer"}``: bytes held by a model's tensors, measured.

    Weights: every parameter once (tied weights once; bitsandbytes 4-bit weights by their packed
    storage plus quantisation constants). Gradients: every ``.grad`` that exists. Optimizer: every
    tensor in ``optimizer.state`` (once, however many parameters share it). The counterpart of
    :func:`estimate`'s exact terms; ``05_full_vs_lora.ipynb`` compares the two.
    """
    import torch

    seen, weights, gradients = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        weights += p.numel() * p.element_size()
        quant_state = getattr(p, "quant_state", None)
        if quant_state is not None:
            weights += sum(t.numel() * t.element_size() for t in _tensors_of(quant_state))
        if p.grad is not None:
            gradients += p.grad.numel() * p.grad.element_size()
    opt, seen_state = 0, set()
    if optimizer is not None:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and id(value) not in seen_state:
                    seen_state.add(id(value))
                    opt += value.numel() * value.element_size()
    return {"weights": weights, "gradients": gradients, "optimizer": opt}


def _tensors_of(quant_state):
    import torch

    found = []
    for value in vars(quant_state).values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif hasattr(value, "absmax"):  # nested state of double quantisation
            found.extend(_tensors_of(value))
    return found


def saved_activation_bytes(forward, exclude=None) -> int:
    """Return the bytes of the tensors autograd keeps for the backward pass of ``forward()``.

    Every tensor saved for backward is counted once, by its storage. ``exclude`` is a model (its
    parameters and buffers) or an iterable of tensors not to count, so that what remains is
    activation memory (the token ids an embedding keeps included). Gradient checkpointing hides
    what a checkpointed layer keeps from these hooks: measure without it. Used to check the
    activation formula of :func:`estimate` (``05_full_vs_lora.ipynb``, ``tests/test_memory.py``).
    """
    import torch
    from torch.autograd.graph import saved_tensors_hooks

    if isinstance(exclude, torch.nn.Module):
        exclude = [*exclude.parameters(), *exclude.buffers()]
    owned = {t.untyped_storage().data_ptr() for t in (exclude or ())}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in owned and storage.nbytes():
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    return sum(kept.values())


# --------------------------------------------------------------------------- python -m labkit estimate


def _on_off(text: str) -> bool:
    if text.lower() in ("on", "true", "yes", "1"):
        return True
    if text.lower() in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on/off, not {text!r}")


def _add_setting_arguments(parser: argparse.ArgumentParser, *, many: bool) -> None:
    nargs = "+" if many else None
    parser.add_argument("--method", nargs=nargs, default=["lora"] if many else "lora", choices=METHODS)
    parser.add_argument("--num-generations", type=int, nargs=nargs, default=[8] if many else 8)
    parser.add_argument("--per-device-batch", type=int, default=1, help="prompts per device per step")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--completion-len", type=int, default=512)
    parser.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    parser.add_argument("--gradient-checkpointing", type=_on_off, default=True, metavar="on|off")
    parser.add_argument("--beta", type=float, default=0.0, help="KL weight; > 0 loads a reference model (full only)")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)


def estimate_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit estimate``: print the memory breakdown of a GRPO run as a table or JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m labkit estimate",
        description="Estimate the GPU memory of one GRPO step (TRL 1.16) for a model, a method and settings. "
                    "The model is a catalogue name (labkit.models.ARCHITECTURES) or a saved model folder.")
    parser.add_argument("--model", default="Qwen/Qwen2.5-1.5B-Instruct")
    _add_setting_arguments(parser, many=False)
    parser.add_argument("--precision", default="bf16", choices=tuple(_PRECISION_BYTES))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="where the run would happen")
    parser.add_argument("--padded", action="store_true", help="prompts of different lengths (a padding mask)")
    parser.add_argument("--logits", default="fused", choices=("fused", "full"))
    parser.add_argument("--json", action="store_true", help="print JSON (with total_gib) instead of a table")
    args = parser.parse_args(argv)
    try:
        est = estimate(args.model, args.method, num_generations=args.num_generations,
                       per_device_batch=args.per_device_batch, prompt_len=args.prompt_len,
                       completion_len=args.completion_len, optimizer=args.optimizer,
                       gradient_checkpointing=args.gradient_checkpointing, beta=args.beta, precision=args.precision,
                       lora_rank=args.lora_rank, gradient_accumulation_steps=args.gradient_accumulation_steps,
                       device=args.device, padded=args.padded, logits=args.logits)
    except (KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(est.as_dict(), indent=2))
        return 0
    s = est.settings
    print(f"{s['model']} | {s['method']} | G={s['num_generations']} x {s['per_device_batch']} prompt(s) | "
          f"prompt {s['prompt_len']} + completion {s['completion_len']} tokens | {s['precision']} | "
          f"{s['optimizer']} | checkpointing {'on' if s['gradient_checkpointing'] else 'off'} | beta {s['beta']}")
    print(f"parameters: {est.total_params:,} total, {est.trainable_params:,} trainable "
          f"({100 * est.trainable_params / est.total_params:.2f} %)\n")
    print(est.table())
    verdict = "fits" if est.total + 1.0 <= 16 * 1e9 / GIB else "does not fit"
    print(f"\n{verdict} a 16 GB card (14.9 GiB) with 1 GiB headroom for the CUDA context and fragmentation")
    return 0


# --------------------------------------------------------------------------- python -m labkit bench memory

# Eight or more configurations for one GPU in under ten minutes: model size x method x num_generations.
GPU_GRID = [
    (model, method, g)
    for model in ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct")
    for method in METHODS
    for g in (4, 8)
]
# On a CPU: a real architecture small enough for RAM (SmolLM2-135M in fp32), full and LoRA.
# The tiny model first: its own memory is a few MB, so what its row measures is the process's floor.
CPU_GRID = [("tiny-qwen2", "lora", 2)] + [
    ("HuggingFaceTB/SmolLM2-135M-Instruct", method, g) for method in ("full", "lora") for g in (2, 4)]
_MEMORY_CSV_FIELDS = [
    "date", "device", "device_kind", "model", "method", "num_generations", "per_device_batch", "prompt_len",
    "completion_len", "optimizer", "gradient_checkpointing", "beta", "precision", "lora_rank", "steps",
    "cap_gib", "status", "measured_peak_gib", "measure", "predicted_total_gib", "error_pct",
    "measured_weights_gib", "predicted_weights_gib", "measured_optimizer_gib", "predicted_optimizer_gib",
    "predicted_activations_gib", "predicted_logits_gib", "predicted_kv_cache_gib", "seconds_per_step",
    "torch", "transformers", "trl", "peft", "bitsandbytes",
]


def _random_prompts(n: int, length: int, seed: int) -> list[str]:
    # Byte-level tokenizer: one token per ASCII letter, so every prompt is exactly `length` tokens.
    import random

    rng = random.Random(seed)
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(length)) for _ in range(n)]


def _reset_peak_rss() -> bool:
    """Reset the kernel's record of this process's peak resident memory (Linux >= 4.0); False if it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes() -> int:
    """Return this process's peak resident memory since start or since :func:`_reset_peak_rss`."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _measure_grpo_worker(spec: dict) -> dict:
    """Run ``spec["steps"]`` real TRL GRPO steps and return the measured peak (runs in a fresh process)."""
    import random
    import time

    import torch
    from datasets import Dataset

    from labkit.dashboard import process_rss
    from labkit.device import detect_device
    from labkit.models import load_policy
    from labkit.training import build_trainer, grpo_config

    device = detect_device(spec["device"])
    prompts = _random_prompts(16 * spec["per_device_batch"], spec["prompt_len"], seed=0)
    dataset = Dataset.from_dict({"prompt": prompts})
    rng = random.Random(0)

    def random_reward(completions, **kwargs):  # memory does not depend on what is rewarded
        return [rng.random() for _ in completions]

    generation_batch = spec["per_device_batch"] * spec["num_generations"]
    micro_batch = generation_batch // spec["gradient_accumulation_steps"]
    optim = {"adamw_8bit": "adamw_bnb_8bit"}.get(spec["optimizer"])
    overrides = dict(optim=optim) if optim else {}
    import tempfile

    out_dir = tempfile.mkdtemp(prefix="labkit-bench-")
    args = grpo_config(
        out_dir, device=device, precision=spec["precision"], max_steps=spec["steps"],
        per_device_train_batch_size=micro_batch, gradient_accumulation_steps=spec["gradient_accumulation_steps"],
        num_generations=spec["num_generations"], max_completion_length=spec["completion_len"],
        beta=spec["beta"], learning_rate=1e-6, activation_checkpointing=spec["gradient_checkpointing"],
        # Every completion runs to full length: EOS is forbidden until max_completion_length.
        generation_kwargs={"min_new_tokens": spec["completion_len"]},
        logging_steps=1, seed=0, **overrides,
    )
    if device.kind == "cuda":
        if spec.get("cap_gib"):
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, spec["cap_gib"] * GIB / total))
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    baseline = process_rss()
    status, error = "ok", ""
    started = time.perf_counter()
    measured_states = {}
    try:
        model, tokenizer = load_policy(spec["path"], spec["method"], precision=spec["precision"],
                                       lora_rank=spec["lora_rank"],
                                       gradient_checkpointing=spec["gradient_checkpointing"])
        trainer = build_trainer(model, [random_reward], dataset, args, tokenizer=tokenizer)
        # Loading reads the weights through a memory map, which counts twice for a moment; the peak
        # that matters is the training step's, with the weights resident.
        import gc

        gc.collect()
        _reset_peak_rss()
        started = time.perf_counter()
        trainer.train()
        measured_states = state_bytes(trainer.model, trainer.optimizer)
    except torch.OutOfMemoryError as exc:
        status, error = "oom", str(exc).splitlines()[0][:200]
    seconds = (time.perf_counter() - started) / spec["steps"]
    if device.kind == "cuda":
        peak, measure = torch.cuda.max_memory_allocated(), "torch.cuda.max_memory_allocated"
    else:
        peak, measure = _peak_rss_bytes() - baseline, "CPU: peak RSS during training minus RSS before loading"
    return dict(status=status, error=error, peak=peak, measure=measure, seconds_per_step=seconds,
                device=str(device), device_kind=device.kind, **measured_states)


def _run_worker(kind: str, spec: dict, timeout: float) -> dict:
    """Run ``python -m labkit.memory KIND SPEC`` in a fresh process and return its JSON answer."""
    import subprocess

    env = dict(os.environ)
    # glibc otherwise serves large blocks from its heap after the first frees and keeps them: with a
    # fixed mmap threshold every tensor over 64 KiB is its own mapping, so RSS follows live memory.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    proc = subprocess.run([sys.executable, "-m", "labkit.memory", kind, json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    answers = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not answers:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"status": "error", "error": " | ".join(tail)[-400:]}
    return json.loads(answers[-1])


def bench_memory_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit bench memory``: measure peaks of real GRPO steps and append them to results/memory.csv.

    Each configuration runs in a fresh process: a catalogue architecture with random weights (memory
    depends on shapes, not values), saved to a temporary folder, loaded with
    :func:`labkit.models.load_policy`, trained for ``--steps`` TRL GRPO steps with every completion
    forced to full length. GPU: ``torch.cuda.max_memory_allocated``. CPU: peak resident memory of
    the process minus its resident memory before the model is loaded (it also counts Python objects
    and allocator slack, so it reads a little high). Each row carries the estimator's prediction.
    """
    from labkit.bench import append_csv, results_dir
    from labkit.device import DeviceInfo, choose_precision
    from labkit.lab import package_versions, provenance

    parser = argparse.ArgumentParser(prog="python -m labkit bench memory", description=bench_memory_cli.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=("gpu", "cpu", "none"), default=None,
                        help="a grid of configurations (default: gpu on a CUDA machine, else cpu); "
                             "'none' measures only --model x --method x --num-generations")
    parser.add_argument("--model", nargs="+", default=None, help="catalogue names (with --preset none)")
    _add_setting_arguments(parser, many=True)
    parser.set_defaults(prompt_len=None, completion_len=None)
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps (>= 2, so optimizer states exist)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None)
    parser.add_argument("--cap-gib", type=float, default=None,
                        help="pretend the GPU has this much memory (torch.cuda.set_per_process_memory_fraction)")
    parser.add_argument("--memory-fraction", type=float, default=None, help="the same, as a fraction of the GPU")
    parser.add_argument("--out", default=None, help="CSV to append to (default results/memory.csv)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per configuration")
    parser.add_argument("--dry-run", action="store_true", help="print the configurations and predictions only")
    args = parser.parse_args(argv)

    # The parent never touches CUDA (a CUDA context here would take GPU memory from the measured
    # processes): a worker reports the device, and this process plans with a description of it.
    probe = _run_worker("probe", {"device": args.device}, timeout=300)
    if probe.get("status") != "ok":
        print(f"error: could not inspect the device: {probe.get('error')}", file=sys.stderr)
        return 2
    device = DeviceInfo(**{k: tuple(v) if k == "compute_capability" and v else v for k, v in probe["device"].items()})
    preset = args.preset or ("none" if args.model else ("gpu" if device.kind == "cuda" else "cpu"))
    if preset == "none":
        grid = [(m, meth, g) for m in (args.model or ["Qwen/Qwen2.5-0.5B-Instruct"]) for meth in args.method
                for g in args.num_generations]
    else:
        grid = GPU_GRID if preset == "gpu" else CPU_GRID
    on_cpu = device.kind != "cuda"
    prompt_len = args.prompt_len or (32 if on_cpu else 128)
    completion_len = args.completion_len or (32 if on_cpu else 256)
    precision = choose_precision(device)
    if any(meth == "qlora" for _, meth, _ in grid) and on_cpu:
        if preset == "none":
            print("error: QLoRA stores weights in 4-bit with bitsandbytes and needs a CUDA GPU; "
                  f"this machine has {device}. Measure --method full or lora here.", file=sys.stderr)
            return 2
        grid = [row for row in grid if row[1] != "qlora"]
    cap = args.cap_gib
    if args.memory_fraction and device.kind == "cuda":
        cap = args.memory_fraction * device.total_memory_gib
    if (cap or args.memory_fraction) and on_cpu:
        print("error: --cap-gib / --memory-fraction limit GPU memory; there is no CUDA GPU here", file=sys.stderr)
        return 2
    if args.steps < 2:
        print("error: --steps must be at least 2: AdamW creates its states in the first step", file=sys.stderr)
        return 2

    import shutil
    import tempfile

    from labkit.device import torch_dtype
    from labkit.models import build_tiny_model

    versions = package_versions()
    out = args.out or results_dir() / "memory.csv"
    folders: dict[tuple[str, str], str] = {}
    failures = 0
    try:
        for model, method, g in grid:
            spec = dict(model=model, method=method, num_generations=g, per_device_batch=args.per_device_batch,
                        prompt_len=prompt_len, completion_len=completion_len, optimizer=args.optimizer,
                        gradient_checkpointing=args.gradient_checkpointing, beta=args.beta, precision=precision,
                        lora_rank=args.lora_rank, gradient_accumulation_steps=args.gradient_accumulation_steps,
                        steps=args.steps, device=device.kind, cap_gib=cap)
            est = estimate(str(build_tiny_model(model.removeprefix("tiny-"))) if model.startswith("tiny-") else model,
                           method, num_generations=g, per_device_batch=args.per_device_batch,
                           prompt_len=prompt_len, completion_len=completion_len, optimizer=args.optimizer,
                           gradient_checkpointing=args.gradient_checkpointing, beta=args.beta, precision=precision,
                           lora_rank=args.lora_rank, gradient_accumulation_steps=args.gradient_accumulation_steps,
                           device="cuda" if device.kind == "cuda" else "cpu")
            label = f"{model} {method} G={g}"
            if args.dry_run:
                print(f"{label:<48} predicted {est.total:7.2f} GiB")
                continue
            dtype_name = str(torch_dtype(precision, method)).removeprefix("torch.")
            key = (model, dtype_name)
            if model.startswith("tiny-"):  # labkit's tiny models live in its cache, built once
                spec["path"] = str(build_tiny_model(model.removeprefix("tiny-")))
            elif key not in folders:
                folders[key] = tempfile.mkdtemp(prefix="labkit-arch-")
                built = _run_worker("build", dict(model=model, dtype=dtype_name, folder=folders[key]), args.timeout)
                if built.get("status") != "ok":
                    print(f"{label}: could not build the architecture: {built.get('error')}", file=sys.stderr)
                    failures += 1
                    continue
            spec.setdefault("path", folders.get(key))
            result = _run_worker("measure", spec, args.timeout)
            if result.get("status") == "error":
                failures += 1
            peak = result.get("peak")
            row = dict(
                date=provenance(device)["date"], device=result.get("device", str(device)), device_kind=device.kind,
                model=model, method=method, num_generations=g, per_device_batch=args.per_device_batch,
                prompt_len=prompt_len, completion_len=completion_len, optimizer=args.optimizer,
                gradient_checkpointing=args.gradient_checkpointing, beta=args.beta, precision=precision,
                lora_rank=args.lora_rank if method != "full" else "", steps=args.steps, cap_gib=cap or "",
                status=result.get("status"), measured_peak_gib=round(peak / GIB, 4) if peak else "",
                measure=result.get("measure", result.get("error", "")),
                predicted_total_gib=round(est.total, 4),
                error_pct=round(100 * (est.total * GIB - peak) / peak, 1) if peak and result["status"] == "ok" else "",
                measured_weights_gib=round(result["weights"] / GIB, 4) if "weights" in result else "",
                predicted_weights_gib=round(est.weights, 4),
                measured_optimizer_gib=round(result["optimizer"] / GIB, 4) if "optimizer" in result else "",
                predicted_optimizer_gib=round(est.optimizer, 4),
                predicted_activations_gib=round(est.activations, 4), predicted_logits_gib=round(est.logits, 4),
                predicted_kv_cache_gib=round(est.kv_cache, 4),
                seconds_per_step=round(result["seconds_per_step"], 2) if "seconds_per_step" in result else "",
                **{k: versions.get(k) or "" for k in ("torch", "transformers", "trl", "peft", "bitsandbytes")},
            )
            append_csv(out, [{k: row[k] for k in _MEMORY_CSV_FIELDS}])
            shown = f"{row['measured_peak_gib']} GiB" if peak else row["measure"]
            print(f"{label:<48} {row['status']:<5} measured {shown}  predicted {est.total:.3f} GiB"
                  + (f"  ({row['error_pct']:+} %)" if row["error_pct"] != "" else ""), flush=True)
    finally:
        for folder in folders.values():
            shutil.rmtree(folder, ignore_errors=True)
    if not args.dry_run:
        print(f"appended to {out}")
    return 1 if failures else 0



# --------------------------------------------------------------------------- python -m labkit bench chunked-logps

# Measured on CPU (results/chunked_logps.json): the unchunked path peaks near 4.3 x the fp32 logits
# (logits, log-sum-exp backward temporaries, the gather's gradient, their sum). Used to refuse a
# run that would not fit in this machine's memory, before it starts.
_UNCHUNKED_PEAK_FACTOR = 4.5


def _chunked_worker(spec: dict) -> dict:
    """Score ``sequences x completion_len`` tokens with :func:`labkit.objective.per_token_logps`, forward
    and backward, and return the peak memory and times (runs in a fresh process)."""
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from labkit.dashboard import process_rss
    from labkit.models import architecture_config
    from labkit.objective import per_token_logps

    torch.set_num_threads(spec["threads"])
    config = architecture_config(spec["model"], num_hidden_layers=spec["layers"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # As with LoRA, the LM head (tied to the embedding) does not train: what remains is the cost of
    # the log-probabilities themselves, not of a (V, H) weight gradient.
    model.get_input_embeddings().weight.requires_grad_(False)
    generator = torch.Generator().manual_seed(1)
    seq = spec["prompt_len"] + spec["completion_len"]
    input_ids = torch.randint(0, config.vocab_size, (spec["sequences"], seq), generator=generator)  # (B, P + C)
    attention_mask = torch.ones_like(input_ids)
    advantages = torch.randn(spec["sequences"], 1, generator=generator)  # (B, 1) a GRPO-like weighting
    import gc

    gc.collect()
    baseline = process_rss()
    _reset_peak_rss()
    started = time.perf_counter()
    logps = per_token_logps(model, input_ids, attention_mask, spec["completion_len"],
                            chunk_size=spec["chunk_size"])  # (B, C)
    forward_s = time.perf_counter() - started
    (-(logps * advantages).mean()).backward()
    backward_s = time.perf_counter() - started - forward_s
    peak = _peak_rss_bytes() - baseline
    grad = model.model.layers[-1].mlp.down_proj.weight.grad  # (H, I) one weight's gradient, to compare variants
    torch.save({"logps": logps.detach(), "grad": grad}, spec["tensors"])
    return dict(status="ok", peak_bytes=peak, forward_s=forward_s, backward_s=backward_s,
                baseline_rss_bytes=baseline)


def bench_chunked_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit bench chunked-logps``: peak CPU memory of chunked vs unchunked log-probs.

    Runs :func:`labkit.objective.per_token_logps` (forward and backward) on a one-layer model with
    the width and vocabulary of ``--model`` (Qwen2.5-0.5B: 896 and 151,936), random weights, the LM
    head frozen, for ``--sequences`` sequences of ``--completion-len`` scored tokens, once unchunked
    and once per ``--chunk-sizes``. Each variant runs in a fresh process; its peak is the peak
    resident memory during the forward and backward minus the resident memory just before (model
    and inputs already built), read from the kernel (``VmHWM`` after resetting it), with glibc's
    mmap threshold fixed so that freed tensors leave the resident set. Values and gradients of the
    variants are compared. A variant that would not fit in the memory available now is skipped,
    not run. Appends a record to ``results/chunked_logps.json``.
    """
    import tempfile

    import psutil

    from labkit.bench import results_dir, write_json
    from labkit.lab import provenance
    from labkit.models import architecture_config

    parser = argparse.ArgumentParser(prog="python -m labkit bench chunked-logps", description=bench_chunked_cli.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct", help="catalogue architecture (width, vocabulary)")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--completion-len", type=int, default=512)
    parser.add_argument("--chunk-sizes", nargs="+", default=["none", "1024", "256"],
                        help="positions per chunk; 'none' is the unchunked baseline")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    parser.add_argument("--headroom-gib", type=float, default=3.0,
                        help="memory to leave free for everything else on this machine")
    parser.add_argument("--out", default=None, help="JSON file (default results/chunked_logps.json)")
    args = parser.parse_args(argv)

    config = architecture_config(args.model)
    vocab = config.vocab_size
    scored = args.sequences * args.completion_len
    logits_gib = scored * vocab * 4 / GIB
    chunk_sizes = [None if c.lower() == "none" else int(c) for c in args.chunk_sizes]
    settings = dict(model=args.model, layers=args.layers, hidden_size=config.hidden_size, vocab_size=vocab,
                    sequences=args.sequences, prompt_len=args.prompt_len, completion_len=args.completion_len,
                    dtype="fp32", lm_head="frozen", threads=args.threads, scored_tokens=scored,
                    full_logits_gib=round(logits_gib, 3))
    print(f"{args.sequences} sequences x {args.completion_len} scored tokens x vocabulary {vocab:,}: "
          f"the fp32 logits alone are {logits_gib:.2f} GiB")
    runs, tensors = [], {}
    folder = tempfile.mkdtemp(prefix="labkit-chunked-")
    for chunk in chunk_sizes:
        name = "unchunked" if chunk is None else f"chunk {chunk}"
        rows = scored if chunk is None else min(chunk, scored)
        need_gib = _UNCHUNKED_PEAK_FACTOR * rows * vocab * 4 / GIB + 1.0
        available_gib = psutil.virtual_memory().available / GIB
        if need_gib > available_gib - args.headroom_gib:
            reason = (f"not run: needs about {need_gib:.1f} GiB ({_UNCHUNKED_PEAK_FACTOR} x its {rows} x {vocab} "
                      f"fp32 logits), {available_gib:.1f} GiB available, {args.headroom_gib} GiB kept free")
            print(f"{name:<10} {reason}")
            runs.append(dict(variant=name, chunk_size=chunk, status="skipped", reason=reason))
            continue
        spec = dict(model=args.model, layers=args.layers, sequences=args.sequences, prompt_len=args.prompt_len,
                    completion_len=args.completion_len, chunk_size=chunk, threads=args.threads,
                    tensors=os.path.join(folder, f"{name.replace(' ', '_')}.pt"))
        result = _run_worker("chunked", spec, timeout=3600)
        if result.get("status") != "ok":
            print(f"{name:<10} failed: {result.get('error')}")
            runs.append(dict(variant=name, chunk_size=chunk, status="error", reason=result.get("error")))
            continue
        tensors[name] = spec["tensors"]
        run = dict(variant=name, chunk_size=chunk, status="ok", peak_gib=round(result["peak_bytes"] / GIB, 3),
                   forward_s=round(result["forward_s"], 2), backward_s=round(result["backward_s"], 2))
        runs.append(run)
        print(f"{name:<10} peak {run['peak_gib']:.3f} GiB over baseline | forward {run['forward_s']:.1f} s, "
              f"backward {run['backward_s']:.1f} s", flush=True)

    import torch

    summary = {}
    if "unchunked" in tensors:
        reference = torch.load(tensors["unchunked"])
        base = next(r for r in runs if r["variant"] == "unchunked")
        for run in runs:
            if run["status"] != "ok" or run["variant"] == "unchunked":
                continue
            other = torch.load(tensors[run["variant"]])
            run["max_abs_diff_logps"] = float((other["logps"] - reference["logps"]).abs().max())
            run["max_abs_diff_grad"] = float((other["grad"] - reference["grad"]).abs().max())
            run["peak_reduction_pct"] = round(100 * (1 - run["peak_gib"] / base["peak_gib"]), 1)
            summary[run["variant"]] = run["peak_reduction_pct"]
            print(f"{run['variant']:<10} {run['peak_reduction_pct']:.1f} % lower peak; max |diff| logps "
                  f"{run['max_abs_diff_logps']:.2e}, gradient {run['max_abs_diff_grad']:.2e}")
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    record = dict(settings=settings, runs=runs, peak_reduction_pct=summary,
                  measure="peak RSS (VmHWM, reset before the call) minus RSS before, fresh process per variant",
                  provenance=provenance())
    out = args.out or results_dir() / "chunked_logps.json"
    existing = json.loads(open(out).read()) if os.path.exists(out) else {"records": []}
    existing.setdefault("records", []).append(record)
    write_json(out, existing)
    print(f"appended to {out}")
    return 0 if all(r["status"] != "error" for r in runs) else 1



# --------------------------------------------------------------------------- python -m labkit bench full-vs-lora


def _nano_record(result, part: str, label: str) -> dict:
    """One run of :func:`labkit.nano.run_nano_grpo`, with its optimizer-state bytes, as a JSON-able dict."""
    from labkit.nano import NanoConfig, warm_up_path

    config = result.config
    # The AdamW states of the trainable parameters, counted exactly as tests/test_memory.py checks against
    # a real optimizer: 2 moments x 4 bytes (fp32) per trainable parameter + a 4-byte step per tensor.
    path = warm_up_path(NanoConfig(**config), progress=False)
    states = estimate(str(path), config["method"], precision="fp32", device="cpu", lora_rank=config["lora_rank"],
                      lora_dropout=0.0).bytes["optimizer"]
    tail = result.curve("reward")[-10:]
    return dict(
        part=part, label=label, method=config["method"],
        lora_rank=config["lora_rank"] if config["method"] == "lora" else None,
        learning_rate=config["learning_rate"], seed=config["seed"],
        accuracy_before=result.accuracy_before, final_accuracy=result.accuracy_after,
        final_greedy_accuracy=result.after.get("greedy_accuracy"),
        train_reward_last10=sum(tail) / len(tail), seconds_per_step=result.seconds_per_step,
        trainable_params=result.parameters["trainable"], total_params=result.parameters["total"],
        optimizer_state_bytes=states,
        curve=result.curve("reward"), accuracy_curve=result.curve("rewards/accuracy_reward/mean"),
        evals=[{"step": e["step"], "accuracy": e["accuracy"]} for e in result.evals],
    )


def bench_full_vs_lora_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit bench full-vs-lora``: full-parameter vs LoRA GRPO on the CPU nano task -> results/.

    1. A learning-rate sweep (``--sweep-seed``) for full fine-tuning and for LoRA of the first rank.
       Each method's rate is chosen by its mean *training* reward over the last 10 steps (never by
       the held-out accuracy reported afterwards).
    2. The comparison: full, and LoRA at each of ``--ranks``, at the chosen rates, for every seed of
       ``--seeds``: reward curves, held-out accuracy (pass@1) before and after, seconds per GRPO step,
       trainable parameters and AdamW state bytes.

    Writes ``results/full_vs_lora.json``; ``05_full_vs_lora.ipynb`` plots it. The task and every
    other knob are :class:`labkit.nano.NanoConfig`'s defaults (the main job's).
    """
    import dataclasses
    import time

    import torch

    from labkit.bench import results_dir, write_json
    from labkit.lab import provenance
    from labkit.nano import NanoConfig, run_nano_grpo

    parser = argparse.ArgumentParser(prog="python -m labkit bench full-vs-lora", description=bench_full_vs_lora_cli.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--learning-rates", type=float, nargs="+", default=[3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2])
    parser.add_argument("--sweep-seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=NanoConfig.max_steps)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; 1 keeps the seconds per step comparable on a shared machine")
    parser.add_argument("--out", default=None, help="JSON file (default results/full_vs_lora.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    base = dataclasses.replace(NanoConfig(), max_steps=args.max_steps)
    started = time.perf_counter()
    runs = []

    def run(part, label, **changes):
        result = run_nano_grpo(dataclasses.replace(base, **changes), progress=False)
        record = _nano_record(result, part, label)
        runs.append(record)
        print(f"{part:<10} {label:<10} lr {record['learning_rate']:<7g} seed {record['seed']}: held-out "
              f"{record['accuracy_before']:.3f} -> {record['final_accuracy']:.3f}, train reward (last 10) "
              f"{record['train_reward_last10']:.3f}, {record['seconds_per_step']:.2f} s/step", flush=True)
        return record

    chosen = {}
    for method in ("full", "lora"):
        label = "full" if method == "full" else f"lora r={args.ranks[0]}"
        sweep = [run("lr_sweep", label, method=method, lora_rank=args.ranks[0], learning_rate=lr, seed=args.sweep_seed)
                 for lr in args.learning_rates]
        chosen[method] = max(sweep, key=lambda r: r["train_reward_last10"])["learning_rate"]
    print(f"chosen learning rates (best training reward): {chosen}")
    for seed in args.seeds:
        run("comparison", "full", method="full", learning_rate=chosen["full"], seed=seed)
        for rank in args.ranks:
            run("comparison", f"lora r={rank}", method="lora", lora_rank=rank, learning_rate=chosen["lora"], seed=seed)
    record = dict(
        benchmark="full vs LoRA GRPO on the nano task (two-digit addition with a carry, CPU)",
        command=("python -m labkit bench full-vs-lora " + " ".join(argv or [])).strip(),
        settings=dict(task="labkit.nano: two-digit addition, sloppy-teacher warm-up, then GRPO",
                      config=dataclasses.asdict(base) | {"seed": None, "method": None, "learning_rate": None},
                      seeds=args.seeds, ranks=args.ranks, learning_rates=args.learning_rates,
                      sweep_seed=args.sweep_seed, chosen_learning_rates=chosen, threads=args.threads,
                      selection="each method's rate with the best mean training reward over the last 10 steps",
                      accuracy="held-out pass@1 (labkit.nano.evaluate)",
                      optimizer_state_bytes="AdamW, fp32: 2 x 4 bytes per trainable parameter + 4 per tensor"),
        runs=runs, seconds_total=round(time.perf_counter() - started, 1), provenance=provenance(),
    )
    out = write_json(args.out or results_dir() / "full_vs_lora.json", record)
    print(f"wrote {out} ({record['seconds_total']:.0f} s)")
    return 0


if __name__ == "__main__":  # the benchmarks' worker processes: python -m labkit.memory KIND SPEC
    if len(sys.argv) != 3:
        raise SystemExit("labkit.memory runs the benchmarks' worker processes; use python -m labkit estimate "
                         "or python -m labkit bench memory | chunked-logps instead")
    _kind, _spec = sys.argv[1], json.loads(sys.argv[2])
    try:
        if _kind == "probe":
            from labkit.device import detect_device

            _answer = {"status": "ok", "device": detect_device(_spec["device"]).as_dict()}
        elif _kind == "build":
            import torch

            from labkit.models import save_random_architecture

            save_random_architecture(_spec["model"], _spec["folder"], dtype=getattr(torch, _spec["dtype"]))
            _answer = {"status": "ok"}
        elif _kind == "measure":
            _answer = _measure_grpo_worker(_spec)
        elif _kind == "chunked":
            _answer = _chunked_worker(_spec)
        else:
            raise SystemExit(f"unknown worker {_kind!r}")
    except Exception as _exc:  # reported to the parent, which records the failure
        _answer = {"status": "error", "error": f"{type(_exc).__name__}: {_exc}"[:400]}
    print(json.dumps(_answer), flush=True)
