"""Rank-side timing of candidates on the benchmark models (run through ``RankPool.call``).

Every candidate wraps an identical copy of the model on a
:class:`~ddp_conformance.ranks.tracing.TracingProcessGroup` (with a tracer of its own)
over a plain Gloo group of all ranks, warms up (which includes torch's bucket rebuild),
and then the candidates run interleaved rounds (A B A B ...) of ``steps`` timed steps
each, so that machine noise hits all of them alike. Each step is timed in three phases: forward (with
zero_grad), backward (which includes the communication DDP does not hide), optimizer.
After each round, a raw ``all_reduce`` of one flat tensor holding as many bytes as the
gradients is timed, in the same run, as the bandwidth baseline. Then a few probe steps
per candidate record when every collective was launched and completed, and when
backward's last gradient-accumulation hook fired (overlap, communication busy time).

On CUDA (:mod:`~ddp_conformance.bench.gpu_timeline`) the phases are CUDA events with one
synchronisation at the end of the step, and a few more probe steps run backward under the
profiler for the overlap of communication kernels with compute kernels on the device.

Only rank 0's clock is reported: ranks are held in step by the collectives.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_conformance.contract.registry import resolve_candidate
from ddp_conformance.ranks.tracing import Collective, Tracer, TracingProcessGroup

from .gpu_timeline import PhaseTimer, capture_kernels, cuda_tracing_available, gpu_overlap, now
from .models import MODELS, size_of
from .stats import busy_time

LOCAL = "local"  # the model without DDP: no communication at all (breakdown baseline)
CPU = torch.device("cpu")


def bench_device(cfg: dict[str, Any]) -> torch.device:
    """This rank's device for the bench: the GPU the rank pinned at start (``--device
    cuda``), else the CPU."""
    if cfg.get("device") == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return CPU


class Runner:
    """One candidate (or ``local``) training one copy of a model on this rank."""

    def __init__(self, spec: str, model_name: str, rank: int, pg: dist.ProcessGroup | None,
                 options: dict[str, Any] | None = None,
                 device: torch.device = CPU) -> None:
        bench = MODELS[model_name]
        torch.manual_seed(0)
        self.device = device
        self.timer = PhaseTimer(device)
        self.module = bench.factory().to(device)
        self.pg = pg
        self.x = bench.input(rank).to(device)
        self.ddp: nn.Module | None = None
        if spec == LOCAL:
            self._forward: Callable[[torch.Tensor], torch.Tensor] = self.module
            self.optimizer = torch.optim.SGD(self.module.parameters(), lr=1e-4)
            self._no_sync: Callable[[], AbstractContextManager[Any]] = nullcontext
        else:
            adapter = resolve_candidate(spec).wrap(self.module, pg, device, **(options or {}))
            adapter.set_optimizer(lambda params: torch.optim.SGD(params, lr=1e-4))
            self.ddp = getattr(adapter, "ddp", None)
            self._forward = adapter.forward
            self.optimizer = adapter.optimizer  # type: ignore[attr-defined]
            self._no_sync = adapter.no_sync

    def take(self) -> list[Collective]:
        """The collectives traced since the last call (none for an untraced group)."""
        return self.pg.tracer.take() if isinstance(self.pg, TracingProcessGroup) else []

    def step(self, phases: dict[str, list[float]] | None = None, sync: bool = True,
             optimizer: bool = True, sync_context: Callable[[], AbstractContextManager[Any]] | None = None
             ) -> float:
        """One step; returns its host time to completion. ``phases`` gets forward (with
        zero_grad), backward and optimizer: host clock on the CPU, CUDA events on CUDA
        (:class:`~ddp_conformance.bench.gpu_timeline.PhaseTimer`: no synchronisation
        between phases, one at the end)."""
        timer = self.timer
        t0 = timer.begin()
        if optimizer:
            self.optimizer.zero_grad(set_to_none=True)
        context = sync_context() if sync_context else (nullcontext() if sync else self._no_sync())
        with context:
            loss = self._forward(self.x).square().mean()
            timer.mark()
            loss.backward()
        timer.mark()
        if optimizer:
            self.optimizer.step()
        t3 = timer.end()
        if phases is not None:
            forward, backward, optimizer_s = timer.phases()
            phases["forward"].append(forward)
            phases["backward"].append(backward)
            phases["optimizer"].append(optimizer_s)
        return t3 - t0


def plain_group(backend: str = "gloo") -> dist.ProcessGroup:
    """A plain group of all ranks on ``backend``, whatever backend the job's default group
    has (the pool may trace its default group; a benchmark must not pay for that)."""
    group = dist.new_group(backend=backend)
    assert group is not None
    return group


def traced(group: dist.ProcessGroup) -> TracingProcessGroup:
    """A tracing group over ``group`` with a tracer of its own (one per candidate)."""
    return TracingProcessGroup(group, tracer=Tracer())


def raw_allreduce_times(nbytes: int, repeats: int, group: dist.ProcessGroup,
                        device: torch.device = CPU) -> list[float]:
    """Seconds per ``dist.all_reduce`` of one float32 tensor of ``nbytes`` on ``device``
    (after a barrier; on CUDA, until the device finished it)."""
    flat = torch.zeros(max(1, nbytes // 4), device=device)
    times = []
    for _ in range(repeats):
        dist.barrier(group=group)
        t = now(device)
        dist.all_reduce(flat, group=group)
        times.append(now(device) - t)
    return times


def probe(runner: Runner, steps: int) -> dict[str, Any]:
    """Overlap and communication figures of ``steps`` steps, from the collectives' time stamps."""
    assert isinstance(runner.pg, TracingProcessGroup)
    tracer = runner.pg.tracer
    last_hook: list[float] = [0.0]

    def hook(_: torch.Tensor) -> None:
        last_hook[0] = time.perf_counter()

    handles = [p.register_post_accumulate_grad_hook(hook)
               for p in runner.module.parameters() if p.requires_grad]
    tracer.completions = True
    per_step = []
    try:
        for _ in range(steps):
            tracer.take()
            runner.optimizer.zero_grad(set_to_none=True)
            loss = runner._forward(runner.x).square().mean()
            t_bwd = time.perf_counter()
            loss.backward()
            t_ret = time.perf_counter()
            events = [e for e in tracer.take() if e.kind == "allreduce"]
            deadline = time.perf_counter() + 5.0
            while any(e.done is None for e in events) and time.perf_counter() < deadline:
                time.sleep(0.0005)  # a completion callback may trail backward's return
            runner.optimizer.step()
            per_step.append(_overlap(events, t_bwd, last_hook[0], t_ret))
    finally:
        tracer.completions = False
        for h in handles:
            h.remove()
    keys = per_step[0].keys() if per_step else []
    return {k: [s[k] for s in per_step] for k in keys}


