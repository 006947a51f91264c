"""Where the memory of a GRPO step goes: a model's shape, and an estimator from shapes alone.

Introduced in ``05_full_vs_lora.ipynb``. One GRPO step has two phases that never overlap:

1. **generation**: the policy samples the whole generation batch in one ``generate`` call with a KV cache, under
   ``torch.no_grad()``: ``per_device_train_batch_size x steps_per_generation`` completions on each device (TRL
   1.16's units; ``num_generations`` of them share a prompt);
2. **training**: forward and backward over ``per_device_train_batch_size`` completions of prompt + completion tokens
   at a time, then the optimizer step.

Weights, the reference model and the optimizer states live through both, so

``peak = weights + reference + optimizer + max(generation, gradients + activations + logits)``

:func:`model_shape` builds an architecture on PyTorch's ``meta`` device (any entry of
:data:`labkit.models.ARCHITECTURES`, a transformers config, a saved model folder or a loaded model) and returns its
:class:`ModelShape`: layers, widths, heads, vocabulary, parameter counts, every ``nn.Linear`` a LoRA could adapt.
:func:`estimate` computes every term from it. :func:`labkit.monitor.state_bytes` and
:func:`labkit.monitor.saved_activation_bytes` measure the same quantities on a real model, exactly (the tests hold
the estimator to them), and :func:`labkit.charts.plot_breakdown` draws the terms against a card. Measured peaks of
real TRL GRPO steps come from ``python -m bench memory``, the live readings of a running step from
:mod:`labkit.monitor`, and the memory of each phase, by which the OOM doctor weighs a change, from
:mod:`labkit.oom`.
"""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, field

from labkit.models import DEFAULT_LORA_TARGETS, LORA_DROPOUT, architecture_config, check_method

__all__ = ["GIB", "OPTIMIZERS", "OPTIMS", "EIGHT_BIT_OPTIMS", "optimizer_layout", "gib", "MemoryEstimate",
           "ModelShape", "model_config", "model_shape", "estimate", "generation_batch", "hidden_state_bytes",
           "adapter_bytes", "fused_head", "PRECISION_BYTES"]

GIB = 1024**3


def gib(n: int | float | None) -> float | None:
    """Return ``n`` bytes in GiB (``None`` stays ``None``): the one conversion every figure uses."""
    return None if n is None else n / GIB


# GRPOConfig.optim values the lab uses (TRL's / transformers' names); the 8-bit ones are bitsandbytes'.
OPTIMS = ("adamw_torch", "adamw_torch_fused", "adamw_bnb_8bit", "paged_adamw_8bit", "adamw_8bit", "paged_adamw_32bit")
EIGHT_BIT_OPTIMS = ("adamw_bnb_8bit", "paged_adamw_8bit", "adamw_8bit")
# The estimator's two layouts of optimiser state: torch's AdamW, or a bitsandbytes 8-bit one.
OPTIMIZERS = ("adamw", "adamw_8bit")


def optimizer_layout(optim: str) -> str:
    """Return the state layout (``"adamw"`` or ``"adamw_8bit"``) of a ``GRPOConfig.optim`` name or a layout name."""
    if optim in OPTIMIZERS:
        return optim
    if optim in OPTIMS:
        return "adamw_8bit" if optim in EIGHT_BIT_OPTIMS else "adamw"
    raise ValueError(f"optimizer must be one of {OPTIMS} (or the estimator's {OPTIMIZERS}), not {optim!r}")


PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

# bitsandbytes NF4 with double quantisation (what labkit.models.load_policy asks for): 4 bits a weight, one 8-bit
# absmax per block of 64 weights, one fp32 absmax per 256 of those blocks.
QLORA_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)
# bitsandbytes' 8-bit optimisers: tensors under 4,096 elements keep 32-bit states; others keep two uint8 states and
# one fp32 absmax per 256-element block for each.
_BNB_MIN_8BIT_SIZE = 4096
_BNB_BLOCK = 256
# TRL 1.16's fused LM head (trl.kernels.chunked_logprob): tiles of 4,096 tokens x 32,768 vocabulary entries.
_TRL_TOKEN_CHUNK = 4096
_TRL_VOCAB_CHUNK = 32768
# On CPU the tile is folded by torch ops (trl.kernels.chunked_logprob._backward_tile): the tile, y, z, log_p, p, grad,
# the one-hot mask and two products live at once. Measured: 1.033 MiB per scored token at 32,768 columns in fp32 =
# 8.25 tiles.
_CPU_TILE_COPIES = 8.25


