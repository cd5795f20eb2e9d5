"""``ddp-conformance repro``: a standalone script that reproduces a case, for a bug report.

The script needs torch and the candidate's package, nothing of the harness. It runs under
``torchrun --nproc-per-node N`` (Gloo on the CPU) and is made of the harness's own code:

- the modules of :mod:`ddp_conformance.script` (their imports of each other dropped), cut
  by :func:`~ddp_conformance.repro_prune.pruned` to what the case reaches, and, where the
  case's failed checks are known, to their kinds of checks (:func:`carried_checks`): the
  single-process loop the oracle runs (``script/single_process.py``), the
  scenario's tables (``script/case.py``: a :class:`~ddp_conformance.script.case.Case`
  literal, computed by ``catalog/tables.py`` as for the oracle), the trace rules the
  ``trace.*`` checks apply (``script/trace_rules.py``, storage extents included), the
  ranks' training loop (``script/training.py``, as ``ranks/engine.py`` drives a DDP-like
  candidate), the checks (``script/checks.py``, ``script/trace_check.py``), the logged Gloo
  groups with their short deadline (``script/logging_group.py``) and the entry point
  (``script/reproducer.py``);
- the model's code, copied from the module that defines its ``ModelSpec``
  (``spec.build.__module__``): only the definitions its ``ModelSpec(...)`` needs, found by
  following names, into the harness's other modules where it imports from them; its other
  imports become the script's (:func:`model_source`);
- the comm hook, the branch of ``catalog.procedure.make_comm_hook`` copied, and
  ``forced_sync``'s reduction by hand from ``reference/sync_strategy.py``.

What it checks: the rank against the single-process result (initial state, buffers at every
forward of the plan, gradients, parameters and buffers after each step; norm-wise within the
harness's tolerance, bitwise for an exact scenario), the collectives against the trace rules
(``trace.no_sync``, ``trace.dtype``, ``trace.reduced_once``), the replicas against each
other, or the expected error on every rank. The first violation raises ``AssertionError``
with one evidence line; ``--ddp torch`` swaps the candidate for torch's DDP, which passes.
A collective waits at most 30 s (``--timeout S`` or ``$REPRO_TIMEOUT_S``), and a rank that
gives up (or that torchrun ends) says which collective it was in.

What the script cannot write faithfully is refused with a usage error (:func:`refusal`):
a world size the scenario is not defined for, a backend other than Gloo, a model whose
``ModelSpec(...)`` is not in the module that defines its build, torch 2.13's surface beyond
the script's procedure. Left out: the reference DDP (and so the reference checks), the
bucket-layout check and the cross-rank trace-consistency check.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import os
import sys
import textwrap
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from ddp_reference import sync_strategy

from ddp_conformance.catalog import procedure
from ddp_conformance.catalog.models import MODELS
from ddp_conformance.catalog.scenario import Accumulate, Optimizer, Scenario
from ddp_conformance.catalog.tables import scenario_case
from ddp_conformance.errors import UsageError
from ddp_conformance.judge.checks.trace_dtype import hook_wire_dtype
from ddp_conformance.judge.tolerance import RTOL
from ddp_conformance.repro_prune import BARE, WIDTH, defined_names, pruned
from ddp_conformance.script import reproducer
from ddp_conformance.script.case import Case
from ddp_conformance.script.case import procedure as script_procedure
from ddp_conformance.script.single_process import Procedure


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
        ("broadcast_buffers set after construction",
         scenario.broadcast_buffers_off_at is not None),
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
    """The ``ModelSpec("model", ...)`` call (name positional or ``name=``) at the top level
    of ``module``, whatever statement holds it (``register(...)``, an assignment)."""
    found = None
    for node in module.tree.body:
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "ModelSpec" \
                    and _spec_name(call) == model:
                found = call
    return found


def _spec_name(call: ast.Call) -> object:
    if call.args and isinstance(call.args[0], ast.Constant):
        return call.args[0].value
    named = [k.value for k in call.keywords if k.arg == "name"]
    return named[0].value if named and isinstance(named[0], ast.Constant) else None


def registering_module(model: str) -> str | None:
    """The module that defines ``model``'s ``ModelSpec(...)``: the module of its ``build``
    (or of its ``batch``), read from the registry; None for an unknown model or a spec
    built elsewhere."""
    spec = MODELS.get(model)
    if spec is None:
        return None
    for fn in (spec.build, spec.batch):
        name = getattr(fn, "__module__", None)
        if name and _registration(_read_module(name), model) is not None:
            return name
    return None


def model_source(model: str) -> str:
    """The code model ``model`` needs, and ``SPEC``, its ``ModelSpec(...)``.

    The definitions are copied from the module that defines the spec
    (:func:`registering_module`) by following the names the spec uses, into the
    harness's other modules where it imports from them (``ModelSpec`` and ``mse``); what
    it imports from elsewhere (``math``, torch's ``checkpoint``) becomes an import of the
    script. In file order, the modules imported from first; nothing of
    ``ddp_conformance`` is imported."""
    home = registering_module(model)
    if home is None:
        raise UsageError(f"repro: model {model!r} is not registered (or its ModelSpec(...) is not "
                         "in the module that defines its build)")
    registration = _registration(_read_module(home), model)
    assert registration is not None
    needed, imports = _needed(model, home, registration)
    lines = _import_lines(model, imports)
    parts = ["\n".join(lines)] if lines else []
    # The modules imported from first (their definitions are used at import time), the
    # registering module last; each in its file order.
    for module_name in [*(m for m in dict.fromkeys(m for m, _ in needed) if m != home), home]:
        chosen = {id(node) for (m, _), node in needed.items() if m == module_name}
        parts += [_text(_read_module(module_name), node)
                  for node in _read_module(module_name).tree.body if id(node) in chosen]
    parts.append(f"SPEC = {_text(_read_module(home), registration)}")
    return "\n\n\n".join(parts)


def _needed(model: str, home: str, registration: ast.Call
            ) -> tuple[dict[tuple[str, str], ast.stmt], dict[str, tuple[str, str]]]:
    """The definitions ``registration`` needs, followed by name across the harness's
    modules ((module, name) -> statement), and what they import from elsewhere (bound
    name -> (module, its name there or ""))."""
    needed: dict[tuple[str, str], ast.stmt] = {}
    imports: dict[str, tuple[str, str]] = {}
    pending: list[tuple[str, ast.AST]] = [(home, registration)]

    def resolve(module_name: str, name: str) -> None:
        module = _read_module(module_name)
        if name in module.defined:
            if (module_name, name) not in needed and name != "MODELS":
                needed[(module_name, name)] = module.defined[name]
                pending.append((module_name, module.defined[name]))
        elif name in module.imported:
            source, original = module.imported[name]
            if source.split(".")[0] != "ddp_conformance":
                imports[name] = (source, original)
            elif original and original == name:
                resolve(source, original)
            else:
                raise UsageError(f"repro: model {model!r} needs {name!r}, imported as a "
                                 f"module or under another name from {source}")

    while pending:
        module_name, node = pending.pop()
        for name in sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)}):
            resolve(module_name, name)
    clash = [name for name in {n for _, n in needed}
             if len({m for m, n in needed if n == name}) > 1]
    if clash:
        raise UsageError(f"repro: model {model!r} needs {clash[0]!r} from two modules")
    return needed, imports


def _import_lines(model: str, imports: dict[str, tuple[str, str]]) -> list[str]:
    """The import statements of what the model's code imports, less what the script's own
    modules import already (a name they bind to something else: a usage error)."""
    bound = _imported(ast.parse("\n".join(script_modules()[0])))
    lines = []
    for name, (source, original) in imports.items():
        if bound.get(name) == (source, original):
            continue  # the script imports it already
        if name in bound:
            raise UsageError(f"repro: model {model!r} imports {name!r} from {source}, a name "
                             "the script binds to something else")
        if original:
            alias = ast.alias(original, None if original == name else name)
            lines.append(ast.unparse(ast.ImportFrom(source, [alias], 0)))
        else:
            alias = ast.alias(source, None if source == name else name)
            lines.append(ast.unparse(ast.Import([alias])))
    return lines


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


@functools.cache
def script_modules() -> tuple[list[str], str]:
    """The script's own code: the modules of :mod:`ddp_conformance.script` the entry point
    (``script/reproducer.py``) needs, in dependency order, each without its docstring and
    imports; and their imports (of the standard library and torch) as statements."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        for node in _read_module(name).tree.body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(_SCRIPT + "."):
                visit(node.module or "")
        order.append(name)

    visit(reproducer.__name__)
    imports: list[ast.Import | ast.ImportFrom] = []
    bodies = []
    for name in order:
        module = _read_module(name)
        kept = []
        for node in module.tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if not (getattr(node, "module", "") or "").startswith((_SCRIPT, "__future__")):
                    imports.append(node)
            elif not (node is module.tree.body[0] and isinstance(node, ast.Expr)):
                kept.append(_text(module, node))  # the docstring left out
        bodies.append(f"# --- from {_path(name)} ".ljust(90, "-") + "\n\n\n"
                      + "\n\n\n".join(kept))
    return _merged(imports), "\n\n\n".join(bodies)


def _merged(imports: list[ast.Import | ast.ImportFrom]) -> list[str]:
    """``imports`` as statements, each module once (``from m import a`` and ``from m import
    b`` become ``from m import a, b``), plain imports first, each group sorted."""
    plain: dict[str, None] = {}
    froms: dict[str, dict[str, None]] = {}
    for node in imports:
        if isinstance(node, ast.Import):
            plain[ast.unparse(node)] = None
        else:
            names = froms.setdefault(node.module or "", {})
            names.update((ast.unparse(alias), None) for alias in node.names)
    return sorted(plain) + [f"from {module} import {', '.join(sorted(names))}"
                            for module, names in sorted(froms.items())]


_SCRIPT = "ddp_conformance.script"


def reproducer_case(scenario: Scenario, world_size: int) -> Case:
    """The scenario's tables at ``world_size``, with what the checks read of the judge
    (the comm hook's wire dtype, the tolerances, the gradient dtypes)."""
    groups = scenario.groups_for(world_size)
    model = procedure.build_module(scenario, groups[0][0], torch.device("cpu"))
    grad_dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()
                          if p.requires_grad})
    return scenario_case(scenario, world_size, groups, hook_wire_dtype(scenario),
                         {str(k).removeprefix("torch."): v for k, v in RTOL.items()}, grad_dtypes)


