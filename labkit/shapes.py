"""A model's shape: the numbers the memory estimator reads from an architecture, without loading a weight.

:func:`model_shape` builds any entry of :data:`labkit.models.ARCHITECTURES`, a transformers config, a saved
model folder or a loaded model on PyTorch's ``meta`` device and returns a :class:`ModelShape`: layers, widths,
heads, vocabulary, parameter counts (tied weights once), and every ``nn.Linear`` a LoRA could adapt.
:func:`labkit.memory.estimate` computes its terms from it (``labkit.memory`` re-exports :func:`model_shape`),
and :mod:`labkit.presets` (a plan's shape), :mod:`labkit.validation` and :mod:`labkit.scale` read it too. Introduced in
``05_full_vs_lora.ipynb``.
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field

__all__ = ["ModelShape", "model_config", "model_shape"]


@dataclass(frozen=True)
class ModelShape:
    """The numbers :func:`labkit.memory.estimate` needs from an architecture (see :func:`model_shape`)."""

    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    qk_norm: bool  # Qwen3 normalises queries and keys per head
    params: int  # total parameters, tied weights once
    param_numels: tuple[int, ...]  # every parameter tensor (tied once), for per-tensor optimiser states
    quantisable_params: int  # weights of nn.Linear layers other than the LM head: what QLoRA stores in 4 bits
    linear_weight_params: int  # same layers; what fp16 autocast casts to half precision in each forward
    lora_modules: tuple[tuple[str, int, int], ...] = field(repr=False)  # (name suffix, in, out) per Linear

    def lora_targets(self, targets) -> list[tuple[int, int]]:
        """Return ``[(in_features, out_features), ...]`` of the Linear layers a LoRA with ``targets`` adapts."""
        wanted = set(targets)
        return [(i, o) for name, i, o in self.lora_modules if name in wanted]


def model_config(model):
    """Return ``(name, transformers config)`` for a catalogue name, a saved folder, a config or a model."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(model, PretrainedConfig):
        return getattr(model, "_name_or_path", "") or model.model_type, model
    if hasattr(model, "config") and isinstance(model.config, PretrainedConfig):
        return model.config._name_or_path or model.config.model_type, model.config
    name = str(model)
    if os.path.isdir(name):
        return name, AutoConfig.from_pretrained(name)
    from labkit.models import architecture_config

    return name, architecture_config(name)


@functools.lru_cache(maxsize=64)
def _shape_from_json(name: str, config_json: str) -> ModelShape:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**json.loads(config_json))
    with torch.device("meta"):  # shapes only: no memory is allocated
        meta = AutoModelForCausalLM.from_config(config)
    text = config.get_text_config()
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    numels = [p.numel() for p in meta.parameters()]  # parameters() yields tied weights once
    lm_head = meta.get_output_embeddings()
    modules, linear = [], 0
    for module_name, module in meta.named_modules():
        if isinstance(module, torch.nn.Linear) and module is not lm_head:
            modules.append((module_name.rsplit(".", 1)[-1], module.in_features, module.out_features))
            linear += module.weight.numel()
    attention = meta.model.layers[0].self_attn
    return ModelShape(
        name=name,
        model_type=config.model_type,
        num_layers=text.num_hidden_layers,
        hidden_size=text.hidden_size,
        intermediate_size=text.intermediate_size,
        num_heads=heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        vocab_size=text.vocab_size,
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        qk_norm=hasattr(attention, "q_norm"),
        params=sum(numels),
        param_numels=tuple(numels),
        quantisable_params=linear,
        linear_weight_params=linear,
        lora_modules=tuple(modules),
    )


def model_shape(model) -> ModelShape:
    """Return the :class:`ModelShape` of ``model``: a catalogue name, a saved folder, a config or a model.

    The architecture is built on PyTorch's ``meta`` device, so counting the parameters of a 7B
    model costs no memory. Results are cached per configuration.
    """
    name, config = model_config(model)
    config_dict = config.to_dict()
    for key in ("_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype"):
        config_dict.pop(key, None)
    return _shape_from_json(name, json.dumps(config_dict, sort_keys=True, default=str))
