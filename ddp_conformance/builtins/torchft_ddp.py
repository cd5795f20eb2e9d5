"""``torchft``: torchft's fault-tolerant DDP, a ``Manager`` per replica and a lighthouse.

What a torchft user runs as DDP (torchft 0.2.0, ``torchft/ddp.py``, ``manager.py``,
``optim.py``; the package's own ``manager_integ_test.ddp_train_loop`` is this loop):
``torchft.ddp.DistributedDataParallel(manager, module, **kwargs)`` is torch's DDP built
over a one-rank dummy group (its construction broadcast reaches nobody) with
``find_unused_parameters=True`` forced, and a comm hook that sends every bucket through
``manager.allreduce`` (a sum over torchft's own Gloo group, divided by the number of
participating replicas). The optimizer is ``torchft.optim.OptimizerWrapper(manager,
optimizer)``: ``zero_grad`` starts a quorum (``manager.start_quorum``), ``step`` steps only
if ``manager.should_commit()`` says every replica succeeded. ``init_sync`` is the
Manager's: at step 0 every replica but the primary heals from it (model and optimizer
state dicts over torchft's HTTP checkpoint transport).

The Manager runs with ``use_async_quorum=False`` (a documented Manager option): the quorum
completes, and a heal is applied, in ``start_quorum``, before the forward. With the
default asynchronous quorum the step-0 heal is applied in ``should_commit`` and the
healing replicas' gradients of step 0 are replaced by zeros while still counted in the
divisor, so step 0's gradient is the primary's divided by the number of replicas, on
every rank (a torchft defect: ``tests/standalone/torchft_init_sync_first_step.py``,
without the harness). Every later step, and the synchronous mode throughout, give DDP's
mean; the synchronous mode is judged here so that this one defect does not hide every
other verdict.

The smallest faithful setup on one machine, per wrap: each harness rank is one replica
group of one worker (``replica_<group rank>``, group rank 0, group size 1) with its own
``TCPStore`` (the Manager needs its replica group's store to exist) and its own
``Manager`` (it runs the replica's Rust ``ManagerServer``); group rank 0 also runs a
``LighthouseServer`` with ``min_replicas`` = the group size, whose address reaches the
other ranks through the job's store (no collective on the traced group). torchft's
collectives go through its own reconfigured Gloo group, which the harness's tracing group
never sees. Every wait is bounded by :data:`TIMEOUT` (Manager timeout, quorum and connect
timeouts, Gloo timeout, store timeout). What a wrap started is shut down when the adapter
is collected, and at the latest when the next wrap starts.

Options: ``bucket_cap_mb`` and ``gradient_as_bucket_view`` go to torch's DDP;
``init_sync`` is the Manager's; ``find_unused_parameters`` is honoured only as True
(torchft forces it, and passing it again is a ``TypeError``); ``broadcast_buffers`` only
as False (torch's buffer broadcast runs over the one-rank dummy group: buffers are synced
only by the step-0 heal). ``static_graph`` is not claimed: torch's static graph rebuilds
its buckets once from each rank's own ready order, and the layout sync that makes ranks
agree runs over the dummy group, so with a rank-dependent order the replicas reduce
mismatched buckets (``gaps/static-graph-unused-on-some-ranks-tiny-cap`` aborted a rank in
Gloo; torchft's docstring warns that features beyond the basic ones are untested).
``no_sync`` is torch's. Comm hooks are not claimed (torchft registers its own, and torch's
DDP takes one), nor Join.
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ddp_conformance.builtins._common import (
    OptionPolicy,
    expectations_file,
    honoured,
    require,
    static_capabilities,
    sync_through_no_sync,
    unknown_options,
    version,
)
from ddp_conformance.contract.adapter import Adapter, OptimizerFactory
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.capability import Capability

NAME = "torchft"
POLICY: OptionPolicy = {"bucket_cap_mb": None, "gradient_as_bucket_view": None, "init_sync": None,
                        "find_unused_parameters": lambda v: bool(v),
                        "broadcast_buffers": lambda v: not v}
FEATURES = (Capability.NO_SYNC, Capability.SYNC_STRATEGY)
#: Every torchft wait: collectives, quorum, RPC connections, stores (a case's own deadline
#: is the harness's; this only keeps a lost peer from blocking past it).
TIMEOUT = timedelta(seconds=30)
#: How often the lighthouse forms a quorum (torchft's tests use 100 ms).
QUORUM_TICK_MS = 20

#: Shut-down calls of the replicas this process started and has not shut down yet.
_LIVE: list[Callable[[], None]] = []


def _shut_down_all() -> None:
    while _LIVE:
        close = _LIVE.pop()
        with contextlib.suppress(Exception):
            close()


def _lighthouse_address(group: Any, group_rank: int) -> tuple[str, Any]:
    """Start the lighthouse on group rank 0; every rank reads its address from the job's
    store (keyed by the group's ranks, so groups side by side do not meet)."""
    from torchft.coordination import LighthouseServer

    store = dist.distributed_c10d._get_default_store()
    key = "torchft/lighthouse/" + ",".join(map(str, dist.get_process_group_ranks(group)))
    lighthouse = None
    if group_rank == 0:
        lighthouse = LighthouseServer(bind="[::]:0", min_replicas=dist.get_world_size(group),
                                      join_timeout_ms=int(TIMEOUT.total_seconds() * 1000),
                                      quorum_tick_ms=QUORUM_TICK_MS)
        store.set(key, lighthouse.address())
    store.wait([key], TIMEOUT)
    return store.get(key).decode(), lighthouse


class TorchftAdapter(Adapter):
    def __init__(self, module: nn.Module, process_group: Any, device: torch.device,
                 **ddp_options: Any) -> None:
        from torchft.ddp import DistributedDataParallel
        from torchft.manager import Manager
        from torchft.process_group import ProcessGroupGloo

        unknown_options(ddp_options)
        _shut_down_all()
        group = process_group if process_group is not None else dist.group.WORLD
        group_rank = dist.get_rank(group)
        address, lighthouse = _lighthouse_address(group, group_rank)
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              timeout=TIMEOUT)
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=TIMEOUT), load_state_dict=None, state_dict=None,
            min_replica_size=dist.get_world_size(group), timeout=TIMEOUT, quorum_timeout=TIMEOUT,
            connect_timeout=TIMEOUT, rank=0, world_size=1, store_addr="127.0.0.1",
            store_port=store.port, lighthouse_addr=address, replica_id=f"replica_{group_rank}",
            hostname="localhost", init_sync=ddp_options.get("init_sync", True),
            use_async_quorum=False)
        kwargs = {k: v for k, v in ddp_options.items()
                  if k not in ("find_unused_parameters", "init_sync")}
        self.ddp = DistributedDataParallel(self.manager, module, **kwargs)
        self.module = module
        self.group = group
        self.optimizer: Any = None
        self.capabilities = honoured(POLICY, ddp_options, *FEATURES)
        close = _closer(self.manager, lighthouse, store)
        _LIVE.append(close)
        weakref.finalize(self, _close_once, close)

    def set_optimizer(self, factory: OptimizerFactory) -> None:
        from torchft.optim import OptimizerWrapper

        inner = factory(self.ddp.parameters())
        self.optimizer = OptimizerWrapper(self.manager, inner)
        self.manager.register_state_dict_fn("default", *_state_dict_fns(self.ddp, inner))

    def forward(self, *inputs: Any) -> Any:
        return self.ddp(*inputs)

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def train(self, mode: bool) -> None:
        self.ddp.train(mode)

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self, set_to_none: bool) -> None:
        self.optimizer.zero_grad(set_to_none)

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        return self.ddp.no_sync()  # type: ignore[no-any-return]

    def sync_context(self, is_final_microbatch: bool, strategy: str
                     ) -> contextlib.AbstractContextManager[None]:
        """Composer's sync strategies through torch's ``no_sync`` (torchft's DDP is torch's
        with its own comm hook); ``forced_sync`` averages ``.grad`` over the scenario's
        group, as Composer does."""
        def grads() -> list[Tensor]:
            return [p.grad for p in self.ddp.parameters() if p.grad is not None]

        return sync_through_no_sync(self.no_sync, grads, self.group, is_final_microbatch,
                                    strategy)


