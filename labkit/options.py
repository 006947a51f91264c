"""Command-line settings shared by ``python -m labkit`` and the benchmarks: ``KEY=VALUE`` words and the estimator's
options, named as ``GRPOConfig`` names them.

One parser for every ``--set`` (:func:`parse_pairs`), so a learning rate typed as ``1e-4`` is the
same float everywhere. Used by :mod:`labkit.cli` and by the ``bench`` folder beside the package.
"""
from __future__ import annotations

import argparse

__all__ = ["UsageError", "parse_value", "parse_pairs", "on_off", "add_setting_arguments", "batch_settings"]


class UsageError(ValueError):
    """A command-line value that cannot be used; the message says what to write instead."""


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
