"""``python -m bench gpu``: the GPU half of the lab, measured on a real CUDA card.

One command records, in ``results/gpu/`` (``measurements.csv`` and ``measurements.json``, a row each as
it ends), what the estimator (:func:`labkit.preflight.estimate`) and the rehearsal (:mod:`bench.rehearse`)
only predict:

- **presets**: each GPU preset for 2 real optimiser steps through :func:`labkit.run.build_run` (the
  road ``labkit train`` takes), its architecture with random weights (memory depends on shapes, not
  values), every completion forced to ``max_completion_length``, PyTorch capped at the preset's card
  less the CUDA context the cap does not see. Per phase (generation, scoring, the loss's forward and
  backward passes, the optimiser step): seconds, ``max_memory_allocated``, ``max_memory_reserved``;
  fits or OOM, beside the estimate and the rehearsal of the same plan. The ``laptop-16gb`` row also
  keeps its live dashboard (picture and memory timeline per phase).
- **qlora**: ``qlora-3b`` with ``prepare_model_for_kbit_training=True`` (labkit's loader runs PEFT's fp32 upcast
  of every weight that is not 4-bit) beside its preset row (TRL loads and quantises the model, as notebook 04's
  plain-TRL cell does; TRL 1.16 never calls ``prepare_model_for_kbit_training``): what the upcast costs.
- **doctor**: the OOM doctor on real OOMs: a base recipe uncapped, then capped between the peak of the phases
  before a target phase and its own (generation, backward, optimiser step), then with the report's first change
  under the same cap (:data:`DOCTOR_BASES`, :func:`doctor_cap`, :func:`doctor_verdict`).
- **grid**: Qwen2.5-0.5B / 1.5B / 3B x full / LoRA / QLoRA with short completions, uncapped, each
  beside the estimate.
- **speed**: completion tokens a second of TRL's ``generate`` and of transformers' continuous batching
  (``use_transformers_continuous_batching=True``) at the ``workshop`` and ``laptop-16gb`` settings.

Each measurement runs in a fresh process (:mod:`bench.worker`): a peak means something only in
a process that measured nothing before, and a crash or a kill loses one row, never the finished ones.
``--budget-s`` runs the most valuable parts first and skips what would not finish in time.
``--tiny`` runs the same code on a CPU with two-layer models (a test in the suite); ``--bundle DIR``
prepares an offline GPU machine (:mod:`bench.gpu_bundle`). docs/gpu.md says how.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.gpu_measure import COLUMNS, LABEL, PHASE_ORDER, PhasePeaks, bench_preset, measure, percent_error
from labkit.memory import GIB

__all__ = ["main", "measure", "PhasePeaks", "plan_jobs", "still_to_measure", "recorded_rows", "measured_rows", "doctor_cap",
           "doctor_spec", "doctor_verdict", "PRESET_ORDER", "GRID", "DOCTOR_BASES", "COLUMNS", "LABEL"]


# The presets a 16 GB card or a T4 is sized by; laptop-16gb first: its row also photographs the dashboard.
# tools-16gb (notebook 08) last: its rollouts with random weights write no tool call, so it measures the recipe's
# shapes (the tool schema in every prompt, completions forced to the budget that counts 3 tool rounds)
PRESET_ORDER = ("laptop-16gb", "laptop-16gb-published", "workshop", "colab-t4", "qlora-3b", "tools-16gb")
GRID = [(model, method, "bf16") for model in ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct",
                                               "Qwen/Qwen2.5-3B-Instruct") for method in ("lora", "qlora", "full")]
GRID += [("Qwen/Qwen2.5-0.5B-Instruct", method, "fp16") for method in ("lora", "qlora", "full")]
# The grid's short recipe: 8 completions of 128 tokens per generation, 2 micro-batches of 4.
GRID_SETTINGS = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4,
                     max_prompt_length=128, max_completion_length=128)
# The CPU rehearsal of this command (--tiny): the same code, two layers, a small width and short sequences.
TINY_SETTINGS = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_generations=2,
                     max_prompt_length=32, max_completion_length=8)
# Most valuable first: the presets (and the dashboard), then QLoRA both ways (one row that says which loader a
# 16 GB card should trust), the estimator grid, the generation speeds.
PARTS = ("presets", "qlora", "doctor", "grid", "speed")
PENDING = {"unsloth": "needs Unsloth's own environment (python -m bench unsloth)"}
# Seconds a row took on an H100 (results/gpu, 2026-11-26: wall_s plus ~15 s of process start), for --budget-s;
# a row not timed yet gets its part's guess. Generation dominates: TRL's generate at ~80 ms a decoding step.
EXPECTED_S = {"laptop-16gb": 170, "laptop-16gb-published": 145, "workshop": 60, "qlora-3b": 225, "tools-16gb": 180,
              "grid-Qwen2.5-0.5B-lora-bf16": 45}
PART_EXPECTED_S = {"presets": 170, "grid": 60, "qlora": 225, "doctor": 90, "speed": 150}
# The OOM doctor on real OOMs. For each phase: a base recipe measured uncapped, the same capped between the peak of
# the phases before it and its own peak (so it runs out of memory there: the doctor's report from the real
# torch.OutOfMemoryError), and the same with the report's first change under the same cap (does it fit now; did
# the phase's peak fall by what the estimator predicted?). Scoring has no recipe: in every measured row its peak
# is below generation's, so no cap can make a run fail there first.
DOCTOR_BASES = {"doctor-lora-base": ("laptop-16gb", {"max_completion_length": 256}),
                "doctor-full-base": ("workshop", {"method": "full", "optim": "adamw_torch",
                                                   "max_completion_length": 64})}
DOCTOR_TARGETS = (("generation", "doctor-lora-base"), ("backward", "doctor-lora-base"),
                  ("optimizer", "doctor-full-base"))
CAP_POSITION = 0.6  # the cap sits 60 % of the way from the earlier phases' peak to the target phase's



# --------------------------------------------------------------------------- the plan and the command


def plan_jobs(parts=PARTS, *, tiny: bool = False, presets=PRESET_ORDER, steps: int = 2,
              results: Path | None = None) -> list[dict]:
    """Return the measurements to make, in the order of :data:`PARTS` (most valuable first; the dashboard rides
    on the laptop-16gb preset row). Each is a spec for :func:`measure`."""
    shrink = TINY_SETTINGS if tiny else {}
    jobs = []
    if "presets" in parts:
        for name in presets:
            jobs.append(dict(part="presets", name=name, preset=name, overrides=dict(shrink), steps=steps, cap="card",
                             dashboard=str(results) if name == "laptop-16gb" and results else None))
    if "grid" in parts:
        for model, method, precision in GRID[:2] if tiny else GRID:
            short = model.split("/")[-1].removesuffix("-Instruct")
            jobs.append(dict(part="grid", name=f"grid-{short}-{method}-{precision}", preset="laptop-16gb",
                             overrides=dict(GRID_SETTINGS, **shrink, model=model, method=method), precision=precision
                             if not tiny else None, steps=2, cap=None))
    if "qlora" in parts:  # qlora-3b's preset row is TRL's loader; this one adds PEFT's fp32 upcast
        jobs.append(dict(part="qlora", name="qlora-3b-prepare-kbit", preset="qlora-3b", steps=steps, cap="card",
                         overrides=dict(shrink, prepare_model_for_kbit_training=True)))
    if "doctor" in parts:
        for base, (name, overrides) in DOCTOR_BASES.items():
            jobs.append(dict(part="doctor", name=base, preset=name, overrides={**overrides, **shrink}, steps=2,
                             cap=None, doctor={"stage": "base"}))
        for target, base in DOCTOR_TARGETS:
            name, overrides = DOCTOR_BASES[base]
            for stage in ("oom", "fix"):
                jobs.append(dict(part="doctor", name=f"doctor-{target}-{stage}", preset=name, steps=2,
                                 overrides={**overrides, **shrink}, doctor={"stage": stage, "target": target,
                                                                            "base": base}))
    if "speed" in parts:
        for name in ("workshop", "laptop-16gb"):
            for batching in (False, True):
                jobs.append(dict(part="speed", name=f"speed-{name}-{'continuous' if batching else 'generate'}",
                                 preset=name, overrides=dict(shrink), steps=1, cap=None,
                                 generation="continuous batching" if batching else "generate",
                                 config={"use_transformers_continuous_batching": True} if batching else {}))
    for job in jobs:
        job["tiny"] = tiny
    return sorted(jobs, key=lambda job: PARTS.index(job["part"]))  # stable: each part keeps its own order


def _rehearsed() -> dict:
    """Return the rehearsal's preset rows (``python -m bench rehearsal`` wrote them), by preset name."""
    path = Path(__file__).resolve().parents[1] / "results" / "rehearsal.csv"  # the repository's, wherever rows go
    if not path.exists():
        return {}
    with path.open() as fh:
        return {r["name"]: r for r in csv.DictReader(fh) if r["kind"] == "preset"}


