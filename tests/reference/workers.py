"""Rank-side code of the reference DDP's tests: run torch's DDP and the reference on the
same models and data, step by step, and describe every difference.

Equality is bitwise throughout. Both implementations hand the same flat bucket (same
layout, same ``grad * (1/world)`` pre-division) to the same Gloo allreduce and copy the
result back, and the model's forward and backward are the same deterministic CPU
kernels on the same inputs; any difference at all is a semantic difference.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ddp_reference
import torch
import torch.distributed as dist
from torch import nn

from ddp_conformance.ranks.tracing import Tracer, TracingProcessGroup
from tests.reference import models

TorchDDP = nn.parallel.DistributedDataParallel
RefDDP = ddp_reference.DistributedDataParallel
IMPLS: dict[str, Callable[..., nn.Module]] = {"torch": TorchDDP, "reference": RefDDP}


def traced(group: dist.ProcessGroup) -> TracingProcessGroup:
    """A group forwarding to ``group`` that logs every collective into a tracer of its own.
    Torch's C++ reducer calls it too."""
    return TracingProcessGroup(group, tracer=Tracer())


def calls(pg: TracingProcessGroup) -> list[tuple[str, str, int]]:
    """The collectives ``pg`` logged since the last call, as (kind, dtype, element count)."""
    return [(c.kind, c.dtype, c.numel) for c in pg.tracer.take()]


@dataclass
class Spec:
    model: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    steps: int = 4
    no_sync_steps: tuple[int, ...] = ()
    no_grad_steps: tuple[int, ...] = ()
    set_to_none: bool = True
    optimizer: str = "sgd"
    rank_config: str = ""  # "extra_on_rank0": UnusedOnSomeRanks uses `extra` on rank 0 only
    trace: bool = True
    #: "new_tensor": :func:`new_tensor_hook` registered on both DDPs.
    comm_hook: str = ""


MODEL_FACTORIES: dict[str, Callable[[], nn.Module]] = {
    "mlp": models.MLP,
    "wide": models.Wide,
    "convbn": models.ConvBN,
    "unused": models.UnusedOnSomeRanks,
    "frozen": models.Frozen,
    "tied": models.Tied,
    "twice": models.UsedTwice,
    "checkpointed": models.CheckpointedTwice,
    "mixed": models.MixedDtypes,
    "tiny": models.ManyTiny,
    "nested": models.NestedOutputs,
    "dense_emb": lambda: models.SparseEmbedding(sparse=False),
    "sparse_emb": lambda: models.SparseEmbedding(sparse=True),
    "complex": models.ComplexMLP,
}


def new_tensor_hook(state, bucket):  # type: ignore[no-untyped-def]
    """An allreduce comm hook whose future holds a new tensor (the bucket divided by the
    group size), not the bucket's buffer; it records what the bucket reports (``buffer()``
    dtype and element count, ``gradients()``, ``parameters()``) into ``state[1]``.
    Unannotated: torch refuses a ``bucket`` annotation that is not ``dist.GradBucket``
    itself, and postponed annotations are strings."""
    pg, seen = state
    buffer = bucket.buffer()
    seen.append({
        "index": bucket.index(), "dtype": str(buffer.dtype), "numel": buffer.numel(),
        "gradients": [g.detach().clone() for g in bucket.gradients()],
        "parameters": [(str(p.dtype), tuple(p.shape)) for p in bucket.parameters()],
    })
    averaged = buffer / pg.size()
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM  # type: ignore[assignment]
    fut = pg.allreduce([averaged], opts).get_future()
    return fut.then(lambda f: f.value()[0])

