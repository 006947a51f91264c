"""One row of ``python -m bench gpu``, measured in a fresh process (:mod:`bench.worker` runs :func:`measure`): a preset,
a grid row or a doctor row for a few real GRPO steps on a CUDA card, peak memory and seconds per phase.

:mod:`bench.gpu` plans the rows, runs each here in a process of its own (several side by side, each under its own
cap), and writes what they return. A tool recipe's rounds are forced (:mod:`bench.forced_tools`).
"""
from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from pathlib import Path

from bench.gpu_speed import SPEED_COLUMNS
from labkit.memory import GIB
from labkit.training import PhaseTracker

__all__ = ["measure", "PhasePeaks", "bench_preset", "row_precision", "model_folder_name", "folder_gb", "shared_model",
           "card_reader", "watch_generations", "generation_columns", "percent_error", "loader_of", "process_gpu_bytes", "LABEL",
           "SIDE_BY_SIDE_LABEL", "TINY_SHAPE", "PHASE_ORDER", "COLUMNS", "SECONDS_COLUMNS"]

LABEL = "measured on {device}, random weights, every completion at max_completion_length"
SIDE_BY_SIDE_LABEL = "; memory only: measured beside {others} other row(s), its seconds are not timings"
TINY_SHAPE = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=512)
PHASE_ORDER = ("generation", "scoring", "forward", "backward", "optimizer")
COLUMNS = [
    "date", "part", "name", "label", "status", "model", "method", "precision", "card", "cap_gib", "context_gib",
    "per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size", "num_generations",
    "max_prompt_length", "max_completion_length", "optim", "gradient_checkpointing", "generation", "loader", "weights_4bit", "embedding_dtype",
    "steps_done", "completion_mean_length", "side_by_side", "cap_from", "context_from", "tool_rounds",
    "longest_prompt_tokens",
    "peak_allocated_gib", "peak_reserved_gib", "peak_with_context_gib", "peak_card_gib", "fits", "fraction_of_card", "oom_phase",
    *[f"{p}_{k}" for p in PHASE_ORDER for k in ("s", "allocated_gib", "reserved_gib")],
    "training_allocated_gib", "generation_tokens_per_s", "generation_mode", "cudagraph_recorded_after_first",
    *SPEED_COLUMNS,
    "estimated_total_gib", "estimated_generation_gib", "estimated_training_gib", "estimate_error_pct",
    "estimate_generation_error_pct", "estimate_training_error_pct",
    "rehearsed_peak_gib", "rehearsal_error_pct", "first_change", "fits_after_first_change", "measured_fall_gib",
    "predicted_fall_gib", "wall_s",
    "device", "driver", "cuda", "torch", "transformers", "trl", "peft", "bitsandbytes", "error",
]
# What a row measured beside other rows does not report as timings (bench.gpu moves them under "seconds_beside").
SECONDS_COLUMNS = [*(f"{p}_s" for p in PHASE_ORDER), "generation_tokens_per_s", "ms_per_decode_step", "bandwidth_share",
                   "first_extra_s", "compile_s", "merged_tokens_per_s", "wall_s"]


# --------------------------------------------------------------------------- one measurement (worker side)


class PhasePeaks(PhaseTracker):
    """Peak CUDA memory and seconds of each phase of a TRL GRPO step, phase by phase.

    The OOM doctor's :class:`labkit.training.PhaseTracker` (``_generate`` -> generation, its return ->
    scoring, ``compute_loss`` -> forward, its return -> backward, the optimiser callbacks -> optimizer),
    with one addition: at each change of phase it reads ``max_memory_allocated`` and
    ``max_memory_reserved`` for the phase that ends and resets them, so each phase's figure is its own
    peak. A running :class:`labkit.monitor.VRAMMonitor` (the dashboard's) gets the same phase marks.
    """

    def __init__(self, cuda: bool, monitor=None, *, card_used=None):
        self.cuda, self.monitor, self.card_used = cuda, monitor, card_used
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
            used = self.card_used() if self.card_used else None
            if used is not None:  # the card's figure less the allocator's: context, cuBLAS, Triton, paged states
                outside = used - torch.cuda.memory_reserved()
                row["card"] = max(row.get("card", 0), row["reserved"] + outside)
            torch.cuda.reset_peak_memory_stats()


def _driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # no NVML: a CPU, or a machine without the driver's library
        return None


