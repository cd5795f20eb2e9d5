"""The module wrapper: torch's ``DistributedDataParallel`` in pure Python.

Specifies ``torch/nn/parallel/distributed.py`` (torch 2.13) over its public surface: every
constructor argument, in torch's order and with torch's defaults (``dim``, the buffer
options ``broadcast_buffers``/``forward_sync_buffers``, ``init_sync``, ``process_group`` or
a 1-D ``device_mesh``, ``bucket_cap_mb``/``bucket_cap_mb_list``,
``find_unused_parameters``, ``check_reduction``, ``gradient_as_bucket_view``,
``static_graph``, ``delay_all_reduce_named_params``/``param_to_hook_all_reduce``,
``mixed_precision``, ``skip_all_reduce_unused_params``, ``batched_grad_copy``); which
parameters are reduced, the initial synchronisation, what happens before and after each
forward (buffer sync or buffer comm hook, ``no_sync``, unused-parameter search, bucket
rebuild, Join notifications, the delayed parameters' gradient buffer); comm hooks (Python,
built-in, fused optimizer), ``_update_process_group``, the ignore helpers, pickling and
the Join protocol. The reduction itself lives in :mod:`.reducer`, mixed precision in
:mod:`.mixed_precision`.

What the reference deliberately does not copy, and why
------------------------------------------------------
* **Logging internals**: ``self.logger`` (``dist.Logger``), ``_set_ddp_runtime_logging_
  sample_rate``'s sampling, timers and the comm-hook name. ``_get_ddp_logging_data`` gives
  only the bucket subset (sizes, cap, rebuild state and order), which is what conformance
  is judged on; the rest describes torch's own C++ process, not DDP semantics.
* **CUDA streams and events**: the side stream of input copies
  (``use_side_stream_for_tensor_copies``), mixed precision's copy stream and events, the
  upcast and optimizer streams. The reference works on the current stream; on CPU this is
  what makes its mixed precision and optimizer-in-backward run at all (torch's raise "cpu
  backend doesn't support events" / "Cannot access accelerator device" there; with those
  two calls stubbed torch's run on CPU and match the reference bitwise).
* **Python-reducer / compiled-autograd mode** (``torch._dynamo.config.optimize_ddp =
  "python_reducer"``): a torch.compile integration (``_register_accum_grad_hook``,
  ``_inside_ddp_forward``'s ``_active_ddp_module``, inductor fusion flags), not a DDP
  semantics of its own; the reference always reduces with its reducer.
* **RRef outputs** (``_tree_flatten_with_rref``): distributed-autograd RPC outputs; the
  reference finds tensors in tensors, sequences, dicts and dataclasses only.
* **SyncBatchNorm handle** (``_passing_sync_batchnorm_handle``): SyncBatchNorm needs
  CUDA, and torch only uses the walk to refuse it on CPU modules.
* **Multi-device paths**: ``scatter``, ``gather``, ``to_kwargs`` and ``dim``'s use by them
  (single-process multi-device DDP is gone from torch; ``dim`` is stored only), and
  ``device_ids`` input moves use a plain ``.to(device)``, not torch's streamed
  ``_to_kwargs``.
* **Optimizer in backward**: copied (:mod:`.optim_in_backward`) but, like mixed
  precision, without torch's optimizer stream: torch's hook needs an accelerator ("Cannot
  access accelerator device when none is available" on CPU), the reference's runs on CPU.
* **Sparse metadata** (``_set_sparse_metadata``) and the **2-D mesh** transform for
  tensor parallelism (``_pre_dp_module_transform`` for a mesh sliced from a larger one):
  TorchRec / DTensor integrations outside DDP's data-parallel contract.
* **Debug-mode checks** (``TORCH_DISTRIBUTED_DEBUG``: ``_build_debug_param_to_name_mapping``
  consistency errors, per-rank unused-parameter logs): the reference always names the
  parameters in its errors instead.
* Known deviations kept on purpose: the shape check at construction adds one allgather so
  that every rank raises on a mismatch (torch: only the mismatching rank), and the
  "Expected to have finished reduction" error lists parameter names as torch does only in
  debug mode; a hook annotated ``bucket: dist.GradBucket`` in a module with ``from
  __future__ import annotations`` (the annotation is then a string) is accepted, where
  torch's ``_check_comm_hook`` compares the string with the class and refuses it.
* Torch defects *kept* as torch has them (the reference is a specification of torch 2.13,
  not of what it intends): ``_get_data_parallel_params(named_params=True)`` yields ignored
  parameters too; the all-delayed check names root-level parameters ``".name"``; a
  delayed-allreduce DDP whose every trainable parameter is delayed has no reducer and
  torch's forward on it raises ``AttributeError: ... '_lazy_init_ran'`` (the reference's
  forward runs the path torch intends: the module's own ``forward`` and
  ``_clear_grad_buffer``).
"""
from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable, JoinHook
from torch.distributed.utils import _cast_forward_inputs
from torch.nn.parallel.distributed import _BufferCommHook, _BufferCommHookLocation
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import collectives, mixed_precision, optim_in_backward
from .buckets import BucketCapacity, initial_bucket_layout
from .comm_hook import builtin_comm_hook, check_comm_hook
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


