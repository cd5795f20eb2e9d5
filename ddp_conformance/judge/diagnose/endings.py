"""The cause of a case that ended without values to judge: ERROR, CRASH, TIMEOUT.

What the ranks left is read as it is: a traceback's innermost frame in the candidate's own
files (``file:line``), the backend's last message in a dead rank's output, whether the
stuck ranks wait in collectives. The words a user reads never name the harness's own
types (:func:`user_words`).
"""
from __future__ import annotations

import os
import re
import sys

from ddp_conformance.judge.diagnose.causes import CaseCause, Cause
from ddp_conformance.judge.verdict import Result, Verdict
from ddp_conformance.ranks.stacks import in_collective, main_frames

_TB_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)',
                       re.MULTILINE)
#: Paths that are never the candidate's own: the harness, torch, Python's library.
_NOT_CANDIDATE = (f"{os.sep}torch{os.sep}", f"{os.sep}ddp_conformance{os.sep}", "<frozen ",
                  f"{os.sep}lib{os.sep}python3", "<string>")
#: A line of a dead rank's output that is the backend's (or the C++ runtime's) own word,
#: preferred; then a generic fatal line (Python's "Fatal Python error: Aborted").
_BACKEND_LINE = re.compile(r"what\(\)|enforce|gloo|NCCL|[A-Za-z]+Error:|[Ee]xception|"
                           r"doesn't match|mismatch|terminate called")
_FATAL_LINE = re.compile(r"[Ff]atal|[Aa]bort|[Ss]egmentation|[Ee]rror")
#: Harness types a message may name, and what they stand for.
HARNESS_WORDS = {
    "TracingProcessGroup": "ProcessGroup (the backend's group, as the harness traces it)",
}


def user_words(text: str) -> str:
    """``text`` with every harness type name replaced by what it stands for."""
    for word, meaning in HARNESS_WORDS.items():
        text = text.replace(word, meaning)
    return text


def candidate_frame(traceback: str, roots: tuple[str, ...] = ()) -> str:
    """The innermost frame of ``traceback`` in the candidate's files, as
    ``file.py:LINE in func``: a file under one of ``roots`` (the candidate's package), or,
    without roots or none there, the innermost one outside the harness, torch and
    Python's library ('' when there is none)."""
    frames = [m.groupdict() for m in _TB_FRAME.finditer(traceback)]
    return _innermost(frames, roots)


def stack_frame(stack: str, roots: tuple[str, ...] = ()) -> str:
    """:func:`candidate_frame` of a faulthandler dump (a dead or stuck rank's stacks,
    innermost first): its main thread's frames."""
    return _innermost(list(reversed(main_frames(stack))), roots)


def _innermost(frames: list[dict[str, str]], roots: tuple[str, ...]) -> str:
    """The last of ``frames`` (outermost first) in the candidate's files ('' for none)."""
    own = [f for f in frames if roots and f["path"].startswith(roots)]
    if not own:
        own = [f for f in frames if not any(p in f["path"] for p in _NOT_CANDIDATE)]
    if not own:
        return ""
    f = own[-1]
    return f"{_short(f['path'])}:{f['line']} in {f['func']}"


def _short(path: str) -> str:
    """A path relative to the current directory where it lies under it, else as is."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def backend_message(output: str) -> str:
    """The last line of a dead rank's output that carries the backend's own word (gloo's
    enforce, a C++ ``what()``, an exception line), else its last fatal line ('' when
    there is neither)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()
             and not ln.strip().startswith(("File \"", "Current thread", "Thread 0x",
                                              "(process died", "(its Python"))]
    for pattern in (_BACKEND_LINE, _FATAL_LINE):
        said = next((line for line in reversed(lines) if pattern.search(line)), "")
        if said:
            return said[:300]
    return ""


#: N/A reasons that are the candidate's (a capability it lacks), not the run's (world size,
#: backend, ``--slow``): ``unsupported-feature``.
_CANDIDATE_LACKS = re.compile(r"^candidate\b|\blacks?\b|does not (take|accept|support|have)")


