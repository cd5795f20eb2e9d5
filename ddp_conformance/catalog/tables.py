"""A scenario at one world size as a :class:`~ddp_conformance.script.case.Case`: its
settings and its procedure's tables, computed by ``catalog/procedure.py``'s own functions.

The oracle reads a scenario through these tables (``judge/oracle.py``) and a reproducer
holds them as a literal (``repro.py``), so both run one single-process loop on the same data.
"""
from __future__ import annotations

from collections.abc import Sequence

from ddp_conformance.catalog import procedure
from ddp_conformance.catalog.models import get_model
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.script.case import Case


def scenario_case(scenario: Scenario, world_size: int, groups: Sequence[Sequence[int]],
                  hook_wire_dtype: str | None = None, rtol: dict[str, float] | None = None,
                  grad_dtypes: Sequence[str] = ()) -> Case:
    """``scenario`` at ``world_size`` for its DDP ``groups`` (global ranks; Join's steps
    by position in the group); the tables cover the groups' ranks. ``hook_wire_dtype``,
    ``rtol`` and ``grad_dtypes`` are the judge's reading (a reproducer's checks need them)."""
    ranks = sorted({r for g in groups for r in g})
    steps = scenario.steps
    plans = {s: procedure.forward_plan(scenario, s) for s in range(steps)}
    forwards = [(r, s, f.microbatch, f.index) for r in ranks for s in range(steps) for f in plans[s]]
    mbs = scenario.microbatches
    return Case(
        world_size=world_size, steps=steps, microbatches=mbs, forwards=scenario.forwards,
        steps_for={r: scenario.steps_for(list(g).index(r)) for g in groups for r in g},
        init_seeds={r: scenario.init_seed(r) for r in ranks},
        batch_sizes={r: scenario.batch_size_for(r) for r in ranks},
        plan={s: [(f.microbatch, f.index) for f in plans[s]] for s in range(steps)},
        broadcasts={s: procedure.broadcasts(scenario, s) for s in range(steps)},
        data_seeds={at: procedure.data_seed(scenario, *at) for at in forwards},
        forward_seeds={at: procedure.forward_seed(scenario, *at) for at in forwards},
        synced=[procedure.synced(scenario, m) for m in range(mbs)],
        buffers_broadcast={(s, m): procedure.buffers_broadcast(scenario, s, m)
                           for s in range(steps) for m in range(mbs)},
        broadcast_buffers=scenario.broadcasts_buffers(),
        init_syncs_buffers=scenario.init_syncs_buffers() or scenario.init == "same",
        optimizer=str(scenario.optimizer), lr=scenario.lr,
        set_to_none=scenario.zero_grad_set_to_none, autocast=scenario.autocast,
        ddp_options=dict(scenario.ddp_options), model_kwargs=dict(scenario.model_kwargs),
        model_rank_aware=get_model(scenario.model).rank_aware,
        groups=[list(g) for g in scenario.groups] if scenario.groups else None,
        join=None if scenario.join is None else dict(
            divide_by_initial_world_size=scenario.join.divide_by_initial_world_size,
            throw_on_early_termination=scenario.join.throw_on_early_termination),
        oracle_after_join=scenario.oracle_after_join,
        sync_strategy=str(scenario.sync_strategy) if scenario.sync_strategy else None,
        comm_hook=str(scenario.comm_hook) if scenario.comm_hook else None,
        comm_hook_registrations=scenario.comm_hook_registrations,
        hook_wire_dtype=hook_wire_dtype, expect_error=scenario.expect_error,
        trace_volume=scenario.trace_volume, exact=scenario.exact, rtol_override=scenario.rtol,
        rtol=dict(rtol or {}), grad_dtypes=list(grad_dtypes), backwards=scenario.backwards)
