"""The speed part of ``python -m bench gpu``: how fast each generation path makes the ``laptop-16gb`` completions.

The rows, most valuable first (a budget cut drops the last ones; :func:`speed_jobs`):

1. **A full GRPO step per path** (``speed-generate``, ``speed-static-compiled``, ``speed-continuous``): the
   ``laptop-16gb`` preset (Qwen2.5-1.5B with LoRA, a generation batch of 96, 786-token completions) with its
   ``generation`` field set (:data:`labkit.generation.PATHS`; never raw GRPOConfig keys), 2 optimiser steps under
   the laptop's 15.7 GiB cap: seconds and peak memory per phase, as the preset rows, and from the run's
   :class:`labkit.generation.GenerationClock`: completion tokens a second and ms per decode step at steady state
   (the generations after the first), the first generation's extra seconds (``first_extra_s``; ``compile_s`` on
   ``static-compiled``, which compiles then), and the share of the measuring card's memory-bandwidth limit.
2. **What PEFT costs** (``speed-peft-merged``): generation only, on ``generate``: a first generation, then one with
   the LoRA adapters merged into the weights (``merge_adapter``) and one unmerged: tokens a second both ways.
3. **The batch sweep** (``speed-sweep-PATH-bB``): generation only (no training step: the full steps above are
   the step's cost), generation batch 8, 32 and 96 (``per_device_train_batch_size`` 2, 8, 24 x 4 micro-batches),
   ``static-compiled`` then ``generate``: tokens a second and ms per decode step. Generation-only rows write
   :data:`SWEEP_COMPLETION`-token completions (not 786): ms per decode step is what compares, and the call is short.

``vllm`` is not measured (:data:`PENDING`). Every row is labelled with the measuring card ("... timings: bound by
the host; a laptop's differ") and carries ``laptop_limit_tokens_per_s``, an estimate: the RTX 3080 Laptop's
memory-bandwidth limit at the row's shapes (:func:`labkit.generation.card_limit`), never a measurement.
``continuous`` drops ``min_new_tokens``: its completions are not forced to full length; its row records their mean
length and says so. ``--tiny`` runs the same rows on a CPU with two-layer models, except the ``static-compiled``
sweep: a tiny compile takes about 30 s on a CPU (:data:`TINY_COMPILE_S`), so one compiled tiny row
(``speed-static-compiled``) is kept.
"""
from __future__ import annotations

__all__ = ["speed_jobs", "generate_only", "speed_columns", "speed_label", "PENDING", "SPEED_PRESET", "SWEEP_BATCHES",
           "SWEEP_COMPLETION", "LAPTOP_CARD", "SPEED_COLUMNS", "STEP_PATHS", "TINY_COMPILE_S"]

SPEED_PRESET = "laptop-16gb"
STEP_PATHS = ("generate", "static-compiled", "continuous")  # the full-step rows, in this order
SWEEP_PATHS = ("static-compiled", "generate")
SWEEP_BATCHES = (8, 32, 96)
SWEEP_COMPLETION = 256  # generation-only rows: a third of the recipe's 786, so that more of them fit a run
LAPTOP_CARD = "rtx3080-laptop-16gb"  # the card laptop-16gb is made for: its limit rides beside each row
TINY_COMPILE_S = 30  # measured: a tiny (two-layer) static-compiled row's first generation on this lab's 2-core CPU
PENDING = {"speed-vllm": "generation='vllm' is not measured: vLLM is not in the offline bundle (its wheel is about "
                         "300 MB; TRL 1.16 supports vLLM 0.22-0.31); measure it on a Linux GPU machine with network "
                         "(docs/gpu.md#speed)"}
# The columns the speed rows add (bench.gpu_measure.COLUMNS), after generation_tokens_per_s.
SPEED_COLUMNS = ["speed_mode", "generation_calls", "ms_per_decode_step", "bandwidth_share", "first_extra_s",
                 "compile_s", "graphs_after_first", "merged_tokens_per_s", "laptop_limit_tokens_per_s"]


