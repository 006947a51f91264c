"""The tool environment exercise (notebook 08): the learner writes ``CalculatorEnv``, the class TRL calls.

Reference: :class:`labkit.environments.CalculatorEnv`. The learner writes a *class*, so each case is a script played
on instances of it as TRL 1.16's ``GRPOTrainer`` drives an ``environment_factory`` (trl/trainer/grpo_trainer.py):
TRL keeps a pool of instances, one per rollout of a batch (lines 2352-2360), calls ``reset(**row)`` on every one of
them with its whole dataset row (lines 2385-2398), then runs the tool calls the model wrote, rollout after rollout
and round after round (``_tool_call_loop``, lines 1957-1994), then calls every ``get_reward()`` (lines 719-725); the
next batch resets the same instances. Each step of a script names its instance, so several instances live at once
and state kept on the class is shared, as it would be under TRL.

The transcript keeps what TRL makes of each step: what ``reset`` returned (``None`` keeps the prompt; a string is
appended to the prompt's last message, line 2398: it must never hold the gold answer), each tool result (an error
message matches any ``"error: ..."`` string; an exception is recorded with its type and message, and any exception
matches any other when a known mistake is looked for), each reward, and the tools TRL makes of the class (its public
methods but ``reset`` and ``get_reward``, :func:`labkit.environments.environment_tools`) rendered by the chat template
notebook 08 gives SmolLM2 (``apply_chat_template(..., tools=...)``: a method without type hints or docstring cannot
become a schema). It is compared with the reference's, step by step; the verdict names the first that differs. The
known mistakes are whole wrong classes, each named with what TRL would do with it.
Solutions: ``docs/solutions/08_grpo_with_tools.md``.
"""
from __future__ import annotations

import functools
import json
import re

from labkit.environments import (ERROR_PREFIX, MAX_CALLS, CalculatorEnv, environment_tools, prepare_tool_tokenizer,
                                 safe_calculate, tool_prompt)
from labkit.exercises import Case, Exercise, register
from labkit.exercises.compare import short_repr
from labkit.rewards.parse import answers_match

__all__ = ["CALCULATOR_ENV", "Raised", "Tools", "Transcript", "play"]

_SOLUTIONS_08 = "docs/solutions/08_grpo_with_tools.md"


def _row(answer, question: str = "Mia has 7 bags with 8 stickers in each bag. How many stickers does Mia have?"):
    """A dataset row as TRL hands it to ``reset``: every column, the prompt included."""
    return {"prompt": tool_prompt(question), "answer": answer}


# Each script: (instance, method, argument) in order; "reset" takes the dataset row as keyword arguments, "tools"
# renders the tools TRL makes of the instance. Instance k is made the first time it is named.
_SCRIPTS = {
    "a right call: the gold is 56, the model calls calculate('7 * 8')":
        [(0, "reset", _row("56")), (0, "calculate", "7 * 8"), (0, "get_reward", None)],
    "the tools TRL makes of your class, rendered by the chat template into the prompt":
        [(0, "tools", None)],
    "a wrong call: the gold is 56, the model calls calculate('7 + 8')":
        [(0, "reset", _row("56")), (0, "calculate", "7 + 8"), (0, "get_reward", None)],
    "a division by zero: calculate('10 / 0')":
        [(0, "reset", _row("5")), (0, "calculate", "10 / 0"), (0, "calculate", "10 / 2"), (0, "get_reward", None)],
    "a malicious expression: calculate(\"__import__('os').getpid()\")":
        [(0, "reset", _row("0")), (0, "calculate", "__import__('os').getpid()"), (0, "get_reward", None)],
    "a number too large: calculate('10**400')":
        [(0, "reset", _row("1")), (0, "calculate", "10**400"), (0, "get_reward", None)],
    "an argument of the wrong type: calculate(56), a number instead of a string":
        [(0, "reset", _row("56")), (0, "calculate", 56), (0, "get_reward", None)],
    f"more calls than allowed: {MAX_CALLS + 1} calls, the last one right":
        [(0, "reset", _row("4"))] + [(0, "calculate", "1 + 1")] * MAX_CALLS + [(0, "calculate", "2 + 2"),
                                                                               (0, "get_reward", None)],
    f"failed calls count too: {MAX_CALLS} divisions by zero, then a right call":
        [(0, "reset", _row("56"))] + [(0, "calculate", "10 / 0")] * MAX_CALLS + [(0, "calculate", "7 * 8"),
                                                                                 (0, "get_reward", None)],
    "the gold number itself, not a substring: the gold is 5, the model computes 15":
        [(0, "reset", _row("5")), (0, "calculate", "3 * 5"), (0, "get_reward", None)],
    "a right result, then another call: the gold is 56, calculate('7 * 8') then calculate('56 + 1')":
        [(0, "reset", _row("56")), (0, "calculate", "7 * 8"), (0, "calculate", "56 + 1"), (0, "get_reward", None)],
    "the gold as the dataset holds it, a number: reset(answer=56)":
        [(0, "reset", _row(56)), (0, "calculate", "7 * 8"), (0, "get_reward", None)],
    "the gold as a float column holds it: reset(answer=56.0), the model computes 56":
        [(0, "reset", _row(56.0)), (0, "calculate", "7 * 8"), (0, "get_reward", None)],
    "two rollouts on one environment (TRL reuses instances): the second makes no call":
        [(0, "reset", _row("56")), (0, "calculate", "7 * 8"), (0, "get_reward", None),
         (0, "reset", _row("56")), (0, "get_reward", None), (0, "calculate", "1 + 1"),
         (0, "calculate", "1 + 1"), (0, "calculate", "1 + 1")],
    "a batch of two rollouts as TRL plays it: both reset, their calls interleaved, then both rewards":
        [(0, "reset", _row("56")), (1, "reset", _row("56")), (0, "calculate", "7 + 8"), (1, "calculate", "7 + 8"),
         (0, "calculate", "7 * 8"), (1, "calculate", "1 + 1"), (1, "calculate", "2 + 2"),
         (0, "get_reward", None), (1, "get_reward", None)],
}


