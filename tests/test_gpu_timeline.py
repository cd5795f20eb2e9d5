"""Timing on the GPU timeline (:mod:`ddp_conformance.bench.gpu_timeline`): the overlap
arithmetic over kernel spans with hand-computed answers, the kernel extraction from
profiler events, the phase timer's host fallback, the report of a CUDA run; and, marked
``gpu`` (skips without CUDA), the bench on a GPU."""
from __future__ import annotations

import io
import json
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.autograd import DeviceType

from ddp_conformance.bench.gpu_timeline import (
    CUDA_EVENTS,
    HOST,
    KernelSpan,
    PhaseTimer,
    capture_kernels,
    gpu_overlap,
    intersection,
    is_comm_kernel,
    kernel_spans,
    merged,
    spans_from_events,
)
from ddp_conformance.report.timing import CUDA_PHASES_NOTE, GPU_INTRO, timing_markdown


def comm(start: float, end: float, stream: int = 20) -> KernelSpan:
    return KernelSpan("ncclDevKernel_AllReduce_Sum_f32_RING_LL", start, end, stream, True)


def compute(start: float, end: float, stream: int = 7) -> KernelSpan:
    return KernelSpan("void at::native::elementwise_kernel", start, end, stream, False)


# -- the arithmetic -----------------------------------------------------------------------------

def test_partial_overlap_is_the_shared_stretch() -> None:
    o = gpu_overlap([comm(0, 4), compute(2, 6)])
    assert (o.comm_busy_s, o.comm_overlapped_s, o.comm_exposed_s) == (4, 2, 2)
    assert o.overlap_share == 0.5
    assert (o.compute_busy_s, o.compute_span_s) == (4, 4)
    assert (o.comm_kernels, o.compute_kernels, o.comm_streams) == (1, 1, (20,))


def test_disjoint_kernels_do_not_overlap() -> None:
    o = gpu_overlap([comm(0, 1), compute(2, 3), compute(5, 6)])
    assert (o.comm_busy_s, o.comm_overlapped_s, o.comm_exposed_s, o.overlap_share) == (1, 0, 1, 0)
    assert o.compute_span_s == 4 and o.compute_busy_s == 2  # span 2..6, busy 1 + 1
    # touching at one instant is not overlapping
    assert gpu_overlap([comm(0, 2), compute(2, 3)]).comm_overlapped_s == 0


def test_nested_kernels() -> None:
    inside = gpu_overlap([comm(1, 2), compute(0, 5)])          # communication hidden entirely
    assert (inside.comm_busy_s, inside.comm_overlapped_s, inside.overlap_share) == (1, 1, 1.0)
    assert inside.comm_exposed_s == 0
    around = gpu_overlap([comm(0, 10), compute(2, 3), compute(5, 7)])  # compute inside comm
    assert (around.comm_busy_s, around.comm_overlapped_s, around.comm_exposed_s) == (10, 3, 7)
    assert around.overlap_share == 0.3
    assert around.compute_span_s == 5 and around.compute_busy_s == 3


def test_several_streams_count_each_instant_once() -> None:
    spans = [comm(0, 4, stream=20), comm(3, 6, stream=20), comm(8, 10, stream=21),   # union [0,6] [8,10]
             compute(1, 2, stream=7), compute(5, 9, stream=7), compute(1.5, 3, stream=8)]  # [1,3] [5,9]
    o = gpu_overlap(spans)
    assert o.comm_busy_s == 8                  # 6 + 2
    assert o.comm_overlapped_s == 4            # [1,3] + [5,6] + [8,9]
    assert o.comm_exposed_s == 4 and o.overlap_share == 0.5
    assert o.compute_busy_s == 6 and o.compute_span_s == 8   # [1,3] + [5,9]; 1..9
    assert (o.comm_kernels, o.compute_kernels, o.comm_streams) == (3, 3, (20, 21))
    # order of the records does not matter
    assert gpu_overlap(list(reversed(spans))) == o


