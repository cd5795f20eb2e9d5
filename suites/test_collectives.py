"""Collectives: the backend itself, before any DDP (``--backend MODULE:NAME``).

Each case runs one operation with exact-valued data on every rank and compares the
results bitwise (``ddp_conformance.collectives``). They run for a custom backend, or with
``--collectives on``; ``--collectives only`` runs nothing else.
"""
from ddp_conformance.catalog.collective import (
    DTYPES,
    FLOAT_DTYPES,
    CollectiveCase,
    Completion,
    GroupKind,
    Layout,
    Op,
)

_EVERY_DTYPE = [
    *(CollectiveCase(Op.ALLREDUCE, dtype, reduce_op)
      for reduce_op in ("SUM", "PRODUCT", "MIN", "MAX") for dtype in DTYPES),
    *(CollectiveCase(Op.ALLREDUCE, dtype, "AVG") for dtype in FLOAT_DTYPES),
    *(CollectiveCase(op, dtype) for op in (Op.BROADCAST, Op.ALLGATHER, Op.ALLGATHER_INTO_TENSOR,
                                           Op.ALLTOALL, Op.ALLTOALL_SINGLE, Op.GATHER,
                                           Op.SCATTER, Op.SEND_RECV)
      for dtype in DTYPES),
    *(CollectiveCase(op, dtype, "SUM")
      for op in (Op.REDUCE_SCATTER, Op.REDUCE_SCATTER_TENSOR, Op.REDUCE) for dtype in DTYPES),
]

_STRIDED = [
    CollectiveCase(Op.ALLREDUCE, reduce_op="SUM", layout=Layout.STRIDED),
    CollectiveCase(Op.BROADCAST, layout=Layout.STRIDED),
    CollectiveCase(Op.ALLGATHER, layout=Layout.STRIDED),
    CollectiveCase(Op.REDUCE, reduce_op="SUM", layout=Layout.STRIDED),
    CollectiveCase(Op.SCATTER, layout=Layout.STRIDED),
    CollectiveCase(Op.SEND_RECV, layout=Layout.STRIDED),
]

_ASYNC = [
    *(CollectiveCase(Op.ALLREDUCE, reduce_op="SUM", completion=c)
      for c in (Completion.WAIT, Completion.FUTURE, Completion.THEN)),
    *(CollectiveCase(Op.BROADCAST, completion=c)
      for c in (Completion.WAIT, Completion.FUTURE, Completion.THEN)),
    CollectiveCase(Op.ALLGATHER, completion=Completion.WAIT),
    CollectiveCase(Op.REDUCE_SCATTER_TENSOR, reduce_op="SUM", completion=Completion.WAIT),
    CollectiveCase(Op.ALLTOALL_SINGLE, completion=Completion.WAIT),
    CollectiveCase(Op.BARRIER, completion=Completion.WAIT, sizes=()),
]

_SUBGROUPS = [
    CollectiveCase(Op.ALLREDUCE, reduce_op="SUM", group=GroupKind.SPLIT),
    CollectiveCase(Op.BROADCAST, group=GroupKind.SPLIT),
    CollectiveCase(Op.ALLGATHER, group=GroupKind.SPLIT),
    CollectiveCase(Op.ALLGATHER_INTO_TENSOR, group=GroupKind.SPLIT),
    CollectiveCase(Op.REDUCE_SCATTER_TENSOR, reduce_op="SUM", group=GroupKind.SPLIT),
    CollectiveCase(Op.ALLTOALL_SINGLE, group=GroupKind.SPLIT),
    CollectiveCase(Op.REDUCE, reduce_op="SUM", group=GroupKind.SPLIT),
    CollectiveCase(Op.GATHER, group=GroupKind.SPLIT),
    CollectiveCase(Op.SCATTER, group=GroupKind.SPLIT),
    CollectiveCase(Op.BARRIER, group=GroupKind.SPLIT, sizes=()),
]

COLLECTIVES = [
    *_EVERY_DTYPE,
    *_STRIDED,
    *_ASYNC,
    *_SUBGROUPS,
    CollectiveCase(Op.BARRIER, sizes=()),
    CollectiveCase(Op.SPARSE_ALLREDUCE, reduce_op="SUM", sizes=(),
                   description="what DDP does with a sparse embedding's gradients"),
]