def _outcome(value) -> object:
    """What a transcript keeps of one call's result: an error is any 'error: ...' text; numbers by value."""
    if isinstance(value, str):
        if value.lower().startswith("error"):  # ERROR_PREFIX, or the learner's own wording
            return "an error message"
        checked = safe_calculate(value)
        return checked if not checked.startswith(ERROR_PREFIX) else value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{type(value).__name__} {short_repr(value, 40)} (a tool returns a string, get_reward a float)"
    return float(value)


def _reset_outcome(value, row: dict) -> str:
    """What TRL makes of what ``reset`` returned (trl/trainer/grpo_trainer.py lines 2385-2398)."""
    if value is None or value == "":
        return "None: the prompt stays as it is"
    if isinstance(value, str):
        numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", value)
        if any(answers_match(n, row["answer"]) for n in numbers):
            return "a text appended to the prompt that holds the gold answer"
        return f"the text {short_repr(value, 60)} appended to the prompt"
    return f"{type(value).__name__} {short_repr(value, 40)}: TRL appends it to the prompt's text, which fails"


class Raised:
    """A call that raised instead of returning: shows the exception's type and message; equal to any other."""

    def __init__(self, error: BaseException):
        self.error = error

    def __eq__(self, other) -> bool:
        return isinstance(other, Raised)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"raised {type(self.error).__name__}: {self.error}"


class Tools:
    """The tools TRL makes of an instance, as the chat template renders them: equal when of the same ``kind``.

    ``kind`` is the rendered signature (``"calculate(expression: string)"``), or what stops it: tools besides
    ``calculate`` (``"more tools than calculate"``), no ``calculate``, or a schema the template cannot build.
    """

    def __init__(self, kind: str, detail: str = ""):
        self.kind, self.detail = kind, detail

    def __eq__(self, other) -> bool:
        return isinstance(other, Tools) and other.kind == self.kind

    def __hash__(self) -> int:
        return hash(self.kind)

    def __repr__(self) -> str:
        return self.kind + (f" ({self.detail})" if self.detail else "")


@functools.lru_cache(maxsize=1)
def _tool_tokenizer():
    """The template notebook 08 gives SmolLM2 (Qwen2.5's, through prepare_tool_tokenizer), on the offline tiny tokenizer."""
    from labkit.models import tiny_tokenizer

    return prepare_tool_tokenizer(tiny_tokenizer())


def _rendered_tools(env) -> Tools:
    """Return the tools TRL makes of ``env``, rendered into a prompt by the chat template, as a :class:`Tools`."""
    tools = environment_tools(env)
    names = [getattr(tool, "__name__", repr(tool)) for tool in tools]
    if [n for n in names if n != "calculate"]:
        return Tools("more tools than calculate", f"TRL makes a tool of every public method: {names}")
    if not names:
        return Tools("no calculate tool", "no public method calculate: the prompt has no tool")
    try:
        text = _tool_tokenizer().apply_chat_template(tool_prompt("q"), tools=tools, add_generation_prompt=True,
                                                     tokenize=False)
    except Exception as error:  # noqa: BLE001  transformers' schema parser: a missing type hint or docstring
        return Tools(f"no schema: {type(error).__name__}", str(error))
    block = re.search(r"<tools>\n(.*?)\n</tools>", text, re.DOTALL)  # the schemas, one JSON object a line
    signatures = []
    for line in block.group(1).splitlines() if block else []:
        function = json.loads(line)["function"]
        arguments = [f"{name}: {spec.get('type')}" for name, spec in function["parameters"].get("properties", {}).items()]
        signatures.append(f"{function['name']}({', '.join(arguments)})")
    return Tools("; ".join(signatures))


