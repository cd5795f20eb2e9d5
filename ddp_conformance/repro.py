"""``ddp-conformance repro``: a standalone script that reproduces a case, for a bug report.

The script needs torch and the candidate's package, nothing of the harness. It runs under
``torchrun --nproc-per-node N`` (Gloo on the CPU), rebuilds the scenario's model and data,
trains it with the candidate the way ``ranks/engine.py`` drives a DDP-like candidate, and
checks what the harness's checks check, in one process per rank.

The model's code is copied from the catalog module that registers it
(``catalog/models/``: ``synthetic.py``, ``real_models.py``, ``composed.py``...): only the
definitions its registration needs, found by following names, into ``registry.py`` and
``synthetic.py`` where the module imports from them (``ModelSpec``, ``mse``); its other
imports (``math``, torch's ``checkpoint``) become the script's (:func:`model_source`).
What the procedure decides is the harness's,
computed by ``catalog/procedure.py``'s own functions and written out as tables: per step
the forward plan (``forward_plan``: the eval forward first where ``eval_between_steps``,
then each microbatch's ``forwards`` forwards), per forward of it whether DDP broadcasts
buffers at its start (``broadcasts``), per (rank, step, microbatch, forward) the batch's
seed and the seed ``seed_forward`` gives torch's RNG before the forward (dropout's masks),
per rank its batch size (uneven batches), per microbatch whether it syncs. The comm hook is
the branch of ``catalog.procedure.make_comm_hook`` copied. Per step a rank calls the
model's ``before_step`` (a model changed between steps), runs the eval forward (inner
module in ``eval()``, ``torch.no_grad()``, through the DDP wrapper), ``zero_grad``, then
per microbatch its forwards (each seeded, under ``torch.autocast`` where the scenario asks;
the losses summed) and one backward outside autocast.

The checks:

- against a single-process result computed the way ``judge/oracle.py`` computes it (the
  same model from the group's rank 0 initial weights, every active rank's forwards of the
  plan in turn, the broadcast source's first, each seeded as the rank seeds it; local
  gradients summed over the microbatches, divided by the group size or, under Join with
  ``divide_by_initial_world_size=False``, by the ranks still active, summed in rank order:
  with uneven batches the mean of the per-rank means, each rank weighted 1/group size;
  buffers simulated per rank, broadcast from rank 0, or under Join from the highest active
  rank, at the forwards where DDP broadcasts): the initial parameters and buffers (DDP's
  init sync), at each step the buffers at the start of every forward (the eval forward
  included), the gradients (``None`` where the result's is; zeros accepted too where the
  oracle's ``zero_or_none`` does: a parameter no active rank used after a join, under
  ``find_unused_parameters``), the parameters and buffers after the step; norm-wise
  within the harness's tolerance (``judge/tolerance.py``: the parameter dtypes' rtol, the
  loosest of a mixed model's, or the scenario's override; autocast changes nothing there,
  as in the harness: the single process computes the same bfloat16 forward, so local
  gradients agree bitwise and only the reduction's rounding is left), bitwise for an
  exact scenario; with ``oracle_after_join`` off, only while every rank is active;
- the collectives, logged by a Gloo process group every group of the script is made of
  (DDP's C++ reducer goes through it too): nothing reduced or broadcast inside
  ``no_sync`` (``trace.no_sync``), reductions in a lossless wire dtype or the comm hook's
  (``hook_wire_dtype``: none under ``forced_sync``, whose reduction by hand skips the hook),
  and enough of each dtype in a mixed model (``trace.dtype``), and every synced backward
  reducing every gradient element once
  (``trace.reduced_once``, where the scenario's ``trace_volume`` is on);
- the replicas: parameters bitwise equal on every rank that ran the step, buffers at each
  broadcasting forward of the plan too, and after the training (Join's exit included)
  every rank's parameters equal, buffers equal to the last joiner's under Join;
- where the scenario expects an error, that error on every rank (regular expression on
  "Type: message"); as in the harness nothing else is compared then (the failing
  iteration is no DDP step: without ``find_unused_parameters`` the step before the error
  never finished its reduction).

Join (``Join([ddp] + [the optimizer if Joinable], ...)``, rank ``r`` of the group running
``JoinSpec.steps_for(r)`` steps), Composer's sync strategies (``ddp_sync_context``, copied
from ``ddp_reference``), process subgroups (every rank creates every group; a rank in none
idles), ZeroRedundancyOptimizer, PowerSGD and the comm hooks are written as the engine
runs them.

The first violation raises ``AssertionError`` with one evidence line ("rank 1, step 2,
'fc.weight': gradient: max abs error 0.0315 vs the single-process result (tolerance
1.1e-06)"). ``--ddp torch`` swaps the candidate for torch's DDP: the same script then
passes, which shows the defect is the candidate's.

What the script cannot write faithfully is refused with a usage error (:func:`refusal`):
a world size the scenario is not defined for, a backend other than Gloo, a model that no
catalog module registers. Left out: the reference DDP (and so the reference checks), the
bucket-layout check and the cross-rank trace-consistency check.
"""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import os
import pprint
import textwrap
from dataclasses import dataclass, field

import torch
from ddp_reference import sync_strategy

from ddp_conformance.catalog import models as models_package
from ddp_conformance.catalog import procedure
from ddp_conformance.catalog.procedure import broadcasts, buffers_broadcast, forward_plan, synced
from ddp_conformance.catalog.scenario import Accumulate, Optimizer, Scenario
from ddp_conformance.errors import UsageError
from ddp_conformance.judge.checks.trace_dtype import hook_wire_dtype
from ddp_conformance.judge.oracle import reduce_gradients
from ddp_conformance.judge.tolerance import RTOL
from ddp_conformance.script.wire_dtypes import HOLDS


def unsupported(scenario: Scenario) -> str:
    """Why the script cannot reproduce ``scenario`` at any world size ('' if it can)."""
    reasons = [what for what, present in (
        ("a backend other than Gloo", scenario.unsupported_backend("gloo") != ""),
        ("a model registered outside the catalog's modules",
         registering_module(scenario.model) is None),
    ) if present]
    surface = surface_features(scenario)
    if surface:
        reasons.append(f"torch 2.13's surface beyond the script's procedure ({', '.join(surface)})")
    return ", ".join(reasons)


#: DDP options whose torch value is an object the rank builds (catalog/ddp_options.py).
MATERIALIZED_OPTIONS = ("mixed_precision", "delay_all_reduce_named_params",
                        "param_to_hook_all_reduce", "device_mesh")


