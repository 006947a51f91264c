"""labkit.rewards: matching rules, both completion formats, None, hacks refused, safety, speed, TRL."""
import ast
import math
import os
import pickle
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from labkit import rewards as R
from bench import rewards as bench_rewards
from labkit.rewards import (accuracy_reward, answers_match, check_reward_function, combine_rewards, completion_text,
                            evaluate_expression, expression_reward, extract_answer, extract_last_number,
                            extract_stated_answer, format_reward, int_answer_reward, overlong_penalty, parse_number,
                            right_answer_reward, short_answer_reward, soft_format_reward, tag_count_reward)
from labkit.rewards.functions import MAX_EQUATIONS

GOOD = "<think>16 - 3 - 4 = 9 eggs; 9 * 2 = 18</think>\n<answer>18</answer>"


def conv(text):
    return [{"role": "assistant", "content": text}]


def both_formats(texts):
    """The same completions as plain strings and as conversational messages."""
    return [list(texts), [conv(t) for t in texts]]


# Every reward function, called as TRL calls it, with the columns it needs.
REWARDS = {
    "format_reward": (format_reward, {}),
    "soft_format_reward": (soft_format_reward, {}),
    "tag_count_reward": (tag_count_reward, {}),
    "accuracy_reward": (accuracy_reward, {"answer": "18"}),
    "int_answer_reward": (int_answer_reward, {}),
    "overlong_penalty": (overlong_penalty(1024, 256), {}),
    "expression_reward": (expression_reward, {"target": 24, "nums": [3, 8, 1]}),
    "combined_reward": (combine_rewards(*R.gsm8k_rewards()), {"answer": "18"}),
    "right_answer_reward": (right_answer_reward, {"answer": "18"}),
    "right_and_short": (combine_rewards([right_answer_reward, short_answer_reward], [1.0, 0.1], "right_and_short"),
                        {"answer": "18"}),
}


def call(fn, completions, columns):
    n = len(completions)
    return fn(completions=completions, prompts=["q"] * n, **{k: [v] * n for k, v in columns.items()})


# ----------------------------------------------------------------------------- reading completions


@pytest.mark.parametrize("completion, text", [
    ("plain", "plain"),
    (conv("hello"), "hello"),
    ({"role": "assistant", "content": "one message"}, "one message"),
    ([{"role": "assistant", "content": [{"type": "text", "text": "parts"}]}], "parts"),
    ([{"role": "assistant", "content": "a"}, {"role": "tool", "content": "x"}, {"role": "assistant", "content": "b"}],
     "a\nb"),
    (None, ""), (42, ""), ([{"role": "assistant", "content": None}], ""),
])
def test_completion_text_reads_both_formats_and_survives_odd_ones(completion, text):
    assert completion_text(completion) == text


@pytest.mark.parametrize("text, answer", [
    (GOOD, "18"),
    ("<answer> 18 </answer>", "18"),  # no reasoning: still an answer (format is another reward's job)
    ("<think>draft <answer>17</answer></think><answer>18</answer>", "18"),  # drafts in <think> are ignored
    ("<think>so <answer>18</answer></think>", None),  # answer only inside <think>
    ("<think>never closed <answer>18</answer>", None),
    ("<think>a</think><think>again <answer>18</answer>", None),
    ("<think>?</think><answer>18</answer><answer>19</answer>", None),  # two answers: a hedge
    ("<think>?</think><answer>18</answer><answer>18</answer>", None),
    ("<think>?</think><answer>   </answer>", None),
    ("<think>?</think></answer>18<answer>", None),
    ("no tags at all, 18", None),
    ("", None),
])
def test_extract_answer_rules(text, answer):
    assert extract_answer(text) == answer
    assert extract_answer(conv(text)) == answer


@pytest.mark.parametrize("text, number", [
    ("so she pays $1,200.50.", "1200.50"), ("3-4", "4"), ("x = -4", "-4"), ("(-5)", "-5"), ("1,2,3", "3"),
    ("18.", "18"), ("answer: 18 eggs", "18"), ("no number", None), ("", None), ("−7", "-7"),
    ("<think>12</think><answer>1,000,000</answer>", "1000000"),
])
def test_extract_last_number_is_lenient(text, number):
    assert extract_last_number(text) == number
    assert extract_last_number(conv(text)) == number


# ----------------------------------------------------------------------------- matching rules


@pytest.mark.parametrize("pred, gold", [
    ("1,200", "1200"), ("1,234,567", "1234567"), ("1{,}200", "1200"), ("1\\,200", "1200"),  # thousands separators
    ("$18", "18"), ("\\$18", "18"), ("18$", "18"), ("€18", "18"), ("$-5", "-5"), ("-$5", "-5"),  # currency
    ("18 dollars", "18"), ("18 eggs per day", "18"), ("18 km/h", "18"), ("18\\text{ apples}", "18"),  # units
    ("\\text{18 apples}", "18"),
    ("18.", "18"), ("18 dollars.", "18"),  # trailing full stop
    ("18.0", "18"), ("18.00", "18"), ("0.50", "0.5"), (".5", "0.5"),  # decimals
    ("50%", "50"), ("50\\%", "50"), ("50 percent", "50"), ("50%", "0.5"),  # percentages
    ("\\boxed{18}", "18"), ("The answer is \\boxed{18}", "18"), ("$\\boxed{18}$", "18"),  # \boxed
    ("3/4", "0.75"), ("\\frac{3}{4}", "0.75"), ("\\dfrac{15}{2}", "7.5"), ("\\frac12", "0.5"),  # fractions
    ("7 1/2", "7.5"), ("7\\frac{1}{2}", "7.5"), ("-\\frac{3}{4}", "-0.75"),  # mixed numbers, signs
    ("$18$", "18"), ("\\(18\\)", "18"), ("−5", "-5"), ("+18", "18"), ("１８", "18"),
    ("\\frac{\\sqrt{16}}{2}", "2"), ("6 \\times 3", "18"), ("\\sqrt{2}", "1.4142135623730951"),  # LaTeX arithmetic
    ("2\\sqrt{4}", "4"), ("(12 + 6) \\div 1", "18"), ("\\frac{1}{\\frac{1}{18}}", "18"), ("\\frac{36}{2}\\%", "18"),
])
def test_answers_match_numerically(pred, gold):
    assert answers_match(pred, gold), (pred, gold)


