"""How a GRPO step makes its completions, and what a decode step costs: a recipe's generation path and its clock.

Introduced in ``04b_where_the_time_goes.ipynb``. Generation is most of a GRPO step
(91-97 % of every step measured on an H100, ``results/gpu/measurements.csv``), and with TRL's default ``generate`` a
decode step costs about the same at a generation batch of 4 or 96: the host launches one small kernel after another
and the card waits. A recipe chooses how TRL 1.16 generates with :attr:`labkit.presets.Preset.generation`:

- ``"generate"``: TRL's default: transformers' ``generate`` with a growing (dynamic) KV cache, uncompiled
  (``GenerationConfig(..., disable_compile=True)``, trl/trainer/grpo_trainer.py 1173).
- ``"static-compiled"``: a static KV cache (GRPOConfig ``cache_implementation="static"``), the prompts passed to
  ``generate`` padded to ``max_prompt_length`` so every generation has the same shapes (the loss's tensors are not
  padded: :class:`GenerationClock`), and the decode step compiled with ``torch.compile`` (CUDA graphs,
  ``mode="reduce-overhead"``): :func:`prepare_generation` turns compilation back on in the trainer's
  ``generation_config`` once TRL has built it. The first generation compiles (minutes); a generation slower than
  :data:`COMPILE_LIMIT_S` stops with :class:`GenerationTooSlow`, never a hang.
- ``"continuous"``: transformers' continuous batching (GRPOConfig ``use_transformers_continuous_batching``), its KV
  pages, batch tokens and memory gate set from the recipe (:func:`generation_arguments`); what it allocates is
  :func:`continuous_footprint`, counted in the memory estimate and refused before any model loads when the card
  cannot hold it.
- ``"vllm"``: TRL's vLLM path in colocate mode (``use_vllm=True``), for a Linux GPU machine with network. TRL 1.16
  supports vLLM 0.22-0.31 and warns about other versions (trl/import_utils.py 101-115); labkit refuses them.

:func:`generation_problems` refuses, before any model loads, what a path cannot do. :class:`GenerationClock`
times every generation of a run and logs, through TRL's own metrics (so the dashboard and ``LogRecorder`` see
them): ``generation/seconds``, ``generation/tokens_per_second`` (completion tokens), ``generation/ms_per_decode_step``
and, on a card of :data:`labkit.device.CARDS`, ``generation/bandwidth_share``: the tokens a second against
:func:`decode_limit`, what the card's memory bandwidth allows. docs/references.md#generation-paths cites each fact.
"""
from __future__ import annotations

import math
import threading
import time

__all__ = ["PATHS", "COMPILE_LIMIT_S", "GenerationTooSlow", "GenerationClock", "generation_problems",
           "generation_arguments", "prepare_generation", "decode_limit", "kv_bytes_per_token", "card_limit",
           "paths_table", "dropped_settings_problem", "GENERATION_FIELDS", "continuous_footprint"]

PATHS = {
    "generate": "TRL's default: transformers' generate, a growing KV cache, uncompiled; the host drives each kernel",
    "static-compiled": "a static KV cache and a compiled decode step (CUDA graphs); the prompts it generates from "
                       "padded to max_prompt_length; the first generation compiles",
    "continuous": "transformers' continuous batching (paged KV cache, finished sequences make room for others)",
    "vllm": "vLLM inside the training process (colocate), for a Linux GPU machine with network",
}
COMPILE_LIMIT_S = 900.0  # the first generation of "static-compiled", compilation included, may take this long
VLLM_VERSIONS = ("0.22.0", "0.31.0")  # what TRL 1.16 supports; it warns outside (trl/import_utils.py 107-113)
# Generation settings that transformers' continuous batching drops (MinNewTokens and RepetitionPenalty say
# supports_continuous_batching = False, transformers/generation/logits_process.py 201 and 356): refused with it.
_CONTINUOUS_DROPS = ("min_new_tokens", "min_length", "repetition_penalty", "no_repeat_ngram_size", "bad_words_ids",
                     "suppress_tokens", "begin_suppress_tokens", "forced_eos_token_id", "exponential_decay_length_penalty")


class GenerationTooSlow(RuntimeError):
    """A generation (compilation included) ran past its limit and was stopped."""


