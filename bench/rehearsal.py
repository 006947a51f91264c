"""``python -m bench rehearsal``: every GPU preset, an 18-row grid and Unsloth's headline setting,
rehearsed on fake tensors (:mod:`bench.rehearse`) beside :func:`labkit.memory.estimate`.

Rows: each preset with a card; Qwen2.5 0.5B / 1.5B / 3B x full / LoRA / QLoRA x bf16 / fp16 on the
laptop-16gb recipe (the precision decides the card: bf16 an Ampere 16 GB card, fp16 a T4); and
Unsloth's "GRPO in 5 GB" setting: Qwen2.5-1.5B LoRA, G = 8 completions of 512 tokens in one
micro-batch; and the sizing rows: each preset sized to its card (laptop-16gb, colab-t4, qlora-3b) one
step up (``per_device_train_batch_size + num_generations``), the size that no longer fits
(:func:`labkit.device.sizing_fits`). A tool recipe's rows (``tools-16gb``) rehearse each of its tool rounds, a new
``generate`` call over prompt + completion (:func:`bench.fake_tensors.generate`). Writes results/rehearsal.csv (one
row per configuration, with provenance); ``--name`` re-rehearses only the rows named. Every peak is
**rehearsed (fake tensors)**: no GPU ran it; ``bench memory`` measures on a real card.
"""
from __future__ import annotations

import argparse
import os
import time
import traceback

from labkit.device import sized_gib
from bench import append_csv, results_dir
from labkit.lab import provenance
from labkit.memory import GIB
from labkit.presets import PRESETS, Preset

__all__ = ["main", "configurations", "rehearse_row", "FIELDS", "SIZED"]

SIZED = ("laptop-16gb", "colab-t4", "qlora-3b", "tools-16gb")  # the presets sized to their card by rehearsal (labkit.presets)

GRID_MODELS = ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-3B-Instruct")
# Unsloth's headline (docs: "GRPO ... in 5GB of VRAM" for Qwen2.5 1.5B): 8 completions of 512 tokens in one step.
UNSLOTH = dict(model="Qwen/Qwen2.5-1.5B-Instruct", method="lora",
               config=dict(per_device_train_batch_size=8, gradient_accumulation_steps=1, num_generations=8,
                           max_completion_length=512))

FIELDS = ["date", "device", "kind", "name", "figure", "model", "method", "precision", "card", "card_gib",
          "per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size", "num_generations",
          "max_prompt_length", "max_completion_length", "optim", "activation_checkpointing", "trainable_params",
          "rehearsed_peak_gib", "rehearsed_generation_gib", "rehearsed_training_gib", "rehearsed_optimizer_gib",
          "rehearsed_weights_gib", "rehearsed_gradients_gib", "rehearsed_optimizer_states_gib",
          "rehearsed_activations_gib", "estimated_total_gib", "estimated_generation_gib", "estimated_training_gib",
          "ratio_estimated_over_rehearsed", "ratio_generation", "ratio_training", "status", "error",
          "sized_gib", "sized_fraction_of_card", "wall_s", "cpu_s", "loadavg_1m", "torch", "transformers", "trl", "peft", "bitsandbytes"]


