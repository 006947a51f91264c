"""Coded exercises: the learner writes a function, a check runs it beside the reference and says what is wrong.

A notebook cell holds a stub the learner fills in, then hands it to :func:`check`::

    def group_advantages(rewards, num_generations):
        # YOUR CODE HERE: ...
        raise NotImplementedError

    group_advantages = labkit.exercises.check("group_advantages", group_advantages)

:func:`check` runs the function on every case of the exercise and compares it with the
reference (labkit's or TRL's own function). It returns the function the rest of the notebook
should use:

- the learner's function, when every case passes (it prints a one-line verdict);
- the reference, when the stub still raises ``NotImplementedError`` (it says so, and why), so a
  notebook run with every stub unfilled still runs end to end (CI runs it that way);
- nothing: it raises :class:`ExerciseFailed` when a case fails, with the case, where the first value
  differs (its index, the expected and the returned value there, and a short rounded view of the row
  around it) and a diagnosis. The diagnosis names a *known mistake* only when that mistake
  gives the learner's output on **every** case of the exercise (each exercise lists its plausible
  wrong answers: the std without Bessel's correction, a missing clip side, the KL the wrong way
  round...); a mistake that merely agrees on the failing case would name the wrong bug. Otherwise
  it is about this case alone: a generic reason (shape, sign, a constant factor, NaN) or, for
  answers that are not numbers, what was expected and what came back.

Help comes in two steps, so that a hint does not give the answer away: a failing check ends with a
one-line **nudge** (``Exercise.nudge``); the next failing check of the same exercise (or
``hint(name, level=2)`` at any time) adds the fuller hint (``Exercise.hint``, close to the solution)
and the worked solution's place in ``docs/solutions``.

A cell further down that calls the learner's function again takes it from :func:`checked`, which
gives the function whose check passed, or the reference (saying which exercise to fix) when the
check failed, so a wrong answer left in place fails at its own check and nowhere else.

The known mistakes double as the exercise's own tests: ``tests/test_exercises.py`` checks that the
reference passes and that every listed mistake fails with its own message.
Exercises are registered by the submodules of this package, one per notebook concept.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

__all__ = ["Case", "Exercise", "ExerciseFailed", "register", "exercise", "names", "check", "checked", "hint",
           "verify", "diagnose"]

# Submodules that register exercises (one per notebook concept); imported on first use.
_SUBMODULES: tuple[str, ...] = ("objective", "rewards", "nano", "memory", "tools")

_REGISTRY: dict[str, "Exercise"] = {}

# What the last check of each exercise left for later cells, name -> ("passed" | "failed" | "unfilled", function),
# and how many checks of it have failed since it last passed (the second failure shows the fuller hint).
_IN_USE: dict[str, tuple[str, Callable]] = {}
_FAILURES: dict[str, int] = {}


@dataclass
class Case:
    """One input of an exercise: positional and keyword arguments, and a label the verdict shows."""

    label: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass
class Exercise:
    """An exercise: its reference answer, the cases it is checked on, the plausible mistakes it recognises.

    ``mistakes`` maps a message (what the learner got wrong, in one sentence) to a function that makes
    exactly that mistake. ``nudge`` is the first hint (one line, no code), ``hint`` the second (the
    recipe). ``compare(expected, got)`` returns ``None`` when they agree, else a short description of
    the difference; the default compares tensors, numbers and nested sequences.
    """

    name: str
    reference: Callable
    cases: Callable[[], list[Case]]
    mistakes: dict[str, Callable] = field(default_factory=dict)
    hint: str = ""  # the fuller hint, close to the solution: shown from the second failing check on
    nudge: str = ""  # one line that points the way without the answer: shown by the first failing check
    solution: str = ""  # where the worked solution is: docs/solutions/<notebook>.md#<anchor>
    reference_name: str = ""  # e.g. "labkit.objective.group_advantages", shown when the stub is unfilled
    compare: Callable[[Any, Any], str | None] | None = None
    # turns what the learner writes into the function the cases call (a class into one that plays a script on
    # an instance of it: labkit.exercises.tools); None: the learner writes that function itself
    adapt: Callable[[Callable], Callable] | None = None

    def runs(self, fn: Callable) -> Callable:
        """Return the function the cases call for the learner's answer ``fn`` (``fn`` itself unless ``adapt``)."""
        return fn if self.adapt is None else self.adapt(fn)

    def differs(self, expected, got) -> str | None:
        """Return ``None`` when ``got`` matches ``expected``, else what differs."""
        return (self.compare or _default_compare)(expected, got)


