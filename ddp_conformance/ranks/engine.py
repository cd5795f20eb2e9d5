"""Runs one scenario for one candidate on one rank and records what happened.

Per optimizer step the record holds the synced gradients (``None`` kept as ``None``), the
parameters after the step, the buffers after the step, and the buffers as the wrapped
module saw them at the start of each forward (a forward pre-hook on the inner module, so
after any broadcast the candidate did in its own forward). The parent process compares
these records with the oracle and across ranks; a rank never judges itself.
"""
from __future__ import annotations

import contextlib
import re
import time
from typing import Any

import torch

from ddp_conformance.catalog.ddp_options import materialize
from ddp_conformance.catalog.models import get_model
from ddp_conformance.catalog.procedure import (
    backward_passes,
    batch,
    build_module,
    forward_context,
    make_buffer_hook,
    make_comm_hook,
    make_optimizer,
    raise_in_no_sync,
    seed_forward,
    synced,
)
from ddp_conformance.catalog.scenario import Accumulate, Scenario, missing_capabilities
from ddp_conformance.contract.adapter import Adapter
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.capability import Capability
from ddp_conformance.contract.refusal import Unsupported, incidental
from ddp_conformance.ranks.forward_buffers import BuffersAtForward
from ddp_conformance.ranks.records import RankRecord, StepRecord
from ddp_conformance.ranks.tracing import TRACER
from ddp_conformance.script.forwards import training_loss


