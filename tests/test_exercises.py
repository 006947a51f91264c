"""Coded exercises: every reference passes its own check, and every listed mistake fails it with its own message."""
import json
import re
from pathlib import Path

import pytest
import torch

import labkit.exercises as ex
from labkit.exercises import Case, Exercise, ExerciseFailed

REPO = Path(__file__).resolve().parents[1]


def _verdict(name, fn) -> str:
    with pytest.raises(ExerciseFailed) as info:
        ex.verify(name, fn)
    return str(info.value)


def _toy() -> Exercise:
    # A throwaway exercise that exercises the machinery itself (not registered for the notebooks).
    def reference(x):
        return (x - x.mean()) / x.std()

    return Exercise(
        name="_toy_standardise", reference=reference,
        cases=lambda: [Case("four rewards", (torch.tensor([1.0, 0.0, 0.0, 1.0]),)),
                       Case("three rewards", (torch.tensor([2.0, 0.0, 1.0]),))],
        mistakes={"the std has no Bessel correction (unbiased=False)": lambda x: (x - x.mean()) / x.std(unbiased=False)},
        nudge="centre, then scale", hint="subtract the mean, divide by the std",
        solution="docs/solutions/toy.md#exercise-toy", reference_name="toy")


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    # what checks left for later cells, and the failures counted for the hints: per test, as per kernel
    monkeypatch.setattr(ex, "_IN_USE", {})
    monkeypatch.setattr(ex, "_FAILURES", {})
    monkeypatch.setattr(ex, "_LINKS_DUE", set(), raising=False)


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


def test_a_mistake_matching_one_case_only_is_not_named(toy):
    # Bessel's mistake on the first case, something else on the second: naming Bessel would mislead.
    def wrong(x):
        return (x - x.mean()) / x.std(unbiased=False) if len(x) == 4 else x

    with pytest.raises(ExerciseFailed) as info:
        ex.check(toy.name, wrong)
    assert "four rewards" in str(info.value) and "Bessel" not in str(info.value)


@pytest.mark.parametrize("wrong, message", [
    (lambda x: -(x - x.mean()) / x.std(), "sign is flipped"),
    (lambda x: 2 * (x - x.mean()) / x.std(), "2.0 times the reference"),
    (lambda x: ((x - x.mean()) / x.std())[:1], "shape"),
    (lambda x: (x - x.mean()) / 0 * 0, "NaN"),
    (lambda x: x.nonexistent(), "your function raised AttributeError: 'Tensor' object has no attribute"),
    (lambda x: x.std() / (x - x.mean()), r"every value is 1 / the reference's: a ratio is upside down"),
    (lambda x: (x - x.mean()) / x.std() + 0.5, r"every value is the reference's \+0.5: a constant term is off"),
    (lambda x: (x - x.mean()) / (x.std() + 1e-3), r"within 0.1\d% of the reference, yet outside the check's tolerance"),
])
def test_generic_diagnoses(toy, wrong, message):
    with pytest.raises(ExerciseFailed, match=message) as info:
        ex.check(toy.name, wrong)
    assert "four rewards" in str(info.value) and "Hint" in str(info.value)


def test_the_verdict_shows_both_answers_rounded_and_where_torch_finds_the_difference(toy):
    # right everywhere but at position 2 of the first case
    def wrong(x):
        out = (x - x.mean()) / x.std()
        return out + torch.tensor([0.0, 0.0, 0.123456789, 0.0])[: len(x)] if len(x) == 4 else out

    verdict = _verdict(toy.name, wrong)
    assert "wrong on four rewards." in verdict, verdict
    assert "expected [0.866, -0.866, -0.866, 0.866]  (shape (4,))" in verdict, verdict
    assert "got      [0.866, -0.866, -0.7426, 0.866]  (shape (4,))" in verdict, verdict
    # torch.testing.assert_close's own message, its differences rounded
    assert "Mismatched elements: 1 / 4 (25.0%)" in verdict, verdict
    assert "Greatest absolute difference: 0.1235 at index (2,) (up to 1e-05 allowed)" in verdict, verdict
    assert not re.search(r"\d\.\d{7,}", verdict), f"unrounded floats in the verdict:\n{verdict}"


def test_the_verdict_of_a_matrix_shows_its_rows_and_the_index():
    exercise = ex.exercise("clipped_surrogate")
    message = next(m for m in exercise.mistakes if m.startswith("the upper clip side is missing"))
    verdict = _verdict("clipped_surrogate", exercise.mistakes[message])
    assert "expected [[-0.5, -0.9, -1, -1.25, -1.28],\n            [0.8, 0.9, 1, 1.25, 1.6]," in verdict, verdict
    assert "got      [[-0.5, -0.9, -1, -1.25, -1.6]," in verdict and "(shape (4, 5))" in verdict, verdict
    assert "Mismatched elements: 3 / 20 (15.0%)" in verdict, verdict
    assert "Greatest absolute difference: 0.36 at index (2, 4)" in verdict, verdict
    assert f"what is wrong: {message}" in verdict
    assert not re.search(r"\d\.\d{7,}", verdict), verdict