class Transcript(list):
    """What each step of a script returned, in order; ``calls`` says which step each entry is."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []
        self.methods: list[str] = []  # the method each step called ("reset", "calculate", "get_reward", "tools")


def _call(instance: int, method: str, argument, several: bool) -> str:
    who = f"instance {instance + 1}: " if several else ""
    if isinstance(argument, dict):  # reset's dataset row, as keyword arguments
        return f"{who}{method}(answer={argument['answer']!r}, prompt=...)"
    return f"{who}{method}()" if argument is None else f"{who}{method}({argument!r})"


def play(environment_class):
    """Return a function ``script -> transcript``: the script played on new instances of ``environment_class``.

    Instance ``k`` of a script is made the first time it is named (a constructor that raises fails the check).
    ``NotImplementedError`` (an unfilled stub) propagates; any other exception is recorded in the transcript
    as :class:`Raised` (shown ``raised <Error>: <message>``). After a tool's exception the script goes on, as TRL
    sends the model ``{"error": ...}``; after one in ``reset`` or ``get_reward`` it stops, as TRL's step does.
    """
    def run(script):
        instances: dict[int, object] = {}
        several = len({step[0] for step in script}) > 1
        transcript = Transcript()
        for instance, method, argument in script:
            if instance not in instances:
                instances[instance] = environment_class()
            env = instances[instance]
            try:
                if method == "reset":
                    outcome = _reset_outcome(getattr(env, "reset")(**argument), argument)
                elif method == "tools":
                    outcome = _rendered_tools(env)
                else:
                    outcome = _outcome(getattr(env, method)() if argument is None else getattr(env, method)(argument))
            except NotImplementedError:
                raise
            except Exception as error:  # noqa: BLE001  a tool that raises is the learner's mistake to show
                outcome = Raised(error)
            transcript.append(outcome)
            transcript.calls.append(_call(instance, method, argument, several))
            transcript.methods.append(method)
            if isinstance(outcome, Raised) and method in _UNCAUGHT:
                break  # TRL catches a tool's exception, not reset's or get_reward's: the training step stops there
        return transcript

    run.environment_class = environment_class
    return run


# The steps whose exception TRL does not catch (grpo_trainer.py line 2389 calls reset, 725 get_reward, outside any
# try): the step stops, where a tool's exception becomes {"error": ...} for the model (lines 1987-1989).
_UNCAUGHT = {"reset": "reset", "get_reward": "get_reward", "tools": "rendering the tools"}


def _compare(expected: Transcript, got) -> str | None:
    """Return ``None`` when the transcripts agree, else the first step whose result differs, named."""
    if not isinstance(got, list) or len(got) > len(expected):
        return f"expected the transcript {short_repr(expected)}, got {short_repr(got)}"
    for number, (call, method, e, g) in enumerate(zip(expected.calls, expected.methods, expected, got), 1):
        if e != g:
            stops = (f"; TRL does not catch an exception of {_UNCAUGHT[method]}: training stops there"
                     if isinstance(g, Raised) and method in _UNCAUGHT else "")
            return f"call {number} of {len(expected)}, {call}: labkit's returns {e!r}, yours {g!r}{stops}"
    if len(got) < len(expected):
        return f"the transcript stops after call {len(got)} of {len(expected)}: {short_repr(got)}"
    return None


def _cases() -> list[Case]:
    return [Case(label, (script,)) for label, script in _SCRIPTS.items()]


# --------------------------------------------------------------------------- plausible wrong environments


class _UsesEval(CalculatorEnv):
    def calculate(self, expression: str) -> str:
        self.calls += 1
        if self.calls > self.max_calls:
            return f"{ERROR_PREFIX}too many calls"
        try:
            result = str(eval(expression))  # noqa: S307  the mistake this exercise exists to catch
        except Exception as error:  # noqa: BLE001
            self.errors += 1
            return f"{ERROR_PREFIX}{error}"
        self.results.append(result)
        return result


class _Raises(CalculatorEnv):
    def calculate(self, expression: str) -> str:
        from labkit.rewards.parse import evaluate_expression

        self.calls += 1
        if self.calls > self.max_calls:
            return f"{ERROR_PREFIX}too many calls"
        value = evaluate_expression(expression, allow_power=True)  # raises on a number, gives None on 10 / 0
        result = str(value.numerator) if value.denominator == 1 else str(float(value))  # AttributeError on None
        self.results.append(result)
        return result


class _RaisesPastCap(CalculatorEnv):
    def calculate(self, expression: str) -> str:
        self.calls += 1
        if self.calls > self.max_calls:
            raise RuntimeError(f"at most {self.max_calls} calls")  # the rule: never raise, return the message
        self.calls -= 1
        return super().calculate(expression)


class _NoCap(CalculatorEnv):
    max_calls = float("inf")  # every call is evaluated, however many a rollout makes


class _CapOneEarly(CalculatorEnv):
    def calculate(self, expression: str) -> str:
        if self.calls + 1 >= self.max_calls:  # refuses the last allowed call too
            self.calls += 1
            return f"{ERROR_PREFIX}at most {self.max_calls} calls"
        return super().calculate(expression)


class _CapCountsResults(CalculatorEnv):
    def calculate(self, expression: str) -> str:
        if len(self.results) >= self.max_calls:  # only calls that gave a result count towards the cap
            return f"{ERROR_PREFIX}at most {self.max_calls} calls"
        result = safe_calculate(expression)
        if not result.startswith(ERROR_PREFIX):
            self.results.append(result)
        return result


class _KeepsLastRollout(CalculatorEnv):
    def __init__(self):
        self.calls, self.errors, self.results = 0, 0, []

    def reset(self, answer=None, **example) -> None:
        self.answer = None if answer is None else str(answer)  # calls and results are not cleared


class _StateOnTheClass(CalculatorEnv):
    results: list = []  # one list on the class: every instance appends to it

    def __init__(self):
        self.reset()

    def reset(self, answer=None, **example) -> None:
        self.answer = None if answer is None else str(answer)
        self.calls, self.errors = 0, 0
        self.results.clear()  # clears the class's list: the other rollouts' results too, and only at a reset


class _ResetReturnsAnswer(CalculatorEnv):
    def reset(self, answer=None, **example) -> str:
        super().reset(answer, **example)
        return f"The answer is {answer}."  # TRL appends it to the question


class _ResetWithoutRow(CalculatorEnv):
    def reset(self, answer=None) -> None:  # TRL passes every column of the row: prompt=... raises TypeError
        super().reset(answer)


class _NoTypeHint(CalculatorEnv):
    def calculate(self, expression):  # noqa: ANN001  the type hint the schema needs is missing
        """Evaluate an arithmetic expression and return its value.

        Args:
            expression: numbers with + - * / and brackets, for example "7 * (8 + 2)".
        """
        return super().calculate(expression)


class _NoDocstring:  # not a subclass: inspect.getdoc would find the reference's docstring
    max_calls = MAX_CALLS

    def __init__(self):
        self._env = CalculatorEnv()

    def reset(self, answer=None, **example) -> None:
        return self._env.reset(answer, **example)

    def calculate(self, expression: str) -> str:
        return self._env.calculate(expression)

    def get_reward(self) -> float:
        return self._env.get_reward()


class _PublicHelper(CalculatorEnv):
    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return its value.

        Args:
            expression: numbers with + - * / and brackets, for example "7 * (8 + 2)".
        """
        return self.record(super().calculate(expression))

    def record(self, result: str) -> str:  # a helper without an underscore: TRL makes it a second tool
        return result