def fused_head(batch: int, completion_len: int, seq: int, vocab: int, b: int, device: str) -> tuple[int, float]:
    """Return ``(N, bytes of one tile)`` of TRL 1.16's fused LM head. ``N`` scored positions: ``B C`` completion tokens
    on CUDA (Triton scores only those), ``B (S - 1)`` on CPU, where TRL folds each tile with torch ops: about 8 fp32
    temporaries of the tile's size."""
    scored = batch * completion_len if device == "cuda" else batch * (seq - 1)
    tile = min(scored, _TRL_TOKEN_CHUNK) * min(vocab, _TRL_VOCAB_CHUNK)
    return scored, tile * (b if device == "cuda" else 4 * _CPU_TILE_COPIES)


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
    context: int | None = None  # max_position_embeddings: what prompt + completion must fit in

    def lora_targets(self, targets) -> list[tuple[int, int]]:
        """Return ``[(in_features, out_features), ...]`` of the Linear layers a LoRA with ``targets`` adapts."""
        wanted = set(targets)
        return [(i, o) for name, i, o in self.lora_modules if name in wanted]


def model_config(model):
    """Return ``(name, transformers config)`` for a catalogue name, a saved folder, a config or a model."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(model, PretrainedConfig):
        return getattr(model, "_name_or_path", "") or model.model_type, model
    if hasattr(model, "config") and isinstance(model.config, PretrainedConfig):
        return model.config._name_or_path or model.config.model_type, model.config
    name = str(model)
    if os.path.isdir(name):
        return name, AutoConfig.from_pretrained(name)
    return name, architecture_config(name)


@functools.lru_cache(maxsize=64)
def _shape_from_json(name: str, config_json: str) -> ModelShape:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**json.loads(config_json))
    with torch.device("meta"):  # shapes only: no memory is allocated
        meta = AutoModelForCausalLM.from_config(config)
    text = config.get_text_config()
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    numels = [p.numel() for p in meta.parameters()]  # parameters() yields tied weights once
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
        context=getattr(text, "max_position_embeddings", None),
    )


def model_shape(model) -> ModelShape:
    """Return the :class:`ModelShape` of ``model``: a catalogue name, a saved folder, a config or a model.

    The architecture is built on PyTorch's ``meta`` device, so counting the parameters of a 7B
    model costs no memory. Results are cached per configuration.
    """
    name, config = model_config(model)
    config_dict = config.to_dict()
    for key in ("_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype"):
        config_dict.pop(key, None)
    return _shape_from_json(name, json.dumps(config_dict, sort_keys=True, default=str))


# --------------------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class MemoryEstimate:
    """What :func:`estimate` returns: the memory of one GRPO step, term by term.

    ``bytes`` holds each term in bytes (exact integers for weights, gradients and optimizer states); the attributes of
    the same names give GiB. ``generation_phase`` and ``training_phase`` are the peaks of the two phases; ``total`` is
    the larger of them.
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
            ("kv_cache", "generation: KV cache + working set at the larger of prefill and the end of decoding"
             + (f" (tool rounds: up to {self.settings['generation_tokens']} tokens)"
                if self.settings.get("max_tool_calling_iterations") else "")),
            ("transients", "generation: LoRA's fp32 input casts (prefill), autocast's copies of fp32 weights"),
            ("gradients", "gradients of the trainable parameters"),
            ("activations", "activations kept for the backward pass"),
            ("logits", "LM-head / log-prob buffers"),
        ]
        lines = [f"{'term':<12} {'GiB':>8}  what"]
        lines += [f"{key:<12} {self.bytes[key] / GIB:>8.3f}  {what}" for key, what in rows]
        held, gen, train = "weights + reference + optimizer", self.generation_phase, self.training_phase
        lines += [f"{'generation':<12} {gen:>8.3f}  phase 1 = {held} + kv_cache + transients",
                  f"{'training':<12} {train:>8.3f}  phase 2 = {held} + gradients + activations + logits",
                  f"{'total':<12} {self.total:>8.3f}  peak = max(generation, training)"]
        return "\n".join(lines)


