"""The rehearsal's tools: a policy at full size made of fake tensors, a counter of the bytes alive, and the CUDA
behaviours a CPU fake-tensor run must reproduce (:mod:`bench.rehearse` runs the step with them).

PyTorch's ``FakeTensorMode`` runs a model's real code with tensors that carry a shape, a dtype and a
device but no data: nothing is computed and nothing is allocated, yet every tensor the step creates
is seen, with its dtype and shape checked by PyTorch's meta kernels. A :class:`LiveBytes` dispatch mode
counts the bytes of every storage alive (each storage once) and records the peak of each phase with a
breakdown. What it does not count and which CUDA behaviours it reproduces on CPU fake tensors (fake
``"cuda"`` tensors cannot run a backward pass without a driver) are listed in :data:`NOT_COUNTED` and
:data:`EMULATED`, each with the library line it mirrors.
"""
from __future__ import annotations

import contextlib
import types
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["EMULATED", "NOT_COUNTED", "LABEL", "LiveBytes", "fake_policy", "cuda_behaviours", "generate", "loss_context",
           "optimizer_for"]

LABEL = "rehearsed (fake tensors)"

# (what a CUDA run does differently from CPU fake tensors, the library line the rehearsal mirrors)
EMULATED = (
    ("TRL's fused LM head scores only the completion tokens (compact) on a Triton device",
     "trl/trainer/utils.py:1642 (compact = _use_triton(...))"),
    ("Triton folds each logits tile in place; the torch fallback's fp32 temporaries of the tile are not made",
     "trl/kernels/chunked_logprob.py:79 and :151 (_forward_kernel, _backward_kernel) instead of :211, :257"),
    ("the LM head's gradient GEMMs accumulate into fp32 in place (addmm out_dtype=fp32), no fp32 copies",
     "trl/kernels/chunked_logprob.py:59-60 (_addmm_fp32)"),
    ("dropout keeps a bool mask (CUDA's fused native_dropout), not a float one",
     "torch/_decomp/decompositions.py:1272-1273, 1288-1290 (dropout -> native_dropout, bool_mask)"),
    ("SDPA with a padding mask runs the memory-efficient kernel: the bool mask becomes an additive bias in the "
     "query's dtype, the log-sum-exp is fp32 padded to a multiple of 32",
     "torch/_meta_registrations.py:6495-6534 (_scaled_dot_product_efficient_attention); "
     "transformers/integrations/sdpa_attention.py:43-53, 130-138 (repeat_kv with a mask)"),
    ("torch.is_autocast_enabled() without a device asks about CUDA: under the rehearsal's CPU autocast it answers "
     "for the CPU, so PEFT's 4-bit LoRA layer skips its input cast as it does under CUDA autocast",
     "peft/tuners/lora/bnb.py:543-546"),
    ("accelerate runs the forward under autocast and returns fp32 outputs",
     "accelerate/accelerator.py:1826-1835 (autocast_context, convert_outputs_to_fp32)"),
    ("fp16: GradScaler scales the loss and unscales the gradients before clipping; the step runs when no inf "
     "was found (.item() reads 0 on fake tensors, so found_inf is 0: the no-inf branch)",
     "torch/amp/grad_scaler.py:294, 371; accelerate/accelerator.py:2857, 3047"),
    ("paged 8-bit AdamW: states counted as resident on the card (they are paged out only under pressure)",
     "bitsandbytes/optim/optimizer.py:383 (get_state_buffer)"),
)

NOT_COUNTED = (
    "the CUDA context and kernels loaded (about 0.3-0.5 GiB on a card, outside PyTorch's allocator)",
    "allocator fragmentation and cached blocks (torch.cuda.memory_reserved - memory_allocated)",
    "cuBLAS / cuDNN workspaces",
    "CPU autocast's op lists stand in for CUDA's (the same matmuls run in half precision; a few "
    "reductions differ)",
    "the reward functions, the tokenizer, the dataset and Python objects (CPU memory, not the card's)",
)


