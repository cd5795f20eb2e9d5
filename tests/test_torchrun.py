"""torchrun mode: two "nodes" on localhost with a c10d rendezvous, one result set.

The cases include PowerSGD: its hook keeps the process group alive in future callbacks,
which aborted ranks whose groups were destroyed under it (the rank runtime keeps destroyed
groups until the next job, for the pool and torchrun alike)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from ddp_conformance.ranks.torchrun import detect
from tests.deadlines import deadline


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_detect_needs_the_whole_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert detect() is None
    env = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert detect() == {"rank": 1, "world_size": 4, "local_rank": 1, "local_world_size": 2,
                        "master": "node0:29500"}


def test_two_nodes_on_localhost(tmp_path: object) -> None:
    report = os.path.join(str(tmp_path), "reports")
    port = _free_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
           "--rdzv-id", f"ddpc{port}", "-m", "ddp_conformance", "run",
           "-k", "gradients/mlp-adam or no-sync or comm-hooks/powersgd", "--timeout", "30",
           "--report-dir", report]
    nodes = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=deadline(240))[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(outputs)
    leader = [o for o in outputs if "ddp-conformance:" in o and "cases" in o]
    assert len(leader) == 1, outputs  # one result set, written by global rank 0
    with open(os.path.join(report, "results.jsonl")) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    cases = [r for r in lines if "verdict" in r]
    # Scenarios the -k expression takes that need more ranks than two are N/A.
    assert cases and {r["verdict"] for r in cases} <= {"PASS", "N/A"}, cases
    assert any(r["verdict"] == "PASS" for r in cases), cases
    assert "2 PASS" in leader[0] or "PASS" in leader[0]