@pytest.mark.parametrize("pred, gold", [
    ("17", "18"), ("18", "180"), ("1.8", "18"), ("0.5", "50"), ("-18", "18"),
    ("42 or 43", "42"), ("42 or 43", "43"), ("42, 43", "42"), ("between 17 and 19", "18"),  # hedges
    ("\\boxed{18} \\boxed{19}", "18"), ("\\boxed{18} \\boxed{18}", "18"),
    ("6*3", "18"), ("x = 18", "18"), ("2^{10}", "1024"), ("\\frac{1}{0}", "0"), ("1/0", "0"),  # not one number
    ("nan", "0"), ("inf", "0"), ("1e5", "100000"), ("12,34", "1234"), ("eighteen", "18"),
    ("", "18"), (None, "18"), ("18", None), ("18", "not a number"),
    ("1" * (R.MAX_ANSWER_CHARS + 1), "1" * (R.MAX_ANSWER_CHARS + 1)),  # too long to be an answer
])
def test_answers_that_must_not_match(pred, gold):
    assert not answers_match(pred, gold), (pred, gold)


def test_parse_number_is_exact():
    assert parse_number("0.1") + parse_number("0.2") == Fraction(3, 10)  # no float rounding
    assert parse_number("$1,200.50") == Fraction(240100, 200)
    assert parse_number("42 or 43") is None
    assert isinstance(parse_number("\\sqrt{2}"), float)


def test_latex_answers_are_read_off_the_main_thread():
    # TRL may call rewards from a worker thread, where math-verify's signal-based timeout raises.
    # A fresh (uncached) LaTeX answer must be read in a thread all the same.
    R.clear_parse_caches()
    results, errors = [], []

    def worker():
        try:
            results.append(answers_match("\\frac{\\sqrt{36}}{3}", "2"))
        except Exception as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=60)
    assert not errors and results == [True]


@st.composite
def latex_numbers(draw, depth=0):
    """(LaTeX, exact value) pairs built from \\frac, \\sqrt of squares, \\times, \\cdot, \\div, + and -."""
    if depth >= 2 or draw(st.booleans()):
        n = draw(st.integers(0, 99))
        return str(n), Fraction(n)
    kind = draw(st.sampled_from(["frac", "sqrt", "times", "cdot", "div", "+", "-", "paren"]))
    (a, va), (b, vb) = draw(latex_numbers(depth + 1)), draw(latex_numbers(depth + 1))
    if kind == "frac" and vb != 0:
        return f"\\frac{{{a}}}{{{b}}}", va / vb
    if kind == "sqrt":
        root = draw(st.integers(0, 30))
        return f"\\sqrt{{{root * root}}}", Fraction(root)
    if kind in ("times", "cdot"):
        return f"{{{a}}} \\{kind} {{{b}}}", va * vb
    if kind == "div" and vb != 0:
        return f"{{{a}}} \\div {{{b}}}", va / vb
    if kind in "+-":
        return f"({a}) {kind} ({b})", va + vb if kind == "+" else va - vb
    return f"({a})", va


@settings(max_examples=60, deadline=None)
@given(latex=latex_numbers())
def test_latex_reading_agrees_with_math_verify(latex):
    # The oracle is the generator's exact Fraction, built alongside the LaTeX: labkit reads LaTeX through
    # math-verify (behind its own bounds), so agreeing with math-verify alone would check math-verify against
    # itself. math-verify's own verify is asserted too, so a failure says which of the two readings broke.
    import sympy
    from math_verify import LatexExtractionConfig, parse, verify

    text, value = latex
    assume(value is not None and "\\" in text and len(text) <= R.MAX_ANSWER_CHARS)  # plain text must be one number
    theirs = parse(f"${text}$", extraction_config=[LatexExtractionConfig()], parsing_timeout=None)
    assert theirs, text
    assert verify(theirs, sympy.Rational(value.numerator, value.denominator), timeout_seconds=None), text
    assert parse_number(text) == value, text
    assert answers_match(text, str(float(value))) or value.denominator not in (1, 2, 4, 5, 8, 10)


# ----------------------------------------------------------------------------- reward functions, both formats


@pytest.mark.parametrize("completions", both_formats([
    GOOD,
    "  <think>x</think>  <answer>18</answer>\n",
    "<think>x</think><answer>18</answer> trailing",
    "intro <think>x</think><answer>18</answer>",
    "<think>x</think> and <answer>18</answer>",
    "<think></think><answer>18</answer>",
    "<think>x</think><answer></answer>",
    "<think>x</think><answer>18</answer><answer>18</answer>",
    "<answer>18</answer><think>x</think>",
    "<think>x</think><think>y</think><answer>18</answer>",
    "18",
]))
def test_format_rewards(completions):
    assert format_reward(completions) == [1.0, 1.0] + [0.0] * 9
    assert soft_format_reward(completions) == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    assert tag_count_reward(completions) == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 0.5, 0.0]


@pytest.mark.parametrize("completions", both_formats([
    GOOD, "<think>x</think><answer>$18.00</answer>", "<think>x</think><answer>17</answer>",
    "<think>x</think><answer>17 or 18</answer>", "<think>the answer is 18</think>", "18", "",
]))
def test_accuracy_and_int_answer_rewards(completions):
    gold = ["18"] * len(completions)
    assert accuracy_reward(completions, answer=gold) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert int_answer_reward(completions) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_accuracy_reward_returns_none_without_a_gold_number():
    completions = [GOOD, GOOD, GOOD, conv(GOOD)]
    assert accuracy_reward(completions, answer=[None, "n/a", "18", 18]) == [None, None, 1.0, 1.0]


