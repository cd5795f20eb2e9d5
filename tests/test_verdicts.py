"""Each kind of broken DDP gets its verdict, with evidence naming the rank and the check."""
from __future__ import annotations

import re

import pytest

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.judge.verdict import Verdict
from ddp_conformance.runner import Runner

from .conftest import DEFECTIVE

CATALOG = {s.id: s for s in load_catalog()}
NEWCOMER = "tests.newcomers:NewcomerDDP"


def scenario(scenario_id: str) -> Scenario:
    return CATALOG[scenario_id]


def torch_defects() -> set[str]:
    """The scenarios torch's own defects fail (builtins/expectations/torch.txt, each shown
    by a standalone script in tests/standalone/)."""
    from ddp_conformance.builtins._common import expectations_file

    path = expectations_file("torch")
    assert path is not None
    with open(path, encoding="utf-8") as f:
        return {line.split("[torch]")[0].strip() for line in f if "[torch]" in line
                and not line.startswith("#")}


def test_torch_ddp_passes_the_catalog(runner: Runner) -> None:
    verdicts = {s.id: runner.run_case(s, "torch") for s in CATALOG.values()}
    # Everything passes but what is defined for other world sizes (process groups), and
    # torch's own defects are expected failures.
    assert {k: r.verdict for k, r in verdicts.items() if r.verdict is not Verdict.PASS and
            not (r.verdict is Verdict.NA and ("defined for world size" in r.reason
                                               or "needs backend" in r.reason
                                               or "a slow scenario" in r.reason))
            and not (r.verdict is Verdict.XFAIL and k in torch_defects())} == {}
    assert {k for k, r in verdicts.items() if r.verdict is Verdict.XFAIL} == torch_defects()


def test_summing_without_dividing_fails_the_oracle_gradient_check(runner: Runner) -> None:
    result = runner.run_case(scenario("gradients/mlp-sgd-momentum"),
                             DEFECTIVE + "SumsWithoutDividing")
    assert result.verdict is Verdict.FAIL
    first = result.failures[0]
    assert first.check == "oracle.grad" and first.step == 0 and first.rank == 0
    assert first.name == "0.weight"
    # At step 0 the candidate's gradient is exactly twice the oracle's: relative error 1.
    bad = [f for f in result.figures if f.check == "oracle.grad" and f.step == 0]
    assert bad and all(abs(f.max_rel - 1.0) < 1e-6 for f in bad)


def test_exact_scenario_fails_bitwise(runner: Runner) -> None:
    result = runner.run_case(scenario("gradients/exact-dyadic"), DEFECTIVE + "SumsWithoutDividing")
    assert result.verdict is Verdict.FAIL
    assert "bitwise" in result.failures[0].message


def test_never_broadcasting_buffers_fails_the_broadcast_check_on_rank_1(runner: Runner) -> None:
    result = runner.run_case(scenario("buffers/conv-bn-broadcast"),
                             DEFECTIVE + "NeverBroadcastsBuffers")
    assert result.verdict is Verdict.FAIL
    broadcast = [f for f in result.failures if f.check == "replica.buffer_broadcast"]
    assert broadcast, [f.message for f in result.failures]
    # Buffers first differ after rank-local updates: at step 1, on rank 1.
    assert (broadcast[0].step, broadcast[0].rank) == (1, 1)
    assert broadcast[0].name is not None and broadcast[0].name.startswith("bn.running_")
    # Without broadcast_buffers the same candidate is right.
    assert runner.run_case(scenario("buffers/conv-bn-no-broadcast"),
                           DEFECTIVE + "NeverBroadcastsBuffers").verdict is Verdict.PASS


def test_a_join_hook_that_shadows_nothing_is_a_desync_with_stacks(runner: Runner) -> None:
    """Rank 0 waits in a traced allreduce that rank 1, looping in Join's own group, never
    issues: diagnosed from the streams and rank 1's stack, before the deadline. (The
    candidate's ``dist.new_group(backend="gloo")`` is traced like every group it creates, so
    rank 1's wait is named by its group and phase.)"""
    result = runner.run_case(scenario("join/uneven-divide-by-initial"),
                             DEFECTIVE + "JoinHookDoesNotShadow")
    assert result.verdict is Verdict.TIMEOUT
    assert result.reason.startswith("desync: rank 0 waits in allreduce(")
    assert "rank 1 waits in allreduce(" in result.reason and "(step 3, join)" in result.reason
    assert result.duration_s < runner.config.timeout_s, "diagnosed, not timed out"
    assert ">>" in result.desync and "[waits]" in result.desync
    assert set(result.stacks) == {0, 1}
    assert "all_reduce" in result.stacks[1]
    # The pool recovered: the next case runs normally.
    assert runner.run_case(scenario("gradients/mlp-adam"), "torch").verdict is Verdict.PASS


