"""The catalog against each mutant, as ``ddp-conformance run --candidate SPEC -x`` does,
several mutants per rank pool.

Per mutant and world size: the scenarios that run its lines (:mod:`.select`), those that
killed most mutants so far first, then the cheapest; the first FAIL, ERROR, CRASH or
TIMEOUT ends it (``-x``). World size 2 first; a mutant that survives there runs again at 3
ranks (the scenarios that run its lines at 3). One :class:`~ddp_conformance.runner.Runner`
(one rank pool, one zygote) serves a batch of mutants. Each mutant's outcome is appended to
a JSONL file as soon as it is known, so a killed run loses nothing and a rerun skips
what is there (resumable).

Statuses: ``killed`` (by which scenario and check), ``timeout`` (a case ran past its
deadline: the harness's TIMEOUT verdict, a hang it diagnosed), ``survived``, ``not
reached`` (no torch case runs its lines), ``incompetent`` (the mutant does not import: its
module raises when executed, checked in a throwaway process before the run).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.mutation.population import IDENTITY, ROOT, Mutant
from benchmarks.mutation.select import PR_MARK, Reach

KILLING = ("FAIL", "ERROR", "CRASH", "TIMEOUT")
DETECTED = ("killed", "timeout")
SPEC = "benchmarks.mutation.live:"
WORLD_SIZES = (2, 3)


@dataclass
class Outcome:
    """One mutant's result (one JSONL line)."""

    id: str
    status: str  # killed | timeout | survived | not reached | incompetent
    world_size: int = 0
    scenario: str = ""
    check: str = ""
    evidence: str = ""
    tried: int = 0
    seconds: float = 0.0
    scenarios: list[str] = field(default_factory=list)  # what a survivor ran
    #: A survivor at a world size before the last: still to run at the next one.
    partial: bool = False

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


def read_outcomes(path: Path) -> dict[str, Outcome]:
    """The outcomes in ``path`` by mutant id (a later line of the same id wins)."""
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            data = json.loads(line)
            out[data["id"]] = Outcome(**data)
    return out


def incompetent(ids: list[str]) -> dict[str, str]:
    """Mutants whose module raises when executed, with the error; built in a throwaway
    process (never the harness's own)."""
    code = ("import json, sys\n"
            "from benchmarks.mutation.install import build, MutantDoesNotImport\n"
            "bad = {}\n"
            "for i in sys.argv[1:]:\n"
            "    try:\n        build(i)\n"
            "    except MutantDoesNotImport as exc:\n        bad[i] = str(exc)\n"
            "print(json.dumps(bad))\n")
    done = subprocess.run([sys.executable, "-c", code, *ids], cwd=ROOT, capture_output=True,
                          text=True, check=True, timeout=600)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _check(result: Any) -> str:
    if result.verdict.name == "FAIL" and result.failures:
        return str(result.failures[0].check)
    return str(result.verdict.name)


def _evidence(result: Any) -> str:
    text = result.failures[0].message if result.verdict.name == "FAIL" and result.failures \
        else f"{result.verdict.name}: {result.reason}"
    text = " ".join(str(text).split())
    return text if len(text) <= 240 else text[:237] + "..."


class Hunt:
    """Runs mutants against their scenarios, learning which scenarios kill most."""

    def __init__(self, reaches: dict[int, Reach], out: Path, timeout_s: float,
                 batch: int, slow: bool = False) -> None:
        self.reaches, self.out, self.timeout_s, self.batch = reaches, out, timeout_s, batch
        self.slow = slow
        self.kills: Counter[str] = Counter()
        #: Survivors so far (partial outcomes of the world sizes before), by mutant id.
        self.before: dict[str, Outcome] = {}

    def order(self, scenarios: list[str]) -> list[str]:
        return sorted(scenarios, key=lambda s: -self.kills[s])  # stable: cheapest next

    def record(self, outcome: Outcome) -> None:
        with self.out.open("a") as f:
            f.write(outcome.to_json() + "\n")
        print(f"{outcome.id:60s} {outcome.status:11s} ws{outcome.world_size} "
              f"{outcome.scenario} {outcome.check} ({outcome.tried} tried, "
              f"{outcome.seconds:.1f} s)", flush=True)

    def run(self, mutants: list[Mutant], world_size: int) -> list[Outcome]:
        """Every mutant at ``world_size``, in batches of one rank pool each. Killed and
        timed-out mutants are recorded; the survivors' outcomes are returned."""
        survivors = []
        for start in range(0, len(mutants), self.batch):
            survivors += self._batch(mutants[start:start + self.batch], world_size)
        return survivors

    def _batch(self, mutants: list[Mutant], world_size: int) -> list[Outcome]:
        from ddp_conformance.catalog.loader import load_catalog
        from ddp_conformance.config import RunConfig
        from ddp_conformance.runner import Runner

        catalog = {s.id: s for s in load_catalog()}
        reach = self.reaches[world_size]
        specs = [SPEC + m.id + mode for m in mutants for mode in ("", PR_MARK)]
        config = RunConfig(candidates=specs, world_size=world_size,
                           timeout_s=self.timeout_s, strict_profile=True, slow=self.slow)
        survivors = []
        with Runner(config) as runner:
            for mutant in mutants:
                outcome = self._one(runner, catalog, mutant, reach.scenarios(mutant) or [])
                outcome.world_size = world_size
                outcome = _merged(mutant.id, self.before.get(mutant.id), outcome, world_size)
                outcome.partial = outcome.status == "survived" and world_size != WORLD_SIZES[-1]
                self.record(outcome)
                if outcome.status == "survived":
                    self.before[mutant.id] = outcome
                    survivors.append(outcome)
        return survivors

    def _one(self, runner: Any, catalog: dict[str, Any], mutant: Mutant,
             scenarios: list[str]) -> Outcome:
        started = time.monotonic()
        tried = []
        for sid in self.order(scenarios):
            tried.append(sid)
            scenario, mode = sid.removesuffix(PR_MARK), PR_MARK if sid.endswith(PR_MARK) else ""
            result = runner.run_case(catalog[scenario], SPEC + mutant.id + mode)
            if result.verdict.name in KILLING:
                self.kills[sid] += 1
                status = "timeout" if result.verdict.name == "TIMEOUT" else "killed"
                return Outcome(mutant.id, status, scenario=sid, check=_check(result),
                               evidence=_evidence(result), tried=len(tried),
                               seconds=time.monotonic() - started)
        return Outcome(mutant.id, "survived", tried=len(tried), scenarios=tried,
                       seconds=time.monotonic() - started)


