"""torchft 0.2.0's process groups registered as c10d backends, the way a torchft user gets
a c10d group from them (needs the optional ``torchft`` extra).

A torchft group is made empty and then ``configure(store_addr, replica_id, rank,
world_size)``-d with a ``host:port/prefix`` address of a ``TCPStore``; torchft's own
``ProcessGroup._register`` then registers a c10d creator that returns that very object.
The creators here do the same per c10d group: they read the ``TCPStore`` under the store
c10d hands them, agree on a fresh key prefix through that (already per-group) store, and
``configure`` the torchft group with it. Importing this module registers:

* ``torchft_gloo``: ``torchft.process_group.ProcessGroupGloo`` as shipped. Its wrapper is
  built as ``ProcessGroup(0, 1)`` on every process (C++ rank 0, C++ size 1), so the
  harness's backend sanity check stops the run before any case::

      --backend tests.backends.torchft_groups:torchft_gloo

* ``torchft_gloo_fixed``: the same class with ONE change, labelled as a fix and not part of
  torchft: the C++ ``ProcessGroup`` base is constructed with the true rank and size
  (:class:`_TrueRankSize`, slotted under torchft's classes in the MRO, so torchft's own
  ``__init__`` runs unchanged and only its ``(0, 1)`` is replaced). torchft is not patched.
* ``torchft_baby_gloo`` and ``torchft_baby_gloo_fixed``: ``ProcessGroupBabyGloo`` (the
  collectives run in a child process), as shipped and with the same fix.

All are CPU only.
"""
from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed import Store
from torchft.process_group import ProcessGroupBabyGloo, ProcessGroupGloo

#: The key, in the per-group store c10d passes the creator, under which rank 0 publishes
#: the torchft store prefix of that group.
_PREFIX_KEY = "torchft_groups/prefix"


class _TrueRankSize(dist.ProcessGroup):
    """THE FIX (not torchft's): constructs the C++ ``ProcessGroup`` with the rank and size the
    group was created for (``self._true_rank_size``, set before ``__init__``), whatever the
    torchft class above it in the MRO passes (torchft passes ``(0, 1)``)."""

    _true_rank_size: tuple[int, int]

    def __init__(self, *_torchft_args: Any, **_torchft_kwargs: Any) -> None:
        rank, size = self._true_rank_size
        dist.ProcessGroup.__init__(self, rank, size)  # type: ignore[call-arg]  # stubs: store first


class FixedProcessGroupGloo(ProcessGroupGloo, _TrueRankSize):
    """torchft's ``ProcessGroupGloo`` whose C++ rank and size are the true ones."""

    def __init__(self, rank: int, size: int, timeout: timedelta) -> None:
        self._true_rank_size = (rank, size)
        ProcessGroupGloo.__init__(self, timeout=timeout)


class FixedProcessGroupBabyGloo(ProcessGroupBabyGloo, _TrueRankSize):
    """torchft's ``ProcessGroupBabyGloo`` whose C++ rank and size are the true ones."""

    def __init__(self, rank: int, size: int, timeout: timedelta) -> None:
        self._true_rank_size = (rank, size)
        ProcessGroupBabyGloo.__init__(self, timeout=timeout)


def store_address(store: Store, rank: int) -> str:
    """The ``host:port/prefix`` address torchft's ``configure`` wants, for the group whose
    (prefixed, per-group) c10d store is ``store``: the underlying ``TCPStore``'s host and
    port, and a prefix rank 0 picks and publishes in ``store`` (so every rank of this group,
    and no other group, uses it)."""
    tcp = (store._underlying_non_prefix_store  # type: ignore[attr-defined]  # not in the stubs
           if isinstance(store, dist.PrefixStore) else store)
    if not isinstance(tcp, dist.TCPStore):
        raise TypeError(f"torchft needs a TCPStore under the c10d store, got {type(tcp).__name__}")
    if rank == 0:
        store.set(_PREFIX_KEY, f"torchft_groups/{uuid.uuid4().hex}")
    prefix = store.get(_PREFIX_KEY).decode()
    return f"{tcp.host}:{tcp.port}/{prefix}"


def _register(name: str, fixed: bool, baby: bool) -> str:
    """Register the c10d backend ``name`` (once per process): a configured torchft group."""
    if not hasattr(dist.Backend, name.upper()):
        def create(store: Store, rank: int, size: int, timeout: timedelta) -> dist.ProcessGroup:
            group: ProcessGroupGloo | ProcessGroupBabyGloo
            if fixed:
                group = (FixedProcessGroupBabyGloo if baby else FixedProcessGroupGloo)(
                    rank, size, timeout)
            else:
                group = (ProcessGroupBabyGloo if baby else ProcessGroupGloo)(timeout=timeout)
            group.configure(store_address(store, rank), f"replica_{name}", rank, size)
            return group

        dist.Backend.register_backend(name, create, extended_api=False, devices=["cpu"])
    return name


torchft_gloo = _register("torchft_gloo", fixed=False, baby=False)
torchft_gloo_fixed = _register("torchft_gloo_fixed", fixed=True, baby=False)
torchft_baby_gloo = _register("torchft_baby_gloo", fixed=False, baby=True)
torchft_baby_gloo_fixed = _register("torchft_baby_gloo_fixed", fixed=True, baby=True)
