"""Exercises on reward functions: a strict answer extractor and a reward in TRL's calling convention (notebook 02).

References: :func:`labkit.rewards.extract_answer` and :func:`labkit.rewards.accuracy_reward`; the reward's
cases are called the way TRL 1.16's ``GRPOTrainer`` calls a reward (keyword arguments ``prompts``,
``completions``, ``completion_ids``, every dataset column, ``trainer_state``, ``log_extra``,
``log_metric``), in both completion formats, including :mod:`labkit.rewards.check`'s awkward and
adversarial completions. Solutions: ``docs/solutions/02_reward_functions.md``.
"""
from __future__ import annotations

import re

from labkit import rewards
from labkit.exercises import Case, Exercise, register
from labkit.exercises.compare import default_compare, short_repr
from labkit.rewards.check import AWKWARD_COMPLETIONS, trl_kwargs

__all__ = ["EXTRACT_ANSWER", "ACCURACY_REWARD"]

_SOLUTIONS_02 = "docs/solutions/02_reward_functions.md"


# --------------------------------------------------------------------------- a strict extractor (02, section 2)

_EXTRACT_TEXTS = {
    "a well-formed completion": "<think>16 - 3 - 4 = 9, 9 * 2 = 18</think>\n<answer>18</answer>",
    "spaces around the answer": "<think>ok</think><answer>  18 \n</answer>",
    "a draft answer inside <think>": "<think>draft: <answer>17</answer>... no, 18</think>\n<answer>18</answer>",
    "the only answer inside <think>": "<think>so the answer is <answer>18</answer></think>",
    "two answer tags (a hedge)": "<think>hmm</think><answer>18</answer><answer>19</answer>",
    "no tags at all": "Janet makes 9 * 2 = $18 a day.",
    "an empty answer": "<think>no idea</think><answer> </answer>",
    "a <think> never closed": "<think>still thinking <answer>18</answer>",
    "a closing tag before the opening one": "<think>x</think></answer>18<answer>",
    "no reasoning, one answer": "<answer>42</answer>",
    "a conversational completion": [{"role": "assistant", "content": "<think>x</think><answer>7</answer>"}],
}


def _extract_cases() -> list[Case]:
    return [Case(f"{label}: {short_repr(text, 90)}", (text,)) for label, text in _EXTRACT_TEXTS.items()]


def _text(text):
    return text if isinstance(text, str) else rewards.completion_text(text)


def _greedy(text):
    m = re.search(r"<answer>(.*)</answer>", _text(text), re.S)
    return m.group(1).strip() or None if m else None


def _first_tag(text):
    m = re.search(r"<answer>(.*?)</answer>", _text(text), re.S)
    return m.group(1).strip() or None if m else None


def _after_think(text) -> str:
    t = _text(text)
    return t[t.rfind("</think>") + 8:] if "</think>" in t else t


def _tagged(t: str) -> str | None:
    """The raw text between the one <answer> and the one </answer> of t, in that order; None otherwise."""
    if t.count("<answer>") != 1 or t.count("</answer>") != 1 or t.find("</answer>") < t.find("<answer>"):
        return None
    return t[t.find("<answer>") + 8:t.find("</answer>")]


def _ignores_think(text):
    return (_tagged(_text(text)) or "").strip() or None


def _open_think_allowed(text):
    # Every rule but one: an answer after a <think> that is never closed is read as the answer.
    return (_tagged(_after_think(text)) or "").strip() or None


def _no_strip(text):
    return None if rewards.extract_answer(text) is None else _tagged(_after_think(text))


def _empty_string(text):
    t = _after_think(text)
    answer = _tagged(t)
    return None if answer is None or "<think>" in t[:t.find("<answer>")] else answer.strip()


EXTRACT_ANSWER = register(Exercise(
    name="extract_answer",
    reference=rewards.extract_answer,
    cases=_extract_cases,
    mistakes={
        "a greedy regex <answer>(.*)</answer> spans from the first tag to the last: two answers must give None":
            _greedy,
        "the first <answer> tag wins: a completion with two answers (or a draft inside <think>) is a hedge "
        "unless only the text after the last </think> is read, and it must hold exactly one <answer>": _first_tag,
        "the answer inside <think> counts: only the text after the last </think> holds the answer": _ignores_think,
        "a <think> that is never closed is not checked: with no </think> the model never finished thinking, so an "
        "<answer> after an opening <think> is still reasoning and must give None": _open_think_allowed,
        "the answer is not stripped: '  18 \\n' must read '18'": _no_strip,
        "an empty answer gives '': it must give None (no answer)": _empty_string,
    },
    nudge="only the text after the last </think> counts, and it must hold exactly one <answer>...</answer>; "
          "anything ambiguous is None.",
    hint="Accept a string or a conversational completion (labkit.rewards.completion_text). Keep only the text "
         "after the last '</think>' (str.rfind); it must hold exactly one '<answer>' and one '</answer>', in that "
         "order, with no '<think>' before the answer; return the stripped content, or None if empty. Use str.find, "
         "not a regex (linear time on any input).",
    solution=f"{_SOLUTIONS_02}#exercise-extract_answer",
    reference_name="labkit.rewards.extract_answer",
))


