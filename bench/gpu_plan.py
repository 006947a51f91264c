"""The plan of one ``python -m bench gpu`` run: what it measures, in which order, how many at once, how long.

A borrowed GPU run is one call of at most 10 minutes, so every pending row must fit in one. Two measured facts
make that possible: TRL's ``generate`` spends about 80 ms a decoding step whatever the batch (the GPU idles:
generation is host-bound), and a row's memory is capped per process (``set_per_process_memory_fraction``), so
several rows, each capped at its own card, can run at once in separate processes on one large GPU.

- :class:`SpeedModel`: the expected seconds of a row, fitted on the rows already measured alone
  (``results/gpu/measurements.json``): generation as decode steps x a per-step time that grows with the model's
  layers and, a little, with the generation batch (LoRA and QLoRA apart), the loss's passes by micro-batches and
  tokens x parameters, the setup by parameters, and the process start from the gaps between recorded rows.
- :func:`footprint_gib`: the device memory a row may take: its cap (the preset's card, the OOM doctor's cap, or for
  a row without one the cap this planner chooses from the estimate, :func:`planner_cap`), its CUDA context and an
  allowance for what lives outside PyTorch's allocator.
- :class:`Scheduler`: which rows start now: in the plan's order, while their memory fits beside the rows
  running, fewer than ``at_once`` run, what they wait for (the OOM doctor's base rows) has ended, and their
  expected seconds fit the time left. The plan (:func:`simulate`, on a clock of expected seconds) and the run
  (:mod:`bench.gpu`, on the real clock) use the same rule, so the run follows the printed plan.

The run: the side-by-side check first, alone (:data:`CHECK_ROW`, the cheapest row; its twin runs in the first
wave beside the others, and their allocated peaks must agree within :data:`AGREE_PCT`), then every memory row side
by side, then the rows that must run alone (the generation speeds). :func:`format_plan` prints it, ending with
``<N> s in all, <K> at once``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["SpeedModel", "Scheduler", "RunPlan", "build_plan", "job_shape", "preset_shape", "footprint_gib",
           "planner_cap", "expected_oom", "choose_at_once", "simulate", "Disk", "measured_slowdown", "format_plan", "twin_of", "peaks_agree", "DEFAULT_DEVICE_GIB", "DEFAULT_CORES", "RESERVE_GIB",
           "OUTSIDE_CAP_GIB", "DEFAULT_CONTEXT_GIB", "SIDE_BY_SIDE_SLOWDOWN", "CHECK_ROW", "AGREE_PCT", "PROBE_S",
           "IMPORT_S", "DISK_GB", "MAX_SLOWDOWN"]

DEFAULT_DEVICE_GIB = 79.1  # an H100 80GB as PyTorch reports it (an H200: about 139)
DEFAULT_CORES = 16  # the lent GPU machine's host cores
RESERVE_GIB = 1.0  # left free on the device whatever runs
OUTSIDE_CAP_GIB = 0.5  # per process, beside its cap and context: what PyTorch's allocator does not hold (bitsandbytes' paged states)
DEFAULT_CONTEXT_GIB = 0.51  # one process's CUDA context on the H100 (results/gpu, 2026-11-26); the probe measures it
# A guess until a run measures it (the check's twin's generation seconds beside the others over the same row's
# alone). Eight processes without MPS share the GPU by time-slicing: kernels of two contexts never run at once, and
# each switch costs. Alone, a host-bound decoding step keeps the GPU busy a fifth to a third of its 80 ms, so eight
# such rows ask 1.6 to 2.7 GPUs' worth of kernel time, and 8 rows x their threads share 16 host cores: 1.5-2 is
# likely; 1.75 is its middle. The check measures it in every run and the next plan takes that figure.
SIDE_BY_SIDE_SLOWDOWN = 1.75
CHECK_ROW = "grid-Qwen2.5-0.5B-lora-bf16"  # the cheapest row: measured alone first, and again beside the others
AGREE_PCT = 1.0  # the card's memory alone and beside others must agree within this, or the rest runs one at a time
MAX_SLOWDOWN = 2.5  # beside others, generation may be this much slower than alone; past it the rest runs one at a time
PROBE_S = 15.0  # the parent's probe of the device (a process that creates a CUDA context), before any row
IMPORT_S = 30.0  # the parent's cold imports before its plan (20-45 s on a fresh machine): the budget counts them
DISK_GB = 20.0  # the disk a plan may fill with random-weight folders (a 64 GiB machine also holds its system image)
PLANNER_CAP_FACTOR, PLANNER_CAP_PLUS_GIB = 1.3, 1.0  # a cap for a row without one: estimate x 1.3 + 1 GiB
PROCESS_START_S = 15.0  # a fresh worker's imports, when the recorded rows do not tell
# The generation paths other than "generate" (labkit.generation.PATHS) until a speed row measures them: guesses.
# static-compiled: CUDA graphs take the host out of a decode step (a 1.5B model's weights and a batch of 96's KV
# cache read in about 2 ms on an H100; kernels and sampling more); its first generation compiles (60-120 s).
GUESS_STEP_MS = {"static-compiled": 20.0}  # continuous: SpeedModel.continuous_ms
GUESS_COMPILE_S = 90.0
# continuous without flash-attention packs every request of a decode step into one sequence with a block-diagonal
# mask (transformers/generation/continuous_batching/input_outputs.py 489-551: q_size tokens against kv_size, the
# mask sliced [..., :q_size, :k_len]; continuous_api.py 745-785 switches to flash only when it is installed): each
# of the batch's B queries attends over all B sequences' cached tokens, so the step's attention costs
# 4 x heads x head_dim x B x (B x context) FLOPs a layer and reads a B x (B x context) 16-bit mask. SDPA's kernel
# with an arbitrary mask: about 100 TFLOP/s and 2,000 GB/s on an H100 (guesses until speed-continuous measures it).
CB_ATTENTION_TFLOPS, CB_MASK_GB_S = 100.0, 2000.0


# --------------------------------------------------------------------------- the shape of a row


def job_shape(job: dict) -> dict:
    """Return what a row's seconds and memory depend on: layers, parameters (billions), method, decode steps per
    generation, generation batch, micro-batches, tokens per step, the estimate (GiB) and its card's GiB."""
    from bench.gpu_measure import bench_preset

    shape = preset_shape(bench_preset(job), job["preset"], steps=job.get("steps", 2), precision=job.get("precision"))
    speed = job.get("speed") or {}
    if speed.get("mode") == "generation only":  # bench.gpu_speed: generations, no training step
        shape.update(generation_only=True, generations=len(speed["generations"]))
    return shape


