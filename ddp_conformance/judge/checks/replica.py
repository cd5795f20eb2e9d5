"""``replica.*``: the ranks of a group hold the same model."""
from __future__ import annotations

from ddp_conformance.catalog.procedure import broadcasts
from ddp_conformance.judge.registry import Context, check, values
from ddp_conformance.judge.tolerance import BITWISE


@check("replica", "replica.param", "replica.buffer_broadcast", "replica.final", when=values)
def replica_consistency(ctx: Context) -> None:
    """The replicas agree with each other, whatever the oracle says:

    - ``replica.param``: after each step, parameters are bitwise identical on all ranks
      that trained in it (every rank applies the same averaged gradient: torch's DDP
      relies on this and never re-broadcasts parameters);
    - ``replica.buffer_broadcast``: with ``broadcast_buffers``, every forward at which DDP
      broadcasts (``procedure.broadcasts``: torch's ``_pre_forward`` after a synced
      forward) starts from the same buffers on every rank, bitwise;
    - ``replica.final``: after the training loop (and Join's final sync), parameters are
      bitwise identical on every rank, and under Join buffers equal the last joiner's
      where broadcast (torch's ``_DDPJoinHook.post_hook`` syncs from it).
    """
    ev, scenario, records, oracle = ctx.evidence, ctx.scenario, ctx.records, ctx.oracle
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
                at = broadcasts(scenario, step)
                for i, bufs in enumerate(rec.steps[step].buffers_at_forward):
                    if i < len(at) and at[i] and i < len(ref_fwd):
                        ev.compare_all("replica.buffer_broadcast", step, rank, bufs, ref_fwd[i],
                                       BITWISE, f"rank {first}'s buffers at the same forward")
    exact = ctx.policy
    for rank, rec in records.items():
        if rank != lowest:
            ev.compare_all("replica.final", len(rec.steps), rank, rec.final_params,
                           records[lowest].final_params, BITWISE, f"rank {lowest}'s final parameters")
        if scenario.join is not None and scenario.broadcasts_buffers():
            ev.compare_all("replica.final", len(rec.steps), rank, rec.final_buffers,
                           oracle.final_buffers, exact,
                           f"the last joiner's (rank {oracle.last_joiner}) final buffers")
