"""``python -m bench rewards``: the worst time per reward on adversarial inputs -> results/rewards_bench.json."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from bench import results_dir, write_json
from labkit.lab import provenance
from labkit.rewards import (
    accuracy_reward, adversarial_inputs, clear_parse_caches, combine_rewards, expression_reward, extract_answer,
    extract_last_number, format_reward, gsm8k_rewards, int_answer_reward, overlong_penalty, parse_number,
    soft_format_reward, tag_count_reward, trl_kwargs,
)
from labkit.rewards.check import LATEX_ANSWERS

__all__ = ["main"]



def _math_verify_reference(repeats: int) -> dict:
    """Time math-verify's ``parse`` alone on :data:`LATEX_ANSWERS` (cold caches), next to labkit's ``parse_number``
    (which reads plain numbers itself and hands LaTeX arithmetic to math-verify after its own bounded checks)."""
    import logging

    from math_verify import LatexExtractionConfig, parse
    from math_verify import parser as mv_parser
    from sympy.core.cache import clear_cache

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled": on purpose here

    def cold_parse(latex):
        clear_cache()
        for name in ("parse_latex_cached", "parse_expr_cached"):
            getattr(getattr(mv_parser, name, None), "cache_clear", lambda: None)()
        return parse(f"${latex}$", extraction_config=[LatexExtractionConfig()], parsing_timeout=None)

    start = time.perf_counter()
    cold_parse("1")  # imports sympy and builds the grammar
    answers = {"import and first parse": {"first_ms": round(1000 * (time.perf_counter() - start), 1)}}
    for name, latex in LATEX_ANSWERS.items():
        times, ours = [], []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            parsed = cold_parse(latex)
            times.append(1000 * (time.perf_counter() - start))
            clear_parse_caches()
            start = time.perf_counter()
            value = parse_number(latex)
            ours.append(1000 * (time.perf_counter() - start))
        answers[name] = {
            "math_verify_first_ms": round(times[0], 2),  # the first time its grammar meets this structure
            "math_verify_median_ms": round(statistics.median(times[1:]), 2),
            "math_verify_reads": str(parsed[0]) if parsed else None,
            "labkit_median_ms": round(statistics.median(ours[1:]), 3),
            "labkit_reads": None if value is None else str(value),
        }
    return {
        "what": ("math-verify's parse() of the same LaTeX answers, alone (not padded), parsing_timeout=None, "
                 "sympy and math-verify caches cleared before each call; labkit's parse_number calls it for LaTeX "
                 "arithmetic only, after bounding the answer's length, characters and nesting"),
        "answers": answers,
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m bench rewards``: worst time per reward on adversarial inputs -> results/rewards_bench.json.

    Each reward is called on one adversarial completion at a time (plain and conversational),
    ``--repeats`` times with every parse cache cleared before each call; an input's time is
    the median of its repeats, and a reward's figure is its worst input. Exits 1 when a reward
    is over ``--budget-ms``.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench rewards", description=main.__doc__)
    parser.add_argument("--chars", type=int, default=100_000, help="length of each adversarial input")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per input and format")
    parser.add_argument("--budget-ms", type=float, default=50.0, help="the most one call may take")
    parser.add_argument("--out", default=None, help="output file (default results/rewards_bench.json)")
    parser.add_argument("--no-math-verify", dest="math_verify", action="store_false",
                        help="skip timing math-verify on the same LaTeX answers (for reference)")
    args = parser.parse_args(argv)

    inputs = adversarial_inputs(args.chars)
    overlong = overlong_penalty(max_completion_length=1024, soft_punish_cache=256)
    gsm8k_funcs, gsm8k_weights = gsm8k_rewards()
    candidates = {
        "format_reward": format_reward,
        "soft_format_reward": soft_format_reward,
        "tag_count_reward": tag_count_reward,
        "accuracy_reward": accuracy_reward,
        "int_answer_reward": int_answer_reward,
        "overlong_penalty": overlong,
        "expression_reward": expression_reward,
        "gsm8k combined": combine_rewards(gsm8k_funcs, gsm8k_weights),
        "extract_answer": lambda completions, **kw: [extract_answer(c) for c in completions],
        "extract_last_number": lambda completions, **kw: [extract_last_number(c) for c in completions],
    }
    columns = {"answer": "18", "target": 24, "nums": [3, 8, 1]}

    figures = {}
    for name, fn in candidates.items():
        per_input = {}
        for label, text in inputs.items():
            times = []
            for conversational in (False, True):
                kwargs = trl_kwargs([text], conversational, columns)
                for _ in range(args.repeats):
                    clear_parse_caches()
                    start = time.perf_counter()
                    fn(**kwargs)
                    times.append(1000 * (time.perf_counter() - start))
            per_input[label] = (statistics.median(times), max(times))
        worst_label = max(per_input, key=lambda key: per_input[key][0])
        worst_median, _ = per_input[worst_label]
        figures[name] = {
            "worst_ms": round(worst_median, 3),
            "worst_input": worst_label,
            "max_single_call_ms": round(max(t for _, t in per_input.values()), 3),
            "within_budget": worst_median < args.budget_ms,
        }
        print(f"{name:<20} worst {worst_median:8.3f} ms  ({worst_label})")

    reference = _math_verify_reference(args.repeats) if args.math_verify else None

    record = {
        "benchmark": "rewards",
        "command": "python -m bench rewards " + " ".join(argv or []),
        "budget_ms": args.budget_ms,
        "input_chars": args.chars,
        "repeats": args.repeats,
        "statistic": ("per reward: the worst input's median time of one call on one completion, over "
                      f"{args.repeats} repeats x 2 formats, parse caches cleared before every call"),
        "inputs": sorted(inputs),
        "rewards": figures,
        "all_within_budget": all(f["within_budget"] for f in figures.values()),
        "math_verify_reference": reference,
        "provenance": provenance(),
    }
    path = write_json(Path(args.out) if args.out else results_dir() / "rewards_bench.json", record)
    print(f"{'all within' if record['all_within_budget'] else 'NOT all within'} {args.budget_ms:g} ms; wrote {path}")
    return 0 if record["all_within_budget"] else 1
