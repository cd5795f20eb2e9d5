"""The small collectives DDP issues outside the gradient reduction.

Every call goes to the process group object itself (``pg.allreduce`` ...), as torch's C++
code does, so a tracer wrapping the process group sees the reference and torch alike;
ranks given here are ranks *within* the group. Every call passes its options object
explicitly, as C++ does: a process group written in Python (a custom c10d backend, a
tracing wrapper) declares ``opts`` as a required argument, and only the C++ binding
supplies a default for it.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

from .buckets import assign_buckets

# torch's DDP ``broadcast_bucket_size``: 250 MiB per coalesced broadcast.
BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024


def allreduce(pg: dist.ProcessGroup, tensor: torch.Tensor,
              op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> dist.Work:
    """Start an allreduce of ``tensor`` in place on ``pg`` and return its work."""
    opts = dist.AllreduceOptions()
    opts.reduceOp = op  # type: ignore[assignment]
    return pg.allreduce([tensor], opts)


def broadcast(pg: dist.ProcessGroup, tensor: torch.Tensor, group_src: int) -> dist.Work:
    """Start a broadcast of ``tensor`` from group rank ``group_src`` and return its work."""
    opts = dist.BroadcastOptions()
    opts.rootRank = group_src
    opts.rootTensor = 0
    return pg.broadcast([tensor], opts)


def allgather(pg: dist.ProcessGroup, outputs: list[torch.Tensor], tensor: torch.Tensor) -> dist.Work:
    """Start an allgather of ``tensor`` into ``outputs`` (one per group rank) on ``pg``."""
    return pg.allgather([outputs], [tensor], AllgatherOptions())


def broadcast_coalesced(pg: dist.ProcessGroup, tensors: Sequence[torch.Tensor],
                        group_src: int, bucket_bytes: int = BROADCAST_BUCKET_BYTES) -> None:
    """Broadcast ``tensors`` in place from ``group_src`` (torch's ``_broadcast_coalesced``).

    Tensors are grouped like gradient buckets (per dtype and device, ``bucket_bytes`` at
    most, ordered by first tensor), each group is flattened into one tensor and broadcast;
    at most two broadcasts are in flight, as in c10d's ``broadcast_coalesced``.
    """
    if not tensors:
        return
    groups = assign_buckets(tensors, [bucket_bytes])
    in_flight: deque[tuple[dist.Work, torch.Tensor, list[torch.Tensor]]] = deque()

    def finish() -> None:
        work, flat, members = in_flight.popleft()
        work.wait()
        offset = 0
        for t in members:
            n = t.numel()
            chunk = flat[offset:offset + n].view_as(t)
            if chunk.data_ptr() != t.data_ptr():
                t.copy_(chunk)
            offset += n

    for group in groups:
        if len(in_flight) >= 2:
            finish()
        members = [tensors[i] for i in group]
        if len(members) == 1 and members[0].is_contiguous():
            flat = members[0].view(-1)
        else:
            flat = torch.cat([t.reshape(-1) for t in members])
        in_flight.append((broadcast(pg, flat, group_src), flat, members))
    while in_flight:
        finish()


def find_common_rank(pg: dist.ProcessGroup, device: torch.device, group_rank: int,
                     candidate: bool) -> int:
    """The largest group rank among those with ``candidate`` true (torch's
    ``_find_common_rank``: an int64 MAX allreduce, -1 for non-candidates)."""
    value = torch.tensor([group_rank if candidate else -1], device=device)
    allreduce(pg, value, dist.ReduceOp.MAX).wait()
    rank = int(value.item())
    if rank == -1:
        raise ValueError("BUG! Expected rank_cond to be true for at least one process.")
    return rank


def verify_param_shapes(pg: dist.ProcessGroup, params: Sequence[torch.Tensor],
                        names: Sequence[str]) -> None:
    """Check that every rank has the same number of parameters with the same sizes and
    strides as group rank 0 (torch's ``_verify_param_shape_across_processes``).

    Unlike torch, which lets only the mismatching rank raise (the others then block in
    the next broadcast), every rank learns the outcome and raises: (1) an allgather of
    the parameter count (and metadata length); (2) a broadcast of rank 0's sizes and
    strides; (3) an allgather of each rank's first mismatching parameter index, the one
    collective torch does not issue.
    """
    rank, world = pg.rank(), pg.size()
    device = params[0].device if params else torch.device("cpu")
    metadata: list[int] = []
    for t in params:
        metadata.extend(t.shape)
        metadata.extend(t.stride())
    # torch allgathers one int64 (the parameter count); this packs the metadata length in
    # its high bits so that the collective is the same and a differing number of
    # dimensions is caught before the broadcast below, whose size depends on it.
    header = torch.tensor([len(metadata) << 32 | len(params)], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(header) for _ in range(world)]
    allgather(pg, gathered, header).wait()
    counts = [(int(g.item()) & 0xFFFFFFFF, int(g.item()) >> 32) for g in gathered]
    if any(c != counts[0] for c in counts):
        details = ", ".join(f"rank {r}: {c[0]} params, {c[1]} sizes and strides"
                            for r, c in enumerate(counts))
        raise RuntimeError(
            f"DDP expects same model across all ranks, but Rank {rank} has {len(params)} "
            f"params, while the ranks have inconsistent parameter counts or dimensions "
            f"({details})."
        )
    control = torch.tensor(metadata, dtype=torch.int64, device=device)
    if control.numel():
        broadcast(pg, control, 0).wait()
    expected = control.tolist()
    mismatch, pos = -1, 0
    for p, t in enumerate(params):
        width = 2 * t.dim()
        if expected[pos:pos + width] != metadata[pos:pos + width]:
            mismatch = p
            break
        pos += width
    flag = torch.tensor([mismatch], dtype=torch.int64, device=device)
    flags = [torch.empty_like(flag) for _ in range(world)]
    allgather(pg, flags, flag).wait()
    bad = {r: int(f.item()) for r, f in enumerate(flags) if int(f.item()) >= 0}
    if bad:
        if mismatch >= 0:
            t = params[mismatch]
            raise RuntimeError(
                f"[{rank}]: params[{mismatch}] ({names[mismatch]}) in this process with sizes "
                f"{list(t.shape)} and strides {list(t.stride())} appears not to match "
                f"sizes or strides of the same param in process 0."
            )
        listed = ", ".join(f"rank {r} at params[{p}] ({names[p]})" for r, p in bad.items())
        raise RuntimeError(
            f"DDP expects same model across all ranks, but parameter shapes differ from "
            f"process 0's: {listed}."
        )
