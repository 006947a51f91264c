"""Exercises on the GRPO objective: the learner writes each piece of the loss (notebooks 01 and 01b).

Each exercise's reference is :mod:`labkit.objective`'s own function, which ``tests/test_objective.py``
checks against TRL 1.16's ``GRPOTrainer``; each lists the plausible wrong answers it recognises.
Solutions: ``docs/solutions/01_grpo_objective.md`` (``group_advantages``, ``clipped_surrogate``,
``kl_k3``, ``aggregate_loss``) and ``docs/solutions/01b_grpo_variants.md`` (``k3_gradient``,
``sequence_ratio``).
"""
from __future__ import annotations

import torch

from labkit import objective
from labkit.exercises import Case, Exercise, gradient_compare, register

__all__ = ["GROUP_ADVANTAGES", "CLIPPED_SURROGATE", "KL_K3", "AGGREGATE_LOSS", "K3_GRADIENT", "SEQUENCE_RATIO"]

_SOLUTIONS_01 = "docs/solutions/01_grpo_objective.md"
_SOLUTIONS_01B = "docs/solutions/01b_grpo_variants.md"


# --------------------------------------------------------------------------- group advantages (01, section 2)


def _advantages_reference(rewards, num_generations, scale_rewards="group"):
    return objective.group_advantages(rewards, num_generations, scale=scale_rewards)


def _advantages_cases() -> list[Case]:
    two_groups = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.0, 0.0])
    uneven = torch.tensor([2.0, 0.0, 1.0, 1.0, 0.25, 3.0, 0.0, 1.0, 1.0])
    flat = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    # Rewards 0.01-0.02 apart (a small length penalty, say): std about 0.01, where std + 1e-4 and
    # sqrt(var + 1e-4) part (0.0097 against 0.0138); with large stds the two agree to 1e-4.
    close = torch.tensor([0.50, 0.50, 0.51, 0.52, 1.0, 0.98, 1.0, 0.99])
    return [
        Case("two groups of 4, scale_rewards='group' (TRL's default)", (two_groups, 4), {"scale_rewards": "group"}),
        Case("three groups of 3, scale_rewards='group'", (uneven, 3), {"scale_rewards": "group"}),
        Case("two groups of 4, scale_rewards='none' (Dr. GRPO)", (two_groups, 4), {"scale_rewards": "none"}),
        Case("three groups of 3, scale_rewards='none'", (uneven, 3), {"scale_rewards": "none"}),
        Case("a flat group (every reward 0) next to a mixed one, 'group'", (flat, 4), {"scale_rewards": "group"}),
        Case("two groups of rewards 0.01 to 0.02 apart (std about 0.01), 'group'", (close, 4),
             {"scale_rewards": "group"}),
    ]


def reference_advantages(rewards, num_generations, scale=True, *, layout="rows", baseline="group", unbiased=True, eps=1e-4,
                eps_in_sqrt=False):
    """Return advantages ``(B,)`` as a learner might compute them: the defaults are TRL's, each keyword one slip.

    ``layout``: ``"rows"`` (``view(-1, G)``, one prompt per row), ``"columns"`` (``view(G, -1)``: the groups
    transposed, each "group" one completion of every prompt) or ``"batch"`` (the whole batch one group);
    ``baseline``: ``"group"``, ``"batch"`` (the whole batch's mean) or ``"others"`` (RLOO's leave-one-out mean).
    Also used by the mistakes of :mod:`labkit.exercises.nano`.
    """
    dim = 0 if layout == "columns" else 1
    grouped = rewards.view({"rows": (-1, num_generations), "columns": (num_generations, -1), "batch": (1, -1)}[layout])
    if baseline == "batch":
        mean = rewards.mean()
    elif baseline == "others":
        mean = (grouped.sum(dim, keepdim=True) - grouped) / (num_generations - 1)
    else:
        mean = grouped.mean(dim, keepdim=True)
    adv = grouped - mean
    if scale:
        adv = adv / (torch.sqrt(grouped.var(dim, keepdim=True) + eps) if eps_in_sqrt
                     else grouped.std(dim, unbiased=unbiased, keepdim=True) + eps)
    return adv.flatten()


