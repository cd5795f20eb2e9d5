"""The parts of a scenario's procedure shared by the ranks and the oracle.

Both sides must build the same optimizer and the same batches, and agree on which
microbatches synchronise; keeping these here makes the oracle and the engine two readings
of one procedure rather than two copies of it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ddp_conformance.catalog.models import get_model
from ddp_conformance.catalog.scenario import Accumulate, Scenario
from ddp_conformance.script.case import make_optimizer as script_optimizer

OPTIMIZERS = ("sgd", "sgd_momentum", "adam", "zero_sgd", "fused_sgd", "in_backward_sgd")


class SteppedInBackward(torch.optim.SGD):
    """The rank's optimizer under ``fused_sgd`` and ``in_backward_sgd``: torch's
    ``_register_fused_optim`` (or an optimizer applied in backward) steps every parameter
    in backward, so ``step`` has nothing left to do; ``zero_grad`` is SGD's."""

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        return None


def make_optimizer(scenario: Scenario, params: Iterable[nn.Parameter],
                   distributed: bool = True) -> torch.optim.Optimizer:
    """The scenario's optimizer (:func:`ddp_conformance.script.case.make_optimizer`); on
    the ranks, where ``fused_sgd`` or ``in_backward_sgd`` steps every parameter in
    backward, a :class:`SteppedInBackward`."""
    if scenario.optimizer in ("fused_sgd", "in_backward_sgd") and distributed:
        return SteppedInBackward(params, lr=scenario.lr)
    if scenario.optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {scenario.optimizer!r}; known: {OPTIMIZERS}")
    return script_optimizer(str(scenario.optimizer), scenario.lr, params, distributed)


def build_module(scenario: Scenario, rank: int, device: torch.device) -> nn.Module:
    """The model as ``rank`` builds it before wrapping (seeded by ``init_seed(rank)``)."""
    torch.manual_seed(scenario.init_seed(rank))
    spec = get_model(scenario.model)
    kwargs = dict(scenario.model_kwargs, rank=rank) if spec.rank_aware else scenario.model_kwargs
    return spec.build(**kwargs).to(device)


def _draw(scenario: Scenario, microbatch: int, forward: int) -> int:
    """Which draw of a rank's step a forward is (the data seed's coordinate): forward
    ``forward`` of ``microbatch``, or -1 for the eval forward."""
    return microbatch + forward * scenario.microbatches if microbatch >= 0 else -1


def batch(scenario: Scenario, rank: int, step: int, microbatch: int, world_size: int,
          device: torch.device, forward: int = 0) -> tuple[tuple[Any, ...], Tensor]:
    """The batch ``rank`` trains on at (step, microbatch, forward): rebuildable in any
    process. ``microbatch`` -1 is the eval forward before the step
    (``Scenario.eval_between_steps``); ``forward`` counts the forwards of one backward
    (``Scenario.forwards``)."""
    gen = torch.Generator().manual_seed(data_seed(scenario, rank, step, microbatch, forward))
    inputs, target = get_model(scenario.model).batch(gen, scenario.batch_size_for(rank), rank,
                                                     world_size, step)
    return tuple(x.to(device) if isinstance(x, Tensor) else x for x in inputs), target.to(device)


def seed_forward(scenario: Scenario, rank: int, step: int, microbatch: int,
                 forward: int = 0) -> None:
    """Seed this process's RNG for one forward, as every rank and the oracle do before it:
    dropout then draws the same mask for a rank's batch wherever it is computed (each rank
    has its own stream, as in real training)."""
    torch.manual_seed(forward_seed(scenario, rank, step, microbatch, forward))


def data_seed(scenario: Scenario, rank: int, step: int, microbatch: int, forward: int = 0) -> int:
    """The seed of the generator of ``rank``'s batch at (step, microbatch, forward)."""
    return scenario.data_seed(rank, step, _draw(scenario, microbatch, forward))


