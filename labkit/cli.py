"""The learner's command line, one table for every ``python -m labkit COMMAND``.

Commands: ``demo`` (the main job), ``estimate`` (the VRAM estimator), ``train`` (a preset) and
``check`` (what the lab will use here). Each command's function parses its options and calls the
concept module that owns the logic; the modules are imported only when their command runs, so
``python -m labkit --help`` is instant and needs no torch. The ``KEY=VALUE`` parser they share with
the benchmarks is :mod:`labkit.options`. The measurements and the maintainer's tools are not here:
they sit beside the package (``python -m bench NAME``, ``python -m scripts.colab``), and their
old names here answer with the new one (:data:`MOVED`).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from labkit.options import UsageError, add_setting_arguments, batch_settings, parse_pairs

__all__ = ["COMMANDS", "MOVED", "main", "demo_cli", "estimate_cli", "train_cli", "check_cli"]

# command -> ("module:function", one-line help). Each function takes argv and returns an exit code.
COMMANDS = {
    "demo": ("labkit.cli:demo_cli", "the main job: a tiny model learns a task with GRPO on CPU in minutes"),
    "estimate": ("labkit.cli:estimate_cli", "estimate the VRAM of a GRPO run (model x method x settings)"),
    "train": ("labkit.cli:train_cli", "train with a named preset (accelerate launch-able)"),
    "check": ("labkit.cli:check_cli", "the pre-workshop checklist: install, device, mode, free disk, model weights"),
}

# Commands that moved out of the learner's package, and what to type instead (run from the repository's folder).
MOVED = {
    "bench": "python -m bench NAME",
    "rehearse": "python -m bench rehearse --preset NAME",
    "colab": "python -m scripts.colab --repo OWNER/NAME --ref TAG",
}

MODEL_COMMANDS = ("demo", "train")  # they load or build models through transformers and TRL


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m labkit COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "python -m labkit COMMAND --help shows a command's options.",
              "Benchmarks: python -m bench (from the repository's folder)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m labkit COMMAND [options]``: run one command and return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command in MOVED:
        print(f"`python -m labkit {command}` moved: run `{MOVED[command]}` from the repository's folder",
              file=sys.stderr)
        return 2
    if command not in COMMANDS:
        print(f"unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if command in MODEL_COMMANDS:  # as labkit.setup() does in a notebook: TRL's deprecated calls, load bars
        from labkit.lab import quiet_library_noise

        quiet_library_noise()
    module_name, func_name = COMMANDS[command][0].split(":")
    func = getattr(importlib.import_module(module_name), func_name)  # an ImportError here is a real one: raised
    return int(func(rest) or 0)


def estimate_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit estimate``: print the memory breakdown of a GRPO run as a table or JSON."""
    from labkit.device import CARDS
    from labkit.memory import PRECISION_BYTES, estimate

    parser = argparse.ArgumentParser(
        prog="python -m labkit estimate",
        description="Estimate the GPU memory of one GRPO step (TRL 1.16) for a model, a method and settings, "
                    "named as in GRPOConfig. The model is a catalogue name (labkit.models.ARCHITECTURES) or a "
                    "saved model folder.")
    parser.add_argument("--model", default="Qwen/Qwen2.5-1.5B-Instruct")
    add_setting_arguments(parser, many=False)
    parser.add_argument("--precision", default="bf16", choices=tuple(PRECISION_BYTES))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="where the run would happen")
    parser.add_argument("--padded", action="store_true", help="prompts of different lengths (a padding mask)")
    parser.add_argument("--logits", default="fused", choices=("fused", "full"))
    parser.add_argument("--card", default="rtx3080-laptop-16gb", choices=tuple(CARDS),
                        help="the card to compare with (labkit.device.CARDS)")
    parser.add_argument("--json", action="store_true", help="print JSON (with total_gib) instead of a table")
    args = parser.parse_args(argv)
    try:
        est = estimate(args.model, args.method, **batch_settings(args, args.num_generations),
                       max_prompt_length=args.max_prompt_length, max_completion_length=args.max_completion_length,
                       optim=args.optim, gradient_checkpointing=args.gradient_checkpointing, beta=args.beta,
                       precision=args.precision, lora_rank=args.lora_rank, device=args.device, padded=args.padded,
                       logits=args.logits)
    except (KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(est.as_dict(), indent=2))
        return 0
    s = est.settings
    print(f"{s['model']} | {s['method']} | per_device_train_batch_size {s['per_device_train_batch_size']}, "
          f"generation batch {s['generation_batch']} (G={s['num_generations']}) | "
          f"prompt {s['max_prompt_length']} + completion {s['max_completion_length']} tokens | {s['precision']} | "
          f"{s['optim']} | checkpointing {'on' if s['gradient_checkpointing'] else 'off'} | beta {s['beta']}")
    print(f"parameters: {est.total_params:,} total, {est.trainable_params:,} trainable "
          f"({100 * est.trainable_params / est.total_params:.2f} %)\n")
    print(est.table())
    card = CARDS[args.card]
    verdict = "fits" if est.total + 1.0 <= card.gib else "does not fit"
    print(f"\n{verdict} {card} with 1 GiB headroom for the CUDA context and fragmentation")
    return 0