def _check_arguments(delay_all_reduce_named_params: Any, param_to_hook_all_reduce: Any) -> None:
    """What torch's constructor refuses before it looks at the module: no default process
    group (``RuntimeError``), one of the two delayed all-reduce arguments without the other
    (``ValueError``)."""
    if not dist.is_initialized():
        raise RuntimeError("Default process group has not been initialized, please make "
                           "sure to call init_process_group.")
    if (delay_all_reduce_named_params is not None) != (param_to_hook_all_reduce is not None):
        raise ValueError("delay_all_reduce_named_params and param_to_hook_all_reduce "
                         "need to be set at the same time.")


def _buffer_sync_options(broadcast_buffers: bool | None,
                         forward_sync_buffers: bool | None) -> tuple[bool, bool]:
    """``(forward_sync_buffers, init_sync_buffers)`` from the two buffer options, with
    torch's FutureWarnings: ``forward_sync_buffers`` wins when given, and then buffers are
    synced at init whatever its value; otherwise ``broadcast_buffers`` (default True)
    decides both."""
    if broadcast_buffers is not None:
        if forward_sync_buffers is not None:
            warnings.warn(
                "Both `broadcast_buffers` and `forward_sync_buffers` were specified. "
                "`broadcast_buffers` is deprecated and its value is ignored when "
                "`forward_sync_buffers` is provided.", FutureWarning, stacklevel=3)
        else:
            warnings.warn(
                "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead. "
                "IMPORTANT: unlike `broadcast_buffers=False`, `forward_sync_buffers=False` "
                "still syncs buffers at init. If you rely on buffers NOT being synced at init "
                "(e.g. rank-local buffers), keep using `broadcast_buffers=False` until "
                "`init_sync_buffers` is available.", FutureWarning, stacklevel=3)
    if forward_sync_buffers is not None:
        return forward_sync_buffers, True
    effective = broadcast_buffers if broadcast_buffers is not None else True
    return effective, effective