def write_script(scenario: Scenario, candidate: str, world_size: int,
                 failed: Collection[str] | None = None) -> str:
    """The reproducer's source for ``scenario`` with ``candidate`` (``module:attr``, a
    DDP-like callable, or ``torch``) at ``world_size`` ranks: the code the case reaches
    (:func:`~ddp_conformance.repro_prune.pruned`); with ``failed``, the ids of the checks
    the case failed, without the kinds of checks none of them is (:func:`carried_checks`)."""
    why = refusal(scenario, world_size)
    if why:
        raise UsageError(why)
    if ":" in candidate:
        module_name, attr = candidate.split(":", 1)
    elif candidate == "torch":
        module_name, attr = "torch.nn.parallel", "DistributedDataParallel"
    else:
        raise UsageError(f"repro: the candidate must be module:attr (a DDP-like callable) "
                         f"or torch, got {candidate!r}")
    case = carried_checks(reproducer_case(scenario, world_size), failed)
    imports, body = script_modules()
    hook = case.comm_hook
    hook_imports = ("from torch.distributed.algorithms.ddp_comm_hooks import (\n"
                    "    debugging_hooks, default_hooks, post_localSGD_hook, powerSGD_hook)\n"
                    if hook else "")
    by_hand = case.sync_strategy == "forced_sync"
    name = f"repro_{scenario.id.replace('/', '_').replace('-', '_')}.py"
    parts = [_HEADER.format(id=scenario.id, candidate=candidate, ws=world_size, name=name),
             "from __future__ import annotations\n\n" + "\n".join(imports) + "\n" + hook_imports,
             f"# --- the model, from {_path(registering_module(scenario.model))} ".ljust(90, "-"),
             model_source(scenario.model),
             "# --- the comm hook, from ddp_conformance/catalog/procedure.py ".ljust(90, "-"),
             comm_hook_source(hook) if hook else "",
             "# --- forced_sync's reduction, from reference/sync_strategy.py ".ljust(90, "-"),
             inspect.getsource(sync_strategy.forced_sync_gradients).strip(), body,
             "# --- the case " + "-" * 76,
             f"CANDIDATE = {(module_name, attr)!r}  # module, attribute",
             f"CASE = {case_literal(case)}",  # pruned() writes the fields read
             'if __name__ == "__main__":\n'
             f"    run(CASE, SPEC, CANDIDATE, {'comm_hook' if hook else 'None'}, "
             f"{'forced_sync_gradients' if by_hand else 'None'})\n"]
    twice = _defined_twice(parts)
    if twice:
        raise UsageError(f"repro: the code of model {scenario.model!r} defines {twice[0]!r}, "
                         "which the script defines too")
    return pruned(parts, known_values(scenario, case), lambda read: case_literal(case, read))


