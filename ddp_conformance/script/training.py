"""A reproducer's ranks: train the case with a DDP-like class, the way the harness's
engine (``ranks/engine.py``) drives a DDP-like candidate, checking each step as it goes.

Per step a rank calls the model's ``before_step``, runs the eval forward (inner module in
``eval()``, ``torch.no_grad()``, through the DDP wrapper), ``zero_grad``, then per
microbatch its forwards (:func:`~.forwards.training_loss`) and one backward, inside
``no_sync`` or Composer's sync strategy where the case says; under Join
(``Join([ddp] + [the optimizer if Joinable], ...)``) for its own number of steps.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ddp_conformance.script.case import Case, batch, build, forward_context, make_optimizer, seed_forward
from ddp_conformance.script.checks import check_init, check_step
from ddp_conformance.script.forwards import training_loss
from ddp_conformance.script.logging_group import TRACE
from ddp_conformance.script.single_process import OracleRecord, Tensors, clone


@dataclass
class Rank:
    """One rank of a reproducer: the case, the model's ``ModelSpec``, this rank, its DDP
    group and the group's global ranks."""

    case: Case
    spec: Any
    rank: int
    group: Any
    members: list[int]


@dataclass
class Record:
    """What one rank did: its steps' parameters and buffers at each forward, for the
    replica checks after training."""

    params: list[Tensors] = field(default_factory=list)
    at_forward: list[list[Tensors]] = field(default_factory=list)
    final_params: Tensors = field(default_factory=dict)
    final_buffers: Tensors = field(default_factory=dict)


def join_context(case: Case, model: nn.Module, opt: Any) -> AbstractContextManager[Any]:
    """Join over the DDP module and, when it is joinable, the optimizer (ZeRO)."""
    if case.join is None:
        return nullcontext()
    from torch.distributed.algorithms.join import Join, Joinable

    joinables: list[Any] = [model] + ([opt] if isinstance(opt, Joinable) else [])
    return Join(joinables, **case.join)


@contextmanager
def sync_context(case: Case, model: Any, mb: int,
                 reduce_by_hand: Callable[[nn.Module], None]) -> Iterator[None]:
    """Around one microbatch's forward and backward: no_sync where the case says, or
    Composer's sync strategy (its ddp_sync_context; ``forced_sync`` reduces by hand with
    ``reduce_by_hand`` after the last microbatch)."""
    final = mb == case.microbatches - 1
    if case.sync_strategy is None:
        with nullcontext() if case.synced[mb] else model.no_sync():
            yield
    elif case.sync_strategy == "single_auto_sync":
        with nullcontext() if final else model.no_sync():
            yield
    elif case.sync_strategy == "multi_auto_sync":
        yield
    else:  # forced_sync: every microbatch inside no_sync, then a reduction by hand
        try:
            with model.no_sync():
                yield
        finally:
            if final:
                with torch.no_grad():
                    reduce_by_hand(model)


def eval_forward(me: Rank, model: nn.Module, module: nn.Module, step: int) -> None:
    """The validation forward before the step: module.eval(), torch.no_grad(), through
    the DDP wrapper (ranks/engine.py: _eval_forward)."""
    at = (me.rank, step, -1, 0)
    inputs, _ = batch(me.case, me.spec, at, len(me.members))
    seed_forward(me.case, at)
    module.eval()
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        module.train()


def train(me: Rank, ddp_class: Any, want: OracleRecord | None, record: Record,
          comm_hook: Any, reduce_by_hand: Callable[[nn.Module], None]) -> None:
    """Wrap, register the comm hook, train this rank's steps (under Join if asked), and
    compare every step with the single-process result ``want`` as it goes (none for a
    case that expects an error)."""
    case, spec = me.case, me.spec
    module = build(case, spec, me.rank)
    model = ddp_class(module, process_group=me.group, **case.ddp_options)
    opt = make_optimizer(case.optimizer, case.lr, model.parameters())
    if case.comm_hook is not None:
        for _ in range(case.comm_hook_registrations):
            model.register_comm_hook(*comm_hook(me.group))
    if case.init_checks and case.expect_error is None and want is not None:
        check_init(case, me.rank, module, want)
    at_forward: list[Tensors] = []
    if case.buffer_checks or case.replica_checks:  # what they compare
        module.register_forward_pre_hook(
            lambda m, args: at_forward.append(clone(dict(m.named_buffers()))))
    with join_context(case, model, opt):
        for step in range(case.steps_for[me.rank]):
            grads = _step(me, model, module, opt, step, reduce_by_hand)
            TRACE.at("check", step)
            if case.replica_checks or case.trace_checks or case.expect_error is not None:
                record.params.append(clone(dict(module.named_parameters())))  # what they read
                record.at_forward.append(list(at_forward))
            if case.expect_error is None and want is not None:
                check_step(case, me.rank, step, want, grads, at_forward, module, len(me.members))
            at_forward.clear()
        TRACE.at("join", case.steps_for[me.rank])  # Join's exit: shadowing, then the final sync
    TRACE.at("after")
    record.final_params = clone(dict(module.named_parameters()))
    record.final_buffers = clone(dict(module.named_buffers()))


def _step(me: Rank, model: Any, module: nn.Module, opt: Any, step: int,
          reduce_by_hand: Callable[[nn.Module], None]) -> dict[str, Any]:
    """One step: before_step, the eval forward, zero_grad, the microbatches, the
    optimizer step; the synced gradients, read before the optimizer step."""
    case, spec = me.case, me.spec
    if spec.before_step is not None:  # how the model changes between steps
        spec.before_step(module, step)
    if case.evals and case.plan[step] and case.plan[step][0][0] < 0:
        TRACE.at("eval", step)
        eval_forward(me, model, module, step)
    TRACE.at("zero_grad", step)
    opt.zero_grad(set_to_none=case.set_to_none)
    for mb in range(case.microbatches):
        with sync_context(case, model, mb, reduce_by_hand):
            TRACE.at("forward", step, mb)
            loss = _microbatch_loss(me, model, step, mb)
            TRACE.at("backward", step, mb)
            loss.backward()
    TRACE.at("optimizer", step)
    grads = {n: None if p.grad is None else p.grad.detach().to_dense().clone()
             for n, p in module.named_parameters()}
    opt.step()
    if spec.after_step is not None:  # a step undone as soon as it is taken
        spec.after_step(module, step)
    return grads


def _microbatch_loss(me: Rank, model: Any, step: int, mb: int) -> Any:
    """The loss of microbatch ``mb``'s forwards of the plan through the DDP wrapper."""
    case, spec = me.case, me.spec
    return training_loss([f for m, f in case.plan[step] if m == mb],
                         lambda f: batch(case, spec, (me.rank, step, mb, f), len(me.members)),
                         lambda f: seed_forward(case, (me.rank, step, mb, f)),
                         lambda: forward_context(case), model, spec.loss)
