"""What a candidate can do, by name (SPEC.md, "The candidate contract").

A scenario derives what it needs from what it does (``Scenario.needs``); a candidate
declares, or the harness detects, what it has. The names are plain strings so that they
cross process boundaries and appear verbatim in N/A reasons ("candidate lacks no_sync").
A candidate may say why it lacks one (:class:`Capabilities`, whose ``notes`` the N/A
reason quotes). This module imports nothing heavy: the pytest plugin and the catalog read it.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any


class Capability(str, enum.Enum):
    """Features a candidate may or may not have."""

    NO_SYNC = "no_sync"
    JOIN = "join"
    COMM_HOOK = "comm_hook"
    SYNC_STRATEGY = "sync_strategy"

    @staticmethod
    def option(name: str) -> str:
        """The capability of accepting the constructor keyword ``name``."""
        return f"option:{name}"


#: Constructor keywords of torch's DDP that scenarios may set.
DDP_OPTIONS = (
    "broadcast_buffers", "bucket_cap_mb", "find_unused_parameters",
    "gradient_as_bucket_view", "static_graph", "init_sync",
)
#: The Joinable protocol (``torch.distributed.algorithms.join.Joinable``): what Join needs.
JOINABLE_ATTRIBUTES = ("join_hook", "join_device", "join_process_group")


class Capabilities(frozenset[str]):
    """A set of capability names that also says why some capabilities are absent.

    ``notes`` maps a capability the candidate does *not* have to a short explanation, which
    the N/A reason quotes: "candidate lacks comm_hook (its register_comm_hook takes (hook),
    not torch's (state, hook))". It is a plain ``frozenset`` otherwise (equality and hashing
    ignore the notes), so an adapter's or a candidate's ``capabilities`` may be either;
    the union keeps the notes of both sides (the left one's win).
    """

    notes: Mapping[str, str]

    def __new__(cls, items: Iterable[str] = (), notes: Mapping[str, str] | None = None
                ) -> Capabilities:
        self = super().__new__(cls, items)
        self.notes = dict(notes or {})
        return self

    def __or__(self, other: AbstractSet[Any]) -> Capabilities:  # type: ignore[override]
        return Capabilities({*self, *other}, {**_notes(other), **self.notes})

    def __ror__(self, other: AbstractSet[Any]) -> Capabilities:
        return Capabilities({*self, *other}, {**self.notes, **_notes(other)})

    def __repr__(self) -> str:
        return f"Capabilities({sorted(self)!r}, notes={dict(self.notes)!r})"


def _notes(capabilities: Any) -> Mapping[str, str]:
    return getattr(capabilities, "notes", None) or {}


def missing_capabilities(needs: frozenset[str], capabilities: frozenset[str]) -> str:
    """The N/A reason, or '' when ``capabilities`` cover ``needs``.

    Each missing capability is named, followed by its note in parentheses where
    ``capabilities`` is a :class:`Capabilities` that has one.
    """
    missing = sorted(needs - capabilities)
    if not missing:
        return ""
    notes = _notes(capabilities)
    named = [f"{m} ({notes[m]})" if m in notes else m for m in missing]
    return f"candidate lacks {', '.join(named)}"
