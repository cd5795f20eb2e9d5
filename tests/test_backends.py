"""Custom c10d backends: ``--backend MODULE:NAME``, the collective checks, the comparison.

Process-free tests of the pieces (resolution, exact data, verdicts, record comparison),
then runs on real ranks over the example backend and the defective ones of
``tests/backends`` (each caught by a named collective check with its evidence, and by DDP
scenarios), and the one-line errors of bad ``--backend`` values.
"""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_conformance.catalog.collective import DTYPES, FLOAT_DTYPES, CollectiveCase, Op
from ddp_conformance.collectives.execute import Mismatch, RankReport
from ddp_conformance.collectives.values import bits, data, reduce
from ddp_conformance.collectives.verdict import declines, judge_collective
from ddp_conformance.config import RunConfig
from ddp_conformance.contract.backend import resolve_backend
from ddp_conformance.errors import UsageError
from ddp_conformance.judge.backend_diff import compare_records
from ddp_conformance.judge.verdict import Result, Verdict
from ddp_conformance.ranks.environment import validate
from ddp_conformance.ranks.outcome import Outcome
from ddp_conformance.ranks.records import RankRecord, StepRecord
from tests.deadlines import deadline

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = "tests.backends.example:example_backend"


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddp_conformance", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=deadline(timeout))


# -- resolving --backend ------------------------------------------------------------------


def test_builtin_and_registered_backends_resolve() -> None:
    assert resolve_backend("gloo").name == "gloo" and not resolve_backend("gloo").custom
    spec = resolve_backend(EXAMPLE)
    assert (spec.name, spec.module, spec.devices, spec.custom) == \
        ("example_backend", "tests.backends.example", ("cpu",), True)
    # Once registered, the plain name is known too (as after a package's import).
    assert resolve_backend("example_backend").name == "example_backend"


