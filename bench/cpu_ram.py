"""``python -m bench cpu-ram``: the resident memory of notebook 04's CPU recipe (``cpu-smollm2``), as it is
and laid out three other ways, each for 2 real GRPO steps through ``build_run`` in a fresh process
-> ``results/cpu_ram.json``.

Where the memory goes: SmolLM2-135M trains in fp32 on a CPU, and every token of a micro-batch keeps about
1.2 MB of activations for the backward pass (30 layers), plus its logits over a 49,152-token vocabulary. One
pass over all 32 completions of a step (4 prompts x 8) holds them all at once; 8 micro-batches of 4
(``per_device_train_batch_size=4``, ``gradient_accumulation_steps=8``) hold an eighth. TRL still generates the 32
completions together, once per optimiser step (``steps_per_generation`` defaults to the accumulation), and its
DAPO loss divides every micro-batch by the tokens of the whole generation batch, so the summed gradient is the
one of a single pass (docs/references.md#the-cpu-recipes-memory). Each row records step 1's loss and gradient
norm (step 1 starts from the same weights and the same completions): LoRA's dropout draws its masks per
micro-batch, so the norms differ by a sample; two rows without dropout must agree to float rounding.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

__all__ = ["main", "LAYOUTS", "measure"]

# name -> overrides of cpu-smollm2; the first is the recipe as the preset has it
LAYOUTS = {
    "the recipe": {},
    "one pass of 32 completions (the recipe before issue 33)": {"per_device_train_batch_size": 32,
                                                                "gradient_accumulation_steps": 1},
    "2 micro-batches of 16": {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 2},
    "one pass of 32, gradient checkpointing": {"per_device_train_batch_size": 32, "gradient_accumulation_steps": 1,
                                               "gradient_checkpointing": True},
    # LoRA's dropout (0.05) draws its masks per micro-batch, so step 1's gradient differs by a sample between
    # layouts; without it, the gradients of 8 x 4 and 1 x 32 must agree to float rounding
    "the recipe, no LoRA dropout": {"lora_dropout": 0.0},
    "one pass of 32, no LoRA dropout": {"per_device_train_batch_size": 32, "gradient_accumulation_steps": 1,
                                        "lora_dropout": 0.0},
}


def measure(overrides: dict, steps: int = 2, threads: int = 1) -> dict:
    """Run ``steps`` GRPO steps of cpu-smollm2 with ``overrides`` in this process; return its peak memory and step 1."""
    import tempfile
    import threading

    import psutil
    import torch

    from labkit.lab import seed_everything
    from labkit.presets import get_preset, resolve_plan
    from labkit.run import build_run, training_prompts

    torch.set_num_threads(threads)
    me, peak, stop = psutil.Process(), [0], threading.Event()

    def watch():
        while not stop.wait(0.02):
            peak[0] = max(peak[0], me.memory_info().rss)

    threading.Thread(target=watch, daemon=True).start()
    overrides = dict(overrides)
    dropout = overrides.pop("lora_dropout", None)
    preset = get_preset("cpu-smollm2", max_steps=steps, save_strategy="no", **overrides)
    seed_everything(preset.config["seed"])  # LoRA's A matrices are drawn here: the same in every layout
    model, tokenizer = resolve_plan(preset).load_policy()  # a CPU preset's plan: fp32
    if dropout is not None:  # every dropout of the model (SmolLM2's own are 0 already): the adapters' too
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = dropout
    loaded = me.memory_info().rss
    prompts, _ = training_prompts(preset, tokenizer, seed=preset.config["seed"])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="labkit-cpu-ram-") as out:
        run = build_run(preset, out, model=model, tokenizer=tokenizer, train_dataset=prompts, print_logs=False)
        run.train(resume=False)
    seconds = time.perf_counter() - started
    stop.set()
    first = next(h for h in run.trainer.state.log_history if "loss" in h)
    gib = 2**30
    return {"per_device_train_batch_size": preset.config["per_device_train_batch_size"],
            "gradient_accumulation_steps": preset.config["gradient_accumulation_steps"],
            "gradient_checkpointing": preset.config["activation_checkpointing"],
            "completions_per_step": preset.generation_batch_size,
            "lora_dropout": preset.lora_dropout if dropout is None else dropout,
            "steps": steps, "threads": threads,
            "peak_rss_gib": round(max(peak[0], me.memory_info().rss) / gib, 2),
            "rss_after_load_gib": round(loaded / gib, 2),
            "seconds": round(seconds, 1), "step1_loss": first["loss"], "step1_grad_norm": first.get("grad_norm"),
            "step1_reward": first.get("reward")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cpu-ram", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps per layout (default 2)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the fresh process's own job
    parser.add_argument("--out", default=None, help="JSON file (default results/cpu_ram.json)")
    args = parser.parse_args(argv)
    if args.one is not None:
        print("ROW " + json.dumps(measure(json.loads(args.one), steps=args.steps)), flush=True)
        return 0
    from labkit.lab import busy_cores, provenance, results_dir, write_json

    rows = []
    for name, overrides in LAYOUTS.items():
        print(f"{name} ...", flush=True)
        busy = busy_cores()
        done = subprocess.run([sys.executable, "-m", "labkit", "bench", "cpu-ram", "--steps", str(args.steps),
                               "--one", json.dumps(overrides)], capture_output=True, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
        line = next((x for x in done.stdout.splitlines() if x.startswith("ROW ")), None)
        if line is None:
            print(done.stdout[-2000:], done.stderr[-3000:], sep="\n")
            return 1
        row = {"layout": name, **json.loads(line[4:]), "busy_cores_before": round(busy, 2)}
        rows.append(row)
        print(f"  peak {row['peak_rss_gib']} GiB, step 1 loss {row['step1_loss']}, grad norm "
              f"{row['step1_grad_norm']}, {row['seconds']} s", flush=True)
    recipe = rows[0]
    plain = [r for r in rows if r["lora_dropout"] == 0]  # 8 x 4 and 1 x 32 without dropout: the same gradient
    norms = [float(r["step1_grad_norm"]) for r in plain]
    same = len(norms) == 2 and abs(norms[0] - norms[1]) <= 1e-4 * norms[0]
    out = write_json(args.out or results_dir() / "cpu_ram.json", {
        "command": "python -m bench cpu-ram" + (f" --steps {args.steps}" if args.steps != 2 else ""),
        "what": "peak resident memory (psutil, 50 Hz) of cpu-smollm2 GRPO steps through build_run, each layout in a "
                "fresh process on 1 thread; seconds are wall time and depend on how busy the machine was",
        "target_gib": 4.0, "recipe_peak_gib": recipe["peak_rss_gib"],
        "step1_gradient_same_without_dropout": same, "rows": rows, "provenance": provenance()})
    print(f"the recipe peaks at {recipe['peak_rss_gib']} GiB (target 4); without LoRA dropout, step 1's gradient "
          f"norm {'is the same' if same else 'DIFFERS'} in 8 micro-batches of 4 and one pass of 32 ({norms}); "
          f"written {out}")
    return 0 if same and recipe["peak_rss_gib"] <= 4.0 else 1