def _state_dict_fns(ddp: nn.Module, optimizer: torch.optim.Optimizer
                    ) -> tuple[Callable[[dict[str, Any]], None], Callable[[], dict[str, Any]]]:
    """What a replica sends and loads when it heals: model and optimizer state (as in
    torchft's ``ddp_train_loop``). They hold no reference to the adapter, so dropping the
    adapter shuts its replica down at once."""
    def load(state: dict[str, Any]) -> None:
        ddp.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    def save() -> dict[str, Any]:
        return {"model": ddp.state_dict(), "optim": optimizer.state_dict()}

    return load, save


def _closer(manager: Any, lighthouse: Any, store: Any) -> Callable[[], None]:
    """Shut this replica down: its Manager (threads, servers), then the lighthouse; the
    store lives as long as the closer does."""
    def close() -> None:
        with contextlib.suppress(Exception):
            manager.shutdown(wait=True)
        if lighthouse is not None:
            with contextlib.suppress(Exception):
                lighthouse.shutdown()
        del store_ref[:]

    store_ref = [store]
    return close


def _start_timeout_manager() -> None:
    """Start torchft's process-wide ``_TimeoutManager`` (an event-loop thread and its
    watchdog, which torchft starts at its first timed wait and never stops) when the
    candidate is resolved, as its import would: each rank resolves its candidates at
    start-up, so these two threads are part of a fresh rank, not state a case left."""
    from torchft.futures import _TIMEOUT_MANAGER

    _TIMEOUT_MANAGER._maybe_start_event_loop()


def _close_once(close: Callable[[], None]) -> None:
    if close in _LIVE:
        _LIVE.remove(close)
        close()


def candidate() -> Candidate:
    require(NAME, "torchft.ddp", "torchft", extra="torchft")
    _start_timeout_manager()
    return Candidate(
        name=NAME, wrap=TorchftAdapter, capabilities=static_capabilities(POLICY, *FEATURES),
        version=version("torchft"),
        description="torchft.ddp.DistributedDataParallel + OptimizerWrapper, a Manager per "
                    "replica, one lighthouse (reduces through torchft's own Gloo group)",
        expectations=expectations_file(NAME))
