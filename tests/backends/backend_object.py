"""A backend whose creator returns a c10d ``Backend`` object, not a ``ProcessGroup``, through
the extended creator API: how C++ extensions (UCC-style) register. Here the object is
torch's own ``ProcessGroupGloo``; c10d (and the harness's tracing group) must wrap it.
"""
from __future__ import annotations

from typing import Any

import torch.distributed as dist


def _create(opts: Any, backend_options: Any) -> Any:
    return dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)


if not hasattr(dist.Backend, "BACKEND_OBJECT"):
    dist.Backend.register_backend("backend_object", _create, extended_api=True, devices=["cpu"])
