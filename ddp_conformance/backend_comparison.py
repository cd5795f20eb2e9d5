"""The backend comparison: every scenario also run on a second backend, each on its own
pool, and how far the two runs' records are apart (``--compare-backend``, Gloo by default
for a custom backend; :mod:`ddp_conformance.judge.backend_diff`).

:class:`BackendComparison` wraps the case runner of the backend under test: it runs each
scenario case as :class:`~ddp_conformance.runner.Runner` does, then the same case on a
plain runner of the comparison backend (no collective checks, no expectations, no
comparison of its own), and charges that to the case's ``comparison`` cost. The run's
runner comes from :func:`runner_for`.
"""
from __future__ import annotations

import dataclasses

from ddp_conformance.catalog.collective import CollectiveCase
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.config import RunConfig
from ddp_conformance.contract.backend import resolve_backend
from ddp_conformance.errors import UsageError
from ddp_conformance.judge.backend_diff import compare_records
from ddp_conformance.judge.verdict import Result
from ddp_conformance.ranks.pool import Pool
from ddp_conformance.runner import Runner


def runner_for(config: RunConfig, pool: Pool | None = None) -> Runner:
    """The run's case runner: a :class:`BackendComparison` where the run may compare
    backends (it compares where :func:`comparison_config` says so), a plain
    :class:`Runner` otherwise. ``pool`` as for :class:`Runner`."""
    if config.compare_backend != "none" and config.runs_scenarios():
        return BackendComparison(config, pool)
    return Runner(config, pool)


def comparison_config(runner: Runner, under_torchrun: bool) -> RunConfig | None:
    """The configuration of the comparison backend's runner for ``runner`` (None: no
    comparison). A usage error where there can be none: under torchrun (one set of
    ranks, no second pool) when asked for, or the backend under test named again."""
    config = runner.config
    compare = config.comparison_backend(runner.backend.custom)
    if under_torchrun and config.compare_backend == "auto":
        compare = ""
    if not compare or not config.runs_scenarios():
        return None
    if under_torchrun:
        raise UsageError("--compare-backend runs a second rank pool: not under torchrun")
    if resolve_backend(compare).name == runner.backend.name:
        raise UsageError(f"--compare-backend {compare}: that is the backend under test")
    return dataclasses.replace(config, backend=compare, device=runner.device_kind,
                               collectives="off", compare_backend="none", expectations=None)


class BackendComparison(Runner):
    """The case runner of the backend under test, each scenario also run on
    :attr:`comparison`, a runner of the comparison backend (None: this run compares
    nothing)."""

    def __init__(self, config: RunConfig, pool: Pool | None = None) -> None:
        super().__init__(config, pool)
        try:
            other = comparison_config(self, under_torchrun=pool is not None)
            self.comparison: Runner | None = None if other is None else Runner(other)
        except BaseException:
            super().close()
            raise

    def close(self) -> None:
        """End the run: the comparison backend's runner first, then this one's."""
        try:
            if self.comparison is not None:
                self.comparison.close()
        finally:
            super().close()

    def run_case(self, scenario: Scenario | CollectiveCase, spec: str) -> Result:
        """Run one case as :meth:`Runner.run_case`; a scenario also on the comparison
        backend, the two runs' records compared in ``result.comparison``."""
        if self.comparison is None or isinstance(scenario, CollectiveCase):
            return super().run_case(scenario, spec)
        started = self.start_case()
        result = self.judge_case(scenario, spec)
        with self.costs.timing("comparison"):
            other = self.comparison.run_case(scenario, spec)
            result.comparison = compare_records(other.backend, other.verdict.value,
                                                self.last_records, self.comparison.last_records)
        return self.conclude(result, started)
