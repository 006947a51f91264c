"""Verifiable reward functions with TRL's calling convention, robust to anything a model writes.

Introduced in ``02_reward_functions.ipynb``. The training notebooks hand them to TRL's
``GRPOTrainer(reward_funcs=[...], args=GRPOConfig(reward_weights=[...]))``, and
``labkit.evaluate`` scores answers with :func:`extract_answer` (strict) and
:func:`extract_last_number` (lenient).

TRL calls every reward function the same way::

    rewards = reward_func(prompts=prompts, completions=completions, completion_ids=completion_ids,
                          answer=answer, trainer_state=..., log_extra=..., log_metric=...)

``completions`` holds plain strings or conversational messages
(``[{"role": "assistant", "content": "..."}]``); every dataset column arrives as a keyword
argument with one value per completion (GSM8K's gold number is the ``answer`` column). A
reward returns one ``float`` per completion, inside the range its docstring gives and its
``value_range`` attribute holds, or ``None`` where it does not apply (TRL skips those).
TRL logs each one as ``rewards/<__name__>/mean``.

Three promises, each checked by ``tests/test_rewards.py`` and ``python -m labkit bench rewards``:

- robust: any text (arbitrary unicode, 100k characters) gives a finite float in range, never
  an exception;
- fast: nothing here can backtrack catastrophically: tags are found with ``str.find``, the
  lenient number search reads backwards from the end in one pass, and the number patterns and
  parsers only ever see answers of at most ``MAX_ANSWER_CHARS`` characters. The worst time per
  call on adversarial 100k-character inputs is recorded in ``results/rewards_bench.json``;
- safe: model output never reaches ``eval``/``exec``. Countdown expressions and LaTeX answers
  are read by small parsers of our own (a whitelisted AST walk; a recursive-descent LaTeX reader),
  with bounded sizes.

On math-verify: it is the maintained maths-equivalence library, and the tests use it as the
oracle that our reading of LaTeX answers must agree with. The rewards do not call it. Its
timeout uses ``signal.alarm``, which raises off the main thread (where TRL may score). With the
timeout disabled it is safe to call, but the benchmark, timing it cold on the same LaTeX answers
next to labkit's reader (``math_verify_reference`` in ``results/rewards_bench.json``), found it
tens of times slower, and over the 50 ms budget the first time its grammar met a structure.
"""
from __future__ import annotations

import ast
import functools
import math
import operator
import re
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

__all__ = [
    "THINK_OPEN", "THINK_CLOSE", "ANSWER_OPEN", "ANSWER_CLOSE", "FORMAT_TAGS",
    "MAX_ANSWER_CHARS", "MAX_EXPRESSION_CHARS",
    # reading completions and answers
    "completion_text", "extract_answer", "extract_last_number", "parse_number", "answers_match",
    "evaluate_expression",
    # reward functions
    "format_reward", "soft_format_reward", "tag_count_reward", "accuracy_reward", "int_answer_reward",
    "expression_reward", "overlong_penalty", "OverlongPenalty",
    # combining and checking
    "combine_rewards", "CombinedReward", "gsm8k_rewards", "score_completions",
    "check_reward_function", "RewardCheck", "AWKWARD_COMPLETIONS",
    # benchmark
    "adversarial_inputs", "bench_cli",
]

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
FORMAT_TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

# An <answer> longer than this is not "one number": it is refused before any parser sees it,
# which is what bounds the cost of every regular expression and parser below.
MAX_ANSWER_CHARS = 200
MAX_EXPRESSION_CHARS = 200  # countdown expressions
MAX_MAGNITUDE = 10**12  # countdown: any intermediate numerator or denominator beyond this is refused
_REL_TOL = 1e-9  # only used when a LaTeX answer is irrational (\sqrt{2}); numbers compare exactly


def _value_range(low: float, high: float):
    """Decorator: record a reward's documented range as ``fn.value_range`` (read by the checker)."""

    def mark(fn):
        fn.value_range = (float(low), float(high))
        return fn

    return mark


