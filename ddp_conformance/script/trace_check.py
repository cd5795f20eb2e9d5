"""A reproducer's trace check: what the process group saw this rank issue, read by the
harness's trace rules (:mod:`.trace_rules`): ``trace.no_sync``, ``trace.dtype`` (each
reduction's wire dtype, the non-strict profile, and a mixed model's per-dtype volume)
and ``trace.reduced_once`` (storage extents, :mod:`.summed_memory`)."""
from __future__ import annotations

from ddp_conformance.script.case import Case
from ddp_conformance.script.collective import Collective, gradient_reduction, real_dtypes
from ddp_conformance.script.single_process import OracleRecord
from ddp_conformance.script.summed_memory import Coverage, backward_coverage
from ddp_conformance.script.trace_rules import (
    defined_gradients,
    dtype_volume_failure,
    elements_by_dtype,
    needed_by_dtype,
    no_sync_offence,
    parameter_numel,
    reduced_numel,
    reduced_once,
    reduced_once_failure,
    row_padding,
    wire_offence,
    wire_rule,
)
from ddp_conformance.script.wire_dtypes import lossless


def check_collectives(case: Case, rank: int, trace: list[Collective], want: OracleRecord,
                      steps: int) -> None:
    """This rank's ``trace`` of ``steps`` steps against the trace rules; the first
    violation raises ``AssertionError`` with its evidence."""
    c = no_sync_offence(trace, lambda mb: case.synced[mb],
                        lambda step, mb: case.buffers_broadcast[(step, mb)], case.join is not None)
    if c is not None:
        raise AssertionError(f"rank {rank}, step {c.step}, microbatch {c.microbatch} (inside "
                             f"no_sync): {c.describe()} issued in {c.stage} (DDP synchronises "
                             "nothing there)")
    allowed, expected = wire_rule(real_dtypes(want.grad_dtypes), case.hook_wire_dtype, False)
    c = wire_offence(trace, allowed)
    if c is not None:
        raise AssertionError(f"rank {rank}, step {c.step}, microbatch {c.microbatch}: gradients "
                             f"reduced as {c.describe()}, {expected}")
    if not case.trace_volume:
        return
    if steps and not any(gradient_reduction(c) for c in trace):
        print(f"rank {rank}: no gradient reduction went through the process group (the "
              "candidate's collectives bypass it): the volume is not checked", flush=True)
        return
    _check_volume(case, rank, trace, want, steps)


def _check_volume(case: Case, rank: int, trace: list[Collective], want: OracleRecord,
                  steps: int) -> None:
    """Each synced backward reduced every needed gradient element once (by memory), and in
    a mixed model each dtype's elements in dtypes that hold them."""
    full = reduced_numel(want.numel_by_dtype)
    whole = max(full, parameter_numel(want.initial_params))
    covered, by_dtype = backward_coverage(trace), elements_by_dtype(trace)
    group_size = max((c.group_size for c in trace if c.stage == "backward"), default=1)
    synced = [mb for mb, yes in enumerate(case.synced) if yes]
    for step in range(steps):
        for mb in synced:
            where = f"rank {rank}, step {step}, microbatch {mb}"
            names = defined_gradients(want.steps[step].local_grads, case.microbatches, synced, mb)
            needed = needed_by_dtype(want.numel_by_dtype, want.initial_params, names)
            cov = covered.get((step, mb), Coverage(0, 0, 0, ()))
            ok, _ = reduced_once(cov, sum(needed.values()), whole,
                                 (group_size - 1) * cov.calls
                                 + row_padding(want.initial_params, group_size, trace))
            if not ok:
                why = reduced_once_failure(cov, sum(needed.values()), full, whole,
                                           want.initial_params)
                raise AssertionError(f"{where}: the backward {why} in {cov.calls} collective(s)")
            if case.hook_wire_dtype or len(needed) < 2:
                continue
            short = dtype_volume_failure(needed, by_dtype.get((step, mb), {}),
                                         want.numel_by_dtype, lossless, "precision lost")
            if short is not None:
                raise AssertionError(f"{where}: {short}")
