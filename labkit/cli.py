"""The lab's command line, one table for every ``python -m labkit COMMAND``, and one ``KEY=VALUE`` parser.

Commands: ``demo`` (the main job), ``estimate`` (the VRAM estimator), ``train`` (a preset),
``check`` (what the lab will use here), ``bench`` (:mod:`labkit.bench`) and ``colab`` (where the lab is
published: every notebook's badge and install cell, from one setting). Each command's
function parses its options and calls the concept module that owns the logic; the modules are
imported only when their command runs, so ``python -m labkit --help`` is instant and needs no torch.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path


__all__ = ["COMMANDS", "main", "UsageError", "parse_value", "parse_pairs", "on_off", "add_setting_arguments",
           "demo_cli", "estimate_cli", "train_cli", "check_cli", "rehearse_cli", "colab_cli"]

# command -> ("module:function", one-line help). Each function takes argv and returns an exit code.
COMMANDS = {
    "demo": ("labkit.cli:demo_cli", "the main job: a tiny model learns a task with GRPO on CPU in minutes"),
    "estimate": ("labkit.cli:estimate_cli", "estimate the VRAM of a GRPO run (model x method x settings)"),
    "bench": ("labkit.bench:bench_cli", "run a benchmark and append its figures to results/"),
    "train": ("labkit.cli:train_cli", "train with a named preset (accelerate launch-able)"),
    "check": ("labkit.cli:check_cli", "the pre-workshop checklist: install, device, mode, free disk, model weights"),
    "rehearse": ("labkit.cli:rehearse_cli",
                 "rehearse a preset's GRPO step at full scale on fake tensors (no GPU needed): peak per phase"),
    "colab": ("labkit.cli:colab_cli",
              "set where the lab is published (--repo OWNER/NAME --ref TAG): every notebook's Colab badge and clone"),
}

MODEL_COMMANDS = ("demo", "bench", "train", "rehearse")  # they load or build models through transformers and TRL


class UsageError(ValueError):
    """A command-line value that cannot be used; the message says what to write instead."""


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m labkit COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "python -m labkit COMMAND --help shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m labkit COMMAND [options]``: run one command and return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if command in MODEL_COMMANDS:  # as labkit.setup() does in a notebook: TRL's deprecated calls, load bars
        from labkit.lab import quiet_library_noise

        quiet_library_noise()
    module_name, func_name = COMMANDS[command][0].split(":")
    func = getattr(importlib.import_module(module_name), func_name)  # an ImportError here is a real one: raised
    return int(func(rest) or 0)


def parse_value(text: str):
    """Return ``text`` as None, a bool, an int, a float (``1e-4`` too) or, failing those, the string itself."""
    lowered = text.lower()
    if lowered in ("none", "null"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def on_off(text: str) -> bool:
    if text.lower() in ("on", "true", "yes", "1"):
        return True
    if text.lower() in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on/off, not {text!r}")


def add_setting_arguments(parser: argparse.ArgumentParser, *, many: bool) -> None:
    """Add the estimator's settings, named as GRPOConfig names them, to ``parser``; ``many`` takes lists."""
    from labkit.memory import OPTIMIZERS, OPTIMS
    from labkit.models import METHODS

    nargs = "+" if many else None
    parser.add_argument("--method", nargs=nargs, default=["lora"] if many else "lora", choices=METHODS)
    parser.add_argument("--num-generations", type=int, nargs=nargs, default=[8] if many else 8,
                        help="completions per prompt (groups the generation batch; changes no memory by itself)")
    parser.add_argument("--per-device-train-batch-size", type=int, default=None,
                        help="completions per forward/backward pass on one device (default: num_generations, "
                             "one prompt's group)")
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    parser.add_argument("--steps-per-generation", type=int, default=None,
                        help="generation batch = per_device_train_batch_size x this (default: "
                             "gradient_accumulation_steps, as in GRPOConfig)")
    parser.add_argument("--max-prompt-length", type=int, default=256)
    parser.add_argument("--max-completion-length", type=int, default=512)
    parser.add_argument("--optim", default="adamw", choices=OPTIMIZERS + OPTIMS)
    parser.add_argument("--gradient-checkpointing", type=on_off, default=True, metavar="on|off")
    parser.add_argument("--beta", type=float, default=0.0, help="KL weight; > 0 loads a reference model (full only)")
    parser.add_argument("--lora-rank", type=int, default=16)


def batch_settings(args, num_generations: int) -> dict:
    """Return the estimator's batch arguments (GRPOConfig's names) from :func:`add_setting_arguments`' options."""
    return dict(per_device_train_batch_size=args.per_device_train_batch_size or num_generations,
                gradient_accumulation_steps=args.gradient_accumulation_steps,
                steps_per_generation=args.steps_per_generation, num_generations=num_generations)


