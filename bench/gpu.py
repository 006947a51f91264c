"""``python -m bench gpu``: the GPU half of the lab, measured on a real CUDA card, in one borrowed run.

One command records, in ``results/gpu/`` (``measurements.csv`` and ``measurements.json``, a row each as
it ends), what the estimator (:func:`labkit.oom.estimate`) and the rehearsal (:mod:`bench.rehearse`)
only predict:

- **presets**: each GPU preset for 2 real optimiser steps through :func:`labkit.run.build_run` (the
  road ``labkit train`` takes), its architecture with random weights (memory depends on shapes, not
  values), every completion forced to ``max_completion_length``, PyTorch capped at the preset's card
  less the CUDA context the cap does not see. Per phase (generation, scoring, the loss's forward and
  backward passes, the optimiser step): seconds, ``max_memory_allocated``, ``max_memory_reserved``;
  fits or OOM, beside the estimate and the rehearsal of the same plan. The ``laptop-16gb`` row also
  keeps its dashboard (the saved picture and the memory timeline per phase). ``tools-16gb``'s tool rounds are
  forced (:mod:`bench.forced_tools`: random weights never write a call).
- **qlora**: ``qlora-3b`` with ``prepare_model_for_kbit_training=True`` (labkit's loader runs PEFT's fp32 upcast
  of every weight that is not 4-bit) beside its preset row (TRL loads and quantises the model, as notebook 04's
  plain-TRL cell does; TRL 1.16 never calls ``prepare_model_for_kbit_training``): what the upcast costs.
- **doctor**: the OOM doctor on real OOMs: a base recipe uncapped, then capped between the peak of the phases
  before a target phase and its own (generation, backward, optimiser step), then with the report's first change
  under the same cap (:data:`DOCTOR_BASES`, :func:`bench.gpu_rows.doctor_cap`, :func:`bench.gpu_rows.doctor_verdict`).
- **grid**: Qwen2.5-0.5B / 1.5B / 3B x full / LoRA / QLoRA with short completions, each beside the estimate.
- **speed** (:mod:`bench.gpu_speed`): the ``laptop-16gb`` recipe's generation paths (``generate``,
  ``static-compiled``, ``continuous``: the preset's ``generation`` field), a full GRPO step each under its 15.7 GiB
  cap: tokens a second, ms per decode step, the share of the card's bandwidth limit, compile seconds; what PEFT's
  unmerged adapters cost; a batch sweep (8, 32, 96). ``vllm`` is pending (:data:`PENDING`).

Each row runs in a fresh process (:mod:`bench.worker`): a peak means something only in a process that measured
nothing before, and a crash or a kill loses that row only. The memory rows run side by side, several processes
at once, each under its own cap (:mod:`bench.gpu_plan` plans how many and in which order, and prints the plan
first); a row measured beside others says so (``side_by_side``) and reports no seconds. A check comes first: one
row alone, then again beside the others; if their allocated peaks differ by more than 1 %, the rest runs one at a
time. The speed rows always run alone, last. ``--budget-s`` starts only what its expected seconds let finish;
``--plan`` prints the plan on any machine; ``--tiny`` runs the same code on a CPU with two-layer models, two
processes at once (a test in the suite); ``--bundle DIR`` prepares an offline GPU machine
(:mod:`scripts.gpu_bundle`); ``--pictures`` renders the docs' pictures from the saved dashboard. docs/gpu.md says how.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from bench.gpu_measure import COLUMNS, LABEL, PHASE_ORDER, PhasePeaks, bench_preset, measure
from bench.gpu_rows import recorded_rows
from bench.gpu_run import Runner
from bench.gpu_speed import PENDING as SPEED_PENDING
from bench.gpu_speed import speed_jobs

__all__ = ["main", "measure", "PhasePeaks", "plan_jobs", "still_to_measure", "measured_rows", "check_job", "PRESET_ORDER", "GRID", "DOCTOR_BASES", "COLUMNS", "LABEL",
           "PARTS", "RESULT_FILES", "PENDING"]

REPO_RESULTS = Path(__file__).resolve().parents[1] / "results" / "gpu"
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
# A tiny tool row's budget: three forced rounds (a call of about 70 byte tokens, the tool turn about 25) fit in it.
TINY_TOOL_COMPLETION = 300
# Most valuable first: the presets (and the dashboard), then QLoRA both ways (one row that says which loader a
# 16 GB card should trust), the estimator grid, the generation speeds.
PARTS = ("presets", "qlora", "doctor", "grid", "speed")
PENDING = {"unsloth": "needs Unsloth's own environment and bundle (python -m bench unsloth --random-weights, docs/unsloth.md)",
           **SPEED_PENDING}
# What one run writes in its results folder, and all a maintainer copies back from the GPU machine.
RESULT_FILES = ("measurements.csv", "measurements.json", "status.json", "runs.log", "dashboard_laptop-16gb.json",
                "dashboard_laptop-16gb.png")
DEFAULT_PLAN_BUDGET_S = 540  # --plan without --budget-s: 10 minutes from the process's start, less the writes
DISK_SPARE_GB = 1.0  # left free on the disk beside the random-weight folders (the results, the logs)
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



# --------------------------------------------------------------------------- the plan and the command


def plan_jobs(parts=PARTS, *, tiny: bool = False, presets=PRESET_ORDER, steps: int = 2,
              results: Path | None = None) -> list[dict]:
    """Return the measurements to make, in the order of :data:`PARTS` (most valuable first; the dashboard rides
    on the laptop-16gb preset row). Each is a spec for :func:`measure`."""
    shrink = TINY_SETTINGS if tiny else {}
    jobs = []
    if "presets" in parts:
        for name in presets:
            tools = tiny and name == "tools-16gb"  # the forced rounds need room in the budget
            jobs.append(dict(part="presets", name=name, preset=name, steps=steps, cap="card",
                             overrides=dict(shrink, **({"max_completion_length": TINY_TOOL_COMPLETION} if tools else {})),
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
    if "speed" in parts:  # bench.gpu_speed: the generation paths, what PEFT costs, the batch sweep
        jobs += speed_jobs(shrink, tiny=tiny, steps=steps)
    for job in jobs:
        job["tiny"] = tiny
    return sorted(jobs, key=lambda job: PARTS.index(job["part"]))  # stable: each part keeps its own order


def measured_rows(results: Path) -> dict:
    """Return the rows on a CUDA device already in ``results/measurements.json`` (ok or OOM: both are findings),
    by name, for the settings they were measured with: a preset changed since then is measured again. A row measured
    side by side before the run's check found that side by side changed a peak does not count."""
    return {r["name"]: r for r in recorded_rows(results) if r.get("status") in ("ok", "oom") and r.get("cuda")
            and r.get("side_by_side_check") != "failed"}


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


