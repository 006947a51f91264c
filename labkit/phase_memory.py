"""The memory each phase of a GRPO step fills, from the estimator's terms: what the OOM doctor weighs a change by.

Introduced in ``04_lora_grpo_16gb.ipynb``. :func:`labkit.memory.estimate` gives a step's two peaks,
generation and training; the OOM doctor (:mod:`labkit.oom`) needs the memory of the phase that ran
out, which is one of those peaks or something smaller (:data:`PHASE_MEMORY`):

- **generation**: ``generation_phase``, the KV cache of the whole generation batch;
- **scoring** (old / reference log-probs, rewards): :func:`scoring_memory`, a ``torch.no_grad()``
  forward of ``per_device_train_batch_size`` sequences with checkpointing switched off;
- the loss's **forward** and **backward** passes: ``training_phase``;
- the **optimiser step**: :func:`optimizer_step_memory`, weights, gradients and the AdamW states
  (allocated on the first step), no activations;
- **setup**: what lives through every phase (weights, reference, optimiser states).

:func:`phase_memory` reads settings under preset / ``GRPOConfig`` field names (:func:`flat_settings`
lifts a preset's ``config``) and returns None for a model it cannot estimate.
"""
from __future__ import annotations

from labkit.environments import tool_rounds
from labkit.memory import PRECISION_BYTES, fused_head, estimate, hidden_state_bytes
from labkit.models import DEFAULT_LORA_TARGETS, resolve_model
from labkit.shapes import model_shape

__all__ = ["PHASE_MEMORY", "flat_settings", "phase_memory", "scoring_memory", "optimizer_step_memory"]

# Which memory each phase fills (phase_memory): a term of labkit.memory.estimate (generation_phase,
# training_phase), scoring_memory, optimizer_step_memory, or what lives through every phase (persistent).
PHASE_MEMORY = {
    "generation": "generation_phase",
    "scoring": "scoring",
    "forward": "training_phase",
    "backward": "training_phase",
    "optimizer": "optimizer_step",
    "setup": "persistent",
}


def flat_settings(settings: dict) -> dict:
    """Return ``settings`` (a preset's ``to_dict()``, perhaps with changes at the top) with its ``config`` (GRPOConfig
    arguments) lifted to the top, under what is already there."""
    options = settings.get("config")
    return {**(options if isinstance(options, dict) else {}), **{k: v for k, v in settings.items() if k != "config"}}


def phase_memory(settings: dict, phase: str | None) -> int | None:
    """Return the bytes ``phase`` fills (:data:`PHASE_MEMORY`) for ``settings`` (preset / GRPOConfig field names),
    from :func:`labkit.memory.estimate`, or None when it cannot estimate them (an unknown model). Any other
    phase (``between steps``, unknown): the whole step's peak.
    """
    s = flat_settings(settings)
    if not s.get("model") or not s.get("method"):
        return None
    fields = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation", "num_generations",
              "num_processes", "max_prompt_length", "max_completion_length", "optim", "beta",
              "precision", "lora_rank", "lora_dropout", "prepare_model_for_kbit_training")  # the last: QLoRA's upcast
    kwargs = {k: s[k] for k in fields if s.get(k) is not None}  # estimate's names; target_modules is lora_targets
    if s.get("activation_checkpointing") is not None:
        kwargs["gradient_checkpointing"] = s["activation_checkpointing"]
    kwargs["lora_targets"] = list(s["target_modules"]) if s.get("target_modules") is not None else None
    kwargs["max_tool_calling_iterations"] = tool_rounds(s)
    try:  # the offline tiny models live in a folder; other names (hub ids, smollm2-135m) are in the catalogue
        name = resolve_model(s["model"]) if str(s["model"]).startswith("tiny:") else s["model"]
        est = estimate(name, s["method"], **kwargs)
    except (KeyError, ValueError, TypeError, OSError):
        return None
    term = PHASE_MEMORY.get(phase or "", "total")
    if term == "persistent":
        return est.bytes["weights"] + est.bytes["reference"] + est.bytes["optimizer"]
    if term == "scoring":
        return scoring_memory(est, model=name, lora_targets=kwargs["lora_targets"],
                              use_vllm=bool(s.get("use_vllm") and s.get("vllm_importance_sampling_correction", True)),
                              num_iterations=s.get("num_iterations") or 1)
    if term == "optimizer_step":
        return optimizer_step_memory(est, optim=s.get("optim"))
    return est.bytes[term]


