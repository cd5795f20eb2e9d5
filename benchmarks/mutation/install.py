"""A mutant in a rank: torch's DDP with one mutation, as a DDP-like candidate.

Nothing of torch is patched. When a rank first wraps a model for mutant ``M``:

1. the mutated file is executed (``exec``) into a **module of its own**
   (``_ddp_mutant_<target>``, registered in ``sys.modules`` so that pickling and
   ``torch.save`` of the DDP find its class), with torch's package as its ``__package__``;
2. torch's ``distributed.py`` (the mutated one, or the original when another file is
   mutated) is executed the same way, its imports of the mutated module redirected to the
   module of step 1: the module's ``__builtins__`` has an ``__import__`` that answers
   ``from <mutated module> import ...`` with it. So a mutant of ``join.py`` is the
   ``Join``, ``Joinable`` and ``JoinHook`` that this DDP subclasses and calls (its ``join()``
   and the ``Join.notify_join_context`` of every forward), and a mutant of
   ``optimizer_overlap_hooks.py`` is what ``_register_fused_optim`` and the optimizer in
   backward import;
3. the DDP class handed to the harness subclasses the mutated one only to translate what
   the harness built with torch's own modules: a comm hook of the mutated hook module
   (:func:`translate`: the function of the same name, a closure rebuilt by calling the
   mutated module's factory, e.g. ``fp16_compress_wrapper(allreduce_hook)``, and a state
   object rebuilt by the mutated module's class from its attributes, so that the mutated
   constructor runs, e.g. ``PowerSGDState``), and a buffer-hook location given as torch's
   enum.

The harness's own process never executes a mutant: the candidate (:mod:`.live`) is only
resolved there and in the pool's zygote; the exec happens at the first ``wrap`` in a
rank, and the rank keeps the last mutant it built (one at a time: its modules replace the
previous mutant's in ``sys.modules``). What the mutated code changes in the rank's state is
the hygiene's business as for any candidate. The reference DDP and the oracle never see it.

Where the harness builds a ``Join`` itself (the DDP and a ZeroRedundancyOptimizer), the
mutant's adapter (:mod:`.live`) uses the mutant's ``Join`` class. Not reached: torch's
other modules that import a hook module directly (``torch.distributed.algorithms.
_optimizer_overlap``'s own state classes are torch's, though the hooks it registers are
translated), and ZeroRedundancyOptimizer's own ``Join.notify_join_context`` (torch's class,
reading the configuration the mutant's ``Join`` set).
"""
from __future__ import annotations

import builtins
import importlib
import inspect
import linecache
import sys
import types
from collections.abc import Callable
from typing import Any

from benchmarks.mutation.population import IDENTITY, TARGETS, mutated_source, parse_id

PREFIX = "_ddp_mutant_"


class MutantDoesNotImport(RuntimeError):
    """The mutated module raised while it was executed (an incompetent mutant)."""


def _importer(redirect: dict[str, types.ModuleType]) -> Callable[..., Any]:
    real = builtins.__import__

    def __import__(name: str, globals: Any = None, locals: Any = None,  # noqa: A002
                   fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and fromlist and name in redirect:
            return redirect[name]
        return real(name, globals, locals, fromlist, level)

    return __import__


def _execute(mutant_id: str, key: str, source: str,
             redirect: dict[str, types.ModuleType]) -> types.ModuleType:
    """``source`` of target ``key`` executed into a fresh module registered as
    ``_ddp_mutant_<key>``; its code's file name names the mutant (tracebacks show its lines)."""
    target = TARGETS[key]
    name = PREFIX + key
    module = types.ModuleType(name)
    filename = f"{target.file} <mutant {mutant_id}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module.__dict__.update(__file__=filename, __package__=target.module.rpartition(".")[0],
                           __builtins__={**builtins.__dict__,
                                         "__import__": _importer(redirect)})
    sys.modules[name] = module
    try:
        # dont_inherit: not this module's own `from __future__ import annotations`
        exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)  # noqa: S102
    except Exception as exc:  # noqa: BLE001 - any failure at import: incompetent
        sys.modules.pop(name, None)
        raise MutantDoesNotImport(f"mutant {mutant_id} does not import: "
                                  f"{type(exc).__name__}: {exc}") from exc
    return module


