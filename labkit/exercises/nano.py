"""Coded exercises of ``03_nano_grpo_cpu.ipynb``: one GRPO step by hand, and pass@k.

- ``completion_mask``: which sampled tokens a completion owns (up to and including its first EOS),
  checked against :func:`labkit.nano.completion_mask` (TRL 1.16's rule);
- ``grpo_step_loss``: the score -> advantage -> loss step of the nano loop, from rewards and
  per-token log-probabilities to TRL's default loss, checked against
  :func:`labkit.objective.group_advantages` + :func:`labkit.objective.grpo_loss`;
- ``pass_at_k``: the unbiased pass@k estimator, checked against :func:`labkit.evaluate.pass_at_k`.

Each lists the plausible wrong answers it recognises; ``tests/test_exercises.py`` checks that the
reference passes and that each of them fails with its own message.
"""
from __future__ import annotations

import math

import torch

from labkit.exercises import Case, Exercise, gradient_compare, register
from labkit.exercises.objective import reference_advantages

__all__ = ["COMPLETION_MASK", "GRPO_STEP_LOSS", "PASS_AT_K"]

_SOLUTIONS = "docs/solutions/03_nano_grpo_cpu.md"


# ----------------------------------------------------------------------------- completion_mask


def _completion_mask(completion_ids, eos_token_id):
    from labkit.nano import completion_mask

    return completion_mask(completion_ids, eos_token_id)


def _mask_cases() -> list[Case]:
    eos = 2
    return [
        Case("completions that stop at different places (EOS = 2)",
             (torch.tensor([[5, 6, 2, 0, 0], [5, 2, 0, 0, 0], [7, 7, 7, 2, 0]]), eos)),
        Case("a completion cut at max_completion_length (no EOS at all)",
             (torch.tensor([[5, 6, 7, 8, 9], [5, 6, 2, 0, 0]]), eos)),
        Case("padding after the EOS is the EOS token again (pad_token = eos_token, as in many tokenizers)",
             (torch.tensor([[5, 6, 2, 2, 2], [2, 2, 2, 2, 2]]), eos)),
        Case("EOS id 0, a batch of one", (torch.tensor([[3, 4, 0, 5]]), 0)),
    ]


def _mask_without_eos(ids, eos):  # positions < first EOS: the EOS itself dropped
    is_eos = ids == eos
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), ids.size(1))
    return (torch.arange(ids.size(1)).unsqueeze(0) < first.unsqueeze(1)).long()


def _mask_not_eos(ids, eos):  # every token that is not EOS, wherever it is
    return (ids != eos).long()


def _mask_argmax_only(ids, eos):  # argmax without the "no EOS" case: a cut completion keeps one token
    first = (ids == eos).int().argmax(1)
    return (torch.arange(ids.size(1)).unsqueeze(0) <= first.unsqueeze(1)).long()


COMPLETION_MASK = register(Exercise(
    name="completion_mask",
    reference=_completion_mask,
    reference_name="labkit.nano.completion_mask, TRL 1.16's rule",
    cases=_mask_cases,
    mistakes={
        "the EOS token itself is masked out: TRL keeps it (position <= first EOS), so the model is trained to stop":
            _mask_without_eos,
        "tokens after the first EOS are kept when they are not EOS (padding counts, and a second EOS is dropped): "
        "everything after the first EOS must be 0": _mask_not_eos,
        "a completion with no EOS (cut at max_completion_length) keeps only its first token: argmax of an all-zero "
        "row is 0, so such rows must keep every token": _mask_argmax_only,
    },
    nudge="each row keeps its tokens up to and including its first EOS; a row that never emits EOS keeps all of "
          "them.",
    hint="find each row's first EOS (is_eos.int().argmax(1)), use the row length T where a row has no EOS "
         "(is_eos.any(1)), then compare torch.arange(T) with it: position <= first EOS.",
    solution=f"{_SOLUTIONS}#exercise-completion_mask",
))


# ----------------------------------------------------------------------------- grpo_step_loss


def _step_loss(logps, rewards, completion_mask, num_generations):
    from labkit.objective import group_advantages, grpo_loss

    advantages = group_advantages(rewards, num_generations)  # (B,)
    return grpo_loss(logps, None, advantages, completion_mask, loss_type="dapo").loss


