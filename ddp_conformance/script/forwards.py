"""One microbatch's training forwards, as the harness's ranks and a reproducer's run them."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

from torch import Tensor


def training_loss(forwards: Iterable[int], batch: Callable[[int], tuple[tuple[Any, ...], Tensor]],
                  seed: Callable[[int], None], context: Callable[[], AbstractContextManager[Any]],
                  forward: Callable[..., Any], loss: Callable[[Any, Tensor], Tensor]) -> Any:
    """The loss one backward of a microbatch back-propagates: for each of its ``forwards``
    in order, the forward's ``batch``, torch's RNG ``seed``-ed for it (dropout's masks),
    ``forward`` under ``context`` (autocast), its ``loss``; the losses summed."""
    total: Any = 0
    for f in forwards:
        inputs, target = batch(f)
        seed(f)
        with context():
            out = forward(*inputs)
        total = total + loss(out, target)
    return total
