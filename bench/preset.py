"""``python -m bench preset``: GRPO steps of a preset on its architecture with random weights, under a cap."""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from labkit.device import CARDS
from labkit.memory import GIB
from labkit.models import resolve_model
from labkit.presets import PRESETS, Preset, get_preset
from labkit.run import build_run
from labkit.training import LogRecorder

__all__ = ["main", "bench_preset", "card_cap_fraction", "save_random_architecture"]


def save_random_architecture(name: str, folder: str | os.PathLike, *, dtype=None, device: str = "cpu",
                             **overrides) -> str:
    """Save a catalogue architecture with random weights, and the tiny byte tokenizer, to ``folder``.

    What the memory benchmarks train: memory depends on shapes, not weight values, so no
    download is needed. The byte tokenizer's ids are a subset of every catalogue vocabulary
    (its pad and EOS become the model's); tokens it cannot decode come out as nothing, which
    only the (irrelevant) rewards see. Random init is much faster with ``device="cuda"``; the
    weights are freed before this returns. ``overrides`` change the shape (``num_hidden_layers=2``: the
    CPU rehearsal of ``python -m bench gpu --tiny``); ``dtype`` defaults to bfloat16. Returns ``str(folder)``.
    """
    import torch

    from labkit.models import build_architecture, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = build_architecture(name, device=device, dtype=dtype or torch.bfloat16, pad_token_id=tokenizer.pad_token_id,
                               eos_token_id=tokenizer.eos_token_id, bos_token_id=None, **overrides)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()
    return str(folder)


def _random_weights_model(preset: Preset, folder: Path, precision: str, device: str | None = None,
                          **overrides) -> str:
    """Return a loadable path for the preset's model: its architecture with random weights, saved to ``folder``
    (:func:`save_random_architecture`; ``overrides`` change its shape), or the tiny model's path.
    QLoRA's frozen base is saved in the LoRA dtype: it is quantised when loaded."""
    import torch

    from labkit.device import torch_dtype
    if preset.model.startswith("tiny:"):
        return resolve_model(preset.model)
    dtype = torch_dtype(precision, "lora" if preset.method == "qlora" else preset.method)
    # Random init is much faster on a GPU; the weights are saved and freed before the measured run starts.
    return save_random_architecture(preset.model, folder, dtype=dtype, **overrides,
                                    device=device or ("cuda" if torch.cuda.is_available() else "cpu"))


