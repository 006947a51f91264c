"""Small tasks with verifiable answers, for the lab's CPU mode: two-digit addition, and word problems.

:class:`AdditionTask`, the tiny model's task, is introduced in ``03_nano_grpo_cpu.ipynb``, where a tiny model
learns it on a laptop CPU in minutes: a short supervised warm-up teaches it the answer format and the digit sums, then
GRPO, scored by :mod:`labkit.rewards`, teaches it what the warm-up data got wrong.

A problem is ``a + b`` with two-digit ``a`` and ``b`` whose ones digits carry (``47 + 38``).
The prompt is conversational (one user message, ``"47+38=?"``), so the tiny byte tokenizer's
chat template renders it exactly as it renders GSM8K; the answer is in the lab's format::

    <think>7+8=15 4+3+1=8</think>
    <answer>85</answer>

The warm-up data comes from a *sloppy teacher* that forgets the carry in a share of its worked
examples (``4+3=7`` above, answer ``75``). Imitation copies the slip: the warmed-up model
carries only about as often as the teacher did. The reward knows better than the
demonstrations, and that gap is what GRPO closes.

:func:`short_working_reward` is a reward with a loophole, for the reward-hacking experiment of
``03_nano_grpo_cpu.ipynb`` (``python -m bench reward-hacking``).

:class:`WordProblems` (introduced in ``04_lora_grpo_16gb.ipynb``) are one-step arithmetic word
problems for a *real* small instruct model (SmolLM2-135M-Instruct), rewarded for the right stated
answer (:func:`labkit.rewards.right_answer_reward`).
"""
from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass

__all__ = ["AdditionTask", "WordProblems", "SHORT_ANSWER_PROMPT", "WORKED_ANSWER_PROMPT", "SYSTEM_PROMPTS", "worked_solution", "carries", "short_working_reward",
           "WORKING_BUDGET", "SPLITS", "NUMBER_RANGES", "WORD_PROBLEM_TASKS"]

SPLITS = ("train", "test")
_TEST_SHARE = 0.2  # a fixed fifth of all problems is held out: never trained on, only evaluated


def worked_solution(a: int, b: int, *, forget_carry: bool = False) -> str:
    """Return the worked answer to ``a + b`` in the lab's format, column by column.

    ``worked_solution(47, 38)`` is ``"<think>7+8=15 4+3+1=8</think>\\n<answer>85</answer>"``.
    With ``forget_carry=True`` the tens column drops the carried one (``4+3=7``) and the answer
    follows from that slip (``75``): a wrong answer that is consistent with its own working.
    """
    if not (10 <= a <= 99 and 10 <= b <= 99):
        raise ValueError(f"both numbers must have two digits, got {a} and {b}")
    ones = a % 10 + b % 10
    carry = ones // 10 if not forget_carry else 0
    tens = a // 10 + b // 10 + carry
    tens_column = f"{a // 10}+{b // 10}+{carry}={tens}" if carry else f"{a // 10}+{b // 10}={tens}"
    answer = tens * 10 + ones % 10
    return f"<think>{a % 10}+{b % 10}={ones} {tens_column}</think>\n<answer>{answer}</answer>"


_CARRIED_COLUMN = re.compile(r"\d\+\d\+1=")  # "4+3+1=": a column that adds a carried one


def carries(completion: str) -> bool:
    """Return whether a worked answer carries a one into the tens column (``4+3+1=`` in its working)."""
    return _CARRIED_COLUMN.search(completion) is not None


WORKING_BUDGET = 13  # characters of working that short_working_reward pays for: "7+8=15 4+3=7" fits, "4+3+1=8" not


def short_working_reward(completions, **kwargs) -> list[float]:
    """Return 1.0 per completion in the strict format whose working is at most :data:`WORKING_BUDGET` characters.

    A reward with a loophole, kept for the lesson on reward hacking: it means "answer in the
    format, and don't ramble", and it never reads the answer. On this task the working of a
    right answer is ``7+8=15 4+3+1=8`` (14 or 15 characters) and that of a forgotten carry
    ``7+8=15 4+3=7`` (12 or 13), so the reward pays exactly the teacher's slip. The strict
    format is :func:`labkit.rewards.format_reward`'s. Range {0, 1}.
    """
    from labkit.rewards import completion_text, format_reward

    formatted = format_reward(completions)
    out = []
    for completion, ok in zip(completions, formatted):
        working = re.search(r"<think>(.*?)</think>", completion_text(completion), re.S)
        out.append(1.0 if ok and working and len(working.group(1).strip()) <= WORKING_BUDGET else 0.0)
    return out