@pytest.mark.parametrize("spec, message", [
    ("mpi", "unknown backend 'mpi'"),
    ("no.such.module:x", "cannot import 'no.such.module'"),
    ("tests.backends.example:nosuch", "registered no backend named 'nosuch'"),
    ("tests.backends.example:", "expected MODULE:NAME"),
    (":example_backend", "no module named before ':'"),
    ("tests.backends.example:gloo", "say --backend gloo"),
    (" gloo", "padded with spaces"),
])
def test_bad_backend_specs_are_one_line_usage_errors(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        resolve_backend(spec)
    assert "\n" not in str(info.value)


def test_a_backend_must_serve_the_device() -> None:
    assert validate(EXAMPLE, "cpu", 2) == "cpu"
    with pytest.raises(UsageError, match="does not serve --device cuda"):
        validate(EXAMPLE, "cuda", 2)


def test_collectives_and_comparison_default_on_for_custom_backends_only() -> None:
    config = RunConfig()
    assert config.runs_collectives(True) and not config.runs_collectives(False)
    assert config.comparison_backend(True) == "gloo" and config.comparison_backend(False) == ""
    assert not RunConfig(compare_backend="none").comparison_backend(True)
    assert RunConfig(collectives="on").runs_collectives(False)
    assert not RunConfig(collectives="only").runs_scenarios()


# -- exact data ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduce_op", ["SUM", "AVG", "PRODUCT", "MIN", "MAX"])
@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_every_reduction_order_gives_the_exact_result(dtype: str, reduce_op: str, ranks: int) -> None:
    """The argument of values.py, checked: reducing in the dtype itself, in every order of
    the ranks, gives the bits that the wide reference gives."""
    if reduce_op == "AVG" and dtype not in FLOAT_DTYPES:
        pytest.skip("AVG is for floating dtypes")
    inputs = [data(r, 257, dtype, reduce_op, group_size=ranks) for r in range(ranks)]
    want = bits(reduce(inputs, reduce_op))
    orders = list(itertools.permutations(range(ranks)))[:24]
    for order in orders:
        acc = inputs[order[0]].clone()
        for r in order[1:]:
            x = inputs[r]
            if dtype == "bool":
                acc = acc | x if reduce_op in ("SUM", "MAX") else acc & x
            elif reduce_op in ("SUM", "AVG"):
                acc = acc + x
            elif reduce_op == "PRODUCT":
                acc = acc * x
            else:
                acc = torch.minimum(acc, x) if reduce_op == "MIN" else torch.maximum(acc, x)
        if reduce_op == "AVG":
            assert torch.equal(bits(acc / ranks), want)  # divide the sum
            divided = [t / ranks for t in inputs]  # or divide each input, then sum
            assert torch.equal(bits(sum(divided[1:], divided[0])), want)
        else:
            assert torch.equal(bits(acc), want), (order, dtype, reduce_op)


#: (dtype, a narrower dtype a wire could carry it in).
NARROWINGS = [("float64", torch.float32), ("float32", torch.bfloat16),
              ("float32", torch.float16), ("float16", torch.bfloat16),
              ("int64", torch.float64), ("int64", torch.int32)]


@pytest.mark.parametrize("dtype, narrow", NARROWINGS)
@pytest.mark.parametrize("reduce_op", ["", "SUM", "AVG", "PRODUCT", "MIN", "MAX"])
@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_no_input_survives_a_narrower_wire(dtype: str, narrow: torch.dtype, reduce_op: str,
                                           ranks: int) -> None:
    """Full precision: every input element (PRODUCT: every carrier) changes when sent
    through a narrower type, so a backend that narrows the wire cannot pass."""
    if reduce_op == "AVG" and dtype not in FLOAT_DTYPES:
        pytest.skip("AVG is for floating dtypes")
    if (dtype, narrow, reduce_op) == ("float16", torch.bfloat16, "AVG") and ranks > 2:
        pytest.skip("AVG on float16 keeps 11 - 2k bits for 2**k ranks: bfloat16 holds 8")
    if (dtype, narrow) == ("float16", torch.bfloat16) and reduce_op and ranks > 4:
        pytest.skip("float16 sums keep 11 - k bits for 2**k ranks: at 8 ranks, bfloat16's 8")
    for rank in range(ranks):
        x = data(rank, 1023, dtype, reduce_op, group_size=ranks)
        if reduce_op == "PRODUCT":
            x = x[torch.arange(1023) % ranks == rank]
        survived = x.to(narrow).to(x.dtype) == x
        assert not bool(survived.any()), (rank, x[survived][:4])


def test_moved_data_reaches_beyond_the_narrower_ranges() -> None:
    """Unreduced floats also leave the narrower types' exponent range (a bfloat16 sent as
    float16 overflows; a float64 sent as float32 becomes 0 or inf)."""
    assert data(0, 1023, "float64").abs().max() > 2.0 ** 200
    assert data(0, 1023, "float64").abs().min() < 2.0 ** -200
    assert data(0, 1023, "bfloat16").abs().max() > 2.0 ** 60
    assert data(0, 1023, "int64").abs().min() > 2 ** 53


def test_bitwise_comparison_tells_negative_zero_apart() -> None:
    assert not torch.equal(bits(torch.tensor([0.0])), bits(torch.tensor([-0.0])))


def test_the_backend_comparison_calls_the_same_nan_bitwise_equal() -> None:
    """values/non-finite-grad: the same NaN in both runs is no difference (it was reported
    as 'differs by 0'); a NaN in one run only is one."""
    from ddp_conformance.judge.backend_diff import _distance
    nan = torch.tensor([1.0, float("nan"), float("inf")])
    assert _distance(nan, nan.clone()) == (True, 0.0)
    assert _distance(nan, torch.tensor([1.0, 2.0, float("inf")]))[0] is False
    assert _distance(torch.tensor([complex(1, float("nan"))]),
                     torch.tensor([complex(1, float("nan"))])) == (True, 0.0)


# -- cases --------------------------------------------------------------------------------


def test_collective_cases_check_their_fields() -> None:
    with pytest.raises(ValueError, match="AVG is meaningful for floating dtypes only"):
        CollectiveCase(Op.ALLREDUCE, "int32", "AVG")
    with pytest.raises(ValueError, match="a reduce op is required"):
        CollectiveCase(Op.ALLREDUCE)
    with pytest.raises(ValueError, match="is not one of"):
        CollectiveCase("allreduce_twice", reduce_op="SUM")
    assert CollectiveCase(Op.BROADCAST, "int64", group="split").id == "collectives/broadcast-int64-split"


def test_the_collective_catalog_covers_every_op_and_dtype() -> None:
    from ddp_conformance.catalog.loader import load_collectives

    cases = load_collectives()
    assert {c.op for c in cases} == set(Op)
    for op in (Op.ALLREDUCE, Op.BROADCAST, Op.ALLGATHER, Op.REDUCE_SCATTER, Op.ALLTOALL,
               Op.REDUCE, Op.GATHER, Op.SCATTER, Op.SEND_RECV):
        assert {c.dtype for c in cases if c.op == op} == set(DTYPES), op


# -- verdicts -----------------------------------------------------------------------------


def _judge(case: CollectiveCase, reports: dict[int, RankReport]) -> Result:
    return judge_collective(case, Result(case.id, "b", Verdict.NA, 2, "b", "cpu"),
                            Outcome("done", results=reports), 60.0)


def test_a_wrong_element_fails_with_the_evidence() -> None:
    case = CollectiveCase(Op.ALLREDUCE, "float16", "SUM")
    bad = RankReport(1, mismatches=[Mismatch("1023 elements", "the result", 1022, 3.0, -1.0, 1, 1023)])
    result = _judge(case, {0: RankReport(0, exact=["1 element"]), 1: bad})
    assert result.verdict is Verdict.FAIL
    assert result.summary_line() == ("rank 1: allreduce SUM float16, 1023 elements: the result, "
                                     "element 1022: expected 3.0, got -1.0 (1 of 1023 elements "
                                     "differ)")
    assert result.failures[0].check == "collective.allreduce"


def _raised(rank: int, error_type: str, error: str, at: str = "1 element") -> RankReport:
    return RankReport(rank, raised_at=at, error_type=error_type, error=error, traceback="tb")


def test_a_gap_declared_on_every_rank_is_not_applicable_with_the_backend_words() -> None:
    case = CollectiveCase(Op.ALLTOALL)
    result = _judge(case, {r: _raised(r, "NotImplementedError", "no alltoall here") for r in (0, 1)})
    assert result.verdict is Verdict.NA
    assert "NotImplementedError: no alltoall here" in result.reason


def test_a_refusal_on_one_rank_or_any_other_error_is_an_error() -> None:
    case = CollectiveCase(Op.ALLTOALL)
    one = _judge(case, {0: _raised(0, "NotImplementedError", "no"), 1: RankReport(1)})
    assert one.verdict is Verdict.ERROR and "rank(s) 1 did not" in one.reason
    other = _judge(case, {r: _raised(r, "RuntimeError", "Connection reset by peer") for r in (0, 1)})
    assert other.verdict is Verdict.ERROR and other.tracebacks == {0: "tb", 1: "tb"}


def test_the_same_decline_is_not_applicable_in_a_split_case_too() -> None:
    """In a split case each group has its own roots, so the ranks raise at items named
    differently: still the same decline, N/A as in the case's world twin."""
    case = CollectiveCase(Op.GATHER, "float32", group="split")
    said = "NotImplementedError: no gather here"
    split = _judge(case, {0: _raised(0, "NotImplementedError", "no gather here", "1 element, root 0"),
                          1: _raised(1, "NotImplementedError", "no gather here", "1 element, root 1")})
    world = _judge(CollectiveCase(Op.GATHER, "float32"),
                   {r: _raised(r, "NotImplementedError", "no gather here", "1 element, root 0")
                    for r in (0, 1)})
    assert split.verdict is world.verdict is Verdict.NA
    assert said in split.reason and said in world.reason
    assert "rank 1" not in split.reason  # the same words: said once


def test_an_error_line_names_every_rank_whose_exception_differs() -> None:
    case = CollectiveCase(Op.GATHER, "float32", group="split")
    result = _judge(case, {0: _raised(0, "RuntimeError", "expected length 2, got 1"),
                           1: _raised(1, "RuntimeError", "Connection closed by peer"),
                           2: _raised(2, "RuntimeError", "Connection closed by peer")})
    assert result.verdict is Verdict.ERROR
    assert result.reason == ("rank 0 raised at 1 element: RuntimeError: expected length 2, got 1; "
                             "rank 1 raised at 1 element: RuntimeError: Connection closed by peer")
    assert set(result.tracebacks) == {0, 1, 2}


def test_a_scenario_error_line_names_every_rank_whose_exception_differs() -> None:
    from ddp_conformance.judge.failures import failed_run

    def tb(line: str) -> str:
        return f'Traceback (most recent call last):\n  File "x.py", line 1, in f\n{line}\n'

    out = Outcome("raised", tracebacks={0: tb("ValueError: rank 0 has 3 params"),
                                        1: tb("ValueError: rank 1 has 4 params"),
                                        2: tb("ValueError: rank 0 has 3 params"),
                                        3: tb("RuntimeError: released")}, released={3})
    result = failed_run(Result("s", "c", Verdict.PASS, 4, "gloo", "cpu"), out, 60.0)
    assert result.reason == ("rank 0 raised ValueError: rank 0 has 3 params; "
                             "rank 1 raised ValueError: rank 1 has 4 params")


def test_a_fail_line_names_every_rank_whose_failure_differs() -> None:
    from ddp_conformance.judge.verdict import CheckFailure

    result = Result("s", "c", Verdict.FAIL, 3, "gloo", "cpu", failures=[
        CheckFailure("oracle.grad", "step 0, rank 0, 'w': max abs error 0.5", rank=0),
        CheckFailure("oracle.grad", "step 1, rank 0, 'w': max abs error 0.7", rank=0),
        CheckFailure("oracle.grad", "step 0, rank 1, 'w': max abs error 0.25", rank=1),
        CheckFailure("oracle.grad", "step 0, rank 2, 'b': gradient is None", rank=2)])
    assert result.summary_line() == ("step 0, rank 0, 'w': max abs error 0.5; "
                                     "step 0, rank 2, 'b': gradient is None")


@pytest.mark.parametrize("error_type, message, gap", [
    ("NotImplementedError", "", True),
    ("RuntimeError", "Cannot use ReduceOp.AVG with Gloo", True),
    ("RuntimeError", "Tensors must be contiguous", True),
    ("RuntimeError", "input tensor has to be contiguous", True),
    ("RuntimeError", "No backend type associated with device type cpu", True),
    ("RuntimeError", "Connection closed by peer", False),
    ("ValueError", "wrong shape", False),
])
def test_what_counts_as_a_declined_operation(error_type: str, message: str, gap: bool) -> None:
    assert declines(error_type, message) is gap


# -- comparing two backends' records ------------------------------------------------------


def _record(grad: float) -> dict[int, RankRecord]:
    step = StepRecord({"w": torch.tensor([grad, 1.0])}, {"w": torch.ones(2)}, {})
    return {0: RankRecord(0, steps=[step])}


def test_records_compare_bitwise_and_by_the_largest_difference() -> None:
    same = compare_records("gloo", "PASS", _record(0.5), _record(0.5))
    assert same.bitwise and same.max_abs == 0 and same.compared == 2
    apart = compare_records("gloo", "PASS", _record(0.5), _record(0.75))
    assert not apart.bitwise and apart.max_abs == 0.25
    assert apart.first_difference.startswith("rank 0, step 0, gradient of 'w'")
    assert compare_records("gloo", "ERROR", _record(0.5), None).bitwise is None


# -- on real ranks ------------------------------------------------------------------------


def _results(report_dir: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in (report_dir / "results.jsonl").read_text().splitlines()]
    return {f"{r['scenario']}[{r['candidate']}]": r for r in rows if r.get("type") != "run"
            and "scenario" in r}


def test_the_example_backend_passes_and_matches_gloo_bitwise(tmp_path: Path) -> None:
    out = cli("run", "--backend", EXAMPLE, "--report-dir", str(tmp_path), "-k",
              "allreduce-sum or broadcast-float32 or send-recv-float32 or sparse or "
              "gradients/exact-dyadic or init-sync/per-rank-weights")
    assert out.returncode == 0, out.stdout + out.stderr
    header = out.stdout.splitlines()[0]  # the default comparison doubles the run: said
    assert header.endswith(", every scenario also on gloo for comparison (--compare-backend "
                           "default for a custom backend; --compare-backend none skips it)"), header
    results = _results(tmp_path)
    collective = results["collectives/allreduce-sum-float32-strided[example_backend]"]
    assert collective["verdict"] == "PASS"
    ddp = results["gradients/exact-dyadic[torch]"]
    assert ddp["backend"] == "example_backend" and ddp["verdict"] == "PASS"
    assert ddp["comparison"]["backend"] == "gloo" and ddp["comparison"]["bitwise"] is True
    summary = (tmp_path / "summary.md").read_text()
    assert "## Backend comparison: example_backend and gloo" in summary
    assert "registered by `tests.backends.example:example_backend`" in summary


def _sum_of_two(dtype: str) -> int:
    """Element 0 of an allreduce SUM over 2 ranks (what the checks expect)."""
    return int(reduce([data(r, 1, dtype, "SUM", group_size=2) for r in (0, 1)], "SUM").item())


@pytest.mark.parametrize("backend, keyword, collective, evidence, scenario", [
    ("last_unreduced", "allreduce-sum-float32 or buckets/one-large-above-cap",
     "collectives/allreduce-sum-float32", "262147 elements: the result, element 262146: "
     "expected", "buckets/one-large-above-cap"),
    ("sum_averages", "allreduce-sum-int64 or gradients/mlp-sgd", "collectives/allreduce-sum-int64",
     f"1 element: the result, element 0: expected {_sum_of_two('int64')}, got "
     f"{_sum_of_two('int64') // 2}", "gradients/mlp-sgd"),
    ("broadcast_ignores_root", "broadcast-bfloat16 or init-sync/per-rank-weights",
     "collectives/broadcast-bfloat16", f"root 0: the result, element 0: expected "
     f"{data(0, 1, 'bfloat16').item()!r}, got 99.0", "init-sync/per-rank-weights"),
    ("float64_as_float32", "allreduce-sum-float64 or buckets/mixed-dtypes-tiny-cap",
     "collectives/allreduce-sum-float64", "1 element: the result, element 0: expected "
     f"{reduce([data(r, 1, 'float64', 'SUM', group_size=2) for r in (0, 1)], 'SUM').item()!r}",
     "buckets/mixed-dtypes-tiny-cap"),
])
def test_each_defective_backend_is_caught_with_the_evidence(
        backend: str, keyword: str, collective: str, evidence: str, scenario: str,
        tmp_path: Path) -> None:
    module = "narrowing" if backend == "float64_as_float32" else "defective"
    out = cli("run", "--backend", f"tests.backends.{module}:{backend}", "--compare-backend",
              "none", "--report-dir", str(tmp_path), "-k", keyword)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "for comparison" not in out.stdout.splitlines()[0]  # --compare-backend none
    results = _results(tmp_path)
    failed = results[f"{collective}[{backend}]"]
    assert failed["verdict"] == "FAIL"
    assert evidence in failed["failures"][0]["message"], failed["failures"][0]["message"]
    assert results[f"{scenario}[torch]"]["verdict"] == "FAIL"
    if backend == "float64_as_float32":  # caught on the float64 layers, at float64's rtol
        messages = [f["message"] for f in results[f"{scenario}[torch]"]["failures"]]
        assert any("'b." in m or "'d." in m for m in messages), messages
        assert any("tolerance 1e-12" in m for m in messages), messages


def test_a_declined_operation_is_not_applicable_and_the_run_passes(tmp_path: Path) -> None:
    out = cli("run", "--backend", "tests.backends.defective:no_alltoall", "--collectives", "only",
              "--report-dir", str(tmp_path), "-k", "alltoall-float32 or allgather-float32")
    assert out.returncode == 0, out.stdout + out.stderr
    results = _results(tmp_path)
    na = results["collectives/alltoall-float32[no_alltoall]"]
    assert na["verdict"] == "N/A" and "NotImplementedError" in na["reason"]
    assert results["collectives/allgather-float32[no_alltoall]"]["verdict"] == "PASS"


@pytest.mark.parametrize("args, message", [
    (["--backend", "no.such.module:x"], "cannot import 'no.such.module'"),
    (["--backend", "tests.backends.example:nosuch"], "registered no backend named 'nosuch'"),
    (["--backend", EXAMPLE, "--device", "cuda"], "does not serve --device cuda"),
    (["--backend", EXAMPLE, "--compare-backend", "nosuch"], "unknown backend 'nosuch'"),
    (["--collectives", "sometimes"], "invalid choice"),
])
def test_bad_backend_values_exit_2_with_one_line(args: list[str], message: str,
                                                 tmp_path: Path) -> None:
    out = cli("run", *args, "--report-dir", str(tmp_path))
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr


def test_gloo_collectives_pass_but_for_its_known_stride_defect(tmp_path: Path) -> None:
    """The checks themselves, on torch's Gloo: everything exact, except what Gloo is known
    to get wrong (shipped as expected failures, pytorch/pytorch#192920)."""
    out = cli("run", "--collectives", "only", "--report-dir", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    verdicts = {k: r["verdict"] for k, r in _results(tmp_path).items()}
    assert {k for k, v in verdicts.items() if v == "XFAIL"} == {
        f"collectives/{name}[gloo]" for name in ("allreduce-sum-float32-strided",
                                                 "broadcast-float32-strided",
                                                 "reduce-sum-float32-strided",
                                                 "scatter-float32-strided")}
    assert set(verdicts.values()) <= {"PASS", "XFAIL", "N/A"}


def test_pytest_runs_the_collective_checks_for_a_custom_backend(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "suites/test_collectives.py",
         "--ddp-backend", EXAMPLE, "-k", "allreduce-product-int32 or alltoall-int64"],
        cwd=ROOT, capture_output=True, text=True, timeout=deadline(300))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 passed" in out.stdout, out.stdout
    plain = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only",
         "suites/test_collectives.py"], cwd=ROOT, capture_output=True, text=True, timeout=deadline(300))
    assert "no tests collected" in plain.stdout, plain.stdout  # Gloo: not unless asked


def test_a_backend_object_from_an_extended_creator_runs_too(tmp_path: Path) -> None:
    """What a C++ extension registers: a ``Backend`` object, created with the extended API."""
    out = cli("run", "--backend", "tests.backends.backend_object:backend_object",
              "--compare-backend", "none", "--report-dir", str(tmp_path), "-k",
              "allreduce-sum-float64 or alltoall-single-int32 or gradients/mlp-sgd")
    assert out.returncode == 0, out.stdout + out.stderr
    results = _results(tmp_path)
    assert results["collectives/allreduce-sum-float64[backend_object]"]["verdict"] == "PASS"
    assert results["gradients/mlp-sgd[torch]"]["backend"] == "backend_object"