def fixed_length_prompts(tokenizer, n: int, length: int):
    """Return ``n`` conversational prompts of exactly ``length`` tokens (chat template included)."""
    from datasets import Dataset

    from labkit.data import load_gsm8k

    overhead = len(tokenizer.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=True)["input_ids"])
    questions = load_gsm8k("train", limit=n)
    prompts, answers = [], []
    for row in questions:
        text = (row["question"] + " ") * 20
        ids = tokenizer(text.encode("ascii", "ignore").decode(), add_special_tokens=False)["input_ids"]
        content = tokenizer.decode(ids[: max(0, length - overhead)])
        prompts.append([{"role": "user", "content": content}])
        answers.append(row["answer"])
    got = len(tokenizer.apply_chat_template(prompts[0], add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"])
    if got != length:
        raise RuntimeError(f"built a {got}-token prompt, wanted {length}")
    return Dataset.from_dict({"prompt": prompts, "answer": answers})


def card_cap_fraction(cap_gib: float, total_bytes: int) -> float:
    """Return the fraction of a card's memory that ``cap_gib`` is (for ``set_per_process_memory_fraction``).

    GiB as PyTorch reports them (:data:`labkit.device.CARDS`: a "16 GB" card reports less than 16 GiB),
    so a cap above what the card reports is refused with the card's own figure (presets' ``card_gib``
    is already given that way).
    """
    total_gib = total_bytes / GIB
    if cap_gib <= 0:
        raise ValueError(f"cap_gib must be positive, not {cap_gib}")
    if cap_gib > total_gib:
        raise ValueError(f"cap_gib={cap_gib:g} is more than this card's {total_gib:.2f} GiB (as PyTorch reports it): "
                         f"leave --cap-gib out (the preset's card_gib) or set --cap-gib {math.floor(total_gib * 100) / 100:g}")
    return cap_gib * GIB / total_bytes


def bench_preset(preset: Preset | str, *, steps: int = 5, cap_gib: float | None = None, min_spare_gib: float = 1.0,
                 device=None, workdir: str | os.PathLike | None = None) -> dict:
    """Return the figures of ``steps`` GRPO steps of ``preset`` on its architecture with random weights.

    Worst case on purpose: every prompt is exactly ``max_prompt_length`` tokens and every
    completion runs to ``max_completion_length`` (``min_new_tokens`` forbids an early stop).
    On CUDA the process is capped at ``cap_gib`` (``torch.cuda.set_per_process_memory_fraction``;
    default: the preset's ``card_gib``, the memory its card reports to PyTorch) and the record says
    whether the peak reserved memory left ``min_spare_gib`` to spare.
    Seconds per step and tokens per second leave out the first step (warm-up). On a CPU the
    memory figures are None: this is a smoke test of the command, not a measurement.
    """
    import torch

    from labkit.device import detect_device
    from labkit.lab import provenance
    from labkit.oom import TrainingOutOfMemory
    from labkit.presets import resolve_plan

    preset = get_preset(preset)
    device = device or detect_device()
    precision = resolve_plan(preset, device).precision
    cuda = device.kind == "cuda"
    cap_note = None
    if cuda and (cap_gib is not None or preset.card_gib is not None):
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        if cap_gib is None:  # the preset's card; a card that reports a little less is that card
            cap_gib = preset.card_gib
            if cap_gib * GIB > total:
                cap_gib = math.floor(total / GIB * 1000) / 1000
                cap_note = f"capped at the card's own {cap_gib:g} GiB (the preset's card_gib is {preset.card_gib:g})"
        torch.cuda.set_per_process_memory_fraction(card_cap_fraction(cap_gib, total))
    record = {"preset": preset.name, "model": preset.model, "method": preset.method, "precision": precision,
              "steps": steps, "cap_gib": cap_gib if cuda else None, "min_spare_gib": min_spare_gib,
              "weights": "random (labkit.models.build_architecture)" if not preset.model.startswith("tiny:") else "tiny",
              "prompt_tokens": preset.max_prompt_length, "completion_tokens": preset.config["max_completion_length"],
              "settings": preset.to_dict()}
    if cap_note:
        record["cap_note"] = cap_note
    recorder = LogRecorder(("num_tokens", "completions/mean_length"))

    owned = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="labkit-bench-"))
    try:
        model_path = _random_weights_model(preset, workdir / "model", precision)
        bench = preset.replace(model=model_path, max_steps=steps, save_strategy="no")
        from labkit.models import load_tokenizer

        tokenizer = load_tokenizer(model_path)
        n = max(8, steps * math.ceil(bench.prompts_per_step) * 2)
        dataset = fixed_length_prompts(tokenizer, n, bench.max_prompt_length)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        run = build_run(bench, workdir / "run", device=device, tokenizer=tokenizer, train_dataset=dataset,
                        callbacks=[recorder], disable_tqdm=True,
                        generation_kwargs={"min_new_tokens": bench.config["max_completion_length"]})
        start = time.perf_counter()
        try:
            run.train(resume=False)
            record["oom"] = None
        except TrainingOutOfMemory as exc:
            record["oom"] = str(exc.report)
        record["wall_seconds"] = round(time.perf_counter() - start, 2)
    finally:
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)
    times, tokens = recorder.values["step_time"], recorder.values["num_tokens"]
    lengths = recorder.values["completions/mean_length"]
    record["steps_done"] = len(times)
    timed = times[1:] if len(times) > 1 else times
    record["seconds_per_step"] = round(sum(timed) / len(timed), 3) if timed else None
    if len(tokens) > 1:
        record["tokens_per_second"] = round((tokens[-1] - tokens[0]) / sum(times[1:]), 1)
    elif tokens:
        record["tokens_per_second"] = round(tokens[0] / times[0], 1)
    else:
        record["tokens_per_second"] = None
    record["tokens_counted"] = "prompt + completion tokens (TRL's num_tokens) per second of step time, first step left out"
    record["completion_mean_length"] = round(sum(lengths) / len(lengths), 1) if lengths else None
    if record["seconds_per_step"] and lengths:
        completion_tokens = record["completion_mean_length"] * bench.generation_batch_size
        record["completion_tokens_per_second"] = round(completion_tokens / record["seconds_per_step"], 1)
    if cuda:
        record["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 3)
        record["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / GIB, 3)
        if cap_gib is not None:
            record["spare_gib"] = round(cap_gib - record["peak_reserved_gib"], 3)
            record["fits"] = record["oom"] is None and record["spare_gib"] >= min_spare_gib
    else:
        record.update(peak_allocated_gib=None, peak_reserved_gib=None, spare_gib=None, fits=None,
                      note="no CUDA: a smoke test of the command; memory is not measured and the cap not applied")
    record["provenance"] = provenance(device)
    return record


def main(argv: list[str] | None = None) -> int:
    """``python -m bench preset --preset NAME [--cap-gib GIB]``: GRPO steps of a preset under a memory cap.

    Writes ``results/preset_NAME.json`` and appends a row to ``results/presets.csv``.
    Exit code 0 when it ran (and, on CUDA, fit with the spare asked for), 1 otherwise.
    """
    import argparse

    from bench import append_csv, results_dir, write_json

    parser = argparse.ArgumentParser(prog="python -m bench preset", description=main.__doc__)
    parser.add_argument("--preset", required=True, help=f"one of: {', '.join(PRESETS)}")
    parser.add_argument("--model", help="another catalogue architecture (default: the preset's)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--cap-gib", type=float, default=None,
                        help="per-process GPU memory cap in GiB as PyTorch reports them (CUDA only; default: the "
                             "preset's card_gib, from labkit.device.CARDS: "
                             + ", ".join(f"{c.gib:g} for {c.name}" for c in CARDS.values()) + ")")
    parser.add_argument("--min-spare-gib", type=float, default=1.0)
    parser.add_argument("--results", default="results", help="results folder")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    preset = get_preset(args.preset, **({"model": args.model} if args.model else {}))
    record = bench_preset(preset, steps=args.steps, cap_gib=args.cap_gib, min_spare_gib=args.min_spare_gib)
    folder = results_dir(args.results)
    write_json(folder / f"preset_{preset.name}.json", record)
    row = {k: record.get(k) for k in ("preset", "model", "method", "precision", "steps_done", "cap_gib",
                                      "peak_allocated_gib", "peak_reserved_gib", "spare_gib", "fits",
                                      "seconds_per_step", "tokens_per_second", "completion_tokens_per_second",
                                      "completion_mean_length")}
    row.update(device=record["provenance"]["device"], date=record["provenance"]["date"],
               torch=record["provenance"]["versions"].get("torch"), trl=record["provenance"]["versions"].get("trl"))
    append_csv(folder / "presets.csv", [row])
    print(json.dumps({k: v for k, v in record.items() if k not in ("settings", "provenance")}, indent=2))
    if record.get("oom"):
        print(record["oom"], file=sys.stderr)
    return 0 if record["oom"] is None and record.get("fits") is not False and record["steps_done"] == args.steps else 1
