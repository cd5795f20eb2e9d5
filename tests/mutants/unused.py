"""Mutants of which parameters are reduced, and of unused-parameter handling."""
from __future__ import annotations

from typing import Any

import torch
from ddp_reference import collectives
from ddp_reference.ddp import _produces_sparse_gradient
from ddp_reference.reducer import Bucket, Reducer
from torch import nn

from ._base import DoneWork, MutantDDP

# --- which parameters -----------------------------------------------------------------------


class TiedWeightsReducedTwice(MutantDDP):
    """Collects parameters per module without de-duplication: a weight shared by two modules is reduced twice
    (values right, traffic doubled)."""

    def _build_params_for_reducer(self) -> tuple[list[nn.Parameter], list[bool], list[str]]:
        params: list[nn.Parameter] = []
        sparse: list[bool] = []
        names: list[str] = []
        for module_name, submodule in self.module.named_modules():
            for param_name, param in submodule.named_parameters(recurse=False):
                if param.requires_grad:  # no `seen` set
                    params.append(param)
                    sparse.append(_produces_sparse_gradient(submodule))
                    names.append(f"{module_name}.{param_name}" if module_name else param_name)
        self._assign_modules_buffers()
        return params, sparse, names


class _FrozenReducedReducer(Reducer):
    frozen: list[nn.Parameter]

    def finalize_backward(self) -> None:
        super().finalize_backward()
        for p in self.frozen:  # flattened with the rest: a zero gradient, reduced
            grad = torch.zeros_like(p)
            collectives.allreduce(self.process_group, grad).wait()
            p.grad = grad


class FrozenParametersReduced(MutantDDP):
    """Reduces every parameter, also those with requires_grad=False (parameters flattened without the
    requires_grad filter): frozen weights get a zero .grad instead of None, and extra bytes on the wire."""

    reducer_class = _FrozenReducedReducer

    def mutate(self) -> None:
        self.reducer.frozen = [p for p in self.module.parameters()  # type: ignore[attr-defined]
                               if not p.requires_grad]


class _SparseSummedReducer(Reducer):
    def _copy_sparse_grad_in(self, bucket: Bucket, index: int) -> None:
        grad = self.params[index].grad
        if grad is None or not grad.is_sparse:
            super()._copy_sparse_grad_in(bucket, index)
            return
        bucket.sparse_grad = grad  # the division only exists on the dense path


class SparseGradientsSummed(MutantDDP):
    """Divides dense buckets by the world size but not sparse gradients (a second code path for sparse
    tensors that forgot the mean)."""

    reducer_class = _SparseSummedReducer


# --- unused parameters ----------------------------------------------------------------------


class _ZeroUnusedReducer(Reducer):
    def _finalize_bucket_dense(self, bucket: Bucket, check_unused: bool) -> None:
        super()._finalize_bucket_dense(bucket, False)  # write zeros for unused ones too


class ZeroGradForUnused(MutantDDP):
    """Writes a zero gradient into globally unused parameters instead of leaving .grad None (optimizers with
    momentum or weight decay then move them)."""

    reducer_class = _ZeroUnusedReducer


class _LocalDecisionReducer(Reducer):
    _local_snapshot: list[int]

    def finalize_backward(self) -> None:
        self._local_snapshot = list(self.local_used)
        super().finalize_backward()

    def _globally_unused(self, index: int) -> bool:
        unused = super()._globally_unused(index)
        return unused or self._local_snapshot[index] == 0


class LocallyUnusedNotWrittenBack(MutantDDP):
    """Does not write the reduced gradient into parameters unused on this rank but used on another (their
    .grad stays None here, so replicas diverge)."""

    reducer_class = _LocalDecisionReducer


class _UnreducedMapReducer(Reducer):
    def _allreduce_local_used_map(self) -> None:
        dev = self._local_used_dev
        assert dev is not None
        dev.copy_(dev.new_tensor(self.local_used))
        self._local_used_work = DoneWork()  # type: ignore[assignment]  # never allreduced


class UsedMapNotAllreduced(MutantDDP):
    """Decides 'globally unused' from the local used-parameter map, never allreduced (the collective dropped
    as an optimisation)."""

    reducer_class = _UnreducedMapReducer


class _StaleMapReducer(Reducer):
    def finalize_backward(self) -> None:
        super().finalize_backward()
        dev = self._local_used_dev
        if self.dynamic_find_unused and dev is not None:
            self.local_used = [int(v != 0) for v in dev.tolist()]  # last iteration's map kept


class UsedMapNotReset(MutantDDP):
    """Does not reset the used-parameter map between iterations: a parameter used once counts as used forever
    (a zero gradient instead of None)."""

    reducer_class = _StaleMapReducer


class NestedOutputsNotSearched(MutantDDP):
    """find_unused_parameters only looks at top-level tensor outputs, not inside dicts or dataclasses (older
    DDP versions): used parameters are taken for unused."""

    def _post_forward(self, output: Any) -> Any:
        import ddp_reference.ddp as ref_ddp

        original = ref_ddp.find_tensors

        def shallow(obj: Any) -> Any:
            items = obj if isinstance(obj, (list, tuple)) else [obj]
            return iter([t for t in items if hasattr(t, "grad_fn")])

        ref_ddp.find_tensors = shallow  # type: ignore[assignment]
        try:
            return super()._post_forward(output)
        finally:
            ref_ddp.find_tensors = original
