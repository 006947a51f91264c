"""The lab's command line: ``python -m labkit COMMAND [options]``.

Each command lives in the module that owns its logic and is imported only when called,
so ``python -m labkit --help`` is instant and needs no torch.
"""
from __future__ import annotations

import importlib
import sys

# command -> ("module:function", one-line help). Each function takes argv and returns an exit code.
COMMANDS = {
    "demo": ("labkit.nano:demo_cli", "the main job: a tiny model learns a task with GRPO on CPU in minutes"),
    "estimate": ("labkit.memory:estimate_cli", "estimate the VRAM of a GRPO run (model x method x settings)"),
    "bench": ("labkit.bench:bench_cli", "run a benchmark and append its figures to results/"),
    "train": ("labkit.presets:train_cli", "train with a named preset (accelerate launch-able)"),
    "check": ("labkit.lab:check_cli", "print the device, precision, mode and versions the lab will use"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m labkit COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "python -m labkit COMMAND --help shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    target, _ = COMMANDS[command]
    module_name, func_name = target.split(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        print(f"'{command}' is not available in this version of labkit ({exc})", file=sys.stderr)
        return 2
    return int(func(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
