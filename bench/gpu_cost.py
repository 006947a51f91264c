"""The cost of one row of ``python -m bench gpu``: its shape, the memory it may take, and its expected seconds.

- :func:`job_shape` / :func:`preset_shape`: the figures of a row its cost depends on (layers, parameters, the
  generation batch, decode steps, micro-batches, tokens), from its preset.
- :func:`footprint_gib`: the device memory a row may take: its cap (the preset's card, the OOM doctor's cap, or for
  a row without one the cap chosen from the estimate, :func:`planner_cap`), its CUDA context and an allowance for
  what lives outside PyTorch's allocator (:data:`OUTSIDE_CAP_GIB`). :func:`expected_oom` says when a row is
  expected to stop at an out-of-memory error.
- :class:`SpeedModel`: the expected seconds of a row, fitted on the rows already measured alone
  (``results/gpu/measurements.json``): generation as decode steps x a per-step time that grows with the model's
  layers and, a little, with the generation batch (LoRA and QLoRA apart), the loss's passes by micro-batches and
  tokens x parameters, the setup by parameters, and the process start from the gaps between recorded rows.

:mod:`bench.gpu_plan` schedules the rows with these figures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["SpeedModel", "job_shape", "preset_shape", "footprint_gib", "planner_cap", "expected_oom",
           "OUTSIDE_CAP_GIB"]

OUTSIDE_CAP_GIB = 0.5  # per process, beside its cap and context: what PyTorch's allocator does not hold (bitsandbytes' paged states)
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
    from labkit.oom import estimate
    from labkit.presets import card_device, resolve_plan
    from labkit.memory import model_shape

    card = card_device(card_name)
    precision = precision or preset.precision or (choose_precision(card) if card else "fp32")
    plan = resolve_plan(preset.replace(precision=precision), card)
    shape = model_shape(plan.shape_name)
    completion = plan.config["max_completion_length"]
    rounds = preset.tool_rounds  # the estimate's rule, once
    est = estimate(plan)
    from bench.gpu_measure import folder_gb, model_folder_name

    folder = model_folder_name(preset, precision)
    return dict(layers=shape.num_layers, params_b=shape.params / 1e9, method=preset.method, completion=completion,
                heads=shape.num_heads, head_dim=shape.head_dim, prompt=preset.max_prompt_length,
                folder=folder, folder_gb=round(folder_gb(shape.params, folder), 2),
                path=preset.generation, generation_only=False, generations=steps,
                # forced tool rounds fill the budget, then the last round writes max_completion_length more
                decode_steps=completion * (2 if rounds else 1), tool_rounds=rounds,
                generation_batch=plan.preset.generation_batch_size, micro_batches=plan.config["gradient_accumulation_steps"],
                tokens=plan.preset.generation_batch_size * (preset.max_prompt_length + completion),
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