def doctor_cap(base_row: dict, target: str) -> float | None:
    """Return the cap (GiB) that makes the base recipe run out of memory in ``target`` first, or None if none can:
    above the peak of every phase before it (setup, then a step's phases in order), below its own."""
    peaks = base_row.get("phase_peaks_gib") or {}
    order = ("setup", *PHASE_ORDER)
    earlier = [peaks[p] for p in order[:order.index(target)] if p in peaks]
    if target not in peaks or not earlier or peaks[target] <= max(earlier):
        return None
    return round(max(earlier) + CAP_POSITION * (peaks[target] - max(earlier)), 3)


def doctor_spec(job: dict, rows: dict) -> dict | str:
    """Return the doctor job with its cap (and, for the fix, the report's first change), or why it cannot run."""
    stage, target = job["doctor"]["stage"], job["doctor"].get("target")
    if stage == "base":
        return job
    base = rows.get(job["doctor"]["base"])
    if base is None or base.get("status") != "ok" or not base.get("phase_peaks_gib"):
        return f"its base row {job['doctor']['base']} was not measured on a GPU"
    cap = doctor_cap(base, target)
    if cap is None:
        return f"no cap makes {job['doctor']['base']} fail in {target} first: its peak there is below an earlier phase's"
    if stage == "oom":
        return dict(job, cap=cap)
    oom = rows.get(f"doctor-{target}-oom")
    if oom is None or oom.get("oom_phase") != target:
        return f"doctor-{target}-oom did not run out of memory in {target} (it was {oom and oom.get('oom_phase')})"
    if not oom.get("first_change"):
        return f"the doctor offered no change for {target}"
    return dict(job, cap=cap, change=oom["first_change"])


