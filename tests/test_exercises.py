"""Coded exercises: every reference passes its own check, and every listed mistake fails it with its own message."""
import pytest
import torch

import labkit.exercises as ex
from labkit.exercises import Case, Exercise, ExerciseFailed


def _toy() -> Exercise:
    # A throwaway exercise that exercises the machinery itself (not registered for the notebooks).
    def reference(x):
        return (x - x.mean()) / x.std()

    return Exercise(
        name="_toy_standardise", reference=reference,
        cases=lambda: [Case("four rewards", (torch.tensor([1.0, 0.0, 0.0, 1.0]),)),
                       Case("three rewards", (torch.tensor([2.0, 0.0, 1.0]),))],
        mistakes={"the std has no Bessel correction (unbiased=False)": lambda x: (x - x.mean()) / x.std(unbiased=False)},
        hint="subtract the mean, divide by the std", reference_name="toy")


@pytest.fixture()
def toy(monkeypatch):
    toy = _toy()
    monkeypatch.setitem(ex._REGISTRY, toy.name, toy)
    return toy


def test_reference_passes_and_is_returned(toy, capsys):
    assert ex.check(toy.name, toy.reference) is toy.reference
    assert "✓" in capsys.readouterr().out


def test_unfilled_stub_falls_back_to_the_reference(toy, capsys):
    def stub(x):
        raise NotImplementedError

    assert ex.check(toy.name, stub) is toy.reference
    assert "not filled in yet" in capsys.readouterr().out


def test_known_mistake_is_named(toy):
    with pytest.raises(ExerciseFailed, match="Bessel"):
        ex.check(toy.name, toy.mistakes["the std has no Bessel correction (unbiased=False)"])


@pytest.mark.parametrize("wrong, message", [
    (lambda x: -(x - x.mean()) / x.std(), "sign is flipped"),
    (lambda x: 2 * (x - x.mean()) / x.std(), "2.0 times the reference"),
    (lambda x: ((x - x.mean()) / x.std())[:1], "shape"),
    (lambda x: (x - x.mean()) / 0 * 0, "NaN"),
    (lambda x: x.nonexistent(), "raised AttributeError"),
])
def test_generic_diagnoses(toy, wrong, message):
    with pytest.raises(ExerciseFailed, match=message) as info:
        ex.check(toy.name, wrong)
    assert "four rewards" in str(info.value) and "Hint" in str(info.value)


def test_verdict_renders_without_a_traceback():
    assert ExerciseFailed("x: wrong")._render_traceback_() == ["\x1b[31m✗ x: wrong\x1b[0m"]


def test_registered_exercises_pass_and_their_mistakes_fail():
    for name in ex.names():
        exercise = ex.exercise(name)
        ex.verify(name, exercise.reference)
        assert len(exercise.mistakes) >= 2, f"{name}: at least two plausible wrong answers must be checked"
        for message, wrong in exercise.mistakes.items():
            with pytest.raises(ExerciseFailed) as info:
                ex.verify(name, wrong)
            assert message in str(info.value), f"{name}: the mistake {message!r} was not recognised:\n{info.value}"


def test_unknown_exercise_lists_the_known_ones():
    with pytest.raises(KeyError, match="no exercise named"):
        ex.exercise("no_such_exercise")


# --------------------------------------------------------------------------- the exercises in the notebooks

import json  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHECK_CALL = re.compile(r"""(?<![\w.])(?:labkit\.)?(?:exercises\.)?check\(\s*["'](\w+)["']""")


def _exercise_cells():
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        previous = ""
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            for name in CHECK_CALL.findall(source):
                yield path.name, name, previous + "\n" + source  # the stub: this cell or the one before
            previous = source


def test_every_check_in_a_notebook_names_a_registered_exercise_with_a_stub():
    seen = set()
    for notebook, name, source in _exercise_cells():
        assert name in ex.names(), f"{notebook} checks {name!r}, which no submodule of labkit.exercises registers"
        assert "raise NotImplementedError" in source, \
            f"{notebook}: the stub that {name!r} checks (raise NotImplementedError) must be in that cell or the one before"
        seen.add(name)
    # every exercise registered by this lab's submodules is used by some notebook (a learner can reach it)
    assert set(ex.names()) <= seen, f"registered but in no notebook: {sorted(set(ex.names()) - seen)}"


def test_every_exercise_points_at_a_worked_solution_that_exists():
    for name in ex.names():
        exercise = ex.exercise(name)
        assert exercise.hint and exercise.reference_name, name
        path, _, anchor = exercise.solution.partition("#")
        text = (REPO / path).read_text()
        headings = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                    for h in re.findall(r"^#{1,6}\s+(.*)$", text, re.M)}
        assert anchor in headings, f"{name}: {exercise.solution} has no such section"
        assert f'labkit.exercises.verify("{name}"' in text, f"{name}: its worked solution must verify itself in CI"


def test_the_reward_exercise_is_called_as_trl_calls_a_reward():
    # TRL 1.16 passes trainer_state, log_extra and log_metric to every reward (grpo_trainer.py, lines 1588-1594)
    cases = ex.exercise("accuracy_reward").cases()
    assert all({"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "answer"}
               <= set(case.kwargs) for case in cases)
    assert any(isinstance(case.kwargs["completions"][0], list) for case in cases)  # conversational too
