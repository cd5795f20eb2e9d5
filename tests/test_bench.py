"""The bench machinery on real ranks with a tiny model and 1-2 steps (not a timed test):
collectives and bytes counted through the tracing process group, overlap probes, the
paper's experiments, bench.json and its place in the report."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from ddp_conformance.bench.experiments import bucket_sweep, no_sync, overlap
from ddp_conformance.bench.models import MODELS, size_of
from ddp_conformance.bench.run import BenchConfig, run_bench
from ddp_conformance.bench.timing import bench_model
from ddp_conformance.errors import UsageError
from ddp_conformance.report.timing import model_rows
from tests.distributed import pool_for, run_distributed

# warm-up 2: the first step ends with the bucket rebuild (and its broadcast of the layout)
TINY = {"model": "tiny", "candidates": ["torch", "reference"], "steps": 2, "rounds": 2, "warmup": 2}


def test_bench_model_counts_collectives_bytes_and_probes_overlap() -> None:
    rank0, rank1 = run_distributed(bench_model, 2, {**TINY, "local": True, "probe_steps": 2})
    assert rank1 is None
    params, tensors, grad_bytes = size_of(MODELS["tiny"].factory())
    assert (rank0["params"], rank0["tensors"], rank0["grad_bytes"]) == (params, tensors, grad_bytes) \
        == (108, 4, 432)
    for name in ("torch", "reference"):
        c = rank0["candidates"][name]
        assert [len(r) for r in c["rounds"]] == [2, 2]
        assert len(c["phases"]["backward"]) == 4
        # one bucket: one allreduce of every gradient byte per step, nothing else
        assert c["collectives"] == {"allreduce": {"calls": 1.0, "bytes": 432.0}}
        probe = c["probe"]
        assert probe["allreduces"] == [1.0, 1.0] and probe["bytes"] == [432.0, 432.0]
        # the only bucket holds the last gradient: it cannot be launched before backward's
        # last hook, and it has completed by the time backward returns
        assert probe["launched_before_last_hook"] == [0.0, 0.0]
        # A completion is time-stamped in the work's future callback, on Gloo's thread,
        # which may run just after backward (which waited for the work) returns: so the
        # count is at most the allreduces, never more, and never negative.
        assert all(0.0 <= c <= a for c, a in zip(probe["completed_before_return"],
                                                  probe["allreduces"], strict=True))
    assert rank0["candidates"]["local"]["collectives"] == {}
    assert len(rank0["raw_allreduce_s"]) == 4
    rows = {r["candidate"]: r for r in model_rows(rank0, 2)}
    assert rows["torch"]["ratio"] == (1.0, 1.0, 1.0)
    assert rows["reference"]["grad_busbw"] > 0 and rows["reference"]["raw_busbw"] > 0


def test_paper_experiments_run_on_a_tiny_model() -> None:
    cfg = {**TINY, "steps": 1, "rounds": 1}
    sweep = run_distributed(bucket_sweep, 2, {**cfg, "caps": [0.0001, 25]})[0]
    assert set(sweep["times"]) == {"torch|0.0001", "torch|25", "reference|0.0001", "reference|25"}
    ns = run_distributed(no_sync, 2, {**cfg, "ns": [1, 2]})[0]
    assert set(ns["times"]) == {"torch|1", "torch|2", "reference|1", "reference|2"}
    ov = run_distributed(overlap, 2, cfg)[0]
    assert set(ov["times"]) == {"torch|overlap", "torch|forced_sync", "reference|overlap",
                                "reference|forced_sync"}


def test_bench_command_merges_bench_json_and_renders_the_report(tmp_path: Path) -> None:
    out = io.StringIO()
    cfg = BenchConfig(candidates=["reference"], models=["tiny"], steps=1, rounds=2, warmup=1,
                      report_dir=str(tmp_path))
    run_bench(cfg, out, pool=pool_for(2))
    cfg.experiment = "overlap"
    run_bench(cfg, out, pool=pool_for(2))
    data = json.loads((tmp_path / "bench.json").read_text())
    assert list(data["timing"]["models"]["tiny"]["candidates"]) == ["torch", "reference"]  # baseline added
    assert set(data["experiments"]) == {"overlap:tiny"}
    assert data["timing"]["info"]["world_size"] == 2 and "commit" in data["timing"]["info"]
    html = (tmp_path / "report.html").read_text()
    assert "Timing" in html and "overlap:tiny" in html and html.count("data:image/png;base64,") >= 3
    assert "ratio to torch" in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize("kwargs, message", [
    ({"experiment": "nope"}, "unknown experiment"),
    ({"models": ["nope"]}, "unknown benchmark model"),
    ({"world_size": 1}, "at least 2"),
    ({"candidates": ["nosuch.module:X"]}, "unknown candidate"),
])
def test_bench_usage_errors(kwargs: dict[str, object], message: str, tmp_path: Path) -> None:
    cfg = BenchConfig(report_dir=str(tmp_path), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=message):
        run_bench(cfg, io.StringIO())


def test_bench_records_its_backend_and_device(tmp_path: Path) -> None:
    cfg = BenchConfig(candidates=["reference"], models=["tiny"], steps=1, rounds=1, warmup=1,
                      backend="gloo", device="cpu", report_dir=str(tmp_path))
    run_bench(cfg, io.StringIO(), pool=pool_for(2))
    info = json.loads((tmp_path / "bench.json").read_text())["timing"]["info"]
    assert (info["backend"], info["device"]) == ("gloo", "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_bench_on_cuda_without_a_gpu_is_one_line_exit_2(capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    from ddp_conformance.cli import main

    for args in (["--device", "cuda"], ["--backend", "nccl"]):
        assert main(["bench", *args, "--report-dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("ddp-conformance: error: "), err


@pytest.mark.gpu
def test_bench_on_cuda(tmp_path: Path) -> None:
    """On a GPU: the timing bench with Gloo on CUDA tensors, 2 ranks sharing the GPU."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    cfg = BenchConfig(candidates=["reference"], models=["tiny"], steps=2, rounds=2, warmup=1,
                      device="cuda", report_dir=str(tmp_path))
    data = run_bench(cfg, io.StringIO())
    assert data["timing"]["info"]["device"] == "cuda"
    assert set(data["timing"]["models"]["tiny"]["candidates"]) == {"torch", "reference"}