# Parameters of MLP(32): fc1 8*32+32, fc2 32*32+32, fc3 32*4+4 floats; 0.002 MiB (~2 KiB)
# makes several buckets, and fc2.weight (4 KiB) alone exceeds the cap.
SCENARIOS: dict[str, Spec] = {
    "mlp": Spec("mlp"),
    "mlp_adam": Spec("mlp", optimizer="adam"),
    "mlp_no_init_sync": Spec("mlp", {"init_sync": False}, steps=2),
    "mlp_tiny_cap": Spec("mlp", {"bucket_cap_mb": 0.002}),
    "mlp_find_unused": Spec("mlp", {"find_unused_parameters": True}),
    "mlp_find_unused_tiny_cap": Spec("mlp", {"find_unused_parameters": True, "bucket_cap_mb": 0.002}),
    "mlp_grad_view": Spec("mlp", {"gradient_as_bucket_view": True}, set_to_none=False),
    "mlp_grad_view_none": Spec("mlp", {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.002}),
    "mlp_static": Spec("mlp", {"static_graph": True, "bucket_cap_mb": 0.002}, steps=5),
    # static_graph given to the constructor: one bucket in the first iteration, even with
    # find_unused_parameters (torch's _ddp_init_helper receives static_graph).
    "mlp_static_find_unused": Spec("mlp", {"static_graph": True, "find_unused_parameters": True,
                                           "bucket_cap_mb": 0.002}, steps=4),
    "mlp_no_sync": Spec("mlp", {"bucket_cap_mb": 0.002}, steps=6, no_sync_steps=(0, 2, 3)),
    "mlp_no_grad_forward": Spec("mlp", steps=4, no_grad_steps=(1,)),
    "wide": Spec("wide", steps=3),
    "wide_find_unused": Spec("wide", {"find_unused_parameters": True}, steps=3),
    "convbn": Spec("convbn"),
    "convbn_no_bcast": Spec("convbn", {"broadcast_buffers": False}),
    "convbn_no_sync": Spec("convbn", steps=5, no_sync_steps=(1, 2)),
    "convbn_no_grad_forward": Spec("convbn", steps=5, no_grad_steps=(1, 3)),
    "unused_find": Spec("unused", {"find_unused_parameters": True}, rank_config="extra_on_rank0"),
    "unused_find_no_sync": Spec("unused", {"find_unused_parameters": True}, steps=5,
                                no_sync_steps=(0, 2), rank_config="extra_on_rank0"),
    "unused_static": Spec("unused", {"static_graph": True}, steps=5, rank_config="extra_on_rank0"),
    "unused_find_grad_view": Spec("unused", {"find_unused_parameters": True,
                                             "gradient_as_bucket_view": True},
                                  rank_config="extra_on_rank0"),
    "frozen": Spec("frozen"),
    "tied": Spec("tied", {"bucket_cap_mb": 0.0005}),
    "twice": Spec("twice"),
    "twice_static": Spec("twice", {"static_graph": True}),
    "checkpointed_static": Spec("checkpointed", {"static_graph": True}, steps=5),
    "checkpointed_static_tiny_cap": Spec("checkpointed", {"static_graph": True,
                                                          "bucket_cap_mb": 0.0001}, steps=5),
    "mixed": Spec("mixed"),
    "mixed_tiny_cap": Spec("mixed", {"bucket_cap_mb": 0.0005}),
    "tiny": Spec("tiny", {"bucket_cap_mb": 0.0002}),
    "tiny_find_unused": Spec("tiny", {"find_unused_parameters": True, "bucket_cap_mb": 0.0002}),
    "nested_find_unused": Spec("nested", {"find_unused_parameters": True}),
    "dense_emb": Spec("dense_emb"),
    "sparse_emb": Spec("sparse_emb"),
    # Complex buckets are reduced as their real view; a hook sees that float buffer and a
    # new tensor it returns is read back through complex views.
    "complex": Spec("complex", {"bucket_cap_mb": 0.001}),
    "complex_new_tensor_hook": Spec("complex", {"bucket_cap_mb": 0.001},
                                    comm_hook="new_tensor"),
    "complex_new_tensor_hook_grad_view": Spec("complex", {"gradient_as_bucket_view": True},
                                              comm_hook="new_tensor", set_to_none=False),
}


def _snapshot(ddp: nn.Module, model: nn.Module) -> dict[str, Any]:
    return {
        "grads": [None if p.grad is None else p.grad.detach().to_dense().clone()
                  for p in model.parameters()],
        "params": [p.detach().clone() for p in model.parameters()],
        "buffers": [b.detach().clone() for b in model.buffers()],
        "rebuilt": bool(getattr(ddp, "_has_rebuilt_buckets", False)),
    }


def run_spec(rank: int, impl: str, spec: Spec) -> dict[str, Any]:
    """Train ``spec`` with one implementation; record every step."""
    torch.manual_seed(1 + rank)  # different initial weights per rank: init sync must fix them
    model = MODEL_FACTORIES[spec.model]()
    if spec.rank_config == "extra_on_rank0":
        model.use_extra = rank == 0  # type: ignore[assignment]
    default_pg = dist.distributed_c10d._get_default_group()
    pg = traced(default_pg) if spec.trace else default_pg
    ddp = IMPLS[impl](model, process_group=pg, **spec.kwargs)
    hook_buckets: list[Any] = []
    if spec.comm_hook == "new_tensor":
        ddp.register_comm_hook((pg, hook_buckets), new_tensor_hook)  # type: ignore[operator]
    sparse = spec.model == "sparse_emb"
    if spec.optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.0 if sparse else 0.9)
    traces = spec.trace and isinstance(pg, TracingProcessGroup)
    init_trace = calls(pg) if traces else []
    gen = torch.Generator().manual_seed(1000 + rank)
    steps = []
    for step in range(spec.steps):
        x = torch.randn(4, 8, generator=gen)
        if step in spec.no_grad_steps:
            with torch.no_grad():
                ddp(x)
            steps.append({**_snapshot(ddp, model), "trace": calls(pg) if traces else []})
            continue
        no_sync = step in spec.no_sync_steps
        with ddp.no_sync() if no_sync else contextlib.nullcontext():  # type: ignore[operator]
            models.loss_of(ddp(x)).backward()
        record = _snapshot(ddp, model)
        if not no_sync:
            opt.step()
            opt.zero_grad(set_to_none=spec.set_to_none)
            record["after_step"] = _snapshot(ddp, model)
        record["trace"] = calls(pg) if traces else []
        steps.append(record)
    logging = ddp._get_ddp_logging_data()  # type: ignore[operator]
    layout = {k: logging.get(k) for k in ("bucket_sizes", "rebuilt_bucket_sizes",
                                          "rebuilt_per_bucket_param_indices", "iteration",
                                          "has_rebuilt_buckets",
                                          "prev_iteration_grad_ready_order_indices")}
    return {"init_trace": init_trace, "steps": steps, "layout": layout,
            "hook_buckets": hook_buckets}


