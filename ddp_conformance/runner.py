"""Runs (scenario, candidate) cases on the ranks and turns what happened into verdicts.

A :class:`Runner` owns the transport (the rank pool, or torchrun's ranks), the resolved
candidates and the per-run caches (one oracle per scenario and DDP group, one reference
run per scenario: neither depends on the candidate). The run loop around it, shared by the
command line and the pytest plugin, is :mod:`ddp_conformance.session`.

It also runs the backend's own collective checks (a
:class:`~ddp_conformance.catalog.collective.CollectiveCase`: the backend is the subject, no
candidate), and, with a comparison backend (``--compare-backend``, Gloo by default for a
custom backend), every scenario a second time on that backend's own pool, recording how
far the two runs' records are apart (:mod:`ddp_conformance.judge.backend_diff`).
"""
from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

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
from ddp_conformance.errors import UsageError
from ddp_conformance.judge.backend_diff import compare_records
from ddp_conformance.judge.costs import CostMeter
from ddp_conformance.judge.evidence import Evidence
from ddp_conformance.judge.expectations import Expectations
from ddp_conformance.judge.failures import failed_run, last_line
from ddp_conformance.judge.oracle import OracleRecord, run_oracle
from ddp_conformance.judge.run import judge_group
from ddp_conformance.judge.verdict import Result, Verdict
from ddp_conformance.ranks.environment import validate
from ddp_conformance.ranks.leaks import LeakLedger
from ddp_conformance.ranks.messages import Job
from ddp_conformance.ranks.pool import Pool, RankPool
from ddp_conformance.ranks.records import RankRecord

__all__ = ["RunConfig", "Runner"]

