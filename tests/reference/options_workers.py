"""Rank-side code for the tests of torch 2.13 DDP's whole constructor and method surface
(``test_options_surface.py``): each function runs torch's DDP and the reference on the same
model and data, on every rank, and returns plain data (tensors, strings, collective traces)
for the test to compare bitwise."""
from __future__ import annotations

import contextlib
import gc
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import ddp_reference
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import (
    debugging_hooks,
    default_hooks,
    post_localSGD_hook,
    powerSGD_hook,
)
from torch.nn.parallel.distributed import _BufferCommHookLocation, _MixedPrecision

from tests.reference import models
from tests.reference.workers import IMPLS, Spec, calls, compare, run_spec, traced

Record = dict[str, Any]

# --------------------------------------------------------------------------- helpers


def _error(fn: Callable[[], Any]) -> str | None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - compared between implementations
        return f"{type(exc).__name__}: {exc}"
    return None


def _grads(model: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return models.MLP()


def train(impl: str, make: Callable[[], nn.Module], kwargs: dict[str, Any],
          setup: Callable[[nn.Module, nn.Module], Any] | None = None, steps: int = 4,
          optimizer: bool = True, warmup: bool = False) -> dict[str, Any]:
    """``steps`` SGD steps of one DDP on the traced default group, rank-dependent data:
    per step the gradients after backward, the parameters and buffers after the step, and
    the collectives of the DDP's group. ``setup(ddp, model)`` runs after construction;
    ``warmup`` runs one backward first and discards its gradients."""
    rank = dist.get_rank()
    torch.manual_seed(1 + rank)
    model = make()
    pg = traced(dist.distributed_c10d._get_default_group())
    ddp = IMPLS[impl](model, process_group=pg, **kwargs)
    if setup is not None:
        setup(ddp, model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    if warmup:  # one backward, its gradients discarded (no step): buckets rebuilt
        models.loss_of(ddp(torch.randn(4, 8, generator=gen))).backward()
        opt.zero_grad(set_to_none=True)
    out: dict[str, Any] = {"init": calls(pg), "steps": []}
    for _ in range(steps):
        x = torch.randn(4, 8, generator=gen)
        models.loss_of(ddp(x)).backward()
        grads = _grads(model)
        if optimizer:
            opt.step()
        opt.zero_grad()
        out["steps"].append({"grads": grads, "params": _params(model),
                             "buffers": [b.detach().clone() for b in model.buffers()],
                             "trace": calls(pg)})
    return out


def drop_extra_allgather(trace: list[Any]) -> list[Any]:
    """The reference's init trace less its known extra collective: the second int64
    allgather of its shape check (so that a mismatch raises on every rank)."""
    seen = [i for i, c in enumerate(trace) if c == ("allgather", "int64", 1)]
    return [c for i, c in enumerate(trace) if len(seen) < 2 or i != seen[1]]


def _diff(a: Any, b: Any, where: str = "") -> list[str]:
    """Bitwise differences between two nested records (tensors, lists, dicts, scalars)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            return [f"{where}: torch {a.dtype}{tuple(a.shape)} vs reference "
                    f"{b.dtype}{tuple(b.shape)}, equal={a.shape == b.shape and torch.equal(a, b)}"]
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(a)} vs {sorted(b)}"]
        return [d for k in a for d in _diff(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: {len(a)} vs {len(b)} items: torch {a} reference {b}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _diff(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: torch {a!r} vs reference {b!r}"]


def both(make: Callable[[], nn.Module], kwargs: dict[str, Any],
         setup: Callable[[nn.Module, nn.Module], Any] | None = None, **kw: Any) -> list[str]:
    """Differences between torch's and the reference's :func:`train` records."""
    records = {impl: train(impl, make, kwargs, setup, **kw) for impl in IMPLS}
    records["reference"]["init"] = drop_extra_allgather(records["reference"]["init"])
    return _diff(records["torch"], records["reference"])


# --------------------------------------------------------------------------- constructor


def constructor_options(rank: int, world_size: int) -> dict[str, Any]:
    """Per DDP: warnings, attributes and init-time buffer sync of the buffer options,
    ``check_reduction``, ``dim``, positional arguments, and the argument errors."""
    out: dict[str, Any] = {}
    for impl, cls in IMPLS.items():
        rec: dict[str, Any] = {}
        cases = {
            "default": {},
            "bcast_false": {"broadcast_buffers": False},
            "bcast_true": {"broadcast_buffers": True},
            "fwd_false": {"forward_sync_buffers": False},
            "both": {"broadcast_buffers": False, "forward_sync_buffers": True},
            "both_false": {"broadcast_buffers": True, "forward_sync_buffers": False},
            "check_reduction": {"check_reduction": True, "dim": 1},
        }
        for name, kwargs in cases.items():
            torch.manual_seed(1 + rank)
            model = models.ConvBN()
            with torch.no_grad():
                model.bn.running_mean.fill_(float(rank))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ddp = cls(model, **kwargs)
            rec[name] = {
                "warnings": [(w.category.__name__, str(w.message)) for w in caught
                             if "deprecat" in str(w.message).lower()],
                "broadcast_buffers": ddp.broadcast_buffers,
                "forward_sync_buffers": ddp.forward_sync_buffers,
                "will_sync": ddp.will_sync_module_buffers(),
                "dim": ddp.dim,
                "running_mean": model.bn.running_mean.clone(),
            }
            ddp.broadcast_buffers = not ddp.broadcast_buffers
            rec[name]["setter"] = ddp.forward_sync_buffers
        positional = cls(models.MLP(), None, None, 2, False, True, None, 0.001)
        rec["positional"] = [positional.dim, positional.forward_sync_buffers,
                             positional.bucket_bytes_cap]
        lst = cls(models.MLP(), bucket_cap_mb_list=[0.001, 0.003])
        rec["cap_list"] = [lst.bucket_bytes_cap, lst.bucket_bytes_cap_list]
        fc = models.MLP().fc1.weight
        rec["delay_without_hook"] = _error(lambda cls=cls, fc=fc: cls(
            models.MLP(), delay_all_reduce_named_params=[("fc1.weight", fc)]))
        rec["hook_without_delay"] = _error(lambda cls=cls, fc=fc: cls(
            models.MLP(), param_to_hook_all_reduce=fc))
        out[impl] = rec
    return out


def device_mesh_options(rank: int, world_size: int) -> dict[str, Any]:
    """A 1-D mesh's group is the DDP group (trained, traced); mesh plus group and a 2-D
    mesh are refused."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    mesh2 = init_device_mesh("cpu", (1, world_size))
    out: dict[str, Any] = {}
    for impl, cls in IMPLS.items():
        ddp = cls(_mlp(), device_mesh=mesh)
        out[impl] = {
            "same_group": ddp.process_group is mesh.get_group(0),
            "mesh_kept": getattr(ddp, "device_mesh", None) is mesh,
            "both": _error(lambda cls=cls: cls(_mlp(), process_group=dist.group.WORLD, device_mesh=mesh)),
            "2d": _error(lambda cls=cls: cls(_mlp(), device_mesh=mesh2)),
        }
    return out


# --------------------------------------------------------------------------- training options

SPECS: dict[str, Spec] = {
    "cap_list": Spec("mlp", {"bucket_cap_mb_list": [0.001, 0.005]}),
    "cap_list_find_unused": Spec("mlp", {"bucket_cap_mb_list": [0.002, 0.0005],
                                         "find_unused_parameters": True}),
    "cap_list_static": Spec("mixed", {"bucket_cap_mb_list": [0.0005, 0.002],
                                      "static_graph": True}, steps=5),
    "skip_unused": Spec("unused", {"find_unused_parameters": True,
                                   "skip_all_reduce_unused_params": True,
                                   "bucket_cap_mb": 0.00005}),
    "skip_unused_one_bucket": Spec("unused", {"find_unused_parameters": True,
                                              "skip_all_reduce_unused_params": True}),
    "skip_unused_static": Spec("unused", {"static_graph": True,
                                          "skip_all_reduce_unused_params": True,
                                          "bucket_cap_mb": 0.00005}, steps=5),
    "batched": Spec("mlp", {"batched_grad_copy": True, "bucket_cap_mb": 0.002}),
    "batched_grad_view": Spec("mlp", {"batched_grad_copy": True, "gradient_as_bucket_view": True,
                                      "bucket_cap_mb": 0.002}, set_to_none=False),
    "batched_find_unused": Spec("unused", {"batched_grad_copy": True,
                                           "find_unused_parameters": True},
                                rank_config="extra_on_rank0"),
    "batched_static": Spec("mlp", {"batched_grad_copy": True, "static_graph": True}, steps=5),
    "fwd_sync_off": Spec("convbn", {"forward_sync_buffers": False}),
    "fwd_sync_on_bcast_off": Spec("convbn", {"forward_sync_buffers": True,
                                             "broadcast_buffers": False}),
}


def compare_specs(rank: int, world_size: int, names: list[str]) -> dict[str, list[str]]:
    out = {}
    for name in names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out[name] = compare(SPECS[name], run_spec(rank, "torch", SPECS[name]),
                                run_spec(rank, "reference", SPECS[name]))
    return out


def layouts(rank: int, world_size: int) -> dict[str, Any]:
    """``bucket_sizes`` (initial) and, after two steps, ``rebuilt_bucket_sizes`` with a
    per-bucket cap list, per DDP."""
    out: dict[str, Any] = {}
    for impl, cls in IMPLS.items():
        model = _mlp()
        ddp = cls(model, bucket_cap_mb_list=[0.001, 0.005])
        for _ in range(3):
            models.loss_of(ddp(torch.randn(2, 8))).backward()
        data = ddp._get_ddp_logging_data()
        out[impl] = [data["bucket_sizes"], data.get("rebuilt_bucket_sizes")]
    return out


# --------------------------------------------------------------------------- comm hooks


def _localsgd_state() -> Any:
    subgroup, _ = dist.new_subgroups(group_size=1)
    return post_localSGD_hook.PostLocalSGDState(process_group=None, subgroup=subgroup,
                                                start_localSGD_iter=2)


HOOKS: dict[str, Callable[[], tuple[Any, Any]]] = {
    "allreduce": lambda: (None, default_hooks.allreduce_hook),
    "fp16_compress": lambda: (None, default_hooks.fp16_compress_hook),
    "fp16_wrapper": lambda: (None, default_hooks.fp16_compress_wrapper(
        default_hooks.allreduce_hook)),
    "noop": lambda: (None, debugging_hooks.noop_hook),
    "powerSGD": lambda: (powerSGD_hook.PowerSGDState(
        process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2),
        powerSGD_hook.powerSGD_hook),
    "batched_powerSGD": lambda: (powerSGD_hook.PowerSGDState(
        process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2),
        powerSGD_hook.batched_powerSGD_hook),
    "post_localSGD": lambda: (_localsgd_state(), post_localSGD_hook.post_localSGD_hook),
}


def comm_hooks(rank: int, world_size: int, names: list[str]) -> dict[str, list[str]]:
    """Each of torch's hook modules' hooks, 4 steps, small buckets, bitwise per DDP."""
    out = {}
    for name in names:
        def setup(ddp: nn.Module, model: nn.Module, name: str = name) -> None:
            state, hook = HOOKS[name]()
            ddp.register_comm_hook(state, hook)  # type: ignore[operator]
        # PowerSGD's callbacks block a Gloo worker thread on a nested allreduce: with more
        # buckets in flight than Gloo has threads (2) it deadlocks, under torch's DDP too.
        kwargs = {} if "powerSGD" in name else {"bucket_cap_mb": 0.002}
        out[name] = both(_mlp, kwargs, setup)
    return out


def batched_powersgd_errors(rank: int, world_size: int) -> dict[str, str | None]:
    """``batched_powerSGD_hook`` fails in torch 2.13 itself (its ``_orthogonalize`` gets a
    2-D tensor once PowerSGD starts): the same error with both DDPs."""
    out = {}
    for impl in IMPLS:
        def run(impl: str = impl) -> None:
            def setup(ddp: nn.Module, model: nn.Module) -> None:
                state, hook = HOOKS["batched_powerSGD"]()
                ddp.register_comm_hook(state, hook)  # type: ignore[operator]
            train(impl, _mlp, {}, setup, steps=3)
        out[impl] = _error(run)
    return out


def builtin_hooks(rank: int, world_size: int) -> dict[str, list[str]]:
    out = {}
    for kind in (dist.BuiltinCommHookType.ALLREDUCE, dist.BuiltinCommHookType.FP16_COMPRESS):
        def setup(ddp: nn.Module, model: nn.Module,
                  kind: dist.BuiltinCommHookType = kind) -> None:
            ddp._register_builtin_comm_hook(kind)  # type: ignore[operator]
        out[str(kind)] = both(_mlp, {"bucket_cap_mb": 0.002}, setup)
    return out


def hook_twice(rank: int, world_size: int) -> dict[str, list[str | None]]:
    """A second hook (Python after built-in, built-in after Python) is refused."""
    out: dict[str, list[str | None]] = {}
    for impl, cls in IMPLS.items():
        a = cls(_mlp())
        a._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        b = cls(_mlp())
        b.register_comm_hook(None, default_hooks.allreduce_hook)
        out[impl] = [_error(lambda a=a: a.register_comm_hook(None, default_hooks.allreduce_hook)),
                     _error(lambda b=b: b._register_builtin_comm_hook(
                         dist.BuiltinCommHookType.ALLREDUCE))]
    return out


def fused_optim(rank: int, world_size: int) -> dict[str, list[str]]:
    """``_register_fused_optim``: parameters updated in backward (no optimizer step), all
    parameters, or a subset (``optim_params``)."""
    def all_params(ddp: nn.Module, model: nn.Module) -> None:
        ddp._register_fused_optim(torch.optim.SGD, lr=0.1, momentum=0.5)  # type: ignore[operator]

    def some(ddp: nn.Module, model: nn.Module) -> None:
        ddp._register_fused_optim(torch.optim.Adam, lr=0.01,  # type: ignore[operator]
                                  optim_params=list(model.fc2.parameters()))
    return {"sgd": both(_mlp, {"bucket_cap_mb": 0.002}, all_params, optimizer=False),
            "adam_subset": both(_mlp, {}, some, optimizer=False)}


# --------------------------------------------------------------------------- buffers


def _sum_buffers(state: Any, named_buffers: dict[str, torch.Tensor]) -> list[Any]:
    return [dist.all_reduce(b, group=state, async_op=True).get_future()
            for b in named_buffers.values() if b.is_floating_point()]


def _sum_buffers_sync(state: Any, named_buffers: dict[str, torch.Tensor]) -> None:
    for b in named_buffers.values():
        if b.is_floating_point():
            dist.all_reduce(b, group=state)


def buffer_hooks(rank: int, world_size: int) -> dict[str, list[str]]:
    """``_register_buffer_comm_hook`` before and after the forward, with futures or not."""
    out = {}
    cases = {"post_futures": (_sum_buffers, _BufferCommHookLocation.POST_FORWARD),
             "pre_sync": (_sum_buffers_sync, _BufferCommHookLocation.PRE_FORWARD)}
    # (PRE_FORWARD with futures races the forward's in-place buffer updates, as torch's
    # docstring warns: no bitwise comparison is possible there.)
    for name, (hook, where) in cases.items():
        def setup(ddp: nn.Module, model: nn.Module, hook: Any = hook, where: Any = where) -> None:
            ddp._register_buffer_comm_hook(dist.group.WORLD, hook, where)  # type: ignore[operator]
        out[name] = both(models.ConvBN, {}, setup)
    return out


def buffer_futures_awaited(rank: int, world_size: int) -> dict[str, list[bool]]:
    """A POST_FORWARD buffer hook whose futures finish 0.3 s later (a timer): are they
    done when ``backward()`` returns? (The reducer awaits them at its end.)"""
    out = {}
    for impl, cls in IMPLS.items():
        futures: list[Any] = []

        def slow(state: Any, named_buffers: dict[str, torch.Tensor],
                 futures: list[Any] = futures) -> list[Any]:
            futures.clear()
            for b in named_buffers.values():
                if b.is_floating_point():
                    dist.all_reduce(b)
                    late: torch.futures.Future[torch.Tensor] = torch.futures.Future()
                    threading.Timer(0.3, late.set_result, (b,)).start()
                    futures.append(late)
            return list(futures)

        torch.manual_seed(0)
        ddp = cls(models.ConvBN())
        ddp._register_buffer_comm_hook(None, slow)
        done = []
        for _ in range(2):
            models.loss_of(ddp(torch.randn(4, 2, 4, 4))).backward()
            done.append(all(f.done() for f in futures) and len(futures) > 0)
        out[impl] = done
    return out


# --------------------------------------------------------------------------- group update


def update_group(rank: int, world_size: int) -> list[str]:
    """Two steps, ``_update_process_group`` to a new traced group, two more: collectives
    (the layout is rebuilt again) and values."""
    new = dist.new_group(list(range(world_size)))
    records = {}
    for impl in IMPLS:
        holder: dict[str, Any] = {}

        def setup(ddp: nn.Module, model: nn.Module, holder: dict[str, Any] = holder) -> None:
            holder["ddp"] = ddp
        first = train(impl, _mlp, {"bucket_cap_mb": 0.002}, setup, steps=2)
        ddp = holder["ddp"]
        pg = traced(new)
        ddp._update_process_group(pg)
        gen = torch.Generator().manual_seed(7 + rank)
        later = []
        for _ in range(2):
            models.loss_of(ddp(torch.randn(4, 8, generator=gen))).backward()
            later.append({"grads": _grads(ddp.module), "trace": calls(pg),
                          "rebuilt": ddp._has_rebuilt_buckets})
            ddp.module.zero_grad()
        records[impl] = [first, later]
    records["reference"][0]["init"] = drop_extra_allgather(records["reference"][0]["init"])
    return _diff(records["torch"], records["reference"])


# --------------------------------------------------------------------------- delayed allreduce


class _AllDelayed(nn.Module):
    """Two linear layers whose parameters can all be delayed, an input gate ``gate.w``
    that DDP ignores (the hooked parameter: its gradient comes after all the others), and
    a frozen parameter: torch needs one parameter it neither delays nor ignores, else its
    device check sees no parameter at all and raises."""

    def __init__(self, frozen: bool = True) -> None:
        super().__init__()
        self.gate = nn.Module()
        self.gate.w = nn.Parameter(torch.ones(8))
        self.a = nn.Linear(8, 6)
        self.b = nn.Linear(6, 4)
        self.frozen = nn.Module()
        if frozen:
            self.frozen.scale = nn.Parameter(torch.ones(1), requires_grad=False)
        self._ddp_params_and_buffers_to_ignore = ["gate.w"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b(torch.tanh(self.a(x * self.gate.w)))
        return y * self.frozen.scale if hasattr(self.frozen, "scale") else y


def delayed(rank: int, world_size: int) -> dict[str, list[str]]:
    """``delay_all_reduce_named_params``: some parameters (reducer for the rest) and all
    of them (no reducer); gradients after the never-awaited allreduce settles."""
    def some(model: nn.Module) -> dict[str, Any]:
        return {"delay_all_reduce_named_params": list(model.fc2.named_parameters(prefix="fc2")),
                "param_to_hook_all_reduce": model.fc1.weight}

    def every(model: nn.Module) -> dict[str, Any]:
        return {"delay_all_reduce_named_params": [(n, p) for n, p in model.named_parameters()
                                                  if p.requires_grad and n != "gate.w"],
                "param_to_hook_all_reduce": model.gate.w}

    out = {}
    for name, make, kwargs_of in (("some", _mlp, some), ("all", _AllDelayed, every)):
        records = {impl: _train_delayed(impl, make, kwargs_of) for impl in IMPLS}
        records["reference"]["init"] = drop_extra_allgather(records["reference"]["init"])
        first = records["torch"].pop("first_forward")
        records["reference"].pop("first_forward")
        out[name] = _diff(records["torch"], records["reference"])
        if (name == "all") != (first is not None and "_lazy_init_ran" in first):
            out[name].append(f"torch's first forward: {first}")
    errors = {}
    for impl, cls in IMPLS.items():
        model = _AllDelayed(frozen=False)
        errors[impl] = _error(lambda cls=cls, model=model: cls(model, **every(model)))
    out["all_without_frozen"] = _diff(errors["torch"], errors["reference"])
    if errors["torch"] is None:
        out["all_without_frozen"].append("torch accepted it")
    return out


def _settle(delayed: list[nn.Parameter]) -> None:
    """Wait (on every rank alike) until the delayed parameters' gradients are equal on all
    ranks: the allreduce DDP starts for them is never waited for by DDP itself."""
    for _ in range(200):
        local = torch.cat([torch.zeros(0)] + [p.grad.flatten() for p in delayed
                                              if p.grad is not None])
        gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, local)
        equal = torch.tensor([float(all(torch.equal(g, local) for g in gathered))])
        dist.all_reduce(equal, op=dist.ReduceOp.MIN)
        if equal.item() == 1.0:
            return
        time.sleep(0.01)
    raise TimeoutError("the delayed allreduce did not settle")


def _train_delayed(impl: str, make: Callable[[], nn.Module],
                   kwargs_of: Callable[[nn.Module], dict[str, Any]]) -> dict[str, Any]:
    rank = dist.get_rank()
    torch.manual_seed(1 + rank)
    model = make()
    pg = traced(dist.distributed_c10d._get_default_group())
    ddp = IMPLS[impl](model, process_group=pg, bucket_cap_mb=0.002, **kwargs_of(model))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)
    out: dict[str, Any] = {"init": calls(pg), "steps": [],
                           "all_delayed": ddp._delay_all_reduce_all_params,
                           "has_reducer": hasattr(ddp, "reducer"), "first_forward": None}
    if impl == "torch" and not hasattr(ddp, "_lazy_init_ran"):
        # torch's all-delayed constructor returns before setting ``_lazy_init_ran``: its
        # first forward raises AttributeError before doing anything. Recorded, then
        # worked around so that the path torch intends is compared.
        out["first_forward"] = _error(lambda: ddp(torch.randn(4, 8)))
        ddp._lazy_init_ran = True
    for step in range(3):
        with torch.no_grad() if step == 1 else contextlib.nullcontext():
            y = ddp(torch.randn(4, 8, generator=gen))
        after_forward = _grads(model)
        if step != 1:
            models.loss_of(y).backward()
        _settle(ddp._delay_all_reduce_params)
        grads = _grads(model)
        opt.step()
        opt.zero_grad(set_to_none=step != 0)
        out["steps"].append({"after_forward": after_forward, "grads": grads,
                             "params": _params(model), "trace": calls(pg)})
    return out


# --------------------------------------------------------------------------- mixed precision


def mixed_precision_constructor(rank: int, world_size: int) -> dict[str, Any]:
    """What torch's constructor does with ``mixed_precision`` (works on CPU), per DDP, and
    torch's CPU forward error."""
    out: dict[str, Any] = {}
    for impl, cls in IMPLS.items():
        torch.manual_seed(0)
        model = models.ConvBN()
        config = _MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float32,
                                 buffer_dtype=torch.bfloat16)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ddp = cls(model, mixed_precision=config)
        out[impl] = {
            "params": [p.dtype for p in model.parameters()],
            "buffers": [b.dtype for b in model.buffers()],
            "mp": [(p._mp_param.dtype, p._mp_param.untyped_storage().size(),
                    p._fp_param.data_ptr() == p.data_ptr()) for p in model.parameters()],
            "idx": [getattr(p, "_idx", None) for p in model.parameters()],
            "hooks": len(ddp._comm_hooks),
            "second_hook": _error(lambda ddp=ddp: ddp.register_comm_hook(
                None, default_hooks.allreduce_hook)),
            "pre_hooks": len(model._forward_pre_hooks) > 0,
        }
        if impl == "torch":
            out[impl]["forward"] = _error(lambda ddp=ddp: ddp(torch.randn(2, 2, 4, 4)))
    return out


