"""The single-process oracle: what DDP's synced gradients must be, computed in one process.

The loop and its rules are :mod:`ddp_conformance.script.single_process`'s (DDP's contract:
every rank holds the mean over ranks of the local gradients; microbatching, Join's
divisor, unused parameters, buffers simulated per rank and broadcast where DDP broadcasts
them, several backwards, the eval forward, autocast, per-rank batch sizes, the forward RNG
seeded per rank and forward). The oracle runs it over the scenario's tables
(``catalog/tables.py``), which is what a reproducer's single process runs too.
"""
from __future__ import annotations

import torch

from ddp_conformance.catalog.models import get_model
from ddp_conformance.catalog.procedure import build_module
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.catalog.tables import scenario_case
from ddp_conformance.script.case import procedure
from ddp_conformance.script.single_process import (
    OracleRecord,
    OracleStep,
    clone,
    reduce_gradients,
    single_process,
)

__all__ = ["OracleRecord", "OracleStep", "reduce_gradients", "run_oracle"]


def run_oracle(scenario: Scenario, ranks: int | list[int], device: torch.device,
               threads: int | None = None) -> OracleRecord:
    """The oracle's record for the DDP group of global ``ranks`` (an int: ``range(n)``).

    ``threads`` should be the ranks' intra-op thread count.

    With the same thread count CPU kernels partition their reductions the same way, so the
    oracle's local gradients equal the ranks' bitwise and only DDP's reduction differs.
    """
    previous_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        group = list(range(ranks)) if isinstance(ranks, int) else list(ranks)
        try:
            return _run_oracle(scenario, group, device)
        except Exception:
            if scenario.expect_error is None:
                raise
            # A scenario whose model cannot train at all (the error it expects of DDP is
            # the model's own: no parameter to reduce) has only its initial state to judge.
            return _initial_state(scenario, group, device)
    finally:
        torch.set_num_threads(previous_threads)


def _initial_state(scenario: Scenario, ranks: list[int], device: torch.device) -> OracleRecord:
    """The oracle of an expected error that leaves no training to simulate: rank 0's
    initial parameters (those initialized: a lazy module's have no values yet) and every
    rank's own initial buffers."""
    from torch.nn.parameter import is_lazy

    model = build_module(scenario, ranks[0], device)
    return OracleRecord(clone({n: p for n, p in model.named_parameters() if not is_lazy(p)}),
                        {r: clone({n: b for n, b in build_module(scenario, r, device)
                                    .named_buffers() if not is_lazy(b)}) for r in ranks})


def _run_oracle(scenario: Scenario, ranks: list[int], device: torch.device) -> OracleRecord:
    """:func:`~ddp_conformance.script.single_process.single_process` over the scenario's
    tables for the group of global ``ranks``."""
    case = scenario_case(scenario, len(ranks), [ranks])
    return single_process(procedure(case, get_model(scenario.model), ranks, device), ranks)
