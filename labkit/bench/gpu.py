"""``python -m labkit bench gpu``: the GPU half of the lab, measured on a real CUDA card.

One command records, in ``results/gpu/`` (``measurements.csv`` and ``measurements.json``, a row each as
it ends), what the estimator (:func:`labkit.preflight.estimate`) and the rehearsal (:mod:`labkit.rehearsal`)
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

Each measurement runs in a fresh process (:mod:`labkit.bench.worker`): a peak means something only in
a process that measured nothing before, and a crash or a kill loses one row, never the finished ones.
``--budget-s`` runs the most valuable parts first and skips what would not finish in time.
``--tiny`` runs the same code on a CPU with two-layer models (a test in the suite); ``--bundle DIR``
prepares an offline GPU machine (:mod:`labkit.bench.gpu_bundle`). docs/gpu.md says how.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from labkit.memory import GIB
from labkit.oom import PhaseTracker

__all__ = ["main", "measure", "PhasePeaks", "plan_jobs", "still_to_measure", "recorded_rows", "measured_rows", "doctor_cap",
           "doctor_spec", "doctor_verdict", "PRESET_ORDER", "GRID", "DOCTOR_BASES", "COLUMNS", "LABEL"]

LABEL = "measured on {device}, random weights, every completion at max_completion_length"
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
TINY_SHAPE = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=512)
TINY_SETTINGS = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_generations=2,
                     max_prompt_length=32, max_completion_length=8)
# Most valuable first: the presets (and the dashboard), then QLoRA both ways (one row that says which loader a
# 16 GB card should trust), the estimator grid, the generation speeds.
PARTS = ("presets", "qlora", "doctor", "grid", "speed")
PENDING = {"unsloth": "needs Unsloth's own environment (python -m labkit bench unsloth)"}
# Seconds a row took on an H100 (results/gpu, 2026-11-26: wall_s plus ~15 s of process start), for --budget-s;
# a row not timed yet gets its part's guess. Generation dominates: TRL's generate at ~80 ms a decoding step.
EXPECTED_S = {"laptop-16gb": 170, "laptop-16gb-published": 145, "workshop": 60, "qlora-3b": 225, "tools-16gb": 180,
              "grid-Qwen2.5-0.5B-lora-bf16": 45}
PART_EXPECTED_S = {"presets": 170, "grid": 60, "qlora": 225, "doctor": 90, "speed": 150}
PHASE_ORDER = ("generation", "scoring", "forward", "backward", "optimizer")
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
COLUMNS = [
    "date", "part", "name", "label", "status", "model", "method", "precision", "card", "cap_gib", "context_gib",
    "per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size", "num_generations",
    "max_prompt_length", "max_completion_length", "optim", "gradient_checkpointing", "generation", "loader", "weights_4bit", "embedding_dtype",
    "steps_done", "completion_mean_length",
    "peak_allocated_gib", "peak_reserved_gib", "peak_with_context_gib", "fits", "fraction_of_card", "oom_phase",
    *[f"{p}_{k}" for p in PHASE_ORDER for k in ("s", "allocated_gib", "reserved_gib")],
    "training_allocated_gib", "generation_tokens_per_s",
    "estimated_total_gib", "estimated_generation_gib", "estimated_training_gib", "estimate_error_pct",
    "estimate_generation_error_pct", "estimate_training_error_pct",
    "rehearsed_peak_gib", "rehearsal_error_pct", "first_change", "fits_after_first_change", "measured_fall_gib",
    "predicted_fall_gib", "wall_s",
    "device", "driver", "cuda", "torch", "transformers", "trl", "peft", "bitsandbytes", "error",
]


# --------------------------------------------------------------------------- one measurement (worker side)


class PhasePeaks(PhaseTracker):
    """Peak CUDA memory and seconds of each phase of a TRL GRPO step, phase by phase.

    The OOM doctor's :class:`labkit.oom.PhaseTracker` (``_generate`` -> generation, its return ->
    scoring, ``compute_loss`` -> forward, its return -> backward, the optimiser callbacks -> optimizer),
    with one addition: at each change of phase it reads ``max_memory_allocated`` and
    ``max_memory_reserved`` for the phase that ends and resets them, so each phase's figure is its own
    peak. A running :class:`labkit.monitor.VRAMMonitor` (the dashboard's) gets the same phase marks.
    """

    def __init__(self, cuda: bool, monitor=None):
        self.cuda, self.monitor = cuda, monitor
        self.peaks: dict[str, dict] = {}
        self._phase, self._since, self._mark = "setup", time.perf_counter(), None
        super().__init__()

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, name: str) -> None:
        """End the current phase (its peaks and seconds are kept) and start ``name``."""
        if name == self._phase:
            return
        self.close()
        self._phase, self._since = name, time.perf_counter()
        if self.monitor is not None and name in PHASE_ORDER:
            self._mark = self.monitor.phase(name if name != "optimizer" else "optimizer step")
            self._mark.__enter__()

    def close(self) -> None:
        """Keep the current phase's seconds and peaks (and reset CUDA's peak counters)."""
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        if self._mark is not None:
            self._mark.__exit__(None, None, None)
            self._mark = None
        row = self.peaks.setdefault(self._phase, {"s": 0.0, "allocated": 0, "reserved": 0, "count": 0})
        row["s"] += time.perf_counter() - self._since
        row["count"] += 1
        if self.cuda:
            row["allocated"] = max(row["allocated"], torch.cuda.max_memory_allocated())
            row["reserved"] = max(row["reserved"], torch.cuda.max_memory_reserved())
            torch.cuda.reset_peak_memory_stats()


def _driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # no NVML: a CPU, or a machine without the driver's library
        return None


def _bench_preset(spec: dict):
    """Return the preset a spec measures: a named preset with ``overrides`` (the grid's, the doctor's), then the
    OOM doctor's ``change`` (``Preset.apply``: GRPOConfig fields such as ``steps_per_generation`` too)."""
    from labkit.presets import get_preset

    return get_preset(spec["preset"], **spec.get("overrides", {})).apply(spec.get("change") or {})