class _SecretSafeParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose error messages never repeat a secret.

    argparse quotes the words it could not read ("unrecognized arguments: -= hub_token=hf_..."): a token typed
    on the command line would be printed back. Each ``KEY=VALUE`` word whose key is a secret field
    (:data:`labkit.validation.SECRET_FIELDS`) is shown as ``KEY=***``.
    """

    def error(self, message: str):
        import re

        from labkit.validation import SECRET_FIELDS

        keys = "|".join(re.escape(key) for key in SECRET_FIELDS)
        super().error(re.sub(rf"\b({keys})\s*=\S*", r"\1=***", message))


def train_parser():
    from labkit.presets import PRESETS

    parser = _SecretSafeParser(
        prog="python -m labkit train",
        description="Train GRPO on GSM8K with a named preset; re-run the same command to resume after an interruption.",
    )
    parser.add_argument("--preset", default=None, help=f"one of: {', '.join(PRESETS)}")
    parser.add_argument("--list", action="store_true", help="list the presets and exit")
    parser.add_argument("--model", help="override the preset's model (hub id or local path)")
    parser.add_argument("--output-dir", help="where checkpoints and the final adapter go (default runs/PRESET)")
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--save-steps", type=int)
    parser.add_argument("--train-limit", type=int)
    # action="extend": a repeated --set or --config adds its pairs instead of silently replacing the earlier ones
    parser.add_argument("--set", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                        help="override any preset field or GRPOConfig argument, in TRL's names "
                             "(e.g. max_steps=50 loss_type=grpo; kept in the recipe)")
    parser.add_argument("--config", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                        help="the same as --set, for GRPOConfig arguments (e.g. loss_type=grpo num_iterations=2)")
    parser.add_argument("--resume", default="auto", help="auto (default), yes, no, or a checkpoint path")
    parser.add_argument("--seed", type=int, help="the run's seed (part of the recipe; default the preset's, 0)")
    parser.add_argument("--dry-run", action="store_true", help="validate and run the preflight check, then exit")
    return parser


def _output_dir(text: str | None, preset) -> Path:
    """Return the run folder, refusing an empty name or a path that is a file."""
    if text is not None and not text.strip():
        raise UsageError("--output-dir is empty: give a folder name (default runs/PRESET)")
    output_dir = Path(text) if text is not None else Path("runs") / preset.name
    for path in (output_dir, *output_dir.parents):
        if path.exists() and not path.is_dir():
            raise UsageError(f"--output-dir {output_dir}: {path} is a file, not a folder; choose another --output-dir")
    return output_dir


def train_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit train --preset NAME [...]``: validate, preflight, train (resuming), save.

    Works as a plain script under ``accelerate launch ... -m labkit train --preset NAME``.
    Exit codes: 0 done (or already finished: nothing is changed), 2 a preset, folder or resume error
    (one line says what to change), 3 out of memory, 130 interrupted (Ctrl-C; the message says where
    the run resumes from).
    """
    from labkit.device import detect_device
    from labkit.oom import TrainingOutOfMemory, preflight
    from labkit.presets import PRESETS, PresetError, card_device, get_preset
    from labkit.run import (ResumeMismatchError, RunLock, RunLockedError, build_run, finished_run, is_main_process,
                            resume_checkpoint)
    from labkit.training import last_checkpoint
    from labkit.validation import SECRET_FIELDS, TRL_CHOICES, checked_plan

    args = train_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.list or not args.preset:
        for preset in PRESETS.values():
            print(f"{preset.name:<12} {preset.model} ({preset.method}): {preset.description}")
        return 0 if args.list else 2
    main = is_main_process()
    output_dir = None
    try:
        overrides = {**parse_pairs("--set", args.set), **parse_pairs("--config", args.config)}
        for key, choices in TRL_CHOICES.items():  # "scale_rewards=none" is TRL's word, not Python's None
            if key in overrides and overrides[key] is None and "none" in choices:
                overrides[key] = "none"
        secrets = sorted(key for key in overrides if key in SECRET_FIELDS)
        if secrets:  # refused before anything can echo or save it
            raise UsageError(f"--set {secrets[0]}=... is refused: a secret on the command line ends up in the "
                             f"shell history and the saved recipe. Set the {SECRET_FIELDS[secrets[0]]} environment "
                             "variable instead.")
        for key in ("model", "max_steps", "save_steps", "train_limit", "seed"):
            if getattr(args, key) is not None:
                overrides[key] = getattr(args, key)
        preset = get_preset(args.preset).replace(**overrides)
        if "LOCAL_RANK" in os.environ:  # accelerate launch: one GPU per process
            import torch

            if torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = detect_device()
        if args.dry_run and device.kind != "cuda" and card_device(preset) is not None:
            # Planning a GPU run from a machine without one: validate and plan for the preset's card.
            device = card_device(preset)
            print(f"no CUDA GPU here: validating and planning for the preset's card, {device}") if main else None
        plan, warnings = checked_plan(preset, device)  # resolved once: preflight and build_run read this plan
        for warning in warnings:
            print("warning:", warning, file=sys.stderr) if main else None
        output_dir = _output_dir(args.output_dir, preset)
        if main:
            print(f"preset {preset.name}: {preset.description}")
            print(f"plan: {plan.describe()}")
            print(preflight(plan))
        if args.dry_run:
            return 0
        resume = {"auto": "auto", "yes": True, "no": False}.get(args.resume, args.resume)
        with RunLock(output_dir):
            resume_checkpoint(output_dir, preset, resume)  # a changed recipe fails here, before loading anything
            finished = finished_run(output_dir, preset) if resume is not False else None
            if finished:
                print(finished) if main else None
                return 0
            run = build_run(plan, output_dir, device=device)
            if main and run.dropped_prompts:
                print(f"dropped {run.dropped_prompts} prompts longer than {preset.max_prompt_length} tokens; "
                      f"training on {len(run.train_dataset)}")
            result = run.train(resume=resume)
            final = run.save()
        if main:
            print(f"done: {result.global_step} steps; saved to {final}")
        _leave_process_group()
        return 0
    except TrainingOutOfMemory as exc:
        print(exc, file=sys.stderr)
        return 3
    except (UsageError, PresetError, ResumeMismatchError, RunLockedError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        checkpoint = last_checkpoint(output_dir) if output_dir is not None else None
        where = (f"re-run the same command to resume from {checkpoint}" if checkpoint else
                 "no checkpoint was written yet, so re-running the same command starts again at step 0")
        print(f"\ninterrupted: {where}.", file=sys.stderr)
        return 130


def _leave_process_group() -> None:
    """Under ``accelerate launch``, leave the process group once the run is saved, as PyTorch asks of a program's end:
    a process that exits with the group's threads still alive can abort ("terminate called without an active
    exception", seen once on notebook 07's two-process CPU run)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def demo_parser(prog: str, description: str) -> argparse.ArgumentParser:
    from labkit.nano import NanoConfig

    defaults = NanoConfig()
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--lr", "--learning-rate", dest="lr", type=float, default=defaults.learning_rate,
                        help=f"GRPO learning rate (default {defaults.learning_rate}; 0 switches the update off)")
    parser.add_argument("--steps", type=int, default=defaults.max_steps, help="GRPO steps")
    parser.add_argument("--sft-steps", type=int, default=defaults.sft_steps, help="warm-up steps")
    parser.add_argument("--num-generations", type=int, default=defaults.num_generations, help="G")
    parser.add_argument("--beta", type=float, default=defaults.beta, help="KL coefficient")
    parser.add_argument("--eval-problems", type=int, default=defaults.eval_problems, help="held-out problems")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def demo_argument_error(args) -> str | None:
    """Return one line saying which demo option is out of range and what to write, or None when all are usable."""
    import math

    rules = [  # (option, value, lowest, highest)
        ("--steps", args.steps, 1, 100_000), ("--sft-steps", args.sft_steps, 0, 1_000_000),
        ("--num-generations", args.num_generations, 2, 1024), ("--eval-problems", args.eval_problems, 1, 100_000),
        ("--lr", args.lr, 0.0, 1.0), ("--beta", args.beta, 0.0, 1000.0),
        ("--seed", args.seed, 0, 2**32 - 1),
    ]
    for option, value, low, high in rules:
        if not math.isfinite(value) or not low <= value <= high:
            why = " (the advantage compares completions of one prompt)" if option == "--num-generations" else ""
            return f"{option} must be from {low:,} to {high:,}{why}, not {value}."
    if not args.out.strip():
        return "--out is empty: give a folder name (default runs/demo)."
    for path in (Path(args.out), *Path(args.out).parents):
        if path.exists() and not path.is_dir():
            return f"--out {args.out}: {path} is a file, not a folder; choose another --out."
    return None


def demo_config(args, seed: int):
    from labkit.nano import NanoConfig

    return NanoConfig(seed=seed, learning_rate=args.lr, max_steps=args.steps, sft_steps=args.sft_steps,
                      num_generations=args.num_generations, beta=args.beta, eval_problems=args.eval_problems)


def print_demo_summary(summary: dict) -> None:
    print(f"seed {summary['seed']}: held-out accuracy {summary['accuracy_before']:.1%} -> "
          f"{summary['accuracy_after']:.1%} ({summary['rise_points']:+.1f} points; greedy "
          f"{summary['greedy_accuracy_before']:.1%} -> {summary['greedy_accuracy_after']:.1%}) "
          f"in {summary['seconds']:.0f} s")
    if "mcnemar" in summary:  # the paired statistics on the same held-out problems (labkit.demo)
        test, (low, high), curve = summary["mcnemar"], summary["greedy_change_95ci"], summary["pass_at_k"]
        print(f"  paired, {test['n']} problems: greedy {summary['greedy_change']:+.1%} (95% CI {low:+.1%} to "
              f"{high:+.1%}), {test['gained']} gained, {test['lost']} lost, McNemar p = {test['p_value']:.2g}; "
              f"pass@{curve['k'][-1]} {curve['before'][-1]:.1%} -> {curve['after'][-1]:.1%}")


def demo_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit demo``: the main job; a model learns with GRPO on a CPU, held-out figures before and after.

    Without ``--model``: the nano task (a tiny model learns to carry). With ``--model smollm2-135m``:
    a real instruct model learns to get word problems right (:func:`labkit.demo.real_model_demo`).
    """
    parser = demo_parser("python -m labkit demo", "Warm a tiny model up on sloppy worked additions, then GRPO "
                         "(or, with --model smollm2-135m, GRPO on a real instruct model): held-out figures before "
                         "and after, written to OUT/summary.json and OUT/demo.png.")
    parser.add_argument("--model", default=None, help="smollm2-135m: the real-model experiment (default: the nano task)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="output folder (default runs/demo, or runs/demo-MODEL)")
    parser.add_argument("--threads", type=int, default=None,
                        help="--model only: torch CPU threads (default 2; 1 on a machine other jobs keep busy)")
    parser.add_argument("--pass-at-k", type=int, default=0, metavar="PROBLEMS",
                        help="--model only: pass@k (k = 1..8, 8 sampled replies) on this many held-out problems, "
                             "before and after (costs about as much as the training)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = "runs/demo" if args.model is None else f"runs/demo-{args.model}"
    problem = demo_argument_error(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    command = ("python -m labkit demo " + " ".join(argv or [])).strip()
    if args.model is not None:
        return _real_model_demo_cli(args, argv or [], command)
    from labkit.demo import demo

    summary = demo(demo_config(args, args.seed), args.out, progress=not args.quiet, command=command)
    print_demo_summary(summary)
    print(f"wrote {Path(args.out) / 'summary.json'} and {Path(args.out) / 'demo.png'}")
    return 0


def _real_model_demo_cli(args, argv: list[str], command: str) -> int:
    from labkit.demo import real_model_demo
    from labkit.models import LOCAL_MODELS

    if args.model not in LOCAL_MODELS:
        print(f"error: --model {args.model!r}: the CPU experiment runs a model a package ships offline; choose "
              f"from {', '.join(LOCAL_MODELS)}", file=sys.stderr)
        return 2
    ignored = [o for o in ("--sft-steps", "--num-generations", "--beta", "--eval-problems") if o in argv]
    if ignored:
        print(f"error: {', '.join(ignored)} belong to the nano task; the {args.model} experiment takes --seed, "
              "--lr (or --learning-rate), --steps, --threads, --pass-at-k and --out", file=sys.stderr)
        return 2
    lr = args.lr if any(o in argv for o in ("--lr", "--learning-rate")) else None
    steps = args.steps if "--steps" in argv else None
    if not 0 <= args.pass_at_k <= 200 or (args.threads is not None and not 1 <= args.threads <= 256):
        print("error: --pass-at-k must be from 0 to 200 (the held-out pool) and --threads from 1 to 256",
              file=sys.stderr)
        return 2
    try:
        summary = real_model_demo(args.model, args.out, seed=args.seed, learning_rate=lr, steps=steps,
                                  progress=not args.quiet, command=command, threads=args.threads or 2,
                                  pass_at_k_problems=args.pass_at_k)
    except FileNotFoundError as exc:  # the package that ships the weights is missing: what to install
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_real_demo_summary(summary)
    print(f"wrote {Path(args.out) / 'summary.json'} and {Path(args.out) / 'demo.png'}")
    return 0


def print_real_demo_summary(summary: dict) -> None:
    rate = summary["preset"]["config"]["learning_rate"]
    print(f"seed {summary['seed']}, learning rate {rate:g}: held-out right answers "
          f"{summary['right_number_before']:.1%} -> {summary['right_number_after']:.1%} "
          f"({summary['rise_points']:+.1f} points, McNemar p = {summary['mcnemar_p']:.2g}; short answers "
          f"{summary['short_answer_before']:.1%} -> {summary['short_answer_after']:.1%}; {summary['mean_words_before']:.1f}"
          f" -> {summary['mean_words_after']:.1f} words) in {summary['seconds']:.0f} s ({summary['cpu_seconds']:.0f} "
          "CPU s" + (f"; peak memory {summary['peak_rss_gib']:.1f} GiB)" if "peak_rss_gib" in summary else ")"))


def check_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit check``: the pre-workshop checklist (install, device, mode, disk, model weights)."""
    from labkit.lab import provenance, results_dir, write_json
    from labkit.workshop import workshop_checklist, workshop_estimate

    parser = argparse.ArgumentParser(prog="python -m labkit check", description=check_cli.__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--preset", default=None, help="the preset to check weights for (default: workshop on a "
                        "GPU, cpu-tiny without)")
    parser.add_argument("--offline", action="store_true", help="do not contact the hub")
    parser.add_argument("--workshop-estimate", action="store_true",
                        help="print the workshop preset's estimated T4 time and write results/workshop_estimate.json")
    args = parser.parse_args(argv)
    if args.workshop_estimate:
        record = {**workshop_estimate(), "command": "python -m labkit check --workshop-estimate",
                  "provenance": provenance()}
        path = write_json(results_dir() / "workshop_estimate.json", record)
        print(f"workshop on a T4: about {record['minutes_low']}-{record['minutes_high']} min (ESTIMATE from published "
              f"step times of {record['seconds_per_step_low']}-{record['seconds_per_step_high']} s; wrote {path})")
        return 0
    items = workshop_checklist(args.preset, online=False if args.offline else None)
    if args.json:
        print(json.dumps({"checks": [vars(item) for item in items], **provenance()}, indent=2))
    else:
        print("\n".join(str(item) for item in items))
    return 0 if all(item.ok is not False for item in items) else 1