def test_int_answer_reward_wants_a_whole_number():
    texts = ["<answer>18</answer>", "<answer>18.0</answer>", "<answer>1,200</answer>", "<answer>-3</answer>",
             "<answer>7.5</answer>", "<answer>50%</answer>", "<answer>3/4</answer>"]
    assert int_answer_reward(texts) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_overlong_penalty_matches_trl_and_dapo():
    from trl.rewards import get_soft_overlong_punishment

    ours, trls = overlong_penalty(100, 20), get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)
    lengths = [0, 50, 80, 81, 90, 100, 101, 500]
    completion_ids = [[1] * n for n in lengths]
    completions = ["x"] * len(lengths)
    assert ours(completions, completion_ids=completion_ids) == trls(completion_ids=completion_ids)
    assert ours(completions, completion_ids=completion_ids)[4] == -0.5  # DAPO: halfway through the cache
    assert ours(["x" * 90, conv("x" * 101)]) == [-0.5, -1.0]  # without token ids it counts characters
    assert overlong_penalty(10, 0)(["x" * 10, "x" * 11]) == [0.0, -1.0]
    with pytest.raises(ValueError):
        overlong_penalty(10, 11)


@pytest.mark.parametrize("completions", both_formats([
    "<think>x</think><answer>(8 - 3 - 1 + 4) * 3</answer>",  # uses 3 twice and adds a 4
    "<think>x</think><answer>8 * 3 * 1</answer>",
    "<think>x</think><answer>(1 + 3 - 1) * 8 = 24</answer>",  # 1 used twice
    "<think>x</think><answer>8 * 3 / 1 = 24</answer>",  # "= target" is allowed
    "<think>x</think><answer>8 * 3 - 1</answer>",
    "<think>x</think><answer>8 * 3</answer>",  # 1 unused
    "<think>x</think><answer>8 * 3 * 1.0</answer>",  # floats are not the numbers given
    "<think>x</think><answer>8 ** 3 * 1</answer>",  # no powers in countdown
    "<think>x</think>",
]))
def test_expression_reward(completions):
    n = len(completions)
    assert expression_reward(completions, target=[24] * n, nums=[[3, 8, 1]] * n) == \
        [0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert expression_reward(completions[1:2], target=[24], numbers=[[1, 3, 8]]) == [1.0]


def test_expression_reward_none_and_missing_columns():
    good = "<answer>8 * 3 * 1</answer>"
    assert expression_reward([good, good, good], target=["n/a", 24, 24], nums=[[3, 8, 1], None, [3, 8.0, 1]]) == \
        [None, None, None]
    with pytest.raises(TypeError, match="nums"):
        expression_reward([good], target=[24])


@pytest.mark.parametrize("expression, value", [
    ("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("7 / 2", Fraction(7, 2)), ("-3 + 5", 2), ("+4", 4), ("8 × 3 ÷ 4", 6),
    ("1 / 0", None), ("1.5 + 1", None), ("True + 1", None), ("x + 1", None), ("'a' * 3", None), ("[1, 2]", None),
    ("2 ** 3", None), ("1 if 1 else 2", None), ("(lambda: 1)()", None), ("1; 2", None), ("", None),
    ("999999 * " * 10 + "1", None),  # bounded magnitude
])
def test_evaluate_expression(expression, value):
    assert evaluate_expression(expression) == value


def test_evaluate_expression_powers_are_bounded():
    assert evaluate_expression("2 ** 8", allow_power=True) == 256
    assert evaluate_expression("2 ** -2", allow_power=True) == Fraction(1, 4)
    assert evaluate_expression("2 ** 9", allow_power=True, max_exponent=8) is None
    assert evaluate_expression("0 ** -1", allow_power=True) is None


# ----------------------------------------------------------------------------- security


@pytest.mark.parametrize("payload", [
    "__import__('os').system('touch {marker}')",
    "open('{marker}', 'w').write('x')",
    "().__class__.__base__.__subclasses__()",
    "exec(\"open('{marker}', 'w')\")",
    "eval('1')",
])
def test_code_in_an_answer_never_runs(payload, tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    ran = []
    monkeypatch.setattr(os, "system", lambda *a: ran.append(a) or 0)
    _spy_on_python_evaluation(monkeypatch, ran)
    text = f"<think>x</think><answer>{payload.format(marker=marker)}</answer>"
    for name, (fn, columns) in REWARDS.items():
        for completions in both_formats([text]):
            values = call(fn, completions, columns)
            if name in ("accuracy_reward", "expression_reward", "int_answer_reward"):
                assert values == [0.0], name  # refused: not a number, not an expression
    assert evaluate_expression(payload.format(marker=marker), allow_power=True) is None
    R.equation_errors(f"{payload.format(marker=marker)} = 1")
    assert not marker.exists() and not ran, ran


def _spy_on_python_evaluation(monkeypatch, ran: list) -> None:
    """Record every eval, exec, and compile to code (``ast.parse`` compiles to a tree only: allowed) from here on."""
    import builtins

    real_compile = builtins.compile

    def compile_(source, filename, mode, flags=0, *args, **kwargs):
        if not flags & ast.PyCF_ONLY_AST:
            ran.append(("compile", source))
        return real_compile(source, filename, mode, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "eval", lambda *args, **kwargs: ran.append(("eval", args)))
    monkeypatch.setattr(builtins, "exec", lambda *args, **kwargs: ran.append(("exec", args)))
    monkeypatch.setattr(builtins, "compile", compile_)


def test_the_evaluation_spy_sees_eval_exec_and_compile_but_not_a_parse(monkeypatch):  # the test above is this good
    ran = []
    _spy_on_python_evaluation(monkeypatch, ran)
    ast.parse("1 + 1")
    assert ran == []
    eval("1 + 1")  # noqa: S307  the spy, not Python, receives it
    exec("x = 1")  # noqa: S102
    compile("1", "<text>", "eval")
    assert [kind for kind, _ in ran] == ["eval", "exec", "compile"]


@pytest.mark.parametrize("payload", ["9**9**9**9", "(9**9)**(9**9)", "2**2**2**2**2**2", "10**100000",
                                     "-(9**9**9)", "1" * 4400 + "**2"])
def test_power_towers_neither_run_nor_hang(payload):
    results = []
    worker = threading.Thread(target=lambda: results.append(
        (evaluate_expression(payload, allow_power=True),
         expression_reward([f"<answer>{payload}</answer>"], target=[24], nums=[[9, 9, 9, 9]]))), daemon=True)
    start = time.perf_counter()
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), f"{payload!r} is still being evaluated"
    assert results == [(None, [0.0])]
    assert time.perf_counter() - start < 1.0


# ----------------------------------------------------------------------------- names, weights, TRL


def test_every_reward_has_the_name_trl_logs():
    # TRL logs rewards/<fn.__name__>/mean (trl.trainer.utils.get_callable_name; checked for real in
    # test_rewards_plug_into_trl_grpo_trainer, which imports TRL's trainer: too slow for here).
    names = {name: fn.__name__ for name, (fn, _) in REWARDS.items()}
    assert names == {name: name for name in REWARDS}
    for name, (fn, _) in REWARDS.items():
        lo, hi = fn.value_range
        assert lo < hi, name
        pickle.loads(pickle.dumps(fn))  # TRL's async rollout workers pickle reward functions


def test_combined_reward_sums_like_trl_reward_weights():
    import torch

    funcs, weights = [accuracy_reward, format_reward, overlong_penalty(20, 10)], [1.0, 0.5, 2.0]
    completions = [GOOD, "<answer>17</answer>", "x" * 15, GOOD]
    gold = ["18", "18", "18", None]
    per_func = [fn(completions=completions, answer=gold) for fn in funcs]
    # TRL: rewards_per_func (None -> NaN) times reward_weights, nansum over functions.
    table = torch.tensor([[math.nan if v is None else v for v in row] for row in zip(*per_func)])
    expected = (table * torch.tensor(weights)).nansum(dim=1).tolist()
    combined = combine_rewards(funcs, weights)(completions=completions, answer=gold)
    assert combined == pytest.approx(expected)
    assert combine_rewards([accuracy_reward])(completions=[GOOD], answer=[None]) == [None]  # nothing applies
    assert combine_rewards(funcs, weights).value_range == (-2.0, 1.5)
    with pytest.raises(ValueError):
        combine_rewards(funcs, [1.0])


def test_score_completions_on_real_gsm8k_items():
    from labkit.data import load_gsm8k

    rows = load_gsm8k("test", limit=5)
    completions, golds = [], []
    for gold in rows["answer"]:
        n = int(gold)
        for written in (f"{n}", f"{n:,}", f"${n:,}.00", f"{n} dollars.", f"\\boxed{{{n}}}", f"{n}.0"):
            completions.append(f"<think>work</think>\n<answer>{written}</answer>")
            golds.append(gold)
        completions.append(f"<think>work</think>\n<answer>{n + 1}</answer>")
        golds.append(gold)
    scores = R.score_completions([accuracy_reward, format_reward], completions, answer=golds)
    assert scores["accuracy_reward"] == ([1.0] * 6 + [0.0]) * len(rows)
    assert scores["format_reward"] == [1.0] * len(completions)


@pytest.mark.slow
def test_rewards_plug_into_trl_grpo_trainer(tiny_model_path, tmp_path):
    from labkit.data import load_gsm8k
    from labkit.models import load_policy, lora_config
    from labkit.training import build_trainer, grpo_config

    model, tokenizer = load_policy(tiny_model_path, "lora", peft_config=lora_config(4))
    funcs, weights = R.gsm8k_rewards()
    funcs = funcs + [overlong_penalty(16, 8)]
    args = grpo_config(tmp_path, max_steps=1, per_device_train_batch_size=4, num_generations=4,
                       max_completion_length=16, reward_weights=weights + [1.0])
    trainer = build_trainer(model, funcs, load_gsm8k("train", limit=4), args, tokenizer=tokenizer)
    trainer.train()
    logged = next(h for h in trainer.state.log_history if "reward" in h)
    for name in ("accuracy_reward", "format_reward", "tag_count_reward", "overlong_penalty"):
        assert math.isfinite(logged[f"rewards/{name}/mean"]), name


# ----------------------------------------------------------------------------- free-text answers (word problems)


@pytest.mark.parametrize("text, stated", [
    ("The answer is 3.", "3"),
    ("Emma has 3 x 2 = 6 apples.", "6"),
    ("There are 5 x 2 = 10 apples in Emma's 5 bags.", "10"),  # the result of the equation, not the last number
    ("Mia has 7 + 5 = 13 stickers, not 12.", "13"),  # the gold number mentioned on the way is not the answer
    ("The answer is: 42 apples. Check: 40 + 2 = 42", "42"),
    ("The answer is 7. So 3 + 4 = 8", "7"),  # an explicit answer wins over a later equation
    ("Ava has 16 coins.", "16"),  # no equation: the last number
    ("16", "16"),
    ("Tom has $1,200 left.", "1200"),
    ("x = 6 or 7 apples", None),  # a hedge states no answer
    ("The answer is 6/7", None),
    ("To solve this problem, we need to consider", None),
    ("Sam has 7 x 4 = ", None),  # cut off before the result: the equation states nothing, and no number follows
    ("<think>7 x 4 = 28</think><answer>28</answer>", "28"),  # the lab's tags: extract_answer's strict reading
    ("<think>7 x 4 = 28</think> 28", "28"),
    ("<answer>28</answer><answer>29</answer>", None),
    ("", None),
])
def test_extract_stated_answer_reads_the_answer_a_reply_gives(text, stated):
    assert extract_stated_answer(text) == stated
    assert extract_stated_answer(conv(text)) == stated


def test_right_answer_reward_pays_the_stated_answer_only():
    texts = ["Emma has 3 x 2 = 6 apples.", "The answer is 3.", "Emma has 3 + 2 = 5 apples, not 6.", "6 or 7",
             "6 apples", "There are 6 apples, so the answer is 6."]
    for completions in both_formats(texts):
        assert right_answer_reward(completions, answer=["6"] * len(texts)) == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    assert right_answer_reward(["6"], answer=["six"]) == [None]  # no gold number: TRL skips the reward


LONG_RIGHT = "There are 3 bags with 2 apples each, so Emma has 3 x 2 = 6 apples in total. " * 3
SHORT_WRONG = ["The answer is 3.", "3", "Emma has 5 apples.", "6 or 3", "The answer is 3. 6"]


@pytest.mark.parametrize("wrong", SHORT_WRONG)
def test_a_short_wrong_answer_never_beats_a_right_one(wrong):
    """The hack notebook 04 showed ("3 x 2 = 6 apples" -> "The answer is 3."): brevity is at most a shaping
    term, so the shortest wrong answer scores below the longest right one, whatever the brevity reward says."""
    from labkit.presets import get_preset
    from labkit.rewards import named_rewards

    preset = get_preset("cpu-smollm2")
    shaped = combine_rewards([right_answer_reward, short_answer_reward], [1.0, 0.1])
    recipe = combine_rewards(*named_rewards(preset.rewards, preset.reward_weights))
    for total in (shaped, recipe):
        right, short_wrong = total([LONG_RIGHT, wrong], answer=["6", "6"])
        assert right >= 1.0 and short_wrong < right, (total, wrong)
    assert short_answer_reward([wrong])[0] == 1.0 or "or" in wrong  # the wrong ones are short: the hack's bait
    # and the recipe's weights keep it so for any brevity term in [0, 1]: correctness outweighs the rest
    funcs, weights = named_rewards(preset.rewards, preset.reward_weights)
    right_weight = weights[funcs.index(right_answer_reward)]
    others = sum(abs(w) * max(abs(v) for v in f.value_range) for f, w in zip(funcs, weights) if f is not right_answer_reward)
    assert others < right_weight


# ----------------------------------------------------------------------------- the checker


@pytest.mark.parametrize("name", list(REWARDS))
def test_labkit_rewards_pass_the_checker(name):
    check = check_reward_function(REWARDS[name][0], time_budget_ms=None)  # default columns: answer "4", ...
    assert check.ok, str(check)
    assert len(check.rewards) == len(R.AWKWARD_COMPLETIONS)


def _length_bonus(completions, **kwargs):
    return [len(completion_text(c)) / 100 for c in completions]  # unbounded: out of its stated range


_length_bonus.value_range = (0.0, 1.0)


def _returns_ints(completions, **kwargs):
    return [1 if "<answer>" in completion_text(c) else 0 for c in completions]


def _raises_without_tag(completions, **kwargs):
    return [float(completion_text(c).split("<answer>")[1].split("</answer>")[0]) for c in completions]


def _wrong_length(completions, **kwargs):
    return [0.0]


def _nan_when_empty(completions, **kwargs):
    return [float("nan") if not completion_text(c) else 0.0 for c in completions]


def _strings_only(completions, **kwargs):
    return [1.0 if "<answer>4</answer>" in str(c) and isinstance(c, str) else 0.0 for c in completions]


def _batch_normalised(completions, **kwargs):
    raw = [float(len(completion_text(c)) > 10) for c in completions]
    return [r / max(1.0, sum(raw)) for r in raw]


class _NoName:
    def __call__(self, completions, **kwargs):
        return [0.0] * len(completions)


@pytest.mark.parametrize("fn, problem", [
    (_length_bonus, "outside its range"),
    (_returns_ints, "must be Python floats"),
    (_raises_without_tag, "raised IndexError on plain completion 'empty'"),
    (_wrong_length, "returned 1 rewards for"),
    (_nan_when_empty, "returned nan on plain completion 'empty'"),
    (_strings_only, "as a plain string but"),
    (_batch_normalised, "in a batch but"),
    (_NoName(), "has no __name__"),
    (lambda completions, **kw: [None] * len(completions), "returned None for every"),
])
def test_the_checker_finds_each_kind_of_bug(fn, problem):
    check = check_reward_function(fn, time_budget_ms=None)
    assert not check.ok
    assert any(problem in p for p in check.problems), str(check)


def test_the_checker_reports_slow_rewards():
    def slow(completions, **kwargs):
        time.sleep(0.02)
        return [0.0] * len(completions)

    check = check_reward_function(slow, completions=[("one", "x")], time_budget_ms=5)
    assert any("took" in p for p in check.problems)


# ----------------------------------------------------------------------------- property tests

_PIECES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "\\boxed{", "\\frac{", "}", "{", "$", ",",
                     ".", "%", "-", " or ", "**", "9" * 50, "1,000", "\\sqrt{", "(", ")", "\n", "\x00", "\ud800"]),
    st.integers(-10**6, 10**6).map(str),
)


