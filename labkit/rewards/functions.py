"""The reward functions, in TRL's calling convention, and how to combine them.

The second part of :mod:`labkit.rewards` (introduced in ``02_reward_functions.ipynb``). TRL calls
every reward function the same way::

    rewards = reward_func(prompts=prompts, completions=completions, completion_ids=completion_ids,
                          answer=answer, trainer_state=..., log_extra=..., log_metric=...)

``completions`` holds plain strings or conversational messages; every dataset column arrives as
a keyword argument with one value per completion (GSM8K's gold number is ``answer``). A reward
returns one ``float`` per completion inside the range its ``value_range`` attribute holds, or
``None`` where it does not apply (TRL skips those), and TRL logs it as ``rewards/<__name__>/mean``.
"""
from __future__ import annotations

import functools
import math
import re
from collections import Counter
from fractions import Fraction

from labkit.environments import ERROR_PREFIX, safe_calculate
from labkit.rewards.parse import (
    ANSWER_CLOSE, ANSWER_OPEN, FORMAT_TAGS, MAX_MAGNITUDE, THINK_CLOSE, THINK_OPEN, evaluate_with_literals, numbers_equal, parse_answer,
    answers_match, completion_text, extract_answer, extract_stated_answer,
)

__all__ = [
    "format_reward", "soft_format_reward", "tag_count_reward", "accuracy_reward", "int_answer_reward",
    "expression_reward", "right_answer_reward", "equation_errors", "short_answer_reward", "overlong_penalty",
    "OverlongPenalty", "combine_rewards", "CombinedReward", "weighted_sum", "gsm8k_rewards", "named_rewards",
    "score_completions",
]


def _value_range(low: float, high: float):
    """Decorator: record a reward's documented range as ``fn.value_range`` (read by the checker)."""

    def mark(fn):
        fn.value_range = (float(low), float(high))
        return fn

    return mark


@_value_range(0.0, 1.0)
def format_reward(completions, **kwargs) -> list[float]:
    """Return 1.0 per completion that is exactly ``<think>...</think>`` then ``<answer>...</answer>``, else 0.0.

    Strict: nothing before ``<think>`` or after ``</answer>`` but whitespace, only whitespace
    between ``</think>`` and ``<answer>``, each tag exactly once, neither part empty. Range {0, 1}.
    """
    return [1.0 if _strict_format(completion_text(c)) else 0.0 for c in completions]


def _strict_format(text: str) -> bool:
    text = text.strip()
    if not (text.startswith(THINK_OPEN) and text.endswith(ANSWER_CLOSE)):
        return False
    if any(text.count(tag) != 1 for tag in FORMAT_TAGS):
        return False
    think_end, answer_start = text.find(THINK_CLOSE), text.find(ANSWER_OPEN)
    if answer_start < think_end or text[think_end + len(THINK_CLOSE):answer_start].strip():
        return False
    thinking = text[len(THINK_OPEN):think_end].strip()
    answer = text[answer_start + len(ANSWER_OPEN):-len(ANSWER_CLOSE)].strip()
    return bool(thinking) and bool(answer)


@_value_range(0.0, 1.0)
def soft_format_reward(completions, **kwargs) -> list[float]:
    """Return 1.0 per completion with ``<think>``, ``</think>``, ``<answer>``, ``</answer>`` in that order, else 0.0.

    Gentler than :func:`format_reward`: any text may surround or separate the tags, and
    repeated tags are tolerated. Range {0, 1}.
    """
    return [1.0 if _tags_in_order(completion_text(c)) else 0.0 for c in completions]


def _tags_in_order(text: str) -> bool:
    position = 0
    for tag in FORMAT_TAGS:
        position = text.find(tag, position)
        if position < 0:
            return False
        position += len(tag)
    return True


