"""Counting the bytes autograd saves for backward (the training loop's --memory-report and benchmarks.memory)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import torch

T = TypeVar("T")


def saved_tensor_bytes(fn: Callable[[], T], exclude: Iterable[torch.Tensor] = ()) -> tuple[int, T]:
    """(bytes of the unique storages autograd saves while fn() runs, fn's result).

    Storages of the tensors in `exclude` (e.g. a model's parameters) are not counted. The caller decides what
    happens to the graph: run backward on the result, or drop it.
    """

    def key(t: torch.Tensor):
        return (t.device.type, t.device.index, t.untyped_storage().data_ptr())

    skip = {key(t) for t in exclude}
    seen: dict[tuple, int] = {}

    def pack(t):
        k = key(t)
        if k not in skip:
            seen[k] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out
