"""FSDP2 (``fully_shard``) on a Gloo group with CUDA tensors: ``DTensor.full_tensor()`` segfaults.

Standalone (torch only, no harness). Needs a CUDA GPU; one is enough::

    torchrun --nproc-per-node 2 tests/standalone/fsdp2_gloo_cuda.py            # all stages
    torchrun --nproc-per-node 2 tests/standalone/fsdp2_gloo_cuda.py --stage train
    torchrun --nproc-per-node 2 tests/standalone/fsdp2_gloo_cuda.py --stage raw
    python tests/standalone/fsdp2_gloo_cuda.py --cpu                             # control run

The configuration ``ddp-conformance run --device cuda --candidate fsdp2`` uses: two ranks
on ``cuda:0`` (``--device-per-rank`` puts rank r on ``cuda:r % GPUs`` instead), a Gloo
default group, ``fully_shard(mlp, mesh=DeviceMesh.from_group(group, "cuda"))`` over the
catalog's MLP (8-16-16-4, the same initial weights on both ranks), SGD, three steps.

Stages, in this order (``--stage``):

- ``train``: three steps of FSDP2's own collectives on Gloo with CUDA tensors (the forward
  all-gather, the backward reduce-scatter). After each backward the full gradients, and
  after each step the full parameters, are read *through the CPU* (local shard copied to
  the host, gathered as a DTensor on a CPU mesh over the same group: what the harness's
  adapter does on Gloo with CUDA) and compared with a single-process oracle on the
  concatenated batch. Expected to pass.
- ``full-tensor``: ``DTensor.full_tensor()`` on a CUDA parameter, as FSDP2 users and the
  harness's adapter did. Its functional all-gather is ``allgather_into_tensor_coalesced``,
  which ProcessGroupGloo implements for CPU tensors only (no CUDA work staging through
  pinned memory, no device check): the Gloo worker thread memcpys from the CUDA pointers
  and the process dies with SIGSEGV (pytorch/pytorch#152645, open; pytorch/pytorch#132471
  reaches it through ``fully_shard``; DeviceMesh's fix for that, a separate group when the
  default one is Gloo, pytorch/pytorch#132709, does not apply to ``DeviceMesh.from_group``).
- ``raw`` (only when asked for): the same crash without FSDP2, one functional all-gather
  of a CUDA tensor on the Gloo group.

``all`` (the default) runs ``train`` then ``full-tensor``. Prints a line before each stage
(flushed, so the last line says where a rank died). Exit status: 0 when every stage that
ran finished and matched; 1 when a comparison failed; a crashed stage ends the process by
its signal (torchrun reports ``Signal 11 (SIGSEGV)``). Without CUDA (and without
``--cpu``) it prints "needs CUDA" and exits 0. ``--cpu`` runs the same stages on CPU
tensors, where Gloo supports every collective involved: all pass.
"""
from __future__ import annotations

import argparse
import copy
import os
import socket
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn

WORLD = 2
STEPS = 3
BATCH = 4  # per rank
LR = 0.1