def mixed_precision_training(rank: int, world_size: int,
                             param_dtype: torch.dtype, reduce_dtype: torch.dtype | None,
                             ) -> dict[str, Any]:
    """The reference with ``mixed_precision`` on CPU against a hand computation: each
    rank's gradients from a ``param_dtype`` copy of the model on ``param_dtype`` inputs,
    cast to the reduction dtype, summed over ranks, divided by the world size, cast to the
    parameters' dtype; parameters full precision outside forward/backward."""
    config = _MixedPrecision(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    reduce = reduce_dtype or param_dtype
    torch.manual_seed(0)
    model = models.MLP()
    twin = models.MLP().to(param_dtype)
    twin.load_state_dict(model.state_dict())
    ddp = ddp_reference.DistributedDataParallel(model, mixed_precision=config,
                                                bucket_cap_mb=0.002)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)
    diffs: list[str] = []
    dtypes_in_forward: list[torch.dtype] = []
    hook = model.fc1.register_forward_hook(
        lambda m, i, o: dtypes_in_forward.append(m.weight.dtype))
    for step in range(3):
        x = torch.randn(4, 8, generator=gen)
        models.loss_of(ddp(x)).backward()
        models.loss_of(twin(x.to(param_dtype))).backward()
        for p, q in zip(model.parameters(), twin.parameters(), strict=True):
            assert q.grad is not None and p.grad is not None
            gathered = [torch.empty_like(q.grad) for _ in range(world_size)]
            dist.all_gather(gathered, q.grad)
            total = gathered[0].to(reduce)
            for g in gathered[1:]:
                total = total + g.to(reduce)
            expected = (total / world_size).to(p.dtype)
            if p.dtype != torch.float32 or not torch.equal(p.grad, expected):
                diffs.append(f"step {step}: grad {p.grad.dtype} vs expected {expected.dtype}, "
                             f"equal={torch.equal(p.grad.float(), expected.float())}")
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for p, q in zip(model.parameters(), twin.parameters(), strict=True):
                q.copy_(p)
                q.grad = None
        diffs += [f"step {step}: param dtype {p.dtype}" for p in model.parameters()
                  if p.dtype != torch.float32]
    hook.remove()
    return {"diffs": diffs, "forward_dtypes": dtypes_in_forward,
            "replicas_equal": _params(model)}


