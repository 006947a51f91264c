"""Verifiable reward functions with TRL's calling convention, robust to anything a model writes.

Introduced in ``02_reward_functions.ipynb``. Three small modules, read in this order:

- :mod:`labkit.rewards.parse`: reading what a model wrote (the ``<answer>`` tag, the last number,
  numbers with units and LaTeX, countdown expressions without ``eval``);
- :mod:`labkit.rewards.functions`: the reward functions TRL's ``GRPOTrainer`` calls, and
  how to weight and combine them;
- :mod:`labkit.rewards.check`: :func:`check_reward_function`, which calls a reward on awkward and
  adversarial completions before a trainer does.

Three promises, each checked by ``tests/test_rewards.py`` and ``python -m bench rewards``:
robust (any text, 100k characters of arbitrary unicode, gives a finite float in range, never an
exception), fast (no pattern can backtrack catastrophically; the worst time per call is recorded
in ``results/rewards_bench.json``) and safe (model output never reaches ``eval``/``exec``).

On math-verify, the maintained maths-equivalence library TRL's own ``accuracy_reward`` calls:
:mod:`labkit.rewards.parse` reads plain answers itself and hands math-verify only short LaTeX arithmetic
(``\\frac{\\sqrt{16}}{2}``), called as TRL calls it off the main thread; its docstring says why and how.
"""
from labkit.rewards.check import *  # noqa: F403
from labkit.rewards.check import __all__ as _check_all
from labkit.rewards.functions import *  # noqa: F403
from labkit.rewards.functions import __all__ as _functions_all
from labkit.rewards.parse import *  # noqa: F403
from labkit.rewards.parse import __all__ as _parse_all

__all__ = [*_parse_all, *_functions_all, *_check_all]