def _loss_cases() -> list[Case]:
    g = torch.Generator().manual_seed(0)
    logps = (-torch.rand(8, 6, generator=g) * 3).requires_grad_()  # (B, T) log-probabilities are <= 0
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0],
                         [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    return [
        Case("2 prompts x G=4, rewards of the lab's weights (1 for the answer, 0.5 for the format)",
             (logps, torch.tensor([1.5, 0.5, 0.5, 0.0, 1.5, 1.5, 0.5, 0.0]), mask, 4)),
        Case("4 prompts x G=2, one group all equal (it teaches nothing)",
             (logps, torch.tensor([1.0, 0.0, 0.5, 0.5, 1.5, 0.0, 0.0, 1.0]), mask, 2)),
        # std about 0.01: where std + 1e-4 and sqrt(var + 1e-4) part (0.0097 against 0.0138)
        Case("2 prompts x G=4, rewards 0.01 to 0.02 apart (a small length penalty): std about 0.01",
             (logps, torch.tensor([0.50, 0.50, 0.51, 0.52, 1.0, 0.98, 1.0, 0.99]), mask, 4)),
        Case("1 prompt x G=8, rewards on another scale",
             (logps.detach()[:, :4].clone().requires_grad_(), torch.tensor([3.0, 1.0, 0.0, 2.0, 2.0, 0.0, 1.0, 3.0]),
              mask[:, :4], 8)),
    ]


def _token_mean(per_token, mask):
    mask = mask.to(per_token.dtype)
    return (per_token * mask).sum() / mask.sum()


def _sequence_mean(per_token, mask):
    mask = mask.to(per_token.dtype)
    return ((per_token * mask).sum(1) / mask.sum(1)).mean()


def _loss_mistake(ratio=lambda logps: torch.exp(logps - logps.detach()), aggregate=_token_mean, **advantage_slip):
    """Return a step loss with one slip: in the ratio (right: 1, with the gradient of log pi), the aggregation,
    or the advantages (a keyword of :func:`labkit.exercises.objective.reference_advantages`)."""
    def wrong(logps, rewards, mask, g):
        return aggregate(-ratio(logps) * reference_advantages(rewards, g, **advantage_slip).unsqueeze(1), mask)
    return wrong


GRPO_STEP_LOSS = register(Exercise(
    name="grpo_step_loss",
    reference=_step_loss,
    reference_name="labkit.objective.grpo_loss with labkit.objective.group_advantages, equal to TRL's",
    cases=_loss_cases,
    compare=gradient_compare("logps"),
    mistakes={
        "the advantage is not divided by the group's standard deviation (that is scale_rewards='none', "
        "Dr. GRPO; TRL's default divides by the group's std + 1e-4)": _loss_mistake(scale=False),
        "1e-4 is added to the variance, inside the square root: TRL divides by the group's std + 1e-4. The two "
        "agree when the std is large; for rewards about 0.01 apart sqrt(var + 1e-4) is 0.0138 where std + 1e-4 is "
        "0.0097, so the advantages shrink by 30 %": _loss_mistake(eps_in_sqrt=True),
        "the mean and std are taken over the whole batch, not within each group of num_generations completions "
        "of one prompt (the group is GRPO's baseline)": _loss_mistake(layout="batch"),
        "the std has no Bessel correction (unbiased=False); TRL, like torch.std, divides by G - 1":
            _loss_mistake(unbiased=False),
        "each completion is averaged over its own tokens, then over completions: that is loss_type='grpo'; "
        "TRL's default 'dapo' sums over all tokens of the batch and divides by their number":
            _loss_mistake(aggregate=_sequence_mean),
        "the completion_mask is not applied: tokens after the EOS (padding) are counted":
            _loss_mistake(aggregate=lambda per_token, mask: per_token.mean()),
        "the ratio is upside down: exp(logps.detach() - logps) is 1 as well, but its gradient is minus that of "
        "log pi, so every step would push the policy away from the high-advantage completions; the ratio is "
        "exp(logps - logps.detach())":
            _loss_mistake(ratio=lambda logps: torch.exp(logps.detach() - logps)),
        "the log-probabilities are multiplied by the advantage, not the ratio exp(logps - logps.detach()): the "
        "gradient is the same on-policy, but the loss's value is not TRL's (it is 1 x advantage per token)":
            _loss_mistake(ratio=lambda logps: logps),
    },
    nudge="in the section's order: advantages within each group, the on-policy ratio (1, with the gradient of "
          "log pi), then one mean over all completion tokens.",
    hint="advantages: reshape rewards to (num_prompts, G), subtract each row's mean, divide by its std + 1e-4, "
         "flatten. Loss: ratio = exp(logps - logps.detach()) (1, with the gradient of log pi); per token "
         "-(ratio * advantage); then (per_token * mask).sum() / mask.sum().",
    solution=f"{_SOLUTIONS}#exercise-grpo_step_loss",
))


# ----------------------------------------------------------------------------- pass@k


def _pass_at_k(n, c, k):
    from labkit.evaluate import pass_at_k

    return pass_at_k(n, c, k)


def _pass_cases() -> list[Case]:
    return [Case(f"n={n} samples, c={c} right, k={k}", (n, c, k))
            for n, c, k in [(8, 3, 1), (8, 3, 4), (8, 1, 8), (8, 0, 3), (8, 6, 4), (10, 5, 3), (20, 2, 5)]]


PASS_AT_K = register(Exercise(
    name="pass_at_k",
    reference=_pass_at_k,
    reference_name="labkit.evaluate.pass_at_k, Chen et al. 2021, eq. 1",
    cases=_pass_cases,
    mistakes={
        "1 - (1 - c/n)^k is the biased estimate (as if the k samples were drawn with replacement); draw k of "
        "the n without replacement: 1 - C(n-c, k) / C(n, k)": lambda n, c, k: 1 - (1 - c / n) ** k,
        "C(c, k) / C(n, k) is the chance that all k samples are right; pass@k asks for at least one":
            lambda n, c, k: math.comb(c, k) / math.comb(n, k),
        "c / n is pass@1 whatever k: more samples must give a higher chance that one is right":
            lambda n, c, k: c / n,
    },
    nudge="count the ways to draw k answers that are all wrong, out of all the ways to draw k of the n (without "
          "replacement).",
    hint="the chance that all k samples drawn (without replacement) from the n are wrong is "
         "C(n - c, k) / C(n, k) (math.comb); pass@k is one minus that.",
    solution=f"{_SOLUTIONS}#exercise-pass_at_k",
))
