"""What a candidate can do, by name (docs/CONTRACT.md, "The candidate contract").

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
    #: ``_register_builtin_comm_hook(dist.BuiltinCommHookType)``: torch's C++ hooks.
    BUILTIN_COMM_HOOK = "builtin_comm_hook"
    #: ``_register_buffer_comm_hook(state, hook, location)``: buffers synced by a hook.
    BUFFER_COMM_HOOK = "buffer_comm_hook"
    #: ``_register_fused_optim(optim_cls, *args, **kwargs)``: the optimizer runs in backward.
    FUSED_OPTIM = "fused_optim"
    #: ``_update_process_group(new_group)``: training goes on over another group.
    UPDATE_PROCESS_GROUP = "update_process_group"
    #: The wrapper pickles (``copy.deepcopy``, ``pickle``, ``torch.save``) and the copy trains.
    PICKLE = "pickle"
    #: ``backward_retaining(loss)``: a backward that keeps the graph for another one
    #: (``loss.backward(retain_graph=True)``).
    RETAIN_GRAPH = "retain_graph"
    #: ``wrapper.broadcast_buffers = value`` after construction (torch's property over
    #: ``forward_sync_buffers``): the buffer broadcast before forwards on or off from the
    #: next forward.
    SET_BROADCAST_BUFFERS = "set_broadcast_buffers"

    @staticmethod
    def option(name: str) -> str:
        """The capability of accepting the constructor keyword ``name``."""
        return f"option:{name}"


#: Constructor keywords of torch's DDP that scenarios may set (torch 2.13's whole
#: signature but ``module``, ``process_group`` and ``output_device``; ``device_ids`` only
#: where a scenario gives it, as a CPU module's misuse: on CUDA the harness passes the
#: rank's device itself, ``contract.ddp_like``). A scenario gives
#: them as plain data; :mod:`ddp_conformance.catalog.ddp_options` turns names into the
#: objects torch takes (a dtype name into a dtype, a parameter name into the parameter).
DDP_OPTIONS = (
    "broadcast_buffers", "bucket_cap_mb", "find_unused_parameters",
    "gradient_as_bucket_view", "static_graph", "init_sync",
    "bucket_cap_mb_list", "forward_sync_buffers", "skip_all_reduce_unused_params",
    "batched_grad_copy", "device_mesh", "mixed_precision", "delay_all_reduce_named_params",
    "param_to_hook_all_reduce", "check_reduction", "device_ids",
)
#: The DDP methods (torch 2.13's, private ones included) that stand for a capability.
METHOD_CAPABILITIES = {
    "_register_builtin_comm_hook": Capability.BUILTIN_COMM_HOOK,
    "_register_buffer_comm_hook": Capability.BUFFER_COMM_HOOK,
    "_register_fused_optim": Capability.FUSED_OPTIM,
    "_update_process_group": Capability.UPDATE_PROCESS_GROUP,
}
#: The Joinable protocol (``torch.distributed.algorithms.join.Joinable``): what Join needs.
JOINABLE_ATTRIBUTES = ("join_hook", "join_device", "join_process_group")


class Capabilities(frozenset[str]):
    """A set of capability names that also says why some capabilities are absent.

    ``notes`` maps a capability the candidate does *not* have to a short explanation, which
    the N/A reason quotes: "candidate lacks comm_hook (its register_comm_hook takes (hook),
    not torch's (state, hook))"; on a capability it has, how it has it (an option "taken
    only through **kwargs": ``contract.ddp_like.THROUGH_KWARGS``). It is a plain
    ``frozenset`` otherwise (equality and hashing ignore the notes), so an adapter's or a
    candidate's ``capabilities`` may be either; the union keeps the notes of both sides (the left one's win).
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
