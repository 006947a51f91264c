"""Exact memory counters that check :func:`labkit.memory.estimate`: the bytes PyTorch holds, and what autograd saves.

:func:`state_bytes` sums weights, gradients and optimiser states of a real model; :func:`saved_activation_bytes`
counts what autograd keeps for the backward pass of a forward. Both run on any device; ``labkit.memory``
re-exports them (``from labkit.memory import state_bytes`` keeps working). Introduced in ``05_full_vs_lora.ipynb``.
"""
from __future__ import annotations

__all__ = ["state_bytes", "saved_activation_bytes"]


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
