"""GSM8K as conversational prompts, bundled with the package so the lab works offline.

Introduced in ``00_setup.ipynb`` and used by every GSM8K notebook. The files under
``labkit/data/gsm8k/`` are OpenAI's GSM8K train (7,473) and test (1,319) splits, MIT
licence (``labkit/data/gsm8k/LICENSE``). Each row of :func:`load_gsm8k` has

- ``prompt``: ``[{"role": "system", ...}, {"role": "user", "content": question}]``, the
  conversational format TRL's ``GRPOTrainer`` applies the chat template to;
- ``answer``: the gold number as a string (``"72"``, ``"-3"``, ``"0.5"``), which the
  reward functions receive as a keyword argument;
- ``question`` and ``solution`` (the worked answer) for reading.
"""
from __future__ import annotations

import json
import re
from importlib import resources

__all__ = ["SYSTEM_PROMPT", "load_gsm8k", "gold_answer", "make_prompt", "GSM8K_SIZES"]

SYSTEM_PROMPT = (
    "You are a careful maths tutor. Think step by step inside <think> and </think>, "
    "then give only the final number inside <answer> and </answer>.\n"
    "Example: <think>3 apples + 4 apples = 7 apples</think>\n<answer>7</answer>"
)
GSM8K_SIZES = {"train": 7473, "test": 1319}
_GOLD = re.compile(r"####\s*(.+?)\s*$", re.S)


def gold_answer(solution: str) -> str:
    """Return the gold number after GSM8K's ``####`` marker, without thousands separators.

    ``"...\\n#### 1,200"`` -> ``"1200"``. Raises ``ValueError`` when there is no marker or
    what follows is not a number, so a corrupt row fails loudly instead of scoring 0.
    """
    match = _GOLD.search(solution)
    if not match:
        raise ValueError(f"no '#### <number>' marker in GSM8K solution: {solution[-80:]!r}")
    text = match.group(1).replace(",", "").replace("$", "").strip()
    float(text)  # raises ValueError if it is not a number
    return text


def make_prompt(question: str, system_prompt: str | None = SYSTEM_PROMPT) -> list[dict]:
    """Return the conversational prompt for one question (system message, then the question)."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": question}]


def load_gsm8k(split: str = "train", limit: int | None = None, source: str = "bundled", *,
               system_prompt: str | None = SYSTEM_PROMPT, seed: int | None = None):
    """Return GSM8K ``split`` as a ``datasets.Dataset`` with ``prompt`` and ``answer`` columns.

    ``limit`` keeps the first ``limit`` rows (after shuffling with ``seed``, if given).
    ``source="bundled"`` reads the copy inside the package (offline, reproducible);
    ``source="hub"`` downloads ``openai/gsm8k`` (needs internet; same rows).
    """
    from datasets import Dataset, load_dataset

    if split not in GSM8K_SIZES:
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    if source == "bundled":
        text = resources.files("labkit").joinpath(f"data/gsm8k/{split}.jsonl").read_text(encoding="utf-8")
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    elif source == "hub":
        rows = list(load_dataset("openai/gsm8k", "main", split=split))
    else:
        raise ValueError(f"source must be 'bundled' or 'hub', not {source!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of rows or None, not {limit}")
    records = {
        "prompt": [make_prompt(r["question"], system_prompt) for r in rows],
        "answer": [gold_answer(r["answer"]) for r in rows],
        "question": [r["question"] for r in rows],
        "solution": [r["answer"] for r in rows],
    }
    dataset = Dataset.from_dict(records)
    if seed is not None:
        dataset = dataset.shuffle(seed=seed)
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return dataset
