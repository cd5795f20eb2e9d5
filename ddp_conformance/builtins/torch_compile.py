"""torch's ``DistributedDataParallel`` under ``torch.compile``: four built-in candidates.

``torch-compile`` (``aot_eager``) and ``torch-compile-inductor`` (``inductor``, which
generates and compiles C++ here) are what torch's documentation tells a user to write:
``ddp = DistributedDataParallel(model, process_group=..., **options)``, then
``compiled = torch.compile(ddp, backend=...)``, forward through ``compiled``,
``loss.backward()``, ``opt.step()``, with the **DDP optimizer** on
(``torch._dynamo.config.optimize_ddp = "ddp_optimizer"``, i.e. ``True``, the default):
dynamo compiles the model inside DDP's forward and splits the captured graph at DDP's
bucket boundaries, so that each bucket's all-reduce, issued by the C++ reducer from its
autograd hooks, can start while the rest of backward runs. DDP's own forward (the
reducer's ``prepare_for_forward``, the buffer broadcast, Join's notification) stays eager;
``no_sync``, Join and ``register_comm_hook`` are the DDP object's, as without compile.

Two adjustments, each a workaround of a torch 2.13 defect shown by a standalone script:

- The model is handed to DDP inside a one-line user-level module (:class:`CompileRoot`,
  ``forward`` calls the model). Without it, a model whose top module is a ``torch.nn``
  class (``nn.Sequential``, a bare ``nn.Linear``: the catalog's MLP) is not compiled at
  all: dynamo breaks the graph inside DDP's forward and skips the ``torch.nn`` frame that
  follows, so everything runs eagerly, silently (pytorch/pytorch#140416;
  ``tests/standalone/compile_ddp_sequential.py``). Parameters, their order, buffers and
  gradients are the model's own; only DDP's parameter names gain a prefix.
- The Python process group the harness traces collectives with is never traced by dynamo
  (:func:`skip_python_process_group`): DDP's reducer calls it from C++ inside the compiled
  call and dynamo hard-errors on it (``tests/standalone/compile_python_backend.py``).

``torch-compile-split`` is ``torch-compile`` with the DDP optimizer given DDP's first-bucket
cap: dynamo builds its ``DDPOptimizer`` with the 1 MiB default first bucket whatever
``bucket_cap_mb`` says, and asserts when the cap is smaller
(``tests/standalone/compile_ddp_small_bucket_cap.py``); every catalog model is under 1 MiB,
so without this the graph is never split. While it compiles,
``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` is lowered to the DDP's bucket cap (what
eager DDP does with its first bucket when ``bucket_cap_mb`` is given), and the small-cap
scenarios compile into one graph per bucket: the DDP optimizer's split is what they test.

``torch-compile-ca`` is torch's compiled-autograd route: DDP built in
``optimize_ddp = "python_reducer"`` mode (the C++ reducer off; every parameter gets a
post-accumulate-grad hook that divides its gradient by the group size and all-reduces it
with functional collectives), the forward compiled with ``aot_eager`` (dynamo traces DDP's
forward whole in this mode), and ``loss.backward()`` run under compiled autograd
(``torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager"))``, what
``torch._dynamo.config.compiled_autograd = True`` turns on inside a compiled training
step), so the hooks and their collectives are traced into the backward graph. Compiled
autograd refuses the C++ reducer ("Compiled autograd is not compatible with C++ DDP
Reducer"), so this is the DDP it runs. As for ``torch-python-reducer`` (the same reducer,
eager) there is, by construction of torch's code, no buffer broadcast in forward, no
unused-parameter search, no Join, and comm hooks are per parameter, not per
``GradBucket``: what scenarios can say of that is N/A.

Every wrap starts from a clean compiler (``torch._dynamo.reset()``: each scenario builds a
fresh model, and a graph compiled for another DDP would keep that DDP's bucket split).
The compiler settings are set only while the candidate runs (patched around each forward
and backward), so nothing leaks into a later scenario of another candidate in the same rank
process: the DDP optimization mode; a recompile limit high enough that a model whose
forward takes Python flags, or is traced again for a new batch shape, is never silently
left to run eagerly (dynamo's default limit of 8 does that); inductor's eager-compatible
random numbers (``fallback_random``: dropout draws the masks the oracle draws) and one
compile thread (no compile subprocesses inside a rank); whether dynamo traces into
``torch.nn.parallel.distributed`` (python-reducer DDP adds it to dynamo's inline list for
the whole process when built: undone after construction, applied around this candidate's
own calls). The first forward checks that dynamo compiled a graph, and for
``torch-compile-ca`` the first backward that compiled autograd captured one, so a run
that quietly fell back to eager is an error, not a pass.

What a case costs is compiling the fresh model once (about 1 to 3 s a case here, 25 to 90 s
for the 204-tensor model), not the harness: its buffers-at-forward hook, which dynamo traces
into the model's graph, appends to a list that is empty at every forward (a growing list
made every forward of a step a recompilation,
:mod:`ddp_conformance.ranks.forward_buffers`), and the monitor thread tqdm starts under
``torch.fx`` at the first compile no longer retires the rank (a fresh rank per case paid
the compiler's start-up every time, :mod:`ddp_conformance.ranks.hygiene`). Neither
changes a setting of the candidate. What was weighed and kept: dynamo's default automatic
dynamic shapes (a second batch shape recompiles, symbolic; ``dynamic=False`` is not what
the documentation has a user write, and such recompiles are a few per catalog), the reset
per wrap (a graph kept from another DDP keeps its bucket split), and the backends' own
caches as torch configures them (inductor's FX graph and AOTAutograd caches are on by
default and shared by the ranks; ``aot_eager`` has none).
"""
from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from ddp_conformance.builtins._common import OptionPolicy, expectations_file, honoured, static_capabilities
from ddp_conformance.contract.adapter import Adapter
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.capability import Capability
from ddp_conformance.contract.ddp_like import DDPLikeAdapter
from ddp_conformance.contract.refusal import CannotJudge

