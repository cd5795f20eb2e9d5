"""``ddp-conformance repro``: a standalone script that reproduces a case, for a bug report.

The script needs torch and the candidate's package, nothing of the harness. It runs under
``torchrun --nproc-per-node N`` (Gloo on the CPU), rebuilds the scenario's model and data
(the model's code is copied from :mod:`ddp_conformance.catalog.models`: only the
definitions it needs, found by following the names its registration uses; the seeds are
the harness's, written out as tables), trains it with the candidate, and checks what the
harness's oracle, replica and buffer checks check, in one process per rank:

- each synced step's gradients against the single-process result: the same model, from
  rank 0's initial weights (what DDP's init sync gives), run on every rank's batch, the
  local gradients averaged over the ranks and summed over the microbatches; norm-wise
  within the harness's tolerance for the dtype (``judge/tolerance.py``: ``max|g - e| <=
  rtol * scale``, scale the largest magnitude the reduction adds), bitwise for an exact
  scenario;
- the parameters after each step against the single-process optimizer's, and bitwise
  equal on every rank;
- with ``broadcast_buffers`` on, the buffers at the start of each forward where DDP
  broadcasts them equal to rank 0's;
- no reducing collective in a backward inside ``no_sync`` (the candidate gets a process
  group that forwards to the world group and counts them).

The first violation raises ``AssertionError`` with one evidence line ("rank 1, step 2,
'fc.weight': gradient: max abs error 0.0315 vs the single-process result (tolerance
1.1e-06)"). ``--ddp torch`` swaps the candidate for torch's DDP: the same script then
passes, which shows the defect is the candidate's.

Scenarios whose procedure the script does not write (Join, sync strategies, process
subgroups, ZeRO, PowerSGD, an expected error) are refused with a usage error.
"""
from __future__ import annotations

import ast
import inspect
import os
import textwrap

from ddp_conformance.catalog import models as models_module
from ddp_conformance.catalog.procedure import buffers_broadcast, synced
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.errors import UsageError
from ddp_conformance.judge.tolerance import RTOL

#: Comm hooks the script registers, as torch names them (``allreduce_to_new_tensor`` is
#: written out in the script).
HOOKS = {"allreduce": "default_hooks.allreduce_hook",
         "fp16_compress": "default_hooks.fp16_compress_hook",
         "allreduce_to_new_tensor": "allreduce_to_new_tensor"}


def unsupported(scenario: Scenario) -> str:
    """Why the script cannot reproduce ``scenario`` ('' if it can)."""
    reasons = [what for what, present in (
        ("Join", scenario.join is not None),
        ("a sync strategy", scenario.sync_strategy is not None),
        ("process subgroups", scenario.groups is not None),
        ("ZeroRedundancyOptimizer", scenario.optimizer.value == "zero_sgd"),
        ("an expected error", scenario.expect_error is not None),
        ("PowerSGD", scenario.comm_hook is not None and scenario.comm_hook.value == "powersgd"),
        ("a comm hook registered twice", scenario.comm_hook_registrations > 1),
    ) if present]
    return ", ".join(reasons)


def model_source(model: str) -> str:
    """The definitions of ``catalog/models.py`` that model ``model`` needs, in file order,
    and ``SPEC``, its registration's ``ModelSpec``."""
    tree = ast.parse(inspect.getsource(models_module))
    defined: dict[str, ast.stmt] = {}
    registration: ast.Call | None = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    defined[target.id] = node
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                getattr(node.value.func, "id", "") == "register":
            spec = node.value.args[0]
            if isinstance(spec, ast.Call) and spec.args and \
                    isinstance(spec.args[0], ast.Constant) and spec.args[0].value == model:
                registration = spec
    if registration is None:
        raise UsageError(f"repro: model {model!r} is not registered in catalog/models.py")
    needed: set[str] = set()
    pending: list[ast.AST] = [registration]
    while pending:
        current = pending.pop()
        for name in {n.id for n in ast.walk(current) if isinstance(n, ast.Name)}:
            if name in defined and name not in needed and name not in ("MODELS",):
                needed.add(name)
                pending.append(defined[name])
    order = [n for n in tree.body if any(defined.get(name) is n for name in needed)]
    parts = [ast.unparse(n) for n in order]
    parts.append(f"SPEC = {ast.unparse(registration)}")
    return "\n\n\n".join(parts)