def process_gpu_bytes() -> int | None:
    """Return the GPU memory NVML counts for this process (its context, PyTorch's reserved and anything else it
    holds there), or None where NVML does not list this process (no NVML, or a container whose process ids NVML
    does not see)."""
    import os

    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]))
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
    except Exception:  # no NVML, a device index NVML numbers otherwise: not this process's figure
        return None
    return None


def card_reader(beside: bool):
    """Return a function that reads this process's memory on the card, outside the allocator's books: NVML's
    figure for this process where NVML lists it, else (alone on the device only) ``mem_get_info``'s used memory;
    None where neither can say (beside other rows without per-process NVML)."""
    import torch

    def alone() -> int:
        free, total = torch.cuda.mem_get_info()
        return total - free

    if process_gpu_bytes() is not None:
        return process_gpu_bytes
    return None if beside else alone


def watch_generations(trainer) -> list[dict]:
    """Wrap ``trainer._generate_single_turn`` (over the generation clock, if any) and return the list it fills, one
    dict a call: ``mode`` ("train" or "eval", the model's mode during the call: dropout runs in train mode only)
    and ``cudagraph_recorded``, the rise of torch's own counter ``counters["inductor"]
    ["cudagraph_recorded_non_static_inputs"]`` (torch/_inductor/cudagraph_trees.py 996: it rises at each new
    recording of a CUDA graph, so a warm path that replays its graphs leaves it where it was)."""
    from torch._dynamo.utils import counters

    calls: list[dict] = []
    inner = trainer._generate_single_turn  # noqa: SLF001 - what TRL 1.16 calls for every generation

    def generate(*args, **kwargs):
        before = counters["inductor"]["cudagraph_recorded_non_static_inputs"]
        calls.append({"mode": "train" if trainer.model.training else "eval"})
        out = inner(*args, **kwargs)
        calls[-1]["cudagraph_recorded"] = counters["inductor"]["cudagraph_recorded_non_static_inputs"] - before
        return out

    trainer._generate_single_turn = generate  # noqa: SLF001
    return calls


def generation_columns(calls: list[dict]) -> dict:
    """Return the row's columns from :func:`watch_generations`' calls: the mode its generations ran in, and the CUDA
    graph recordings after the first generation (0: the graphs were replayed; more: each generation recorded again)."""
    modes = sorted({c["mode"] for c in calls})
    return dict(generation_mode="/".join(modes) or None,
                cudagraph_recorded_after_first=sum(c.get("cudagraph_recorded", 0) for c in calls[1:]) if calls else None)


def row_precision(spec: dict, *, cuda: bool) -> str:
    """Return the precision a row trains in: the spec's, else the preset's, else its card's choice (fp32 on a CPU)."""
    from labkit.device import choose_precision
    from labkit.presets import card_device

    preset, card = bench_preset(spec), card_device(spec["preset"])
    return spec.get("precision") or (preset.precision or choose_precision(card) if cuda and card else "fp32")


def model_folder_name(preset, precision: str, *, tiny: bool = False) -> str:
    """Return the name of the random-weight folder a row loads: one per (architecture, dtype saved), shared by
    every row that loads it. The weights are saved in the row's 16-bit dtype (fp32 on a CPU): a full fine-tuning row
    loads them in fp32 (:func:`labkit.device.torch_dtype`), which needs their shapes, not their values."""
    dtype = _saved_dtype(precision)
    return f"{preset.model.replace('/', '--').replace(':', '-')}-{dtype}{'-tiny' if tiny else ''}"


def _saved_dtype(precision: str) -> str:
    return {"fp16": "float16", "fp32": "float32"}.get(precision, "bfloat16")


def folder_gb(params: float, folder_name: str) -> float:
    """Return the disk (GB) a random-weight folder of ``params`` parameters takes (2 or 4 bytes a parameter)."""
    return params * (4 if "-float32" in folder_name else 2) / 1e9


def shared_model(folder: Path, preset, precision: str, *, device: str, tiny: bool = False) -> str:
    """Return ``folder``, a random-weight copy of the preset's architecture, saving it first if no row has: the
    first row that needs it saves it (into a temporary name, then renamed whole) while the others wait on a lock."""
    import fcntl

    import torch

    from bench.preset import save_random_architecture
    from labkit.models import resolve_model

    if preset.model.startswith("tiny:"):
        return resolve_model(preset.model)
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "config.json").exists():
            part = folder.with_name(f"{folder.name}.part")
            shutil.rmtree(part, ignore_errors=True)
            dtype = getattr(torch, _saved_dtype(precision))
            save_random_architecture(preset.model, part, dtype=dtype, device=device, **(TINY_SHAPE if tiny else {}))
            part.rename(folder)
    return str(folder)


