"""The tool environment exercise (notebook 08): the learner writes ``CalculatorEnv``, the class TRL calls.

Reference: :class:`labkit.tools.CalculatorEnv`. The learner writes a *class*, so each case is a script played
on a fresh instance of it, as TRL 1.16's ``GRPOTrainer`` drives an ``environment_factory`` instance: ``reset``
with the dataset row, then the tool calls the model wrote, then ``get_reward``; one instance serves several
rollouts in turn (TRL pools and resets them). The transcript of what each call returned is compared with the
reference's, call by call (the verdict names the first call that differs): an error message matches any
``"error: ..."`` string, and an exception is recorded with its type and message (a tool must return a message,
never raise; any exception matches any other when a known mistake is looked for). The known mistakes are whole wrong classes: ``eval``, an exception on a
bad expression, no cap on calls, a reset that keeps the last rollout's results, a reward for any call.
Solutions: ``docs/solutions/08_grpo_with_tools.md``.
"""
from __future__ import annotations

from labkit.exercises import Case, Exercise, _short, register
from labkit.tools import ERROR_PREFIX, MAX_CALLS, CalculatorEnv, safe_calculate

__all__ = ["CALCULATOR_ENV", "Raised", "Transcript", "play"]

_SOLUTIONS_08 = "docs/solutions/08_grpo_with_tools.md"

# Each script: (method, arguments) in order; "reset" takes the dataset row as keyword arguments.
_SCRIPTS = {
    "a right call: the gold is 56, the model calls calculate('7 * 8')":
        [("reset", {"answer": "56"}), ("calculate", "7 * 8"), ("get_reward", None)],
    "a wrong call: the gold is 56, the model calls calculate('7 + 8')":
        [("reset", {"answer": "56"}), ("calculate", "7 + 8"), ("get_reward", None)],
    "a division by zero: calculate('10 / 0')":
        [("reset", {"answer": "5"}), ("calculate", "10 / 0"), ("calculate", "10 / 2"), ("get_reward", None)],
    "a malicious expression: calculate(\"__import__('os').getpid()\")":
        [("reset", {"answer": "0"}), ("calculate", "__import__('os').getpid()"), ("get_reward", None)],
    "a number too large: calculate('10**400')":
        [("reset", {"answer": "1"}), ("calculate", "10**400"), ("get_reward", None)],
    "an argument of the wrong type: calculate(56), a number instead of a string":
        [("reset", {"answer": "56"}), ("calculate", 56), ("get_reward", None)],
    f"more calls than allowed: {MAX_CALLS + 1} calls, the last one right":
        [("reset", {"answer": "4"})] + [("calculate", "1 + 1")] * MAX_CALLS + [("calculate", "2 + 2"),
                                                                                ("get_reward", None)],
    "two rollouts on one environment (TRL reuses instances): the second makes no call":
        [("reset", {"answer": "56", "prompt": []}), ("calculate", "7 * 8"), ("get_reward", None),
         ("reset", {"answer": "56", "prompt": []}), ("get_reward", None), ("calculate", "1 + 1"),
         ("calculate", "1 + 1"), ("calculate", "1 + 1")],
}


def _outcome(value) -> object:
    """What a transcript keeps of one call's result: an error is any 'error: ...' text; numbers by value."""
    if isinstance(value, str):
        if value.startswith(ERROR_PREFIX.strip()) or value.lower().startswith("error"):
            return "an error message"
        checked = safe_calculate(value)
        return checked if not checked.startswith(ERROR_PREFIX) else value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{type(value).__name__} {_short(value, 40)} (a tool returns a string, get_reward a float)"
    return float(value)


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