def doctor_verdict(row: dict, rows: dict) -> dict:
    """Return the fix row's verdict: did the first change fit, and how far the target phase's peak fell, measured
    (the base row, uncapped, against this row) and predicted (the estimator's phase memory, as the doctor reads it)."""
    from labkit.phase_memory import phase_memory

    target = row["doctor"]["target"]
    base = rows[row["doctor"]["base"]]
    before, after = (phase_memory(r.get("settings") or {}, target) for r in (base, row))
    measured = (base.get(f"{target}_allocated_gib") or 0) - (row.get(f"{target}_allocated_gib") or 0)
    predicted = None if before is None or after is None else round((before - after) / GIB, 3)
    return dict(fits_after_first_change=row["status"] == "ok", measured_fall_gib=round(measured, 3),
                predicted_fall_gib=predicted, predicted_from=f"labkit.phase_memory.phase_memory(settings, {target!r})")


def recorded_rows(results: Path) -> list[dict]:
    """Return every row in ``results/measurements.json``, oldest first (none when the file does not exist)."""
    path = Path(results) / "measurements.json"
    return json.loads(path.read_text()) if path.exists() else []


def measured_rows(results: Path) -> dict:
    """Return the rows on a CUDA device already in ``results/measurements.json`` (ok or OOM: both are findings),
    by name, for the settings they were measured with: a preset changed since then is measured again."""
    return {r["name"]: r for r in recorded_rows(results) if r.get("status") in ("ok", "oom") and r.get("cuda")}


def row_settings(row: dict) -> dict:
    """Return the preset settings a recorded row was measured with, in today's fields.

    Fields added to :class:`labkit.presets.Preset` since keep their defaults, except
    ``prepare_model_for_kbit_training``: before it existed, labkit's QLoRA loader (``loader`` "labkit")
    always ran PEFT's upcast, so those rows measured ``prepare_model_for_kbit_training=True``.
    """
    from labkit.presets import Preset

    settings = dict(row.get("settings") or {})
    if not settings:
        return settings
    if "prepare_model_for_kbit_training" not in settings:
        settings["prepare_model_for_kbit_training"] = row.get("loader") == "labkit"
    return Preset.from_dict(settings).to_dict()


