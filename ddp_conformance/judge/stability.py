"""Stability over repeats (``ddp-conformance run --repeat N``), as wptrunner's ``--verify``.

Every case runs N times on the same rank pool. A case is **flaky** when its verdict or its
figures (the error figures of every check, the failures' messages) differ between repeats:
the harness promises the same answer for the same candidate, so any difference is either
nondeterminism in the candidate or a bug of the harness. After each repeat every rank
reports its resident and peak memory; the rank processes **grow** when, past the first
repeat (which warms allocator caches and imports), the resident size keeps rising by more
than ``GROWTH_ALLOWANCE_MB`` plus 5 %.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

from ddp_conformance.judge.verdict import Result

GROWTH_ALLOWANCE_MB = 16.0


def fingerprint(result: Result) -> str:
    """What must not change between repeats: the verdict and every figure and message."""
    return json.dumps({
        "verdict": result.verdict.value,
        "failures": [f.message for f in result.failures],
        "figures": [(f.check, f.step, f.rank, f.name, f.passed, f.max_abs, f.max_ulp)
                    for f in result.figures],
    }, sort_keys=True, default=str)


@dataclass
class Stability:
    repeats: int
    fingerprints: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    verdicts: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    memory: list[dict[int, tuple[float, float]]] = field(default_factory=list)

    def add(self, result: Result) -> None:
        self.fingerprints[result.case_id].append(fingerprint(result))
        self.verdicts[result.case_id].append(result.verdict.value)

    def add_memory(self, per_rank: dict[int, tuple[float, float]]) -> None:
        self.memory.append(per_rank)

    def flaky(self) -> dict[str, str]:
        """Case id -> what changed."""
        out = {}
        for case, prints in self.fingerprints.items():
            if len(set(prints)) > 1:
                verdicts = self.verdicts[case]
                out[case] = ("verdicts " + ", ".join(verdicts) if len(set(verdicts)) > 1
                             else "figures changed between repeats")
        return out

    def growth(self) -> dict[int, str]:
        """Rank -> how its resident memory grew past the first repeat (if it did)."""
        out: dict[int, str] = {}
        if len(self.memory) < 3:
            return out
        for rank in self.memory[0]:
            if any(rank not in m for m in self.memory):
                continue
            base = self.memory[1][rank][0]
            last = self.memory[-1][rank][0]
            if last > base * 1.05 + GROWTH_ALLOWANCE_MB:
                out[rank] = f"resident {base:.0f} MiB after repeat 2, {last:.0f} MiB after " \
                            f"repeat {len(self.memory)}"
        return out

    def memory_rows(self) -> list[list[str]]:
        """One row per repeat: each rank's resident / peak MiB."""
        return [[str(i + 1), *(f"{m[r][0]:.0f} / {m[r][1]:.0f}" for r in sorted(m))]
                for i, m in enumerate(self.memory)]