# --------------------------------------------------------------------------- misc surface


def misc_surface(rank: int, world_size: int) -> dict[str, Any]:
    """``train``, ``state_dict``/``load_state_dict``, the ignore helpers,
    ``_get_data_parallel_params``, ``_check_reducer_finalized``, ``_remove_autograd_hooks``,
    ``_set_ddp_sink_clone``, per DDP."""
    out: dict[str, Any] = {}
    for impl, cls in IMPLS.items():
        rec: dict[str, Any] = {}
        model = models.ConvBN()
        cls._set_params_and_buffers_to_ignore_for_model(model, ["head.bias", "bn.running_var"])
        ddp = cls(model)
        rec["ignored"] = [n for n, p in model.named_parameters() if hasattr(p, "_ddp_ignored")]
        rec["ignored_bufs"] = [n for n, b in model.named_buffers() if hasattr(b, "_ddp_ignored")]
        rec["dp_params"] = [n for n, _ in cls._get_data_parallel_params(model, named_params=True)]
        rec["dp_count"] = len(list(cls._get_data_parallel_params(model)))
        rec["train"] = [ddp.train(False) is ddp, model.training, ddp.train() is ddp, model.training]
        state = ddp.state_dict()
        rec["keys"] = list(state)
        fresh = cls(models.ConvBN())
        fresh.load_state_dict(state)
        rec["loaded"] = [torch.equal(a, b) for a, b in zip(
            fresh.state_dict().values(), state.values(), strict=True)]

        unused = cls(models.UnusedOnSomeRanks())
        models.loss_of(unused(torch.randn(2, 8))).backward()
        rec["not_finalized"] = _error(unused._check_reducer_finalized)
        fine = cls(_mlp())
        models.loss_of(fine(torch.randn(2, 8))).backward()
        rec["finalized"] = _error(fine._check_reducer_finalized)

        local = cls(_mlp())
        local._remove_autograd_hooks()
        models.loss_of(local(torch.randn(2, 8) + rank)).backward()
        rec["no_hooks_grads"] = _grads(local.module)
        rec["no_hooks_next"] = _error(lambda local=local: local(torch.randn(2, 8)))

        rec["sample_rate"] = [_error(lambda fine=fine: fine._set_ddp_runtime_logging_sample_rate(0)),
                              _error(lambda fine=fine: fine._set_ddp_runtime_logging_sample_rate(5))]
        rec["bf16_hook"] = _error(lambda fine=fine: fine.register_comm_hook(
            None, default_hooks.bf16_compress_hook))
        rec["bad_annotation"] = _error(lambda fine=fine: fine._check_comm_hook(_misannotated))

        for clone in (True, False):
            sink = cls(_mlp(), find_unused_parameters=True)
            sink._set_ddp_sink_clone(clone)
            seen: list[torch.Tensor] = []
            sink.module.register_forward_hook(lambda m, i, o, seen=seen: seen.append(o))
            y = sink(torch.randn(2, 8))
            rec[f"sink_clone_{clone}"] = y.data_ptr() == seen[0].data_ptr()
            models.loss_of(y).backward()
        out[impl] = rec
    return out