def generation_problems(p, device) -> tuple[list[str], list[str]]:
    """Return ``(errors, warnings)`` for recipe ``p``'s generation path on ``device``, before any model loads."""
    path, errors, warnings = p.generation, [], []
    if path not in PATHS:
        return [f"generation must be one of {', '.join(PATHS)}, not {path!r}."], []
    cuda = getattr(device, "kind", "cpu") == "cuda"
    vllm_options = sorted(k for k in p.config if k.startswith("vllm_"))
    if vllm_options and path != "vllm":
        verb, them = ("acts", "it") if len(vllm_options) == 1 else ("act", "them")
        errors.append(f"{', '.join(vllm_options)} {verb} only with generation='vllm' (this recipe's is "
                      f"{path!r}): set generation='vllm', or drop {them}.")
    if path == "static-compiled":
        if p.method == "qlora":
            errors.append("generation='static-compiled' cannot compile a 4-bit (QLoRA) model: transformers compiles "
                          "a quantized model only when its quantizer says so (hf_quantizer.is_compileable), and its "
                          "bitsandbytes 4-bit quantizer says no. It would decode uncompiled with a static cache, "
                          "slower than the default. Set generation='generate' (or method='lora').")
        if p.environment:
            errors.append("generation='static-compiled' with tool rounds: every round generates on a longer prompt, "
                          "a new shape to compile each time. Set generation='generate' for a tool recipe.")
        if not cuda:
            warnings.append(f"generation='static-compiled' on {device}: no CUDA graphs there; compiling takes minutes "
                            "and buys little on a CPU (measured: results/generation_paths.json). 'generate' is faster.")
    elif path == "continuous":
        dropped = dropped_settings_problem(path, p.config.get("generation_kwargs"),
                                           p.config.get("repetition_penalty", 1.0))
        if dropped:
            errors.append(dropped)
        card = getattr(device, "total_memory_gib", None)
        if cuda and card and not errors:  # the pages, mask and buffers beside the weights and optimizer
            from labkit.device import SIZING_CONTEXT_GIB
            from labkit.memory import estimate

            b = 4 if p.precision == "fp32" else 2
            need = continuous_footprint(p.model, p.generation_batch_size, p.max_prompt_length,
                                        p.config["max_completion_length"], b)["total"] / 2**30
            est = estimate(p.model, p.method, optim=p.config["optim"], precision="fp32" if b == 4 else "bf16",
                           beta=p.config["beta"],
                           lora_rank=p.lora_rank, lora_targets=list(p.target_modules), lora_dropout=p.lora_dropout,
                           max_completion_length=1,
                           prepare_model_for_kbit_training=p.prepare_model_for_kbit_training).bytes
            has = card - SIZING_CONTEXT_GIB - (est["weights"] + est["reference"] + est["optimizer"]) / 2**30
            if need > has:
                errors.append(f"generation='continuous' needs {need:.1f} GiB for its KV pages, attention mask and "
                              f"read buffers (transformers' own sizing), and this {card:.1f} GiB card has {has:.1f} "
                              "GiB beside the weights and optimizer. Lower gradient_accumulation_steps or "
                              "per_device_train_batch_size (the pages hold every sequence of the generation batch) "
                              "or max_completion_length, or set generation='generate'.")
        if p.method == "full" and cuda:
            errors.append("generation='continuous' casts every weight to 16 bits for each generation: with full "
                          "fine-tuning's fp32 weights that is a second copy of the model. Set generation='generate'.")
    elif path == "vllm":
        import importlib.metadata

        try:
            version = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            version = None
        if not cuda:
            errors.append(f"generation='vllm' needs a CUDA GPU, not {device}: set generation='generate'.")
        elif version is None:
            errors.append(f"generation='vllm': vLLM is not installed. On a Linux GPU machine with network: pip install "
                          f"'vllm>={VLLM_VERSIONS[0]},<={VLLM_VERSIONS[1]}'; without it, set "
                          "generation='static-compiled'.")
        else:
            from packaging.version import Version

            if not Version(VLLM_VERSIONS[0]) <= Version(Version(version).base_version) <= Version(VLLM_VERSIONS[1]):
                errors.append(f"generation='vllm': vLLM {version} is installed; TRL 1.16 supports "
                              f"{VLLM_VERSIONS[0]}-{VLLM_VERSIONS[1]} and only warns about others. Install one of "
                              "those, or set "
                              "generation='static-compiled'.")
        if p.card_gib is None and not errors and p.config.get("vllm_mode", "colocate") != "server":
            errors.append("generation='vllm' sizes vLLM's share of the card from its memory: set card (a key of "
                          "labkit.device.CARDS) or card_gib.")
    return errors, warnings