class ExerciseFailed(AssertionError):
    """A learner's answer failed a case; the message says which case, what was expected and what is wrong."""

    def _render_traceback_(self):  # IPython shows this instead of a traceback: the verdict, not our stack
        return ["\x1b[31m✗ " + str(self) + "\x1b[0m"]


def register(ex: Exercise) -> Exercise:
    """Add ``ex`` to the registry (a second exercise with the same name is a bug) and return it."""
    if ex.name in _REGISTRY and _REGISTRY[ex.name] is not ex:
        raise ValueError(f"exercise {ex.name!r} is registered twice")
    _REGISTRY[ex.name] = ex
    return ex


def _load_all() -> None:
    for module in _SUBMODULES:
        importlib.import_module(f"{__name__}.{module}")


def names() -> list[str]:
    """Return the names of every registered exercise."""
    _load_all()
    return sorted(_REGISTRY)


def exercise(name: str) -> Exercise:
    """Return the registered exercise ``name`` (``KeyError`` lists the known names)."""
    _load_all()
    if name not in _REGISTRY:
        raise KeyError(f"no exercise named {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def _short(value, limit: int = 160) -> str:
    text = repr(value)
    if isinstance(value, torch.Tensor):
        text = f"tensor{tuple(value.shape)} {value.detach().flatten()[:8].tolist()}" + (
            " ..." if value.numel() > 8 else "")
    return text if len(text) <= limit else text[:limit] + " ..."


def _as_float_list(x):
    if isinstance(x, torch.Tensor):
        return [float(v) for v in x.detach().double().flatten().tolist()], tuple(x.shape)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return [float(x)], ()
    if isinstance(x, (list, tuple)) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x):
        return [float(v) for v in x], (len(x),)
    return None, None


def _default_compare(expected, got, rtol: float = 1e-4, atol: float = 1e-5) -> str | None:
    e_vals, e_shape = _as_float_list(expected)
    if e_vals is None:
        return None if expected == got else f"expected {_short(expected)}, got {_short(got)}"
    g_vals, g_shape = _as_float_list(got)
    if g_vals is None:
        return f"expected a number or tensor like {_short(expected)}, got {type(got).__name__} {_short(got)}"
    if e_shape != g_shape and not (len(e_vals) == len(g_vals) == 1):
        return f"shape {g_shape} where {e_shape} was expected"
    if any(math.isnan(v) for v in g_vals) and not any(math.isnan(v) for v in e_vals):
        return "the result has NaN where the reference has none (a division by zero? a log of 0?)"
    if all(math.isclose(g, e, rel_tol=rtol, abs_tol=atol) or (math.isnan(g) and math.isnan(e))
           for g, e in zip(g_vals, e_vals)):
        return None
    return "values differ"


_PREVIEW = 8  # values shown of a row around the first difference


def _flat_numbers(x):
    """Return ``(values, shape, whole)`` for a tensor, a number or a flat list of numbers, else ``None``.

    ``whole`` says the values are integers to show exactly (an int tensor, a Python int), not to round.
    """
    if isinstance(x, torch.Tensor):
        return x.detach().double().flatten().tolist(), tuple(x.shape), not x.is_floating_point()
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return [float(x)], (), isinstance(x, int)
    if isinstance(x, (list, tuple)) and x and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x):
        return [float(v) for v in x], (len(x),), all(isinstance(v, int) for v in x)
    return None


def _close(e: float, g: float, rtol: float = 1e-4, atol: float = 1e-5) -> bool:
    return math.isclose(g, e, rel_tol=rtol, abs_tol=atol) or (math.isnan(g) and math.isnan(e))