#: The module python-reducer DDP asks dynamo to trace into (``LEGACY_MOD_INLINELIST``).
DDP_MODULE = "torch.nn.parallel.distributed"
#: Recompiles allowed per code object while the candidate runs (dynamo's default is 8,
#: after which it runs the frame eagerly without saying so in the result).
RECOMPILE_LIMIT = 64
#: Where dynamo breaks DDP's own forward (not the model's doing), in its explanations.
DDP_BREAKS = ("Generators cannot be compiled", "_inside_ddp_forward", "set_runtime_stats_and_log")

#: The C++ reducer under the DDP optimizer: every DDP option, no_sync, Join, comm hooks.
REDUCER_POLICY: OptionPolicy = {o: None for o in (
    "broadcast_buffers", "bucket_cap_mb", "find_unused_parameters", "gradient_as_bucket_view",
    "static_graph", "init_sync")}
REDUCER_FEATURES = (Capability.NO_SYNC, Capability.SYNC_STRATEGY, Capability.JOIN,
                    Capability.COMM_HOOK)
#: The Python reducer (compiled autograd): what ``torch-python-reducer`` honours.
PYTHON_REDUCER_POLICY: OptionPolicy = {
    "broadcast_buffers": lambda v: not v,
    "find_unused_parameters": lambda v: not v,
    "bucket_cap_mb": None, "gradient_as_bucket_view": None, "static_graph": None,
    "init_sync": None,
}
PYTHON_REDUCER_FEATURES = (Capability.NO_SYNC, Capability.SYNC_STRATEGY)


@dataclass(frozen=True)
class Variant:
    """One built-in candidate: a compile backend and a DDP optimization mode."""

    name: str
    backend: str
    #: ``optimize_ddp`` while compiling: ``"ddp_optimizer"`` or ``"python_reducer"``.
    optimize_ddp: str
    description: str
    #: Give the DDP optimizer DDP's bucket cap as its first bucket (``torch-compile-split``).
    first_bucket_from_ddp: bool = False

    @property
    def compiled_autograd(self) -> bool:
        return self.optimize_ddp == "python_reducer"

    @property
    def policy(self) -> OptionPolicy:
        return PYTHON_REDUCER_POLICY if self.compiled_autograd else REDUCER_POLICY

    @property
    def features(self) -> tuple[Capability, ...]:
        return PYTHON_REDUCER_FEATURES if self.compiled_autograd else REDUCER_FEATURES


VARIANTS = {v.name: v for v in (
    Variant("torch-compile", "aot_eager", "ddp_optimizer",
            "torch.compile(DistributedDataParallel(...), backend='aot_eager') with the DDP "
            "optimizer (C++ reducer)"),
    Variant("torch-compile-split", "aot_eager", "ddp_optimizer",
            "torch-compile with the DDP optimizer's first bucket set to DDP's bucket cap, so "
            "small caps split the graph per bucket", first_bucket_from_ddp=True),
    Variant("torch-compile-inductor", "inductor", "ddp_optimizer",
            "torch.compile(DistributedDataParallel(...), backend='inductor') with the DDP "
            "optimizer (generated C++, C++ reducer)"),
    Variant("torch-compile-ca", "aot_eager", "python_reducer",
            "torch.compile(DistributedDataParallel(...)) in optimize_ddp='python_reducer' mode, "
            "backward under compiled autograd (per-parameter all-reduces traced, aot_eager)"),
)}


