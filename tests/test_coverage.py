"""``--coverage TARGET``: what a run executes of a user's DDP, measured in the parent and in
every rank, from the command line and from pytest (with and without xdist workers)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.deadlines import deadline

pytest.importorskip("coverage")

from ddp_conformance.errors import UsageError  # noqa: E402
from ddp_conformance.ranks import coverage_hook  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = "gradients/mlp-sgd or options/static-graph"

#: A user's DDP: ``_marked`` runs only inside the ranks (in forward), ``never_called`` never.
USER_DDP = textwrap.dedent('''
    from torch.nn.parallel import DistributedDataParallel


    class MyDDP(DistributedDataParallel):
        def forward(self, *inputs, **kwargs):
            return self._marked(super().forward(*inputs, **kwargs))

        def _marked(self, output):
            return output

        def never_called(self):
            return 42
''')


@pytest.fixture
def user_package(tmp_path: Path) -> Path:
    (tmp_path / "myddp.py").write_text(USER_DDP)
    return tmp_path


def _env(path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(path), str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _file_row(summary: dict, name: str) -> dict:
    rows = [r for r in summary["files"] if os.path.basename(r["file"]) == name]
    assert len(rows) == 1, summary["files"]
    return rows[0]


def _check_user_summary(summary: dict, processes_at_least: int) -> None:
    row = _file_row(summary, "myddp.py")
    # The class body and its three defs run at import (in every rank); forward and
    # _marked run only in the ranks, inside the catalog's training steps.
    assert "MyDDP.never_called" in row["never_entered"]
    assert "MyDDP._marked" not in row["never_entered"]
    assert "MyDDP.forward" not in row["never_entered"]
    assert row["statements"] == 8 and row["covered"] == 7, row
    assert summary["processes"] >= processes_at_least


def test_cli_measures_the_users_ddp_in_every_rank(user_package: Path, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    proc = subprocess.run(
        [sys.executable, "-m", "ddp_conformance", "run", "--candidate", "myddp:MyDDP",
         "-k", SCENARIOS, "--coverage", "myddp", "--report-dir", str(reports)],
        cwd=user_package, env=_env(user_package), capture_output=True, text=True, timeout=deadline(300))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((reports / "coverage" / "summary.json").read_text())
    _check_user_summary(summary, processes_at_least=3)  # the parent and two ranks
    markdown = (reports / "summary.md").read_text()
    assert "## Coverage" in markdown and "MyDDP.never_called" in markdown
    assert "MyDDP.never_called" in (reports / "report.html").read_text()
    assert (reports / "coverage" / "coverage.json").exists()
    # Re-rendering the set from the directory keeps the section.
    (reports / "summary.md").unlink()
    again = subprocess.run([sys.executable, "-m", "ddp_conformance", "report", str(reports)],
                           cwd=user_package, env=_env(user_package), capture_output=True,
                           text=True, timeout=deadline(120))
    assert again.returncode == 0, again.stderr
    assert "MyDDP.never_called" in (reports / "summary.md").read_text()


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_pytest_route_measures_too(user_package: Path, workers: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "ddp_conformance_suites", "-k", SCENARIOS,
         "--ddp-candidate", "myddp:MyDDP", "--ddp-coverage", "myddp", "-p", "no:cacheprovider",
         "-q", *workers],
        cwd=user_package, env=_env(user_package), capture_output=True, text=True, timeout=deadline(300))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ddp-conformance coverage" in proc.stdout and "myddp.py" in proc.stdout
    summary = json.loads((user_package / "reports" / "coverage" / "summary.json").read_text())
    _check_user_summary(summary, processes_at_least=3)


def test_a_run_without_coverage_drops_an_earlier_section(user_package: Path,
                                                         tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    base = [sys.executable, "-m", "ddp_conformance", "run", "--candidate", "myddp:MyDDP",
            "-k", "gradients/mlp-sgd", "--report-dir", str(reports)]
    first = subprocess.run([*base, "--coverage", "myddp"], cwd=user_package,
                           env=_env(user_package), capture_output=True, text=True, timeout=deadline(300))
    assert first.returncode == 0 and "## Coverage" in (reports / "summary.md").read_text()
    second = subprocess.run(base, cwd=user_package, env=_env(user_package),
                            capture_output=True, text=True, timeout=deadline(300))
    assert second.returncode == 0, second.stderr
    assert "## Coverage" not in (reports / "summary.md").read_text()


def test_unknown_target_is_a_one_line_usage_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ddp_conformance", "run", "--coverage", "no_such_module_xyz",
         "--report-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=deadline(120))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "ddp-conformance: error: --coverage 'no_such_module_xyz': neither a path nor an "
        "importable module or package"]


def test_targets_resolve_without_importing(tmp_path: Path) -> None:
    files = coverage_hook.resolve_target("torch.distributed.algorithms.ddp_comm_hooks")
    assert any(f.endswith("powerSGD_hook.py") for f in files)
    assert all(f.endswith(".py") for f in files)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    assert coverage_hook.resolve_target(str(tmp_path / "pkg")) == [
        os.path.realpath(tmp_path / "pkg" / "a.py")]
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no Python file"):
        coverage_hook.resolve_target(str(tmp_path / "empty"))


def test_without_coverage_installed_the_error_names_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = coverage_hook.importlib.util.find_spec
    monkeypatch.setattr(coverage_hook.importlib.util, "find_spec",
                        lambda name, *a: None if name == "coverage" else real(name, *a))
    with pytest.raises(UsageError, match=r"pip install 'ddp-conformance\[coverage\]'"):
        coverage_hook.setup_for(["torch.nn.parallel.distributed"], "reports")
