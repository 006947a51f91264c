"""The nano task's policy before GRPO: a tiny model built from a seed, warmed up on a sloppy teacher, cached.

Introduced in ``03_nano_grpo_cpu.ipynb``. GRPO can only reinforce what a policy already samples, and a
model with random weights never writes a right answer. :func:`warm_up` is a short supervised run on the
worked examples of :class:`labkit.tasks.AdditionTask`'s teacher, who forgets the carry in
``forget_carry`` of them: the model learns the answer format and the digit sums, and the slip with them,
so it carries only about as often as the teacher did. That leaves GRPO (:func:`labkit.nano.nano_grpo`)
something to find: within a group, the completions that carry are the ones rewarded.

The warm-up is a deterministic function of a :class:`labkit.nano.NanoConfig`'s seed, model shape and
``sft_*`` fields, so :func:`warmed_up_policy` saves it under the lab's cache and runs that only change
GRPO settings share it; :func:`warm_up_path` is its folder, what TRL's ``GRPOTrainer`` loads by path.
Notebook 03 imports both from here. (Notebook 08's warm-up on tool-call demonstrations is
:func:`labkit.tools.warm_up`.)
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
from pathlib import Path
import torch
from torch.nn.utils.rnn import pad_sequence

from labkit.models import build_tiny_model, cache_dir, load_tokenizer, write_whole
from labkit.tasks import AdditionTask

# ``config`` below is a labkit.nano.NanoConfig (its seed, model shape and warm-up fields); not imported here, so
# that labkit.nano, which calls this module, is never imported back by it.
__all__ = ["build_policy", "warm_up", "warmed_up_policy", "warm_up_path"]


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' loading and saving progress bars (noise in a lesson that reloads a tiny model)."""
    from transformers.utils import logging

    enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            logging.enable_progress_bar()


def _load(path, device: str):
    # fp32 whatever the device: the model is tiny, and its warm-up is its whole training.
    from transformers import AutoModelForCausalLM

    with _quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(device)
    return model, load_tokenizer(path)


def build_policy(config):
    """Return ``(model, tokenizer)``: the tiny model of ``config``'s shape, random weights from its seed."""
    with _quiet_transformers():
        path = build_tiny_model(config.arch, seed=config.seed, **config.model_shape())
    return _load(path, config.device)


def warm_up(model, tokenizer, task: AdditionTask, *, steps: int, batch_size: int = 64, learning_rate: float = 3e-3,
            seed: int = 0, progress: bool = True) -> list[float]:
    """Return the loss per step of a supervised warm-up on the task's (sloppy) worked examples.

    Cross-entropy on the completion tokens only (the prompt is context), AdamW with a 10-step
    linear warm-up of the learning rate, then a cosine decay to a tenth of it, gradients
    clipped at norm 1. Sequences are padded on the right, so every token's position is the
    one it has at generation time.
    """
    import random

    from labkit.dashboard import progress_bar  # text, not a widget: it survives saving the notebook

    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / max(1, steps))))))
    model.train()
    losses = []
    bar = progress_bar(range(steps), desc="warm-up (SFT)", enabled=progress)
    for step in bar:
        pairs = task.problems(batch_size, seed=rng.randrange(2**31), split="train")
        sequences, targets = [], []
        for a, b in pairs:
            prompt = tokenizer.apply_chat_template(task.prompt(a, b), tokenize=False, add_generation_prompt=True)
            prompt_ids = tokenizer(prompt)["input_ids"]
            completion_ids = tokenizer(task.teacher_solution(a, b, rng) + tokenizer.eos_token)["input_ids"]
            sequences.append(torch.tensor(prompt_ids + completion_ids))
            targets.append(torch.tensor([-100] * len(prompt_ids) + completion_ids))  # -100: not scored
        input_ids = pad_sequence(sequences, batch_first=True, padding_value=tokenizer.pad_token_id)  # (N, L)
        attention_mask = pad_sequence([torch.ones_like(x) for x in sequences], batch_first=True)  # (N, L)
        labels = pad_sequence(targets, batch_first=True, padding_value=-100)  # (N, L)
        loss = model(input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device),
                     labels=labels.to(model.device)).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    return losses


def _warm_up_folder(config) -> Path:
    fields = ("seed", "arch", "forget_carry", "sft_steps", "sft_batch_size", "sft_learning_rate", "device")
    key = json.dumps({**{f: getattr(config, f) for f in fields}, **config.model_shape(), "v": 1}, sort_keys=True)
    return cache_dir() / "nano-warm-ups" / f"addition-{hashlib.sha1(key.encode()).hexdigest()[:10]}"


def warmed_up_policy(config, *, reuse: bool = True, progress: bool = True):
    """Return ``(model, tokenizer, losses)``: the tiny model after the warm-up, cached on disk when ``reuse``.

    Comparisons that only change GRPO settings share one (``losses`` is then the cached run's);
    the saved folder is also what TRL's ``GRPOTrainer`` loads (a path).
    """
    path = _warm_up_folder(config)
    if reuse and (path / "config.json").exists():
        model, tokenizer = _load(path, config.device)
        return model, tokenizer, json.loads((path / "warm_up_losses.json").read_text())
    from labkit.lab import seed_everything

    seed_everything(config.seed)
    model, tokenizer = build_policy(config)
    losses = warm_up(model, tokenizer, config.task(), steps=config.sft_steps, batch_size=config.sft_batch_size,
                     learning_rate=config.sft_learning_rate, seed=config.seed, progress=progress)
    if reuse:
        def save(tmp):
            with _quiet_transformers():
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
            (tmp / "warm_up_losses.json").write_text(json.dumps(losses))

        write_whole(path, save)
        model.config._name_or_path = str(path)
    return model, tokenizer, losses


def warm_up_path(config, progress: bool = True) -> Path:
    """Return the folder of the cached warmed-up model for ``config`` (warming it up if needed)."""
    path = _warm_up_folder(config)
    if not (path / "config.json").exists():
        warmed_up_policy(config, reuse=True, progress=progress)
    return path
