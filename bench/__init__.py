"""The lab's measurements: ``python -m bench NAME [options]`` (from the repository's folder) records figures under
``results/``.

Every figure the lab states is made here, by a command that writes what it measured (with
:func:`labkit.lab.provenance`: device, versions, date), never by a timed test. One file per
benchmark, each with a ``main(argv) -> exit code``; :mod:`bench.worker` runs the
measurements that need a fresh process. This package sits beside ``labkit``, not in it: it is not
installed with the learner's package, and ``labkit`` never imports it (tests/test_layout.py).
"""
from __future__ import annotations

import csv
import importlib
import sys
from pathlib import Path

from labkit.lab import write_json

__all__ = ["BENCHMARKS", "results_dir", "write_json", "append_csv", "main"]

# name -> (module of the bench package, help). Each module's main(argv) returns an exit code.
BENCHMARKS = {
    "memory": ("memory", "measure peak memory of real GRPO steps -> results/memory.csv"),
    "chunked-logps": ("chunked_logps", "peak memory of chunked vs full log-probs -> results/"),
    "rewards": ("rewards", "worst-case reward time on adversarial inputs -> results/"),
    "dashboard": ("dashboard", "dashboard overhead per training step -> results/"),
    "preset": ("preset", "GRPO steps of a preset (random weights, full-length completions) under a GPU memory cap -> results/"),
    "gpu": ("gpu", "the GPU half measured on a CUDA card in one run: presets per phase (+ dashboard, forced tool rounds), "
                   "QLoRA, the OOM doctor, estimator grid side by side, then generation speed -> results/gpu/ (--plan: "
                   "the plan on any machine; --tiny: the CPU rehearsal of the command; --bundle DIR: offline wheels)"),
    "unsloth": ("unsloth", "plain TRL vs Unsloth on one preset (GPU, Unsloth environment) -> results/unsloth_vs_trl.csv; "
                           "--random-weights: memory per phase under the card's cap -> results/gpu/unsloth_vs_trl.csv; "
                           "--bundle DIR: the offline wheels"),
    "demo": ("demo", "the main job over several seeds -> results/"),
    "rehearse": ("rehearse", "one preset's GRPO step at full scale on fake tensors (no GPU needed): peak per phase, "
                             "beside the estimate (prints; writes nothing)"),
    "rehearsal": ("rehearsal", "GPU presets + an 18-row grid + Unsloth's setting rehearsed on fake tensors, beside the "
                               "estimate -> results/rehearsal.csv"),
    "smollm2-demo": ("real_demo", "GRPO on SmolLM2-135M-Instruct on CPU: 3 seeds and a learning-rate-0 control -> results/"),
    "smollm2-experiments": ("smollm2_experiments", "one recipe trial of the SmolLM2 CPU experiment (per seed) "
                            "-> results/smollm2_experiments.json"),
    "smollm2-long-run": ("smollm2_long_run", "the SmolLM2 CPU recipe for hundreds of steps, held-out curve written "
                         "as it goes -> results/smollm2_long_run/ (an hour or more; background)"),
    "full-vs-lora": ("full_vs_lora",
                     "full-parameter vs LoRA GRPO on the CPU nano task (3 seeds, LR sweep) -> results/full_vs_lora.json"),
    "cpu-ram": ("cpu_ram", "peak RAM of notebook 04's CPU recipe (cpu-smollm2) and three other layouts of its batch, "
                           "2 GRPO steps each -> results/cpu_ram.json"),
    "notebooks": ("notebooks", "each notebook end to end in CPU mode: wall time and the kernel's peak memory "
                               "-> results/notebook_times.json"),
    "tools-demo": ("tools_demo", "SmolLM2-135M-Instruct learns to call a calculator (TRL's environment_factory) on CPU: "
                                 "held-out tool-call, well-formed and right-answer rates before/after GRPO, McNemar, "
                                 "a learning-rate-0 control -> results/tools_demo.json"),
    "generation-paths": ("generation_paths", "each generation path on a CPU with SmolLM2: the same greedy tokens, tokens a "
                                             "second, and a learning run against the default's -> "
                                             "results/generation_paths.json"),
    "reward-hacking": ("reward_hacking",
                       "a reward with a loophole vs the strict reward on the CPU nano task (3 seeds) "
                       "-> results/reward_hacking.json"),
    "false-equations": ("false_equations", "replies right_answer_reward scores right that hold a false equation, in "
                                           "the recorded SmolLM2 CPU runs (reads JSON only) -> "
                                           "results/false_equations.json"),
}


def results_dir(path: str | Path | None = None) -> Path:
    """Return the results folder (``results/`` in the current directory unless given), created."""
    folder = Path(path or "results")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def append_csv(path: str | Path, rows: list[dict]) -> Path:
    """Append ``rows`` to a CSV file, writing the header when the file is new."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    fields = list(rows[0]) if rows else []
    if not new:
        with path.open() as fh:
            header = next(csv.reader(fh), [])
        missing = [f for f in fields if f not in header]
        if missing:
            raise ValueError(f"{path} has columns {header}; these rows add {missing}. Write to a new file.")
        fields = header
    with path.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        if new:
            writer.writeheader()
        writer.writerows(rows)
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m bench NAME [options]``: run one benchmark; without a name, list them."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m bench NAME [options]\n\nbenchmarks:")
        for name, (_, help_) in BENCHMARKS.items():
            print(f"  {name:<14} {help_}")
        return 0
    name = argv[0]
    if name not in BENCHMARKS:
        print(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    from labkit.lab import quiet_library_noise

    quiet_library_noise()  # as labkit.setup() does in a notebook: TRL's deprecated calls, load bars
    module = importlib.import_module(f"bench.{BENCHMARKS[name][0]}")
    return int(module.main(argv[1:]) or 0)
