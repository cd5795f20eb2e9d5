"""Candidate specs of the mutants: ``--candidate benchmarks.mutation.live:<mutant id>``.

``benchmarks.mutation.live:distributed/AddNot/17`` is torch's DDP with that one mutation
(:mod:`benchmarks.mutation.install`); ``benchmarks.mutation.live:identity`` is torch's DDP
built the same way without one (the control: it passes what torch passes);
``<mutant id>@python-reducer`` is the mutant built in python-reducer mode, as the built-in
``torch-python-reducer`` candidate builds torch's DDP (the only way a mutant of the Python
reducer's lines runs). Resolving a spec
executes nothing of the mutant (the pool's zygote resolves every candidate): the mutated
module is built at the candidate's first ``wrap``, in a rank. Run from the repository root,
which the harness puts on the import path.
"""
from __future__ import annotations

import dataclasses
import sys
from contextlib import AbstractContextManager
from typing import Any

import torch

from benchmarks.mutation.population import IDENTITY, parse_id
from ddp_conformance.contract.adapter import Adapter
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.ddp_like import DDPLikeAdapter, ddp_like_candidate

#: The suffix of a mutant's spec in python-reducer mode.
PYTHON_REDUCER = "@python-reducer"


def candidate(spec: str) -> Candidate:
    """The candidate of ``spec`` (a mutant id, with :data:`PYTHON_REDUCER` or not)."""
    if spec.endswith(PYTHON_REDUCER):
        return python_reducer_candidate(spec.removesuffix(PYTHON_REDUCER))
    return cpp_reducer_candidate(spec)


def cpp_reducer_candidate(mutant_id: str) -> Candidate:
    """The candidate of ``mutant_id``: torch's DDP's capabilities and constructor (the
    mutated class has the same), a ``wrap`` that builds the mutant in the rank."""
    from torch.nn.parallel import DistributedDataParallel

    if mutant_id != IDENTITY:
        parse_id(mutant_id)
    name = f"mutant {mutant_id}"

    def wrap(module: torch.nn.Module, process_group: object, device: torch.device,
             **ddp_options: object) -> Adapter:
        from benchmarks.mutation.install import ddp_class

        adapter = ddp_like_candidate(name, ddp_class(mutant_id)).wrap(
            module, process_group, device, **ddp_options)
        adapter.__class__ = _MutantJoinAdapter
        return adapter

    base = ddp_like_candidate(name, DistributedDataParallel, torch.__version__,
                              f"torch's DDP with the mutation {mutant_id}")
    return dataclasses.replace(base, wrap=wrap)


def python_reducer_candidate(mutant_id: str) -> Candidate:
    """``mutant_id`` built in python-reducer mode: the capabilities, options and wrapping
    of the built-in ``torch-python-reducer`` candidate, with the mutant's DDP class."""
    from ddp_conformance.builtins import torch_python_reducer as pr
    from ddp_conformance.builtins._common import honoured

    if mutant_id != IDENTITY:
        parse_id(mutant_id)

    def wrap(module: torch.nn.Module, process_group: object, device: torch.device,
             **ddp_options: object) -> Adapter:
        from benchmarks.mutation.install import ddp_class

        kwargs: dict[str, Any] = dict(ddp_options, process_group=process_group)
        ddp = pr.python_reducer_ddp(module, ddp_class=ddp_class(mutant_id), **kwargs)
        adapter = DDPLikeAdapter(ddp, module, frozenset())
        adapter.capabilities = honoured(pr.POLICY, ddp_options, *pr.FEATURES)
        return adapter

    base = pr.candidate()
    return dataclasses.replace(
        base, name=f"mutant {mutant_id}{PYTHON_REDUCER}", wrap=wrap, expectations=None,
        description=f"torch's DDP with the mutation {mutant_id}, in python-reducer mode")


class _MutantJoinAdapter(DDPLikeAdapter):
    """The harness's adapter, except that Join over the DDP and a joinable optimizer
    (ZeroRedundancyOptimizer) is the mutant's ``Join`` (the class its ``join()`` uses), so
    that a mutant of ``join.py`` is reached there too."""

    def join(self, **join_kwargs: Any) -> AbstractContextManager[None]:
        from torch.distributed.algorithms.join import Joinable

        if not isinstance(self.optimizer, Joinable):
            return super().join(**join_kwargs)
        join = sys.modules[type(self.ddp).__module__].Join
        throw = join_kwargs.pop("throw_on_early_termination", False)
        return join([self.ddp, self.optimizer],  # type: ignore[no-any-return]
                    throw_on_early_termination=throw, **join_kwargs)


def __getattr__(name: str) -> Candidate:
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return candidate(name)
    except ValueError as exc:
        raise AttributeError(f"{name}: not a mutant id ({exc})") from None