#: The kinds of checks a reproducer leaves out when none of the case's failed checks is
#: one of them: the ``Case`` flag, the check ids' prefix.
CHECK_KINDS = {"init_checks": "init.", "buffer_checks": "oracle.buffer",
               "trace_checks": "trace.", "replica_checks": "replica."}
#: The checks a reproducer makes (the others, of the reference DDP, the bucket layout and
#: the cross-rank trace, it cannot), by their ids' prefixes.
SCRIPT_CHECKS = ("oracle.", "init.", "replica.", "trace.no_sync", "trace.dtype",
                 "trace.reduced_once", "expected_error")


def carried_checks(case: Case, failed: Collection[str] | None) -> Case:
    """``case`` without the kinds of checks (:data:`CHECK_KINDS`) none of ``failed`` is:
    all of them where ``failed`` is unknown (None) or holds only checks the script does
    not make; none where it is empty (a crash, a hang: the run itself reproduces it, and
    the single-process result is left out too)."""
    if failed is None or failed and not any(c.startswith(SCRIPT_CHECKS) for c in failed):
        return case
    flags: dict[str, Any] = {flag: any(c.startswith(prefix) for c in failed)
                             for flag, prefix in CHECK_KINDS.items()}
    # The volume rule (storage extents) for trace.reduced_once, or for trace.dtype's
    # per-dtype volume of a model with several gradient dtypes.
    flags["oracle_checks"] = bool(failed)  # a crash or a hang: the run alone
    flags["trace_volume"] = case.trace_volume and (
        "trace.reduced_once" in failed or "trace.dtype" in failed and len(case.grad_dtypes) > 1)
    return dataclasses.replace(case, **flags)


