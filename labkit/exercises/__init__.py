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
- nothing: it raises :class:`ExerciseFailed` when a case fails, with the case, the expected and the
  returned answer (rounded), how they differ (numbers and tensors, and lists, tuples and dicts of them, by
  :func:`torch.testing.assert_close` with ``rtol=1e-4``, ``atol=1e-5``; other answers by ``==``, unless the
  exercise brings its own ``compare``, as those whose answer must carry a gradient do: :func:`gradient_compare`)
  and a diagnosis (:func:`diagnose`). The diagnosis names a *known mistake* (each exercise lists its plausible
  wrong answers: the std without Bessel's correction, a missing clip side, the KL the wrong way round...) only
  when that mistake gives the learner's output on **every** case of the exercise: one that merely agrees on the
  failing case would name the wrong bug.

Help comes in two steps, so that a hint does not give the answer away: a failing check ends with a
one-line **nudge** (``Exercise.nudge``); the next failing check of the same exercise (or
``hint(name, level=2)`` at any time) adds the fuller hint (``Exercise.hint``, close to the solution)
and the worked solution's place in ``docs/solutions`` (a link, in a notebook).

A cell further down that calls the learner's function again takes it from :func:`checked`, which
gives the function whose check passed, or the reference (saying which exercise to fix) when the
check failed, so a wrong answer left in place fails at its own check and nowhere else.

The known mistakes double as the exercise's own tests: ``tests/test_exercises.py`` checks that the
reference passes and that every listed mistake fails with its own message.
Exercises are registered by the submodules of this package, one per notebook concept.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from labkit.exercises.compare import (ATOL, RTOL, default_compare, as_numbers, short_repr, show_values, torch_difference,
                                      unequal_message, gradient_compare)

__all__ = ["Case", "Exercise", "ExerciseFailed", "register", "exercise", "names", "check", "checked", "hint",
           "verify", "diagnose", "gradient_compare", "assert_close_with_gradient", "stand_ins"]

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
    the difference; the default compares tensors, numbers and containers of them with
    :func:`torch.testing.assert_close`, anything else with ``==`` (a ``compare`` of an exercise's own says
    what assert_close cannot: a gradient, the float type TRL needs, which tool call differs).
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
        return (self.compare or default_compare)(expected, got)


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


def _kind(fn) -> str:
    """Return what the learner wrote, as a verdict names it: ``"class"`` (an environment) or ``"function"``."""
    return "class" if isinstance(fn, type) else "function"


# --------------------------------------------------------------------------- comparing and showing answers

def assert_close_with_gradient(actual, expected, wrt: str = "logps") -> None:
    """Raise :class:`ExerciseFailed` unless ``actual`` equals ``expected`` in value and in gradient (with respect to
    the tensors ``expected`` was computed from): ``torch.testing.assert_close`` would let a detached answer pass."""
    difference = gradient_compare(wrt)(expected, actual)
    if difference is not None:
        raise ExerciseFailed(f"not equal to the reference: {difference}")


def _shape_reason(expected: torch.Tensor, got: torch.Tensor) -> str | None:
    """Return what is wrong with the shape of ``got``, or ``None`` when it is the reference's."""
    if expected.shape == got.shape or expected.numel() == got.numel() == 1:
        return None
    same_values = expected.numel() == got.numel() and torch.allclose(got.flatten(), expected.flatten(), rtol=RTOL,
                                                                      atol=ATOL, equal_nan=True)
    return (f"shape {tuple(got.shape)} where {tuple(expected.shape)} was expected"
            + (": the values are right, laid out in another shape" if same_values else ""))


def _numeric_reason(expected: torch.Tensor, got: torch.Tensor,
                    every_case: tuple[torch.Tensor, torch.Tensor] | None = None) -> str | None:
    """Return a generic reason why the numbers ``got`` are wrong (shape, NaN, 0, sign, 1 / x, a small constant, a
    constant factor or term), or ``None`` when none fits. A relation is claimed only when it holds on
    ``every_case`` (both answers on every case, flattened) when given, and from two values or more: any single
    wrong number is some factor of the right one."""
    shape = _shape_reason(expected, got)
    if shape:
        return shape
    e, g = expected.flatten(), got.flatten()
    if g.isnan().any() and not e.isnan().any():
        return "the result has NaN where the reference has none (a division by zero? a log of 0?)"
    if not (e.isfinite().all() and g.isfinite().all()):
        return None
    yours = "every value" if e.numel() > 1 else "your value"
    if (g == 0).all() and (e != 0).any():
        return f"{yours} is 0 where the reference's is not"
    where = ""
    if every_case is not None and all(t.isfinite().all() for t in every_case):
        (e, g), where = every_case, "on every case, "
    every = where + yours
    nonzero = e.abs() > 1e-6
    if nonzero.sum() >= 2 and torch.allclose(g, -e, rtol=RTOL, atol=1e-6):
        return f"{where}the sign is flipped"
    if e.numel() >= 2 and (e != 0).all() and (g != 0).all() and torch.allclose(g, 1 / e, rtol=RTOL, atol=0):
        return f"{every} is 1 / the reference's: a ratio is upside down (exp(-x) where exp(x) belongs?)"
    if ((g - e).abs() <= 0.01 * e.abs() + ATOL).all() and nonzero.any():
        worst = ((g - e)[nonzero].abs() / e[nonzero].abs()).max().item()
        return (f"{every} is within {worst:.2%} of the reference, yet outside the check's tolerance ({RTOL:g} "
                "relative): no formula slip makes so small a difference, a small constant does (an epsilon?)")
    if nonzero.sum() >= 2 and (g[~nonzero].abs() < 1e-6).all():
        ratios = g[nonzero] / e[nonzero]
        if ratios[0].abs() > 1e-4 and torch.allclose(ratios, ratios[:1].expand_as(ratios), rtol=RTOL, atol=0):
            return f"{every} is {round(ratios[0].item(), 4)} times the reference: a constant factor is off"
    offset = g - e
    if e.numel() > 1 and torch.allclose(offset, offset[:1].expand_as(offset), rtol=RTOL, atol=1e-6):
        return f"{every} is the reference's {offset[0].item():+.4g}: a constant term is off"
    return None


def _every_case(ex: "Exercise", fn: Callable, cases: list[Case] | None = None,
                learner: list | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Return the reference's and ``fn``'s values on every case, flattened; ``None`` unless all are numbers."""
    if learner is None:
        cases = ex.cases()  # one set of inputs for both
        learner = _outputs(fn, cases)
    pairs = [(as_numbers(e), as_numbers(g)) for e, g in zip(_outputs(ex.runs(ex.reference), cases), learner)]
    if any(e is None or g is None or e.numel() != g.numel() for e, g in pairs):  # as_numbers(_RAISED) is None
        return None
    return torch.cat([e.flatten() for e, _ in pairs]), torch.cat([g.flatten() for _, g in pairs])


_RAISED = object()  # stands for "this call raised" when two functions are compared case by case


def _outputs(fn: Callable, cases: list[Case]) -> list:
    outputs = []
    for case in cases:
        try:
            outputs.append(fn(*case.args, **case.kwargs))
        except Exception:
            outputs.append(_RAISED)
    return outputs


def _same_outputs(differs: Callable, ours: list, theirs: list) -> bool:
    return all((a is _RAISED) == (b is _RAISED) and (a is _RAISED or differs(a, b) is None)
               for a, b in zip(ours, theirs))


def diagnose(ex: Exercise, case: Case, expected, got, fn: Callable | None = None) -> str:
    """Return why ``got`` is wrong on ``case``: a known mistake's message if it matches, else a generic reason.

    A known mistake is named only when it reproduces ``got`` on ``case`` and, given the learner's
    ``fn``, ``fn``'s output on every other case of the exercise too (a mistake that agrees on one
    case only is a coincidence: naming it would send the learner after the wrong bug). Otherwise: what
    the exercise's own comparison says (a gradient, a type TRL needs), a generic reason for numbers
    (shape, NaN, sign, 1 / x, a small constant, a constant factor or term), or that this case is the one to read.
    """
    cases = learner = None  # fn's outputs on every case, computed when a mistake first matches this case
    # a wrong value that also lost the reference's gradient: its value mistake is looked for, and both are said
    detached = (isinstance(expected, torch.Tensor) and expected.requires_grad and not getattr(got, "requires_grad", 0)
                and default_compare(expected, got) is not None)
    differs, also = (default_compare, "; and your answer carries no gradient") if detached else (ex.differs, "")
    for message, wrong in ex.mistakes.items():
        wrong = ex.runs(wrong)
        try:
            theirs = wrong(*case.args, **case.kwargs)
        except Exception:  # a mistake that cannot run on this case does not reproduce it
            continue
        if differs(theirs, got) is not None:
            continue
        if fn is None:
            return message + also
        if learner is None:
            cases = ex.cases()  # one set of inputs for both: a comparison may follow a loss back to its inputs
            learner = _outputs(fn, cases)
        if _same_outputs(differs, _outputs(wrong, cases), learner):
            return message + also
    difference, torch_says = ex.differs(expected, got), torch_difference(expected, got)
    if difference and difference not in (torch_says, unequal_message(expected, got)):
        return difference  # the exercise's own comparison: what assert_close cannot see
    e, g = as_numbers(expected), as_numbers(got)
    reason = None
    if e is not None and g is not None:
        reason = _numeric_reason(e, g, None if fn is None else _every_case(ex, fn, cases, learner))
    if reason:
        return reason
    if torch_says is None:
        return (f"on this input the reference returns {short_repr(expected)} and yours {short_repr(got)}; no known "
                "mistake gives your answers on every case, so look at what this case tests")
    return ("the values differ (above), and no known mistake gives your answers on every case: look at what "
            "this case tests")


def _notebook_shell():
    """Return IPython's shell when this runs in a notebook's kernel (which shows Markdown), else ``None``."""
    from IPython import get_ipython  # IPython comes with ipywidgets, a dependency of labkit

    shell = get_ipython()
    return shell if getattr(shell, "kernel", None) is not None else None


_LINKS_DUE: set[str] = set()  # exercises whose solution link shows when the running cell ends


def _solution_line(ex: Exercise, now: bool = False) -> str:
    """Return the line that gives the worked solution: its path in a terminal; in a notebook, a link it displays
    (relative to the notebooks' folder) at once (``now``) or once under the cell's output (``post_run_cell``)."""
    shell = _notebook_shell() if ex.solution else None
    if shell is None:
        return f"\nWorked solution: {ex.solution}" if ex.solution else ""
    from IPython.display import Markdown, display

    link = Markdown(f"Worked solution: [{ex.solution}](../{ex.solution})")
    if now:
        sys.stdout.flush()  # after the text printed before it
        display(link)
        return ""

    def show(*_):
        shell.events.unregister("post_run_cell", show)
        _LINKS_DUE.discard(ex.name)
        display(link)

    if ex.name not in _LINKS_DUE:
        _LINKS_DUE.add(ex.name)
        shell.events.register("post_run_cell", show)
    return "\nWorked solution: the link under this message"


def _help(ex: Exercise, level: int, shape: tuple | None = None) -> str:
    """Return the help a verdict ends with: level 1, the nudge and how to get more; 2, the fuller hint and solution.
    ``shape``: the expected shape, when the answer's is wrong and no known mistake says why: the hint is about it."""
    nudge = ex.nudge or ex.hint
    if shape is not None:
        nudge = (f"return shape {shape}, as the reference does: print the shape after each step of your "
                 f"{_kind(ex.reference)} to see where it changes.")
    if level <= 1:
        more = (f"\nMore help: a second failing check adds the fuller hint and the worked solution; or ask now: "
                f"labkit.exercises.hint({ex.name!r}, level=2)") if ex.hint and ex.nudge else ""
        return (f"\nHint: {nudge}" if nudge else "") + more
    return ((f"\nHint: {nudge}" if ex.nudge else "") + (f"\nFuller hint: {ex.hint}" if ex.hint else "")
            + _solution_line(ex))


def hint(name: str, level: int = 1) -> None:
    """Print the help of exercise ``name``: ``level=1`` the one-line nudge, ``level=2`` the fuller hint and solution.

    A failing :func:`check` shows level 1 the first time, level 2 from the second failure on.
    """
    ex = exercise(name)
    if level <= 1 and ex.nudge:
        print(f"{name}, hint 1 of 2: {ex.nudge}\n"
              f"  (labkit.exercises.hint({name!r}, level=2): the fuller hint and the worked solution)")
        return
    print(f"{name}, hint 2 of 2: {ex.hint or ex.nudge}")
    line = _solution_line(ex, now=True)  # in a notebook it displays the link and returns ""
    if line:
        print(line.lstrip("\n"))


def _inputs(case: Case) -> str:
    """Return the verdict's line that shows a case's inputs, tensors by their shape; "" when none is a tensor."""
    shown = [(f"{k}=" if k else "") + (f"tensor of shape {tuple(v.shape)}" if isinstance(v, torch.Tensor) else
                                       short_repr(v, 60)) for k, v in [("", a) for a in case.args] + [*case.kwargs.items()]]
    return "\n  the inputs: " + ", ".join(shown) if any(isinstance(a, torch.Tensor) for a in case.args) else ""


def verify(name: str, fn: Callable, level: int = 2) -> None:
    """Run ``fn`` on every case of exercise ``name``; raise :class:`ExerciseFailed` at the first failing case.

    ``NotImplementedError`` propagates (an unfilled stub); any other exception becomes a failure
    that names the case. ``level`` is the help the message ends with (see :func:`hint`).
    """
    ex = exercise(name)
    kind, reference, fn = _kind(fn), ex.runs(ex.reference), ex.runs(fn)
    for case in ex.cases():
        expected = reference(*case.args, **case.kwargs)
        try:
            got = fn(*case.args, **case.kwargs)
        except NotImplementedError:
            raise
        except Exception as err:
            raise ExerciseFailed(f"{name}: on {case.label} your {kind} raised {type(err).__name__}: {err}"
                                 + _inputs(case) + _help(ex, level)) from None
        if ex.differs(expected, got) is not None:
            reason = diagnose(ex, case, expected, got, fn)
            e, g = as_numbers(expected), as_numbers(got)
            shape = e is not None and g is not None and reason == _shape_reason(e, g)
            raise ExerciseFailed(f"{name}: wrong on {case.label}.\n{show_values(expected, got)}  what is wrong: {reason}"
                                 + _help(ex, level, tuple(e.shape) if shape else None))


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
              f"({_reference_name(ex)}). Fill in the {_kind(fn)} and run this cell again.")
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
    functions, unfilled, kinds = [], [], set()
    for name in exercise_names:
        ex = exercise(name)
        status, fn = _IN_USE.get(name, ("unchecked", ex.reference))
        if status == "failed":
            print(f"✗ {name}: your {_kind(ex.reference)} failed its check, so labkit's ({_reference_name(ex)}) "
                  f"stands in here. Fix it in the cell that checks {name!r}, run that cell, then this one.")
        elif status != "passed":
            unfilled.append(f"{name} ({'not filled in' if status == 'unfilled' else 'its exercise cell has not run'})")
            kinds.add(_kind(ex.reference))
        functions.append(fn)
    if unfilled:
        print(f"… labkit's {'class' if kinds == {'class'} else 'function'} stands in for " + ", ".join(unfilled))
    return functions[0] if len(functions) == 1 else tuple(functions)


def stand_ins(*exercise_names: str) -> list[str]:
    """Return those of ``exercise_names`` whose last check did not pass: labkit's function stands in for them."""
    return [name for name in exercise_names if _IN_USE.get(name, ("unchecked",))[0] != "passed"]
