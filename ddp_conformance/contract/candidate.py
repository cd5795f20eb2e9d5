"""The candidate: a DDP implementation under test, as the harness knows it before wrapping."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ddp_conformance.contract.adapter import Adapter


@dataclass
class Candidate:
    """A DDP implementation under test.

    ``wrap(module, process_group, device, **ddp_options)`` returns an :class:`Adapter`.
    ``capabilities`` are what the harness may know before wrapping (options accepted,
    features); the adapter's own ``capabilities`` are final.
    """

    name: str
    wrap: Callable[..., Adapter]
    capabilities: frozenset[str] = frozenset()
    #: The backends it runs on (None: any, the custom ones included).
    backends: frozenset[str] | None = None
    version: str = ""
    description: str = ""
    #: When True, capabilities are only known once the model is wrapped (a factory function).
    late_capabilities: bool = False
    #: An expectations file shipped with the candidate (built-in adapters), applied with
    #: any ``--expectations`` file the user gives.
    expectations: str | None = None
