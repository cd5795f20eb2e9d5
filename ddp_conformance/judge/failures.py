"""Verdicts of jobs that did not end with every rank done: CRASH, ERROR, TIMEOUT.

SPEC.md, "Verdicts and exit codes": a CRASH names the rank and its exit code or signal; an
ERROR the rank that raised first (not a peer released by its failure) and its exception
line; a TIMEOUT where every stuck rank is (its innermost frame, and the innermost one in
the candidate's own code).
"""
from __future__ import annotations

import os
import re

from ddp_conformance.judge.verdict import Result, Verdict
from ddp_conformance.ranks.outcome import Outcome, describe_exit


def failed_run(result: Result, out: Outcome, timeout_s: float) -> Result:
    """Fill ``result`` (verdict, reason, evidence) from an outcome other than ``done``."""
    if out.status == "crash":
        rank, code = min(out.exit_codes.items())
        result.verdict, result.reason = Verdict.CRASH, f"rank {rank} died with {describe_exit(code)}"
    elif out.status == "raised":
        primary = {r: tb for r, tb in out.tracebacks.items() if r not in out.released} \
            or out.tracebacks
        rank = min(primary)
        result.verdict, result.reason = Verdict.ERROR, f"rank {rank} raised {last_line(primary[rank])}"
    else:
        result.verdict = Verdict.TIMEOUT
        result.reason = (
            f"no progress within {timeout_s:g}s: rank(s) "
            f"{', '.join(map(str, sorted(out.stacks)))} still running"
            + "".join(f"; rank {r} at {innermost_frame(s)}" for r, s in sorted(out.stacks.items())))
    result.tracebacks, result.stacks, result.exit_codes = out.tracebacks, out.stacks, out.exit_codes
    for rank, log in out.logs.items():
        fatal = result.stacks.get(rank)
        result.stacks[rank] = f"(process died; end of its output)\n{log}" + (
            f"\n(its Python stacks at the fatal signal)\n{fatal}" if fatal else "")
    return result


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


_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_HARNESS_PARTS = (f"{os.sep}torch{os.sep}", f"{os.sep}ddp_conformance{os.sep}", "<frozen ")


def innermost_frame(stack: str) -> str:
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