def configurations(which: str = "all") -> list[tuple[str, str, object]]:
    """Return ``[(kind, name, preset), ...]``: the GPU presets, the grid and Unsloth's setting."""
    rows = []
    if which in ("all", "presets"):
        rows += [("preset", p.name, p) for p in PRESETS.values() if p.card_gib is not None]
    if which in ("all", "grid"):
        for model in GRID_MODELS:
            for method in ("full", "lora", "qlora"):
                for precision in ("bf16", "fp16"):
                    short = model.split("/")[-1].removesuffix("-Instruct")
                    name = f"grid-{short}-{method}-{precision}"
                    # the published laptop recipe (Preset's defaults: batch 1 x 4, G = 4, 256 + 786 tokens,
                    # 8-bit AdamW, checkpointing); an fp16 row plans for a T4, a bf16 row for a 16 GB Ampere card
                    card = "t4" if precision == "fp16" else "rtx3080-laptop-16gb"
                    rows.append(("grid", name, Preset(name=name, model=model, method=method, precision=precision,
                                                      card=card)))
    if which in ("all", "unsloth"):
        rows.append(("unsloth", "unsloth-headline", Preset(name="unsloth-headline", **UNSLOTH)))
    if which in ("all", "sizing"):  # one step past each sized preset: the evidence that it is the largest that fits
        for name in SIZED:
            p = PRESETS[name]
            step = p.config["per_device_train_batch_size"] + p.config["num_generations"]
            rows.append(("sizing", f"{name}-batch{step}", p.replace(per_device_train_batch_size=step)))
    return rows


def _sizing(row: dict) -> dict:
    """The allowance columns: rehearsed peak x 1.1 + 1 GiB (labkit.device.sized_gib) and its share of the card."""
    sized = sized_gib(float(row["rehearsed_peak_gib"]))
    return dict(sized_gib=round(sized, 3), sized_fraction_of_card=round(sized / float(row["card_gib"]), 3))


def rehearse_row(kind: str, name: str, preset) -> dict:
    """Rehearse one configuration and return its CSV row (status "error" with the message when it fails)."""
    from labkit.lab import package_versions
    from labkit.oom import estimate
    from labkit.presets import card_device, resolve_plan
    from bench.rehearse import LABEL, rehearse

    versions = package_versions()
    plan = resolve_plan(preset, card_device(preset))
    g = dict(plan.config, generation_batch_size=plan.preset.generation_batch_size, max_prompt_length=preset.max_prompt_length)
    row = dict(kind=kind, name=name, figure=LABEL, model=plan.model, method=plan.method, precision=plan.precision,
               card=plan.card.name, card_gib=plan.card.total_memory_gib,
               **{k: g[k] for k in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                    "generation_batch_size", "num_generations", "max_prompt_length",
                                    "max_completion_length", "optim", "activation_checkpointing")},
               **{k: versions.get(k) for k in ("torch", "transformers", "trl", "peft", "bitsandbytes")})
    started, cpu = time.perf_counter(), time.process_time()
    try:
        result = rehearse(plan)
        est = estimate(plan)
    except Exception as exc:  # recorded, not hidden: the row says what failed
        row.update(status="error", error=f"{type(exc).__name__}: {exc}"[:300])
        traceback.print_exc()
        return row
    phases = result.phases
    training = max(phases[p]["peak"] for p in ("training", "optimizer"))
    at_peak = max(phases.values(), key=lambda p: p["peak"])["breakdown"]
    row.update(
        trainable_params=result.settings["trainable_params"],
        rehearsed_peak_gib=round(result.peak_gib, 4),
        rehearsed_generation_gib=round(phases["generation"]["peak"] / GIB, 4),
        rehearsed_training_gib=round(phases["training"]["peak"] / GIB, 4),
        rehearsed_optimizer_gib=round(phases["optimizer"]["peak"] / GIB, 4),
        rehearsed_weights_gib=round(at_peak.get("weights", 0) / GIB, 4),
        rehearsed_gradients_gib=round(at_peak.get("gradients", 0) / GIB, 4),
        rehearsed_optimizer_states_gib=round(at_peak.get("optimizer", 0) / GIB, 4),
        rehearsed_activations_gib=round(sum(v for k, v in at_peak.items()
                                            if k not in ("weights", "gradients", "optimizer")) / GIB, 4),
        estimated_total_gib=round(est.total, 4),
        estimated_generation_gib=round(est.bytes["generation_phase"] / GIB, 4),
        estimated_training_gib=round(est.bytes["training_phase"] / GIB, 4),
        ratio_estimated_over_rehearsed=round(est.bytes["total"] / result.peak, 4),
        ratio_generation=round(est.bytes["generation_phase"] / phases["generation"]["peak"], 4),
        ratio_training=round(est.bytes["training_phase"] / training, 4),
        status="ok", error="",
        wall_s=round(time.perf_counter() - started, 1), cpu_s=round(time.process_time() - cpu, 1),
        loadavg_1m=round(os.getloadavg()[0], 2),
    )
    row.update(_sizing(row))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench rehearsal", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="all", choices=("all", "presets", "grid", "unsloth", "sizing"))
    parser.add_argument("--name", nargs="*", help="only these row names")
    parser.add_argument("--out", default=None, help="CSV to write (default results/rehearsal.csv, replaced)")
    parser.add_argument("--reestimate", action="store_true",
                        help="recompute only the estimate columns of an existing CSV (after an estimator fix)")
    args = parser.parse_args(argv)
    if args.reestimate:
        return _reestimate(args.out or str(results_dir() / "rehearsal.csv"))
    rows_in = [r for r in configurations(args.only) if not args.name or r[1] in args.name]
    prov = provenance()
    out = args.out or str(results_dir() / "rehearsal.csv")
    if os.path.exists(out) and not args.name and args.only == "all":
        os.remove(out)  # a full run replaces the table
    elif os.path.exists(out):  # rows rehearsed again replace their old rows
        _drop_rows(out, {name for _, name, _ in rows_in})
    failed = 0
    for kind, name, preset in rows_in:
        row = rehearse_row(kind, name, preset)
        row.update(date=prov["date"], device=prov["device"])
        append_csv(out, [{k: row.get(k, "") for k in FIELDS}])
        failed += row["status"] != "ok"
        print(f"{name:<32} {row['status']:<6} rehearsed {row.get('rehearsed_peak_gib', '-')} GiB, estimated "
              f"{row.get('estimated_total_gib', '-')} GiB, ratio {row.get('ratio_estimated_over_rehearsed', '-')} "
              f"({row.get('wall_s', '-')} s)", flush=True)
    print(f"wrote {out}: {len(rows_in)} rows ({failed} failed); every peak is rehearsed (fake tensors), not measured")
    return 1 if failed else 0


