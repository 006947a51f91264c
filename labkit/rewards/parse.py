"""Reading what a model wrote: answers, numbers (plain, with units, LaTeX) and countdown expressions.

The first of the three parts of :mod:`labkit.rewards` (introduced in ``02_reward_functions.ipynb``):
:func:`extract_answer` (strict: the ``<answer>`` tag) and :func:`extract_last_number` (lenient),
:func:`parse_number` and :func:`answers_match` (exact, over fractions), and
:func:`evaluate_expression`, a whitelisted AST walk that never calls ``eval``.

A plain answer (``1,200``, ``$12``, ``3/4``, ``12 apples``, ``\\boxed{18}``, ``\\frac{3}{4}``) is read here,
exactly and cheaply; LaTeX arithmetic beyond that (``\\frac{\\sqrt{16}}{2}``, ``6 \\times 3``) is read by
math-verify, as TRL's ``accuracy_reward`` reads answers, and its value compared exactly here.

Everything here is bounded: tags are found with ``str.find``, the lenient number search reads
backwards from the end in one pass, and the number patterns and parsers only ever see answers of
at most ``MAX_ANSWER_CHARS`` characters, so no input can make them backtrack catastrophically;
math-verify only sees short LaTeX arithmetic without powers, symbols or deep nesting.
"""
from __future__ import annotations

import ast
import functools
import math
import operator
import re
import sys
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "THINK_OPEN", "THINK_CLOSE", "ANSWER_OPEN", "ANSWER_CLOSE", "FORMAT_TAGS",
    "MAX_ANSWER_CHARS", "MAX_EXPRESSION_CHARS", "MAX_MAGNITUDE", "UNIT_WORDS",
    "completion_text", "extract_answer", "extract_last_number", "extract_stated_answer", "parse_number",
    "answers_match",
    "evaluate_expression", "clear_parse_caches",
]

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
FORMAT_TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

# An <answer> longer than this is not "one number": it is refused before any parser sees it,
# which is what bounds the cost of every regular expression and parser below.
MAX_ANSWER_CHARS = 200
MAX_EXPRESSION_CHARS = 200  # countdown expressions
MAX_MAGNITUDE = 10**12  # countdown: any intermediate numerator or denominator beyond this is refused
_REL_TOL = 1e-9  # only used when a LaTeX answer is irrational (\sqrt{2}); numbers compare exactly


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
    start, end = text.find(ANSWER_OPEN), text.find(ANSWER_CLOSE)
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


_STATED_WINDOW = 40  # characters after "answer is" or "=" in which the stated number must start
_ANSWER_PHRASE = re.compile(r"answer\s*(?:is|:|=)", re.IGNORECASE)
_WINDOW_NUMBER = re.compile(r"[-\u2212]?\$?\d{1,3}(?:,\d{3})+(?:\.\d+)?|[-\u2212]?\$?\d+(?:\.\d+)?")
_HEDGE = re.compile(r"\s*(?:or|to|/)\s*[-\u2212]?\$?\d", re.IGNORECASE)


def _number_after(text: str, start: int) -> str | None:
    window = text[start:start + _STATED_WINDOW]
    match = _WINDOW_NUMBER.search(window)
    if match is None:
        return None
    if _HEDGE.match(window, match.end()):  # "6 or 7", "6 to 7", "6/7": not one stated number
        return ""
    return match.group(0).replace(",", "").replace("$", "").replace("\u2212", "-")


