"""The module wrapper: torch's ``DistributedDataParallel`` in pure Python.

Specifies ``torch/nn/parallel/distributed.py`` (torch 2.13) for the options listed in the
constructor: which parameters are reduced, the initial synchronisation, what happens
before and after each forward (buffer broadcast, ``no_sync``, unused-parameter search,
bucket rebuild, Join notifications), comm hooks and the Join protocol. The reduction
itself lives in :mod:`.reducer`.
"""
from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable, JoinHook
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import collectives
from .buckets import BucketCapacity, initial_bucket_layout
from .comm_hook import check_comm_hook
from .join import DDPJoinHook
from .reducer import Reducer
from .sink import DDPSink
from .unused import find_tensors

__all__ = ["DistributedDataParallel"]


def _produces_sparse_gradient(module: nn.Module) -> bool:
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        return bool(module.sparse)
    return False


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_to_device(o, device) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return type(obj)((k, _to_device(v, device)) for k, v in obj.items())
    return obj


class DistributedDataParallel(nn.Module, Joinable):
    """Data parallelism over a process group, with torch DDP's semantics.

    Accepts torch's ``module, device_ids, output_device, broadcast_buffers,
    process_group, bucket_cap_mb, find_unused_parameters, gradient_as_bucket_view,
    static_graph, init_sync``; any other torch DDP argument is a ``TypeError`` naming it.

    The constructor builds ``self.reducer`` as ``self.reducer_class(...)``: a subclass may
    set ``reducer_class`` to a :class:`~ddp_reference.reducer.Reducer` subclass to change
    how gradients are reduced (the mutants of the test suite do) without touching the
    constructor.
    """

    #: The class of ``self.reducer``, which ``__init__`` builds once bucket layout is known.
    reducer_class: ClassVar[type[Reducer]] = Reducer

    def __init__(
        self,
        module: nn.Module,
        device_ids: Sequence[int | torch.device] | None = None,
        output_device: int | torch.device | None = None,
        *,
        broadcast_buffers: bool = True,
        process_group: dist.ProcessGroup | None = None,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        init_sync: bool = True,
    ) -> None:
        super().__init__()
        Joinable.__init__(self)
        if not dist.is_initialized():
            raise RuntimeError("Default process group has not been initialized, please make "
                               "sure to call init_process_group.")
        pg = process_group if process_group is not None else dist.distributed_c10d._get_default_group()
        self.process_group: dist.ProcessGroup = pg
        self.module = module

        ignore = getattr(module, "_ddp_params_and_buffers_to_ignore", ())
        self.parameters_to_ignore: set[str] = set(ignore)
        module_params = [p for n, p in module.named_parameters()
                         if n not in self.parameters_to_ignore]
        if not any(p.requires_grad for p in module_params):
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't "
                               "have any parameter that requires a gradient.")
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("device_ids can only be None or contain a single element.")
        device_types = {p.device.type for p in module_params}
        if len(device_types) != 1:
            raise ValueError("DistributedDataParallel's input module must be on the same type "
                             f"of devices, but input module parameters locate in {device_types}.")
        self.device_type = next(iter(device_types))
        multi_device = len({p.device for p in module_params}) > 1
        if not device_ids or self.device_type == "cpu" or multi_device:
            if device_ids or output_device:
                raise ValueError(
                    "DistributedDataParallel device_ids and output_device arguments only work "
                    "with single-device/multiple-device GPU modules or CPU modules, but got "
                    f"device_ids {device_ids}, output_device {output_device}, and module "
                    f"parameters { {p.device for p in module_params} }."
                )
            self.device_ids: list[int] | None = None
            self.output_device: int | None = None
        else:
            self.device_ids = [torch.device(self.device_type, d).index if isinstance(d, int)
                               else torch.device(d).index for d in device_ids]  # type: ignore[misc]
            out = output_device if output_device is not None else self.device_ids[0]
            self.output_device = torch.device(self.device_type, out).index if isinstance(out, int) \
                else torch.device(out).index
        self.device: torch.device = module_params[0].device

        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.static_graph = False
        self._static_graph_delay_allreduce_enqueued = False
        self._divide_by_initial_world_size = True
        self._has_rebuilt_buckets = False
        self._comm_hooks: list[tuple[Any, Any]] = []
        self.bucket_capacity = BucketCapacity.from_bucket_cap_mb(bucket_cap_mb)
        self.bucket_bytes_cap = self.bucket_capacity.bytes_cap

        params, expect_sparse, names = self._build_params_for_reducer()
        if init_sync:
            collectives.verify_param_shapes(pg, params, names)
            self._sync_module_states(src=0, with_buffers=broadcast_buffers)

        self._make_reducer(params, expect_sparse, names, static_graph)

    # ----------------------------------------------------------------- construction
    def _make_reducer(self, params: list[nn.Parameter], expect_sparse: list[bool],
                      names: list[str], static_graph: bool) -> None:
        """A new reducer over ``params`` in torch's initial bucket layout (the constructor
        and ``__setstate__``, as torch's ``_ddp_init_helper``)."""
        layout = initial_bucket_layout(params, self.bucket_capacity, expect_sparse,
                                       static_graph, self.find_unused_parameters)
        self.reducer = self.reducer_class(params, layout, self.process_group, expect_sparse,
                                          self.bucket_capacity, self.find_unused_parameters,
                                          self.gradient_as_bucket_view, names)
        if static_graph:
            self.static_graph = False
            self._set_static_graph()

    # ----------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        """Pickling, ``copy.deepcopy`` and ``torch.save`` (torch's ``__getstate__``): only
        on the default group; the process group and the reducer are left out."""
        self._check_default_group()
        attrs = dict(self.__dict__)
        del attrs["process_group"]
        del attrs["reducer"]
        return attrs

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling (torch's ``__setstate__``): the default group, and a new reducer in
        the initial bucket layout, static graph again where it was set; no init sync, and
        no comm hook on the new reducer (torch registers none either)."""
        self.process_group = dist.distributed_c10d._get_default_group()
        super().__setstate__(state)
        self.__dict__.setdefault("require_forward_param_sync", True)
        self.__dict__.setdefault("require_backward_grad_sync", True)
        params, expect_sparse, names = self._build_params_for_reducer()
        self._make_reducer(params, expect_sparse, names, bool(self.static_graph))

    def _check_default_group(self) -> None:
        try:
            default = self.process_group == dist.distributed_c10d._get_default_group()
        except (RuntimeError, ValueError):
            default = False
        if not default:
            raise RuntimeError(
                "DDP Pickling/Unpickling are only supported when using DDP with the default "
                "process group. That is, when you have called init_process_group and have "
                "not passed process_group argument to DDP constructor")

    def _build_params_for_reducer(self) -> tuple[list[nn.Parameter], list[bool], list[str]]:
        """Parameters reduced, in torch's order: modules in ``named_modules()`` order, each
        module's own ``requires_grad`` parameters, a shared parameter only the first time."""
        seen: set[nn.Parameter] = set()
        params: list[nn.Parameter] = []
        expect_sparse: list[bool] = []
        names: list[str] = []
        for module_name, submodule in self.module.named_modules():
            for param_name, param in submodule.named_parameters(recurse=False):
                fqn = f"{module_name}.{param_name}" if module_name else param_name
                if not param.requires_grad or fqn in self.parameters_to_ignore or param in seen:
                    continue
                seen.add(param)
                params.append(param)
                expect_sparse.append(_produces_sparse_gradient(submodule))
                names.append(fqn)
        self._assign_modules_buffers()
        return params, expect_sparse, names

    def _assign_modules_buffers(self) -> None:
        """Buffers DDP broadcasts, looked up again before each sync (they may be reassigned)."""
        self.named_module_buffers = {n: b for n, b in self.module.named_buffers()
                                     if n not in self.parameters_to_ignore}
        self.modules_buffers = list(self.named_module_buffers.values())

    def _sync_module_states(self, src: int, with_buffers: bool) -> None:
        """Broadcast all parameters (and buffers) from group rank ``src``."""
        states = [p.detach() for n, p in self.module.named_parameters()
                  if n not in self.parameters_to_ignore]
        if with_buffers:
            states += [b.detach() for n, b in self.module.named_buffers()
                       if n not in self.parameters_to_ignore]
        collectives.broadcast_coalesced(self.process_group, states, src)

    def _set_static_graph(self) -> None:
        """Declare the graph static (torch's ``_set_static_graph``); before training only
        (after it, the reducer raises). A second call only warns, as torch's does."""
        if self.static_graph:
            warnings.warn("You've set static_graph to be True, no need to set it again.",
                          stacklevel=2)
            return
        self.static_graph = True
        self._static_graph_delay_allreduce_enqueued = False
        self.reducer.set_static_graph()
        if self.find_unused_parameters:
            warnings.warn(
                "You passed find_unused_parameters=true to DistributedDataParallel, "
                "`_set_static_graph` will detect unused parameters automatically, so you do "
                "not need to set find_unused_parameters=true, just be sure these unused "
                "parameters will not change during training loop while calling "
                "`_set_static_graph`.", stacklevel=2)

    # ----------------------------------------------------------------- forward
    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forwards run inside skip gradient synchronisation; gradients accumulate locally
        and the first synchronised backward after it reduces the accumulated sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        inputs, kwargs = self._pre_forward(*inputs, **kwargs)
        output = self.module(*inputs, **kwargs)
        return self._post_forward(output)

    def _pre_forward(self, *inputs: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        grad_enabled = torch.is_grad_enabled()
        if grad_enabled and self.require_backward_grad_sync:
            self._log_runtime_stats()
            self.reducer.prepare_for_forward()
        work = Join.notify_join_context(self)
        if work:
            self.reducer.set_forward_pass_work_handle(work, self._divide_by_initial_world_size)
        if grad_enabled and self.reducer.rebuild_buckets():
            self._has_rebuilt_buckets = True
        if self.will_sync_module_buffers():
            self._sync_buffers()
        if self._join_config.enable:
            self._check_global_requires_backward_grad_sync(is_joined_rank=False)
        if self.device_ids:
            device = torch.device(self.device_type, self.device_ids[0])
            return _to_device(inputs, device), _to_device(kwargs, device)
        return inputs, kwargs

    def _post_forward(self, output: Any) -> Any:
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self.require_forward_param_sync = True
            if self.find_unused_parameters and not self.static_graph:
                self.reducer.prepare_for_backward(list(find_tensors(output)))
            else:
                self.reducer.prepare_for_backward([])
        else:
            self.require_forward_param_sync = False
        if ((self.find_unused_parameters and not self.static_graph)
                or (self.static_graph and not self._static_graph_delay_allreduce_enqueued)):
            output = self._through_sink(output)
        return output

    def _through_sink(self, output: Any) -> Any:
        leaves, spec = tree_flatten(output)
        passed = DDPSink.apply(self._sink_backward_callback(), *leaves)
        merged = [leaf if not isinstance(leaf, torch.Tensor) or leaf.grad_fn is None else new
                  for leaf, new in zip(leaves, passed, strict=True)]
        return tree_unflatten(merged, spec)

    def _sink_backward_callback(self) -> Any:
        ref = weakref.ref(self)

        def on_backward() -> None:
            ddp = ref()
            if ddp is None or not ddp.static_graph or ddp._static_graph_delay_allreduce_enqueued:
                return
            torch.autograd.Variable._execution_engine.queue_callback(ddp.reducer.delay_all_reduce)
            ddp._static_graph_delay_allreduce_enqueued = True

        return on_backward

    # ----------------------------------------------------------------- buffers
    def will_sync_module_buffers(self) -> bool:
        """Buffers are broadcast before a forward that follows a synchronised forward."""
        return (self.require_forward_param_sync and self.broadcast_buffers
                and len(self.modules_buffers) > 0)

    @property
    def _distributed_rank(self) -> int:
        return self.process_group.rank()

    def _sync_buffers(self) -> None:
        with torch.no_grad():
            if self._join_config.enable:
                src = collectives.find_common_rank(self.process_group, self.device,
                                                   self._distributed_rank, True)
            else:
                src = 0
            self._assign_modules_buffers()
            with torch.autograd._unsafe_preserve_version_counter(tuple(self.modules_buffers)):
                collectives.broadcast_coalesced(self.process_group, self.modules_buffers, src)

    # ----------------------------------------------------------------- join
    def join_hook(self, **kwargs: Any) -> JoinHook:
        """The hook shadowing this DDP's collectives on a joined rank
        (``divide_by_initial_world_size``, default True, chooses the divisor)."""
        return DDPJoinHook(self, kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self) -> torch.device:
        return self.device

    @property
    def join_process_group(self) -> dist.ProcessGroup:
        return self.process_group

    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False) -> Join:
        """Torch's ``DistributedDataParallel.join``: a ``Join`` over this module alone."""
        return Join([self], enable, throw_on_early_termination,
                    divide_by_initial_world_size=divide_by_initial_world_size)

    def _check_global_requires_backward_grad_sync(self, is_joined_rank: bool) -> bool | None:
        flag = 1 if (not is_joined_rank and self.require_backward_grad_sync) else 0
        tensor = torch.full((1,), float(flag), device=self.device)
        work = collectives.allreduce(self.process_group, tensor)
        if is_joined_rank:
            work.wait()
            return bool(tensor.item() != 0)
        return None

    def _check_and_sync_module_buffers(self) -> None:
        if self.will_sync_module_buffers():
            src = collectives.find_common_rank(self.process_group, self.device,
                                               self._distributed_rank, False)
            collectives.broadcast_coalesced(self.process_group, self.modules_buffers, src)

    def _sync_final_model(self, is_last_joiner: bool) -> None:
        src = collectives.find_common_rank(self.process_group, self.device,
                                           self._distributed_rank, is_last_joiner)
        self._authoritative_rank = src
        self._sync_module_states(src=src, with_buffers=self.broadcast_buffers)

    # ----------------------------------------------------------------- comm hooks
    def register_comm_hook(self, state: object, hook: Any) -> None:
        """Reduce buckets with ``hook(state, bucket)`` instead of the built-in allreduce;
        once only, before the first backward."""
        check_comm_hook(hook)
        self.reducer.register_comm_hook(state, hook)
        self._comm_hooks.append((hook, state))

    # ----------------------------------------------------------------- introspection
    @property
    def bucket_indices(self) -> list[list[int]]:
        """Current layout: parameter indices per bucket, in reduction order."""
        return self.reducer.bucket_indices()

    @property
    def has_rebuilt_buckets(self) -> bool:
        return self.reducer.has_rebuilt_bucket

    def _log_runtime_stats(self) -> None:
        """Snapshot of the runtime state, taken (like torch's logger) at the start of each
        synchronised grad-enabled forward, before that forward's bucket rebuild: in
        ``_get_ddp_logging_data`` a rebuild shows up one synchronised forward later."""
        reducer = self.reducer
        stats: dict[str, Any] = {"iteration": reducer.num_iterations,
                                 "has_rebuilt_buckets": int(reducer.has_rebuilt_bucket)}
        if reducer.rebuilt_bucket_indices is not None:
            stats["rebuilt_bucket_sizes"] = self._bucket_sizes(reducer.rebuilt_bucket_indices)
            stats["rebuilt_per_bucket_param_indices"] = ", ".join(
                " ".join(str(i) for i in b) for b in reducer.rebuilt_bucket_indices)
        if reducer.grad_ready_order:
            stats["prev_iteration_grad_ready_order_indices"] = ", ".join(
                str(i) for i in reducer.grad_ready_order)
        self._logged_stats = stats

    def _bucket_sizes(self, layout: list[list[int]]) -> str:
        params = self.reducer.params
        return ", ".join(str(sum(params[i].numel() * params[i].element_size() for i in b))
                         for b in layout)

    def _get_ddp_logging_data(self) -> dict[str, Any]:
        """The bucket-related subset of torch's ``_get_ddp_logging_data()``, with its keys,
        formats (sizes in bytes, comma separated; indices space separated per bucket) and
        timing (see ``_log_runtime_stats``). ``bucket_indices``, ``has_rebuilt_buckets``
        and ``reducer.rebuilt_iteration`` give the current state without the delay."""
        data: dict[str, Any] = {
            "bucket_sizes": self._bucket_sizes(self.reducer.initial_bucket_indices),
            "bucket_cap_bytes": self.bucket_bytes_cap,
            "gradient_as_bucket_view": int(self.gradient_as_bucket_view),
            "find_unused_parameters": int(self.find_unused_parameters),
            "static_graph": int(self.static_graph),
            "num_parameter_tensors": len(self.reducer.params),
            "world_size": self.process_group.size(),
            "rank": self.process_group.rank(),
            "iteration": 0,
        }
        data.update(getattr(self, "_logged_stats", {}))
        return data
