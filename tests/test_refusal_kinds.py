"""Two kinds of refusal (issue 27.1), options taken through ``**kwargs``, and the
scenarios reading real DDPs showed missing (27.6).

- An API contract (``Scenario.expect_error``): every rank raises a clear error; torch's
  text only under ``--strict-messages``.
- A limit of torch's implementation (``Scenario.torch_limit``): a candidate refuses like
  torch (every rank) or goes on and is judged on its values: a DDP that reduces every
  gradient after backward passes where the ranks agree on which gradients exist, and
  fails where they do not (experts differ per rank).
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.config import RunConfig
from ddp_conformance.contract.capability import DDP_OPTIONS, Capability
from ddp_conformance.contract.ddp_like import (
    _accepted_options,
    kwargs_only_options,
    kwargs_only_remark,
)
from ddp_conformance.judge.checks.expected_error import clear
from ddp_conformance.judge.verdict import Verdict
from ddp_conformance.runner import Runner
from tests.judge.world import make_world

from . import beyond_torch

CATALOG = {s.id: s for s in load_catalog()}
MODULE = "tests.beyond_torch:"
AFTER_BACKWARD = MODULE + "ReducesAfterBackward"
AGREES = MODULE + "AgreesOnUnused"
LEFT_OFF = MODULE + "NoSyncLeftOffAfterError"
FLOAT32_ONLY = MODULE + "ReducesFloat32Only"
SECOND_BACKWARD = MODULE + "RaisesOnSecondBackward"
SWALLOWS = MODULE + "swallows_find_unused"
VIEWS = MODULE + "ViewsEveryGradient"
#: The scenarios of torch's implementation limits that issue 27 names.
TORCH_LIMITS = ("errors/unused-without-find-unused", "errors/output-left-out-of-loss",
                "real/moe-without-find-unused", "real/moe-static-graph",
                "real/freeze-mid-run-without-find-unused",
                "procedures/checkpoint-reentrant-find-unused", "values/late-use-default",
                "values/late-use-static-graph", "surface/copy-on-a-subgroup")
#: API contracts: refusing is the behaviour.
CONTRACTS = ("errors/comm-hook-registered-twice", "errors/mismatched-models")
READ_IN_DDPS = ("values/bfloat16-beside-float32", "values/float16-first-bucket",
                "values/float16-first-bucket-tiny-cap", "procedures/backward-twice-retain-graph",
                "no-sync/exception-inside", "no-sync/exception-inside-window")


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    with Runner(RunConfig(candidates=["torch", "reference", AFTER_BACKWARD, AGREES, LEFT_OFF,
                                      FLOAT32_ONLY, SECOND_BACKWARD, SWALLOWS, VIEWS],
                          timeout_s=60.0)) as r:
        yield r


# --- the catalog states which kind each refusal is ----------------------------------------------


def test_torch_limits_are_marked_as_such_and_contracts_stay_expected_errors() -> None:
    assert all(CATALOG[i].torch_limit and CATALOG[i].expect_error is None for i in TORCH_LIMITS)
    assert all(CATALOG[i].expect_error and CATALOG[i].torch_limit is None for i in CONTRACTS)


def test_a_clear_error_has_a_message() -> None:
    assert clear("RuntimeError: Expected to have finished reduction")
    assert not clear("AssertionError: ") and not clear("KeyError")


# --- the judge, on hand-built records -----------------------------------------------------------

LIMIT = Scenario("judge/limit", "mlp", torch_limit=r"RuntimeError: .*boom")
CONTRACT = Scenario("judge/contract", "mlp", expect_error=r"RuntimeError: .*boom")


def test_a_contract_demands_a_clear_error_on_every_rank_and_torch_text_only_when_strict() -> None:
    world = make_world(CONTRACT)
    world.records[0].raised = "RuntimeError: boom"
    world.records[1].raised = "ValueError: the candidate's own words"
    assert world.failed() == set()
    world.strict_messages = True
    assert world.failed() == {"expected_error"}
    world.strict_messages = False
    world.records[1].raised = "AssertionError: "
    assert world.failed() == {"expected_error"}
    assert "without a message" in world.messages("expected_error")[0]
    world.records[1].raised = ""
    assert world.failed() == {"expected_error"}
    assert "without raising" in world.messages("expected_error")[0]


def test_at_a_torch_limit_a_refusal_on_every_rank_passes_and_on_some_ranks_fails() -> None:
    world = make_world(LIMIT)
    for rec in world.records.values():
        rec.raised = "RuntimeError: its own words"
    world.judge()
    assert world.evidence.failures == [] and "oracle.grad" not in world.evidence.checks
    world.strict_messages = True  # --strict-messages: torch's text for a refusal too
    assert world.failed() == {"expected_error"}
    world.strict_messages = False
    world.records[1].raised = ""
    assert world.failed() == {"expected_error"}
    assert "went on while other ranks refused" in world.messages("expected_error")[0]


def test_at_a_torch_limit_going_on_is_judged_on_values() -> None:
    world = make_world(LIMIT)
    world.judge()
    assert world.evidence.failures == [] and "oracle.grad" in world.evidence.checks
    g = world.oracle.steps[0].grads["w"]
    assert g is not None
    g += 1.0
    assert "oracle.grad" in world.failed()


# --- options taken only through **kwargs ---------------------------------------------------------


def test_options_taken_only_through_kwargs_are_granted_and_named() -> None:
    accepted, _ = _accepted_options(beyond_torch.swallows_find_unused)
    assert {Capability.option(o) for o in DDP_OPTIONS} <= accepted
    assert kwargs_only_options(accepted, ["find_unused_parameters"]) == ["find_unused_parameters"]
    assert kwargs_only_remark(accepted, {"find_unused_parameters": True}) == \
        "option find_unused_parameters was taken only through **kwargs"
    named, _ = _accepted_options(beyond_torch.ReducesAfterBackward)
    assert kwargs_only_options(named, ["find_unused_parameters"]) == []
    assert Capability.option("bucket_cap_mb") not in named


def test_a_verdict_caused_by_a_swallowed_option_names_it(runner: Runner) -> None:
    result = runner.run_case(CATALOG["unused/used-on-some-ranks"], SWALLOWS)
    assert result.verdict in (Verdict.ERROR, Verdict.FAIL)
    assert "option find_unused_parameters was taken only through **kwargs" in \
        result.summary_line()
    assert runner.run_case(CATALOG["unused/used-on-some-ranks"], "torch").verdict is Verdict.PASS


# --- real processes: torch refuses, a DDP reducing after backward goes on -----------------------


@pytest.mark.parametrize("scenario_id", ["errors/unused-without-find-unused",
                                         "errors/output-left-out-of-loss"])
def test_reducing_every_gradient_after_backward_passes_beyond_torch(runner: Runner,
                                                                    scenario_id: str) -> None:
    beyond = runner.run_case(CATALOG[scenario_id], AFTER_BACKWARD)
    assert beyond.verdict is Verdict.PASS, (beyond.reason, beyond.failures[:2])
    assert "oracle.grad" in beyond.checks_run
    assert any(n.startswith("beyond torch") for n in beyond.notes), beyond.notes
    torch_result = runner.run_case(CATALOG[scenario_id], "torch")
    assert torch_result.verdict is Verdict.PASS
    assert any(n.startswith("refused, like torch") for n in torch_result.notes)


def test_a_bug_raising_inside_the_candidate_s_hook_is_no_refusal(runner: Runner) -> None:
    """At a torch limit (a parameter unused without find_unused_parameters), a hook that
    crashes on the missing gradient raises on every rank: an ERROR naming its own line,
    not "refused, like torch"."""
    result = runner.run_case(CATALOG["errors/unused-without-find-unused"], VIEWS)
    assert result.verdict is Verdict.ERROR, (result.verdict, result.notes)
    assert "AttributeError" in result.reason and "'NoneType'" in result.reason
    assert not any(n.startswith("refused, like torch") for n in result.notes)
    assert "beyond_torch.py" in "\n".join(result.tracebacks.values())


def test_incidental_exceptions_are_told_from_refusals() -> None:
    from ddp_conformance.contract.refusal import CannotJudge, incidental

    # An adapter saying its run is not what it claims (compiled nothing) refuses nothing.
    assert incidental(CannotJudge("torch-compile: dynamo compiled no graph"))

    assert incidental(AttributeError("'NoneType' object has no attribute 'view'"))
    assert incidental(KeyError("w")) and incidental(IndexError("list index out of range"))
    assert incidental(TypeError("'NoneType' object is not subscriptable"))
    assert not incidental(RuntimeError("Expected to have finished reduction in the prior "
                                       "iteration before starting a new one"))
    assert incidental(TypeError("cannot pickle 'ProcessGroup' object"))
    assert not incidental(TypeError("expected a dist.GradBucket, got a Tensor"))
    assert not incidental(ValueError("bucket annotation should be dist.GradBucket"))


def test_experts_that_differ_per_rank_fail_a_ddp_reducing_only_what_it_has(runner: Runner) -> None:
    scenario = CATALOG["real/moe-without-find-unused"]
    result = runner.run_case(scenario, AFTER_BACKWARD)
    assert result.verdict is Verdict.FAIL
    assert "oracle.grad_none" in {f.check for f in result.failures}
    # Agreeing on which gradients exist anywhere (find_unused_parameters' semantics) is
    # what the oracle computes: a DDP doing it passes beyond torch.
    agreed = runner.run_case(scenario, AGREES)
    assert agreed.verdict is Verdict.PASS, agreed.failures[:2]
    assert any(n.startswith("beyond torch") for n in agreed.notes)


# --- 27.6: what reading real DDPs found ----------------------------------------------------------


@pytest.mark.parametrize("scenario_id", READ_IN_DDPS)
def test_torch_and_the_reference_pass_the_scenarios_read_in_ddps(runner: Runner,
                                                                 scenario_id: str) -> None:
    for candidate in ("torch", "reference"):
        result = runner.run_case(CATALOG[scenario_id], candidate)
        assert result.verdict is Verdict.PASS, (candidate, result.reason, result.failures[:2])


@pytest.mark.parametrize("scenario_id", ["no-sync/exception-inside",
                                         "no-sync/exception-inside-window"])
def test_sync_left_off_after_an_exception_inside_no_sync_fails(runner: Runner,
                                                               scenario_id: str) -> None:
    result = runner.run_case(CATALOG[scenario_id], LEFT_OFF)
    assert result.verdict is Verdict.FAIL
    # The gradients it left unsynced differ from the oracle's at the first step. Nothing
    # went through the traced group, which cannot tell that from a DDP reducing through a
    # group of its own: the trace claims nothing ("not applied"), the values say it.
    assert any(f.check == "oracle.grad" and f.step == 0 for f in result.failures)
    assert not any(f.check == "trace.reduced_once" for f in result.failures)
    assert any("trace.reduced_once not applied" in n for n in result.notes), result.notes


@pytest.mark.parametrize(("scenario_id", "layer"), [("values/bfloat16-beside-float32", "inp"),
                                                   ("values/float16-first-bucket", "out")])
def test_parameters_of_another_dtype_left_unreduced_fail(runner: Runner, scenario_id: str,
                                                         layer: str) -> None:
    result = runner.run_case(CATALOG[scenario_id], FLOAT32_ONLY)
    assert result.verdict is Verdict.FAIL
    at_step_0 = {f.name for f in result.figures
                 if f.check == "oracle.grad" and f.step == 0 and not f.passed}
    assert at_step_0 == {f"{layer}.weight", f"{layer}.bias"}


def test_a_ddp_refusing_a_second_backward_fails_retain_graph(runner: Runner) -> None:
    result = runner.run_case(CATALOG["procedures/backward-twice-retain-graph"], SECOND_BACKWARD)
    assert result.verdict is Verdict.ERROR
    assert "already reduced" in result.summary_line() + str(result.tracebacks)


def test_strict_messages_is_one_option_of_both_routes() -> None:
    import argparse

    from ddp_conformance.options import CLI, PYTEST, add_to_argparse, options_for, run_config

    parser = argparse.ArgumentParser()
    add_to_argparse(parser)
    for argv, want in (([], False), (["--strict-messages"], True),
                       (["--ddp-strict-messages"], True)):
        values = vars(parser.parse_args(argv))
        assert run_config(values.get, CLI).strict_messages is want
    assert "strict-messages" in {o.name for o in options_for(PYTEST)}
