"""The classification of the mutants that no scenario kills (``verdicts.toml``).

Each entry is a mutant id with ``class`` and ``reason``:

- ``equivalent``: no behaviour a user can observe changes (the reason says why);
- ``out-of-reach``: its change only shows where Gloo on CPU cannot go (CUDA-only branch,
  NCCL-only, ...), or in code no DDP on CPU calls; the reason says which;
- ``gap``: an observable change the catalog missed; ``fixed_by`` names the scenario or check
  added for it, and the mutant is re-measured (``results/after.jsonl``).

A mutant not reached by the catalog whose lines all lie in a range of
``benchmarks/torch_coverage_exclusions.txt`` (lines no Gloo/CPU run can reach, each with
its reason) is out of reach with that reason, without an entry here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tomllib

from benchmarks.mutation.population import TARGETS, Mutant

HERE = Path(__file__).resolve().parent
VERDICTS = HERE / "verdicts.toml"
EXCLUSIONS = HERE.parent / "torch_coverage_exclusions.txt"
CLASSES = ("equivalent", "out-of-reach", "gap")


@dataclass(frozen=True)
class Verdict:
    cls: str
    reason: str
    fixed_by: str = ""


def read(path: Path = VERDICTS) -> dict[str, Verdict]:
    """Mutant id -> its verdict; ValueError for an unknown class or a missing reason."""
    data = tomllib.loads(path.read_text()) if path.exists() else {}
    out = {}
    for mutant_id, entry in data.items():
        cls, reason = entry.get("class", ""), entry.get("reason", "").strip()
        if cls not in CLASSES or not reason:
            raise ValueError(f"{path.name}: {mutant_id}: needs class (one of "
                             f"{', '.join(CLASSES)}) and a reason")
        out[mutant_id] = Verdict(cls, " ".join(reason.split()), entry.get("fixed_by", ""))
    return out


def excluded(mutant: Mutant) -> str | None:
    """The exclusion file's reason when every line of ``mutant`` is in one excluded range."""
    section, ranges = "", []
    for raw in EXCLUSIONS.read_text().splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif " | " in line and section == TARGETS[mutant.target].path:
            span, _, reason = (p.strip() for p in line.split(" | ", 2))
            first, last = (int(x) for x in span.split("-"))
            ranges.append((first, last, reason))
    lines = range(mutant.first_line, mutant.last_line + 1)
    for first, last, reason in ranges:
        if first <= lines.start and lines.stop - 1 <= last:
            return reason
    return None