def extract_stated_answer(text) -> str | None:
    """Return the number a free-text reply *states* as its answer, or ``None``.

    For replies without the lab's tags (a small instruct model answering a word problem in a
    sentence). Read in this order, the first rule that applies decides:

    1. an ``<answer>`` tag: :func:`extract_answer`'s strict reading;
    2. the last ``"answer is N"`` (or ``"answer: N"``): ``N``;
    3. the last ``=``: the number right after it, the result of the last equation
       (``"There are 5 x 2 = 10 apples in Emma's 5 bags."`` states 10, not 5);
    4. otherwise the last number (:func:`extract_last_number`); an equation left without its
       result (``"7 x 4 = "``, a reply cut off) states none.

    Rules 2 and 3 look at most ``_STATED_WINDOW`` characters on; a hedge there (``"6 or 7"``,
    ``"6/7"``) states no answer. So the reward pays the answer a reply gives, not any number it
    mentions on the way: ``"Mia has 7 + 5 = 13 stickers, not 12."`` states 13. Linear time.
    """
    if not isinstance(text, str):
        text = completion_text(text)
    if ANSWER_OPEN in text or ANSWER_CLOSE in text:
        return extract_answer(text)
    for phrase in reversed(list(_ANSWER_PHRASE.finditer(text))):
        number = _number_after(text, phrase.end())
        if number is not None:
            return number or None
    equals = text.rfind("=")
    if equals >= 0:
        number = _number_after(text, equals + 1)
        if number is not None:
            return number or None
        if _FIRST_DIGIT.search(text, equals + 1) is None:  # "7 x 4 = " and no number after: no result stated
            return None
    return extract_last_number(text)


# ----------------------------------------------------------------------------- numbers


@dataclass(frozen=True)
class _Number:
    value: Fraction | float  # Fraction whenever exact; float only for irrational LaTeX (\sqrt{2})
    percent: bool = False


_FORMATTING_COMMANDS = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_SIMPLE_FRAC = re.compile(r"\\[dtc]?frac\s*\{\s*([-+]?[\d.,]+)\s*\}\s*\{\s*([-+]?[\d.,]+)\s*\}")
_SHORT_FRAC = re.compile(r"\\[dtc]?frac\s*(\d)\s*(\d)(?!\d)")
_SPACING = re.compile(r"\\[,!;: ]|~")
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


# Trailing words an answer may carry. A closed list of units of measure and money, plus counted things
# ("18 apples", "18 eggs per day"): any plain word that is not in _NOT_A_UNIT. _NOT_A_UNIT holds what
# turns "42" into something other than one number: arithmetic, hedges, comparisons, verbs, negations
# and number words ("42 minus one", "42 or forty-three", "42 is wrong", "42 times ten").
UNIT_WORDS = frozenset("""
    dollar dollars cent cents euro euros pound pounds yen rupee rupees usd
    percent per cent
    mm cm m km ft yd mi inch inches foot feet yard yards mile miles meter meters metre metres
    centimeter centimeters centimetre centimetres millimeter millimeters kilometer kilometers kilometres
    mg g kg lb lbs oz ton tons tonnes gram grams kilogram kilograms ounce ounces
    ml l liter liters litre litres gallon gallons quart quarts pint pints cup cups
    s sec secs second seconds min mins minute minutes h hr hrs hour hours day days week weeks month months
    year years decade decades
    mph kph km/h m/s ft/s sq square cubic degrees degree °c °f
""".split())
_NOT_A_UNIT = frozenset("""
    plus minus times divided over multiplied add added subtract subtracted sum difference product quotient
    squared cubed power root of
    or and nor either neither not no never but if else otherwise unless except than versus vs
    is are was were be been am equals equal equals makes gives give would could should might may maybe perhaps
    probably possibly approximately approx about around roughly nearly almost circa some
    wrong right correct incorrect true false sure unsure guess estimate
    more less fewer greater smaller larger bigger lower higher least most at to from between till until
    up down off by with without
    zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen
    seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred hundreds thousand
    thousands million millions billion billions trillion dozen dozens half halves quarter quarters third thirds
    once twice thrice
    answer answers final result total
""".split())


def _is_unit(unit: str) -> bool:
    """Return whether the words after a number name what it counts, not more arithmetic or a hedge."""
    words = unit.rstrip(".").removeprefix("per cent").removeprefix("percent").split()  # "18 dollars.", "50 percent"
    for i, word in enumerate(words):
        if word == "per":  # "eggs per day": joins two words
            if i == 0 or i == len(words) - 1:
                return False
        elif word not in UNIT_WORDS and (word in _NOT_A_UNIT or not word.isalpha()):
            return False
    return True


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
    if unit and not _is_unit(unit):
        return None  # "42 minus one", "42 or forty-three", "42 is wrong": not one number
    percent = bool(g["percent"]) or unit.startswith(("percent", "per cent"))
    return _Number(-value if negative else value, percent)