def _misannotated(state: object, bucket: int) -> torch.futures.Future[torch.Tensor]:
    raise NotImplementedError


def delete_wrapper(rank: int, world_size: int) -> dict[str, Any]:
    """After ``del ddp; gc.collect()`` the module trains alone: local gradients (they differ
    across ranks) and no collective on the group DDP used."""
    out: dict[str, Any] = {}
    for impl, cls in IMPLS.items():
        model = _mlp()
        pg = traced(dist.distributed_c10d._get_default_group())
        ddp = cls(model, process_group=pg)
        models.loss_of(ddp(torch.randn(2, 8))).backward()
        model.zero_grad()
        calls(pg)
        del ddp
        gc.collect()
        x = torch.randn(2, 8, generator=torch.Generator().manual_seed(rank))
        models.loss_of(model(x)).backward()
        out[impl] = {"grads": _grads(model), "trace": calls(pg)}
    return out


def quantization_and_bf16_under_torch(rank: int, world_size: int) -> dict[str, str | None]:
    """Hooks that fail under torch itself on Gloo CPU (only confirmed, not chased)."""
    from torch.distributed.algorithms.ddp_comm_hooks import quantization_hooks

    out: dict[str, str | None] = {}
    for name, hook in (("quantize_per_tensor", quantization_hooks.quantization_pertensor_hook),
                       ("bf16_compress", default_hooks.bf16_compress_hook)):
        ddp = nn.parallel.DistributedDataParallel(_mlp(), bucket_cap_mb=0.002)

        def run(ddp: nn.Module = ddp, hook: Any = hook) -> None:
            ddp.register_comm_hook(dist.group.WORLD, hook)  # type: ignore[operator]
            models.loss_of(ddp(torch.randn(2, 8))).backward()
        out[name] = _error(run)
    return out


