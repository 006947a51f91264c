"""How a check compares a learner's answer with the reference's, and shows the two side by side.

Numbers, tensors and containers of them are compared by :func:`torch.testing.assert_close` (``rtol=1e-4``,
``atol=1e-5``), anything else by ``==``; :func:`gradient_compare` compares the gradient too, for the exercises whose
answer must carry one. Used by :mod:`labkit.exercises` and its submodules.
"""
from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
import torch

__all__ = ["gradient_compare"]


def short_repr(value, limit: int = 160) -> str:
    text = repr(value)
    if isinstance(value, torch.Tensor):
        text = f"tensor{tuple(value.shape)} {value.detach().flatten()[:8].tolist()}" + (
            " ..." if value.numel() > 8 else "")
    return text if len(text) <= limit else text[:limit] + " ..."


RTOL, ATOL = 1e-4, 1e-5  # the check's tolerances, as torch.testing.assert_close's rtol and atol


def as_numbers(x) -> torch.Tensor | None:
    """Return ``x`` as a float64 tensor when it is a tensor, a number or a flat list of numbers, else ``None``."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return torch.tensor(float(x), dtype=torch.float64)
    if isinstance(x, (list, tuple)) and x and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x):
        return torch.tensor([float(v) for v in x], dtype=torch.float64)
    return None


def _rounded(number: str) -> str:
    try:
        return f"{float(number):.4g}"
    except ValueError:
        return number


def _not_close(expected, got, rtol: float = RTOL, atol: float = ATOL) -> str | None:
    """Return :func:`torch.testing.assert_close`'s message when ``got`` is not close to ``expected``, else ``None``.

    Tensors, numbers and lists, tuples and dicts of them, compared value by value (any dtype, NaN equal to
    NaN); a tensor beside a number or a list of numbers is compared by its values, and two one-element
    tensors of different shapes (a loss of shape ``()`` and one of ``(1,)``) as numbers. The message (its
    differences rounded to 4 digits, blank lines dropped) says how many elements differ and the greatest
    absolute and relative difference with its index, or the item of a list or dict that differs. Raises
    ``TypeError`` for what assert_close does not compare (text, None beside a number in a list, objects).
    """
    if expected is None or isinstance(expected, str):
        raise TypeError("text and None are compared with ==")
    if isinstance(expected, torch.Tensor) != isinstance(got, torch.Tensor):
        e, g = as_numbers(expected), as_numbers(got)
        if e is None or g is None:
            raise TypeError(f"{type(expected).__name__} against {type(got).__name__}")
        expected, got = e, g
    if isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor) and expected.numel() == got.numel() == 1:
        got = got.reshape(expected.shape)
    try:
        torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True, check_dtype=False)
    except AssertionError as error:
        message = re.sub(r"(difference: )(\S+)", lambda m: m.group(1) + _rounded(m.group(2)), str(error))
        return "\n".join(line for line in message.splitlines() if line.strip())
    except Exception as error:  # noqa: BLE001  no comparison for these types (TypeError, or a bool beside an int)
        raise TypeError(str(error)) from error
    return None


def torch_difference(expected, got) -> str | None:
    """Return assert_close's message on ``got`` against ``expected``; ``None`` when close or not comparable."""
    try:
        return _not_close(expected, got)
    except TypeError:
        return None


def unequal_message(expected, got) -> str:
    return f"expected {short_repr(expected)}, got {type(got).__name__} {short_repr(got)}"


def default_compare(expected, got, rtol: float = RTOL, atol: float = ATOL) -> str | None:
    """Return ``None`` when ``got`` matches ``expected``, else what differs.

    Numbers, tensors and containers of them: :func:`torch.testing.assert_close` (see :func:`_not_close`);
    anything else (text, None, a transcript of calls): ``==``.
    """
    try:
        return _not_close(expected, got, rtol, atol)
    except TypeError:
        pass
    try:
        same = bool(expected == got)
    except Exception:  # noqa: BLE001  e.g. a list of tensors against a list of tensors
        same = False
    return None if same else unequal_message(expected, got)