def write_script(scenario: Scenario, candidate: str, world_size: int) -> str:
    """The reproducer's source for ``scenario`` with ``candidate`` (``module:attr``, a
    DDP-like callable) at ``world_size`` ranks."""
    why = unsupported(scenario)
    if why:
        raise UsageError(f"repro: {scenario.id} uses {why}, which the standalone script does "
                         "not write yet")
    if ":" not in candidate:
        if candidate != "torch":
            raise UsageError(f"repro: the candidate must be module:attr (a DDP-like callable) "
                             f"or torch, got {candidate!r}")
        module_name, attr = "torch.nn.parallel", "DistributedDataParallel"
    else:
        module_name, attr = candidate.split(":", 1)
    steps, mbs = scenario.steps, scenario.microbatches
    table = {
        "INIT_SEEDS": {r: scenario.init_seed(r) for r in range(world_size)},
        "DATA_SEEDS": {(r, s, m): scenario.data_seed(r, s, m) for r in range(world_size)
                       for s in range(steps) for m in range(mbs)},
        "SYNCED": [synced(scenario, m) for m in range(mbs)],
        "BUFFERS_BROADCAST": {(s, m): buffers_broadcast(scenario, s, m)
                              for s in range(steps) for m in range(mbs)},
    }
    rtol = {str(k).removeprefix("torch."): v for k, v in RTOL.items()}
    settings = dict(
        WORLD_SIZE=world_size, STEPS=steps, MICROBATCHES=mbs, BATCH_SIZE=scenario.batch_size,
        OPTIMIZER=scenario.optimizer.value, LR=scenario.lr,
        SET_TO_NONE=scenario.zero_grad_set_to_none, DDP_OPTIONS=dict(scenario.ddp_options),
        COMM_HOOK=HOOKS.get(scenario.comm_hook.value) if scenario.comm_hook else None,
        EXACT=scenario.exact, RTOL_OVERRIDE=scenario.rtol, RTOL=rtol,
        MODEL_RANK_AWARE=models_module.get_model(scenario.model).rank_aware,
        MODEL_KWARGS=dict(scenario.model_kwargs))
    constants = "\n".join(f"{k} = {v!r}" for k, v in {**settings, **table}.items())
    header = _HEADER.format(id=scenario.id, candidate=candidate, ws=world_size,
                            name=f"repro_{scenario.id.replace('/', '_').replace('-', '_')}.py")
    hook_line = COMM_HOOK_IMPORT if scenario.comm_hook else ""
    return "\n".join([header, _IMPORTS + hook_line, "", "# --- the scenario " + "-" * 66,
                      f"CANDIDATE = {(module_name, attr)!r}  # module, attribute", constants, "",
                      "# --- the model, from ddp_conformance/catalog/models.py " + "-" * 27,
                      model_source(scenario.model), "", _BODY])


def write_file(script: str, scenario: Scenario, directory: str) -> str:
    """Write ``script`` under ``directory``; return its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"repro_{scenario.id.replace('/', '_').replace('-', '_')}.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(script)
    return path


_HEADER = '''"""Standalone reproducer of ddp-conformance case {id}[{candidate}] at {ws} ranks.

Needs torch and the candidate's package only. From the directory the candidate imports from:

    torchrun --standalone --nproc-per-node {ws} {name}              # the candidate: fails with the evidence
    torchrun --standalone --nproc-per-node {ws} {name} --ddp torch  # torch's DDP: passes