def test_a_long_answer_is_shown_whole_with_the_index_of_the_difference():
    expected, got = torch.arange(40.0), torch.arange(40.0)
    got[30] = -1.0
    shown = ex.show_values(expected, got)
    assert "29, -1, 31" in shown and "29, 30, 31" in shown, shown
    assert "Greatest absolute difference: 31 at index (30,)" in shown, shown


def test_a_difference_only_in_digits_beyond_the_fourth_shows_enough_digits():
    # 1.23401 and 1.23449 differ beyond the tolerance but both round to 1.234
    shown = ex.show_values(torch.tensor([1.23401, 2.0], dtype=torch.float64),
                     torch.tensor([1.23449, 2.0], dtype=torch.float64))
    assert "expected [1.234, 2]" in shown and "got      [1.2345, 2]" in shown, shown


def test_a_dict_answer_names_the_key_that_differs():
    shown = ex.show_values({"weights": 4, "optimizer": 8}, {"weights": 4, "optimizer": 16})
    assert "Expected 8 but got 16." in shown and "The failure occurred for item ['optimizer']" in shown, shown
    assert ex.default_compare({"weights": 4, "optimizer": 8}, {"optimizer": 8, "weights": 4}) is None


def test_answers_that_are_not_one_tensor_are_compared_too():
    pair = (torch.tensor([1.0, 2.0]), torch.tensor(3.0))
    assert ex.default_compare(pair, (torch.tensor([1.0, 2.0]), torch.tensor(3.0))) is None
    assert "The failure occurred for item [1]" in ex.default_compare(pair, (pair[0], torch.tensor(3.5)))
    assert ex.default_compare(0.5, torch.tensor(0.5)) is None and ex.default_compare(2, 2.0) is None
    assert ex.default_compare(torch.tensor([1.0, 2.0]), [1.0, 2.0]) is None
    assert ex.default_compare(torch.tensor(2.0), torch.tensor([2.0])) is None  # a loss of shape () or (1,)
    assert ex.default_compare(torch.tensor([1, 0]), torch.tensor([True, False])) is None  # any dtype
    assert ex.default_compare([1.0, None], [1.0, None]) is None
    assert ex.default_compare("18", "18") is None and ex.default_compare(None, None) is None
    assert ex.default_compare(None, "18") == "expected None, got str '18'"
    assert ex.default_compare(0.5, "x") == "expected 0.5, got str 'x'"


def test_a_toy_with_a_tuple_of_tensors_checks_and_diagnoses(monkeypatch):
    def reference(x):
        return x - x.mean(), x.std()

    toy = Exercise(name="_toy_pair", reference=reference, cases=lambda: [Case("four", (torch.tensor([1.0, 0.0, 3.0, 1.0]),))],
                   mistakes={"no Bessel correction": lambda x: (x - x.mean(), x.std(unbiased=False))})
    monkeypatch.setitem(ex._REGISTRY, toy.name, toy)
    ex.verify(toy.name, lambda x: (x - x.mean(), torch.std(x)))
    verdict = _verdict(toy.name, lambda x: (x - x.mean(), x.std(unbiased=False)))
    assert "The failure occurred for item [1]" in verdict and "what is wrong: no Bessel correction" in verdict, verdict


# --------------------------------------------------------------------------- hints: a nudge first, the solution later


def test_the_first_failing_check_nudges_and_the_second_gives_the_fuller_hint(toy):
    wrong = toy.mistakes["the std has no Bessel correction (unbiased=False)"]
    with pytest.raises(ExerciseFailed) as first:
        ex.check(toy.name, wrong)
    assert "Hint: centre, then scale" in str(first.value)
    assert "subtract the mean" not in str(first.value) and "docs/solutions" not in str(first.value)
    assert f"labkit.exercises.hint({toy.name!r}, level=2)" in str(first.value)
    with pytest.raises(ExerciseFailed) as second:
        ex.check(toy.name, wrong)
    assert "Fuller hint: subtract the mean, divide by the std" in str(second.value)
    assert "Worked solution: docs/solutions/toy.md#exercise-toy" in str(second.value)


def test_a_passing_check_starts_the_hints_over(toy):
    wrong = toy.mistakes["the std has no Bessel correction (unbiased=False)"]
    with pytest.raises(ExerciseFailed):
        ex.check(toy.name, wrong)
    ex.check(toy.name, toy.reference)
    with pytest.raises(ExerciseFailed) as again:
        ex.check(toy.name, wrong)
    assert "Fuller hint" not in str(again.value)


def test_hint_asked_for_gives_either_level(toy, capsys):
    ex.hint(toy.name)
    first = capsys.readouterr().out
    assert "centre, then scale" in first and "subtract the mean" not in first
    ex.hint(toy.name, level=2)
    second = capsys.readouterr().out
    assert "subtract the mean, divide by the std" in second and "docs/solutions/toy.md#exercise-toy" in second


