"""The case runner: runs (scenario, candidate) cases on the ranks and turns what happened
into verdicts.

A :class:`Runner` owns the transport (the rank pool, or torchrun's ranks) and the resolved
candidates; for one case it decides N/A (what the backend, the world size or the candidate
lacks), runs the job, and judges the records. The per-run caches it reads are their own
modules, since neither depends on the candidate: :mod:`ddp_conformance.oracle_cache` (one
oracle per scenario and DDP group, computed ahead on a thread while the job runs) and
:mod:`ddp_conformance.reference_cache` (one reference DDP run per scenario). The run loop
around it, shared by the command line and the pytest plugin, is
:mod:`ddp_conformance.session`.

It also runs the backend's own collective checks (a
:class:`~ddp_conformance.catalog.collective.CollectiveCase`: the backend is the subject, no
candidate). A comparison backend (``--compare-backend``) wraps it:
:mod:`ddp_conformance.backend_comparison`.
"""
from __future__ import annotations

import time

from ddp_conformance.builtins._common import expectations_file
from ddp_conformance.catalog.backend_needs import BackendFeature, backend_lacks
from ddp_conformance.catalog.collective import CollectiveCase, Op
from ddp_conformance.catalog.scenario import Scenario, missing_capabilities
from ddp_conformance.collectives.verdict import judge_collective
from ddp_conformance.config import RunConfig
from ddp_conformance.contract.backend import resolve_backend
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.ddp_like import kwargs_only_remark
from ddp_conformance.contract.registry import resolve_candidate
from ddp_conformance.judge.costs import CostMeter
from ddp_conformance.judge.diagnose.endings import candidate_roots, explain_ending
from ddp_conformance.judge.diagnose.kwargs import passes_on
from ddp_conformance.judge.evidence import Evidence
from ddp_conformance.judge.expectations import Expectations
from ddp_conformance.judge.failures import failed_run, last_line
from ddp_conformance.judge.run import judge_group
from ddp_conformance.judge.verdict import Result, Verdict
from ddp_conformance.oracle_cache import OracleCache
from ddp_conformance.ranks.environment import validate
from ddp_conformance.ranks.leaks import LeakLedger
from ddp_conformance.ranks.messages import Job
from ddp_conformance.ranks.pool import Pool, RankPool
from ddp_conformance.ranks.records import RankRecord
from ddp_conformance.reference_cache import REFERENCE, Records, ReferenceCache

__all__ = ["RunConfig", "Runner"]

#: Gloo's own collective timeout: longer than the scenario deadline, so that a hang is
#: reported by the harness (with stacks) and not by the backend.
COLLECTIVE_TIMEOUT_MARGIN_S = 30.0
#: The N/A reason of a slow scenario in a run without ``--slow``.
SLOW_REASON = "a slow scenario (seconds): run with --slow (pytest: --ddp-slow)"
#: Candidates held to the strict profile always: torch's DDP and the reference.
STRICT_CANDIDATES = frozenset({"torch", REFERENCE})
#: The rank-side function of a collective check.
RUN_COLLECTIVE = "ddp_conformance.collectives.execute:run_case"
#: The collective checks whose N/A says the backend lacks what some scenarios need.
FEATURE_CHECKS = {Op.SPARSE_ALLREDUCE: BackendFeature.SPARSE_ALLREDUCE}
#: Expectations shipped for torch's own backends' known defects (collective checks).
SHIPPED_BACKEND_EXPECTATIONS = {"gloo": "gloo-backend"}