def _digits(e: float, g: float) -> int:
    """Return the fewest significant digits (4 or more) that show ``e`` and ``g`` as different numbers."""
    for digits in range(4, 12):
        if f"{e:.{digits}g}" != f"{g:.{digits}g}":
            return digits
    return 12


def _number(v: float, whole: bool, digits: int) -> str:
    return str(int(v)) if whole and v.is_integer() else f"{v:.{digits}g}"


def _unravel(flat: int, shape: tuple) -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return index[::-1]


def _row(values: list, shape: tuple, flat: int, whole: bool, digits: int) -> str:
    """Return the row (last dimension) that holds ``values[flat]``, rounded, at most ``_PREVIEW`` values around it."""
    if len(shape) > 1:
        width = shape[-1]
        start = flat - flat % width
        values, flat = values[start:start + width], flat % width
    first = max(0, min(flat - _PREVIEW // 2 + 1, len(values) - _PREVIEW))
    shown = ", ".join(_number(v, whole, digits) for v in values[first:first + _PREVIEW])
    return ("[" + ("..., " if first > 0 else "") + shown
            + (", ..." if first + _PREVIEW < len(values) else "") + "]")


def _where(shape: tuple, flat: int) -> str:
    """Return ``"row [i, j]: "`` for a tensor of two or more dimensions (the row the view shows), else ``""``."""
    return f"row {_unravel(flat, shape)[:-1]}: " if len(shape) > 1 else ""


def _show_difference(expected, got) -> str:
    """Return the lines that show where ``got`` first differs from ``expected``, short and rounded.

    Numbers and tensors: the index of the first differing value with the shape, both values there (with
    as many digits as it takes to tell them apart), and the row around it, rounded. Sequences and dicts:
    the first position or key that differs. Anything else: both values, abbreviated.
    """
    e, g = _flat_numbers(expected), _flat_numbers(got)
    if e is not None and g is not None:
        (e_vals, e_shape, e_whole), (g_vals, g_shape, g_whole) = e, g
        whole = e_whole and g_whole
        if len(e_vals) == len(g_vals) == 1 and (e_shape == g_shape or not e_shape or not g_shape):  # scalars
            digits = _digits(e_vals[0], g_vals[0])
            return (f"  expected {_number(e_vals[0], whole, digits)}\n"
                    f"  got      {_number(g_vals[0], whole, digits)}\n")
        if e_shape != g_shape:
            return (f"  expected shape {e_shape}: {_row(e_vals, e_shape, 0, whole, 4)}\n"
                    f"  got      shape {g_shape}: {_row(g_vals, g_shape, 0, whole, 4)}\n")
        first = next((i for i, (a, b) in enumerate(zip(e_vals, g_vals)) if not _close(a, b)), None)
        if first is None:  # the values agree (what differs is not a value: a gradient, a type)
            return (f"  expected {_row(e_vals, e_shape, 0, whole, 4)}\n"
                    f"  got      {_row(g_vals, g_shape, 0, whole, 4)} (the same values)\n")
        digits = _digits(e_vals[first], g_vals[first])
        return (f"  first difference at {_unravel(first, e_shape)} (shape {e_shape}): expected "
                f"{_number(e_vals[first], whole, digits)}, got {_number(g_vals[first], whole, digits)}\n"
                f"  expected {_where(e_shape, first)}{_row(e_vals, e_shape, first, whole, digits)}\n"
                f"  got      {_where(e_shape, first)}{_row(g_vals, g_shape, first, whole, digits)}\n")
    where = ""
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)) and len(expected) == len(got):
        first = next((i for i, (a, b) in enumerate(zip(expected, got)) if _default_compare(a, b) is not None), None)
        if first is not None:
            where = (f"  first difference at [{first}] (length {len(expected)}): "
                     f"expected {_short(expected[first], 60)}, got {_short(got[first], 60)}\n")
    elif isinstance(expected, dict) and isinstance(got, dict):
        first = next((k for k in expected if k not in got or _default_compare(expected[k], got[k]) is not None), None)
        if first is not None:
            where = (f"  first difference at [{first!r}]: expected {_short(expected[first], 60)}, "
                     f"got {_short(got.get(first, '(no such key)'), 60)}\n")
    return where + f"  expected {_short(expected)}\n  got      {_short(got)}\n"