def test_every_exercise_nudges_in_one_line_without_its_recipe():
    for name in ex.names():
        exercise = ex.exercise(name)
        assert exercise.nudge and "\n" not in exercise.nudge and len(exercise.nudge) <= 160, name
        assert exercise.nudge != exercise.hint, name
        verdict = _verdict_at_level_1(name, next(iter(exercise.mistakes.values())))
        assert exercise.hint not in verdict and exercise.solution not in verdict, name


def _verdict_at_level_1(name, fn) -> str:
    with pytest.raises(ExerciseFailed) as info:
        ex.verify(name, fn, level=1)
    return str(info.value)


# --------------------------------------------------------------------------- later cells take the checked function


def test_checked_gives_the_function_the_last_check_left(toy, capsys):
    wrong = toy.mistakes["the std has no Bessel correction (unbiased=False)"]
    assert ex.checked(toy.name) is toy.reference  # no check has run yet
    with pytest.raises(ExerciseFailed):
        ex.check(toy.name, wrong)
    capsys.readouterr()
    assert ex.checked(toy.name) is toy.reference
    assert f"✗ {toy.name}: your function failed its check" in capsys.readouterr().out

    def mine(x):
        return (x - x.mean()) / x.std()

    ex.check(toy.name, mine)
    assert ex.checked(toy.name) is mine
    assert ex.checked(toy.name, toy.name) == (mine, mine)


def test_checked_says_which_stubs_are_unfilled(toy, capsys):
    def stub(x):
        raise NotImplementedError

    ex.check(toy.name, stub)
    capsys.readouterr()
    assert ex.checked(toy.name) is toy.reference
    assert f"labkit's function stands in for {toy.name} (not filled in)" in capsys.readouterr().out


def _notebook_cells(name, cell_type=None) -> list[str]:
    cells = json.loads((REPO / "notebooks" / name).read_text())["cells"]
    return ["".join(c["source"]) for c in cells if cell_type in (None, c["cell_type"])]


def _run_cells(sources, namespace):
    """Run the cells' code in ``namespace``; return the value of the last cell's last expression, if any."""
    import ast

    result = None
    for source in sources:
        tree = ast.parse(source)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<cell>", "exec"), namespace)
        result = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace) if last else None
    return result


def test_a_wrong_answer_left_in_place_does_not_reach_section_8_of_notebook_01(capsys):
    # The learner's clipped surrogate fails its check in section 3 and stays defined; section 8 must run on
    # labkit's and say which exercise to fix, not end in torch's "Scalars are not close!".
    code = _notebook_cells("01_grpo_objective.ipynb", "code")
    setup = [c for c in code if c.startswith("MODE =") or "AGGREGATIONS =" in c]  # the parameters, the imports
    section_8 = [c for c in code if "def my_grpo_loss" in c or "my_grpo_loss(*batch" in c]
    assert len(setup) == 2 and len(section_8) == 2
    namespace = {}
    _run_cells(setup, namespace)

    def my_clipped_surrogate(logps, old_logps, advantages, epsilon=0.2, epsilon_high=0.2):
        ratio = torch.exp(logps - old_logps)
        A = advantages[:, None]
        return -torch.min(ratio * A, torch.clamp(ratio, min=1 - epsilon) * A)  # the upper clip side is missing

    def stub(*args, **kwargs):
        raise NotImplementedError

    namespace["my_k3"] = ex.check("kl_k3", stub)  # left unfilled: labkit's stands in
    namespace["my_aggregate_loss"] = ex.check("aggregate_loss", stub)
    with pytest.raises(ExerciseFailed):
        ex.check("clipped_surrogate", my_clipped_surrogate)
    namespace["my_clipped_surrogate"] = my_clipped_surrogate  # the cell's def ran; check() raised before rebinding
    capsys.readouterr()
    _run_cells(section_8, namespace)
    out = capsys.readouterr().out
    assert "✗ clipped_surrogate: your function failed its check" in out
    # labkit's three functions ran: the verdict says so, not "your loss equals"
    assert "✓ my_grpo_loss equals labkit.objective.grpo_loss in value and gradient" in out, out
    assert "labkit's clipped_surrogate, kl_k3, aggregate_loss stood in for yours" in out and "your loss" not in out


def test_section_8_of_notebook_01_fails_a_detached_loss_and_credits_the_learner_whose_pieces_passed(capsys):
    code = _notebook_cells("01_grpo_objective.ipynb", "code")
    setup = [c for c in code if c.startswith("MODE =") or "AGGREGATIONS =" in c]
    define, compare = [c for c in code if "def my_grpo_loss" in c], [c for c in code if "my_grpo_loss(*batch" in c]
    namespace = {}
    _run_cells(setup, namespace)
    for name in ("clipped_surrogate", "kl_k3", "aggregate_loss"):  # the learner's pieces are right
        namespace[f"my_{name.replace('kl_', '')}"] = ex.check(name, ex.exercise(name).reference)
    _run_cells(define, namespace)
    capsys.readouterr()
    _run_cells(compare, namespace)
    out = capsys.readouterr().out
    assert "✓ your loss equals labkit.objective.grpo_loss in value and gradient" in out and "stood in" not in out
    right = namespace["my_grpo_loss"]
    namespace["my_grpo_loss"] = lambda *args, **kwargs: right(*args, **kwargs).detach()
    with pytest.raises(ExerciseFailed, match="the value is right, but it carries no gradient"):
        _run_cells(compare, namespace)


