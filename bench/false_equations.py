"""``python -m bench false-equations``: how many replies ``right_answer_reward`` pays carry a false equation.

Reads the SmolLM2 CPU runs recorded under ``results/`` (JSON only: nothing is trained or generated). Each run holds
the greedy replies to the held-out word problems before and after GRPO: all 96 in the long runs (``summary.json``,
else ``latest_completions.json``), 8 ``examples`` in the 16- and 24-step runs. The examples are a selection, not a
sample: the first 4 problems, then up to 4 whose verdict changed (labkit.demo.real_model_demo). Each reply is scored
with :func:`labkit.rewards.right_answer_reward` and read with :func:`labkit.rewards.equation_errors` (the lab's
calculator, never ``eval``). Writes ``results/false_equations.json``.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["main", "replies_of", "measure"]


def replies_of(record, where: str = "") -> dict[str, list[dict]]:
    """Return ``{JSON path: replies}`` for every list of before/after replies in a results record.

    A list is one named ``completions`` or ``examples`` whose items hold ``question``, ``gold``, ``before`` and
    ``after`` (``now`` in ``latest_completions.json``); ``examples`` is skipped beside ``completions`` (a subset).
    """
    found = {}
    if isinstance(record, dict):
        for key, value in record.items():
            if key == "examples" and "completions" in record:
                continue
            if key in ("completions", "examples") and isinstance(value, list) and value \
                    and all(isinstance(v, dict) and {"gold", "before"} <= set(v) for v in value):
                found[f"{where}.{key}"] = [{**v, "after": v.get("after", v.get("now"))} for v in value]
            else:
                found.update(replies_of(value, f"{where}.{key}"))
    elif isinstance(record, list):
        for index, value in enumerate(record):
            found.update(replies_of(value, f"{where}[{index}]"))
    return found


def measure(replies: list[dict], stage: str) -> dict:
    """Return the counts for one stage (``"before"`` or ``"after"``): replies, scored right, right with a false
    equation, their share, and each such reply with its false equations."""
    from labkit.rewards import equation_errors, right_answer_reward

    texts = [r[stage] for r in replies]
    scores = right_answer_reward(texts, answer=[r["gold"] for r in replies])
    right = [(r, t) for r, t, s in zip(replies, texts, scores) if s == 1.0]
    false = [{"question": r["question"], "gold": r["gold"], "reply": t, "false_equations": equation_errors(t)}
             for r, t in right if equation_errors(t)]
    recorded = [r.get(f"right_{stage}") for r in replies]
    return {
        "replies": len(replies), "scored_right": len(right), "right_with_false_equation": len(false),
        "share_of_right": round(len(false) / len(right), 4) if right else None,
        "any_false_equation": sum(bool(equation_errors(t)) for t in texts),
        # the recorded verdicts (right_before / right_after), where the file has them, against right_answer_reward's
        "verdicts_differing_from_recorded": (sum(v != (s == 1.0) for v, s in zip(recorded, scores))
                                             if None not in recorded else None),
        "right_and_false": false,
    }


def _sources(results: Path) -> list[Path]:
    files = sorted(results.glob("smollm2*.json"))
    for folder in sorted(p for p in results.glob("smollm2*") if p.is_dir()):
        summary = folder / "summary.json"
        files.append(summary if summary.exists() else folder / "latest_completions.json")
    return [f for f in files if f.exists()]


def main(argv: list[str] | None = None) -> int:
    """``python -m bench false-equations [--results DIR] [--out FILE]``: the measurement above -> results/."""
    from bench import results_dir, write_json
    from labkit.lab import provenance

    parser = argparse.ArgumentParser(prog="python -m bench false-equations", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="results", help="the folder the recorded runs are read from")
    parser.add_argument("--out", default=None, help="output file (default results/false_equations.json)")
    args = parser.parse_args(argv)
    results = Path(args.results)
    runs = []
    for path in _sources(results):
        for where, replies in replies_of(json.loads(path.read_text())).items():
            runs.append({"file": str(path.relative_to(results)), "replies_at": where or ".",
                         "kind": ("every held-out problem" if where.endswith("completions")
                                  else "examples: the first 4 problems, then up to 4 whose verdict changed"),
                         "before": measure(replies, "before"), "after": measure(replies, "after")})
    if not runs:
        print(f"no recorded replies under {results}/ (smollm2*.json, smollm2*/summary.json): nothing to measure")
        return 1
    for run in runs:
        cells = [f"{run[s]['right_with_false_equation']}/{run[s]['scored_right']} right of {run[s]['replies']}"
                 for s in ("before", "after")]
        print(f"{run['file'] + run['replies_at']:<58} before {cells[0]:<18} after {cells[1]}")
    record = {
        "benchmark": "false-equations",
        "command": "python -m bench false-equations " + " ".join(argv or []),
        "what": ("per recorded run: the held-out replies right_answer_reward scores right (1.0) that hold an "
                 "equation whose arithmetic is false (labkit.rewards.equation_errors), before and after GRPO. "
                 "The replies before training are the untrained model's greedy replies, the same in every run."),
        "runs": runs,
        "provenance": provenance(),
    }
    out = write_json(Path(args.out) if args.out else results_dir() / "false_equations.json", record)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