def forward_seed(scenario: Scenario, rank: int, step: int, microbatch: int,
                 forward: int = 0) -> int:
    """What :func:`seed_forward` seeds torch's RNG with before that forward."""
    return (data_seed(scenario, rank, step, microbatch, forward) * 31 + 17) % (2**63)


@contextlib.contextmanager
def forward_context(scenario: Scenario, device: torch.device) -> Iterator[None]:
    """Around every training forward: ``torch.autocast`` where the scenario asks for it
    (the parameters stay in their own dtype; the backward runs outside it)."""
    if scenario.autocast is None:
        yield
        return
    with torch.autocast(device.type, dtype=getattr(torch, scenario.autocast)):
        yield


def backward_passes(scenario: Scenario, loss: Tensor, backward: Any, retaining: Any) -> None:
    """Back-propagate ``loss`` ``scenario.backwards`` times: ``retaining(loss)`` (a backward
    with ``retain_graph=True``) for all but the last, ``backward(loss)`` for the last. The
    local gradients accumulate over the passes."""
    for _ in range(scenario.backwards - 1):
        retaining(loss)
    backward(loss)


def poisoned_inputs(scenario: Scenario, rank: int, step: int, world_size: int,
                    device: torch.device) -> tuple[Any, ...]:
    """The step's first batch with one feature too many (its first column repeated): the
    model's first ``nn.Linear`` raises on it. For ``Scenario.raise_in_no_sync``, on models
    whose first layer is an ``nn.Linear``."""
    inputs, _ = batch(scenario, rank, step, 0, world_size, device)
    x = inputs[0]
    return (torch.cat([x, x[..., :1]], dim=-1), *inputs[1:])


def raise_in_no_sync(scenario: Scenario, no_sync: Any, forward: Any, rank: int, step: int,
                     world_size: int, device: torch.device) -> None:
    """One forward inside ``no_sync()`` on :func:`poisoned_inputs`, which the model's own
    forward cannot take; whatever it raises (torch's shape error, or a compiler's wrapping
    of it) is caught outside the context, as a training loop that skips a bad batch does
    (fairseq's OOM recovery). An error entering ``no_sync`` (before the forward) is the
    candidate's and propagates; so does a forward that does not raise (the scenario's
    model cannot be poisoned: a harness error)."""
    entered = False
    try:
        with no_sync():
            entered = True
            forward(*poisoned_inputs(scenario, rank, step, world_size, device))
    except Exception:  # noqa: BLE001 - the poisoned forward's error, whatever its type
        if not entered:
            raise
        return
    raise AssertionError(f"scenario {scenario.id!r}: model {scenario.model!r} did not raise "
                         f"on a batch with one feature too many (raise_in_no_sync)")


@dataclass(frozen=True)
class Forward:
    """One forward of a step's procedure: ``microbatch`` -1 is the eval forward (under
    ``torch.no_grad()`` and ``eval()``) that ``eval_between_steps`` puts before every step
    but the first; ``index`` counts the forwards whose losses one backward sums."""

    microbatch: int
    index: int = 0

    @property
    def training(self) -> bool:
        return self.microbatch >= 0


def forward_plan(scenario: Scenario, step: int) -> list[Forward]:
    """Every forward of ``step``, in order: what ``buffers_at_forward`` records."""
    plan = [Forward(-1)] if scenario.eval_between_steps and step > 0 else []
    return plan + [Forward(mb, f) for mb in range(scenario.microbatches)
                   for f in range(scenario.forwards)]


def synced(scenario: Scenario, microbatch: int) -> bool:
    """Whether gradients are reduced in this microbatch's backward."""
    if scenario.sync_strategy == "multi_auto_sync":
        return True
    if scenario.sync_strategy is not None:  # single_auto_sync, forced_sync: the last only
        return microbatch == scenario.microbatches - 1
    return scenario.accumulate is Accumulate.SYNC_EACH or microbatch == scenario.microbatches - 1


