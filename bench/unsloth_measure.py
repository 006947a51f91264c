"""``python -m bench unsloth --random-weights``: plain TRL beside Unsloth on a 16 GB card's recipe, measured as
``python -m bench gpu`` measures its rows -> ``results/gpu/unsloth_vs_trl.csv`` (and ``.json``).

One row per (method, loader): :func:`bench.gpu_measure.measure`, the lab's GPU row, unchanged: the recipe's
architecture with random weights saved to a folder (:func:`bench.preset.save_random_architecture`; no download),
every completion forced to ``max_completion_length``, PyTorch capped at the recipe's card less the CUDA context
(:func:`bench.preset.card_cap_fraction`), peak allocated and reserved memory and seconds of each phase
(:class:`bench.gpu_measure.PhasePeaks`), generation tokens a second, the lab's estimate beside them. Only the
loader differs: ``trl`` hands GRPOTrainer the folder (notebook 04's path), ``unsloth`` loads that same folder with
``FastLanguageModel.from_pretrained`` (a local folder is how its loader takes a config rather than a hub id;
``use_exact_model_name=True``, ``fast_inference=False``) and ``get_peft_model``
(:func:`labkit.unsloth_path.load_unsloth_policy`), and both go through the same :func:`labkit.run.build_run`.
Both arms put LoRA on all seven projections (:data:`labkit.unsloth_path.COMPARISON_TARGETS`). Seconds per step are
TRL's ``step_time`` without the first step.

Each row runs in a fresh process (``python -m bench.unsloth_measure SPEC OUT``): a peak means something only in a
process that measured nothing before, and once unsloth is imported it has patched TRL and transformers for good.
Where Unsloth cannot run (no CUDA, not installed, versions outside its pins) its rows are skipped with the reason in
one line; ``--tiny`` rehearses the command on a CPU (two-layer model, plain-TRL side; no memory measured).
The environment is Unsloth's (``requirements-unsloth.txt``, or the offline bundle of :mod:`scripts.unsloth_bundle`):
both loaders then run the same TRL 1.15 and transformers 5.17.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from labkit.unsloth_path import BACKENDS as LOADERS
from labkit.unsloth_path import COMPARISON_TARGETS

__all__ = ["LOADERS", "METHODS", "RESULTS_CSV", "RESULTS_JSON", "RESULTS_LOG", "CAP_LABEL", "row_specs", "measure_loader",
           "run_row", "bench_loaders", "row_columns", "main"]

METHODS = ("qlora", "lora")  # QLoRA first: Unsloth's usual path on a 16 GB card or a T4
RESULTS_CSV, RESULTS_JSON, RESULTS_LOG = "unsloth_vs_trl.csv", "unsloth_vs_trl.json", "unsloth_runs.log"
CAP_LABEL = ("measured on {device} capped at {cap:.2f} GiB (a {card} less the CUDA context), random weights, every "
             "completion at max_completion_length; loaded by {loader}")
_VERSIONS = ("datasets", "unsloth", "unsloth_zoo")  # beside the torch / transformers / trl / peft / bitsandbytes a row has


def row_specs(preset: str = "workshop", methods=METHODS, loaders=LOADERS, *, steps: int = 3,
              tiny: bool = False) -> list[dict]:
    """Return the rows to measure, in order: for each method, each loader, as :func:`bench.gpu_measure.measure`
    specs (``cap="card"``: the preset's card less the CUDA context) with the ``loader`` to use."""
    overrides = {"target_modules": list(COMPARISON_TARGETS)}
    if tiny:  # bench gpu's CPU rehearsal sizes: two-layer model, short sequences, a few completions
        from bench.gpu import TINY_SETTINGS

        overrides.update(TINY_SETTINGS)
    return [{"part": "unsloth", "name": f"{preset}-{method}-{loader}", "preset": preset, "loader": loader,
             "overrides": {**overrides, "method": method}, "steps": steps, "cap": None if tiny else "card",
             "tiny": tiny} for method in methods for loader in loaders]


@contextlib.contextmanager
def _loaded_by(loader: str, recorder, seen: dict):
    """Within the block, :func:`labkit.run.build_run` (which :func:`bench.gpu_measure.measure` calls) also records
    each step's time, shows the loaders the capped card's free memory (:func:`_free_memory_of_the_card`) and, for
    ``loader="unsloth"``, hands the trainer the policy Unsloth loaded from the same folder."""
    import labkit.run

    original = labkit.run.build_run
    with contextlib.ExitStack() as restore:

        def build_run(preset, output_dir, **kwargs):
            kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), recorder]
            seen["loaders_see"] = _free_memory_of_the_card(restore)  # measure() has set the card's cap by now
            if loader == "unsloth":
                from labkit.unsloth_path import load_unsloth_policy

                model, tokenizer = load_unsloth_policy(preset, fast_inference=False, seed=preset.config["seed"])
                # Unsloth's checkpointing (inputs offloaded to CPU RAM) is on the model; the trainer's would replace it.
                kwargs.update(model=model, tokenizer=tokenizer, activation_checkpointing=False)
            run = original(preset, output_dir, **kwargs)
            seen["lora_dropout"] = getattr(getattr(run.model, "peft_config", {}).get("default"), "lora_dropout", None)
            return run

        labkit.run.build_run = build_run
        restore.callback(setattr, labkit.run, "build_run", original)
        yield


