"""The checks every scenario runs (SPEC.md, "What every scenario checks").

- ``init.param`` / ``init.buffer``: after wrapping, every rank holds rank 0's initial
  parameters, bitwise, and rank 0's buffers where ``broadcast_buffers`` (its own otherwise):
  DDP's init sync broadcasts them.
- ``oracle.grad`` / ``oracle.grad_none``: the synced gradients equal the oracle's within the
  dtype's tolerance (bitwise for exact-valued scenarios), and a gradient is ``None`` exactly
  where the oracle's is.
- ``oracle.param`` / ``oracle.buffer``: parameters and buffers after each step equal the
  oracle's trajectory.
- ``replica.param``: after each step, parameters are bitwise identical on all ranks that
  trained in it.
- ``replica.buffer_broadcast``: with ``broadcast_buffers``, every forward at which DDP
  broadcasts (see ``procedure.buffers_broadcast``) starts from the same buffers on every
  rank, bitwise.
- ``replica.final``: after the training loop (and Join's final sync), parameters are
  bitwise identical on every rank, and buffers equal the last joiner's where broadcast.
- ``reference.grad`` / ``reference.grad_none`` / ``reference.param`` / ``reference.buffer``:
  the same trajectory as the reference DDP (``ddp_reference``) run on the same data.
"""
from __future__ import annotations

import re

from torch import Tensor

from ddp_conformance.catalog.procedure import buffers_broadcast
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.judge.evidence import Evidence
from ddp_conformance.judge.oracle import OracleRecord
from ddp_conformance.judge.tolerance import BITWISE, Policy
from ddp_conformance.ranks.records import RankRecord, Tensors


def check_run(scenario: Scenario, records: dict[int, RankRecord], oracle: OracleRecord,
              ev: Evidence | None = None) -> Evidence:
    """Run every check on the per-rank records of one scenario against the oracle.

    A scenario that expects an error checks that error only (and, elsewhere, the trace):
    the iteration that fails is by definition not a DDP step.
    """
    ev = ev if ev is not None else Evidence()
    if scenario.expect_error is not None:
        _check_expected_error(ev, scenario.expect_error, records)
        return ev
    exact = Policy.for_model(scenario.exact, scenario.rtol, oracle.grad_dtypes)
    for rank, rec in sorted(records.items()):
        ev.compare_all("init.param", -1, rank, rec.initial_params, oracle.initial_params,
                       BITWISE, "rank 0's initial parameters")
        ev.compare_all("init.buffer", -1, rank, rec.initial_buffers,
                       oracle.initial_buffers[rank], BITWISE,
                       "the initial buffers (rank 0's where broadcast, else its own)")
        for step, srec in enumerate(rec.steps):
            if step >= len(oracle.steps):
                ev.fail("oracle.grad", f"rank {rank} ran step {step}, the oracle has "
                                       f"{len(oracle.steps)} steps", step, rank)
                break
            ostep = oracle.steps[step]
            if not scenario.oracle_after_join and len(ostep.active) < len(records):
                break
            _check_grads(ev, "oracle", step, rank, srec.grads, ostep.grads, ostep.grad_scales,
                         exact, "the oracle")
            ev.compare_all("oracle.param", step, rank, srec.params, ostep.params, exact,
                           "the oracle")
            ev.compare_all("oracle.buffer", step, rank, srec.buffers, ostep.buffers[rank], exact,
                           "the oracle")
            _check_forward_buffers(ev, step, rank, srec.buffers_at_forward,
                                   ostep.buffers_at_forward[rank], exact)

    lowest = min(records)
    for step in range(max(len(r.steps) for r in records.values())):
        holders = {r: rec for r, rec in records.items() if step < len(rec.steps)}
        first = min(holders)
        for rank, rec in holders.items():
            if rank == first:
                continue
            ev.compare_all("replica.param", step, rank, rec.steps[step].params,
                           holders[first].steps[step].params, BITWISE, f"rank {first}")
            if scenario.broadcasts_buffers():
                ref_fwd = holders[first].steps[step].buffers_at_forward
                for mb, bufs in enumerate(rec.steps[step].buffers_at_forward):
                    if buffers_broadcast(scenario, step, mb) and mb < len(ref_fwd):
                        ev.compare_all("replica.buffer_broadcast", step, rank, bufs, ref_fwd[mb],
                                       BITWISE, f"rank {first}'s buffers at the same forward")
    for rank, rec in records.items():
        if rank != lowest:
            ev.compare_all("replica.final", len(rec.steps), rank, rec.final_params,
                           records[lowest].final_params, BITWISE, f"rank {lowest}'s final parameters")
        if scenario.join is not None and scenario.broadcasts_buffers():
            ev.compare_all("replica.final", len(rec.steps), rank, rec.final_buffers,
                           oracle.final_buffers, exact,
                           f"the last joiner's (rank {oracle.last_joiner}) final buffers")
    return ev