def _reestimate(path: str) -> int:
    """Rewrite the estimate and ratio columns of ``path`` from :func:`labkit.oom.estimate`; rehearsed ones stay."""
    import csv

    from labkit.presets import resolve_plan
    from labkit.oom import estimate

    presets = {name: preset for _, name, preset in configurations("all")}
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        if row["status"] != "ok" or row["name"] not in presets:
            continue
        preset = presets[row["name"]]
        from labkit.presets import card_device

        est = estimate(resolve_plan(preset, card_device(preset)))
        peak, gen = float(row["rehearsed_peak_gib"]), float(row["rehearsed_generation_gib"])
        train = max(float(row["rehearsed_training_gib"]), float(row["rehearsed_optimizer_gib"]))
        row.update(estimated_total_gib=round(est.total, 4),
                   estimated_generation_gib=round(est.bytes["generation_phase"] / GIB, 4),
                   estimated_training_gib=round(est.bytes["training_phase"] / GIB, 4),
                   ratio_estimated_over_rehearsed=round(est.total / peak, 4),
                   ratio_generation=round(est.bytes["generation_phase"] / GIB / gen, 4),
                   ratio_training=round(est.bytes["training_phase"] / GIB / train, 4), **_sizing(row))
        print(f"{row['name']:<32} estimated {row['estimated_total_gib']} GiB, rehearsed {peak} GiB, "
              f"ratio {row['ratio_estimated_over_rehearsed']}")
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows({k: row.get(k, "") for k in FIELDS} for row in rows)
    return 0


def _drop_rows(path: str, names: set) -> None:
    import csv

    with open(path) as fh:
        rows = [row for row in csv.DictReader(fh) if row["name"] not in names]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
