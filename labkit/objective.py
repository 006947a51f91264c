"""The GRPO objective: group-relative advantages, KL estimators, the clipped loss, log-probs.

Introduced and derived in ``01_grpo_objective.ipynb`` (the variants, KL gradients and chunked log-probs in
``01b_grpo_variants.ipynb``); every training path of the lab
(the nano loop, the dashboard's diagnostics) uses these functions, and
``tests/test_objective.py`` checks :func:`grpo_loss` (loss and gradient) against the loss TRL's own
``GRPOTrainer`` computes on the same batch, for each of TRL 1.16's eight ``loss_type`` values, at both
``importance_sampling_level`` values, with and without KL.

Names follow TRL: ``num_generations`` (G, completions per prompt), ``completion_mask``,
``old_logps`` (TRL's ``old_per_token_logps``), ``ref_logps``, ``advantages``, ``beta``,
``epsilon`` / ``epsilon_high``, ``loss_type``, ``importance_sampling_level``. Shapes: ``B`` completions in a batch
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
    "CLIPPED_LOSS_TYPES",
    "IMPORTANCE_SAMPLING_LEVELS",
    "SCALES",
    "group_advantages",
    "token_entropy",
    "frac_reward_zero_std",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "GRPOLossOutput",
    "aggregate_loss",
    "grpo_loss",
    "token_logps_from_logits",
    "token_logps_from_hidden",
    "per_token_logps",
]

# TRL 1.16's eight loss types; all are implemented here and checked against TRL's GRPOTrainer.
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # PPO's clipped surrogate, aggregated differently
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")  # TRL 1.16's importance_sampling_level values
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

    Its value is unbiased, its gradient is not, on-policy too: with tokens sampled from pi
    (held fixed), ``E[grad k3] = grad KL(pi_ref || pi)``, the forward KL. Multiplied by the ratio
    ``pi / pi_old`` (TRL's ``use_bias_correction_kl``, what :func:`grpo_loss` does by default),
    ``E[grad (ratio * k3)] = grad KL(pi || pi_ref)``. ``01b_grpo_variants.ipynb`` section 1 checks both.
    """
    log_ratio = ref_logps - logps  # log(pi_ref / pi)
    return torch.exp(log_ratio) - log_ratio - 1


# --------------------------------------------------------------------------- the loss


@dataclass
class GRPOLossOutput:
    """What :func:`grpo_loss` returns: the loss, its per-token terms, and the diagnostics.

    ``metrics`` uses TRL's names so the dashboard shows TRL runs and labkit runs the same way.
    For the clipped loss types (:data:`CLIPPED_LOSS_TYPES`): ``clip_ratio/low_mean``,
    ``clip_ratio/low_min``, ``clip_ratio/high_mean``, ``clip_ratio/high_max``,
    ``clip_ratio/region_mean``; for ``cispo``: ``cispo_clip_ratio``; for ``vespo``:
    ``vespo/phi_seq_mean``; ``sapo`` clips nothing. When ``ref_logps`` is given, ``kl``. Always
    ``ratio/mean`` and ``ratio/max`` (the importance ratio, not a TRL metric). At
    ``importance_sampling_level="sequence"`` the clip fractions count completions, not tokens, as
    in TRL.
    """

    loss: torch.Tensor  # () what backward() is called on
    per_token_loss: torch.Tensor  # (B, T) policy term (+ beta * KL), before masking and aggregation
    ratio: torch.Tensor  # (B, T) pi_theta / pi_old, detached; (B, 1) at importance_sampling_level="sequence"
    per_token_kl: torch.Tensor | None  # (B, T) the KL term as it enters the loss, detached; None without ref_logps
    metrics: dict = field(default_factory=dict)  # name -> float


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    if x.size(-1) == 1 and mask.size(-1) != 1:  # one value per completion (sequence level): TRL averages rows
        return x.mean().item()
    return ((x * mask).sum() / mask.sum().clamp(min=1.0)).item()


def _seq_means(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # Per-sequence mean over completion tokens; NaN for a fully masked row, as in TRL.
    if x.size(-1) == 1 and mask.size(-1) != 1:
        return x[:, 0]  # (B,) already one value per completion
    return (x * mask).sum(-1) / mask.sum(-1)  # (B,)


def _vespo_weights(advantages: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor,
                   importance_sampling_ratio: torch.Tensor | None, k_pos: float, lambda_pos: float, k_neg: float,
                   lambda_neg: float) -> torch.Tensor:
    # VESPO's gamma weight of a completion, phi(w) = e^lambda w^k e^(-lambda w) (phi(1) = 1), with
    # w = prod_t pi_theta / pi_old (a product, not GSPO's geometric mean); detached, in log space, clamped as in TRL.
    with torch.no_grad():
        lower = math.log(1e-8)
        log_w = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)  # (B, 1)
        if importance_sampling_ratio is not None:  # TRL sums the vLLM log-ratios over all T positions
            log_w = log_w + torch.clamp(torch.log(importance_sampling_ratio), lower, 20.0).sum(-1, keepdim=True)
        log_w = torch.clamp(log_w, lower, 20.0)
        nonneg = advantages >= 0  # (B, 1)
        k = torch.where(nonneg, k_pos, k_neg)
        lam = torch.where(nonneg, lambda_pos, lambda_neg).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
        return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)  # (B, 1)