def _adv_mistake(**slip):
    return lambda rewards, num_generations, scale_rewards="group": reference_advantages(
        rewards, num_generations, scale_rewards == "group", **slip)


GROUP_ADVANTAGES = register(Exercise(
    name="group_advantages",
    reference=_advantages_reference,
    cases=_advantages_cases,
    mistakes={
        "the std has no Bessel correction: TRL divides by the sample std, torch.std's default (unbiased=True)":
            _adv_mistake(unbiased=False),
        "the mean is the whole batch's: each completion's baseline is the mean of its own group "
        "(view the rewards as (num_prompts, num_generations) and average along dim=1)": _adv_mistake(baseline="batch"),
        "both the mean and the std are the whole batch's: GRPO normalises each group of num_generations on its own "
        "(rewards.view(-1, num_generations), then statistics along dim=1)": _adv_mistake(layout="batch"),
        "these are the rewards themselves: the advantage is the reward minus its group's mean":
            lambda rewards, num_generations, scale_rewards="group": rewards.clone(),
        "scale_rewards='none' still divides by the std: 'none' (Dr. GRPO) only subtracts the group mean":
            lambda rewards, num_generations, scale_rewards="group": reference_advantages(rewards, num_generations),
        "no epsilon: TRL divides by std + 1e-4, so a flat group gets advantage 0, not 0/0 = NaN": _adv_mistake(eps=0.0),
        "the epsilon is too small: TRL divides by std + 1e-4, not 1e-8 (or 1e-6); a flat group still gets 0, but "
        "every other advantage comes out about 0.02 % larger, and 1 % larger where the std is about 0.01":
            _adv_mistake(eps=1e-8),
        "1e-4 is added to the variance, inside the square root: TRL divides by std + 1e-4. The two agree when the "
        "std is large; for rewards about 0.01 apart (std 0.0096) std + 1e-4 is 0.0097 but sqrt(var + 1e-4) is "
        "0.0138, so every advantage shrinks by 30 %": _adv_mistake(eps_in_sqrt=True),
        "the groups are transposed: TRL puts the num_generations completions of a prompt next to each other, so "
        "rewards.view(-1, num_generations) has one prompt per row; view(num_generations, -1) makes each 'group' "
        "one completion of every prompt": _adv_mistake(layout="columns"),
        "that is RLOO's leave-one-out baseline (the mean of the OTHER completions); GRPO's mean includes the "
        "completion's own reward": _adv_mistake(baseline="others"),
    },
    nudge="each completion is compared with the other completions of its own prompt (its group), never with the "
          "whole batch; 'none' differs from 'group' in one step only.",
    hint="rewards.view(-1, num_generations) puts one group per row; subtract each row's mean; with "
         "scale_rewards='group' divide by the row's std (torch.std, Bessel-corrected) + 1e-4 (outside the square "
         "root); with 'none' do not divide.",
    solution=f"{_SOLUTIONS_01}#exercise-group_advantages",
    reference_name="labkit.objective.group_advantages, equal to TRL's GRPOTrainer advantages",
))


# --------------------------------------------------------------------------- the clipped surrogate (01, section 3)


def _surrogate_reference(logps, old_logps, advantages, epsilon=0.2, epsilon_high=0.2):
    # TRL's defaults: epsilon=0.2, epsilon_high=None (the same as epsilon). Every case passes both.
    mask = torch.ones_like(logps)
    return objective.grpo_loss(logps, old_logps, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high,
                               loss_type="bnpo").per_token_loss