def known_values(scenario: Scenario, case: Case) -> dict[str, dict[str, Any]]:
    """What the script's tests read that the case fixes, by the name they read it through:
    the case's fields and ``evals``, the single-process procedure's (and ``evals``), the
    model's step hooks, the tracer's ``memory``; as bare names, the optimizer's name and
    :func:`model_facts` (for :func:`~ddp_conformance.repro_prune.pruned`)."""
    spec = MODELS[scenario.model]
    proc = script_procedure(case, spec, scenario.groups_for(case.world_size)[0])
    return {"case": {**{f.name: getattr(case, f.name) for f in dataclasses.fields(case)},
                     "evals": case.evals},
            "proc": {**{f.name: getattr(proc, f.name) for f in dataclasses.fields(proc)},
                     "evals": proc.evals},
            "spec": {"before_step": spec.before_step, "after_step": spec.after_step},
            "TRACE": {"memory": case.trace_checks and case.trace_volume},
            BARE: {"optimizer_name": case.optimizer,
                   **model_facts(proc, scenario.groups_for(case.world_size)[0][0])}}


def model_facts(proc: Procedure, rank: int) -> dict[str, bool]:
    """What the single process's code computes of the model as ``rank`` builds it:
    whether it has buffers, a sparse embedding (torch's RNG left as it was)."""
    with torch.random.fork_rng(devices=[]):
        model = proc.build(rank)
    return {"model_has_buffers": any(True for _ in model.buffers()),
            "model_has_sparse": any(isinstance(m, torch.nn.Embedding) and m.sparse
                                    for m in model.modules())}