def _recipe(settings: dict) -> dict:
    """Return preset settings less the description: a description is not the recipe."""
    return {k: v for k, v in settings.items() if k != "description"}


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
        if row is None or _recipe(row_settings(row)) != _recipe(bench_preset(job).replace(precision=row["precision"])
                                                                 .to_dict()):
            todo.append(job)
        elif job.get("dashboard") and not (Path(results) / f"dashboard_{job['name']}.png").exists():
            todo.append(dict(job, picture_only=True))  # not whole without its picture: after its part's new rows
    return sorted(todo, key=lambda job: (PARTS.index(job["part"]), bool(job.get("picture_only"))))


def check_job(tiny: bool = False) -> dict:
    """Return the spec of the side-by-side check's row (:data:`bench.gpu_plan.CHECK_ROW`, a grid row)."""
    from bench.gpu_plan import CHECK_ROW

    return next(job for job in plan_jobs(("grid",), tiny=tiny) if job["name"] == CHECK_ROW)


def _pictures(results: Path, docs: Path) -> int:
    """Render the docs' pictures of the measured laptop-16gb run from what the GPU run saved in ``results``."""
    from labkit.dashboard import memory_replay_png

    record_path, dashboard = results / "dashboard_laptop-16gb.json", results / "dashboard_laptop-16gb.png"
    if not record_path.exists():
        print(f"error: {record_path} does not exist: run python -m bench gpu on a GPU first", file=sys.stderr)
        return 2
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "gpu_memory_laptop-16gb.png").write_bytes(memory_replay_png(json.loads(record_path.read_text())))
    written = [docs / "gpu_memory_laptop-16gb.png"]
    if dashboard.exists():  # the dashboard's saved picture (labkit.dashboard.picture.png_bytes), drawn on the GPU machine
        (docs / "gpu_dashboard_laptop-16gb.png").write_bytes(dashboard.read_bytes())
        written.append(docs / "gpu_dashboard_laptop-16gb.png")
    print(f"wrote {', '.join(map(str, written))}: the memory replayed from {record_path.name} here (the live "
          "dashboard's browser view cannot be photographed on the GPU machine, which has no browser)")
    return 0