def _free_memory_of_the_card(stack: contextlib.ExitStack) -> str:
    """Return what ``torch.cuda.mem_get_info`` tells the loaders from now until ``stack`` closes: under a
    per-process cap, the capped card's free memory (the cap less PyTorch's reserved), as a card of that size would.

    The cap limits PyTorch's allocator, not what the driver reports: on an 80 GB card ``mem_get_info`` would say
    some 78 GiB are free, and Unsloth sizes its GRPO loss's chunks from it (``unsloth_zoo/rl_replacements.py``,
    ``autotune_batch_and_chunks``), as do its checkpoints' double buffer and transformers' allocator warm-up.
    """
    import torch

    fraction_of = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if not torch.cuda.is_available():
        return "no CUDA"
    if fraction_of is None or fraction_of() >= 1.0:
        return "the device's free memory"
    original = torch.cuda.mem_get_info

    def mem_get_info(device=None):
        free, total = original(device)
        cap = int(fraction_of(device) * total)
        return max(0, min(free, cap - torch.cuda.memory_reserved(device))), cap

    torch.cuda.mem_get_info = mem_get_info
    stack.callback(setattr, torch.cuda, "mem_get_info", original)
    return "the capped card's free memory"


def measure_loader(spec: dict) -> dict:
    """Return one row: :func:`bench.gpu_measure.measure` of ``spec`` with its policy loaded by ``spec["loader"]``.

    Runs in a fresh process (:func:`run_row`). An Unsloth row where Unsloth cannot run returns
    ``status="skipped"`` with the reason (:func:`labkit.unsloth_path.unsloth_status`), never a traceback.
    """
    loader = spec.get("loader", "trl")
    if loader not in LOADERS:
        raise ValueError(f"loader must be one of {LOADERS}, not {loader!r}")
    if loader == "unsloth":
        from labkit.unsloth_path import unsloth_status

        status = unsloth_status()
        if not status.available:
            return {"name": spec["name"], "preset": spec["preset"], "loader": loader, "status": "skipped",
                    "error": status.reason}
        import importlib

        importlib.import_module("unsloth")  # before transformers and TRL: it patches them as it loads
    from bench.gpu_measure import measure
    from labkit.training import LogRecorder

    # A class of its own: transformers warns when a second callback of measure()'s LogRecorder class is added.
    recorder, seen = type("StepTimes", (LogRecorder,), {})(), {}
    with _loaded_by(loader, recorder, seen):
        row = measure(spec)
    times = [t for t in recorder.values["step_time"] if t == t]
    timed = times[1:] if len(times) > 1 else times  # the first step warms up (kernels compile, caches fill)
    row.update(preset=spec["preset"], loader=loader, fast_inference=False, lora_dropout=seen.get("lora_dropout"),
               loaders_see=seen.get("loaders_see"),
               target_modules=",".join(spec["overrides"].get("target_modules", ())),
               seconds_per_step=round(sum(timed) / len(timed), 3) if timed else None, steps_timed=len(timed))
    for name in _VERSIONS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            row[name] = metadata.version(name)
    if row.get("cap_gib") is not None:
        row["label"] = CAP_LABEL.format(device=row["device"], cap=row["cap_gib"], card=row["card"], loader=loader)
    return row


