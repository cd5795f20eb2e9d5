"""What a backend cannot do makes a scenario N/A for every candidate, derived from the
scenario's model (no GPU needed: the decision is taken before any rank runs)."""
from __future__ import annotations

import torch
from torch import nn

from ddp_conformance.catalog.backend_needs import BackendFeature, backend_lacks, backend_needs, model_needs
from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.catalog.procedure import build_module
from ddp_conformance.contract.backend import resolve_backend
from ddp_conformance.judge.verdict import Verdict
from ddp_conformance.runner import Runner

CATALOG = {s.id: s for s in load_catalog()}
SPARSE = CATALOG["models/sparse-embedding"]


def test_a_sparse_embedding_needs_sparse_allreduce() -> None:
    assert model_needs(nn.Embedding(4, 2, sparse=True)) == {BackendFeature.SPARSE_ALLREDUCE}
    assert model_needs(nn.Sequential(nn.Linear(2, 2), nn.EmbeddingBag(4, 2, sparse=True))) \
        == {BackendFeature.SPARSE_ALLREDUCE}
    assert model_needs(nn.Embedding(4, 2)) == frozenset()


def test_needs_are_derived_from_every_catalog_model() -> None:
    """The scenarios flagged are exactly those whose built module has a sparse embedding."""
    for s in CATALOG.values():
        built = build_module(s, 0, torch.device("cpu"))
        sparse = any(getattr(m, "sparse", False) for m in built.modules()
                     if isinstance(m, (nn.Embedding, nn.EmbeddingBag)))
        assert (BackendFeature.SPARSE_ALLREDUCE in backend_needs(s)) == sparse, s.id
    assert any(BackendFeature.SPARSE_ALLREDUCE in backend_needs(s) for s in CATALOG.values())


def test_nccl_lacks_sparse_allreduce_and_gloo_does_not() -> None:
    reason = backend_lacks(SPARSE, "nccl", "cuda")
    assert reason == ("backend nccl lacks sparse allreduce (NCCL does not support all_reduce "
                      "with sparse tensors)")
    assert backend_lacks(SPARSE, "gloo", "cpu") == ""
    assert backend_lacks(CATALOG["gradients/mlp-adam"], "nccl", "cuda") == ""


def test_deriving_needs_leaves_the_random_stream_alone() -> None:
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    backend_needs(CATALOG["gradients/mlp-sgd"])
    assert torch.equal(torch.rand(3), expected)


def test_the_runner_reports_it_as_na_for_every_candidate(runner: Runner) -> None:
    """The runner's own path, as it would run on NCCL: the case is N/A before any job."""
    config, device, backend = runner.config, runner.device_kind, runner.backend
    runner.config = type(config)(**{**config.__dict__, "backend": "nccl"})
    runner.device_kind, runner.backend = "cuda", resolve_backend("nccl")
    try:
        for spec in ("torch", "tests.limited:torch_ddp_factory"):
            result = runner.run_case(SPARSE, spec)
            assert result.verdict is Verdict.NA, (spec, result.reason)
            assert "NCCL does not support all_reduce with sparse tensors" in result.reason
    finally:
        runner.config, runner.device_kind, runner.backend = config, device, backend
