"""Hunting the zoo: run the catalog against each mutant until a scenario catches it.

Shared by ``tests/test_mutant_zoo.py`` and ``benchmarks/mutant_zoo.py``. Per mutant the
catalog runs in a fixed order, cheap and broad scenarios first, and stops at the first
scenario whose verdict is FAIL, ERROR, TIMEOUT or CRASH. World size 2 first; scenarios
that need more ranks (process subgroups) then run at 3 and 4 ranks for the mutants still
uncaught. One runner (one rank pool) per world size; then the reference DDP runs every
scenario that caught a mutant, to show the catch is the defect's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.config import RunConfig
from ddp_conformance.judge.verdict import Result, Verdict
from ddp_conformance.runner import Runner

CAUGHT = frozenset({Verdict.FAIL, Verdict.ERROR, Verdict.TIMEOUT, Verdict.CRASH})
REFERENCE = "reference"
TIMEOUT_S = 10.0
#: Cheap, broad scenarios first: each catches a family of defects in ~0.1 s.
FIRST = (
    "gradients/mlp-sgd", "no-sync/window-of-3", "buffers/conv-bn-broadcast",
    "init-sync/per-rank-weights", "unused/always-and-alternate", "unused/used-on-some-ranks",
    "models/tied", "models/frozen", "buckets/mlp-tiny-cap", "gradients/exact-fp16-near-range",
    "buckets/mixed-dtypes", "models/sparse-embedding", "options/gradient-as-bucket-view",
    "comm-hooks/fp16-compress", "buffers/conv-bn-no-sync", "buffers/conv-bn-no-broadcast",
    "join/uneven-divide-by-active", "join/uneven-buffers",
)
#: World sizes tried in turn, each only for the mutants still uncaught.
WORLD_SIZES = (2, 3, 4)


def ordered_catalog() -> list[Scenario]:
    """The whole catalog, :data:`FIRST` first, then the rest in catalog order."""
    catalog = load_catalog()
    rank = {sid: i for i, sid in enumerate(FIRST)}
    return sorted(catalog, key=lambda s: rank.get(s.id, len(FIRST)))


def scenarios_for(world_size: int, catalog: list[Scenario]) -> list[Scenario]:
    """At 2 ranks everything defined there; at more ranks only what needs more ranks or is
    defined for exact world sizes (process subgroups): the rest already ran at 2."""
    runs = [s for s in catalog if not s.unsupported_world_size(world_size)]
    if world_size == WORLD_SIZES[0]:
        return runs
    return [s for s in runs if s.world_sizes is not None or s.min_world_size > WORLD_SIZES[0]]


@dataclass
class Catch:
    mutant: str
    result: Result | None  # None: nothing caught it
    world_size: int
    tried: int

    @property
    def check(self) -> str:
        if self.result is None:
            return "-"
        if self.result.verdict is Verdict.FAIL and self.result.failures:
            return self.result.failures[0].check
        return self.result.verdict.name

    @property
    def message(self) -> str:
        if self.result is None:
            return "not caught"
        r = self.result
        text = r.failures[0].message if r.verdict is Verdict.FAIL and r.failures else \
            f"{r.verdict.name}: {r.reason}"
        return " ".join(text.split())


@dataclass
class ZooRun:
    catches: dict[str, Catch]
    reference: dict[tuple[str, int], Result]
    seconds: float


def hunt(mutants: list[str], timeout_s: float = TIMEOUT_S) -> ZooRun:
    """Run the ordered catalog against each mutant until a scenario catches it; then the
    reference on every scenario that caught one."""
    started = time.monotonic()
    catalog = ordered_catalog()
    catches: dict[str, Catch] = {}
    reference: dict[tuple[str, int], Result] = {}
    left = list(mutants)
    for ws in WORLD_SIZES:
        scenarios = scenarios_for(ws, catalog)
        if not left or not scenarios:
            continue
        config = RunConfig(candidates=[*left, REFERENCE], world_size=ws, timeout_s=timeout_s)
        with Runner(config) as runner:
            for mutant in left:
                tried = 0
                for scenario in scenarios:
                    tried += 1
                    result = runner.run_case(scenario, mutant)
                    if result.verdict in CAUGHT:
                        catches[mutant] = Catch(mutant, result, ws, tried)
                        break
                else:
                    catches[mutant] = Catch(mutant, None, ws, tried)
            for scenario_id in sorted({c.result.scenario for c in catches.values()
                                       if c.result is not None and c.world_size == ws}):
                scenario = next(s for s in catalog if s.id == scenario_id)
                reference[(scenario_id, ws)] = runner.run_case(scenario, REFERENCE)
        left = [m for m in left if catches[m].result is None]
    return ZooRun(catches, reference, time.monotonic() - started)


def table(run: ZooRun, docs: dict[str, str] | None = None, width: int = 160) -> str:
    """The Markdown table: mutant, defect, catching scenario, check, evidence."""
    head = "| mutant | defect | caught by (world size) | check | evidence |\n|---|---|---|---|---|"
    rows = []
    for mutant, c in run.catches.items():
        name = mutant.rpartition(":")[2]
        where = "**not caught**" if c.result is None else f"`{c.result.scenario}` ({c.world_size})"
        message = c.message if len(c.message) <= width else c.message[:width - 3] + "..."
        doc = (docs or {}).get(mutant, "")
        rows.append(f"| `{name}` | {doc} | {where} | `{c.check}` | {message.replace('|', '/')} |")
    return "\n".join([head, *rows])
