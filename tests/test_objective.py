"""labkit.objective: advantages, KL estimators, the clipped loss (checked against TRL's own code), log-probs."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.objective import (CLIPPED_LOSS_TYPES, IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES, frac_reward_zero_std,
                              group_advantages, grpo_loss, kl_k1, kl_k2, kl_k3, per_token_logps,
                              token_entropy, token_logps_from_hidden)

FAST = settings(max_examples=60, deadline=None)
TRL_METRICS = ("clip_ratio/low_mean", "clip_ratio/low_min", "clip_ratio/high_mean", "clip_ratio/high_max",
               "clip_ratio/region_mean")


# ----------------------------------------------------------------------------- advantages


@FAST
@given(st.integers(2, 6), st.integers(1, 4), st.sampled_from(["group", "batch", "none"]), st.data())
def test_advantages_have_zero_mean_per_group(num_generations, num_prompts, scale, data):
    values = data.draw(st.lists(st.floats(-10, 10, allow_nan=False), min_size=num_generations * num_prompts,
                                max_size=num_generations * num_prompts))
    rewards = torch.tensor(values, dtype=torch.float64)
    advantages = group_advantages(rewards, num_generations, scale=scale).view(num_prompts, num_generations)
    torch.testing.assert_close(advantages.mean(1), torch.zeros(num_prompts, dtype=torch.float64),
                               atol=1e-9, rtol=0)
    if scale == "group":  # unit std within a group, unless the group is flat
        std = rewards.view(num_prompts, num_generations).std(1)
        expected = std / (std + 1e-4)
        torch.testing.assert_close(advantages.std(1), expected, atol=1e-9, rtol=0)


def test_advantages_by_hand_and_flat_groups():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])  # second group: every reward equal
    advantages = group_advantages(rewards, num_generations=4)
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std()  # Bessel-corrected, as TRL
    torch.testing.assert_close(advantages[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + 1e-4))
    assert torch.equal(advantages[4:], torch.zeros(4))
    assert frac_reward_zero_std(rewards, 4) == 0.5
    torch.testing.assert_close(group_advantages(rewards, 4, scale="none"),
                               torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match="multiple of num_generations"):
        group_advantages(rewards[:6], 4)


def test_unscorable_completion_is_left_out_and_gets_zero_advantage():
    rewards = torch.tensor([1.0, float("nan"), 0.0, 1.0])
    advantages = group_advantages(rewards, 4)
    assert advantages[1] == 0
    torch.testing.assert_close(advantages[[0, 2, 3]], group_advantages(torch.tensor([1.0, 0.0, 1.0]), 3))


# ----------------------------------------------------------------------------- KL estimators


def test_kl_estimators_against_the_exact_kl():
    # Expectations under pi computed exactly over a categorical's support, not by sampling.
    pi = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    ref = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    exact = (pi * (pi / ref).log()).sum()
    logp, ref_logp = pi.log(), ref.log()
    torch.testing.assert_close((pi * kl_k1(logp, ref_logp)).sum(), exact)  # unbiased
    torch.testing.assert_close((pi * kl_k3(logp, ref_logp)).sum(), exact)  # unbiased
    assert not torch.isclose((pi * kl_k2(logp, ref_logp)).sum(), exact, rtol=1e-3)  # biased
    assert (kl_k1(logp, ref_logp) < 0).any() and (kl_k3(logp, ref_logp) >= 0).all()


# ----------------------------------------------------------------------------- loss properties


def _batch(seed=0, B=8, T=6, noise=0.3, lengths=None):
    g = torch.Generator().manual_seed(seed)
    logps = -3 * torch.rand(B, T, generator=g, dtype=torch.float64)
    old_logps = logps + noise * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref_logps = logps + noise * torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = lengths or [1 + (i * 5) % T for i in range(B)]
    completion_mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    rewards = torch.randint(0, 3, (B,), generator=g).double()
    rewards[:4] = torch.tensor([0.0, 1.0, 2.0, 1.0])  # at least one informative group
    return dict(logps=logps, old_logps=old_logps, ref_logps=ref_logps, completion_mask=completion_mask,
                advantages=group_advantages(rewards, 4))


@FAST
@given(st.floats(0.05, 0.5), st.floats(0.05, 0.5), st.sampled_from(CLIPPED_LOSS_TYPES), st.integers(0, 10_000))
def test_clipping_changes_nothing_inside_the_trust_region(epsilon, epsilon_high, loss_type, seed):
    b = _batch(seed)
    g = torch.Generator().manual_seed(seed)
    # ratios strictly inside [1 - eps, 1 + eps_high]
    u = torch.rand(b["logps"].shape, generator=g, dtype=torch.float64)
    ratio = (1 - epsilon) + (epsilon + epsilon_high) * (0.01 + 0.98 * u)
    logps = b["logps"].clone().requires_grad_(True)
    old_logps = logps.detach() - ratio.log()
    clipped = grpo_loss(logps, old_logps, b["advantages"], b["completion_mask"], epsilon=epsilon,
                        epsilon_high=epsilon_high, loss_type=loss_type)
    (grad_clipped,) = torch.autograd.grad(clipped.loss, logps)
    unclipped = grpo_loss(logps, old_logps, b["advantages"], b["completion_mask"], epsilon=1e6, loss_type=loss_type)
    (grad_unclipped,) = torch.autograd.grad(unclipped.loss, logps)
    assert clipped.loss.item() == pytest.approx(unclipped.loss.item(), abs=1e-12)
    torch.testing.assert_close(grad_clipped, grad_unclipped, rtol=0, atol=1e-12)
    assert clipped.metrics["clip_ratio/region_mean"] == 0.0


def test_clipping_bites_outside_the_trust_region():
    mask = torch.ones(2, 1)
    logps = torch.zeros(2, 1, requires_grad=True)
    old_logps = -torch.log(torch.tensor([[1.5], [0.5]]))  # ratios 1.5 and 0.5
    out = grpo_loss(logps, old_logps, torch.tensor([1.0, -1.0]), mask, epsilon=0.2, loss_type="bnpo")
    # A > 0 above 1 + eps and A < 0 below 1 - eps: both clipped, so no gradient at all
    (grad,) = torch.autograd.grad(out.loss, logps)
    assert torch.equal(grad, torch.zeros_like(grad))
    assert out.metrics["clip_ratio/high_mean"] == 0.5 and out.metrics["clip_ratio/low_mean"] == 0.5
    assert out.metrics["clip_ratio/region_mean"] == 1.0


@FAST
@given(st.sampled_from(LOSS_TYPES), st.integers(0, 10_000), st.floats(0.0, 2.0))
def test_loss_is_exactly_zero_without_advantage_or_kl(loss_type, seed, noise):
    b = _batch(seed, noise=noise)
    out = grpo_loss(b["logps"], b["old_logps"], torch.zeros(8, dtype=torch.float64), b["completion_mask"],
                    ref_logps=b["ref_logps"], beta=0.0, loss_type=loss_type)
    assert out.loss.item() == 0.0


def test_on_policy_grpo_loss_is_zero_but_its_gradient_is_not():
    b = _batch(3)
    logps = b["logps"].clone().requires_grad_(True)
    out = grpo_loss(logps, None, b["advantages"], b["completion_mask"], loss_type="grpo")
    assert out.loss.item() == pytest.approx(0.0, abs=1e-12)  # mean advantage of each group is 0
    (grad,) = torch.autograd.grad(out.loss, logps)
    assert grad.abs().sum() > 0.1


@pytest.mark.parametrize("importance_sampling_level", IMPORTANCE_SAMPLING_LEVELS)
def test_loss_type_weights_of_a_short_and_a_long_completion(importance_sampling_level):
    mask = torch.tensor([[1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    logps = torch.zeros(2, 8, requires_grad=True)
    weights = {}
    for loss_type in LOSS_TYPES:
        out = grpo_loss(logps, None, torch.tensor([1.0, 1.0]), mask, loss_type=loss_type, max_completion_length=10,
                        epsilon_high=5.0 if loss_type == "cispo" else None,  # CISPO's cap, as ScaleRL recommends
                        importance_sampling_level=importance_sampling_level)
        (grad,) = torch.autograd.grad(out.loss, logps)
        weights[loss_type] = -grad[:, 0]  # weight of one token of each completion
    # On-policy every loss type is a weighted REINFORCE; what differs is the weight of a token.
    torch.testing.assert_close(weights["grpo"], torch.tensor([1 / 4, 1 / 16]))  # 1 / (B |o_i|)
    torch.testing.assert_close(weights["bnpo"], torch.tensor([1 / 10, 1 / 10]))  # 1 / total tokens
    torch.testing.assert_close(weights["dapo"], torch.tensor([1 / 10, 1 / 10]))
    torch.testing.assert_close(weights["dr_grpo"], torch.tensor([1 / 20, 1 / 20]))  # 1 / (B L_max)
    torch.testing.assert_close(weights["luspo"], torch.tensor([1 / 2, 1 / 2]))  # 1 / B: a sum over tokens
    torch.testing.assert_close(weights["sapo"], weights["grpo"])  # the soft gate has slope 1 at ratio 1
    torch.testing.assert_close(weights["cispo"], weights["dapo"])  # weight min(1, eps_max) = 1
    torch.testing.assert_close(weights["vespo"], weights["dapo"])  # phi(1) = 1


def test_sequence_level_ratio_is_one_per_completion_and_clips_whole_completions():
    b = _batch(5, noise=0.5)
    logps = b["logps"].clone().requires_grad_(True)
    mask = b["completion_mask"]
    out = grpo_loss(logps, b["old_logps"], b["advantages"], mask, loss_type="grpo",
                    importance_sampling_level="sequence")
    # GSPO's ratio: the geometric mean of the token ratios of a completion, (B, 1)
    log_ratio = ((logps - b["old_logps"]) * mask).sum(-1) / mask.sum(-1)  # (B,)
    torch.testing.assert_close(out.ratio, log_ratio.detach().exp()[:, None])
    (grad,) = torch.autograd.grad(out.loss, logps)
    A = b["advantages"]
    inside = (out.ratio[:, 0] > 0.8) & (out.ratio[:, 0] < 1.2)
    clipped = ((out.ratio[:, 0] >= 1.2) & (A > 0)) | ((out.ratio[:, 0] <= 0.8) & (A < 0))
    assert inside.any() and clipped.any()  # the batch has both kinds
    assert torch.equal(grad[clipped], torch.zeros_like(grad[clipped]))  # a whole completion drops out
    # Inside the trust region every token of completion i gets -A_i s_i / (B |o_i|): one weight per completion.
    expected = -(A * out.ratio[:, 0] / mask.sum(-1) / len(A))[:, None] * mask  # (B, T)
    torch.testing.assert_close(grad[inside], expected[inside])
    assert out.metrics["clip_ratio/region_mean"] == pytest.approx(clipped.double().mean().item())


@pytest.mark.parametrize("loss_type", CLIPPED_LOSS_TYPES)
def test_sequence_level_gradient_equals_token_level_on_policy(loss_type):
    # With num_iterations = 1 both ratios are 1 and the surrogates have the same gradient; they part off-policy.
    b = _batch(6)
    grads = {}
    for level in IMPORTANCE_SAMPLING_LEVELS:
        logps = b["logps"].clone().requires_grad_(True)
        loss = grpo_loss(logps, None, b["advantages"], b["completion_mask"], loss_type=loss_type,
                         importance_sampling_level=level).loss
        (grads[level],) = torch.autograd.grad(loss, logps)
    if loss_type == "luspo":  # its sum over tokens multiplies the sequence term by |o_i|
        grads["token"] = grads["token"] / b["completion_mask"].sum(-1, keepdim=True)
        grads["sequence"] = grads["sequence"] / b["completion_mask"].sum(-1, keepdim=True)
    torch.testing.assert_close(grads["sequence"], grads["token"])


def test_bias_corrected_k3_gradient_is_the_reverse_kl_gradient():
    # Exact expectations over a categorical's support; the sampling distribution is detached, as sampling is.
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(12, generator=g, dtype=torch.float64, requires_grad=True)
    ref_logps = torch.log_softmax(torch.randn(12, generator=g, dtype=torch.float64), -1)  # (V,)
    logps = torch.log_softmax(logits, -1)  # (V,)
    pi = logps.exp().detach()  # tokens are sampled from pi_old = pi_theta

    def grad(value):
        return torch.autograd.grad(value, logits, retain_graph=True)[0]

    reverse_kl = grad((logps.exp() * (logps - ref_logps)).sum())  # of KL(pi || ref), what the penalty means
    forward_kl = grad((ref_logps.exp() * (ref_logps - logps)).sum())  # of KL(ref || pi)
    ratio = torch.exp(logps - logps.detach())  # 1, with the gradient of log pi
    k3 = kl_k3(logps, ref_logps)
    torch.testing.assert_close(grad((pi * ratio * k3).sum()), reverse_kl)
    torch.testing.assert_close(grad((pi * kl_k2(logps, ref_logps)).sum()), reverse_kl)
    torch.testing.assert_close(grad((pi * k3).sum()), forward_kl)  # biased, on-policy too
    assert (forward_kl - reverse_kl).abs().max() > 0.01
    # grpo_loss's KL term (zero advantages, so the surrogate adds nothing) with and without the correction
    for use_bias_correction_kl, expected in ((True, reverse_kl), (False, forward_kl)):
        out = grpo_loss(logps[None], None, torch.zeros(1, dtype=torch.float64), torch.ones(1, 12), beta=1.0,
                        ref_logps=ref_logps[None], use_bias_correction_kl=use_bias_correction_kl)
        torch.testing.assert_close(grad((pi * out.per_token_loss[0]).sum()), expected)


def test_bad_arguments_are_refused():
    b = _batch()
    with pytest.raises(ValueError, match="loss_type"):
        grpo_loss(b["logps"], None, b["advantages"], b["completion_mask"], loss_type="ppo")
    with pytest.raises(ValueError, match="ref_logps"):
        grpo_loss(b["logps"], None, b["advantages"], b["completion_mask"], beta=0.04)
    with pytest.raises(ValueError, match="importance_sampling_level"):
        grpo_loss(b["logps"], None, b["advantages"], b["completion_mask"], importance_sampling_level="sequence_token")


# ----------------------------------------------------------------------------- against TRL's GRPOTrainer


def _trl_trainer(tmp_path_factory, tiny_model_path, **config):
    """A real GRPOTrainer on the tiny model; its loss code is what the tests compare against."""
    from datasets import Dataset

    from labkit.device import detect_device
    from labkit.training import grpo_config
    from trl import GRPOTrainer

    def constant_reward(completions, **kwargs):
        return [0.0] * len(completions)

    args = grpo_config(tmp_path_factory.mktemp("grpo"), device=detect_device("cpu"), num_generations=4,
                       per_device_train_batch_size=8, max_completion_length=16, **config)
    trainer = GRPOTrainer(model=str(tiny_model_path), reward_funcs=constant_reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["hello"] * 8}))
    trainer.model.train()
    # Set by Trainer's training loop before each step; the loss divides by it.
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    return trainer


def _trl_loss(trainer, batch, logps, num_items_in_batch=None, importance_sampling_ratio=None):
    """Return TRL's loss on ``batch`` with ``logps`` as the policy's log-probs, and its logged metrics."""
    B, T = logps.shape
    entropies = torch.rand(B, T, dtype=logps.dtype)  # logged only
    # The model forward is replaced, so that TRL's own loss code runs on log-probs we choose.
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logps, entropies, None)
    mask = batch["completion_mask"]
    inputs = {
        "prompt_ids": torch.ones(B, 3, dtype=torch.long), "prompt_mask": torch.ones(B, 3, dtype=torch.long),
        "completion_ids": torch.ones(B, T, dtype=torch.long), "completion_mask": mask,
        "advantages": batch["advantages"], "old_per_token_logps": batch["old_logps"],
        "ref_per_token_logps": batch["ref_logps"],
        "num_items_in_batch": torch.as_tensor(num_items_in_batch if num_items_in_batch is not None else mask.sum()),
    }
    if importance_sampling_ratio is not None:
        inputs["importance_sampling_ratio"] = importance_sampling_ratio
    trainer._metrics["train"].clear()
    loss = trainer.compute_loss(trainer.model, inputs)
    return loss, {name: values[-1] for name, values in trainer._metrics["train"].items()}


def _float_batch(seed=0, noise=0.4):
    return {k: (v.float() if v.is_floating_point() else v) for k, v in _batch(seed, T=7, noise=noise).items()}


# What TRL logs for each loss type besides kl and entropy (a soft or capped weight has no clip region).
TRL_METRICS_OF = {**{t: TRL_METRICS for t in CLIPPED_LOSS_TYPES}, "cispo": ("cispo_clip_ratio",), "sapo": (),
                  "vespo": ("vespo/phi_seq_mean",)}


@pytest.mark.parametrize("importance_sampling_level", IMPORTANCE_SAMPLING_LEVELS)
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_and_gradient_equal_trl(tmp_path_factory, tiny_model_path, loss_type, beta, importance_sampling_level):
    # TRL allows every loss type at both levels (it only warns about some pairs); so must labkit.
    epsilon_high = 1.3 if loss_type == "cispo" else 0.28  # CISPO's cap on the ratio: low enough to bite here
    config = dict(loss_type=loss_type, beta=beta, epsilon_high=epsilon_high,
                  importance_sampling_level=importance_sampling_level)
    trainer = _trl_trainer(tmp_path_factory, tiny_model_path, **config)
    # A sequence ratio averages its tokens' log-ratios: further off-policy, so that some completions are clipped.
    batch = _float_batch(seed=1) if importance_sampling_level == "token" else _float_batch(seed=2, noise=1.0)
    logps_trl = batch["logps"].clone().requires_grad_(True)
    trl_loss, trl_metrics = _trl_loss(trainer, batch, logps_trl)
    trl_loss.backward()
    logps = batch["logps"].clone().requires_grad_(True)
    ours = grpo_loss(logps, batch["old_logps"], batch["advantages"], batch["completion_mask"],
                     ref_logps=batch["ref_logps"] if beta else None, epsilon=trainer.args.epsilon,
                     max_completion_length=trainer.max_completion_length, **config)
    ours.loss.backward()
    torch.testing.assert_close(ours.loss, trl_loss, rtol=0, atol=1e-5)
    torch.testing.assert_close(logps.grad, logps_trl.grad, rtol=0, atol=1e-6)
    assert logps.grad.abs().sum() > 0
    if loss_type in CLIPPED_LOSS_TYPES:
        assert ours.metrics["clip_ratio/region_mean"] > 0  # the batch exercises clipping
    if loss_type == "cispo":
        assert 0 < ours.metrics["cispo_clip_ratio"] < 1  # and the cap
    for name in TRL_METRICS_OF[loss_type] + (("kl",) if beta else ()):
        assert ours.metrics[name] == pytest.approx(trl_metrics[name], abs=1e-6), name


def test_dapo_normalises_by_the_whole_accumulated_batch_like_trl(tmp_path_factory, tiny_model_path):
    # Two accumulation steps share one generation batch: TRL divides each micro-batch's token sum by the
    # token count of both; grpo_loss does the same when given num_items_in_batch.
    trainer = _trl_trainer(tmp_path_factory, tiny_model_path, loss_type="dapo", gradient_accumulation_steps=2)
    assert trainer.args.steps_per_generation == 2
    first, second = _float_batch(seed=3), _float_batch(seed=4)
    total = int(first["completion_mask"].sum() + second["completion_mask"].sum())
    for batch in (first, second):
        trl_loss, _ = _trl_loss(trainer, batch, batch["logps"], num_items_in_batch=total)
        ours = grpo_loss(batch["logps"], batch["old_logps"], batch["advantages"], batch["completion_mask"],
                         num_items_in_batch=total)
        torch.testing.assert_close(ours.loss, trl_loss, rtol=0, atol=1e-5)


@pytest.mark.parametrize("loss_type", ["bnpo", "vespo"])  # vespo folds the vLLM ratio into its weights
def test_vllm_importance_sampling_correction_like_trl(tmp_path_factory, tiny_model_path, loss_type):
    trainer = _trl_trainer(tmp_path_factory, tiny_model_path, loss_type=loss_type, beta=0.04)
    # What GRPOTrainer sets when it generates with vLLM (vLLM itself is not needed for the loss).
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    batch = _float_batch(seed=5)
    is_ratio = torch.rand(batch["logps"].shape) + 0.5
    trl_loss, _ = _trl_loss(trainer, batch, batch["logps"], importance_sampling_ratio=is_ratio)
    ours = grpo_loss(batch["logps"], batch["old_logps"], batch["advantages"], batch["completion_mask"],
                     ref_logps=batch["ref_logps"], beta=0.04, loss_type=loss_type, importance_sampling_ratio=is_ratio)
    torch.testing.assert_close(ours.loss, trl_loss, rtol=0, atol=1e-5)


def test_advantages_equal_trl(tmp_path_factory, tiny_model_path):
    """TRL generates, scores with our rewards, and computes advantages; group_advantages must agree."""
    from datasets import Dataset

    from labkit.device import detect_device
    from labkit.training import grpo_config
    from trl import GRPOTrainer

    rewards = [1.0, 0.0, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0]  # the second group is flat

    def preset_reward(completions, **kwargs):
        return rewards

    args = grpo_config(tmp_path_factory.mktemp("grpo"), device=detect_device("cpu"), num_generations=4,
                       per_device_train_batch_size=8, max_completion_length=4)
    trainer = GRPOTrainer(model=str(tiny_model_path), reward_funcs=preset_reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}))
    trainer.model.train()
    rows = [{"prompt": p} for p in ("a", "b") for _ in range(4)]  # as TRL's sampler repeats each prompt
    out = trainer._generate_and_score_completions(rows)
    torch.testing.assert_close(out["advantages"], group_advantages(torch.tensor(rewards), 4))
    assert trainer._metrics["train"]["frac_reward_zero_std"][-1] == frac_reward_zero_std(rewards, 4)


# ----------------------------------------------------------------------------- log-probabilities


def test_chunked_token_logps_match_unchunked_values_and_gradients():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 5, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (3, 5), generator=g)
    upstream = torch.randn(3, 5, generator=g, dtype=torch.float64)
    full = token_logps_from_hidden(hidden, weight, targets, temperature=0.7)
    full_grads = torch.autograd.grad((full * upstream).sum(), (hidden, weight))
    reference = torch.log_softmax(hidden @ weight.T / 0.7, -1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(full, reference.float())
    for chunk_size in (1, 4, 15, 64):  # 4 does not divide the 15 positions
        chunked = token_logps_from_hidden(hidden, weight, targets, temperature=0.7, chunk_size=chunk_size)
        grads = torch.autograd.grad((chunked * upstream).sum(), (hidden, weight))
        torch.testing.assert_close(chunked, full, rtol=0, atol=1e-5)
        for a, b in zip(grads, full_grads):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_chunked_logps_never_keep_the_full_logits():
    # The largest tensor autograd saves for backward must be a chunk's, not the (N, V) logits.
    hidden = torch.randn(64, 8, requires_grad=True)
    weight = torch.randn(1000, 8, requires_grad=True)
    targets = torch.randint(0, 1000, (64,))

    def largest_saved(chunk_size):
        sizes = [0]

        def pack(t):
            sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = token_logps_from_hidden(hidden, weight, targets, chunk_size=chunk_size)
        out.sum().backward()
        return max(sizes)

    assert largest_saved(None) >= 64 * 1000
    assert largest_saved(16) < 16 * 1000


@pytest.fixture(scope="module", params=["full", "lora"])
def tiny_policy(request, tiny_model_path):
    from labkit.models import load_policy

    model, tokenizer = load_policy(tiny_model_path, request.param)
    return model.eval()  # no LoRA dropout: two forward passes must see the same network


def _tiny_inputs(model):
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, model.config.vocab_size, (4, 12), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :3] = 0  # a left-padded prompt
    return input_ids, attention_mask


def test_per_token_logps_chunked_equals_unchunked_on_a_model(tiny_policy):
    model = tiny_policy
    input_ids, attention_mask = _tiny_inputs(model)
    params = [p for p in model.parameters() if p.requires_grad]  # only the adapters with LoRA
    results = {}
    for chunk_size in (None, 5):
        logps = per_token_logps(model, input_ids, attention_mask, logits_to_keep=6, temperature=0.9,
                                chunk_size=chunk_size)
        assert logps.shape == (4, 6) and (logps <= 0).all()
        results[chunk_size] = (logps.detach(), torch.autograd.grad(logps.sum(), params))
    torch.testing.assert_close(results[5][0], results[None][0], rtol=0, atol=1e-5)
    for a, b in zip(results[5][1], results[None][1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_per_token_logps_equal_trl(tmp_path_factory, tiny_model_path):
    trainer = _trl_trainer(tmp_path_factory, tiny_model_path, temperature=0.9)
    model = trainer.model
    input_ids, attention_mask = _tiny_inputs(model)
    with torch.no_grad():
        trl_logps, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, 6)
        for chunk_size in (None, 5):
            ours = per_token_logps(model, input_ids, attention_mask, 6, temperature=0.9, chunk_size=chunk_size)
            torch.testing.assert_close(ours, trl_logps, rtol=0, atol=1e-5)
    assert not math.isclose(trainer.temperature, 1.0)


def test_token_entropy_by_hand_and_equal_to_trl():
    from trl.trainer.utils import entropy_from_logits

    vocab = 50
    assert token_entropy(torch.zeros(3, vocab)).allclose(torch.full((3,), math.log(vocab)))  # uniform: log V
    certain = torch.full((vocab,), -1e4)
    certain[7] = 0.0
    assert token_entropy(certain).item() == pytest.approx(0.0, abs=1e-6)
    logits = torch.randn(2, 5, vocab, generator=torch.Generator().manual_seed(0)) * 3
    assert token_entropy(logits).shape == (2, 5)
    assert torch.allclose(token_entropy(logits), entropy_from_logits(logits), atol=1e-5)
