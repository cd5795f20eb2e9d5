"""``ddp-conformance repro``: standalone scripts that fail with a defective DDP and pass with
torch's, under torchrun, with nothing of the harness imported."""
from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.errors import UsageError
from ddp_conformance.repro import model_source, parse_case, write_script

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """torchrun with a static rendezvous on a free port (what --standalone sets up, without
    its c10d rendezvous round)."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(script), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("mutant, literal, evidence", [
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
     "microbatch 0: 1 reducing collective(s) in a backward inside no_sync"),
])
def test_the_reproducer_fails_with_the_mutant_and_passes_with_torch(
        mutant: str, literal: str, evidence: str, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "ddp_conformance", "repro", literal,
                          "--candidate", mutant, "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    script = Path(out.stdout.splitlines()[0])
    text = script.read_text()
    assert not re.search(r"^\s*(import|from)\s+(ddp_conformance|ddp_reference)", text, re.M)
    failing = _torchrun(script)
    assert failing.returncode != 0
    assert evidence in failing.stderr, failing.stderr[-3000:]
    passing = _torchrun(script, "--ddp", "torch")
    assert passing.returncode == 0, passing.stderr[-3000:]
    assert "PASS: torch matches the single-process result" in passing.stdout


def test_model_source_takes_what_the_model_needs_only() -> None:
    source = model_source("conv_bn")
    assert "class ConvBN" in source and "def _image_batch" in source and "SPEC = ModelSpec(" in source
    assert "class Tied" not in source and "def build_mlp" not in source
    compile(source, "<conv_bn>", "exec")


def test_unsupported_procedures_and_bad_cases_are_one_line_errors() -> None:
    with pytest.raises(UsageError, match="Join"):
        write_script(parse_case("join/uneven-divide-by-initial"), "torch", 2)
    with pytest.raises(UsageError, match="no scenario 'nosuch'"):
        parse_case("nosuch")
    with pytest.raises(UsageError, match="not a Scenario literal"):
        parse_case("Scenario('x', nosuch=1)")
    assert parse_case("Scenario('a/b', 'mlp', steps=2)") == Scenario("a/b", "mlp", steps=2)