def _surrogate_cases() -> list[Case]:
    # Four completions x five tokens; ratios on both sides of both bounds, advantages of both signs.
    ratios = torch.tensor([[0.5, 0.9, 1.0, 1.25, 1.6],
                           [0.5, 0.9, 1.0, 1.25, 1.6],
                           [0.7, 0.79, 1.1, 1.3, 2.0],
                           [0.7, 0.79, 1.1, 1.3, 2.0]])
    old_logps = -torch.linspace(0.5, 3.0, 20).view(4, 5)
    logps = (old_logps + ratios.log()).requires_grad_()  # the policy's: the loss's gradient flows to it
    advantages = torch.tensor([1.0, -1.0, 0.5, -1.5])
    g = torch.Generator().manual_seed(0)
    old2 = -3 * torch.rand(6, 7, generator=g)
    logps2 = (old2 + 0.4 * torch.randn(6, 7, generator=g)).requires_grad_()
    adv2 = torch.tensor([1.2, -0.3, 0.0, 0.8, -1.1, 0.4])
    return [
        Case("ratios 0.5 to 2.0 on both sides of both bounds, epsilon=0.2, epsilon_high=0.28 (DAPO's clip-higher)",
             (logps, old_logps, advantages), {"epsilon": 0.2, "epsilon_high": 0.28}),
        Case("the same tokens with TRL's default symmetric clip, epsilon=epsilon_high=0.2",
             (logps, old_logps, advantages), {"epsilon": 0.2, "epsilon_high": 0.2}),
        Case("random (6, 7) log-probs, epsilon=0.1, epsilon_high=0.3", (logps2, old2, adv2),
             {"epsilon": 0.1, "epsilon_high": 0.3}),
    ]


def _sur(logps, old_logps, advantages, lo, hi, combine=torch.min, ratio=None):
    ratio = torch.exp(logps - old_logps) if ratio is None else ratio
    a = advantages[:, None]
    return -combine(ratio * a, torch.clamp(ratio, lo, hi) * a)


CLIPPED_SURROGATE = register(Exercise(
    name="clipped_surrogate",
    reference=_surrogate_reference,
    cases=_surrogate_cases,
    mistakes={
        "the upper clip side is missing: clamp the ratio to [1 - epsilon, 1 + epsilon_high], not only from below":
            lambda lp, olp, a, epsilon=0.2, epsilon_high=0.2: _sur(lp, olp, a, 1 - epsilon, None),
        "the lower clip side is missing: clamp the ratio to [1 - epsilon, 1 + epsilon_high], not only from above":
            lambda lp, olp, a, epsilon=0.2, epsilon_high=0.2: _sur(lp, olp, a, None, 1 + epsilon_high),
        "epsilon_high is ignored: the upper bound is 1 + epsilon_high (DAPO's clip-higher), the lower 1 - epsilon":
            lambda lp, olp, a, epsilon=0.2, epsilon_high=0.2: _sur(lp, olp, a, 1 - epsilon, 1 + epsilon),
        "epsilon and epsilon_high are swapped: the ratio is clamped to [1 - epsilon, 1 + epsilon_high] (DAPO's "
        "clip-higher raises the upper bound only), not [1 - epsilon_high, 1 + epsilon]":
            lambda lp, olp, a, epsilon=0.2, epsilon_high=0.2: _sur(lp, olp, a, 1 - epsilon_high, 1 + epsilon),
        "the clip bounds are the wrong way round: torch.clamp(ratio, 1 + epsilon_high, 1 - epsilon) has min > max, "
        "so every clipped ratio becomes 1 - epsilon; the lower bound (min) is 1 - epsilon, the upper (max) "
        "1 + epsilon_high": lambda lp, olp, a, epsilon=0.2, epsilon_high=0.2: _sur(lp, olp, a, 1 + epsilon_high,
                                                                                1 - epsilon),
        "max where min belongs: the surrogate takes the smaller objective (min), so the loss is -min(...)":
            lambda lp, olp, a, epsilon=0.2, epsilon_high=0.2: _sur(lp, olp, a, 1 - epsilon, 1 + epsilon_high,
                                                                    combine=torch.max),
        "only the clipped term: without min(ratio * A, clipped * A) the update can no longer undo a mistake":
            lambda lp, olp, a, epsilon=0.2, epsilon_high=0.2: -torch.clamp(
                torch.exp(lp - olp), 1 - epsilon, 1 + epsilon_high) * a[:, None],
        "the ratio is upside down: it is pi_theta / pi_old = exp(logps - old_logps)":
            lambda lp, olp, a, epsilon=0.2, epsilon_high=0.2: _sur(lp, olp, a, 1 - epsilon, 1 + epsilon_high,
                                                                    ratio=torch.exp(olp - lp)),
    },
    nudge="the ratio comes from the two log-probs; the loss is minus the pessimistic (smaller) of the unclipped "
          "and the clipped objective.",
    hint="ratio = exp(logps - old_logps), (B, T); A = advantages[:, None], (B, 1); per-token loss = "
         "-min(ratio * A, clamp(ratio, 1 - epsilon, 1 + epsilon_high) * A).",
    solution=f"{_SOLUTIONS_01}#exercise-clipped_surrogate",
    compare=gradient_compare("logps"),
    reference_name="labkit.objective.grpo_loss(...).per_token_loss",
))