def test_the_k3_cell_of_notebook_01_says_when_labkit_stands_in(capsys):
    # the stub left unfilled: the comparison of section 4 compares labkit's k3 with itself, and says so
    code = _notebook_cells("01_grpo_objective.ipynb", "code")
    cells = [c for c in code if c.startswith("MODE =") or "AGGREGATIONS =" in c or "def my_k1" in c
             or "KL(pi || ref)" in c or "on the far reference" in c]
    assert len(cells) == 5
    _run_cells(cells, {})
    out = capsys.readouterr().out
    assert "labkit's k3 stands in for yours" in out and "your k3 equals" not in out, out


def test_notebook_01_prints_the_rloo_identity_rounded(capsys):
    code = _notebook_cells("01_grpo_objective.ipynb", "code")
    cell = next(c for c in code if "(G-1)/G x RLOO" in c)
    import pandas as pd

    from labkit.objective import group_advantages
    _run_cells([cell], {"torch": torch, "pd": pd, "group_advantages": group_advantages})
    out = capsys.readouterr().out
    assert "[0.625, -0.375, -0.375, 0.125] = [0.625, -0.375, -0.375, 0.125]" in out, out


def test_the_extractor_table_of_notebook_02_shows_the_tags_and_none():
    # The completions the extract_answer exercise is checked on, with what each reader returns: the table must show
    # the literal <think> / <answer> tags (HTML-escaped, not swallowed by the browser) and None as None, not nan.
    import pandas as pd

    from labkit import rewards

    cell = next(c for c in _notebook_cells("02_reward_functions.ipynb", "code") if "extract_last_number (lenient)" in c)
    html = _run_cells([cell], {"pd": pd, "rewards": rewards})._repr_html_()
    cells = re.findall(r"<td[^>]*>(.*?)</td>", html, re.S)
    assert "&lt;think&gt;hmm&lt;/think&gt;&lt;answer&gt;18&lt;/answer&gt;&lt;answer&gt;19&lt;/answer&gt;" in cells
    assert "None" in cells and "nan" not in cells and "<think>" not in html
    assert 'class="mathjax_ignore tex2jax_ignore"' in html  # the money signs stay text


MY_NOTEBOOKS = ("01_grpo_objective.ipynb", "01b_grpo_variants.ipynb", "02_reward_functions.ipynb",
                "03_nano_grpo_cpu.ipynb", "08_grpo_with_tools.ipynb")
ASSIGNED_CHECK = re.compile(r"""^(\w+) = labkit\.exercises\.check\("(\w+)", \1\)""", re.M)


@pytest.mark.parametrize("notebook", MY_NOTEBOOKS)
def test_later_cells_take_the_checked_function(notebook):
    # a cell after the exercise's own that calls the learner's function first gets it from checked(): after a
    # failed check the name still holds the wrong function
    cells = _notebook_cells(notebook, "code")
    for i, source in enumerate(cells):
        for var, name in ASSIGNED_CHECK.findall(source):
            taken = False
            for j in range(i + 1, len(cells)):
                if re.search(rf"""^{var} = labkit\.exercises\.checked\("{name}"\)""", cells[j], re.M) or \
                        re.search(rf"""checked\([^)]*"{name}"[^)]*\)""", cells[j]):
                    taken = True
                if re.search(rf"(?<![\w.]){var}\(", cells[j]) and not re.search(rf"def {var}\(", cells[j]):
                    assert taken, f"{notebook} cell {j} calls {var} without labkit.exercises.checked({name!r})"


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


# --------------------------------------------------------------------------- diagnoses of plausible wrong answers
# Each learner below is written the way a learner would write it (not by calling the exercise's own mistake
# functions). A known mistake is named only when it gives the learner's output on every case; otherwise the
# verdict is about the failing case alone (its input, what was expected, what came back).

import labkit.rewards  # noqa: E402


def _named_mistakes(name, verdict) -> list[str]:
    return [message for message in ex.exercise(name).mistakes if message in verdict]


def _text(completion):
    return completion if isinstance(completion, str) else labkit.rewards.completion_text(completion)


def _extract_forgets_open_think(completion):
    # follows the hint, but never checks for a <think> left open before the answer
    text = _text(completion)
    close = text.rfind("</think>")
    if close >= 0:
        text = text[close + len("</think>"):]
    if text.count("<answer>") != 1 or text.count("</answer>") != 1:
        return None
    start, end = text.find("<answer>"), text.find("</answer>")
    return (text[start + len("<answer>"):end].strip() or None) if start < end else None


def _extract_last_findall(completion):
    # the last <answer>...</answer> anywhere, lazily matched
    found = re.findall(r"<answer>(.*?)</answer>", _text(completion), re.DOTALL)
    return (found[-1].strip() or None) if found else None