def preset_shape(preset, card_name: str, *, steps: int = 2, precision: str | None = None) -> dict:
    """Return :func:`job_shape` of ``preset`` measured on the card of preset ``card_name`` for ``steps`` steps."""
    from labkit.device import choose_precision
    from labkit.plan import resolve_plan
    from labkit.preflight import estimate
    from labkit.presets import card_device
    from labkit.shapes import model_shape

    card = card_device(card_name)
    precision = precision or preset.precision or (choose_precision(card) if card else "fp32")
    plan = resolve_plan(preset.replace(precision=precision), card)
    shape = model_shape(plan.shape_name)
    completion = plan.config["max_completion_length"]
    rounds = (preset.max_tool_calling_iterations or 0) if preset.environment else 0
    est = estimate(plan)
    from bench.gpu_measure import folder_gb, model_folder_name

    folder = model_folder_name(preset, precision)
    return dict(layers=shape.num_layers, params_b=shape.params / 1e9, method=preset.method, completion=completion,
                heads=shape.num_heads, head_dim=shape.head_dim, prompt=preset.max_prompt_length,
                folder=folder, folder_gb=round(folder_gb(shape.params, folder), 2),
                path=preset.generation, generation_only=False, generations=steps,
                # forced tool rounds fill the budget, then the last round writes max_completion_length more
                decode_steps=completion * (2 if rounds else 1), tool_rounds=rounds,
                generation_batch=plan.generation_batch_size, micro_batches=plan.config["gradient_accumulation_steps"],
                tokens=plan.generation_batch_size * (preset.max_prompt_length + completion),
                steps=steps, estimate_gib=est.total, generation_gib=est.generation_phase,
                training_gib=est.training_phase, card_gib=card.total_memory_gib if card else None)


def planner_cap(shape: dict) -> float:
    """Return the cap (GiB) this planner gives a row that has none: the estimate x 1.3 + 1 GiB, up to half a GiB.

    Far above the peak (the estimate was within 7 % of every row measured, reserved within 20 % of allocated),
    so it does not change what the row measures; it only tells the planner how much of the device the row may take.
    """
    return math.ceil((shape["estimate_gib"] * PLANNER_CAP_FACTOR + PLANNER_CAP_PLUS_GIB) * 2) / 2


def expected_oom(job: dict, shape: dict, context_gib: float) -> str | None:
    """Return the phase a capped row is expected to run out of memory in, by the estimate (None: it fits): a
    preset whose estimate passes its card stops early, which the plan's seconds count."""
    if job.get("cap") == "card" and shape["card_gib"]:
        cap = shape["card_gib"] - context_gib
    elif isinstance(job.get("cap"), (int, float)) and job.get("cap_from") != "planner":
        cap = job["cap"]
    else:
        return None
    if shape["generation_gib"] > cap:
        return "generation"
    return "backward" if shape["training_gib"] > cap else None


def footprint_gib(job: dict, shape: dict, context_gib: float) -> float:
    """Return the device memory a row may take: its cap + its context + :data:`OUTSIDE_CAP_GIB`.

    The cap: the preset's card less the context (``cap="card"``), the OOM doctor's (a number), or
    :func:`planner_cap` (a row without one, and a doctor row whose cap comes from a row not measured yet).
    """
    if job.get("cap") == "card" and shape["card_gib"]:
        return shape["card_gib"] + OUTSIDE_CAP_GIB
    cap = job["cap"] if isinstance(job.get("cap"), (int, float)) else planner_cap(shape)
    return cap + context_gib + OUTSIDE_CAP_GIB


# --------------------------------------------------------------------------- the seconds of a row


