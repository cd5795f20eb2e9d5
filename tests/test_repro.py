"""``ddp-conformance repro``: standalone scripts that fail with a defective DDP and pass with
torch's, under torchrun, with nothing of the harness imported."""
from __future__ import annotations

import builtins
import re
import socket
import subprocess
import symtable
import sys
import time
from pathlib import Path

import pytest

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.errors import UsageError
from ddp_conformance.repro import model_source, parse_case, write_file, write_script

ROOT = Path(__file__).resolve().parent.parent
#: Seconds one torchrun of a reproducer may take (a hang fails the test, never blocks it).
DEADLINE_S = 150


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(script: Path, *args: str, ranks: int = 2) -> subprocess.CompletedProcess[str]:
    """torchrun with a static rendezvous on a free port (what --standalone sets up, without
    its c10d rendezvous round), within :data:`DEADLINE_S`."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
         str(ranks), "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
         str(script), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE_S)


def _script(case: str, candidate: str, directory: Path, ranks: int = 2) -> Path:
    """The reproducer written by the CLI, as a user gets it; checked to import nothing of
    the harness."""
    out = subprocess.run([sys.executable, "-m", "ddp_conformance", "repro", case,
                          "--candidate", candidate, "--world-size", str(ranks),
                          "--out", str(directory)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    script = Path(out.stdout.splitlines()[0])
    assert not re.search(r"^\s*(import|from)\s+(ddp_conformance|ddp_reference)",
                         script.read_text(), re.M)
    return script


def _fails_then_passes(script: Path, evidence: str, ranks: int = 2) -> None:
    failing = _torchrun(script, ranks=ranks)
    assert failing.returncode != 0
    assert evidence in failing.stderr, failing.stderr[-3000:]
    passing = _torchrun(script, "--ddp", "torch", ranks=ranks)
    assert passing.returncode == 0, passing.stderr[-3000:]
    assert "PASS: torch matches the single-process result" in passing.stdout


@pytest.mark.parametrize("mutant, case, evidence", [
    ("tests.mutants.reduction:SumsWithoutDividing",
     "Scenario('fuzz/shrunk-fce8771e94', 'mlp', steps=1, batch_size=1, seed=0)",
     "step 0, '0.weight': gradient: max abs error"),
    ("tests.mutants.sync:NeverBroadcastsBuffers",
     "Scenario('fuzz/shrunk-fa34c26d6c', 'conv_bn', steps=1, batch_size=1, microbatches=2, seed=0)",
     "'bn.running_mean': buffer at the start of microbatch 1's forward"),
    ("tests.mutants.reduction:ReducesInFloat16", "gradients/mlp-sgd",
     "gradient: max abs error"),
    ("tests.mutants.sync:NoSyncIgnored",
     "Scenario('fuzz/shrunk-0dc10fc2f4', 'mlp', steps=1, batch_size=1, microbatches=2, "
     "accumulate='no_sync', seed=0)",
     "step 0, microbatch 0 (inside no_sync): allreduce float32"),
    # The collective volume: values right, every bucket reduced twice.
    ("tests.mutants.reduction:ReducesEveryBucketTwice",
     "Scenario('fuzz/shrunk-0bcc314af2', 'mlp', steps=1, batch_size=1, seed=0)",
     "2.00x the model: reduced more than once"),
    # Join: the divisor once rank 1 has joined (rank 0 alone at step 3 divides by 1) ...
    ("tests.mutants.join:JoinIgnoresDivideByInitialWorldSize", "join/uneven-divide-by-active",
     "rank 0, step 3, '0.weight': gradient: max abs error"),
    # ... and the final model sync from the last joiner when Join exits.
    ("tests.mutants.join:JoinSkipsFinalModelSync", "join/uneven-divide-by-initial",
     "rank 1, after training, '0.weight': parameter differs from rank 0's"),
    # A sync strategy: single_auto_sync's no_sync window of 2 microbatches.
    ("tests.mutants.sync:NoSyncIgnored", "sync-strategy/single-auto-sync-3-microbatches",
     "microbatch 0 (inside no_sync): allreduce float32"),
    # ZeroRedundancyOptimizer joined with DDP.
    ("tests.mutants.reduction:SumsWithoutDividing", "join/zero-redundancy-optimizer",
     "step 0, '0.weight': gradient: max abs error"),
    # An expected error: DDP must refuse a second comm hook.
    ("tests.mutants.hooks:SecondCommHookAccepted", "errors/comm-hook-registered-twice",
     "finished its 3 steps without raising; expected an error matching "
     "'can only be called once'"),
])
def test_the_reproducer_fails_with_the_mutant_and_passes_with_torch(
        mutant: str, case: str, evidence: str, tmp_path: Path) -> None:
    _fails_then_passes(_script(case, mutant, tmp_path), evidence)


def test_a_subgroup_reproducer_at_its_world_size(tmp_path: Path) -> None:
    """A group of 2 inside a world of 3 (rank 2 idle): the mutant's init sync broadcasts
    from the group's last rank."""
    script = _script("process-groups/pair-in-three", "tests.mutants.sync:InitSyncFromLastRank",
                     tmp_path, ranks=3)
    _fails_then_passes(script, "rank 0, after wrapping, '0.weight': parameter (DDP's init sync",
                       ranks=3)