def _extract_greedy(completion):
    # one greedy regex over the whole completion
    match = re.search(r"<answer>(.*)</answer>", _text(completion), re.DOTALL)
    return (match.group(1).strip() or None) if match else None


def test_extract_answer_open_think_is_named_and_is_not_a_greedy_regex():
    verdict = _verdict("extract_answer", _extract_forgets_open_think)
    assert _named_mistakes("extract_answer", verdict) == [next(m for m in ex.exercise("extract_answer").mistakes
                                                               if m.startswith("a <think> that is never closed"))]
    assert "a <think> never closed" in verdict and "greedy" not in verdict


def test_extract_answer_findall_last_gets_the_case_not_a_known_mistake():
    # findall()[-1] agrees with a greedy regex and with "the answer inside <think> counts" on the first case it
    # fails, but with neither on every case: the verdict names no mistake, only the case, expected and got.
    verdict = _verdict("extract_answer", _extract_last_findall)
    assert _named_mistakes("extract_answer", verdict) == []
    assert "the only answer inside <think>" in verdict
    assert "expected None" in verdict and "got      '18'" in verdict
    assert "no known mistake gives your answers on every case" in verdict


def test_extract_answer_greedy_regex_is_named():
    verdict = _verdict("extract_answer", _extract_greedy)
    assert _named_mistakes("extract_answer", verdict) == [next(m for m in ex.exercise("extract_answer").mistakes
                                                               if m.startswith("a greedy regex"))]


def _advantages_eps_in_sqrt(rewards, num_generations, scale_rewards="group"):
    grouped = rewards.view(-1, num_generations)
    advantages = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_rewards == "group":
        advantages = advantages / (grouped.var(dim=1, keepdim=True) + 1e-4).sqrt()  # epsilon inside the sqrt
    return advantages.flatten()


def _advantages_transposed(rewards, num_generations, scale_rewards="group"):
    grouped = rewards.reshape(num_generations, -1).T  # (num_prompts, G) in shape, but the wrong completions
    advantages = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_rewards == "group":
        advantages = advantages / (grouped.std(dim=1, keepdim=True) + 1e-4)
    return advantages.T.reshape(-1)


def _advantages_transposed_unscaled(rewards, num_generations, scale_rewards="group"):
    # transposed AND never divides: two mistakes at once, so neither known mistake reproduces it everywhere
    grouped = rewards.reshape(num_generations, -1).T
    return (grouped - grouped.mean(dim=1, keepdim=True)).T.reshape(-1)


@pytest.mark.parametrize("learner, start", [
    (_advantages_eps_in_sqrt, "1e-4 is added to the variance"),
    (_advantages_transposed, "the groups are transposed"),
])
def test_group_advantages_diagnoses(learner, start):
    verdict = _verdict("group_advantages", learner)
    assert [m[:len(start)] for m in _named_mistakes("group_advantages", verdict)] == [start]


def test_group_advantages_eps_in_sqrt_fails_on_close_rewards():
    verdict = _verdict("group_advantages", _advantages_eps_in_sqrt)
    assert "std about 0.01" in verdict  # the only case where std + 1e-4 and sqrt(var + 1e-4) part


def test_group_advantages_two_mistakes_at_once_name_neither():
    verdict = _verdict("group_advantages", _advantages_transposed_unscaled)
    assert _named_mistakes("group_advantages", verdict) == []
    assert "values differ" in verdict


def _aggregate_token_mean(per_token_loss, completion_mask, loss_type, max_completion_length):
    m = completion_mask.float()
    return (per_token_loss * m).sum() / m.sum()  # whatever the loss_type


def test_aggregate_loss_token_mean_everywhere_is_named_not_swapped():
    # On the 'grpo' case this equals "token mean and sequence mean swapped"; on 'bnpo' it does not.
    verdict = _verdict("aggregate_loss", _aggregate_token_mean)
    assert [m[:30] for m in _named_mistakes("aggregate_loss", verdict)] == ["the token mean for every loss_"]


# --------------------------------------------------------------------------- mistakes a reviewer saw described vaguely
# (issue 44 item 5): each, written as a learner would, fails with its own named mistake; the right answer passes.


def reference_advantages(rewards, num_generations, scale_rewards="group", eps=1e-4):
    grouped = rewards.view(-1, num_generations)
    advantages = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_rewards == "group":
        advantages = advantages / (grouped.std(dim=1, keepdim=True) + eps)
    return advantages.flatten()


def _surrogate(logps, old_logps, advantages, epsilon=0.2, epsilon_high=0.2, *, low=None, high=None, upside=False):
    ratio = (old_logps - logps).exp() if upside else (logps - old_logps).exp()
    low = 1 - epsilon if low is None else low(epsilon, epsilon_high)
    high = 1 + epsilon_high if high is None else high(epsilon, epsilon_high)
    A = advantages.unsqueeze(1)
    return -torch.minimum(ratio * A, ratio.clamp(low, high) * A)


def _k3(logps, ref_logps, plus=False):
    x = ref_logps - logps
    return x.exp() - x + (1 if plus else -1)