class CompileRoot(nn.Module):
    """The model under a user-level ``forward``, so that dynamo compiles it inside DDP's
    forward even when its own class is a ``torch.nn`` one (pytorch/pytorch#140416)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.model(*inputs, **kwargs)


@contextlib.contextmanager
def ddp_traced(traced: bool) -> Iterator[None]:
    """While inside, dynamo traces into ``torch.nn.parallel.distributed`` iff ``traced``."""
    from torch._dynamo import trace_rules

    names: set[str] = trace_rules.LEGACY_MOD_INLINELIST
    if (DDP_MODULE in names) == traced:
        yield
        return
    (names.add if traced else names.discard)(DDP_MODULE)
    trace_rules.get_legacy_mod_inlinelist.cache_clear()
    try:
        yield
    finally:
        (names.discard if traced else names.add)(DDP_MODULE)
        trace_rules.get_legacy_mod_inlinelist.cache_clear()


@contextlib.contextmanager
def first_bucket_bytes(value: int | None) -> Iterator[None]:
    """While inside, ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` is ``value`` (if given)."""
    import torch.distributed as dist

    if value is None:
        yield
        return
    saved = dist._DEFAULT_FIRST_BUCKET_BYTES
    dist._DEFAULT_FIRST_BUCKET_BYTES = value
    try:
        yield
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = saved


@contextlib.contextmanager
def compiler_settings(variant: Variant, bucket_cap_mb: float | None = None,
                      first_bucket: int | None = None) -> Iterator[None]:
    """The dynamo and inductor settings ``variant`` runs under, restored on exit."""
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    dynamo: dict[str, Any] = {"optimize_ddp": variant.optimize_ddp}
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, limit):
            dynamo[limit] = max(RECOMPILE_LIMIT, getattr(dynamo_config, limit))
            break
    inductor: dict[str, Any] = {"compile_threads": 1}
    if variant.backend == "inductor":
        # Random ops (dropout) draw from eager's generator, as the oracle and the reference
        # do: inductor's own RNG gives other masks, a difference that is not DDP's.
        inductor["fallback_random"] = True
    if variant.compiled_autograd:
        # What python-reducer DDP's constructor sets for inductor (bucketed all-reduces).
        inductor["_fuse_ddp_communication"] = True
        inductor["_fuse_ddp_bucket_size"] = 25 if bucket_cap_mb is None else bucket_cap_mb
    with dynamo_config.patch(dynamo), inductor_config.patch(inductor), \
            ddp_traced(variant.compiled_autograd), first_bucket_bytes(first_bucket):
        yield


def skip_python_process_group(group: Any) -> None:
    """Tell dynamo never to trace the Python code of ``group``'s class, nor what it calls.

    A process group written in Python (the harness's collective tracing, a custom c10d
    backend) is called from C++ inside the compiled call (DDP's reducer broadcasts its
    rebuilt buckets and the buffers from its eager ``_pre_forward``); dynamo then compiles
    that frame and raises a hard error on the group object (torch 2.13; see
    ``tests/standalone/compile_python_backend.py``). On a C++ group this does nothing.
    """
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    skip = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
    for cls in type(group).__mro__:
        if cls.__module__.split(".")[0] in ("torch", "builtins", "pybind11_builtins"):
            continue
        for value in vars(cls).values():
            function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            code = getattr(function, "__code__", None)
            if isinstance(code, types.CodeType):
                set_code_exec_strategy(code, skip)


def _count(kind: str, key: str) -> int:
    from torch._dynamo.utils import counters

    return int(counters[kind][key])


def _fallbacks() -> dict[str, int]:
    """Why dynamo broke graphs or gave up on frames so far: its counters' messages, counted."""
    from torch._dynamo.utils import counters

    return {**counters["unimplemented"], **counters["graph_break"]}


def _why(reasons: set[str]) -> str:
    """The explanations of ``reasons`` that concern the model (not DDP's own generators)."""
    lines: dict[str, None] = {}
    for reason in sorted(reasons):
        explanation = next((line.strip().removeprefix("Explanation: ")
                            for line in reason.splitlines() if "Explanation:" in line), "")
        if explanation and not any(ddp in explanation for ddp in DDP_BREAKS):
            lines[explanation] = None
    return "; ".join(lines)


class CompiledDDPAdapter(DDPLikeAdapter):
    """torch's DDP compiled with ``torch.compile``; ``no_sync``, Join and comm hooks go to
    the DDP object, gradients and parameters are the real module's."""

    def __init__(self, variant: Variant, module: nn.Module, process_group: Any,
                 device: torch.device, **ddp_options: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel

        torch._dynamo.reset()
        self.variant = variant
        self._cap: float | None = ddp_options.get("bucket_cap_mb")
        kwargs: dict[str, Any] = dict(ddp_options, process_group=process_group)
        if device.type == "cuda":
            kwargs["device_ids"] = [device]
        # Python-reducer DDP traces DDP's forward whole and compiles any model; the DDP
        # optimizer route needs a user-level root (CompileRoot).
        root = module if variant.compiled_autograd else CompileRoot(module)
        # Python-reducer DDP's constructor adds DDP_MODULE to dynamo's inline list and sets
        # inductor flags, for the whole process: ddp_traced and inductor's patch undo that.
        with compiler_settings(variant, self._cap), ddp_traced(variant.compiled_autograd):
            ddp = DistributedDataParallel(root, **kwargs)
        if variant.compiled_autograd and not getattr(ddp, "_use_python_reducer", False):
            raise RuntimeError(f"torch {torch.__version__} did not switch DDP to its Python reducer")
        self._first_bucket: int | None = None
        if variant.first_bucket_from_ddp:
            import torch.distributed as dist

            self._first_bucket = min(dist._DEFAULT_FIRST_BUCKET_BYTES, int(ddp.bucket_bytes_cap))
        self._groups = [ddp.process_group]
        super().__init__(ddp, module, frozenset())
        # torch.compile of a module returns an OptimizedModule (typed as a callable).
        self.wrapped = cast(nn.Module, torch.compile(ddp, backend=variant.backend))
        self.capabilities = honoured(variant.policy, ddp_options, *variant.features)
        self._forwards = 0
        self._backwards = 0
        self._ca_compiler: Any = torch.compile(backend=variant.backend) \
            if variant.compiled_autograd else None

    @contextlib.contextmanager
    def _settings(self) -> Iterator[None]:
        for group in self._groups:
            skip_python_process_group(group)
        with compiler_settings(self.variant, self._cap, self._first_bucket):
            yield

    def forward(self, *inputs: Any) -> Any:
        first = self._forwards == 0
        before, known = _count("stats", "unique_graphs"), _fallbacks()
        with self._settings():
            out = self.wrapped(*inputs)
        self._forwards += 1
        if first and _count("stats", "unique_graphs") == before:
            why = _why({m for m, n in _fallbacks().items() if n > known.get(m, 0)})
            raise CannotJudge(f"{self.variant.name}: dynamo compiled no graph in the first "
                               f"forward, the model ran eagerly ({why or 'no reason given'})")
        return out

    def backward(self, loss: Tensor) -> None:
        if not self.variant.compiled_autograd:
            with self._settings():
                loss.backward()
            return
        from torch._dynamo import compiled_autograd

        first = self._backwards == 0
        before = _count("compiled_autograd", "captures")
        with self._settings(), compiled_autograd._enable(self._ca_compiler):
            loss.backward()
        self._backwards += 1
        if first and _count("compiled_autograd", "captures") == before:
            raise RuntimeError(f"{self.variant.name}: compiled autograd captured no graph in "
                               "the first backward")


def _candidate(variant: Variant) -> Candidate:
    def wrap(module: nn.Module, process_group: Any, device: torch.device,
             **ddp_options: Any) -> Adapter:
        return CompiledDDPAdapter(variant, module, process_group, device, **ddp_options)

    return Candidate(
        name=variant.name, wrap=wrap,
        capabilities=static_capabilities(variant.policy, *variant.features),
        version=torch.__version__, description=variant.description,
        expectations=expectations_file(variant.name))


def torch_compile() -> Candidate:
    return _candidate(VARIANTS["torch-compile"])


def torch_compile_split() -> Candidate:
    return _candidate(VARIANTS["torch-compile-split"])


def torch_compile_inductor() -> Candidate:
    return _candidate(VARIANTS["torch-compile-inductor"])


def torch_compile_ca() -> Candidate:
    return _candidate(VARIANTS["torch-compile-ca"])