class PhaseClock:
    """Seconds per phase of one rank's scenario: :meth:`enter` charges the time since the
    previous :meth:`enter` to the previous phase (``wrap``, ``steps``, ``record``)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self._phase: str | None = None
        self._since = time.perf_counter()

    def enter(self, phase: str | None) -> None:
        """From now on the time goes to ``phase`` (None: to no phase)."""
        now = time.perf_counter()
        if self._phase is not None:
            self.times[self._phase] = self.times.get(self._phase, 0.0) + now - self._since
        self._phase, self._since = phase, now

    def stop(self) -> dict[str, float]:
        """Close the current phase; the seconds per phase."""
        self.enter(None)
        return dict(self.times)


def run_scenario(scenario: Scenario, candidate: Candidate, rank: int, world_size: int,
                 device: torch.device, process_group: Any) -> RankRecord:
    """Train ``scenario`` with ``candidate`` on this rank; every rank calls this together.

    The record's ``times`` say where this rank's time went (:class:`PhaseClock`), also when
    the scenario ended early (N/A, idle, an expected error).
    """
    clock = PhaseClock()
    record = _run_scenario(scenario, candidate, rank, world_size, device, process_group, clock)
    record.times = clock.stop()
    return record


def _run_scenario(scenario: Scenario, candidate: Candidate, rank: int, world_size: int,
                  device: torch.device, process_group: Any, clock: PhaseClock) -> RankRecord:
    static_missing = missing_capabilities(
        scenario, candidate.capabilities | _unknowable(candidate))
    if static_missing:
        return RankRecord(rank, not_applicable=static_missing)
    TRACER.take()
    TRACER.phase("wrap")
    clock.enter("wrap")
    group_ranks = list(range(world_size))
    if scenario.groups is not None:
        process_group, group_ranks = _join_groups(scenario.groups, rank)
        if process_group is None:
            return RankRecord(rank, idle=True, trace=TRACER.take())
    group_rank, group_size = group_ranks.index(rank), len(group_ranks)
    module = build_module(scenario, rank, device)
    adapter = _wrap(scenario, candidate, rank, module, process_group, device)
    if isinstance(adapter, RankRecord):
        return adapter

    TRACER.phase("record")
    clock.enter("record")
    record = _initial_record(scenario, adapter, rank)
    if record.accepted:
        return record
    at_forward = BuffersAtForward()  # filled by the hook, emptied after every step
    hooks = [at_forward.watch(module)]
    steps = scenario.steps_for(group_rank)
    clock.enter("steps")
    try:
        # Join's constructor may refuse (joinables on different groups): inside the try.
        with _join(scenario, adapter):
            _train(scenario, adapter, module, record, steps, at_forward, rank, group_size,
                   device, clock, process_group, hooks)
            TRACER.phase("join", steps)  # Join's exit: shadowing and the final sync
    except Exception as exc:  # noqa: BLE001 - only where the scenario expects an error
        if not scenario.may_raise or incidental(exc):  # a bug is no refusal: ERROR
            raise
        record.raised = f"{type(exc).__name__}: {exc}"
    finally:
        for handle in hooks:
            handle.remove()
    TRACER.phase("record", steps)
    clock.enter("record")
    try:
        record.final_params = adapter.parameters()
        record.final_buffers = adapter.buffers()
    except Exception:  # noqa: BLE001 - only after the very refusal expected, which stands
        # The refusal the scenario expects, raised in the middle of a step (the first
        # forward), can leave a candidate unreadable (FSDP stays in its forward state): the
        # refusal is the result. Any other error raised in the step stays unexcused.
        if not _the_expected_refusal(scenario, record.raised):
            raise
    record.trace = TRACER.take()
    return record


def _initial_record(scenario: Scenario, adapter: Adapter, rank: int) -> RankRecord:
    """The rank's record with the state the candidate starts from.

    Where the scenario expects a refusal and the candidate constructed without one, a
    state the harness cannot read (the uninitialized parameters of a lazy module it
    accepted: torch's ``UninitializedParameter`` raises at ``detach``) ends the rank
    there with the record's ``accepted``: the missing refusal is the result, judged FAIL
    by ``expected_error``, not an ERROR of the harness's read.
    """
    try:
        params, buffers = adapter.parameters(), adapter.buffers()
    except Exception as exc:  # noqa: BLE001 - only where the scenario expects a refusal
        if scenario.expect_error is None:
            raise
        return RankRecord(rank, accepted=f"{type(exc).__name__}: {exc}", trace=TRACER.take())
    return RankRecord(rank, initial_params=params, initial_buffers=buffers,
                      unread_options=tuple(getattr(adapter, "unread_options", ())))


def _the_expected_refusal(scenario: Scenario, raised: str) -> bool:
    """Whether ``raised`` ("Type: message") is the error the scenario names (its
    ``expect_error`` or ``torch_limit`` pattern)."""
    patterns = [p for p in (scenario.expect_error, scenario.torch_limit) if p is not None]
    return bool(raised) and any(re.search(p, raised) for p in patterns)


def _wrap(scenario: Scenario, candidate: Candidate, rank: int, module: torch.nn.Module,
          process_group: Any, device: torch.device) -> Adapter | RankRecord:
    """The candidate's adapter around ``module``, its optimizer set and the scenario's
    hooks registered; or the rank's record where it refused as the scenario expects (what
    it raised) or lacks a capability the scenario needs (N/A)."""
    if scenario.optimizer == "in_backward_sgd":  # the user's model, before DDP sees it
        from torch.distributed.optim import _apply_optimizer_in_backward

        _apply_optimizer_in_backward(torch.optim.SGD, module.parameters(), {"lr": scenario.lr})
    try:
        options = materialize(scenario.ddp_options, module, process_group, device)
        adapter = candidate.wrap(module, process_group, device, **options)
        # Right after wrapping, before anything is read: frameworks that build their
        # engine around the optimizer (DeepSpeed, fairscale's OSS) do it, and sync, here.
        adapter.set_optimizer(lambda params: make_optimizer(scenario, params))
    except Unsupported as exc:  # the adapter cannot run this: N/A, as a missing capability
        return RankRecord(rank, not_applicable=f"the candidate cannot run this: {exc}")
    except Exception as exc:  # noqa: BLE001 - only where the scenario expects an error
        if not scenario.may_raise or incidental(exc):  # a bug is no refusal: ERROR
            raise
        return RankRecord(rank, raised=f"{type(exc).__name__}: {exc}", trace=TRACER.take())
    na = missing_capabilities(scenario, adapter.capabilities) or _misuse_unread(scenario, adapter)
    if na:
        return RankRecord(rank, not_applicable=na)
    try:
        _register_hooks(scenario, adapter, process_group)
    except Exception as exc:  # noqa: BLE001 - only where the scenario expects an error
        if not scenario.may_raise or incidental(exc):  # a bug is no refusal: ERROR
            raise
        return RankRecord(rank, raised=f"{type(exc).__name__}: {exc}", trace=TRACER.take())
    return adapter


def _misuse_unread(scenario: Scenario, adapter: Adapter) -> str:
    """The N/A reason of a scenario that misuses DDP options the candidate never reads
    (it expects their misuse refused: nothing can refuse it), or ''."""
    unread = adapter.unread_options
    if scenario.expect_error is None or not unread:
        return ""
    return (f"option{'s' if len(unread) > 1 else ''} {', '.join(unread)} never read by the "
            f"candidate (taken only through **kwargs, passed to no torch "
            f"DistributedDataParallel): its misuse cannot be refused")


def _join(scenario: Scenario, adapter: Adapter) -> contextlib.AbstractContextManager[Any]:
    """The scenario's Join context around the training loop (a null one without Join)."""
    if not scenario.join:
        return contextlib.nullcontext()
    return adapter.join(
        divide_by_initial_world_size=scenario.join.divide_by_initial_world_size,
        throw_on_early_termination=scenario.join.throw_on_early_termination)