def _gspo(logps, old_logps, completion_mask, upside=False):
    log_ratio = (old_logps - logps) if upside else (logps - old_logps)
    lengths = completion_mask.sum(dim=1, keepdim=True)
    return torch.exp((log_ratio * completion_mask).sum(dim=1, keepdim=True) / lengths)


def _step(logps, rewards, completion_mask, num_generations, upside=False):
    ratio = torch.exp(logps.detach() - logps) if upside else torch.exp(logps - logps.detach())
    advantages = reference_advantages(rewards, num_generations)
    per_token = -ratio * advantages[:, None]
    mask = completion_mask.float()
    return (per_token * mask).sum() / mask.sum()


@pytest.mark.parametrize("name, learner, start", [
    ("group_advantages", lambda r, g, scale_rewards="group": reference_advantages(r, g, scale_rewards, eps=1e-8),
     "the epsilon is too small"),
    ("group_advantages", lambda r, g, scale_rewards="group": reference_advantages(r, g, scale_rewards, eps=1e-6),
     "the epsilon is too small"),
    ("clipped_surrogate", lambda *a, **k: _surrogate(*a, **k, low=lambda e, h: 1 - h, high=lambda e, h: 1 + e),
     "epsilon and epsilon_high are swapped"),
    ("clipped_surrogate", lambda *a, **k: _surrogate(*a, **k, low=lambda e, h: 1 + h, high=lambda e, h: 1 - e),
     "the clip bounds are the wrong way round"),
    ("clipped_surrogate", lambda *a, **k: _surrogate(*a, **k, upside=True), "the ratio is upside down"),
    ("kl_k3", lambda logps, ref_logps: _k3(logps, ref_logps, plus=True), "+ 1 where - 1 belongs"),
    ("sequence_ratio", lambda *a: _gspo(*a, upside=True), "the ratio is upside down"),
    ("grpo_step_loss", lambda *a: _step(*a, upside=True), "the ratio is upside down"),
])
def test_a_plausible_wrong_answer_is_named(name, learner, start):
    verdict = _verdict(name, learner)
    assert [m[:len(start)] for m in _named_mistakes(name, verdict)] == [start], verdict
    assert "values differ" not in verdict and "constant factor" not in verdict, verdict


@pytest.mark.parametrize("name, learner", [
    ("group_advantages", reference_advantages),
    ("clipped_surrogate", _surrogate),
    ("kl_k3", _k3),
    ("sequence_ratio", _gspo),
    ("grpo_step_loss", _step),
])
def test_the_right_answer_written_by_hand_passes(name, learner):
    ex.verify(name, learner)


def test_an_epsilon_slip_is_not_called_a_constant_factor():
    # 1e-5 is no known mistake (it parts from 1e-8 on the std-0.01 case), but it is no factor of 1.0002 either
    verdict = _verdict("group_advantages", lambda r, g, scale_rewards="group": reference_advantages(r, g, scale_rewards, 1e-5))
    assert _named_mistakes("group_advantages", verdict) == []
    assert "a small constant does (an epsilon?)" in verdict and "constant factor" not in verdict, verdict


def test_a_class_is_called_your_class(capsys):
    class NeedsAnArgument:
        def __init__(self, answer):
            self.answer = answer

    verdict = _verdict("calculator_env", NeedsAnArgument)
    assert "your class raised TypeError:" in verdict and "missing 1 required positional argument" in verdict, verdict
    with pytest.raises(ExerciseFailed):
        ex.check("calculator_env", NeedsAnArgument)
    capsys.readouterr()
    ex.checked("calculator_env")
    assert "✗ calculator_env: your class failed its check" in capsys.readouterr().out


# --------------------------------------------------------------------------- answers right in value, without a gradient
# (issue 54, medium 4): the optimiser only uses the gradient, so a detached answer fails and is told why.


def _step_loss_by_hand(logps, rewards, completion_mask, num_generations, eps_in_sqrt=False):
    grouped = rewards.view(-1, num_generations)
    std = grouped.std(dim=1, keepdim=True)
    spread = (grouped.var(dim=1, keepdim=True) + 1e-4).sqrt() if eps_in_sqrt else std + 1e-4
    advantages = ((grouped - grouped.mean(dim=1, keepdim=True)) / spread).flatten()
    per_token = -torch.exp(logps - logps.detach()) * advantages[:, None]
    mask = completion_mask.float()
    return (per_token * mask).sum() / mask.sum()


def _aggregate_by_hand(per_token_loss, completion_mask, loss_type, max_completion_length):
    m = completion_mask.float()
    if loss_type == "grpo":
        return ((per_token_loss * m).sum(1) / m.sum(1)).mean()
    if loss_type == "dr_grpo":
        return (per_token_loss * m).sum() / (m.size(0) * max_completion_length)
    return (per_token_loss * m).sum() / m.sum()


def _no_grad(fn):
    def wrapped(*args, **kwargs):
        with torch.no_grad():
            return fn(*args, **kwargs)
    return wrapped