def build(mutant_id: str) -> type:
    """The DDP class of ``mutant_id`` (see the module docstring), built now."""
    key = "distributed" if mutant_id == IDENTITY else parse_id(mutant_id)[0]
    redirect: dict[str, types.ModuleType] = {}
    if key != "distributed":
        redirect[TARGETS[key].module] = _execute(mutant_id, key, mutated_source(mutant_id), {})
    source = mutated_source(mutant_id) if key == "distributed" else \
        TARGETS["distributed"].file.read_text()
    ddp_module = _execute(mutant_id, "distributed", source, redirect)
    return _translating_class(ddp_module, redirect)


def _translating_class(ddp_module: types.ModuleType,
                       mutated: dict[str, types.ModuleType]) -> type:
    base: Any = ddp_module.DistributedDataParallel

    class DistributedDataParallel(base):  # type: ignore[misc, valid-type]
        """torch's DDP with one mutation (a mutant of the mutation score)."""

        def register_comm_hook(self, state: object, hook: Callable[..., Any]) -> None:
            state, hook = translate(state, mutated), translate(hook, mutated)
            super().register_comm_hook(state, hook)

        def _register_buffer_comm_hook(self, state: object, hook: Callable[..., Any],
                                       comm_hook_location: Any = None) -> None:
            if comm_hook_location is None:
                super()._register_buffer_comm_hook(state, hook)
            else:
                location = ddp_module._BufferCommHookLocation[comm_hook_location.name]
                super()._register_buffer_comm_hook(state, hook, location)

    DistributedDataParallel.__module__ = ddp_module.__name__
    DistributedDataParallel.__qualname__ = "DistributedDataParallel"  # pickled by name
    ddp_module.DistributedDataParallel = DistributedDataParallel
    return DistributedDataParallel


def translate(obj: Any, mutated: dict[str, types.ModuleType]) -> Any:
    """``obj`` (a comm hook or its state, built from torch's modules) as the mutated
    module makes it: a function by name, a closure by calling its factory there with the
    closure's (translated) values, an object by moving it to the mutated class. Anything
    else, or anything the mutated module lacks, is returned as is."""
    if not mutated:
        return obj
    if isinstance(obj, types.FunctionType):
        return _translate_function(obj, mutated)
    module = mutated.get(type(obj).__module__)
    new_class = getattr(module, type(obj).__qualname__, None) if module else None
    if isinstance(new_class, type) and new_class is not type(obj):
        rebuilt = _rebuilt(obj, new_class)
        if rebuilt is not None:
            return rebuilt
        try:
            obj.__class__ = new_class
        except TypeError:
            pass
    return obj


def _rebuilt(obj: Any, new_class: type) -> Any:
    """``new_class`` constructed from ``obj``'s attributes of the constructor's parameter
    names (torch's hook states keep their arguments so: ``PowerSGDState``,
    ``PostLocalSGDState``), so that the mutated constructor runs; a parameter ``obj`` lacks
    keeps its default (``random_seed``: the catalog passes torch's default, 0). None when a
    required one is missing. The mutated constructor's own errors propagate (the user's
    registration would raise them)."""
    try:
        params = inspect.signature(new_class).parameters.values()
    except (TypeError, ValueError):
        return None
    kwargs = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if hasattr(obj, p.name):
            kwargs[p.name] = getattr(obj, p.name)
        elif p.default is p.empty:
            return None
    return new_class(**kwargs)


def _translate_function(fn: types.FunctionType,
                        mutated: dict[str, types.ModuleType]) -> Any:
    qualname, module_name = fn.__qualname__, fn.__module__
    if not module_name.startswith("torch."):
        return fn
    if "<locals>" not in qualname:
        module = mutated.get(module_name)
        return getattr(module, qualname, fn) if module else fn
    factory_name = qualname.split(".<locals>")[0]
    home = mutated.get(module_name) or importlib.import_module(module_name)
    factory = getattr(home, factory_name, None)
    cells = dict(zip(fn.__code__.co_freevars,
                     (c.cell_contents for c in fn.__closure__ or ()), strict=False))
    try:
        params = list(inspect.signature(factory).parameters) if factory else None
    except (TypeError, ValueError):
        params = None
    if not params or not set(params) <= set(cells):
        return fn
    values = {p: translate(cells[p], mutated) for p in params}
    if home is not mutated.get(module_name) and all(values[p] is cells[p] for p in params):
        return fn  # nothing in it is mutated
    return factory(**values)  # type: ignore[misc]


_BUILT: dict[str, type] = {}


def ddp_class(mutant_id: str) -> type:
    """The mutant's DDP class in this process: built on first use; building another mutant
    replaces it (a rank runs one mutant at a time)."""
    if mutant_id not in _BUILT:
        _BUILT.clear()
        _BUILT[mutant_id] = build(mutant_id)
    return _BUILT[mutant_id]