def optimizer_step_memory(est, optim: str | None = None) -> int:
    """Return the bytes live during ``optimizer.step()`` for the :class:`labkit.memory.MemoryEstimate` ``est``.

    ``weights + reference + gradients + optimizer`` (the estimate's terms; the AdamW states are
    allocated on the first step), plus, for ``optim="adamw_torch"`` on CUDA, one temporary the size
    of a moment: torch's foreach AdamW builds ``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)``
    for all the parameters at once (torch/optim/adam.py, ``_multi_tensor_adam``, lines 762 and 790
    in torch 2.13; foreach is torch's default for CUDA tensors, torch/optim/optimizer.py line 161).
    Moments are in the parameter's dtype, like the gradients, so it is the gradients' size. The fused
    and the 8-bit optimisers update in place. No activations: transformers calls the step after the
    backward pass of the last micro-batch has freed them (transformers/trainer.py, lines 1931-1935:
    clip, ``on_pre_optimizer_step``, ``optimizer.step()``). So gradient checkpointing, the per-device
    batch and the completion length change nothing here.
    """
    terms = est.bytes
    foreach_temporary = terms["gradients"] if optim == "adamw_torch" and est.settings.get("device") == "cuda" else 0
    return terms["weights"] + terms["reference"] + terms["gradients"] + terms["optimizer"] + foreach_temporary


def scoring_memory(est, *, model=None, lora_targets=None, num_iterations: int = 1,
                   use_vllm: bool = False) -> int:
    """Return the bytes of the scoring phase (old and reference log-probs) for the estimate ``est`` of ``model``.

    TRL 1.16 scores the generation batch in ``GRPOTrainer._generate_and_score_completions`` under
    ``torch.no_grad()`` with gradient checkpointing switched off (trl/trainer/grpo_trainer.py, line
    2634, ``disable_gradient_checkpointing``), in chunks of ``B = per_device_train_batch_size``
    sequences (line 2505; ``_get_per_token_logps_and_entropies``, lines 1440-1446) of
    ``S = max_prompt_length + max_completion_length`` tokens, with no KV cache (trl/trainer/utils.py,
    line 1612). It runs the policy only when the samples may be stale (lines 2642-2645:
    ``gradient_accumulation_steps % (steps_per_generation x num_iterations) != 0``) or when vLLM generates
    (``vllm_importance_sampling_correction``, True by default, grpo_config.py lines 925-926) and the reference
    only when ``beta > 0`` (line 2710); otherwise scoring is the reward functions alone. It counts:

    - weights + reference + optimizer states, and the gradients of earlier micro-batches when a generation
      starts mid-accumulation (``steps_per_generation x num_iterations`` not a multiple of the accumulation);
    - a no-grad forward of ``B S`` tokens, one layer at a time (no autograd-saved activations): the
      residual stream and the layer's largest moment, SwiGLU's intermediates,
      ``B S (3 i + 2 h) hb`` as at the prefill of :func:`labkit.memory.estimate`, with PEFT's fp32
      casts of the widest LoRA input; or, when larger, the fused LM head: the last hidden states
      (``B S h hb``), the ``N`` scored positions copied (``N h hb``; ``N = B C`` on CUDA, ``B (S - 1)``
      on CPU, trl/trainer/utils.py line 1645), seven fp32 statistics per position and one tile of
      ``min(N, 4096) x min(V, 32768)`` logits (trl/kernels/chunked_logprob.py, lines 340-352); plus
      autocast's 16-bit copies of fp32 master weights.

    Neither checkpointing nor the generation batch changes it (only ``B`` and ``S`` do). Not counted: the
    generation batch's token ids and log-probs (a few MiB), the reward functions' own memory.
    """
    s, terms = est.settings, est.bytes
    accumulation, generate_every = s["gradient_accumulation_steps"], s["steps_per_generation"] * num_iterations
    memory = terms["weights"] + terms["reference"] + terms["optimizer"]
    if generate_every % accumulation:
        memory += terms["gradients"]
    if not (s["beta"] > 0 or accumulation % generate_every or use_vllm):
        return memory
    method, precision, device = s["method"], s["precision"], s.get("device", "cuda")
    shape = model_shape(s["model"] if model is None else model)  # a name, a folder or a config
    b = PRECISION_BYTES[precision]
    upcast = bool(s.get("prepare_model_for_kbit_training"))
    hb = hidden_state_bytes(method, precision, prepare_model_for_kbit_training=upcast)
    rb = 4 if s.get("fp32_master_weights") else hb  # the residual stream: fp32 under fp32 master weights
    batch, seq = s["per_device_train_batch_size"], s["max_prompt_length"] + s["max_completion_length"]
    tokens, h, i, V = batch * seq, shape.hidden_size, shape.intermediate_size, shape.vocab_size
    # PEFT casts a LoRA input to its fp32 adapters' dtype (as labkit.memory.estimate); its 4-bit layers do not
    casts = method == "lora"
    widest = max((n for n, _ in shape.lora_targets(lora_targets or DEFAULT_LORA_TARGETS)), default=0) if casts else 0
    layer = (tokens * ((2 if widest >= i else 3) * i * hb + 2 * h * rb)
             + tokens * widest * (4 + (5 if s["lora_dropout"] else 0)))  # the estimate's LoRA dropout
    if s.get("padded"):
        layer += tokens * seq * b  # SDPA's additive mask of one layer, (B, 1, S, S)
    scored, tile = fused_head(batch, s["max_completion_length"], seq, V, b, device)
    head = tokens * h * rb + scored * h * rb + scored * 7 * 4 + tile
    weight_copies = shape.linear_weight_params * b if s.get("fp32_master_weights") else 0
    return int(round(memory + max(layer, head) + weight_copies))
