"""A reproducer's checks: its rank against the single-process result, its replicas
against its peers', its trace against the harness's trace rules. The first violation
raises ``AssertionError`` with one evidence line ("rank 1, step 2, 'fc.weight': gradient:
max abs error 0.0315 vs the single-process result (tolerance 1.1e-06)").

Tolerances are the harness's (``judge/tolerance.py``, written into the case): norm-wise,
``max|got - want| <= rtol * max(scale, max|want|)``, rtol the parameter dtype's (the
loosest of a mixed model's) or the scenario's override; bitwise for an exact scenario.
"""
from __future__ import annotations

import re
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ddp_conformance.script.case import Case
from ddp_conformance.script.single_process import OracleRecord, Tensors, clone


def rtol(case: Case, dtype: torch.dtype) -> float:
    """judge/tolerance.py: bitwise where exact, the scenario's override, else the dtype's
    (at least the model's loosest gradient dtype's: a mixed model carries its rounding)."""
    if case.exact or not (dtype.is_floating_point or dtype.is_complex):
        return 0.0
    if case.rtol_override is not None:
        return case.rtol_override
    floor = max((case.rtol.get(d, 1e-5) for d in case.grad_dtypes), default=0.0)
    return max(case.rtol.get(str(dtype).removeprefix("torch."), 1e-5), floor)


def compare(case: Case, rank: int, when: int | str, name: str, what: str, got: Tensor,
            want: Tensor, scale: float = 0.0, bitwise: bool = False) -> None:
    """max|got - want| <= rtol * max(scale, max|want|); ``when``: a step, or words."""
    when = f"step {when}" if isinstance(when, int) else when
    tolerance = 0.0 if bitwise else rtol(case, want.dtype)
    got, want = _real(got), _real(want)
    if got.shape != want.shape:
        raise AssertionError(f"rank {rank}, {when}, {name!r}: {what}: shape "
                             f"{tuple(got.shape)} vs the single-process {tuple(want.shape)}")
    error = float((got - want).abs().max()) if got.numel() else 0.0
    scale = max(scale, float(want.abs().max()) if want.numel() else 0.0)
    if not error <= tolerance * scale:  # NaN fails too
        raise AssertionError(f"rank {rank}, {when}, {name!r}: {what}: max abs error "
                             f"{error:.3g} vs the single-process result (tolerance "
                             f"{tolerance * scale:.3g})")


def _real(tensor: Tensor) -> Tensor:
    """``tensor`` dense in float64; a complex one as its real view (real and imaginary
    parts side by side, as torch's reducer reduces it), so no component is dropped."""
    tensor = tensor.detach().to_dense()
    return (torch.view_as_real(tensor) if tensor.is_complex() else tensor).double()


def compare_all(case: Case, rank: int, when: int | str, what: str, got: Tensors, want: Tensors,
                bitwise: bool = False) -> None:
    if set(got) != set(want):
        raise AssertionError(f"rank {rank}, {when}: {what}: names "
                             f"{sorted(set(got) ^ set(want))} on one side only")
    for name in want:
        compare(case, rank, when, name, what, got[name], want[name], bitwise=bitwise)


def forward_name(case: Case, mb: int, f: int) -> str:
    """A forward of the step's plan, in words."""
    if mb < 0:
        return "the eval forward (no_grad, eval())"
    return f"microbatch {mb}'s forward" + (f" {f}" if case.forwards > 1 else "")


def check_init(case: Case, rank: int, module: nn.Module, want: OracleRecord) -> None:
    """DDP's init sync: the group's first rank's parameters, its buffers where broadcast."""
    compare_all(case, rank, "after wrapping", "parameter (DDP's init sync broadcasts its "
                "group's rank 0's)", clone(dict(module.named_parameters())),
                want.initial_params, bitwise=True)
    compare_all(case, rank, "after wrapping", "buffer (DDP's init sync broadcasts its group's "
                "rank 0's, with broadcast_buffers)", clone(dict(module.named_buffers())),
                want.initial_buffers[rank], bitwise=True)