# LaTeX that is more than one plain number (\sqrt{2}, 6 \times 3, \frac{\sqrt{16}}{2}) is read by math-verify,
# the maths-equivalence library TRL's accuracy_reward calls (trl/rewards/accuracy_rewards.py), but only LaTeX
# arithmetic that stays cheap reaches it: numbers, + - * /, ( ) { }, the commands below, and nesting at most
# _MAX_LATEX_DEPTH deep, in at most MAX_ANSWER_CHARS characters. So no power (9^{9^{9}}), factorial, symbol
# or set reaches sympy, and no parse can run long: math-verify's own timeout (signal.alarm) is not used.
_LATEX_COMMAND = re.compile(r"\\(?:[a-zA-Z]+|.)")
_LATEX_ALLOWED = {"\\frac", "\\dfrac", "\\tfrac", "\\cfrac", "\\sqrt", "\\cdot", "\\times", "\\div"}
_LATEX_REST = re.compile(r"[0-9.+\-*/(){}\s]*")  # what may remain once the allowed commands are set aside
_MAX_LATEX_DEPTH = 20  # the depth labkit's own LaTeX reader allowed before math-verify read LaTeX
# Readings this lab refuses and latex2sympy would not: two numbers side by side ("1 2", "1.5.5", "18.", "(3) 4",
# "\sqrt{4} 5"); a number before a \frac that is not a plain mixed number (7\frac{1}{2} is read before this;
# 2\frac{3}{2} is not one number) or before a brace group (2{3}); and \frac or \sqrt without braces beyond
# \frac12 (read before this): latex2sympy reads \frac121 as 1/21, TeX as \frac{1}{2}1.
_LATEX_REFUSED = re.compile(
    r"\d\s+[\d.]|\.\d*\.|\.(?!\d)|[)}]\s*[\d.]|[\d)}]\s*\\[dtc]?frac|[\d)]\s*\{|\\(?:[dtc]?frac|sqrt)(?!\s*\{)")
# Two brace groups side by side are a \frac's arguments, or not one number ({2}{3}, which latex2sympy reads as 5).
_GROUPS_SIDE_BY_SIDE, _FRAC = re.compile(r"\}\s*\{"), re.compile(r"\\[dtc]?frac")
# latex2sympy reads an integer followed by a positive rational as a mixed number, so 2(3) and (2)(3) would read
# 5: the product is written out (2 \cdot (3)) before math-verify sees it.
_IMPLICIT_PRODUCT = re.compile(r"(?<=[\d)}])\s*\(")


def _latex_depth_ok(text: str) -> bool:
    depth = 0
    for char in text:  # at most MAX_ANSWER_CHARS steps
        depth += 1 if char in "({" else -1 if char in ")}" else 0
        if depth > _MAX_LATEX_DEPTH or depth < 0:
            return False
    return depth == 0


@functools.lru_cache(maxsize=1)
def _math_verify():
    """Import math-verify on first use (it imports sympy: a second or so), quieting its one-off warning."""
    import logging

    import sympy
    from math_verify import LatexExtractionConfig, parse

    # parsing_timeout=None (below) makes math-verify warn once that the caller bounds the work: this module
    # does, as TRL does off the main thread (trl/rewards/accuracy_rewards.py, lines 72-81).
    logging.getLogger("math_verify.parser").setLevel(logging.ERROR)
    # LaTeX extraction only: math-verify's ExprExtractionConfig hands text to sympy's parse_expr, which calls eval.
    return sympy, parse, [LatexExtractionConfig()]


def _sympy_value(expr, sympy) -> Fraction | float | None:
    """Return a Fraction for a rational value, a float for a real irrational one, None for anything else."""
    if not isinstance(expr, sympy.Expr) or expr.free_symbols or expr.has(sympy.zoo, sympy.nan, sympy.oo):
        return None  # a division by zero anywhere (1/(3/0) would simplify to 0)
    # latex2sympy reads "0.1" as a sympy Float of the digits written: back to the exact decimal.
    expr = expr.xreplace({f: sympy.Rational(str(f)) for f in expr.atoms(sympy.Float)}).doit()
    if expr.is_Rational:
        return Fraction(int(expr.p), int(expr.q))
    if expr.is_real is not True:  # complex (\sqrt{-4}), infinite (\frac{1}{0}), undefined (\frac{0}{0})
        return None
    value = float(expr)
    return value if math.isfinite(value) else None