# --------------------------------------------------------------------------- a reward in TRL's convention (02, section 2)


def _reward_compare(expected, got) -> str | None:
    if not isinstance(got, list):
        return f"returned {type(got).__name__}: a reward function returns a list, one reward per completion"
    if len(got) != len(expected):
        return f"returned {len(got)} rewards for {len(expected)} completions"
    for i, (e, g) in enumerate(zip(expected, got)):
        if e is None or g is None:
            if e is not g:
                return f"completion {i}: expected {e!r}, got {g!r}"
        elif isinstance(e, float) and not isinstance(g, float):
            return f"completion {i}: returned {g!r} ({type(g).__name__}); TRL needs Python floats (or None)"
    return default_compare(expected, got)  # torch.testing.assert_close: None beside None, floats by value


_GOLD = "18"
_MIXED = [
    "<think>9 * 2 = 18</think>\n<answer>18</answer>",
    "<think>9 * 2 = 18</think>\n<answer>$18.00</answer>",
    "<think>x</think><answer>1,200</answer>",
    "<think>x</think><answer>8</answer>",
    "<think>x</think><answer>118</answer>",
    "<think>draft <answer>18</answer></think><answer>17</answer>",
    "<think>x</think><answer>17</answer><answer>18</answer>",
    "The answer is 18.",
]


def _kwargs(texts, conversational, golds) -> dict:
    # What TRL passes (labkit.rewards.check.trl_kwargs), with one gold answer per completion.
    return {**trl_kwargs(texts, conversational, columns={}), "answer": list(golds)}


def _reward_cases() -> list[Case]:
    golds = [_GOLD] * len(_MIXED)
    golds[2] = "1200"
    awkward = [text for _, text in AWKWARD_COMPLETIONS]
    return [
        Case("8 plain completions, gold 18 (1200 for the third), with every keyword TRL passes",
             kwargs=_kwargs(_MIXED, False, golds)),
        Case("the same 8 as conversational messages [{'role': 'assistant', 'content': ...}]",
             kwargs=_kwargs(_MIXED, True, golds)),
        Case("a gold that is not a number ('n/a'): the reward does not apply (None)",
             kwargs=_kwargs(_MIXED[:2], True, ["n/a", "18"])),
        Case(f"labkit.rewards.check's {len(awkward)} awkward and adversarial completions (empty, 100k characters, "
             "nested tags, code...), gold 4",
             kwargs=_kwargs(awkward, False, ["4"] * len(awkward))),
    ]


def _reward_from(read, cast=float):
    def reward(completions, answer, **kwargs):
        return [None if rewards.parse_number(gold) is None else cast(read(completion, gold))
                for completion, gold in zip(completions, answer)]
    return reward


ACCURACY_REWARD = register(Exercise(
    name="accuracy_reward",
    reference=rewards.accuracy_reward,
    cases=_reward_cases,
    mistakes={
        "answers compared as strings: '$18.00' and '1,200' are right answers; compare numbers with "
        "labkit.rewards.answers_match": _reward_from(
            lambda c, gold: rewards.extract_answer(c) == gold),
        "a substring test pays '118' and '8' for the gold 18: compare numbers with labkit.rewards.answers_match":
            _reward_from(lambda c, gold: (rewards.extract_answer(c) or "").find(gold) >= 0
                         or gold.find(rewards.extract_answer(c) or "#") >= 0),
        "conversational completions are not read: they arrive as [{'role': 'assistant', 'content': ...}]; "
        "take the text with labkit.rewards.completion_text": _reward_from(
            lambda c, gold: isinstance(c, str) and rewards.answers_match(rewards.extract_answer(c), gold)),
        "rewards are ints or bools: TRL needs Python floats (1.0 / 0.0)": _reward_from(
            lambda c, gold: rewards.answers_match(rewards.extract_answer(c), gold), cast=int),
        "a gold that is not a number gets 0.0: return None there, so TRL leaves this reward out for that completion":
            lambda completions, answer, **kw: [
                1.0 if rewards.answers_match(rewards.extract_answer(c), g) else 0.0
                for c, g in zip(completions, answer)],
    },
    nudge="one Python float per completion, in order: read the answer with labkit.rewards' extractor and "
          "compare as numbers; a gold that is no number gives None.",
    hint="def f(completions, answer, **kwargs): one float per completion. Read each with "
         "labkit.rewards.extract_answer (it accepts both formats); None when labkit.rewards.parse_number(gold) is "
         "None; else 1.0 if labkit.rewards.answers_match(answer_read, gold) else 0.0. Keep **kwargs: TRL also "
         "passes prompts, completion_ids, trainer_state, log_extra, log_metric and every dataset column.",
    solution=f"{_SOLUTIONS_02}#exercise-accuracy_reward",
    reference_name="labkit.rewards.accuracy_reward",
    compare=_reward_compare,
))