def test_no_communication_kernels() -> None:
    o = gpu_overlap([compute(0, 2), compute(1, 3)])
    assert (o.comm_kernels, o.comm_busy_s, o.comm_overlapped_s) == (0, 0, 0)
    assert math.isnan(o.overlap_share)
    figures = o.figures()
    assert figures == {"comm_kernels": 0.0, "compute_kernels": 2.0, "comm_busy_s": 0.0,
                       "comm_overlapped_s": 0.0, "comm_exposed_s": 0.0, "compute_busy_s": 3.0,
                       "compute_span_s": 3.0}
    json.dumps(figures, allow_nan=False)  # what bench.json stores has no NaN
    empty = gpu_overlap([])
    assert (empty.comm_busy_s, empty.compute_busy_s, empty.compute_span_s) == (0, 0, 0)


def test_interval_union_and_intersection() -> None:
    assert merged([(3, 4), (0, 1), (0.5, 2), (2, 2.5)]) == [(0, 2.5), (3, 4)]
    assert merged([]) == []
    assert intersection([(0, 2.5), (3, 4)], [(1, 3.5)]) == [(1, 2.5), (3, 3.5)]
    assert intersection([(0, 1)], [(1, 2)]) == []
    assert intersection([], [(0, 1)]) == []


def test_communication_kernels_are_nccl_kernels() -> None:
    assert is_comm_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
    assert is_comm_kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)")
    assert is_comm_kernel("NCCL_something")
    assert not is_comm_kernel("void at::native::vectorized_elementwise_kernel<4, ...>")
    assert not is_comm_kernel("Memcpy DtoH (Device -> Pageable)")


# -- from profiler events -----------------------------------------------------------------------

def event(name: str, start_us: float, end_us: float, device: Any = DeviceType.CUDA,
          activity: str | None = "kernel", stream: int = 7, annotation: bool = False) -> SimpleNamespace:
    """A stand-in for a ``FunctionEvent`` as ``prof.events()`` returns them."""
    return SimpleNamespace(name=name, device_type=device, activity_type=activity,
                           time_range=SimpleNamespace(start=start_us, end=end_us),
                           device_resource_id=stream, is_user_annotation=annotation)


