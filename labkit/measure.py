"""Memory beside :func:`labkit.memory.estimate`: the bytes PyTorch holds and what autograd saves, counted on a live
model; the peaks the lab recorded in ``results/``; and the estimate's terms drawn against a card.

:func:`state_bytes` sums weights, gradients and optimiser states of a real model; :func:`saved_activation_bytes`
counts what autograd keeps for the backward pass of a forward. Both run on any device; the tests hold the estimator
to them (introduced in ``05_full_vs_lora.ipynb``). :func:`memory_columns` reads what ``python -m bench`` recorded:
the estimate beside the rehearsed and the measured peak (introduced in ``04_lora_grpo_16gb.ipynb``). The
measurements themselves are made by the ``bench`` folder beside this package; this module only reads them.
:func:`plot_breakdown` stacks an estimate's terms, phase by phase, under a card's memory (``05_full_vs_lora.ipynb``).
"""
from __future__ import annotations

import os

from labkit.device import Card, card as card_named
from labkit.memory import GIB, MemoryEstimate

__all__ = ["state_bytes", "saved_activation_bytes", "memory_columns", "plot_breakdown"]


def state_bytes(model, optimizer=None) -> dict:
    """Return ``{"weights", "gradients", "optimizer"}``: bytes held by a model's tensors, measured.

    Weights: every parameter once (tied weights once; bitsandbytes 4-bit weights by their packed
    storage plus quantisation constants). Gradients: every ``.grad`` that exists. Optimizer: every
    tensor in ``optimizer.state`` (once, however many parameters share it). The counterpart of
    :func:`estimate`'s exact terms; ``05_full_vs_lora.ipynb`` compares the two.
    """
    import torch

    weights = gradients = 0
    for p in model.parameters():  # tied weights once: parameters() skips repeats
        weights += p.numel() * p.element_size()
        quant_state = getattr(p, "quant_state", None)
        if quant_state is not None:
            weights += sum(t.numel() * t.element_size() for t in _tensors_of(quant_state))
        if p.grad is not None:
            gradients += p.grad.numel() * p.grad.element_size()
    states = {id(value): value for state in (optimizer.state.values() if optimizer is not None else ())
              for value in state.values() if isinstance(value, torch.Tensor)}
    return {"weights": weights, "gradients": gradients,
            "optimizer": sum(t.numel() * t.element_size() for t in states.values())}


def _tensors_of(quant_state):
    import torch

    found = []
    for value in vars(quant_state).values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif hasattr(value, "absmax"):  # nested state of double quantisation
            found.extend(_tensors_of(value))
    return found


def saved_activation_bytes(forward, exclude=None) -> int:
    """Return the bytes of the tensors autograd keeps for the backward pass of ``forward()``.

    Every tensor saved for backward is counted once, by its storage. ``exclude`` is a model (its
    parameters and buffers) or an iterable of tensors not to count, so that what remains is
    activation memory (the token ids an embedding keeps included). Gradient checkpointing hides
    what a checkpointed layer keeps from these hooks: measure without it. Used to check the
    activation formula of :func:`estimate` (``05_full_vs_lora.ipynb``, ``tests/test_memory.py``).
    """
    import torch
    from torch.autograd.graph import saved_tensors_hooks

    if isinstance(exclude, torch.nn.Module):
        exclude = [*exclude.parameters(), *exclude.buffers()]
    owned = {t.untyped_storage().data_ptr() for t in (exclude or ())}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in owned and storage.nbytes():
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    return sum(kept.values())


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


_STACK = {  # phase -> terms from bottom to top, with colours that stay the same in every plot
    "generation": ("weights", "reference", "optimizer", "kv_cache", "transients"),
    "training": ("weights", "reference", "optimizer", "gradients", "activations", "logits"),
}
_COLOURS = {"weights": "#4c72b0", "reference": "#8172b3", "optimizer": "#dd8452", "kv_cache": "#937860",
            "gradients": "#c44e52", "transients": "#8c8c8c", "activations": "#55a868", "logits": "#da8bc3"}


def plot_breakdown(estimates, labels=None, *, card="rtx3080-laptop-16gb", ax=None):
    """Return a matplotlib ``Axes``: stacked bars of each estimate's two phases against a card's memory.

    ``estimates`` is one :class:`MemoryEstimate` or a list; each gets a pair of bars (generation,
    training), stacked term by term in GiB, and a dashed line marks what ``card`` (a key of
    :data:`labkit.device.CARDS`, or a :class:`labkit.device.Card`) reports to PyTorch: a card sold as
    16 GB reports about 15.7 GiB, not 14.9. Used by the interactive estimator of ``05_full_vs_lora.ipynb``.
    """
    import matplotlib.pyplot as plt

    if isinstance(estimates, MemoryEstimate):
        estimates = [estimates]

    card = card if isinstance(card, Card) else card_named(card)
    labels = labels or [f"{e.settings['method']} {e.settings['per_device_train_batch_size']}x"
                        f"{e.settings['steps_per_generation']}" for e in estimates]
    if ax is None:
        _, ax = plt.subplots(figsize=(4.6 + 2 * len(estimates), 4), layout="constrained")
    positions, ticks, shown = [], [], set()
    for k, est in enumerate(estimates):
        for j, phase in enumerate(("generation", "training")):
            x = 2.6 * k + j
            bottom = 0.0
            for term in _STACK[phase]:
                height = est.bytes[term] / GIB
                if height <= 0:
                    continue
                ax.bar(x, height, bottom=bottom, color=_COLOURS[term], width=0.8,
                       label=term if term not in shown else None)
                shown.add(term)
                bottom += height
            positions.append(x)
            ticks.append(f"{labels[k]}\n{phase}" if len(estimates) > 1 else phase)
    # the card's line is named in the legend, which sits beside the bars: a label on the plot covered a bar
    ax.axhline(card.gib, color="black", linestyle="--", linewidth=1, label=f"{card.sold_as} card ({card.gib:g} GiB)")
    ax.set_xticks(positions, ticks, fontsize=9)
    ax.set_ylabel("GiB")
    if len(estimates) == 1:
        ax.set_xlabel(labels[0], fontsize=9)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return ax