@_value_range(0.0, 1.0)
def tag_count_reward(completions, **kwargs) -> list[float]:
    """Return 0.25 per format tag that appears exactly once in a completion (0.0 to 1.0).

    Partial credit that a small model can climb one tag at a time before it ever gets the whole
    format right (a common remedy for models that never learn the format). Repeating a tag
    earns nothing for it, so spamming tags does not pay. Range [0, 1] in steps of 0.25.
    """
    return [0.25 * sum(completion_text(c).count(tag) == 1 for tag in FORMAT_TAGS) for c in completions]


def _gold_rewards(completions, answer, read) -> list[float | None]:
    """Return 1.0 where ``read(completion)`` matches the gold number, 0.0 where not, None where the gold is no number."""
    return [None if parse_answer(gold) is None else 1.0 if answers_match(read(completion), gold) else 0.0
            for completion, gold in zip(completions, answer, strict=True)]


@_value_range(0.0, 1.0)
def accuracy_reward(completions, answer, **kwargs) -> list[float | None]:
    """Return 1.0 per completion whose ``<answer>`` states the gold number, 0.0 otherwise, None if no gold.

    ``answer`` is the dataset column with the gold number (GSM8K: ``"72"``). The answer is read
    with :func:`extract_answer` (the one ``<answer>`` after ``</think>``) and compared with
    :func:`answers_match` (numerically: ``"$1,200.00"`` equals ``"1200"``). A gold value that is
    not a number gives ``None``: TRL then ignores this reward for that completion. Range {0, 1}.
    """
    return _gold_rewards(completions, answer, extract_answer)


@_value_range(0.0, 1.0)
def int_answer_reward(completions, **kwargs) -> list[float]:
    """Return 1.0 per completion whose ``<answer>`` is one whole number (``"18"``, ``"1,200"``), else 0.0.

    Every GSM8K answer is a whole number, so this pays for answering in the right shape before
    the value is right: a small shaping reward, like :func:`tag_count_reward`. Range {0, 1}.
    """
    numbers = [parse_answer(extract_answer(c)) for c in completions]
    # A float is an irrational LaTeX answer (\sqrt{2}): never whole, however large ("\sqrt{99...9}" is
    # a float that is_integer() calls whole).
    return [1.0 if n is not None and not n.percent and isinstance(n.value, Fraction) and n.value.denominator == 1
            else 0.0 for n in numbers]


@_value_range(0.0, 1.0)
def expression_reward(completions, target, nums=None, numbers=None, **kwargs) -> list[float | None]:
    """Return 1.0 per completion whose ``<answer>`` expression reaches ``target`` using each number once, else 0.0.

    The countdown task: given ``nums`` (``[3, 8, 1]``) reach ``target`` (``24``) with ``+ - * /``
    and parentheses, every number used exactly once: ``<answer>(1 + 3) * 8 - 8</answer>``
    would use 8 twice and earns 0. The expression (the text before any ``=``) is evaluated
    exactly by :func:`evaluate_expression`: never ``eval``. Dataset columns: ``target`` and
    ``nums`` (TinyZero's name; ``numbers`` is accepted too). A row without numbers or a numeric
    target gives ``None``. Range {0, 1}.
    """
    nums = nums if nums is not None else numbers
    if nums is None:
        raise TypeError("expression_reward needs the numbers of each task as a 'nums' (or 'numbers') column")
    out = []
    for completion, goal, available in zip(completions, target, nums, strict=True):
        goal = parse_answer(goal)
        if goal is None or goal.percent or not isinstance(available, (list, tuple)) \
                or not all(type(n) is int for n in available):
            out.append(None)
            continue
        expression = extract_answer(completion)
        result = None if expression is None else evaluate_with_literals(expression.split("=", 1)[0], allow_power=False,
                                                           max_exponent=0, max_magnitude=MAX_MAGNITUDE)
        correct = (result is not None and Counter(result[1]) == Counter(available)
                   and numbers_equal(result[0], goal.value))
        out.append(1.0 if correct else 0.0)
    return out