def surface_features(scenario: Scenario) -> list[str]:
    """What of ``scenario`` the standalone script does not write (the surface scenarios'
    fields: their reproduction is the scenario itself, run on the ranks)."""
    present = [
        ("a builtin comm hook", scenario.comm_hook is not None and scenario.comm_hook.builtin),
        ("a buffer comm hook", scenario.buffer_comm_hook is not None),
        ("an optimizer stepped in backward",
         scenario.optimizer in (Optimizer.FUSED_SGD, Optimizer.IN_BACKWARD_SGD)),
        ("a process-group update", scenario.update_process_group_at is not None),
        ("a copy of the wrapper", scenario.copy_wrapper is not None),
        ("nested no_sync", scenario.accumulate is Accumulate.NESTED_NO_SYNC),
        ("a barrier after backward", scenario.barrier_after_backward),
        ("a torch limit", scenario.torch_limit is not None),
        ("several backwards of one loss", scenario.backwards > 1),
        ("a forward raising inside no_sync", scenario.raise_in_no_sync),
        ("options built on the rank", any(o in scenario.ddp_options
                                           for o in MATERIALIZED_OPTIONS)),
    ]
    return [what for what, yes in present if yes]


def refusal(scenario: Scenario, world_size: int) -> str:
    """The one line saying why no script is written for ``scenario`` at ``world_size``
    ('' if one is)."""
    why = unsupported(scenario)
    if why:
        return f"repro: {scenario.id} uses {why}, which the standalone script cannot write"
    wrong_size = scenario.unsupported_world_size(world_size)
    if wrong_size:
        return f"repro: {scenario.id} is {wrong_size}, not {world_size} ranks (--world-size)"
    return ""


#: The modules a catalog model may be registered in (``register(ModelSpec("name", ...))``).
CATALOG_MODULES = tuple(member.__name__ for member in models_package.MEMBERS)


@dataclass
class _Module:
    """One module's top level, read for :func:`model_source`."""

    name: str
    tree: ast.Module
    lines: list[str]
    #: Top-level name -> the statement defining it (def, class, assignment).
    defined: dict[str, ast.stmt] = field(default_factory=dict)
    #: Top-level name -> (module, its name there; "" for a module) for what it imports.
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)


@functools.cache
def _read_module(name: str) -> _Module:
    source = inspect.getsource(importlib.import_module(name))
    module = _Module(name, ast.parse(source), source.splitlines())
    for node in module.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            module.defined[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):  # a, b = 1, 2 defines both
                    if isinstance(leaf, ast.Name):
                        module.defined[leaf.id] = node
    module.imported = _imported(module.tree)
    return module


def _imported(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Top-level name -> (module, its name there; "" for a module) of ``tree``'s imports."""
    bound: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                bound[name] = (alias.name if alias.asname else name, "")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                bound[alias.asname or alias.name] = (node.module, alias.name)
    return bound


def _registration(module: _Module, model: str) -> ast.Call | None:
    """The ``ModelSpec(...)`` of ``register(ModelSpec("model", ...))`` in ``module``."""
    found = None
    for node in module.tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                getattr(node.value.func, "id", "") == "register" and node.value.args:
            spec = node.value.args[0]
            if isinstance(spec, ast.Call) and spec.args and \
                    isinstance(spec.args[0], ast.Constant) and spec.args[0].value == model:
                found = spec
    return found


def registering_module(model: str) -> str | None:
    """The catalog module whose top level registers ``model`` (None: none of
    :data:`CATALOG_MODULES`)."""
    for name in CATALOG_MODULES:
        if _registration(_read_module(name), model) is not None:
            return name
    return None


def model_source(model: str) -> str:
    """The code model ``model`` needs, and ``SPEC``, its registration's ``ModelSpec``.

    The definitions are copied from the module that registers it (``catalog/models/``:
    ``synthetic.py``, ``real_models.py``, ``composed.py``...) by following the names its
    registration uses, into the harness's other modules where it imports from them
    (``ModelSpec`` from ``registry.py``, ``mse`` from ``synthetic.py``); what it imports
    from elsewhere (``math``, torch's ``checkpoint``) becomes an import of the script. In
    file order, the modules imported from first; nothing of ``ddp_conformance`` is imported."""
    home = registering_module(model)
    if home is None:
        raise UsageError(f"repro: model {model!r} is not registered in "
                         f"{', '.join(m.rsplit('.', 1)[-1] + '.py' for m in CATALOG_MODULES)}")
    registration = _registration(_read_module(home), model)
    assert registration is not None
    needed: dict[tuple[str, str], ast.stmt] = {}  # (module, name) -> definition
    imports: dict[str, tuple[str, str]] = {}  # bound name -> (module, name there or "")
    pending: list[tuple[str, ast.AST]] = [(home, registration)]

    def resolve(module_name: str, name: str) -> None:
        module = _read_module(module_name)
        if name in module.defined:
            if (module_name, name) not in needed and name != "MODELS":
                needed[(module_name, name)] = module.defined[name]
                pending.append((module_name, module.defined[name]))
        elif name in module.imported:
            source, original = module.imported[name]
            if source.split(".")[0] == "ddp_conformance":
                if not original or original != name:
                    raise UsageError(f"repro: model {model!r} needs {name!r}, imported as a "
                                     f"module or under another name from {source}")
                resolve(source, original)
            else:
                imports[name] = (source, original)

    while pending:
        module_name, node = pending.pop()
        for name in sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)}):
            resolve(module_name, name)
    clash = [name for name in {n for _, n in needed}
             if len({m for m, n in needed if n == name}) > 1]
    if clash:
        raise UsageError(f"repro: model {model!r} needs {clash[0]!r} from two modules")
    lines = []
    for name, (source, original) in imports.items():
        if _SCRIPT_IMPORTS.get(name) == (source, original):
            continue  # the script imports it already
        if name in _SCRIPT_IMPORTS:
            raise UsageError(f"repro: model {model!r} imports {name!r} from {source}, a name "
                             "the script binds to something else")
        if original:
            alias = ast.alias(original, None if original == name else name)
            lines.append(ast.unparse(ast.ImportFrom(source, [alias], 0)))
        else:
            alias = ast.alias(source, None if source == name else name)
            lines.append(ast.unparse(ast.Import([alias])))
    parts = ["\n".join(lines)] if lines else []
    # The modules imported from first (their definitions are used at import time), the
    # registering module last; each in its file order.
    for module_name in [*(m for m in dict.fromkeys(m for m, _ in needed) if m != home), home]:
        chosen = {id(node) for (m, _), node in needed.items() if m == module_name}
        parts += [_text(_read_module(module_name), node)
                  for node in _read_module(module_name).tree.body if id(node) in chosen]
    parts.append(f"SPEC = {_text(_read_module(home), registration)}")
    return "\n\n\n".join(parts)


