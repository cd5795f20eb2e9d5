"""A rank's record crosses to the parent packed: every tensor comes back equal, with its
dtype, shape, strides and layout; None, sparse and non-tensor fields pass through."""
from __future__ import annotations

import pickle

import torch

from ddp_conformance.ranks.records import RankRecord, StepRecord
from ddp_conformance.ranks.tracing import Collective


def _tensors() -> dict[str, torch.Tensor | None]:
    return {
        "plain": torch.randn(3, 4),
        "channels_last": torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),
        "transposed": torch.randn(4, 6).t(),
        "strided": torch.randn(8)[::2],  # not dense: sent as a contiguous copy
        "half": torch.randn(5).half(),
        "bfloat16": torch.randn(5).bfloat16(),
        "double": torch.randn(2, 2).double(),
        "int": torch.tensor(7),
        "empty": torch.empty(0, 3),
        "sparse": torch.randn(3, 3).to_sparse(),
        "none": None,
    }


def test_a_record_round_trips_through_pickle() -> None:
    grads = _tensors()
    trace = [Collective(0, 0, "backward", "allreduce", "float32", 12, 2)]
    record = RankRecord(1, initial_params={"w": torch.randn(3)}, trace=trace, raised="",
                        steps=[StepRecord(grads, {"w": torch.randn(3)}, {},
                                          [{"b": torch.zeros(2)}])])
    back = pickle.loads(pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))
    assert back.rank == 1 and back.trace == trace and len(back.steps) == 1
    got = back.steps[0].grads
    assert got.keys() == grads.keys() and got["none"] is None
    for name, want in grads.items():
        if want is None:
            continue
        have = got[name]
        assert have is not None and have.dtype == want.dtype and have.shape == want.shape, name
        if want.is_sparse:
            assert have.is_sparse and torch.equal(have.to_dense(), want.to_dense())
            continue
        assert torch.equal(have, want), name
        if name != "strided":
            assert have.stride() == want.stride(), name
    assert got["channels_last"].is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(back.steps[0].buffers_at_forward[0]["b"], torch.zeros(2))
    assert torch.equal(back.initial_params["w"], record.initial_params["w"])


def test_packing_sends_one_flat_tensor_per_dtype() -> None:
    many = {f"layer{i}.weight": torch.randn(3, 3) for i in range(200)}
    record = RankRecord(0, initial_params=many)
    assert len(pickle.dumps(record)) < len(pickle.dumps(dict(many))) / 2