short_working_reward.value_range = (0.0, 1.0)  # read by labkit.rewards.check_reward_function


@dataclass(frozen=True)
class AdditionTask:
    """Two-digit addition, by default only problems whose ones digits carry; see the module docstring.

    ``forget_carry`` is the share of the teacher's worked examples that forget the carry
    (the warm-up data); ``carry_only=False`` also asks problems without a carry.
    """

    forget_carry: float = 0.6
    carry_only: bool = True

    def __post_init__(self):
        if not 0.0 <= self.forget_carry <= 1.0:
            raise ValueError(f"forget_carry is a probability, not {self.forget_carry}")

    def problems(self, n: int, seed: int, split: str = "train") -> list[tuple[int, int]]:
        """Return ``n`` problems ``(a, b)`` of ``split``, drawn with ``seed`` (same seed, same problems).

        The held-out ``"test"`` split is a fixed fifth of all problems (the same whatever the
        seed), drawn without replacement; ``"train"`` draws from the rest, with replacement.
        """
        train, test = _split_problems(self.carry_only)
        rng = random.Random(seed)
        if split == "train":
            return [rng.choice(train) for _ in range(n)]
        if split == "test":
            if n > len(test):
                raise ValueError(f"the test split has {len(test)} problems; asked for {n}")
            return rng.sample(test, n)
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")

    @staticmethod
    def prompt(a: int, b: int) -> list[dict]:
        """Return the conversational prompt for ``a + b``: one user message, ``"47+38=?"``.

        No system prompt: the tiny tokenizer spends one token per byte, and the format is
        learned in the warm-up. Real models get the lab's system prompt instead.
        """
        return [{"role": "user", "content": f"{a}+{b}=?"}]

    @staticmethod
    def answer(a: int, b: int) -> str:
        """Return the gold answer as the reward functions want it: a number in a string."""
        return str(a + b)

    def teacher_solution(self, a: int, b: int, rng: random.Random) -> str:
        """Return the sloppy teacher's worked answer: it forgets the carry with probability ``forget_carry``."""
        return worked_solution(a, b, forget_carry=rng.random() < self.forget_carry)

    def dataset(self, n: int, seed: int, split: str = "train"):
        """Return ``n`` problems as a ``datasets.Dataset`` with TRL's ``prompt`` and the gold ``answer``.

        The same columns as :func:`labkit.data.load_gsm8k`, so ``GRPOTrainer`` and
        :func:`labkit.rewards.accuracy_reward` take it as they take GSM8K.
        """
        from datasets import Dataset

        pairs = self.problems(n, seed, split)
        return Dataset.from_dict({
            "prompt": [self.prompt(a, b) for a, b in pairs],
            "answer": [self.answer(a, b) for a, b in pairs],
        })


@functools.lru_cache(maxsize=2)
def _split_problems(carry_only: bool) -> tuple[list, list]:
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100) if a % 10 + b % 10 >= 10 or not carry_only]
    random.Random(20240603).shuffle(pairs)  # fixed: the held-out problems never change
    cut = int(len(pairs) * _TEST_SHARE)
    return pairs[cut:], pairs[:cut]


SHORT_ANSWER_PROMPT = "Answer in one short sentence of at most 10 words."
# A short chain of thought: the calculation written out, then the result, still one sentence.
WORKED_ANSWER_PROMPT = "Write the calculation and its result in one short sentence."
SYSTEM_PROMPTS = {"short": SHORT_ANSWER_PROMPT, "worked": WORKED_ANSWER_PROMPT}
_NAMES = ("Sam", "Mia", "Leo", "Ava", "Tom", "Zoe", "Ben", "Lily", "Max", "Emma", "Noah", "Ella", "Jack", "Ruby",
          "Omar", "Nina")
_ITEMS = ("apples", "marbles", "stickers", "books", "pencils", "cookies", "shells", "cards", "stamps", "balloons",
          "coins", "toys")
# "small": what SmolLM2-135M-Instruct often gets right in its head (notebook 04); "large": three-digit sums and
# two-digit products it almost never gets right without a calculator (notebook 08's comparison with and without it)
NUMBER_RANGES = {"small": {"add": (2, 20), "sub": (8, 30), "sub_min_taken": 2, "mul": (2, 9)},
                 "large": {"add": (100, 999), "sub": (300, 999), "sub_min_taken": 101, "mul": (12, 99)}}