def bench_preset(spec: dict):
    """Return the preset a spec measures: a named preset with ``overrides`` (the grid's, the doctor's), then the
    OOM doctor's ``change`` (``Preset.apply``: GRPOConfig fields such as ``steps_per_generation`` too)."""
    from labkit.presets import get_preset

    return get_preset(spec["preset"], **spec.get("overrides", {})).replace(**spec.get("change") or {})


def loader_of(preset) -> str | None:
    """Return who loaded a QLoRA row's model: ``"trl"`` (GRPOTrainer from the quantization_config, the default)
    or ``"labkit-prepare-kbit"`` (labkit's loader with PEFT's ``prepare_model_for_kbit_training``)."""
    if preset.method != "qlora":
        return None
    return "labkit-prepare-kbit" if preset.prepare_model_for_kbit_training else "trl"


def measure(spec: dict) -> dict:
    """Return one row of ``bench gpu``: GRPO steps of ``spec``'s preset through ``build_run``, phase by phase.

    Runs in a fresh process (``python -m bench.worker gpu SPEC``). ``spec``: ``preset`` (a name),
    ``overrides`` (preset fields), ``config`` (extra ``GRPOConfig`` values), ``steps``, ``cap`` ("card":
    the preset's card less the CUDA context; a number: a cap in GiB, the OOM doctor's or the planner's, as
    ``cap_from`` says; None: the whole device), ``precision`` (default: the preset card's), ``tiny`` (a two-layer
    model on the CPU), ``dashboard`` (a folder for its picture and record), ``side_by_side`` (other rows may run on
    the device at the same time: the context is then this process's own in NVML, else ``context_gib``, the
    parent's probe of one context measured alone; NVML's whole-device figure is kept off the dashboard).
    A tool recipe's rounds are forced (:mod:`bench.forced_tools`): the row records the rounds TRL took
    (``tool_rounds``, its ``tools/call_frequency``) and the longest prompt a ``generate`` call saw.
    """
    import torch

    from bench.preset import fixed_length_prompts, card_cap_fraction
    from labkit.device import detect_device
    from labkit.lab import provenance
    from labkit.models import load_tokenizer
    from labkit.oom import TrainingOutOfMemory, estimate
    from labkit.presets import card_device, resolve_plan
    from labkit.run import build_run
    from labkit.training import LogRecorder

    tiny = bool(spec.get("tiny"))
    cuda = torch.cuda.is_available() and not tiny
    device = detect_device("cuda" if cuda else "cpu")
    preset = bench_preset(spec)
    card = card_device(spec["preset"])
    precision = row_precision(spec, cuda=cuda)
    preset = preset.replace(precision=precision)
    plan = resolve_plan(preset, card)  # what the estimate and the rehearsal plan for: the preset on its card
    row = dict(part=spec["part"], name=spec["name"], model=preset.model, method=preset.method, precision=precision,
               card=card.name if card else None, generation=preset.generation,
               loader=loader_of(preset),
               **{k: plan.config[k] for k in ("per_device_train_batch_size", "gradient_accumulation_steps")},
               generation_batch_size=plan.preset.generation_batch_size, num_generations=plan.config["num_generations"],
               max_prompt_length=preset.max_prompt_length,
               **{k: plan.config[k] for k in ("max_completion_length", "optim")},
               gradient_checkpointing=plan.config["activation_checkpointing"])  # the CSV's column name
    context = cap_gib = context_from = cap_from = None
    beside = bool(spec.get("side_by_side"))
    if cuda:
        torch.empty(1, device="cuda")  # the context exists from here on
        free, total = torch.cuda.mem_get_info()
        own = process_gpu_bytes() if beside else None
        if not beside:  # alone on the device: everything in use but PyTorch's reserved is this process's context
            context, context_from = (total - free - torch.cuda.memory_reserved()) / GIB, "mem_get_info, alone"
        elif own is not None:  # beside other processes mem_get_info counts theirs too; NVML names this one's
            context, context_from = (own - torch.cuda.memory_reserved()) / GIB, "NVML, this process"
        else:
            context, context_from = spec.get("context_gib"), "the probe's context, measured alone"
        if beside:  # the dashboard's gauge would read NVML's whole device, every other row's memory included
            import labkit.monitor

            labkit.monitor.nvml_reader._module = False  # noqa: SLF001 - PyTorch's own figures for this process only
        if spec.get("cap") == "card" and card is not None:
            cap_gib, cap_from = card.total_memory_gib - (context or 0), "card"  # what PyTorch can have of that card
        elif isinstance(spec.get("cap"), (int, float)):  # the OOM doctor's cap between two phases, or the planner's
            cap_gib, cap_from = float(spec["cap"]), spec.get("cap_from", "doctor")
        if cap_gib is not None:
            torch.cuda.set_per_process_memory_fraction(card_cap_fraction(cap_gib, total))
    row.update(cap_gib=cap_gib, context_gib=context, context_from=context_from, cap_from=cap_from)

    est = estimate(plan)
    row.update(estimated_total_gib=est.total, estimated_generation_gib=est.generation_phase,
               estimated_training_gib=est.training_phase)
    folder = Path(tempfile.mkdtemp(prefix="labkit-gpu-"))
    recorder = LogRecorder(("num_tokens", "completions/mean_length", "tools/call_frequency"))
    monitor = dashboard = peaks = forced = run = states = None
    generations: list[dict] = []
    started = time.perf_counter()
    try:
        path = shared_model(Path(spec.get("models") or folder) / model_folder_name(preset, precision, tiny=tiny),
                            preset, precision, device="cuda" if cuda else "cpu", tiny=tiny)
        bench = preset.replace(model=path, max_steps=spec.get("steps", 2), save_strategy="no")
        tokenizer = load_tokenizer(path)
        n = max(8, math.ceil(bench.prompts_per_step) * bench.config["max_steps"] * 2)
        tools = None
        if preset.environment:  # a tool recipe: prompts with the tool schema, exactly max_prompt_length tokens
            from bench import forced_tools
            from labkit.environments import ENVIRONMENTS, environment_tools

            tools = environment_tools(ENVIRONMENTS[preset.environment]())
            forced_tools.prepare(tokenizer, tools)
            dataset = forced_tools.tool_prompts(tokenizer, tools, n, bench.max_prompt_length)
        else:
            dataset = fixed_length_prompts(tokenizer, n, bench.max_prompt_length)
        callbacks = [recorder]
        if spec.get("dashboard"):
            from labkit.dashboard import LiveDashboard
            from labkit.monitor import VRAMMonitor

            monitor = VRAMMonitor(interval_s=0.05).start()
            dashboard = LiveDashboard(title=f"{spec['name']} on {device.name} (random weights)", frontend="none",
                                      total_steps=bench.config["max_steps"], monitor=monitor, autoshow=False, tick_s=None,
                                      budget_gib=card.total_memory_gib if card and cuda else None)
            callbacks.append(dashboard)
        peaks = PhasePeaks(cuda, monitor, card_used=card_reader(beside) if cuda else None)
        config = dict(spec.get("config", {}))
        if preset.generation != "continuous":  # continuous batching drops min_new_tokens: its lengths are its own
            config.setdefault("generation_kwargs", {"min_new_tokens": bench.config["max_completion_length"]})
        run = build_run(bench, folder / "run", device=device, tokenizer=tokenizer, train_dataset=dataset,
                        callbacks=callbacks, print_logs=False, **config)
        peaks.install(run.trainer)
        generations = watch_generations(run.trainer)
        if tools:  # random weights write no call: force one per turn, max_tool_calling_iterations rounds
            forced = forced_tools.install(run.trainer, tokenizer, tools,
                                          rounds=preset.config.get("max_tool_calling_iterations"),
                                          budget=plan.config["max_completion_length"])
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
            if (spec.get("speed") or {}).get("mode") == "generation only":  # bench.gpu_speed: no training step
                from bench.gpu_speed import generate_only

                states = generate_only(run, spec, dataset, peaks)
            else:
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
        record = _dashboard_record(dashboard, monitor)
        if beside:  # its memory is its own (PyTorch's figures); its seconds were shared with the other rows
            record["note"] = ("measured beside other rows of bench gpu's side-by-side run: memory is this process's "
                              "own (PyTorch's figures, no whole-GPU NVML line); the time axis is stretched by the others")
        (out / f"dashboard_{spec['name']}.json").write_text(json.dumps(record) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    _phase_columns(row, peaks.peaks if peaks else {}, cuda)
    row.update(generation_columns(generations))
    if cuda and peaks:
        row["phase_peaks_gib"] = {name: round(p["allocated"] / GIB, 3) for name, p in peaks.peaks.items()}
    lengths = [x for x in recorder.values["completions/mean_length"] if x == x]
    row["steps_done"] = len(recorder.values["step_time"])
    if forced is not None:
        calls = [x for x in recorder.values["tools/call_frequency"] if x == x]
        row.update(tool_rounds=round(sum(calls) / len(calls), 2) if calls else None,
                   longest_prompt_tokens=forced.longest_prompt, forced_tools=forced.summary(),
                   estimated_sequence_tokens=est.settings.get("generation_tokens"))
    row["completion_mean_length"] = round(sum(lengths) / len(lengths), 1) if lengths else None
    gen_s = row.get("generation_s")
    if gen_s and lengths:
        count = peaks.peaks["generation"]["count"]
        row["generation_tokens_per_s"] = round(row["completion_mean_length"] * bench.generation_batch_size * count
                                               / gen_s, 1)
    if spec.get("speed") and run is not None and row["status"] != "error":  # bench.gpu_speed: the clock's figures
        from bench.gpu_speed import speed_columns

        try:
            row.update(speed_columns(run.generation, spec, run.trainer.model.config, states))
            calls = run.generation.calls
            if row["speed_mode"] == "generation only" and calls:  # no step logged its lengths: the clock's calls
                row["completion_mean_length"] = round(sum(c["tokens"] for c in calls)
                                                      / sum(c["sequences"] for c in calls), 1)
        except Exception as exc:  # the row's memory and seconds stand; say what is missing
            row["error"] = f"speed columns: {type(exc).__name__}: {exc}"[:400]
    row.update(_compare(row))
    info = provenance(device)
    row.update(date=info["date"], device=device.name, driver=_driver(), cuda=torch.version.cuda,
               label=LABEL.format(device=device.name) if cuda else "CPU rehearsal of the command (--tiny): no memory "
                                                                  "measured", settings=preset.to_dict(),
               side_by_side=spec.get("side_by_side"),
               **{k: info["versions"].get(k) for k in ("torch", "transformers", "trl", "peft", "bitsandbytes")})
    if spec.get("speed"):
        from bench.gpu_speed import speed_label

        row["label"] = speed_label(row, device.name, cuda=cuda)
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
        cards = {name: p["card"] for name, p in peaks.items() if p.get("card") is not None}
        row["phase_card_gib"] = {name: round(v / GIB, 3) for name, v in cards.items()} or None
        row["peak_card_gib"] = round(max(cards.values()) / GIB, 3) if cards else None
        training = [row[f"{p}_allocated_gib"] for p in ("scoring", "forward", "backward", "optimizer")
                    if row[f"{p}_allocated_gib"] is not None]
        row["training_allocated_gib"] = max(training) if training else None


def percent_error(estimated, measured):
    return round(100 * (estimated - measured) / measured, 1) if estimated is not None and measured else None


def _compare(row: dict) -> dict:
    """Return the row's verdicts: fits (reserved + context within the memory it was given: the card, or the OOM
    doctor's cap plus the context), and the estimate's errors."""
    out = {}
    if row.get("peak_reserved_gib") is not None:
        with_context = row["peak_reserved_gib"] + (row.get("context_gib") or 0)
        out["peak_with_context_gib"] = round(with_context, 3)
        # what the card held: the allocator's reserved plus what was read outside it at each phase's end (cuBLAS,
        # bitsandbytes, Triton and paged 8-bit AdamW's managed memory load after the context is read)
        on_card = row.get("peak_card_gib") if row.get("peak_card_gib") is not None else with_context
        if row.get("cap_gib") is not None:  # a card's cap is that card less the context: the sum is the card
            given = row["cap_gib"] + (row.get("context_gib") or 0)
            out["fits"] = row["status"] == "ok" and on_card <= given + 1e-6
            out["fraction_of_card"] = round(on_card / given, 3)
        out["estimate_error_pct"] = percent_error(row["estimated_total_gib"], row["peak_allocated_gib"])
        out["estimate_generation_error_pct"] = percent_error(row["estimated_generation_gib"], row.get("generation_allocated_gib"))
        out["estimate_training_error_pct"] = percent_error(row["estimated_training_gib"], row.get("training_allocated_gib"))
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