# --------------------------------------------------------------------------- the k3 estimator (01, section 4)


def _kl_cases() -> list[Case]:
    g = torch.Generator().manual_seed(1)
    base = -4 * torch.rand(3, 6, generator=g)
    logps = base.clone().requires_grad_()  # the policy's: the KL's gradient flows to it, not to the reference's
    return [
        Case("a policy close to its reference (log-ratios within 0.1)",
             (logps, base + 0.1 * torch.randn(3, 6, generator=g))),
        Case("a policy far from its reference (log-ratios of about 1.5)",
             (logps, base + 1.5 * torch.randn(3, 6, generator=g))),
        Case("equal log-probs (the first step: KL 0)", (logps, base.clone())),
    ]


KL_K3 = register(Exercise(
    name="kl_k3",
    reference=objective.kl_k3,
    cases=_kl_cases,
    mistakes={
        "the log-ratio is the wrong way round: k3 uses x = ref_logps - logps, i.e. log(pi_ref / pi_theta)":
            lambda logps, ref_logps: torch.exp(logps - ref_logps) - (logps - ref_logps) - 1,
        "that is k1 (logps - ref_logps): unbiased, but negative on many tokens":
            objective.kl_k1,
        "that is k2 ((ref_logps - logps)^2 / 2): never negative, but biased":
            objective.kl_k2,
        "the '- 1' is missing: e^x - x - 1 is 0 when the policies agree":
            lambda logps, ref_logps: torch.exp(ref_logps - logps) - (ref_logps - logps),
        "+ 1 where - 1 belongs: k3 = e^x - x - 1, which is 0 when the policies agree; e^x - x + 1 is 2 there, "
        "so every token's KL is 2 too large":
            lambda logps, ref_logps: torch.exp(ref_logps - logps) - (ref_logps - logps) + 1,
    },
    nudge="start from x = log(pi_ref / pi_theta) per token, the way round the table writes it, then apply the "
          "k3 row.",
    hint="x = ref_logps - logps (per token); k3 = exp(x) - x - 1.",
    solution=f"{_SOLUTIONS_01}#exercise-kl_k3",
    compare=gradient_compare("logps"),
    reference_name="labkit.objective.kl_k3, TRL's per-token KL",
))


# --------------------------------------------------------------------------- aggregation (01, section 5)


def _aggregate_reference(per_token_loss, completion_mask, loss_type, max_completion_length):
    return objective.aggregate_loss(per_token_loss, completion_mask, loss_type,
                                    max_completion_length=max_completion_length)


def _aggregate_cases() -> list[Case]:
    g = torch.Generator().manual_seed(2)
    loss = torch.randn(4, 6, generator=g)
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    # Padding holds junk, as it does in a real batch: a loss that forgets the mask counts it.
    loss = torch.where(mask.bool(), loss, torch.full_like(loss, 7.0)).requires_grad_()
    return [Case(f"loss_type={lt!r}, 4 completions of 2, 6, 3 and 1 tokens, max_completion_length=8",
                 (loss, mask, lt, 8)) for lt in ("grpo", "bnpo", "dr_grpo", "dapo")]