def _leaves(output: torch.Tensor) -> list[torch.Tensor]:
    """Return the leaf tensors (requires_grad) an output was computed from, by walking its autograd graph."""
    found, stack, seen = [], [output.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):  # AccumulateGrad: a leaf
            found.append(node.variable)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def gradient_compare(wrt: str) -> Callable[[Any, Any], str | None]:
    """Return a ``compare`` that checks the value, then the gradient of the answer's sum with respect to ``wrt``.

    The cases give that input ``requires_grad=True``; gradients are compared with ``rtol=1e-4``, ``atol=1e-6``.
    A detached, ``.item()``-rebuilt or ``no_grad`` answer is right in value and fails, and the message says so.
    """
    def compare(expected, got) -> str | None:
        value = default_compare(expected, got)
        if value is not None or not (isinstance(expected, torch.Tensor) and expected.requires_grad):
            return value
        if not (isinstance(got, torch.Tensor) and got.requires_grad):
            return (f"the value is right, but it carries no gradient (detached, rebuilt from .item(), or computed "
                    f"under torch.no_grad): backward() could not follow it back to {wrt}")
        leaves = _leaves(expected)
        ours = torch.autograd.grad(expected.sum(), leaves, retain_graph=True)
        theirs = torch.autograd.grad(got.sum(), leaves, retain_graph=True, allow_unused=True)
        for e, g in zip(ours, theirs):
            if g is None:
                return f"the value is right, but it does not depend on {wrt}: its gradient is missing"
            difference = _not_close(e, g, rtol=1e-4, atol=1e-6)
            if difference is not None:
                return (f"the value is right, but its gradient with respect to {wrt} is not the reference's: "
                        + "; ".join(difference.splitlines()[:3]))
        return None
    return compare


def _digits(expected: torch.Tensor | None, got: torch.Tensor | None) -> int:
    """Return the fewest significant digits (4 to 9) that show the first value not close in ``got`` apart."""
    if expected is None or got is None or expected.shape != got.shape:
        return 4
    apart = ~torch.isclose(got, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
    if not apart.any():
        return 4
    e, g = expected[apart].flatten()[0].item(), got[apart].flatten()[0].item()
    return next((d for d in range(4, 10) if f"{e:.{d}g}" != f"{g:.{d}g}"), 9)


def _readable(value, prefix: str, digits: int = 4) -> str:
    """Return ``value`` as a learner reads it: a tensor's values rounded (numpy's layout, with its shape), a float
    rounded, a tuple of tensors each so; anything else its ``repr``, abbreviated."""
    if isinstance(value, torch.Tensor):
        array = value.detach().cpu()
        array = (array.double() if array.is_floating_point() else array).numpy()
        text = np.array2string(array, separator=", ", prefix=prefix, threshold=100, edgeitems=5, max_line_width=110,
                               formatter={"float_kind": lambda v: f"{v:.{digits}g}"})
        return f"{text}  (shape {tuple(value.shape)})"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, tuple) and any(isinstance(v, torch.Tensor) for v in value):
        return "(" + ", ".join(_readable(v, prefix + " ", digits) for v in value) + ")"
    return short_repr(value)


def show_values(expected, got) -> str:
    """Return the lines of a verdict that show the answers: expected and got, readable, then assert_close's message.

    Tensors and numbers are rounded to 4 significant digits, or as many as it takes to tell the first
    differing value apart; torch's message adds how many values differ and where the greatest difference is.
    """
    digits = _digits(as_numbers(expected), as_numbers(got))
    lines = [f"  expected {_readable(expected, '  expected ', digits)}",
             f"  got      {_readable(got, '  got      ', digits)}"]
    lines += ["  " + line for line in (torch_difference(expected, got) or "").splitlines()]
    return "\n".join(lines) + "\n"