def kv_bytes_per_token(shape, dtype_bytes: int = 2) -> int:
    """Bytes one token's keys and values take in the KV cache: ``2 x layers x kv_heads x head_dim x dtype_bytes``."""
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * dtype_bytes


def decode_limit(weight_bytes: float, kv_bytes_per_token: float, batch: int, mean_context: float,
                 bandwidth_bytes_per_s: float) -> float:
    """Completion tokens a second at the memory-bandwidth limit.

    One decode step makes one token for each of ``batch`` sequences, and reads every weight once plus each
    sequence's KV cache (``mean_context`` tokens on average over the generation). A step cannot be faster than
    those bytes over the bandwidth: ``batch x bandwidth / (weights + batch x mean_context x kv_bytes_per_token)``.
    """
    return batch * bandwidth_bytes_per_s / (weight_bytes + batch * mean_context * kv_bytes_per_token)


def card_limit(model, card, *, batch: int, prompt_tokens: float, completion_tokens: float,
               dtype_bytes: int = 2) -> float:
    """:func:`decode_limit` for ``model`` (a name, config or model: :func:`labkit.memory.model_shape`) on ``card``
    (:class:`labkit.device.Card`) in 16-bit weights, its context growing from the prompt through the completion."""
    from labkit.memory import model_shape

    shape = model_shape(model)
    return decode_limit(shape.params * dtype_bytes, kv_bytes_per_token(shape, dtype_bytes), batch,
                        prompt_tokens + completion_tokens / 2, card.bandwidth_gb_s * 1e9)


def _continuous_sizes(generation_batch: int, max_prompt_length: int, max_completion_length: int) -> dict:
    """``ContinuousBatchingConfig`` sizes: pages for every sequence at full length; ``max_batch_tokens`` for one
    prompt or one decode step of the batch a forward pass (the default 8,192 makes a 2 GiB mask for ``laptop-16gb``);
    ``max_memory_percent=1``: with both sizes set it only gates (continuous_batching/cache.py 692-701)."""
    tokens = max_prompt_length + max_completion_length
    page = 256 if tokens >= 256 else 64
    return dict(page_size=page, num_blocks=generation_batch * math.ceil(tokens / page),
                max_batch_tokens=page * math.ceil(max(max_prompt_length, generation_batch) / page),
                max_memory_percent=1.0)


