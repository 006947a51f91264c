"""``python -m bench unsloth``: the same preset through plain TRL and Unsloth -> results/unsloth_vs_trl.csv.

Each backend runs ``python -m bench.unsloth arm ...`` (:func:`comparison_run`) in a fresh process, one after the
other, so neither sees the other's memory or Unsloth's patches of TRL and transformers. Notebook 06 starts it and
reads what it recorded (:func:`labkit.unsloth_path.read_comparison`). This is the learner's comparison: the
recipe's real model from the hub, evaluated on GSM8K after training.

Two more doors, for a GPU machine without network: ``--random-weights`` (:mod:`bench.unsloth_measure`) measures both
loaders as ``python -m bench gpu`` measures its rows (random weights saved from the architecture's config, the
card's cap, peak memory and seconds per phase) into ``results/gpu/unsloth_vs_trl.csv``, and ``--bundle DIR``
(:mod:`scripts.unsloth_bundle`) makes the offline wheels and the command that installs them and runs it.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from labkit.memory import GIB
from labkit.options import UsageError, parse_pairs
from labkit.presets import PresetError, get_preset
from labkit.unsloth_path import (BACKENDS, COMPARISON_TARGETS, RESULTS_FILE, load_unsloth_policy, require_unsloth,
                                 unsloth_status)

__all__ = ["main", "bench_unsloth", "comparison_run"]

_CSV_FIELDS = ("backend", "preset", "model", "method", "precision", "steps", "steps_done", "seconds_per_step",
               "peak_allocated_gib", "peak_reserved_gib", "strict_accuracy", "lenient_accuracy", "format_rate",
               "eval_n", "reward_last", "lora_dropout", "fast_inference", "target_modules", "device", "date", "torch", "transformers", "trl", "unsloth")


def comparison_run(preset, backend: str = "trl", *, steps: int = 30, eval_limit: int = 200,
                   output_dir: str | os.PathLike | None = None, seed: int = 0, fast_inference: bool = False,
                   callbacks=None, target_modules="all") -> dict:
    """Return one row of the Unsloth-vs-TRL comparison: ``steps`` GRPO steps of ``preset`` through ``backend``.

    Both arms put LoRA on the same targets: ``target_modules="all"`` (the default) means
    :data:`COMPARISON_TARGETS`, all seven projections, where Unsloth's fused QKV and MLP kernels
    apply; ``None`` keeps the preset's; a list sets them. The record names them.

    ``backend="trl"`` is notebook 04's path (:func:`labkit.run.build_run` loads the model);
    ``"unsloth"`` loads it with :func:`load_unsloth_policy` and hands it to the same
    ``build_run``, so prompts, rewards, ``GRPOConfig`` and evaluation are identical. Measured:

    - ``peak_allocated_gib`` / ``peak_reserved_gib``: ``torch.cuda.max_memory_allocated`` /
      ``max_memory_reserved`` from before loading the model to the end of training (CUDA only);
    - ``seconds_per_step``: the mean of TRL's logged ``step_time``, leaving out the first step (warm-up);
    - ``strict_accuracy`` / ``lenient_accuracy`` / ``format_rate`` after training, greedy, on the
      first ``eval_limit`` questions of GSM8K's test split, at most ``max_completion_length`` tokens.

    Run each backend in its own process (:func:`bench_unsloth` does): once unsloth is imported it
    has patched TRL and transformers for the rest of the process. On a CPU the plain-TRL backend
    runs (a smoke test of this code with the ``cpu-tiny`` preset); memory is then not measured.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    if backend == "unsloth":
        status = require_unsloth()
        importlib.import_module("unsloth")  # before labkit.presets imports transformers and TRL
    import torch

    from labkit.device import detect_device
    from labkit.evaluate import gsm8k_accuracy
    from labkit.lab import provenance
    from labkit.presets import get_preset, resolve_plan
    from labkit.run import build_run
    from labkit.training import LogRecorder

    preset = get_preset(preset, max_steps=steps, save_strategy="no",
                        **({"target_modules": COMPARISON_TARGETS} if target_modules == "all" else
                           {"target_modules": tuple(target_modules)} if target_modules else {}))
    device = detect_device()
    cuda = device.kind == "cuda"
    precision = resolve_plan(preset, device).precision
    owned = output_dir is None
    output_dir = Path(output_dir or tempfile.mkdtemp(prefix=f"labkit-{backend}-"))
    recorder = LogRecorder(("reward",))
    meters = [recorder, *(callbacks or [])]
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    if backend == "unsloth":
        model, tokenizer = load_unsloth_policy(preset, fast_inference=fast_inference, seed=seed)
        # Unsloth's checkpointing is already on the model; the trainer's would replace it.
        run = build_run(preset, output_dir / "run", device=device, model=model, tokenizer=tokenizer,
                        callbacks=meters, seed=seed, activation_checkpointing=False, disable_tqdm=True)
    else:
        run = build_run(preset, output_dir / "run", device=device, callbacks=meters, seed=seed, disable_tqdm=True)
    run.train(resume=False)
    train_seconds = time.perf_counter() - start
    record = {"backend": backend, "preset": preset.name, "model": preset.model, "method": preset.method,
              "precision": precision, "steps": steps, "steps_done": run.trainer.state.global_step,
              "fast_inference": fast_inference and backend == "unsloth",
              "target_modules": ",".join(preset.target_modules)}
    times = recorder.values["step_time"]
    rewards = [r for r in recorder.values["reward"] if r == r]  # NaN: a step without a reward log
    timed = times[1:] if len(times) > 1 else times
    record["seconds_per_step"] = round(sum(timed) / len(timed), 3) if timed else None
    record["load_and_train_seconds"] = round(train_seconds, 1)
    if cuda:
        record["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 3)
        record["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / GIB, 3)
    else:
        record["peak_allocated_gib"] = record["peak_reserved_gib"] = None
        record["note"] = "no CUDA: a smoke test of the comparison code; memory is not measured"
    record["reward_last"] = round(rewards[-1], 4) if rewards else None

    model = run.model
    peft_config = getattr(model, "peft_config", {}).get("default")
    record["lora_dropout"] = getattr(peft_config, "lora_dropout", None)
    if backend == "unsloth":
        from unsloth import FastLanguageModel

        FastLanguageModel.for_inference(model)
    result = gsm8k_accuracy(model, run.tokenizer, "test", limit=eval_limit, batch_size=preset.eval_batch_size,
                            max_new_tokens=preset.config["max_completion_length"], progress=False)
    record.update(strict_accuracy=round(result.strict_accuracy, 4), lenient_accuracy=round(result.lenient_accuracy, 4),
                  format_rate=round(result.format_rate, 4), eval_n=result.n, eval_seconds=result.seconds)
    record["unsloth"] = status.version if backend == "unsloth" else None
    record["settings"] = preset.to_dict()
    record["provenance"] = provenance(device)
    if owned:
        import shutil

        shutil.rmtree(output_dir, ignore_errors=True)
    return record


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
    ``--random-weights`` measures both loaders as ``bench gpu`` measures its rows, on the recipe's architecture with
    random weights under its card's cap, into results/gpu/ (:mod:`bench.unsloth_measure`; no download: what the
    offline GPU machine runs); ``--bundle DIR`` makes that machine's Unsloth wheels (:mod:`scripts.unsloth_bundle`).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(arg == "--bundle" or arg.startswith("--bundle=") for arg in argv):
        from scripts.unsloth_bundle import main as bundle_main

        return bundle_main(argv)
    if "--random-weights" in argv:
        from bench.unsloth_measure import main as measured_main

        return measured_main([arg for arg in argv if arg != "--random-weights"])
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
    args = parser.parse_args(argv)
    if "unsloth" in args.backends:
        status = unsloth_status()
        if not status.available:
            print(f"cannot run the Unsloth backend: {status.reason}", file=sys.stderr)
            return 2
    try:
        overrides = {"method": "qlora", **parse_pairs("--set", args.set)}
        get_preset(args.preset, **overrides)  # a wrong name or value is refused here, before an arm starts
    except (UsageError, PresetError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        records = bench_unsloth(args.preset, backends=args.backends, steps=args.steps, eval_limit=args.eval_limit,
                                overrides=overrides, fast_inference=args.fast_inference, results=args.results)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    for record in records:
        print(json.dumps({k: v for k, v in record.items() if k not in ("settings", "provenance")}, indent=1))
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
        importlib.import_module("unsloth")  # first thing in the process: it patches transformers and TRL as it loads
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
