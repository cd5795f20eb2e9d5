"""The DDP paper's experiments (Li et al., "PyTorch Distributed: Experiences on
Accelerating Data Parallel Training", VLDB 2020), rank side, on this backend.

- ``bucket_sweep``: step time against ``bucket_cap_mb``, from below 1 MB to above the
  model's gradient size (one bucket), per candidate (paper section 5.2, figure 7/8);
- ``no_sync``: synchronise every n = 1, 2, 4, 8 iterations with ``no_sync`` (time per
  iteration; paper section 5.4, figure 12);
- ``overlap``: normal DDP (allreduce of each bucket launched from backward) against
  Composer's ``forced_sync`` (all communication after backward, one allreduce per
  gradient; via ``ddp_reference.ddp_sync_context``) (paper section 5.1's overlap);
- the latency breakdown is :func:`ddp_conformance.bench.timing.bench_model` with the
  ``local`` (no DDP) baseline (paper figure 2/6).

Candidates run interleaved configuration by configuration, round after round.
"""
from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any

import ddp_reference

from .timing import Runner, bench_device, plain_group


def _interleave(runners: dict[str, Any], rounds: int, one: Any) -> dict[str, list[list[float]]]:
    out: dict[str, list[list[float]]] = {k: [] for k in runners}
    for _ in range(rounds):
        for key, r in runners.items():
            out[key].append(one(key, r))
    return out


def bucket_sweep(rank: int, world_size: int, cfg: dict[str, Any]) -> dict[str, Any] | None:
    group = plain_group(cfg.get("backend", "gloo"))
    runners = {f"{spec}|{cap:g}": Runner(spec, cfg["model"], rank, group, {"bucket_cap_mb": cap},
                                         bench_device(cfg))
               for spec in cfg["candidates"] for cap in cfg["caps"]}
    for r in runners.values():
        for _ in range(cfg.get("warmup", 3)):
            r.step()
    steps = cfg["steps"]
    times = _interleave(runners, cfg["rounds"], lambda _, r: [r.step() for _ in range(steps)])
    return {"times": times} if rank == 0 else None


def no_sync(rank: int, world_size: int, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """Per (candidate, n): seconds per iteration over blocks of ``block`` iterations in which
    every n-th iteration synchronises (and steps the optimizer)."""
    group = plain_group(cfg.get("backend", "gloo"))
    block = cfg.get("block", 8)
    runners = {f"{spec}|{n}": (Runner(spec, cfg["model"], rank, group, device=bench_device(cfg)), n)
               for spec in cfg["candidates"] for n in cfg["ns"]}

    def one_block(pair: tuple[Runner, int]) -> float:
        r, n = pair
        t = time.perf_counter()
        r.optimizer.zero_grad(set_to_none=True)
        for i in range(block):
            last = (i + 1) % n == 0
            r.step(sync=last, optimizer=False)
            if last:
                r.optimizer.step()
                r.optimizer.zero_grad(set_to_none=True)
        return (time.perf_counter() - t) / block

    for pair in runners.values():
        one_block(pair)
        one_block(pair)
    blocks = cfg["steps"]
    times = _interleave(runners, cfg["rounds"], lambda _, p: [one_block(p) for _ in range(blocks)])
    return {"times": times} if rank == 0 else None


def overlap(rank: int, world_size: int, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """Per (candidate, mode): step times; mode ``overlap`` is normal DDP, ``forced_sync``
    runs backward under no_sync and then allreduces every gradient."""
    group = plain_group(cfg.get("backend", "gloo"))
    runners: dict[str, tuple[Runner, str]] = {}
    for spec in cfg["candidates"]:
        for mode in ("overlap", "forced_sync"):
            runners[f"{spec}|{mode}"] = (Runner(spec, cfg["model"], rank, group,
                                                device=bench_device(cfg)), mode)

    def step(pair: tuple[Runner, str], phases: dict[str, list[float]] | None = None) -> float:
        r, mode = pair
        if mode == "overlap":
            return r.step(phases)
        assert r.ddp is not None, "forced_sync needs a DDP-like module"
        ddp = r.ddp

        def context() -> AbstractContextManager[None]:
            return ddp_reference.ddp_sync_context(ddp, True, ddp_reference.SyncStrategy.FORCED_SYNC)

        return r.step(phases, sync_context=context)

    for pair in runners.values():
        for _ in range(cfg.get("warmup", 3)):
            step(pair)
    phases: dict[str, dict[str, list[float]]] = {
        k: {"forward": [], "backward": [], "optimizer": []} for k in runners}
    steps = cfg["steps"]
    times = _interleave(runners, cfg["rounds"],
                        lambda key, p: [step(p, phases[key]) for _ in range(steps)])
    return {"times": times, "phases": phases} if rank == 0 else None