def measure(sample: list[Mutant], reaches: dict[int, Reach], out: Path,
            timeout_s: float = 30.0, batch: int = 25, slow: bool = False) -> None:
    """Measure every mutant of ``sample`` not yet in ``out`` (resumable: a survivor of
    world size 2, recorded as partial, goes on at 3)."""
    done = read_outcomes(out)
    hunt = Hunt(reaches, out, timeout_s, batch, slow)
    for o in done.values():  # what killed before goes first again
        if o.status in DETECTED:
            hunt.kills[o.scenario] += 1
    hunt.before = {i: o for i, o in done.items() if o.partial}
    if IDENTITY not in done:
        control(hunt)
    todo = [m for m in sample if m.id not in done]
    bad = incompetent([m.id for m in todo]) if todo else {}
    runnable = []
    for m in todo:
        if m.id in bad:
            hunt.record(Outcome(m.id, "incompetent", evidence=bad[m.id][:240]))
        elif all(reaches[ws].scenarios(m) is None for ws in reaches):
            hunt.record(Outcome(m.id, "not reached"))
        else:
            runnable.append(m)
    now = [m for m in runnable if reaches[WORLD_SIZES[0]].scenarios(m)]
    hunt.run(now, WORLD_SIZES[0])
    # Survivors argued equivalent or out of reach (verdicts.toml) are not run at 3 ranks:
    # they do not count in the score whatever happens there.
    from benchmarks.mutation.verdicts import read

    settled = {i for i, v in read().items() if v.cls != "gap"}
    later = [m for m in sample if m.id not in settled and
             (m.id in hunt.before or (m in runnable and m not in now))]
    last = WORLD_SIZES[-1]
    hunt.run([m for m in later if reaches[last].scenarios(m)], last)
    for m in later:  # survived at 2, nothing to run at 3: final as it is
        o = hunt.before.get(m.id)
        if not reaches[last].scenarios(m):
            o = _merged(m.id, o, None, last)
            o.partial = False
            hunt.record(o)


def control(hunt: Hunt) -> None:
    """torch's sources unmutated, built and run as a mutant is, on every scenario torch
    passes at 2 ranks: it must survive, or the installation itself kills (exit)."""
    ws = WORLD_SIZES[0]
    identity = Mutant(IDENTITY, "distributed", "", 0, 0, 0, 0)
    hunt.reaches = {**hunt.reaches, ws: _Everything(hunt.reaches[ws])}
    try:
        outcome = hunt.run([identity], ws)
    finally:
        hunt.reaches = {k: getattr(r, "reach", r) for k, r in hunt.reaches.items()}
    if not outcome:
        sys.exit("the unmutated control fails a scenario torch passes: see the results")
    hunt.before.pop(IDENTITY, None)


class _Everything:
    """A reach that gives every scenario torch passes, in either reducer mode (for the
    control)."""

    def __init__(self, reach: Reach) -> None:
        self.reach = reach

    def scenarios(self, mutant: Mutant) -> list[str]:
        return sorted(self.reach.passed, key=lambda s: (self.reach.passed[s], s))


def _merged(mutant_id: str, before: Outcome | None, now: Outcome | None,
            ws: int) -> Outcome:
    """A mutant's outcome over the world sizes it ran at (a survivor's scenarios are
    listed with their world size)."""
    if now is None:
        if before is None:
            return Outcome(mutant_id, "survived", world_size=ws)
        return Outcome(**{**before.__dict__})
    if now.status == "survived":
        now.scenarios = [f"{s} ({ws})" for s in now.scenarios]
    if before is not None:
        now.tried += before.tried
        now.seconds += before.seconds
        if now.status == "survived":
            now.scenarios = before.scenarios + now.scenarios
    return now