def still_to_measure(jobs: list[dict], results: Path) -> list[dict]:
    """Return the ``jobs`` that ``results`` has no CUDA row for, at the preset's settings as they are now."""
    done = measured_rows(results)
    recorded = {r["name"]: r for r in recorded_rows(results)}
    todo = []
    for job in jobs:
        if job.get("doctor") and job["doctor"]["stage"] != "base":  # its cap and change come from other rows
            if recorded.get(job["name"], {}).get("status") not in ("ok", "oom", "not isolated"):
                todo.append(job)
            continue
        row = done.get(job["name"])
        if row is None or row_settings(row) != bench_preset(job).replace(precision=row["precision"]).to_dict():
            todo.append(job)
        elif job.get("dashboard") and not (Path(results) / f"dashboard_{job['name']}.png").exists():
            todo.append(dict(job, picture_only=True))  # not whole without its picture: after its part's new rows
    return sorted(todo, key=lambda job: (PARTS.index(job["part"]), bool(job.get("picture_only"))))


def _write(results: Path, rows: list[dict]) -> None:
    """Write every row: the CSV's columns and the full records (the OOM report, the settings) as JSON."""
    from bench import append_csv

    json_path = results / "measurements.json"
    tmp = json_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(recorded_rows(results) + rows, indent=1) + "\n")
    os.replace(tmp, json_path)  # a kill leaves the old file or the new one, never half of one
    append_csv(results / "measurements.csv", [{k: r.get(k) for k in COLUMNS} for r in rows])


def _show(row: dict) -> str:
    if row["status"] in ("error", "cut", "not isolated"):
        return f"{row['name']:<34} {row['status']}: {row.get('error')}"
    peak = row.get("peak_allocated_gib")
    mem = (f"peak {peak:.2f} GiB allocated, {row['peak_reserved_gib']:.2f} reserved"
           + (f" (+{row['context_gib']:.2f} context) of {row['cap_gib'] + row['context_gib']:.2f}"
              if row.get("cap_gib") else "")
           + f"; estimate {row['estimated_total_gib']:.2f} ({row['estimate_error_pct']:+.1f} %)"
           if peak is not None else "no CUDA memory (CPU)")
    speed = f", {row['generation_tokens_per_s']:.0f} completion tok/s" if row.get("generation_tokens_per_s") else ""
    return f"{row['name']:<34} {row['status']}{' in ' + str(row['oom_phase']) if row.get('oom_phase') else ''}: " \
           f"{mem}{speed}, {row['wall_s']} s"


