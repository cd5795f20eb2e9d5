"""Comparing one step's gradients with expected ones: ``None``-ness first, then values.

Shared by the oracle and reference checks (``oracle.grad``/``oracle.grad_none``,
``reference.grad``/``reference.grad_none``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ddp_conformance.judge.evidence import Evidence
from ddp_conformance.judge.tolerance import Policy


def check_grads(ev: Evidence, prefix: str, step: int, rank: int,
                grads: dict[str, Tensor | None], expected: dict[str, Tensor | None],
                scales: dict[str, float], policy: Policy, against: str,
                zero_or_none: frozenset[str] = frozenset()) -> None:
    """``{prefix}.grad_none``: a gradient is ``None`` exactly where the expected one is
    (or, for a name in ``zero_or_none``, None or all zeros); ``{prefix}.grad``: where both
    are tensors, they agree within ``policy`` (the tolerance's magnitude raised to
    ``scales[name]``, what the reduction sums)."""
    ev.ran(f"{prefix}.grad_none")
    for name, want in expected.items():
        got = grads.get(name)
        if want is None and got is not None and name in zero_or_none and \
                not torch.count_nonzero(got.to_dense() if got.is_sparse else got):
            continue
        if (got is None) != (want is None):
            state = "None" if got is None else "a tensor"
            ev.fail(f"{prefix}.grad_none", f"step {step}, rank {rank}, {name!r}: gradient is "
                    f"{state}, {against}'s is {'None' if want is None else 'a tensor'}",
                    step, rank, name)
        elif got is not None and want is not None:
            ev.compare(f"{prefix}.grad", step, rank, name, got, want, policy.rtol(want.dtype, step),
                       against, scales.get(name, 0.0))