# --------------------------------------------------------------------------- counting live bytes


class LiveBytes(TorchDispatchMode):
    """Count the bytes of every storage that op outputs create, each storage once, while it is alive.

    A storage is counted when an op first returns a tensor on it and uncounted when Python frees it
    (storages keep their Python object while any tensor or autograd node holds them). ``category``
    labels new storages (``label`` relabels one: gradients, optimiser states, the KV cache);
    ``phase`` names the phase whose peak (with the breakdown by category at that moment) is kept.
    """

    def __init__(self):
        super().__init__()
        self.live: dict[int, list] = {}  # storage id -> [bytes, category]
        self.by_category: dict[str, int] = {}
        self.current = 0
        self.category = "weights"
        self.phase = "setup"
        self.peaks: dict[str, tuple[int, dict]] = {}
        # A boolean index's size depends on values: the rehearsal says how many are True (TRL's label mask:
        # every completion token), so ``hidden_states[mask]`` gets its real shape.
        self.true_count: int | None = None

    def _masked(self, func, args):
        aten = torch.ops.aten
        if func is aten._local_scalar_dense.default:  # .item(): metrics and GradScaler's found_inf read as 0
            return False if args[0].dtype == torch.bool else 0 if not args[0].is_floating_point() else 0.0
        if self.true_count is None:
            return None
        if func is aten.index.Tensor:
            source, indices = args[0], args[1]
            if len(indices) == 1 and indices[0] is not None and indices[0].dtype == torch.bool:
                k = indices[0].dim()
                return torch.empty((self.true_count, *source.shape[k:]), dtype=source.dtype)
        elif func in (aten.index_put_.default, aten._index_put_impl_.default):
            indices = args[1]
            if len(indices) == 1 and indices[0] is not None and indices[0].dtype == torch.bool:
                return args[0]  # in place: no new storage
        elif func is aten.index_put.default:
            indices = args[1]
            if len(indices) == 1 and indices[0] is not None and indices[0].dtype == torch.bool:
                return torch.empty_like(args[0])
        return None

    def _add(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.live:
            return
        nbytes = storage.nbytes()
        self.live[key] = [nbytes, self.category]
        self.by_category[self.category] = self.by_category.get(self.category, 0) + nbytes
        self.current += nbytes
        weakref.finalize(storage, self._drop, key)
        peak = self.peaks.get(self.phase)
        if peak is None or self.current > peak[0]:
            self.peaks[self.phase] = (self.current, dict(self.by_category))

    def _drop(self, key: int) -> None:
        nbytes, category = self.live.pop(key)
        self.by_category[category] -= nbytes
        self.current -= nbytes

    def label(self, tensor: torch.Tensor | None, category: str) -> None:
        """Count ``tensor``'s storage under ``category`` from now on."""
        if tensor is None:
            return
        key = tensor.untyped_storage()._cdata
        if key not in self.live:
            self._add(tensor)
        record = self.live[key]
        if record[1] != category:
            self.by_category[record[1]] -= record[0]
            self.by_category[category] = self.by_category.get(category, 0) + record[0]
            record[1] = category

    def start(self, phase: str, category: str) -> None:
        """Enter ``phase`` (again): its peak counts from what is alive now; new storages are ``category``."""
        self.phase, self.category = phase, category
        if phase not in self.peaks or self.peaks[phase][0] < self.current:
            self.peaks[phase] = (self.current, dict(self.by_category))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = self._masked(func, args)
        if out is None:
            out = func(*args, **(kwargs or {}))
        if self.phase == "generation" and func is torch.ops.aten.cat.default and out.dim() == 4:
            category, self.category = self.category, "kv_cache"  # DynamicLayer.update's torch.cat
            self._add(out)
            self.category = category
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                self._add(item)
        return out


# --------------------------------------------------------------------------- CUDA behaviours on CPU fakes


def _efficient_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
    """``F.scaled_dot_product_attention`` as CUDA dispatches it for these inputs (see :data:`EMULATED`)."""
    if attn_mask is None:  # no mask: the flash kernel, which keeps q, k, v, the output and the log-sum-exp
        return _ORIGINAL_SDPA(query, key, value, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                              enable_gqa=enable_gqa)
    if attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype).masked_fill_(~attn_mask, float("-inf"))
    bias = attn_mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, torch.is_grad_enabled() and query.requires_grad, dropout_p, is_causal,
        scale=scale)
    return out[0]


