"""What a candidate can do, by name (SPEC.md, "The candidate contract").

A scenario derives what it needs from what it does (``Scenario.needs``); a candidate
declares, or the harness detects, what it has. The names are plain strings so that they
cross process boundaries and appear verbatim in N/A reasons ("candidate lacks no_sync").
This module imports nothing heavy: the pytest plugin and the catalog read it.
"""
from __future__ import annotations

import enum


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


def missing_capabilities(needs: frozenset[str], capabilities: frozenset[str]) -> str:
    """The N/A reason, or '' when ``capabilities`` cover ``needs``."""
    missing = sorted(needs - capabilities)
    return f"candidate lacks {', '.join(missing)}" if missing else ""
