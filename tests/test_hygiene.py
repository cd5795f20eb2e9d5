"""Every case as if on fresh ranks: a rank puts back what a job changed, or retires, and
ends every process the job started (ranks/hygiene.py, ranks/orphans.py); hostile
candidates (tests/hostile.py) run before torch in one run change none of torch's verdicts,
and the report names what they left."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ddp_conformance.ranks.hygiene import Fingerprint
from ddp_conformance.ranks.leaks import Hygiene, LeakLedger
from ddp_conformance.ranks.orphans import become_subreaper, end_descendants
from tests.deadlines import deadline

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ("DefaultDeviceMeta", "PatchesTensorAdd", "GlobalForwardHook", "EntersFunctionMode",
           "PatchesAllReduce", "MkldnnOff", "ThreadIssuingCollectives", "StartsChildren")
#: What the run's notes must say of each hostile candidate.
NAMED = {"DefaultDeviceMeta": "default device meta",
         "PatchesTensorAdd": "torch.Tensor.add_",
         "GlobalForwardHook": "_global_forward_hooks",
         "EntersFunctionMode": "_ScalesLinear",
         "PatchesAllReduce": "torch.distributed.all_reduce",
         "MkldnnOff": "torch.backends.mkldnn.enabled",
         "ThreadIssuingCollectives": "hostile-collectives",
         "StartsChildren": "process(es) it started"}


def test_fingerprint_puts_back_what_it_can() -> None:
    fp = Fingerprint()
    torch.backends.mkldnn.enabled = False
    torch.set_default_dtype(torch.float64)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    os.environ["DDP_CONFORMANCE_TEST_LEAK"] = "1"
    try:
        found = fp.check()
    finally:
        handle.remove()
    assert not found.retire, found
    assert torch.backends.mkldnn.enabled and torch.get_default_dtype() is torch.float32
    assert not torch.nn.modules.module._global_forward_hooks
    assert "DDP_CONFORMANCE_TEST_LEAK" not in os.environ
    text = "; ".join(found.restored)
    for what in ("mkldnn.enabled", "default_dtype", "_global_forward_hooks",
                 "DDP_CONFORMANCE_TEST_LEAK"):
        assert what in text, text
    assert not fp.check(), "a second check finds nothing: the state was put back"


def test_fingerprint_ends_only_the_processes_started_after_it() -> None:
    """A process that fingerprints itself (this test's) keeps the children it had: the
    check ends what the job started, not a session's rank pools."""
    before = subprocess.Popen(["sleep", "300"])
    try:
        fp = Fingerprint()
        after = subprocess.Popen(["sleep", "301"])
        found = fp.check()
        assert len(found.ended) == 1 and "sleep 301" in found.ended[0], found
        with pytest.raises(ProcessLookupError):  # ended and reaped
            os.kill(after.pid, 0)
        assert before.poll() is None, "a child from before the fingerprint was ended"
    finally:
        before.kill()
        before.wait()


def test_fingerprint_retires_what_it_cannot() -> None:
    fp = Fingerprint()
    original = dist.all_reduce
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="foreign-thread", daemon=True)
    thread.start()
    dist.all_reduce = lambda *a, **k: None  # type: ignore[assignment]
    try:
        found = fp.check()
    finally:
        dist.all_reduce = original
        stop.set()
        thread.join()
    text = "; ".join(found.retired)
    assert "torch.distributed.all_reduce" in text and "foreign-thread" in text, text
    torch.set_default_device("meta")
    found = fp.check()
    assert "default device meta" in "; ".join(found.restored), found
    assert torch.get_default_device() == torch.device("cpu") and not fp.check()


def _sleeper(setsid: bool) -> None:
    pid = os.fork()
    if pid == 0:
        try:
            if os.fork():
                os._exit(0)
            if setsid:
                os.setsid()
            time.sleep(300)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def test_orphans_of_a_subreaper_are_ended() -> None:
    """In a child process (a subreaper for good): double forks, with and without setsid."""
    code = ("import os, time, json\n"
            "from tests.test_hygiene import _sleeper\n"
            "from ddp_conformance.ranks.orphans import become_subreaper, end_descendants\n"
            "assert become_subreaper()\n"
            "_sleeper(False); _sleeper(True)\n"
            "import subprocess; subprocess.Popen(['sleep', '300'])\n"
            "time.sleep(0.2)\n"
            "print(json.dumps([end_descendants(), end_descendants()]))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True)
    first, second = json.loads(out.stdout)
    assert len(first) == 3 and any("sleep 300" in e for e in first), first
    assert second == []
    assert become_subreaper is not None and end_descendants is not None


def test_ledger_names_each_change_once() -> None:
    ledger = LeakLedger()
    h = Hygiene(restored=("a",), retired=("b",), ended=("pid 1 (x)",))
    first = ledger.record("X", {0: h, 1: h})
    assert "a (put back)" in first and "b (the rank was retired)" in first and "2 process" in first
    assert "a (put back)" not in ledger.record("X", {0: h})
    assert ledger.record("Y", {}) == ""
    (line,) = ledger.notes()
    assert "candidate X" in line and "3 process(es)" in line


def _marked(token: str) -> list[int]:
    """Processes whose environment carries ``HOSTILE_RUN=token``."""
    needle = f"HOSTILE_RUN={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read():
                    with open(f"/proc/{entry}/stat", "rb") as s:
                        if s.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                            found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_hostile_candidates_change_no_verdict_of_torch(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    report = tmp_path / "report"
    cmd = [sys.executable, "-m", "ddp_conformance", "run", "--timeout", "120",
           "-k", "gradients/mlp-sgd", "--report-dir", str(report),
           *(a for name in HOSTILE for a in ("--candidate", f"tests.hostile:{name}")),
           "--candidate", "torch"]
    env = {**os.environ, "HOSTILE_RUN": token}
    try:
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=deadline(900))
        left = _marked(token)
    finally:
        for pid in _marked(token):  # nothing of this test survives it, whatever happened
            os.kill(pid, 9)
    assert not left, f"processes of the run left: {left}"
    results = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()
               if line.strip()]
    torch_verdicts = {r["scenario"]: (r["verdict"], r["reason"][:300]) for r in results
                      if r.get("type") == "result" and r.get("candidate") == "torch"}
    assert len(torch_verdicts) == 2, run.stdout + run.stderr
    assert {v for v, _ in torch_verdicts.values()} == {"PASS"}, torch_verdicts
    summary = (report / "summary.md").read_text()
    for name, what in NAMED.items():
        lines = [n for n in summary.splitlines() if f"left by candidate tests.hostile:{name} " in n]
        assert lines and what in lines[0], (name, what, lines)