def _parse_latex(text: str) -> _Number | None:
    """Read a LaTeX answer (``\\frac{\\sqrt{16}}{2}``, ``6 \\times 3``) with math-verify; None unless one number.

    Called as TRL calls it off the main thread, ``parsing_timeout=None``: math-verify's timeout uses
    ``signal.alarm`` (``math_verify/utils.py``, lines 50-67), which raises outside the main thread
    (``math_verify/parser.py``, lines 709-713); the checks above bound the work instead. ``"0 + "`` in front
    keeps latex2sympy from weighing a leading ``(`` or ``{`` as a tuple, interval or set (that costs it tenths
    of a second, and ``{2}`` alone reads as a set).
    """
    text = text.strip()
    percent = text.endswith("%")
    if percent:
        text = text[:-1].rstrip()
    rest = _LATEX_COMMAND.sub(lambda m: " " if m.group(0) in _LATEX_ALLOWED else "\0", text)
    if not rest.strip() or not _LATEX_REST.fullmatch(rest) or _LATEX_REFUSED.search(text) \
            or not _latex_depth_ok(rest) or len(_GROUPS_SIDE_BY_SIDE.findall(text)) > len(_FRAC.findall(text)):
        return None
    sympy, parse, config = _math_verify()
    latex = _IMPLICIT_PRODUCT.sub(r" \\cdot (", text)
    parsed = parse(f"$0 + {latex}$", extraction_config=config, fallback_mode="no_fallback",
                   extraction_mode="first_match", parsing_timeout=None)
    value = _sympy_value(parsed[0], sympy) if len(parsed) == 1 else None
    return None if value is None else _Number(value, percent)


@functools.lru_cache(maxsize=4096)
def _parse_bounded(text: str) -> _Number | None:
    text = _unwrap_boxed(_strip_math_delimiters(text))
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


def parse_answer(text) -> _Number | None:
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
    ``"3/4"``, ``"7 1/2"``, ``"\\boxed{18}"``, ``"\\frac{3}{4}"``, ``"$\\dfrac{15}{2}$"``, and LaTeX
    arithmetic such as ``"\\frac{\\sqrt{16}}{2}"`` (with math-verify). Refuses hedges (``"42 or 43"``,
    two ``\\boxed``), expressions in plain text, and anything longer than ``MAX_ANSWER_CHARS``.
    Returns a ``Fraction`` (exact) or, for an irrational LaTeX answer, a float.
    """
    number = parse_answer(text)
    return None if number is None else number.value


def numbers_equal(a, b) -> bool:
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return a == b
    if any(isinstance(x, Fraction) and x.denominator == 1 for x in (a, b)):
        return False  # a float here is irrational (\sqrt{...}): never equal to a whole number, however close
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
    p, g = parse_answer(pred), parse_answer(gold)
    if p is None or g is None:
        return False
    return any(numbers_equal(a, b) for a in _candidates(p) for b in _candidates(g))


# ----------------------------------------------------------------------------- countdown expressions


class _Refused(Exception):
    """Raised inside the countdown evaluator when an input is refused (it then returns None)."""


_BINARY_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate_with_literals(expression, *, allow_power: bool, max_exponent: int, max_magnitude: int):
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
    result = evaluate_with_literals(expression, allow_power=allow_power, max_exponent=max_exponent, max_magnitude=max_magnitude)
    return None if result is None else result[0]


def clear_parse_caches() -> None:
    """Forget every parsed answer, here and in math-verify and sympy once loaded (the benchmark times cold calls)."""
    _parse_bounded.cache_clear()
    if "math_verify.parser" in sys.modules:
        from math_verify import parser
        from sympy.core.cache import clear_cache

        parser.parse_latex_cached.cache_clear()
        parser.parse_expr_cached.cache_clear()
        clear_cache()

