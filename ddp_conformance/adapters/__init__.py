"""Built-in adapters for the ecosystem's data-parallel implementations.

``ADAPTERS`` maps a built-in candidate name (``--candidate NAME``) to a function returning
its :class:`~ddp_conformance.candidate.Candidate`; the function raises
:class:`~ddp_conformance.errors.UsageError` with one line when the package it needs is
not installed.
"""
from __future__ import annotations

from collections.abc import Callable

from ..candidate import Candidate

ADAPTERS: dict[str, Callable[[], Candidate]] = {}
