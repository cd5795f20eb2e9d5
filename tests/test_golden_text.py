"""Golden tests of the text a person reads: the summary table, the progress line, one-line
usage errors, and a failure's evidence (Markdown summary and pytest's evidence block).

The expected texts are inline (``assertExpectedInline``). After an intended change of a
text, rewrite them with expecttest's accept flag and review the diff::

    EXPECTTEST_ACCEPT=1 python -m pytest tests/test_golden_text.py

Inputs are hand-built with fixed values (no dates, paths or versions of this machine), so
the texts are deterministic; the command-line errors run ``python -m ddp_conformance run``
with bad input, which fails before any rank process starts.
"""
# The golden texts below are verbatim lines of output, however long they are.
# ruff: noqa: E501
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import expecttest

from ddp_conformance.catalog.listing import catalog_table
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.cli import build_parser, progress_line, summary_table
from ddp_conformance.judge.verdict import CheckFailure, Figure, Result, Verdict
from ddp_conformance.pytest_items import describe
from ddp_conformance.report.markdown import markdown_summary
from tests.deadlines import deadline

REPO = Path(__file__).resolve().parent.parent

DEFECTIVE = "tests.defective:SumsWithoutDividing"
HANGS = "tests.defective:JoinHookDoesNotShadow"


def result(scenario: str, candidate: str, verdict: Verdict, **kwargs: Any) -> Result:
    """A result as the runner makes it: 2 ranks, gloo on the CPU."""
    return Result(scenario, candidate, verdict, world_size=2, backend="gloo", device="cpu",
                  **kwargs)


def failed_result() -> Result:
    """A FAIL as SumsWithoutDividing produces it: two checks failed, figures for both."""
    return result(
        "gradients/mlp-sgd", DEFECTIVE, Verdict.FAIL, duration_s=2.46,
        cause={"code": "no-division", "check": "oracle.grad",
               "relation": "every wrong gradient at step 0 is 2.000x the expected (= world "
                           "size 2): summed without dividing"},
        costs={"handover": 0.0, "wrap": 0.31, "steps": 0.42, "record": 0.02, "transfer": 0.08,
               "reference": 0.55, "oracle": 0.9, "checks": 0.15, "other": 0.03},
        failures=[
            CheckFailure("oracle.grad", "oracle.grad: step 0, rank 0, '0.weight': max abs error "
                         "0.0644 against the oracle (max rel 1, 8.389e+06 ulp) exceeds tolerance "
                         "1e-05 x max|expected| 0.0644", step=0, rank=0, name="0.weight"),
            CheckFailure("oracle.param", "oracle.param: step 0, rank 0, '4.weight': max abs "
                         "error 0.00678 against the oracle (max rel 0.149, 1.819e+06 ulp) exceeds "
                         "tolerance 1e-05 x max|expected| 0.249", step=0, rank=0, name="4.weight"),
        ],
        figures=[
            Figure("init.param", -1, 1, "0.weight", True, 0.0, 0.0, 0.0, 0.0),
            Figure("oracle.grad", 0, 0, "0.weight", False, 0.06439532339572906, 1.0, 8388608.0,
                   1e-05),
            Figure("oracle.grad", 0, 1, "0.weight", False, 0.06439532339572906, 1.0, 8388608.0,
                   1e-05),
            Figure("oracle.grad", 1, 0, "0.weight", False, 0.4650000035762787, 400.0,
                   2029000000.0, 1e-05),
            Figure("oracle.param", 0, 0, "4.weight", False, 0.006780000030994415,
                   0.14900000393390656, 1819000.0, 1e-05),
        ],
        checks_run=["init.param", "oracle.grad", "oracle.param"])


STACK_RANK0 = """\
Thread 0x00007f2e5d7fe6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 629 in wait

Current thread 0x00007f2e6c1b2740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2810 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1421 in _check_global_requires_backward_grad_sync
  File "/src/tests/defective.py", line 58 in forward
  File "/src/ddp_conformance/ranks/procedure.py", line 88 in run_steps
"""

STACK_RANK1 = """\
Current thread 0x00007f9a0c4d1740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/algorithms/join.py", line 274 in __exit__
  File "/src/ddp_conformance/ranks/procedure.py", line 97 in run_steps
"""


