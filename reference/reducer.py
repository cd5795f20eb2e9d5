"""Gradient reduction: grad hooks, buckets, overlap, write-back (torch's ``c10d::Reducer``).

What it specifies, from ``torch/csrc/distributed/c10d/reducer.cpp``:

* One hook per parameter, run after its ``AccumulateGrad`` node (also when that node got
  no gradient, as with an output left out of the loss). When the reducer expects hooks,
  the hook copies ``param.grad`` into the parameter's bucket view, divided by the world
  size first (``grad * (1/world)``, or an in-place ``div_`` when the gradient already is
  the view), or zeroes the view when there is no gradient.
* A bucket whose gradients are all ready is reduced asynchronously, strictly in bucket
  order (bucket ``i`` starts only after ``0..i-1`` started); when the last one has started
  a callback is queued on the autograd engine, which waits for every bucket and copies
  the results into ``param.grad`` before ``backward()`` returns.
* ``find_unused_parameters``: parameters not reached from the outputs are marked ready at
  the first hook; a map of locally used parameters (int32, one allreduce per iteration,
  after the buckets) decides which are globally unused, whose ``.grad`` is left untouched.
  Local use is recorded by the hooks even inside ``no_sync``, so it accumulates.
* Without dynamic unused search the layout is rebuilt once, from the gradient-ready order
  of the first synced iteration, and rank 0's layout is broadcast to all.
* ``static_graph``: the first iteration only counts hook firings per parameter and
  reduces everything at the end of backward; later iterations mark a parameter ready when
  its hook fired as many times as in the first.
* A missing reduction makes the next forward raise torch's "Expected to have finished
  reduction in the prior iteration ..." error.
* ``skip_all_reduce_unused_params`` (``should_skip_all_reduce_bucket``): a bucket whose
  parameters are all in this iteration's unused set is not reduced, and its gradients are
  left as they are at the end of backward (meant for parameters unused on every rank: a
  rank that skips a bucket another rank reduces desynchronises the group, as in torch).
* ``batched_grad_copy`` (``flush_deferred_copies``): gradients are copied into a bucket
  in one ``_foreach_copy_`` when its last gradient is ready, and the whole flat bucket is
  then divided in place (``div_``, not the per-gradient ``mul`` by the reciprocal).
* ``mixed_precision_param_dtype`` (``set_mixed_precision_param_dtype``): buckets hold
  gradients in that dtype, and incoming gradients are checked against it.
* A complex bucket (``is_complex_bucket``) is stored as its real view: a flat buffer of
  ``2 * numel`` real elements, into which each complex parameter has a ``view_as_complex``
  view. That real buffer is what is allreduced, what a comm hook's ``buffer()`` returns
  (its ``gradients()`` are slices of it at the complex offsets, as torch's), and how the
  tensor a hook returns is read back.
* Futures installed by a buffer comm hook (``install_futures``) are awaited at the end
  of backward, after the buckets.
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd import Variable

from . import collectives
from .buckets import BucketCapacity, assign_buckets
from .comm_hook import GradBucket, allreduce_sum_future, hook_result
from .unused import grad_accumulator, unused_parameter_indices

_queue_callback: Callable[[Callable[[], None]], None] = Variable._execution_engine.queue_callback


class Bucket:
    """One flat gradient buffer and the per-parameter views into it."""

    __slots__ = (
        "deferred",
        "expect_sparse",
        "future",
        "gradients",
        "is_complex",
        "lengths",
        "offsets",
        "params",
        "pending",
        "sizes",
        "sparse_grad",
        "sparse_zeros",
        "variable_indices",
        "views_in",
        "views_out",
        "work",
    )

    def __init__(self, variable_indices: list[int], params: list[torch.Tensor],
                 expect_sparse: bool, dtype: torch.dtype | None = None) -> None:
        self.variable_indices = variable_indices
        self.params = params
        self.expect_sparse = expect_sparse
        self.offsets: list[int] = []
        self.lengths: list[int] = []
        self.sizes: list[torch.Size] = []
        self.views_in: list[torch.Tensor] = []
        self.views_out: list[torch.Tensor] = []
        self.pending = len(params)
        #: A complex bucket (torch's ``is_complex_bucket``): ``gradients`` is its real view.
        self.is_complex = False
        #: Intra-bucket positions whose copy ``batched_grad_copy`` deferred.
        self.deferred: list[int] = []
        self.work: dist.Work | None = None
        self.future: torch.futures.Future | None = None
        self.sparse_grad: torch.Tensor | None = None
        #: A sparse zero tensor shaped like the last gradient (what a joined rank sends).
        self.sparse_zeros: torch.Tensor | None = None
        if expect_sparse:
            self.gradients = torch.empty(0)
            return
        offset = 0
        for p in params:
            self.offsets.append(offset)
            self.lengths.append(p.numel())
            self.sizes.append(p.shape)
            offset += p.numel()
        self.allocate(dtype or params[0].dtype)

    def allocate(self, dtype: torch.dtype) -> None:
        """A new flat buffer of ``dtype`` for the bucket's parameters, and their views.

        A complex bucket is stored as its real view, as torch's ``initialize_buckets`` does
        (``bucket.gradients = at::view_as_real(gradients).reshape({-1})``): ``gradients``
        holds ``2 * numel`` elements of the real dtype, and each complex parameter's view
        is ``view_as_complex`` of its slice (``initialize_bucket_views``). The reduction,
        a comm hook's ``buffer()`` and the tensor a hook returns are all that real buffer.
        """
        self.is_complex = dtype.is_complex
        numel = sum(self.lengths)
        flat = torch.empty(numel, dtype=dtype, device=self.params[0].device)
        self.gradients = torch.view_as_real(flat).reshape(-1) if self.is_complex else flat
        self.views_in = bucket_views(self.gradients, self.params, self.offsets, self.is_complex)
        self.views_out = self.views_in

    def nbytes(self) -> int:
        return self.gradients.numel() * self.gradients.element_size()


def bucket_views(flat: torch.Tensor, params: Sequence[torch.Tensor],
                 offsets: Sequence[int], complex_bucket: bool = False) -> list[torch.Tensor]:
    """Views of ``flat`` shaped like ``params`` (torch's "gradient layout contract": a dense
    parameter's view has its strides, others a contiguous view). In a complex bucket
    ``flat`` is the real view and ``offsets`` count complex elements: see
    :func:`complex_bucket_view`."""
    views = []
    for p, off in zip(params, offsets, strict=True):
        if complex_bucket and p.is_complex():
            views.append(complex_bucket_view(flat, p, off))
        elif _non_overlapping_and_dense(p):
            views.append(flat.as_strided(p.shape, p.stride(), off))
        else:
            views.append(flat.narrow(0, off, p.numel()).view(p.shape))
    return views


def complex_bucket_view(flat: torch.Tensor, param: torch.Tensor, offset: int) -> torch.Tensor:
    """The complex view of ``param``'s gradient in the real buffer ``flat`` of a complex
    bucket, starting at complex element ``offset`` (torch's ``initialize_bucket_views`` and
    ``populate_bucket_views_out``): a dense parameter's real view has its strides doubled
    plus a last dimension of 2 (stride 1), others a contiguous ``(numel, 2)`` slice; both
    are then ``view_as_complex``. A ``flat`` that is not real (a hook returning a complex
    tensor) is refused by ``view_as_complex``, as in torch."""
    if _non_overlapping_and_dense(param):
        real = flat.as_strided((*param.shape, 2), (*(2 * s for s in param.stride()), 1),
                               2 * offset)
        return torch.view_as_complex(real)
    real = flat.narrow(0, 2 * offset, 2 * param.numel()).reshape(param.numel(), 2)
    return torch.view_as_complex(real).view(param.shape)


def _non_overlapping_and_dense(t: torch.Tensor) -> bool:
    if t.is_contiguous():
        return True
    pairs = sorted((s, d) for s, d in zip(t.stride(), t.shape, strict=True) if d != 1)
    expected = 1
    for stride, size in pairs:
        if stride != expected:
            return False
        expected *= size
    return True


def _clone_obeying_layout(src: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A new gradient for ``like`` holding ``src`` (dense parameters keep their strides)."""
    return torch.empty_like(like, memory_format=torch.preserve_format).copy_(src)


def _format_indices(indices: Sequence[int]) -> str:
    return " ".join(str(i) for i in indices)


class Reducer:
    """Reduces the gradients of ``params`` over ``process_group`` during backward."""

    def __init__(self, params: Sequence[torch.Tensor], bucket_indices: list[list[int]],
                 process_group: dist.ProcessGroup, expect_sparse_gradient: Sequence[bool],
                 capacity: BucketCapacity, find_unused_parameters: bool,
                 gradient_as_bucket_view: bool, param_names: Sequence[str],
                 skip_all_reduce_unused_params: bool = False,
                 batched_grad_copy: bool = False) -> None:
        if not params:
            raise RuntimeError("Expected at least one parameter.")
        self.params = list(params)
        self.param_names = list(param_names)
        self.process_group = process_group
        self.expect_sparse = list(expect_sparse_gradient)
        self.capacity = capacity
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = False
        self.skip_all_reduce_unused_params = skip_all_reduce_unused_params
        self.batched_grad_copy = batched_grad_copy
        self.mixed_precision_param_dtype: torch.dtype | None = None
        #: Optimizers run in backward (``_set_optimizer_in_backward``): the reduced bucket
        #: is not written back into ``.grad``.
        self.optim_in_backward = False
        self._installed_futures: list[torch.futures.Future] | None = None
        n = len(self.params)
        self._init_iteration_state(n)

        # Layout and its one-time rebuild.
        self.buckets: list[Bucket] = []
        self._locators: list[tuple[Bucket, int]] = []
        self.initial_bucket_indices = [list(b) for b in bucket_indices]
        self.has_rebuilt_bucket = False
        self.rebuilt_bucket_indices: list[list[int]] | None = None
        self.rebuilt_iteration: int | None = None
        self._rebuilt_param_indices: list[int] = []
        self.grad_ready_order: list[int] = []
        self.prev_grad_ready_order: list[int] = []
        self._initialize_buckets(bucket_indices)

        self._init_unused_accounting(n, find_unused_parameters)
        self._refresh_mode()
        self._accumulators = [grad_accumulator(p) for p in self.params]
        self._hook_handles = []
        ref = weakref.ref(self)
        for index, acc in enumerate(self._accumulators):
            self._hook_handles.append(acc.register_hook(_make_hook(ref, index)))

    def _init_iteration_state(self, n: int) -> None:
        """The per-iteration state of ``n`` parameters before the first backward (torch's
        ``Reducer`` constructor: counters, readiness, division factor, comm hook)."""
        self.num_iterations = 0
        #: Backward passes seen (torch's ``num_bwd_calls_``): counted at the first autograd
        #: hook of each backward, reset by ``finalize_backward``. The static graph's first
        #: iteration is the first *backward*, however many forwards preceded it.
        self.num_bwd_calls = 0
        self.first_autograd_hook_called = False
        self.expect_autograd_hooks = False
        self.require_finalize = False
        self.has_marked_unused = False
        self.unused_parameters: list[int] = []
        self._ready = bytearray(n)
        self.next_bucket = 0
        self.div_factor: float | None = None
        self.div_factor_last: float | None = None
        self._reciprocals: dict[torch.dtype, torch.Tensor] = {}
        self.comm_hook: Callable[[Any, GradBucket], torch.futures.Future] | None = None
        self.comm_hook_state: Any = None
        self._forward_work: dist.Work | None = None
        self._forward_work_static = True

    def _init_unused_accounting(self, n: int, find_unused_parameters: bool) -> None:
        """Unused-parameter accounting of ``n`` parameters (find_unused_parameters or
        static graph: torch's ``local_used_map_``), and the static graph's hook counts."""
        self.local_used: list[int] = [0] * n
        self._local_used_dev: torch.Tensor | None = None
        self._local_used_work: dist.Work | None = None
        self.local_used_reduced = False
        if find_unused_parameters:
            self._local_used_dev = torch.zeros(n, dtype=torch.int32, device=self.params[0].device)

        # Static graph: hook firings per parameter, counted in the first iteration.
        self._hook_counts = [0] * n
        self._hook_counts_left: list[int] = []

    # ----------------------------------------------------------------- configuration
    def set_static_graph(self) -> None:
        if self.num_iterations != 0:
            raise RuntimeError(
                "set_static_graph() should be called before training loop starts and after "
                "DistributedDataParallel is constructed."
            )
        self.static_graph = True
        if self._local_used_dev is None:
            self._local_used_dev = torch.zeros(len(self.params), dtype=torch.int32,
                                               device=self.params[0].device)
        self._refresh_mode()

    def register_comm_hook(self, state: Any, hook: Callable[[Any, GradBucket], Any],
                           builtin: bool = False) -> None:
        if self.comm_hook is not None:
            raise RuntimeError(
                "register_builtin_comm_hook or register_comm_hook can only be called once."
                if builtin else
                "register_comm_hook or register_builtin_comm_hook can only be called once."
            )
        self.comm_hook = hook
        self.comm_hook_state = state

    def set_mixed_precision_param_dtype(self, dtype: torch.dtype) -> None:
        """Buckets hold (and expect) gradients of ``dtype`` from now on (torch's
        ``set_mixed_precision_param_dtype``, called once at construction)."""
        self.mixed_precision_param_dtype = dtype
        for bucket in self.buckets:
            if not bucket.expect_sparse and bucket.views_in[0].dtype != dtype:
                old = bucket.gradients
                bucket.allocate(dtype)
                if bucket.gradients.numel() == old.numel():
                    bucket.gradients.copy_(old)

    def set_optimizer_in_backward(self) -> None:
        self.optim_in_backward = True

    def install_futures(self, futures: Sequence[torch.futures.Future]) -> None:
        """Futures to await at the end of this backward (appended, as torch's
        ``install_futures``: several calls in one iteration add up)."""
        if self._installed_futures is None:
            self._installed_futures = list(futures)
        else:
            self._installed_futures.extend(futures)

    def reset_state(self) -> None:
        """Forget the iteration in progress and force a new layout rebuild (torch's
        ``Reducer::reset_state``, used by ``_update_process_group``)."""
        self.has_rebuilt_bucket = False
        self._rebuilt_param_indices = []
        self.expect_autograd_hooks = False
        self.require_finalize = False
        self.first_autograd_hook_called = False
        self.div_factor = None
        self.local_used = [0] * len(self.params)
        self.local_used_reduced = False
        self._refresh_mode()

    def update_process_group(self, process_group: dist.ProcessGroup) -> None:
        self.process_group = process_group
        self.div_factor_last = None
        self._reciprocals = {}

    def check_finalized(self) -> None:
        """Raise torch's "Expected to have finished reduction ..." error if the last
        backward left a reduction unfinished (``Reducer::check_finalized``)."""
        self.ensure_prior_reduction_finished()

    def set_forward_pass_work_handle(self, work: dist.Work, use_static_world_size: bool) -> None:
        """Join: the forward's "not joined" allreduce, whose sum is the divisor when the
        divisor follows the number of active ranks."""
        self._forward_work = work
        self._forward_work_static = use_static_world_size

    def remove_hooks(self) -> None:
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # hooks may be gone at interpreter shutdown
            self.remove_hooks()

    def _refresh_mode(self) -> None:
        """Cache the per-iteration flags the hot path reads."""
        self.dynamic_find_unused = self.find_unused_parameters and not self.static_graph
        self.static_first_iteration = self.static_graph and self.num_bwd_calls == 1
        self.static_after_first_iteration = self.static_graph and self.num_bwd_calls > 1
        self._track_local_use = self.dynamic_find_unused or self.static_first_iteration
        self.should_rebuild = ((self.static_graph or not self.find_unused_parameters)
                               and not self.has_rebuilt_bucket)

    # ----------------------------------------------------------------- layout
    def bucket_indices(self) -> list[list[int]]:
        return [list(b.variable_indices) for b in self.buckets]

    def _initialize_buckets(self, bucket_indices: list[list[int]]) -> None:
        if self.expect_autograd_hooks:
            raise RuntimeError("`initialize_buckets` must NOT be called during autograd execution.")
        buckets: list[Bucket] = []
        locators: list[tuple[Bucket, int] | None] = [None] * len(self.params)
        for indices in bucket_indices:
            if not indices:
                raise RuntimeError("Empty bucket specified.")
            sparse = len(indices) == 1 and self.expect_sparse[indices[0]]
            if len(indices) > 1 and any(self.expect_sparse[i] for i in indices):
                raise RuntimeError("Buckets with more than one variable cannot include "
                                   "variables that expect a sparse gradient.")
            params = [self.params[i] for i in indices]
            if len({(p.dtype, p.device) for p in params}) != 1:
                raise RuntimeError("All parameters in a bucket must have the same dtype "
                                   "and be placed on the same device.")
            bucket = Bucket(list(indices), params, sparse, self.mixed_precision_param_dtype)
            for intra, index in enumerate(indices):
                locators[index] = (bucket, intra)
            buckets.append(bucket)
            if self.gradient_as_bucket_view and not sparse:
                # Gradients already there move into the new buffer and point at it.
                for p, view in zip(params, bucket.views_in, strict=True):
                    grad = p.grad
                    if grad is not None and grad.data_ptr() != view.data_ptr():
                        view.copy_(grad)
                        p.grad = view
        if any(loc is None for loc in locators):
            missing = [i for i, loc in enumerate(locators) if loc is None]
            raise RuntimeError(f"Parameters {missing} are in no bucket.")
        self.buckets = buckets
        self._locators = locators  # type: ignore[assignment]

    def rebuild_buckets(self) -> bool:
        """Called before each grad-enabled forward: raise if the previous reduction did not
        finish; the first time gradient-ready order is known, rebuild the layout from it
        and use rank 0's."""
        self.ensure_prior_reduction_finished()
        if not self.should_rebuild or not self._rebuilt_param_indices:
            return False
        order = self._rebuilt_param_indices
        if len(order) != len(self.params):
            raise RuntimeError(
                "rebuilt parameter indices size is not same as original model parameters "
                f"size. Original model param size is: {len(self.params)} versus rebuilt "
                f"params size of: {len(order)}"
            )
        layout = assign_buckets([self.params[i] for i in order], self.capacity.rebuild_limits(),
                                self.expect_sparse, tensor_indices=order)
        layout = self._sync_bucket_indices(layout)
        self.has_rebuilt_bucket = True
        self._rebuilt_param_indices = []
        self.rebuilt_bucket_indices = [list(b) for b in layout]
        self.rebuilt_iteration = self.num_iterations
        self._initialize_buckets(layout)
        self._refresh_mode()
        return True

    def _sync_bucket_indices(self, layout: list[list[int]]) -> list[list[int]]:
        """Rank 0's layout for everyone: broadcast (int32) the concatenated indices plus
        the bucket count, then the bucket sizes (torch's ``sync_bucket_indices``)."""
        device = self.params[0].device
        flat = [i for bucket in layout for i in bucket] + [len(layout)]
        indices = torch.tensor(flat, dtype=torch.int32, device=device)
        collectives.broadcast(self.process_group, indices, 0).wait()
        received = indices.tolist()
        num_buckets = received[-1]
        local_sizes = [len(b) for b in layout]
        sizes = torch.tensor([local_sizes[min(i, len(local_sizes) - 1)] for i in range(num_buckets)],
                             dtype=torch.int32, device=device)
        collectives.broadcast(self.process_group, sizes, 0).wait()
        result, pos = [], 0
        for size in sizes.tolist():
            result.append(received[pos:pos + size])
            pos += size
        return result

    def push_all_rebuilt_params(self) -> None:
        """Join: a joined rank that never ran a backward records the index order."""
        if self.should_rebuild and not self._rebuilt_param_indices:
            self._rebuilt_param_indices = list(range(len(self.params)))

    # ----------------------------------------------------------------- iteration
    def prepare_for_forward(self) -> None:
        self.num_iterations += 1
        self._refresh_mode()

    def prepare_for_backward(self, outputs: Sequence[torch.Tensor]) -> None:
        self.expect_autograd_hooks = True
        self.prev_grad_ready_order = self.grad_ready_order
        self.grad_ready_order = []
        self.next_bucket = 0
        for bucket in self.buckets:
            bucket.pending = len(bucket.params)
            bucket.deferred = []
        if self.static_graph:
            self._hook_counts_left = list(self._hook_counts)
        self.has_marked_unused = False
        self._ready = bytearray(len(self.params))
        if self.dynamic_find_unused:
            self.unused_parameters = unused_parameter_indices(outputs, self._accumulators)

    def autograd_hook(self, index: int) -> None:
        """Runs after parameter ``index``'s gradient accumulator."""
        if not self.first_autograd_hook_called:
            self.first_autograd_hook_called = True
            self.num_bwd_calls += 1
            self._refresh_mode()
        if self._track_local_use and self.params[index].grad is not None:
            self.local_used[index] = 1
        if self.static_first_iteration:
            self._hook_counts[index] += 1
            return
        if not self.expect_autograd_hooks:
            return
        self.grad_ready_order.append(index)
        if not self.has_marked_unused:
            self.has_marked_unused = True
            for unused in self.unused_parameters:
                self.mark_variable_ready(unused)
        if self.static_after_first_iteration:
            left = self._hook_counts_left[index]
            if left <= 0:
                raise RuntimeError(
                    "Your training graph has changed in this iteration, e.g., one parameter "
                    "is unused in first iteration, but then got used in the second iteration. "
                    "this is not compatible with static_graph set to True."
                )
            self._hook_counts_left[index] = left - 1
            if left > 1:
                return
        if self.should_rebuild:
            self._rebuilt_param_indices.append(index)
        self.mark_variable_ready(index)

    def mark_variable_ready(self, index: int) -> None:
        if self._ready[index]:
            self._raise_marked_twice(index)
        self._ready[index] = 1
        self.require_finalize = True
        if self.div_factor is None:
            self._set_divide_factor()
        bucket, intra = self._locators[index]
        if bucket.expect_sparse:
            self._copy_sparse_grad_in(bucket, index)
        else:
            self._copy_grad_in(bucket, intra)
        bucket.pending -= 1
        if bucket.pending == 0 and self.batched_grad_copy:
            self._flush_deferred_copies(bucket)
        if (bucket.pending == 0 and self._mark_bucket_ready(bucket)
                and self.next_bucket == len(self.buckets)):
            # Every bucket has started: reduce the used-parameter map, then finish at
            # the end of backward.
            if self.dynamic_find_unused:
                self._allreduce_local_used_map()
            _queue_callback(self._finalize_callback)

    def _copy_grad_in(self, bucket: Bucket, intra: int) -> None:
        param = bucket.params[intra]
        view = bucket.views_in[intra]
        grad = param.grad
        if grad is None:
            view.zero_()
        elif self.gradient_as_bucket_view and grad.data_ptr() == view.data_ptr():
            if self.comm_hook is None and not self.batched_grad_copy:
                view.div_(self.div_factor)  # type: ignore[arg-type]
        else:
            expected = self.mixed_precision_param_dtype or view.dtype
            if grad.dtype != expected or grad.shape != view.shape:
                raise RuntimeError(f"Expected {expected} of shape {tuple(view.shape)}, got "
                                   f"{grad.dtype} of shape {tuple(grad.shape)}")
            if self.batched_grad_copy and not grad.requires_grad:
                bucket.deferred.append(intra)
                return
            if self.comm_hook is None and not grad.requires_grad:
                torch.mul(grad, self._reciprocal(grad.dtype), out=view)
            elif self.comm_hook is None:
                # backward(create_graph=True): the gradient requires grad itself, so
                # torch divides out of place and copies (reducer.cpp; it warns that
                # higher-order gradients are not synchronised, pytorch/pytorch#63929).
                view.copy_(torch.mul(grad, self._reciprocal(grad.dtype)))
            else:
                view.copy_(grad)
            if self.gradient_as_bucket_view:
                param.grad = view

    def _flush_deferred_copies(self, bucket: Bucket) -> None:
        """``batched_grad_copy``: the deferred gradients into the bucket in one
        ``_foreach_copy_``, then one in-place division of the whole flat bucket (torch's
        ``flush_deferred_copies``; sparse buckets are left alone)."""
        if bucket.expect_sparse:
            return
        if bucket.deferred:
            grads = [bucket.params[i].grad for i in bucket.deferred]
            views = [bucket.views_in[i] for i in bucket.deferred]
            torch._foreach_copy_(views, grads)  # type: ignore[arg-type]
            if self.gradient_as_bucket_view:
                for i in bucket.deferred:
                    bucket.params[i].grad = bucket.views_in[i]
            bucket.deferred = []
        if self.comm_hook is None:
            bucket.gradients.div_(self.div_factor)  # type: ignore[arg-type]

    def _copy_sparse_grad_in(self, bucket: Bucket, index: int) -> None:
        grad = self.params[index].grad
        if grad is None:
            raise RuntimeError("Expected sparse gradient to be defined.")
        if not grad.is_sparse:
            raise RuntimeError("Expected variable to have sparse gradient.")
        if self.comm_hook is None:
            grad.div_(self.div_factor)  # type: ignore[arg-type]
        bucket.sparse_grad = grad

    def _reciprocal(self, dtype: torch.dtype) -> float | torch.Tensor:
        """``1/div_factor`` as torch's ``mul_out`` uses it: the double reciprocal rounded to
        the gradient's dtype. For float32/float64 a cached 0-dim tensor of that dtype gives
        the same product three times faster than a Python scalar; other dtypes compute in
        float, so they get the Python scalar."""
        inv = self._reciprocals.get(dtype)
        if inv is None:
            value = 1.0 / self.div_factor  # type: ignore[operator]
            if dtype not in (torch.float32, torch.float64):
                return value
            inv = torch.tensor(value, dtype=dtype, device=self.params[0].device)
            self._reciprocals[dtype] = inv
        return inv

    def _set_divide_factor(self) -> None:
        factor: float = self.process_group.size()
        work = self._forward_work
        if work is not None and not self._forward_work_static:
            work.wait()
            factor = int(work.get_future().value()[0].item())
        if factor != self.div_factor_last:
            self._reciprocals = {}
            self.div_factor_last = factor
        self.div_factor = factor

    def _mark_bucket_ready(self, bucket: Bucket) -> bool:
        """Start every ready bucket from ``next_bucket`` on; False if none started."""
        buckets = self.buckets
        if buckets[self.next_bucket] is not bucket:
            return False
        while self.next_bucket < len(buckets) and buckets[self.next_bucket].pending == 0:
            ready = buckets[self.next_bucket]
            if not self._should_skip_all_reduce(ready):
                self._all_reduce_bucket(ready)
            self.next_bucket += 1
        return True

    def _should_skip_all_reduce(self, bucket: Bucket) -> bool:
        """``skip_all_reduce_unused_params`` and every parameter of the bucket unused in
        this iteration (torch's ``should_skip_all_reduce_bucket``)."""
        if not self.skip_all_reduce_unused_params:
            return False
        unused = set(self.unused_parameters)
        return all(i in unused for i in bucket.variable_indices)

    def _all_reduce_bucket(self, bucket: Bucket) -> None:
        tensor = bucket.sparse_grad if bucket.expect_sparse else bucket.gradients
        assert tensor is not None
        if self.comm_hook is None:
            if bucket.expect_sparse:
                bucket.future = allreduce_sum_future(self.process_group, tensor)
                bucket.work = None
            else:
                bucket.work = collectives.allreduce(self.process_group, tensor)
                bucket.future = None
        else:
            bucket.work = None
            bucket.future = self.comm_hook(self.comm_hook_state, self._grad_bucket(bucket, tensor))

    def _grad_bucket(self, bucket: Bucket, tensor: torch.Tensor) -> GradBucket:
        return GradBucket(self.next_bucket, len(self.buckets), tensor, bucket.offsets,
                          bucket.lengths, bucket.sizes, bucket.params)

    def _allreduce_local_used_map(self) -> None:
        dev = self._local_used_dev
        assert dev is not None
        dev.copy_(torch.tensor(self.local_used, dtype=torch.int32))
        self._local_used_work = collectives.allreduce(self.process_group, dev)

    def _finalize_callback(self) -> None:
        if self.static_after_first_iteration and self.should_rebuild:
            self._rebuilt_param_indices.extend(self.unused_parameters)
        self.finalize_backward()

    def delay_all_reduce(self) -> None:
        """Static graph, first iteration, end of backward: every gradient at once."""
        self._allreduce_local_used_map()
        self.unused_parameters = [i for i, c in enumerate(self._hook_counts) if c == 0]
        self.require_finalize = True
        for index in range(len(self.params)):
            if self.div_factor is None:
                self._set_divide_factor()
            bucket, intra = self._locators[index]
            if bucket.expect_sparse:
                self._copy_sparse_grad_in(bucket, index)
            else:
                self._copy_grad_in(bucket, intra)
        for bucket in self.buckets:
            if self.batched_grad_copy:
                self._flush_deferred_copies(bucket)
            self._all_reduce_bucket(bucket)
        self.finalize_backward()

    def finalize_backward(self) -> None:
        if not self.expect_autograd_hooks:
            raise RuntimeError("finalize_backward called while no backward was expected")
        self.expect_autograd_hooks = False
        self.require_finalize = False
        self.first_autograd_hook_called = False
        check_unused = self.static_graph or self.find_unused_parameters
        for bucket in self.buckets:
            if bucket.future is None and bucket.work is None:
                # A bucket ``skip_all_reduce_unused_params`` did not reduce: untouched.
                if not self.skip_all_reduce_unused_params:
                    raise RuntimeError("currently only support to skip all reduce for unused "
                                       "params when skip_all_reduce_unused_params_ is true.")
                continue
            if bucket.future is not None:
                result = hook_result(bucket.future.wait())
            else:
                assert bucket.work is not None
                bucket.work.wait()
                result = bucket.gradients
            bucket.work = None
            bucket.future = None
            if bucket.expect_sparse:
                assert bucket.sparse_grad is not None
                if result is not bucket.sparse_grad:
                    bucket.sparse_grad.copy_(result)
                bucket.sparse_zeros = torch.zeros_like(bucket.sparse_grad)
                bucket.sparse_grad = None
            else:
                if result.data_ptr() == bucket.gradients.data_ptr():
                    bucket.views_out = bucket.views_in
                else:
                    bucket.views_out = bucket_views(result, bucket.params, bucket.offsets,
                                                    bucket.is_complex)
            self.div_factor = None
            if not bucket.expect_sparse:
                self._finalize_bucket_dense(bucket, check_unused)
        if self._installed_futures is not None:
            futures, self._installed_futures = self._installed_futures, None
            torch.futures.collect_all(futures).wait()
        if self._track_local_use and not self.local_used_reduced:
            assert self._local_used_work is not None
            self._local_used_work.wait()
        if self.dynamic_find_unused:
            self.local_used = [0] * len(self.params)
            self.local_used_reduced = False

    def _globally_unused(self, index: int) -> bool:
        if self.local_used[index] != 0:
            return False
        if not self.local_used_reduced:
            assert self._local_used_work is not None and self._local_used_dev is not None
            self._local_used_work.wait()
            self.local_used = self._local_used_dev.tolist()
            self.local_used_reduced = True
        return self.local_used[index] == 0

    def _finalize_bucket_dense(self, bucket: Bucket, check_unused: bool) -> None:
        views_out = bucket.views_out
        if self.gradient_as_bucket_view:
            for intra, param in enumerate(bucket.params):
                view_in = bucket.views_in[intra]
                if views_out is not bucket.views_in:
                    view_in.copy_(views_out[intra])
                if check_unused and self._globally_unused(bucket.variable_indices[intra]):
                    continue
                if self.optim_in_backward:
                    continue
                grad = param.grad
                if grad is None:
                    param.grad = view_in
                elif grad.data_ptr() != view_in.data_ptr():
                    raise RuntimeError(
                        "Detected at least one parameter gradient is not the expected DDP "
                        "bucket view with gradient_as_bucket_view=True. This may happen (for "
                        "example) if multiple allreduce hooks were registered onto the same "
                        "parameter."
                    )
            return
        if self.optim_in_backward:
            return  # the optimizer already ran on the reduced bucket
        if not check_unused:
            grads = [p.grad for p in bucket.params]
            if all(g is not None for g in grads):  # common case: one batched copy
                torch._foreach_copy_(grads, views_out)  # type: ignore[arg-type]
                return
        for intra, param in enumerate(bucket.params):
            if check_unused and self._globally_unused(bucket.variable_indices[intra]):
                continue
            grad = param.grad
            if grad is None:
                param.grad = _clone_obeying_layout(views_out[intra], param)
            else:
                grad.copy_(views_out[intra])

    # ----------------------------------------------------------------- errors
    def unmarked_param_indices(self) -> list[int]:
        return [i for i, ready in enumerate(self._ready) if not ready]

    def ensure_prior_reduction_finished(self) -> None:
        if not self.require_finalize:
            return
        unmarked = self.unmarked_param_indices()
        msg = ("Expected to have finished reduction in the prior iteration before starting a "
               "new one. This error indicates that your module has parameters that were not "
               "used in producing loss. ")
        outputs_hint = ("making sure all `forward` function outputs participate in calculating "
                        "loss. ")
        bug_hint = ("\nIf you already have done the above, then the distributed data parallel "
                    "module wasn't able to locate the output tensors in the return value of "
                    "your module's `forward` function. Please include the loss function and "
                    "the structure of the return value of `forward` of your module when "
                    "reporting this issue (e.g. list, dict, iterable).")
        if self.static_graph:
            msg = ("Expected to have finished reduction in the prior iteration before starting "
                   "a new one. This error indicates that your training graph has changed in "
                   "this iteration, e.g., one parameter is used in first iteration, but then "
                   "got unused in the second iteration. this is not compatible with "
                   "static_graph set to True.")
        elif not self.find_unused_parameters:
            msg += ("You can enable unused parameter detection by passing the keyword argument "
                    "`find_unused_parameters=True` to "
                    "`torch.nn.parallel.DistributedDataParallel`, and by \n")
            msg += outputs_hint + bug_hint
        else:
            msg += ("Since `find_unused_parameters=True` is enabled, this likely  means that not "
                    "all `forward` function outputs participate in computing loss. You can fix "
                    "this by ")
            msg += outputs_hint + bug_hint
        rank = self.process_group.rank()
        names = ", ".join(self.param_names[i] for i in unmarked)
        msg += f"\nParameters which did not receive grad for rank {rank}: {names}"
        msg += (f"\nParameter indices which did not receive grad for rank {rank}: "
                f"{_format_indices(unmarked)}")
        raise RuntimeError(msg)

    def _raise_marked_twice(self, index: int) -> None:
        raise RuntimeError(
            "Expected to mark a variable ready only once. This error is caused by one of the "
            "following reasons: 1) Use of a module parameter outside the `forward` function. "
            "Please make sure model parameters are not shared across multiple concurrent "
            "forward-backward passes. or try to use _set_static_graph() as a workaround if "
            "this module graph does not change during training loop.2) Reused parameters in "
            "multiple reentrant backward passes. For example, if you use multiple "
            "`checkpoint` functions to wrap the same part of your model, it would result in "
            "the same set of parameters been used by different reentrant backward passes "
            "multiple times, and hence marking a variable ready multiple times. DDP does not "
            "support such use cases in default. You can try to use _set_static_graph() as a "
            "workaround if your module graph does not change over iterations.\n"
            f"Parameter at index {index} with name {self.param_names[index]} has been marked "
            "as ready twice. This means that multiple autograd engine  hooks have fired for "
            "this particular parameter during this iteration."
        )

    # ----------------------------------------------------------------- join support
    def zeros_like_grad_buckets(self) -> list[GradBucket]:
        """Zero-filled buckets in the current layout (what a joined rank contributes).

        A sparse bucket contributes a sparse zero tensor shaped like its last gradient, so
        that the joined rank matches the active ranks' sparse allreduce: torch's reducer
        keeps a sparse bucket's last gradient as the bucket's ``gradients``
        (``mark_variable_ready_sparse``) and zeros it like any other bucket's
        (``get_grad_buckets(return_zero_tensors=true)``); before any gradient it has none,
        and the bucket is empty here too."""
        out = []
        for i, bucket in enumerate(self.buckets):
            zeros = bucket.sparse_zeros if bucket.expect_sparse and bucket.sparse_zeros is not None \
                else torch.zeros_like(bucket.gradients)
            out.append(GradBucket(i, len(self.buckets), zeros,
                                  bucket.offsets, bucket.lengths, bucket.sizes, bucket.params))
        return out

    def run_allreduce_hook(self, grad_bucket: GradBucket) -> torch.futures.Future:
        """The default SUM allreduce of a bucket as a future (``_run_allreduce_hook``)."""
        return allreduce_sum_future(self.process_group, grad_bucket.buffer())

    def run_comm_hook(self, grad_bucket: GradBucket) -> torch.futures.Future:
        if self.comm_hook is None:
            return allreduce_sum_future(self.process_group, grad_bucket.buffer())
        return self.comm_hook(self.comm_hook_state, grad_bucket)

    def allreduce_local_used_map_for_join(self) -> None:
        """Join: match the active ranks' used-map allreduce. As torch does, the joined rank
        sends its device-side map as it is (the last map it reduced, zeros if none: torch's
        is uninitialised memory then), not a fresh local map."""
        dev = self._local_used_dev
        assert dev is not None
        collectives.allreduce(self.process_group, dev).wait()


def _make_hook(ref: weakref.ReferenceType[Reducer], index: int) -> Callable[..., None]:
    def hook(grad_inputs: Any, grad_outputs: Any) -> None:
        reducer = ref()
        if reducer is not None:
            reducer.autograd_hook(index)
    return hook