def _text(module: _Module, node: ast.stmt | ast.expr) -> str:
    """``node``'s source as written (comments inside kept, decorators included)."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    end = node.end_lineno or node.lineno
    text = "\n".join(module.lines[first - 1:end])
    if isinstance(node, ast.stmt):
        return text
    # An expression (the registration's ModelSpec call): from its column to its end.
    tail = len(module.lines[end - 1]) - (node.end_col_offset or 0)
    return text[node.col_offset:len(text) - tail]


def comm_hook_source(name: str) -> str:
    """``comm_hook(process_group)`` for the script: the branch of
    ``catalog.procedure.make_comm_hook`` for hook ``name``, copied with its comments, after
    the procedure module's functions it calls (``_allreduce_to_new_tensor``)."""
    source = textwrap.dedent(inspect.getsource(procedure.make_comm_hook))
    lines = source.splitlines()
    branch: ast.If | None = None
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and \
                isinstance(node.test.comparators[0], ast.Constant) and \
                node.test.comparators[0].value == name:
            branch = node
    if branch is None or branch.body[-1].end_lineno is None:
        raise UsageError(f"repro: no comm hook {name!r} in catalog/procedure.make_comm_hook")
    body = textwrap.dedent("\n".join(lines[branch.lineno:branch.body[-1].end_lineno]))
    helpers = [inspect.getsource(value) for helper, value in vars(procedure).items()
               if inspect.isfunction(value) and value.__module__ == procedure.__name__
               and helper in {n.id for stmt in branch.body for n in ast.walk(stmt)
                              if isinstance(n, ast.Name)}]
    function = ('def comm_hook(process_group):\n'
                '    """(state, hook) of the scenario\'s comm hook, as the harness registers '
                'it\n    (ddp_conformance/catalog/procedure.py: make_comm_hook)."""\n'
                + textwrap.indent(body, "    "))
    return "\n\n".join([*helpers, function])


def write_script(scenario: Scenario, candidate: str, world_size: int) -> str:
    """The reproducer's source for ``scenario`` with ``candidate`` (``module:attr``, a
    DDP-like callable) at ``world_size`` ranks."""
    why = refusal(scenario, world_size)
    if why:
        raise UsageError(why)
    if ":" not in candidate:
        if candidate != "torch":
            raise UsageError(f"repro: the candidate must be module:attr (a DDP-like callable) "
                             f"or torch, got {candidate!r}")
        module_name, attr = "torch.nn.parallel", "DistributedDataParallel"
    else:
        module_name, attr = candidate.split(":", 1)
    steps, mbs = scenario.steps, scenario.microbatches
    groups = scenario.groups_for(world_size)
    model = procedure.build_module(scenario, groups[0][0], torch.device("cpu"))
    grad_dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()
                          if p.requires_grad})
    hook = scenario.comm_hook.value if scenario.comm_hook else None
    plans = {s: forward_plan(scenario, s) for s in range(steps)}
    settings = dict(
        WORLD_SIZE=world_size, STEPS=steps, MICROBATCHES=mbs, FORWARDS=scenario.forwards,
        EVAL_BETWEEN_STEPS=scenario.eval_between_steps, AUTOCAST=scenario.autocast,
        OPTIMIZER=scenario.optimizer.value, LR=scenario.lr,
        SET_TO_NONE=scenario.zero_grad_set_to_none, DDP_OPTIONS=dict(scenario.ddp_options),
        BROADCAST_BUFFERS=scenario.broadcasts_buffers(), SAME_INIT=scenario.init.value == "same",
        GROUPS=[list(g) for g in scenario.groups] if scenario.groups else None,
        JOIN=None if scenario.join is None else dict(
            divide_by_initial_world_size=scenario.join.divide_by_initial_world_size,
            throw_on_early_termination=scenario.join.throw_on_early_termination),
        ORACLE_AFTER_JOIN=scenario.oracle_after_join,
        SYNC_STRATEGY=scenario.sync_strategy.value if scenario.sync_strategy else None,
        COMM_HOOK=hook, COMM_HOOK_REGISTRATIONS=scenario.comm_hook_registrations,
        HOOK_WIRE_DTYPE=hook_wire_dtype(scenario),
        EXPECT_ERROR=scenario.expect_error, TRACE_VOLUME=scenario.trace_volume,
        EXACT=scenario.exact, RTOL_OVERRIDE=scenario.rtol,
        RTOL={str(k).removeprefix("torch."): v for k, v in RTOL.items()},
        GRAD_DTYPES=grad_dtypes, HOLDS={w: sorted(g) for w, g in HOLDS.items()},
        MODEL_RANK_AWARE=models_package.get_model(scenario.model).rank_aware,
        MODEL_KWARGS=dict(scenario.model_kwargs))
    table = {
        # Join: rank r of its group runs max(1, STEPS - r * fewer) steps (JoinSpec.steps_for)
        "STEPS_FOR": {r: scenario.steps_for(g.index(r)) for g in groups for r in g},
        "INIT_SEEDS": {r: scenario.init_seed(r) for r in range(world_size)},
        "BATCH_SIZES": {r: scenario.batch_size_for(r) for r in range(world_size)},
        "PLAN": {s: [(f.microbatch, f.index) for f in plans[s]] for s in range(steps)},
        "BROADCASTS": {s: broadcasts(scenario, s) for s in range(steps)},
        "DATA_SEEDS": {(r, s, f.microbatch, f.index): scenario.data_seed(
                           r, s, procedure._draw(scenario, f.microbatch, f.index))
                       for r in range(world_size) for s in range(steps) for f in plans[s]},
        "FORWARD_SEEDS": {(r, s, f.microbatch, f.index): _forward_seed(scenario, r, s, f)
                          for r in range(world_size) for s in range(steps) for f in plans[s]},
        "SYNCED": [synced(scenario, m) for m in range(mbs)],
        "BUFFERS_BROADCAST": {(s, m): buffers_broadcast(scenario, s, m)
                              for s in range(steps) for m in range(mbs)},
    }
    constants = "\n".join((f"# {_NOTES[k]}\n" if k in _NOTES else "")
                          + f"{k} = {pprint.pformat(v, width=96, compact=True)}"
                          for k, v in {**settings, **table}.items())
    header = _HEADER.format(id=scenario.id, candidate=candidate, ws=world_size,
                            name=f"repro_{scenario.id.replace('/', '_').replace('-', '_')}.py")
    imports = _IMPORTS + ("from torch.distributed.algorithms.ddp_comm_hooks import (\n"
                          "    debugging_hooks, default_hooks, post_localSGD_hook, powerSGD_hook)\n"
                          if hook else "")
    parts = [header, imports, "", "# --- the scenario " + "-" * 66,
             f"CANDIDATE = {(module_name, attr)!r}  # module, attribute", constants, "",
             f"# --- the model, from {_path(registering_module(scenario.model))} ".ljust(84, "-"),
             model_source(scenario.model), ""]
    parts += ["", "# --- the comm hook, from ddp_conformance/catalog/procedure.py " + "-" * 20,
              comm_hook_source(hook) if hook else "comm_hook = None  # the scenario registers none",
              "", "# --- forced_sync's reduction, from reference/sync_strategy.py " + "-" * 20,
              inspect.getsource(sync_strategy.forced_sync_gradients), "",
              "# --- the reduction of one step, from ddp_conformance/judge/oracle.py " + "-" * 13,
              inspect.getsource(reduce_gradients), ""]
    script = "\n".join([*parts, _BODY])
    twice = _defined_twice(script)
    if twice:
        raise UsageError(f"repro: the code of model {scenario.model!r} defines {twice[0]!r}, "
                         "which the script defines too")
    return script