def speed_jobs(shrink: dict, *, tiny: bool = False, steps: int = 2) -> list[dict]:
    """Return the speed rows' specs (:func:`bench.gpu_measure.measure`), most valuable first; ``shrink`` is
    ``--tiny``'s settings (empty on a GPU)."""
    from labkit.presets import get_preset

    accumulation = shrink.get("gradient_accumulation_steps", get_preset(SPEED_PRESET).config["gradient_accumulation_steps"])
    short = {} if tiny else {"max_completion_length": SWEEP_COMPLETION}

    def job(name, path, speed, **overrides):
        return dict(part="speed", name=name, preset=SPEED_PRESET, steps=steps, cap="card", generation=path,
                    overrides=dict(shrink, generation=path, **overrides), speed=speed)

    jobs = [job(f"speed-{path}", path, {"mode": "full step"}) for path in STEP_PATHS]
    jobs.append(job("speed-peft-merged", "generate", {"mode": "generation only",
                                                      "generations": ["unmerged", "merged", "unmerged"]}, **short))
    # static-compiled's small batches first (generate's flat ~80 ms a step is known); batch 96 last: the full steps
    # above measured it (at 786 tokens)
    order = [(p, b) for p in SWEEP_PATHS for b in SWEEP_BATCHES[:-1]] + [(p, SWEEP_BATCHES[-1]) for p in SWEEP_PATHS]
    for path, batch in order:
        if tiny and path == "static-compiled":  # one compiled tiny row is enough (TINY_COMPILE_S a row)
            continue
        jobs.append(job(f"speed-sweep-{path}-b{batch}", path, {"mode": "generation only",
                                                               "generations": ["unmerged", "unmerged"]},
                        per_device_train_batch_size=batch // accumulation, **short))
    return jobs


def generate_only(run, spec: dict, dataset, peaks) -> list[str]:
    """Generate a generation-only row's generations through TRL (``_generate_single_turn``, the clock's): one
    generation batch of the dataset's prompts, each repeated ``num_generations`` times as TRL's sampler does,
    with the LoRA adapters merged into the weights for the ones marked ``"merged"`` (``merge_adapter`` before,
    ``unmerge_adapter`` after, outside the clock). The model generates in train mode, as in a full step: the
    Trainer calls ``model.train()`` before each step (transformers/trainer.py 2072), so LoRA's dropout runs during
    a training step's generation; ``from_pretrained`` leaves the model in eval mode. Returns the adapters' state for
    each call, in order."""
    trainer = run.trainer
    trainer.model.train()
    count, per_prompt = trainer.args.generation_batch_size, trainer.num_generations
    prompts = [dataset[(i // per_prompt) % len(dataset)]["prompt"] for i in range(count)]
    prompt_ids, images, fields = trainer._tokenize_prompts(prompts)  # noqa: SLF001 - what TRL's _generate does
    states = list(spec["speed"]["generations"])
    peaks.phase = "generation"
    for state in states:
        if state == "merged":
            trainer.model.merge_adapter()
        try:
            trainer._generate_single_turn(prompt_ids, images, fields, per_prompt)  # noqa: SLF001 - the clock's
        finally:
            if state == "merged":
                trainer.model.unmerge_adapter()
    peaks.phase = "between steps"
    return states


def _rate(calls: list[dict]) -> tuple[float | None, float | None]:
    """Return (completion tokens a second, ms per decode step) of ``calls`` together."""
    seconds = sum(c["seconds"] for c in calls)
    if not calls or seconds <= 0:
        return None, None
    return (sum(c["tokens"] for c in calls) / seconds,
            1000 * seconds / max(1, sum(c["decode_steps"] for c in calls)))


def speed_columns(clock, spec: dict, model_config, states: list[str] | None = None) -> dict:
    """Return a speed row's columns from its run's :class:`labkit.generation.GenerationClock`: steady state (every
    generation after the first; unmerged ones only for the PEFT row, whose merged ones give
    ``merged_tokens_per_s``), the first generation's extra seconds, the share of the measuring card's bandwidth
    limit (a card of :data:`labkit.device.CARDS` only) and the laptop's limit at the same shapes (an estimate) for
    the model of ``model_config`` (its architecture, in 16-bit weights)."""
    from labkit.device import CARDS
    from labkit.generation import card_limit

    calls = clock.calls
    if not calls:
        return dict(speed_mode=spec["speed"]["mode"], generation_calls=0)
    states = states or ["unmerged"] * len(calls)
    steady = [c for c, s in zip(calls, states) if not c["first"] and s == "unmerged"] or calls[:1]
    merged = [c for c, s in zip(calls, states) if not c["first"] and s == "merged"]
    tokens_per_s, ms = _rate(steady)
    out = dict(speed_mode=spec["speed"]["mode"], generation_calls=len(calls), generation_tokens_per_s=round(tokens_per_s, 1),
               ms_per_decode_step=round(ms, 2), merged_tokens_per_s=round(_rate(merged)[0], 1) if merged else None)
    summary = clock.summary()
    extra = summary.get("first_extra_s")
    out["first_extra_s"] = round(extra, 2) if extra is not None else None
    out["compile_s"] = out["first_extra_s"] if clock.path == "static-compiled" else None
    # graphs torch.compile made after the first generation: 0 when the steady figures are steady; more means the
    # compiled path recompiled (after a training step, say) and its seconds include compilation
    out["graphs_after_first"] = sum(c.get("compiled", 0) for c in calls[1:])  # dynamo's; CUDA graphs: bench.gpu_measure
    out["bandwidth_share"] = None  # on a card of labkit.device.CARDS only
    if clock.bandwidth_gb_s:  # the measuring card's limit at each steady call's batch and context
        shares = [clock.figures(c)["bandwidth_share"] for c in steady]
        out["bandwidth_share"] = round(sum(shares) / len(shares), 4)
    n = len(steady)
    laptop = card_limit(model_config, CARDS[LAPTOP_CARD], batch=round(sum(c["sequences"] for c in steady) / n),
                        prompt_tokens=sum(c["prompt_tokens"] for c in steady) / n,
                        completion_tokens=sum(c["decode_steps"] for c in steady) / n)
    out["laptop_limit_tokens_per_s"] = round(laptop, 1)
    return out


def speed_label(row: dict, device_name: str, *, cuda: bool) -> str:
    """Return a speed row's label: where it was measured and how, that its timings are the measuring card's (bound
    by the host unless its bandwidth share says otherwise), and that the laptop's figure is an estimate."""
    from labkit.device import CARDS

    laptop = CARDS[LAPTOP_CARD]
    head = (f"measured on {device_name}, random weights" if cuda
            else "CPU rehearsal of the command (--tiny): no memory measured, random weights")
    if row.get("generation") == "continuous":
        forced = (f"completions not forced to max_completion_length (continuous batching drops min_new_tokens): mean "
                  f"length {row.get('completion_mean_length')} of {row.get('max_completion_length')}")
    else:
        forced = "every completion at max_completion_length"
    mode = (f"generation only ({row.get('generation_calls')} generations, no training step)"
            if row.get("speed_mode") == "generation only" else "full GRPO steps")
    mode += f", generating in {row.get('generation_mode') or 'an unrecorded'} mode"
    if row.get("cudagraph_recorded_after_first"):  # torch's counter rose after the first generation
        mode += "; CUDA graphs recorded again after the first generation (its seconds include recording)"
    share = row.get("bandwidth_share")
    bound = ("near the card's memory-bandwidth limit" if share is not None and share >= 0.5
             else "bound by the host")
    return (f"{head}; {forced}; {mode}; {device_name} timings: {bound}; a laptop's differ; "
            f"laptop_limit_tokens_per_s is an estimate (the {laptop.name}'s {laptop.bandwidth_gb_s:g} GB/s "
            "memory-bandwidth limit at these shapes), not a measurement")
