"""The buffers at forward (ranks/forward_buffers.py): one snapshot per forward, in order,
and a hook that dynamo compiles into the model without a new compilation per forward of a
step; tqdm's monitor thread, which every ``torch.compile`` starts, retires no rank
(ranks/hygiene.py)."""
from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import nn

from ddp_conformance.ranks.forward_buffers import BuffersAtForward
from ddp_conformance.ranks.hygiene import Fingerprint


class _Forwarding:
    """The one adapter method BuffersAtForward.forward calls."""

    def __init__(self, run: Any) -> None:
        self.forward = run


def _compiled_forwards(model: nn.Module, compiled: Any, n: int) -> BuffersAtForward:
    snapshots = BuffersAtForward()
    snapshots.watch(model)
    forward = snapshots.forward(_Forwarding(compiled))  # type: ignore[arg-type]
    for i in range(n):
        forward(torch.full((4, 3), float(i)))
    return snapshots


def test_one_snapshot_per_forward_in_order_and_one_compilation() -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    before = counters["stats"]["unique_graphs"]
    snapshots = _compiled_forwards(model, torch.compile(model, backend="eager"), 3)
    compiled = counters["stats"]["unique_graphs"] - before
    counts = [int(s["1.num_batches_tracked"]) for s in snapshots.taken]
    assert counts == [0, 1, 2], counts  # each as the forward began, in order
    # A hook appending to the step's growing list was guarded on its length: 3 graphs.
    assert compiled == 1, f"{compiled} graphs compiled for 3 forwards of one step"


def test_a_forward_that_raises_is_settled_too() -> None:
    def raising(*inputs: Any) -> Any:
        model(*inputs)
        raise RuntimeError("refused")

    model = nn.Linear(3, 3)
    model.register_buffer("seen", torch.zeros(1))
    snapshots = BuffersAtForward()
    snapshots.watch(model)
    with pytest.raises(RuntimeError):
        snapshots.forward(_Forwarding(raising))(torch.ones(2, 3))  # type: ignore[arg-type]
    assert len(snapshots.taken) == 1 and not snapshots._pending


def test_tqdm_monitor_retires_no_rank_a_foreign_thread_does() -> None:
    std = pytest.importorskip("tqdm.std")
    if std.tqdm.monitor is not None:  # started by an earlier test in this process
        std.tqdm.monitor.exit()
        std.tqdm.monitor = None
    fp = Fingerprint()
    bar = std.tqdm(total=1, disable=True)  # what torch.fx's Interpreter opens
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="foreign-thread", daemon=True)
    thread.start()
    try:
        assert any(isinstance(t, std.TMonitor) for t in threading.enumerate())
        found = fp.check()
    finally:
        bar.close()
        stop.set()
        thread.join()
    retired = "; ".join(found.retired)
    assert "foreign-thread" in retired and "tqdm" not in retired, retired