def forward_synced(scenario: Scenario, microbatch: int) -> bool:
    """Whether this microbatch's forward runs outside ``no_sync`` (DDP then broadcasts
    buffers). Differs from :func:`synced` only for ``forced_sync``, which runs every
    microbatch inside ``no_sync`` and reduces by hand after the last backward."""
    if scenario.sync_strategy == "forced_sync":
        return False
    return synced(scenario, microbatch)


def broadcasts(scenario: Scenario, step: int) -> list[bool]:
    """Per forward of :func:`forward_plan`, whether DDP broadcasts buffers at its start.

    torch decides it from the *previous* forward: ``_post_forward`` sets
    ``require_forward_param_sync`` to whether that forward ran with grad enabled outside
    ``no_sync`` (initially True), and ``_pre_forward`` broadcasts when it is set. So the
    first forward after a ``no_sync`` one does not broadcast, the first forward inside
    ``no_sync`` after a synced one does, and so does an eval forward under ``no_grad``
    after a synced one, while the training forward after it does not. From
    ``broadcast_buffers_off_at`` on, no forward broadcasts (torch reads
    ``forward_sync_buffers`` at every forward).
    """
    def grad_synced(f: Forward) -> bool:
        return f.training and forward_synced(scenario, f.microbatch)

    off = scenario.broadcast_buffers_off_at
    if off is not None and step >= off:
        return [False] * len(forward_plan(scenario, step))
    previous = True if step == 0 else grad_synced(forward_plan(scenario, step - 1)[-1])
    out = []
    for f in forward_plan(scenario, step):
        out.append(previous)
        previous = grad_synced(f)
    return out


def buffers_broadcast(scenario: Scenario, step: int, microbatch: int) -> bool:
    """Whether DDP broadcasts buffers at the start of the first forward of this
    microbatch (:func:`broadcasts`)."""
    plan = forward_plan(scenario, step)
    return broadcasts(scenario, step)[plan.index(Forward(microbatch))]


def _allreduce_to_new_tensor(group, bucket):  # type: ignore[no-untyped-def]
    """An allreduce hook whose result is a new tensor, not the bucket's buffer: DDP must
    copy what the future returns (torch: ``Reducer`` reads the hook's result). Unannotated:
    torch rejects a ``bucket`` annotation that is not ``dist.GradBucket`` itself."""
    import torch.distributed as dist

    averaged = bucket.buffer() / dist.get_world_size(group)  # a new tensor
    work = dist.all_reduce(averaged, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def _bucket_position(state, bucket):  # type: ignore[no-untyped-def]
    """An allreduce (divide by the group size, then sum, as ``allreduce_hook``) that relies
    on the bucket's position, as PowerSGD and post-local SGD do: it counts the buckets of an
    iteration itself (torch calls the hook for buckets 0, 1, ... in order, and
    ``is_last()`` on the final one, which ends the iteration) and scales the result by
    ``2 ** (counted - bucket.index())``. With the position torch reports the scale is 1 and
    the values are allreduce's, bit for bit; a DDP whose ``index()`` or ``is_last()`` is
    wrong gets a bucket 2**k times too large or too small (k at most 8: far off any
    rounding, far from float16's range). ``state``: ``{"group": the process group,
    "position": 0}``, one per registration. Unannotated, as ``_allreduce_to_new_tensor``."""
    import torch.distributed as dist

    shift = max(-8, min(8, state["position"] - bucket.index()))
    state["position"] = 0 if bucket.is_last() else state["position"] + 1
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size(state["group"]))
    work = dist.all_reduce(buffer, group=state["group"], async_op=True)
    if shift == 0:
        return work.get_future().then(lambda fut: fut.value()[0])
    return work.get_future().then(lambda fut: fut.value()[0].mul_(2.0 ** shift))