@_value_range(0.0, 1.0)
def right_answer_reward(completions, answer, **kwargs) -> list[float | None]:
    """Return 1.0 per completion whose *stated* answer is the gold number, 0.0 otherwise, None if no gold.

    For free-text replies (the CPU mode's word problems, :class:`labkit.tasks.WordProblems`): the
    answer is read with :func:`extract_stated_answer` (an ``<answer>`` tag, else ``"answer is N"``,
    else the result of the last ``=``, else the last number) and compared with :func:`answers_match`.
    The gold number merely appearing in the reply earns nothing: ``"7 + 5 = 13, not 12"`` states 13.
    A hedge (``"12 or 13"``) states no answer. Range {0, 1}.
    """
    return _gold_rewards(completions, answer, extract_stated_answer)


# An equation: starts at a digit or "(" that no operator precedes ("bags x 2 = 6" is not "2 = 6"), runs over digits,
# operators, brackets, spaces and "=", and keeps a "." "," or "$" only before a digit. One character class: linear.
_EQUATION = re.compile(r"(?<![\w.+\-*/×÷=])(?<![+\-*/×÷=xX] )[\d(](?:[\d \t+\-*/×÷xX()=\u2212]|[.,$](?=\d))*")
MAX_EQUATIONS, MAX_EQUATION_CHARS = 10, 200  # the last 10 equations of a reply are read; a longer chain is not


def _agree(a: str, b: str) -> bool:
    """Return whether two calculator results are one number, to the decimals the shorter one shows (7/3 = 2.33)."""
    places = min(len(s.partition(".")[2]) for s in (a, b))
    return a == b or places > 0 and abs(Fraction(a) - Fraction(b)) * 2 * 10**places <= 1


def equation_errors(text: str) -> list[str]:
    """Return the equations in ``text`` whose arithmetic is false: ``["3 * 2 * 2 = 6"]`` for "Emma has 3 * 2 * 2 = 6".

    An equation is a run of numbers, operators (``x``, ``×`` and ``÷`` too), brackets and ``=``, with one operator
    at least; a chain ``a = b = c`` is false where two neighbouring sides differ. The lab's calculator evaluates
    each side (:func:`labkit.environments.safe_calculate`, never ``eval``), and a side it refuses (a name, over 100
    characters, beyond 10^12) is not compared. The last :data:`MAX_EQUATIONS` of a reply are read, each at most
    :data:`MAX_EQUATION_CHARS` long. Introduced in ``04_lora_grpo_16gb.ipynb``.
    """
    found = [m.group().rstrip(" \t+-*/×÷xX(=\u2212") for m in _EQUATION.finditer(completion_text(text))]
    found = [e if e.count("(") == e.count(")") else e.strip("()") for e in found  # "(so 3 + 2 = 5)": "3 + 2 = 5"
             if "=" in e and len(e) <= MAX_EQUATION_CHARS and re.search(r"[^\d\s.,=()$]", e)]
    false = []
    for equation in found[-MAX_EQUATIONS:]:
        sides = [s.strip() for s in equation.replace("$", "").split("=")]
        values = [safe_calculate(s if s.count("(") == s.count(")") else s.strip("() ")) for s in sides]
        values = [v for v in values if not v.startswith(ERROR_PREFIX)]
        if not all(_agree(a, b) for a, b in zip(values, values[1:])):
            false.append(equation)
    return false


SHORT_ANSWER_WORDS = 10
_DIGIT = re.compile(r"\d")  # states a number: any digit (written-out numbers do not count)


@_value_range(0.0, 1.0)
def short_answer_reward(completions, max_words: int = SHORT_ANSWER_WORDS, **kwargs) -> list[float]:
    """Return 1.0 per completion of 1 to ``max_words`` words (split on whitespace) that states a number, else 0.0.

    The reward of the CPU mode's real-model experiment (``labkit.tasks.WordProblems``, whose system
    prompt asks for one short sentence of at most 10 words): a *behaviour* a small instruct model
    follows about half the time, so GRPO's groups have reward variance to learn from. It does not
    check that the number is right: notebook 04 shows what a model does with that loophole.
    """
    texts = [completion_text(c) for c in completions]
    return [1.0 if 1 <= len(t.split()) <= max_words and _DIGIT.search(t) is not None else 0.0 for t in texts]