def _path(module: str | None) -> str:
    """``ddp_conformance/catalog/models/synthetic.py`` for its module's name."""
    return (module or "?").replace(".", "/") + ".py"


def _forward_seed(scenario: Scenario, rank: int, step: int, forward: procedure.Forward) -> int:
    """The seed ``procedure.seed_forward`` gives torch's RNG before this forward, read back
    from torch (the harness's RNG state is restored)."""
    with torch.random.fork_rng(devices=[]):
        procedure.seed_forward(scenario, rank, step, forward.microbatch, forward.index)
        return torch.initial_seed()


def _defined_twice(source: str) -> list[str]:
    """Top-level names two statements of ``source`` define (a def, class or assignment
    silently replacing another: a model's code against the script's own)."""
    seen: dict[str, int] = {}
    for node in ast.parse(source).body:
        names: list[str] = []
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        for name in names:
            seen[name] = seen.get(name, 0) + 1
    return sorted(name for name, count in seen.items() if count > 1)


#: Comments on the script's constants.
_NOTES = {
    "DDP_OPTIONS": "the candidate's constructor keywords (besides process_group)",
    "GROUPS": "DDP process groups (global ranks), every rank creates each in order; None: the world",
    "JOIN": "Join's keywords (None: no Join)",
    "ORACLE_AFTER_JOIN": "compare with the single-process result after a rank has joined",
    "SYNC_STRATEGY": "Composer's gradient-accumulation sync strategy (None: SYNCED decides)",
    "HOOK_WIRE_DTYPE": "the dtype the comm hook reduces in (None: a dtype holding the gradients'; "
                       "forced_sync reduces by hand, the hook never runs)",
    "EXPECT_ERROR": "the error every rank must raise, on 'Type: message' (then nothing else is "
                    "compared)",
    "TRACE_VOLUME": "check that each synced backward reduces every gradient element once",
    "RTOL": "norm-wise tolerance per dtype (ddp_conformance/judge/tolerance.py); RTOL_OVERRIDE "
            "replaces it",
    "GRAD_DTYPES": "the dtypes of the parameters that require gradients",
    "HOLDS": "per wire dtype, the gradient dtypes it holds exactly (judge/wire_dtypes.py)",
    "STEPS_FOR": "steps per global rank (Join: rank r of its group runs max(1, STEPS - r * fewer))",
    "FORWARDS": "forwards per backward, their losses summed (PLAN lists them)",
    "EVAL_BETWEEN_STEPS": "a forward under no_grad and eval() before every step but the first "
                          "(PLAN's microbatch -1)",
    "AUTOCAST": "the dtype of torch.autocast around every training forward (None: none)",
    "BATCH_SIZES": "samples per global rank (uneven batches: DDP averages the per-rank means)",
    "PLAN": "per step, its forwards in order as (microbatch, forward): microbatch -1 is the eval "
            "forward (catalog/procedure.py: forward_plan)",
    "BROADCASTS": "per step and forward of PLAN, whether DDP broadcasts buffers at its start "
                  "(procedure.broadcasts: after a forward with grad outside no_sync)",
    "DATA_SEEDS": "per (rank, step, microbatch, forward), the seed of the batch's generator",
    "FORWARD_SEEDS": "per (rank, step, microbatch, forward), torch.manual_seed before it "
                     "(procedure.seed_forward: dropout's masks)",
    "SYNCED": "per microbatch, whether its backward reduces gradients",
    "BUFFERS_BROADCAST": "per (step, microbatch), whether DDP broadcasts buffers at its forward "
                         "(after a synced forward)",
}


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

