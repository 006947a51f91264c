"""Tool environments for GRPO: a safe calculator and the environment TRL 1.16 calls it through.

Introduced in ``08_grpo_with_tools.ipynb`` (which teaches it with :mod:`labkit.tools`). TRL 1.16's
``GRPOTrainer(environment_factory=...)`` makes one environment per rollout, calls its ``reset(**example)``
before generation, exposes its public methods as tools (their names, type hints and docstrings become the
tool schema in the prompt), runs the tool calls the model writes (``_tool_call_loop``) and, when the
environment defines ``get_reward()``, adds its value as one more reward (weight 1, logged under the class's name).

A recipe names its environment (``Preset.environment``): :data:`ENVIRONMENTS` maps the name to the class,
and :func:`labkit.run.build_run` hands it to TRL with a tokenizer made ready by :func:`prepare_tool_tokenizer`
and prompts made by :func:`tool_prompt`. This module sits with the rewards and tasks, below the recipe core.

- :func:`safe_calculate`: the calculator: labkit's ast-based evaluator (never ``eval``), with decimals, a
  length cap and a size cap; every bad input gives a short ``"error: ..."`` string, never an exception.
- :class:`CalculatorEnv`: the environment (``reset``, the ``calculate`` tool, ``get_reward``, a cap on calls).
- :func:`prepare_tool_tokenizer`: a tokenizer whose template renders tools and whose replies parse back
  (SmolLM2's own template has no tools: it gets the Qwen2.5 template TRL recognises).
"""
from __future__ import annotations

import ast
import re
import warnings
from fractions import Fraction

__all__ = ["TOOL_SYSTEM_PROMPT", "NO_TOOL_SYSTEM_PROMPT", "MAX_CALLS", "MAX_EXPRESSION_CHARS", "ERROR_PREFIX",
           "safe_calculate", "CalculatorEnv", "ENVIRONMENTS", "environment_tools", "prepare_tool_tokenizer",
           "tool_prompt", "tool_rounds"]

TOOL_SYSTEM_PROMPT = "Use the calculate tool for the arithmetic, then answer in one short sentence."
NO_TOOL_SYSTEM_PROMPT = "Answer in one short sentence."  # the same run without the tool (the comparison arm)
MAX_CALLS = 3  # tool calls a rollout may make; the rest get an error message
MAX_EXPRESSION_CHARS = 100  # longer expressions are refused before parsing
ERROR_PREFIX = "error: "
_DECIMAL = re.compile(r"(?<![\d.])(\d+)\.(\d+)(?![\d.])")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")