class Runner:
    """Owns the rank pool and the resolved candidates of one run; runs one case at a time."""

    #: The runner of the comparison backend (set by :mod:`ddp_conformance.backend_comparison`).
    comparison: Runner | None = None

    def __init__(self, config: RunConfig, pool: Pool | None = None) -> None:
        """``pool`` replaces the rank pool (e.g. ranks started by torchrun); same interface."""
        self.config = config
        self.device_kind = validate(config.backend, config.device, config.world_size)
        self.backend = resolve_backend(config.backend)
        self.candidates: dict[str, Candidate] = {}
        for spec in config.candidates:
            self.candidates[spec] = resolve_candidate(spec)
        shipped = [c.expectations for c in self.candidates.values() if c.expectations]
        backend_file = expectations_file(SHIPPED_BACKEND_EXPECTATIONS.get(self.backend.name, ""))
        if backend_file and config.runs_collectives(self.backend.custom):
            shipped.append(backend_file)
        self.expectations = Expectations.load_all(
            ([config.expectations] if config.expectations else []) + shipped)
        preload = [*config.candidates, *(["reference"] if config.compare_with_reference else [])]
        self.pool: Pool = pool or RankPool(config.world_size, config.backend, self.device_kind,
                                           fresh=config.pool == "fresh", spare=config.spare,
                                           preload=list(dict.fromkeys(preload)),
                                           allow_oversubscribe=config.allow_oversubscribe)
        #: What the backend declined in this run's collective checks (its words).
        self.declined: dict[BackendFeature, str] = {}
        #: The last scenario's records on this runner (None: it produced none).
        self.last_records: Records | None = None
        #: Where the current case's time goes (see :mod:`ddp_conformance.judge.costs`).
        self.costs = CostMeter()
        #: What candidates left in the ranks (ranks/hygiene.py); the current case's note.
        self.leaks = LeakLedger()
        self._leak_note = ""
        self.oracles = OracleCache(self.pool, config.world_size)
        self.references = ReferenceCache(self.pool, config.world_size, self.backend.name,
                                         self.device_kind, self.leaks)

    def close(self) -> None:
        """End the run: the oracle thread, then the ranks."""
        try:
            self.oracles.close()
        finally:
            self.pool.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def reference_notes(self) -> dict[str, str]:
        """Why the reference DDP gave no records, by scenario id."""
        return self.references.notes

    def reference_summary(self) -> list[str]:
        """The run-level word on the reference DDP (:meth:`ReferenceCache.summary`)."""
        return self.references.summary()

    def candidate_name(self, spec: str) -> str:
        return self.candidates[spec].name

    def run_case(self, scenario: Scenario | CollectiveCase, spec: str) -> Result:
        """Run one case: ``scenario`` with candidate ``spec``, or a collective check of the
        backend (``spec`` is then the backend's name)."""
        started = self.start_case()
        return self.conclude(self.judge_case(scenario, spec), started)

    def start_case(self) -> float:
        """Open a case's account of costs; its start, for :meth:`conclude`."""
        self.costs = CostMeter()
        self._leak_note = ""
        return time.monotonic()

    def judge_case(self, scenario: Scenario | CollectiveCase, spec: str) -> Result:
        """One case's result, before :meth:`conclude` (between :meth:`start_case` and it)."""
        if isinstance(scenario, CollectiveCase):
            return self._run_collective(scenario)
        result = self._run_case(scenario, spec)
        if self._leak_note:
            result.notes.append(self._leak_note)
        self._name_swallowed_options(scenario, spec, result)
        explain_ending(result, scenario.join is not None, candidate_roots(spec))
        return result

    def conclude(self, result: Result, started: float) -> Result:
        """Close the case's account (duration, costs) and apply the run's expectations."""
        result.duration_s = time.monotonic() - started
        result.costs = self.costs.finish(result.duration_s)
        return self.expectations.apply(result)

    def _name_swallowed_options(self, scenario: Scenario, spec: str, result: Result) -> None:
        """A FAIL, ERROR, TIMEOUT or CRASH of a scenario whose DDP options the candidate
        takes only through ``**kwargs`` says so in its one line and its notes: the
        candidate may have swallowed them (``contract.ddp_like.kwargs_only_remark``). Not
        for options a subclass of torch's DDP hands on to it untouched
        (:func:`~ddp_conformance.judge.diagnose.kwargs.passes_on`): those reach the DDP.
        The diagnosis repeats the note on a finding only where every case it explains
        set such an option (:mod:`ddp_conformance.judge.diagnose.findings`)."""
        if not result.verdict.unexpected:
            return
        options = [o for o in scenario.ddp_options if not passes_on(spec, o)]
        remark = kwargs_only_remark(self.candidates[spec].capabilities, options)
        if not remark:
            return
        result.notes.append(remark)
        if result.failures:
            first = result.failures[0]
            first.message = f"{first.message} ({remark})"
        else:
            result.reason = f"{result.reason} ({remark})" if result.reason else remark

    def _result(self, scenario: Scenario, spec: str, verdict: Verdict, reason: str = "") -> Result:
        return Result(scenario.id, self.candidate_name(spec), verdict, self.config.world_size,
                      self.backend.name, self.device_kind, reason=reason, rule=scenario.rule,
                      guards=list(scenario.guards))

    def _job(self, scenario: Scenario, spec: str) -> Job:
        """The job that runs ``scenario`` with candidate ``spec`` on the ranks."""
        return Job("scenario", "", self.config.timeout_s + COLLECTIVE_TIMEOUT_MARGIN_S,
                   seed=scenario.seed, scenario=scenario, candidate=spec,
                   trace=self.config.trace)

    def _run_collective(self, case: CollectiveCase) -> Result:
        result = Result(case.id, self.backend.name, Verdict.NA, self.config.world_size,
                        self.backend.name, self.device_kind)
        unsupported = case.unsupported_world_size(self.config.world_size)
        if unsupported:
            result.reason = unsupported
            return result
        job = Job("call", "", self.config.timeout_s + COLLECTIVE_TIMEOUT_MARGIN_S,
                  function=RUN_COLLECTIVE, args=(case, self.device_kind), trace=self.config.trace)
        job_started = time.perf_counter()
        outcome = self.pool.run(job, self.config.timeout_s)
        # The ranks' collectives and comparisons are the job: charged to "steps".
        self.costs.add("handover", outcome.handover_s)
        self.costs.add("steps", time.perf_counter() - job_started - outcome.handover_s)
        with self.costs.timing("checks"):
            result = judge_collective(case, result, outcome, self.config.timeout_s)
        feature = FEATURE_CHECKS.get(Op(case.op))
        if feature is not None and result.verdict is Verdict.NA:
            self.declined[feature] = result.reason
        return result

    def not_applicable(self, scenario: Scenario, spec: str) -> str:
        """Why the case cannot run here ('' if it can): the candidate's backends, what the
        scenario needs of the backend and the world size, ``--slow``, the candidate's
        capabilities (when it declares them before it runs)."""
        candidate = self.candidates[spec]
        ws = self.config.world_size
        backend = self.backend.name
        if candidate.backends is not None and backend not in candidate.backends:
            return f"candidate does not support backend {backend}"
        unsupported = (scenario.unsupported_backend(backend)
                       or scenario.unsupported_device(self.device_kind)
                       or backend_lacks(scenario, backend, self.device_kind, self.declined)
                       or scenario.unsupported_world_size(ws)
                       or (SLOW_REASON if scenario.slow and not self.config.slow else ""))
        if unsupported or candidate.late_capabilities:
            return unsupported
        return missing_capabilities(scenario, candidate.capabilities)

    def _run_case(self, scenario: Scenario, spec: str) -> Result:
        self.last_records = None
        unsupported = self.not_applicable(scenario, spec)
        if unsupported:
            return self._result(scenario, spec, Verdict.NA, unsupported)
        records = self.references.claim(scenario.id) if spec == REFERENCE else None
        if records is None:
            # (else the reference already ran this very job as the other candidates'
            # comparison, same scenario, same trace: its records are this case's.)
            ran = self._run_job(scenario, spec)
            if isinstance(ran, Result):
                return ran
            records = ran
            if spec == REFERENCE and self.config.compare_with_reference \
                    and not any(r.not_applicable for r in records.values()):
                self.references.keep(scenario.id, records)
        self.last_records = records
        na = {r.not_applicable for r in records.values() if r.not_applicable}
        if na:
            return self._result(scenario, spec, Verdict.NA, "; ".join(sorted(na)))
        return self._judge(scenario, spec, records)

    def _run_job(self, scenario: Scenario, spec: str) -> Records | Result:
        """Run the case's job on the ranks, its oracles computed meanwhile: the records,
        or the ERROR, TIMEOUT or CRASH result of a job that did not finish."""
        job_started = time.perf_counter()
        prefetch = self.oracles.prefetch(scenario)
        try:
            outcome = self.pool.run(self._job(scenario, spec), self.config.timeout_s)
        finally:
            job_s = time.perf_counter() - job_started
            self.oracles.collect(prefetch, self.costs)
        self._leak_note = self.leaks.record(self.candidates[spec].name, outcome.hygiene)
        rank_times = [r.times for r in outcome.results.values() if isinstance(r, RankRecord)]
        self.costs.add_job(job_s, outcome.handover_s,
                           rank_times if outcome.status == "done" else [])
        if outcome.status != "done":
            return failed_run(self._result(scenario, spec, Verdict.ERROR), outcome,
                              self.config.timeout_s)
        return outcome.results

    def _judge(self, scenario: Scenario, spec: str, records: Records) -> Result:
        """Judge the case's records, group by group, against the oracle and the reference."""
        evidence = Evidence()
        reference = None if scenario.expect_error else self.reference_records(scenario, spec)
        strict = self.config.strict_profile or spec in STRICT_CANDIDATES
        cause = None
        for group in scenario.groups_for(self.config.world_size):
            mine = {r: records[r] for r in group}
            theirs = {r: reference[r] for r in group} if reference is not None else None
            oracle = self.oracles.oracle(scenario, group, self.costs)
            try:
                with self.costs.timing("checks"):
                    found = judge_group(evidence, scenario, mine, oracle, theirs, strict=strict,
                                        trace=self.config.trace,
                                        strict_messages=self.config.strict_messages)
                cause = cause or found
            except Exception as exc:  # noqa: BLE001 - records outside the contract: this case's error
                return self._result(
                    scenario, spec, Verdict.ERROR,
                    f"the candidate's records could not be checked: {type(exc).__name__}: "
                    f"{last_line(str(exc)) if str(exc) else ''}")
        result = self._result(scenario, spec, Verdict.FAIL if evidence.failures else Verdict.PASS)
        result.failures, result.figures, result.checks_run, result.notes = (
            evidence.failures, evidence.figures, evidence.checks, evidence.notes)
        if cause is not None:
            result.cause = cause.to_json()
        self.references.explain(result, scenario.id, compared=reference is not None)
        if scenario.torch_limit is not None:
            result.notes.append(torch_limit_note(scenario, records))
        return result

    def reference_records(self, scenario: Scenario, spec: str) -> Records | None:
        """The reference DDP's records for ``scenario`` (run once per run), or None.

        None when the candidate is the reference itself, or when the reference could not
        run the scenario (then the reason is kept in :attr:`reference_notes`, and a failed
        run's result, with its tracebacks, in the cache's ``failures``).
        """
        if spec == REFERENCE or not self.config.compare_with_reference:
            return None
        return self.references.records(scenario, self.config.timeout_s,
                                       self._job(scenario, REFERENCE), self.costs)


def torch_limit_note(scenario: Scenario, records: Records) -> str:
    """The note of a scenario beyond one of torch's limits: the candidate refused it like
    torch (what it raised), or went on and was judged on its values."""
    raised = sorted({r.raised for r in records.values() if r.raised})
    return (f"refused, like torch: {raised[0]}" if raised else
            "beyond torch: went on where torch refuses (torch: "
            f"{scenario.torch_limit}), judged on its values against the oracle")
