"""The run of one ``python -m bench gpu`` plan (:class:`bench.gpu_plan.RunPlan`) on the device: :class:`Runner`.

The side-by-side check's row alone first, then the pool, several workers at once (:mod:`bench.worker`), started
by :class:`bench.gpu_plan.Scheduler`'s rule on the real clock, then the rows that run alone (a row the planner's
cap was short for, again uncapped; the generation speeds). Each row is written as it ends
(:func:`bench.gpu_rows.write_rows`): a worker that dies or is killed loses its own row only, and a row still running at
the budget is killed and written as ``cut``. When the check's twin ends, its allocated peak is compared with the
row's alone (:func:`bench.gpu_plan.peaks_agree`); if they differ, the rows not started yet run one at a time and
the rows measured side by side count as not measured (``side_by_side_check: failed``).
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from bench.gpu_measure import SECONDS_COLUMNS, SIDE_BY_SIDE_LABEL, percent_error
from bench.gpu_rows import doctor_spec, doctor_verdict, recorded_rows, rehearsed_presets, show_row, write_rows

__all__ = ["Runner", "finish_row", "mark_check", "POLL_S"]

POLL_S = 0.2  # seconds between two looks at the workers


def finish_row(job: dict, row: dict, others: set, recorded: dict, rehearsed: dict) -> dict:
    """Return the row as written: the worker's answer with the doctor's verdict, the rehearsal, and, beside other
    rows, its seconds moved out of the timing columns."""
    if "name" not in row:  # the worker died, was killed or ran out of time: a row of its own says so
        row = dict(part=job["part"], name=job["name"], status=row.get("status", "error"), wall_s=None,
                   error=row.get("error", "")[:400])
    if job.get("doctor"):
        row["doctor"] = job["doctor"]
        if job["doctor"]["stage"] == "fix" and row["status"] in ("ok", "oom"):
            row.update(doctor_verdict(row, recorded))
    if job.get("twin_of"):
        row["twin_of"] = job["twin_of"]
    reh = rehearsed.get(job["name"]) if job["part"] == "presets" else None
    if reh and row.get("peak_allocated_gib"):
        row["rehearsed_peak_gib"] = float(reh["rehearsed_peak_gib"])
        row["rehearsal_error_pct"] = percent_error(row["rehearsed_peak_gib"], row["peak_allocated_gib"])
    row["side_by_side"] = len(others)
    if others:  # memory only: the others' kernels shared the GPU and its host, so these seconds are no timing
        row["seconds_beside"] = {k: row.get(k) for k in SECONDS_COLUMNS}
        row["beside"] = sorted(others)
        row.update({k: None for k in SECONDS_COLUMNS})
        if row.get("label"):
            row["label"] += SIDE_BY_SIDE_LABEL.format(others=len(others))
    if row["status"] == "oom" and job.get("cap_from") == "planner":  # the planner's guess was short: no finding
        row.update(status="over planner cap", error=f"out of memory under the planner's cap of {job['cap']:g} GiB "
                                                    f"(not a finding): measured again alone, uncapped, if time is left")
    return row


class Runner:
    """Run a :class:`bench.gpu_plan.RunPlan`: the check alone, the pool side by side, the rest alone.

    Every row is written as it ends (:func:`write_rows`); a worker that dies or is killed loses its own row only. A row
    still running at the budget is killed and written as ``cut``.
    """

    def __init__(self, plan, *, results: Path, budget_s: float, clock, say, cores: int, models: Path | None = None):
        self.plan, self.results, self.budget_s, self.clock, self.say = plan, results, budget_s, clock, say
        self.cores, self.models = cores, models
        self.disk = plan.disk()  # the random-weight folders in ``models``: each deleted when its last row ends
        self.unwritten: list[str] = []  # rows whose write failed (a full disk): kept in self.rows and the status
        self.rehearsed = rehearsed_presets()
        self.rows: list[dict] = []
        self.skipped: list[str] = []
        self.broken = 0
        self.check: dict = {}
        self.reruns: list[dict] = []
        self.running: dict = {}  # name -> [worker, job, footprint, names beside it, expected end]
        self.run_id = time.strftime("%Y-%m-%dT%H:%M:%S")  # marks this run's rows (the check's verdict goes to them)

    def _recorded(self) -> dict:
        return {r["name"]: r for r in recorded_rows(self.results)}

    def _written(self, job: dict, answer: dict, others: set) -> dict:
        row = finish_row(job, answer, others, self._recorded(), self.rehearsed)
        row["run"] = self.run_id
        if self.check.get("passed") is False and others:
            row["side_by_side_check"] = "failed"
        self.rows.append(row)
        self.save([row])
        self._ended(job["name"])
        self.broken += row["status"] in ("error", "cut")
        if row["status"] == "over planner cap":
            self.reruns.append(dict(job, cap=None, cap_from=None, side_by_side=False))
        self.say(show_row(row))
        return row

    def save(self, rows: list[dict], *, replace: bool = False) -> bool:
        """Write ``rows`` (:func:`write_rows`); a failed write (a full disk, say) costs those rows' files only: the run
        goes on, the rows stay in memory and in the status, and the log says so."""
        try:
            write_rows(self.results, rows, replace=replace)
            return True
        except OSError as exc:
            self.unwritten += [r["name"] for r in rows if r["name"] not in self.unwritten]
            self.say(f"could not write {', '.join(r['name'] for r in rows)} to {self.results}: {exc}; the run goes on")
            return False

    def _ended(self, name: str) -> None:
        """Delete the row's random-weight folder if no row left needs it."""
        folder = self.disk.end(name)
        if folder and self.models is not None:
            shutil.rmtree(self.models / folder, ignore_errors=True)

    def _start(self, job: dict, env: dict | None = None):
        from bench import worker

        self.disk.start(job["name"])
        if self.models is not None:
            job = dict(job, models=str(self.models))
        return worker.start("gpu", job, env)

    def _wait(self, job: dict):
        """Run ``job`` alone to its end (or the budget) and write its row."""
        proc = self._start(job)
        while not proc.poll():
            if self.clock() > self.budget_s:
                proc.kill()
                proc.answer()
                return self._written(job, dict(status="cut", error=f"stopped at the budget after "
                                                                    f"{proc.seconds():.0f} s"), set())
            time.sleep(POLL_S)
        return self._written(job, proc.answer(), set())

    def run_alone(self, jobs: list[dict]) -> None:
        """Run ``jobs`` one after another, each alone on the device, while its expected seconds fit."""
        for job in jobs:
            expected = self.plan.expected.get(job["name"]) or self.plan.expected.get(job.get("twin_of") or "", 0)
            if self.clock() + expected > self.budget_s:
                self.skipped.append(job["name"])
                continue
            row = self._wait(dict(job, side_by_side=False))
            if job.get("check"):
                self.check["alone"] = row

    def _resolve_doctor(self, scheduler) -> None:
        """Give each doctor row whose rows it waits for have ended its cap and change, or write why it cannot run."""
        from bench.gpu_cost import OUTSIDE_CAP_GIB

        for job in list(scheduler.waiting):
            stage = (job.get("doctor") or {}).get("stage")
            if stage not in ("oom", "fix") or job.get("resolved") or any(n not in scheduler.ended
                                                                          for n in job.get("after", ())):
                continue
            planned = doctor_spec(job, self._recorded())
            index = scheduler.waiting.index(job)
            if isinstance(planned, str):  # a finding too: written as a row of its own
                scheduler.waiting.remove(job)
                row = dict(part="doctor", name=job["name"], status="not isolated", error=planned, wall_s=0,
                           doctor=job["doctor"], run=self.run_id)
                self.rows.append(row)
                self.save([row])
                self.say(show_row(row))
                self._ended(job["name"])
                scheduler.end(job["name"])
                continue
            scheduler.waiting[index] = dict(planned, resolved=True)
            scheduler.footprints[job["name"]] = planned["cap"] + self.plan.context_gib + OUTSIDE_CAP_GIB

    def _check_verdict(self, twin_row: dict, scheduler) -> None:
        from bench.gpu_plan import peaks_agree

        alone = self.check.get("alone") or {}
        passed, words, slowdown = peaks_agree(alone, twin_row)
        self.check.update(passed=passed, verdict=words, slowdown=slowdown)
        if slowdown:  # the rows not started yet are timed with the slowdown this run measured
            scheduler.slowdown = max(slowdown, 1.0)
        if passed is None:  # a failed twin or row alone says nothing of side by side: the run goes on as planned
            self.say(f"side-by-side check: {words}; the run goes on side by side")
            return
        if passed:
            self.say(f"side-by-side check: {words}")
            return
        scheduler.at_once = 1
        self.check["passed"] = False
        self.say(f"side-by-side check: {words}; the rows not started yet run one at a time, and the rows measured "
                 "side by side so far count as not measured")
        self.mark_check("failed")

    def run_pool(self) -> None:
        """Run the pool: start what the scheduler allows, collect what ends, until nothing waits or runs."""
        from bench.gpu_plan import Scheduler

        plan = self.plan
        scheduler = Scheduler([dict(j) for j in plan.pool], footprints=dict(plan.footprints), expected=plan.expected,
                              device_gib=plan.device_gib, at_once=plan.at_once, deadline=self.budget_s,
                              slowdown=plan.slowdown, disk=self.disk)
        for job in plan.alone_first:
            scheduler.end(job["name"])
        threads = {"OMP_NUM_THREADS": max(1, self.cores // max(plan.at_once, 1))}
        while scheduler.waiting or self.running:
            now = self.clock()
            for name, (proc, job, _, others, _) in list(self.running.items()):
                if proc.poll() or now > self.budget_s:
                    if not proc.poll():
                        proc.kill()
                        answer = dict(status="cut", error=f"stopped at the budget after {proc.seconds():.0f} s")
                        proc.answer()
                    else:
                        answer = proc.answer()
                    del self.running[name]
                    row = self._written(job, answer, others)
                    scheduler.end(name)
                    if job.get("twin_of"):
                        self._check_verdict(row, scheduler)
            self._resolve_doctor(scheduler)
            started = scheduler.startable(now, {n: (r[2], r[4]) for n, r in self.running.items()})
            for folder in scheduler.freed:  # rows dropped for the budget: a folder no row left needs
                if self.models is not None:
                    shutil.rmtree(self.models / folder, ignore_errors=True)
            scheduler.freed.clear()
            for job in started:
                spec = dict(job, side_by_side=scheduler.at_once > 1, context_gib=plan.context_gib)
                for other in self.running.values():
                    other[3].add(job["name"])
                self.running[job["name"]] = [self._start(spec, threads), spec, scheduler.footprints[job["name"]],
                                             set(self.running), now + scheduler.seconds(job)]
            if not self.running and scheduler.waiting and not started:
                break  # what waits can never start: the rows it waits for were not measured
            time.sleep(POLL_S)
        self.skipped += [job["name"] for job in scheduler.dropped + scheduler.waiting]


    def mark_check(self, verdict: str) -> None:
        """:func:`mark_check` for this run's rows; a failed write costs the mark only."""
        try:
            mark_check(self.results, self.run_id, verdict)
        except OSError as exc:
            self.say(f"could not mark the side-by-side check ({verdict}) in {self.results}: {exc}")


def mark_check(results: Path, run_id: str, verdict: str) -> None:
    """Record the side-by-side check's verdict ("passed", "failed") in the rows of run ``run_id`` measured beside
    others (``side_by_side_check``; a failed check makes them count as not measured)."""
    rows = recorded_rows(results)
    for row in rows:
        if row.get("run") == run_id and row.get("side_by_side"):
            row["side_by_side_check"] = verdict
    write_rows(results, rows, replace=True)
