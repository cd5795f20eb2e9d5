"""Expectations files: known, accepted deviations kept by a candidate's owner.

One pattern per line (``*`` and ``?`` are wildcards, everything else literal, brackets
included), matched against the case id ``scenario-id[candidate]`` and the bare scenario
id, followed by ``#`` and the reason (required). Blank lines and lines starting with ``#`` are comments::

    join/*[mypkg:MyDDP]   # our Join hook does not shadow the unused-parameter map yet
    comm-hook/powersgd*   # PowerSGD not ported

A failing case that matches becomes XFAIL, a passing one XPASS; a pattern that matched no
case of the run is reported as stale.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddp_conformance.errors import UsageError
from ddp_conformance.judge.verdict import Result, Verdict
from ddp_conformance.user_files import read_user_text


@dataclass
class Expectation:
    pattern: str
    reason: str
    line: int
    used: bool = False
    path: str = ""

    def matches(self, text: str) -> bool:
        regex = re.escape(self.pattern).replace(r"\*", ".*").replace(r"\?", ".")
        return re.fullmatch(regex, text) is not None


@dataclass
class Expectations:
    path: str = ""
    entries: list[Expectation] = field(default_factory=list)

    @classmethod
    def load_all(cls, paths: list[str]) -> Expectations:
        """Several files as one: the first matching entry wins, in the order given."""
        merged = cls(", ".join(paths))
        for path in paths:
            merged.entries.extend(cls.load(path).entries)
        return merged

    @classmethod
    def load(cls, path: str | None) -> Expectations:
        if not path:
            return cls()
        lines = read_user_text(path, "expectations file").splitlines()
        entries = []
        for number, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            pattern, sep, reason = line.partition("#")
            if not sep or not reason.strip():
                raise UsageError(f"{path}:{number}: every expectation needs a reason after '#'")
            entries.append(Expectation(pattern.strip(), reason.strip(), number, path=path))
        return cls(path, entries)

    def match(self, scenario_id: str, candidate: str) -> Expectation | None:
        case = f"{scenario_id}[{candidate}]"
        for entry in self.entries:
            if entry.matches(case) or entry.matches(scenario_id):
                entry.used = True
                return entry
        return None

    def apply(self, result: Result) -> Result:
        """Turn an expected failure into XFAIL and an expected failure that passed into XPASS."""
        entry = self.match(result.scenario, result.candidate)
        if entry is None:
            return result
        result.expectation = f"{entry.path}:{entry.line}: {entry.reason}"
        if result.verdict is Verdict.PASS:
            result.verdict = Verdict.XPASS
        elif result.verdict.unexpected:
            result.verdict = Verdict.XFAIL
        return result

    def stale(self) -> list[Expectation]:
        return [e for e in self.entries if not e.used]