@st.composite
def completions_text(draw):
    """Arbitrary unicode mixed with the tokens parsers care about, repeated up to 100k characters."""
    text = "".join(draw(st.lists(_PIECES, max_size=20)))
    repeats = draw(st.sampled_from([1, 1, 1, 10, 1_000, 100_000]))
    text = (text * repeats)[:100_000] if text else text
    return draw(st.sampled_from([text, f"<think>{text}</think><answer>{text[:300]}</answer>", f"<answer>{text}"]))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(text=completions_text(), gold=st.one_of(st.none(), st.text(max_size=20), st.integers().map(str)))
def test_every_reward_returns_a_finite_float_in_range_on_any_text(text, gold):
    for name, (fn, columns) in REWARDS.items():
        if "answer" in columns:
            columns = {**columns, "answer": gold}
        for completions in both_formats([text, text]):
            values = call(fn, completions, columns)
            assert len(values) == 2, name
            for value in values:
                if value is None:
                    assert name in ("accuracy_reward", "combined_reward", "expression_reward", "right_answer_reward",
                                    "right_and_short"), name
                    continue
                assert type(value) is float and math.isfinite(value), (name, value)
                lo, hi = fn.value_range
                assert lo <= value <= hi, (name, value)
    extract_answer(text), extract_last_number(text), extract_stated_answer(text), answers_match(text, gold)
    evaluate_expression(text)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(-10**9, 10**9), style=st.sampled_from(["{n}", "{n:,}", "${n:,}", "{n}.0", "{n:,}.00 dollars.",
                                                          "\\boxed{{{n}}}", "$\\boxed{{{n:,}}}$", " {n} eggs ",
                                                          "{n}\\%", "\\text{{{n}}}"]))
