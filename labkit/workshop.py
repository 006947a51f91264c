"""The pre-workshop checklist (``python -m labkit check``) and the workshop preset's estimated time on a T4.

What an instructor runs on every machine before the day: is the install complete, which device and mode the
notebooks will use, is there disk, are the model weights the notebooks train already here. Split from the run
context (:mod:`labkit.lab`), which it reads.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from labkit.lab import data_dir, package_versions, resolve_mode

__all__ = ["T4_STEP_SECONDS", "workshop_estimate", "CheckItem", "workshop_checklist", "hf_cache_has_weights"]



# Published seconds per GRPO step on a free Colab T4 (docs/references.md#t4-step-times). Not our measurements.
T4_STEP_SECONDS = {
    "unsloth_qwen2.5-3b_vllm": {
        "seconds_per_step": 24.0, "params_b": 3.1, "num_generations": 8, "completion_tokens": 200, "vllm": True,
        "source": "Unsloth's saved Colab T4 notebook (unslothai/notebooks): 250 steps in 1 h 40 min",
    },
    "trl_qwen2-7b_qlora": {
        "seconds_per_step": 94.0, "params_b": 7.6, "num_generations": 8, "completion_tokens": 256, "vllm": False,
        "source": "TRL's T4 notebook (huggingface/trl examples/notebooks/grpo_trl_lora_qlora.ipynb): 500 steps in ~13 h",
    },
}
# Not published: an allowance for the install, the ~1 GB model download and loading, in minutes. An assumption.
_SETUP_ALLOWANCE_MIN = 10.0


def workshop_estimate(preset="workshop", eval_questions: int = 100, eval_passes: int = 2) -> dict:
    """Return the ESTIMATED minutes notebook 04 takes on a free T4 with ``preset``, and what the estimate rests on.

    No GPU run has been measured yet: this is arithmetic on published T4 step times
    (:data:`T4_STEP_SECONDS`), to be replaced by a measured figure. Per step, the upper figure is
    Unsloth's 3B step (24 s; vLLM, 200 tokens), the smallest published T4 GRPO step and for a model 6x
    larger; the lower one is TRL's 7B QLoRA step without vLLM (94 s, G = 8, 256 tokens) scaled by
    parameter count (decoding is bound by reading the weights). An evaluation batch generates as long
    as one step does, so ``eval_passes x ceil(eval_questions / eval_batch_size)`` batches count as steps.
    """
    import math

    from labkit.presets import get_preset

    p = get_preset(preset)
    catalogue = json.loads((data_dir() / "architectures.json").read_text())
    params_b = catalogue.get(p.model, {}).get("params_b")
    trl = T4_STEP_SECONDS["trl_qwen2-7b_qlora"]
    upper_step = T4_STEP_SECONDS["unsloth_qwen2.5-3b_vllm"]["seconds_per_step"]
    if params_b is None:
        raise ValueError(f"{p.model} is not in labkit/data/architectures.json: its size (params_b) is unknown")
    lower_step = trl["seconds_per_step"] * params_b / trl["params_b"]
    eval_batches = eval_passes * math.ceil(eval_questions / p.eval_batch_size)
    units = p.config["max_steps"] + eval_batches
    upper = units * upper_step / 60 + _SETUP_ALLOWANCE_MIN
    lower = units * lower_step / 60 + _SETUP_ALLOWANCE_MIN
    return {
        "preset": p.name, "model": p.model, "max_steps": p.config["max_steps"],
        "num_generations": p.config["num_generations"], "max_completion_length": p.config["max_completion_length"], "eval_questions": eval_questions,
        "eval_batches": eval_batches, "seconds_per_step_low": round(lower_step, 1),
        "seconds_per_step_high": upper_step, "setup_allowance_min": _SETUP_ALLOWANCE_MIN,
        "minutes_low": round(lower), "minutes_high": round(upper), "status": "estimate",
        "note": "ESTIMATE from published T4 step times, not a measurement; replace with a measured notebook 04 run "
                "on a T4 when one exists.",
        "sources": {k: v["source"] for k, v in T4_STEP_SECONDS.items()},
    }


@dataclass
class CheckItem:
    """One line of :func:`workshop_checklist`: what was checked, whether it is fine (None: could not tell), why."""

    name: str
    ok: bool | None
    detail: str

    def __str__(self) -> str:
        mark = {True: "ok  ", False: "FIX ", None: "?   "}[self.ok]
        return f"[{mark}] {self.name}: {self.detail}"


def hf_cache_has_weights(model: str, cache: str | Path | None = None) -> bool:
    """Return True when the Hugging Face cache holds a snapshot of ``model`` with its weights (``*.safetensors``)."""
    if cache is None:
        from huggingface_hub import constants

        cache = constants.HF_HUB_CACHE
    snapshots = Path(cache) / f"models--{model.replace('/', '--')}" / "snapshots"
    return any(snapshots.glob("*/*.safetensors"))


def _hub_reachable(timeout: float = 5.0) -> bool:
    import urllib.request

    try:  # an anonymous HEAD request: no token is read or sent
        urllib.request.urlopen(urllib.request.Request("https://huggingface.co", method="HEAD"), timeout=timeout)
        return True
    except OSError:
        return False


def workshop_checklist(preset: str | None = None, *, online: bool | None = None, min_free_gib: float = 5.0) -> list:
    """Return the pre-workshop checklist as :class:`CheckItem` lines: install, device, mode, disk, weights.

    ``preset`` defaults to what the notebooks train here: ``workshop`` on a GPU; without one ``cpu-tiny`` and
    ``cpu-smollm2`` (SmolLM2-135M-Instruct, which a pip package ships: notebooks 04 and 08 train it on a CPU).
    ``online``: None asks the hub (unless ``HF_HUB_OFFLINE`` is set). The weights check reads the
    local Hugging Face cache only; offline, it says what to download at home. No token is read or printed.
    """
    import shutil

    from labkit.device import detect_device

    items = []
    versions = package_versions()
    missing = [name for name in ("torch", "transformers", "trl", "peft", "accelerate", "datasets") if not versions[name]]
    items.append(CheckItem("install", not missing, "missing " + ", ".join(missing) + ": run the README's install"
                           if missing else ", ".join(f"{k} {versions[k]}" for k in ("torch", "transformers", "trl", "peft"))))
    device = detect_device()
    items.append(CheckItem("device", True, f"{device}" + ("" if device.kind == "cuda" else
                                                          " (no CUDA GPU: CPU mode; the GPU steps run on Colab)")))
    try:
        mode = resolve_mode("auto", device)
        items.append(CheckItem("mode", True, f"{mode} (LABKIT_MODE={os.environ.get('LABKIT_MODE', 'unset')})"))
    except (ValueError, RuntimeError) as exc:
        items.append(CheckItem("mode", False, str(exc)))
        mode = "cpu"
    from huggingface_hub import constants

    from labkit.models import cache_dir

    cache = Path(constants.HF_HUB_CACHE)
    written = cache_dir()  # where labkit converts the CPU model: LABKIT_CACHE when set
    free_gib = shutil.disk_usage(written).free / 2**30
    items.append(CheckItem("free disk", free_gib >= min_free_gib, f"{free_gib:.1f} GiB free at {written}, labkit's "
                           f"cache ({'LABKIT_CACHE' if os.environ.get('LABKIT_CACHE') else 'set LABKIT_CACHE to move it'}"
                           f"; need {min_free_gib:g} GiB for the workshop model and runs)"))
    # The weights of what the notebooks train here: notebook 04's preset, and without a GPU also the real
    # instruct model that notebooks 04 and 08 train in CPU mode (cpu-smollm2, cpu-tools: smollm2-135m).
    presets = [preset] if preset else ["workshop"] if device.kind == "cuda" else ["cpu-tiny", "cpu-smollm2"]
    for name in presets:
        items.append(_weights_item(name, cache, online))
    return items


def _weights_item(preset: str, cache: Path, online: bool | None) -> CheckItem:
    """Return the checklist's line on ``preset``'s model weights: built here, shipped by a package, or from the hub."""
    from labkit.models import LOCAL_MODELS, local_model_built, local_model_problem
    from labkit.presets import get_preset

    model = get_preset(preset).model
    if model.startswith("tiny:"):
        return CheckItem("weights", True, f"preset {preset}: {model} is built on this machine, nothing to download "
                         "(the GPU preset is 'workshop': python -m labkit check --preset workshop)")
    if model in LOCAL_MODELS:  # a pip package ships its weights; labkit converts them once into its cache
        spec = LOCAL_MODELS[model]
        where = f"preset {preset}: {model} ({spec['hub_id']}, notebooks 04 and 08 in CPU mode)"
        if local_model_built(model):
            return CheckItem("weights", True, f"{where} is built in labkit's cache")
        problem = local_model_problem(model)
        return CheckItem("weights", problem is None, f"{where}: {problem}" if problem else
                         f"{where}: the {spec['pip']} package holds {spec['gguf_file']}; the first run converts it, once")
    if hf_cache_has_weights(model, cache):
        return CheckItem("weights", True, f"preset {preset}: {model} is in the Hugging Face cache ({cache})")
    if online is None:
        online = os.environ.get("HF_HUB_OFFLINE", "0") not in ("1", "true", "True") and _hub_reachable()
    download = f"hf download {model}"  # huggingface_hub >= 1.0; older releases: huggingface-cli download
    if online:
        return CheckItem("weights", False, f"preset {preset}: {model} is not cached yet; the hub is reachable: "
                         f"run `{download}` now, before the workshop's shared network")
    return CheckItem("weights", None, f"preset {preset}: {model} is not in the cache and the hub cannot be "
                     f"checked (offline); at home, run `{download}`")