# A preset's ``task`` names for the word problems, and the NUMBER_RANGES key of each (labkit.run.task_dataset)
WORD_PROBLEM_TASKS = {"word-problems": "small", "word-problems-large": "large"}
_HELD_OUT_SEED = 10_000  # the held-out problems are the same for every training seed
HELD_OUT_POOL = 200


@dataclass(frozen=True)
class WordProblems:
    """One-step arithmetic word problems (+, -, x) a small instruct model answers in a short sentence.

    ``"Mia has 7 stickers. Mia gets 5 more stickers. How many stickers does Mia have now?"``, with
    the system prompt :data:`SHORT_ANSWER_PROMPT` (a short reply: the calculation fits a small
    completion budget). SmolLM2-135M-Instruct gets about 4 in 10 right before training (greedy, 24
    tokens), so the groups GRPO samples differ in reward, which is what it learns from.
    The held-out ``"test"`` problems are a fixed pool (the same for every seed) that ``"train"``
    never draws from; they are new instances of the same three templates, not new templates.
    ``numbers="large"`` (notebook 08) draws three-digit sums and differences and two-digit products
    (:data:`NUMBER_RANGES`): the arithmetic a calculator helps with; it has its own held-out pool.
    """

    system_prompt: str = SHORT_ANSWER_PROMPT
    numbers: str = "small"

    def __post_init__(self):
        if self.numbers not in NUMBER_RANGES:
            raise ValueError(f"numbers must be one of {sorted(NUMBER_RANGES)}, not {self.numbers!r}")

    @staticmethod
    def make_problem(rng: random.Random, numbers: str = "small") -> tuple[str, str]:
        """Return ``(question, gold answer)`` for one random problem with :data:`NUMBER_RANGES` ``[numbers]``."""
        r = NUMBER_RANGES[numbers]
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        kind = rng.choice(("add", "sub", "mul"))
        if kind == "add":
            a, b = rng.randint(*r["add"]), rng.randint(*r["add"])
            return f"{name} has {a} {item}. {name} gets {b} more {item}. How many {item} does {name} have now?", str(a + b)
        if kind == "sub":
            a = rng.randint(*r["sub"])
            b = rng.randint(r["sub_min_taken"], a - 1)
            return (f"{name} has {a} {item}. {name} gives away {b} {item}. How many {item} does {name} have left?",
                    str(a - b))
        a, b = rng.randint(*r["mul"]), rng.randint(*r["mul"])
        return f"{name} has {a} bags with {b} {item} in each bag. How many {item} does {name} have in total?", str(a * b)

    def problems(self, n: int, seed: int = 0, split: str = "train") -> list[tuple[str, str]]:
        """Return ``n`` problems of ``split``: the held-out pool's first ``n``, or ``n`` fresh ones drawn with ``seed``."""
        held_out = _held_out_pool(self.numbers)
        if split == "test":
            if not 1 <= n <= len(held_out):
                raise ValueError(f"the held-out pool has {len(held_out)} problems; asked for {n}")
            return held_out[:n]
        if split != "train":
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        taken = {q for q, _ in held_out}
        rng, out = random.Random(seed), []
        while len(out) < n:
            question, answer = self.make_problem(rng, self.numbers)
            if question not in taken:
                out.append((question, answer))
        return out

    def prompt(self, question: str) -> list[dict]:
        """Return the conversational prompt: the short-answer system prompt, then the question."""
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": question}]

    def dataset(self, n: int, seed: int = 0, split: str = "train"):
        """Return ``n`` problems as a ``datasets.Dataset`` with TRL's ``prompt`` and the gold ``answer``."""
        from datasets import Dataset

        pairs = self.problems(n, seed, split)
        return Dataset.from_dict({"prompt": [self.prompt(q) for q, _ in pairs], "answer": [a for _, a in pairs]})


@functools.lru_cache(maxsize=2)
def _held_out_pool(numbers: str = "small") -> list[tuple[str, str]]:
    rng, pool = random.Random(_HELD_OUT_SEED), {}  # question -> answer, in the order drawn, each question once
    while len(pool) < HELD_OUT_POOL:
        question, answer = WordProblems.make_problem(rng, numbers)
        pool.setdefault(question, answer)
    return list(pool.items())