def main(argv: list[str] | None = None) -> int:
    """``python -m bench gpu [--budget-s N] [--parts ...] [--tiny] [--bundle DIR]``: see the module docstring.

    Exit code 0 when every planned row ran (fit or not: an OOM is a finding), 1 when a row broke or was
    skipped, 2 on bad input (no CUDA device without --tiny, an unknown part).
    """
    from bench import worker
    from labkit.presets import card_device

    parser = argparse.ArgumentParser(prog="python -m bench gpu", description=main.__doc__)
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS, help="what to measure, in order")
    parser.add_argument("--presets", nargs="+", default=list(PRESET_ORDER), choices=PRESET_ORDER)
    parser.add_argument("--steps", type=int, default=2, help="optimiser steps per preset (>= 2: states exist)")
    parser.add_argument("--budget-s", type=float, default=None, help="stop starting rows after this many seconds")
    parser.add_argument("--results", default=None, help="folder (default results/gpu; --tiny: a temporary one)")
    parser.add_argument("--tiny", action="store_true", help="the same code on a CPU with two-layer models")
    parser.add_argument("--bundle", default=None, help="prepare an offline GPU machine's wheels in this folder")
    parser.add_argument("--redo", action="store_true",
                        help="measure every row again (default: only rows the results lack at today's settings)")
    args = parser.parse_args(argv)
    if args.bundle:
        from bench.gpu_bundle import install_command, make_bundle

        make_bundle(args.bundle)
        print(install_command(args.bundle))
        return 0
    if args.steps < 2 and "presets" in args.parts:
        print("error: --steps must be at least 2: AdamW creates its states in the first step", file=sys.stderr)
        return 2
    probe = worker.run("probe", {"device": "cpu" if args.tiny else None}, timeout=300)
    if probe.get("status") != "ok":
        print(f"error: could not inspect the device: {probe.get('error')}", file=sys.stderr)
        return 2
    if probe["device"]["kind"] != "cuda" and not args.tiny:
        print(f"error: no CUDA device here ({probe['device']['name']}): bench gpu measures a GPU. "
              "Run --tiny for the CPU rehearsal of the command, or --bundle DIR for an offline GPU machine.",
              file=sys.stderr)
        return 2
    results = Path(args.results or (tempfile.mkdtemp(prefix="labkit-gpu-tiny-") if args.tiny else "results/gpu"))
    if args.tiny and measured_rows(results):
        print(f"error: {results} holds rows measured on a GPU; --tiny (a CPU rehearsal of the command) never writes "
              "beside them. Leave --results out (a temporary folder) or name an empty one.", file=sys.stderr)
        return 2
    results.mkdir(parents=True, exist_ok=True)
    rehearsed = _rehearsed()
    jobs = plan_jobs(args.parts, tiny=args.tiny, presets=args.presets, steps=args.steps, results=results)
    if not args.redo:
        kept = len(jobs)
        jobs = still_to_measure(jobs, results)
        if kept > len(jobs):
            print(f"{kept - len(jobs)} rows already measured at today's settings (--redo measures them again)")
    deadline = time.monotonic() + args.budget_s if args.budget_s else math.inf
    done, skipped, broken = [], [], 0
    print(f"bench gpu: {len(jobs)} rows -> {results}", flush=True)
    device_gib = probe["device"].get("total_memory_gib") or math.inf
    for job in jobs:
        card = card_device(job["preset"]) if job.get("cap") == "card" and not args.tiny else None
        if card is not None and card.total_memory_gib > device_gib:  # a cap larger than the card is refused
            print(f"{job['name']:<34} refused: its card has {card.total_memory_gib:g} GiB, more than this device's "
                  f"{device_gib:.2f} GiB; measure it on a card at least that large", flush=True)
            skipped.append(job["name"])
            continue
        left = deadline - time.monotonic()
        if left < EXPECTED_S.get(job["name"], PART_EXPECTED_S[job["part"]]) and not args.tiny:
            skipped.append(job["name"])
            continue
        recorded, planned = {}, job
        if job.get("doctor"):  # the doctor's caps and changes come from the rows measured before
            recorded = {r["name"]: r for r in recorded_rows(results)}
            planned = doctor_spec(job, recorded)
        if isinstance(planned, str):  # a finding too: written as a row of its own
            row = dict(part="doctor", name=job["name"], status="not isolated", error=planned, wall_s=0,
                       doctor=job["doctor"])
        else:
            job = planned
            try:
                row = worker.run("gpu", job, timeout=min(left, 900))
            except subprocess.TimeoutExpired:
                row = dict(part=job["part"], name=job["name"], status="cut", wall_s=round(min(left, 900)),
                           error=f"stopped at the budget after {min(left, 900):.0f} s")
            if "name" not in row:  # the worker died or ran out of time: say so in a row of its own
                row = dict(part=job["part"], name=job["name"], status="error", error=row.get("error", "")[:400],
                           wall_s=None)
            if job.get("doctor"):
                row["doctor"] = job["doctor"]
                if job["doctor"]["stage"] == "fix" and row["status"] in ("ok", "oom"):
                    row.update(doctor_verdict(row, recorded))
        reh = rehearsed.get(job["name"]) if job["part"] == "presets" else None
        if reh and row.get("peak_allocated_gib"):
            row["rehearsed_peak_gib"] = float(reh["rehearsed_peak_gib"])
            row["rehearsal_error_pct"] = percent_error(row["rehearsed_peak_gib"], row["peak_allocated_gib"])
        broken += row["status"] in ("error", "cut")
        _write(results, [row])
        done.append(row)
        print(_show(row), flush=True)
    # What results/ holds now and what a GPU session should measure next (a --tiny run measures no memory).
    pending = [] if args.tiny else [j["name"] for j in still_to_measure(plan_jobs(PARTS, results=results), results)]
    status = {"measured": [r["name"] for r in done] if args.tiny else sorted(measured_rows(results)),
              "pending": pending, "not built yet": PENDING, "skipped_for_budget": skipped,
              "this_run": [r["name"] for r in done]}
    (results / "status.json").write_text(json.dumps(status, indent=1) + "\n")
    if skipped:
        print(f"skipped (budget): {', '.join(skipped)}")
    print(f"wrote {results / 'measurements.csv'} and measurements.json ({len(done)} rows)")
    return 1 if broken or skipped else 0