class DistributedDataParallel(nn.Module, Joinable):
    """Data parallelism over a process group, with torch DDP's semantics.

    Takes torch 2.13's constructor arguments, in its positional order and with its
    defaults (see the module docstring for what each one does and what is not copied);
    an unknown argument is a ``TypeError`` naming it.

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
        dim: int = 0,
        broadcast_buffers: bool | None = None,
        init_sync: bool = True,
        process_group: dist.ProcessGroup | None = None,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        delay_all_reduce_named_params: Sequence[tuple[str, nn.Parameter]] | None = None,
        param_to_hook_all_reduce: torch.Tensor | None = None,
        mixed_precision: Any = None,
        device_mesh: Any = None,
        skip_all_reduce_unused_params: bool = False,
        bucket_cap_mb_list: Sequence[float] | None = None,
        batched_grad_copy: bool = False,
        forward_sync_buffers: bool | None = None,
    ) -> None:
        super().__init__()
        Joinable.__init__(self)
        _check_arguments(delay_all_reduce_named_params, param_to_hook_all_reduce)
        self.process_group: dist.ProcessGroup = self._group_from(process_group, device_mesh)
        if device_mesh is not None:
            self.device_mesh = device_mesh
        self.module = module
        module_params = self._take_parameters(module, delay_all_reduce_named_params)
        self._set_devices(device_ids, output_device, module_params)
        self.static_graph = False
        self.dim = dim
        self.device: torch.device = module_params[0].device
        init_sync_buffers = self._set_options(
            broadcast_buffers, forward_sync_buffers, find_unused_parameters,
            gradient_as_bucket_view, batched_grad_copy, mixed_precision)
        if check_reduction:
            warnings.warn("The `check_reduction` argument in `DistributedDataParallel` module "
                          "is deprecated. Please avoid using it.", FutureWarning, stacklevel=2)
        if any(isinstance(p, nn.parameter.UninitializedParameter) for p in module_params):
            raise RuntimeError(
                "Modules with uninitialized parameters can't be used with "
                "`DistributedDataParallel`. Run a dummy forward pass to correctly initialize "
                "the modules")
        self._set_bucket_caps(bucket_cap_mb, bucket_cap_mb_list)
        if self._delay_all_reduce(param_to_hook_all_reduce, device_ids):
            return  # as torch: no reducer at all, forward is the module's own
        self._init_reducer_state(skip_all_reduce_unused_params)
        params, expect_sparse, names = self._build_params_for_reducer()
        if init_sync:
            collectives.verify_param_shapes(self.process_group, params, names)
            self._sync_module_states(src=0, with_buffers=init_sync_buffers)
        self._make_reducer(params, expect_sparse, names, static_graph)
        if mixed_precision is not None:
            self._setup_mixed_precision()
        if static_graph:
            self._set_static_graph()

    def _take_parameters(self, module: nn.Module, delay_all_reduce_named_params:
                         Sequence[tuple[str, nn.Parameter]] | None) -> list[nn.Parameter]:
        """The module's parameters DDP manages: all but those named in
        ``_ddp_params_and_buffers_to_ignore`` and the delayed ones (torch's constructor
        adds ``delay_all_reduce_named_params`` to ``parameters_to_ignore``); none requiring
        a gradient is a ``RuntimeError``, as torch."""
        ignore = getattr(module, "_ddp_params_and_buffers_to_ignore", ())
        self.parameters_to_ignore: set[str] = set(ignore)
        self._delay_all_reduce_params: list[nn.Parameter] = []
        for name, param in delay_all_reduce_named_params or ():
            self.parameters_to_ignore.add(name)
            self._delay_all_reduce_params.append(param)
        module_params = [p for n, p in module.named_parameters()
                         if n not in self.parameters_to_ignore]
        self._module_parameters = module_params
        if not any(p.requires_grad for p in module_params) and not self._delay_all_reduce_params:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't "
                               "have any parameter that requires a gradient.")
        return module_params

    def _set_options(self, broadcast_buffers: bool | None, forward_sync_buffers: bool | None,
                     find_unused_parameters: bool, gradient_as_bucket_view: bool,
                     batched_grad_copy: bool, mixed_precision: Any) -> bool:
        """Keep the constructor's plain options (torch's attribute names); whether the
        init sync broadcasts buffers (:func:`_buffer_sync_options`)."""
        self.forward_sync_buffers, init_sync_buffers = _buffer_sync_options(
            broadcast_buffers, forward_sync_buffers)
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.batched_grad_copy = batched_grad_copy
        self.mixed_precision = mixed_precision
        return init_sync_buffers

    def _set_bucket_caps(self, bucket_cap_mb: float | None,
                         bucket_cap_mb_list: Sequence[float] | None) -> None:
        """The bucket capacities (torch's ``bucket_bytes_cap``, ``bucket_bytes_cap_list``)
        and the init sync's broadcast bucket size."""
        self.broadcast_bucket_size = collectives.BROADCAST_BUCKET_BYTES
        self.bucket_capacity = BucketCapacity.from_bucket_cap_mb(bucket_cap_mb, bucket_cap_mb_list)
        self.bucket_bytes_cap = self.bucket_capacity.bytes_cap
        self.bucket_bytes_cap_list = list(self.bucket_capacity.per_bucket_caps)

    def _delay_all_reduce(self, param_to_hook_all_reduce: torch.Tensor | None,
                          device_ids: Sequence[int | torch.device] | None) -> bool:
        """Set up the delayed all-reduce of ``delay_all_reduce_named_params`` (its hook on
        ``param_to_hook_all_reduce``); whether every parameter is delayed (torch then
        builds no reducer at all)."""
        self._delay_grad_buffer: torch.Tensor | None = None
        self._delay_grad_views: list[torch.Tensor] = []
        self._delay_all_reduce_all_params = False
        if self._delay_all_reduce_params:
            assert param_to_hook_all_reduce is not None
            self._register_delay_all_reduce_hook(param_to_hook_all_reduce, device_ids)
        return self._delay_all_reduce_all_params

    def _init_reducer_state(self, skip_all_reduce_unused_params: bool) -> None:
        """The state torch's constructor sets before it builds the reducer."""
        self.skip_all_reduce_unused_params = skip_all_reduce_unused_params
        self._static_graph_delay_allreduce_enqueued = False
        self._divide_by_initial_world_size = True
        self._has_rebuilt_buckets = False
        self._comm_hooks: list[tuple[Any, Any]] = []
        self._ddp_sink_clone = True
        self._lazy_init_ran = False

    @staticmethod
    def _group_from(process_group: dist.ProcessGroup | None,
                    device_mesh: Any) -> dist.ProcessGroup:
        """The group DDP reduces over: ``process_group``, a 1-D ``device_mesh``'s group, or
        the default group (torch's constructor; both given is a ``RuntimeError``)."""
        if process_group and device_mesh is not None:
            raise RuntimeError("Cannot specify both process_group and device_mesh arguments.")
        if device_mesh is not None:
            if device_mesh.ndim != 1:
                raise RuntimeError(f"Only 1D device mesh is supported, but got {device_mesh}.")
            group: dist.ProcessGroup = device_mesh.get_group(mesh_dim=0)
            return group
        if process_group is not None:
            return process_group
        return dist.distributed_c10d._get_default_group()

    def _set_devices(self, device_ids: Sequence[int | torch.device] | None,
                     output_device: int | torch.device | None,
                     module_params: list[nn.Parameter]) -> None:
        """``device_type``, ``device_ids`` and ``output_device`` as torch checks and sets
        them (CPU and multi-device modules take neither)."""
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("device_ids can only be None or contain a single element.")
        device_types = {p.device.type for p in module_params}
        if len(device_types) != 1:
            raise ValueError("DistributedDataParallel's input module must be on the same type "
                             f"of devices, but input module parameters locate in {device_types}.")
        self.device_type = next(iter(device_types))
        self.is_multi_device_module = len({p.device for p in module_params}) > 1
        if not device_ids or self.device_type == "cpu" or self.is_multi_device_module:
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

    @property
    def broadcast_buffers(self) -> bool:
        """Deprecated alias of ``forward_sync_buffers`` (torch's property)."""
        return bool(self.forward_sync_buffers)

    @broadcast_buffers.setter
    def broadcast_buffers(self, value: bool) -> None:
        self.forward_sync_buffers = value

    # ----------------------------------------------------------------- construction
    def _make_reducer(self, params: list[nn.Parameter], expect_sparse: list[bool],
                      names: list[str], static_graph: bool) -> None:
        """A new reducer over ``params`` in torch's initial bucket layout (the constructor
        and ``__setstate__``, as torch's ``_ddp_init_helper``). ``static_graph`` is the
        constructor's (or the pickled DDP's): torch's layout depends on it before the
        reducer is told, so a static graph starts with one bucket per dtype even under
        ``find_unused_parameters``; ``set_static_graph`` follows."""
        layout = initial_bucket_layout(params, self.bucket_capacity, expect_sparse,
                                       static_graph, self.find_unused_parameters)
        if self.mixed_precision is not None:
            for index, param in enumerate(params):
                param._idx = index  # type: ignore[attr-defined]
        self.reducer = self.reducer_class(params, layout, self.process_group, expect_sparse,
                                          self.bucket_capacity, self.find_unused_parameters,
                                          self.gradient_as_bucket_view, names,
                                          skip_all_reduce_unused_params=getattr(
                                              self, "skip_all_reduce_unused_params", False),
                                          batched_grad_copy=getattr(
                                              self, "batched_grad_copy", False))

    def _setup_mixed_precision(self) -> None:
        """torch's mixed-precision setup (see :mod:`.mixed_precision`): twins, buffer cast,
        the root pre-forward hook, the allreduce-and-upcast comm hook, bucket dtype."""
        config = self.mixed_precision
        mixed_precision.setup_params(config.param_dtype, self.module)
        mixed_precision.cast_buffers(config.buffer_dtype, self.module)
        self.module.register_forward_pre_hook(
            functools.partial(mixed_precision.root_copy_hook, weakref.ref(self)),
            prepend=False, with_kwargs=True)
        self.register_comm_hook(mixed_precision.AllreduceUpcastState(self),
                                mixed_precision.allreduce_and_upcast_hook)
        self.reducer.set_mixed_precision_param_dtype(config.param_dtype)

    # ----------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        """Pickling, ``copy.deepcopy`` and ``torch.save`` (torch's ``__getstate__``): only
        on the default group; the process group and the reducer are left out."""
        self._check_default_group()
        attrs = dict(self.__dict__)
        del attrs["process_group"]
        del attrs["reducer"]
        attrs["broadcast_buffers"] = self.forward_sync_buffers
        return attrs

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling (torch's ``__setstate__``): the default group, and a new reducer in
        the initial bucket layout, static graph again where it was set; no init sync, and
        no comm hook on the new reducer (torch registers none either)."""
        self.process_group = dist.distributed_c10d._get_default_group()
        super().__setstate__(state)
        self.__dict__.setdefault("require_forward_param_sync", True)
        self.__dict__.setdefault("require_backward_grad_sync", True)
        old_broadcast = self.__dict__.pop("broadcast_buffers", True)
        self.__dict__.setdefault("forward_sync_buffers", old_broadcast)
        params, expect_sparse, names = self._build_params_for_reducer()
        self._make_reducer(params, expect_sparse, names, bool(self.static_graph))
        if self.static_graph:
            self.static_graph = False
            self._set_static_graph()

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
        if self._delay_all_reduce_all_params:
            # torch calls ``module.forward`` here, bypassing the module's own hooks.
            output = self.module.forward(*inputs, **kwargs)
        else:
            output = self.module(*inputs, **kwargs)
        return self._post_forward(output)

    def _pre_forward(self, *inputs: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if not self.__dict__.get("_lazy_init_ran", True) and not torch.compiler.is_compiling():
            self._lazy_init()
        if self._delay_all_reduce_all_params:
            return inputs, kwargs
        grad_enabled = torch.is_grad_enabled()
        if grad_enabled and self.require_backward_grad_sync:
            self._log_runtime_stats()
            self.reducer.prepare_for_forward()
        work = Join.notify_join_context(self)
        if work:
            self.reducer.set_forward_pass_work_handle(work, self._divide_by_initial_world_size)
        if grad_enabled and self.reducer.rebuild_buckets():
            self._has_rebuilt_buckets = True
        if self._check_sync_bufs_pre_fwd():
            self._sync_buffers()
        if self._join_config.enable:
            self._check_global_requires_backward_grad_sync(is_joined_rank=False)
        if self.device_ids:
            device = torch.device(self.device_type, self.device_ids[0])
            inputs, kwargs = _to_device(inputs, device), _to_device(kwargs, device)
        if self.mixed_precision is not None:
            inputs, kwargs = _cast_forward_inputs(self.mixed_precision.param_dtype,
                                                  *inputs, **kwargs)
        return inputs, kwargs

    def _post_forward(self, output: Any) -> Any:
        if self._delay_all_reduce_all_params:
            self._clear_grad_buffer()
            return output
        if self._check_sync_bufs_post_fwd():
            self._sync_buffers()
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
        self._clear_grad_buffer()
        return output

    def _through_sink(self, output: Any) -> Any:
        leaves, spec = tree_flatten(output)
        passed = DDPSink.apply(self._sink_backward_callback(), self._ddp_sink_clone, *leaves)
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

    def _lazy_init(self) -> None:
        """Before the first forward (torch's ``_lazy_init``): optimizers registered with
        ``_apply_optimizer_in_backward`` run in DDP's comm hook, after the reduction."""
        self._setup_in_backward_optimizers()
        self._lazy_init_ran = True

    def _setup_in_backward_optimizers(self) -> None:
        """torch's ``_setup_in_backward_optimizers``: if a DDP parameter has
        ``_in_backward_optimizers``, their post-accumulate hooks are removed and
        :func:`.optim_in_backward.apply_optim_in_backward_hook` reduces each bucket, sets
        ``.grad`` to the reduced bucket view and steps the optimizers; ``.grad`` is ``None``
        after backward. (torch's hook needs an accelerator; see that module.)"""
        if not any(hasattr(p, "_in_backward_optimizers") for p in self._module_parameters):
            return
        handles = dist.optim.apply_optimizer_in_backward.param_to_optim_hook_handle_map
        for param in self._module_parameters:
            for handle in handles.get(param, []):
                handle.remove()
        self.register_comm_hook(weakref.ref(self), optim_in_backward.apply_optim_in_backward_hook(
            self.gradient_as_bucket_view))
        self.reducer.set_optimizer_in_backward()

    def _set_ddp_sink_clone(self, val: bool) -> None:
        """Whether the sink node (dynamic unused search, static graph's first iteration)
        clones the outputs (default True; torch's ``_set_ddp_sink_clone``)."""
        self._ddp_sink_clone = val

    def train(self, mode: bool = True) -> DistributedDataParallel:
        super().train(mode)
        return self

    # ----------------------------------------------------------------- delayed allreduce
    def _register_delay_all_reduce_hook(self, param_to_hook_all_reduce: torch.Tensor,
                                        device_ids: Sequence[int | torch.device] | None) -> None:
        """``delay_all_reduce_named_params`` (torch's ``_register_delay_all_reduce_hook``):
        one flat default-dtype buffer for the delayed parameters' gradients, their
        broadcast from rank 0 (coalesced in buckets of ``bucket_cap_mb`` *bytes*, the
        whole-MiB value torch passes), a tensor hook on ``param_to_hook_all_reduce`` that
        divides the buffer by the world size and starts its allreduce (never waited for),
        and views of the buffer that become the gradients (``_clear_grad_buffer``)."""
        device = torch.device("cpu") if device_ids is None else device_ids[0]
        numel = sum(p.numel() for p in self._delay_all_reduce_params)
        self._delay_grad_buffer = torch.zeros(numel, device=device)
        collectives.broadcast_coalesced(self.process_group,
                                        [p.detach() for p in self._delay_all_reduce_params], 0,
                                        bucket_bytes=self.bucket_capacity.bucket_cap_mb)
        param_to_hook_all_reduce.register_hook(self._delayed_all_reduce_hook)
        offset = 0
        for param in self._delay_all_reduce_params:
            view = self._delay_grad_buffer[offset:offset + param.numel()].view(param.shape)
            self._delay_grad_views.append(view)
            offset += param.numel()
        self._delay_all_reduce_all_params = not any(
            p.requires_grad and n not in self.parameters_to_ignore
            for n, p in self._named_params_by_module())

    def _named_params_by_module(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Parameters as torch's delay check names them: ``f"{module}.{param}"``, so a
        parameter of the root module gets a leading dot and never matches an ignored name
        (torch's quirk, kept: all-delayed needs every root-level parameter frozen)."""
        for module_name, submodule in self.module.named_modules():
            for param_name, param in submodule.named_parameters(recurse=False):
                yield f"{module_name}.{param_name}", param

    def _delayed_all_reduce_hook(self, grad: torch.Tensor) -> torch.Tensor:
        buffer = self._delay_grad_buffer
        assert buffer is not None
        buffer.div_(self.process_group.size())
        self._delay_all_reduce_work = collectives.allreduce(self.process_group, buffer)
        return grad

    def _clear_grad_buffer(self) -> None:
        """After each forward: a delayed parameter without ``.grad`` gets its buffer view
        (zeroed), or the whole buffer is zeroed when none has one (``_clear_grad_buffer``)."""
        buffer = self._delay_grad_buffer
        if buffer is None:
            return
        all_none = all(p.grad is None for p in self._delay_all_reduce_params)
        for param, view in zip(self._delay_all_reduce_params, self._delay_grad_views, strict=True):
            if param.grad is None:
                param.grad = view
                if not all_none:
                    view.zero_()
        if all_none:
            buffer.zero_()

    # ----------------------------------------------------------------- buffers
    def will_sync_module_buffers(self) -> bool:
        """Buffers are synced before a forward that follows a synchronised forward."""
        return (self.require_forward_param_sync and self.forward_sync_buffers
                and len(self.modules_buffers) > 0)

    def _check_sync_bufs_pre_fwd(self) -> bool:
        return self.will_sync_module_buffers() and (
            not hasattr(self, "buffer_hook")
            or self.buffer_hook.buffer_comm_hook_location == _BufferCommHookLocation.PRE_FORWARD)

    def _check_sync_bufs_post_fwd(self) -> bool:
        return (self.will_sync_module_buffers() and hasattr(self, "buffer_hook")
                and self.buffer_hook.buffer_comm_hook_location
                == _BufferCommHookLocation.POST_FORWARD)

    def _register_buffer_comm_hook(
        self, state: Any, hook: Any,
        comm_hook_location: _BufferCommHookLocation = _BufferCommHookLocation.POST_FORWARD,
    ) -> None:
        """Sync buffers with ``hook(state, named_module_buffers)`` instead of the broadcast
        from rank 0, before or after the forward; futures it returns are awaited at the
        end of the next backward (torch's ``_register_buffer_comm_hook``)."""
        if not callable(hook):
            raise AssertionError(f"hook must be callable, got {type(hook).__name__}")
        self.buffer_hook = _BufferCommHook(buffer_comm_hook=hook, buffer_comm_hook_state=state,
                                           buffer_comm_hook_location=comm_hook_location)

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
                self._sync_module_buffers(src)

    def _sync_module_buffers(self, authoritative_rank: int) -> None:
        if not hasattr(self, "buffer_hook"):
            collectives.broadcast_coalesced(self.process_group, self.modules_buffers,
                                            authoritative_rank)
            return
        hook = self.buffer_hook.buffer_comm_hook
        futures = hook(self.buffer_hook.buffer_comm_hook_state, self.named_module_buffers)
        if futures is not None:
            self.reducer.install_futures(futures)

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
        if self._check_sync_bufs_pre_fwd():
            src = collectives.find_common_rank(self.process_group, self.device,
                                               self._distributed_rank, False)
            self._sync_module_buffers(src)

    def _sync_final_model(self, is_last_joiner: bool) -> None:
        src = collectives.find_common_rank(self.process_group, self.device,
                                           self._distributed_rank, is_last_joiner)
        self._authoritative_rank = src
        self._sync_module_states(src=src, with_buffers=self.forward_sync_buffers)

    # ----------------------------------------------------------------- comm hooks
    def register_comm_hook(self, state: object, hook: Any) -> None:
        """Reduce buckets with ``hook(state, bucket)`` instead of the built-in allreduce;
        once only, before the first backward."""
        check_comm_hook(hook)
        self._comm_hooks.append((hook, state))
        self.reducer.register_comm_hook(state, hook)

    def _check_comm_hook(self, hook: Any) -> None:
        """torch's validation of a hook: callable, ``bucket`` annotated ``dist.GradBucket``
        if at all, returns ``torch.futures.Future[torch.Tensor]`` if annotated, bf16 hooks
        only with CUDA+NCCL 2.10 or XPU+XCCL."""
        check_comm_hook(hook)

    def _register_builtin_comm_hook(self, comm_hook_type: dist.BuiltinCommHookType) -> None:
        """torch's C++ built-in hooks (``ALLREDUCE``, ``FP16_COMPRESS``), bound to the group
        DDP has now (see :func:`.comm_hook.builtin_comm_hook`)."""
        hook = builtin_comm_hook(comm_hook_type)
        if hook is None:
            warnings.warn("Unknown built-in DDP comm hook type is provided. No comm hook will "
                          "be used.", stacklevel=2)
            return
        self.reducer.register_comm_hook(self.process_group, hook, builtin=True)

    def _register_fused_optim(self, optim: type, *args: Any, optim_params: Any = None,
                              **kwargs: Any) -> None:
        """Run ``optim`` on each parameter as soon as its bucket is reduced, in backward
        (torch's ``_register_fused_optim``: torch's own ``_as_overlapped_optim(...)
        .register_ddp(self)``, which registers ``_hook_then_optimizer(allreduce_hook, ...)``
        through ``register_comm_hook``)."""
        from torch.distributed.algorithms._optimizer_overlap import _as_overlapped_optim

        overlapped = _as_overlapped_optim(optim, optim_params, *args, **kwargs)
        try:
            overlapped.register_ddp(self)  # type: ignore[arg-type]
        except NotImplementedError as e:
            raise RuntimeError(
                f"{optim} does not support overlapped DDP. Please file an issue to PyTorch or "
                f"the respective owner of {optim}.") from e

    # ----------------------------------------------------------------- process group
    def _update_process_group(self, new_process_group: dist.ProcessGroup) -> None:
        """Reduce over ``new_process_group`` from now on: the reducer forgets the iteration
        in progress and rebuilds its layout after the next backward; a rank outside the new
        group keeps the old one (torch's ``_update_process_group``; comm hooks keep the
        group they were given)."""
        self._has_rebuilt_buckets = False
        self.reducer.reset_state()
        if not dist.distributed_c10d._rank_not_in_group(new_process_group):
            self.process_group = new_process_group
            self.reducer.update_process_group(new_process_group)

    # ----------------------------------------------------------------- misc surface
    @staticmethod
    def _get_data_parallel_params(module: nn.Module, named_params: bool = False) -> Iterator[Any]:
        """The parameters of ``module`` not marked ``_ddp_ignored``. With ``named_params``
        torch tests the ``(name, param)`` tuple, never marked, so every named parameter is
        yielded, ignored ones included (kept as torch has it)."""
        items = module.named_parameters() if named_params else module.parameters()
        for item in items:
            if not hasattr(item, "_ddp_ignored"):
                yield item

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(module: nn.Module,
                                                    params_and_buffers_to_ignore: Any) -> None:
        """Names (fully qualified) of parameters and buffers DDP must leave alone: stored on
        the module, and the tensors marked ``_ddp_ignored`` (torch's static method)."""
        module._ddp_params_and_buffers_to_ignore = params_and_buffers_to_ignore
        for name, param in module.named_parameters():
            if name in params_and_buffers_to_ignore:
                param._ddp_ignored = True  # type: ignore[attr-defined]
        for name, buffer in module.named_buffers():
            if name in params_and_buffers_to_ignore:
                buffer._ddp_ignored = True  # type: ignore[attr-defined]

    def _set_ddp_runtime_logging_sample_rate(self, sample_rate: int) -> None:
        """Accepted and validated as torch does; the reference keeps no runtime timings."""
        if sample_rate < 1:
            raise ValueError("DDP runtime logging sample rate should be equal or greater "
                             "than 1")
        self._ddp_runtime_logging_sample_rate = sample_rate

    def _remove_autograd_hooks(self) -> None:
        """Remove the reducer's hooks from the parameters' gradient accumulators."""
        self.reducer.remove_hooks()

    def _check_reducer_finalized(self) -> None:
        """Raise torch's "Expected to have finished reduction ..." error if the last
        backward did not finish its reduction."""
        self.reducer.check_finalized()

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