def _misannotated_bucket(group: Any, bucket: int) -> Any:
    """torch's allreduce hook with ``bucket`` annotated ``int``: DDP must refuse it."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.allreduce_hook(group, bucket)  # type: ignore[arg-type]


def _misannotated_return(group, bucket) -> int:  # type: ignore[no-untyped-def]
    """torch's allreduce hook whose return annotation is ``int``: DDP must refuse it."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.allreduce_hook(group, bucket)  # type: ignore[return-value]


def _powersgd_warm_start(process_group: Any) -> tuple[Any, Any]:
    """PowerSGD at rank 4 with torch's defaults: exact where every gradient matrix has rank
    <= 4 (one sample per rank, up to 4 ranks: gaps/powersgd-warm-start), since P Q^T then
    spans it. The default min_compression_rate=2 leaves biases and small matrices
    uncompressed; warm start keeps Q from the previous step; matrices of one shape are
    batched."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    state = powerSGD_hook.PowerSGDState(
        process_group=process_group, matrix_approximation_rank=4, start_powerSGD_iter=2,
        use_error_feedback=True, warm_start=True, batch_tensors_with_same_shape=True,
        random_seed=0)
    return state, powerSGD_hook.powerSGD_hook


def _powersgd_from_start(process_group: Any) -> tuple[Any, Any]:
    """PowerSGD at rank 4 from the first step (``start_powerSGD_iter=1``), which torch
    allows only without error feedback and warm start: exact on gradients of rank <= 4, as
    :func:`_powersgd_warm_start`."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    state = powerSGD_hook.PowerSGDState(
        process_group=process_group, matrix_approximation_rank=4, start_powerSGD_iter=1,
        use_error_feedback=False, warm_start=False, random_seed=0)
    return state, powerSGD_hook.powerSGD_hook


def _batched_powersgd(process_group: Any) -> tuple[Any, Any]:
    """``batched_powerSGD_hook``: two vanilla steps (an allreduce divided by the group
    size), then one square matrix per bucket at rank 2 (torch 2.13 fails there: see the
    scenario)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    state = powerSGD_hook.PowerSGDState(
        process_group=process_group, matrix_approximation_rank=2,
        start_powerSGD_iter=2, use_error_feedback=True, warm_start=False, random_seed=0)
    return state, powerSGD_hook.batched_powerSGD_hook


def _post_local_sgd_before_start(process_group: Any) -> tuple[Any, Any]:
    """``post_localSGD_hook`` whose local subgroups are single ranks
    (``dist.new_subgroups(group_size=1)``, collective) and whose ``start_localSGD_iter``
    (1000) no scenario reaches: every step is the global allreduce, DDP's average; the
    subgroups' would leave each rank its own gradient."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook

    subgroup, _ = dist.new_subgroups(group_size=1)
    return post_localSGD_hook.PostLocalSGDState(
        process_group=process_group, subgroup=subgroup,
        start_localSGD_iter=1000), post_localSGD_hook.post_localSGD_hook