def test_a_constructor_broadcast_against_a_gradient_allreduce_is_a_desync(runner: Runner) -> None:
    """The newcomer's DDP: rank 1 broadcasts weights in its constructor while rank 0 is in a
    gradient allreduce (the models differ): the mismatch is named at its sequence number."""
    result = runner.run_case(scenario("errors/mismatched-models"), NEWCOMER)
    assert result.verdict is Verdict.TIMEOUT
    assert "rank 0 waits in allreduce(" in result.reason and "(step 0, " in result.reason
    assert "rank 1 waits in broadcast(" in result.reason and "(wrap)" in result.reason
    assert "the streams differ first at #" in result.reason
    assert result.duration_s < runner.config.timeout_s, "diagnosed, not timed out"


def test_a_rank_that_finished_while_its_peer_waits_is_a_desync(runner: Runner) -> None:
    """A parameter unused on rank 1: the newcomer's rank 1 issues one allreduce fewer and
    finishes the job, while rank 0 waits in it."""
    result = runner.run_case(scenario("unused/used-on-some-ranks"), NEWCOMER)
    assert result.verdict is Verdict.TIMEOUT
    assert "rank 1 never issued #" in result.reason and "it finished the job" in result.reason
    assert set(result.stacks) == {0}


def test_a_slow_case_is_not_a_desync(runner: Runner) -> None:
    """Rank 1 sleeps before its first allreduce while rank 0 waits in it: merely slow."""
    result = runner.run_case(scenario("gradients/mlp-sgd"), "tests.newcomers:SlowRank1")
    assert result.verdict is Verdict.PASS, result.reason


def test_a_rank_exiting_mid_step_is_a_crash_naming_it(runner: Runner) -> None:
    result = runner.run_case(scenario("gradients/mlp-adam"), DEFECTIVE + "ExitsMidStep")
    assert result.verdict is Verdict.CRASH
    assert result.exit_codes == {1: 3}
    assert result.reason == "rank 1 died with exit code 3"
    assert runner.run_case(scenario("gradients/mlp-adam"), "torch").verdict is Verdict.PASS


def test_a_rank_killed_by_a_signal_is_a_crash_with_its_python_stack(runner: Runner) -> None:
    result = runner.run_case(scenario("gradients/mlp-adam"), DEFECTIVE + "SegfaultsMidStep")
    assert result.verdict is Verdict.CRASH
    # The signal first; then where the candidate was (its own file:line) and the rank's last words.
    assert result.reason.startswith("rank 1 died with signal SIGSEGV (11) at tests/defective.py:")
    # faulthandler's dump at the fatal signal: where in the candidate the rank died.
    assert "Fatal Python error: Segmentation fault" in result.stacks[1]
    assert "defective.py" in result.stacks[1] and "in forward" in result.stacks[1]
    assert runner.run_case(scenario("gradients/mlp-adam"), "torch").verdict is Verdict.PASS


def test_a_rank_raising_is_an_error_with_its_traceback(runner: Runner) -> None:
    result = runner.run_case(scenario("gradients/mlp-adam"), DEFECTIVE + "RaisesOnRank1")
    assert result.verdict is Verdict.ERROR
    # What it raised, then where in the candidate's own code.
    assert re.fullmatch(r"rank 1 raised RuntimeError: defective candidate: rank 1 gives up "
                        r"at tests/defective\.py:\d+ in fail", result.reason), result.reason
    assert "defective.py" in result.tracebacks[1]
    assert result.duration_s < 6.0, "rank 0 must be released, not left to the Gloo timeout"


@pytest.mark.parametrize("scenario_id, missing", [
    ("no-sync/window-of-3", "no_sync"),
    ("join/uneven-divide-by-active", "join"),
])
def test_missing_capabilities_are_not_applicable(runner: Runner, scenario_id: str,
                                                 missing: str) -> None:
    result = runner.run_case(scenario(scenario_id), "tests.limited:ForwardOnly")
    assert result.verdict is Verdict.NA
    assert missing in result.reason
    # What it has, it is judged on.
    assert runner.run_case(scenario("gradients/mlp-adam"),
                           "tests.limited:ForwardOnly").verdict is Verdict.PASS


def test_a_factory_function_is_judged_after_wrapping(runner: Runner) -> None:
    """A callable that is not a class: its features are read from the module it returns."""
    for sid in ("no-sync/window-of-3", "join/uneven-divide-by-initial"):
        assert runner.run_case(scenario(sid), "tests.limited:torch_ddp_factory").verdict \
            is Verdict.PASS


def test_an_option_the_candidate_does_not_accept_is_not_applicable(runner: Runner) -> None:
    # ForwardOnly accepts broadcast_buffers but not gradient_as_bucket_view.
    s = Scenario("t/bucket-view", "mlp", ddp_options={"gradient_as_bucket_view": True})
    result = runner.run_case(s, "tests.limited:ForwardOnly")
    assert result.verdict is Verdict.NA
    assert "option:gradient_as_bucket_view" in result.reason
