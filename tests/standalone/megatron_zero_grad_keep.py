"""megatron-core 0.16.1: ``zero_grad(set_to_none=False)`` doubles every later gradient of
Megatron's local DDP.

Standalone (torch and megatron-core only, no harness; one process, Gloo)::

    python tests/standalone/megatron_zero_grad_keep.py

``megatron.core.distributed.DistributedDataParallel`` keeps each gradient in a contiguous
buffer (``param.main_grad``): a hook on the gradient accumulator adds ``param.grad`` into
``main_grad`` and sets ``param.grad = None``. Megatron's ``FP32Optimizer`` points
``param.grad`` at ``main_grad`` before stepping (``prepare_grads``) and zeroes with
``_zero_grad_group_helper(params, set_to_none)``; the loop is
``model.zero_grad_buffer(); optimizer.zero_grad(set_to_none)``, forward, backward,
``model.finish_grad_sync()``, step. With ``set_to_none=False`` the zeroed ``param.grad`` is
still a view of ``main_grad``: the next backward's ``AccumulateGrad`` adds the new gradient
into it in place (into ``main_grad``), then the hook adds ``param.grad`` (that same
``main_grad``) into ``main_grad`` again: ``2 g``. ``set_to_none=True`` gives ``g``. The
optimizer itself is built as ``FP32Optimizer`` does it, but not instantiated (its
constructor allocates a CUDA tensor); the gradient buffer's allocation asks
``torch.cuda.current_device()``, answered here with the CPU, the one line megatron-core
needs bypassed on a machine without CUDA. Prints the step-1 gradient against plain
autograd's for both settings; exits 1 when ``set_to_none=False`` gives twice the gradient
and ``set_to_none=True`` does not.
"""
from __future__ import annotations

import socket
import sys
import warnings
from unittest import mock

import torch
import torch.distributed as dist
from torch import nn


def gradient_at_step_1(set_to_none: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(Megatron DDP's step-1 gradient of the weight, plain autograd's)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer.optimizer import _zero_grad_group_helper
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(0)
    module = nn.Linear(4, 1)
    plain = nn.Linear(4, 1)
    plain.load_state_dict(module.state_dict())
    pgs = ProcessGroupCollection()
    pgs.dp = dist.group.WORLD
    pgs.tp = pgs.pp = pgs.ep = pgs.expt_dp = dist.new_group([0])
    with mock.patch.object(torch.cuda, "current_device", lambda: torch.device("cpu")):
        ddp = DistributedDataParallel(TransformerConfig(num_layers=1, hidden_size=1, num_attention_heads=1),
                                      DistributedDataParallelConfig(), module, pg_collection=pgs)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    plain_optimizer = torch.optim.SGD(plain.parameters(), lr=0.1)
    for step in range(2):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
        ddp.zero_grad_buffer()
        _zero_grad_group_helper(optimizer.param_groups[0]["params"], set_to_none)
        ddp(x).sum().backward()
        ddp.finish_grad_sync()
        for param in module.parameters():  # FP32Optimizer.prepare_grads
            param.grad = param.main_grad
        got = module.weight.grad.clone()
        optimizer.step()
        plain_optimizer.zero_grad(set_to_none)
        plain(x).sum().backward()
        expected = plain.weight.grad.clone()
        plain_optimizer.step()
    return got, expected


def main() -> int:
    warnings.simplefilter("ignore")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        doubled = {}
        for set_to_none in (True, False):
            got, expected = gradient_at_step_1(set_to_none)
            ratio = (got / expected).mean().item()
            doubled[set_to_none] = torch.allclose(got, 2 * expected)
            print(f"set_to_none={set_to_none}: step-1 gradient / autograd's = {ratio:.4f}")
    finally:
        dist.destroy_process_group()
    return 1 if doubled[False] and not doubled[True] else 0


if __name__ == "__main__":
    sys.exit(main())
