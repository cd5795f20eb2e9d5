"""What the parent asks of the ranks, and what they answer: typed messages.

The parent sends :class:`RunJob` (or :class:`Exit`); a rank answers :class:`Ready` once
started, and :class:`Done` or :class:`Raised` per job. A rank that raised and stayed may be
sent :class:`Release` (peers wait on it) and answers :class:`Released`. The rank pool carries them over a
private socket pair, torchrun mode through torchrun's TCP store; both pickle them with
the standard pickle (``send_bytes``), never through torch's shared-memory reductions: a
record's tensors are copied, so nothing ties a rank's memory to the parent.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.ranks.communicator import CommState
from ddp_conformance.ranks.leaks import Hygiene

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
    #: Create the job's process groups through the tracing backend (see tracing.py).
    trace: bool = True
    #: The communicator generation whose default-group backend the job may reuse ('' for
    #: none: it creates its own; see :mod:`~ddp_conformance.ranks.communicator`).
    communicator: str = ""


@dataclass(frozen=True)
class RunJob:
    """Parent to rank: run ``job`` now."""

    job: Job


@dataclass(frozen=True)
class Exit:
    """Parent to rank: leave (between jobs)."""


@dataclass(frozen=True)
class Release:
    """Parent to a rank that raised and stayed: peers wait in a collective on you; let the
    job's groups go (closing their connections), or leave if you cannot."""


@dataclass(frozen=True)
class Released:
    """Rank to parent, after :class:`Release`: ``stays`` False when it leaves the pool."""

    rank: int
    stays: bool


@dataclass(frozen=True)
class Ready:
    """Rank to parent: started, connected to the store, waiting for jobs."""

    rank: int
    pid: int


@dataclass(frozen=True)
class Done:
    """Rank to parent: the job finished here; ``result`` is its record or return value."""

    rank: int
    result: Any
    #: The default group's state after the job (for a job that named a communicator).
    communicator: CommState | None = None
    #: What the job left in the rank (ranks/hygiene.py); ``retire``: the rank then leaves.
    hygiene: Hygiene = Hygiene()


@dataclass(frozen=True)
class Raised:
    """Rank to parent: the job raised here; ``traceback`` is the formatted exception."""

    rank: int
    traceback: str
    #: The rank cleaned up and stays in the pool (else it exits after this answer).
    stays: bool = False
    #: What the job left in the rank (ranks/hygiene.py), when it stays.
    hygiene: Hygiene = Hygiene()

    @property
    def released(self) -> bool:
        """Whether the exception only echoes a peer's failure (the rank itself is sound)."""
        return was_released(self.traceback)


Answer = Done | Raised


def send(conn: Connection, message: Any) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def was_released(traceback_text: str) -> bool:
    """Whether a rank's exception is the echo of another rank's failure."""
    return any(marker in traceback_text for marker in RELEASED_MARKERS)