def timeout_result() -> Result:
    """A TIMEOUT as the runner makes it: every stuck rank's faulthandler stack."""
    return result(
        "join/uneven-divide-by-initial", HANGS, Verdict.TIMEOUT, duration_s=8.02,
        cause={"code": "join-not-shadowed", "check": "",
               "relation": "ranks hang in collectives after a rank joined: the joined rank "
                           "does not shadow them"},
        reason="no progress within 8s: rank(s) 0, 1 still running; rank 0 at all_reduce "
               "(distributed_c10d.py:2810) called from forward (defective.py:58); rank 1 at "
               "__exit__ (join.py:274)",
        stacks={1: STACK_RANK1, 0: STACK_RANK0})


RUN_INFO = {
    "type": "run", "started": "2026-01-02T03:04:05+00:00", "torch": "2.13.0+cpu",
    "python": "3.11.7", "cpu_count": 2, "backend": "gloo", "device": "cpu", "devices": ["cpu"],
    "world_size": 2,
    "project_git": {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": True},
    "candidates": [
        {"name": "torch", "version": "2.13.0+cpu"},
        {"name": DEFECTIVE, "version": "", "git": {"commit": "fedcba9876543210fedcba98"}},
    ],
}


def show_trailing_spaces(text: str) -> str:
    """Trailing spaces made visible as ``·`` (a Markdown line break is two of them), so that
    the golden text shows them and no editor strips them."""
    return re.sub(r" +$", lambda m: "·" * len(m.group()), text, flags=re.MULTILINE)


class TestSummaryTable(expecttest.TestCase):
    def test_two_candidates_several_verdicts(self) -> None:
        results = [
            result("gradients/mlp-sgd", "torch", Verdict.PASS),
            result("gradients/mlp-sgd", DEFECTIVE, Verdict.FAIL),
            result("no-sync/window-of-3", "torch", Verdict.PASS),
            result("no-sync/window-of-3", DEFECTIVE, Verdict.NA, reason="candidate lacks no_sync"),
            result("join/uneven-divide-by-initial", "torch", Verdict.XFAIL, expectation="known"),
            result("join/uneven-divide-by-initial", DEFECTIVE, Verdict.TIMEOUT),
            # Run for one candidate only: the other's cell stays empty.
            result("comm-hooks/allreduce", "torch", Verdict.PASS),
        ]
        self.assertExpectedInline(summary_table(results), """\
scenario                       torch    tests.defective:SumsWithoutDividing
-----------------------------  -------  -------------------------------------
gradients/mlp-sgd              PASS     FAIL
no-sync/window-of-3            PASS     N/A
join/uneven-divide-by-initial  XFAIL    TIMEOUT
comm-hooks/allreduce           PASS""")


class TestProgressLine(expecttest.TestCase):
    def test_pass(self) -> None:
        r = result("gradients/mlp-sgd", "torch", Verdict.PASS, duration_s=1.234)
        self.assertExpectedInline(progress_line(3, 12, r), """[ 3/12] PASS    gradients/mlp-sgd[torch] (1.23s)""")

    def test_fail_with_message(self) -> None:
        self.assertExpectedInline(progress_line(12, 12, failed_result()), """\
[12/12] FAIL    gradients/mlp-sgd[tests.defective:SumsWithoutDividing] (2.46s)
    [no-division] every wrong gradient at step 0 is 2.000x the expected (= world size 2): summed without dividing
    oracle.grad: step 0, rank 0, '0.weight': max abs error 0.0644 against the oracle (max rel 1, 8.389e+06 ulp) exceeds tolerance 1e-05 x max|expected| 0.0644""")


def run_command(args: list[str], cwd: Path, base_s: float) -> tuple[int, str]:
    """``python -m ddp_conformance ARGS`` in ``cwd``, the repository importable: (exit code,
    stderr). Its own process group, so that if a regression lets it start ranks, the kill
    after ``deadline(base_s)`` takes them too."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen([sys.executable, "-m", "ddp_conformance", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=deadline(base_s))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"ddp-conformance {' '.join(args)} took over "
                             f"{deadline(base_s):.0f} s") from None
    return proc.returncode, stderr


def run_cli(*args: str) -> tuple[int, str]:
    """``ddp-conformance run ARGS`` from the repository root, its report directory a
    temporary one: (exit code, stderr)."""
    with tempfile.TemporaryDirectory() as reports:
        return run_command(["run", *args, "--report-dir", reports], REPO, 10)


def command_error(cwd: Path, *args: str) -> str:
    """``ddp-conformance ARGS`` run in ``cwd``: its one stderr line, which must come with
    exit code 2 before any rank starts."""
    code, stderr = run_command(list(args), cwd, 20)
    assert code == 2 and len(stderr.splitlines()) == 1, (code, stderr)
    return stderr.strip()


#: Machine- or version-specific parts of an error line, and what replaces them.
_MASKS = [
    (re.compile(re.escape(str(REPO))), "<repo>"),
]


class TestUsageErrors(expecttest.TestCase):
    def usage_error(self, *args: str) -> str:
        """The one stderr line of a run that fails with exit code 2, masked."""
        code, stderr = run_cli(*args)
        self.assertEqual(code, 2, stderr)
        lines = stderr.splitlines()
        self.assertEqual(len(lines), 1, f"not one line on stderr:\n{stderr}")
        line = lines[0]
        for pattern, replacement in _MASKS:
            line = pattern.sub(replacement, line)
        return line

    def test_unknown_candidate(self) -> None:
        self.assertExpectedInline(self.usage_error("--candidate", "nosuch"), """ddp-conformance: error: unknown candidate 'nosuch': not a built-in (torch, reference, torch-python-reducer, replicate, fsdp-no-shard, fsdp-full-shard, fsdp2, lightning, accelerate, deepspeed-zero0, deepspeed-zero1, deepspeed-zero2, fairscale-sharded, torch-compile, torch-compile-split, torch-compile-inductor, torch-compile-ca, ignite, megatron-core, torchft) and not of the form package.module:attr""")

    def test_candidate_module_does_not_import(self) -> None:
        self.assertExpectedInline(self.usage_error("--candidate", "nosuch.module:X"), """ddp-conformance: error: unknown candidate 'nosuch.module:X': cannot import 'nosuch.module' (No module named 'nosuch'); 'nosuch' is not in <repo>: run from the directory that holds it, or add that directory to PYTHONPATH""")

    def test_candidate_attribute_missing(self) -> None:
        self.assertExpectedInline(self.usage_error("--candidate", "tests.limited:Nope"), """ddp-conformance: error: unknown candidate 'tests.limited:Nope': 'tests.limited' has no attribute 'Nope'""")

    def test_unknown_backend(self) -> None:
        self.assertExpectedInline(self.usage_error("--backend", "mpi"), """ddp-conformance: error: unknown backend 'mpi'; choose gloo, nccl, or MODULE:NAME for a backend that MODULE registers with torch.distributed.Backend.register_backend""")

    def test_world_size_zero(self) -> None:
        self.assertExpectedInline(self.usage_error("--world-size", "0"), """ddp-conformance: error: --world-size must be at least 1, got 0""")

    def test_timeout_zero(self) -> None:
        self.assertExpectedInline(self.usage_error("--timeout", "0"), """ddp-conformance: error: --timeout must be positive, got 0""")

    def test_repeat_zero(self) -> None:
        self.assertExpectedInline(self.usage_error("--repeat", "0"), """ddp-conformance: error: --repeat must be at least 1, got 0""")

    def test_keyword_matches_nothing(self) -> None:
        self.assertExpectedInline(self.usage_error("-k", "no-such-scenario"), """ddp-conformance: error: no scenario matches -k 'no-such-scenario'""")

    def test_keyword_does_not_parse(self) -> None:
        self.assertExpectedInline(self.usage_error("-k", "a b"), """ddp-conformance: error: -k 'a b' is not a valid expression: expected end of input; got identifier (at column 3)""")

    def test_timeout_not_a_number(self) -> None:
        self.assertExpectedInline(self.usage_error("--timeout", "nan"), """ddp-conformance: error: --timeout must be positive, got nan""")

    def test_unknown_option(self) -> None:
        self.assertExpectedInline(self.usage_error("--no-such-option"), """ddp-conformance: error: unrecognized arguments: --no-such-option""")


class TestInputErrors(expecttest.TestCase):
    """Input that gave a traceback (or was lost silently) before: one line, exit 2, for
    every command. Each runs in a fresh directory holding the files it names."""

    def setUp(self) -> None:
        self.dir = Path(self.enterContext(tempfile.TemporaryDirectory()))
        (self.dir / "afile").write_text("")
        (self.dir / "adir").mkdir()
        (self.dir / "latin1.txt").write_bytes(b"gradients/*  # caf\xe9\n")
        (self.dir / "run").mkdir()
        (self.dir / "run" / "results.jsonl").write_bytes(b'{"type": "run"}\n\xff\n')
        (self.dir / "myscript.py").write_text("import sys\nsys.exit(3)\n")
        (self.dir / "mydp.py").write_text(
            "class NoGroup:\n    def __init__(self, module, device_ids=None):\n"
            "        self.module = module\n")

    def error(self, *args: str) -> str:
        return command_error(self.dir, *args)

    def test_report_dir_under_a_file(self) -> None:
        self.assertExpectedInline(self.error("run", "--report-dir", "afile/out"), """ddp-conformance: error: cannot write afile/out: afile is a file, not a directory""")

    def test_report_dir_is_a_file(self) -> None:
        self.assertExpectedInline(self.error("run", "--report-dir", "afile"), """ddp-conformance: error: cannot write afile: afile is a file, not a directory""")

    def test_expectations_not_utf8(self) -> None:
        self.assertExpectedInline(self.error("run", "--expectations", "latin1.txt"), """ddp-conformance: error: cannot read expectations file 'latin1.txt': not UTF-8 text (byte 0xe9 on line 1)""")

    def test_expectations_a_directory(self) -> None:
        self.assertExpectedInline(self.error("run", "--expectations", "adir"), """ddp-conformance: error: cannot read expectations file 'adir': Is a directory""")

    def test_candidate_without_process_group(self) -> None:
        self.assertExpectedInline(self.error("run", "--candidate", "mydp:NoGroup"), """ddp-conformance: error: candidate 'mydp:NoGroup' cannot be called as torch's DDP is, NoGroup(module, process_group=group, **ddp_options): got an unexpected keyword argument 'process_group' (its signature: (module, device_ids=None)); accept process_group=, or give a Candidate""")

    def test_candidate_module_exits_on_import(self) -> None:
        self.assertExpectedInline(self.error("run", "--candidate", "myscript:DDP"), """ddp-conformance: error: candidate 'myscript:DDP': importing 'myscript' called sys.exit(3) (is it a script? guard its main code with if __name__ == '__main__')""")

    def test_report_dir_empty(self) -> None:
        self.assertExpectedInline(self.error("bench", "--report-dir", ""), """ddp-conformance: error: --report-dir must name a directory, got ''""")

    def test_fuzz_two_candidates(self) -> None:
        self.assertExpectedInline(self.error("fuzz", "--candidate", "mydp:MyDDP", "--candidate", "torch", "--budget", "10"), """ddp-conformance: error: fuzz takes one --candidate, got 2 (mydp:MyDDP, torch); run fuzz once per candidate""")

    def test_fuzz_no_candidate(self) -> None:
        self.assertExpectedInline(self.error("fuzz"), """ddp-conformance: error: fuzz needs --candidate SPEC (one candidate)""")

    def test_fuzz_report_dir_is_a_file(self) -> None:
        self.assertExpectedInline(self.error("fuzz", "--candidate", "torch", "--report-dir", "afile"), """ddp-conformance: error: cannot write afile/repro: afile is a file, not a directory""")

    def test_repro_two_candidates(self) -> None:
        self.assertExpectedInline(self.error("repro", "gradients/mlp-sgd", "--candidate", "torch", "--candidate", "reference"), """ddp-conformance: error: repro takes one --candidate, got 2 (torch, reference); run repro once per candidate""")

    def test_repro_report_dir_under_a_file(self) -> None:
        self.assertExpectedInline(self.error("repro", "gradients/mlp-sgd", "--candidate", "torch", "--report-dir", "afile/out"), """ddp-conformance: error: cannot write afile/out/repro: afile is a file, not a directory""")

    def test_bench_report_dir_under_a_file(self) -> None:
        self.assertExpectedInline(self.error("bench", "--report-dir", "afile/out"), """ddp-conformance: error: cannot write afile/out: afile is a file, not a directory""")

    def test_report_results_not_utf8(self) -> None:
        self.assertExpectedInline(self.error("report", "run"), """ddp-conformance: error: cannot read results 'run/results.jsonl': not UTF-8 text (byte 0xff on line 2)""")

    def test_report_two_directories(self) -> None:
        self.assertExpectedInline(self.error("report", "run", "--report-dir", "adir"), """ddp-conformance: error: give the run's directory once: RESULTS_DIR 'run' or --report-dir 'adir'""")

    def test_list_matches_nothing(self) -> None:
        self.assertExpectedInline(self.error("list", "-k", "no-such-scenario"), """ddp-conformance: error: no scenario matches -k 'no-such-scenario'""")


class TestCommandText(expecttest.TestCase):
    def test_list_fits_100_columns(self) -> None:
        scenarios = [
            Scenario("gradients/exact-dyadic", "mlp", "dyadic data: sums exact in any order, so "
                     "the candidate must match the oracle bitwise, whatever its reduction order",
                     exact=True),
            Scenario("join/uneven-throw-with-unused-and-static-graph-long-id", "unused_param",
                     "a long id", ddp_options={"find_unused_parameters": True,
                                               "static_graph": True, "bucket_cap_mb": 1,
                                               "gradient_as_bucket_view": True},
                     world_sizes=(2, 4)),
        ]
        self.assertExpectedInline(catalog_table(scenarios), """\
scenario                                                world size  needs
---------------------------------------------------------------------------------------------------
gradients/exact-dyadic                                  any         -
    dyadic data: sums exact in any order, so the candidate must match the oracle bitwise, whatever
    its reduction order (model mlp)
join/uneven-throw-with-unused-and-static-graph-long-id  2 or 4      option:bucket_cap_mb,
                                                                    option:find_unused_parameters,
                                                                    option:gradient_as_bucket_view,
                                                                    option:static_graph
    a long id (model unused_param)""")

    def test_fuzz_help(self) -> None:
        sub = next(a for a in build_parser()._actions if a.dest == "command")
        with mock.patch.dict(os.environ, {"COLUMNS": "100"}):
            text = sub.choices["fuzz"].format_help()  # type: ignore[attr-defined]
        self.assertExpectedInline(text, """\
usage: ddp-conformance fuzz [-h] [--candidate SPEC] [--backend NAME] [--device DEV]
                            [--world-size N] [--timeout S] [--allow-oversubscribe]
                            [--report-dir DIR] [--budget TIME] [--max-scenarios N]
                            [--shrink-budget TIME] [--seed N] [--keep-going]

options:
  -h, --help            show this help message and exit
  --candidate SPEC, --ddp-candidate SPEC
                        the candidate DDP to fuzz, as for run; exactly one (fuzz each candidate
                        with its own command): only what it supports is drawn, and torch's DDP
                        runs each scenario it fails
  --backend NAME, --ddp-backend NAME
                        process-group backend: gloo (default), nccl, or MODULE:NAME, a backend
                        that importing MODULE registers as NAME
                        (torch.distributed.Backend.register_backend)
  --device DEV, --ddp-device DEV
                        tensor device: cpu (default) or cuda (nccl, and a backend registered for
                        cuda only, imply cuda)
  --world-size N, --ddp-world-size N
                        ranks (default 2), or world sizes drawn in turn: 1-4, 1,3
  --timeout S, --ddp-timeout S
                        deadline of one case in seconds (default 60)
  --allow-oversubscribe, --ddp-allow-oversubscribe
                        run a world size that does not fit this machine (more ranks than 8 per
                        core, or than its memory holds) instead of refusing it
  --report-dir DIR, --ddp-report-dir DIR
                        each finding's standalone reproducer goes to DIR/repro, the scenarios set
                        aside to DIR/fuzz-set-aside.txt, hypothesis's files to DIR/.hypothesis
                        (default reports/)
  --budget TIME         how long to generate scenarios: 90s, 5m, 1h (default 5m)
  --max-scenarios N     generate at most N scenarios (with --budget, whichever ends first): the
                        same search on any machine
  --shrink-budget TIME  how long to shrink a failure (default 2m)
  --seed N              the same seed generates the same scenarios (default 0)
  --keep-going          after a finding, shrink it and go on looking for others until the budget
                        is spent (default: stop at the first finding, shrunk)
""")


class TestFailureEvidence(expecttest.TestCase):
    def test_fail_markdown(self) -> None:
        results = [result("gradients/mlp-sgd", "torch", Verdict.PASS), failed_result()]
        notes = ["gradients/mlp-sgd: not compared with the reference DDP (reference could not "
                 "run it: timeout)"]
        text = markdown_summary(RUN_INFO, results, notes)
        self.assertExpectedInline(show_trailing_spaces(text), """\
# ddp-conformance summary

torch 2.13.0+cpu, backend gloo, device cpu, world size 2, 2 CPUs, started 2026-01-02T03:04:05+00:00··
ddp-conformance at 0123456789ab (dirty)··
candidate `torch` 2.13.0+cpu··
candidate `tests.defective:SumsWithoutDividing`, git fedcba987654··

Verdicts: FAIL 1, PASS 1

## Diagnosis

```
diagnosis of `tests.defective:SumsWithoutDividing`: 1 cause for 1 unexpected verdict
  1. `no-division` (1 case): every wrong gradient at step 0 is 2.000x the expected (= world size 2): summed without dividing
     shows in gradients
     look first at `gradients/mlp-sgd[tests.defective:SumsWithoutDividing]`: `ddp-conformance repro gradients/mlp-sgd --candidate tests.defective:SumsWithoutDividing --world-size 2`
```

Unexpected verdicts by the check that failed first:

| check (first failed)   | cases   | causes        |
|------------------------|---------|---------------|
| oracle.grad            | 1       | no-division 1 |

## Failures by cause

### `no-division`: 1 case

#### FAIL `gradients/mlp-sgd[tests.defective:SumsWithoutDividing]`

[no-division] every wrong gradient at step 0 is 2.000x the expected (= world size 2): summed without dividing··
oracle.grad: step 0, rank 0, '0.weight': max abs error 0.0644 against the oracle (max rel 1, 8.389e+06 ulp) exceeds tolerance 1e-05 x max|expected| 0.0644

| check        |   first step | rank(s)   | parameter(s)   |   max abs |   max rel |   max ULP |   tolerance (rtol) |
|--------------|--------------|-----------|----------------|-----------|-----------|-----------|--------------------|
| oracle.grad  |            0 | 0, 1      | 0.weight       |   0.465   |   400     | 2.029e+09 |              1e-05 |
| oracle.param |            0 | 0         | 4.weight       |   0.00678 |     0.149 | 1.819e+06 |              1e-05 |

## Verdict matrix

| scenario          | torch   | tests.defective:SumsWithoutDividing   |
|-------------------|---------|---------------------------------------|
| gradients/mlp-sgd | PASS    | FAIL                                  |

## Slowest cases

All 2 cases, slowest first (2.5 s in all), seconds per phase. The reference DDP's run and the oracle are cached per scenario: each is charged to the case that ran it.

Where the run's time went: oracle 37% · reference 22% · steps 17% · wrap 13% · checks 6% · transfer 3% · other 1% · record 1%

| case                                                   | verdict   |   seconds |   handover |   wrap |   steps |   record |   transfer |   reference |   oracle |   checks |   other |
|--------------------------------------------------------|-----------|-----------|------------|--------|---------|----------|------------|-------------|----------|----------|---------|
| gradients/mlp-sgd[tests.defective:SumsWithoutDividing] | FAIL      |     2.460 |      0.000 |  0.310 |   0.420 |    0.020 |      0.080 |       0.550 |    0.900 |    0.150 |   0.030 |
| gradients/mlp-sgd[torch]                               | PASS      |     0.000 |          - |      - |       - |        - |          - |           - |        - |        - |       - |

## Notes

- gradients/mlp-sgd: not compared with the reference DDP (reference could not run it: timeout)
""")

    def test_fail_pytest_evidence(self) -> None:
        self.assertExpectedInline("\n".join(describe(failed_result())), """\
FAIL: gradients/mlp-sgd[tests.defective:SumsWithoutDividing]: [no-division] every wrong gradient at step 0 is 2.000x the expected (= world size 2): summed without dividing
  oracle.grad: step 0, rank 0, '0.weight': max abs error 0.0644 against the oracle (max rel 1, 8.389e+06 ulp) exceeds tolerance 1e-05 x max|expected| 0.0644
  oracle.param: step 0, rank 0, '4.weight': max abs error 0.00678 against the oracle (max rel 0.149, 1.819e+06 ulp) exceeds tolerance 1e-05 x max|expected| 0.249""")

    def test_timeout_markdown(self) -> None:
        info = {**RUN_INFO, "candidates": [{"name": HANGS, "version": "1.0"}]}
        text = markdown_summary(info, [timeout_result()], [])
        self.assertExpectedInline(show_trailing_spaces(text), """\
# ddp-conformance summary

torch 2.13.0+cpu, backend gloo, device cpu, world size 2, 2 CPUs, started 2026-01-02T03:04:05+00:00··
ddp-conformance at 0123456789ab (dirty)··
candidate `tests.defective:JoinHookDoesNotShadow` 1.0··

Verdicts: TIMEOUT 1

## Diagnosis

```
diagnosis of `tests.defective:JoinHookDoesNotShadow`: 1 cause for 1 unexpected verdict
  1. `join-not-shadowed` (1 case): ranks hang in collectives after a rank joined: the joined rank does not shadow them
     shows in join
     look first at `join/uneven-divide-by-initial[tests.defective:JoinHookDoesNotShadow]`: `ddp-conformance repro join/uneven-divide-by-initial --candidate tests.defective:JoinHookDoesNotShadow --world-size 2`
```

Unexpected verdicts by the check that failed first:

| check (first failed)   | cases   | causes              |
|------------------------|---------|---------------------|
| TIMEOUT                | 1       | join-not-shadowed 1 |

## Failures by cause

### `join-not-shadowed`: 1 case

#### TIMEOUT `join/uneven-divide-by-initial[tests.defective:JoinHookDoesNotShadow]`

[join-not-shadowed] ranks hang in collectives after a rank joined: the joined rank does not shadow them··
no progress within 8s: rank(s) 0, 1 still running; rank 0 at all_reduce (distributed_c10d.py:2810) called from forward (defective.py:58); rank 1 at __exit__ (join.py:274)

rank 0 stack:

```
Thread 0x00007f2e5d7fe6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 629 in wait

Current thread 0x00007f2e6c1b2740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2810 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1421 in _check_global_requires_backward_grad_sync
  File "/src/tests/defective.py", line 58 in forward
  File "/src/ddp_conformance/ranks/procedure.py", line 88 in run_steps
```

rank 1 stack:

```
Current thread 0x00007f9a0c4d1740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/algorithms/join.py", line 274 in __exit__
  File "/src/ddp_conformance/ranks/procedure.py", line 97 in run_steps
```

## Verdict matrix

| scenario                      | tests.defective:JoinHookDoesNotShadow   |
|-------------------------------|-----------------------------------------|
| join/uneven-divide-by-initial | TIMEOUT                                 |

## Slowest cases

The one case (8.0 s in all), seconds per phase. The reference DDP's run and the oracle are cached per scenario: each is charged to the case that ran it.

| case                                                                 | verdict   |   seconds |
|----------------------------------------------------------------------|-----------|-----------|
| join/uneven-divide-by-initial[tests.defective:JoinHookDoesNotShadow] | TIMEOUT   |     8.020 |
""")

    def test_timeout_pytest_evidence(self) -> None:
        self.assertExpectedInline("\n".join(describe(timeout_result())), """\
TIMEOUT: join/uneven-divide-by-initial[tests.defective:JoinHookDoesNotShadow]: [join-not-shadowed] ranks hang in collectives after a rank joined: the joined rank does not shadow them
  no progress within 8s: rank(s) 0, 1 still running; rank 0 at all_reduce (distributed_c10d.py:2810) called from forward (defective.py:58); rank 1 at __exit__ (join.py:274)
--- rank 0 stack ---
Thread 0x00007f2e5d7fe6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 629 in wait

Current thread 0x00007f2e6c1b2740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2810 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1421 in _check_global_requires_backward_grad_sync
  File "/src/tests/defective.py", line 58 in forward
  File "/src/ddp_conformance/ranks/procedure.py", line 88 in run_steps

--- rank 1 stack ---
Current thread 0x00007f9a0c4d1740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/algorithms/join.py", line 274 in __exit__
  File "/src/ddp_conformance/ranks/procedure.py", line 97 in run_steps
""")
