"""``ddp-conformance bench``: run a timing or an experiment on the rank pool, merge it into
``DIR/bench.json`` and re-render the report set in ``DIR``."""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from ddp_conformance.bench import EXPERIMENTS
from ddp_conformance.contract.registry import resolve_candidate
from ddp_conformance.errors import UsageError
from ddp_conformance.ranks.environment import validate
from ddp_conformance.ranks.pool import RankPool
from ddp_conformance.report import BENCH_FILE, load_bench, write_report_set
from ddp_conformance.report.files import ReportFiles
from ddp_conformance.report.gitstate import project_git_state
from ddp_conformance.report.timing import BASELINE, timing_markdown

from .models import DEFAULT_MODELS, MODELS

#: (steps, rounds) per experiment when not given.
DEFAULTS: dict[str, tuple[int, int]] = {"timing": (2, 40), "bucket-sweep": (4, 4), "no-sync": (2, 4),
                                        "overlap": (5, 6), "breakdown": (8, 6)}
BUCKET_CAPS_MB = [0.25, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0]
NO_SYNC_NS = [1, 2, 4, 8]


@dataclass
class BenchConfig:
    candidates: list[str] = field(default_factory=lambda: ["torch", "reference"])
    world_size: int = 2
    models: list[str] | None = None
    steps: int | None = None
    rounds: int | None = None
    warmup: int = 3
    backend: str = "gloo"
    device: str = "cpu"
    experiment: str = "timing"
    report_dir: str = "reports"
    timeout_s: float = 600.0


def bench_info(world_size: int, threads: int, backend: str = "gloo",
               device: str = "cpu") -> dict[str, Any]:
    import torch

    git = project_git_state() or {}
    return {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cpu_count": os.cpu_count(), "backend": backend,
            "device": device, "world_size": world_size, "threads": threads,
            "commit": git.get("commit"), "dirty": git.get("dirty"), "argv": sys.argv}


def _models(cfg: BenchConfig) -> list[str]:
    default = DEFAULT_MODELS if cfg.experiment in ("timing", "breakdown") else ["mlp10m"]
    models = cfg.models or default
    for m in models:
        if m not in MODELS:
            raise UsageError(f"unknown benchmark model {m!r} (known: {', '.join(MODELS)})")
    return models


def run_bench(cfg: BenchConfig, out: TextIO, pool: RankPool | None = None) -> dict[str, Any]:
    """Run ``cfg.experiment``; return the updated content of ``bench.json``.

    ``pool`` (with ``cfg.world_size`` ranks) is used instead of a new one, and left open.
    """
    device, candidates, steps, rounds = _checked(cfg)
    models = _models(cfg)
    base = {"candidates": candidates, "steps": steps, "rounds": rounds, "warmup": cfg.warmup,
            "backend": cfg.backend, "device": device}
    data: dict[str, Any] = load_bench(cfg.report_dir) or {"type": "bench"}
    out.write(f"ddp-conformance bench: {cfg.experiment}, models {', '.join(models)}, candidates "
              f"{', '.join(candidates)}, {cfg.world_size} ranks, {rounds} rounds x {steps} steps\n")
    started = time.monotonic()
    own = pool is None
    pool = pool or RankPool(cfg.world_size, cfg.backend, device, threads_per_rank=1)
    if pool.world_size != cfg.world_size:
        raise UsageError(f"the pool has {pool.world_size} ranks, the bench asks for {cfg.world_size}")
    try:
        info = bench_info(cfg.world_size, pool.threads, cfg.backend, device)
        if own:
            pool.start()
        run = _run_timing if cfg.experiment in ("timing", "breakdown") else _run_experiment
        run(cfg, pool, models, base, info, data, out)
    finally:
        if own:
            pool.close()
    _write(cfg, data, out, started)
    return data


