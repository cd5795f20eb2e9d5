"""Installing this package never changes another project's pytest run.

Each test builds a scratch repository (its own ``conftest.py`` and tests) and runs pytest in
it, with this package installed as it is for these tests: the plugin is loaded through its
``pytest11`` entry point, exactly as in a user's CI.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.deadlines import deadline

#: A conftest.py as common in ML repositories: the short names this plugin would like too.
CONFTEST = '''
def pytest_addoption(parser):
    parser.addoption("--device", default="cpu")
    parser.addoption("--backend", default="inductor")
    parser.addoption("--world-size", type=int, default=8)
    parser.addoption("--candidate", default="theirs")
'''


def _pytest(repo: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=deadline(timeout))


def _repo(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def test_a_conftest_keeps_its_options_and_pays_nothing(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"conftest.py": CONFTEST, "test_theirs.py": '''
        import sys

        SCENARIOS = ["not", "ours"]  # a name this plugin collects, but not scenarios


        def test_options_are_theirs(request):
            get = request.config.getoption
            assert (get("device"), get("backend"), get("world_size"), get("candidate")) == \\
                ("cuda", "inductor", 3, "mine")


        def test_plugin_imported_nothing_heavy():
            assert "torch" not in sys.modules
            assert "ddp_conformance.pytest_items" not in sys.modules
    '''})
    proc = _pytest(repo, "--device", "cuda", "--world-size", "3", "--candidate", "mine")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout
    # No header, no summary: not a conformance run (pytest's own "plugins:" line lists it).
    assert not [line for line in proc.stdout.splitlines()
                if "ddp-conformance" in line and not line.startswith("plugins:")], proc.stdout
    plain = _pytest(repo, "-p", "no:ddp_conformance", "--device", "cuda", "--world-size", "3",
                    "--candidate", "mine")
    assert plain.returncode == 0 and "2 passed" in plain.stdout  # the same without the plugin


def test_namespaced_options_when_the_short_ones_are_taken(tmp_path: Path) -> None:
    """The documented CI route: the installed suites against a candidate of the user's own."""
    repo = _repo(tmp_path, {"conftest.py": CONFTEST, "mypkg_ddp.py": '''
        from torch.nn.parallel import DistributedDataParallel


        class MyDDP(DistributedDataParallel):
            """The user's DDP (here torch's own, so everything passes)."""
    '''})
    proc = _pytest(repo, "--pyargs", "ddp_conformance_suites", "--ddp-candidate",
                   "mypkg_ddp:MyDDP", "--ddp-world-size", "2", "--device", "ignored-by-us",
                   "-k", "mlp-sgd and not momentum or window-of-3", "-q", "-rA")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "PASSED test_gradients.py::gradients/mlp-sgd[mypkg_ddp:MyDDP]" in proc.stdout
    assert "2 passed" in proc.stdout, proc.stdout[-2000:]
    assert "candidates mypkg_ddp:MyDDP" in proc.stdout  # the run's summary line


@pytest.mark.parametrize("bad", [["--ddp-candidate", "nosuch.module:X"],
                                 ["--ddp-backend", "mpi"]])
def test_bad_namespaced_options_stop_with_one_line(tmp_path: Path, bad: list[str]) -> None:
    repo = _repo(tmp_path, {"conftest.py": CONFTEST})
    proc = _pytest(repo, "--pyargs", "ddp_conformance_suites", "-k", "gradients/mlp-sgd", *bad,
                   timeout=deadline(120))
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "ddp-conformance:" in proc.stderr and "Traceback" not in proc.stderr
