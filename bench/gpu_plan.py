"""The plan of one ``python -m bench gpu`` run: what it measures, in which order, how many at once, how long.

A GPU run has a time budget (540 s from the process's start by default), and every pending row should fit in
it. Two measured facts make that possible: TRL's ``generate`` spends about 80 ms a decoding step whatever the batch
(the GPU idles: generation is host-bound), and a row's memory is capped per process
(``set_per_process_memory_fraction``), so several rows, each capped at its own card, can run at once in separate
processes on one large GPU. Each row's memory and seconds come from :mod:`bench.gpu_cost` (:class:`SpeedModel`,
:func:`footprint_gib`).

- :class:`Scheduler`: which rows start now: in the plan's order, while their memory fits beside the rows
  running, fewer than ``at_once`` run, what they wait for (the OOM doctor's base rows) has ended, and their
  expected seconds fit the time left. The plan (:func:`simulate`, on a clock of expected seconds) and the run
  (:mod:`bench.gpu`, on the real clock) use the same rule, so the run follows the printed plan.

The run: the side-by-side check first, alone (:data:`CHECK_ROW`, the cheapest row; its twin runs in the first
wave beside the others, the card's memory outside the allocator must agree within :data:`AGREE_PCT` and the
generation's seconds grow at most :data:`MAX_SLOWDOWN` times: :func:`peaks_agree`), then every memory row side
by side, then the rows that must run alone (the generation speeds). :func:`format_plan` prints it, ending with
``<N> s in all, <K> at once``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from bench.gpu_cost import OUTSIDE_CAP_GIB, SpeedModel, expected_oom, footprint_gib, job_shape, planner_cap

__all__ = ["Scheduler", "RunPlan", "build_plan", "choose_at_once", "simulate", "Disk", "measured_slowdown", "format_plan", "twin_of", "peaks_agree", "DEFAULT_DEVICE_GIB", "DEFAULT_CORES", "RESERVE_GIB",
           "DEFAULT_CONTEXT_GIB", "SIDE_BY_SIDE_SLOWDOWN", "CHECK_ROW", "AGREE_PCT", "PROBE_S",
           "IMPORT_S", "DISK_GB", "MAX_SLOWDOWN"]

DEFAULT_DEVICE_GIB = 79.1  # an H100 80GB as PyTorch reports it (an H200: about 139)
DEFAULT_CORES = 16  # --plan's host cores without --cores: the machine that measured the H100 rows had 16
RESERVE_GIB = 1.0  # left free on the device whatever runs
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
DISK_GB = 20.0  # the disk a plan may fill with random-weight folders (--disk-gb; less where less is free)


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
    card = f"a card of {device_gib:g} GiB" if device_gib < 1e5 else "a CPU (--tiny: no memory to plan)"
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
