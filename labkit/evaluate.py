"""GSM8K accuracy of a policy: batched greedy generation, strict and lenient scoring, per-item records.

Introduced in ``04_lora_grpo_16gb.ipynb``, which evaluates the policy on the held-out test
split before and after GRPO. Three rates, each over the same questions:

- **strict accuracy**: the completion has the lab's format exactly (``<think>...</think>``
  then ``<answer>...</answer>``, :func:`labkit.rewards.format_reward`) *and* its answer
  (:func:`labkit.rewards.extract_answer`) equals the gold number
  (:func:`labkit.rewards.answers_match`);
- **lenient accuracy**: the last number anywhere in the completion equals the gold number
  (:func:`labkit.rewards.extract_last_number`), whatever the format: what a model "knows";
- **format rate**: the share of completions with the exact format.

Greedy decoding (``do_sample=False``) makes the figures reproducible. A rate ``p`` over ``n``
questions has a 95 % interval of about ``1.96 sqrt(p (1 - p) / n)``: +/- 2.7 points at
``n = 1,319`` and ``p = 0.5``, +/- 18 points at ``n = 30`` (what some published peers report).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = ["EvalResult", "grade_completion", "gsm8k_accuracy", "before_after_table", "ci95"]


def ci95(rate: float, n: int) -> float:
    """Return the half-width of the normal-approximation 95 % interval of a rate over ``n`` items."""
    return 1.96 * math.sqrt(max(rate * (1 - rate), 0.0) / n) if n else float("nan")


def grade_completion(completion: str, gold: str) -> dict:
    """Return one completion's scores: ``format_ok``, ``strict_correct``, ``lenient_correct`` and the answers read.

    ``strict_correct`` needs the exact format and the right ``<answer>``; ``lenient_correct``
    only needs the last number of the text to be right.
    """
    from labkit.rewards import answers_match, extract_answer, extract_last_number, format_reward

    format_ok = format_reward([completion])[0] == 1.0
    strict_answer = extract_answer(completion)
    lenient_answer = extract_last_number(completion)
    return {
        "format_ok": format_ok,
        "strict_answer": strict_answer,
        "lenient_answer": lenient_answer,
        "strict_correct": format_ok and answers_match(strict_answer, gold),
        "lenient_correct": answers_match(lenient_answer, gold),
    }


@dataclass
class EvalResult:
    """What :func:`gsm8k_accuracy` measured: the three rates over ``n`` questions, and every item."""

    n: int
    strict_accuracy: float
    lenient_accuracy: float
    format_rate: float
    records: list = field(default_factory=list, repr=False)
    split: str = "test"
    seconds: float = 0.0
    max_new_tokens: int = 0
    truncated_rate: float = 0.0  # completions cut at max_new_tokens
    records_path: str | None = None

    def as_dict(self) -> dict:
        """Return the figures (without the per-item records)."""
        return {k: v for k, v in self.__dict__.items() if k != "records"}

    def save(self, path: str | Path) -> Path:
        """Write one JSON line per question to ``path`` and return it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as fh:
            for record in self.records:
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.records_path = str(path)
        return path

    def __str__(self) -> str:
        return (f"GSM8K {self.split} (n={self.n}): strict {self.strict_accuracy:.1%} "
                f"(+/- {ci95(self.strict_accuracy, self.n):.1%}), lenient {self.lenient_accuracy:.1%}, "
                f"format {self.format_rate:.1%}, cut at {self.max_new_tokens} tokens {self.truncated_rate:.1%} "
                f"[{self.seconds:.0f} s]")


def _device_of(model) -> torch.device:
    return next(model.parameters()).device