def measure(spec: dict) -> dict:
    """Return one row of ``bench gpu``: GRPO steps of ``spec``'s preset through ``build_run``, phase by phase.

    Runs in a fresh process (``python -m labkit.bench.worker gpu SPEC``). ``spec``: ``preset`` (a name),
    ``overrides`` (preset fields), ``config`` (extra ``GRPOConfig`` values), ``steps``, ``cap`` ("card":
    the preset's card less the CUDA context; None: the whole device), ``precision`` (default: the preset
    card's), ``tiny`` (a two-layer model on the CPU), ``dashboard`` (a folder for its picture and record).
    """
    import torch

    from labkit.bench.preset import _fixed_length_prompts, _random_weights_model, card_cap_fraction
    from labkit.device import choose_precision, detect_device
    from labkit.lab import provenance
    from labkit.models import load_tokenizer
    from labkit.oom import TrainingOutOfMemory
    from labkit.plan import resolve_plan
    from labkit.preflight import estimate
    from labkit.presets import card_device
    from labkit.run import build_run
    from labkit.training import LogRecorder

    tiny = bool(spec.get("tiny"))
    cuda = torch.cuda.is_available() and not tiny
    device = detect_device("cuda" if cuda else "cpu")
    preset = _bench_preset(spec)
    card = card_device(spec["preset"])
    precision = spec.get("precision") or (preset.precision or choose_precision(card) if cuda and card else "fp32")
    preset = preset.replace(precision=precision)
    plan = resolve_plan(preset, card)  # what the estimate and the rehearsal plan for: the preset on its card
    row = dict(part=spec["part"], name=spec["name"], model=preset.model, method=preset.method, precision=precision,
               card=card.name if card else None, generation=spec.get("generation", "generate"),
               loader=_loader(preset),
               per_device_train_batch_size=plan.per_device_train_batch_size,
               gradient_accumulation_steps=plan.config["gradient_accumulation_steps"],
               generation_batch_size=plan.generation_batch_size, num_generations=plan.config["num_generations"],
               max_prompt_length=preset.max_prompt_length,
               **{k: plan.config[k] for k in ("max_completion_length", "optim")},
               gradient_checkpointing=preset.gradient_checkpointing)
    context = cap_gib = None
    if cuda:
        torch.empty(1, device="cuda")  # the context exists from here on
        free, total = torch.cuda.mem_get_info()
        context = (total - free - torch.cuda.memory_reserved()) / GIB  # the driver's and kernels', outside the cap
        if spec.get("cap") == "card" and card is not None:
            cap_gib = card.total_memory_gib - context  # what PyTorch can have of that card
        elif isinstance(spec.get("cap"), (int, float)):  # the OOM doctor's rows: a cap between two phases' peaks
            cap_gib = float(spec["cap"])
        if cap_gib is not None:
            torch.cuda.set_per_process_memory_fraction(card_cap_fraction(cap_gib, total))
    row.update(cap_gib=cap_gib, context_gib=context)

    est = estimate(plan)
    row.update(estimated_total_gib=est.total, estimated_generation_gib=est.generation_phase,
               estimated_training_gib=est.training_phase)
    folder = Path(tempfile.mkdtemp(prefix="labkit-gpu-"))
    recorder = LogRecorder(("num_tokens", "completions/mean_length"))
    monitor = dashboard = peaks = None
    started = time.perf_counter()
    try:
        path = _random_weights_model(preset, folder / "model", precision, device="cuda" if cuda else "cpu",
                                     **(TINY_SHAPE if tiny else {}))
        bench = preset.replace(model=path, max_steps=spec.get("steps", 2), save_steps=None)
        tokenizer = load_tokenizer(path)
        dataset = _fixed_length_prompts(tokenizer, max(8, math.ceil(bench.prompts_per_step) * bench.max_steps * 2),
                                        bench.max_prompt_length)
        callbacks = [recorder]
        if spec.get("dashboard"):
            from labkit.dashboard import LiveDashboard
            from labkit.monitor import VRAMMonitor

            monitor = VRAMMonitor(interval_s=0.05).start()
            dashboard = LiveDashboard(title=f"{spec['name']} on {device.name} (random weights)", frontend="none",
                                      total_steps=bench.max_steps, monitor=monitor, autoshow=False, tick_s=None,
                                      budget_gib=card.total_memory_gib if card and cuda else None)
            callbacks.append(dashboard)
        peaks = PhasePeaks(cuda, monitor)
        config = dict(spec.get("config", {}))
        run = build_run(bench, folder / "run", device=device, tokenizer=tokenizer, train_dataset=dataset,
                        callbacks=callbacks, print_logs=False,
                        generation_kwargs={"min_new_tokens": bench.max_completion_length}, **config)
        peaks.install(run.trainer)
        if preset.method == "qlora":  # what each loader left in full precision (PEFT's upcast, TRL's does not)
            model = run.trainer.model
            row.update(weights_4bit=any(type(m).__name__ == "Linear4bit" for m in model.modules()),
                       embedding_dtype=str(model.get_input_embeddings().weight.dtype).removeprefix("torch."))
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            peaks.peaks["setup"] = {"s": 0.0, "allocated": torch.cuda.memory_allocated(),
                                    "reserved": torch.cuda.memory_reserved(), "count": 1}
        peaks.phase = "between steps"
        row["oom_phase"], row["status"] = None, "ok"
        try:
            run.train(resume=False)
        except TrainingOutOfMemory as exc:
            row.update(status="oom", oom_phase=exc.report.phase, error=str(exc.report).splitlines()[0],
                       oom_report=exc.report.as_dict(),
                       first_change=exc.report.changes[0].updates if exc.report.changes else None)
        peaks.close()
    except Exception as exc:  # recorded in the row: one broken measurement never stops the others
        row.update(status="error", error=f"{type(exc).__name__}: {exc}"[:400])
    finally:
        if monitor is not None:
            monitor.stop()
        row["wall_s"] = round(time.perf_counter() - started, 1)
    if dashboard is not None and row["status"] != "error":
        dashboard.record.finish("finished" if row["status"] == "ok" else "out of memory")
        _restore_peak_series(dashboard.record, monitor)
        out = Path(spec["dashboard"])
        out.mkdir(parents=True, exist_ok=True)
        dashboard.save(out / f"dashboard_{spec['name']}.png")
        (out / f"dashboard_{spec['name']}.json").write_text(json.dumps(_dashboard_record(dashboard, monitor)) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    _phase_columns(row, peaks.peaks if peaks else {}, cuda)
    if cuda and peaks:
        row["phase_peaks_gib"] = {name: round(p["allocated"] / GIB, 3) for name, p in peaks.peaks.items()}
    lengths = [x for x in recorder.values["completions/mean_length"] if x == x]
    row["steps_done"] = len(recorder.values["step_time"])
    row["completion_mean_length"] = round(sum(lengths) / len(lengths), 1) if lengths else None
    gen_s = row.get("generation_s")
    if gen_s and lengths:
        count = peaks.peaks["generation"]["count"]
        row["generation_tokens_per_s"] = round(row["completion_mean_length"] * bench.generation_batch_size * count
                                               / gen_s, 1)
    row.update(_compare(row))
    info = provenance(device)
    row.update(date=info["date"], device=device.name, driver=_driver(), cuda=torch.version.cuda,
               label=LABEL.format(device=device.name) if cuda else "CPU rehearsal of the command (--tiny): no memory "
                                                                  "measured", settings=preset.to_dict(),
               **{k: info["versions"].get(k) for k in ("torch", "transformers", "trl", "peft", "bitsandbytes")})
    return row


def _phase_columns(row: dict, peaks: dict, cuda: bool) -> None:
    for phase in PHASE_ORDER:
        p = peaks.get(phase)
        row[f"{phase}_s"] = round(p["s"], 2) if p else None
        row[f"{phase}_allocated_gib"] = round(p["allocated"] / GIB, 3) if p and cuda else None
        row[f"{phase}_reserved_gib"] = round(p["reserved"] / GIB, 3) if p and cuda else None
    if cuda and peaks:
        row["peak_allocated_gib"] = round(max(p["allocated"] for p in peaks.values()) / GIB, 3)
        row["peak_reserved_gib"] = round(max(p["reserved"] for p in peaks.values()) / GIB, 3)
        training = [row[f"{p}_allocated_gib"] for p in ("scoring", "forward", "backward", "optimizer")
                    if row[f"{p}_allocated_gib"] is not None]
        row["training_allocated_gib"] = max(training) if training else None


def _pct(estimated, measured):
    return round(100 * (estimated - measured) / measured, 1) if estimated is not None and measured else None


def _compare(row: dict) -> dict:
    """Return the row's verdicts: fits (reserved + context within the memory it was given: the card, or the OOM
    doctor's cap plus the context), and the estimate's errors."""
    out = {}
    if row.get("peak_reserved_gib") is not None:
        with_context = row["peak_reserved_gib"] + (row.get("context_gib") or 0)
        out["peak_with_context_gib"] = round(with_context, 3)
        if row.get("cap_gib") is not None:  # a card's cap is that card less the context: the sum is the card
            given = row["cap_gib"] + (row.get("context_gib") or 0)
            out["fits"] = row["status"] == "ok" and with_context <= given + 1e-6
            out["fraction_of_card"] = round(with_context / given, 3)
        out["estimate_error_pct"] = _pct(row["estimated_total_gib"], row["peak_allocated_gib"])
        out["estimate_generation_error_pct"] = _pct(row["estimated_generation_gib"], row.get("generation_allocated_gib"))
        out["estimate_training_error_pct"] = _pct(row["estimated_training_gib"], row.get("training_allocated_gib"))
    for key in ("estimated_total_gib", "estimated_generation_gib", "estimated_training_gib"):
        out[key] = round(row[key], 3)
    return out


def _restore_peak_series(record, monitor) -> None:
    """Give the dashboard's "peak" line the run's peak so far at each step, from the phase marks' exact peaks.

    :class:`PhasePeaks` resets CUDA's peak counters at every phase, so the record read only the last phase's
    peak at each step's end (a learner's run, which resets nothing, reads the run's peak). The monitor counts
    steps from 0, TRL from 1.
    """
    steps, _ = record.history.get("memory/peak", ([], []))
    running, by_step = 0, {}
    for mark in monitor.phases:
        running = max(running, mark.peak_bytes)
        by_step[mark.step + 1] = running
    if steps and all(step in by_step for step in steps):
        record.history["memory/peak"] = (steps, [by_step[step] / GIB for step in steps])


def _dashboard_record(dashboard, monitor) -> dict:
    """Return what notebooks replay of a measured run: metrics per step, memory samples, phase marks."""
    from dataclasses import asdict

    record = dashboard.record
    return {"title": record.title, "budget_gib": record.budget_gib, "label": monitor.label,
            "history": {k: [list(s), list(v)] for k, (s, v) in record.history.items()},
            "timeline": monitor.timeline(), "phases": [asdict(m) for m in monitor.phases]}


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
    """Return the rehearsal's preset rows (``python -m labkit bench rehearsal`` wrote them), by preset name."""
    path = Path(__file__).resolve().parents[2] / "results" / "rehearsal.csv"  # the repository's, wherever rows go
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
    from labkit.oom import phase_memory

    target = row["doctor"]["target"]
    base = rows[row["doctor"]["base"]]
    before, after = (phase_memory(r.get("settings") or {}, target) for r in (base, row))
    measured = (base.get(f"{target}_allocated_gib") or 0) - (row.get(f"{target}_allocated_gib") or 0)
    predicted = None if before is None or after is None else round((before - after) / GIB, 3)
    return dict(fits_after_first_change=row["status"] == "ok", measured_fall_gib=round(measured, 3),
                predicted_fall_gib=predicted, predicted_from=f"labkit.oom.phase_memory(settings, {target!r})")


def recorded_rows(results: Path) -> list[dict]:
    """Return every row in ``results/measurements.json``, oldest first (none when the file does not exist)."""
    path = Path(results) / "measurements.json"
    return json.loads(path.read_text()) if path.exists() else []


def measured_rows(results: Path) -> dict:
    """Return the rows on a CUDA device already in ``results/measurements.json`` (ok or OOM: both are findings),
    by name, for the settings they were measured with: a preset changed since then is measured again."""
    return {r["name"]: r for r in recorded_rows(results) if r.get("status") in ("ok", "oom") and r.get("cuda")}


def _loader(preset) -> str | None:
    """Return who loaded a QLoRA row's model: ``"trl"`` (GRPOTrainer from the quantization_config, the default)
    or ``"labkit-prepare-kbit"`` (labkit's loader with PEFT's ``prepare_model_for_kbit_training``)."""
    if preset.method != "qlora":
        return None
    return "labkit-prepare-kbit" if preset.prepare_model_for_kbit_training else "trl"


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
        if row is None or row_settings(row) != _bench_preset(job).replace(precision=row["precision"]).to_dict():
            todo.append(job)
        elif job.get("dashboard") and not (Path(results) / f"dashboard_{job['name']}.png").exists():
            todo.append(dict(job, picture_only=True))  # not whole without its picture: after its part's new rows
    return sorted(todo, key=lambda job: (PARTS.index(job["part"]), bool(job.get("picture_only"))))


def _write(results: Path, rows: list[dict]) -> None:
    """Write every row: the CSV's columns and the full records (the OOM report, the settings) as JSON."""
    from labkit.bench import append_csv

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
    """``python -m labkit bench gpu [--budget-s N] [--parts ...] [--tiny] [--bundle DIR]``: see the module docstring.

    Exit code 0 when every planned row ran (fit or not: an OOM is a finding), 1 when a row broke or was
    skipped, 2 on bad input (no CUDA device without --tiny, an unknown part).
    """
    from labkit.bench import worker
    from labkit.presets import card_device

    parser = argparse.ArgumentParser(prog="python -m labkit bench gpu", description=main.__doc__)
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
        from labkit.bench.gpu_bundle import install_command, make_bundle

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
            row["rehearsal_error_pct"] = _pct(row["rehearsed_peak_gib"], row["peak_allocated_gib"])
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