def _check_expected_error(ev: Evidence, pattern: str, records: dict[int, RankRecord]) -> None:
    """``expected_error``: every rank raised an error matching ``pattern`` (no hang: the
    deadline would have turned a hang into TIMEOUT before this check)."""
    ev.ran("expected_error")
    for rank, rec in sorted(records.items()):
        if not rec.raised:
            ev.fail("expected_error", f"rank {rank} finished its {len(rec.steps)} steps without "
                    f"raising; expected an error matching {pattern!r}", None, rank)
        elif not re.search(pattern, rec.raised):
            ev.fail("expected_error", f"rank {rank} raised {rec.raised!r}, expected an error "
                    f"matching {pattern!r}", len(rec.steps), rank)


def check_reference(ev: Evidence, scenario: Scenario, records: dict[int, RankRecord],
                    reference: dict[int, RankRecord], oracle: OracleRecord) -> None:
    """``reference.*``: the candidate's trajectory equals the reference DDP's on the same data.

    Same tolerances as against the oracle (the reference may reduce in another order than
    the candidate); ``None``-ness of gradients must match exactly.
    """
    policy = Policy.for_model(scenario.exact, scenario.rtol, oracle.grad_dtypes)
    for rank, rec in sorted(records.items()):
        ref = reference.get(rank)
        if ref is None:
            continue
        if len(rec.steps) != len(ref.steps):
            ev.fail("reference.steps", f"rank {rank} ran {len(rec.steps)} steps, the reference "
                                       f"{len(ref.steps)}", None, rank)
        for step, (srec, rrec) in enumerate(zip(rec.steps, ref.steps, strict=False)):
            scales = oracle.steps[step].grad_scales if step < len(oracle.steps) else {}
            _check_grads(ev, "reference", step, rank, srec.grads, rrec.grads, scales,
                         policy, "the reference")
            ev.compare_all("reference.param", step, rank, srec.params, rrec.params,
                           policy, "the reference")
            ev.compare_all("reference.buffer", step, rank, srec.buffers, rrec.buffers,
                           policy, "the reference")


def _check_grads(ev: Evidence, prefix: str, step: int, rank: int,
                 grads: dict[str, Tensor | None], expected: dict[str, Tensor | None],
                 scales: dict[str, float], policy: Policy, against: str) -> None:
    ev.ran(f"{prefix}.grad_none")
    for name, want in expected.items():
        got = grads.get(name)
        if (got is None) != (want is None):
            state = "None" if got is None else "a tensor"
            ev.fail(f"{prefix}.grad_none", f"step {step}, rank {rank}, {name!r}: gradient is "
                    f"{state}, {against}'s is {'None' if want is None else 'a tensor'}",
                    step, rank, name)
        elif got is not None and want is not None:
            ev.compare(f"{prefix}.grad", step, rank, name, got, want, policy.rtol(want.dtype),
                       against, scales.get(name, 0.0))


def _check_forward_buffers(ev: Evidence, step: int, rank: int,
                           seen: list[Tensors], expected: list[Tensors], policy: Policy) -> None:
    if len(seen) != len(expected):
        ev.fail("oracle.buffer", f"step {step}, rank {rank}: {len(seen)} forwards seen, "
                                 f"{len(expected)} expected", step, rank)
        return
    for bufs, want in zip(seen, expected, strict=True):
        ev.compare_all("oracle.buffer", step, rank, bufs, want, policy, "the oracle at forward")