def _agg_mistake(kind):
    def wrong(per_token_loss, completion_mask, loss_type, max_completion_length):
        m = torch.ones_like(per_token_loss) if kind == "no_mask" else completion_mask.float()
        total = (per_token_loss * m).sum()
        seq_mean = ((per_token_loss * m).sum(-1) / m.sum(-1)).mean()
        tok_mean = total / m.sum()
        if kind == "sum":  # no normalisation at all
            return total
        if kind == "token_mean" or (kind == "dr_tokens" and loss_type == "dr_grpo"):  # the token mean
            return tok_mean
        if kind == "swapped":  # grpo as a token mean, the token-level types as a sequence mean
            return tok_mean if loss_type == "grpo" else seq_mean
        return {"grpo": seq_mean, "dr_grpo": total / (m.size(0) * max_completion_length)}.get(loss_type, tok_mean)
    return wrong


AGGREGATE_LOSS = register(Exercise(
    name="aggregate_loss",
    reference=_aggregate_reference,
    cases=_aggregate_cases,
    mistakes={
        "token mean and sequence mean are swapped: 'grpo' averages each completion's tokens, then the completions; "
        "'bnpo' / 'dapo' divide the sum over all tokens by the number of tokens": _agg_mistake("swapped"),
        "the completion_mask is ignored: padding tokens enter the sum and the counts": _agg_mistake("no_mask"),
        "'dr_grpo' divides by the token count: it divides by B * max_completion_length, a constant":
            _agg_mistake("dr_tokens"),
        "no normalisation: the loss is a sum, so it grows with the batch and the lengths": _agg_mistake("sum"),
        "the token mean for every loss_type: right for 'bnpo' and 'dapo' only. 'grpo' averages each completion's "
        "tokens first, then the completions (each completion weighs the same); 'dr_grpo' divides the sum by "
        "B * max_completion_length": _agg_mistake("token_mean"),
    },
    nudge="every loss_type sums the masked per-token losses; they differ in what they divide by, and 'grpo' "
          "averages within each completion first.",
    hint="m = completion_mask.float(); grpo: ((loss * m).sum(1) / m.sum(1)).mean(); bnpo and dapo (one batch): "
         "(loss * m).sum() / m.sum(); dr_grpo: (loss * m).sum() / (B * max_completion_length).",
    solution=f"{_SOLUTIONS_01}#exercise-aggregate_loss",
    compare=gradient_compare("per_token_loss"),
    reference_name="labkit.objective.aggregate_loss, the aggregation inside grpo_loss, equal to TRL's",
))


# --------------------------------------------------------------------------- the k3 gradient (01b, section 1)


def _k3_gradient_reference(logps, ref_logps):
    logps = logps.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(objective.kl_k3(logps, ref_logps).sum(), logps)
    return grad


K3_GRADIENT = register(Exercise(
    name="k3_gradient",
    reference=_k3_gradient_reference,
    cases=_kl_cases,
    mistakes={
        "that is the derivative of k3 with the log-ratio the wrong way round (x = logps - ref_logps)":
            lambda logps, ref_logps: torch.exp(logps - ref_logps) - 1,
        "the sign is flipped: d k3 / d logps = 1 - pi_ref / pi_theta (x = ref_logps - logps, dx/dlogps = -1)":
            lambda logps, ref_logps: torch.exp(ref_logps - logps) - 1,
        "that is k1's gradient (1 for every token): on average it is zero, k1 pulls nowhere":
            lambda logps, ref_logps: torch.ones_like(logps),
        "that is k2's gradient (logps - ref_logps)":
            lambda logps, ref_logps: logps - ref_logps,
    },
    nudge="differentiate k3 = e^x - x - 1 with the chain rule, remembering that x = ref_logps - logps depends "
          "on logps with slope -1.",
    hint="With x = ref_logps - logps, k3 = e^x - x - 1 and dx/dlogps = -1, so d k3 / d logps = -(e^x - 1) = "
         "1 - exp(ref_logps - logps). Write it by hand, then compare with autograd.",
    solution=f"{_SOLUTIONS_01B}#exercise-k3_gradient",
    reference_name="autograd of labkit.objective.kl_k3",
))