def _format(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"


def safe_calculate(expression) -> str:
    """Return the value of an arithmetic expression as text, or a short ``"error: ..."`` message; never raises.

    Accepted: integers and decimals (``2.5`` is read as the exact ``25/10``), ``+ - * /``, ``**`` with an
    exponent of at most 8, brackets, ``x`` / ``×`` for times, thousands separators (``1,200``). Refused with a
    message: a non-string, more than :data:`MAX_EXPRESSION_CHARS` characters, names, calls and attributes
    (``__import__('os')``), division by zero, an incomplete expression (``(1 +``), and any intermediate value
    beyond 10^12 (``9**9**9`` stops at its first power, having computed nothing big). The evaluation is
    :func:`labkit.rewards.parse.evaluate_expression`: ``ast.parse`` and a walk over whitelisted nodes.
    """
    from labkit.rewards.parse import evaluate_expression

    if not isinstance(expression, str):
        return f"{ERROR_PREFIX}the expression must be a string, not {type(expression).__name__}"
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"{ERROR_PREFIX}the expression is longer than {MAX_EXPRESSION_CHARS} characters"
    text = _THOUSANDS.sub("", expression.strip().rstrip("=").strip())
    text = re.sub(r"(?<=[\d)\s])[xX](?=[\s\d(])", "*", text)
    # 0.25 -> (25/100): int() drops the leading zeros Python refuses in "025"
    text = _DECIMAL.sub(lambda m: f"({int(m.group(1) + m.group(2))}/1{'0' * len(m.group(2))})", text)
    if not text:
        return f"{ERROR_PREFIX}empty expression"
    with warnings.catch_warnings():  # ast.parse warns on odd escapes ("\\F") in string literals: model text, not ours
        warnings.simplefilter("ignore")
        value = evaluate_expression(text, allow_power=True)
        if value is not None:
            return _format(value)
        as_product = evaluate_expression(text.replace("/", "*"), allow_power=True)
    if re.search(r"[A-Za-z_]", text):
        return f"{ERROR_PREFIX}only numbers and + - * / ** ( ) are allowed"
    if as_product is not None:  # the same with every "/" read as "*" evaluates: a division by zero
        return f"{ERROR_PREFIX}division by zero"
    if _incomplete(text):  # "(1 + ": say what is wrong with it, not "too large"
        return f"{ERROR_PREFIX}{expression.strip()[:40]!r} is not a complete expression (check its brackets and operators)"
    return f"{ERROR_PREFIX}cannot evaluate {expression[:40]!r} (too large, or not arithmetic)"


def _incomplete(text: str) -> bool:
    """Return whether ``text`` is not even a Python expression (a syntax error: an open bracket, a dangling ``+``)."""
    try:
        ast.parse(text.replace("×", "*").replace("÷", "/").replace("\u2212", "-"), mode="eval")
    except (SyntaxError, ValueError):
        return True
    except (RecursionError, MemoryError):
        return False
    return False


class CalculatorEnv:
    """The lab's tool environment: TRL makes one per rollout (``environment_factory=CalculatorEnv``).

    - ``reset(**example)``: called by TRL before each rollout with the dataset row (``prompt``, ``answer``,
      ...); clears the previous rollout's calls and keeps the gold ``answer``. Returns ``None``: the prompt
      stays as it is (a string would be appended to the last user message).
    - ``calculate(expression)``: the tool (its docstring and type hint become the schema the model reads).
      At most :data:`MAX_CALLS` calls a rollout; every failure is a string that goes back to the model.
    - ``get_reward()``: 1.0 when a call of this rollout returned the gold answer, else 0.0 (TRL adds it to
      the other rewards with weight 1, under the name ``CalculatorEnv``). It can be gamed: a word problem
      (:class:`labkit.tasks.WordProblems`) is one of ``a + b``, ``a - b``, ``a x b``, so three calls, one of each,
      always compute the gold within :data:`MAX_CALLS` = 3. The recipes keep ``right_answer_reward`` (the *stated*
      answer) beside it, which such a rollout does not earn by calling (notebook 08, section 3; tests/test_tools.py).

    ``calls``, ``errors`` and ``results`` are what this rollout did (the notebook's metrics read them).
    """

    max_calls = MAX_CALLS

    def __init__(self):
        self.reset()

    def reset(self, answer=None, **example) -> None:
        self.answer = None if answer is None else str(answer)
        self.calls = 0
        self.errors = 0
        self.results: list[str] = []

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return its value.

        Args:
            expression: numbers with + - * / and brackets, for example "7 * (8 + 2)".
        """
        self.calls += 1
        if self.calls > self.max_calls:
            self.errors += 1
            return f"{ERROR_PREFIX}at most {self.max_calls} calls per question; answer now"
        result = safe_calculate(expression)
        if result.startswith(ERROR_PREFIX):
            self.errors += 1
        else:
            self.results.append(result)
        return result

    def get_reward(self) -> float:
        from labkit.rewards.parse import answers_match

        return 1.0 if any(answers_match(r, self.answer) for r in self.results) else 0.0


# The environments a recipe may name (Preset.environment): the name -> the class TRL gets as environment_factory
ENVIRONMENTS = {"calculator": CalculatorEnv}


def environment_tools(environment) -> list:
    """Return the tools TRL 1.16 makes of an environment instance: its public methods but ``reset`` and ``get_reward``.

    As trl/trainer/grpo_trainer.py lines 686-697 list them (the class's functions, so properties are not evaluated).
    The prompt's tool schema is rendered from these (``apply_chat_template(..., tools=...)``).
    """
    import inspect

    return [getattr(environment, name) for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")]


# ----------------------------------------------------------------------------- the chat template


def prepare_tool_tokenizer(tokenizer):
    """Return ``tokenizer`` ready for tool calls: a template that renders tools, and a response parser.

    A template that cannot render a tool conversation (SmolLM2's: TRL's ``supports_tool_calling`` is False)
    is replaced by TRL's copy of Qwen2.5's ChatML template (``trl/chat_templates/qwen2_5.jinja``): SmolLM2
    speaks ChatML (``<|im_start|>``, ``<|im_end|>``), so only the tool blocks are new to it. That exact text
    is one ``add_response_schema`` recognises, so tool calls written as
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` parse back (``parse_response``).
    Qwen2.5's own tokenizer is left as it is (its template is that one).
    """
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template, supports_tool_calling

    if not supports_tool_calling(tokenizer):
        tokenizer.chat_template = qwen2_5_chat_template
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        add_response_schema(tokenizer)
    return tokenizer


def tool_prompt(question: str, system_prompt: str = TOOL_SYSTEM_PROMPT) -> list[dict]:
    """Return the conversational prompt of a question for the tool runs (system prompt, then the question)."""
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


def tool_rounds(settings: dict) -> int:
    """Return the tool rounds a recipe's rollout may take, as :func:`labkit.memory.estimate` counts them for
    ``settings`` (preset / GRPOConfig field names): 0 without an ``environment``;
    else ``max_tool_calling_iterations``, where None is TRL's "no limit" (``sys.maxsize``,
    trl/trainer/grpo_trainer.py 784-785), which the estimate counts as at least one round."""
    if not settings.get("environment"):
        return 0
    rounds = settings.get("max_tool_calling_iterations")
    return 1 if rounds is None else rounds
