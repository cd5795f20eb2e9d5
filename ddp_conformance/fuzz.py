"""``ddp-conformance fuzz``: generated scenarios, judged only where torch's DDP passes them.

docs/CONTRACT.md, "Beyond the catalog". The loop draws scenarios from
:func:`~ddp_conformance.catalog.strategies.scenarios` with hypothesis, in rounds of
:data:`ROUND` examples, each round seeded from ``--seed`` and its number, until the budget
is spent:

1. **the candidate** runs the scenario, drawn from what it supports (its capabilities:
   :func:`~ddp_conformance.catalog.strategies.fit`; the first round draws every feature it
   has, each later round a random half of them, a *swarm*). PASS counts as such (a
   candidate that passes every check is never failed, whatever torch does there); N/A
   (a capability it hides until it wraps a model) too.
2. **torch's DDP** runs a scenario the candidate failed (FAIL, ERROR, TIMEOUT, CRASH):
   where torch passes it, it is a finding; where torch does not, the scenario is *set
   aside* and counted with torch's verdict (a generated combination torch refuses, or a
   defect of torch worth a look, listed in the report directory's
   ``fuzz-set-aside.txt``). torch runs only where it decides something.
3. **shrinking**: hypothesis's shrinker minimises a finding, every step a real run, within
   ``--shrink-budget``; the smallest scenario that still fails (torch still passing it) is
   printed as a ``Scenario(...)`` literal to paste into ``suites/``.

The same seed gives the same scenarios in the same order (hypothesis's database is off);
what happens on them is the ranks' business. Every case runs on one
:class:`~ddp_conformance.session.Session`, so the pool, the oracles and torch's verdicts
are shared: a scenario is never run twice for the same candidate.
"""
from __future__ import annotations

import dataclasses
import os
import random
import re
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.catalog.strategies import excluded, scenario_literal, scenarios, swarm
from ddp_conformance.errors import UsageError
from ddp_conformance.judge.verdict import Result, Verdict
from ddp_conformance.session import Session

#: Examples per hypothesis round: small, so that the budget is checked between rounds
#: without generating many examples that are then skipped, and so that rounds, each its
#: own swarm of features (:meth:`Fuzzer.round_strategy`), come often.
ROUND = 30
TORCH = "torch"


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``5m``, ``1h`` to seconds; a one-line usage error otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise UsageError(f"a duration must be a positive number of seconds, or end in s, m or "
                         f"h (90s, 5m, 1h); got {text!r}")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def parse_world_sizes(text: str) -> tuple[int, ...]:
    """``2``, ``1-4`` or ``1,3`` to the world sizes a fuzz run draws from; a one-line usage
    error otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    try:
        sizes = (tuple(range(int(match.group(1)), int(match.group(2)) + 1)) if match
                 else tuple(int(part) for part in text.split(",")))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise UsageError(f"--world-size must be a number of ranks (2), a range (1-4) or a list "
                         f"(1,3), each at least 1; got {text!r}")
    return tuple(dict.fromkeys(sizes))


@dataclass
class Finding:
    """A torch-valid scenario the candidate fails, and its shrunk form."""

    found: Result
    shrunk: Scenario
    shrunk_result: Result
    shrink_runs: int
    #: The world size the scenario was drawn for and fails at.
    world_size: int = 2

    @property
    def id(self) -> str:
        """The finding's one id: the scenario as first found (``fuzz/<model>-<digest>``)."""
        return self.found.scenario

    @property
    def scenario(self) -> Scenario:
        """The shrunk scenario, named ``<id>-shrunk`` after the finding (the literal's and
        the reproducer's name)."""
        return dataclasses.replace(self.shrunk, id=f"{self.id}-shrunk")

    def literal(self) -> str:
        return scenario_literal(self.scenario)


@dataclass
class FuzzRun:
    """What one fuzz run saw."""

    candidate: str
    seed: int
    world_size: int
    budget_s: float
    ran: int = 0
    passed: int = 0
    not_applicable: int = 0
    #: Scenarios torch itself does not pass: torch's verdict, and a count.
    set_aside: Counter[str] = field(default_factory=Counter)
    #: One example of each, for a look: verdict -> the first scenario and why.
    set_aside_examples: dict[str, str] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    #: The world sizes drawn from, one per round in turn (``world_size`` is the first).
    world_sizes: tuple[int, ...] = ()
    #: Scenarios run per world size.
    ran_by_world_size: Counter[int] = field(default_factory=Counter)

    @property
    def cases_per_second(self) -> float:
        return self.ran / self.seconds if self.seconds else 0.0


