"""The GRPO objective: group-relative advantages, KL estimators, the clipped loss, log-probs.

Introduced and derived in ``01_grpo_objective.ipynb``; every training path of the lab
(the nano loop, the dashboard's diagnostics) uses these functions, and
``tests/test_objective.py`` checks :func:`grpo_loss` against the loss TRL's own
``GRPOTrainer`` computes on the same batch, for every ``loss_type``, with and without KL.

Names follow TRL: ``num_generations`` (G, completions per prompt), ``completion_mask``,
``old_logps`` (TRL's ``old_per_token_logps``), ``ref_logps``, ``advantages``, ``beta``,
``epsilon`` / ``epsilon_high``, ``loss_type``. Shapes: ``B`` completions in a batch
(``B = num_prompts * G``, the G completions of a prompt next to each other, as TRL lays
them out), ``T`` completion tokens, ``V`` vocabulary, ``H`` hidden size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

__all__ = [
    "LOSS_TYPES",
    "SCALES",
    "group_advantages",
    "frac_reward_zero_std",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "GRPOLossOutput",
    "grpo_loss",
    "token_logps_from_logits",
    "token_logps_from_hidden",
    "per_token_logps",
]

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALES = ("group", "batch", "none")
ADVANTAGE_EPS = 1e-4  # TRL's: advantages = (r - mean) / (std + 1e-4)


# --------------------------------------------------------------------------- advantages


def _std(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    # Bessel-corrected std that ignores NaN (unscorable completions), as TRL's nanstd; 0 for a
    # single value. Keeps the reduced dimension.
    if dim is None:
        x, dim = x.reshape(-1), 0
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True)
    variance = torch.nansum((x - mean) ** 2, dim=dim, keepdim=True) / (count - 1).clamp(min=1)
    return torch.where(count > 1, variance.sqrt(), torch.zeros_like(variance))


def group_advantages(rewards: torch.Tensor, num_generations: int, scale: str = "group",
                     eps: float = ADVANTAGE_EPS) -> torch.Tensor:
    """Return the advantage of every completion: its reward relative to its group, ``(B,)``.

    .. math:: \\hat A_i = \\frac{r_i - \\operatorname{mean}(r_{\\text{group}(i)})}{\\operatorname{std} + \\varepsilon}

    ``rewards`` is ``(B,)`` with ``B = num_prompts * num_generations``, the ``num_generations``
    completions of one prompt next to each other. The mean is always taken per group (the
    group is GRPO's baseline, in place of PPO's value model). ``scale`` says what to divide by:

    - ``"group"`` (GRPO, TRL's default): the group's standard deviation;
    - ``"batch"``: the whole batch's standard deviation (PPO-Lite);
    - ``"none"``: nothing (Dr. GRPO: scaling by the group std favours too-easy and too-hard prompts).

    Standard deviations are Bessel-corrected and ``eps = 1e-4``, as in TRL. A group whose
    rewards are all equal gets zero advantage, hence no gradient (see
    :func:`frac_reward_zero_std`). A NaN reward (a completion no reward function could score)
    is left out of its group's statistics and gets advantage 0, as in TRL.
    Introduced in ``01_grpo_objective.ipynb``.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, not {scale!r}")
    rewards = torch.as_tensor(rewards)
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    if rewards.dim() != 1 or rewards.numel() % num_generations:
        raise ValueError(f"rewards must be (B,) with B a multiple of num_generations={num_generations}, "
                         f"got shape {tuple(rewards.shape)}")
    grouped = rewards.view(-1, num_generations)  # (num_prompts, G)
    advantages = grouped - torch.nanmean(grouped, dim=1, keepdim=True)  # (num_prompts, G)
    if scale == "group":
        advantages = advantages / (_std(grouped, dim=1) + eps)
    elif scale == "batch":
        advantages = advantages / (_std(rewards) + eps)
    return torch.nan_to_num(advantages.reshape(-1), nan=0.0)  # (B,)


def frac_reward_zero_std(rewards: torch.Tensor, num_generations: int) -> float:
    """Return the fraction of completions whose group has all-equal rewards (TRL's ``frac_reward_zero_std``).

    Those groups have zero advantage, so they add nothing to the gradient: a value near 1
    means the batch teaches almost nothing (every answer right, or every answer wrong).
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    std = _std(rewards.view(-1, num_generations), dim=1)  # (num_prompts, 1)
    return torch.isclose(std, torch.zeros_like(std)).float().mean().item()


# --------------------------------------------------------------------------- KL estimators
# Tokens are sampled from the policy pi_theta; each estimator is a function of the per-token
# log-ratio log(pi_ref / pi_theta) whose expectation under pi_theta is (or approximates)
# KL(pi_theta || pi_ref). J. Schulman, "Approximating KL Divergence" (2020) names them k1, k2, k3.


def kl_k1(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Return the k1 estimate of KL(pi || pi_ref) per token: ``logps - ref_logps``, same shape.

    Unbiased, but high variance and negative for about half of the tokens.
    """
    return logps - ref_logps


def kl_k2(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Return the k2 estimate of KL(pi || pi_ref) per token: ``0.5 * (ref_logps - logps) ** 2``.

    Always >= 0 and low variance, but biased (the bias grows as the two policies part).
    """
    return 0.5 * (ref_logps - logps) ** 2


def kl_k3(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Return the k3 estimate of KL(pi || pi_ref) per token, the one GRPO (and TRL) uses.

    .. math:: k_3 = e^{\\log\\pi_{ref} - \\log\\pi} - (\\log\\pi_{ref} - \\log\\pi) - 1

    Unbiased (``E[e^x] = 1`` under pi), always >= 0 (``e^x >= 1 + x``), and low variance
    when the policies are close. Shapes: any, ``(B, T)`` in the loss.
    """
    log_ratio = ref_logps - logps  # log(pi_ref / pi)
    return torch.exp(log_ratio) - log_ratio - 1


# --------------------------------------------------------------------------- the loss


@dataclass
class GRPOLossOutput:
    """What :func:`grpo_loss` returns: the loss, its per-token terms, and the diagnostics.

    ``metrics`` uses TRL's names so the dashboard shows TRL runs and labkit runs the same way:
    ``clip_ratio/low_mean``, ``clip_ratio/low_min``, ``clip_ratio/high_mean``,
    ``clip_ratio/high_max``, ``clip_ratio/region_mean`` and, when ``ref_logps`` is given,
    ``kl``; plus ``ratio/mean`` and ``ratio/max`` (the importance ratio over the completion
    tokens, not a TRL metric).
    """

    loss: torch.Tensor  # () what backward() is called on
    per_token_loss: torch.Tensor  # (B, T) clipped surrogate (+ beta * KL), before masking and aggregation
    ratio: torch.Tensor  # (B, T) pi_theta / pi_old, detached
    per_token_kl: torch.Tensor | None  # (B, T) the KL term as it enters the loss, detached; None without ref_logps
    metrics: dict = field(default_factory=dict)  # name -> float


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return ((x * mask).sum() / mask.sum().clamp(min=1.0)).item()


def _seq_means(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # Per-sequence mean over completion tokens; NaN for a fully masked row, as in TRL.
    return (x * mask).sum(-1) / mask.sum(-1)  # (B,)


def grpo_loss(logps: torch.Tensor, old_logps: torch.Tensor | None, advantages: torch.Tensor,
              completion_mask: torch.Tensor, *, ref_logps: torch.Tensor | None = None, beta: float = 0.0,
              epsilon: float = 0.2, epsilon_high: float | None = None, loss_type: str = "dapo",
              max_completion_length: int | None = None, num_items_in_batch: int | torch.Tensor | None = None,
              use_bias_correction_kl: bool = True, delta: float | None = None,
              importance_sampling_ratio: torch.Tensor | None = None) -> GRPOLossOutput:
    """Return a :class:`GRPOLossOutput`: GRPO's clipped surrogate loss and its diagnostics.

    Per completion token ``t`` of completion ``i``, with ``ratio = exp(logps - old_logps)``:

    .. math:: \\ell_{i,t} = -\\min\\big(r_{i,t} \\hat A_i,\\;
              \\operatorname{clip}(r_{i,t}, 1-\\epsilon, 1+\\epsilon_{high}) \\hat A_i\\big)
              + \\beta\\, r_{i,t}\\, k_3(\\pi_\\theta, \\pi_{ref})_{i,t}

    (the ``r_{i,t}`` in front of the KL is TRL's ``use_bias_correction_kl``: it makes the KL
    gradient unbiased; its value is 1 on-policy but its gradient is not zero). The per-token
    terms are then aggregated over the ``completion_mask`` by ``loss_type``:

    - ``"grpo"``: mean over each completion's tokens, then over completions (DeepSeekMath).
      Every completion weighs the same, so a token of a short completion weighs more.
    - ``"bnpo"``: sum over all tokens / number of tokens in this batch.
    - ``"dr_grpo"``: sum over all tokens / (B * ``max_completion_length``), a constant.
    - ``"dapo"`` (TRL's default): sum over all tokens / ``num_items_in_batch``, the number of
      tokens in the whole generation batch across gradient-accumulation steps (this batch's
      token count when not given). On one batch it equals ``bnpo``; with accumulation,
      summing ``grpo_loss`` over the micro-batches gives the token mean of the whole batch.

    Shapes: ``logps``, ``old_logps``, ``ref_logps``, ``completion_mask``: ``(B, T)``;
    ``advantages``: ``(B,)``. ``old_logps=None`` means on-policy (``logps.detach()``, as TRL
    does with one iteration per generation). ``max_completion_length`` defaults to ``T``.
    ``delta`` (two-sided clipping of the ratio from above, INTELLECT-2) and
    ``importance_sampling_ratio`` (``(B, T)``, TRL's vLLM sampling correction) follow TRL; both
    are off by default. TRL's gradient-accumulation scaling is not applied: this is the loss
    of one batch. Introduced in ``01_grpo_objective.ipynb``.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, not {loss_type!r}")
    if beta != 0.0 and ref_logps is None:
        raise ValueError("beta != 0 needs ref_logps, the reference model's log-probs of the same tokens")
    if logps.dim() != 2 or completion_mask.shape != logps.shape:
        raise ValueError(f"logps and completion_mask must both be (B, T); got {tuple(logps.shape)} "
                         f"and {tuple(completion_mask.shape)}")
    epsilon_low = epsilon
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    mask = completion_mask.to(logps.dtype)  # (B, T)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (B, 1), the same advantage for every token
    old_logps = logps.detach() if old_logps is None else old_logps

    ratio = torch.exp(logps - old_logps)  # (B, T) pi_theta / pi_old per token
    clipped_ratio = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)  # (B, T)
    # INTELLECT-2's two-sided clipping also caps the unclipped branch (it matters for A < 0).
    ratio_for_loss = ratio if delta is None else torch.clamp(ratio, max=delta)  # (B, T)
    # Pessimistic bound: take the smaller objective, i.e. the larger loss.
    per_token_loss = -torch.min(ratio_for_loss * advantages, clipped_ratio * advantages)  # (B, T)
    if importance_sampling_ratio is not None:
        per_token_loss = per_token_loss * importance_sampling_ratio

    per_token_kl = None
    if ref_logps is not None:
        per_token_kl = kl_k3(logps, ref_logps)  # (B, T)
        if use_bias_correction_kl:
            per_token_kl = per_token_kl * ratio
        if beta != 0.0:
            per_token_loss = per_token_loss + beta * per_token_kl

    if loss_type == "grpo":
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        length = logps.size(1) if max_completion_length is None else max_completion_length
        loss = (per_token_loss * mask).sum() / (logps.size(0) * length)
    else:  # dapo
        n = mask.sum() if num_items_in_batch is None else torch.as_tensor(num_items_in_batch, dtype=mask.dtype)
        loss = (per_token_loss * mask).sum() / n.clamp(min=1.0)

    with torch.no_grad():
        ratio, seen = ratio.detach(), ratio_for_loss.detach()  # TRL counts clipping on the delta-capped ratio
        is_low = ((seen < 1 - epsilon_low) & (advantages < 0)).to(mask.dtype)  # (B, T) clipped: no gradient
        is_high = ((seen > 1 + epsilon_high) & (advantages > 0)).to(mask.dtype)  # (B, T)
        is_region = torch.maximum(is_low, is_high)
        low_per_seq, high_per_seq = _seq_means(is_low, mask), _seq_means(is_high, mask)
        active = mask.bool()
        metrics = {
            "clip_ratio/low_mean": _masked_mean(is_low, mask),
            "clip_ratio/low_min": torch.nan_to_num(low_per_seq, nan=math.inf).min().item(),
            "clip_ratio/high_mean": _masked_mean(is_high, mask),
            "clip_ratio/high_max": torch.nan_to_num(high_per_seq, nan=-math.inf).max().item(),
            "clip_ratio/region_mean": _masked_mean(is_region, mask),
            "ratio/mean": _masked_mean(ratio, mask),
            "ratio/max": ratio[active].max().item() if active.any() else math.nan,
        }
        if not torch.isfinite(low_per_seq).any():  # every row masked out
            metrics["clip_ratio/low_min"] = metrics["clip_ratio/high_max"] = math.nan
        if per_token_kl is not None:
            per_token_kl = per_token_kl.detach()
            metrics["kl"] = _masked_mean(per_token_kl, mask)
    return GRPOLossOutput(loss=loss, per_token_loss=per_token_loss, ratio=ratio, per_token_kl=per_token_kl,
                          metrics=metrics)


# --------------------------------------------------------------------------- log-probabilities


def token_logps_from_logits(logits: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
    """Return ``log_softmax(logits)[target_ids]`` without building the full log-softmax tensor.

    ``logits`` is ``(..., V)`` and ``target_ids`` ``(...)``; the result is ``(...)`` in float32
    (the log-sum-exp over 151,936 entries loses too much in bf16). Uses
    ``logit[target] - logsumexp(logits)``, as TRL's ``selective_log_softmax`` does.
    """
    logits = logits.float()
    picked = logits.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)  # (...)
    return picked - torch.logsumexp(logits, dim=-1)  # (...)


def _head_logps(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target_ids: torch.Tensor,
                temperature: float) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias)  # (N, V)
    if temperature != 1.0:
        logits = logits / temperature
    return token_logps_from_logits(logits, target_ids)  # (N,)


def token_logps_from_hidden(hidden: torch.Tensor, lm_head_weight: torch.Tensor, target_ids: torch.Tensor,
                            temperature: float = 1.0, chunk_size: int | None = None,
                            lm_head_bias: torch.Tensor | None = None) -> torch.Tensor:
    """Return the log-probability of each target token given the hidden state before it, ``(...)``.

    .. math:: \\log p(y) = \\frac{h W^\\top}{\\tau}[y] - \\operatorname{logsumexp}\\Big(\\frac{h W^\\top}{\\tau}\\Big)

    ``hidden`` is ``(..., H)`` (e.g. ``(B, T, H)``, the last hidden states at the positions that
    predict the targets), ``lm_head_weight`` ``(V, H)``, ``target_ids`` ``(...)``; the result is
    float32 with ``target_ids``' shape.

    With ``chunk_size=None`` the whole ``(N, V)`` logits tensor is built (``N`` = number of
    positions), and autograd keeps it for the backward pass: at Qwen's vocabulary of 151,936
    that is about 0.6 MB per position in fp32. With ``chunk_size=k`` the positions are processed
    ``k`` at a time, each chunk under ``torch.utils.checkpoint``: the forward pass keeps only the
    per-position results, and the backward pass recomputes one chunk's logits at a time, so
    no more than ``k x V`` logits ever exist. Values and gradients equal the unchunked ones
    (up to floating-point summation order); the price is a second LM-head matmul in the
    backward pass. Introduced in ``01_grpo_objective.ipynb``; measured by ``python -m labkit
    bench chunked-logps``.
    """
    if hidden.shape[:-1] != target_ids.shape:
        raise ValueError(f"hidden (..., H) and target_ids (...) disagree: {tuple(hidden.shape)} vs "
                         f"{tuple(target_ids.shape)}")
    shape = target_ids.shape
    flat_hidden = hidden.reshape(-1, hidden.size(-1))  # (N, H)
    flat_targets = target_ids.reshape(-1)  # (N,)
    if chunk_size is None:
        return _head_logps(flat_hidden, lm_head_weight, lm_head_bias, flat_targets, temperature).view(shape)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of positions, not {chunk_size}")
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (flat_hidden, lm_head_weight, lm_head_bias))
    chunks = []
    for start in range(0, flat_hidden.size(0), chunk_size):
        h = flat_hidden[start:start + chunk_size]  # (k, H)
        y = flat_targets[start:start + chunk_size]  # (k,)
        if needs_grad:
            # Keep only the inputs; the (k, V) logits are recomputed during backward.
            chunks.append(checkpoint(_head_logps, h, lm_head_weight, lm_head_bias, y, temperature,
                                     use_reentrant=False))
        else:
            chunks.append(_head_logps(h, lm_head_weight, lm_head_bias, y, temperature))
    if not chunks:
        return flat_hidden.new_zeros(shape, dtype=torch.float32)
    return torch.cat(chunks).view(shape)


def _causal_lm(model):
    # A PEFT model wraps the causal LM; LoRA layers live inside it, so its body and head are the ones to use.
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def per_token_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                    temperature: float = 1.0, chunk_size: int | None = None) -> torch.Tensor:
    """Return the log-probability of each of the last ``logits_to_keep`` tokens under ``model``, ``(B, K)``.

    ``input_ids`` and ``attention_mask`` are ``(B, P + K)``: prompt then completion, as in TRL.
    Position ``t`` of the model's output predicts token ``t + 1``, so the completion's ``K``
    tokens are scored by the ``K`` positions before them. Logits are divided by
    ``temperature`` first (TRL scores with the sampling temperature). Values at padded
    completion positions are whatever the model gives; mask them with ``completion_mask``.

    ``chunk_size=None`` asks the model for its logits (``(B, K, V)``, kept for backward).
    ``chunk_size=k`` runs the model's body once for the hidden states, then the LM head
    ``k`` positions at a time with :func:`token_logps_from_hidden`, never building the full
    ``(B, K, V)`` logits; values and gradients are the same. Works for full and PEFT models of
    the Qwen2 / Llama kind (LM head = one linear layer, no logit scaling or soft-capping).
    Introduced in ``01_grpo_objective.ipynb``.
    """
    targets = input_ids[:, -logits_to_keep:]  # (B, K)
    if chunk_size is None:
        # logits_to_keep + 1: the position before the first completion token predicts it.
        logits = model(input_ids=input_ids, attention_mask=attention_mask,
                       logits_to_keep=logits_to_keep + 1).logits  # (B, K + 1, V)
        logits = logits[:, :-1]  # (B, K, V) the last position predicts a token we do not have
        if temperature != 1.0:
            logits = logits / temperature
        return token_logps_from_logits(logits, targets)  # (B, K)
    causal_lm = _causal_lm(model)
    config = causal_lm.config.get_text_config() if hasattr(causal_lm.config, "get_text_config") else causal_lm.config
    for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(config, name, None) is not None:
            raise NotImplementedError(f"chunked log-probs assume a plain linear LM head; this model sets {name}. "
                                      "Use chunk_size=None.")
    body, head = causal_lm.base_model, causal_lm.get_output_embeddings()
    hidden = body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state  # (B, L, H)
    hidden = hidden[:, -logits_to_keep - 1:-1]  # (B, K, H)
    hidden = hidden.to(head.weight.device)
    return token_logps_from_hidden(hidden, head.weight, targets.to(head.weight.device), temperature, chunk_size,
                                   lm_head_bias=head.bias)  # (B, K)