_ORIGINAL_SDPA = torch.nn.functional.scaled_dot_product_attention
_ORIGINAL_IS_AUTOCAST_ENABLED = torch.is_autocast_enabled


def _is_autocast_enabled(*args, **kwargs):
    """``torch.is_autocast_enabled()`` with no device means CUDA: here the CPU autocast stands in for it."""
    return _ORIGINAL_IS_AUTOCAST_ENABLED(*args, **kwargs) if args or kwargs else _ORIGINAL_IS_AUTOCAST_ENABLED("cpu")


def _fused_dropout(self, x):
    """``nn.Dropout.forward`` through ``native_dropout``: a bool mask, as CUDA's fused kernel keeps."""
    if not self.training or self.p == 0:
        return x
    return torch.ops.aten.native_dropout(x, self.p, True)[0]


def _forward_fold_in_place(tile, tile_stride, targets, running_max, sum_exp, *args, **kwargs):
    """Triton's forward fold: reads the tile, updates the per-token statistics in place, allocates nothing."""


def _backward_fold_in_place(tile, *args, **kwargs):
    """Triton's backward fold: turns the tile into the logits gradient in place, allocates nothing."""


def _addmm_fp32_in_place(acc, a, b):
    """``torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)``: CUDA's branch of ``_addmm_fp32``."""
    torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)


@contextlib.contextmanager
def cuda_behaviours():
    """Patch, for the rehearsal only, the places where a CUDA run allocates differently from CPU fakes."""
    import trl.kernels.chunked_logprob as kernels
    import trl.trainer.utils as trl_utils

    saved = [(trl_utils, "_use_triton", trl_utils._use_triton), (kernels, "_forward_tile", kernels._forward_tile),
             (kernels, "_backward_tile", kernels._backward_tile), (kernels, "_addmm_fp32", kernels._addmm_fp32),
             (torch.nn.functional, "scaled_dot_product_attention", _ORIGINAL_SDPA),
             (torch.nn.Dropout, "forward", torch.nn.Dropout.forward),
             (torch, "is_autocast_enabled", _ORIGINAL_IS_AUTOCAST_ENABLED)]
    trl_utils._use_triton = lambda device: True  # compact: only completion tokens are scored
    kernels._forward_tile, kernels._backward_tile = _forward_fold_in_place, _backward_fold_in_place
    kernels._addmm_fp32 = _addmm_fp32_in_place
    torch.nn.functional.scaled_dot_product_attention = _efficient_sdpa
    torch.nn.Dropout.forward = _fused_dropout
    torch.is_autocast_enabled = _is_autocast_enabled
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


# --------------------------------------------------------------------------- the policy on fake tensors