def _checked(cfg: BenchConfig) -> tuple[str, list[str], int, int]:
    """The bench's device kind, candidates (torch first where ratios are to it), steps and
    rounds; a :class:`UsageError` for what cannot run, before any rank starts."""
    if cfg.experiment not in EXPERIMENTS:
        raise UsageError(f"unknown experiment {cfg.experiment!r} (known: {', '.join(EXPERIMENTS)})")
    device = validate(cfg.backend, cfg.device, cfg.world_size)
    if cfg.world_size < 2:
        raise UsageError("bench needs --world-size of at least 2 (there is nothing to communicate)")
    candidates = list(dict.fromkeys(cfg.candidates))
    if cfg.experiment in ("timing", "breakdown") and BASELINE not in candidates:
        candidates.insert(0, BASELINE)  # ratios are to torch DDP
    for spec in candidates:
        resolve_candidate(spec)  # UsageError now, not on the ranks
    steps_default, rounds_default = DEFAULTS[cfg.experiment]
    steps, rounds = cfg.steps or steps_default, cfg.rounds or rounds_default
    if steps < 1 or rounds < 1:
        raise UsageError("--steps and --rounds must be at least 1")
    return device, candidates, steps, rounds


def _run_timing(cfg: BenchConfig, pool: RankPool, models: list[str], base: dict[str, Any],
                info: dict[str, Any], data: dict[str, Any], out: TextIO) -> None:
    """The timing (or its breakdown) of every model, into ``data``."""
    results = {}
    for m in models:
        t = time.monotonic()
        results[m] = pool.call("ddp_conformance.bench.timing:bench_model",
                               {**base, "model": m, "local": cfg.experiment == "breakdown"},
                               timeout_s=cfg.timeout_s)[0]
        out.write(f"  {m}: {time.monotonic() - t:.1f}s\n")
        out.flush()
    section = {"info": info, "config": {**base, "models": models}, "models": results,
               "command": command_line()}
    if cfg.experiment == "timing":
        data["timing"] = section
    else:
        data.setdefault("experiments", {})["breakdown"] = {
            "info": info, "config": section["config"], "data": {"models": results},
            "command": command_line()}


def _run_experiment(cfg: BenchConfig, pool: RankPool, models: list[str], base: dict[str, Any],
                    info: dict[str, Any], data: dict[str, Any], out: TextIO) -> None:
    """One of the DDP paper's experiments on every model, into ``data``."""
    function = cfg.experiment.replace("-", "_")
    for m in models:
        extra: dict[str, Any] = {"model": m}
        if cfg.experiment == "bucket-sweep":
            extra["caps"] = BUCKET_CAPS_MB
            extra["grad_mb"] = _grad_mb(m)
        elif cfg.experiment == "no-sync":
            extra["ns"] = NO_SYNC_NS
        t = time.monotonic()
        result = pool.call(f"ddp_conformance.bench.experiments:{function}", {**base, **extra},
                           timeout_s=cfg.timeout_s)[0]
        out.write(f"  {m}: {time.monotonic() - t:.1f}s\n")
        key = cfg.experiment if m == "mlp10m" else f"{cfg.experiment}:{m}"
        data.setdefault("experiments", {})[key] = {
            "info": info, "config": {**base, **extra}, "data": result, "command": command_line()}


def _write(cfg: BenchConfig, data: dict[str, Any], out: TextIO, started: float) -> None:
    """Write ``bench.json`` and the report set, and show the experiment's tables."""
    os.makedirs(cfg.report_dir, exist_ok=True)
    # Whole or absent, as every file of the report set (report/files.py).
    ReportFiles().write_text(os.path.join(cfg.report_dir, BENCH_FILE), lambda: json.dumps(data))
    written = write_report_set(cfg.report_dir)
    shown = {"timing": data["timing"]} if cfg.experiment == "timing" else \
        {"experiments": {k: v for k, v in data.get("experiments", {}).items()
                         if k.split(":")[0] == cfg.experiment}}
    out.write("\n".join(timing_markdown(shown)) + "\n")
    out.write(f"done in {time.monotonic() - started:.1f}s; wrote {', '.join(written)} and "
              f"{os.path.join(cfg.report_dir, BENCH_FILE)}\n")


def _grad_mb(model: str) -> float:
    from .models import size_of

    return size_of(MODELS[model].factory())[2] / 2**20


def command_line() -> str:
    argv = list(sys.argv)
    if argv and argv[0].endswith("ddp-conformance"):
        argv[0] = "ddp-conformance"
    return " ".join(argv)