# --------------------------------------------------------------------------- GSPO's sequence ratio (01b, section 3)


def _sequence_ratio_reference(logps, old_logps, completion_mask):
    # grpo_loss's .ratio is detached (a diagnostic); with advantage 1 and no clipping each completion's per-token
    # loss is -s, so -per_token_loss is the ratio the loss uses, with its gradient
    out = objective.grpo_loss(logps, old_logps, torch.ones(logps.size(0)), completion_mask, epsilon=1.0,
                              epsilon_high=float("inf"), importance_sampling_level="sequence", loss_type="grpo")
    return -out.per_token_loss[:, :1]  # (B, 1)


def _sequence_ratio_cases() -> list[Case]:
    g = torch.Generator().manual_seed(3)
    base = -3 * torch.rand(4, 6, generator=g)
    logps = base.clone().requires_grad_()  # the policy's: the ratio's gradient flows to it
    old = base + 0.3 * torch.randn(4, 6, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]])
    stale = base + 0.8 * torch.randn(4, 6, generator=g)
    return [Case("4 completions of 6, 2, 4 and 1 tokens, slightly off-policy", (logps, old, mask)),
            Case("the same, further off-policy", (logps, stale, mask)),
            Case("on-policy (old_logps = logps): every ratio 1", (logps, base.clone(), mask))]


def _seq(logps, old_logps, completion_mask, how):
    m = completion_mask.float()
    log_ratio = (logps - old_logps) * m
    if how == "upside_down":
        return torch.exp(-log_ratio.sum(1, keepdim=True) / m.sum(1, keepdim=True))
    if how == "product":
        return torch.exp(log_ratio.sum(1, keepdim=True))
    if how == "all_T":
        return torch.exp(log_ratio.sum(1, keepdim=True) / logps.size(1))
    ratios = torch.exp(logps - old_logps) * m  # arithmetic mean of token ratios
    return ratios.sum(1, keepdim=True) / m.sum(1, keepdim=True)


SEQUENCE_RATIO = register(Exercise(
    name="sequence_ratio",
    reference=_sequence_ratio_reference,
    cases=_sequence_ratio_cases,
    mistakes={
        "that is the product of the token ratios (VESPO's w): GSPO takes their geometric mean, "
        "exp(mean of the log-ratios over the completion's tokens)": lambda lp, olp, m: _seq(lp, olp, m, "product"),
        "padding is counted: divide the sum of log-ratios by the completion's length, completion_mask.sum(1), not T":
            lambda lp, olp, m: _seq(lp, olp, m, "all_T"),
        "the ratio is upside down: GSPO's s is (pi_theta / pi_old)^(1/|y|), the exp of the mean of "
        "logps - old_logps, not old_logps - logps": lambda lp, olp, m: _seq(lp, olp, m, "upside_down"),
        "that is the arithmetic mean of the token ratios: GSPO averages the log-ratios, then takes exp "
        "(a geometric mean)": lambda lp, olp, m: _seq(lp, olp, m, "arithmetic"),
    },
    nudge="a geometric mean is the exp of a mean of logs: average the log-ratios over each completion's own "
          "tokens only (the mask).",
    hint="log_ratio = (logps - old_logps) * mask; s = exp(log_ratio.sum(1, keepdim=True) / mask.sum(1, keepdim=True)), "
         "shape (B, 1).",
    solution=f"{_SOLUTIONS_01B}#exercise-sequence_ratio",
    compare=gradient_compare("logps"),
    reference_name="the ratio of labkit.objective.grpo_loss(..., importance_sampling_level='sequence')",
))