class _Log:
    """Print a line and keep it in the results folder's ``runs.log``."""

    def __init__(self):
        self.path: Path | None = None

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        if self.path is not None:
            with self.path.open("a") as fh:
                fh.write(text + "\n")


def _process_age_s() -> float:
    """Return the seconds since this process started (its imports included), or 0 where psutil cannot say."""
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:  # no psutil: the budget counts from here
        return 0.0


def _card_gib() -> float | None:
    """Return the memory of the CUDA card here, as PyTorch reports it (from a probe process), or None without one."""
    if not Path("/proc/driver/nvidia/gpus").exists() and not Path("/dev/nvidia0").exists():
        return None
    from bench import worker

    probe = worker.run("probe", {"device": None}, timeout=300)
    device = probe.get("device") or {}
    return device.get("total_memory_gib") if device.get("kind") == "cuda" else None


def _print_plan(args, results: Path) -> int:
    """``--plan``: print the plan for the card here, else a card of ``--device-gib`` GiB (an H100 80GB unless told),
    on any machine."""
    from bench.gpu_plan import DEFAULT_CONTEXT_GIB, DEFAULT_CORES, DEFAULT_DEVICE_GIB, DISK_GB, build_plan

    rows = recorded_rows(results) or recorded_rows(REPO_RESULTS)
    jobs = plan_jobs(args.parts, presets=args.presets, steps=args.steps, results=results)
    todo = jobs if args.redo else still_to_measure(jobs, results)
    contexts = sorted(r["context_gib"] for r in rows if r.get("context_gib") and r.get("cuda"))
    plan = build_plan(todo, rows=rows, device_gib=args.device_gib or _card_gib() or DEFAULT_DEVICE_GIB,
                      context_gib=contexts[len(contexts) // 2] if contexts else DEFAULT_CONTEXT_GIB,
                      cores=args.cores or DEFAULT_CORES, budget_s=args.budget_s or DEFAULT_PLAN_BUDGET_S,
                      at_once=args.at_once, check=check_job() if todo else None, disk_gb=args.disk_gb or DISK_GB)
    done = sorted({j["name"] for j in jobs} - {j["name"] for j in todo})
    lines = plan.text(done).splitlines()
    print("\n".join([*lines[:-1], *_pending_lines(args.parts), lines[-1]]))
    return 0


def _pending_lines(parts) -> list[str]:
    """Return a line for each row of ``parts`` that is pending, not measured (:data:`PENDING`), and why."""
    return [f"  pending, never measured here: {name}: {why}" for name, why in PENDING.items()
            if name.split("-")[0] in parts]


def main(argv: list[str] | None = None) -> int:
    """``python -m bench gpu [--plan] [--budget-s N] [--parts ...] [--tiny] [--bundle DIR] [--pictures]``: see the
    module docstring.

    Exit code 0 when every planned row ran (fit or not: an OOM is a finding), 1 when a row broke or was
    skipped, 2 on bad input (no CUDA device without --tiny or --plan, an unknown part).
    """
    from bench import worker
    from bench.gpu_plan import DISK_GB, build_plan

    started = time.monotonic() - _process_age_s()  # the budget counts from the process's start, imports included
    parser = argparse.ArgumentParser(prog="python -m bench gpu", description=main.__doc__)
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS, help="what to measure, in order")
    parser.add_argument("--presets", nargs="+", default=list(PRESET_ORDER), choices=PRESET_ORDER)
    parser.add_argument("--steps", type=int, default=2, help="optimiser steps per preset (>= 2: states exist)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start only rows expected to end within this many seconds of the start; kill what runs "
                             f"past it (--plan: {DEFAULT_PLAN_BUDGET_S} s unless given)")
    parser.add_argument("--results", default=None, help="folder (default results/gpu; --tiny: a temporary one)")
    parser.add_argument("--tiny", action="store_true", help="the same code on a CPU with two-layer models")
    parser.add_argument("--plan", action="store_true", help="print the plan only (any machine, no CUDA needed)")
    parser.add_argument("--device-gib", type=float, default=None,
                        help="--plan: the card's memory as PyTorch reports it (default: the card here, else 79.1, an "
                             "H100 80GB; an H200: 139)")
    parser.add_argument("--disk-gb", type=float, default=None,
                        help="the disk the random-weight folders may fill (default: 20 GB, or less where less is free)")
    parser.add_argument("--cores", type=int, default=None, help="--plan: the GPU machine's host cores (default 16)")
    parser.add_argument("--at-once", type=int, default=None, help="at most this many rows at once (--tiny: 2)")
    parser.add_argument("--bundle", default=None, help="prepare an offline GPU machine's wheels in this folder")
    parser.add_argument("--pictures", action="store_true",
                        help="render docs/gpu_memory_laptop-16gb.png (and copy the dashboard's picture) from the "
                             "results folder's saved dashboard, on any machine")
    parser.add_argument("--redo", action="store_true",
                        help="measure every row again (default: only rows the results lack at today's settings)")
    args = parser.parse_args(argv)
    if args.bundle:
        from scripts.gpu_bundle import device_command, make_bundle

        make_bundle(args.bundle)
        print(f"on the GPU machine, with the repository and {args.bundle}/ there, from the repository root (the rows "
              f"go to results/gpu/):\n{device_command(args.bundle)}")
        return 0
    if args.pictures:
        return _pictures(Path(args.results or "results/gpu"), Path(__file__).resolve().parents[1] / "docs")
    if args.steps < 2 and "presets" in args.parts:
        print("error: --steps must be at least 2: AdamW creates its states in the first step", file=sys.stderr)
        return 2
    if args.plan:
        return _print_plan(args, Path(args.results or "results/gpu"))
    probe = worker.run("probe", {"device": "cpu" if args.tiny else None}, timeout=300)
    if probe.get("status") != "ok":
        print(f"error: could not inspect the device: {probe.get('error')}", file=sys.stderr)
        return 2
    if probe["device"]["kind"] != "cuda" and not args.tiny:
        print(f"error: no CUDA device here ({probe['device']['name']}): bench gpu measures a GPU. "
              "Run --tiny for the CPU rehearsal of the command, --plan for its plan, or --bundle DIR for an "
              "offline GPU machine.", file=sys.stderr)
        return 2
    results = Path(args.results or (tempfile.mkdtemp(prefix="labkit-gpu-tiny-") if args.tiny else "results/gpu"))
    if args.tiny and measured_rows(results):
        print(f"error: {results} holds rows measured on a GPU; --tiny (a CPU rehearsal of the command) never writes "
              "beside them. Leave --results out (a temporary folder) or name an empty one.", file=sys.stderr)
        return 2
    results.mkdir(parents=True, exist_ok=True)
    say = _Log()
    say.path = results / "runs.log"
    device = probe["device"]
    say(f"\n# {datetime.now(timezone.utc).isoformat(timespec='seconds')}: python -m bench gpu "
        f"{' '.join(argv if argv is not None else sys.argv[1:])} ({device['name']})")
    jobs = plan_jobs(args.parts, tiny=args.tiny, presets=args.presets, steps=args.steps, results=results)
    kept = len(jobs)
    if not args.redo:
        jobs = still_to_measure(jobs, results)
        if kept > len(jobs):
            say(f"{kept - len(jobs)} rows already measured at today's settings (--redo measures them again)")
    device_gib = device.get("total_memory_gib") or math.inf
    from labkit.presets import card_device

    skipped = []
    for job in list(jobs):
        card = card_device(job["preset"]) if job.get("cap") == "card" and not args.tiny else None
        if card is not None and card.total_memory_gib > device_gib:  # a cap larger than the card is refused
            say(f"{job['name']:<34} refused: its card has {card.total_memory_gib:g} GiB, more than this device's "
                f"{device_gib:.2f} GiB; measure it on a card at least that large")
            skipped.append(job["name"])
            jobs.remove(job)
    rows = recorded_rows(results) or recorded_rows(REPO_RESULTS)
    cores = probe.get("cpu_count") or os.cpu_count() or 1
    budget_s = args.budget_s or math.inf
    models = Path(tempfile.mkdtemp(prefix="labkit-gpu-models-"))  # the random-weight folders, shared by rows
    free_gb = shutil.disk_usage(models).free / 1e9 - DISK_SPARE_GB
    disk_gb = min(args.disk_gb or DISK_GB, free_gb)
    # On a CPU (--tiny) the rows only rehearse the code, two at a time; the check compares their seconds only.
    plan = build_plan(jobs, rows=rows, device_gib=1e6 if args.tiny else device_gib,
                      context_gib=probe.get("context_gib") or 0.0, cores=cores,
                      budget_s=budget_s, at_once=args.at_once or (2 if args.tiny else None),
                      check=check_job(tiny=args.tiny) if jobs else None, start_s=time.monotonic() - started,
                      disk_gb=disk_gb)
    say(plan.text())
    for line in _pending_lines(args.parts):
        say(line)
    skipped += list(plan.refused)
    if plan.refused:
        say(f"{len(plan.refused)} rows need more disk than the {disk_gb:.1f} GB free in {models.parent} "
            f"(--disk-gb, or free disk there): the run measures what fits")
    runner = Runner(plan, results=results, budget_s=budget_s, clock=lambda: time.monotonic() - started, say=say,
                    cores=cores, models=models)
    if not plan.jobs():
        say(f"nothing to run: no row fits {disk_gb:.1f} GB of free disk and this card" if plan.refused
            else "nothing to run")
    say(f"bench gpu: {len(plan.jobs())} rows -> {results}")
    try:
        runner.run_alone(plan.alone_first)
        runner.run_pool()
        if runner.check.get("passed") is not None:
            runner.mark_check("passed" if runner.check["passed"] else "failed")
        runner.run_alone(runner.reruns + plan.alone_last)
    finally:  # whatever broke, the models go and the status is written
        shutil.rmtree(models, ignore_errors=True)
        skipped += runner.skipped
        _write_status(args, results, runner, plan, skipped, say)
    if skipped:
        say(f"skipped (budget or disk): {', '.join(skipped)}")
    say(f"wrote {results / 'measurements.csv'} and measurements.json ({len(runner.rows) - len(runner.unwritten)} rows"
        + (f"; not written: {', '.join(runner.unwritten)}" if runner.unwritten else "") + ")")
    return 1 if runner.broken or skipped or runner.unwritten else 0


def _write_status(args, results: Path, runner, plan, skipped: list, say) -> None:
    """Write ``status.json``: what results/ holds, what this run measured, skipped or could not write, and what a
    GPU session should measure next (a --tiny run measures no memory). A failed write is said, never raised."""
    try:
        pending = [] if args.tiny else [j["name"] for j in still_to_measure(plan_jobs(PARTS, results=results), results)]
        status = {"measured": [r["name"] for r in runner.rows] if args.tiny else sorted(measured_rows(results)),
                  "pending": pending, "not built yet": PENDING, "skipped_for_budget": skipped,
                  "refused_for_disk": plan.refused, "not_written": runner.unwritten,
                  "this_run": [r["name"] for r in runner.rows], "at_once": plan.at_once,
                  "disk_peak_gb": runner.disk.peak,
                  "side_by_side_check": {k: v for k, v in runner.check.items() if k != "alone"}}
        (results / "status.json").write_text(json.dumps(status, indent=1) + "\n")
    except Exception as exc:  # noqa: BLE001 - the status is the last word: say why it is missing
        say(f"could not write {results / 'status.json'}: {type(exc).__name__}: {exc}")