def gsm8k_accuracy(model, tokenizer, split: str = "test", limit: int | None = None, batch_size: int = 32, *,
                   max_new_tokens: int = 512, dataset=None, records_path: str | Path | None = None,
                   progress: bool = True) -> EvalResult:
    """Return an :class:`EvalResult`: strict and lenient accuracy and format rate on GSM8K ``split``.

    ``limit`` keeps the first questions (``None``: all 1,319 of the test split); ``dataset``
    replaces GSM8K with any dataset of conversational ``prompt`` and gold ``answer`` columns.
    Prompts are chat-templated, sorted by length (longest first, so an out-of-memory error
    shows at once and padding is small) and generated greedily ``batch_size`` at a time,
    left-padded; the records come back in the dataset's order. ``records_path`` writes
    them as JSON lines (question index, gold, completion, the answers read, the scores).
    The model is put in eval mode and back afterwards.
    """
    from labkit.dashboard import progress_bar  # text, not a widget: it survives saving the notebook

    from labkit.data import load_gsm8k

    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    desc = f"GSM8K {split}" if dataset is None else "held-out problems"
    dataset = dataset if dataset is not None else load_gsm8k(split, limit=limit)
    if limit is not None and len(dataset) > limit:
        dataset = dataset.select(range(limit))
    prompts, golds = dataset["prompt"], dataset["answer"]
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    # The chat template already wrote any BOS token: do not add special tokens again.
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: -lengths[i])

    was_training = model.training
    model.eval()
    device = _device_of(model)
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"  # decoder-only generation
    completions: dict[int, tuple[str, int]] = {}
    start = time.perf_counter()
    try:
        with torch.inference_mode(), progress_bar(total=len(order), desc=desc, enabled=progress) as bar:
            for first in range(0, len(order), batch_size):
                batch = order[first:first + batch_size]
                enc = tokenizer([texts[i] for i in batch], return_tensors="pt", padding=True,
                                add_special_tokens=False).to(device)
                out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, temperature=None,
                                     top_p=None, top_k=None, pad_token_id=tokenizer.pad_token_id)  # (b, T + new)
                new = out[:, enc["input_ids"].shape[1]:]  # (b, new)
                eos = {tokenizer.eos_token_id, tokenizer.pad_token_id, *_as_list(model.generation_config.eos_token_id)}
                for row, index in enumerate(batch):
                    ids = new[row].tolist()
                    used = next((k for k, t in enumerate(ids) if t in eos), None)
                    n_tokens = len(ids) if used is None else used
                    completions[index] = (tokenizer.decode(ids[:n_tokens], skip_special_tokens=True), n_tokens)
                bar.update(len(batch))
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
    seconds = time.perf_counter() - start

    records = []
    for index in range(len(texts)):
        text, n_tokens = completions[index]
        record = {"index": index, "gold": golds[index], "completion": text, "completion_tokens": n_tokens,
                  "truncated": n_tokens >= max_new_tokens}
        record.update(grade_completion(text, golds[index]))
        records.append(record)
    n = len(records)
    rate = lambda key: sum(r[key] for r in records) / n if n else float("nan")  # noqa: E731
    result = EvalResult(n=n, strict_accuracy=rate("strict_correct"), lenient_accuracy=rate("lenient_correct"),
                        format_rate=rate("format_ok"), records=records, split=split, seconds=round(seconds, 2),
                        max_new_tokens=max_new_tokens, truncated_rate=rate("truncated"))
    if records_path is not None:
        result.save(records_path)
    return result


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def before_after_table(before: EvalResult, after: EvalResult):
    """Return a pandas DataFrame: each rate before and after training, the change, and its 95 % interval.

    Both results must cover the same questions (same split and count), or the comparison
    would mean nothing; a mismatch raises ``ValueError``.
    """
    import pandas as pd

    if before.n != after.n or before.split != after.split:
        raise ValueError(f"before ({before.split}, n={before.n}) and after ({after.split}, n={after.n}) must be "
                         "evaluated on the same questions")
    if before.records and after.records and [r["gold"] for r in before.records] != [r["gold"] for r in after.records]:
        raise ValueError("before and after were evaluated on different questions")
    rows = []
    for label, key in (("strict accuracy", "strict_accuracy"), ("lenient accuracy", "lenient_accuracy"),
                       ("format rate", "format_rate")):
        b, a = getattr(before, key), getattr(after, key)
        rows.append({"metric": label, "before": round(b, 3), "after": round(a, 3), "change": round(a - b, 3),
                     "± 95% (each)": round(max(ci95(b, before.n), ci95(a, after.n)), 3)})  # one format: 3 decimals
    table = pd.DataFrame(rows).set_index("metric")
    table.attrs["n"] = before.n
    return table