def estimate_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit estimate``: print the memory breakdown of a GRPO run as a table or JSON."""
    from labkit.cards import CARDS
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
                        help="the card to compare with (labkit.cards.CARDS)")
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


def parse_pairs(option: str, pairs: list[str] | None) -> dict:
    """Return ``{key: value}`` from ``KEY=VALUE`` words (``--set`` / ``--config``), each value read by :func:`parse_value`."""
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise UsageError(f"{option} takes KEY=VALUE, not {pair!r}")
        key, value = pair.split("=", 1)
        if not key.strip():
            raise UsageError(f"{option} takes KEY=VALUE, not {pair!r}: the key is empty")
        out[key.strip()] = parse_value(value.strip())
    return out


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
                        help="override any preset field")
    parser.add_argument("--config", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                        help="any other GRPOConfig field, e.g. loss_type=grpo num_iterations=2 (kept in the recipe)")
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
    from labkit.oom import TrainingOutOfMemory
    from labkit.plan import resolve_plan
    from labkit.preflight import preflight
    from labkit.presets import PRESETS, PresetError, card_device, get_preset
    from labkit.run import (ResumeMismatchError, RunLock, RunLockedError, build_run, finished_run, is_main_process,
                            resume_checkpoint)
    from labkit.training import last_checkpoint
    from labkit.validation import SECRET_FIELDS, TRL_CHOICES, validate

    args = train_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.list or not args.preset:
        for preset in PRESETS.values():
            print(f"{preset.name:<12} {preset.model} ({preset.method}): {preset.description}")
        return 0 if args.list else 2
    main = is_main_process()
    output_dir = None
    try:
        overrides = parse_pairs("--set", args.set)
        if "trl_options" in overrides:  # a dict on the command line is --config's job, pair by pair
            raise UsageError("--set trl_options=... is not a setting: pass GRPOConfig fields one by one with "
                             "--config KEY=VALUE (e.g. --config loss_type=grpo num_iterations=2)")
        config = parse_pairs("--config", args.config)
        for key, choices in TRL_CHOICES.items():  # "scale_rewards=none" is TRL's word, not Python's None
            if key in config and config[key] is None and "none" in choices:
                config[key] = "none"
        secrets = sorted(key for key in config if key in SECRET_FIELDS)
        if secrets:  # refused before anything can echo or save it
            raise UsageError(f"--config {secrets[0]}=... is refused: a secret on the command line ends up in the "
                             f"shell history and the saved recipe. Set the {SECRET_FIELDS[secrets[0]]} environment "
                             "variable instead.")
        if config:
            overrides["trl_options"] = {**(overrides.get("trl_options") or {}), **config}
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
        for warning in validate(preset, device):
            print("warning:", warning, file=sys.stderr) if main else None
        output_dir = _output_dir(args.output_dir, preset)
        plan = resolve_plan(preset, device)  # resolved once: preflight and build_run read the same plan
        if main:
            print(f"preset {preset.name}: {preset.description}")
            print(f"plan: {plan.describe()}")
            print(preflight(plan))
        if args.dry_run:
            return 0
        resume = {"auto": "auto", "yes": True, "no": False}.get(args.resume, args.resume)
        with RunLock(output_dir):
            resume_checkpoint(output_dir, preset, resume)  # a changed recipe fails here, before loading anything
            finished = finished_run(output_dir, preset) if resume != False else None  # noqa: E712
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
    ]
    if hasattr(args, "seed"):
        rules.append(("--seed", args.seed, 0, 2**32 - 1))
    for option, value, low, high in rules:
        if not math.isfinite(value) or not low <= value <= high:
            why = " (the advantage compares completions of one prompt)" if option == "--num-generations" else ""
            return f"{option} must be from {low:,} to {high:,}{why}, not {value}."
    out = getattr(args, "out", None)
    if out is not None:
        if not str(out).strip():
            return "--out is empty: give a folder name (default runs/demo)."
        for path in (Path(out), *Path(out).parents):
            if path.exists() and not path.is_dir():
                return f"--out {out}: {path} is a file, not a folder; choose another --out."
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
    print(f"seed {summary['seed']}, learning rate {summary['preset']['learning_rate']:g}: held-out right answers "
          f"{summary['right_number_before']:.1%} -> {summary['right_number_after']:.1%} "
          f"({summary['rise_points']:+.1f} points, McNemar p = {summary['mcnemar_p']:.2g}; short answers "
          f"{summary['short_answer_before']:.1%} -> {summary['short_answer_after']:.1%}; {summary['mean_words_before']:.1f}"
          f" -> {summary['mean_words_after']:.1f} words) in {summary['seconds']:.0f} s ({summary['cpu_seconds']:.0f} "
          "CPU s" + (f"; peak memory {summary['peak_rss_gib']:.1f} GiB)" if "peak_rss_gib" in summary else ")"))


def check_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit check``: the pre-workshop checklist (install, device, mode, disk, model weights)."""
    from labkit.lab import provenance, workshop_checklist, workshop_estimate, write_json, results_dir

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