def test_spans_from_events_keep_cuda_kernels_only() -> None:
    events = [
        event("aten::mm", 0, 50, device=DeviceType.CPU, activity="cpu_op", stream=1234),
        event("ampere_sgemm_128x64_nn", 20, 60),
        event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40, 100, stream=25),
        event("Memcpy DtoH (Device -> Pageable)", 100, 110, activity="gpu_memcpy"),
        event("Memset (Device)", 110, 111, activity="gpu_memset"),
        event("DistributedDataParallel.forward", 0, 200, activity="gpu_user_annotation"),
        event("Memcpy HtoD (Pageable -> Device)", 120, 130, activity=None),        # no activity type
        event("my_annotation", 0, 300, activity=None, annotation=True),
        event("void kernel_without_activity_type", 130, 140, activity=None, stream=8),
        event("broken", 5, 1),                                                       # ends before it starts
        SimpleNamespace(name="no time range", device_type=DeviceType.CUDA, activity_type="kernel"),
    ]
    spans = spans_from_events(events)
    assert spans == [
        KernelSpan("ampere_sgemm_128x64_nn", 20 / 1e6, 60 / 1e6, 7, False),
        KernelSpan("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40 / 1e6, 100 / 1e6, 25, True),
        KernelSpan("void kernel_without_activity_type", 130 / 1e6, 140 / 1e6, 8, False),
    ]
    o = gpu_overlap(spans)
    assert o.comm_busy_s == pytest.approx(60e-6) and o.comm_overlapped_s == pytest.approx(20e-6)
    assert o.overlap_share == pytest.approx(1 / 3)


def test_a_cpu_only_profile_has_no_device_kernels() -> None:
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (x @ x).sum()
    assert any(e.name == "aten::mm" for e in prof.events())  # the profile did record the ops
    assert kernel_spans(prof) == []
    with capture_kernels(torch.device("cpu"), cuda=False) as capture:
        (x @ x).sum()
    assert capture.spans == [] and capture.unavailable is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_capturing_cuda_kernels_without_cuda_says_why() -> None:
    with capture_kernels(torch.device("cpu")) as capture:
        torch.ones(4).sum()
    assert capture.spans == [] and capture.unavailable and "CUDA" in capture.unavailable


# -- the phase timer ------------------------------------------------------------------------------

def test_phase_timer_on_cpu_is_the_host_clock() -> None:
    timer = PhaseTimer(torch.device("cpu"))
    assert timer.clock == HOST
    t0 = timer.begin()
    time.sleep(0.01)
    timer.mark()
    time.sleep(0.02)
    t1 = timer.end()
    phases = timer.phases()
    assert len(phases) == 2 and phases[0] >= 0.01 and phases[1] >= 0.02
    assert sum(phases) == pytest.approx(t1 - t0)
    timer.begin()  # a new step forgets the last one's marks
    timer.end()
    assert len(timer.phases()) == 1


def test_a_cpu_bench_step_times_its_phases_on_the_host() -> None:
    from ddp_conformance.bench.timing import LOCAL, Runner

    r = Runner(LOCAL, "tiny", 0, None)
    assert r.timer.clock == HOST
    phases: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
    total = r.step(phases)
    assert all(len(v) == 1 and v[0] >= 0 for v in phases.values())
    assert sum(v[0] for v in phases.values()) == pytest.approx(total)


# -- the report -----------------------------------------------------------------------------------

def bench_json(device: str, backend: str, gpu_probe: dict[str, list[float]] | None) -> dict[str, Any]:
    cand: dict[str, Any] = {
        "rounds": [[0.010, 0.011]], "phases": {"forward": [0.002], "backward": [0.006], "optimizer": [0.001]},
        "collectives": {"allreduce": {"calls": 1.0, "bytes": 800.0}},
        "probe": {"allreduces": [1.0, 1.0], "launched_before_last_hook": [0.0, 1.0],
                  "completed_before_last_hook": [0.0, 0.0], "completed_before_return": [1.0, 1.0],
                  "bytes": [800.0, 800.0], "comm_busy_s": [0.001, 0.001],
                  "backward_compute_s": [0.004, 0.004], "backward_s": [0.005, 0.005]}}
    if gpu_probe is not None:
        cand["gpu_probe"] = gpu_probe
    model = {"model": "m", "description": "d", "params": 200, "tensors": 2, "grad_bytes": 800,
             "candidates": {"torch": cand}, "raw_allreduce_s": [0.001],
             "phase_clock": CUDA_EVENTS if device == "cuda" else HOST}
    return {"type": "bench", "timing": {"info": {"world_size": 2, "backend": backend, "device": device},
                                        "config": {}, "models": {"m": model}}}


NCCL_PROBE = {"kernels": [40.0, 42.0], "comm_kernels": [2.0, 2.0], "compute_kernels": [38.0, 40.0],
              "comm_busy_s": [0.004, 0.002], "comm_overlapped_s": [0.002, 0.001],
              "comm_exposed_s": [0.002, 0.001], "compute_busy_s": [0.005, 0.005],
              "compute_span_s": [0.006, 0.008]}


def gpu_row(text: str) -> list[str]:
    """The cells of the (only) row of the GPU-timeline table in a markdown report."""
    after = text.split(GPU_INTRO, 1)[1]
    row = next(line for line in after.splitlines() if line.startswith("| m "))
    return [c.strip() for c in row.strip().strip("|").split("|")]


def test_a_cuda_report_names_its_clock_and_shows_the_gpu_timeline() -> None:
    text = "\n".join(timing_markdown(bench_json("cuda", "nccl", NCCL_PROBE)))
    assert "2 ranks on NCCL/CUDA" in text
    assert CUDA_PHASES_NOTE in text and GPU_INTRO in text
    cells = gpu_row(text)
    # medians over the 2 probe steps; share = (2 + 1) / (4 + 2) ms; host: 1 of 2 launched early
    assert cells == ["m", "torch", "41 / 2", "3.00", "1.50", "50%", "1.50", "7.00", "50% / 0%"]


def test_gloo_on_cuda_says_there_are_no_communication_kernels() -> None:
    probe = {**NCCL_PROBE, "comm_kernels": [0.0, 0.0], "comm_busy_s": [0.0, 0.0],
             "comm_overlapped_s": [0.0, 0.0], "comm_exposed_s": [0.0, 0.0]}
    text = "\n".join(timing_markdown(bench_json("cuda", "gloo", probe)))
    assert "2 ranks on Gloo/CUDA" in text and CUDA_PHASES_NOTE in text
    assert "had none on the GPU timeline (Gloo copies CUDA tensors to the host" in text
    assert gpu_row(text) == ["m", "torch", "41 / 0", "-", "-", "-", "-",
                                                              "7.00", "50% / 0%"]
    unavailable = "\n".join(timing_markdown(bench_json("cuda", "nccl", {"unavailable": "no CUPTI"})))
    assert "no CUPTI" in unavailable


def test_a_cpu_report_has_no_gpu_figures() -> None:
    text = "\n".join(timing_markdown(bench_json("cpu", "gloo", None)))
    assert "2 ranks on Gloo/CPU" in text
    assert "CUDA" not in text and "GPU timeline" not in text
    # bench.json written before backend, device and clock were recorded reads as before
    old = bench_json("cpu", "gloo", None)
    del old["timing"]["info"]["backend"], old["timing"]["info"]["device"]
    del old["timing"]["models"]["m"]["phase_clock"]
    assert "\n".join(timing_markdown(old)) == text


def test_the_html_report_of_a_cuda_run(tmp_path: Path) -> None:
    from ddp_conformance.report.html import timing_html

    html = timing_html(bench_json("cuda", "nccl", NCCL_PROBE))
    assert "NCCL on CUDA" in html and "CUDA events" in html and "Overlap on the GPU timeline" in html
    assert "Gloo on CPU" in timing_html(bench_json("cpu", "gloo", None))


# -- on a GPU -------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_phase_timer_on_cuda_uses_events() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    device = torch.device("cuda", torch.cuda.current_device())
    timer = PhaseTimer(device)
    assert timer.clock == CUDA_EVENTS
    x = torch.randn(2048, 2048, device=device)
    t0 = timer.begin()
    for _ in range(20):
        x = x @ x / 2048
    timer.mark()
    x.sum()
    t1 = timer.end()
    phases = timer.phases()
    assert len(phases) == 2 and phases[0] > 0 and 0 < sum(phases) <= (t1 - t0) * 1.05


@pytest.mark.gpu
def test_capture_kernels_on_cuda_sees_compute_kernels() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    device = torch.device("cuda", torch.cuda.current_device())
    x = torch.randn(512, 512, device=device)
    with capture_kernels(device) as capture:
        (x @ x).sum()
    assert capture.unavailable is None
    assert capture.spans and not any(s.comm for s in capture.spans)
    assert all(s.end_s >= s.start_s for s in capture.spans)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_bench_on_cuda_reports_cuda_event_phases_and_the_gpu_timeline(backend: str, tmp_path: Path) -> None:
    """Gloo: 2 ranks share the GPU (no communication kernels); NCCL: needs 2 GPUs."""
    from ddp_conformance.bench.run import BenchConfig, run_bench

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    if backend == "nccl" and (not dist.is_nccl_available() or torch.cuda.device_count() < 2):
        pytest.skip("NCCL needs one GPU per rank (2)")
    cfg = BenchConfig(candidates=["reference"], models=["mlp10m"], steps=2, rounds=2, warmup=2,
                      backend=backend, device="cuda", report_dir=str(tmp_path))
    data = run_bench(cfg, io.StringIO())
    model = data["timing"]["models"]["mlp10m"]
    assert model["phase_clock"] == CUDA_EVENTS
    for name in ("torch", "reference"):
        gpu = model["candidates"][name]["gpu_probe"]
        assert "unavailable" not in gpu, gpu
        assert all(k > 0 for k in gpu["compute_kernels"])
        if backend == "nccl":
            assert all(k > 0 for k in gpu["comm_kernels"])
            assert all(0 <= o <= b for o, b in zip(gpu["comm_overlapped_s"], gpu["comm_busy_s"], strict=True))
        else:
            assert gpu["comm_kernels"] == [0.0] * len(gpu["comm_kernels"])
    summary = (tmp_path / "summary.md").read_text()
    assert CUDA_PHASES_NOTE in summary and GPU_INTRO in summary
    assert "Overlap on the GPU timeline" in (tmp_path / "report.html").read_text()
