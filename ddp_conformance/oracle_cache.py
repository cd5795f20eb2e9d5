"""The run's oracles: one per (scenario, DDP group), computed once per run, and computed
ahead on a thread while the scenario's job runs on the ranks.

The oracle does not depend on the candidate, so every case of a scenario shares it. The
parent mostly waits on sockets while a job runs (and torch releases the GIL in its
kernels), so :meth:`OracleCache.prefetch` starts the scenario's missing oracles on a
thread when the job is dispatched and :meth:`OracleCache.collect` waits for them once the
job is over: the two never overlap the next case. The seconds spent waiting, or computing
an oracle that was not prefetched, are the case's ``oracle`` cost.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.judge.costs import CostMeter
from ddp_conformance.judge.oracle import OracleRecord, run_oracle
from ddp_conformance.ranks.pool import Pool

#: A prefetch in flight: the oracles it computes, by :func:`oracle_key`.
Prefetch = Future[dict[str, OracleRecord]]


def oracle_key(scenario: Scenario, group: list[int]) -> str:
    """The cache key of ``scenario``'s oracle for DDP group ``group``."""
    return f"{scenario.id}@{','.join(map(str, group))}"


class OracleCache:
    """The oracles of one run, for the ranks of ``pool`` (``world_size`` of them)."""

    def __init__(self, pool: Pool, world_size: int) -> None:
        self._pool = pool
        self._world_size = world_size
        self._oracles: dict[str, OracleRecord] = {}
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ddp-oracle")

    def close(self) -> None:
        """Wait for a prefetch still running and stop the thread (called once, at the
        run's end)."""
        self._thread.shutdown(wait=True)

    def prefetch(self, scenario: Scenario) -> Prefetch | None:
        """Start computing the scenario's missing oracles on the oracle thread; called
        before its job is dispatched. None when there is nothing to compute, or when rank
        0 runs in this process (the oracle seeds torch's global RNG)."""
        if getattr(self._pool, "in_process", True):
            return None
        groups = [g for g in scenario.groups_for(self._world_size)
                  if oracle_key(scenario, g) not in self._oracles]
        if not groups:
            return None
        threads = self._pool.threads

        def compute() -> dict[str, OracleRecord]:
            return {oracle_key(scenario, g): run_oracle(scenario, g, torch.device("cpu"),
                                                        threads) for g in groups}

        return self._thread.submit(compute)

    def collect(self, prefetch: Prefetch | None, costs: CostMeter) -> None:
        """Wait for a prefetch (always, once its job is over: it must not overlap the next
        case); the wait is charged to ``costs``' oracle. A failed one is left to
        :meth:`oracle` to raise where it is needed."""
        if prefetch is None:
            return
        with costs.timing("oracle"):
            try:
                self._oracles.update(prefetch.result())
            except Exception:  # noqa: BLE001 - recomputed, and raised, by oracle() if needed
                pass

    def oracle(self, scenario: Scenario, group: list[int], costs: CostMeter) -> OracleRecord:
        """The oracle of ``scenario`` for one DDP group (computed once per run; the
        computing is charged to ``costs``, the case that needed it)."""
        key = oracle_key(scenario, group)
        if key not in self._oracles:
            device = torch.device("cpu")  # docs/CONTRACT.md, "What every scenario checks"
            with costs.timing("oracle"):
                self._oracles[key] = run_oracle(scenario, group, device, self._pool.threads)
        return self._oracles[key]