def capabilities_of(session: Session, candidate: str) -> frozenset[str] | None:
    """What ``candidate`` is known to support before it wraps a model (None: torch's DDP,
    or a candidate whose capabilities are known only once it wraps one: no restriction)."""
    resolved = session.runner.candidates.get(candidate)
    if candidate == TORCH or resolved is None or resolved.late_capabilities:
        return None
    return frozenset(resolved.capabilities)


def keep_hypothesis_files_in(report_dir: str) -> None:
    """hypothesis's own files (its cache of constants; the example database is off) go to
    ``report_dir``/.hypothesis, never to the user's working directory."""
    from hypothesis.configuration import set_hypothesis_home_dir

    set_hypothesis_home_dir(os.path.join(os.path.abspath(report_dir), ".hypothesis"))


#: The file of the report directory that lists what torch's DDP did not pass.
SET_ASIDE_FILE = "fuzz-set-aside.txt"


def write_set_aside(run: FuzzRun, report_dir: str) -> str:
    """Write what was set aside (per torch verdict: how many, the first scenario as a
    literal and torch's words) to ``report_dir``/:data:`SET_ASIDE_FILE`; its path."""
    path = os.path.join(report_dir, SET_ASIDE_FILE)
    os.makedirs(report_dir, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        out.write(f"fuzz {run.candidate}, seed {run.seed}: scenarios torch's DDP does not "
                  f"pass judge nothing; per verdict, the first of them\n")
        for verdict, count in sorted(run.set_aside.items()):
            out.write(f"\n{verdict}: {count}\n{run.set_aside_examples[verdict]}\n")
    return path


class Fuzzer:
    """Runs the loop of the module docstring on ``session`` (its config names the candidate;
    torch is run as well, for validity), or on one session per world size: the rounds then
    take the world sizes in turn (``--world-size 1-4``)."""

    def __init__(self, session: Session | Mapping[int, Session], candidate: str, budget_s: float,
                 seed: int = 0,
                 shrink_budget_s: float = 120.0, keep_going: bool = False,
                 progress: Callable[[str], None] | None = None,
                 verdicts: dict[tuple[str, str], Result] | None = None,
                 max_scenarios: int | None = None) -> None:
        """``verdicts``: results already known, by (scenario id, candidate spec), shared
        between fuzzers of one session (torch's, when several candidates are fuzzed).
        ``max_scenarios``: generate at most this many (``--max-scenarios``; with the time
        budget, whichever ends first): a budget that means the same on any machine."""
        self.max_scenarios = max_scenarios
        self.sessions: dict[int, Any] = (dict(session) if isinstance(session, Mapping)
                                         else {session.config.world_size: session})
        self.world_size = next(iter(self.sessions))
        self.candidate = candidate
        self.shrink_budget_s = shrink_budget_s
        self.keep_going = keep_going
        self.progress = progress or (lambda line: None)
        self.run_state = FuzzRun(candidate, seed, self.world_size, budget_s,
                                 world_sizes=tuple(self.sessions))
        self._verdicts: dict[tuple[str, str], Result] = {} if verdicts is None else verdicts
        self._answers: dict[tuple[int, str], bool] = {}
        self._ends = 0.0
        self._shrinking_until: float | None = None
        self._shrink_runs = 0
        #: The round's finding as first found (shrinking keeps its id for it).
        self._found: tuple[Scenario, Result] | None = None
        #: What the candidate can run (None: everything; :func:`capabilities_of`).
        self.capabilities = capabilities_of(self.sessions[self.world_size], candidate)

    # -- one scenario -------------------------------------------------------------------

    def case(self, scenario: Scenario, spec: str) -> Result:
        """The verdict of ``scenario`` for ``spec``, run at most once."""
        key = (scenario.id if self.world_size == self.run_state.world_size
               else f"{scenario.id}@{self.world_size}", spec)
        if key not in self._verdicts:
            self._verdicts[key] = self.sessions[self.world_size].run_case(scenario, spec)
        return self._verdicts[key]

    def fails(self, scenario: Scenario) -> bool:
        """Whether the candidate fails ``scenario`` where torch passes it (the condition
        hypothesis searches for and shrinks). A scenario once answered keeps its answer
        within a round (hypothesis replays the smallest one, and calls a changed answer
        flaky); a failure a finished round reported answers False in later rounds (found
        once is enough: ``--keep-going`` looks for others); one drawn after the budget is
        spent is answered False without a run."""
        key = (self.world_size, scenario.id)
        if key not in self._answers:
            self._answers[key] = self._fails(scenario)
        return self._answers[key]

    def _fails(self, scenario: Scenario) -> bool:
        now = time.monotonic()
        shrinking = self._shrinking_until is not None
        if now > (self._ends if self._shrinking_until is None else self._shrinking_until):
            return False  # out of budget: generate and shrink nothing more
        if not shrinking and self._scenarios_spent():
            return False
        if shrinking:
            self._shrink_runs += 1
        else:
            self.run_state.ran += 1
            self.run_state.ran_by_world_size[self.world_size] += 1
        result = self.case(scenario, self.candidate)
        if not result.verdict.unexpected:
            if not shrinking:
                self.run_state.passed += result.verdict is Verdict.PASS
                self.run_state.not_applicable += result.verdict is Verdict.NA
            return False
        torch_result = self.case(scenario, TORCH)  # a failure counts where torch passes
        if torch_result.verdict is not Verdict.PASS:
            if not shrinking:
                self._set_aside(scenario, torch_result)
            return False
        if not shrinking:
            self._found = (scenario, result)
            self._shrinking_until = now + self.shrink_budget_s
            self.progress(f"found: {result.case_id}: {result.verdict.value}: "
                          f"{result.summary_line()}; shrinking (up to "
                          f"{self.shrink_budget_s:.0f}s)")
        return True

    def _scenarios_spent(self) -> bool:
        return self.max_scenarios is not None and self.run_state.ran >= self.max_scenarios

    def _set_aside(self, scenario: Scenario, result: Result) -> None:
        verdict = result.verdict.value
        self.run_state.set_aside[verdict] += 1
        self.run_state.set_aside_examples.setdefault(
            verdict, f"{scenario_literal(scenario)}: {result.summary_line()}")

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> FuzzRun:
        started = time.monotonic()
        if self.capabilities is not None:
            left_out = excluded(self.world_size, self.capabilities)
            if left_out:
                self.progress(textwrap.fill(
                    f"fuzz {self.candidate}: drawing only what it supports; not drawn (it "
                    f"lacks them): {'; '.join(left_out)}", 120, subsequent_indent="  "))
        self._ends = started + self.run_state.budget_s
        config = settings(max_examples=ROUND, database=None, deadline=None,
                          phases=(Phase.generate, Phase.shrink),
                          suppress_health_check=list(HealthCheck))
        round_number = 0
        while time.monotonic() < self._ends and not self._scenarios_spent():
            self._shrinking_until, self._shrink_runs, self._found = None, 0, None
            rng = random.Random(self.run_state.seed * 1_000_003 + round_number)
            strategy = self.round_strategy(round_number, rng)
            try:
                shrunk = find(strategy, self.fails, settings=config, random=rng)
            except NoSuchExample:
                shrunk = None
            round_number += 1
            if shrunk is not None:
                result = self.case(shrunk, self.candidate)
                assert self._found is not None
                self.run_state.findings.append(Finding(self._found[1], shrunk, result,
                                                       self._shrink_runs, self.world_size))
                self._answers = {key: False for key in self._answers}  # reported
                if not self.keep_going:
                    break
            self.progress(self.status_line(started))
        self.run_state.seconds = time.monotonic() - started
        return self.run_state

    def round_strategy(self, round_number: int, rng: random.Random) -> Any:
        """Round ``round_number``'s world size (in turn) and strategy: the first round
        draws every feature the candidate has, each later one a swarm of them
        (:func:`~ddp_conformance.catalog.strategies.swarm`, from ``rng``)."""
        sizes = self.run_state.world_sizes
        self.world_size = sizes[round_number % len(sizes)]
        if round_number == 0:
            return scenarios(self.world_size, self.capabilities)
        return scenarios(self.world_size, swarm(self.capabilities, rng))

    def status_line(self, started: float) -> str:
        s = self.run_state
        left = max(0.0, self._ends - time.monotonic())
        aside = sum(s.set_aside.values())
        return (f"fuzz {self.candidate}: {s.ran} scenarios, {s.passed} passed, "
                f"{s.not_applicable} N/A, {aside} set aside (failing, torch too), "
                f"{len(s.findings)} failing; {time.monotonic() - started:.0f}s, {left:.0f}s left")
