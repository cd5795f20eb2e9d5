"""DDP's join hook for uneven inputs (torch's ``_DDPJoinHook``).

While some rank is still training, a rank that ran out of inputs repeats, per iteration,
every collective the active ranks issue in a training iteration, in the same order:

1. (the ``Join`` context's own allreduce matches the active ranks' "not joined" notice);
2. the one-time bucket rebuild broadcasts, if still due;
3. the buffer broadcast, from the highest active rank (an allreduce MAX to agree on it);
4. the allreduce of the "will synchronize gradients" flag (0 from a joined rank); when no
   active rank synchronizes, nothing else is matched this iteration;
5. one allreduce of zeros per bucket, through the registered comm hook if any (without a
   hook the active ranks divide before summing, so the zeros change nothing but the
   count they divide by);
6. with ``find_unused_parameters``, the used-parameter map allreduce.

When every rank has joined, ``post_hook`` broadcasts parameters (and buffers when DDP
broadcasts them) from the highest rank among the last to join.
``divide_by_initial_world_size=False`` makes active ranks divide by the number of active
ranks, read from the forward's "not joined" allreduce.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from torch.distributed.algorithms.join import JoinHook

if TYPE_CHECKING:
    from .ddp import DistributedDataParallel


class DDPJoinHook(JoinHook):
    def __init__(self, ddp: DistributedDataParallel, divide_by_initial_world_size: bool) -> None:
        self.ddp = ddp
        ddp._divide_by_initial_world_size = divide_by_initial_world_size
        super().__init__()

    def main_hook(self) -> None:
        ddp = self.ddp
        reducer = ddp.reducer
        if reducer.rebuild_buckets():
            ddp._has_rebuilt_buckets = True
        ddp._check_and_sync_module_buffers()
        should_sync = ddp._check_global_requires_backward_grad_sync(is_joined_rank=True)
        ddp.require_forward_param_sync = bool(should_sync)
        if not should_sync:
            return
        futures = [reducer.run_comm_hook(b) for b in reducer.zeros_like_grad_buckets()]
        for fut in futures:
            fut.wait()
        if ddp.find_unused_parameters:
            reducer.allreduce_local_used_map_for_join()
        reducer.push_all_rebuilt_params()

    def post_hook(self, is_last_joiner: bool) -> None:
        self.ddp._sync_final_model(is_last_joiner)