_RAISED = object()  # stands for "this call raised" when two functions are compared case by case


def _outputs(fn: Callable, cases: list[Case]) -> list:
    outputs = []
    for case in cases:
        try:
            outputs.append(fn(*case.args, **case.kwargs))
        except Exception:
            outputs.append(_RAISED)
    return outputs


def _same_outputs(ex: Exercise, ours: list, theirs: list) -> bool:
    return all((a is _RAISED) == (b is _RAISED) and (a is _RAISED or ex.differs(a, b) is None)
               for a, b in zip(ours, theirs))


def diagnose(ex: Exercise, case: Case, expected, got, fn: Callable | None = None) -> str:
    """Return why ``got`` is wrong on ``case``: a known mistake's message if it matches, else a generic reason.

    A known mistake is named only when it reproduces ``got`` on ``case`` and, given the learner's
    ``fn``, ``fn``'s output on every other case of the exercise too (a mistake that agrees on one
    case only is a coincidence: naming it would send the learner after the wrong bug).
    """
    cases = learner = None  # fn's outputs on every case, computed when a mistake first matches this case
    for message, wrong in ex.mistakes.items():
        wrong = ex.runs(wrong)
        try:
            theirs = wrong(*case.args, **case.kwargs)
        except Exception:  # a mistake that cannot run on this case does not reproduce it
            continue
        if ex.differs(theirs, got) is not None:
            continue
        if fn is None:
            return message
        if learner is None:
            cases = ex.cases()  # one set of inputs for both: a comparison may follow a loss back to its inputs
            learner = _outputs(fn, cases)
        if _same_outputs(ex, _outputs(wrong, cases), learner):
            return message
    generic = ex.differs(expected, got) or ""
    e_vals, _ = _as_float_list(expected)
    g_vals, _ = _as_float_list(got)
    if e_vals is None and generic == f"expected {_short(expected)}, got {_short(got)}":  # not numbers: this case
        return (f"on this input the reference returns {_short(expected)} and yours {_short(got)}; no known "
                "mistake gives your answers on every case, so look at what this case tests")
    if e_vals and g_vals and len(e_vals) == len(g_vals) and generic == "values differ":
        if all(math.isclose(g, -e, rel_tol=1e-4, abs_tol=1e-6) for g, e in zip(g_vals, e_vals)):
            return "the sign is flipped"
        ratios = {round(g / e, 4) for g, e in zip(g_vals, e_vals) if abs(e) > 1e-6}
        if len(ratios) == 1 and all(abs(g) < 1e-6 for g, e in zip(g_vals, e_vals) if abs(e) <= 1e-6):
            return f"every value is {ratios.pop()} times the reference: a constant factor is off"
    return generic or "values differ"


def _help(ex: Exercise, level: int) -> str:
    """Return the help a verdict ends with: level 1, the nudge and how to get more; 2, the fuller hint and solution."""
    nudge = ex.nudge or ex.hint
    if level <= 1:
        more = (f"\nMore help: a second failing check adds the fuller hint and the worked solution; or ask now: "
                f"labkit.exercises.hint({ex.name!r}, level=2)") if ex.hint and ex.nudge else ""
        return (f"\nHint: {nudge}" if nudge else "") + more
    return ((f"\nHint: {ex.nudge}" if ex.nudge else "") + (f"\nFuller hint: {ex.hint}" if ex.hint else "")
            + (f"\nWorked solution: {ex.solution}" if ex.solution else ""))


