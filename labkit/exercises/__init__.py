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
- nothing: it raises :class:`ExerciseFailed` when a case fails, with the case, what was expected,
  what came back and a diagnosis. The diagnosis names a *known mistake* only when that mistake
  gives the learner's output on **every** case of the exercise (each exercise lists its plausible
  wrong answers: the std without Bessel's correction, a missing clip side, the KL the wrong way
  round...); a mistake that merely agrees on the failing case would name the wrong bug. Otherwise
  it is about this case alone: a generic reason (shape, sign, a constant factor, NaN) or, for
  answers that are not numbers, what was expected and what came back.

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

__all__ = ["Case", "Exercise", "ExerciseFailed", "register", "exercise", "names", "check", "verify", "diagnose"]

# Submodules that register exercises (one per notebook concept); imported on first use.
_SUBMODULES: tuple[str, ...] = ("objective", "rewards", "nano", "memory")

_REGISTRY: dict[str, "Exercise"] = {}


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
    exactly that mistake. ``compare(expected, got)`` returns ``None`` when they agree, else a short
    description of the difference; the default compares tensors, numbers and nested sequences.
    """

    name: str
    reference: Callable
    cases: Callable[[], list[Case]]
    mistakes: dict[str, Callable] = field(default_factory=dict)
    hint: str = ""
    solution: str = ""  # where the worked solution is: docs/solutions/<notebook>.md#<anchor>
    reference_name: str = ""  # e.g. "labkit.objective.group_advantages", shown when the stub is unfilled
    compare: Callable[[Any, Any], str | None] | None = None

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


def verify(name: str, fn: Callable) -> None:
    """Run ``fn`` on every case of exercise ``name``; raise :class:`ExerciseFailed` at the first failing case.

    ``NotImplementedError`` propagates (an unfilled stub); any other exception becomes a failure
    that names the case.
    """
    ex = exercise(name)
    for case in ex.cases():
        expected = ex.reference(*case.args, **case.kwargs)
        try:
            got = fn(*case.args, **case.kwargs)
        except NotImplementedError:
            raise
        except Exception as err:
            raise ExerciseFailed(f"{name}: on {case.label} your function raised {type(err).__name__}: {err}"
                                 + (f"\nHint: {ex.hint}" if ex.hint else "")) from None
        if ex.differs(expected, got) is not None:
            raise ExerciseFailed(
                f"{name}: wrong on {case.label}.\n  expected {_short(expected)}\n  got      {_short(got)}\n"
                f"  what is wrong: {diagnose(ex, case, expected, got, fn)}"
                + (f"\nHint: {ex.hint}" if ex.hint else "")
                + (f"\nWorked solution: {ex.solution}" if ex.solution else ""))


def check(name: str, fn: Callable) -> Callable:
    """Check the learner's ``fn`` against exercise ``name``; return the function the notebook goes on with.

    Prints ``✓`` and returns ``fn`` when every case passes; prints that the stub is not filled in
    and returns the reference when ``fn`` raises ``NotImplementedError``; raises
    :class:`ExerciseFailed` with the failing case and a diagnosis otherwise.
    """
    ex = exercise(name)
    try:
        verify(name, fn)
    except NotImplementedError:
        print(f"… {name}: not filled in yet, so the notebook goes on with the reference "
              f"({ex.reference_name or ex.reference.__qualname__}). Fill in the function and run this cell again.")
        return ex.reference
    print(f"✓ {name}: right on all {len(ex.cases())} cases (checked against "
          f"{ex.reference_name or ex.reference.__qualname__})")
    return fn