def gpu_probe(runner: Runner, steps: int) -> dict[str, Any]:
    """Overlap on the GPU timeline (CUDA only): ``steps`` more steps, each with backward
    under the profiler (CPU and CUDA activity; forward's kernels finished before it starts,
    backward's before it stops), and per step the figures of
    :func:`~ddp_conformance.bench.gpu_timeline.gpu_overlap` over backward's kernels:
    ``{figure: [per step]}``, plus ``kernels`` (all device kernels) per step. Gloo on CUDA
    has no communication kernels (it copies to the host and reduces there): then
    ``comm_kernels`` is 0. ``{"unavailable": reason}`` when kernels cannot be traced."""
    if not cuda_tracing_available():
        return {"unavailable": "the profiler cannot trace CUDA kernels here (no CUDA or no CUPTI)"}
    per_step: list[dict[str, float]] = []
    for _ in range(steps):
        runner.optimizer.zero_grad(set_to_none=True)
        loss = runner._forward(runner.x).square().mean()
        torch.cuda.synchronize(runner.device)
        with capture_kernels(runner.device) as capture:
            loss.backward()
        runner.optimizer.step()
        per_step.append({"kernels": float(len(capture.spans)), **gpu_overlap(capture.spans).figures()})
    runner.take()  # these steps' collectives are not the timed steps'
    keys = per_step[0].keys() if per_step else []
    return {k: [s[k] for s in per_step] for k in keys}


def _overlap(events: list[Collective], t_bwd: float, t_last_hook: float, t_ret: float) -> dict[str, float]:
    done = [e for e in events if e.done is not None]
    return {
        "allreduces": float(len(events)),
        "launched_before_last_hook": float(sum(e.launched <= t_last_hook for e in events)),
        "completed_before_last_hook": float(sum(e.done <= t_last_hook for e in done)),  # type: ignore[operator]
        "completed_before_return": float(sum(e.done <= t_ret for e in done)),  # type: ignore[operator]
        "bytes": float(sum(e.nbytes for e in events)),
        "comm_busy_s": busy_time([(e.launched, e.done) for e in done if e.done is not None]),
        "backward_compute_s": t_last_hook - t_bwd,
        "backward_s": t_ret - t_bwd,
    }


def collectives_per_step(events: list[Collective], steps: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for e in events:
        entry = out.setdefault(e.kind, {"calls": 0.0, "bytes": 0.0})
        entry["calls"] += 1 / steps
        entry["bytes"] += e.nbytes / steps
    return out


def bench_model(rank: int, world_size: int, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """Time every candidate of ``cfg['candidates']`` on ``cfg['model']``; rank 0 reports."""
    name = cfg["model"]
    specs: list[str] = list(cfg["candidates"])
    if cfg.get("local"):
        specs.append(LOCAL)
    group = plain_group(cfg.get("backend", "gloo"))
    device = bench_device(cfg)
    runners = {s: Runner(s, name, rank, None if s == LOCAL else traced(group), cfg.get("options"),
                         device) for s in specs}
    for r in runners.values():
        for _ in range(cfg.get("warmup", 3)):
            r.step()
        r.take()
    params, tensors, grad_bytes = size_of(runners[specs[0]].module)
    steps, rounds = cfg["steps"], cfg["rounds"]
    out: dict[str, Any] = {spec: {"rounds": [], "phases": {"forward": [], "backward": [], "optimizer": []},
                                  "collectives": {}} for spec in specs}
    raw: list[float] = []
    events: dict[str, list[Collective]] = {s: [] for s in specs}
    for _ in range(rounds):
        for spec, r in runners.items():
            times = [r.step(out[spec]["phases"]) for _ in range(steps)]
            out[spec]["rounds"].append(times)
            events[spec] += r.take()
        raw += raw_allreduce_times(grad_bytes, cfg.get("raw_repeats", 2), group, device)
    for spec, r in runners.items():
        out[spec]["collectives"] = collectives_per_step(events[spec], steps * rounds)
        if isinstance(r.pg, TracingProcessGroup):
            out[spec]["probe"] = probe(r, cfg.get("probe_steps", 3))
            if device.type == "cuda":
                out[spec]["gpu_probe"] = gpu_probe(r, cfg.get("probe_steps", 3))
    if rank != 0:
        return None
    return {"model": name, "description": MODELS[name].description, "params": params,
            "tensors": tensors, "grad_bytes": grad_bytes, "candidates": out,
            "raw_allreduce_s": raw, "phase_clock": runners[specs[0]].timer.clock}