def test_a_number_matches_itself_however_it_is_written(n, style):
    written = style.format(n=n)
    assert answers_match(written, str(n)), written
    assert not answers_match(written, str(n + 1)), written
    assert extract_answer(f"<think>{n - 1}</think><answer>{written}</answer>") == written.strip()


@settings(max_examples=200, deadline=None)
@given(num=st.integers(-10**6, 10**6), den=st.sampled_from([1, 2, 4, 5, 8, 16, 20, 25, 40, 125, 1000]))
def test_fractions_match_their_decimals(num, den):
    from decimal import Decimal

    decimal = str(Decimal(num) / Decimal(den))  # exact: den divides a power of ten
    assert answers_match(f"{num}/{den}", decimal), (num, den, decimal)
    assert answers_match(f"\\frac{{{abs(num)}}}{{{den}}}", decimal.lstrip("-"))
    assert not answers_match(f"{num + 1}/{den}", decimal)


def _expressions():
    leaf = st.integers(0, 100).map(lambda n: (str(n), Fraction(n)))

    def extend(children):
        def combine(pair, op):
            (ls, lv), (rs, rv) = pair
            if op == "/" and rv == 0:
                return (f"({ls}) + ({rs})", lv + rv)
            value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "/": lv / rv if rv else None}[op]
            return (f"({ls}) {op} ({rs})", value)

        return st.builds(combine, st.tuples(children, children), st.sampled_from("+-*/"))

    return st.recursive(leaf, extend, max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(expression=_expressions())
def test_evaluator_agrees_with_exact_arithmetic(expression):
    text, value = expression
    bounded = abs(value.numerator) <= R.MAX_MAGNITUDE and value.denominator <= R.MAX_MAGNITUDE
    if len(text) <= R.MAX_EXPRESSION_CHARS and bounded:
        assert evaluate_expression(text) == value


# ----------------------------------------------------------------------------- adversarial inputs and the benchmark


def test_adversarial_inputs_are_scored_fast_and_in_range():
    # The benchmark records the real figures (budget 50 ms); this only catches catastrophic
    # backtracking, which costs seconds to hours, not milliseconds, so noise cannot fail it.
    inputs = R.adversarial_inputs(100_000)
    assert all(len(text) >= 99_000 for name, text in inputs.items() if not name.startswith("bounded"))
    R.answers_match("\\frac{\\sqrt{16}}{2}", "2")  # math-verify's first call imports sympy
    for name, (fn, columns) in REWARDS.items():
        for label, text in inputs.items():
            start = time.perf_counter()
            value = call(fn, [text], columns)[0]
            assert time.perf_counter() - start < 1.0, (name, label)
            assert value is None or fn.value_range[0] <= value <= fn.value_range[1]
    for label, text in inputs.items():
        start = time.perf_counter()
        extract_last_number(text), extract_answer(text)
        assert time.perf_counter() - start < 1.0, label


def test_bench_cli_writes_its_figures_with_provenance(tmp_path):
    import json

    out = tmp_path / "rewards_bench.json"
    code = bench_rewards.main(["--chars", "2000", "--repeats", "1", "--out", str(out)])
    record = json.loads(out.read_text())
    assert set(record["rewards"]) >= {"format_reward", "accuracy_reward", "expression_reward", "extract_last_number"}
    assert record["provenance"]["versions"]["trl"] and record["input_chars"] == 2000
    assert code == (0 if record["all_within_budget"] else 1)


def test_recorded_benchmark_is_within_budget():
    path = Path(__file__).resolve().parents[1] / "results" / "rewards_bench.json"
    if not path.exists():
        pytest.skip("run `python -m bench rewards` to record results/rewards_bench.json")
    import json

    record = json.loads(path.read_text())
    assert record["input_chars"] >= 100_000 and record["budget_ms"] <= 50
    assert all(f["worst_ms"] < record["budget_ms"] for f in record["rewards"].values()), record["rewards"]


# ----------------------------------------------------------------------------- issue 14: hedges and huge irrationals


@pytest.mark.parametrize("answer", ["42 minus one", "42 or forty-three", "42 is wrong", "42 times ten",
                                    "42 plus 1", "42 and 43 apples", "42 per", "42 approximately", "42 twenty"])
def test_trailing_words_that_are_not_units_get_no_credit(answer):
    """Only units and counted things may follow the number: arithmetic, hedges and number words may not."""
    completion = f"<think>work</think><answer>{answer}</answer>"
    assert accuracy_reward([completion], answer=["42"]) == [0.0], answer
    assert not answers_match(answer, "42")


@pytest.mark.parametrize("answer", ["42 dollars", "42 cm", "42 km/h", "42 eggs per day", "42 apples", "42 per cent",
                                    "42 minutes.", "$42", "42 kg"])
def test_units_and_counted_things_still_get_credit(answer):
    assert accuracy_reward([f"<think>work</think><answer>{answer}</answer>"], answer=["42"]) == [1.0], answer


def test_a_huge_irrational_is_neither_whole_nor_equal_to_a_whole_number():
    huge = "\\sqrt{" + "9" * 40 + "}"  # 10**20 - 5e-21: a float that is_integer() calls whole
    completion = f"<think>work</think><answer>{huge}</answer>"
    assert R.int_answer_reward([completion]) == [0.0]
    assert accuracy_reward([completion], answer=["1" + "0" * 20]) == [0.0]
    assert R.int_answer_reward(["<think>w</think><answer>\\sqrt{16}</answer>"]) == [1.0]  # exactly 4


# ----------------------------------------------------------------------------- issue 55: the equation a reply states


@pytest.mark.parametrize("text, false", [
    ("Emma has 3 * 2 * 2 = 6 apples", ["3 * 2 * 2 = 6"]),  # notebook 04: right_answer_reward pays it (states 6)
    ("Tom has 4 * 5 * 4 = 60 pens in total.", ["4 * 5 * 4 = 60"]),  # 04's own question: 4 boxes of 5 pens
    ("10 - 15 = 5\nZoe has 15 cards left.", ["10 - 15 = 5"]),  # the untrained model, results/false_equations.json
    ("Sam has 7 x 4 = 27 pencils", ["7 x 4 = 27"]),
    ("3 × 4 = 13 and 12 ÷ 4 = 4", ["3 × 4 = 13", "12 ÷ 4 = 4"]),
    ("Tom has $1,200 + $300 = $1,600.", ["1,200 + $300 = $1,600"]),
    ("2 + 3 = 5 = 6", ["2 + 3 = 5 = 6"]),  # a chain: its last link is false
    ("2 + 3 = 6 = 6", ["2 + 3 = 6 = 6"]),  # ... or its first
    ("3 + 2 = 5 apples, then 4 + 4 = 9", ["4 + 4 = 9"]),  # only the false one of two
    ("2 / 3 = 0.66", ["2 / 3 = 0.66"]),  # 0.666..., not 0.66 to two places
    ("7 / 2 = 3", ["7 / 2 = 3"]),  # a whole number is not a rounding of 3.5
    ("Mia (so 3 + 2 = 6) has 6.", ["3 + 2 = 6"]), ("Mia has (3 + 2 = 6) apples", ["(3 + 2 = 6)"]),  # brackets
])
def test_equation_errors_finds_the_false_equations(text, false):
    assert R.equation_errors(text) == false
    assert R.equation_errors(conv(text)) == false


@pytest.mark.parametrize("text", [
    "Emma has 3 x 2 = 6 apples.", "3 × 4 = 12 and 12 ÷ 4 = 3", "Tom has $1,200 + $300 = $1,500.",
    "2 + 3 = 5 = 5", "2 * (3 + 4) = 14 = 7 * 2", "(3 + 2) * 2 = 10", "Mia (so 3 + 2 = 5) has 5.",
    "10 / 4 = 2.5", "1/2 + 1/4 = 3/4", "7 / 3 = 2.33", "2 / 3 = 0.67", "1 / 3 = 0.333", "5 - 8 = -3", "10 − 3 = 7",
    "2.5 * 4 = 10", "0.1 + 0.2 = 0.3",  # exact decimals: 0.1 + 0.2 is 0.3 here, unlike in floats
    "The answer is 3 + 4 = 7. 7 x 2 = 14.", "",
])
def test_equation_errors_passes_true_equations(text):
    assert R.equation_errors(text) == []


@pytest.mark.parametrize("text", [
    "She has 3 bags x 2 = 6", "3 bags x 2 + 1 = 7",  # words before an operator: "2 + 1 = 7" is not the equation
    "50% of 10 = 5", "Tom is 10 = 5 + 5 years",  # no operator before '=', then a true one
    "x = 5", "2x = 10", "a = b = c", "a2 + 2 = 5", "Tom has x + 3 = 9 pens",  # algebra: names are not numbers
    "__import__('os').system('touch pwned') = 0", "len('abc') = 4", "print(1) + 1 = 7",
    "9**9**9 = 1", "1 / 0 = 5", "(1 + = 3", "1" * 150 + " + 1 = 2",  # refused: too big, undefined, broken, too long
    "1 + 0 = " * 30 + "2",  # a chain longer than MAX_EQUATION_CHARS (200) is not read
])
def test_equation_errors_refuses_what_is_not_plain_arithmetic(text):
    assert R.equation_errors(text) == []


def test_equation_errors_never_hands_a_name_to_the_calculator(monkeypatch):
    import labkit.rewards.functions as F

    seen, ran = [], []
    calculate = F.safe_calculate
    monkeypatch.setattr(F, "safe_calculate", lambda expression: seen.append(expression) or calculate(expression))
    monkeypatch.setattr(os, "system", lambda *a: ran.append(a) or 0)
    texts = ["__import__('os').system('ls') + 1 = 1", "os.getcwd() * 2 = 3", "exec('1') - 1 = 0", "Tom's x + 3 = 5",
             "f(2) * 3 = 6 and g(1) + 1 = 3", "lambda: 1 = 2 * 1", "Emma has 3 * 2 * 2 = 6 apples"]
    for text in texts:
        R.equation_errors(text)
    assert seen and not ran
    assert not [e for e in seen if any(c.isalpha() and c not in "xX" for c in e) or "_" in e], seen


@pytest.mark.parametrize("text", ["1=1=" * 25_000, "1+1=3, " * 15_000, "1+1=3a" * 20_000, "(" * 50_000 + "= 1",
                                  "9**9**9**9 = 1, " * 6_000, "1" * 4_400 + "**2 = 1", "2 " * 50_000 + "= 2",
                                  "=" * 100_000, "1 + 1 = 3\n" * 10_000])
def test_equation_errors_on_huge_inputs_returns_and_reads_at_most_the_last_few(text):
    results = []
    worker = threading.Thread(target=lambda: results.append(R.equation_errors(text)), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), f"{text[:20]!r}... is still being read"
    assert len(results[0]) <= MAX_EQUATIONS


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(text=completions_text())
def test_equation_errors_returns_pieces_of_any_text(text):
    errors = R.equation_errors(text)
    assert isinstance(errors, list) and len(errors) <= MAX_EQUATIONS
    assert all(isinstance(e, str) and "=" in e and e in text for e in errors)


def test_bench_false_equations_counts_right_replies_with_false_equations(tmp_path):
    import json

    from bench import false_equations

    def reply(before, after, gold="6"):
        return {"question": "Emma has 3 bags with 2 apples in each bag. How many?", "gold": gold, "before": before,
                "after": after}

    (tmp_path / "smollm2_short.json").write_text(json.dumps({"examples": [
        reply("Emma has 3 * 2 * 2 = 6 apples", "Emma has 3 x 2 = 6 apples."),  # right, false -> right, true
        reply("Emma has 3 x 2 = 5", "Emma has 3 x 2 = 5"),  # wrong either way: not counted
    ]}))
    (tmp_path / "smollm2_long").mkdir()
    (tmp_path / "smollm2_long" / "latest_completions.json").write_text(json.dumps({"completions": [
        {**reply("6", "Emma has 2 + 2 = 6 apples."), "now": "Emma has 2 + 2 = 6 apples."}]}))
    out = tmp_path / "false_equations.json"
    assert false_equations.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    counts = {(run["file"], stage): (run[stage]["scored_right"], run[stage]["right_with_false_equation"])
              for run in record["runs"] for stage in ("before", "after")}
    assert counts == {("smollm2_short.json", "before"): (1, 1), ("smollm2_short.json", "after"): (1, 0),
                      ("smollm2_long/latest_completions.json", "before"): (1, 0),
                      ("smollm2_long/latest_completions.json", "after"): (1, 1)}
    assert record["runs"][0]["before"]["right_and_false"][0]["false_equations"] == ["3 * 2 * 2 = 6"]
    assert {"date", "device", "versions"} <= set(record["provenance"])


# ----------------------------------------------------------------------------- your own task (issue 53, item 5)


def _own_task(n=20):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"What is {i} + 1?"}] for i in range(n)],
                              "answer": [str(i + 1) for i in range(n)]})