#: Gloo's own collective timeout: longer than the scenario deadline, so that a hang is
#: reported by the harness (with stacks) and not by the backend.
COLLECTIVE_TIMEOUT_MARGIN_S = 30.0
REFERENCE = "reference"
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
    """Owns the rank pool, the resolved candidates and the oracle cache of one run."""

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
        #: The same scenarios on a second backend, each on its own pool (None: no comparison).
        self.comparison: Runner | None = None
        compare = config.comparison_backend(self.backend.custom)
        if pool is not None and config.compare_backend == "auto":
            compare = ""  # under torchrun: one set of ranks, no second pool to compare on
        if compare and config.runs_scenarios():
            if pool is not None:
                raise UsageError("--compare-backend runs a second rank pool: not under torchrun")
            if resolve_backend(compare).name == self.backend.name:
                raise UsageError(f"--compare-backend {compare}: that is the backend under test")
            self.comparison = Runner(dataclasses.replace(
                config, backend=compare, device=self.device_kind, collectives="off",
                compare_backend="none", expectations=None))
        preload = [*config.candidates, *(["reference"] if config.compare_with_reference else [])]
        self.pool: Pool = pool or RankPool(config.world_size, config.backend, self.device_kind,
                                           fresh=config.pool == "fresh", spare=config.spare,
                                           preload=list(dict.fromkeys(preload)))
        #: What the backend declined in this run's collective checks (its words).
        self.declined: dict[BackendFeature, str] = {}
        #: The last scenario's records on this runner (None: it produced none).
        self.last_records: dict[int, RankRecord] | None = None
        self._oracles: dict[str, OracleRecord] = {}
        #: Computes a scenario's oracles while its job runs on the ranks (the parent waits
        #: on sockets then; torch releases the GIL in its kernels).
        self._oracle_thread = ThreadPoolExecutor(1, thread_name_prefix="ddp-oracle")
        self._references: dict[str, dict[int, RankRecord] | None] = {}
        #: Reference runs made for comparison and not yet used as the reference candidate's
        #: own case: taken once (a later ``--repeat`` runs the reference candidate afresh).
        self._unclaimed: dict[str, dict[int, RankRecord]] = {}
        self.reference_notes: dict[str, str] = {}
        #: The reference DDP's own failed runs (ERROR, TIMEOUT or CRASH, with tracebacks or
        #: stacks), by scenario id: each makes the cases that needed it say so loudly.
        self.reference_failures: dict[str, Result] = {}
        #: Where the current case's time goes (see :mod:`ddp_conformance.judge.costs`).
        self._costs = CostMeter()
        #: What candidates left in the ranks (ranks/hygiene.py); the current case's note.
        self.leaks = LeakLedger()
        self._leak_note = ""

    def close(self) -> None:
        self._oracle_thread.shutdown(wait=True)
        try:
            if self.comparison is not None:
                self.comparison.close()
        finally:
            self.pool.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def candidate_name(self, spec: str) -> str:
        return self.candidates[spec].name

    def run_case(self, scenario: Scenario | CollectiveCase, spec: str) -> Result:
        """Run one case: ``scenario`` with candidate ``spec``, or a collective check of the
        backend (``spec`` is then the backend's name)."""
        started = time.monotonic()
        self._costs = CostMeter()
        self._leak_note = ""
        if isinstance(scenario, CollectiveCase):
            result = self._run_collective(scenario)
        else:
            result = self._run_case(scenario, spec)
            if self._leak_note:
                result.notes.append(self._leak_note)
            self._name_swallowed_options(scenario, spec, result)
            if self.comparison is not None:
                with self._costs.timing("comparison"):
                    self._compare(scenario, spec, result)
        result.duration_s = time.monotonic() - started
        result.costs = self._costs.finish(result.duration_s)
        return self.expectations.apply(result)

    def _name_swallowed_options(self, scenario: Scenario, spec: str, result: Result) -> None:
        """A FAIL, ERROR, TIMEOUT or CRASH of a scenario whose DDP options the candidate
        takes only through ``**kwargs`` says so in its one line and its notes: the
        candidate may have swallowed them (``contract.ddp_like.kwargs_only_remark``)."""
        if not result.verdict.unexpected:
            return
        remark = kwargs_only_remark(self.candidates[spec].capabilities, scenario.ddp_options)
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
                      self.backend.name, self.device_kind, reason=reason)

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
        self._costs.add("handover", outcome.handover_s)
        self._costs.add("steps", time.perf_counter() - job_started - outcome.handover_s)
        with self._costs.timing("checks"):
            result = judge_collective(case, result, outcome, self.config.timeout_s)
        feature = FEATURE_CHECKS.get(Op(case.op))
        if feature is not None and result.verdict is Verdict.NA:
            self.declined[feature] = result.reason
        return result

    def _compare(self, scenario: Scenario, spec: str, result: Result) -> None:
        """Run the case on the comparison backend; record the two side by side."""
        assert self.comparison is not None
        other = self.comparison.run_case(scenario, spec)
        theirs = self.comparison.last_records
        result.comparison = compare_records(other.backend, other.verdict.value,
                                            self.last_records, theirs)

    def _run_case(self, scenario: Scenario, spec: str) -> Result:
        self.last_records = None
        candidate = self.candidates[spec]
        ws = self.config.world_size
        backend = self.backend.name
        if candidate.backends is not None and backend not in candidate.backends:
            return self._result(scenario, spec, Verdict.NA,
                                f"candidate does not support backend {backend}")
        unsupported = (scenario.unsupported_backend(backend)
                       or backend_lacks(scenario, backend, self.device_kind, self.declined)
                       or scenario.unsupported_world_size(ws)
                       or (SLOW_REASON if scenario.slow and not self.config.slow else ""))
        if unsupported:
            return self._result(scenario, spec, Verdict.NA, unsupported)
        if not candidate.late_capabilities:
            missing = missing_capabilities(scenario, candidate.capabilities)
            if missing:
                return self._result(scenario, spec, Verdict.NA, missing)
        job = Job("scenario", "", self.config.timeout_s + COLLECTIVE_TIMEOUT_MARGIN_S,
                  seed=scenario.seed, scenario=scenario, candidate=spec, trace=self.config.trace)
        shared = self._unclaimed.pop(scenario.id, None) if spec == REFERENCE else None
        if shared is not None:
            # The reference already ran this very job as the other candidates' comparison
            # (same scenario, same trace): its records are this case's.
            records: dict[int, RankRecord] = shared
        else:
            job_started = time.perf_counter()
            oracles = self._prefetch_oracles(scenario)
            try:
                outcome = self.pool.run(job, self.config.timeout_s)
            finally:
                job_s = time.perf_counter() - job_started
                self._collect_oracles(oracles)
            self._leak_note = self.leaks.record(candidate.name, outcome.hygiene)
            rank_times = [r.times for r in outcome.results.values() if isinstance(r, RankRecord)]
            self._costs.add_job(job_s, outcome.handover_s,
                                rank_times if outcome.status == "done" else [])
            if outcome.status != "done":
                return failed_run(self._result(scenario, spec, Verdict.ERROR), outcome,
                                  self.config.timeout_s)
            records = outcome.results
            if spec == REFERENCE and self.config.compare_with_reference \
                    and not any(r.not_applicable for r in records.values()):
                self._references[scenario.id] = records
        self.last_records = records
        na = {r.not_applicable for r in records.values() if r.not_applicable}
        if na:
            return self._result(scenario, spec, Verdict.NA, "; ".join(sorted(na)))
        evidence = Evidence()
        reference = None if scenario.expect_error else self.reference_records(scenario, spec)
        strict = self.config.strict_profile or spec in STRICT_CANDIDATES
        for group in scenario.groups_for(self.config.world_size):
            mine = {r: records[r] for r in group}
            theirs = {r: reference[r] for r in group} if reference is not None else None
            oracle = self.oracle(scenario, group)
            try:
                with self._costs.timing("checks"):
                    judge_group(evidence, scenario, mine, oracle, theirs, strict=strict,
                                trace=self.config.trace,
                                strict_messages=self.config.strict_messages)
            except Exception as exc:  # noqa: BLE001 - records outside the contract: this case's error
                return self._result(
                    scenario, spec, Verdict.ERROR,
                    f"the candidate's records could not be checked: {type(exc).__name__}: "
                    f"{last_line(str(exc)) if str(exc) else ''}")
        result = self._result(scenario, spec, Verdict.FAIL if evidence.failures else Verdict.PASS)
        result.failures, result.figures, result.checks_run, result.notes = (
            evidence.failures, evidence.figures, evidence.checks, evidence.notes)
        if scenario.id in self.reference_failures and reference is None:
            self._without_reference(result, self.reference_failures[scenario.id])
        elif scenario.id in self.reference_notes:
            result.notes.append(self.reference_notes[scenario.id])
        if scenario.torch_limit is not None:
            raised = sorted({r.raised for r in records.values() if r.raised})
            result.notes.append(
                f"refused, like torch: {raised[0]}" if raised else
                "beyond torch: went on where torch refuses (torch: "
                f"{scenario.torch_limit}), judged on its values against the oracle")
        return result

    def reference_records(self, scenario: Scenario, spec: str) -> dict[int, RankRecord] | None:
        """The reference DDP's records for ``scenario`` (run once per run), or None.

        None when the candidate is the reference itself, or when the reference could not
        run the scenario (then the reason is kept in :attr:`reference_notes`, and a failed
        run's result, with its tracebacks, in :attr:`reference_failures`).
        """
        if spec == REFERENCE or not self.config.compare_with_reference:
            return None
        if scenario.id not in self._references:
            with self._costs.timing("reference"):  # charged to the case that runs it
                job = Job("scenario", "", self.config.timeout_s + COLLECTIVE_TIMEOUT_MARGIN_S,
                          seed=scenario.seed, scenario=scenario, candidate=REFERENCE,
                          trace=self.config.trace)
                out = self.pool.run(job, self.config.timeout_s)
                self.leaks.record(REFERENCE, out.hygiene)
            records: dict[int, RankRecord] | None = out.results if out.status == "done" else None
            na = sorted({r.not_applicable for r in (records or {}).values() if r.not_applicable})
            if records is None:
                failed = failed_run(Result(scenario.id, REFERENCE, Verdict.ERROR,
                                           self.config.world_size, self.backend.name,
                                           self.device_kind), out, self.config.timeout_s)
                self.reference_failures[scenario.id] = failed
                self.reference_notes[scenario.id] = (
                    f"the reference DDP could not run it: {failed.verdict.value}: "
                    f"{failed.reason}")
            elif na:
                records = None
                self.reference_notes[scenario.id] = (
                    f"the reference DDP does not apply here: {'; '.join(na)}")
            else:
                self._unclaimed[scenario.id] = records
            self._references[scenario.id] = records
        return self._references[scenario.id]

    def _without_reference(self, result: Result, failed: Result) -> None:
        """Make ``result`` say, loudly, that the reference DDP could not run its scenario.

        The checks against the reference were not applied, so a case that otherwise
        passed is an ERROR (the harness's, not the candidate's: the reason says whose);
        a FAIL stays a FAIL. Either way the reference's own evidence (its tracebacks,
        stacks, exit codes) comes with it, each marked as the reference's.
        """
        why = (f"the reference DDP could not run this scenario, so the candidate was not "
               f"compared with it: reference {failed.verdict.value}: {failed.reason}")
        if result.verdict is Verdict.PASS:
            result.verdict, result.reason = Verdict.ERROR, why
        else:
            result.notes.append(why)
        mark = "(the reference DDP's, not the candidate's)\n"
        for rank, text in failed.tracebacks.items():
            result.tracebacks.setdefault(rank, mark + text)
        for rank, text in failed.stacks.items():
            result.stacks.setdefault(rank, mark + text)
        result.desync = result.desync or failed.desync

    def reference_summary(self) -> list[str]:
        """The run-level word on the reference DDP: said when it was needed and ran nothing."""
        asked = len(self._references)
        ran = sum(records is not None for records in self._references.values())
        if asked and not ran:
            return [f"the reference DDP ran none of the {asked} scenario"
                    f"{'' if asked == 1 else 's'} it was needed for: no case was compared "
                    f"with it"]
        return []

    @staticmethod
    def _oracle_key(scenario: Scenario, group: list[int]) -> str:
        return f"{scenario.id}@{','.join(map(str, group))}"

    def _prefetch_oracles(self, scenario: Scenario) -> Future[dict[str, OracleRecord]] | None:
        """Start computing the scenario's missing oracles on the oracle thread (not where
        rank 0 runs in this process: the oracle seeds torch's global RNG)."""
        if getattr(self.pool, "in_process", True):
            return None
        groups = [g for g in scenario.groups_for(self.config.world_size)
                  if self._oracle_key(scenario, g) not in self._oracles]
        if not groups:
            return None
        threads = self.pool.threads

        def compute() -> dict[str, OracleRecord]:
            return {self._oracle_key(scenario, g): run_oracle(scenario, g, torch.device("cpu"),
                                                              threads) for g in groups}

        return self._oracle_thread.submit(compute)

    def _collect_oracles(self, future: Future[dict[str, OracleRecord]] | None) -> None:
        """Wait for a prefetch (always: it must not overlap the next case); the wait is
        the oracle's cost. A failed one is left to :meth:`oracle` to raise where it is
        needed."""
        if future is None:
            return
        with self._costs.timing("oracle"):
            try:
                self._oracles.update(future.result())
            except Exception:  # noqa: BLE001 - recomputed, and raised, by oracle() if needed
                pass

    def oracle(self, scenario: Scenario, group: list[int]) -> OracleRecord:
        """The oracle of ``scenario`` for one DDP group (computed once per run)."""
        key = self._oracle_key(scenario, group)
        if key not in self._oracles:
            device = torch.device("cpu")  # the oracle's models are small; see SPEC.md
            with self._costs.timing("oracle"):  # charged to the case that computes it
                self._oracles[key] = run_oracle(scenario, group, device, self.pool.threads)
        return self._oracles[key]
