"""Reading a rank's Python stacks (faulthandler's dump): where is it, and is it in a collective?

faulthandler lists every thread, most recent call first, and marks the thread that handled
the signal "Current thread": the main thread, where a rank runs its job.
"""
from __future__ import annotations

import os
import re

_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_HARNESS_PARTS = (f"{os.sep}torch{os.sep}", f"{os.sep}ddp_conformance{os.sep}", "<frozen ")
#: torch.distributed's Python collectives: a main thread whose innermost frame is one of
#: these in ``distributed_c10d.py`` waits for that collective to complete.
C10D_COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather",
    "all_gather_into_tensor", "all_gather_coalesced", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter",
    "barrier", "monitored_barrier", "send", "recv", "all_gather_object", "gather_object",
    "broadcast_object_list", "scatter_object_list", "batch_isend_irecv"})
_IN_C10D = frozenset(("distributed_c10d.py", name) for name in C10D_COLLECTIVES)
#: Where a main thread creating a process group waits for the group's other ranks: c10d's
#: helper (a backend's constructor connects through the store, below Python) and its store
#: barrier, and the harness's tracing backend, which creates the real group for it.
GROUP_CREATION = frozenset({("distributed_c10d.py", "_new_process_group_helper"),
                            ("distributed_c10d.py", "_store_based_barrier"),
                            ("tracing.py", "create_inner")})


def _main_frames(stack: str) -> tuple[str, list[dict[str, str]]]:
    blocks = stack.split("\n\n")
    current = next((b for b in blocks if b.lstrip().startswith("Current thread")), blocks[0])
    return current, [m.groupdict() for m in _FRAME.finditer(current)]


def main_frames(stack: str) -> list[dict[str, str]]:
    """The main thread's frames (``path``, ``line``, ``func``), innermost first."""
    return _main_frames(stack)[1]


def _show(f: dict[str, str]) -> str:
    return f"{f['func']} ({os.path.basename(f['path'])}:{f['line']})"


def innermost_frame(stack: str) -> str:
    """Where a stuck rank is: its innermost frame, and the innermost one in user code."""
    current, frames = _main_frames(stack)
    if not frames:
        return "(unknown)"
    where = _show(frames[0])
    if "Garbage-collecting" in current.split("File ", 1)[0]:
        where = f"garbage collection in {where}"
    caller = next((f for f in frames if not any(p in f["path"] for p in _HARNESS_PARTS)), None)
    if caller is not None and caller is not frames[0]:
        where += f" called from {_show(caller)}"
    return where


def _innermost_at(stack: str, places: frozenset[tuple[str, str]]) -> str | None:
    """Where the main thread is (:func:`innermost_frame`) if its innermost frame is one of
    ``places`` (file name, function name); else None."""
    _, frames = _main_frames(stack)
    if not frames or (os.path.basename(frames[0]["path"]), frames[0]["func"]) not in places:
        return None
    return innermost_frame(stack)


def in_collective(stack: str) -> str | None:
    """If the main thread waits in one of torch.distributed's Python collectives, where
    (``all_reduce (distributed_c10d.py:3252) called from __exit__ (join.py:274)``)."""
    return _innermost_at(stack, _IN_C10D)


def in_group_creation(stack: str) -> str | None:
    """If the main thread is creating a process group (waiting, if it is still there, for
    the group's other ranks to create it too), where."""
    return _innermost_at(stack, GROUP_CREATION)