def _exact(completions, answer, **kwargs):
    return [1.0 if completion_text(c).strip() == gold else 0.0 for c, gold in zip(completions, answer)]


@pytest.mark.parametrize("reward, words", [
    (lambda completions, **kwargs: [1.0], ["returned 1 rewards for 4 completions"]),
    (lambda completions, **kwargs: 1 / 0, ["raised ZeroDivisionError", "columns: answer"]),
    (lambda completions, **kwargs: ["1"] * len(completions), ["returned '1' (str)"]),
    (lambda completions, **kwargs: [True] * len(completions), ["returned True (bool)"]),
    # inf gives its group NaN advantages; nan, the result of a 0 / 0, is what check_reward_function calls a bug too
    (lambda completions, **kwargs: [float("inf")] * len(completions), ["returned inf (float)", "finite number"]),
    (lambda completions, **kwargs: [0.0, float("nan")] * (len(completions) // 2), ["returned nan (float)"]),
    (lambda completions, gold, **kwargs: gold, ["raised TypeError", "gold"]),  # a column the dataset lacks
])
def test_a_reward_that_would_fail_in_trl_is_named_before_any_model_loads(reward, words):
    from labkit.presets import PresetError, get_preset
    from labkit.validation import validate

    errors = R.task_errors(_own_task(), (reward,))
    assert len(errors) == 1 and errors[0].startswith("reward <lambda> ") and all(w in errors[0] for w in words), errors
    with pytest.raises(PresetError, match="reward <lambda>"):
        validate(get_preset("cpu-tiny", task=_own_task(), rewards=reward))


def test_your_own_dataset_needs_a_prompt_column_and_rows():
    assert R.task_errors(_own_task(), (_exact, "accuracy")) == []
    missing = R.task_errors(_own_task().rename_column("prompt", "question"), (_exact,))
    assert "no 'prompt' column (its columns: question, answer)" in missing[0]
    assert "rename_column('question', 'prompt')" in missing[0]
    assert "no rows" in R.task_errors(_own_task().select([]), (_exact,))[0]
    assert "not a list" in R.task_errors([{"prompt": "x"}], (_exact,))[0]


def test_a_preset_with_your_task_names_them_when_saved_and_is_json():
    import json

    from labkit.presets import Preset, get_preset

    preset = get_preset("cpu-tiny", task=_own_task(), rewards=[_exact, "format"])
    saved = json.loads(json.dumps(preset.to_dict()))
    assert saved["task"].startswith("your dataset: 20 rows, fingerprint ")
    assert saved["rewards"] == ["your function _exact", "format"]
    assert Preset.from_dict(saved).to_dict() == saved  # what a resume compares


def test_notebook_02s_own_task_passes_the_checks_on_the_real_modes_card_too():
    """Section 10 runs the workshop preset in real mode: the same task and reward pass its checks on a T4."""
    from labkit.presets import card_device, get_preset
    from labkit.validation import validate

    preset = get_preset("workshop", task=_own_task(), rewards=[_exact], max_steps=2, save_strategy="no", train_limit=None)
    assert validate(preset, card_device(preset)) == []
