"""Finding parameters a forward pass did not use, from its autograd graph.

Specifies torch's ``_find_tensors`` (``torch/nn/parallel/distributed.py``: tensors inside
lists, tuples, dict values and dataclass fields of the output) and the reducer's
``search_unused_parameters`` (``reducer.cpp``): walk ``next_functions`` from the outputs'
``grad_fn`` and report every gradient accumulator (``AccumulateGrad`` node) never reached.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import torch


def find_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor contained in a forward output, in order."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from find_tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from find_tensors(item)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            yield from find_tensors(getattr(obj, field.name))


def grad_accumulator(param: torch.Tensor) -> Any:
    """The ``AccumulateGrad`` node of a leaf tensor (created on first request).

    The tensor only holds it weakly: the caller must keep it alive for its identity (and
    the hooks registered on it) to last.
    """
    node = param.view_as(param).grad_fn
    if node is None:
        raise RuntimeError("a parameter that requires grad must have a gradient accumulator")
    return node.next_functions[0][0]


def reachable_nodes(outputs: Sequence[torch.Tensor]) -> set[Any]:
    """The autograd nodes reachable from the outputs' ``grad_fn`` (the seeds themselves are
    only included when reached again, as in torch's traversal)."""
    seen: set[Any] = set()
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        for next_node, _ in node.next_functions:
            if next_node is not None and next_node not in seen:
                seen.add(next_node)
                stack.append(next_node)
    return seen


def unused_parameter_indices(outputs: Sequence[torch.Tensor],
                             accumulators: Sequence[Any]) -> list[int]:
    """Indices of the parameters whose accumulator the outputs' graph does not reach."""
    seen = reachable_nodes(outputs)
    return [i for i, acc in enumerate(accumulators) if acc not in seen]