class _RewardsAnyCall(CalculatorEnv):
    def get_reward(self) -> float:
        return 1.0 if self.results else 0.0


class _RewardsSubstring(CalculatorEnv):
    def get_reward(self) -> float:
        return 1.0 if self.answer is not None and any(self.answer in r for r in self.results) else 0.0


class _RewardsLastResult(CalculatorEnv):
    def get_reward(self) -> float:
        return 1.0 if self.results and answers_match(self.results[-1], self.answer) else 0.0


class _RewardsExactText(CalculatorEnv):
    def get_reward(self) -> float:
        return 1.0 if self.answer in self.results else 0.0  # the text '56.0' is not the text '56'


class _ComparesText(CalculatorEnv):
    def reset(self, answer=None, **example) -> None:
        super().reset(answer, **example)
        self.answer = answer  # kept as the dataset holds it: 56, not "56"

    def get_reward(self) -> float:
        return 1.0 if self.answer in self.results else 0.0  # text against the gold: "56" != 56


_TRL = "trl/trainer/grpo_trainer.py"
CALCULATOR_ENV = register(Exercise(
    name="calculator_env",
    reference=CalculatorEnv,
    cases=_cases,
    adapt=play,
    compare=_compare,
    mistakes={
        "it evaluates with eval(): the model's text runs as Python ('__import__(\"os\").getpid()' gave a number); "
        "evaluate with labkit.environments.safe_calculate, which parses and never runs code": _UsesEval,
        "a bad expression raises instead of returning an 'error: ...' string: TRL would send the model "
        "{'error': ...} and count a tool failure, so the model never reads what went wrong; return "
        "safe_calculate's message": _Raises,
        "past max_calls calculate raises an exception where it should return an 'error: ...' string: TRL would "
        "count a tool failure and send the model the exception, where the rule is never raise; return 'error: at "
        "most ... calls'": _RaisesPastCap,
        f"no cap on calls: call {MAX_CALLS + 1} was evaluated; count calls in self.calls and answer "
        f"'error: ...' once there are more than max_calls ({MAX_CALLS})": _NoCap,
        f"the cap refuses call {MAX_CALLS}: TRL would give the model one call fewer than max_calls ({MAX_CALLS}); "
        "refuse only once self.calls is more than max_calls": _CapOneEarly,
        "the cap counts only calls that gave a result: failed calls are free, so under TRL a rollout may call "
        "without end; count every call in self.calls, before evaluating it": _CapCountsResults,
        "reset() keeps the last rollout's calls and results: TRL reuses an environment for the next rollout, "
        "which then earns a reward it did not make; clear calls, errors and results in reset": _KeepsLastRollout,
        "state kept on the class (a class-level list): TRL makes one instance per rollout of a batch and resets "
        f"them all before any call ({_TRL} lines 2352-2398), so every rollout of the batch shares that list and "
        "earns the others' rewards; set every piece of state on self in reset": _StateOnTheClass,
        "reset returns text that holds the gold answer: TRL appends a string reset returns to the prompt's last "
        f"message ({_TRL} line 2398), so the model would read the answer it is asked to find; return None": _ResetReturnsAnswer,
        "reset takes only answer: TRL calls reset(**row) with every column of the dataset row (prompt, answer, ...), "
        "and the TypeError stops training; write reset(self, answer=None, **example)": _ResetWithoutRow,
        "calculate has no type hint: transformers cannot build the tool schema TRL puts in the prompt (it raises "
        "TypeHintParsingException when the prompt is rendered); write calculate(self, expression: str) -> str": _NoTypeHint,
        "calculate has no docstring: transformers builds the tool's description from it and raises "
        "DocstringParsingException without one, so the prompt cannot be rendered; keep the docstring with its "
        "Args: section": _NoDocstring,
        "a public helper method: TRL makes every public method but reset and get_reward a tool (grpo_trainer.py "
        "lines 686-697), so the model is offered a second tool; start a helper's name with _": _PublicHelper,
        "get_reward pays for any successful call: it must pay only when a result equals the gold answer "
        "(labkit.rewards.answers_match)": _RewardsAnyCall,
        "get_reward matches a substring ('5' in '15'): TRL would pay for 15 when the gold is 5; compare numbers "
        "with labkit.rewards.answers_match": _RewardsSubstring,
        "get_reward checks only the last result: a rollout that computed the gold and then made another call earns "
        "nothing, though the rule pays any result equal to the gold; check every result": _RewardsLastResult,
        "get_reward looks for the gold's exact text among the results (self.answer in self.results): the gold 56.0 "
        "is the result '56' written another way, as '1,200' is '1200'; compare numbers with "
        "labkit.rewards.answers_match": _RewardsExactText,
        "get_reward compares text with the gold as the dataset holds it ('56' == 56 is False): TRL passes the "
        "column's value as it is; keep str(answer) and compare with labkit.rewards.answers_match": _ComparesText,
    },
    nudge="reset clears state on self, returns None; calculate counts every call, caps, returns safe_calculate's "
          "text; get_reward checks each result; nothing else public.",
    hint="reset(self, answer=None, **example): keep str(answer), set self.calls = self.errors = 0 and "
         "self.results = [] (on self, never on the class); return None. calculate(self, expression: str) -> str, "
         "with its docstring: self.calls += 1 first; past self.max_calls return 'error: at most ... calls' (and "
         "count an error); else result = safe_calculate(expression); count an error if it starts with 'error: ', "
         "else append it to self.results; return it. get_reward(self): 1.0 if any result answers_match the gold "
         "answer, else 0.0. Any helper's name starts with _.",
    solution=f"{_SOLUTIONS_08}#exercise-calculator_env",
    reference_name="labkit.environments.CalculatorEnv",
))
