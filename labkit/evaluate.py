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

Before/after statistics (the same problems scored twice, so the comparison is *paired*; scipy.stats
computes the standard ones, docs/references.md, "Statistics"): the Wilson interval of one rate
(:func:`wilson_interval`), the exact McNemar test (:func:`mcnemar_test`), two intervals of the change
(:func:`paired_bootstrap`, :func:`newcombe_interval`), both kept by every before/after record
(:func:`paired_change`), and pass@k (:func:`pass_at_k`).
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

__all__ = ["EvalResult", "grade_completion", "gsm8k_accuracy", "before_after_table", "ci95", "wilson_interval",
           "McNemarResult", "mcnemar_test", "paired_bootstrap", "newcombe_interval", "PairedChange", "paired_change",
           "paired_columns", "pass_at_k", "held_out_scores", "describe_held_out", "short_answer_scores",
           "held_out_table", "side_by_side", "answer_verdict", "sampled_pass_at_k"]


def ci95(rate: float, n: int) -> float:
    """Return the half-width of the normal-approximation 95 % interval of a rate over ``n`` items."""
    return 1.96 * math.sqrt(max(rate * (1 - rate), 0.0) / n) if n else float("nan")


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, not {confidence}")


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Return ``(low, high)``: the Wilson score interval of the rate ``successes / n``.

    With ``p = successes / n`` and ``z`` the normal quantile (1.96 at 95 %):
    ``(p + z^2/2n +/- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``, computed by
    ``scipy.stats.binomtest(successes, n).proportion_ci(confidence, method="wilson")``.

    At 0 of 24 it is (0, 0.138), not the zero-width (0, 0) of the normal approximation.
    Defined in ``labkit.evaluate``; used by the before/after tables of 03 and 04.
    """
    from scipy.stats import binomtest

    if n < 1:
        raise ValueError(f"a rate needs at least one item, not n={n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be between 0 and n={n}, not {successes}")
    _check_confidence(confidence)
    interval = binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(interval.low), float(interval.high)


@dataclass
class McNemarResult:
    """The exact McNemar test of one paired before/after comparison over ``n`` problems."""

    n: int
    gained: int  # wrong before, right after
    lost: int  # right before, wrong after
    p_value: float

    @property
    def change(self) -> float:
        """Return the change in rate, ``(gained - lost) / n``."""
        return (self.gained - self.lost) / self.n


def _paired(before, after) -> tuple[list[bool], list[bool]]:
    before, after = [bool(x) for x in before], [bool(x) for x in after]
    if len(before) != len(after):
        raise ValueError(f"a paired comparison needs one verdict per problem before and after; got {len(before)} "
                         f"before and {len(after)} after")
    if not before:
        raise ValueError("a paired comparison needs at least one problem")
    return before, after


def _verdict_counts(before, after) -> tuple[int, int, int, int]:
    """Return ``(both, gained, lost, neither)``: problems right both times, only after, only before, never."""
    counts = Counter(zip(*_paired(before, after)))
    return counts[True, True], counts[False, True], counts[True, False], counts[False, False]


def mcnemar_test(before, after) -> McNemarResult:
    """Return a :class:`McNemarResult`: the exact (binomial) McNemar test of paired verdicts.

    ``before[i]`` and ``after[i]`` say whether problem ``i`` was right before and after training.
    Under the null hypothesis (training changed nothing) each of the ``gained + lost`` changed
    verdicts is a fair coin, so the two-sided p-value is
    ``min(1, 2 P[Binomial(gained + lost, 1/2) <= min(gained, lost)])``
    (``scipy.stats.binomtest(gained, gained + lost).pvalue``); 1.0 when nothing changed.
    """
    from scipy.stats import binomtest

    both, gained, lost, neither = _verdict_counts(before, after)
    p_value = float(binomtest(gained, gained + lost, 0.5).pvalue) if gained + lost else 1.0
    return McNemarResult(n=both + gained + lost + neither, gained=gained, lost=lost, p_value=p_value)


def paired_bootstrap(before, after, *, n_resamples: int = 10_000, confidence: float = 0.95,
                     seed: int = 0) -> tuple[float, float, float]:
    """Return ``(change, low, high)``: the change in rate and its paired percentile-bootstrap interval.

    Each resample draws ``n`` problems with replacement and takes the mean of
    ``after[i] - before[i]`` over them, so a problem's two verdicts always travel together
    (``scipy.stats.bootstrap(..., paired=True, method="percentile")``, seeded with ``seed``). When every
    problem moved the same way (all gained, or nothing changed) every resample is the same and the
    interval has no width: :func:`newcombe_interval` has one in every case.
    """
    import numpy as np
    from scipy.stats import bootstrap

    before, after = _paired(before, after)
    _check_confidence(confidence)
    was, now = np.asarray(before, dtype=float), np.asarray(after, dtype=float)  # (n,) each, in {0, 1}
    change = float((now - was).mean())
    if len(was) == 1:  # one problem: every resample is that problem (scipy asks for two)
        return change, change, change
    result = bootstrap((was, now), lambda b, a, axis: (a - b).mean(axis=axis), paired=True, vectorized=True,
                       n_resamples=n_resamples, confidence_level=confidence, method="percentile",
                       rng=np.random.default_rng(seed))
    return change, float(result.confidence_interval.low), float(result.confidence_interval.high)


def newcombe_interval(before, after, *, confidence: float = 0.95) -> tuple[float, float]:
    """Return ``(low, high)``: Newcombe's score interval of the change in rate ``mean(after) - mean(before)``.

    Newcombe (1998, Statistics in Medicine 17:2635, method 10), the paired "square-and-add" interval:
    with the rates ``p1`` (after) and ``p2`` (before), their Wilson intervals ``(l1, u1)`` and ``(l2, u2)`` and
    ``phi`` the correlation of the two verdicts over the problems,
    ``low = d - sqrt((p1 - l1)^2 - 2 phi (p1 - l1)(u2 - p2) + (u2 - p2)^2)`` and
    ``high = d + sqrt((u1 - p1)^2 - 2 phi (u1 - p1)(p2 - l2) + (p2 - l2)^2)``, ``d = p1 - p2``.
    ``phi`` is 0 when a margin is empty and carries Newcombe's continuity correction (a positive
    ``ad - bc`` less ``n/2``, never below 0), so ``|phi| < 1`` and the interval always has width: at 30 of
    30 gained it is (0.839, 1.0) where the percentile bootstrap gives (1.0, 1.0).
    """
    both, gained, lost, neither = _verdict_counts(before, after)
    n = both + gained + lost + neither
    p1, p2 = (both + gained) / n, (both + lost) / n
    (l1, u1), (l2, u2) = wilson_interval(both + gained, n, confidence), wilson_interval(both + lost, n, confidence)
    margins = (both + gained) * (lost + neither) * (both + lost) * (gained + neither)
    cross = both * neither - gained * lost
    phi = 0.0 if margins == 0 else (cross - n / 2 if cross > n / 2 else min(cross, 0)) / math.sqrt(margins)
    d = p1 - p2
    low = d - math.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    high = d + math.sqrt(max((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2, 0.0))
    return max(-1.0, low), min(1.0, high)


@dataclass
class PairedChange(McNemarResult):
    """A paired before/after comparison of per-problem verdicts: the exact test (:class:`McNemarResult`, whose
    ``change`` is the change in rate) and Newcombe's interval of that change (:func:`newcombe_interval`)."""

    low: float
    high: float

    @property
    def points(self) -> float:
        """Return the change in percentage points."""
        return 100 * self.change


