"""A collective check of a backend: what to run, as data (one id, one verdict).

A case is an operation (:class:`Op`) with its reduce op, dtype, memory layout, way of
completing (:class:`Completion`) and group (:class:`GroupKind`), run for every size of
``sizes`` (and every root of the group, for rooted operations). Sizes count the elements
one rank contributes (per peer for ``alltoall`` and ``reduce_scatter``); 0 comes last, so a
backend that refuses empty tensors is still checked on the others first.
"""
from __future__ import annotations

from dataclasses import dataclass

from ddp_conformance.catalog.scenario import StringEnum


class Op(StringEnum):
    """The operation, named for the ``torch.distributed`` call it makes."""

    ALLREDUCE = "allreduce"  # all_reduce
    BROADCAST = "broadcast"  # broadcast, from every root
    ALLGATHER = "allgather"  # all_gather into a list
    ALLGATHER_INTO_TENSOR = "allgather_into_tensor"  # all_gather_into_tensor
    REDUCE_SCATTER = "reduce_scatter"  # reduce_scatter from a list
    REDUCE_SCATTER_TENSOR = "reduce_scatter_tensor"  # reduce_scatter_tensor
    ALLTOALL = "alltoall"  # all_to_all with lists
    ALLTOALL_SINGLE = "alltoall_single"  # all_to_all_single, equal splits
    REDUCE = "reduce"  # reduce, to every root
    GATHER = "gather"  # gather, to every root
    SCATTER = "scatter"  # scatter, from every root
    BARRIER = "barrier"  # barrier: nobody leaves before everybody arrived
    SEND_RECV = "send_recv"  # isend/irecv around a ring, two tags per size
    SPARSE_ALLREDUCE = "sparse_allreduce"  # all_reduce of a sparse COO tensor (DDP's sparse grads)


#: Operations that take a reduce op.
REDUCING = frozenset({Op.ALLREDUCE, Op.REDUCE_SCATTER, Op.REDUCE_SCATTER_TENSOR, Op.REDUCE,
                      Op.SPARSE_ALLREDUCE})
#: Operations with a root, checked from (or to) every rank of the group in turn.
ROOTED = frozenset({Op.BROADCAST, Op.REDUCE, Op.GATHER, Op.SCATTER})


class Layout(StringEnum):
    CONTIGUOUS = "contiguous"
    #: Every other element of a larger tensor: the backend must read and write through the
    #: strides, and leave the elements between untouched.
    STRIDED = "strided"


class Completion(StringEnum):
    """How the caller waits for the collective."""

    SYNC = "sync"  # async_op=False
    WAIT = "wait"  # async_op=True, then work.wait()
    FUTURE = "future"  # work.get_future().wait(): its value holds the results
    THEN = "then"  # work.get_future().then(f): f sees the results


class GroupKind(StringEnum):
    WORLD = "world"
    #: Two subgroups side by side, the even and the odd ranks (``new_group``): each rank
    #: runs the collective in its own, with group ranks that are not global ranks.
    SPLIT = "split"


REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX")
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "bool")
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
#: One element, an odd count, a few hundred thousand (past any small-message path), none.
SIZES = (1, 1023, 262_147, 0)


@dataclass(frozen=True)
class CollectiveCase:
    op: Op | str
    dtype: str = "float32"
    reduce_op: str = ""
    layout: Layout | str = Layout.CONTIGUOUS
    completion: Completion | str = Completion.SYNC
    group: GroupKind | str = GroupKind.WORLD
    sizes: tuple[int, ...] = SIZES
    description: str = ""

    def __post_init__(self) -> None:
        name = f"collective {self.op}"
        for attr, kind in (("op", Op), ("layout", Layout), ("completion", Completion),
                           ("group", GroupKind)):
            object.__setattr__(self, attr, kind.convert(getattr(self, attr), attr, name))
        if self.dtype not in DTYPES:
            raise ValueError(f"{name}: dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if (self.op in REDUCING) != bool(self.reduce_op):
            raise ValueError(f"{name}: a reduce op is required for {sorted(REDUCING)} and "
                             "only for them")
        if self.reduce_op and self.reduce_op not in REDUCE_OPS:
            raise ValueError(f"{name}: reduce op {self.reduce_op!r} is not one of "
                             f"{', '.join(REDUCE_OPS)}")
        if self.reduce_op == "AVG" and self.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name}: AVG is meaningful for floating dtypes only")

    @property
    def id(self) -> str:
        """E.g. ``collectives/allreduce-sum-float32``, ``collectives/broadcast-int64-split``."""
        parts = [str(self.op).replace("_", "-")]
        if self.reduce_op:
            parts.append(self.reduce_op.lower())
        if self.op != Op.BARRIER:  # moves no data
            parts.append(self.dtype)
        for value, plain in ((self.layout, Layout.CONTIGUOUS), (self.completion, Completion.SYNC),
                             (self.group, GroupKind.WORLD)):
            if value != plain:
                parts.append(str(value))
        return "collectives/" + "-".join(parts)

    @property
    def seed(self) -> int:
        return 0

    def unsupported_world_size(self, world_size: int) -> str:
        """Why the case means nothing at ``world_size`` ('' if it does)."""
        if world_size < 2 and (self.op == Op.SEND_RECV or self.group == GroupKind.SPLIT):
            return f"{self.op} on a {self.group} group needs at least 2 ranks"
        return ""

    def title(self) -> str:
        """What it runs, in words: "allreduce SUM float32, strided"."""
        words = [str(self.op)] + ([self.reduce_op] if self.reduce_op else []) + \
            ([self.dtype] if self.op != Op.BARRIER else [])
        extra = [str(v) for v, plain in ((self.layout, Layout.CONTIGUOUS),
                                         (self.completion, Completion.SYNC),
                                         (self.group, GroupKind.WORLD)) if v != plain]
        return " ".join(words) + (", " + ", ".join(extra) if extra else "")
