"""A candidate that branches on the backend's name, as pytorch-ignite's ``auto_model`` does.

``idist.auto_model`` wraps the model in torch's DDP only when ``idist.backend()`` (that is,
``dist.get_backend()``) is a backend it knows, and otherwise returns the model as it is.
Through a tracing group that answered ``traced_gloo``, it did not wrap at all: 69 FAIL
traced, 101 PASS with ``--no-trace`` (issue 27). With the trace invisible, its verdicts
are the same traced and untraced (``tests/test_invisible_trace.py``)::

    --candidate tests.ignite_like:auto_ddp
"""
from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

#: The backends ignite's ``auto_model`` wraps on (its ``idist`` native backends).
KNOWN = ("nccl", "gloo", "mpi")


def auto_ddp(module: nn.Module, process_group: Any = None, **ddp_options: Any) -> nn.Module:
    """torch's DDP on a backend whose name is known, else the module itself."""
    if dist.get_backend(process_group) in KNOWN:
        return DistributedDataParallel(module, process_group=process_group, **ddp_options)
    return module