def _diff_tensors(where: str, a: list[Any], b: list[Any]) -> list[str]:
    out = []
    if len(a) != len(b):
        return [f"{where}: {len(a)} vs {len(b)} tensors"]
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if (x is None) != (y is None):
            out.append(f"{where}[{i}]: torch {'None' if x is None else 'set'}, "
                       f"reference {'None' if y is None else 'set'}")
        elif x is not None and (x.dtype != y.dtype or not torch.equal(x, y)):
            if x.dtype != y.dtype:
                out.append(f"{where}[{i}]: torch {x.dtype}, reference {y.dtype}")
                continue
            err = (_real(x) - _real(y)).abs().max().item()
            out.append(f"{where}[{i}]: max abs difference {err:.3g}")
    return out


def _real(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float64, a complex tensor as its real and imaginary parts."""
    return torch.view_as_real(t).double() if t.is_complex() else t.double()


def _diff_hook_buckets(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    """Differences between what torch's and the reference's hooks were handed."""
    if len(a) != len(b):
        return [f"comm hook called {len(a)} times with torch, {len(b)} with the reference"]
    out = []
    for n, (ba, bb) in enumerate(zip(a, b, strict=True)):
        meta = ("index", "dtype", "numel", "parameters")
        if any(ba[k] != bb[k] for k in meta):
            out.append(f"hook call {n}: torch {[ba[k] for k in meta]} "
                       f"reference {[bb[k] for k in meta]}")
        out += _diff_tensors(f"hook call {n} gradients()", ba["gradients"], bb["gradients"])
    return out


def compare(spec: Spec, a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Differences between torch's record ``a`` and the reference's ``b``."""
    diffs = []
    if a["layout"] != b["layout"]:
        diffs.append(f"layout: torch {a['layout']} reference {b['layout']}")
    if spec.trace:
        # Known deviation: the reference adds one allgather (3rd collective) at init so
        # that a shape mismatch raises on every rank.
        ref_init = b["init_trace"][:2] + b["init_trace"][3:]
        if a["init_trace"] != ref_init:
            diffs.append(f"init collectives: torch {a['init_trace']} reference {b['init_trace']}")
    diffs += _diff_hook_buckets(a["hook_buckets"], b["hook_buckets"])
    for step, (sa, sb) in enumerate(zip(a["steps"], b["steps"], strict=True)):
        for key in ("grads", "params", "buffers"):
            diffs += _diff_tensors(f"step {step} {key}", sa[key], sb[key])
        if "after_step" in sa:
            for key in ("grads", "params", "buffers"):
                diffs += _diff_tensors(f"step {step} after optimizer {key}",
                                       sa["after_step"][key], sb["after_step"][key])
        if sa["rebuilt"] != sb["rebuilt"]:
            diffs.append(f"step {step}: buckets rebuilt torch {sa['rebuilt']} "
                         f"reference {sb['rebuilt']}")
        if sa["trace"] != sb["trace"]:
            diffs.append(f"step {step} collectives: torch {sa['trace']} reference {sb['trace']}")
    return diffs


def subgroup(rank: int, world_size: int, members: list[int]) -> list[str]:
    """DDP over a subgroup (group ranks differ from global ranks): torch and reference
    agree on the ranks inside; the others only take part in creating the group."""
    group = dist.new_group(members)
    if rank not in members:
        return []
    diffs = []
    records = {}
    for impl, cls in IMPLS.items():
        torch.manual_seed(1 + rank)
        model = models.ConvBN()
        ddp = cls(model, process_group=group, bucket_cap_mb=0.001)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(1000 + rank)
        snaps = []
        for _ in range(3):
            models.loss_of(ddp(torch.randn(4, 8, generator=gen))).backward()
            opt.step()
            snaps.append(_snapshot(ddp, model))
            opt.zero_grad()
        records[impl] = snaps
    for step, (sa, sb) in enumerate(zip(records["torch"], records["reference"], strict=True)):
        for key in ("grads", "params", "buffers"):
            diffs += _diff_tensors(f"step {step} {key}", sa[key], sb[key])
    return diffs


def compare_scenarios(rank: int, world_size: int, names: list[str]) -> dict[str, list[str]]:
    results = {}
    for name in names:
        spec = SCENARIOS[name]
        a = run_spec(rank, "torch", spec)
        b = run_spec(rank, "reference", spec)
        results[name] = compare(spec, a, b)
        if spec.steps and not any(s["grads"] for s in b["steps"]):
            results[name].append("no gradients recorded")
    return results
