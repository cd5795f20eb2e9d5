"""Under ``--no-trace`` a hang is still diagnosed within seconds, from the ranks' stacks.

No flight recorder runs without the trace; :class:`~ddp_conformance.ranks.stack_watch.
StackWatch` ends a job whose live ranks all sit idle inside torch (a collective, the
reducer) at the same frames on two looks. Real ranks, 60 s deadline: each hang must end
well before it, and a rank that merely sleeps in its own code is no hang.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.config import RunConfig
from ddp_conformance.judge.verdict import Verdict
from ddp_conformance.ranks.stack_watch import blocked_in
from ddp_conformance.runner import Runner

from .deadlines import deadline

CATALOG = {s.id: s for s in load_catalog()}
NEWCOMER = "tests.newcomers:NewcomerDDP"
HANGS = [("errors/mismatched-models", NEWCOMER),
         ("unused/used-on-some-ranks", NEWCOMER)]


@pytest.fixture(scope="module")
def untraced() -> Iterator[Runner]:
    with Runner(RunConfig(candidates=[c for _, c in HANGS] + ["tests.newcomers:SlowRank1"],
                          timeout_s=60.0, trace=False)) as r:
        yield r


@pytest.mark.parametrize(("scenario", "candidate"), HANGS)
def test_a_hang_without_the_trace_ends_in_seconds_with_every_rank_s_stack(
        untraced: Runner, scenario: str, candidate: str) -> None:
    result = untraced.run_case(CATALOG[scenario], candidate)
    assert result.verdict is Verdict.TIMEOUT, (result.verdict, result.reason)
    assert "--no-trace" in result.reason and "waited inside torch" in result.reason
    assert result.duration_s < min(deadline(20), 50), result.duration_s
    assert result.stacks, "each waiting rank's stack is the evidence"


def test_a_rank_sleeping_in_its_own_code_is_no_hang(untraced: Runner) -> None:
    result = untraced.run_case(CATALOG["gradients/mlp-sgd"], "tests.newcomers:SlowRank1")
    assert result.verdict is Verdict.PASS, result.reason


def test_only_a_wait_inside_torch_counts() -> None:
    torch_wait = ('Current thread 0x1 (most recent call first):\n'
                  '  File "/x/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
                  '  File "/y/my_ddp.py", line 10 in step\n')
    user_sleep = ('Current thread 0x1 (most recent call first):\n'
                  '  File "/y/my_ddp.py", line 12 in slow\n')
    assert blocked_in(torch_wait) is not None and "all_reduce" in str(blocked_in(torch_wait))
    assert blocked_in(user_sleep) is None