def hint(name: str, level: int = 1) -> None:
    """Print the help of exercise ``name``: ``level=1`` the one-line nudge, ``level=2`` the fuller hint and solution.

    A failing :func:`check` shows level 1 the first time, level 2 from the second failure on.
    """
    ex = exercise(name)
    if level <= 1 and ex.nudge:
        print(f"{name}, hint 1 of 2: {ex.nudge}\n"
              f"  (labkit.exercises.hint({name!r}, level=2): the fuller hint and the worked solution)")
        return
    print(f"{name}, hint 2 of 2: {ex.hint or ex.nudge}" + (f"\nWorked solution: {ex.solution}" if ex.solution else ""))


def verify(name: str, fn: Callable, level: int = 2) -> None:
    """Run ``fn`` on every case of exercise ``name``; raise :class:`ExerciseFailed` at the first failing case.

    ``NotImplementedError`` propagates (an unfilled stub); any other exception becomes a failure
    that names the case. ``level`` is the help the message ends with (see :func:`hint`).
    """
    ex = exercise(name)
    reference, fn = ex.runs(ex.reference), ex.runs(fn)
    for case in ex.cases():
        expected = reference(*case.args, **case.kwargs)
        try:
            got = fn(*case.args, **case.kwargs)
        except NotImplementedError:
            raise
        except Exception as err:
            raise ExerciseFailed(f"{name}: on {case.label} your function raised {type(err).__name__}: {err}"
                                 + _help(ex, level)) from None
        if ex.differs(expected, got) is not None:
            raise ExerciseFailed(
                f"{name}: wrong on {case.label}.\n{_show_difference(expected, got)}"
                f"  what is wrong: {diagnose(ex, case, expected, got, fn)}" + _help(ex, level))


def _reference_name(ex: Exercise) -> str:
    return ex.reference_name or ex.reference.__qualname__


def check(name: str, fn: Callable) -> Callable:
    """Check the learner's ``fn`` against exercise ``name``; return the function the notebook goes on with.

    Prints ``✓`` and returns ``fn`` when every case passes; prints that the stub is not filled in
    and returns the reference when ``fn`` raises ``NotImplementedError``; raises
    :class:`ExerciseFailed` with the failing case and a diagnosis otherwise, ending with the nudge the
    first time and the fuller hint from the second failure on. :func:`checked` then gives later cells
    the function this check left (the reference after a failure).
    """
    ex = exercise(name)
    try:
        verify(name, fn, level=1 + min(_FAILURES.get(name, 0), 1))
    except NotImplementedError:
        _IN_USE[name] = ("unfilled", ex.reference)
        print(f"… {name}: not filled in yet, so the notebook goes on with the reference "
              f"({_reference_name(ex)}). Fill in the function and run this cell again.")
        return ex.reference
    except ExerciseFailed:
        _IN_USE[name] = ("failed", ex.reference)
        _FAILURES[name] = _FAILURES.get(name, 0) + 1
        raise
    _IN_USE[name] = ("passed", fn)
    _FAILURES.pop(name, None)
    print(f"✓ {name}: right on all {len(ex.cases())} cases (checked against {_reference_name(ex)})")
    return fn


def checked(*exercise_names: str):
    """Return the function (one name) or functions (several) that the last :func:`check` of each exercise left.

    That is the learner's function when its check passed, else the reference: when the check failed
    (it prints which exercise to fix, so a wrong answer left in place fails at its own check, not in a
    later cell), when the stub is unfilled, or when the exercise's cell has not run yet.
    """
    functions, stand_ins = [], []
    for name in exercise_names:
        ex = exercise(name)
        status, fn = _IN_USE.get(name, ("unchecked", ex.reference))
        if status == "failed":
            print(f"✗ {name}: your function failed its check, so labkit's ({_reference_name(ex)}) stands in here. "
                  f"Fix it in the cell that checks {name!r}, run that cell, then this one.")
        elif status != "passed":
            stand_ins.append(f"{name} ({'not filled in' if status == 'unfilled' else 'its exercise cell has not run'})")
        functions.append(fn)
    if stand_ins:
        print("… labkit's function stands in for " + ", ".join(stand_ins))
    return functions[0] if len(functions) == 1 else tuple(functions)