import importlib
import itertools
import os
import re
import sys
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
'''

#: What the script's own imports bind (a model's import of the same is not repeated).
_SCRIPT_IMPORTS = _imported(ast.parse(_IMPORTS))

_BODY = textwrap.dedent('''
    # --- the procedure, as ddp_conformance/ranks/engine.py drives a DDP-like candidate ---


    def build(rank):
        torch.manual_seed(INIT_SEEDS[rank])
        kwargs = dict(MODEL_KWARGS, rank=rank) if MODEL_RANK_AWARE else MODEL_KWARGS
        return SPEC.build(**kwargs)


    def batch(rank, step, mb, forward, group_size):
        """Rank ``rank``'s batch for one forward of the step (microbatch -1: the eval
        forward), BATCH_SIZES[rank] samples (catalog/procedure.py: batch)."""
        gen = torch.Generator().manual_seed(DATA_SEEDS[(rank, step, mb, forward)])
        return SPEC.batch(gen, BATCH_SIZES[rank], rank, group_size, step)


    def seed_forward(rank, step, mb, forward):
        """Seed torch's RNG before a forward, as every rank and the single process do:
        dropout then draws rank ``rank``'s masks wherever its batch is computed."""
        torch.manual_seed(FORWARD_SEEDS[(rank, step, mb, forward)])


    def forward_context():
        """Around every training forward (not the eval forward, not the backward)."""
        if AUTOCAST is None:
            return nullcontext()
        return torch.autocast("cpu", dtype=getattr(torch, AUTOCAST))


    def training_forwards(step, mb):
        """The forwards (their indices) whose losses microbatch ``mb``'s backward sums."""
        return [f for m, f in PLAN[step] if m == mb]


    def eval_forward(model, module, rank, step, group_size):
        """The validation forward before the step: module.eval(), torch.no_grad(), through
        the DDP wrapper (ranks/engine.py: _eval_forward)."""
        inputs, _ = batch(rank, step, -1, 0, group_size)
        seed_forward(rank, step, -1, 0)
        module.eval()
        try:
            with torch.no_grad():
                model(*inputs)
        finally:
            module.train()


    def optimizer(params, distributed=True):
        """ZeroRedundancyOptimizer over SGD on the ranks, plain SGD in the single process
        (ZeRO changes where the update is computed, not its value)."""
        if OPTIMIZER == "zero_sgd" and distributed:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, lr=LR)
        if OPTIMIZER in ("sgd", "zero_sgd"):
            return torch.optim.SGD(params, lr=LR)
        if OPTIMIZER == "sgd_momentum":
            return torch.optim.SGD(params, lr=LR, momentum=0.9)
        return torch.optim.Adam(params, lr=LR)


    def join(model, opt):
        """Join over the DDP module and, when it is joinable, the optimizer (ZeRO)."""
        if JOIN is None:
            return nullcontext()
        from torch.distributed.algorithms.join import Join, Joinable

        joinables = [model] + ([opt] if isinstance(opt, Joinable) else [])
        return Join(joinables, **JOIN)


    @contextmanager
    def sync_context(model, mb):
        """Around one microbatch's forward and backward: no_sync where the scenario says,
        or Composer's sync strategy (its ddp_sync_context)."""
        final = mb == MICROBATCHES - 1
        if SYNC_STRATEGY is None:
            with nullcontext() if SYNCED[mb] else model.no_sync():
                yield
        elif SYNC_STRATEGY == "single_auto_sync":
            with nullcontext() if final else model.no_sync():
                yield
        elif SYNC_STRATEGY == "multi_auto_sync":
            yield
        else:  # forced_sync: every microbatch inside no_sync, then a reduction by hand
            try:
                with model.no_sync():
                    yield
            finally:
                if final:
                    with torch.no_grad():
                        forced_sync_gradients(model)


    @dataclass
    class Record:
        """What one rank did: its steps' parameters and buffers at each forward, for the
        replica checks after training."""
        params: list = field(default_factory=list)
        at_forward: list = field(default_factory=list)
        final_params: dict = field(default_factory=dict)
        final_buffers: dict = field(default_factory=dict)


    def train(ddp_class, rank, group, members, want, record):
        """Wrap, register the comm hook, train this rank's steps (under Join if asked), and
        compare every step with the single-process result as it goes."""
        module = build(rank)
        model = ddp_class(module, process_group=group, **DDP_OPTIONS)
        opt = optimizer(model.parameters())
        for _ in range(COMM_HOOK_REGISTRATIONS if COMM_HOOK else 0):
            model.register_comm_hook(*comm_hook(group))
        if EXPECT_ERROR is None:
            check_init(rank, module, want)
        at_forward = []
        module.register_forward_pre_hook(lambda m, args: at_forward.append(snapshot(m.named_buffers())))
        with join(model, opt):
            for step in range(STEPS_FOR[rank]):
                if SPEC.before_step is not None:  # how the model changes between steps
                    SPEC.before_step(module, step)
                if PLAN[step] and PLAN[step][0][0] < 0:
                    at("eval", step)
                    eval_forward(model, module, rank, step, len(members))
                at("zero_grad", step)
                opt.zero_grad(set_to_none=SET_TO_NONE)
                for mb in range(MICROBATCHES):
                    with sync_context(model, mb):
                        at("forward", step, mb)
                        loss = 0  # the forwards' losses summed, one backward
                        for f in training_forwards(step, mb):
                            inputs, target = batch(rank, step, mb, f, len(members))
                            seed_forward(rank, step, mb, f)
                            with forward_context():
                                out = model(*inputs)
                            loss = loss + SPEC.loss(out, target)
                        at("backward", step, mb)
                        loss.backward()
                at("optimizer", step)
                grads = {n: None if p.grad is None else p.grad.detach().to_dense().clone()
                         for n, p in module.named_parameters()}
                opt.step()
                at("check", step)
                record.params.append(snapshot(module.named_parameters()))
                record.at_forward.append(list(at_forward))
                if EXPECT_ERROR is None:
                    check_step(rank, step, want, grads, at_forward, module, len(members))
                at_forward.clear()
            at("join", STEPS_FOR[rank])  # Join's exit: shadowing, then the final sync
        at("after")
        record.final_params = snapshot(module.named_parameters())
        record.final_buffers = snapshot(module.named_buffers())


    def snapshot(tensors):
        return {n: t.detach().clone() for n, t in tensors}


    # --- the single-process result, as ddp_conformance/judge/oracle.py computes it ---------


    @dataclass
    class Step:
        active: list      # the ranks still training (fewer under Join)
        grads: dict       # the synced gradients (None where no active rank made one)
        scales: dict      # per gradient, max of sum_r |local_r| / divisor: what the reduction adds
        params: dict      # after the optimizer step
        buffers: dict     # per rank, after the step
        at_forward: dict  # per rank, the buffers at the start of each forward
        produced: list    # per microbatch, the parameters some active rank made a gradient for
        # None expected, zeros accepted: Join with find_unused_parameters after a rank joined,
        # used by no active rank (torch's joined rank allreduces its stale used map)
        zero_or_none: set = field(default_factory=set)


    @dataclass
    class SingleProcess:
        initial_params: dict
        initial_buffers: dict  # per rank
        steps: list = field(default_factory=list)
        final_buffers: dict = field(default_factory=dict)
        last_joiner: int = 0
        reduced_numel: int = 0  # elements of the parameters that require gradients


    def single_process(members):
        """The group's trajectory in one process: the model from its rank 0's initial
        weights (DDP's init sync), every active rank's batch in turn (each forward of the
        step's PLAN, seeded as the rank seeds it; a microbatch's forwards' losses summed,
        one backward), each rank's local gradients summed over the microbatches, divided by
        the group size (or by the ranks still active: Join with
        divide_by_initial_world_size=False) and summed in rank order; buffers simulated per
        rank, broadcast where DDP broadcasts them (BROADCASTS)."""
        model = build(members[0])
        rank_buffers = {r: snapshot(model.named_buffers()) if BROADCAST_BUFFERS or SAME_INIT
                        else snapshot(build(r).named_buffers()) for r in members}
        params = dict(model.named_parameters())
        result = SingleProcess(snapshot(params.items()), {r: dict(b) for r, b in rank_buffers.items()},
                               reduced_numel=sum(p.numel() for p in params.values() if p.requires_grad))
        opt = optimizer(model.parameters(), distributed=False)
        previous = dict.fromkeys(params)
        for step in range(max(STEPS_FOR[r] for r in members)):
            if SPEC.before_step is not None:
                SPEC.before_step(model, step)
            active = [r for r in members if step < STEPS_FOR[r]]
            divide_by_all = JOIN is None or JOIN["divide_by_initial_world_size"]
            divisor = len(members) if divide_by_all else len(active)
            # Under Join torch broadcasts from the highest active rank, else from rank 0. The
            # source runs first, so every other rank can start a broadcast forward from its
            # buffers at that forward.
            source = max(active) if JOIN is not None else active[0]
            order = [source] + [r for r in active if r != source]
            plan, bcast = PLAN[step], BROADCASTS[step]
            local = {r: {} for r in active}
            at_forward = {r: [] for r in active}
            produced = []
            source_at = {}  # the source's buffers at each forward of the plan
            for mb in sorted({m for m, _ in plan}):  # the eval forward (-1) first
                positions = [i for i, (m, _) in enumerate(plan) if m == mb]
                made = set()
                for r in order:
                    loss = 0
                    for i in positions:
                        f = plan[i][1]
                        sync = BROADCAST_BUFFERS and bcast[i] and r != source
                        if sync:
                            rank_buffers[r] = snapshot(source_at[i].items())
                        if i == positions[0] or sync:  # in place, as DDP's broadcast writes
                            load_buffers(model, rank_buffers[r])
                        if r == source:
                            source_at[i] = snapshot(rank_buffers[r].items())
                        at_forward[r].append(snapshot(rank_buffers[r].items()))
                        inputs, target = batch(r, step, mb, f, len(members))
                        seed_forward(r, step, mb, f)
                        if mb < 0:  # the eval forward
                            model.eval()
                            with torch.no_grad():
                                model(*inputs)
                            model.train()
                        else:
                            with forward_context():
                                out = model(*inputs)
                            loss = loss + SPEC.loss(out, target)
                        rank_buffers[r] = snapshot(model.named_buffers())
                    if mb < 0:
                        continue
                    model.zero_grad(set_to_none=True)
                    loss.backward()
                    for name, p in params.items():
                        if p.grad is not None:
                            made.add(name)
                            g = p.grad.detach().to_dense().clone()
                            local[r][name] = g if name not in local[r] else local[r][name] + g
                if mb >= 0:
                    produced.append(made)
            # zero_grad at the start of the step, as every rank does
            previous = {n: None if SET_TO_NONE or g is None else torch.zeros_like(g)
                        for n, g in previous.items()}
            stale_used_map = len(active) < len(members) and \\
                bool(DDP_OPTIONS.get("find_unused_parameters"))
            grads, scales, zero_or_none = reduce_gradients(
                params, [local[r] for r in active], divisor, previous, stale_used_map)
            for name, p in params.items():
                g = grads[name]
                owner = model.get_submodule(name.rpartition(".")[0])
                if g is not None and isinstance(owner, nn.Embedding) and owner.sparse:
                    g = g.to_sparse()  # a sparse embedding's optimizer wants a sparse gradient
                p.grad = None if g is None else g.clone()
            opt.step()
            result.steps.append(Step(active, grads, scales, snapshot(params.items()),
                                     {r: dict(rank_buffers[r]) for r in active}, at_forward, produced,
                                     zero_or_none))
            previous = grads
        # Join's exit syncs the final model from the highest-ranked last joiner.
        most = max(STEPS_FOR[r] for r in members)
        result.last_joiner = max(r for r in members if STEPS_FOR[r] == most)
        result.final_buffers = dict(rank_buffers[result.last_joiner])
        return result


    def load_buffers(model, buffers):
        """Write ``buffers`` into the model's as DDP's broadcast does: into their storage,
        without bumping their autograd version (.data), so that a graph that saved a buffer
        survives a broadcast between two forwards of one backward."""
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.data.copy_(buffers[name])


    # --- the checks: the first violation raises with one evidence line -----------------

    FLOOR = max((RTOL.get(d, 1e-5) for d in GRAD_DTYPES), default=0.0)


    def rtol(dtype):
        """judge/tolerance.py: bitwise where exact, the scenario's override, else the dtype's
        (at least the model's loosest gradient dtype's: a mixed model carries its rounding)."""
        if EXACT or not dtype.is_floating_point:
            return 0.0
        return RTOL_OVERRIDE if RTOL_OVERRIDE is not None else max(RTOL.get(str(dtype)[6:], 1e-5), FLOOR)


    def compare(rank, when, name, what, got, want, scale=0.0, bitwise=False):
        """max|got - want| <= rtol * max(scale, max|want|); ``when``: a step, or words."""
        when = f"step {when}" if isinstance(when, int) else when
        tolerance = 0.0 if bitwise else rtol(want.dtype)
        got, want = got.detach().to_dense().double(), want.detach().to_dense().double()
        if got.shape != want.shape:
            raise AssertionError(f"rank {rank}, {when}, {name!r}: {what}: shape "
                                 f"{tuple(got.shape)} vs the single-process {tuple(want.shape)}")
        error = float((got - want).abs().max()) if got.numel() else 0.0
        scale = max(scale, float(want.abs().max()) if want.numel() else 0.0)
        if not error <= tolerance * scale:  # NaN fails too
            raise AssertionError(f"rank {rank}, {when}, {name!r}: {what}: max abs error "
                                 f"{error:.3g} vs the single-process result (tolerance "
                                 f"{tolerance * scale:.3g})")


    def compare_all(rank, when, what, got, want, **how):
        if set(got) != set(want):
            raise AssertionError(f"rank {rank}, {when}: {what}: names "
                                 f"{sorted(set(got) ^ set(want))} on one side only")
        for name in want:
            compare(rank, when, name, what, got[name], want[name], **how)


    def forward_name(mb, f):
        """A forward of the step's PLAN, in words."""
        if mb < 0:
            return "the eval forward (no_grad, eval())"
        return f"microbatch {mb}'s forward" + (f" {f}" if FORWARDS > 1 else "")


    def check_init(rank, module, want):
        """DDP's init sync: the group's rank 0's parameters, its buffers where broadcast."""
        compare_all(rank, "after wrapping", "parameter (DDP's init sync broadcasts its group's "
                    "rank 0's)", snapshot(module.named_parameters()), want.initial_params, bitwise=True)
        compare_all(rank, "after wrapping", "buffer (DDP's init sync broadcasts its group's rank "
                    "0's, with broadcast_buffers)", snapshot(module.named_buffers()),
                    want.initial_buffers[rank], bitwise=True)


    def check_step(rank, step, want, grads, at_forward, module, group_size):
        """One step of this rank against the single-process result."""
        expected = want.steps[step]
        if not ORACLE_AFTER_JOIN and len(expected.active) < group_size:
            return  # a rank has joined: the scenario leaves the single-process trajectory
        if len(at_forward) != len(expected.at_forward[rank]):
            raise AssertionError(f"rank {rank}, step {step}: {len(at_forward)} forwards seen, "
                                 f"{len(expected.at_forward[rank])} expected")
        for (mb, f), seen, buffers in zip(PLAN[step], at_forward, expected.at_forward[rank]):
            compare_all(rank, step, f"buffer at the start of {forward_name(mb, f)}", seen, buffers)
        for name, g in expected.grads.items():
            if g is None and grads[name] is not None and name in expected.zero_or_none \\
                    and not torch.count_nonzero(grads[name]):
                continue  # zeros where None is expected: torch's stale used map under Join
            if (grads[name] is None) != (g is None):
                raise AssertionError(f"rank {rank}, step {step}, {name!r}: gradient is "
                                     f"{'None' if grads[name] is None else 'a tensor'}, the "
                                     f"single-process gradient is {'None' if g is None else 'not'}")
            if g is not None:
                compare(rank, step, name, "gradient", grads[name], g, expected.scales.get(name, 0.0))
        compare_all(rank, step, "parameter after the step", snapshot(module.named_parameters()),
                    expected.params)
        compare_all(rank, step, "buffer after the step", snapshot(module.named_buffers()),
                    expected.buffers[rank])


    def check_expected_error(rank, raised, steps):
        if raised is None:
            raise AssertionError(f"rank {rank} finished its {steps} steps without raising; "
                                 f"expected an error matching {EXPECT_ERROR!r}")
        if not re.search(EXPECT_ERROR, raised):
            raise AssertionError(f"rank {rank} raised {raised!r}, expected an error matching "
                                 f"{EXPECT_ERROR!r}")
        print(f"rank {rank} raised the expected error: {raised}", flush=True)


    FLOATING = ("float64", "float32", "float16", "bfloat16")
    REDUCING = ("allreduce", "allreduce_coalesced", "reduce", "reduce_scatter",
                "_reduce_scatter_base", "reduce_scatter_tensor_coalesced",
                "reduce_scatter_single", "reduce_scatter_single_coalesced")


    def check_collectives(rank, want, steps):
        """What the process group saw this rank issue, as the harness's trace checks read it."""
        reductions = [c for c in LOG if c.stage == "backward" and c.kind in REDUCING
                      and c.dtype in FLOATING]
        # trace.no_sync: nothing reduced or broadcast in a forward or backward inside no_sync
        for c in LOG:
            if c.stage not in ("forward", "backward") or SYNCED[c.mb] or c.dtype not in FLOATING \\
                    or c.kind not in REDUCING + ("broadcast", "scatter"):
                continue
            if c.stage == "forward" and c.kind == "broadcast" and BUFFERS_BROADCAST[(c.step, c.mb)]:
                continue  # the buffer broadcast DDP owes the previous synced forward
            if JOIN is not None and c.stage == "forward" and c.kind == "allreduce" and c.numel == 1:
                continue  # Join's count of the ranks still active
            raise AssertionError(f"rank {rank}, step {c.step}, microbatch {c.mb} (inside no_sync): "
                                 f"{c.kind} {c.dtype} x {c.numel} issued in {c.stage} (DDP "
                                 "synchronises nothing there)")
        # trace.dtype: gradients reduced in a dtype that holds them exactly (or the hook's)
        def lossless(wire):
            if HOOK_WIRE_DTYPE:  # the comm hook sets the wire dtype: exactly that one
                return wire == HOOK_WIRE_DTYPE
            return any(g in HOLDS.get(wire, [wire]) for g in GRAD_DTYPES)

        for c in reductions:
            if not lossless(c.dtype):
                raise AssertionError(
                    f"rank {rank}, step {c.step}, microbatch {c.mb}: gradients reduced as {c.kind} "
                    f"{c.dtype} x {c.numel}, expected {HOOK_WIRE_DTYPE or ' or '.join(GRAD_DTYPES)}"
                    " (precision changed)")
        # trace.reduced_once: each synced backward reduces every gradient element defined on
        # some rank once (at least those, at most the model plus padding of group size - 1 per
        # collective), and trace.dtype for a mixed model: every gradient dtype's elements were
        # reduced in dtypes that hold it exactly (for every set of dtypes, Hall's condition)
        if not TRACE_VOLUME:
            return
        if steps and not reductions:
            print(f"rank {rank}: no gradient reduction went through the process group (the "
                  "candidate's collectives bypass it): the volume is not checked", flush=True)
            return
        numel = {n: p.numel() for n, p in want.initial_params.items()}
        dtype = {n: str(p.dtype)[6:] for n, p in want.initial_params.items()}
        full = want.reduced_numel
        slack = max(c.group_size for c in reductions) - 1 if reductions else 0
        for step in range(steps):
            start = 0
            for mb in range(MICROBATCHES):
                if not SYNCED[mb]:
                    continue
                names = set().union(*want.steps[step].produced[start:mb + 1])
                needed = sum(numel[n] for n in names)
                start = mb + 1
                mine = [c for c in reductions if (c.step, c.mb) == (step, mb)]
                total = sum(c.numel for c in mine)
                if not needed <= total <= full + slack * len(mine):
                    why = "some gradients never synchronised" if total < needed else \\
                        f"{total / max(1, full):.2f}x the model: reduced more than once"
                    raise AssertionError(
                        f"rank {rank}, step {step}, microbatch {mb}: the backward reduced {total} "
                        f"gradient elements in {len(mine)} collective(s); expected "
                        f"{needed if needed == full else f'{needed} to {full}'} ({why})")
                if HOOK_WIRE_DTYPE or len(GRAD_DTYPES) < 2:
                    continue
                got = {}
                for c in mine:
                    got[c.dtype] = got.get(c.dtype, 0) + c.numel
                for size in range(1, len(GRAD_DTYPES) + 1):
                    for kinds in itertools.combinations(GRAD_DTYPES, size):
                        need = sum(numel[n] for n in names if dtype[n] in kinds)
                        have = sum(k for w, k in got.items() if any(d in HOLDS.get(w, [w]) for d in kinds))
                        if need > have:
                            raise AssertionError(
                                f"rank {rank}, step {step}, microbatch {mb}: only {have} of the {need} "
                                f"{' and '.join(kinds)} gradient elements were reduced in a dtype that "
                                f"holds them exactly (reduced as {got}: precision lost)")


    def check_replicas(rank, group, members, record, want):
        """Bitwise equal replicas: every rank that ran a step holds the parameters of the
        lowest such rank, and its buffers at each forward where DDP broadcasts; after the
        training every rank holds the same parameters, and under Join the last joiner's
        buffers. Collectives of the group, after Join, where every rank takes part."""
        def from_rank(src, mine, like):
            theirs = (mine if rank == src else torch.zeros_like(like)).clone()
            dist.broadcast(theirs, src, group=group)
            return theirs

        for step in range(max(STEPS_FOR[r] for r in members)):
            first = min(r for r in members if step < STEPS_FOR[r])
            ran = step < len(record.params)
            for name, like in record.final_params.items():
                mine = record.params[step][name] if ran else like
                theirs = from_rank(first, mine, like)
                if ran and not torch.equal(mine, theirs):
                    raise AssertionError(f"rank {rank}, step {step}, {name!r}: parameter after "
                                         f"the step differs from rank {first}'s (replicas must "
                                         "stay bitwise equal)")
            for i, (mb, f) in enumerate(PLAN[step]):
                if not (BROADCAST_BUFFERS and BROADCASTS[step][i]):
                    continue
                ran_it = ran and i < len(record.at_forward[step])
                for name, like in record.final_buffers.items():
                    mine = record.at_forward[step][i][name] if ran_it else like
                    theirs = from_rank(first, mine, like)
                    if ran_it and not torch.equal(mine, theirs):
                        raise AssertionError(f"rank {rank}, step {step}, {name!r}: buffer at the "
                                             f"start of {forward_name(mb, f)} differs from rank "
                                             f"{first}'s (DDP broadcast it)")
        lowest = min(members)
        for name, mine in record.final_params.items():
            if not torch.equal(mine, from_rank(lowest, mine, mine)):
                raise AssertionError(f"rank {rank}, after training, {name!r}: parameter differs from "
                                     f"rank {lowest}'s (every rank must end with the same model; "
                                     "Join's exit broadcasts the last joiner's)")
        if JOIN is not None and BROADCAST_BUFFERS:
            compare_all(rank, "after training", f"buffer (Join's exit syncs the last joiner's, rank "
                        f"{want.last_joiner}'s)", record.final_buffers, want.final_buffers)


    # --- the collectives: every group is Gloo behind one that logs what it is asked --------


    @dataclass
    class Collective:
        stage: str
        step: int
        mb: int
        kind: str
        dtype: str
        numel: int
        group_size: int


    LOG = []  # every collective of this process
    WHERE = ["setup", -1, -1]  # stage, step, microbatch of the training loop


    def at(stage, step=-1, mb=-1):
        WHERE[:] = [stage, step, mb]


    class LoggingGroup(dist.ProcessGroup):
        """A Gloo process group that logs every collective it is asked for, also by DDP's
        C++ reducer, with where the training loop was. Registered as the backend
        "logged_gloo": the world and every new_group are made of it. (As the harness's
        tracing group, every operation goes to Gloo's backend object directly.)"""

        def __init__(self, gloo):
            super().__init__(gloo.rank(), gloo.size())
            self.gloo = gloo
            # A plain group over the same Gloo, for what the Gloo object does not bind in Python.
            self.plain = dist.ProcessGroup(gloo.rank(), gloo.size())
            for group in (self, self.plain):
                group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
            self.plain._set_default_backend(dist.ProcessGroup.BackendType.GLOO)

        @staticmethod
        def create(opts, backend_options):
            return LoggingGroup(dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size,
                                                      opts.timeout))

        def getBackendName(self):
            return "logged_gloo"


    def _logged(kind, data):
        """LoggingGroup's method ``kind``, whose argument ``data`` holds the tensors."""
        def call(self, *args, **kwargs):
            tensors = args[data] if data is not None and args else []
            while isinstance(tensors, (list, tuple)) and tensors and isinstance(tensors[0], (list, tuple)):
                tensors = [t for ts in tensors for t in ts]
            tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
            dtype = str(tensors[0].dtype)[6:] if tensors else "-"
            LOG.append(Collective(*WHERE, kind, dtype, sum(t.numel() for t in tensors), self.size()))
            target = self.gloo if hasattr(self.gloo, kind) else self.plain
            return getattr(target, kind)(*args, **kwargs)
        return call


    # Every operation goes straight to Gloo (the argument holding the data: what is logged).
    for _kind, _data in (
            ("allreduce", 0), ("allreduce_coalesced", 0), ("reduce", 0), ("broadcast", 0),
            ("reduce_scatter", 1), ("_reduce_scatter_base", 1), ("reduce_scatter_tensor_coalesced", 1),
            ("reduce_scatter_single", 1), ("reduce_scatter_single_coalesced", 1),
            ("allgather", 1), ("allgather_coalesced", 1), ("_allgather_base", 1),
            ("allgather_into_tensor_coalesced", 1), ("all_gather_single", 1),
            ("all_gather_single_coalesced", 1), ("alltoall_base", 1), ("all_to_all_single", 1),
            ("alltoall", 1), ("gather", 1), ("scatter", 0), ("send", 0), ("recv", 0),
            ("barrier", None)):
        setattr(LoggingGroup, _kind, _logged(_kind, _data))


    # --- main -------------------------------------------------------------------------------


    def main():
        use_torch = "--ddp" in sys.argv and sys.argv[sys.argv.index("--ddp") + 1] == "torch"
        if use_torch:
            ddp_class = torch.nn.parallel.DistributedDataParallel
        else:
            sys.path.insert(0, os.getcwd())  # the candidate imports from here, as python -m
            ddp_class = importlib.import_module(CANDIDATE[0])
            for part in CANDIDATE[1].split("."):
                ddp_class = getattr(ddp_class, part)
        dist.Backend.register_backend("logged_gloo", LoggingGroup.create, extended_api=True,
                                      devices=["cpu"])
        # A peer that failed its check leaves: the others' collectives end within this.
        dist.init_process_group("logged_gloo", timeout=timedelta(seconds=120))
        rank, world = dist.get_rank(), dist.get_world_size()
        assert world == WORLD_SIZE, f"written for {WORLD_SIZE} ranks, run with {world}"
        torch.set_num_threads(1)  # the single-process result then computes as the ranks do
        group, members = dist.group.WORLD, list(range(WORLD_SIZE))
        if GROUPS is not None:  # every rank creates every group (new_group is collective)
            group, members = None, []
            for ranks in GROUPS:
                created = dist.new_group(ranks)
                if rank in ranks:
                    group, members = created, ranks
        if group is None:
            print(f"rank {rank} is in no DDP group: idle", flush=True)
        else:
            want = single_process(members)
            record = Record()
            raised = None
            try:
                train(ddp_class, rank, group, members, want, record)
            except Exception as error:
                if EXPECT_ERROR is None:
                    raise
                raised = f"{type(error).__name__}: {error}"
            if EXPECT_ERROR is not None:
                check_expected_error(rank, raised, len(record.params))
            else:
                check_collectives(rank, want, len(record.params))
                check_replicas(rank, group, members, record, want)
        dist.barrier()
        if rank == 0:
            print(f"PASS: {'torch' if use_torch else 'the candidate'} matches the "
                  "single-process result")
        dist.destroy_process_group()


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
