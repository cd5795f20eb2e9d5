"""A reproducer's entry point: every rank joins the logged Gloo groups, computes the
single-process result, trains with the candidate (or torch's DDP: ``--ddp torch``) and
checks; rank 0 says PASS, or a rank raises ``AssertionError`` with the evidence (FAIL).
A rank whose collective gave up (the short deadline, a peer gone) says which collective
it was in."""
from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_conformance.script.case import Case, procedure
from ddp_conformance.script.checks import check_expected_error, check_replicas
from ddp_conformance.script.logging_group import (
    TRACE,
    LoggingGroup,
    collective_timeout_s,
    report_on_termination,
)
from ddp_conformance.script.single_process import single_process
from ddp_conformance.script.trace_check import check_collectives
from ddp_conformance.script.training import Rank, Record, train


def ddp_under_test(candidate: tuple[str, str], argv: list[str]) -> Any:
    """torch's DDP with ``--ddp torch``, else the candidate (module, attribute), imported
    from the current directory as ``python -m`` would."""
    if "--ddp" in argv[:-1] and argv[argv.index("--ddp") + 1] == "torch":
        return torch.nn.parallel.DistributedDataParallel
    sys.path.insert(0, os.getcwd())
    found: Any = importlib.import_module(candidate[0])
    for part in candidate[1].split("."):
        found = getattr(found, part)
    return found


def my_group(case: Case, rank: int, timeout: timedelta) -> tuple[Any, list[int]]:
    """This rank's DDP group and its global ranks (None, []: in no group). Every rank
    creates every group (new_group is collective), with the script's deadline."""
    if case.groups is None:
        return dist.group.WORLD, list(range(case.world_size))
    group, members = None, []
    for ranks in case.groups:
        created = dist.new_group(ranks, timeout=timeout)
        if rank in ranks:
            group, members = created, ranks
    return group, members


def run_rank(me: Rank, ddp_class: Any, comm_hook: Any,
             reduce_by_hand: Callable[[nn.Module], None]) -> None:
    """One rank of a DDP group: the single-process result (where compared), training, the
    checks."""
    case = me.case
    record = Record()
    if case.expect_error is not None:  # nothing is compared: no single-process result
        raised = None
        try:
            train(me, ddp_class, None, record, comm_hook, reduce_by_hand)
        except Exception as error:
            raised = f"{type(error).__name__}: {error}"
        check_expected_error(case, me.rank, raised, len(record.params))
        return
    want = single_process(procedure(case, me.spec, me.members), me.members) \
        if case.oracle_checks else None
    train(me, ddp_class, want, record, comm_hook, reduce_by_hand)
    if case.trace_checks and want is not None:
        check_collectives(case, me.rank, TRACE.log, want, len(record.params))
    if case.replica_checks and want is not None:
        check_replicas(case, me.rank, me.group, me.members, record, want)


def main(case: Case, spec: Any, candidate: tuple[str, str], comm_hook: Any,
         reduce_by_hand: Callable[[nn.Module], None], argv: list[str]) -> None:
    """The reproducer, on this rank (torchrun's environment)."""
    ddp_class = ddp_under_test(candidate, argv)
    report_on_termination(int(os.environ.get("RANK", "0")))  # before Gloo's threads
    timeout = timedelta(seconds=collective_timeout_s(argv, dict(os.environ)))
    dist.Backend.register_backend("logged_gloo", LoggingGroup.create, extended_api=True,
                                  devices=["cpu"])
    dist.init_process_group("logged_gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == case.world_size, f"written for {case.world_size} ranks, run with {world}"
    torch.set_num_threads(1)  # the single-process result then computes as the ranks do
    if case.trace_checks and case.trace_volume:
        TRACE.memory = True
    group, members = my_group(case, rank, timeout)
    if group is None:
        print(f"rank {rank} is in no DDP group: idle", flush=True)
    else:
        run_rank(Rank(case, spec, rank, group, members), ddp_class, comm_hook, reduce_by_hand)
    dist.barrier()
    if rank == 0:
        who = "torch" if ddp_class is torch.nn.parallel.DistributedDataParallel else "the candidate"
        what = ("raises the expected error" if case.expect_error is not None
                else "matches the single-process result" if case.oracle_checks
                else "runs the case to its end")
        print(f"PASS: {who} {what}")
    dist.destroy_process_group()


def run(case: Case, spec: Any, candidate: tuple[str, str], comm_hook: Any,
        reduce_by_hand: Callable[[nn.Module], None]) -> None:
    """:func:`main` with this process's arguments; a failed check's evidence, or the
    collective a rank gave up in, on stderr before the exception propagates."""
    try:
        main(case, spec, candidate, comm_hook, reduce_by_hand, sys.argv)
    except AssertionError as failure:  # the evidence, flushed before the peers go
        print(f"FAIL: {failure}", file=sys.stderr, flush=True)
        raise
    except (dist.DistError, RuntimeError) as error:
        rank = os.environ.get("RANK", "?")
        first = (str(error).strip().splitlines() or [""])[0][:300]
        print(f"rank {rank} gave up {TRACE.waiting()} ({type(error).__name__}: {first})",
              file=sys.stderr, flush=True)
        raise