class OverlongPenalty:
    """A reward function: DAPO's soft overlong punishment, 0 for short completions down to -1.

    With ``L = len(completion_ids)``, ``L_max = max_completion_length`` and ``L_cache = soft_punish_cache``
    (DAPO, Eq. 13; TRL's ``get_soft_overlong_punishment``)::

        0                                  if L <= L_max - L_cache
        ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max
        -1                                 if L > L_max

    Lengths are in tokens (TRL's ``completion_ids``); called without ``completion_ids`` it counts
    characters instead. A callable class rather than a closure, so that it pickles. Range [-1, 0].
    """

    value_range = (-1.0, 0.0)

    def __init__(self, max_completion_length: int, soft_punish_cache: int, name: str = "overlong_penalty"):
        if max_completion_length < 1 or not 0 <= soft_punish_cache <= max_completion_length:
            raise ValueError("need max_completion_length >= 1 and 0 <= soft_punish_cache <= max_completion_length, "
                             f"got {max_completion_length} and {soft_punish_cache}")
        self.max_completion_length = int(max_completion_length)
        self.soft_punish_cache = int(soft_punish_cache)
        self.__name__ = name

    def penalty(self, length: int) -> float:
        """Return the penalty of a completion of ``length`` tokens."""
        safe_length = self.max_completion_length - self.soft_punish_cache
        if length <= safe_length:
            return 0.0
        if length <= self.max_completion_length:
            return (safe_length - length) / self.soft_punish_cache
        return -1.0

    def __call__(self, completions, completion_ids=None, **kwargs) -> list[float]:
        if completion_ids is not None:
            lengths = [len(ids) if hasattr(ids, "__len__") else 0 for ids in completion_ids]
            if len(lengths) != len(completions):
                raise ValueError(f"{len(completion_ids)} completion_ids for {len(completions)} completions")
        else:
            lengths = [len(completion_text(c)) for c in completions]
        return [self.penalty(n) for n in lengths]

    def __repr__(self) -> str:
        return (f"OverlongPenalty(max_completion_length={self.max_completion_length}, "
                f"soft_punish_cache={self.soft_punish_cache})")


def overlong_penalty(max_completion_length: int, soft_punish_cache: int) -> OverlongPenalty:
    """Return DAPO's soft overlong penalty as a reward function (range [-1, 0]); see :class:`OverlongPenalty`."""
    return OverlongPenalty(max_completion_length, soft_punish_cache)


def callable_name(fn) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def weighted_sum(per_function, weights) -> list[float | None]:
    """Return ``sum_i w_i * r_i`` per completion, as TRL sums ``reward_weights`` (``nansum``).

    ``per_function`` holds one list of rewards per function (``(F, B)``); a ``None`` or NaN term
    is left out, and a completion that no function scored gets ``None``.
    """
    out = []
    for row in zip(*per_function, strict=True):
        terms = [w * r for w, r in zip(weights, row) if r is not None and not math.isnan(r)]
        out.append(float(sum(terms)) if terms else None)
    return out