@dataclass
class SpeedModel:
    """Expected seconds of a row on the card the recorded rows were measured on (see the module docstring).

    generation = ``steps x (overhead + decode steps x layers x (per_layer_ms[method] + per_seq_ms x batch) / 1000)``;
    training = ``micro_overhead_s x micro-batches + token_s x tokens x parameters (billions)`` a step;
    setup = ``setup_s + setup_per_b_s x parameters``; plus ``start_s``, the process start outside ``wall_s``.
    Full fine-tuning has no recorded row yet: it is timed as LoRA (more kernels a layer: an over-estimate).
    """

    per_layer_ms: dict = field(default_factory=lambda: {"lora": 2.7, "qlora": 3.2})
    per_seq_ms: float = 0.003
    overhead_s: float = 2.0
    micro_overhead_s: float = 0.4
    token_s: float = 3.2e-5
    setup_s: float = 3.0
    setup_per_b_s: float = 3.0
    start_s: float = PROCESS_START_S
    fitted_on: list = field(default_factory=list)
    path_ms: dict = field(default_factory=lambda: dict(GUESS_STEP_MS))  # ms a decode step by path, else generate's
    compile_s: float = GUESS_COMPILE_S  # static-compiled's first generation, over the others
    path_from: dict = field(default_factory=dict)  # path -> the speed rows its figures come from (absent: a guess)

    @classmethod
    def from_rows(cls, rows: list[dict]) -> "SpeedModel":
        """Return the model fitted (least squares) on the ok rows measured alone on CUDA with TRL's ``generate``
        and every phase timed; the defaults stand where the rows are too few to fit (or a fit comes out negative)."""
        import numpy as np

        model = cls()
        model._path_figures(rows)
        usable = [r for r in rows if r.get("status") == "ok" and r.get("cuda") and not r.get("side_by_side")
                  and r.get("generation", "generate") == "generate"  # the other paths: _path_figures
                  and r.get("speed_mode") != "generation only"
                  and r.get("settings") and r.get("wall_s") and all(r.get(f"{p}_s") is not None for p in
                                                                    ("generation", "forward", "backward"))]
        if not usable:
            return model
        from labkit.presets import Preset

        shapes = [preset_shape(Preset.from_dict(r["settings"]), r["settings"]["name"], steps=r.get("steps_done") or 2,
                               precision=r["precision"]) for r in usable]
        model.fitted_on = [r["name"] for r in usable]
        # generation: gen_s / steps = overhead + decode x layers x (a[method] + b x batch) / 1000
        methods = sorted({"qlora" if s["method"] == "qlora" else "lora" for s in shapes})
        a_rows, y = [], []
        for row, s in zip(usable, shapes):
            kind = "qlora" if s["method"] == "qlora" else "lora"
            steps = s["steps"]
            units = s["decode_steps"] * s["layers"] / 1000
            a_rows.append([units if m == kind else 0.0 for m in methods] + [units * s["generation_batch"], 1.0])
            y.append(row["generation_s"] / steps)
        if len(usable) >= len(methods) + 2:
            coef = np.linalg.lstsq(np.array(a_rows), np.array(y), rcond=None)[0]
            if all(c >= 0 for c in coef):
                model.per_layer_ms.update({m: float(c) for m, c in zip(methods, coef[:len(methods)])})
                model.per_seq_ms, model.overhead_s = float(coef[-2]), float(coef[-1])
        # training: (scoring + forward + backward + optimizer) / steps = micro x m + tokens x params x k
        x, y = [], []
        for row, s in zip(usable, shapes):
            x.append([s["micro_batches"], s["tokens"] * s["params_b"]])
            y.append(sum(row.get(f"{p}_s") or 0 for p in ("scoring", "forward", "backward", "optimizer")) / s["steps"])
        if len(usable) >= 3:
            coef = np.linalg.lstsq(np.array(x, dtype=float), np.array(y), rcond=None)[0]
            if all(c >= 0 for c in coef):
                model.micro_overhead_s, model.token_s = float(coef[0]), float(coef[1])
        # setup: wall_s less every phase = setup + per_b x params
        x, y = [], []
        for row, s in zip(usable, shapes):
            phases = sum(row.get(f"{p}_s") or 0 for p in ("generation", "scoring", "forward", "backward", "optimizer"))
            x.append([1.0, s["params_b"]])
            y.append(row["wall_s"] - phases)
        if len(usable) >= 3:
            coef = np.linalg.lstsq(np.array(x), np.array(y), rcond=None)[0]
            if all(c >= 0 for c in coef):
                model.setup_s, model.setup_per_b_s = float(coef[0]), float(coef[1])
        model.start_s = _process_start_s(usable) or PROCESS_START_S
        return model

    def _path_figures(self, rows: list[dict]) -> None:
        """Take each generation path's ms a decode step (and static-compiled's compile seconds) from the speed rows
        measured alone on CUDA at full length (the median), where there are some; the guesses stand elsewhere."""
        for path in ("static-compiled", "continuous"):
            speed = [r for r in rows if r.get("part") == "speed" and r.get("generation") == path and r.get("cuda")
                     and r.get("status") == "ok" and not r.get("side_by_side") and r.get("ms_per_decode_step")
                     and r.get("speed_mode") == "full step"]
            if speed:
                self.path_ms[path] = sorted(r["ms_per_decode_step"] for r in speed)[len(speed) // 2]
                self.path_from[path] = [r["name"] for r in speed]
                compiles = sorted(r["compile_s"] for r in speed if r.get("compile_s") is not None)
                if path == "static-compiled" and compiles:
                    self.compile_s = compiles[len(compiles) // 2]

    def step_ms(self, shape: dict) -> float:
        """Return the milliseconds of one decoding step for a row of this shape: ``generate``'s fit, or the path's
        figure (:meth:`_path_figures`, else :data:`GUESS_STEP_MS`; ``continuous`` without one: as ``generate``)."""
        path = shape.get("path", "generate")
        if path != "generate" and self.path_ms.get(path):
            return self.path_ms[path]
        kind = "qlora" if shape["method"] == "qlora" else "lora"
        generate = shape["layers"] * (self.per_layer_ms[kind] + self.per_seq_ms * shape["generation_batch"])
        return generate + (self.continuous_ms(shape) if path == "continuous" else 0.0)

    @staticmethod
    def continuous_ms(shape: dict) -> float:
        """Return what ``continuous`` adds to a decoding step over ``generate`` without flash-attention: the packed
        batch's attention (:data:`CB_ATTENTION_TFLOPS`) and mask (:data:`CB_MASK_GB_S`), both growing with the
        batch squared, at the mean context of a generation (the prompt and half the completion)."""
        batch, context = shape["generation_batch"], shape["prompt"] + shape["decode_steps"] / 2
        keys = batch * batch * context  # query x key pairs a layer
        flops = 4 * shape["heads"] * shape["head_dim"] * keys
        return shape["layers"] * (flops / (CB_ATTENTION_TFLOPS * 1e12) + 2 * keys / (CB_MASK_GB_S * 1e9)) * 1000

    def step_ms_from(self, shape: dict) -> str:
        """Return where :meth:`step_ms`'s figure comes from, in words (for the printed plan)."""
        path = shape.get("path", "generate")
        if path == "generate":
            return "generate"
        if path in self.path_from:
            return f"{path}, measured"
        if path == "continuous":
            return f"continuous: generate's step + {self.continuous_ms(shape):.0f} ms of packed attention (batch squared)"
        return f"{path}: a guess" if self.path_ms.get(path) else f"{path}: a guess, as generate"

    def seconds(self, job: dict, shape: dict) -> dict:
        """Return the expected seconds of a row measured alone, by part (``total`` their sum): a generation-only
        speed row generates ``generations`` times and trains none; a static-compiled one compiles once."""
        steps = shape["steps"]
        generations = shape.get("generations", steps)
        generation = generations * (self.overhead_s + shape["decode_steps"] * self.step_ms(shape) / 1000)
        if shape.get("path") == "static-compiled":
            generation += self.compile_s
        training = 0.0 if shape.get("generation_only") else steps * (
            self.micro_overhead_s * shape["micro_batches"] + self.token_s * shape["tokens"] * shape["params_b"])
        stage = (job.get("doctor") or {}).get("stage")
        target = job["doctor"]["target"] if stage == "oom" else shape.get("expected_oom")
        if target:  # it stops where it runs out of memory, in the first step
            generation = 0.0 if target == "generation" else generation / steps
            training = 0.0 if target in ("generation", "backward") else training / steps
        setup = self.setup_s + self.setup_per_b_s * shape["params_b"]
        parts = dict(start=self.start_s, setup=setup, generation=generation, training=training)
        parts["total"] = sum(parts.values())
        return parts


def _process_start_s(rows: list[dict]) -> float | None:
    """Return the median gap between one recorded row's end and the next one's start (a process start), or None."""
    ends = []
    for row in rows:
        try:
            ends.append((datetime.fromisoformat(row["date"]).timestamp(), row["wall_s"]))
        except (KeyError, TypeError, ValueError):
            continue
    ends.sort()
    gaps = sorted(b - wall - a for (a, _), (b, wall) in zip(ends, ends[1:]) if 0 < b - wall - a < 60)
    return gaps[len(gaps) // 2] if gaps else None


# --------------------------------------------------------------------------- which row starts when


def choose_at_once(device_gib: float, cores: int, largest_gib: float, asked: int | None = None) -> tuple[int, str]:
    """Return ``(K, why)``: how many rows may run at once: ``asked``, else half the host cores (generation keeps
    one core busy a row, and a row's start more); and, in words, how many of the largest rows the device fits
    (fewer run beside those: the scheduler starts a row only when its memory fits)."""
    limit = max(1, asked or cores // 2)
    why = f"at most {limit} rows at once ({'as asked' if asked else f'{cores} host cores, one row for two'})"
    fit = int((device_gib - RESERVE_GIB) // largest_gib) if largest_gib else limit
    if fit < limit:
        why += (f"; the device fits only {max(fit, 1)} of its largest rows ({largest_gib:.1f} GiB each) at once, "
                "so fewer run beside those")
    return limit, why


class Disk:
    """The random-weight folders on disk: one per (architecture, dtype), saved when the first row that loads it
    starts and deleted when the last one ends (or is dropped). ``users``: row name -> folder; ``sizes``: folder -> GB.
    A row whose folder is not on disk starts only if the folders already there leave it room within ``limit_gb``."""

    def __init__(self, users: dict, sizes: dict, limit_gb: float = math.inf):
        self.users, self.sizes, self.limit_gb = dict(users), dict(sizes), limit_gb
        self.left = {}
        for folder in self.users.values():
            self.left[folder] = self.left.get(folder, 0) + 1
        self.live: set[str] = set()
        self.peak = 0.0

    def used(self) -> float:
        return sum(self.sizes[f] for f in self.live)

    def fits(self, name: str) -> bool:
        folder = self.users.get(name)
        return folder is None or folder in self.live or self.used() + self.sizes[folder] <= self.limit_gb + 1e-9

    def start(self, name: str) -> None:
        if self.users.get(name):
            self.live.add(self.users[name])
            self.peak = max(self.peak, self.used())

    def end(self, name: str) -> str | None:
        """Count ``name`` as ended (or dropped); return its folder if no row needs it any more (to delete)."""
        folder = self.users.pop(name, None)
        if folder is None:
            return None
        self.left[folder] -= 1
        if self.left[folder] == 0 and folder in self.live:
            self.live.discard(folder)
            return folder
        return None


class Scheduler:
    """Which rows start now (the rule the plan simulates and the run follows).

    ``jobs`` in the plan's order; ``footprints`` and ``expected`` by name (expected: seconds alone); a job's
    ``after`` names rows that must have ended first. A job starts when those have ended, its footprint fits the
    device less :data:`RESERVE_GIB` and the rows running, fewer than ``at_once`` run, and its expected seconds
    (x ``slowdown`` beside others) fit before ``deadline``; a job whose seconds can no longer fit is dropped.
    The first job that waits for memory holds its place (backfilling, as batch schedulers do): from the expected
    ends of the rows running it knows when its memory will be free, and a later job starts before it only if it
    ends by then or leaves that memory free, so small rows never starve a large one.
    """

    def __init__(self, jobs: list[dict], *, footprints: dict, expected: dict, device_gib: float, at_once: int,
                 deadline: float, slowdown: float = SIDE_BY_SIDE_SLOWDOWN, disk: Disk | None = None):
        self.waiting = list(jobs)
        self.disk = disk or Disk({}, {})
        self.footprints, self.expected = footprints, expected
        self.device_gib, self.at_once, self.deadline, self.slowdown = device_gib, at_once, deadline, slowdown
        self.ended: set[str] = set()
        self.dropped: list[dict] = []  # expected to end after the deadline: left for a later run
        self.freed: list[str] = []  # random-weight folders no row needs since a drop (the run deletes them)

    def seconds(self, job: dict) -> float:
        return self.expected[job["name"]] * (self.slowdown if self.at_once > 1 else 1.0)

    def startable(self, now: float, running: dict) -> list[dict]:
        """Return the jobs to start at ``now`` beside ``running`` (name -> (footprint, expected end)), removed from
        the waiting."""
        free = self.device_gib - RESERVE_GIB - sum(f for f, _ in running.values())
        ends = [(end, f) for f, end in running.values()]
        count = len(running)
        started, shadow = [], None  # shadow: (when the first waiting job's memory is free, what is left beside it)
        for job in list(self.waiting):
            if count >= self.at_once:
                break
            seconds = self.seconds(job)
            if now + seconds > self.deadline:
                self.waiting.remove(job)
                self.dropped.append(job)
                self.freed += [f for f in (self.disk.end(job["name"]),) if f]
                continue
            if any(name not in self.ended for name in job.get("after", ())) or not self.disk.fits(job["name"]):
                continue
            need = self.footprints[job["name"]]
            if need <= free or not count:  # alone, a row larger than the device is refused where it runs
                if shadow is not None and now + seconds > shadow[0]:
                    if need > shadow[1]:
                        continue  # it would hold memory the first waiting row needs
                    shadow = (shadow[0], shadow[1] - need)
                self.waiting.remove(job)
                started.append(job)
                self.disk.start(job["name"])
                ends.append((now + seconds, need))
                free -= need
                count += 1
            elif shadow is None:
                available, when = free, now
                for end, f in sorted(ends):
                    available, when = available + f, end
                    if available >= need:
                        break
                shadow = (when, available - need)
        return started

    def end(self, name: str) -> str | None:
        """Count ``name`` as ended; return its random-weight folder when no row needs it any more (to delete)."""
        self.ended.add(name)
        return self.disk.end(name)


def simulate(alone_first: list[dict], pool: list[dict], alone_last: list[dict], *, footprints: dict, expected: dict,
             device_gib: float, at_once: int, budget_s: float, slowdown: float = SIDE_BY_SIDE_SLOWDOWN,
             start_s: float = IMPORT_S + PROBE_S, folders: dict | None = None, disk_gb: float = math.inf) -> dict:
    """Return the plan on a clock of expected seconds from the process's start (rows begin at ``start_s``, after
    the parent's imports and probe): ``entries`` (name, start, end, at once, footprint, seconds), ``dropped`` (rows
    past the budget), ``end`` (seconds in all), ``at_once`` (the most rows at once) and ``disk_peak_gb`` (the most
    random-weight folders on disk at once; ``folders``: row -> (folder, GB), within ``disk_gb``)."""
    entries, dropped = [], []
    folders = folders or {}
    disk = Disk({n: f for n, (f, _) in folders.items()}, {f: gb for f, gb in folders.values()}, disk_gb)

    def one_at_a_time(jobs, now: float) -> float:  # rows that run alone, before or after the pool
        for job in jobs:
            if now + expected[job["name"]] > budget_s or not disk.fits(job["name"]):
                dropped.append(job)
                disk.end(job["name"])
                continue
            disk.start(job["name"])
            entries.append(dict(name=job["name"], start=now, end=now + expected[job["name"]], at_once=1, alone=True,
                                footprint=footprints[job["name"]], seconds=expected[job["name"]]))
            now = entries[-1]["end"]
            disk.end(job["name"])
        return now

    now = one_at_a_time(alone_first, start_s)
    scheduler = Scheduler(pool, footprints=footprints, expected=expected, device_gib=device_gib, at_once=at_once,
                          deadline=budget_s, slowdown=slowdown, disk=disk)
    for job in alone_first:
        scheduler.end(job["name"])
    running: dict[str, tuple[float, float]] = {}  # name -> (end, footprint)
    most = 1 if entries else 0
    while scheduler.waiting or running:
        for job in scheduler.startable(now, {n: (f, end) for n, (end, f) in running.items()}):
            seconds = scheduler.seconds(job)
            running[job["name"]] = (now + seconds, footprints[job["name"]])
            entries.append(dict(name=job["name"], start=now, end=now + seconds, at_once=len(running),
                                footprint=footprints[job["name"]], seconds=seconds))
        most = max(most, len(running))
        if not running:
            break  # what waits can never start (what it waits for was dropped)
        name, (end, _) = min(running.items(), key=lambda item: item[1][0])
        now = end
        del running[name]
        scheduler.end(name)
    dropped += scheduler.dropped + scheduler.waiting
    for job in scheduler.waiting:
        disk.end(job["name"])
    now = one_at_a_time(alone_last, now)
    return dict(entries=entries, dropped=dropped, end=now, at_once=max(most, 1), disk_peak_gb=round(disk.peak, 1))


def twin_of(job: dict) -> dict:
    """Return the side-by-side check's twin of ``job``: the same row, measured again beside the others."""
    twin = dict(job, part="check", name=f"{job['name']}-beside", twin_of=job["name"], dashboard=None)
    twin.pop("check", None)
    return twin


def peaks_agree(alone: dict, beside: dict) -> tuple[bool | None, str, float | None]:
    """Return the side-by-side check's verdict on two rows of the same spec, one alone and one beside the others:
    whether side by side changed what the rows measure (None: not comparable, when one failed), the verdict in
    words, and the slowdown (the generation phase's seconds beside over alone; None where one is missing).

    Two things side by side can change: the card's memory, read outside the allocator (``peak_card_gib``: NVML's
    figure for the process, or ``mem_get_info`` alone), which must agree within :data:`AGREE_PCT`; and the
    generation's seconds, which may grow up to :data:`MAX_SLOWDOWN` times. The allocator's own peaks cannot
    differ (each process counts its own tensors), so they are not compared."""
    if alone.get("status") != "ok" or beside.get("status") != "ok":
        return None, f"not compared: alone {alone.get('status')}, beside {beside.get('status')}", None
    gen_a = alone.get("generation_s")
    gen_b = (beside.get("seconds_beside") or {}).get("generation_s") or beside.get("generation_s")
    slowdown = round(gen_b / gen_a, 2) if gen_a and gen_b else None
    words, ok = [], True
    if slowdown is not None:
        ok = slowdown <= MAX_SLOWDOWN
        words.append(f"generation {gen_a:.1f} s alone, {gen_b:.1f} s beside others (x {slowdown:g}"
                     + ("" if ok else f", more than x {MAX_SLOWDOWN:g}") + ")")
    a, b = alone.get("peak_card_gib"), beside.get("peak_card_gib")
    if a and b is not None:
        diff = 100 * (b - a) / a
        ok = ok and abs(diff) <= AGREE_PCT
        words.append(f"the card's memory alone {a:.3f} GiB, beside others {b:.3f} GiB ({diff:+.2f} %"
                     + ("" if abs(diff) <= AGREE_PCT else f", more than {AGREE_PCT:g} % apart") + ")")
    else:
        words.append("the card's memory not compared (no CUDA figure outside the allocator)")
    if slowdown is None and not (a and b is not None):
        return None, "not compared: " + "; ".join(words), None
    return ok, "; ".join(words) + (": side by side measures what alone does" if ok else ""), slowdown


def measured_slowdown(rows: list[dict]) -> float | None:
    """Return the last side-by-side check's slowdown (the twin's generation seconds beside others over the row's
    alone: a row's start and its model's save are not the GPU's sharing), or None when no run has measured one."""
    alone = {r["name"]: r for r in rows if r.get("cuda") and r.get("status") == "ok" and not r.get("side_by_side")}
    for row in reversed(rows):
        base = alone.get(row.get("twin_of") or "")
        beside = (row.get("seconds_beside") or {}).get("generation_s")
        if base and beside and base.get("generation_s"):
            return round(beside / base["generation_s"], 2)
    return None


@dataclass
class RunPlan:
    """One run's plan: the rows alone first (the check), side by side (the pool, in start order), alone last."""

    alone_first: list
    pool: list
    alone_last: list
    shapes: dict
    seconds: dict  # name -> expected seconds alone, by part
    footprints: dict
    speed: SpeedModel
    at_once: int
    at_once_why: str
    slowdown: float
    context_gib: float
    device_gib: float
    budget_s: float
    simulated: dict
    folders: dict = field(default_factory=dict)  # row -> (random-weight folder, GB)
    disk_gb: float = math.inf
    start_s: float = IMPORT_S + PROBE_S
    refused: dict = field(default_factory=dict)  # row -> why it cannot run on this disk

    @property
    def expected(self) -> dict:
        return {name: part["total"] for name, part in self.seconds.items()}

    def jobs(self) -> dict:
        return {job["name"]: job for job in [*self.alone_first, *self.pool, *self.alone_last]}

    def text(self, measured: list[str] = ()) -> str:
        return format_plan(dict(self.simulated, slowdown=self.slowdown), jobs=self.jobs(), shapes=self.shapes,
                           seconds=self.seconds, speed=self.speed, device_gib=self.device_gib, budget_s=self.budget_s,
                           at_once_why=self.at_once_why, context_gib=self.context_gib, measured=list(measured),
                           disk_gb=self.disk_gb, start_s=self.start_s, refused=self.refused)

    def disk(self) -> Disk:
        """Return the run's disk book: every planned row's folder, within the plan's disk."""
        return Disk({n: f for n, (f, _) in self.folders.items()}, {f: gb for f, gb in self.folders.values()},
                    self.disk_gb)


def build_plan(jobs: list[dict], *, rows: list[dict], device_gib: float, context_gib: float, cores: int,
               budget_s: float = math.inf, at_once: int | None = None, check: dict | None = None,
               start_s: float = IMPORT_S + PROBE_S, disk_gb: float = DISK_GB) -> RunPlan:
    """Return the plan of a run of ``jobs`` (:func:`bench.gpu.plan_jobs`' specs, still to measure): the speed rows
    alone at the end, every other row side by side, with ``check`` (the :data:`CHECK_ROW` spec; None: no check)
    alone first and its twin first in the pool. A row without a cap gets :func:`planner_cap`'s (``cap_from``
    "planner"); the OOM doctor's rows wait for the rows their cap and change come from. Of a few orders of the
    pool, the plan keeps the one that leaves out the fewest memory rows within ``budget_s``, then the fewest speed
    rows, then the shortest; then it moves a row left out to an earlier place while that leaves out fewer. Rows
    begin at ``start_s`` seconds from the process's start (the budget counts from there); their random-weight
    folders share ``disk_gb`` (a row whose folder alone is larger is refused, in ``refused``)."""
    speed = SpeedModel.from_rows(rows)
    refused, kept = {}, []
    for job in jobs:
        need = job_shape(job)["folder_gb"]
        if need > disk_gb:
            refused[job["name"]] = f"its random-weight folder needs {need:.1f} GB of disk, more than the {disk_gb:.1f} GB free"
        else:
            kept.append(job)
    jobs = kept
    if check and job_shape(check)["folder_gb"] > disk_gb:
        check = None
    slowdown = measured_slowdown(rows) or SIDE_BY_SIDE_SLOWDOWN
    alone_last = [dict(job) for job in jobs if job["part"] == "speed"]
    pool = [dict(job) for job in jobs if job["part"] != "speed" and not (check and job["name"] == check["name"])]
    alone_first = [dict(check, check=True)] if check and pool else []
    if alone_first:
        pool.insert(0, twin_of(alone_first[0]))
    names = {job["name"] for job in pool}
    for job in pool:
        doctor = job.get("doctor") or {}
        if doctor.get("stage") == "oom" and doctor["base"] in names:
            job["after"] = [doctor["base"]]
        elif doctor.get("stage") == "fix":
            job["after"] = [n for n in (f"doctor-{doctor['target']}-oom",) if n in names]
    # a doctor row's cap (and change) come from rows measured in the run: until then its base's planner cap bounds it
    shapes = {job["name"]: job_shape(job) for job in [*alone_first, *pool, *alone_last]}
    for job in pool:
        shapes[job["name"]]["expected_oom"] = expected_oom(job, shapes[job["name"]], context_gib)
    most = device_gib - RESERVE_GIB - context_gib - OUTSIDE_CAP_GIB
    for job in [*alone_first, *pool]:
        if job.get("cap") is None and not (job.get("doctor") or {}).get("stage") in ("oom", "fix"):
            job.update(cap=min(planner_cap(shapes[job["name"]]), round(most, 2)), cap_from="planner")
    seconds = {name: speed.seconds(job, shapes[name]) for name, job in
               {j["name"]: j for j in [*alone_first, *pool, *alone_last]}.items()}
    footprints = {job["name"]: footprint_gib(job, shapes[job["name"]], context_gib)
                  for job in [*alone_first, *pool, *alone_last]}
    largest = max((footprints[job["name"]] for job in pool), default=0.0)
    k, why = choose_at_once(device_gib, cores, largest, at_once)
    expected = {name: part["total"] for name, part in seconds.items()}
    head = pool[:1] if alone_first else []  # the check's twin, in the first wave
    rest = pool[len(head):]
    orders = {"most valuable first": rest,
              "longest first": sorted(rest, key=lambda j: -expected[j["name"]]),
              "largest memory x seconds first": sorted(rest, key=lambda j: -expected[j["name"]] * footprints[j["name"]])}
    last = {job["name"] for job in alone_last}  # the speed rows: only if time is left

    folders = {name: (shape["folder"], shape["folder_gb"]) for name, shape in shapes.items()}

    def run(order):
        result = simulate(alone_first, order, alone_last, footprints=footprints, expected=expected,
                          device_gib=device_gib, at_once=k, budget_s=budget_s, slowdown=slowdown, start_s=start_s,
                          folders=folders, disk_gb=disk_gb)
        lost = [job["name"] in last for job in result["dropped"]]
        return (lost.count(False), lost.count(True), result["end"]), result

    best = None
    for label, order in orders.items():
        key, result = run(head + order)
        if best is None or key < best[0]:
            best = (key, label, head + order, result)
    # Then move a row left out to an earlier place, while that leaves out fewer rows (or ends sooner).
    for _ in range(len(pool)):
        key, label, order, result = best
        pool_names = {job["name"] for job in order}
        moved = None
        for job in [j for j in result["dropped"] if j["name"] in pool_names]:
            without = [j for j in order if j["name"] != job["name"]]
            for place in range(len(head), len(without)):
                trial = without[:place] + [job] + without[place:]
                trial_key, trial_result = run(trial)
                if trial_key < key and (moved is None or trial_key < moved[0]):
                    moved = (trial_key, f"{label}, {job['name']} moved up", trial, trial_result)
        if moved is None:
            break
        best = moved
    _, label, order, result = best
    result["order"] = label
    return RunPlan(alone_first, order, alone_last, shapes, seconds, footprints, speed, k, why + f"; order: {label}",
                   slowdown, context_gib, device_gib, budget_s, result, folders, disk_gb, start_s, refused)


# --------------------------------------------------------------------------- the printed plan


def format_plan(plan: dict, *, jobs: dict, shapes: dict, seconds: dict, speed: SpeedModel, device_gib: float,
                budget_s: float, at_once_why: str, context_gib: float, measured: list[str], disk_gb: float = math.inf,
                start_s: float = IMPORT_S + PROBE_S, refused: dict | None = None) -> str:
    """Return the plan as printed: the model of seconds, one line a row in the order they start, what is left for
    a later run, and the last line ``<N> s in all, <K> at once``."""
    card = f"a {device_gib:g} GiB card" if device_gib < 1e5 else "a CPU (--tiny: no memory to plan)"
    budget = f"{budget_s:g} s of budget" if budget_s < math.inf else "no budget"
    lines = [f"bench gpu plan: {card}, {budget}; {at_once_why}",
             f"  expected seconds from {len(speed.fitted_on)} rows measured alone ({', '.join(speed.fitted_on) or 'none: defaults'}):"
             f" a decoding step {speed.per_layer_ms['lora']:.2f} ms a layer (LoRA, full as LoRA), "
             f"{speed.per_layer_ms['qlora']:.2f} (QLoRA), + {speed.per_seq_ms * 1000:.1f} us a layer a sequence; "
             f"process start {speed.start_s:.0f} s; beside others x {plan.get('slowdown', SIDE_BY_SIDE_SLOWDOWN):g}",
             f"  footprint = cap + context ({context_gib:.2f} GiB) + {OUTSIDE_CAP_GIB:g} GiB outside the allocator; "
             f"{RESERVE_GIB:g} GiB of the device kept free",
             f"  {'start':>5} {'end':>5}  {'at once':>7}  {'GiB':>5}  {'row':<38} {'s':>5}  how"]
    imports = max(start_s - PROBE_S, 0.0)
    lines.append(f"  {0:5.0f} {imports:5.0f}  {'':>7}  {'':>5}  {'(imports: the budget counts them)':<38} "
                 f"{imports:5.0f}")
    lines.append(f"  {imports:5.0f} {start_s:5.0f}  {'alone':>7}  {'':>5}  {'(probe: the device and one context)':<38} "
                 f"{start_s - imports:5.0f}")
    for entry in plan["entries"]:
        name, shape, part = entry["name"], shapes[entry["name"]], seconds[entry["name"]]
        job = jobs[name]
        path = shape.get("path", "generate")
        origin = "" if path == "generate" else f", {speed.step_ms_from(shape)}"
        compiled = ""
        if path == "static-compiled":
            compiled = (f" + compile {speed.compile_s:.0f} s" + ("" if path in speed.path_from else
                                                                 " (a guess: 60-120 s)"))
        how = (f"{shape.get('generations', shape['steps'])} x {shape['decode_steps']} decode steps x "
               f"{speed.step_ms(shape):.0f} ms (batch {shape['generation_batch']}{origin}){compiled} = "
               f"{part['generation']:.0f} s + training {part['training']:.0f} + setup {part['setup']:.0f} + "
               f"start {part['start']:.0f}")
        if shape.get("generation_only"):
            how += "; generation only"
        if shape["tool_rounds"]:
            how += f"; {shape['tool_rounds']} forced tool rounds"
        if job.get("doctor", {}).get("stage") == "oom":
            how += f"; stops at its OOM in {job['doctor']['target']}"
        elif shape.get("expected_oom"):
            how += (f"; estimated {shape['estimate_gib']:.1f} GiB, more than its card: expected to stop at an OOM in "
                    f"{shape['expected_oom']}")
        if job.get("twin_of"):
            how = f"the check's twin, beside the others; {how}"
        if job.get("check"):
            how = f"the side-by-side check, alone first; {how}"
        if job.get("dashboard"):
            how += "; saves the dashboard"
        at_once = "alone" if entry.get("alone") else entry["at_once"]
        lines.append(f"  {entry['start']:5.0f} {entry['end']:5.0f}  {str(at_once):>7}  {entry['footprint']:5.1f}  "
                     f"{name:<38} {entry['seconds']:5.0f}  {how}")
    if plan["dropped"]:
        lines.append(f"  left for a later run (past the budget): {', '.join(j['name'] for j in plan['dropped'])}")
    for name, why in (refused or {}).items():
        lines.append(f"  refused: {name}: {why}")
    limit = f" of the {disk_gb:.0f} GB it may use" if disk_gb < math.inf else ""
    lines.append(f"  disk: random-weight folders, one per architecture and dtype, each deleted when its last row "
                 f"ends: {plan.get('disk_peak_gb', 0):.1f} GB at the peak{limit}")
    if measured:
        lines.append(f"  already measured at today's settings: {', '.join(measured)}")
    lines.append(f"{plan['end']:.0f} s in all, {plan['at_once']} at once")
    return "\n".join(lines)