def _register_hooks(scenario: Scenario, adapter: Adapter, process_group: Any) -> None:
    """After wrapping: the scenario's comm hook (``comm_hook_registrations`` times; a
    ``builtin_`` one through ``_register_builtin_comm_hook``), its buffer comm hook, and
    the fused optimizer (``fused_sgd``: torch's ``_register_fused_optim``)."""
    for _ in range(scenario.comm_hook_registrations if scenario.comm_hook else 0):
        state, hook = make_comm_hook(str(scenario.comm_hook), process_group)
        if scenario.comm_hook is not None and scenario.comm_hook.builtin:
            adapter.register_builtin_comm_hook(hook)
        else:
            adapter.register_comm_hook(state, hook)
    if scenario.buffer_comm_hook is not None:
        adapter.register_buffer_comm_hook(*make_buffer_hook(str(scenario.buffer_comm_hook),
                                                            process_group))
    if scenario.optimizer == "fused_sgd":
        adapter.register_fused_optim(torch.optim.SGD, lr=scenario.lr)


def _copy_wrapper(how: str) -> Any:
    """The copier of ``Scenario.copy_wrapper``: through ``pickle``, ``copy.deepcopy`` or
    ``torch.save``/``torch.load`` (torch's DDP pickles with the default group only)."""
    import copy
    import io
    import pickle

    def through_torch_save(obj: Any) -> Any:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)

    copiers: dict[str, Any] = {"pickle": lambda obj: pickle.loads(pickle.dumps(obj)),
                               "deepcopy": copy.deepcopy, "torch_save": through_torch_save}
    return copiers[how]


def _join_groups(groups: tuple[tuple[int, ...], ...], rank: int) -> tuple[Any, list[int]]:
    """Create every group on every rank (``new_group`` is collective); return this rank's."""
    import torch.distributed as dist

    mine: Any = None
    ranks: list[int] = []
    for members in groups:
        group = dist.new_group(list(members))
        if rank in members:
            mine, ranks = group, list(members)
    return mine, ranks


def _train(scenario: Scenario, adapter: Adapter, module: torch.nn.Module, record: RankRecord,
           steps: int, at_forward: BuffersAtForward, rank: int, world_size: int,
           device: torch.device, clock: PhaseClock, process_group: Any,
           hooks: list[Any]) -> None:
    """The training loop: per step, the model's ``before_step``, the eval forward
    (``eval_between_steps``), zero_grad, the microbatches (each ``forwards`` forwards and
    one backward), record, optimizer step.

    ``module`` is the unwrapped model; ``world_size`` is the DDP group's size (what the
    data is scaled by for exactness); ``clock`` gets the snapshots as ``record``, the rest
    as ``steps``. ``process_group``: the DDP group (None: the default one); ``hooks``:
    the handles of the buffer snapshots at forward, replaced when the wrapper is copied.
    """
    spec = get_model(scenario.model)
    for step in range(steps):
        if scenario.update_process_group_at == step:
            import torch.distributed as dist

            members = dist.get_process_group_ranks(process_group or dist.group.WORLD)
            adapter.update_process_group(dist.new_group(members))
        if scenario.copy_wrapper is not None and scenario.copy_wrapper_at == step:
            # Training goes on with the copy: a new module, a new optimizer over it, and
            # the buffer snapshots taken at its forwards (the harness's hook is taken off
            # first: it is no part of the user's model, and a closure does not pickle).
            for handle in hooks:
                handle.remove()
            module = adapter.copy_wrapper(_copy_wrapper(str(scenario.copy_wrapper)))
            adapter.set_optimizer(lambda params: make_optimizer(scenario, params))
            hooks[:] = [at_forward.watch(module)]
        if scenario.broadcast_buffers_off_at == step:
            adapter.set_broadcast_buffers(False)
        if spec.before_step is not None:
            spec.before_step(module, step)
        if scenario.eval_between_steps and step > 0:
            TRACER.phase("eval", step)
            _eval_forward(scenario, adapter, at_forward.forward(adapter), rank, step,
                          world_size, device)
        TRACER.phase("zero_grad", step)
        clock.enter("steps")
        adapter.zero_grad(scenario.zero_grad_set_to_none)
        _microbatches(scenario, adapter, at_forward, rank, step, world_size, device, process_group)
        TRACER.phase("record", step)
        clock.enter("record")
        # The contract asks for dense copies (Adapter.gradients makes them); a sparse one
        # from a candidate of the user's own is densified here rather than left to fail
        # the checks.
        grads = {n: g.to_dense() if g is not None and g.is_sparse else g
                 for n, g in adapter.gradients().items()}
        TRACER.phase("optimizer", step)
        clock.enter("steps")
        adapter.step()
        if spec.after_step is not None:
            spec.after_step(module, step)
        TRACER.phase("record", step)
        clock.enter("record")
        at_forward.settle()
        record.steps.append(StepRecord(grads, adapter.parameters(), adapter.buffers(),
                                       list(at_forward.taken)))
        at_forward.taken.clear()
    clock.enter("steps")


