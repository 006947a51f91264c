"""``python -m bench memory``: measured peaks of real TRL GRPO steps against :func:`labkit.memory.estimate`.

Each configuration runs in a fresh process (:mod:`bench.worker`): a catalogue architecture
with random weights (memory depends on shapes, not values), every completion forced to full length.
"""
from __future__ import annotations

import argparse
import sys

from bench import worker
from labkit.options import add_setting_arguments, batch_settings
from labkit.monitor import state_bytes
from labkit.memory import GIB, estimate
from labkit.models import METHODS
from labkit.monitor import peak_rss_bytes, reset_peak_rss

__all__ = ["main", "measure_grpo", "GPU_GRID", "CPU_GRID"]


# Eight or more configurations for one GPU in under ten minutes: model size x method x num_generations.
GPU_GRID = [
    (model, method, g)
    for model in ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct")
    for method in METHODS
    for g in (4, 8)
]


# On a CPU: a real architecture small enough for RAM (SmolLM2-135M in fp32), full and LoRA.
# The tiny model first: its own memory is a few MB, so what its row measures is the process's floor.
CPU_GRID = [("tiny-qwen2", "lora", 2)] + [
    ("HuggingFaceTB/SmolLM2-135M-Instruct", method, g) for method in ("full", "lora") for g in (2, 4)]


_MEMORY_CSV_FIELDS = [
    "date", "device", "device_kind", "model", "method", "num_generations", "per_device_train_batch_size",
    "gradient_accumulation_steps", "prompt_len", "completion_len", "optimizer", "gradient_checkpointing", "beta", "precision", "lora_rank", "steps",
    "cap_gib", "status", "measured_peak_gib", "measure", "predicted_total_gib", "error_pct",
    "measured_weights_gib", "predicted_weights_gib", "measured_optimizer_gib", "predicted_optimizer_gib",
    "predicted_activations_gib", "predicted_logits_gib", "predicted_kv_cache_gib", "seconds_per_step",
    "torch", "transformers", "trl", "peft", "bitsandbytes",
]


def _random_prompts(n: int, length: int, seed: int) -> list[str]:
    # Byte-level tokenizer: one token per ASCII letter, so every prompt is exactly `length` tokens.
    import random

    rng = random.Random(seed)
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(length)) for _ in range(n)]


def measure_grpo(spec: dict) -> dict:
    """Run ``spec["steps"]`` real TRL GRPO steps and return the measured peak (runs in a fresh process)."""
    import random
    import time

    import torch
    from datasets import Dataset

    from labkit.monitor import process_rss
    from labkit.device import detect_device
    from labkit.models import load_policy, lora_config, match_adapter_dtype
    from labkit.training import build_trainer, grpo_config

    device = detect_device(spec["device"])
    prompts = _random_prompts(16 * spec["per_device_train_batch_size"], spec["prompt_len"], seed=0)
    dataset = Dataset.from_dict({"prompt": prompts})
    rng = random.Random(0)

    def random_reward(completions, **kwargs):  # memory does not depend on what is rewarded
        return [rng.random() for _ in completions]

    optim = {"adamw_8bit": "adamw_bnb_8bit"}.get(spec["optimizer"], spec["optimizer"])
    overrides = dict(optim=optim) if optim != "adamw" else {}
    if spec.get("steps_per_generation"):
        overrides["steps_per_generation"] = spec["steps_per_generation"]
    import tempfile

    out_dir = tempfile.mkdtemp(prefix="labkit-bench-")
    args = grpo_config(
        out_dir, device=device, precision=spec["precision"], max_steps=spec["steps"],
        per_device_train_batch_size=spec["per_device_train_batch_size"],
        gradient_accumulation_steps=spec["gradient_accumulation_steps"],
        num_generations=spec["num_generations"], max_completion_length=spec["completion_len"],
        beta=spec["beta"], learning_rate=1e-6, activation_checkpointing=spec["gradient_checkpointing"],
        # Every completion runs to full length: EOS is forbidden until max_completion_length.
        generation_kwargs={"min_new_tokens": spec["completion_len"]},
        logging_steps=1, seed=0, **overrides,
    )
    if device.kind == "cuda":
        if spec.get("cap_gib"):
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, spec["cap_gib"] * GIB / total))
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    baseline = process_rss()
    status, error = "ok", ""
    started = time.perf_counter()
    measured_states = {}
    try:
        model, tokenizer = load_policy(spec["path"], spec["method"], precision=spec["precision"],
                                       peft_config=lora_config(spec["lora_rank"]),
                                       gradient_checkpointing=spec["gradient_checkpointing"])
        trainer = build_trainer(model, [random_reward], dataset, args, tokenizer=tokenizer)
        match_adapter_dtype(trainer.model, spec["precision"])  # TRL's bf16 adapters break fp16's grad scaler
        # Loading reads the weights through a memory map, which counts twice for a moment; the peak
        # that matters is the training step's, with the weights resident.
        import gc

        gc.collect()
        reset_peak_rss()
        started = time.perf_counter()
        trainer.train()
        measured_states = state_bytes(trainer.model, trainer.optimizer)
    except torch.OutOfMemoryError as exc:
        status, error = "oom", str(exc).splitlines()[0][:200]
    seconds = (time.perf_counter() - started) / spec["steps"]
    if device.kind == "cuda":
        peak, measure = torch.cuda.max_memory_allocated(), "torch.cuda.max_memory_allocated"
    else:
        peak, measure = peak_rss_bytes() - baseline, "CPU: peak RSS during training minus RSS before loading"
    return dict(status=status, error=error, peak=peak, measure=measure, seconds_per_step=seconds,
                device=str(device), device_kind=device.kind, **measured_states)