Written by `ddp-conformance repro`; what it checks is said in ddp_conformance/repro.py.
"""'''

_IMPORTS = '''from __future__ import annotations

import copy
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

Batch = tuple[tuple[Any, ...], Tensor]
'''

COMM_HOOK_IMPORT = '''from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


def allreduce_to_new_tensor(group, bucket):  # a hook whose result is a new tensor
    averaged = bucket.buffer() / dist.get_world_size(group)
    work = dist.all_reduce(averaged, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
'''

_BODY = textwrap.dedent('''
    # --- the procedure and the checks ---------------------------------------------------


    def build(rank):
        torch.manual_seed(INIT_SEEDS[rank])
        kwargs = dict(MODEL_KWARGS, rank=rank) if MODEL_RANK_AWARE else MODEL_KWARGS
        return SPEC.build(**kwargs)


    def batch(rank, step, mb):
        gen = torch.Generator().manual_seed(DATA_SEEDS[(rank, step, mb)])
        return SPEC.batch(gen, BATCH_SIZE, rank, WORLD_SIZE, step)


    def optimizer(params):
        if OPTIMIZER == "sgd":
            return torch.optim.SGD(params, lr=LR)
        if OPTIMIZER == "sgd_momentum":
            return torch.optim.SGD(params, lr=LR, momentum=0.9)
        return torch.optim.Adam(params, lr=LR)


    def rtol(dtype):
        if EXACT or not dtype.is_floating_point:
            return 0.0
        return RTOL_OVERRIDE if RTOL_OVERRIDE is not None else RTOL.get(str(dtype)[6:], 1e-5)


    def compare(rank, step, name, what, got, want, scale):
        tolerance = rtol(got.dtype) * scale
        got, want = got.detach().to_dense().double(), want.detach().to_dense().double()
        error = float((got - want).abs().max()) if got.numel() else 0.0
        if error > tolerance or (EXACT and not torch.equal(got, want)):
            raise AssertionError(f"rank {rank}, step {step}, {name!r}: {what}: max abs error "
                                 f"{error:.3g} vs the single-process result (tolerance "
                                 f"{tolerance:.3g})")


    def expected_grads(reference, step):
        """Every rank's local gradient of the single-process model, averaged over ranks and
        summed over microbatches; and the magnitude the reduction adds, per parameter."""
        total, magnitude = {}, {}
        for mb in range(MICROBATCHES):
            for r in range(WORLD_SIZE):
                local = copy.deepcopy(reference)
                inputs, target = batch(r, step, mb)
                SPEC.loss(local(*inputs), target).backward()
                for name, p in local.named_parameters():
                    if p.grad is None:
                        continue
                    g = p.grad.to_dense() / WORLD_SIZE
                    total[name] = total[name] + g if name in total else g
                    m = g.abs()
                    magnitude[name] = magnitude[name] + m if name in magnitude else m
        return total, {n: float(m.max()) if m.numel() else 0.0 for n, m in magnitude.items()}


    def main():
        use_torch = "--ddp" in sys.argv and sys.argv[sys.argv.index("--ddp") + 1] == "torch"
        if use_torch:
            ddp_class = torch.nn.parallel.DistributedDataParallel
        else:
            sys.path.insert(0, os.getcwd())  # the candidate imports from here, as python -m
            ddp_class = importlib.import_module(CANDIDATE[0])
            for part in CANDIDATE[1].split("."):
                ddp_class = getattr(ddp_class, part)
        # A peer that failed its check leaves: the others' collectives end within this.
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
        rank, world = dist.get_rank(), dist.get_world_size()
        assert world == WORLD_SIZE, f"written for {WORLD_SIZE} ranks, run with {world}"
        torch.set_num_threads(1)
        counting = CountingGroup(dist.group.WORLD)
        model = ddp_class(build(rank), process_group=counting, **DDP_OPTIONS)
        inner = model.module if hasattr(model, "module") else model
        if COMM_HOOK is not None:
            model.register_comm_hook(dist.group.WORLD, eval(COMM_HOOK))
        opt = optimizer(model.parameters())
        reference = build(0)  # DDP's init sync gives every rank rank 0's weights
        reference_opt = optimizer(reference.parameters())
        at_forward = []
        inner.register_forward_pre_hook(
            lambda module, args: at_forward.append({n: b.detach().clone()
                                                    for n, b in module.named_buffers()}))
        broadcast = DDP_OPTIONS.get("broadcast_buffers", True)
        for step in range(STEPS):
            opt.zero_grad(set_to_none=SET_TO_NONE)
            for mb in range(MICROBATCHES):
                inputs, target = batch(rank, step, mb)
                context = model.no_sync() if not SYNCED[mb] else _Null()
                with context:
                    loss = SPEC.loss(model(*inputs), target)
                    before = counting.reductions
                    loss.backward()
                if not SYNCED[mb] and counting.reductions != before:
                    raise AssertionError(f"rank {rank}, step {step}, microbatch {mb}: "
                                         f"{counting.reductions - before} reducing collective(s) "
                                         "in a backward inside no_sync (DDP reduces nothing there)")
                if broadcast and BUFFERS_BROADCAST[(step, mb)]:
                    for name, b in at_forward[-1].items():
                        theirs = b.clone()
                        dist.broadcast(theirs, 0)
                        compare(rank, step, name, f"buffer at the start of microbatch {mb}'s "
                                "forward (DDP broadcasts rank 0's)", b, theirs, 0.0)
            want, scale = expected_grads(reference, step)
            for name, p in inner.named_parameters():
                if name in want:
                    if p.grad is None:
                        raise AssertionError(f"rank {rank}, step {step}, {name!r}: gradient is "
                                             "None, the single-process gradient is not")
                    compare(rank, step, name, "gradient", p.grad, want[name], scale[name])
            opt.step()
            reference_opt.zero_grad(set_to_none=True)
            for name, p in reference.named_parameters():
                if name in want:
                    p.grad = want[name].to(p.dtype)
            reference_opt.step()
            for (name, p), (_, q) in zip(inner.named_parameters(), reference.named_parameters()):
                compare(rank, step, name, "parameter after the step", p, q,
                        float(q.detach().abs().max()) if q.numel() else 0.0)
                theirs = p.detach().clone()
                dist.broadcast(theirs, 0)
                if not torch.equal(p.detach(), theirs):
                    raise AssertionError(f"rank {rank}, step {step}, {name!r}: parameter differs "
                                         "from rank 0's (replicas must stay bitwise equal)")
        dist.barrier()
        if rank == 0:
            print(f"PASS: {'torch' if use_torch else 'the candidate'} matches the "
                  "single-process result")
        dist.destroy_process_group()


    class CountingGroup(dist.ProcessGroup):
        """The world group, counting the reducing collectives issued through it; every
        other operation goes to the world group's Gloo backend, registered here too."""

        def __init__(self, inner):
            super().__init__(inner.rank(), inner.size())
            self.inner = inner
            self.reductions = 0
            cpu = torch.device("cpu")
            gloo = dist.ProcessGroup.BackendType.GLOO
            self._register_backend(cpu, gloo, inner._get_backend(cpu))
            self._set_default_backend(gloo)

        def getBackendName(self):
            return "gloo"

        def allreduce(self, *args, **kwargs):
            self.reductions += 1
            return self.inner.allreduce(*args, **kwargs)

        def allreduce_coalesced(self, *args, **kwargs):
            self.reductions += 1
            return self.inner.allreduce_coalesced(*args, **kwargs)

        def reduce_scatter(self, *args, **kwargs):
            self.reductions += 1
            return self.inner.reduce_scatter(*args, **kwargs)


    class _Null:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False


    if __name__ == "__main__":
        try:
            main()
        except AssertionError as failure:  # the evidence, flushed before the peers go
            print(f"FAIL: {failure}", file=sys.stderr, flush=True)
            raise
''')


def parse_case(case: str) -> Scenario:
    """A catalog scenario id, or a ``Scenario(...)`` literal as ``fuzz`` prints it."""
    if case.lstrip().startswith("Scenario("):
        from ddp_conformance.catalog.scenario import JoinSpec

        try:
            scenario = eval(case, {"__builtins__": {}}, {"Scenario": Scenario, "JoinSpec": JoinSpec})
        except Exception as exc:  # noqa: BLE001 - the user's literal: one line
            raise UsageError(f"repro: not a Scenario literal: {type(exc).__name__}: {exc}") from None
        if not isinstance(scenario, Scenario):
            raise UsageError("repro: the literal is not a Scenario")
        return scenario
    from ddp_conformance.catalog.loader import load_catalog

    for scenario in load_catalog():
        if scenario.id == case:
            return scenario
    raise UsageError(f"repro: no scenario {case!r} in the catalog (give an id from "
                     "`ddp-conformance list`, or a Scenario(...) literal)")
