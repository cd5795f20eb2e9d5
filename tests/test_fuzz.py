"""``ddp-conformance fuzz``: generated scenarios, torch-validity, shrinking, the literal."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddp_conformance.catalog.loader import validate
from ddp_conformance.catalog.scenario import Scenario, missing_capabilities
from ddp_conformance.catalog.strategies import (
    DRAWN_FEATURES,
    EXACT_LR,
    RANK_DEPENDENT_USE,
    scenario_literal,
    scenarios,
    swarm,
)
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.errors import UsageError
from ddp_conformance.fuzz import Fuzzer, parse_duration
from ddp_conformance.judge.verdict import Result, Verdict
from tests.deadlines import deadline

ROOT = Path(__file__).resolve().parent.parent


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_generated_scenarios_are_valid_and_their_literal_rebuilds_them(data: st.DataObject) -> None:
    world_size = data.draw(st.integers(1, 4))
    scenario = data.draw(scenarios(world_size))
    validate(scenario)  # the loader's checks: a known model
    namespace: dict[str, object] = {}
    exec("from ddp_conformance import Scenario, JoinSpec", namespace)  # noqa: S102
    rebuilt = eval(scenario_literal(scenario), namespace)  # noqa: S307 - the literal under test
    assert rebuilt == scenario
    if scenario.join is not None:
        assert world_size > 1 and scenario.microbatches == 1
    if scenario.model in EXACT_LR:
        assert scenario.exact and scenario.optimizer.value == "sgd" and scenario.rtol is None
    if scenario.model in RANK_DEPENDENT_USE:
        assert scenario.sync_strategy != "forced_sync", "Composer's forced_sync desyncs on it"
    if scenario.rtol is not None:
        assert scenario.autocast is None, "a lossy hook under autocast: chaotic trajectories"
    if scenario.model == "composed" and "float16" in scenario.model_kwargs["blocks"]:
        assert scenario.optimizer.value != "adam", "Adam's eps is 0 in a float16 parameter"


#: A plain hand-written DDP: the constructor's first arguments, nothing else.
PLAIN: frozenset[str] = frozenset()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_scenarios_drawn_for_a_candidate_use_only_what_it_has(data: st.DataObject) -> None:
    """The generator draws for the candidate in hand: nothing it lacks, so no N/A (a plain
    DDP, a random half of torch's features), at the world size drawn for."""
    world_size = data.draw(st.integers(1, 4))
    capabilities = data.draw(st.sampled_from([PLAIN, swarm(None, random.Random(
        data.draw(st.integers(0, 99))))]))
    scenario = data.draw(scenarios(world_size, capabilities))
    validate(scenario)
    assert missing_capabilities(scenario, capabilities) == "", scenario
    assert scenario.unsupported_world_size(world_size) == ""


def test_what_a_plain_ddp_lacks_is_said_once() -> None:
    session = _Session("")
    session.runner.candidates = {"plain": Candidate("plain", wrap=lambda *a, **k: None,  # type: ignore[arg-type,return-value]
                                                  capabilities=PLAIN)}
    lines: list[str] = []
    run = Fuzzer(session, "plain", budget_s=2, seed=0,  # type: ignore[arg-type]
                 progress=lines.append).run()
    said = [line for line in lines if "not drawn" in line]
    assert len(said) == 1 and "no_sync" in said[0] and "join" in said[0], lines
    assert "unused_on_rank1" in said[0]  # a model that needs find_unused_parameters
    assert all(len(line) <= 120 for line in said[0].splitlines())
    assert run.ran > 0 and run.not_applicable == 0


def test_rounds_draw_seeded_swarms_of_features() -> None:
    """Each round after the first draws a random half of the features, per seed."""
    rounds = {seed: [swarm(None, random.Random(seed * 1_000_003 + r)) for r in range(1, 6)]
              for seed in (0, 1)}
    assert rounds[0] != rounds[1]
    assert all(0 < len(s & DRAWN_FEATURES) < len(DRAWN_FEATURES) for s in rounds[0])


def _draws(seed: int, n: int) -> list[str]:
    """The first ``n`` scenario ids the fuzzer's strategy draws for ``seed``."""
    from hypothesis import find

    seen: list[str] = []

    def note(s: Scenario) -> bool:
        seen.append(s.id)
        return len(seen) >= n

    find(scenarios(2), note, settings=settings(max_examples=n, database=None),
         random=random.Random(seed))
    return seen


def test_the_same_seed_draws_the_same_scenarios() -> None:
    assert _draws(3, 30) == _draws(3, 30)
    assert _draws(3, 30) != _draws(4, 30)


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("5m", 300), ("1.5h", 5400)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5m", "5 minutes", "m"])
def test_bad_durations_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError, match="duration"):
        parse_duration(text)


class _Session:
    """A stand-in for the session: verdicts by rule, no ranks (the loop's logic only)."""

    def __init__(self, fails_when: str, torch_fails_when: str = "") -> None:
        self.config = type("C", (), {"world_size": 2})()
        self.runner = type("R", (), {"candidates": {}})()  # capabilities unknown: everything
        self.fails_when, self.torch_fails_when = fails_when, torch_fails_when
        self.runs: list[tuple[str, str]] = []

    def run_case(self, scenario: Scenario, spec: str) -> Result:
        self.runs.append((scenario.id, spec))
        rule = self.torch_fails_when if spec == "torch" else self.fails_when
        bad = bool(rule) and eval(rule, {"s": scenario})  # noqa: S307 - the test's own rule
        return Result(scenario.id, spec, Verdict.FAIL if bad else Verdict.PASS, 2, "gloo", "cpu")


