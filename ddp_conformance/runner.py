"""Runs (scenario, candidate) cases on the rank pool and turns what happened into verdicts.

Shared by the command line and the pytest plugin, so both give the same verdicts. The
oracle of a scenario is computed once per run (it does not depend on the candidate).
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field

import torch

from .candidate import Candidate, resolve_candidate
from .checks import Evidence, check_reference, check_run
from .engine import RankRecord, missing_capabilities
from .environment import validate
from .expectations import Expectations
from .jobs import Job
from .oracle import OracleRecord, run_oracle
from .pool import Outcome, Pool, RankPool
from .scenario import Scenario
from .trace_checks import check_trace
from .verdict import Result, Verdict, describe_exit

#: Gloo's own collective timeout: longer than the scenario deadline, so that a hang is
#: reported by the harness (with stacks) and not by the backend.
COLLECTIVE_TIMEOUT_MARGIN_S = 30.0
REFERENCE = "reference"
#: Candidates held to the strict profile always: torch's DDP and the reference.
STRICT_CANDIDATES = frozenset({"torch", REFERENCE})


@dataclass
class RunConfig:
    candidates: list[str] = field(default_factory=lambda: ["torch"])
    backend: str = "gloo"
    device: str = "cpu"
    world_size: int = 2
    timeout_s: float = 60.0
    pool: str = "persistent"  # or "fresh"
    expectations: str | None = None
    #: Also compare every candidate with the reference DDP run on the same scenario.
    compare_with_reference: bool = True
    #: Trace collectives at the process-group level and check them.
    trace: bool = True
    #: Enforce the strict profile (bucket layout equal to the reference's) for every
    #: candidate, not only for torch and reference.
    strict_profile: bool = False


class Runner:
    """Owns the rank pool, the resolved candidates and the oracle cache of one run."""

    def __init__(self, config: RunConfig, pool: Pool | None = None) -> None:
        """``pool`` replaces the rank pool (e.g. ranks started by torchrun); same interface."""
        self.config = config
        self.device_kind = validate(config.backend, config.device, config.world_size)
        self.candidates: dict[str, Candidate] = {}
        for spec in config.candidates:
            self.candidates[spec] = resolve_candidate(spec)
        shipped = [c.expectations for c in self.candidates.values() if c.expectations]
        self.expectations = Expectations.load_all(
            ([config.expectations] if config.expectations else []) + shipped)
        self.pool: Pool = pool or RankPool(config.world_size, config.backend, self.device_kind,
                                     fresh=config.pool == "fresh")
        self._oracles: dict[str, OracleRecord] = {}
        self._references: dict[str, dict[int, RankRecord] | None] = {}
        self.reference_notes: dict[str, str] = {}

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def candidate_name(self, spec: str) -> str:
        return self.candidates[spec].name

    def run_case(self, scenario: Scenario, spec: str) -> Result:
        started = time.monotonic()
        result = self._run_case(scenario, spec)
        result.duration_s = time.monotonic() - started
        return self.expectations.apply(result)

    def _result(self, scenario: Scenario, spec: str, verdict: Verdict, reason: str = "") -> Result:
        return Result(scenario.id, self.candidate_name(spec), verdict, self.config.world_size,
                      self.config.backend, self.device_kind, reason=reason)

    def _run_case(self, scenario: Scenario, spec: str) -> Result:
        candidate = self.candidates[spec]
        ws = self.config.world_size
        if self.config.backend not in candidate.backends:
            return self._result(scenario, spec, Verdict.NA,
                                f"candidate does not support backend {self.config.backend}")
        unsupported = (scenario.unsupported_backend(self.config.backend)
                       or scenario.unsupported_world_size(ws))
        if unsupported:
            return self._result(scenario, spec, Verdict.NA, unsupported)
        if not candidate.late_capabilities:
            missing = missing_capabilities(scenario, candidate.capabilities)
            if missing:
                return self._result(scenario, spec, Verdict.NA, missing)
        job = Job("scenario", "", self.config.timeout_s + COLLECTIVE_TIMEOUT_MARGIN_S,
                  seed=scenario.seed, scenario=scenario, candidate=spec, trace=self.config.trace)
        outcome = self.pool.run(job, self.config.timeout_s)
        if outcome.status != "done":
            return self._failed_run(scenario, spec, outcome)
        records: dict[int, RankRecord] = outcome.results
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
                check_run(scenario, mine, oracle, evidence)
                if theirs is not None:
                    check_reference(evidence, scenario, mine, theirs, oracle)
                if self.config.trace:
                    check_trace(evidence, scenario, mine, oracle, theirs, strict)
            except Exception as exc:  # noqa: BLE001 - records outside the contract: this case's error
                return self._result(
                    scenario, spec, Verdict.ERROR,
                    f"the candidate's records could not be checked: {type(exc).__name__}: "
                    f"{_last_line(str(exc)) if str(exc) else ''}")
        result = self._result(scenario, spec, Verdict.FAIL if evidence.failures else Verdict.PASS)
        result.failures, result.figures, result.checks_run, result.notes = (
            evidence.failures, evidence.figures, evidence.checks, evidence.notes)
        if scenario.id in self.reference_notes:
            result.notes.append(self.reference_notes[scenario.id])
        return result

    def reference_records(self, scenario: Scenario, spec: str) -> dict[int, RankRecord] | None:
        """The reference DDP's records for ``scenario`` (run once per run), or None.

        None when the candidate is the reference itself, or when the reference could not
        run the scenario (then the reason is kept in :attr:`reference_notes`).
        """
        if spec == REFERENCE or not self.config.compare_with_reference:
            return None
        if scenario.id not in self._references:
            job = Job("scenario", "", self.config.timeout_s + COLLECTIVE_TIMEOUT_MARGIN_S,
                      seed=scenario.seed, scenario=scenario, candidate=REFERENCE,
                      trace=self.config.trace)
            out = self.pool.run(job, self.config.timeout_s)
            records: dict[int, RankRecord] | None = out.results if out.status == "done" else None
            if records is not None and any(r.not_applicable for r in records.values()):
                records = None
            if records is None:
                self.reference_notes[scenario.id] = f"reference could not run it: {out.status}"
            self._references[scenario.id] = records
        return self._references[scenario.id]

    def oracle(self, scenario: Scenario, group: list[int]) -> OracleRecord:
        """The oracle of ``scenario`` for one DDP group (computed once per run)."""
        key = f"{scenario.id}@{','.join(map(str, group))}"
        if key not in self._oracles:
            device = torch.device("cpu")  # the oracle's models are small; see SPEC.md
            self._oracles[key] = run_oracle(scenario, group, device, self.pool.threads)
        return self._oracles[key]

    def _failed_run(self, scenario: Scenario, spec: str, out: Outcome) -> Result:
        if out.status == "crash":
            rank, code = min(out.exit_codes.items())
            result = self._result(scenario, spec, Verdict.CRASH,
                                  f"rank {rank} died with {describe_exit(code)}")
        elif out.status == "raised":
            primary = {r: tb for r, tb in out.tracebacks.items() if r not in out.released} \
                or out.tracebacks
            rank = min(primary)
            result = self._result(scenario, spec, Verdict.ERROR,
                                  f"rank {rank} raised {_last_line(primary[rank])}")
        else:
            result = self._result(
                scenario, spec, Verdict.TIMEOUT,
                f"no progress within {self.config.timeout_s:g}s: rank(s) "
                f"{', '.join(map(str, sorted(out.stacks)))} still running"
                + "".join(f"; rank {r} at {_innermost_frame(s)}" for r, s in sorted(out.stacks.items())))
        result.tracebacks, result.stacks, result.exit_codes = out.tracebacks, out.stacks, out.exit_codes
        for rank, log in out.logs.items():
            fatal = result.stacks.get(rank)
            result.stacks[rank] = f"(process died; end of its output)\n{log}" + (
                f"\n(its Python stacks at the fatal signal)\n{fatal}" if fatal else "")
        return result


def _last_line(text: str) -> str:
    """The exception line of a traceback (its first line if the message spans several),
    else the text's last non-empty line."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    frames = [i for i, ln in enumerate(lines) if ln.startswith('  File "')]
    if frames:
        after = [ln for ln in lines[frames[-1] + 1:] if not ln.startswith(" ")]
        if after:
            return after[0].strip()
    return lines[-1].strip() if lines else "(no traceback)"


_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_HARNESS_PARTS = (f"{os.sep}torch{os.sep}", f"{os.sep}ddp_conformance{os.sep}", "<frozen ")


def _innermost_frame(stack: str) -> str:
    """Where a stuck rank is: its innermost frame, and the innermost one in user code.

    faulthandler lists every thread, the current (main) one marked, most recent call first.
    """
    blocks = stack.split("\n\n")
    current = next((b for b in blocks if b.lstrip().startswith("Current thread")), blocks[0])
    frames = [m.groupdict() for m in _FRAME.finditer(current)]
    if not frames:
        return "(unknown)"

    def show(f: dict[str, str]) -> str:
        return f"{f['func']} ({os.path.basename(f['path'])}:{f['line']})"

    where = show(frames[0])
    if "Garbage-collecting" in current.split("File ", 1)[0]:
        where = f"garbage collection in {where}"
    caller = next((f for f in frames if not any(p in f["path"] for p in _HARNESS_PARTS)), None)
    if caller is not None and caller is not frames[0]:
        where += f" called from {show(caller)}"
    return where