#: Scenarios the script still refuses at 2 ranks, by id prefix, with the reason's words.
REFUSED_AT_2 = {"process-groups/": "is defined for world size"}

#: A varied sample of the catalog run with torch's DDP: Join with buffers, ZeRO, an expected
#: error under Join and one in training, PowerSGD, the fp16 hook, forced_sync, a sparse
#: embedding, mixed dtypes, BatchNorm under no_sync.
SAMPLE = ("join/uneven-buffers", "join/zero-redundancy-optimizer",
          "join/throw-on-early-termination", "errors/unused-without-find-unused",
          "comm-hooks/powersgd-full-rank", "comm-hooks/fp16-compress",
          "sync-strategy/forced-sync-3-microbatches", "models/sparse-embedding",
          "buckets/mixed-dtypes", "buffers/conv-bn-no-sync")


def test_every_catalog_scenario_is_written_or_refused_with_a_reason() -> None:
    written, refused = [], {}
    for scenario in load_catalog():
        try:
            written.append(write_script(scenario, "torch", 2))
        except UsageError as exc:
            refused[scenario.id] = str(exc)
    for case, why in refused.items():
        assert why.startswith(f"repro: {case} ") or why.startswith("repro: model "), why
        assert "\n" not in why
    for prefix, words in REFUSED_AT_2.items():
        for case in (s.id for s in load_catalog() if s.id.startswith(prefix)):
            assert words in refused[case], refused.get(case)
    for case in SAMPLE:
        assert case not in refused, refused[case]
    for script in written:
        assert not _undefined_names(script), _undefined_names(script)


def _undefined_names(source: str) -> set[str]:
    """Names a script reads that nothing in it defines (a NameError waiting to happen)."""
    top = symtable.symtable(source, "<repro>", "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    defined |= set(dir(builtins))
    missing: set[str] = set()
    pending = [top]
    while pending:
        table = pending.pop()
        for symbol in table.get_symbols():
            if symbol.is_referenced() and (table is top or symbol.is_global()) \
                    and symbol.get_name() not in defined:
                missing.add(symbol.get_name())
        pending.extend(table.get_children())
    return missing


def test_a_sample_of_the_catalog_passes_with_torch(tmp_path: Path) -> None:
    start, failures = time.monotonic(), []
    for case in SAMPLE:
        scenario = parse_case(case)
        script = Path(write_file(write_script(scenario, "torch", 2), scenario, str(tmp_path)))
        run = _torchrun(script, "--ddp", "torch")
        if run.returncode != 0 or "PASS: torch" not in run.stdout:
            failures.append(f"{case}: {run.stderr[-1500:]}")
    assert not failures, "\n".join(failures)
    print(f"{len(SAMPLE)} reproducers passed with torch in {time.monotonic() - start:.1f}s")


def test_model_source_takes_what_the_model_needs_only() -> None:
    source = model_source("conv_bn")
    assert "class ConvBN" in source and "def _image_batch" in source and "SPEC = ModelSpec(" in source
    assert "class Tied" not in source and "def build_mlp" not in source
    compile(source, "<conv_bn>", "exec")


def test_the_comm_hook_is_the_harness_s_copied() -> None:
    script = write_script(parse_case("comm-hooks/powersgd-full-rank"), "torch", 2)
    assert "matrix_approximation_rank=16" in script and "start_powerSGD_iter=2" in script
    assert "def comm_hook(process_group):" in script
    script = write_script(parse_case("comm-hooks/returns-new-tensor"), "torch", 2)
    assert "def _allreduce_to_new_tensor(group, bucket)" in script


def test_refusals_and_bad_cases_are_one_line_errors() -> None:
    with pytest.raises(UsageError, match="defined for world size 3, not 2 ranks"):
        write_script(parse_case("process-groups/pair-in-three"), "torch", 2)
    assert "GROUPS = [[0, 1]]" in write_script(parse_case("process-groups/pair-in-three"),
                                               "torch", 3)
    with pytest.raises(UsageError, match="uses a backend other than Gloo"):
        write_script(Scenario("a/b", "mlp", backends=("nccl",)), "torch", 2)
    with pytest.raises(UsageError, match="the candidate must be module:attr"):
        write_script(Scenario("a/b", "mlp"), "reference", 2)
    with pytest.raises(UsageError, match="no scenario 'nosuch'"):
        parse_case("nosuch")
    with pytest.raises(UsageError, match="not a Scenario literal"):
        parse_case("Scenario('x', nosuch=1)")
    assert parse_case("Scenario('a/b', 'mlp', steps=2)") == Scenario("a/b", "mlp", steps=2)