def card_busy_gib(index: int = 0) -> float | None:
    """Return the GiB other processes hold on CUDA device ``index`` (NVML, every process), or None without NVML.

    Read through NVML, which opens no CUDA context: the parent process of the benchmark stays off the card.
    """
    from labkit.monitor import nvml_reader

    found = nvml_reader.memory(index)
    return None if found is None else found[0] / GIB


def main(argv: list[str] | None = None) -> int:
    """``python -m bench memory``: measure peaks of real GRPO steps and append them to results/memory.csv.

    Each configuration runs in a fresh process: a catalogue architecture with random weights (memory
    depends on shapes, not values), saved to a temporary folder, loaded with
    :func:`labkit.models.load_policy`, trained for ``--steps`` TRL GRPO steps with every completion
    forced to full length. GPU: ``torch.cuda.max_memory_allocated``. CPU: peak resident memory of
    the process minus its resident memory before the model is loaded (it also counts Python objects
    and allocator slack, so it reads a little high). Each row carries the estimator's prediction.
    """
    from bench import append_csv, results_dir
    from labkit.device import DeviceInfo, choose_precision
    from labkit.lab import package_versions, provenance

    parser = argparse.ArgumentParser(prog="python -m bench memory", description=main.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=("gpu", "cpu", "none"), default=None,
                        help="a grid of configurations (default: gpu on a CUDA machine, else cpu); "
                             "'none' measures only --model x --method x --num-generations")
    parser.add_argument("--model", nargs="+", default=None, help="catalogue names (with --preset none)")
    add_setting_arguments(parser, many=True)
    parser.set_defaults(max_prompt_length=None, max_completion_length=None)
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps (>= 2, so optimizer states exist)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None)
    parser.add_argument("--cap-gib", type=float, default=None,
                        help="pretend the GPU has this much memory (torch.cuda.set_per_process_memory_fraction)")
    parser.add_argument("--memory-fraction", type=float, default=None, help="the same, as a fraction of the GPU")
    parser.add_argument("--out", default=None, help="CSV to append to (default results/memory.csv)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per configuration")
    parser.add_argument("--dry-run", action="store_true", help="print the configurations and predictions only")
    parser.add_argument("--max-busy-gib", type=float, default=1.0,
                        help="refuse to measure when other processes hold more than this on the card (NVML)")
    args = parser.parse_args(argv)

    # The parent never touches CUDA (a CUDA context here would take GPU memory from the measured
    # processes): a worker reports the device, and this process plans with a description of it.
    probe = worker.run("probe", {"device": args.device}, timeout=300)
    if probe.get("status") != "ok":
        print(f"error: could not inspect the device: {probe.get('error')}", file=sys.stderr)
        return 2
    device = DeviceInfo(**{k: tuple(v) if k == "compute_capability" and v else v for k, v in probe["device"].items()})
    preset = args.preset or ("none" if args.model else ("gpu" if device.kind == "cuda" else "cpu"))
    if preset == "none":
        grid = [(m, meth, g) for m in (args.model or ["Qwen/Qwen2.5-0.5B-Instruct"]) for meth in args.method
                for g in args.num_generations]
    else:
        grid = GPU_GRID if preset == "gpu" else CPU_GRID
    on_cpu = device.kind != "cuda"
    prompt_len = args.max_prompt_length or (32 if on_cpu else 128)
    completion_len = args.max_completion_length or (32 if on_cpu else 256)
    precision = choose_precision(device)
    if any(meth == "qlora" for _, meth, _ in grid) and on_cpu:
        if preset == "none":
            print("error: QLoRA stores weights in 4-bit with bitsandbytes and needs a CUDA GPU; "
                  f"this machine has {device}. Measure --method full or lora here.", file=sys.stderr)
            return 2
        grid = [row for row in grid if row[1] != "qlora"]
    cap = args.cap_gib
    if args.memory_fraction and device.kind == "cuda":
        cap = args.memory_fraction * device.total_memory_gib
    if (cap or args.memory_fraction) and on_cpu and not args.dry_run:  # a dry run plans a GPU's grid from anywhere
        print("error: --cap-gib / --memory-fraction limit GPU memory; there is no CUDA GPU here", file=sys.stderr)
        return 2
    busy = card_busy_gib() if device.kind == "cuda" and not args.dry_run else None
    if busy is not None and busy > args.max_busy_gib:
        print(f"error: the card already holds {busy:.1f} GiB (another process, or a notebook kernel that still keeps a "
              f"model): measured peaks would be wrong. Free it (del model; gc.collect(); torch.cuda.empty_cache()) "
              f"or raise --max-busy-gib (now {args.max_busy_gib:g}).", file=sys.stderr)
        return 2
    if args.steps < 2:
        print("error: --steps must be at least 2: AdamW creates its states in the first step", file=sys.stderr)
        return 2

    import shutil
    import tempfile

    from labkit.device import torch_dtype
    from labkit.models import build_tiny_model

    versions = package_versions()
    out = args.out or results_dir() / "memory.csv"
    folders: dict[tuple[str, str], str] = {}
    failures = 0
    try:
        for model, method, g in grid:
            batch = batch_settings(args, g)  # GRPOConfig's units; default: one prompt's group per pass
            spec = dict(model=model, method=method, **batch, prompt_len=prompt_len, completion_len=completion_len,
                        optimizer=args.optim, gradient_checkpointing=args.gradient_checkpointing, beta=args.beta,
                        precision=precision, lora_rank=args.lora_rank, steps=args.steps, device=device.kind,
                        cap_gib=cap)
            est = estimate(str(build_tiny_model(model.removeprefix("tiny-"))) if model.startswith("tiny-") else model,
                           method, **batch, max_prompt_length=prompt_len, max_completion_length=completion_len,
                           optim=args.optim, gradient_checkpointing=args.gradient_checkpointing, beta=args.beta,
                           precision=precision, lora_rank=args.lora_rank,
                           device="cuda" if device.kind == "cuda" else "cpu")
            label = f"{model} {method} G={g}"
            if args.dry_run:
                print(f"{label:<48} predicted {est.total:7.2f} GiB")
                continue
            dtype_name = str(torch_dtype(precision, method)).removeprefix("torch.")
            key = (model, dtype_name)
            if model.startswith("tiny-"):  # labkit's tiny models live in its cache, built once
                spec["path"] = str(build_tiny_model(model.removeprefix("tiny-")))
            elif key not in folders:
                folders[key] = tempfile.mkdtemp(prefix="labkit-arch-")
                built = worker.run("build", dict(model=model, dtype=dtype_name, folder=folders[key]), args.timeout)
                if built.get("status") != "ok":
                    print(f"{label}: could not build the architecture: {built.get('error')}", file=sys.stderr)
                    failures += 1
                    continue
            spec.setdefault("path", folders.get(key))
            result = worker.run("measure", spec, args.timeout)
            if result.get("status") == "error":
                failures += 1
            peak = result.get("peak")
            row = dict(
                date=provenance(device)["date"], device=result.get("device", str(device)), device_kind=device.kind,
                model=model, method=method, num_generations=g,
                per_device_train_batch_size=batch["per_device_train_batch_size"],
                gradient_accumulation_steps=batch["gradient_accumulation_steps"],
                prompt_len=prompt_len, completion_len=completion_len, optimizer=args.optim,
                gradient_checkpointing=args.gradient_checkpointing, beta=args.beta, precision=precision,
                lora_rank=args.lora_rank if method != "full" else "", steps=args.steps, cap_gib=cap or "",
                status=result.get("status"), measured_peak_gib=round(peak / GIB, 4) if peak else "",
                measure=result.get("measure", result.get("error", "")),
                predicted_total_gib=round(est.total, 4),
                error_pct=round(100 * (est.total * GIB - peak) / peak, 1) if peak and result["status"] == "ok" else "",
                measured_weights_gib=round(result["weights"] / GIB, 4) if "weights" in result else "",
                predicted_weights_gib=round(est.weights, 4),
                measured_optimizer_gib=round(result["optimizer"] / GIB, 4) if "optimizer" in result else "",
                predicted_optimizer_gib=round(est.optimizer, 4),
                predicted_activations_gib=round(est.activations, 4), predicted_logits_gib=round(est.logits, 4),
                predicted_kv_cache_gib=round(est.kv_cache, 4),
                seconds_per_step=round(result["seconds_per_step"], 2) if "seconds_per_step" in result else "",
                **{k: versions.get(k) or "" for k in ("torch", "transformers", "trl", "peft", "bitsandbytes")},
            )
            append_csv(out, [{k: row[k] for k in _MEMORY_CSV_FIELDS}])
            shown = f"{row['measured_peak_gib']} GiB" if peak else row["measure"]
            print(f"{label:<48} {row['status']:<5} measured {shown}  predicted {est.total:.3f} GiB"
                  + (f"  ({row['error_pct']:+} %)" if row["error_pct"] != "" else ""), flush=True)
    finally:
        for folder in folders.values():
            shutil.rmtree(folder, ignore_errors=True)
    if not args.dry_run:
        print(f"appended to {out}")
    return 1 if failures else 0