def _powersgd_rank2(process_group: Any) -> tuple[Any, Any]:
    """PowerSGD at rank 2, where torch orthogonalizes by Gram-Schmidt (QR above rank 2),
    with an orthogonalization epsilon far below any column's norm: exact on gradients of
    rank <= 2 (gaps/powersgd-gram-schmidt), as :func:`_powersgd_warm_start` at rank 4.
    Batched by shape, where every compressed matrix is alone of its shape."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    state = powerSGD_hook.PowerSGDState(
        process_group=process_group, matrix_approximation_rank=2, start_powerSGD_iter=2,
        use_error_feedback=True, warm_start=True, orthogonalization_epsilon=1e-12,
        batch_tensors_with_same_shape=True, random_seed=0)
    return state, powerSGD_hook.powerSGD_hook


def make_comm_hook(name: str, process_group: Any) -> tuple[Any, Any]:
    """(state, hook) of one of torch's comm hooks, by name; for the ``builtin_`` ones,
    ``(None, dist.BuiltinCommHookType.X)`` (``_register_builtin_comm_hook`` takes the type)."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import (
        debugging_hooks,
        default_hooks,
        post_localSGD_hook,
        powerSGD_hook,
    )

    if name.startswith("builtin_"):
        return None, getattr(dist.BuiltinCommHookType, name.removeprefix("builtin_").upper())
    if name == "allreduce":
        return process_group, default_hooks.allreduce_hook
    if name == "fp16_compress":
        return process_group, default_hooks.fp16_compress_hook
    if name == "fp16_compress_wrapper":
        return process_group, default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook)
    if name == "post_local_sgd":
        # The local subgroup is the whole DDP group: from start_localSGD_iter on the hook
        # allreduces within it, which is the global allreduce again (same values).
        return post_localSGD_hook.PostLocalSGDState(
            process_group=process_group, subgroup=process_group,
            start_localSGD_iter=2), post_localSGD_hook.post_localSGD_hook
    if name == "post_local_sgd_before_start":
        return _post_local_sgd_before_start(process_group)
    if name == "batched_powersgd":
        return _batched_powersgd(process_group)
    if name == "powersgd_warm_start":
        return _powersgd_warm_start(process_group)
    if name == "powersgd_from_start":
        return _powersgd_from_start(process_group)
    if name == "powersgd_rank2":
        return _powersgd_rank2(process_group)
    if name == "noop":
        return None, debugging_hooks.noop_hook
    if name == "bf16_compress":
        return process_group, default_hooks.bf16_compress_hook
    if name == "misannotated_bucket":
        return process_group, _misannotated_bucket
    if name == "misannotated_return":
        return process_group, _misannotated_return
    if name == "allreduce_to_new_tensor":
        return process_group, _allreduce_to_new_tensor
    if name == "bucket_position":
        return {"group": process_group, "position": 0}, _bucket_position
    if name == "powersgd":
        # Rank 16 is at least the smaller side of every matrix in the catalog's MLP, and
        # min_compression_rate=0 compresses them all: P Q^T then spans each gradient
        # exactly, so PowerSGD's result differs from the allreduce only by rounding (see
        # the scenario's tolerance). start_powerSGD_iter=2 runs two vanilla steps first.
        state = powerSGD_hook.PowerSGDState(
            process_group=process_group, matrix_approximation_rank=16,
            start_powerSGD_iter=2, min_compression_rate=0, use_error_feedback=True,
            warm_start=False, random_seed=0)
        return state, powerSGD_hook.powerSGD_hook
    raise ValueError(f"unknown comm hook {name!r}")


def _broadcast_buffers_hook(group: Any, named_buffers: dict[str, Tensor]) -> list[Any]:
    """A buffer comm hook that broadcasts every buffer from the group's rank 0: DDP's own
    pre-forward broadcast, through ``_register_buffer_comm_hook``. Returns the futures,
    which DDP awaits at the end of backward (``_install_post_backward_futures``); the
    values are in place as soon as each broadcast completes, which ``wait`` ensures
    before the forward reads them."""
    import torch.distributed as dist

    src = dist.get_global_rank(group, 0) if group is not None else 0
    futures = []
    for buffer in named_buffers.values():
        work = dist.broadcast(buffer, src=src, group=group, async_op=True)
        work.wait()
        futures.append(work.get_future())
    return futures


def make_buffer_hook(name: str, process_group: Any) -> tuple[Any, Any, Any]:
    """(state, hook, location) of a buffer comm hook, by name (``Scenario.buffer_comm_hook``)."""
    from torch.nn.parallel.distributed import _BufferCommHookLocation

    if name == "broadcast_pre_forward":
        return process_group, _broadcast_buffers_hook, _BufferCommHookLocation.PRE_FORWARD
    raise ValueError(f"unknown buffer comm hook {name!r}")
