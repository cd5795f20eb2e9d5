"""``init.param`` / ``init.buffer``: DDP's init sync."""
from __future__ import annotations

from ddp_conformance.judge.registry import Context, check, values
from ddp_conformance.judge.tolerance import BITWISE


@check("init", "init.param", "init.buffer", when=values)
def init_sync(ctx: Context) -> None:
    """After wrapping, every rank holds its group rank 0's initial parameters, bitwise
    (``init.param``), and rank 0's buffers where ``broadcast_buffers`` is on, its own
    otherwise (``init.buffer``): torch's DDP constructor broadcasts the module state from
    rank 0 (``_sync_module_states``), buffers only with ``broadcast_buffers``."""
    ev, oracle = ctx.evidence, ctx.oracle
    for rank, rec in sorted(ctx.records.items()):
        ev.compare_all("init.param", -1, rank, rec.initial_params, oracle.initial_params,
                       BITWISE, "rank 0's initial parameters")
        ev.compare_all("init.buffer", -1, rank, rec.initial_buffers,
                       oracle.initial_buffers[rank], BITWISE,
                       "the initial buffers (rank 0's where broadcast, else its own)")