def case_literal(case: Case, read: Collection[str] | None = None) -> str:
    """``Case(...)`` with the fields that differ from their defaults (of ``read`` only,
    when given), as many to a line as fit in :data:`~ddp_conformance.repro_prune.WIDTH`
    characters (a long dict or list packed
    into lines: :func:`packed`)."""
    changed = [f"{f.name}={packed(getattr(case, f.name), len(f.name) + 5)}"
               for f in dataclasses.fields(case)
               if getattr(case, f.name) != _default(f) and (read is None or f.name in read)]
    lines = [""]
    for field_ in changed:
        if lines[-1] and ("\n" in field_ or "\n" in lines[-1]
                          or 4 + len(lines[-1]) + len(field_) + 2 > WIDTH):
            lines.append("")
        lines[-1] += (" " if lines[-1] else "") + field_ + ","
    return "Case(\n" + "".join(f"    {line}\n" for line in lines if line) + ")"


def packed(value: Any, indent: int, width: int = WIDTH) -> str:
    """``repr(value)``; a dict or list longer than the line, its items as many to a line
    as fit (each continuation line indented by ``indent``)."""
    text = repr(value)
    if indent + len(text) <= width or not isinstance(value, (dict, list)) or not value:
        return text
    items = [f"{k!r}: {v!r}" for k, v in value.items()] if isinstance(value, dict) \
        else [repr(v) for v in value]
    lines = [""]
    for item in items:
        if lines[-1] and indent + len(lines[-1]) + len(item) + 2 > width:
            lines.append("")
        lines[-1] += (", " if lines[-1] else "") + item
    opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
    return opening + (",\n" + " " * (indent + 1)).join(lines) + closing


def _default(f: dataclasses.Field[Any]) -> Any:
    """A field's default (a sentinel no value equals where it has none)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return object()


def _path(module: str | None) -> str:
    """``ddp_conformance/catalog/models.py`` for its module's name (a package's
    ``__init__.py``)."""
    if module is None:
        return "?"
    path = (module or "?").replace(".", "/")
    found = sys.modules.get(module)
    is_package = found is not None and hasattr(found, "__path__")
    return path + ("/__init__.py" if is_package else ".py")


def _defined_twice(source: str | Sequence[str]) -> list[str]:
    """Top-level names two statements of ``source`` (a script, or its parts) define (a
    def, class or assignment silently replacing another: a model's code against the
    script's own)."""
    seen: dict[str, int] = {}
    for name in defined_names(source):
        seen[name] = seen.get(name, 0) + 1
    return sorted(name for name, count in seen.items() if count > 1)


def write_file(script: str, scenario: Scenario, directory: str) -> str:
    """Write ``script`` under ``directory``; return its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"repro_{scenario.id.replace('/', '_').replace('-', '_')}.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(script)
    return path


_HEADER = '''"""Reproducer of ddp-conformance case {id}[{candidate}], {ws} ranks; torch and the
candidate's package only. ddp-conformance's code (ddp_conformance/script/, the model's, the comm
hook's) cut to what the case runs and the kinds of checks it failed, written by `ddp-conformance
repro {id} --candidate {candidate} --world-size {ws}`. From the directory the candidate imports from:
    torchrun --standalone --nproc-per-node {ws} {name}              # the candidate: fails
    torchrun --standalone --nproc-per-node {ws} {name} --ddp torch  # torch's DDP: passes
A collective waits at most 30 s (--timeout S, REPRO_TIMEOUT_S=S); a rank that gives up names it.
"""'''



def failed_checks(report_dir: str, scenario: str, candidate: str) -> list[str] | None:
    """The checks ``scenario`` failed with ``candidate`` in the run whose ``results.jsonl``
    is in ``report_dir`` (None: no such run or result)."""
    from ddp_conformance.report.load import RESULTS_FILE, load_results

    if not os.path.exists(os.path.join(report_dir, RESULTS_FILE)):
        return None
    try:
        results = load_results(report_dir).results
    except (OSError, ValueError):
        return None
    found = [r for r in results if r.scenario == scenario and r.candidate == candidate]
    return [f.check for f in found[-1].failures] if found else None


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
