"""The rows of ``python -m bench gpu``'s results folder: read, written, shown, and the OOM doctor's caps and verdicts.

:func:`recorded_rows` reads ``measurements.json``; :func:`write_rows` adds rows to it and writes
``measurements.csv`` again, each file replaced whole; :func:`show_row` is a row's line in the log. The OOM
doctor's capped rows take their cap from their base row (:func:`doctor_cap`, :func:`doctor_spec`), and its fix
rows get a verdict (:func:`doctor_verdict`). :mod:`bench.gpu` (the plan, the command) and :mod:`bench.gpu_run`
(the run) both read and write rows through this module, which imports neither.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from bench.gpu_measure import COLUMNS, PHASE_ORDER
from labkit.memory import GIB
from labkit.models import write_whole

__all__ = ["CAP_POSITION", "rehearsed_presets", "doctor_cap", "doctor_spec", "doctor_verdict", "recorded_rows",
           "write_rows", "show_row"]

CAP_POSITION = 0.6  # the cap sits 60 % of the way from the earlier phases' peak to the target phase's


def rehearsed_presets() -> dict:
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


def write_rows(results: Path, rows: list[dict], *, replace: bool = False) -> None:
    """Add ``rows`` to ``measurements.json`` (the full records: the OOM report, the settings; ``replace``: write
    ``rows`` as the whole file) and write ``measurements.csv`` again from it (its columns); each file is replaced
    whole, so a kill leaves the old one or the new one, never half of one."""
    json_path, csv_path = results / "measurements.json", results / "measurements.csv"
    every = rows if replace else recorded_rows(results) + rows
    write_whole(json_path, json.dumps(every, indent=1) + "\n")

    def write_csv(tmp: Path):
        with tmp.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows({k: r.get(k) for k in COLUMNS} for r in every)

    write_whole(csv_path, write_csv)


def show_row(row: dict) -> str:
    """Return one line that says how a row ended: its status, its memory against its card and estimate, its speed."""
    if row["status"] in ("error", "cut", "not isolated", "over planner cap"):
        return f"{row['name']:<34} {row['status']}: {row.get('error')}"
    peak = row.get("peak_allocated_gib")
    mem = (f"peak {peak:.2f} GiB allocated, {row['peak_reserved_gib']:.2f} reserved"
           + (f" (+{row['context_gib']:.2f} context) of {row['cap_gib'] + row['context_gib']:.2f}"
              if row.get("cap_gib") and row.get("cap_from") == "card" else "")
           + f"; estimate {row['estimated_total_gib']:.2f} ({row['estimate_error_pct']:+.1f} %)"
           if peak is not None else "no CUDA memory (CPU)")
    tools = (f", {row['tool_rounds']:g} tool rounds, longest prompt {row['longest_prompt_tokens']} tokens"
             if row.get("tool_rounds") is not None else "")
    if row.get("side_by_side"):
        return f"{row['name']:<34} {row['status']}{' in ' + str(row['oom_phase']) if row.get('oom_phase') else ''}: " \
               f"{mem}{tools} (beside {row['side_by_side']} other rows: memory only)"
    speed = f", {row['generation_tokens_per_s']:.0f} completion tok/s" if row.get("generation_tokens_per_s") else ""
    if row.get("ms_per_decode_step"):  # a speed row (bench.gpu_speed): steady state, and the first generation apart
        speed += (f" ({row.get('generation')}, {row['ms_per_decode_step']:.1f} ms a decode step"
                  + (f", {row['bandwidth_share']:.1%} of the card's bandwidth limit" if row.get("bandwidth_share") else "")
                  + (f"; compiled in {row['compile_s']:.0f} s" if row.get("compile_s") is not None else "")
                  + (f"; merged adapters {row['merged_tokens_per_s']:.0f} tok/s" if row.get("merged_tokens_per_s") else "")
                  + (f"; laptop limit {row['laptop_limit_tokens_per_s']:.0f} tok/s, an estimate"
                     if row.get("laptop_limit_tokens_per_s") else "") + ")")
    return f"{row['name']:<34} {row['status']}{' in ' + str(row['oom_phase']) if row.get('oom_phase') else ''}: " \
           f"{mem}{tools}{speed}, {row['wall_s']} s"