def continuous_footprint(model, generation_batch: int, max_prompt_length: int, max_completion_length: int,
                         dtype_bytes: int = 2) -> dict:
    """Return the bytes continuous batching allocates for the recipe, by transformers' own sizing code
    (``PagedAttentionMemoryHandler``, continuous_batching/cache.py 532-711): ``cache`` (KV pages), ``attention_mask``
    (SDPA), ``reads`` (keys and values read back), ``batch_tokens``, ``fixed`` and ``total``. ``model``: a name,
    config or model; ``dtype_bytes``: the model's as it generates (TRL casts to 16 bits)."""
    import inspect

    import torch
    from transformers import AutoModelForCausalLM, ContinuousBatchingConfig
    from transformers.generation.continuous_batching import cache as cb, initialization, utils

    from labkit.memory import model_config

    config = model_config(model)[1].get_text_config()
    dtype = {2: torch.bfloat16, 4: torch.float32}[dtype_bytes]
    sizes = _continuous_sizes(generation_batch, max_prompt_length, max_completion_length)
    hints = utils.WorkloadHints(max_prompt_length=max_prompt_length, max_generated_length=max_completion_length,
                                num_requests=generation_batch)
    cb_config = initialization.resolve_continuous_batching_config(config, ContinuousBatchingConfig(**sizes), hints,
                                                                  True, torch.device("cuda"))
    # the sector geometry as PagedAttentionCache.__init__ computes it (cache.py 150-183), one allocator per kind
    kv_heads = cb.find_num_key_value_heads(config)
    allocators = [cb.ATTN_TYPE_TO_ALLOCATOR[kind](index=i, layer_indices=layers, num_key_value_heads=kv_heads,
                                                  config=config, cache_dtype=dtype, page_size=cb_config.page_size,
                                                  allow_block_sharing=cb_config.allow_block_sharing)
                  for i, (kind, layers) in enumerate(cb.group_layers_by_attn_type(config).items())]
    bytes_per_sector = math.lcm(*(a.bytes_per_block for a in allocators), 128)
    tokens_per_sector = max((bytes_per_sector // a.bytes_per_block) * a.tokens_per_page for a in allocators)
    bytes_per_block = config.num_hidden_layers * cb.FullAttentionCacheAllocator.get_bytes_per_page(
        kv_heads, cb.find_head_dim(config), dtype, cb_config.page_size)
    head = AutoModelForCausalLM._model_mapping.get(type(config), None)  # as GenerationMixin._supports_logits_to_keep
    logits_to_keep = head is not None and "logits_to_keep" in inspect.signature(head.forward).parameters
    handler = cb.PagedAttentionMemoryHandler(config, cb_config, dtype, bytes_per_sector, tokens_per_sector,
                                             bytes_per_block, [*cb.group_layers_by_attn_type(config)], logits_to_keep)
    tokens, sectors = cb_config.max_batch_tokens, handler.num_sectors_from_config()
    return dict(cache=sectors * bytes_per_sector, attention_mask=handler.attention_mask_bytes(tokens, sectors),
                reads=sectors * tokens_per_sector * handler.bytes_per_cache_token,
                batch_tokens=tokens * handler.bytes_per_batch_token, fixed=handler.fixed_overhead_bytes,
                total=handler.compute_memory_footprint(tokens, sectors))


def generation_arguments(p) -> dict:
    """Return the ``GRPOConfig`` fields recipe ``p``'s generation path sets (none for ``"generate"``)."""
    if p.generation == "static-compiled":
        # the prompts passed to generate are padded by the clock (GenerationClock), not through GRPOConfig's
        # pad_to_multiple_of, which TRL also applies to the loss's tensors (grpo_trainer.py 2443-2482)
        return dict(cache_implementation="static")
    if p.generation == "continuous":
        # sized from the recipe, not a share of whatever the device reports free (transformers reads
        # torch.cuda.mem_get_info, which a per-process cap does not change: continuous_batching/utils.py 404-406)
        config = dict(_continuous_sizes(p.generation_batch_size, p.max_prompt_length, p.config["max_completion_length"]),
                      seed=p.config["seed"], drop_unsupported_processors=False)
        return dict(use_transformers_continuous_batching=True, transformers_continuous_batching_config=config)
    if p.generation == "vllm":
        if p.config.get("vllm_mode", "colocate") == "server":  # vLLM runs on its own GPU: nothing to share
            return dict(use_vllm=True)
        if p.card_gib is None:  # no card to share: generation_problems refuses the recipe, naming card_gib
            return dict(use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True)
        from labkit.memory import model_shape
        from labkit.models import resolve_model

        shape = model_shape(resolve_model(p.model))
        tokens = p.generation_batch_size * (p.max_prompt_length + p.config["max_completion_length"])
        need = shape.params * 2 + tokens * kv_bytes_per_token(shape)
        share = min(0.9, max(0.1, math.ceil(20 * 1.2 * need / (p.card_gib * 2**30)) / 20))
        return dict(use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True, vllm_gpu_memory_utilization=share)
    return {}


def paths_table(p, device) -> list[dict]:
    """Return one row per path for recipe ``p`` on ``device``: what it is, the ``GRPOConfig`` fields it sets (what
    to type in plain TRL), and whether it runs here: "yes", a warning, or the refusal (notebook 04's table)."""
    rows = []
    for path, what in PATHS.items():
        q = p.replace(generation=path)
        errors, warnings = generation_problems(q, device)
        fields = generation_arguments(q) if not errors else {}
        shown = dict(fields)
        if "transformers_continuous_batching_config" in shown:  # the table shows its sizes only
            config = shown["transformers_continuous_batching_config"]
            shown["transformers_continuous_batching_config"] = {k: config[k] for k in ("num_blocks", "page_size")}
        rows.append({"generation": path, "what it is": what,
                     "GRPOConfig fields": ", ".join(f"{k}={v!r}" for k, v in shown.items())
                                          or ("-" if errors else "(TRL's defaults)"),
                     "runs here?": errors[0] if errors else warnings[0] if warnings else "yes"})
    return rows


# The GRPOConfig fields a generation path sets: a recipe changes them through its generation field only.
# (vllm_mode is a recipe's choice under generation='vllm': "colocate", the default, or "server" with
# vllm_server_base_url, both in the preset's config, as notebook 07 shows.)
GENERATION_FIELDS = ("cache_implementation", "pad_to_multiple_of", "use_transformers_continuous_batching",
                     "transformers_continuous_batching_config", "use_vllm", "vllm_enable_sleep_mode",
                     "vllm_gpu_memory_utilization")


def prepare_generation(trainer, path: str = "generate", *, compile_limit_s: float | None = COMPILE_LIMIT_S,
                       max_prompt_length: int | None = None, shape=None) -> "GenerationClock":
    """Finish generation ``path`` (a recipe's ``generation``) on a built ``trainer``; return the clock that times it.

    ``"static-compiled"``: TRL builds its ``GenerationConfig`` with ``disable_compile=True``; this turns compilation
    back on with a ``CompileConfig`` (static shapes; CUDA graphs on a GPU, inductor's default mode on a CPU), and
    the clock pads the prompts it generates from to ``max_prompt_length`` (one shape, one compilation). ``shape``:
    the model's :class:`labkit.memory.ModelShape` where it is known (a plan's), else read from the model's config.
    """
    # where the trainer really runs (a test may plan for a card on a CPU): what compiles, and which card's bandwidth
    kind = trainer.args.device.type
    if path == "static-compiled":
        from transformers import CompileConfig

        config = CompileConfig(fullgraph=False, dynamic=False, mode="reduce-overhead" if kind == "cuda" else "default")
        if kind != "cuda":  # transformers compiles on CUDA-like devices only unless told (configuration_utils.py 1676)
            config._compile_all_devices = True
        trainer.generation_config.disable_compile = False
        trainer.generation_config.compile_config = config
    bandwidth = None
    if kind == "cuda":
        import torch

        from labkit.device import CARDS

        name = torch.cuda.get_device_name()
        bandwidth = next((c.bandwidth_gb_s for c in CARDS.values() if c.name == name), None)
    return GenerationClock(trainer, path, bandwidth_gb_s=bandwidth,
                           compile_limit_s=compile_limit_s if path == "static-compiled" else None,
                           pad_prompts_to=max_prompt_length if path == "static-compiled" else None, shape=shape)


class _Watchdog(threading.Timer):
    """Interrupts the main thread after ``seconds`` (``_thread.interrupt_main``: a KeyboardInterrupt there)."""

    def __init__(self, seconds: float):
        super().__init__(seconds, self._fire)
        self.fired = False
        self.daemon = True
        self.start()

    def _fire(self) -> None:
        import _thread

        self.fired = True  # set before the interrupt: the main thread reads it when the KeyboardInterrupt lands
        _thread.interrupt_main()


class GenerationClock:
    """Times each of a trainer's generations and logs what it made, through TRL's metrics.

    It stands in for ``trainer._generate_single_turn`` (what TRL 1.16 calls for every generation, tool rounds
    included) and calls the original. ``calls`` keeps one dict per generation: ``seconds``, ``sequences``,
    ``tokens`` (completion tokens), ``decode_steps`` (the longest completion: one token per unfinished sequence each
    step), ``prompt_tokens`` (their mean), ``first`` (the first of its shape: it compiles on "static-compiled") and
    ``compiled`` (graphs ``torch.compile`` made during the call: a warm compiled path makes none; one that does after
    a training step is recompiling, and its seconds are not steady ones).
    For ``"continuous"``, which casts the model to 16 bits to generate (grpo_trainer.py 1796-1800), every parameter,
    gradient and buffer the cast changed gets its own tensor back afterwards: fp32 LoRA adapters and the gradients
    they accumulate stay fp32, bit for bit, and so do the rotary frequencies (``inv_freq``, fp32 in a bf16 model:
    cast, they stay rounded for the rest of the run). Under a per-process cap it sets ``max_memory_percent`` so that
    transformers checks the cache against the cap's free memory, not the card's. Each generation turns gradient
    checkpointing off and on (trl/models/utils.py 136-154), which adds a ``requires_grad_`` hook on the embeddings
    (transformers/modeling_utils.py 2143-2170, 3183-3189, 3273): the clock removes the hooks the new ones replace.
    ``pad_prompts_to``: TRL pads the prompts it generates from to it during the call only, not the loss's tensors.
    """

    def __init__(self, trainer, path: str = "generate", *, bandwidth_gb_s: float | None = None,
                 compile_limit_s: float | None = None, clock=time.perf_counter, pad_prompts_to: int | None = None,
                 shape=None):
        self.trainer, self.path, self.clock, self.pad_prompts_to = trainer, path, clock, pad_prompts_to
        self.bandwidth_gb_s, self.compile_limit_s = bandwidth_gb_s, compile_limit_s
        self.calls: list[dict] = []
        self._inner = trainer._generate_single_turn
        self._shapes: set = set()
        # continuous batching reseeds its sampler from its config at every call (__call__): the recipe's seed, read once
        self._cb_config = getattr(trainer, "continuous_batching_config", None) if path == "continuous" else None
        self._seed = (self._cb_config.seed or 0) if self._cb_config is not None else 0
        self._percent = getattr(self._cb_config, "max_memory_percent", None)  # the recipe's, without a cap
        model = trainer.model
        # Module.parameters() yields a tied weight once (remove_duplicate=True): the bytes a decode step reads
        self.weight_bytes = sum(param.numel() * param.element_size() for param in model.parameters())
        from labkit.memory import model_shape

        embedding = model.get_input_embeddings().weight
        self.kv_bytes_per_token = kv_bytes_per_token(shape or model_shape(model.config), embedding.element_size())
        trainer._generate_single_turn = self

    def __call__(self, prompt_ids, *args, **kwargs):
        width, pad = max(map(len, prompt_ids), default=0), self.pad_prompts_to
        shape = (len(prompt_ids), -(-width // pad) * pad if pad else width)  # the padded prompts' shape
        first = shape not in self._shapes
        self._shapes.add(shape)
        watchdog = None
        if self.compile_limit_s and first and threading.current_thread() is threading.main_thread():
            watchdog = _Watchdog(self.compile_limit_s)
        model = self.trainer.model
        kept = [(p, p.data, None if p.grad is None else p.grad.data)
                for p in model.parameters()] if self.path == "continuous" else []
        hooks = {m: m.__dict__["_require_grads_hooks"] for m in model.modules() if "_require_grads_hooks" in m.__dict__}
        padding = self.trainer.__dict__.get("pad_to_multiple_of")
        if self.pad_prompts_to:
            self.trainer.pad_to_multiple_of = self.pad_prompts_to
        # Module.to() changes a parameter's .data but puts a new tensor in the module's _buffers
        buffers = [(m, name, b) for m in model.modules() for name, b in m._buffers.items()
                   if b is not None] if self.path == "continuous" else []
        if self._cb_config is not None:
            # one seed for every call would draw the same random numbers at every step (tests/test_generation.py);
            # the recipe's seed plus the call's number keeps a run reproducible and each generation its own draws
            self._cb_config.seed = self._seed + len(self.calls)
            self._cb_config.max_memory_percent = _memory_percent_under_cap(self._percent)
        graphs = _graphs_compiled()
        start = self.clock()
        try:
            result = self._inner(prompt_ids, *args, **kwargs)
            _synchronize()
        except KeyboardInterrupt:
            if watchdog is not None and watchdog.fired:
                raise GenerationTooSlow(
                    f"the first generation with generation='{self.path}' (compilation included) ran past its "
                    f"{self.compile_limit_s:g} s limit and was stopped. Set generation='generate', or raise the "
                    "limit (labkit.generation.COMPILE_LIMIT_S) if this card compiles slowly.") from None
            raise
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if self.pad_prompts_to:
                self.trainer.pad_to_multiple_of = padding
            for module, handles in hooks.items():
                if module.__dict__.get("_require_grads_hooks") is not handles:  # re-enabled: new hooks replace these
                    for handle in handles:
                        handle.remove()
            for param, data, grad in kept:
                if param.data.dtype != data.dtype:
                    param.data = data
                if grad is not None and param.grad is not None and param.grad.dtype != grad.dtype:
                    param.grad.data = grad
            for module, name, buffer in buffers:
                current = module._buffers.get(name)
                if current is not None and current.dtype != buffer.dtype:
                    module._buffers[name] = buffer
        seconds = self.clock() - start
        lengths = [len(c) for c in result[0]]
        call = dict(seconds=seconds, sequences=len(lengths), tokens=sum(lengths), decode_steps=max(lengths, default=0),
                    prompt_tokens=sum(map(len, prompt_ids)) / max(1, len(prompt_ids)), first=first,
                    compiled=_graphs_compiled() - graphs)
        self.calls.append(call)
        metrics = self.trainer._metrics["train" if self.trainer.model.training else "eval"]
        for key, value in self.figures(call).items():
            metrics[f"generation/{key}"].append(value)
        return result

    def figures(self, call: dict) -> dict:
        """``seconds``, ``tokens_per_second``, ``ms_per_decode_step`` and (a known card) ``bandwidth_share`` of a call."""
        seconds = max(call["seconds"], 1e-9)
        out = dict(seconds=seconds, tokens_per_second=call["tokens"] / seconds,
                   ms_per_decode_step=1000 * seconds / max(1, call["decode_steps"]))
        if self.bandwidth_gb_s:  # decode_limit at the call's batch and mean context
            limit = decode_limit(self.weight_bytes, self.kv_bytes_per_token, call["sequences"],
                                 call["prompt_tokens"] + call["decode_steps"] / 2, self.bandwidth_gb_s * 1e9)
            out["bandwidth_share"] = out["tokens_per_second"] / limit
        return out

    def summary(self) -> dict:
        """The run's generations in one dict: calls, seconds, tokens a second, ms per decode step, and the first
        generation's extra seconds over the others' median (its compilation, on "static-compiled")."""
        if not self.calls:
            return {"path": self.path, "calls": 0}
        steady = [c for c in self.calls if not c["first"]] or self.calls
        seconds, tokens, steps = (sum(c[k] for c in steady) for k in ("seconds", "tokens", "decode_steps"))
        median = sorted(c["seconds"] for c in steady)[len(steady) // 2]
        shares = [self.figures(c).get("bandwidth_share") for c in steady]
        return {"path": self.path, "calls": len(self.calls), "shapes": sum(c["first"] for c in self.calls),
                "compiled_after_first": sum(c["compiled"] for c in self.calls[1:]),
                "bandwidth_share": sum(shares) / len(shares) if None not in shares else None,
                "seconds": sum(c["seconds"] for c in self.calls), "tokens_per_second": tokens / max(seconds, 1e-9),
                "ms_per_decode_step": 1000 * seconds / max(1, steps),
                "first_extra_s": max(0.0, self.calls[0]["seconds"] - median) if len(self.calls) > 1 else None}


def _memory_percent_under_cap(default: float | None) -> float | None:
    """The ``max_memory_percent`` that turns what transformers reads as free (the card's ``mem_get_info``:
    continuous_batching/utils.py 398-410, cache.py 652-658) into what is free under this process's cap."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()) or \
            torch.cuda.get_per_process_memory_fraction() >= 1:
        return default
    fraction = torch.cuda.get_per_process_memory_fraction()
    torch.cuda.empty_cache()  # as transformers does before it reads
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    seen = total - max(total - free, reserved)
    return max(0.0, min(1.0, (fraction * total - reserved) / max(seen, 1)))


def _graphs_compiled() -> int:
    """How many graphs ``torch.compile`` has made in this process (``torch._dynamo``'s ``unique_graphs`` counter)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def dropped_settings_problem(path: str, generation_kwargs: dict | None, repetition_penalty: float = 1.0) -> str | None:
    """Say which generation settings ``path`` would silently drop, or return None: for "continuous", those of
    :data:`_CONTINUOUS_DROPS` in ``generation_kwargs`` and a ``repetition_penalty`` other than 1. One message for
    :func:`generation_problems` (a recipe's ``config``) and ``labkit.run.build_run`` (its caller's overrides)."""
    if path != "continuous":
        return None
    drops = sorted(k for k in _CONTINUOUS_DROPS if k in (generation_kwargs or {}))
    drops += ["repetition_penalty"] if repetition_penalty != 1.0 and "repetition_penalty" not in drops else []
    if not drops:
        return None
    return (f"generation='continuous' drops {', '.join(drops)} (transformers' continuous batching has no such logits "
            "processor): remove it, or set generation='generate'.")


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
