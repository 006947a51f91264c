"""Readers of what the lab recorded in ``results/``: the notebooks show measured figures through here.

The measurements themselves are made by the ``bench`` folder beside this package (``python -m bench NAME``);
this module only reads what they wrote. Introduced in ``04_lora_grpo_16gb.ipynb`` (memory in three columns)
and used again in ``05_full_vs_lora.ipynb``.
"""
from __future__ import annotations

import os

__all__ = ["memory_columns"]


def memory_columns(rehearsal_csv, memory_csv=None, kinds=("preset", "grid", "unsloth"), gpu_csv=None):
    """Return a table of peak memory in three columns: estimated, rehearsed (fake tensors), measured.

    ``rehearsal_csv`` is what ``python -m bench rehearsal`` writes. Measured peaks come from
    ``gpu_csv`` (default: ``gpu/measurements.csv`` beside ``rehearsal_csv``, written by
    ``python -m bench gpu``: the same preset or grid row at the same settings, on a real card) and
    from ``memory_csv`` (``python -m bench memory``: the same model, method, precision, G and
    completion length). The measured column is torch's ``max_memory_allocated``, the tensors the other two
    columns count; where nothing was measured it says a GPU is needed.
    """
    import pandas as pd

    if not os.path.exists(rehearsal_csv):
        return pd.DataFrame({"missing": [f"{rehearsal_csv}: run python -m bench rehearsal"]})
    rows = pd.read_csv(rehearsal_csv)
    rows = rows[(rows.status == "ok") & rows.kind.isin(kinds)]
    measured = {}
    if memory_csv is not None and os.path.exists(memory_csv):
        gpu = pd.read_csv(memory_csv)
        for _, m in gpu[(gpu.get("device_kind") == "cuda") & (gpu.get("status") == "ok")].iterrows():
            key = (m.model, m.method, m.precision, int(m.num_generations), int(m.completion_len))
            measured[key] = round(float(m.measured_peak_gib), 2)
    settings = ["model", "method", "precision", "per_device_train_batch_size", "gradient_accumulation_steps",
                "num_generations", "max_completion_length"]
    def same(value) -> str:  # 24 and 24.0 (a column with a blank reads as floats) are the same setting
        try:
            number = float(value)
            return str(int(number)) if number.is_integer() else str(number)
        except (TypeError, ValueError):
            return str(value)

    gpu_csv = gpu_csv or os.path.join(os.path.dirname(str(rehearsal_csv)), "gpu", "measurements.csv")
    by_name = {}
    if os.path.exists(gpu_csv):
        gpu = pd.read_csv(gpu_csv)
        for _, m in gpu[gpu.status == "ok"].dropna(subset=["peak_allocated_gib"]).iterrows():
            # a QLoRA row loaded by labkit ran PEFT's fp32 upcast (before 2026-11-26 the only QLoRA loader)
            upcast = str(m.get("loader")) in ("labkit", "labkit-prepare-kbit")
            by_name[m["name"]] = ((*(same(m[k]) for k in settings), upcast), round(float(m.peak_allocated_gib), 2))

    def measured_gib(row):
        found = by_name.get(row["name"])
        upcast = str(row.get("prepare_model_for_kbit_training", False)) == "True"
        if found and found[0] == (*(same(row[k]) for k in settings), upcast):
            return found[1]
        key = (row.model, row.method, row.precision, int(row.num_generations), int(row.max_completion_length))
        return measured.get(key, "needs a GPU")

    table = pd.DataFrame({
        "row": rows.name,
        "model": rows.model.str.split("/").str[-1],
        "method": rows.method,
        "precision": rows.precision,
        "G x len": [f"{g} x {c}" for g, c in zip(rows.num_generations, rows.max_completion_length)],
        "estimated GiB": rows.estimated_total_gib.round(2),
        "rehearsed GiB (fake tensors, full scale)": rows.rehearsed_peak_gib.round(2),
        "measured GiB (a real card, torch allocated)": [measured_gib(row) for _, row in rows.iterrows()],
    })
    return table.reset_index(drop=True)