def ending_cause(result: Result, join: bool, roots: tuple[str, ...] = ()) -> CaseCause | None:
    """The cause of an ERROR, CRASH or TIMEOUT, and of an N/A the candidate's lack of a
    capability makes (``unsupported-feature``: grouped, never a finding); None otherwise."""
    if result.verdict is Verdict.NA:
        return CaseCause(Cause.UNSUPPORTED_FEATURE, result.reason) \
            if _CANDIDATE_LACKS.search(result.reason) else None
    if result.verdict is Verdict.ERROR:
        named = [int(r) for r in re.findall(r"rank (\d+) raised", result.reason)]
        order = sorted(result.tracebacks, key=lambda r: (r not in named, r))
        where = next((candidate_frame(result.tracebacks[r], roots) for r in order
                      if candidate_frame(result.tracebacks[r], roots)), "")
        return CaseCause(Cause.RAISES, user_words(result.reason) + (f" at {where}" if where
                                                                   else ""))
    if result.verdict is Verdict.CRASH:
        said = next((backend_message(s) for _, s in sorted(result.stacks.items())
                     if backend_message(s)), "")
        where = next((stack_frame(s, roots) for _, s in sorted(result.stacks.items())
                      if stack_frame(s, roots)), "")
        return CaseCause(Cause.CRASH, result.reason + (f" at {where}" if where else "")
                         + (f'; its last message: "{said}"' if said else ""))
    if result.verdict is not Verdict.TIMEOUT:
        return None
    return _hang_cause(result, join, roots)


def _hang_cause(result: Result, join: bool, roots: tuple[str, ...]) -> CaseCause:
    """A TIMEOUT's cause: a rank that raised while its peers waited (``raises``); a rank
    stuck in the candidate's own code, outside torch (``hang-outside-collective``); else
    ranks waiting in collectives (a desync, or stacks in torch): under Join
    ``join-not-shadowed``, otherwise ``hang-in-collective``."""
    raised = {r: tb for r, tb in result.tracebacks.items() if tb.strip()}
    if raised:
        rank, tb = min(raised.items())
        where = candidate_frame(tb, roots)
        return CaseCause(Cause.RAISES, f"rank {rank} raised {_exception_line(tb)}"
                         + (f" at {where}" if where else "") + "; the other ranks waited for it")
    stuck = {r: stack_frame(s, roots) for r, s in result.stacks.items()
             if not in_collective(s) and _innermost_is_candidate(s, roots)}
    if stuck and not result.desync:
        rank, where = min(stuck.items())
        return CaseCause(Cause.HANG_OUTSIDE_COLLECTIVE,
                         f"rank {rank} stuck at {where}, outside any collective; "
                         + result.reason)
    if join:
        return CaseCause(Cause.JOIN_NOT_SHADOWED, "ranks hang in collectives after a rank "
                         "joined: the joined rank does not shadow them; " + result.reason)
    return CaseCause(Cause.HANG_IN_COLLECTIVE, result.reason)


def _innermost_is_candidate(stack: str, roots: tuple[str, ...]) -> bool:
    """Whether a stuck rank's innermost frame is the candidate's own code (not torch's)."""
    frames = main_frames(stack)
    return bool(frames) and _innermost([frames[0]], roots) != ""


def _exception_line(traceback: str) -> str:
    from ddp_conformance.judge.failures import last_line

    return last_line(traceback)


def candidate_roots(spec: str) -> tuple[str, ...]:
    """Where the candidate ``package.module:attr``'s own files are: its top-level package's
    directory (or its module's file), as imported; none for a built-in name."""
    module_name, sep, _ = spec.partition(":")
    top = sys.modules.get(module_name.split(".")[0]) if sep else None
    path = getattr(top, "__file__", None)
    if not path:
        return ()
    if os.path.basename(path) == "__init__.py":
        return (os.path.dirname(path) + os.sep,)
    return (path,)


def explain_ending(result: Result, join: bool, roots: tuple[str, ...] = ()) -> None:
    """Give an ERROR, CRASH or TIMEOUT its cause, and an ERROR's or CRASH's line the
    candidate's frame and the backend's message; no message keeps a harness type's name."""
    found = ending_cause(result, join, roots)
    if found is not None:
        result.cause = found.to_json()
        if result.verdict in (Verdict.ERROR, Verdict.CRASH):
            result.reason = found.relation
    result.reason = user_words(result.reason)
    for failure in result.failures:
        failure.message = user_words(failure.message)