def check_step(case: Case, rank: int, step: int, want: OracleRecord, grads: dict[str, Any],
               at_forward: list[Tensors], module: nn.Module, group_size: int) -> None:
    """One step of this rank against the single-process result."""
    expected = want.steps[step]
    if not case.oracle_after_join and len(expected.active) < group_size:
        return  # a rank has joined: the scenario leaves the single-process trajectory
    if case.buffer_checks:
        if len(at_forward) != len(expected.buffers_at_forward[rank]):
            raise AssertionError(f"rank {rank}, step {step}: {len(at_forward)} forwards seen, "
                                 f"{len(expected.buffers_at_forward[rank])} expected")
        for (mb, f), seen, buffers in zip(case.plan[step], at_forward,
                                          expected.buffers_at_forward[rank], strict=True):
            compare_all(case, rank, step, f"buffer at the start of {forward_name(case, mb, f)}",
                        seen, buffers)
    for name, g in expected.grads.items():
        if case.join is not None and g is None and grads[name] is not None \
                and name in expected.zero_or_none and not torch.count_nonzero(grads[name]):
            continue  # zeros where None is expected: torch's stale used map under Join
        if (grads[name] is None) != (g is None):
            raise AssertionError(f"rank {rank}, step {step}, {name!r}: gradient is "
                                 f"{'None' if grads[name] is None else 'a tensor'}, the "
                                 f"single-process gradient is {'None' if g is None else 'not'}")
        if g is not None:
            compare(case, rank, step, name, "gradient", grads[name], g,
                    expected.grad_scales.get(name, 0.0))
    compare_all(case, rank, step, "parameter after the step",
                clone(dict(module.named_parameters())), expected.params)
    if case.buffer_checks:
        compare_all(case, rank, step, "buffer after the step",
                    clone(dict(module.named_buffers())), expected.buffers[rank])


def check_expected_error(case: Case, rank: int, raised: str | None, steps: int) -> None:
    """Every rank raised the case's error (a regular expression on 'Type: message')."""
    if raised is None:
        raise AssertionError(f"rank {rank} finished its {steps} steps without raising; "
                             f"expected an error matching {case.expect_error!r}")
    if not re.search(case.expect_error or "", raised):
        raise AssertionError(f"rank {rank} raised {raised!r}, expected an error matching "
                             f"{case.expect_error!r}")
    print(f"rank {rank} raised the expected error: {raised}", flush=True)


def check_replicas(case: Case, rank: int, group: Any, members: list[int], record: Any,
                   want: OracleRecord) -> None:
    """Bitwise equal replicas: every rank that ran a step holds the parameters of the
    lowest such rank, and its buffers at each forward where DDP broadcasts; after the
    training every rank holds the same parameters, and under Join the last joiner's
    buffers. Collectives of the group, after Join, where every rank takes part."""
    def from_rank(src: int, mine: Tensor, like: Tensor) -> Tensor:
        theirs = (mine if rank == src else torch.zeros_like(like)).clone()
        dist.broadcast(theirs, src, group=group)
        return theirs

    for step in range(max(case.steps_for[r] for r in members)):
        first = min(r for r in members if step < case.steps_for[r])
        ran = step < len(record.params)
        for name, like in record.final_params.items():
            mine = record.params[step][name] if ran else like
            if not torch.equal(mine, from_rank(first, mine, like)) and ran:
                raise AssertionError(f"rank {rank}, step {step}, {name!r}: parameter after the "
                                     f"step differs from rank {first}'s (replicas must stay "
                                     "bitwise equal)")
        for i, (mb, f) in enumerate(case.plan[step]):
            if not (case.broadcast_buffers and case.broadcasts[step][i]):
                continue
            ran_it = ran and i < len(record.at_forward[step])
            for name, like in record.final_buffers.items():
                mine = record.at_forward[step][i][name] if ran_it else like
                if not torch.equal(mine, from_rank(first, mine, like)) and ran_it:
                    raise AssertionError(f"rank {rank}, step {step}, {name!r}: buffer at the "
                                         f"start of {forward_name(case, mb, f)} differs from "
                                         f"rank {first}'s (DDP broadcast it)")
    _check_final(case, rank, members, record, want, from_rank)


def _check_final(case: Case, rank: int, members: list[int], record: Any, want: OracleRecord,
                 from_rank: Any) -> None:
    """After training: every rank's parameters the lowest rank's; under Join with
    broadcast buffers, the last joiner's buffers."""
    lowest = min(members)
    for name, mine in record.final_params.items():
        if not torch.equal(mine, from_rank(lowest, mine, mine)):
            raise AssertionError(f"rank {rank}, after training, {name!r}: parameter differs from "
                                 f"rank {lowest}'s (every rank must end with the same model; "
                                 "Join's exit broadcasts the last joiner's)")
    if case.join is not None and case.broadcast_buffers:
        compare_all(case, rank, "after training", f"buffer (Join's exit syncs the last "
                    f"joiner's, rank {want.last_joiner}'s)", record.final_buffers,
                    want.final_buffers)