def run_row(spec: dict, timeout_s: float, env: dict | None = None) -> tuple[dict, str]:
    """Return ``(row, output)``: :func:`measure_loader` of ``spec`` in a fresh process, and the end of what it
    printed. A process that dies or outlives ``timeout_s`` gives a row with ``status="error"`` and the reason."""
    with tempfile.TemporaryDirectory(prefix="labkit-unsloth-row-") as tmp:
        out, log = Path(tmp) / "row.json", Path(tmp) / "output.txt"
        command = [sys.executable, "-m", "bench.unsloth_measure", json.dumps(spec), str(out)]
        with log.open("w") as fh:  # a file, not a pipe: Unsloth prints a lot, and a full pipe would stall it
            try:
                code = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s,
                                      env={**os.environ, **(env or {})}).returncode
            except subprocess.TimeoutExpired:
                code = f"killed after {timeout_s:.0f} s"
        output = log.read_text(errors="replace")[-4000:]
        if out.exists():
            return json.loads(out.read_text()), output
    last = next((line for line in reversed(output.splitlines()) if line.strip()), "no output")
    return {"name": spec["name"], "preset": spec["preset"], "loader": spec["loader"], "status": "error",
            "error": f"the row's process ended without a row ({code}): {last}"[:400]}, output


def row_columns() -> list[str]:
    """Return the CSV's columns: what compares the two loaders, phase by phase, and the versions they ran."""
    from bench.gpu_measure import PHASE_ORDER

    return ["date", "name", "preset", "loader", "label", "status", "model", "method", "precision", "card", "cap_gib",
            "context_gib", "per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size",
            "num_generations", "max_prompt_length", "max_completion_length", "optim", "gradient_checkpointing",
            "target_modules", "lora_dropout", "fast_inference", "loaders_see", "weights_4bit", "embedding_dtype", "steps_done",
            "steps_timed", "seconds_per_step", "completion_mean_length", "peak_allocated_gib", "peak_reserved_gib",
            "peak_with_context_gib", "fits", *[f"{p}_{k}" for p in PHASE_ORDER for k in ("s", "allocated_gib",
                                                                                         "reserved_gib")],
            "training_allocated_gib", "generation_tokens_per_s", "estimated_total_gib", "estimate_error_pct", "wall_s",
            "device", "driver", "cuda", "torch", "transformers", "trl", "peft", "bitsandbytes", *_VERSIONS, "error"]


def _write(results: Path, row: dict) -> None:
    """Append ``row`` to the CSV (its columns) and the JSON list (all of it) in ``results``."""
    from bench import append_csv, write_json

    append_csv(results / RESULTS_CSV, [{k: row.get(k) for k in row_columns()}])
    path = results / RESULTS_JSON
    rows = json.loads(path.read_text()) if path.exists() else []
    write_json(path, [*rows, row])


def _summary(row: dict) -> str:
    """Return one line about a row: what it measured, or why it has no figures."""
    name = f"{row['name']:<24}"
    if row.get("status") not in ("ok", "oom"):
        return f"{name} {row.get('status')}: {row.get('error')}"
    parts = [f"{row['status']}: {row.get('steps_done')} steps"]
    if row.get("peak_allocated_gib") is not None:
        parts.append(f"peak {row['peak_allocated_gib']:.2f} GiB allocated, {row['peak_reserved_gib']:.2f} reserved "
                     f"(cap {row['cap_gib']:.2f}); estimate {row['estimated_total_gib']:.2f}")
    if row.get("seconds_per_step"):
        parts.append(f"{row['seconds_per_step']:.2f} s/step")
    if row.get("generation_tokens_per_s"):
        parts.append(f"{row['generation_tokens_per_s']:.0f} completion tok/s")
    return name + " " + ", ".join(parts)


def bench_loaders(specs: list[dict], results: str | os.PathLike, *, budget_s: float = math.inf,
                  row_timeout_s: float = 600, min_row_s: float = 60, say=print) -> list[dict]:
    """Return the rows of ``specs``, each measured by :func:`run_row` in its own process, one after the other, and
    appended to ``results`` as it ends. A row starts only with ``min_row_s`` of ``budget_s`` left, and gets at most
    what is left; the rows skipped for the budget are named at the end."""
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    started, rows, skipped = time.monotonic(), [], []
    # Unsloth's generated code: shared by the run's rows, never written into the repository, removed at the end.
    cache = tempfile.TemporaryDirectory(prefix="labkit-unsloth-compiled-")
    for spec in specs:
        left = budget_s - (time.monotonic() - started)
        if left < min_row_s:
            skipped.append(spec["name"])
            continue
        row, output = run_row(spec, min(row_timeout_s, left), env={"UNSLOTH_COMPILE_LOCATION": cache.name,
                                                                   "TOKENIZERS_PARALLELISM": "false"})
        if row.get("status") == "skipped":
            say(f"{spec['name']:<24} skipped: {row['error']}")
            continue
        _write(results, row)
        rows.append(row)
        say(_summary(row))
        if row.get("status") == "error":
            say("  its output ended with:\n" + "\n".join("  | " + line for line in output.splitlines()[-25:]))
    cache.cleanup()
    if skipped:
        say(f"skipped (budget): {', '.join(skipped)}")
    return rows


