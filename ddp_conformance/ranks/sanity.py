"""Backend sanity first: before any case, every rank asks the backend what it is.

A backend that lies about itself makes every verdict after it worthless: torchft 0.2.0
builds each Python wrapper as ``ProcessGroup(0, 1)`` (C++ rank 0 and size 1 on every
process; only its Python ``size()`` says 2), and 99 DDP scenarios passed on it while rank 1
believed it was rank 0. So a run first checks, on every rank, in a default group created
as the harness creates each job's (untraced: what the backend itself says):

- ``dist.get_rank(group)`` and ``dist.get_world_size(group)`` (the Python answers) against
  the rank and world size the harness set up;
- the group's rank and size as C++ holds them (what torch's DDP reads);
- ``dist.get_process_group_ranks(group)``: ``0 .. n-1``;
- a rank-identifying allgather: each rank contributes its rank (one ``int64``), the
  result must be ``0 .. n-1`` in order (a backend that mixes up ranks, or drops one).

It costs one job and one small allgather. A mismatch ends the run before any case with one
line per rank that disagrees ("rank 1: backend says rank 0; ...") and exit code 1
(:class:`BackendInsane`).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ddp_conformance.errors import BackendInsane
from ddp_conformance.ranks.tracing import cpp_rank_size

#: The function the ranks run (``RankPool.call``).
RANK_CHECK = "ddp_conformance.ranks.sanity:rank_check"
#: How long the check may take on all ranks together (a hang is a failed check).
CHECK_TIMEOUT_S = 120.0


def rank_check(rank: int, world_size: int, device_kind: str = "cpu") -> list[str]:
    """On one rank, in the job's default group: what the backend says of itself that
    differs from what the harness set up (``[]``: it agrees). ``device_kind``: where the
    allgather's tensors live ("cuda": the rank's current device)."""
    group = dist.group.WORLD
    assert group is not None
    said: list[str] = []

    def expect(what: str, got: Any, want: Any) -> None:
        if got != want:
            said.append(f"{what} {got}" + ("" if what.startswith("backend says") else
                                            f" (expected {want})"))

    expect("backend says rank", dist.get_rank(group), rank)
    expect("backend says size", dist.get_world_size(group), world_size)
    cpp_rank, cpp_size = cpp_rank_size(group)
    expect("its C++ rank is", cpp_rank, rank)
    expect("its C++ size is", cpp_size, world_size)
    expect("its group's ranks are", dist.get_process_group_ranks(group), list(range(world_size)))
    device = (torch.device("cuda", torch.cuda.current_device()) if device_kind == "cuda"
              else torch.device(device_kind))
    mine = torch.tensor([rank], dtype=torch.int64, device=device)
    gathered = [torch.full((1,), -1, dtype=torch.int64, device=device) for _ in range(world_size)]
    try:
        dist.all_gather(gathered, mine, group=group)
    except Exception as exc:  # noqa: BLE001 - a backend that cannot allgather: said so
        said.append(f"the rank-identifying allgather raised {type(exc).__name__}: "
                    f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
    else:
        expect("the rank-identifying allgather gave", [int(t.item()) for t in gathered],
               list(range(world_size)))
    return said


def check_backend(pool: Any, backend: str, world_size: int, device_kind: str) -> None:
    """Run :func:`rank_check` on every rank of ``pool`` (one job); raise
    :class:`BackendInsane` with one line per disagreeing rank, or one line when the check
    could not finish (a rank raised, crashed or hung). A pool without ``call`` (none here)
    is not checked."""
    call = getattr(pool, "call", None)
    if call is None:
        return
    try:
        answers = call(RANK_CHECK, device_kind, timeout_s=CHECK_TIMEOUT_S)
    except RuntimeError as exc:
        first = next((line for line in str(exc).splitlines() if line.strip()), "")
        raise BackendInsane(backend, world_size,
                            [f"the check did not finish on every rank: {first.strip()}"]) from exc
    lines = [f"rank {r}: {'; '.join(said)}" for r, said in enumerate(answers) if said]
    if lines:
        raise BackendInsane(backend, world_size, lines)