def optimizer_in_backward(rank: int, world_size: int, grad_view: bool) -> dict[str, Any]:
    """``_apply_optimizer_in_backward`` (SGD) under the reference's DDP against torch's
    DDP with the same SGD stepped after backward (2 ranks: dividing after the sum equals
    torch's pre-division bitwise); torch's own in-backward path fails on CPU."""
    from torch.distributed.optim import _apply_optimizer_in_backward

    out: dict[str, Any] = {}
    gen = torch.Generator().manual_seed(1000 + rank)
    data = [torch.randn(4, 8, generator=gen) for _ in range(3)]
    ours = _mlp()
    _apply_optimizer_in_backward(torch.optim.SGD, ours.parameters(), {"lr": 0.05})
    ref = ddp_reference.DistributedDataParallel(ours, bucket_cap_mb=0.002,
                                                gradient_as_bucket_view=grad_view)
    theirs = _mlp()
    ddp = nn.parallel.DistributedDataParallel(theirs, bucket_cap_mb=0.002,
                                              gradient_as_bucket_view=grad_view)
    opt = torch.optim.SGD(theirs.parameters(), lr=0.05)
    steps = []
    for x in data:
        models.loss_of(ref(x)).backward()
        models.loss_of(ddp(x)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps.append({"params": _diff(_params(theirs), _params(ours)),
                      "grads": [g is None for g in _grads(ours)]})
    out["steps"] = steps
    broken = _mlp()
    _apply_optimizer_in_backward(torch.optim.SGD, broken.parameters(), {"lr": 0.05})
    torch_ddp = nn.parallel.DistributedDataParallel(broken)
    out["torch_on_cpu"] = _error(lambda: models.loss_of(torch_ddp(data[0])).backward())
    return out


class _NoEvent:
    """Stands in for ``torch.Event`` on CPU: recording and waiting do nothing (the work is
    already ordered on the one CPU stream)."""

    def record(self, *args: Any, **kwargs: Any) -> None:
        return None

    def wait(self, *args: Any, **kwargs: Any) -> None:
        return None


class _NoStream:
    def wait_stream(self, *args: Any, **kwargs: Any) -> None:
        return None


@contextlib.contextmanager
def torch_streams_on_cpu() -> Any:
    """torch's mixed precision and optimizer-in-backward made runnable on CPU for the
    length of the block: their only CPU obstacles are ``torch.Event`` and
    ``torch.accelerator.current_stream()``, stubbed here (restored on exit)."""
    from unittest import mock

    with mock.patch.object(torch, "Event", _NoEvent), \
            mock.patch.object(torch.accelerator, "current_stream", lambda *a: _NoStream()):
        yield


def mixed_precision_vs_torch(rank: int, world_size: int, param_dtype: torch.dtype,
                             reduce_dtype: torch.dtype | None,
                             buffer_dtype: torch.dtype | None, model: str) -> list[str]:
    """The reference's mixed precision against torch's own, run on CPU with events and
    the accelerator stream stubbed (:func:`torch_streams_on_cpu`), bitwise, after
    one warm-up backward whose gradients are discarded: torch's first iteration reduces
    uninitialised memory (``set_mixed_precision_param_dtype`` replaces the buckets'
    ``gradients`` but not the views gradients are copied into), its bucket rebuild then
    fixes the layout. The reference reduces the real gradients from the start
    (:func:`mixed_precision_training` checks that)."""
    config = _MixedPrecision(param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                             buffer_dtype=buffer_dtype)
    make = {"mlp": models.MLP, "convbn": models.ConvBN}[model]
    with torch_streams_on_cpu(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return both(make, {"mixed_precision": config, "bucket_cap_mb": 0.002}, warmup=True)



def optimizer_in_backward_vs_torch(rank: int, world_size: int, grad_view: bool) -> list[str]:
    """The reference's optimizer-in-backward against torch's own, run on CPU with the
    accelerator stream stubbed (:func:`torch_streams_on_cpu`), bitwise."""
    from torch.distributed.optim import _apply_optimizer_in_backward

    def make() -> nn.Module:
        model = models.MLP()
        _apply_optimizer_in_backward(torch.optim.SGD, model.parameters(),
                                     {"lr": 0.05, "momentum": 0.9})
        return model

    with torch_streams_on_cpu():
        return both(make, {"bucket_cap_mb": 0.002, "gradient_as_bucket_view": grad_view},
                    optimizer=False)
