"""The verdict of one collective case, from what every rank saw (:mod:`.execute`).

- FAIL: a rank holds a value other than the exact one; the evidence names the rank, the
  operation, reduce op and dtype, the item (size, root), the tensor, the first differing
  element and both values, and how many elements differ.
- N/A: every rank raised, and each exception declares a gap (``NotImplementedError``, or
  a message saying the operation, op or dtype is not supported): the reason quotes each
  distinct one with its rank and item, and the items that were exact before. Where the
  ranks raised is not compared: in a ``-split`` case each group names its own roots, and
  the same decline must be N/A there as in its twin. docs/CONTRACT.md: what a backend cannot do is
  N/A with the reason, never a silent pass.
- ERROR: any other exception, or a refusal on some ranks only (their peers then waited
  for them: a backend must refuse the same call on every rank). The reason names every
  rank whose exception differs, each distinct one once, and every rank's traceback is kept.
- TIMEOUT, CRASH: as for scenarios (the flight recorder names a desync within seconds).
"""
from __future__ import annotations

import re

from ddp_conformance.catalog.collective import CollectiveCase
from ddp_conformance.collectives.execute import RankReport
from ddp_conformance.judge.failures import failed_run
from ddp_conformance.judge.verdict import CheckFailure, Result, Verdict
from ddp_conformance.ranks.outcome import Outcome

#: What backends say when they decline an operation, an op or a dtype (Gloo: "Cannot use
#: ReduceOp.AVG with Gloo", "... can't be cast to the desired output type Int"; NCCL:
#: "Tensors must be contiguous", "NCCL does not support ..."; c10d: "... is not supported",
#: and "No backend type associated with device type cpu" when a Python process group does
#: not define the operation and c10d finds no backend object to serve it).
_DECLINES = re.compile(
    r"not (yet )?(supported|implemented)|unsupported|does ?n[o']t support|cannot use|"
    r"can't be cast|only supports?|(must|has to) be contiguous|no support|not available|"
    r"no backend type associated with device type",
    re.IGNORECASE)


def declines(error_type: str, message: str) -> bool:
    """Whether an exception declares a gap of the backend rather than a failure."""
    return error_type == "NotImplementedError" or bool(_DECLINES.search(message))


def judge_collective(case: CollectiveCase, result: Result, outcome: Outcome,
                     timeout_s: float) -> Result:
    """Fill ``result`` (made for ``case``) from the ranks' reports."""
    if outcome.status != "done":
        return failed_run(result, outcome, timeout_s)
    reports: dict[int, RankReport] = outcome.results
    check = f"collective.{case.op}"
    result.checks_run = [check]
    for rank, report in sorted(reports.items()):
        for m in report.mismatches:
            result.failures.append(CheckFailure(
                check, f"rank {rank}: {case.title()}, {m.describe()}", rank=rank, name=m.item))
    raised = {r: rep for r, rep in reports.items() if rep.raised_at}
    if result.failures:
        result.verdict = Verdict.FAIL
        result.notes += [f"rank {r} then raised at {rep.raised_at}: {rep.error_type}: "
                         f"{_first_line(rep.error)}" for r, rep in sorted(raised.items())]
        return result
    if not raised:
        result.verdict = Verdict.PASS
        return result
    said = _distinct(raised)
    if len(raised) == len(reports) and \
            all(declines(rep.error_type, rep.error) for rep in raised.values()):
        exact = raised[min(raised)].exact
        result.verdict = Verdict.NA
        result.reason = (f"the backend declines {case.title()}: {said}"
                         + (f" (exact before it: {', '.join(exact)})" if exact else ""))
        return result
    result.verdict = Verdict.ERROR
    others = sorted(set(reports) - set(raised))
    result.reason = said + (f"; rank(s) {', '.join(map(str, others))} did not" if others else "")
    result.tracebacks = {r: rep.traceback for r, rep in raised.items()}
    return result


def _distinct(raised: dict[int, RankReport]) -> str:
    """The lowest rank's "rank 0 raised at <item>: <exception>", then the same for every
    other rank whose exception differs from those already named (items are left out of the comparison:
    in a split group, the same call has another root's name on each side)."""
    named: dict[str, tuple[int, str]] = {}
    for rank, rep in sorted(raised.items()):
        named.setdefault(f"{rep.error_type}: {_first_line(rep.error)}", (rank, rep.raised_at))
    return "; ".join(f"rank {rank} raised at {item}: {said}"
                     for said, (rank, item) in named.items())


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0][:300] if lines else "(no message)"