def build_mlp() -> nn.Module:
    """The harness's catalog MLP (``mlp``: width 16, depth 2)."""
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def batch(step: int, rank: int) -> tuple[Tensor, Tensor]:
    """Rank ``rank``'s batch at ``step`` (CPU; every rank can make every rank's)."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, 8, generator=gen), torch.randn(BATCH, 4, generator=gen)


def say(rank: int, text: str) -> None:
    print(f"[rank {rank}] {text}", flush=True)


def full_via_host(t: Any, host_mesh: Any) -> Tensor:
    """The whole of DTensor ``t``, gathered on the CPU over the same group."""
    from torch.distributed.tensor import DTensor

    local = t.to_local().detach().cpu()
    on_host = DTensor.from_local(local, host_mesh, t.placements, run_check=False,
                                 shape=t.shape, stride=t.stride())
    return on_host.full_tensor().detach().clone()


def max_error(got: dict[str, Tensor], want: dict[str, Tensor]) -> float:
    return max(float((got[n] - want[n]).abs().max()) for n in want)


def stage_train(rank: int, device: torch.device, model: nn.Module, oracle: nn.Module,
                host_mesh: Any) -> bool:
    say(rank, f"stage train: {STEPS} steps of fully_shard on Gloo with {device} tensors; "
              "full tensors read through the CPU")
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    oracle_optimizer = torch.optim.SGD(oracle.parameters(), lr=LR)
    ok = True
    for step in range(STEPS):
        x, y = batch(step, rank)
        nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
        grads = {n: full_via_host(p.grad, host_mesh) for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        params = {n: full_via_host(p, host_mesh) for n, p in model.named_parameters()}

        # The oracle: one process, the concatenated global batch, the mean loss (DDP's
        # and FSDP's gradient is the mean of the ranks' gradients).
        everyone = [batch(step, r) for r in range(WORLD)]
        xs, ys = torch.cat([x for x, _ in everyone]), torch.cat([y for _, y in everyone])
        nn.functional.mse_loss(oracle(xs), ys).backward()
        want_grads = {n: p.grad.detach().clone() for n, p in oracle.named_parameters()
                      if p.grad is not None}
        oracle_optimizer.step()
        oracle_optimizer.zero_grad()
        want_params = {n: p.detach().clone() for n, p in oracle.named_parameters()}

        grad_err, param_err = max_error(grads, want_grads), max_error(params, want_params)
        good = grad_err <= 1e-5 and param_err <= 1e-5
        ok &= good
        say(rank, f"  step {step}: gradients max abs error {grad_err:.2e}, parameters "
                  f"{param_err:.2e} against the oracle: {'ok' if good else 'MISMATCH'}")
    return ok


def stage_full_tensor(rank: int, device: torch.device, model: nn.Module, host_mesh: Any) -> bool:
    name, param = next(iter(model.named_parameters()))
    dtensor: Any = param  # a DTensor since fully_shard
    say(rank, f"stage full-tensor: DTensor.full_tensor() of {name!r} on {device} over Gloo "
              "(on CUDA: expect SIGSEGV here, pytorch/pytorch#152645)")
    full = dtensor.full_tensor().detach().cpu()
    want = full_via_host(dtensor, host_mesh)
    good = torch.equal(full, want)
    say(rank, f"  full_tensor() returned, {'equal to' if good else 'DIFFERENT from'} the "
              "CPU-gathered tensor" + (": no crash on CUDA, this torch has a fix" if device.type == "cuda"
                                       else ""))
    return good


def stage_raw(rank: int, device: torch.device) -> bool:
    import torch.distributed._functional_collectives as funcol

    say(rank, f"stage raw: one functional all-gather of a {device} tensor on the Gloo group "
              "(what DTensor.full_tensor() issues; on CUDA: expect SIGSEGV here)")
    group = dist.distributed_c10d._get_default_group()
    out = funcol.all_gather_tensor(torch.full((4,), float(rank), device=device), 0, group)
    got = out.cpu()
    want = torch.cat([torch.full((4,), float(r)) for r in range(WORLD)])
    good = torch.equal(got, want)
    say(rank, f"  returned {got.tolist()}: {'ok' if good else 'WRONG'}")
    return good


def run(rank: int, args: argparse.Namespace) -> bool:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    if args.cpu:
        device = torch.device("cpu")
    else:
        local = int(os.environ.get("LOCAL_RANK", rank))
        index = local % torch.cuda.device_count() if args.device_per_rank else 0
        torch.cuda.set_device(index)  # before anything touches CUDA, as the harness does
        device = torch.device("cuda", index)
    dist.init_process_group("gloo")
    try:
        if rank == 0:
            say(rank, f"torch {torch.__version__} (CUDA {torch.version.cuda}), "
                      f"{dist.get_world_size()} ranks, Gloo, {device}")
        if args.stage == "raw":
            return stage_raw(rank, device)
        torch.manual_seed(0)  # the same initial weights on every rank (fully_shard has no init sync)
        oracle = build_mlp()
        model = copy.deepcopy(oracle).to(device)
        group = dist.distributed_c10d._get_default_group()
        mesh = DeviceMesh.from_group(group, device.type)
        host_mesh = DeviceMesh.from_group(group, "cpu")
        fully_shard(model, mesh=mesh)
        ok = True
        if args.stage in ("train", "all"):
            ok &= stage_train(rank, device, model, oracle, host_mesh)
        if args.stage in ("full-tensor", "all"):
            ok &= stage_full_tensor(rank, device, model, host_mesh)
        return ok
    finally:
        dist.destroy_process_group()


def spawned(rank: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
    if not run(rank, args):
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--stage", choices=("all", "train", "full-tensor", "raw"), default="all")
    parser.add_argument("--cpu", action="store_true",
                        help="control run: the same stages on CPU tensors (all pass)")
    parser.add_argument("--device-per-rank", action="store_true",
                        help="rank r on cuda:(LOCAL_RANK %% GPUs) instead of every rank on cuda:0")
    args = parser.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        if int(os.environ.get("RANK", "0")) == 0:
            print("needs CUDA: no CUDA device here; nothing to reproduce (--cpu runs the "
                  "control on CPU tensors)", flush=True)
        sys.exit(0)
    if "RANK" in os.environ:  # under torchrun
        sys.exit(0 if run(int(os.environ["RANK"]), args) else 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(spawned, args=(args, port), nprocs=WORLD)
    except mp.ProcessExitedException as exc:
        print(exc, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
