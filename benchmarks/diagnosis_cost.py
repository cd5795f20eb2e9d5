"""What the diagnosis costs a failing run: with and without it, side by side, interleaved.

    python benchmarks/diagnosis_cost.py [--candidate SPEC] [-k EXPR] [--rounds 3]

One runner (two ranks) runs the selected cases of a failing candidate (default
``tests.defective:SumsWithoutDividing`` over the ``gradients``, ``buckets`` and ``buffers``
families) once per mode per round, the modes alternating (on, off, on, off, ...):

- *on*: as a run does: each failing case's cause (``judge.diagnose``), each ERROR, CRASH or
  TIMEOUT's cause, then the diagnosis and its report lines at the end;
- *off*: the same cases with those three replaced by nothing.

It prints per mode the median seconds of a round, the seconds spent inside the diagnosis
in the *on* rounds (timed around each call: the direct figure, immune to the noise of a
shared machine), and both as shares of an *on* round. The oracle and reference caches are
warm after the first round, which the medians leave to the later ones; each mode runs
each case the same number of times.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ddp_conformance.judge.run as judge_run  # noqa: E402
import ddp_conformance.runner as runner_module  # noqa: E402
from ddp_conformance.catalog.loader import keyword_matcher, load_catalog  # noqa: E402
from ddp_conformance.config import RunConfig  # noqa: E402
from ddp_conformance.judge.diagnose.findings import diagnose  # noqa: E402
from ddp_conformance.report.diagnosis import closing_line, opening_lines  # noqa: E402
from ddp_conformance.runner import Runner  # noqa: E402

SPENT = [0.0]


def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[0] += time.perf_counter() - started
    return wrapper


ON = {"diagnose_group": timed(judge_run.diagnose_group),
      "explain_ending": timed(runner_module.explain_ending)}
OFF = {"diagnose_group": lambda ctx: None, "explain_ending": lambda *a, **k: None}


def one_round(runner: Runner, cases: list[Any], spec: str, on: bool) -> tuple[float, int]:
    judge_run.diagnose_group = (ON if on else OFF)["diagnose_group"]  # type: ignore[assignment]
    runner_module.explain_ending = (ON if on else OFF)["explain_ending"]  # type: ignore[assignment]
    started = time.perf_counter()
    results = [runner.run_case(s, spec) for s in cases]
    if on:
        timed(lambda: (opening_lines(results, diagnose(results)), closing_line(results)))()
    return time.perf_counter() - started, sum(r.verdict.unexpected for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidate", default="tests.defective:SumsWithoutDividing")
    parser.add_argument("-k", default="gradients or buckets or buffers")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    matches = keyword_matcher(args.k)
    cases = [s for s in load_catalog() if matches(s.id)]
    times: dict[bool, list[float]] = {True: [], False: []}
    spent: list[float] = []
    with Runner(RunConfig(candidates=[args.candidate], timeout_s=30.0)) as runner:
        one_round(runner, cases, args.candidate, True)  # warm the caches
        for _ in range(args.rounds):
            for on in (True, False):
                SPENT[0] = 0.0
                took, failed = one_round(runner, cases, args.candidate, on)
                times[on].append(took)
                if on:
                    spent.append(SPENT[0])
                print(f"{'on ' if on else 'off'}: {took:.2f} s, {failed} unexpected of "
                      f"{len(cases)}" + (f", diagnosis {SPENT[0]:.3f} s" if on else ""),
                      flush=True)
    on_s, off_s = statistics.median(times[True]), statistics.median(times[False])
    inside = statistics.median(spent)
    print(f"median round: on {on_s:.2f} s, off {off_s:.2f} s (on/off {on_s / off_s:.3f}); "
          f"inside the diagnosis {inside:.3f} s = {inside / on_s:.2%} of a failing run")


if __name__ == "__main__":
    main()