def aggregate_loss(per_token_loss: torch.Tensor, completion_mask: torch.Tensor, loss_type: str = "dapo", *,
                   max_completion_length: int | None = None,
                   num_items_in_batch: int | torch.Tensor | None = None) -> torch.Tensor:
    """Return the scalar loss: the per-token losses averaged over the ``completion_mask`` as ``loss_type`` says.

    ``per_token_loss`` and ``completion_mask`` are ``(B, T)``. By TRL 1.16's ``loss_type``:

    - ``"grpo"``, ``"sapo"``: :math:`\\frac1B\\sum_i \\frac{1}{|o_i|}\\sum_t \\ell_{i,t}`, a mean per completion, then over
      completions (DeepSeekMath: every completion weighs the same, so a token of a short completion weighs more);
    - ``"bnpo"``: :math:`\\sum_{i,t}\\ell_{i,t} / \\sum_i |o_i|`, a token mean over this batch;
    - ``"dr_grpo"``: :math:`\\sum_{i,t}\\ell_{i,t} / (B \\cdot` ``max_completion_length``:math:`)`, a constant
      (``T`` when not given);
    - ``"dapo"`` (TRL's default), ``"cispo"``, ``"vespo"``: :math:`\\sum_{i,t}\\ell_{i,t}` / ``num_items_in_batch``,
      the token count of the whole generation batch across gradient-accumulation steps, so that the losses of the
      micro-batches sum to the token mean of the whole batch (this batch's count when not given: then it is ``bnpo``);
    - ``"luspo"`` (arXiv 2602.05261, as TRL cites it): :math:`\\frac1B\\sum_i\\sum_t \\ell_{i,t}`, a sum per
      completion, then a mean (a completion weighs by its length; meant for ``importance_sampling_level="sequence"``).

    Used by :func:`grpo_loss`; the exercise ``aggregate_loss`` of ``01_grpo_objective.ipynb`` checks a
    learner's version against it.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, not {loss_type!r}")
    mask = completion_mask.to(per_token_loss.dtype)  # (B, T)
    if loss_type in ("grpo", "sapo"):
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        length = per_token_loss.size(1) if max_completion_length is None else max_completion_length
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * length)
    if loss_type == "luspo":
        return (per_token_loss * mask).sum(-1).mean()
    # dapo, cispo, vespo
    n = mask.sum() if num_items_in_batch is None else torch.as_tensor(num_items_in_batch, dtype=mask.dtype)
    return (per_token_loss * mask).sum() / n.clamp(min=1.0)


def grpo_loss(logps: torch.Tensor, old_logps: torch.Tensor | None, advantages: torch.Tensor,
              completion_mask: torch.Tensor, *, ref_logps: torch.Tensor | None = None, beta: float = 0.0,
              epsilon: float = 0.2, epsilon_high: float | None = None, loss_type: str = "dapo",
              importance_sampling_level: str = "token", max_completion_length: int | None = None,
              num_items_in_batch: int | torch.Tensor | None = None, use_bias_correction_kl: bool = True,
              delta: float | None = None, importance_sampling_ratio: torch.Tensor | None = None,
              sapo_temperature_pos: float = 1.0, sapo_temperature_neg: float = 1.05, vespo_k_pos: float = 2.0,
              vespo_lambda_pos: float = 3.0, vespo_k_neg: float = 3.0,
              vespo_lambda_neg: float = 2.0) -> GRPOLossOutput:
    """Return a :class:`GRPOLossOutput`: GRPO's clipped surrogate loss (or a variant) and its diagnostics.

    **The importance ratio** of token ``t`` of completion ``i``, by ``importance_sampling_level``:

    - ``"token"`` (GRPO, TRL's default): :math:`r_{i,t} = \\pi_\\theta(o_{i,t}) / \\pi_{old}(o_{i,t})`, ``(B, T)``;
    - ``"sequence"`` (GSPO, arXiv 2507.18071): one ratio per completion, the geometric mean of its
      token ratios,
      :math:`s_i = \\exp\\big(\\frac{1}{|o_i|}\\sum_t \\log\\frac{\\pi_\\theta(o_{i,t})}{\\pi_{old}(o_{i,t})}\\big)`,
      ``(B, 1)``, differentiable through every token of the completion; clipping then keeps or
      drops whole completions. On-policy (``s_i = 1``) the clipped losses have the token level's gradient.

    **The per-token loss** by ``loss_type`` (``r`` is the ratio above, ``A_i`` the advantage):

    - clipped surrogate (``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``, ``luspo``):
      :math:`-\\min\\big(r A_i,\\ \\operatorname{clip}(r, 1-\\epsilon, 1+\\epsilon_{high}) A_i\\big)`;
    - ``"cispo"`` (MiniMax-M1, arXiv 2506.13585):
      :math:`-\\operatorname{sg}[\\min(r, \\epsilon_{high})]\\, A_i \\log\\pi_\\theta`:
      the ratio is capped and detached, so no token's gradient is ever zeroed; here
      ``epsilon_high`` is the cap ε_max (TRL quotes 5.0 as the recommended value; left at None it is
      ``epsilon``, as in TRL);
    - ``"sapo"`` (arXiv 2511.20347): :math:`-\\frac{4}{\\tau}\\sigma\\big(\\tau (r - 1)\\big) A_i`, a soft gate in
      place of the hard clip, :math:`\\tau` = ``sapo_temperature_pos`` for ``A > 0``, else ``_neg``;
    - ``"vespo"`` (arXiv 2602.10693, as TRL cites it): :math:`-\\phi(w_i) A_i \\log\\pi_\\theta`,
      :math:`\\phi(w) = e^{\\lambda} w^k e^{-\\lambda w}` detached,
      :math:`w_i = \\prod_t r_{i,t}`, ``k`` and ``lambda`` by the sign of ``A_i``.

    Then ``+ beta * r * k3`` when ``ref_logps`` is given: the ``r`` in front of the KL is TRL's
    ``use_bias_correction_kl``. It is 1 in value on-policy but not in gradient: with it the expected
    gradient is that of KL(pi_theta || pi_ref); without it, that of KL(pi_ref || pi_theta) (see
    :func:`kl_k3`). At the sequence level the sequence ratio multiplies the per-token KL, as in TRL.

    **Aggregation** over the ``completion_mask``, by ``loss_type``: :func:`aggregate_loss` (``grpo`` and ``sapo``
    average each completion's tokens, then the completions; ``dapo``, TRL's default, takes the token mean).

    Shapes: ``logps``, ``old_logps``, ``ref_logps``, ``completion_mask``: ``(B, T)``;
    ``advantages``: ``(B,)``. ``old_logps=None`` means on-policy (``logps.detach()``, as TRL
    does with one iteration per generation). ``max_completion_length`` defaults to ``T``.
    ``delta`` (two-sided clipping of the ratio from above, INTELLECT-2) and
    ``importance_sampling_ratio`` (``(B, T)``, TRL's vLLM sampling correction) follow TRL; both
    are off by default. TRL's gradient-accumulation scaling is not applied: this is the loss
    of one batch. Every ``loss_type`` and level is checked against TRL 1.16's ``GRPOTrainer`` in
    ``tests/test_objective.py``. Introduced in ``01_grpo_objective.ipynb``.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, not {loss_type!r}")
    if importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS} (as in TRL 1.16), "
                         f"not {importance_sampling_level!r}")
    if beta != 0.0 and ref_logps is None:
        raise ValueError("beta != 0 needs ref_logps, the reference model's log-probs of the same tokens")
    if logps.dim() != 2 or completion_mask.shape != logps.shape:
        raise ValueError(f"logps and completion_mask must both be (B, T); got {tuple(logps.shape)} "
                         f"and {tuple(completion_mask.shape)}")
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    mask = completion_mask.to(logps.dtype)  # (B, T)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (B, 1), the same advantage for every token
    old_logps = logps.detach() if old_logps is None else old_logps

    log_ratio = logps - old_logps  # (B, T)
    if importance_sampling_level == "token":
        ratio = torch.exp(log_ratio)  # (B, T) pi_theta / pi_old per token
    else:  # GSPO: the geometric mean over the completion's tokens, one ratio per completion
        lengths = mask.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1)
        ratio = torch.exp((log_ratio * mask).sum(-1, keepdim=True) / lengths)  # (B, 1)
    ratio_seen = ratio  # what the clip metrics look at

    if loss_type == "cispo":
        # Cap and detach the ratio: it only weights REINFORCE's log-prob gradient, never zeroes it.
        per_token_loss = -torch.clamp(ratio, max=epsilon_high).detach() * advantages * logps  # (B, T)
    elif loss_type == "sapo":
        temperature = torch.where(advantages > 0, sapo_temperature_pos, sapo_temperature_neg)  # (B, 1)
        per_token_loss = -torch.sigmoid(temperature * (ratio - 1)) * 4 / temperature * advantages
    elif loss_type == "vespo":
        phi = _vespo_weights(advantages, log_ratio, mask, importance_sampling_ratio, vespo_k_pos, vespo_lambda_pos,
                             vespo_k_neg, vespo_lambda_neg)  # (B, 1)
        per_token_loss = -phi * advantages * logps  # (B, T)
    else:
        clipped_ratio = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
        # INTELLECT-2's two-sided clipping also caps the unclipped branch (it matters for A < 0).
        ratio_seen = ratio if delta is None else torch.clamp(ratio, max=delta)
        # Pessimistic bound: take the smaller objective, i.e. the larger loss.
        per_token_loss = -torch.min(ratio_seen * advantages, clipped_ratio * advantages)  # (B, T) or (B, 1)
    if importance_sampling_ratio is not None and loss_type != "vespo":  # vespo took it into phi
        per_token_loss = per_token_loss * importance_sampling_ratio

    per_token_kl = None
    if ref_logps is not None:
        per_token_kl = kl_k3(logps, ref_logps)  # (B, T)
        if use_bias_correction_kl:
            per_token_kl = per_token_kl * ratio  # (B, T); the sequence ratio is broadcast over the tokens
        if beta != 0.0:
            per_token_loss = per_token_loss + beta * per_token_kl
    per_token_loss = per_token_loss.expand_as(mask)  # (B, T) also when the policy term is one per completion

    loss = aggregate_loss(per_token_loss, mask, loss_type, max_completion_length=max_completion_length,
                          num_items_in_batch=num_items_in_batch)

    with torch.no_grad():
        ratio, seen = ratio.detach(), ratio_seen.detach()  # TRL counts clipping on the delta-capped ratio
        active = mask.bool()
        metrics = {}
        if loss_type in CLIPPED_LOSS_TYPES:
            is_low = ((seen < 1 - epsilon) & (advantages < 0)).to(mask.dtype)  # clipped: no gradient
            is_high = ((seen > 1 + epsilon_high) & (advantages > 0)).to(mask.dtype)
            is_region = torch.maximum(is_low, is_high)
            low_per_seq, high_per_seq = _seq_means(is_low, mask), _seq_means(is_high, mask)
            metrics.update({
                "clip_ratio/low_mean": _masked_mean(is_low, mask),
                "clip_ratio/low_min": torch.nan_to_num(low_per_seq, nan=math.inf).min().item(),
                "clip_ratio/high_mean": _masked_mean(is_high, mask),
                "clip_ratio/high_max": torch.nan_to_num(high_per_seq, nan=-math.inf).max().item(),
                "clip_ratio/region_mean": _masked_mean(is_region, mask),
            })
            if not torch.isfinite(low_per_seq).any():  # every row masked out
                metrics["clip_ratio/low_min"] = metrics["clip_ratio/high_max"] = math.nan
        elif loss_type == "cispo":
            metrics["cispo_clip_ratio"] = _masked_mean(((ratio > epsilon_high) & (advantages > 0)).to(mask.dtype), mask)
        elif loss_type == "vespo":
            metrics["vespo/phi_seq_mean"] = phi.mean().item()
        metrics["ratio/mean"] = _masked_mean(ratio, mask)
        metrics["ratio/max"] = ratio.expand_as(mask)[active].max().item() if active.any() else math.nan
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


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Return the entropy, in nats, of each position's next-token distribution ``softmax(logits)``.

    ``logits`` is ``(..., V)``; the result is ``(...)`` in float32:
    :math:`H = -\\sum_v p_v \\log p_v`. 0 means the policy is certain of its next token; a policy
    whose entropy collapses early stops exploring, its groups stop differing and GRPO's
    advantages go to zero. TRL logs the masked mean over completion tokens as ``entropy``
    (``trl.trainer.utils.entropy_from_logits``).
    """
    logps = torch.log_softmax(logits.float(), dim=-1)  # (..., V)
    return -(logps.exp() * logps).sum(-1)  # (...)


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
    backward pass. Introduced in ``01b_grpo_variants.ipynb`` (section 4); measured by ``python -m labkit
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
    Introduced in ``01_grpo_objective.ipynb`` (section 6); chunked in ``01b_grpo_variants.ipynb`` (section 4).
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
    # A PEFT model wraps the causal LM; LoRA layers live inside it, so its body and head are the ones to use.
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
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
