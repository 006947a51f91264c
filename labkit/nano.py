"""A transparent GRPO loop, and the lab's main job: a tiny model learns addition on a CPU in minutes.

Introduced in ``03_nano_grpo_cpu.ipynb``. :func:`nano_grpo` is GRPO in about a hundred
readable lines, built on :mod:`labkit.objective` (advantages, clipped loss, log-probs) and
scored by :mod:`labkit.rewards`; every step of the algorithm is a line you can print:

1. draw ``num_prompts`` problems and sample ``G = num_generations`` completions of each;
2. score every completion with the reward functions (TRL's calling convention);
3. turn rewards into group-relative advantages, ``(r - mean_group) / (std_group + 1e-4)``;
4. score the sampled tokens under the policy (with gradient) and the frozen reference (if
   ``beta > 0``), then take the clipped surrogate loss and one optimiser step (``num_iterations``
   steps on the same batch, as TRL's option of that name: then the ratio leaves 1 and clipping bites).

The task (:class:`labkit.tasks.AdditionTask`) is two-digit addition with a carry, and the policy starts
warmed up (:mod:`labkit.warmup`) on a sloppy teacher who often forgets the carry. GRPO's reward is for
right answers (and the format, which the warm-up already taught), so within each group the completions
that carry win, and the model learns to carry. :func:`trl_trainer` trains the same task with TRL's ``GRPOTrainer``.

The main job, ``python -m labkit demo`` (:mod:`labkit.demo`), runs it all on the CPU, evaluates
held-out accuracy before and after GRPO and writes ``summary.json`` and plots. :func:`run_nano_grpo`
trains the task with full fine-tuning or LoRA and returns the learning curve, for comparisons.

Accuracy is measured on held-out problems (a fixed fifth of all problems, never trained on) as
pass@1: the share of right answers among ``eval_samples`` completions per problem, sampled at
the training temperature, i.e. the expected reward of the policy GRPO optimises. Greedy
accuracy is reported next to it.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field

import torch

from labkit.objective import frac_reward_zero_std, group_advantages, grpo_loss, per_token_logps, token_entropy
from labkit.rewards import accuracy_reward, format_reward, score_completions, weighted_sum
from labkit.tasks import AdditionTask, carries
from labkit.warmup import warm_up_path, warmed_up_policy

__all__ = [
    "NanoConfig",
    "NanoResult",
    "Rollout",
    "REWARD_FUNCS",
    "REWARD_WEIGHTS",
    "sample_completions",
    "completion_mask",
    "calculate_rewards",
    "rollout_logps",
    "rollout_loss",
    "nano_grpo",
    "evaluate_held_out",
    "run_nano_grpo",
    "trl_trainer",
    "plot_run",
]

# Rewards, with TRL's reward_weights: a right answer is worth 1, the format 0.5 (the lab's
# GSM8K weights, labkit.rewards.gsm8k_rewards, without the tag-count shaping the format no
# longer needs after the warm-up).
REWARD_FUNCS = (accuracy_reward, format_reward)
REWARD_WEIGHTS = (1.0, 0.5)


@dataclass
class NanoConfig:
    """Every knob of a nano run: the tiny model, the warm-up, GRPO (TRL's names) and the evaluation.

    The defaults are the main job's: about two minutes on two CPU cores.
    """

    seed: int = 0
    # the tiny model (labkit.models.build_tiny_model overrides)
    arch: str = "qwen2"
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    # the task and the supervised warm-up
    forget_carry: float = 0.6  # share of the teacher's worked examples that forget the carry
    sft_steps: int = 600
    sft_batch_size: int = 64
    sft_learning_rate: float = 3e-3
    # GRPO
    max_steps: int = 40
    num_prompts: int = 16  # prompts per step; the batch holds num_prompts * num_generations completions
    num_generations: int = 8
    learning_rate: float = 3e-4
    beta: float = 0.0  # KL coefficient (TRL's default 0: no reference model)
    epsilon: float = 0.2
    loss_type: str = "dapo"  # TRL's default
    temperature: float = 1.0
    max_completion_length: int = 24
    max_grad_norm: float = 1.0
    num_iterations: int = 1  # optimiser steps per sampled batch (TRL's name); > 1: the ratio leaves 1, clipping bites
    method: str = "full"  # or "lora": the warmed-up weights frozen, LoRA adapters train
    lora_rank: int = 8
    # evaluation on held-out problems
    eval_problems: int = 200
    eval_samples: int = 4
    eval_every: int = 10  # GRPO steps between evaluations (0: only before and after)
    device: str = "cpu"  # "cuda" runs the same on a GPU (in fp32: the model is tiny)

    def task(self) -> AdditionTask:
        return AdditionTask(forget_carry=self.forget_carry)

    def model_shape(self) -> dict:
        return dict(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                    num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
                    num_key_value_heads=self.num_key_value_heads)


@dataclass
class NanoResult:
    """What :func:`run_nano_grpo` returns: the curves, held-out accuracy before and after, and timings."""

    config: dict
    before: dict  # evaluate_held_out() before GRPO (after the warm-up)
    after: dict  # evaluate_held_out() after GRPO
    history: list[dict]  # one dict of metrics per GRPO step
    evals: list[dict]  # held-out evaluations during GRPO: {"step": ..., **evaluate_held_out()}
    warm_up_losses: list[float]
    seconds: dict  # "warm_up", "grpo", "eval", "total"
    parameters: dict  # {"total": n, "trainable": n} during GRPO

    @property
    def accuracy_before(self) -> float:
        return self.before["accuracy"]

    @property
    def accuracy_after(self) -> float:
        return self.after["accuracy"]

    @property
    def seconds_per_step(self) -> float:
        return self.seconds["grpo"] / max(1, len(self.history))

    def curve(self, name: str = "reward") -> list[float]:
        """Return one metric per GRPO step (``"reward"``, ``"rewards/accuracy_reward/mean"``, ``"loss"``...)."""
        return [h[name] for h in self.history]

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(accuracy_before=self.accuracy_before, accuracy_after=self.accuracy_after,
                   seconds_per_step=self.seconds_per_step)
        return out


# ----------------------------------------------------------------------------- one GRPO step, piece by piece


@dataclass
class Rollout:
    """A batch of sampled completions, laid out as TRL lays them out (the G of a prompt side by side)."""

    prompt_ids: torch.Tensor  # (B, P) left-padded prompts, each repeated G times
    prompt_mask: torch.Tensor  # (B, P)
    completion_ids: torch.Tensor  # (B, T) right-padded completions
    completion_mask: torch.Tensor  # (B, T) 1 up to and including the first EOS
    completions: list[str] = field(default_factory=list)  # B decoded texts
    entropy: float | None = None  # mean entropy (nats) of the sampling distribution over completion tokens


@torch.no_grad()
def sample_completions(model, tokenizer, prompts: list[list[dict]], num_generations: int, *,
                       temperature: float = 1.0, max_completion_length: int = 24, greedy: bool = False,
                       entropy: bool = False) -> Rollout:
    """Return a :class:`Rollout`: ``num_generations`` completions of each conversational prompt.

    Plain sampling at ``temperature`` (no top-k, no top-p: TRL's defaults), or greedy. ``B``
    is ``len(prompts) * num_generations``. The completion mask keeps the tokens up to and
    including the first EOS, as TRL's does. ``entropy=True`` also records the mean entropy of
    the distributions the tokens were sampled from (TRL's ``entropy`` metric), from the logits
    ``generate`` already computed: no extra forward pass.
    """
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    encoded = tokenizer(texts, return_tensors="pt", padding=True).to(model.device)  # left padding
    was_training = model.training
    model.eval()
    options = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    out = model.generate(**encoded, max_new_tokens=max_completion_length, num_return_sequences=num_generations,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         return_dict_in_generate=True, output_logits=entropy, **options)
    sequences = out.sequences  # (B, P + T)
    model.train(was_training)
    prompt_length = encoded["input_ids"].size(1)
    completion_ids = sequences[:, prompt_length:]  # (B, T)
    mask = completion_mask(completion_ids, tokenizer.eos_token_id)  # (B, T)
    mean_entropy = None
    if entropy:
        logits = torch.stack(out.logits, 1) / temperature  # (B, T, V) the distributions sampled from
        per_token = token_entropy(logits)  # (B, T)
        mean_entropy = ((per_token * mask).sum() / mask.sum().clamp(min=1)).item()
    return Rollout(
        prompt_ids=encoded["input_ids"].repeat_interleave(num_generations, 0),  # (B, P)
        prompt_mask=encoded["attention_mask"].repeat_interleave(num_generations, 0),  # (B, P)
        completion_ids=completion_ids,
        completion_mask=mask,
        completions=tokenizer.batch_decode(completion_ids, skip_special_tokens=True),
        entropy=mean_entropy,
    )


def completion_mask(completion_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """Return the ``(B, T)`` mask of the tokens a completion owns: 1 up to and including its first EOS, then 0.

    A completion without EOS (cut at ``max_completion_length``) keeps every token. As TRL 1.16's
    ``GRPOTrainer._generate_and_score_completions`` (``is_eos``, ``eos_idx``, ``sequence_indices``).
    """
    is_eos = completion_ids == eos_token_id  # (B, T)
    first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), completion_ids.size(1))  # (B,)
    positions = torch.arange(completion_ids.size(1), device=completion_ids.device).unsqueeze(0)  # (1, T)
    return (positions <= first_eos.unsqueeze(1)).long()  # (B, T)


def calculate_rewards(completions: list, answers: list[str], reward_funcs=REWARD_FUNCS, weights=REWARD_WEIGHTS):
    """Return ``(rewards, per_function)``: the weighted total per completion ``(B,)`` and each function's list.

    The reward functions are called as TRL calls them (``completions=..., answer=...``) and
    summed with ``weights`` as TRL's ``reward_weights`` sums them.
    """
    per_function = score_completions(list(reward_funcs), completions, answer=answers)
    total = weighted_sum(list(per_function.values()), weights)  # None where no function applied: 0, as TRL's nansum
    rewards = torch.tensor([0.0 if r is None else r for r in total])  # (B,)
    return rewards, per_function


def rollout_logps(model, rollout: Rollout, temperature: float = 1.0) -> torch.Tensor:
    """Return the log-probability of every sampled token of ``rollout`` under ``model``, ``(B, T)``."""
    input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)  # (B, P + T)
    attention_mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], 1)  # (B, P + T)
    return per_token_logps(model, input_ids, attention_mask, rollout.completion_ids.size(1), temperature)  # (B, T)


def rollout_loss(model, rollout: Rollout, advantages: torch.Tensor, *, ref_model=None, beta: float = 0.0,
                 epsilon: float = 0.2, loss_type: str = "dapo", temperature: float = 1.0,
                 old_logps: torch.Tensor | None = None):
    """Return :func:`labkit.objective.grpo_loss` of a rollout: log-probs under ``model`` (and ``ref_model``).

    ``old_logps=None``: on-policy, one optimiser step per batch (TRL's ``num_iterations=1``): the
    old log-probs are the current ones, detached, so the ratio is exactly 1 and clipping never
    bites; the gradient is that of ``-A * log pi`` per token. Pass the log-probs of the policy
    that sampled (:func:`rollout_logps` before the first step, ``(B, T)``) to reuse a batch.
    """
    logps = rollout_logps(model, rollout, temperature)  # (B, T)
    ref_logps = None
    if ref_model is not None:
        with torch.no_grad():
            ref_logps = rollout_logps(ref_model, rollout, temperature)  # (B, T)
    return grpo_loss(logps, old_logps, advantages, rollout.completion_mask, ref_logps=ref_logps, beta=beta,
                     epsilon=epsilon, loss_type=loss_type)


def _mean_metrics(passes: list[dict]) -> dict:
    # One row per sampled batch: the mean over its optimiser steps (the extremes for *_min and *_max).
    reduce = {"min": min, "max": max}
    return {key: reduce.get(key[-3:], lambda v: sum(v) / len(v))([p[key] for p in passes]) for key in passes[0]}


# ----------------------------------------------------------------------------- the loop


def nano_grpo(model, tokenizer, task: AdditionTask, config: NanoConfig, *, callback=None, evaluate_every=None,
              reward_funcs=REWARD_FUNCS, reward_weights=REWARD_WEIGHTS,
              progress: bool = True) -> tuple[list[dict], list[dict]]:
    """Return ``(history, evals)``: GRPO on ``task``, one dict of metrics per step and the held-out evaluations.

    Each step: ``num_prompts`` training problems, ``num_generations`` samples of each, rewards
    from ``reward_funcs`` (default :data:`REWARD_FUNCS`, summed with ``reward_weights``), group
    advantages, the clipped loss (plus ``beta`` times the k3 KL to a frozen copy of the
    starting policy) and one AdamW step, gradients clipped at ``max_grad_norm`` as TRL does.
    With ``num_iterations > 1`` the batch is reused for that many AdamW steps against the
    log-probs it was sampled with (TRL's ``num_iterations``); the loss metrics are then the
    mean over those steps (the first is on-policy: ratio 1, nothing clipped). ``callback(step, metrics)``
    is called after every step (a :class:`labkit.dashboard.LiveDashboard`'s ``log`` fits);
    ``evaluate_every(step)`` returns a held-out evaluation to record, or ``None``.
    The metric names are TRL's, so a nano run and a TRL run plot the same way.
    """
    from labkit.dashboard import progress_bar  # text, not a widget: it survives saving the notebook

    if config.num_iterations < 1:
        raise ValueError(f"num_iterations is the number of optimiser steps per sampled batch: at least 1, "
                         f"not {config.num_iterations}")
    G = config.num_generations
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=0.0)
    # The reference: the policy as it starts, frozen. Only needed for the KL term (beta > 0).
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if config.beta > 0 else None
    history, evals = [], []
    bar = progress_bar(range(config.max_steps), desc="GRPO", enabled=progress)
    for step in bar:
        started = time.perf_counter()
        # 1. A batch of training problems, each to be answered G times.
        pairs = task.problems(config.num_prompts, seed=config.seed * 100_003 + step, split="train")
        prompts = [task.prompt(a, b) for a, b in pairs]
        answers = [task.answer(a, b) for a, b in pairs for _ in range(G)]  # (B,) one per completion
        # 2. Sample with the current policy (no gradient).
        rollout = sample_completions(model, tokenizer, prompts, G, temperature=config.temperature,
                                     max_completion_length=config.max_completion_length, entropy=True)
        # 3. Score every completion; 4. compare it with its group.
        rewards, per_function = calculate_rewards(rollout.completions, answers, reward_funcs, reward_weights)  # (B,)
        advantages = group_advantages(rewards, G).to(model.device)  # (B,) zero mean within each group
        # 5. The clipped surrogate loss (+ beta * KL), then one step of the optimiser (num_iterations
        # steps on this batch, each measured against the policy that sampled it: the ratio's denominator).
        model.train()
        old_logps = None
        if config.num_iterations > 1:
            with torch.no_grad():
                old_logps = rollout_logps(model, rollout, config.temperature)  # (B, T)
        passes = []
        for _ in range(config.num_iterations):
            out = rollout_loss(model, rollout, advantages, ref_model=ref_model, beta=config.beta, old_logps=old_logps,
                               epsilon=config.epsilon, loss_type=config.loss_type, temperature=config.temperature)
            optimizer.zero_grad()
            out.loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(trainable, config.max_grad_norm)
            optimizer.step()
            passes.append({"loss": out.loss.item(), "grad_norm": grad_norm.item(), **out.metrics})

        lengths = rollout.completion_mask.sum(1).float()  # (B,)
        metrics = {
            "reward": rewards.mean().item(),
            "reward_std": rewards.std().item(),
            "frac_reward_zero_std": frac_reward_zero_std(rewards, G),
            **{f"rewards/{name}/mean": sum(r for r in rs if r is not None) / len(rs)
               for name, rs in per_function.items()},
            "completions/mean_length": lengths.mean().item(),
            "entropy": rollout.entropy,
            "carry_rate": sum(map(carries, rollout.completions)) / len(rollout.completions),
            **_mean_metrics(passes),
            "step_time": time.perf_counter() - started,
        }
        history.append(metrics)
        if callback is not None:
            callback(step + 1, metrics)
        if evaluate_every is not None:
            record = evaluate_every(step + 1)
            if record is not None:
                evals.append({"step": step + 1, **record})
        bar.set_postfix(reward=f"{metrics['reward']:.2f}")
    return history, evals


# ----------------------------------------------------------------------------- evaluation


def evaluate_held_out(model, tokenizer, task: AdditionTask, problems: list[tuple[int, int]], *, samples: int = 4,
             temperature: float = 1.0, max_completion_length: int = 24, seed: int = 0, greedy: bool = True) -> dict:
    """Return held-out scores: ``accuracy`` (pass@1 over ``samples`` sampled answers), ``greedy_accuracy``, ...

    - ``accuracy``: share of right answers among ``samples`` completions per problem, sampled at
      ``temperature`` (the chance that the policy, as it samples in training, answers right);
    - ``greedy_accuracy``: the same with the single most likely answer (``greedy=False`` skips it);
    - ``format``: share of sampled completions in the exact format; ``carry_rate``: share that carry;
    - per problem, for paired tests and pass@k (:mod:`labkit.evaluate`): ``right_per_problem``, how many
      of its ``samples`` answers are right, and ``greedy_right``, whether its greedy answer is.

    Sampling uses its own random generator seeded with ``seed``, so evaluating does not
    change the training's random stream and two evaluations of one model agree.
    """
    prompts = [task.prompt(a, b) for a, b in problems]
    answers = [task.answer(a, b) for a, b in problems]
    with torch.random.fork_rng(devices=[model.device] if model.device.type == "cuda" else []):
        torch.manual_seed(seed)
        rollout = sample_completions(model, tokenizer, prompts, samples, temperature=temperature,
                                     max_completion_length=max_completion_length)
    repeated = [a for a in answers for _ in range(samples)]
    correct = accuracy_reward(rollout.completions, answer=repeated)
    out = {
        "accuracy": sum(correct) / len(correct),
        "format": sum(format_reward(rollout.completions)) / len(correct),
        "carry_rate": sum(map(carries, rollout.completions)) / len(correct),
        "right_per_problem": [int(sum(correct[i * samples:(i + 1) * samples])) for i in range(len(problems))],
    }
    if greedy:
        rollout = sample_completions(model, tokenizer, prompts, 1, greedy=True,
                                     max_completion_length=max_completion_length)
        out["greedy_right"] = [r == 1.0 for r in accuracy_reward(rollout.completions, answer=answers)]
        out["greedy_accuracy"] = sum(out["greedy_right"]) / len(answers)
    out.update(problems=len(problems), samples=samples, temperature=temperature)
    return out


# ----------------------------------------------------------------------------- a whole run


def run_nano_grpo(config: NanoConfig | dict | None = None, *, reuse_warm_up: bool = True, callback=None,
                  reward_funcs=REWARD_FUNCS, reward_weights=REWARD_WEIGHTS, progress: bool = True) -> NanoResult:
    """Return a :class:`NanoResult`: warm up (or reuse the cached warm-up), evaluate, GRPO, evaluate.

    ``config`` is a :class:`NanoConfig` or a dict of its fields, e.g.
    ``run_nano_grpo({"method": "lora", "lora_rank": 8, "learning_rate": 2e-3, "seed": 1})``.
    ``method="lora"`` freezes the warmed-up weights and trains LoRA adapters of ``lora_rank``
    on every attention and MLP projection. The result holds the per-step curves
    (``result.curve("reward")``), held-out accuracy before and after GRPO
    (``result.accuracy_before``, ``result.accuracy_after``), the seconds per GRPO step and the
    trainable parameter count (``result.parameters``). ``reward_funcs`` and ``reward_weights``
    replace the training reward (held-out accuracy is always the strict ``accuracy_reward``).
    """
    from labkit.lab import seed_everything
    from labkit.models import count_parameters, lora_config

    if config is None:
        config = NanoConfig()
    elif isinstance(config, dict):
        config = NanoConfig(**config)
    if config.method not in ("full", "lora"):
        raise ValueError(f"method must be 'full' or 'lora', not {config.method!r}")

    started = time.perf_counter()
    model, tokenizer, losses = warmed_up_policy(config, reuse=reuse_warm_up, progress=progress)
    warm_up_seconds = time.perf_counter() - started
    seed_everything(config.seed)
    if config.method == "lora":
        from peft import get_peft_model

        # No dropout: sampling runs in eval mode and scoring in train mode, and dropout would
        # make the two disagree about the very probabilities GRPO compares.
        model = get_peft_model(model, lora_config(config.lora_rank, dropout=0.0))
    task = config.task()
    test = task.problems(config.eval_problems, seed=0, split="test")
    eval_seconds = [0.0]

    def held_out(step=None):
        if step is not None and (not config.eval_every or step % config.eval_every or step == config.max_steps):
            return None
        t = time.perf_counter()
        record = evaluate_held_out(model, tokenizer, task, test, samples=config.eval_samples, seed=config.seed,
                                   temperature=config.temperature, max_completion_length=config.max_completion_length)
        eval_seconds[0] += time.perf_counter() - t
        return record

    before = held_out()
    eval_before = eval_seconds[0]
    grpo_started = time.perf_counter()
    history, evals = nano_grpo(model, tokenizer, task, config, callback=callback, evaluate_every=held_out,
                               reward_funcs=reward_funcs, reward_weights=reward_weights, progress=progress)
    grpo_seconds = time.perf_counter() - grpo_started - (eval_seconds[0] - eval_before)  # without evaluations
    after = held_out()
    evals.append({"step": config.max_steps, **after})
    total = time.perf_counter() - started
    return NanoResult(
        config=dataclasses.asdict(config), before=before, after=after, history=history,
        evals=[{"step": 0, **before}] + evals, warm_up_losses=losses,
        seconds={"warm_up": warm_up_seconds, "grpo": grpo_seconds, "eval": eval_seconds[0], "total": total},
        parameters=count_parameters(model),
    )


# ----------------------------------------------------------------------------- the production path


def trl_trainer(config: NanoConfig, output_dir: str | os.PathLike, *, model=None, callbacks=None,
                train_size: int = 2048, **overrides):
    """Return a TRL ``GRPOTrainer`` set up to train the nano task as :func:`nano_grpo` does.

    The same warmed-up model (by default the cached warm-up of ``config``, loaded by path),
    rewards and weights, group size, batch (``num_prompts * num_generations`` completions per
    step), learning rate (constant), clipping, KL coefficient, loss aggregation, temperature
    and gradient clipping, through :func:`labkit.training.grpo_config` (which sets the
    precision for this device). ``overrides`` are any other ``GRPOConfig`` fields. Quiet by default
    (no progress bar, no printed logs): a :class:`labkit.dashboard.LiveDashboard` in ``callbacks``, or
    ``trainer.state.log_history``, shows the metrics.
    """
    from labkit.training import build_trainer, grpo_config

    model = str(warm_up_path(config)) if model is None else model
    batch = config.num_prompts * config.num_generations
    args = grpo_config(
        output_dir, **{
            "per_device_train_batch_size": batch,
            "gradient_accumulation_steps": 1,
            "num_generations": config.num_generations,
            "max_completion_length": config.max_completion_length,
            "temperature": config.temperature,
            "learning_rate": config.learning_rate,
            "lr_scheduler_type": "constant",
            "weight_decay": 0.0,
            "max_grad_norm": config.max_grad_norm,
            "beta": config.beta,
            "epsilon": config.epsilon,
            "loss_type": config.loss_type,
            "max_steps": config.max_steps,
            "reward_weights": list(REWARD_WEIGHTS),
            "seed": config.seed,
            "disable_tqdm": True,
            **overrides,
        })
    train = config.task().dataset(train_size, seed=config.seed, split="train")
    trainer = build_trainer(model, list(REWARD_FUNCS), train, args, callbacks=callbacks)
    if args.disable_tqdm:
        from transformers import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # it prints every step's logs as a dict
    return trainer


# ----------------------------------------------------------------------------- plots and the main job


def plot_run(history: list[dict], evals: list[dict], path: str | os.PathLike | None = None, *,
             title: str | None = None):
    """Return a matplotlib figure of a GRPO run; saved as a PNG if ``path`` is given.

    Left: the share of right answers and of completions that carry in each training batch
    (``history``, from :func:`nano_grpo`). Right: held-out accuracy at each evaluation
    (``evals``: dicts with ``step``, ``accuracy`` and optionally ``greedy_accuracy``).
    """
    import matplotlib

    if path is not None and "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), dpi=70)
    steps = range(1, len(history) + 1)
    left.plot(steps, [h["rewards/accuracy_reward/mean"] for h in history], label="right answers", color="#2ca02c")
    left.plot(steps, [h["carry_rate"] for h in history], label="carries", color="#ff7f0e", linestyle="--")
    left.set(xlabel="GRPO step", ylabel="share of the batch", ylim=(-0.02, 1.02), title="training batches")
    left.legend(loc="lower right")
    eval_steps = [e["step"] for e in evals]
    right.plot(eval_steps, [e["accuracy"] for e in evals], "o-", label="pass@1 (sampled)", color="#1f77b4")
    if evals and "greedy_accuracy" in evals[0]:
        right.plot(eval_steps, [e["greedy_accuracy"] for e in evals], "s--", label="greedy", color="#7f7f7f")
    right.set(xlabel="GRPO step", ylabel="accuracy", ylim=(-0.02, 1.02), title="held-out problems")
    right.legend(loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path)
        plt.close(fig)
    return fig