def test_a_failure_is_shrunk_to_what_it_needs() -> None:
    session = _Session("s.steps >= 2 and s.ddp_options.get('bucket_cap_mb') == 0.0001")
    run = Fuzzer(session, "cand", budget_s=60, seed=1, shrink_budget_s=60).run()  # type: ignore[arg-type]
    assert len(run.findings) == 1
    shrunk = run.findings[0].shrunk
    assert shrunk.steps == 2 and shrunk.ddp_options == {"bucket_cap_mb": 0.0001}
    assert shrunk.model == "mlp" and shrunk.microbatches == 1 and shrunk.comm_hook is None
    # Each scenario ran at most once per candidate.
    assert len(session.runs) == len(set(session.runs))


def test_keep_going_reports_each_failure_once_and_looks_for_others() -> None:
    """A failure found in one round is not found (nor replayed from the cache) again."""
    session = _Session("s.steps >= 2")
    run = Fuzzer(session, "cand", budget_s=8, seed=0, shrink_budget_s=2,  # type: ignore[arg-type]
                 keep_going=True).run()
    assert len(run.findings) >= 2
    shrunk = [f.shrunk.id for f in run.findings]
    assert len(shrunk) == len(set(shrunk)), shrunk
    assert all(f.shrunk.steps >= 2 for f in run.findings)


def test_scenarios_torch_does_not_pass_are_set_aside_never_findings() -> None:
    """torch runs only where the candidate failed, and a failure torch shares is set aside."""
    session = _Session("s.model == 'tied'", torch_fails_when="s.model == 'tied'")
    run = Fuzzer(session, "cand", budget_s=3, seed=0).run()  # type: ignore[arg-type]
    assert not run.findings and run.set_aside["FAIL"] > 0
    by_torch = {sid for sid, spec in session.runs if spec == "torch"}
    assert by_torch and all("/tied-" in sid for sid in by_torch)


def test_fuzzing_torch_itself_runs_each_scenario_once_and_finds_nothing() -> None:
    session = _Session("", torch_fails_when="s.steps == 4")
    run = Fuzzer(session, "torch", budget_s=2, seed=0).run()  # type: ignore[arg-type]
    assert not run.findings and run.ran > 0
    assert all(spec == "torch" for _, spec in session.runs)


def test_fuzz_finds_and_shrinks_a_mutant_on_real_ranks(tmp_path: Path) -> None:
    """The search is bounded in scenarios (the same on any machine: seed 0 finds it well
    within 400), the time budgets only as a backstop scaled to the machine's load."""
    (tmp_path / "cwd").mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "ddp_conformance", "fuzz", "--candidate",
         "tests.mutants.sync:NoSyncIgnored", "--max-scenarios", "400",
         "--budget", f"{deadline(600):.0f}s", "--shrink-budget", f"{deadline(60):.0f}s",
         "--report-dir", str(tmp_path / "r")],
        cwd=tmp_path / "cwd", capture_output=True, text=True, timeout=deadline(900),
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 1, out.stdout + out.stderr
    found = next(line for line in out.stdout.splitlines() if line.startswith("found: "))
    finding = found.split()[1].split("[")[0]  # the finding's one id, from found to shrunk
    assert f"FAILING at 2 ranks: {finding}[" in out.stdout, out.stdout
    literal = next(line.strip() for line in out.stdout.splitlines()
                   if line.strip().startswith("Scenario("))
    assert literal.startswith(f"Scenario('{finding}-shrunk'"), literal
    assert "accumulate='no_sync'" in literal and "microbatches=2" in literal, literal
    assert all(len(line) <= 120 for line in out.stdout.splitlines()
               if line.startswith("set aside"))
    # hypothesis's files go to the report directory, never to the working directory
    assert not (tmp_path / "cwd" / ".hypothesis").exists()


def test_fuzz_usage_errors_are_one_line() -> None:
    out = subprocess.run([sys.executable, "-m", "ddp_conformance", "fuzz", "--candidate", "torch",
                          "--budget", "soon"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_reference_matches_a_sparse_allreduce_after_joining() -> None:
    """Found by ``fuzz --candidate reference``: a joined rank sent a dense empty tensor where
    the active ranks allreduce a sparse gradient, and they desynced. torch's reducer keeps the
    last sparse gradient as the bucket's and sends sparse zeros shaped like it."""
    from ddp_conformance.catalog.scenario import JoinSpec
    from ddp_conformance.config import RunConfig
    from ddp_conformance.session import Session

    scenario = Scenario("fuzz/shrunk-b49ef642fa", "sparse_embedding", batch_size=1,
                        join=JoinSpec(fewer_steps_per_rank=1), seed=0)
    with Session(RunConfig(candidates=["torch", "reference"], timeout_s=20)) as session:
        for spec in ("torch", "reference"):
            result = session.run_case(scenario, spec)
            assert result.verdict is Verdict.PASS, (spec, result.summary_line())