def _microbatches(scenario: Scenario, adapter: Adapter, at_forward: BuffersAtForward, rank: int,
                  step: int, world_size: int, device: torch.device, process_group: Any) -> None:
    """One step's forwards and backwards through the candidate: the forward that raises
    inside ``no_sync`` (``raise_in_no_sync``), then each microbatch's forwards and backward
    in its sync context (``no_sync``, nested ``no_sync``, or the sync strategy's)."""
    last = scenario.microbatches - 1
    if scenario.raise_in_no_sync:  # a forward that raises inside no_sync, caught
        TRACER.phase("forward", step, 0)
        mark = len(at_forward.taken)
        raise_in_no_sync(scenario, adapter.no_sync, at_forward.forward(adapter), rank, step,
                         world_size, device)
        del at_forward.taken[mark:]  # the raised forward is none of the step's forwards
    # NESTED_NO_SYNC: one no_sync() around all but the last microbatch, and a second,
    # nested one around every other microbatch inside it.
    outer = contextlib.ExitStack()
    for mb in range(scenario.microbatches):
        nested = scenario.accumulate is Accumulate.NESTED_NO_SYNC and mb < last
        if nested and mb == 0:
            outer.enter_context(adapter.no_sync())
        if scenario.sync_strategy is not None:
            sync = adapter.sync_context(mb == last, scenario.sync_strategy)
        elif nested:
            sync = adapter.no_sync() if mb % 2 == 0 else contextlib.nullcontext()
        else:
            sync = contextlib.nullcontext() if synced(scenario, mb) else adapter.no_sync()
        with sync:
            TRACER.phase("forward", step, mb)
            loss = _microbatch_loss(scenario, at_forward.forward(adapter), rank, step, mb,
                                    world_size, device)
            TRACER.phase("backward", step, mb)
            backward_passes(scenario, loss, adapter.backward, adapter.backward_retaining)
            if scenario.barrier_after_backward:
                import torch.distributed as dist

                dist.barrier(group=process_group)
        if mb == last - 1:
            outer.close()


def _microbatch_loss(scenario: Scenario, forward: Any, rank: int, step: int, mb: int,
                     world_size: int, device: torch.device) -> Any:
    """The loss of microbatch ``mb``'s forwards through the candidate
    (:func:`~ddp_conformance.script.forwards.training_loss`)."""
    return training_loss(range(scenario.forwards),
                         lambda f: batch(scenario, rank, step, mb, world_size, device, f),
                         lambda f: seed_forward(scenario, rank, step, mb, f),
                         lambda: forward_context(scenario, device), forward,
                         get_model(scenario.model).loss)


def _eval_forward(scenario: Scenario, adapter: Adapter, forward: Any, rank: int, step: int,
                  world_size: int, device: torch.device) -> None:
    """A validation forward through the candidate: ``eval()`` mode, ``torch.no_grad()``
    (DDP then neither prepares a backward nor, at the next forward, broadcasts buffers)."""
    inputs, _ = batch(scenario, rank, step, -1, world_size, device)
    seed_forward(scenario, rank, step, -1)
    adapter.train(False)
    try:
        with torch.no_grad():
            forward(*inputs)
    finally:
        adapter.train(True)


def _unknowable(candidate: Candidate) -> frozenset[str]:
    """Features a factory function may have once called: assume them until wrapped."""
    if not candidate.late_capabilities:
        return frozenset()
    return frozenset(c.value for c in Capability)