@pytest.mark.parametrize("name, learner", [
    ("clipped_surrogate", lambda lp, olp, a, **k: _surrogate(lp.detach(), olp, a, **k)),
    ("clipped_surrogate", _no_grad(_surrogate)),
    ("kl_k3", lambda logps, ref_logps: torch.tensor(_k3(logps, ref_logps).tolist())),  # rebuilt from the values
    ("aggregate_loss", lambda *args: _aggregate_by_hand(*args).item()),
    ("aggregate_loss", lambda *args: torch.tensor(_aggregate_by_hand(*args).item())),
    ("sequence_ratio", lambda lp, olp, m: _gspo(lp, olp, m).detach()),
    ("grpo_step_loss", lambda *args: torch.tensor(_step_loss_by_hand(*args).item())),
])
def test_an_answer_right_in_value_without_a_gradient_fails_and_says_so(name, learner):
    verdict = _verdict(name, learner)
    assert "what is wrong: the value is right, but it carries no gradient" in verdict, verdict
    assert _named_mistakes(name, verdict) == [], verdict


def test_the_hand_written_aggregation_passes_with_its_gradient():
    ex.verify("aggregate_loss", _aggregate_by_hand)


def test_a_surrogate_with_a_detached_clip_term_has_the_wrong_gradient():
    # -min(ratio * A, clip(ratio).detach() * A): the same values; inside the clip range torch.min splits the
    # gradient between the two equal terms, so half of it is lost there
    def learner(logps, old_logps, advantages, epsilon=0.2, epsilon_high=0.2):
        ratio, A = torch.exp(logps - old_logps), advantages[:, None]
        return -torch.min(ratio * A, ratio.clamp(1 - epsilon, 1 + epsilon_high).detach() * A)

    verdict = _verdict("clipped_surrogate", learner)
    assert "the value is right, but its gradient with respect to logps is not the reference's" in verdict, verdict


def test_a_k3_that_does_not_depend_on_logps_is_told_so():
    # the value rebuilt from the reference's log-probs only: it carries a gradient, but not to logps
    verdict = _verdict("kl_k3", lambda logps, ref_logps: _k3(logps.detach(), ref_logps) + 0 * ref_logps.sum()
                       + torch.zeros((), requires_grad=True))
    assert "does not depend on logps: its gradient is missing" in verdict, verdict


def test_grpo_step_loss_with_the_epsilon_inside_the_square_root_fails_on_close_rewards():
    verdict = _verdict("grpo_step_loss", lambda *args: _step_loss_by_hand(*args, eps_in_sqrt=True))
    assert "std about 0.01" in verdict, verdict
    assert [m[:30] for m in _named_mistakes("grpo_step_loss", verdict)] == ["1e-4 is added to the variance,"]
    ex.verify("grpo_step_loss", _step_loss_by_hand)


# --------------------------------------------------------------------------- messages that say only what is true
# (issue 55 item 7, issue 54's low on "a constant factor is off")


def test_a_wrong_scalar_is_no_constant_factor_unless_it_is_one_on_every_case():
    # divides every loss_type by B * T: each case's value is some factor of the right one, a different one each time
    def by_b_times_t(per_token_loss, completion_mask, loss_type, max_completion_length):
        return (per_token_loss * completion_mask).sum() / per_token_loss.numel()

    verdict = _verdict("aggregate_loss", by_b_times_t)
    assert "times the reference" not in verdict and "constant" not in verdict, verdict
    twice = _verdict("aggregate_loss", lambda *args: 2 * _aggregate_by_hand(*args))
    assert "what is wrong: on every case, your value is 2.0 times the reference: a constant factor is off" in twice


def test_an_answer_of_zero_is_called_zero(toy):
    verdict = _verdict(toy.name, lambda x: torch.zeros_like(x))
    assert "what is wrong: every value is 0 where the reference's is not" in verdict, verdict
    assert "times" not in verdict and "upside down" not in verdict, verdict


def test_zero_beside_a_large_reference_is_not_called_upside_down(monkeypatch):
    # 1 / 6,193,152 is within 1e-6 of 0: notebook 04's count of 0 was once called "a ratio is upside down"
    large = Exercise(name="_toy_large", reference=lambda x: x * 1e7, nudge="scale it",
                     cases=lambda: [Case("three", (torch.tensor([1.0, 2.0, 3.0]),)),
                                    Case("two", (torch.tensor([4.0, 5.0]),))])
    monkeypatch.setitem(ex._REGISTRY, large.name, large)
    verdict = _verdict(large.name, lambda x: torch.zeros_like(x))
    assert "every value is 0 where the reference's is not" in verdict and "upside down" not in verdict, verdict
    verdict = _verdict(large.name, lambda x: 1 / (x * 1e7))  # truly upside down: said so, on every case
    assert "on every case, every value is 1 / the reference's: a ratio is upside down" in verdict, verdict