class Transcript(list):
    """What each call of a script returned, in order; ``calls`` says which call each entry is."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []


def _call(method: str, argument) -> str:
    if isinstance(argument, dict):  # reset's dataset row, as keyword arguments
        return f"{method}({', '.join(f'{key}={value!r}' for key, value in argument.items())})"
    return f"{method}()" if argument is None else f"{method}({argument!r})"


def play(environment_class):
    """Return a function ``script -> transcript``: the script played on one new instance of ``environment_class``.

    ``NotImplementedError`` (an unfilled stub) propagates; any other exception is recorded in the transcript
    as :class:`Raised` (shown ``raised <Error>: <message>``), the way TRL records a failing tool call, and the
    script goes on.
    """
    def run(script):
        env = environment_class()
        transcript = Transcript()
        for method, argument in script:
            try:
                if method == "reset":
                    getattr(env, "reset")(**argument)
                    continue
                result = getattr(env, method)() if argument is None else getattr(env, method)(argument)
                outcome = _outcome(result)
            except NotImplementedError:
                raise
            except Exception as error:  # noqa: BLE001  a tool that raises is the learner's mistake to show
                outcome = Raised(error)
            transcript.append(outcome)
            transcript.calls.append(_call(method, argument))
        return transcript

    run.environment_class = environment_class
    return run


def _compare(expected: Transcript, got) -> str | None:
    """Return ``None`` when the transcripts agree, else the first call whose result differs, named."""
    if not isinstance(got, list) or len(got) != len(expected):
        return f"expected the transcript {_short(expected)}, got {_short(got)}"
    for number, (call, e, g) in enumerate(zip(expected.calls, expected, got), 1):
        if e != g:
            return f"call {number} of {len(expected)}, {call}: labkit's returns {e!r}, yours {g!r}"
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


class _NoCap(CalculatorEnv):
    max_calls = float("inf")  # every call is evaluated, however many a rollout makes


class _KeepsLastRollout(CalculatorEnv):
    def __init__(self):
        self.calls, self.errors, self.results = 0, 0, []

    def reset(self, answer=None, **example) -> None:
        self.answer = None if answer is None else str(answer)  # calls and results are not cleared


class _RewardsAnyCall(CalculatorEnv):
    def get_reward(self) -> float:
        return 1.0 if self.results else 0.0


CALCULATOR_ENV = register(Exercise(
    name="calculator_env",
    reference=CalculatorEnv,
    cases=_cases,
    adapt=play,
    compare=_compare,
    mistakes={
        "it evaluates with eval(): the model's text runs as Python ('__import__(\"os\").getpid()' gave a number); "
        "evaluate with labkit.tools.safe_calculate, which parses and never runs code": _UsesEval,
        "a bad expression raises instead of returning an 'error: ...' string: the model should read what went "
        "wrong, and an exception must never stop a rollout; return safe_calculate's message": _Raises,
        f"no cap on calls: call {MAX_CALLS + 1} was evaluated; count calls in self.calls and answer "
        f"'error: ...' once there are more than max_calls ({MAX_CALLS})": _NoCap,
        "reset() keeps the last rollout's calls and results: TRL reuses an environment for the next rollout, "
        "which then earns a reward it did not make; clear calls, errors and results in reset": _KeepsLastRollout,
        "get_reward pays for any successful call: it must pay only when a result equals the gold answer "
        "(labkit.rewards.answers_match)": _RewardsAnyCall,
    },
    nudge="reset clears the rollout; calculate counts calls, refuses past max_calls, returns safe_calculate's text; "
          "get_reward checks results.",
    hint="reset(self, answer=None, **example): keep str(answer), set self.calls = self.errors = 0 and "
         "self.results = []. calculate(self, expression): self.calls += 1; past self.max_calls return "
         "'error: at most ... calls' (and count an error); else result = safe_calculate(expression); count an "
         "error if it starts with 'error: ', else append it to self.results; return it. get_reward(self): 1.0 if "
         "any result answers_match the gold answer, else 0.0.",
    solution=f"{_SOLUTIONS_08}#exercise-calculator_env",
    reference_name="labkit.tools.CalculatorEnv",
))