def hidden_state_bytes(method: str, precision: str, prepare_model_for_kbit_training: bool = False) -> int:
    """Return the bytes of one element of the hidden states (residual stream, checkpointed inputs, KV cache).

    The precision's size (bf16/fp16 2, fp32 4): full, LoRA, and QLoRA as TRL 1.16 builds it with the training dtype
    in ``model_init_kwargs``, as labkit passes it (TRL's own default, float32, would load the embeddings and norms in
    fp32). 4 for QLoRA with ``prepare_model_for_kbit_training``: PEFT turns the embeddings and norms into fp32, and a
    bitsandbytes 4-bit linear layer returns its input's dtype, so the residual stream, what checkpointing keeps and
    the KV cache are fp32 (checked on a real 4-bit model in the tests).
    """
    check_method(method)
    return 4 if method == "qlora" and prepare_model_for_kbit_training else PRECISION_BYTES[precision]


def adapter_bytes(method: str, precision: str) -> int:
    """Return the bytes of a trainable adapter weight: fp32 (PEFT) for LoRA; for QLoRA the dtype
    :func:`labkit.models.adapter_dtype` gives (bf16 under bf16, as TRL casts them; fp32 otherwise)."""
    return 2 if method == "qlora" and precision == "bf16" else 4


def _layer_activation_bytes(shape: ModelShape, *, method: str, act_bytes: int, autocast_adapters: bool,
                            device: str, lora_rank: int, lora_targets, lora_dropout: float, padded: bool,
                            seq_len: int, hidden_bytes: int, masters: bool) -> tuple[float, float]:
    """Return ``(bytes per token, bytes per layer)`` that autograd keeps for one decoder layer.

    Counted from what each operation saves for its backward (checked against
    :func:`labkit.monitor.saved_activation_bytes` on CPU in the tests). ``b`` is the activation dtype's size.
    ``masters``: full fine-tuning with fp32 master weights under 16-bit autocast, whose residual stream is fp32 (fp32
    embeddings and norms; autocast only lowers the matmuls).
    """
    b = act_bytes
    hb = hidden_bytes  # QLoRA with PEFT's upcast: fp32 outputs of the 4-bit projections
    h, i = shape.hidden_size, shape.intermediate_size
    q = shape.num_heads * shape.head_dim
    kv = shape.num_kv_heads * shape.head_dim
    full = method == "full"
    # RMSNorm upcasts to fp32: pow and mul keep the fp32 input (4h) and rsqrt (4); the weight multiply keeps the
    # normalised input (b*h) only when the norm weight trains. With fp32 masters that input is the fp32 residual
    # stream's.
    norm = 4 * h + 4 + ((4 if masters else b) * h if full else 0)
    per_token = 2 * norm
    if full:
        # Inputs of the trainable projections, kept for their weight gradients: q/k/v share one input, gate/up share
        # one, down_proj's input is the gated product. o_proj's input is the attention output, already kept by SDPA
        # (same storage). With fp32 masters each projection casts the fp32 norm output itself: one 16-bit copy per
        # projection.
        per_token += (3 if masters else 1) * b * h + (2 if masters else 1) * b * h + b * i
    if shape.qk_norm:  # RMSNorm over each head of the queries and keys
        per_token += 4 * q + 4 * shape.num_heads + 4 * kv + 4 * shape.num_kv_heads
        if full:
            per_token += b * (q + kv)
    # SDPA (flash / memory-efficient kernels) keeps q, k, v, its output and the log-sum-exp (fp32, one per head). With
    # a padding mask transformers repeats the K/V heads, and SDPA keeps the mask turned into an additive bias of shape
    # (batch, 1, S, S) in every layer.
    kv_kept = q if padded else kv
    per_token += b * (q + 2 * kv_kept + q) + 4 * shape.num_heads
    if padded:
        per_token += b * seq_len
    # SwiGLU: the gate projection's output (for SiLU), SiLU's output and the up projection's output (for the product).
    per_token += 3 * hb * i
    per_layer = 0.0
    if method in ("lora", "qlora"):
        targets = shape.lora_targets(lora_targets)
        layer_targets = targets[: len(targets) // max(shape.num_layers, 1)]
        for in_f, out_f in layer_targets:
            # PEFT's adapters are fp32 (autocast_adapter_dtype). Dropout keeps its mask: a bool per element with
            # CUDA's fused kernel, a float mask in the adapter dtype on CPU. lora_A keeps its input: the dropout
            # output, or its autocast copy in the compute dtype.
            adapter_input = b if autocast_adapters else 4
            if lora_dropout > 0:
                mask = 1 if device == "cuda" else 4
                per_token += (mask + adapter_input) * in_f
                if hb > b and autocast_adapters:  # QLoRA: dropout's own output is fp32, autocast copies it
                    per_token += hb * in_f
            else:
                per_token += adapter_input * in_f if autocast_adapters else 0
            per_token += b * lora_rank  # lora_A's output, kept by lora_B
            if autocast_adapters:  # autocast's half-precision copies of A and B, kept for backward
                per_layer += b * lora_rank * (in_f + out_f)
        if lora_dropout == 0 and not autocast_adapters:
            # Without dropout or casts lora_A keeps the input tensor itself, shared by the projections that read it:
            # the two norm outputs and the gated product (o_proj's input is SDPA's output).
            per_token += b * (h + h + i)
    return per_token, per_layer


# The estimator's old argument names, renamed to TRL's (GRPOConfig's) own: what a learner reads there they type here.
_RENAMED = {"prompt_len": "max_prompt_length", "completion_len": "max_completion_length", "optimizer": "optim",
            "per_device_batch": "per_device_train_batch_size (it counts completions per forward/backward pass, as in "
                                "GRPOConfig: the old per_device_batch x num_generations / gradient_accumulation_steps)"}


def generation_batch(per_device_train_batch_size: int = 8, gradient_accumulation_steps: int = 1,
                     steps_per_generation: int | None = None, generation_batch_size: int | None = None,
                     num_generations: int = 8, num_processes: int = 1) -> tuple[int, int]:
    """Return ``(steps_per_generation, completions one device generates at once)``, as TRL 1.16 resolves them.

    ``GRPOConfig.__post_init__``: ``steps_per_generation`` defaults to ``gradient_accumulation_steps``;
    ``generation_batch_size`` (all processes) is ``per_device_train_batch_size x num_processes x
    steps_per_generation``; giving both is an error. One device generates ``per_device_train_batch_size x
    steps_per_generation`` completions in one ``generate`` call, then trains on them ``per_device_train_batch_size``
    at a time. ``num_generations`` only decides how many share a prompt: the generation batch must hold whole groups.
    Raises ``ValueError`` where TRL would, saying what to set. TRL's lines: docs/references.md, "Batch units".
    """
    for knob, value in dict(per_device_train_batch_size=per_device_train_batch_size,
                            gradient_accumulation_steps=gradient_accumulation_steps,
                            num_processes=num_processes).items():
        if value < 1:
            raise ValueError(f"{knob} must be at least 1, not {value}")
    if num_generations < 2:
        raise ValueError(f"num_generations must be at least 2 (the advantage compares completions of one prompt), "
                         f"not {num_generations}")
    per_step = per_device_train_batch_size * num_processes
    default = steps_per_generation is None and generation_batch_size is None  # TRL's: gradient_accumulation_steps
    if generation_batch_size is not None and steps_per_generation is not None:
        raise ValueError("generation_batch_size and steps_per_generation cannot both be set (TRL refuses it): "
                         "set one of them")
    if generation_batch_size is not None:
        if generation_batch_size < 1 or generation_batch_size % per_step:
            raise ValueError(f"generation_batch_size ({generation_batch_size}) must be a positive multiple of "
                             f"per_device_train_batch_size x num_processes ({per_step})")
        steps_per_generation = generation_batch_size // per_step
    steps_per_generation = gradient_accumulation_steps if steps_per_generation is None else steps_per_generation
    if steps_per_generation < 1:
        raise ValueError(f"steps_per_generation must be at least 1, not {steps_per_generation}")
    total = per_step * steps_per_generation
    if total % num_generations:
        raise ValueError(f"the generation batch, per_device_train_batch_size ({per_device_train_batch_size}) x "
                         f"num_processes ({num_processes}) x steps_per_generation ({steps_per_generation}"
                         f"{', = gradient_accumulation_steps by default' if default else ''}) = {total} completions, "
                         f"must be a multiple of num_generations ({num_generations}): TRL generates each prompt's "
                         f"{num_generations} completions in one generation batch")
    return steps_per_generation, per_device_train_batch_size * steps_per_generation


def estimate(model, method: str = "lora", *, per_device_train_batch_size: int = 8,
             gradient_accumulation_steps: int = 1, steps_per_generation: int | None = None,
             generation_batch_size: int | None = None, num_generations: int = 8, num_processes: int = 1,
             max_prompt_length: int = 256, max_completion_length: int = 512, optim: str = "adamw",
             gradient_checkpointing: bool = True, beta: float = 0.0, precision: str = "bf16",
             lora_rank: int = 16, lora_targets=None, lora_dropout: float = LORA_DROPOUT, device: str = "cuda",
             padded: bool = False, logits: str = "fused", fp32_master_weights: bool | None = None,
             prepare_model_for_kbit_training: bool = False, max_tool_calling_iterations: int = 0,
             **renamed) -> MemoryEstimate:
    """Return a :class:`MemoryEstimate`: the peak memory of one GRPO step of TRL 1.16 on one device, term by term.

    The batch arguments are ``GRPOConfig``'s, in its units. Each forward/backward pass trains on ``B =
    per_device_train_batch_size`` completions of ``S = max_prompt_length + max_completion_length`` tokens; one
    ``generate`` call samples ``B_gen = per_device_train_batch_size x steps_per_generation`` completions
    (:func:`generation_batch`). ``num_generations`` only says how many share a prompt: at a fixed batch and
    accumulation it changes no term. ``P`` parameters (tied weights once), ``P_t`` trainable ones; ``w`` the bytes of
    a weight and ``b`` of an activation (``precision``: bf16/fp16 2, fp32 4); layers ``L``, hidden ``h``, MLP ``i``,
    vocabulary ``V``, KV heads x head size ``kv``. Full fine-tuning keeps fp32 master weights under 16-bit autocast
    by default (as labkit and TRL load it): 16 bytes a parameter, the recipe that learns. ``fp32_master_weights=False``
    is pure bf16, 8 bytes a parameter, a memory-only figure: its AdamW steps round away (notebook 05, section 11).

    - **weights** ``= P w`` (full, LoRA's base); LoRA adds ``P_lora x 4`` (PEFT's fp32 adapters); QLoRA stores the
      ``nn.Linear`` weights in NF4, ``0.5 + 1/64 + 1/4096`` bytes each, every other weight in the training precision
      (as TRL loads it with labkit's dtype in ``model_init_kwargs``), its adapters bf16 under bf16 and fp32 otherwise
      (:func:`labkit.models.match_adapter_dtype`). With ``prepare_model_for_kbit_training`` PEFT turns every other
      weight into fp32 and the hidden states follow (:func:`hidden_state_bytes`): 4 bytes an element below.
    - **reference** ``= P w`` when ``beta > 0`` and ``method == "full"``; 0 with ``beta = 0`` (TRL's default) and
      with PEFT, whose reference is the base with its adapters off (or a frozen copy of the adapter, not counted).
    - **gradients** ``= P_t x (bytes of a trainable weight)``.
    - **optimizer**: ``adamw``: two moments in the parameter's dtype (``2 P_t w``) and a 4-byte step per tensor;
      ``adamw_8bit`` (bitsandbytes): 2 bytes a parameter plus one fp32 absmax per 256 per moment, 32-bit moments
      for tensors under 4,096 elements.
    - **activations**: what autograd keeps for the backward pass of each decoder layer, per token (the source of
      ``_layer_activation_bytes``: RMSNorm's fp32 copies, the projections' inputs, SDPA's q/k/v/output, SwiGLU's
      three ``i``-wide tensors, LoRA's dropout masks and inputs), times ``B S`` tokens and ``L`` layers. With
      gradient checkpointing each layer keeps only its input and one layer is recomputed: ``L b h B S + layer(B S)``.
    - **logits**: TRL 1.16's fused LM head never builds the ``(B, S, V)`` logits: the hidden states it scores
      (``N h b``), a tile of ``min(N, 4096) x min(V, 32768)`` logits, in the backward pass an fp32 gradient for the
      hidden states (``N h 4``) and, when the head trains, an fp32 accumulator for its weight (``V h 4``); ``N``
      from :func:`fused_head`. ``logits="full"`` counts a plain implementation instead: ``3 N V b``, ``N = B (C+1)``.
    - **kv_cache**: the larger of two moments that never coexist. The *prefill*: the prompt's keys and values
      (``2 L kv b B_gen P``, ``P = max_prompt_length``) and its largest intermediate (``B_gen P (3 i + 2 h) b``);
      the *end of decoding*: the full-length cache ``2 L kv b B_gen S``, one layer's copy of it while
      ``DynamicCache.update`` concatenates, and the sampling buffers (``B_gen V``). With tools
      (``max_tool_calling_iterations`` >= 1) the larger of that and a **tool round**, which prefills up to ``P + C``
      tokens and asks ``C`` new ones: a cache toward ``P + 2C`` tokens for the whole generation batch (notebook 08).
    - **transients** (generation; found by :mod:`bench.rehearse`): LoRA's fp32 input casts at the prefill (when it is
      the larger moment), autocast's copies of an fp32 LM head and of every fp32 master weight.

    ``peak = weights + reference + optimizer + max(kv_cache + transients, gradients + activations + logits)``:
    with accumulation the gradients of earlier micro-batches are alive during the next backward (with one
    micro-batch, an upper bound). Not counted: the CUDA context (about 0.3-0.5 GiB) and fragmentation; leave about
    1 GiB of headroom. Every source, with TRL's, PEFT's and bitsandbytes' lines: docs/references.md, "Memory facts"
    and "TRL 1.16, PEFT and bitsandbytes, as the lab teaches them".
    """
    if renamed:
        raise TypeError("estimate() got " + "; ".join(
            f"{old!r}: renamed {_RENAMED[old]}" if old in _RENAMED else f"an unexpected argument {old!r}"
            for old in renamed))
    check_method(method)
    optimizer = optimizer_layout(optim)
    for knob, value, allowed in (("precision", precision, tuple(PRECISION_BYTES)), ("device", device, ("cuda", "cpu")),
                                 ("logits", logits, ("fused", "full"))):  # fused: TRL 1.16's LM head
        if value not in allowed:
            raise ValueError(f"{knob} must be one of {allowed}, not {value!r}")
    for knob, value, least in (("max_completion_length", max_completion_length, 1), ("lora_rank", lora_rank, 1),
                               ("max_prompt_length", max_prompt_length, 0)):
        if value < least:
            raise ValueError(f"{knob} must be at least {least}, not {value}")
    if isinstance(max_tool_calling_iterations, bool) or not isinstance(max_tool_calling_iterations, int) \
            or max_tool_calling_iterations < 0:
        raise ValueError(f"max_tool_calling_iterations must be a whole number >= 0 (0: no tool), not "
                         f"{max_tool_calling_iterations!r}; for TRL's None (no limit) give any number >= 1")
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta must be a finite number >= 0, not {beta!r}")
    steps_per_generation, generation_batch_ = generation_batch(
        per_device_train_batch_size, gradient_accumulation_steps, steps_per_generation, generation_batch_size,
        num_generations, num_processes)
    prompt_len, completion_len = max_prompt_length, max_completion_length
    shape = model if isinstance(model, ModelShape) else model_shape(model)
    context = shape.context if shape is not model else None  # a plan's shape: its context checked by labkit.validation
    if context and prompt_len + completion_len > context:
        raise ValueError(f"max_prompt_length ({prompt_len}) + max_completion_length ({completion_len}) = "
                         f"{prompt_len + completion_len} tokens, more than {model}'s context of {context}; "
                         f"set max_completion_length to at most {max(1, context - prompt_len)}")
    micro_batch = per_device_train_batch_size
    targets = list(lora_targets or DEFAULT_LORA_TARGETS)
    b = PRECISION_BYTES[precision]
    if prepare_model_for_kbit_training and method != "qlora":
        raise ValueError(f"prepare_model_for_kbit_training applies to method='qlora' only, not {method!r}")
    upcast = bool(prepare_model_for_kbit_training)
    # Weight dtype of the policy as labkit.device.torch_dtype chooses it; None: what it loads, fp32 master weights
    # under autocast.
    masters = method == "full" and precision != "fp32" and (fp32_master_weights is None or bool(fp32_master_weights))
    w = 4 if precision == "fp32" or masters else 2
    seq = prompt_len + completion_len
    h, V, L = shape.hidden_size, shape.vocab_size, shape.num_layers
    kv = shape.num_kv_heads * shape.head_dim

    # --- weights, gradients, optimizer: exact
    if method == "full":
        trainable_numels = list(shape.param_numels)
        weights = shape.params * w
        trainable_bytes = w
    else:
        trainable_numels = [n for i, o in shape.lora_targets(targets) for n in (lora_rank * i, lora_rank * o)]
        adapters = sum(trainable_numels)
        if not trainable_numels:
            raise ValueError(f"no Linear layer of {shape.name} is called any of {targets}")
        trainable_bytes = adapter_bytes(method, precision)
        if method == "lora":
            weights = shape.params * w + adapters * 4
        else:
            other = shape.params - shape.quantisable_params
            weights = (math.ceil(shape.quantisable_params * QLORA_BYTES_PER_PARAM) + other * (4 if upcast else w)
                       + adapters * trainable_bytes)
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
    hb = hidden_state_bytes(method, precision, upcast)
    # The residual stream: fp32 under fp32 masters too (fp32 embeddings and norms; autocast lowers only the matmuls,
    # so the projections' outputs stay hb), and so the checkpointed layer inputs and, through RoPE's cos and sin in
    # the stream's dtype (transformers' rotary embedding), the keys of the KV cache.
    rb = 4 if masters else hb
    # PEFT casts a LoRA layer's input to its fp32 adapters' dtype (peft/tuners/lora/layer.py); its 4-bit LoRA layer
    # does not under autocast (peft/tuners/lora/bnb.py 543-546: requires_conversion = not is_autocast_enabled())
    fp32_adapter_casts = method == "lora"
    autocast_adapters = method != "full" and b < 4
    per_token, per_layer = _layer_activation_bytes(
        shape, method=method, act_bytes=b, autocast_adapters=autocast_adapters, device=device,
        lora_rank=lora_rank, lora_targets=targets, lora_dropout=lora_dropout, padded=padded, seq_len=seq,
        hidden_bytes=hb, masters=masters)
    layer = per_token * tokens + per_layer
    final_norm = (4 * h + 4 + (rb * h if method == "full" else 0)) * tokens
    input_ids = 8 * tokens if method == "full" else 0  # the embedding's gradient needs the token ids
    rotary = 2 * seq * shape.head_dim * b  # RoPE's cos and sin, shared by the batch and the layers
    if gradient_checkpointing:
        activations = L * rb * h * tokens + layer + final_norm + input_ids
    else:
        activations = L * layer + final_norm + input_ids + rotary
    if masters:
        activations += shape.linear_weight_params * 2  # autocast's 16-bit copies of the fp32 master weights
    if fp32_adapter_casts:  # PEFT's fp32 cast of the widest LoRA input and dropout's fp32 output (layer.py:1100)
        activations += tokens * max(i for i, _ in shape.lora_targets(targets)) * (4 + (4 if lora_dropout > 0 else 0))

    # --- the LM head and log-probabilities
    head_trains = method == "full"
    if logits == "fused":
        scored, tile = fused_head(micro_batch, completion_len, seq, V, b, device)
        logits_bytes = scored * h * rb + scored * 16 + tile + scored * h * (4 + rb)
        if head_trains:
            logits_bytes += V * h * 4
    else:
        scored = micro_batch * (completion_len + 1)
        logits_bytes = 3 * scored * V * b

    # --- generation: one generate call over the whole generation batch. Its two largest moments never coexist:
    # the prefill (the prompt's KV cache and the prompt-wide working set of one layer) and the end of decoding (the
    # full-length KV cache, one layer's copy while DynamicCache.update concatenates, the sampling buffers). The
    # phase's peak is the larger of the two, not their sum (the rehearsal showed the sum 1.3x too high at
    # per_device_train_batch_size=16). PEFT's fp32 casts (below) peak at down_proj's LoRA, when SwiGLU's gate and up
    # outputs are freed: two i-wide tensors then coexist with them, not three (matches the rehearsal within 1 % at
    # batch 1-24 on laptop-16gb) TRL 1.16 generates a PEFT model without autocast (accelerate patches only the outer
    # forward; docs/references.md, the rehearsal): then PEFT's 4-bit LoRA layer casts its input to fp32 adapters'
    # dtype too (QLoRA under fp16)
    generation_casts = fp32_adapter_casts or (method == "qlora" and adapter_bytes(method, precision) == 4 and hb < 4)
    widest = max((i for i, _ in shape.lora_targets(targets)), default=0) if generation_casts else 0
    mlp_wide, h_wide = (2 if fp32_adapter_casts and widest >= shape.intermediate_size else 3), 2
    if method == "qlora" and not upcast and any(o == shape.intermediate_size for _, o in shape.lora_targets(targets)):
        # PEFT clones a 4-bit layer's output before adding the adapter's (peft/tuners/lora/bnb.py 527-533): at an
        # adapted up_proj the rehearsal holds four i-wide tensors (SiLU's output, the 4-bit result, its clone, the
        # product) and four h-wide ones (the embedding's output, two residual sums, the norm's output)
        mlp_wide, h_wide = 4, 4
    # Generation transients the rehearsal (bench.rehearse) showed: PEFT casts a LoRA input to fp32 and dropout keeps
    # an fp32 output and a mask (prefill only: one token wide while decoding); autocast copies an fp32 LM head (QLoRA
    # with prepare_model_for_kbit_training, fp32 masters) and caches the copies of every fp32 master weight (every
    # forward: both moments).
    weight_copies = 0
    if b < 4 and ((method == "qlora" and upcast) or masters):
        weight_copies = V * h * b + (shape.linear_weight_params * b if method == "full" else 0)

    def one_generate_call(prefill_len: int) -> tuple[int, int]:
        """(kv_cache, transients) of a generate call that prefills prefill_len tokens and adds completion_len."""
        kv_prompt = L * kv * (rb + hb) * generation_batch_ * prefill_len  # keys in the stream's dtype, values in hb
        kv_full = L * kv * (rb + hb) * generation_batch_ * (prefill_len + completion_len)
        prefill = kv_prompt + generation_batch_ * prefill_len * (mlp_wide * shape.intermediate_size * hb + h_wide * h * rb)
        decode_end = kv_full + kv_full // L + generation_batch_ * V * (b + 3 * 4)  # logits, fp32 copy, sampling buffers
        prefill_casts = generation_batch_ * prefill_len * widest * (4 + (5 if lora_dropout > 0 else 0))
        if prefill + prefill_casts >= decode_end:  # kv_cache + transients = the larger moment (plus the weight copies)
            return prefill, weight_copies + prefill_casts
        return decode_end, weight_copies

    # A tool round (TRL 1.16's _tool_call_loop) calls generate again on prompt + reply + tool turn, prefilled from
    # scratch for up to every row, asking max_completion_length new tokens again: a prefill of up to P + C tokens, a
    # KV cache toward P + 2C. The phase holds the larger of the first turn and a round (TRL's lines:
    # docs/references.md, "What a tool round costs").
    kv_cache, transients = max(one_generate_call(prompt_len), one_generate_call(seq) if max_tool_calling_iterations
                               else (0, 0), key=sum)

    persistent = weights + reference + optimizer_bytes
    generation_phase = persistent + kv_cache + transients
    training_phase = persistent + gradients + activations + logits_bytes
    terms = dict(weights=weights, reference=reference, gradients=gradients, optimizer=optimizer_bytes,
                 activations=activations, logits=logits_bytes, kv_cache=kv_cache, transients=transients,
                 generation_phase=generation_phase, training_phase=training_phase,
                 total=max(generation_phase, training_phase))
    terms = {k: int(round(v)) for k, v in terms.items()}
    settings = dict(model=shape.name, method=method, per_device_train_batch_size=per_device_train_batch_size,
                    gradient_accumulation_steps=gradient_accumulation_steps,
                    steps_per_generation=steps_per_generation, generation_batch=generation_batch_,
                    num_generations=num_generations, num_processes=num_processes,
                    max_prompt_length=prompt_len, max_completion_length=completion_len,
                    optim=optimizer, gradient_checkpointing=gradient_checkpointing, beta=beta,
                    precision=precision, fp32_master_weights=masters, lora_dropout=lora_dropout,
                    prepare_model_for_kbit_training=upcast, max_tool_calling_iterations=max_tool_calling_iterations,
                    generation_tokens=prompt_len + completion_len * (2 if max_tool_calling_iterations else 1),
                    lora_rank=lora_rank if method != "full" else None, device=device, padded=padded, logits=logits)
    return MemoryEstimate(bytes=terms, settings=settings, trainable_params=trainable, total_params=shape.params)