# ----------------------------------------------------------------------------- reading completions


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):  # multimodal style: [{"type": "text", "text": "..."}]
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def completion_text(completion) -> str:
    """Return the text of one completion, plain (``"..."``) or conversational (``[{"role": "assistant", ...}]``).

    A conversational completion joins the contents of its assistant messages with newlines
    (TRL's tool-calling completions can hold several). Anything else (``None``, a number) reads
    as empty text, so that a reward never raises on an odd completion.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)):
        texts = [_content_text(m.get("content")) for m in completion
                 if isinstance(m, dict) and m.get("role", "assistant") == "assistant"]
        return "\n".join(t for t in texts if t)
    return ""


def extract_answer(text) -> str | None:
    """Return the stripped content of the one ``<answer>...</answer>`` after the reasoning, or ``None``.

    Strict on purpose; each rule refuses a reward hack:

    - only text after the last ``</think>`` counts: an answer inside ``<think>`` is a draft, and
      a ``<think>`` that is never closed means the model never finished thinking;
    - exactly one ``<answer>`` and one ``</answer>``, in that order: two answers are a hedge;
    - an empty answer is no answer.

    Accepts a string or a completion in either format. Linear time (``str.find``) on any input.
    """
    if not isinstance(text, str):
        text = completion_text(text)
    close = text.rfind(THINK_CLOSE)
    if close >= 0:
        text = text[close + len(THINK_CLOSE):]
    if text.count(ANSWER_OPEN) != 1 or text.count(ANSWER_CLOSE) != 1:
        return None
    start = text.find(ANSWER_OPEN)
    end = text.find(ANSWER_CLOSE)
    if end < start or THINK_OPEN in text[:start]:  # the answer sits inside a <think> never closed
        return None
    answer = text[start + len(ANSWER_OPEN):end].strip()
    return answer or None


# Read backwards from the end of the text: the first match in the reversed string is the last
# number of the original, found in time proportional to the distance from the end (a pattern
# that starts with a character class lets the regex engine skip ahead quickly).
_FIRST_DIGIT = re.compile(r"\d")
# A number read backwards: [digits "."] then digits grouped by three with commas, or plain digits.
_NUMBER_REVERSED = re.compile(r"(?:\d+\.)?(?:(?:\d{3},)+\d{1,3}(?!\d)|\d+)")


def extract_last_number(text) -> str | None:
    """Return the last number anywhere in the text (lenient scoring), normalised, or ``None``.

    ``"... so she pays $1,200.50."`` -> ``"1200.50"``; ``"3-4"`` -> ``"4"``; ``"x = -4"`` -> ``"-4"``.
    Thousands separators are dropped when they group digits by three; otherwise a comma
    separates numbers (``"1,2,3"`` -> ``"3"``). Integers and decimals only (no fractions). A minus
    sign counts unless it follows a word character or a closing bracket. Used by
    ``labkit.evaluate`` for lenient accuracy; compare with :func:`answers_match`.
    """
    if not isinstance(text, str):
        text = completion_text(text)
    reversed_text = text[::-1]
    first = _FIRST_DIGIT.search(reversed_text)
    if first is None:
        return None
    match = _NUMBER_REVERSED.match(reversed_text, first.start())
    number, end = match.group(0)[::-1].replace(",", ""), match.end()
    after = reversed_text[end:end + 2]  # the two characters before the number, nearest first
    if "." not in number and after[:1] == "." and not after[1:2].isdigit():  # ".5"
        number, end = "0." + number, end + 1
        after = reversed_text[end:end + 2]
    glued = len(after) > 1 and (after[1].isalnum() or after[1] in "_)]")
    return f"-{number}" if after[:1] in ("-", "\u2212") and not glued else number


# ----------------------------------------------------------------------------- numbers


@dataclass(frozen=True)
class _Number:
    value: Fraction | float  # Fraction whenever exact; float only for irrational LaTeX (\sqrt{2})
    percent: bool = False


_FORMATTING_COMMANDS = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_SIMPLE_FRAC = re.compile(r"\\[dtc]?frac\s*\{\s*([-+]?[\d.,]+)\s*\}\s*\{\s*([-+]?[\d.,]+)\s*\}")
_SHORT_FRAC = re.compile(r"\\[dtc]?frac\s*(\d)\s*(\d)(?!\d)")
_SPACING = re.compile(r"\\[,!;: ]|~")
_LATEX_COMMAND = re.compile(r"\\(?:[a-zA-Z]+|.)")
_LATEX_ALLOWED = {"\\frac", "\\dfrac", "\\tfrac", "\\cfrac", "\\sqrt", "\\cdot", "\\times", "\\div"}
# Plain-text answers: one number (an integer, a decimal, a fraction or a mixed number), with an
# optional sign, currency symbol, percent sign, trailing unit words and full stop. Whitespace is
# collapsed to single spaces first, and the answer is at most MAX_ANSWER_CHARS long, so this
# pattern cannot backtrack for long.
_PLAIN_NUMBER = re.compile(
    r"""
    (?P<sign>[-+\u2212]?)\ ?(?P<currency>[$€£¥₹])?\ ?(?P<sign2>[-+\u2212]?)\ ?
    (?:
        (?P<whole>\d+)\ (?P<mnum>\d+)\ ?/\ ?(?P<mden>\d+)                      # mixed number: 7 1/2
      | (?P<num>\d+(?:\.\d+)?)\ ?/\ ?(?P<den>\d+(?:\.\d+)?)                  # fraction: 3/4
      | (?P<number>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d*)?|\.\d+)          # 1,200.50 | 18 | 18. | .5
    )
    \ ?(?P<currency2>[$€£¥₹])?
    \ ?(?P<percent>%)?
    (?P<unit>\ ?[^\W\d_][^\s\d]*(?:\ [^\W\d_][^\s\d]*){0,3})?                # dollars | km/h | per hour
    \ ?\.?
    """,
    re.VERBOSE,
)


def _unwrap_boxed(text: str) -> str | None:
    """Return the content of the one ``\\boxed{...}`` in text (text itself if none); None if ambiguous."""
    count = text.count("\\boxed")
    if count == 0:
        return text
    if count > 1:
        return None  # two boxed answers: a hedge
    start = text.find("{", text.find("\\boxed"))
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):  # at most MAX_ANSWER_CHARS steps
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i]
    return None


def _strip_math_delimiters(text: str) -> str:
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(text) > len(left) + len(right) and text.startswith(left) and text.endswith(right):
            inner = text[len(left):-len(right)]
            if "$" not in inner.replace("\\$", ""):
                return inner.strip()
    return text


def _parse_plain(text: str) -> _Number | None:
    match = _PLAIN_NUMBER.fullmatch(text)
    if match is None:
        return None
    g = match.groupdict()
    if g["currency"] and g["currency2"]:
        return None
    negative = (g["sign"] in ("-", "\u2212")) != (g["sign2"] in ("-", "\u2212"))
    if g["number"] is not None:
        value = Fraction(g["number"].replace(",", "").rstrip("."))
    elif g["num"] is not None:
        denominator = Fraction(g["den"])
        if denominator == 0:
            return None
        value = Fraction(g["num"]) / denominator
    else:
        numerator, denominator = int(g["mnum"]), int(g["mden"])
        if denominator == 0 or numerator >= denominator:
            return None  # "7 15/2" is not a mixed number
        value = int(g["whole"]) + Fraction(numerator, denominator)
    unit = (g["unit"] or "").strip().lower()
    percent = bool(g["percent"]) or unit.startswith(("percent", "per cent"))
    return _Number(-value if negative else value, percent)


class _Refused(Exception):
    """Raised inside the readers and the evaluator when an input is refused (they then return None)."""


_LATEX_TOKEN = re.compile(r"\s*(?:(\\[a-zA-Z]+)|(\d+(?:\.\d+)?|\.\d+)|([-+*/(){}%]))")
_LATEX_PRODUCT = {"*": operator.mul, "\\times": operator.mul, "\\cdot": operator.mul, "/": operator.truediv,
                  "\\div": operator.truediv}


class _LatexReader:
    """Recursive-descent reader of the LaTeX arithmetic a final answer may hold, evaluated exactly.

    Grammar (numbers, ``+ - * /``, ``\\times \\cdot \\div``, ``( )``, ``{ }``, ``\\frac{a}{b}``
    with ``\\dfrac``/``\\tfrac``/``\\cfrac``, ``\\sqrt{a}``, a mixed number ``7\\frac{1}{2}``,
    implicit products ``2\\sqrt{2}``); anything else is refused. Values are ``Fraction``s, or
    floats once an irrational square root appears.
    """

    def __init__(self, text: str):
        self.tokens, position = [], 0
        while position < len(text):
            match = _LATEX_TOKEN.match(text, position)
            if match is None:
                if text[position:].strip():
                    raise _Refused(f"unexpected {text[position]!r}")
                break
            self.tokens.append(next(t for t in match.groups() if t is not None))
            position = match.end()
        self.position, self.depth = 0, 0

    def peek(self):
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self, expected=None):
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _Refused(f"expected {expected!r}, got {token!r}")
        self.position += 1
        return token

    def read(self):
        value = self.expression()
        if self.peek() is not None:
            raise _Refused(f"unexpected {self.peek()!r}")
        return value

    def expression(self):
        self.depth += 1
        if self.depth > 20:
            raise _Refused("too deep")
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        self.depth -= 1
        return value

    def term(self):
        value = self.factor()
        while True:
            token = self.peek()
            if token in _LATEX_PRODUCT:
                self.take()
                right = self.factor()
                if token in ("/", "\\div") and right == 0:
                    raise _Refused("division by zero")
                value = _LATEX_PRODUCT[token](value, right)
            elif token in ("(", "\\sqrt"):  # implicit product: 2(3 + 4), 2\sqrt{2}
                value = value * self.factor()
            else:
                return value

    def factor(self):
        if self.peek() in ("+", "-"):
            return -self.factor() if self.take() == "-" else self.factor()
        token = self.take()
        if token in ("(", "{"):
            value = self.expression()
            self.take(")" if token == "(" else "}")
            return value
        if token in ("\\frac", "\\dfrac", "\\tfrac", "\\cfrac"):
            numerator, denominator = self.group(), self.group()
            if denominator == 0:
                raise _Refused("division by zero")
            return numerator / denominator
        if token == "\\sqrt":
            return _exact_sqrt(self.group())
        if token[0].isdigit() or token[0] == ".":
            value = Fraction(token)
            if self.peek() in ("\\frac", "\\dfrac", "\\tfrac") and value.denominator == 1:  # 7\frac{1}{2}
                self.take()
                numerator, denominator = self.group(), self.group()
                if not (isinstance(numerator, Fraction) and isinstance(denominator, Fraction)
                        and 0 <= numerator < denominator):
                    raise _Refused("not a mixed number")
                return value + numerator / denominator
            return value
        raise _Refused(f"unexpected {token!r}")

    def group(self):
        self.take("{")
        value = self.expression()
        self.take("}")
        return value


def _exact_sqrt(value):
    if value < 0:
        raise _Refused("square root of a negative number")
    if isinstance(value, Fraction):
        top, bottom = math.isqrt(value.numerator), math.isqrt(value.denominator)
        if top * top == value.numerator and bottom * bottom == value.denominator:
            return Fraction(top, bottom)
    return math.sqrt(value)


def _parse_latex(text: str) -> _Number | None:
    """Read a LaTeX answer (``\\frac{\\sqrt{16}}{2}``, ``2\\sqrt{2}``, ``6 \\times 3``) exactly; None unless one number.

    math-verify (latex2sympy + sympy) reads the same answers, and the tests check that both
    agree; it is not called here because it is tens of times slower on unseen answers
    (see the module docstring and ``python -m labkit bench rewards``).
    """
    text = text.strip()
    percent = text.endswith("%")
    if percent:
        text = text[:-1]
    commands = _LATEX_COMMAND.findall(text)
    if any(c not in _LATEX_ALLOWED for c in commands):
        return None
    value = _LatexReader(text).read()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return _Number(value, percent)


@functools.lru_cache(maxsize=4096)
def _parse_bounded(text: str) -> _Number | None:
    text = _strip_math_delimiters(text)
    text = _unwrap_boxed(text)
    if text is None:
        return None
    text = _strip_math_delimiters(text.strip())
    text = _FORMATTING_COMMANDS.sub(r" \1 ", text)
    text = text.replace("{,}", ",").replace("\\$", "$").replace("\\%", "%").replace("\\left", "").replace("\\right", "")
    text = _SPACING.sub(lambda m: "" if m.group(0) in ("\\,", "\\!") else " ", text)
    plain = _SHORT_FRAC.sub(r" \1/\2 ", _SIMPLE_FRAC.sub(r" \1/\2 ", text))
    if "\\" not in plain:  # fast path: one plain number, possibly after \frac{3}{4} -> 3/4
        number = _parse_plain(" ".join(plain.replace("{", " ").replace("}", " ").split()))
        if number is not None or "\\" not in text:
            return number
    return _parse_latex(text)


def _parse(text) -> _Number | None:
    if isinstance(text, bool) or text is None:
        return None
    if isinstance(text, (int, Fraction)):
        return _Number(Fraction(text))
    if isinstance(text, float):
        return _Number(Fraction(text)) if math.isfinite(text) else None
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not text or len(text) > MAX_ANSWER_CHARS:
        return None
    try:
        return _parse_bounded(text)
    except Exception:  # noqa: BLE001  a parser bug must cost one answer, never a training run
        return None


def parse_number(text) -> Fraction | float | None:
    """Return the number an answer states, or ``None`` when it is not exactly one number.

    Reads ``"1,200"``, ``"$1,200.00"``, ``"18 dollars."``, ``"18.0"``, ``"50%"`` (-> 50),
    ``"3/4"``, ``"7 1/2"``, ``"\\boxed{18}"``, ``"\\frac{3}{4}"``, ``"$\\dfrac{15}{2}$"``. Refuses
    hedges (``"42 or 43"``, two ``\\boxed``), expressions in plain text, and anything longer than
    ``MAX_ANSWER_CHARS``. Returns a ``Fraction`` (exact) or, for an irrational LaTeX answer, a float.
    """
    number = _parse(text)
    return None if number is None else number.value


def _numbers_equal(a, b) -> bool:
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return a == b
    try:
        return math.isclose(float(a), float(b), rel_tol=_REL_TOL, abs_tol=1e-12)
    except OverflowError:
        return False


def _candidates(number: _Number):
    return (number.value, number.value / 100) if number.percent else (number.value,)


def answers_match(pred, gold) -> bool:
    """Return whether answer ``pred`` states the same number as ``gold``: numerically, not as text.

    ``answers_match("$1,200.00", "1200")``, ``("18.0", "18")``, ``("18 dollars.", "18")``,
    ``("\\boxed{18}", "18")`` and ``("3/4", "0.75")`` are all ``True``. A percentage matches
    either its number or its fraction (``"50%"`` matches ``"50"`` and ``"0.5"``).
    ``("42 or 43", "42")`` is ``False``: an answer is one number. See :func:`parse_number`.
    """
    p, g = _parse(pred), _parse(gold)
    if p is None or g is None:
        return False
    return any(_numbers_equal(a, b) for a in _candidates(p) for b in _candidates(g))


# ----------------------------------------------------------------------------- countdown expressions


_BINARY_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _evaluate(expression, *, allow_power: bool, max_exponent: int, max_magnitude: int):
    """Return (value, integer literals used) of an arithmetic expression, or None. Never runs code."""
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        return None
    expression = expression.strip().replace("×", "*").replace("÷", "/").replace("\u2212", "-")
    try:
        tree = ast.parse(expression, mode="eval")  # parsing builds a tree; nothing is executed
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None
    literals: list[int] = []

    def bounded(value: Fraction) -> Fraction:
        if abs(value.numerator) > max_magnitude or value.denominator > max_magnitude:
            raise _Refused("too large")
        return value

    def visit(node) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:  # not bool, float, str, ...
            literals.append(node.value)
            return bounded(Fraction(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            value = visit(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
            left, right = visit(node.left), visit(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise _Refused("division by zero")
            return bounded(_BINARY_OPS[type(node.op)](left, right))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and allow_power:
            base, exponent = visit(node.left), visit(node.right)
            # Checked before computing: 9**9**9**9 stops here at 9**387420489, having computed nothing big.
            if exponent.denominator != 1 or abs(exponent) > max_exponent or (base == 0 and exponent < 0):
                raise _Refused("exponent out of bounds")
            return bounded(base ** int(exponent))
        raise _Refused(type(node).__name__)  # names, calls, attributes, comparisons, ...

    try:
        return visit(tree.body), literals
    except (_Refused, RecursionError, ZeroDivisionError, OverflowError, MemoryError):
        return None


def evaluate_expression(expression, *, allow_power: bool = False, max_exponent: int = 8,
                        max_magnitude: int = MAX_MAGNITUDE) -> Fraction | None:
    """Return the exact value of an arithmetic expression written by a model, or ``None``.

    The text is parsed with ``ast.parse`` (which builds a tree and runs nothing) and evaluated by
    walking the tree; only integer literals, ``+ - * /``, unary signs and parentheses are
    accepted (``**`` too with ``allow_power``, with ``|exponent| <= max_exponent``). Every
    intermediate value is an exact ``Fraction`` whose numerator and denominator stay within
    ``max_magnitude``; the expression is at most ``MAX_EXPRESSION_CHARS`` long. So
    ``__import__('os').system(...)`` is refused (a call) and ``9**9**9**9`` is refused before
    anything big is computed. Introduced in ``02_reward_functions.ipynb``.
    """
    result = _evaluate(expression, allow_power=allow_power, max_exponent=max_exponent, max_magnitude=max_magnitude)
    return None if result is None else result[0]


# ----------------------------------------------------------------------------- reward functions


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
    out = []
    for completion in completions:
        text = completion_text(completion)
        out.append(0.25 * sum(text.count(tag) == 1 for tag in FORMAT_TAGS))
    return out


@_value_range(0.0, 1.0)
def accuracy_reward(completions, answer, **kwargs) -> list[float | None]:
    """Return 1.0 per completion whose ``<answer>`` states the gold number, 0.0 otherwise, None if no gold.

    ``answer`` is the dataset column with the gold number (GSM8K: ``"72"``). The answer is read
    with :func:`extract_answer` (the one ``<answer>`` after ``</think>``) and compared with
    :func:`answers_match` (numerically: ``"$1,200.00"`` equals ``"1200"``). A gold value that is
    not a number gives ``None``: TRL then ignores this reward for that completion. Range {0, 1}.
    """
    out = []
    for completion, gold in zip(completions, answer, strict=True):
        if _parse(gold) is None:
            out.append(None)
            continue
        out.append(1.0 if answers_match(extract_answer(completion), gold) else 0.0)
    return out


@_value_range(0.0, 1.0)
def int_answer_reward(completions, **kwargs) -> list[float]:
    """Return 1.0 per completion whose ``<answer>`` is one whole number (``"18"``, ``"1,200"``), else 0.0.

    Every GSM8K answer is a whole number, so this pays for answering in the right shape before
    the value is right: a small shaping reward, like :func:`tag_count_reward`. Range {0, 1}.
    """
    out = []
    for completion in completions:
        number = _parse(extract_answer(completion))
        whole = number is not None and not number.percent and (
            number.value.denominator == 1 if isinstance(number.value, Fraction) else float(number.value).is_integer())
        out.append(1.0 if whole else 0.0)
    return out


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
        goal = _parse(goal)
        if goal is None or goal.percent or not isinstance(available, (list, tuple)) \
                or not all(type(n) is int for n in available):
            out.append(None)
            continue
        expression = extract_answer(completion)
        result = None if expression is None else _evaluate(expression.split("=", 1)[0], allow_power=False,
                                                           max_exponent=0, max_magnitude=MAX_MAGNITUDE)
        correct = (result is not None and Counter(result[1]) == Counter(available)
                   and _numbers_equal(result[0], goal.value))
        out.append(1.0 if correct else 0.0)
    return out


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


# ----------------------------------------------------------------------------- combining rewards


def _callable_name(fn) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


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
        columns = [fn(completions=completions, **kwargs) for fn in self.reward_funcs]
        out = []
        for row in zip(*columns, strict=True):
            terms = [w * r for w, r in zip(self.weights, row) if r is not None and not math.isnan(r)]
            out.append(float(sum(terms)) if terms else None)
        return out

    def __repr__(self) -> str:
        parts = ", ".join(f"{w:g} * {_callable_name(fn)}" for w, fn in zip(self.weights, self.reward_funcs))
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
    return {_callable_name(fn): list(fn(completions=completions, **columns)) for fn in reward_funcs}


# ----------------------------------------------------------------------------- checking a reward function

# (label, text): what models actually write, and what adversaries write.
AWKWARD_COMPLETIONS = [
    ("correct", "<think>1 + 3 = 4</think>\n<answer>4</answer>"),
    ("wrong", "<think>1 + 3 = 5</think>\n<answer>5</answer>"),
    ("empty", ""),
    ("whitespace only", " \n\t "),
    ("no tags", "The answer is 4."),
    ("answer only inside <think>", "<think>so <answer>4</answer></think>"),
    ("two answer tags", "<think>?</think><answer>4</answer><answer>5</answer>"),
    ("unclosed <think>", "<think>" + "hmm " * 50),
    ("nested tags", "<think><think><answer><answer>4</answer></answer></think></think>"),
    ("hedge", "<think>about</think><answer>4 or 5</answer>"),
    ("nan and inf", "<think>x</think><answer>nan</answer> inf 1e999"),
    ("unicode digits", "<think>٣ + ١ = ٤ 🦆</think><answer>٤</answer>"),
    ("control characters", "\x00<think>\x1b[31m</think><answer>4\x00</answer>\ud800"),
    ("latex", "<think>x</think><answer>\\boxed{\\frac{8}{2}}</answer>"),
    ("code injection", "<think>x</think><answer>__import__('os').system('echo hacked')</answer>"),
    ("power tower", "<think>x</think><answer>9**9**9**9</answer>"),
    ("long digit run", "<think>x</think><answer>" + "9" * 100_000 + "</answer>"),
    ("repeated tags", "<answer></answer>" * 6_000),
    ("giant output", "<think>" + "let me think again. " * 5_000 + "</think><answer>4</answer>"),
]
_DEFAULT_COLUMNS = {"answer": "4", "target": 4, "nums": [1, 3]}


def _noop(*args, **kwargs):
    return None


def _as_conversational(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def _trl_kwargs(texts, conversational: bool, columns: dict) -> dict:
    n = len(texts)
    prompt = [{"role": "user", "content": "What is 1 + 3?"}] if conversational else "What is 1 + 3?"
    kwargs = {key: [value] * n for key, value in columns.items()}
    kwargs.update(
        prompts=[prompt] * n,
        completions=[_as_conversational(t) for t in texts] if conversational else list(texts),
        completion_ids=[list(t.encode("utf-8", "surrogatepass")) for t in texts],  # byte-level "tokens"
        trainer_state=None,
        log_extra=_noop,
        log_metric=_noop,
    )
    return kwargs


@dataclass
class RewardCheck:
    """What :func:`check_reward_function` found: ``ok`` when ``problems`` is empty."""

    name: str
    problems: list[str] = field(default_factory=list)
    rewards: list[dict] = field(default_factory=list)  # one row per awkward completion, both formats
    worst_ms: float = 0.0  # slowest single-completion call

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        values = [v for row in self.rewards for k, v in row.items() if k != "completion" and isinstance(v, float)]
        seen = f"rewards seen in [{min(values):g}, {max(values):g}]" if values else "no float reward seen"
        head = f"{self.name}: {'OK' if self.ok else f'{len(self.problems)} problem(s)'} " \
               f"({len(self.rewards)} awkward completions x 2 formats; {seen}; slowest call {self.worst_ms:.1f} ms)"
        shown = [f"  - {p}" for p in self.problems[:10]]
        if len(self.problems) > 10:
            shown.append(f"  ... and {len(self.problems) - 10} more (see .problems)")
        return "\n".join([head] + shown)

    __repr__ = __str__


def _describe_value(value) -> str:
    return f"{value!r} ({type(value).__name__})"


def check_reward_function(fn, value_range=None, *, columns: dict | None = None, completions=None,
                          time_budget_ms: float | None = 50.0) -> RewardCheck:
    """Return a :class:`RewardCheck` of ``fn`` run, as TRL runs it, over a battery of awkward completions.

    Calls ``fn`` on :data:`AWKWARD_COMPLETIONS` (or ``completions``, a list of ``(label, text)``)
    in both formats (plain strings and conversational messages), with TRL's keyword arguments
    (``prompts``, ``completion_ids``, ``trainer_state``, ``log_extra``, ``log_metric``) and the
    dataset ``columns`` (default: ``answer="4"``, ``target=4``, ``nums=[1, 3]``). Reports as problems:

    - a missing ``__name__`` (TRL logs ``rewards/<name>/mean``);
    - raising (and on which completion), returning the wrong number of rewards;
    - a reward that is not a Python ``float`` or ``None`` (ints, bools, numpy scalars, tensors);
    - NaN or infinity; a value outside ``value_range`` (default ``fn.value_range`` when set);
    - ``None`` for every completion (TRL would ignore the function);
    - different rewards for the same text in the two formats, or alone versus in a batch;
    - a single call slower than ``time_budget_ms`` (None: no time check).
    """
    name = _callable_name(fn)
    check = RewardCheck(name=name)
    if not hasattr(fn, "__name__") and not isinstance(fn, functools.partial):
        check.problems.append("has no __name__: TRL would log it as rewards/<class name>/mean; set fn.__name__")
    value_range = value_range if value_range is not None else getattr(fn, "value_range", None)
    columns = dict(_DEFAULT_COLUMNS if columns is None else columns)
    battery = list(AWKWARD_COMPLETIONS if completions is None else completions)
    labels, texts = [label for label, _ in battery], [text for _, text in battery]
    results: dict[str, list] = {}

    def problem(message: str) -> None:
        if message not in check.problems:
            check.problems.append(message)

    def validate(values, where: str) -> list | None:
        try:
            values = list(values)
        except Exception as exc:  # noqa: BLE001
            problem(f"{where}: returned {type(values).__name__}, not a list ({exc})")
            return None
        return values

    for conversational in (False, True):
        fmt = "conversational" if conversational else "plain"
        batch_values = None
        try:
            batch_values = validate(fn(**_trl_kwargs(texts, conversational, columns)), f"{fmt} batch")
        except Exception as exc:  # noqa: BLE001  the point is to report it
            problem(f"raised {type(exc).__name__} on a {fmt} batch: {str(exc)[:120]}")
        if batch_values is not None and len(batch_values) != len(texts):
            problem(f"returned {len(batch_values)} rewards for {len(texts)} {fmt} completions")
            batch_values = None
        single = []
        for label, text in battery:
            start = time.perf_counter()
            try:
                values = validate(fn(**_trl_kwargs([text], conversational, columns)), f"{fmt} {label!r}")
            except Exception as exc:  # noqa: BLE001
                problem(f"raised {type(exc).__name__} on {fmt} completion {label!r}: {str(exc)[:120]}")
                values = None
            elapsed_ms = 1000 * (time.perf_counter() - start)
            check.worst_ms = max(check.worst_ms, elapsed_ms)
            if time_budget_ms is not None and elapsed_ms > time_budget_ms:
                problem(f"took {elapsed_ms:.0f} ms on {fmt} completion {label!r} (budget {time_budget_ms:g} ms)")
            if values is not None and len(values) != 1:
                problem(f"returned {len(values)} rewards for 1 {fmt} completion ({label!r})")
                values = None
            single.append(values[0] if values else _MISSING)
        for i, (label, value) in enumerate(zip(labels, single)):
            if value is _MISSING or value is None:
                continue
            if not isinstance(value, float):
                problem(f"returned {_describe_value(value)} on {label!r}: rewards must be Python floats (or None)")
            elif not math.isfinite(value):
                problem(f"returned {value} on {fmt} completion {label!r}")
            elif value_range is not None and not value_range[0] <= value <= value_range[1]:
                problem(f"returned {value:g} on {fmt} completion {label!r}, outside its range {tuple(value_range)}")
            if batch_values is not None and not _same_reward(batch_values[i], value):
                problem(f"gave {label!r} {batch_values[i]!r} in a batch but {value!r} alone: "
                        "a reward must not depend on the rest of the batch")
        if single and all(v is None for v in single):
            problem(f"returned None for every {fmt} completion: TRL would ignore it")
        results[fmt] = single

    for i, label in enumerate(labels):
        plain, conv = results["plain"][i], results["conversational"][i]
        if plain is not _MISSING and conv is not _MISSING and not _same_reward(plain, conv):
            problem(f"gave {label!r} {plain!r} as a plain string but {conv!r} as a conversational message")
        check.rewards.append({"completion": label,
                              "plain": None if plain is _MISSING else plain,
                              "conversational": None if conv is _MISSING else conv})
    return check


_MISSING = object()


def _same_reward(a, b) -> bool:
    if a is None or b is None:
        return a is b
    try:
        return a == b or (math.isnan(a) and math.isnan(b))
    except TypeError:
        return False


# ----------------------------------------------------------------------------- benchmark


# Short LaTeX answers that make a LaTeX reader work hardest; timed padded to 100k characters,
# and alone against math-verify for reference.
LATEX_ANSWERS = {
    "square roots": "\\frac{\\sqrt{999999999999}}{\\sqrt{444444444444}}",
    "nested \\sqrt": "\\sqrt{\\sqrt{\\sqrt{\\sqrt{999999999999}}}}",
    "nested \\frac": "\\frac{1}{\\frac{2}{\\frac{3}{\\frac{4}{999999999999}}}}",
    "products": " \\times ".join(["99999"] * 15),
    "mixed operators": "(12 + 34) \\times (56 - 78) \\div \\sqrt{16} \\cdot 9",
    "mixed number": "7\\frac{1}{2}",
    "near-miss": "\\frac{" * 15 + "1" + "}{2}" * 14 + "}{x}",
}


def adversarial_inputs(n_chars: int = 100_000) -> dict[str, str]:
    """Return ``{name: text}``: completions of about ``n_chars`` built to make parsers slow.

    Repeated and nested tags, long digit and separator runs, unclosed braces, hedges, unicode
    digits, and short answers built to be the worst case of each bounded parser, padded with
    reasoning to ``n_chars``. Used by ``python -m labkit bench rewards`` and the tests.
    """

    def fill(unit: str, size: int = n_chars) -> str:
        return (unit * (size // len(unit) + 1))[:size]

    def padded(answer: str) -> str:  # a long <think> then the given answer block
        think = "<think>" + fill("so 12 + 3 = 15, then ", max(0, n_chars - len(answer) - 40)) + "</think>"
        return f"{think}\n<answer>{answer}</answer>"

    k = n_chars // 20
    half = n_chars // 2
    return {
        "repeated <think>": fill("<think>"),
        "repeated <answer>": fill("<answer>"),
        "repeated answer blocks": "<think>x</think>" + fill("<answer>4</answer>"),
        "nested tags": ("<think>" * k + "<answer>" * k + "9" + "</answer>" * k + "</think>" * k)[:n_chars],
        "unclosed <think>": "<think>" + fill("and 4 more ", n_chars - 8),
        "digit run": fill("9"),
        "digit run in <answer>": "<think>x</think><answer>" + fill("9", n_chars - 40) + "</answer>",
        "comma-separated digits": fill("1,"),
        "thousands separators in <answer>": "<think>x</think><answer>" + fill("1,000", n_chars - 40) + "</answer>",
        "decimal points": fill("1."),
        "minus signs": fill("-1"),
        "spaces in <answer>": "<think>x</think><answer>-" + " " * (n_chars - 40) + "x</answer>",
        "unit words in <answer>": "<think>x</think><answer>18 " + fill("dollars ", n_chars - 40) + "</answer>",
        "hedge list in <answer>": "<think>x</think><answer>" + fill("1 or ", n_chars - 40) + "</answer>",
        "open braces in <answer>": "<think>x</think><answer>\\boxed{" + fill("{", n_chars - 50) + "</answer>",
        "nested \\frac in <answer>": "<think>x</think><answer>" + "\\frac{1}{" * (2 * k) + "2" + "}" * (2 * k) + "</answer>",
        "parentheses in <answer>": "<think>x</think><answer>" + "(" * half + ")" * half + "</answer>",
        "unicode digits": fill("٣٤ 🦆 "),
        "whitespace": fill(" \n\t"),
        # Short answers at the bound of each parser (padded with reasoning to n_chars).
        "bounded: worst plain number": padded("- $ - " + "1" * 180 + " % x"),
        "bounded: mixed number near-miss": padded("1 " + "2" * 90 + " / " + "3" * 90 + " ("),
        "bounded: unit words near-miss": padded("18 " + " ".join(["dollars"] * 20) + " 1"),
        "bounded: two \\boxed": padded("\\boxed{4} \\boxed{5}"),
        "bounded: code injection": padded("__import__('os').system('true')"),
        "bounded: power tower": padded("9**9**9**9"),
        "bounded: deep parentheses": padded("(" * 99 + "1" + ")" * 99),
        "bounded: long sum": padded("+".join(["1"] * 100)),
        "bounded: huge product": padded("*".join(["999999"] * 28)),
        **{f"bounded: LaTeX {name}": padded(answer) for name, answer in LATEX_ANSWERS.items()},
    }


def _clear_parse_caches() -> None:
    _parse_bounded.cache_clear()


def _math_verify_reference(repeats: int) -> dict:
    """Time math-verify's ``parse`` on :data:`LATEX_ANSWERS` (cold caches), next to labkit's reader."""
    import logging

    from math_verify import LatexExtractionConfig, parse
    from math_verify import parser as mv_parser
    from sympy.core.cache import clear_cache

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled": on purpose here

    def cold_parse(latex):
        clear_cache()
        for name in ("parse_latex_cached", "parse_expr_cached"):
            getattr(getattr(mv_parser, name, None), "cache_clear", lambda: None)()
        return parse(f"${latex}$", extraction_config=[LatexExtractionConfig()], parsing_timeout=None)

    start = time.perf_counter()
    cold_parse("1")  # imports sympy and builds the grammar
    answers = {"import and first parse": {"first_ms": round(1000 * (time.perf_counter() - start), 1)}}
    for name, latex in LATEX_ANSWERS.items():
        times, ours = [], []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            parsed = cold_parse(latex)
            times.append(1000 * (time.perf_counter() - start))
            _clear_parse_caches()
            start = time.perf_counter()
            value = parse_number(latex)
            ours.append(1000 * (time.perf_counter() - start))
        answers[name] = {
            "math_verify_first_ms": round(times[0], 2),  # the first time its grammar meets this structure
            "math_verify_median_ms": round(statistics.median(times[1:]), 2),
            "math_verify_reads": str(parsed[0]) if parsed else None,
            "labkit_median_ms": round(statistics.median(ours[1:]), 3),
            "labkit_reads": None if value is None else str(value),
        }
    return {
        "what": ("math-verify's parse() of the same LaTeX answers, alone (not padded), parsing_timeout=None, "
                 "sympy and math-verify caches cleared before each call; the rewards do not call it"),
        "answers": answers,
    }


def bench_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit bench rewards``: worst time per reward on adversarial inputs -> results/rewards_bench.json.

    Each reward is called on one adversarial completion at a time (plain and conversational),
    ``--repeats`` times with every parse cache cleared before each call; an input's time is
    the median of its repeats, and a reward's figure is its worst input. Exits 1 when a reward
    is over ``--budget-ms``.
    """
    import argparse

    from labkit.bench import results_dir, write_json
    from labkit.lab import provenance

    parser = argparse.ArgumentParser(prog="python -m labkit bench rewards", description=bench_cli.__doc__)
    parser.add_argument("--chars", type=int, default=100_000, help="length of each adversarial input")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per input and format")
    parser.add_argument("--budget-ms", type=float, default=50.0, help="the most one call may take")
    parser.add_argument("--out", default=None, help="output file (default results/rewards_bench.json)")
    parser.add_argument("--no-math-verify", dest="math_verify", action="store_false",
                        help="skip timing math-verify on the same LaTeX answers (for reference)")
    args = parser.parse_args(argv)

    inputs = adversarial_inputs(args.chars)
    overlong = overlong_penalty(max_completion_length=1024, soft_punish_cache=256)
    gsm8k_funcs, gsm8k_weights = gsm8k_rewards()
    candidates = {
        "format_reward": format_reward,
        "soft_format_reward": soft_format_reward,
        "tag_count_reward": tag_count_reward,
        "accuracy_reward": accuracy_reward,
        "int_answer_reward": int_answer_reward,
        "overlong_penalty": overlong,
        "expression_reward": expression_reward,
        "gsm8k combined": combine_rewards(gsm8k_funcs, gsm8k_weights),
        "extract_answer": lambda completions, **kw: [extract_answer(c) for c in completions],
        "extract_last_number": lambda completions, **kw: [extract_last_number(c) for c in completions],
    }
    columns = {"answer": "18", "target": 24, "nums": [3, 8, 1]}

    figures = {}
    for name, fn in candidates.items():
        per_input = {}
        for label, text in inputs.items():
            times = []
            for conversational in (False, True):
                kwargs = _trl_kwargs([text], conversational, columns)
                for _ in range(args.repeats):
                    _clear_parse_caches()
                    start = time.perf_counter()
                    fn(**kwargs)
                    times.append(1000 * (time.perf_counter() - start))
            per_input[label] = (statistics.median(times), max(times))
        worst_label = max(per_input, key=lambda key: per_input[key][0])
        worst_median, _ = per_input[worst_label]
        figures[name] = {
            "worst_ms": round(worst_median, 3),
            "worst_input": worst_label,
            "max_single_call_ms": round(max(t for _, t in per_input.values()), 3),
            "within_budget": worst_median < args.budget_ms,
        }
        print(f"{name:<20} worst {worst_median:8.3f} ms  ({worst_label})")

    reference = _math_verify_reference(args.repeats) if args.math_verify else None

    record = {
        "benchmark": "rewards",
        "command": "python -m labkit bench rewards " + " ".join(argv or []),
        "budget_ms": args.budget_ms,
        "input_chars": args.chars,
        "repeats": args.repeats,
        "statistic": ("per reward: the worst input's median time of one call on one completion, over "
                      f"{args.repeats} repeats x 2 formats, parse caches cleared before every call"),
        "inputs": sorted(inputs),
        "rewards": figures,
        "all_within_budget": all(f["within_budget"] for f in figures.values()),
        "math_verify_reference": reference,
        "provenance": provenance(),
    }
    path = write_json(Path(args.out) if args.out else results_dir() / "rewards_bench.json", record)
    print(f"{'all within' if record['all_within_budget'] else 'NOT all within'} {args.budget_ms:g} ms; wrote {path}")
    return 0 if record["all_within_budget"] else 1


if __name__ == "__main__":
    sys.exit(bench_cli())
