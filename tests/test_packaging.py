"""The distribution ships every package of the layered core (pyproject lists them by hand,
because ``reference/`` and ``suites/`` install under other names), the expectations files
and the entry points; the built wheel's files, installed away from this tree, run."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.deadlines import deadline

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_directory_is_listed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts)
               for p in (ROOT / "ddp_conformance").rglob("__init__.py")}
    assert on_disk <= listed, sorted(on_disk - listed)
    assert {"ddp_reference", "ddp_conformance_suites"} <= listed


#: What the tree holds that is not source: left out of the copy the distribution is built from.
_NOT_SOURCE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", ".tox", ".venv",
                                     "reports", "__pycache__", ".mypy_cache", ".ruff_cache")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build``'s sdist and wheel (the wheel built from the sdist), built from a
    copy of the tree so that nothing is written into it; offline (``--no-isolation``: the
    installed setuptools builds)."""
    pytest.importorskip("build")
    source = tmp_path_factory.mktemp("source") / "ddp-conformance"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out),
                           str(source)], capture_output=True, text=True, timeout=deadline(300))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_the_wheel_holds_every_package_the_expectations_and_the_entry_points(dist: Path) -> None:
    (wheel,) = dist.glob("ddp_conformance-*.whl")
    assert len(list(dist.glob("ddp_conformance-*.tar.gz"))) == 1
    names = set(zipfile.ZipFile(wheel).namelist())
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    renamed = {"ddp_reference": "reference", "ddp_conformance_suites": "suites"}
    for package in listed:
        folder = ROOT.joinpath(*renamed.get(package, package).split("."))
        for module in folder.glob("*.py"):
            assert f"{package.replace('.', '/')}/{module.name}" in names, module
    expectations = sorted((ROOT / "ddp_conformance/builtins/expectations").glob("*.txt"))
    assert expectations and all(f"ddp_conformance/builtins/expectations/{p.name}" in names
                                for p in expectations)
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "ddp-conformance = ddp_conformance.cli:main" in text
    assert "ddp_conformance = ddp_conformance.pytest_plugin" in text


def test_the_installed_wheel_runs(dist: Path, tmp_path: Path) -> None:
    """The wheel's files alone (installed to a directory, away from this tree) run a few
    cases: the reference DDP, the catalog and torch's expectations file come with it."""
    (wheel,) = dist.glob("ddp_conformance-*.whl")
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                           "--target", str(target), str(wheel)],
                          capture_output=True, text=True, timeout=deadline(300))
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run([sys.executable, "-c", "import ddp_conformance, ddp_reference, "
                            "ddp_conformance_suites as s; print(ddp_conformance.__file__); "
                            "print(ddp_reference.__file__); print(s.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=deadline(60))
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(target)) for line in where.stdout.splitlines()), where.stdout
    run = subprocess.run([sys.executable, "-m", "ddp_conformance", "run", "-k", "exact-dyadic",
                          "--candidate", "torch", "--candidate", "reference",
                          "--report-dir", str(tmp_path / "reports")],
                         cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=deadline(300))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "4 PASS" in run.stdout, run.stdout
