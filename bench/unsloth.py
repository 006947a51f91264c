"""``python -m bench unsloth``: the same preset through plain TRL and Unsloth -> results/unsloth_vs_trl.csv.

Each backend runs ``python -m bench.unsloth arm ...`` in a fresh process, one after the
other, so neither sees the other's memory or Unsloth's patches of TRL and transformers.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from labkit.options import parse_pairs
from labkit.presets import get_preset
from labkit.unsloth_path import BACKENDS, RESULTS_FILE, _CSV_FIELDS, comparison_run, unsloth_status

__all__ = ["main", "bench_unsloth"]


def _csv_row(record: dict) -> dict:
    versions = record["provenance"]["versions"]
    row = {k: record.get(k) for k in _CSV_FIELDS}
    row.update(device=record["provenance"]["device"], date=record["provenance"]["date"],
               torch=versions.get("torch"), transformers=versions.get("transformers"), trl=versions.get("trl"),
               unsloth=record.get("unsloth"))
    return row


def bench_unsloth(preset="colab-t4", *, backends=BACKENDS, steps: int = 30, eval_limit: int = 200,
                  overrides: dict | None = None, fast_inference: bool = False, results: str | os.PathLike = "results",
                  python: str = sys.executable, timeout_s: float | None = None) -> list[dict]:
    """Return the records of one comparison: ``preset`` through each of ``backends``, each in a fresh process.

    Every backend runs ``python -m bench.unsloth arm ...`` (:func:`comparison_run`) in its
    own process, one after the other, so neither run sees the other's memory or Unsloth's patches.
    Each record is written to ``results/unsloth_vs_trl_BACKEND.json`` and appended as a row to
    ``results/unsloth_vs_trl.csv`` (with the device, versions and date). A backend that fails
    raises ``RuntimeError`` with the end of its output; rows already written stay.
    """
    from bench import append_csv, results_dir, write_json

    folder = results_dir(results)
    records = []
    for backend in backends:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
        with tempfile.TemporaryDirectory(prefix="labkit-arm-") as tmp:
            out = Path(tmp) / "record.json"
            name = preset if isinstance(preset, str) else preset.name
            command = [python, "-m", "bench.unsloth", "arm", "--backend", backend, "--preset", name,
                       "--steps", str(steps), "--eval-limit", str(eval_limit), "--out", str(out)]
            for key, value in (overrides or {}).items():
                command += ["--set", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
            if fast_inference:
                command.append("--fast-inference")
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
            if done.returncode != 0 or not out.exists():
                tail = (done.stdout + done.stderr)[-3000:]
                raise RuntimeError(f"the {backend} run failed (exit {done.returncode}):\n{tail}")
            record = json.loads(out.read_text())
        write_json(folder / f"unsloth_vs_trl_{backend}.json", record)
        append_csv(folder / RESULTS_FILE, [_csv_row(record)])
        records.append(record)
    return records


def main(argv: list[str] | None = None) -> int:
    """``python -m bench unsloth``: the same preset through plain TRL and Unsloth -> results/unsloth_vs_trl.csv.

    Exit codes: 0 both measured, 1 a run failed, 2 Unsloth cannot run here (the reason is printed).
    """
    parser = argparse.ArgumentParser(prog="python -m bench unsloth", description=main.__doc__)
    parser.add_argument("--preset", default="colab-t4", help="a labkit.presets name (default colab-t4)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="preset overrides for BOTH backends; method is qlora (4-bit weights) and LoRA targets "
                             "are all seven projections (Unsloth's fused kernels need them) unless set")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval-limit", type=int, default=200, help="GSM8K test questions to score after training")
    parser.add_argument("--fast-inference", action="store_true", help="Unsloth generates with vLLM (needs vllm)")
    parser.add_argument("--results", default="results")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if "unsloth" in args.backends:
        status = unsloth_status()
        if not status.available:
            print(f"cannot run the Unsloth backend: {status.reason}", file=sys.stderr)
            return 2
    try:
        records = bench_unsloth(args.preset, backends=args.backends, steps=args.steps, eval_limit=args.eval_limit,
                                overrides={"method": "qlora", **parse_pairs("--set", args.set)},
                                fast_inference=args.fast_inference,
                                results=args.results)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    for record in records:
        print(json.dumps({k: v for k, v in record.items() if k not in ("settings", "provenance")}))
    print(f"appended {len(records)} row(s) to {Path(args.results) / RESULTS_FILE}")
    return 0


def _arm_cli(argv: list[str]) -> int:
    """``python -m bench.unsloth arm``: one backend's :func:`comparison_run`, written as JSON to --out."""
    parser = argparse.ArgumentParser(prog="python -m bench.unsloth arm")
    parser.add_argument("--backend", required=True, choices=BACKENDS)
    parser.add_argument("--preset", required=True)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval-limit", type=int, default=200)
    parser.add_argument("--fast-inference", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.backend == "unsloth":
        import unsloth  # noqa: F401  (first thing in the process: it patches transformers and TRL as it loads)
    pairs = parse_pairs("--set", args.set)
    preset = get_preset(args.preset, **pairs)
    # Both arms on all seven projections (COMPARISON_TARGETS) unless --set target_modules=... says otherwise.
    record = comparison_run(preset, args.backend, steps=args.steps, eval_limit=args.eval_limit,
                            fast_inference=args.fast_inference,
                            target_modules=None if "target_modules" in pairs else "all")
    Path(args.out).write_text(json.dumps(record, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    _argv = sys.argv[1:]
    if _argv[:1] == ["arm"]:
        raise SystemExit(_arm_cli(_argv[1:]))
    raise SystemExit(main(_argv))
