"""What the parent asks of the rank processes, and what they answer.

Messages cross a private socket pair as standard pickles (``send_bytes``), never through
torch's shared-memory reductions: a record's tensors are copied, so nothing ties a rank's
memory to the parent.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from .scenario import Scenario

#: Exceptions a rank raises only because a peer failed first (Gloo reports the closed pair).
RELEASED_MARKERS = ("Connection closed by peer", "Connection reset by peer",
                    "Broken pipe", "Connection refused", "closed by remote")


@dataclass
class Job:
    """One unit of work for every rank: a scenario with a candidate, or a function call."""

    kind: str  # "scenario" | "call"
    store_prefix: str
    collective_timeout_s: float
    seed: int = 0
    scenario: Scenario | None = None
    candidate: str = ""
    function: str = ""  # "package.module:qualname" for kind == "call"
    args: tuple[Any, ...] = field(default_factory=tuple)
    #: Create the job's process groups through the tracing backend (see trace.py).
    trace: bool = True


def send(conn: Connection, message: Any) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def was_released(traceback_text: str) -> bool:
    """Whether a rank's exception is the echo of another rank's failure."""
    return any(marker in traceback_text for marker in RELEASED_MARKERS)
