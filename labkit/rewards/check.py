"""Checking a reward function before it meets a trainer: awkward completions and adversarial inputs.

The third part of :mod:`labkit.rewards` (introduced in ``02_reward_functions.ipynb``):
:func:`check_reward_function` calls a reward the way TRL does, on :data:`AWKWARD_COMPLETIONS`
(what models actually write, and what adversaries write), plain and conversational, and reports
what breaks; :func:`adversarial_inputs` are the 100k-character inputs ``python -m bench
rewards`` times every reward on.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field

from labkit.rewards.functions import callable_name

__all__ = ["AWKWARD_COMPLETIONS", "RewardCheck", "check_reward_function", "adversarial_inputs", "LATEX_ANSWERS",
           "trl_kwargs", "task_errors"]


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


def trl_kwargs(texts, conversational: bool, columns: dict) -> dict:
    """Return the keyword arguments TRL passes a reward for ``texts`` (plain or conversational), with ``columns``."""
    n = len(texts)
    prompt = [{"role": "user", "content": "What is 1 + 3?"}] if conversational else "What is 1 + 3?"
    kwargs = {key: [value] * n for key, value in columns.items()}
    kwargs.update(
        prompts=[prompt] * n,
        completions=[[{"role": "assistant", "content": t}] for t in texts] if conversational else list(texts),
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
    check = RewardCheck(name=callable_name(fn))
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
            return list(values)
        except Exception as exc:  # noqa: BLE001
            problem(f"{where}: returned {type(values).__name__}, not a list ({exc})")
            return None

    for conversational in (False, True):
        fmt = "conversational" if conversational else "plain"
        batch_values = None
        try:
            batch_values = validate(fn(**trl_kwargs(texts, conversational, columns)), f"{fmt} batch")
        except Exception as exc:  # noqa: BLE001  the point is to report it
            problem(f"raised {type(exc).__name__} on a {fmt} batch: {str(exc)[:120]}")
        if batch_values is not None and len(batch_values) != len(texts):
            problem(f"returned {len(batch_values)} rewards for {len(texts)} {fmt} completions")
            batch_values = None
        single = []
        for label, text in battery:
            start = time.perf_counter()
            try:
                values = validate(fn(**trl_kwargs([text], conversational, columns)), f"{fmt} {label!r}")
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
                problem(f"returned {value!r} ({type(value).__name__}) on {label!r}: "
                        "rewards must be Python floats (or None)")
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


# Short LaTeX answers that make the LaTeX path (math-verify, behind labkit's checks) work hardest; timed padded
# to 100k characters, and alone against math-verify for reference. All within MAX_ANSWER_CHARS; "near-miss"
# is refused by the checks (a symbol) before math-verify sees it.
LATEX_ANSWERS = {
    "square roots": "\\frac{\\sqrt{999999999999}}{\\sqrt{444444444444}}",
    "nested \\sqrt": "\\sqrt{\\sqrt{\\sqrt{\\sqrt{999999999999}}}}",
    "nested \\frac": "\\frac{1}{\\frac{2}{\\frac{3}{\\frac{4}{999999999999}}}}",
    "products": " \\times ".join(["99999"] * 15),
    "mixed operators": "(12 + 34) \\times (56 - 78) \\div \\sqrt{16} \\cdot 9",
    "mixed number": "7\\frac{1}{2}",
    "near-miss": "\\frac{" * 15 + "1" + "}{2}" * 14 + "}{x}",
    "deepest nesting": "\\frac{1}{" * 19 + "2" + "}" * 19,  # 19 levels, 191 characters
    "large square root": "\\sqrt{" + "9" * 190 + "}",  # sympy looks for square factors
}


def adversarial_inputs(n_chars: int = 100_000) -> dict[str, str]:
    """Return ``{name: text}``: completions of about ``n_chars`` built to make parsers slow.

    Repeated and nested tags, long digit and separator runs, unclosed braces, hedges, unicode
    digits, and short answers built to be the worst case of each bounded parser, padded with
    reasoning to ``n_chars``. Used by ``python -m bench rewards`` and the tests.
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


def task_errors(dataset, rewards) -> list[str]:
    """Return what stops ``GRPOTrainer`` from training on your ``dataset`` with ``rewards`` (names or functions),
    found before any model loads: no ``prompt`` column, no rows, or a reward that raises or does not return one
    number (or None) per completion when called as TRL calls it (trl/trainer/grpo_trainer.py 1579-1636): on the
    dataset's first two rows, each with an empty and a short reply, and its other columns."""
    from labkit.rewards.functions import named_rewards

    columns = getattr(dataset, "column_names", None)
    if columns is None:
        return [f"task must be a task's name or a datasets.Dataset, not a {type(dataset).__name__}."]
    if "prompt" not in columns:
        return [f"your dataset has no 'prompt' column (its columns: {', '.join(columns) or 'none'}): GRPOTrainer "
                f"reads the prompts from it. Rename yours: dataset.rename_column({(columns or ['question'])[0]!r}, 'prompt')."]
    if len(dataset) == 0:
        return ["your dataset has no rows: give it at least one prompt per generation batch."]
    try:
        funcs, _ = named_rewards(rewards)
    except ValueError:  # an unknown name: the recipe's reward check says which
        return []
    rows = [dataset[i] for i in range(min(2, len(dataset)))] * 2  # two replies to each of the first rows
    replies = [""] * (len(rows) // 2) + ["42"] * (len(rows) // 2)
    conversational = isinstance(rows[0]["prompt"], list)
    kwargs = {key: [row[key] for row in rows] for key in columns if key != "prompt"}
    kwargs.update(trl_kwargs(replies, conversational, {}), prompts=[row["prompt"] for row in rows])
    errors = []
    for fn in funcs:
        name = callable_name(fn)
        try:
            values = list(fn(**kwargs))
        except Exception as exc:  # noqa: BLE001  the point is to report it, before a model loads
            errors.append(f"reward {name} raised {type(exc).__name__} ({str(exc)[:120]}) when called as TRL calls it "
                          f"on your dataset's first rows (columns: {', '.join(sorted(kwargs))}).")
            continue
        if len(values) != len(rows):
            errors.append(f"reward {name} returned {len(values)} rewards for {len(rows)} completions: return one "
                          "number (or None) per completion, in order.")
        elif bad := [v for v in values if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                                             or not math.isfinite(v))]:  # as check_reward_function
            errors.append(f"reward {name} returned {bad[0]!r} ({type(bad[0]).__name__}): each reward must be a "
                          "finite number, or None to abstain.")
    return errors