class CombinedReward:
    """A reward function: the weighted sum of several, computed the way TRL's ``reward_weights`` sums them.

    ``r = sum_i w_i * r_i`` over the rewards that apply (TRL's ``nansum``); ``None`` when none
    applies. ``GRPOTrainer(reward_funcs=[f, g], args=GRPOConfig(reward_weights=[wf, wg]))``
    trains on the same total as ``GRPOTrainer(reward_funcs=[combine_rewards([f, g], [wf, wg])])``,
    but logs one curve instead of two. Picklable when its parts are.
    """

    def __init__(self, reward_funcs, weights=None, name: str = "combined_reward"):
        self.reward_funcs = list(reward_funcs)
        self.weights = [1.0] * len(self.reward_funcs) if weights is None else [float(w) for w in weights]
        if not self.reward_funcs or len(self.weights) != len(self.reward_funcs):
            raise ValueError(f"need one weight per reward function, got {len(self.weights)} weights "
                             f"for {len(self.reward_funcs)} functions")
        if not all(math.isfinite(w) for w in self.weights):
            raise ValueError(f"weights must be finite, got {self.weights}")
        self.__name__ = name
        ranges = [getattr(fn, "value_range", None) for fn in self.reward_funcs]
        if all(r is not None for r in ranges):
            # 0 is in every term's range too: a reward that returns None contributes nothing.
            self.value_range = (
                sum(min(0.0, w * lo, w * hi) for w, (lo, hi) in zip(self.weights, ranges)),
                sum(max(0.0, w * lo, w * hi) for w, (lo, hi) in zip(self.weights, ranges)),
            )

    def __call__(self, completions, **kwargs) -> list[float | None]:
        return weighted_sum([fn(completions=completions, **kwargs) for fn in self.reward_funcs], self.weights)

    def __repr__(self) -> str:
        parts = ", ".join(f"{w:g} * {callable_name(fn)}" for w, fn in zip(self.weights, self.reward_funcs))
        return f"{self.__name__} = {parts}"


def combine_rewards(reward_funcs, weights=None, name: str = "combined_reward") -> CombinedReward:
    """Return one reward function that sums ``reward_funcs`` with ``weights`` (TRL's ``reward_weights``)."""
    return CombinedReward(reward_funcs, weights, name)


def gsm8k_rewards() -> tuple[list, list[float]]:
    """Return the lab's GSM8K rewards and their weights, ready for ``GRPOTrainer`` / ``GRPOConfig``.

    ``accuracy_reward`` (weight 1.0) carries the task; ``format_reward`` (0.5) and
    ``tag_count_reward`` (0.25) shape the format a small model must learn first. The lab's
    choice, not a published recipe: notebook 02 shows how weights move the advantages.
    """
    return [accuracy_reward, format_reward, tag_count_reward], [1.0, 0.5, 0.25]


def score_completions(reward_funcs, completions, **columns) -> dict[str, list]:
    """Return ``{reward name: rewards}`` for ``completions``, calling each function as TRL would."""
    return {callable_name(fn): list(fn(completions=completions, **columns)) for fn in reward_funcs}


def named_rewards(names, weights=None) -> tuple[list, list[float]]:
    """Return ``(reward_funcs, reward_weights)`` for reward names: ``"gsm8k"`` (:func:`gsm8k_rewards`,
    with its weights) or ``X`` for ``X_reward`` of this module (weight 1.0). ``weights``, when given,
    replace them all and must have one value per function. Raises ``ValueError`` naming what to use.
    """
    known = {n.removesuffix("_reward"): globals()[n] for n in __all__ if n.endswith("_reward")}
    funcs, chosen = [], []
    for name in names:
        if name == "gsm8k":
            more, more_weights = gsm8k_rewards()
            funcs += more
            chosen += more_weights
        elif name in known or callable(name):  # a name, or your own function as GRPOTrainer takes it
            funcs.append(known[name] if isinstance(name, str) else name)
            chosen.append(1.0)
        else:
            raise ValueError(f"unknown reward {name!r}: use 'gsm8k' or any of {', '.join(sorted(known))}.")
    if not funcs:
        raise ValueError("rewards is empty: use rewards=('gsm8k',).")
    if weights is not None:
        weights = list(weights)
        if len(weights) != len(funcs):
            raise ValueError(f"reward_weights has {len(weights)} values for {len(funcs)} reward "
                             f"functions ({', '.join(f.__name__ for f in funcs)}).")
        bad = [w for w in weights if not isinstance(w, (int, float)) or isinstance(w, bool) or not math.isfinite(w)]
        if bad:
            raise ValueError(f"reward_weights must be finite numbers, not {bad}.")
        chosen = [float(w) for w in weights]
    return funcs, chosen