def test_counting_with_the_whole_layer_name_is_named_no_layer_matched():
    # notebook 04's lora_param_count, with `name in target_modules`: nothing matches, so the count is 0
    def lora_param_count(model, rank, target_modules):
        return sum(rank * (m.in_features + m.out_features) for name, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and name in target_modules)

    verdict = _verdict("lora_param_count", lora_param_count)
    assert [m[:40] for m in _named_mistakes("lora_param_count", verdict)] == [
        "no layer matched your target modules, so"], verdict
    assert "upside down" not in verdict, verdict


def test_a_wrong_shape_ends_with_a_hint_about_the_shape(toy):
    group = ex.exercise("group_advantages")
    def not_flattened(rewards, g, scale_rewards="group"):
        return reference_advantages(rewards, g, scale_rewards).view(-1, g)

    verdict = _verdict_at_level_1("group_advantages", not_flattened)
    assert "what is wrong: shape (2, 4) where (8,) was expected: the values are right, laid out in another shape" \
        in verdict, verdict
    assert "Hint: return shape (8,), as the reference does" in verdict and group.nudge not in verdict, verdict
    # a wrong shape with other values: the shape is said, not that the values are right
    verdict = _verdict(toy.name, lambda x: x[:1])
    assert "shape (1,) where (4,) was expected\n" in verdict and "Hint: return shape (4,)" in verdict, verdict


def test_get_reward_testing_the_exact_text_is_named():
    class CalculatorEnv(ex.exercise("calculator_env").reference):
        def get_reward(self) -> float:
            return 1.0 if self.answer in self.results else 0.0

    verdict = _verdict("calculator_env", CalculatorEnv)
    assert [m[:45] for m in _named_mistakes("calculator_env", verdict)] == [
        "get_reward looks for the gold's exact text am"], verdict


def test_an_unfilled_class_is_called_a_class(capsys):
    class CalculatorEnv:
        def reset(self, answer=None, **example):
            raise NotImplementedError

    ex.check("calculator_env", CalculatorEnv)
    assert "Fill in the class and run this cell again" in capsys.readouterr().out
    ex.checked("calculator_env")
    assert "… labkit's class stands in for calculator_env (not filled in)" in capsys.readouterr().out
    assert ex.stand_ins("calculator_env", "kl_k3") == ["calculator_env", "kl_k3"]


# --------------------------------------------------------------------------- the worked solution, a link in a notebook


class _Kernel:
    """Stands for a notebook's IPython shell: it has a kernel and IPython's events."""

    def __init__(self):
        from IPython.core.events import EventManager, available_events

        self.kernel = object()
        self.events = EventManager(self, available_events)


def test_in_a_notebook_the_worked_solution_is_a_link_under_the_verdict(toy, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    shell = _Kernel()
    monkeypatch.setattr(ex, "_notebook_shell", lambda: shell)
    wrong = toy.mistakes["the std has no Bessel correction (unbiased=False)"]
    with pytest.raises(ExerciseFailed):
        ex.check(toy.name, wrong)
    with pytest.raises(ExerciseFailed) as second:
        ex.check(toy.name, wrong)
    with pytest.raises(ExerciseFailed):
        ex.check(toy.name, wrong)  # a third failure in the same cell: still one link
    assert "Worked solution: the link under this message" in str(second.value), second.value
    assert shown == []  # the link comes after the verdict: when the cell has run
    shell.events.trigger("post_run_cell", None)
    shell.events.trigger("post_run_cell", None)  # once only
    assert [m.data for m in shown] == [
        "Worked solution: [docs/solutions/toy.md#exercise-toy](../docs/solutions/toy.md#exercise-toy)"]
    ex.hint(toy.name, level=2)
    assert shown[-1].data == shown[0].data and len(shown) == 2


def test_in_a_terminal_the_worked_solution_is_its_path(toy):
    wrong = toy.mistakes["the std has no Bessel correction (unbiased=False)"]
    assert "Worked solution: docs/solutions/toy.md#exercise-toy" in _verdict(toy.name, wrong)


def test_a_function_that_raises_is_shown_the_inputs_it_raised_on():
    def fixed_group_of_4(rewards, num_generations, scale_rewards="group"):
        grouped = rewards.view(-1, 4)  # num_generations ignored
        advantages = grouped - grouped.mean(dim=1, keepdim=True)
        if scale_rewards == "group":
            advantages = advantages / (grouped.std(dim=1, keepdim=True) + 1e-4)
        return advantages.flatten()

    verdict = _verdict("group_advantages", fixed_group_of_4)
    assert "raised RuntimeError: shape '[-1, 4]' is invalid for input of size 9\n" \
           "  the inputs: tensor of shape (9,), 3, scale_rewards='group'\n" in verdict, verdict


def test_a_detached_answer_with_a_known_value_mistake_gets_both_named():
    def learner(logps, old_logps, advantages, epsilon=0.2, epsilon_high=0.2):  # epsilon_high ignored, and detached
        return _surrogate(logps, old_logps, advantages, epsilon, epsilon).detach()

    verdict = _verdict("clipped_surrogate", learner)
    assert [m[:26] for m in _named_mistakes("clipped_surrogate", verdict)] == ["epsilon_high is ignored: t"], verdict
    assert "; and your answer carries no gradient" in verdict, verdict
