"""Verdicts of jobs that did not end with every rank done: CRASH, ERROR, TIMEOUT.

docs/CONTRACT.md, "Verdicts and exit codes": a CRASH names the rank and its exit code or signal; an
ERROR the ranks that raised (not a peer released by a failure), each distinct exception
line once; a TIMEOUT where every stuck rank is (its innermost frame, and the innermost one
in the candidate's own code), or, when the ranks' collective streams can never match again,
the desync: who waits in what, where the streams first differ, and the streams side by side.
"""
from __future__ import annotations

from ddp_conformance.judge.verdict import Result, Verdict
from ddp_conformance.ranks.outcome import Outcome, describe_exit
from ddp_conformance.ranks.stacks import innermost_frame

__all__ = ["failed_run", "innermost_frame", "last_line", "raised_line"]


def failed_run(result: Result, out: Outcome, timeout_s: float) -> Result:
    """Fill ``result`` (verdict, reason, evidence) from an outcome other than ``done``."""
    if out.status == "crash":
        rank, code = min(out.exit_codes.items())
        result.verdict, result.reason = Verdict.CRASH, f"rank {rank} died with {describe_exit(code)}"
    elif out.status == "raised":
        primary = {r: tb for r, tb in out.tracebacks.items() if r not in out.released} \
            or out.tracebacks
        result.verdict, result.reason = Verdict.ERROR, raised_line(primary)
    elif out.desync is not None:
        result.verdict = Verdict.TIMEOUT
        result.reason = f"{out.desync.summary} (diagnosed after {out.elapsed_s:.1f}s)"
        result.desync = out.desync.detail
    else:
        result.verdict = Verdict.TIMEOUT
        result.reason = (
            f"no progress within {timeout_s:g}s: rank(s) "
            f"{', '.join(map(str, sorted(out.stacks)))} still running"
            + "".join(f"; rank {r} at {innermost_frame(s)}" for r, s in sorted(out.stacks.items())))
    if out.desync is not None and out.status in ("crash", "raised"):
        result.reason += f"; {out.desync.summary}"
        result.desync = out.desync.detail
    if out.not_run:  # the fail-fast rule (ranks/endings.py): the evidence is the first case's
        result.reason = f"not run: {out.not_run}"
    result.tracebacks, result.stacks, result.exit_codes = out.tracebacks, out.stacks, out.exit_codes
    for rank, log in out.logs.items():
        fatal = result.stacks.get(rank)
        result.stacks[rank] = f"(process died; end of its output)\n{log}" + (
            f"\n(its Python stacks at the fatal signal)\n{fatal}" if fatal else "")
    return result


def raised_line(tracebacks: dict[int, str]) -> str:
    """The ERROR line: "rank 0 raised X" for the lowest rank, then "; rank 1 raised Y" for
    every other rank whose exception line differs from those already named."""
    named: dict[str, int] = {}
    for rank in sorted(tracebacks):
        named.setdefault(last_line(tracebacks[rank]), rank)
    return "; ".join(f"rank {rank} raised {line}" for line, rank in named.items())


def last_line(text: str) -> str:
    """The exception line of a traceback (its first line if the message spans several),
    else the text's last non-empty line."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    frames = [i for i, ln in enumerate(lines) if ln.startswith('  File "')]
    if frames:
        after = [ln for ln in lines[frames[-1] + 1:] if not ln.startswith(" ")]
        if after:
            return after[0].strip()
    return lines[-1].strip() if lines else "(no traceback)"