def _device(tiny: bool):
    """Return the :class:`labkit.device.DeviceInfo` a fresh process sees (this one never touches CUDA)."""
    from bench import worker
    from labkit.device import DeviceInfo

    probe = worker.run("probe", {"device": "cpu" if tiny else None}, timeout=300)
    if probe.get("status") != "ok":
        raise RuntimeError(f"could not inspect the device: {probe.get('error')}")
    found = dict(probe["device"])
    found["compute_capability"] = tuple(found["compute_capability"]) if found.get("compute_capability") else None
    return DeviceInfo(**found)


class _Log:
    """Print a line and keep it in the results folder's log."""

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        with self.path.open("a") as fh:
            fh.write(text + "\n")


def main(argv: list[str] | None = None) -> int:
    """``python -m bench unsloth --random-weights``: plain TRL and Unsloth, each row in a fresh process, on the
    recipe's architecture with random weights under its card's cap -> results/gpu/unsloth_vs_trl.csv.

    Exit codes: 0 every row measured (Unsloth's skipped with the reason where it cannot run), 1 a row failed,
    2 no CUDA GPU without --tiny.
    """
    from labkit.presets import PRESETS
    from labkit.unsloth_path import unsloth_status

    parser = argparse.ArgumentParser(prog="python -m bench unsloth --random-weights", description=main.__doc__)
    parser.add_argument("--preset", default="workshop", choices=sorted(PRESETS),
                        help="a 16 GB card's recipe: workshop (a T4, Qwen2.5-0.5B) or laptop-16gb-published (1.5B)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=("lora", "qlora"))
    parser.add_argument("--loaders", nargs="+", default=list(LOADERS), choices=LOADERS)
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per row (the first is left out of s/step)")
    parser.add_argument("--budget-s", type=float, default=math.inf, help="start no row after this many seconds")
    parser.add_argument("--results", default=None, help="folder (default results/gpu; --tiny: a temporary one)")
    parser.add_argument("--tiny", action="store_true", help="rehearse the command on a CPU: two layers, no memory")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    device = _device(args.tiny)
    if device.kind != "cuda" and not args.tiny:
        print(f"no CUDA GPU here ({device}): the measured comparison needs one; --tiny rehearses the command on "
              "the CPU (plain-TRL side, no memory measured)", file=sys.stderr)
        return 2
    results = Path(args.results or (tempfile.mkdtemp(prefix="labkit-unsloth-tiny-") if args.tiny else "results/gpu"))
    results.mkdir(parents=True, exist_ok=True)
    say = _Log(results / RESULTS_LOG)
    say(f"\n# {time.strftime('%Y-%m-%dT%H:%M:%S%z')}: python -m bench unsloth --random-weights "
        f"{' '.join(argv if argv is not None else sys.argv[1:])} ({device})")
    loaders = list(args.loaders)
    status = unsloth_status(device)
    if "unsloth" in loaders and not status.available:
        say(f"skipped the Unsloth side: {status.reason}")
        loaders.remove("unsloth")
    specs = row_specs(args.preset, args.methods, loaders, steps=args.steps, tiny=args.tiny)
    rows = bench_loaders(specs, results, budget_s=args.budget_s, say=say)
    say(f"{len(rows)} row(s) -> {results / RESULTS_CSV}")
    return 0 if rows and all(r.get("status") == "ok" for r in rows) else 1


if __name__ == "__main__":  # one row, in a fresh process: python -m bench.unsloth_measure SPEC OUT
    _spec = json.loads(sys.argv[1])
    try:
        _row = measure_loader(_spec)
    except Exception as exc:  # an import or a load that fails outside measure(): the row says so, the log shows where
        import traceback

        traceback.print_exc()
        _row = {"name": _spec["name"], "preset": _spec["preset"], "loader": _spec.get("loader"), "status": "error",
                "error": f"{type(exc).__name__}: {exc}"[:400]}
    Path(sys.argv[2]).write_text(json.dumps(_row, indent=1, default=str) + "\n")