def rehearse_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit rehearse --preset NAME [--set KEY=VALUE ...]``: :func:`labkit.rehearsal.rehearse`.

    Prints the plan, the rehearsed peak of each phase with its breakdown, what is not counted and which
    CUDA behaviours are emulated, and the estimate preflight makes for the same plan. Exit 2 on a bad preset.
    """
    from labkit.cards import card_gib
    from labkit.memory import GIB
    from labkit.presets import PRESETS, PresetError, get_preset
    from labkit.validation import validate

    parser = argparse.ArgumentParser(
        prog="python -m labkit rehearse",
        description="Run a GPU preset's GRPO step (TRL 1.16's own code) at full size on fake tensors and print the "
                    "peak live memory of each phase: rehearsed, not measured.")
    parser.add_argument("--preset", required=True, help=f"one of: {', '.join(PRESETS)}")
    parser.add_argument("--set", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                        help="override any preset field")
    parser.add_argument("--no-generation", action="store_true", help="skip the generation phase")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        from labkit.plan import resolve_plan
        from labkit.preflight import estimate

        preset = get_preset(args.preset, **parse_pairs("--set", args.set))
        plan = resolve_plan(preset)
        if plan.card is None or plan.card.kind != "cuda":
            raise PresetError(f"{preset.name} is a CPU preset (card_gib=None): the rehearsal rehearses a GPU run; "
                              f"give it a card with --set card_gib={card_gib('rtx3080-laptop-16gb')}")
        for warning in validate(preset, plan.card):
            print(f"warning: {warning}")
    except (PresetError, UsageError, KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from labkit.rehearsal import LABEL, rehearse

    result = rehearse(plan, generation=not args.no_generation)
    print(result.report())
    est = estimate(plan)
    rows = [("generation", est.bytes["generation_phase"]), ("training", est.bytes["training_phase"]),
            ("peak", est.bytes["total"])]
    print(f"\npreflight's estimate (labkit.memory.estimate) vs the rehearsal, GiB:")
    print(f"{'phase':<11}{'estimated':>10}{'rehearsed':>11}{'ratio':>8}")
    for name, value in rows:
        rehearsed = result.peak if name == "peak" else max(
            result.phases[p]["peak"] for p in (("training", "optimizer") if name == "training" else (name,))
            if p in result.phases)
        print(f"{name:<11}{value / GIB:>10.3f}{rehearsed / GIB:>11.3f}{value / rehearsed:>8.3f}")
    card = plan.card.total_memory_gib
    print(f"\ncard {card:g} GiB: rehearsed peak {result.peak_gib:.2f} GiB = {100 * result.peak_gib / card:.0f} % "
          f"of it ({LABEL}; add the CUDA context and fragmentation, about 1 GiB, before comparing with a card)")
    return 0


def colab_cli(argv: list[str] | None = None) -> int:
    """``python -m labkit colab --repo OWNER/NAME --ref TAG``: set the lab's home (:func:`labkit.nbcheck.set_home`).

    Writes ``labkit/data/home.json``, every notebook's Colab badge and install cell, and the README's Colab
    links, in one go, or nothing at all: bad input or a file it cannot rewrite exits 2 before any write.
    Idempotent. ``--unset`` goes back to no home; ``--check`` only reports disagreements (exit 1).
    """
    from labkit.nbcheck import HomeError, home_problems, read_home, set_home, validate_home

    parser = argparse.ArgumentParser(
        prog="python -m labkit colab",
        description="Set where this copy of the lab is published, for Colab: its GitHub repository and the tag "
                    "learners get. Rewrites labkit/data/home.json, every notebook's badge and clone cell and the "
                    "README's Colab links. Commit the result, then create the tag on that commit and push both.")
    parser.add_argument("--repo", help="the lab's public GitHub repository, OWNER/NAME (e.g. alice/grpo-lab)")
    parser.add_argument("--ref", help="the tag (or commit) learners clone, e.g. v0.2.0-class")
    parser.add_argument("--unset", action="store_true", help="forget the home: badges and clone cells say there is none")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a notebook or the README disagrees with labkit/data/home.json")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the lab's folder (default: the one holding this labkit)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.check:
            if args.repo or args.ref or args.unset:
                raise HomeError("--check takes no --repo, --ref or --unset")
            problems = home_problems(args.root)
            print("\n".join(problems) if problems else f"every notebook and the README show {read_home(args.root)}")
            return 1 if problems else 0
        if args.unset and (args.repo or args.ref):
            raise HomeError("--unset takes no --repo or --ref")
        if not args.unset and (args.repo is None or args.ref is None):
            raise HomeError("give both --repo OWNER/NAME and --ref TAG (or --unset, or --check)")
        home = validate_home(None if args.unset else args.repo, None if args.unset else args.ref)
        changed = set_home(args.root, home)
    except HomeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not changed:
        print(f"the lab already shows {home}: nothing to change")
        return 0
    rewrote = ", ".join(str(path.relative_to(args.root)) for path in changed)
    print(f"the lab's home is now {home}; rewrote {rewrote}" if home.is_set else
          f"the lab now has no published home; rewrote {rewrote}")
    if home.is_set:
        print(f"next: commit these files, then tag that commit and push both: git tag {home.ref} && "
              f"git push origin HEAD {home.ref} (the badges open the notebooks as they are at {home.ref})")
    return 0