class _Linear4bit(torch.nn.Linear):
    """A stand-in for ``bitsandbytes.nn.Linear4bit`` whose weight can be a fake tensor.

    ``Params4bit`` cannot wrap a fake tensor, so the packed NF4 codes are a plain ``uint8`` parameter
    (``(out x in + 1) // 2`` bytes) with a ``QuantState`` (8-bit absmax per 64 weights, double-quantised
    with an fp32 absmax per 256 of them); ``forward`` mirrors ``Linear4bit.forward``
    (bitsandbytes/nn/modules.py:609-637) and calls the same ``bnb.matmul_4bit``.
    """

    def __init__(self, linear: torch.nn.Linear, compute_dtype: torch.dtype):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        n = self.in_features * self.out_features
        self.weight = torch.nn.Parameter(torch.empty(((n + 1) // 2, 1), dtype=torch.uint8, device="meta"),
                                         requires_grad=False)
        self.bias = linear.bias
        self.compute_dtype = compute_dtype
        self.register_buffer("absmax", torch.empty(-(-n // 64), dtype=torch.uint8, device="meta"))
        self.register_buffer("absmax2", torch.empty(-(-n // 64 // 256), dtype=torch.float32, device="meta"))
        self.register_buffer("offset", torch.empty((), dtype=torch.float32, device="meta"))

    def quant_state(self, codes):
        import bitsandbytes.functional as F

        nested = F.QuantState(absmax=self.absmax2, code=codes["dynamic"], blocksize=256, dtype=torch.float32)
        return F.QuantState(absmax=self.absmax, shape=torch.Size([self.out_features, self.in_features]),
                            code=codes["nf4"], blocksize=64, quant_type="nf4", dtype=self.compute_dtype,
                            offset=self.offset, state2=nested)

    def forward(self, x):
        import bitsandbytes as bnb

        inp_dtype = x.dtype
        x = x.to(self.compute_dtype)
        bias = self.bias
        if bias is not None:
            if bias.dtype != x.dtype:
                bias.data = bias.data.to(x.dtype)
            bias = bias.to(self.compute_dtype)
        return bnb.matmul_4bit(x, self.weight.t(), bias=bias, quant_state=self._quant_state).to(inp_dtype)


def _quant_codes() -> dict:
    """The NF4 and dynamic 8-bit code books, built with real tensors (they call ``.tolist()``)."""
    import bitsandbytes.functional as F

    return {"nf4": F.get_4bit_type("nf4", device="cpu"), "dynamic": F.create_dynamic_map(signed=True)}


def _materialise(model: torch.nn.Module) -> None:
    """Replace every meta parameter and buffer by an empty (fake) one of the same shape and dtype; ties kept."""
    made: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for table, wrap in ((module._parameters, True), (module._buffers, False)):
            for name, old in list(table.items()):
                if old is None:
                    continue
                if id(old) not in made:
                    new = torch.empty(old.shape, dtype=old.dtype, device="cpu")
                    made[id(old)] = torch.nn.Parameter(new, requires_grad=old.requires_grad) if wrap else new
                table[name] = made[id(old)]


def fake_policy(plan, fake_mode, tracker: LiveBytes | None = None, *, num_layers: int | None = None):
    """Return the plan's policy with fake weights, set up as ``build_run`` and TRL 1.16 set it up.

    The model is built on the meta device (random init needs real generators) and PEFT's LoRA applied
    there; then, inside ``fake_mode`` (and ``tracker``), every weight is materialised as a fake tensor.
    ``num_layers`` builds a shallower model of the same width (the fast rows of the tests).
    """
    from peft import get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM

    from labkit.models import architecture_config, enable_checkpointing

    config = architecture_config(plan.shape_name, **({"num_hidden_layers": num_layers} if num_layers else {}))
    checkpointing = plan.config["activation_checkpointing"]
    load_dtype = plan.compute_dtype if plan.method == "qlora" else plan.weight_dtype
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=load_dtype, attn_implementation="sdpa")
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if plan.method == "qlora":  # transformers swaps every Linear but the head for bitsandbytes' Linear4bit
        head = model.get_output_embeddings()
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear) and child is not head:
                    setattr(parent, name, _Linear4bit(child, plan.compute_dtype))
        model.is_loaded_in_4bit = True
    if plan.method == "qlora" and plan.preset.prepare_model_for_kbit_training:
        # labkit.models.load_policy with the preset's option: PEFT turns every weight that is not 4-bit into fp32
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})
    elif checkpointing:
        enable_checkpointing(model)  # TRL: activation_checkpointing with {"use_reentrant": False}
    if plan.peft_config is not None:
        model = get_peft_model(model, plan.peft_config)
        if plan.method == "qlora":  # PEFT wraps a Linear4bit base with its bitsandbytes LoRA layer
            from peft.tuners.lora import Linear as LoraLinear
            from peft.tuners.lora.bnb import Linear4bit as LoraLinear4bit

            for module in model.modules():
                if type(module) is LoraLinear:
                    module.__class__ = LoraLinear4bit
        if checkpointing:
            model.enable_input_require_grads()  # trl/trainer/grpo_trainer.py:529-530
    codes = _quant_codes() if plan.method == "qlora" else None
    with fake_mode, (tracker or contextlib.nullcontext()):
        _fake_weights(model, plan, tied, codes, tracker)
    return model


def _fake_weights(model, plan, tied: bool, codes, tracker) -> None:
    from trl.trainer.utils import add_fused_lm_head

    from labkit.models import match_adapter_dtype

    _materialise(model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if tied:
        base.get_output_embeddings().weight = base.get_input_embeddings().weight
    if plan.method == "qlora":
        for module in model.modules():
            if isinstance(module, _Linear4bit):
                module._quant_state = module.quant_state(codes)
        for param in model.parameters():  # trl/trainer/grpo_trainer.py:538-541: adapters to bf16
            if param.requires_grad:
                param.data = param.data.to(torch.bfloat16)
        match_adapter_dtype(model, plan.precision)  # labkit's fix: fp32 adapters under fp16 (GradScaler)
    add_fused_lm_head(base, temperature=plan.config["temperature"], outputs=("log_probs", "entropy"))
    if tracker is not None:
        for param in model.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(lambda p: tracker.label(p.grad, "gradients"))


# --------------------------------------------------------------------------- the phases


def _autocast(plan):
    if plan.precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=plan.compute_dtype)


def generate(model, plan, tracker: LiveBytes, prompts: int, prompt_len: int, completion_len: int,
             tool_rounds: int = 0) -> list[int]:
    """Prefill and decode ``completion_len`` tokens for ``prompts`` sequences, as ``generate``'s ``_sample`` does; then
    ``tool_rounds`` tool rounds as TRL 1.16's ``_tool_call_loop`` runs them.

    Decoding steps cost the same allocations but for the cache's length, so step 1 runs, the cache is then
    grown to the length before the last step with one ``DynamicCache.update`` per layer (the same
    ``torch.cat`` every step does, transformers/cache_utils.py:136-137), and the last step runs in full.
    A tool round is a new ``generate`` call (trl/trainer/grpo_trainer.py:2124-2130) on prompt + reply + tool turn,
    at most ``prompt_len + completion_len`` tokens (longer ones are dropped, :2054-2057), prefilled from scratch
    for every sequence, asking ``completion_len`` new tokens again (``max_new_tokens``, :1156; cut only afterwards,
    :2136-2144): each round is rehearsed at that worst case, after the first turn's cache is freed. Returns the
    phase's peak so far after each turn (the first turn's, then each round's).
    """
    from transformers import DynamicCache

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    checkpointing = getattr(base, "is_gradient_checkpointing", False)
    if checkpointing:  # trl/models/utils.py:136-138: generation runs without checkpointing
        base.gradient_checkpointing_disable()

    def sample(out):  # transformers/generation/utils.py:3247, 3274-3276
        logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
        probs = torch.nn.functional.softmax(logits / plan.config["temperature"], dim=-1)
        return torch.multinomial(probs, num_samples=1)

    peaks = []
    for prefill_len in [prompt_len] + [prompt_len + completion_len] * tool_rounds:
        ids = torch.zeros((prompts, prefill_len), dtype=torch.long)
        mask = torch.ones((prompts, prefill_len), dtype=torch.long)
        cache = DynamicCache(config=base.config)

        def label_cache(cache):
            for layer in cache.layers:
                tracker.label(getattr(layer, "keys", None), "kv_cache")
                tracker.label(getattr(layer, "values", None), "kv_cache")

        with torch.no_grad(), _autocast(plan):
            out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=1)
            label_cache(cache)
            done = 1
            while done < completion_len:
                next_ids = sample(out)
                del out
                ids = torch.cat([ids, next_ids], dim=-1)
                mask = torch.cat([mask, mask.new_ones((prompts, 1))], dim=-1)
                skip = completion_len - 1 - done if done == 1 else 0
                if skip > 0:  # steps 2 .. C-1: grow the cache (and the ids and mask) to their final length at once
                    for index, layer in enumerate(cache.layers):
                        block = torch.empty((*layer.keys.shape[:2], skip, layer.keys.shape[-1]), dtype=layer.keys.dtype)
                        cache.update(block, block.clone(), index)
                        del block
                    ids = torch.cat([ids, ids.new_zeros((prompts, skip))], dim=-1)
                    mask = torch.cat([mask, mask.new_ones((prompts, skip))], dim=-1)
                    done += skip
                label_cache(cache)
                out = model(input_ids=next_ids, attention_mask=mask, past_key_values=cache, use_cache=True,
                            logits_to_keep=1)
                label_cache(cache)
                done += 1
            ids = torch.cat([ids, sample(out)], dim=-1)
            del out
        if ids.shape != (prompts, prefill_len + completion_len):
            raise RuntimeError(f"the rehearsed generation made {tuple(ids.shape)} tokens, not "
                               f"{(prompts, prefill_len + completion_len)}")
        del cache, ids, mask  # TRL keeps the completions as lists of token ids: nothing of a turn stays on the card
        peaks.append(tracker.peaks[tracker.phase][0])
    if checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return peaks


def loss_context(plan, model):
    """An object with the attributes ``GRPOTrainer._compute_loss`` reads, from a real ``GRPOConfig``."""
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir="/tmp/labkit-rehearsal", use_cpu=True, report_to="none",
                      **{**plan.preset.config, "loss_type": plan.loss_type})

    accelerator = types.SimpleNamespace(autocast=lambda: _autocast(plan), num_processes=1, sync_gradients=True,
                                        is_main_process=True, reduce=lambda x, reduction="sum": x,
                                        gather=lambda x: x, gather_for_metrics=lambda x: x)
    ctx = types.SimpleNamespace(
        args=args, model=model, accelerator=accelerator, beta=args.beta, loss_type=args.loss_type,
        epsilon_low=args.epsilon, epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        importance_sampling_level=args.importance_sampling_level,
        off_policy_mask_threshold=args.off_policy_mask_threshold, top_entropy_quantile=args.top_entropy_quantile,
        entropy_coef=args.entropy_coef, use_adaptive_entropy=args.use_adaptive_entropy,
        _entropy_bonus_enabled=args.entropy_coef != 0.0 or args.use_adaptive_entropy, aux_loss_enabled=False,
        use_vllm=False, vllm_importance_sampling_correction=False, max_completion_length=args.max_completion_length,
        current_gradient_accumulation_steps=args.gradient_accumulation_steps,
        _metrics={"train": __import__("collections").defaultdict(list)})
    ctx._get_per_token_logps_and_entropies = types.MethodType(GRPOTrainer._get_per_token_logps_and_entropies, ctx)
    ctx.get_high_entropy_mask = types.MethodType(GRPOTrainer.get_high_entropy_mask, ctx)
    ctx.compute_loss = types.MethodType(GRPOTrainer._compute_loss, ctx)
    return ctx, args


def optimizer_for(plan, params):
    """The optimiser ``GRPOConfig.optim`` names, built outside fake mode (bitsandbytes' maps call .tolist())."""
    import bitsandbytes as bnb

    lr = plan.config["learning_rate"]
    name = plan.config["optim"]
    if name in ("adamw_bnb_8bit", "adamw_8bit"):
        return bnb.optim.AdamW8bit(params, lr=lr)
    if name == "paged_adamw_8bit":
        return bnb.optim.PagedAdamW8bit(params, lr=lr)
    if name == "paged_adamw_32bit":
        return bnb.optim.PagedAdamW32bit(params, lr=lr)
    return torch.optim.AdamW(params, lr=lr, foreach=False)