def paired_change(before, after, *, confidence: float = 0.95) -> PairedChange:
    """Return a :class:`PairedChange`: :func:`mcnemar_test` and :func:`newcombe_interval` of the same verdicts.

    One call for the figures every before/after record of the lab keeps (notebooks 03, 04 and 08, ``labkit demo``,
    ``bench tools-demo``), so each record's change, interval and p come from the same code. The interval has
    width whenever there is a problem, also when every problem was gained or nothing changed.
    """
    test = mcnemar_test(before, after)
    low, high = newcombe_interval(before, after, confidence=confidence)
    return PairedChange(**asdict(test), low=low, high=high)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Return the unbiased pass@k estimate ``1 - C(n - c, k) / C(n, k)``: k of n samples, c of them right.

    Chen et al. (2021, arXiv 2107.03374), "Evaluating Large Language Models Trained on Code", eq. 1: draw ``n >= k``
    samples per problem, count the ``c`` right ones; averaging this over problems estimates the
    chance that at least one of ``k`` fresh samples is right, without the bias of ``1 - (1 - c/n)^k``.
    """
    if not 0 <= c <= n:
        raise ValueError(f"c (right samples) must be between 0 and n={n}, not {c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n (samples drawn); got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


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


@contextlib.contextmanager
def _generating(model, tokenizer):
    """Generate in eval mode without autograd, left-padded (decoder-only generation); restore both afterwards."""
    was_training, padding_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    try:
        with torch.inference_mode():
            yield
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)


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

    eos = {tokenizer.eos_token_id, tokenizer.pad_token_id, *_as_list(model.generation_config.eos_token_id)}
    completions: dict[int, tuple[str, int]] = {}
    start = time.perf_counter()
    with _generating(model, tokenizer), progress_bar(total=len(order), desc=desc, enabled=progress) as bar:
        for first in range(0, len(order), batch_size):
            batch = order[first:first + batch_size]
            enc = tokenizer([texts[i] for i in batch], return_tensors="pt", padding=True,
                            add_special_tokens=False).to(_device_of(model))
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, temperature=None,
                                 top_p=None, top_k=None, pad_token_id=tokenizer.pad_token_id)  # (b, T + new)
            new = out[:, enc["input_ids"].shape[1]:]  # (b, new)
            for row, index in enumerate(batch):
                ids = new[row].tolist()
                used = next((k for k, t in enumerate(ids) if t in eos), None)
                n_tokens = len(ids) if used is None else used
                completions[index] = (tokenizer.decode(ids[:n_tokens], skip_special_tokens=True), n_tokens)
            bar.update(len(batch))
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


_METRICS = {"strict accuracy": ("strict_accuracy", "strict_correct"),
            "lenient accuracy": ("lenient_accuracy", "lenient_correct"),
            "format rate": ("format_rate", "format_ok")}


def _interval(low: float, high: float) -> str:
    return f"[{low:.3f}, {high:.3f}]"


def paired_columns(before, after) -> dict:
    """Return a before/after table's paired columns for per-problem verdicts ``before`` and ``after``.

    ``change 95% CI``: Newcombe's paired interval of the change (:func:`newcombe_interval`, never zero-width);
    ``McNemar p``: the exact test (:func:`mcnemar_test`) as text with two significant figures, so a
    p of 2e-06 never reads 0. Used by :func:`before_after_table` and :func:`held_out_table`.
    """
    paired = paired_change(before, after)
    return {"change 95% CI": _interval(paired.low, paired.high), "McNemar p": f"{paired.p_value:.2g}"}


def before_after_table(before: EvalResult, after: EvalResult, metrics=tuple(_METRICS)):
    """Return a pandas DataFrame: each rate before and after, its Wilson interval, the change and a paired test.

    The paired columns (:func:`paired_columns`: Newcombe's interval of the change, the exact McNemar p) need
    the per-problem records of both results (what :func:`gsm8k_accuracy` keeps); without them they say so.
    ``metrics`` picks rows (``"strict accuracy"``, ``"lenient accuracy"``, ``"format rate"``): show only the
    ones that can change in the run at hand. Both results must cover the same questions (same split and
    count), or the comparison would mean nothing; a mismatch raises ``ValueError``.
    """
    import pandas as pd

    unknown = [m for m in metrics if m not in _METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; choose from {list(_METRICS)}")
    if before.n != after.n or before.split != after.split:
        raise ValueError(f"before ({before.split}, n={before.n}) and after ({after.split}, n={after.n}) must be "
                         "evaluated on the same questions")
    paired = bool(before.records and after.records)
    if paired and [r["gold"] for r in before.records] != [r["gold"] for r in after.records]:
        raise ValueError("before and after were evaluated on different questions")
    rows = []
    for label in metrics:
        key, record_key = _METRICS[label]
        b, a = getattr(before, key), getattr(after, key)
        row = {"metric": label,
               "before": round(b, 3), "before 95% CI": _interval(*wilson_interval(round(b * before.n), before.n)),
               "after": round(a, 3), "after 95% CI": _interval(*wilson_interval(round(a * after.n), after.n)),
               "change": round(a - b, 3)}
        if paired:
            row |= paired_columns([r[record_key] for r in before.records], [r[record_key] for r in after.records])
        else:
            row["change 95% CI"] = row["McNemar p"] = "needs per-problem records"
        rows.append(row)
    table = pd.DataFrame(rows).set_index("metric")
    table.attrs["n"] = before.n
    return table


# --------------------------------------------------------------------------- the held-out word problems (CPU mode)


def held_out_scores(result) -> dict:
    """Return the held-out figures of an evaluation of :class:`labkit.tasks.WordProblems`, with per-problem verdicts.

    ``result`` is :func:`labkit.evaluate.gsm8k_accuracy`'s answer on the word problems (greedy).
    ``right_answer`` is what GRPO trains for: the share whose *stated* answer is the gold number
    (:func:`labkit.rewards.right_answer_reward`); ``right`` holds the verdict of each problem
    (for the paired test). ``short_answer`` (1-10 words with a number), ``last_number`` (the
    last number in the reply is the gold one, the lenient reading) and ``mean_words`` are
    reported beside it, and ``right_false_equation``: the share scored right whose reply holds an equation with
    false arithmetic (:func:`labkit.rewards.equation_errors`), which the reward never checks.
    """
    from labkit.rewards import equation_errors, right_answer_reward, short_answer_reward

    texts = [r["completion"] for r in result.records]
    golds = [r["gold"] for r in result.records]
    n = len(texts)
    right = [bool(x) for x in right_answer_reward(texts, answer=golds)]
    return {
        "right_answer": sum(right) / n,
        "right": right,
        "right_false_equation": sum(r and bool(equation_errors(t)) for r, t in zip(right, texts)) / n,
        "short_answer": sum(short_answer_reward(texts)) / n,
        "last_number": sum(bool(r["lenient_correct"]) for r in result.records) / n,
        "mean_words": sum(len(t.split()) for t in texts) / n,
        "n": n,
    }


def describe_held_out(result) -> str:
    """Return one line on an evaluation of the held-out word problems: right answers with their Wilson interval.

    What notebook 04 prints in CPU mode instead of GSM8K's line (whose strict and format rates
    cannot move on word problems): ``held-out word problems (n=96, greedy, at most 24 tokens): 36
    right = 37.5 % [95 % Wilson 28.5-47.5 %]; 62.5 % cut off at the budget [22 s]``.
    """
    right = held_out_scores(result)["right"]
    low, high = wilson_interval(sum(right), len(right))
    return (f"held-out word problems (n={len(right)}, greedy, at most {result.max_new_tokens} tokens): {sum(right)} "
            f"right = {sum(right) / len(right):.1%} [95 % Wilson {low:.1%}-{high:.1%}]; "
            f"{result.truncated_rate:.1%} cut off at the budget [{result.seconds:.0f} s]")


def short_answer_scores(result) -> dict:
    """Return :func:`held_out_scores` without the per-problem verdicts (one row of a table)."""
    return {k: v for k, v in held_out_scores(result).items() if k != "right"}


def held_out_table(before, after=None):
    """Return a pandas DataFrame of the held-out right-answer rate of the word problems, before and after GRPO.

    ``before`` and ``after`` are :func:`labkit.evaluate.gsm8k_accuracy` results on the word
    problems, or ``before`` is a :func:`labkit.demo.real_model_demo` summary (its per-problem verdicts). One
    row, the rate GRPO trains (GSM8K's strict format rate cannot move here, nobody asked for
    tags): each rate with its Wilson interval, the change with its paired (Newcombe) interval, and the
    exact McNemar p.
    """
    import pandas as pd

    if isinstance(before, dict):
        before, after = before["right_before"], before["right_after"]
    else:
        before, after = held_out_scores(before)["right"], held_out_scores(after)["right"]
    n = len(before)
    row = {"problems": n,
           "before": round(sum(before) / n, 3), "before 95% CI": _interval(*wilson_interval(sum(before), n)),
           "after": round(sum(after) / n, 3), "after 95% CI": _interval(*wilson_interval(sum(after), n)),
           "change": round((sum(after) - sum(before)) / n, 3), **paired_columns(before, after)}
    return pd.DataFrame([row], index=pd.Index(["right answer (held-out word problems)"], name="metric"))


def side_by_side(dataset, before, after, rows: int = 8):
    """Return a styled table: each held-out question beside its gold number and both replies, left-aligned.

    ``dataset`` holds the problems (conversational ``prompt``: the question is its last message),
    ``before``/``after`` are their evaluations; ``right before``/``right after`` are
    :func:`labkit.rewards.right_answer_reward`'s verdicts.
    """
    import pandas as pd

    b_scores, a_scores = held_out_scores(before)["right"], held_out_scores(after)["right"]
    table = pd.DataFrame([{"question": q, "gold": b["gold"], "before": b["completion"], "right before": rb,
                           "after": a["completion"], "right after": ra}
                          for q, b, a, rb, ra in zip(dataset_questions(dataset), before.records, after.records, b_scores,
                                                     a_scores)][:rows])
    return table.style.set_properties(**{"text-align": "left", "white-space": "pre-wrap"}).set_table_styles(
        [{"selector": "th", "props": [("text-align", "left")]}]).hide(axis="index")


def answer_verdict(reply: str, answer) -> str:
    """Return one line on a reply to a learner's own question (notebook 04, section 9): right, wrong or unchecked.

    The answer the reply states (:func:`labkit.rewards.extract_stated_answer`: what the reward reads) is compared
    with ``answer``, the learner's ``MY_ANSWER`` (:func:`labkit.rewards.answers_match`). Every equation of the
    reply whose arithmetic is false (:func:`labkit.rewards.equation_errors`) is named: the reward never checks
    them. An ``answer`` that is not one number (``None``, a list, a word) gets a sentence, never an exception.
    """
    from labkit.rewards import answers_match, equation_errors, extract_stated_answer, parse_number

    stated = extract_stated_answer(reply)
    if parse_number(answer) is None:
        shown = "not set" if answer is None else f"{answer!r}, not one number"
        line = (f"states {stated or 'no number'}; not checked: MY_ANSWER is {shown} (set it in the parameters cell "
                'to the answer you expect, e.g. MY_ANSWER = "20")')
    elif stated is None:
        line = f"states no number as its answer: wrong (MY_ANSWER is {answer})"
    else:
        line = f"states {stated}: {'right' if answers_match(stated, answer) else 'wrong'} (MY_ANSWER is {answer})"
    false = equation_errors(reply)
    return line + ("; its false arithmetic: " + "; ".join(false) if false else "")


def dataset_questions(dataset) -> list[str]:
    return [prompt[-1]["content"] for prompt in dataset["prompt"]]


def sampled_pass_at_k(model, tokenizer, dataset, *, samples: int = 8, max_new_tokens: int = 32,
                      temperature: float = 1.0, batch_size: int = 4, seed: int = 0, progress: bool = True,
                      desc: str = "sampled replies") -> dict:
    """Return ``{"pass@k": {k: rate}, "right_per_problem": [c, ...]}``: ``samples`` sampled replies per problem.

    Each problem of ``dataset`` (conversational ``prompt``, gold ``answer``) gets ``samples``
    replies sampled at ``temperature`` (TRL's default sampling, as in training), scored with
    :func:`labkit.rewards.right_answer_reward`; pass@k for k = 1..samples is
    :func:`labkit.evaluate.pass_at_k` averaged over problems. A progress bar counts the problems
    (``progress=False``: none); the inputs go to the model's device.
    """
    from labkit.dashboard.live import progress_bar
    from labkit.rewards import right_answer_reward

    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in dataset["prompt"]]
    golds = list(dataset["answer"])
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
    counts = []
    with _generating(model, tokenizer), progress_bar(total=len(texts), desc=desc, enabled=progress) as bar:
        for first in range(0, len(texts), batch_size):
            enc = tokenizer(texts[first:first + batch_size], return_tensors="pt", padding=True,
                            add_special_tokens=False).to(_device_of(model))
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature,
                                 top_p=1.0, top_k=0, num_return_sequences=samples,
                                 pad_token_id=tokenizer.pad_token_id)  # (b * samples, T + new)
            replies = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            for row, gold in enumerate(golds[first:first + batch_size]):
                mine = replies[row * samples:(row + 1) * samples]
                counts.append(int(sum(right_answer_reward(mine, answer=[gold] * samples))))
            bar.update(len(golds[first:first + batch_size]))
    rates = {k: sum(pass_at_k(samples, c, k) for c in counts) / len(counts) for k in range(1, samples + 1)}
    return {"pass@k": rates, "right_per_problem": counts, "samples": samples, "temperature": temperature}
