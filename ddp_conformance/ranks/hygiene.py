"""Every job as if on a fresh rank: what a job changed in the process is put back, or the
rank is retired.

A rank of the pool takes a :class:`Fingerprint` of the process state a candidate can
change once, after its start-up (torch imported, candidates preloaded: a fresh rank is in
exactly that state), and compares after every job (:meth:`Fingerprint.check`):

- **put back** (the rank stays): the default dtype and device, backend and autograd flags
  (``torch.backends.*``, float32 matmul precision, deterministic algorithms, anomaly
  mode, autocast, ...), the intra-op thread count, the global module and optimizer hook
  dicts (``torch.nn.modules.module._global_*``, ``torch.optim.optimizer._global_*``:
  their baseline content is restored, the job's own entries dropped), environment
  variables, the working directory, the collector's switch. Each is state the process
  reads afresh on every use, so restoring the value is the fresh state;
- **retire** (the rank answers, then leaves; the next job runs on a fresh rank): a
  replaced function or method of torch's surface (the modules and classes of
  :data:`NAMESPACES`; code that ran during the job may hold the replacement — a module
  imported then, a closure — so putting the original back is not the fresh state), a
  torch-function or dispatch mode left on the stack (a mode's exit may run code and
  expects its own entry order), a saved-tensors hook left pushed, inference mode left on,
  the inter-op thread count (torch sets it once per process), a Python thread still
  running, resident memory grown by more than :data:`RSS_RETIRE_MIB`.

The harness's own rank machinery is no candidate: a function it installs lazily (the
tracing group's wrapper of ``_new_process_group_helper``) and a thread it starts lazily
(the group reaper, the flight recorder's completion watcher) come from code of
:data:`HARNESS_PACKAGE`; they join the fingerprint when first seen. So do torch's own
lazily installed wrappers (:func:`_torch_wrapper`: dynamo's of ``torch.nn.Module.__init__``)
and the progress-bar monitor thread a first ``torch.compile`` starts
(:func:`_progress_monitors`; retiring a rank for it replaced the rank after every compiled
case, and the next case paid a fresh process's compiler start-up again).
What torch's DDP and the reference leave across the whole catalog is nothing of the above
(measured: no note in a catalog run of both), so the fingerprint changes no correct
candidate's verdict. Its cost is about 0.2 ms per job (median, measured in-process), most
of it comparing the surface's identities.

Processes the job started are ended too (:mod:`ddp_conformance.ranks.orphans`).
"""
from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Iterable
from functools import partial
from types import FunctionType, ModuleType
from typing import Any

import torch

from ddp_conformance.ranks.leaks import Hygiene
from ddp_conformance.ranks.memory import resident_mib
from ddp_conformance.ranks.orphans import descendants, end_descendants

#: Growth of resident memory over the rank's start-up that retires it (memory a job kept
#: cannot be handed back). Torch's DDP and the reference stay far below this over the
#: whole catalog (docs/benchmarks.md: 4 MiB over ten repeats); a candidate that keeps a
#: GiB is reported and replaced.
RSS_RETIRE_MIB = 1024.0

#: Modules whose functions and classes are torch's surface: a replaced one retires the rank.
MODULES = ("torch", "torch.nn.functional", "torch.distributed",
           "torch.distributed.distributed_c10d", "torch.autograd", "torch.autograd.graph",
           "torch.nn.parallel.distributed", "torch.nn.modules.module", "torch.optim.optimizer")
#: Classes whose methods are torch's surface: a replaced or added method retires the rank.
#: (``torch._C.TensorBase`` is an immutable type: nothing to watch there.)
CLASSES = ("torch.Tensor", "torch.nn.Module", "torch.nn.Parameter",
           "torch.nn.parallel.DistributedDataParallel", "torch.optim.Optimizer",
           "torch.autograd.Function", "torch.distributed.ProcessGroup", "torch.futures.Future")
#: Modules whose ``_global_*`` attributes are process-wide hook registries.
HOOK_MODULES = ("torch.nn.modules.module", "torch.optim.optimizer")
NAMESPACES = MODULES + CLASSES
#: The package of the rank machinery, whose own lazily installed patches and threads are
#: part of every rank's state (the built-in candidates live elsewhere and are judged).
HARNESS_PACKAGE = "ddp_conformance.ranks."

_MISSING = object()


def _resolve(path: str) -> Any:
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def _is_code(value: Any) -> bool:
    """A function, class or descriptor (not data a module or class keeps as state)."""
    return callable(value) or hasattr(type(value), "__get__")


def _flags() -> list[tuple[str, Callable[[], Any], Callable[[Any], None]]]:
    """(name, getter, setter) of the process-wide flags put back after a job; those this
    torch lacks are left out."""
    c: Any = torch._C
    pairs: list[tuple[str, str, str]] = [
        ("torch.backends.mkldnn.enabled", "_get_mkldnn_enabled", "_set_mkldnn_enabled"),
        ("torch.backends.mkldnn.deterministic", "_get_mkldnn_deterministic",
         "_set_mkldnn_deterministic"),
        ("torch.backends.nnpack.enabled", "_get_nnpack_enabled", "_set_nnpack_enabled"),
        ("torch.backends.cudnn.enabled", "_get_cudnn_enabled", "_set_cudnn_enabled"),
        ("torch.backends.cudnn.benchmark", "_get_cudnn_benchmark", "_set_cudnn_benchmark"),
        ("torch.backends.cudnn.deterministic", "_get_cudnn_deterministic",
         "_set_cudnn_deterministic"),
        ("torch.backends.cudnn.allow_tf32", "_get_cudnn_allow_tf32", "_set_cudnn_allow_tf32"),
        ("torch.backends.cuda.matmul.allow_tf32", "_get_cublas_allow_tf32",
         "_set_cublas_allow_tf32"),
        ("torch.backends.cpu fp16 reduced-precision reduction",
         "_get_cpu_allow_fp16_reduced_precision_reduction",
         "_set_cpu_allow_fp16_reduced_precision_reduction"),
        ("torch.utils.deterministic.fill_uninitialized_memory",
         "_get_deterministic_fill_uninitialized_memory",
         "_set_deterministic_fill_uninitialized_memory"),
        ("torch.backends.quantized.engine", "_get_qengine", "_set_qengine"),
        ("warn-always", "_get_warnAlways", "_set_warnAlways"),
        ("forward-mode AD", "_is_fwd_grad_enabled", "_set_fwd_grad_enabled"),
        ("autograd multithreading", "_is_multithreading_enabled", "_set_multithreading_enabled"),
        ("the autograd fallback mode", "_get_autograd_fallback_mode",
         "_set_autograd_fallback_mode"),
    ]
    out: list[tuple[str, Callable[[], Any], Callable[[Any], None]]] = [
        (name, getattr(c, get), getattr(c, put)) for name, get, put in pairs
        if hasattr(c, get) and hasattr(c, put)]
    for backend, ops in (("generic", ("all",)), ("mkldnn", ("all", "matmul", "conv", "rnn")),
                         ("cuda", ("all", "matmul", "conv", "rnn"))):
        for op in ops:
            if hasattr(c, "_get_fp32_precision_getter"):
                out.append((f"the fp32 precision of {backend}/{op}",
                            partial(c._get_fp32_precision_getter, backend, op),
                            partial(c._set_fp32_precision_setter, backend, op)))
    out += [
        ("torch.get_float32_matmul_precision()", torch.get_float32_matmul_precision,
         torch.set_float32_matmul_precision),
        ("deterministic algorithms",
         lambda: (torch.are_deterministic_algorithms_enabled(),
                  torch.is_deterministic_algorithms_warn_only_enabled()),
         lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
        ("anomaly detection", lambda: (torch.is_anomaly_enabled(),
                                       torch.is_anomaly_check_nan_enabled()),
         lambda v: torch.set_anomaly_enabled(*v)),
        ("autocast on cpu", lambda: torch.is_autocast_enabled("cpu"),
         lambda v: torch.set_autocast_enabled("cpu", v)),
        ("torch.get_default_dtype()", torch.get_default_dtype, torch.set_default_dtype),
        ("torch.get_num_threads()", torch.get_num_threads, torch.set_num_threads),
        ("the working directory", os.getcwd, os.chdir),
        ("the garbage collector's switch", gc.isenabled,
         lambda v: gc.enable() if v else gc.disable()),
    ]
    return out


def _surface(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(obj).items() if _is_code(v)}


def _ids(base: dict[str, Any], now: Any) -> tuple[int, ...]:
    """The identities of ``now``'s values under ``base``'s keys (of a missing one: None's)."""
    return tuple(map(id, map(now.get, base.keys())))


def _environ_data() -> dict[Any, Any]:
    """A copy of the process environment as ``os.environ`` keeps it (encoded: no decoding
    of every entry, as comparing ``os.environ`` itself does)."""
    return dict(getattr(os.environ, "_data", os.environ))


def _python_threads() -> set[int]:
    return set(sys._current_frames())


def _harness_code(value: Any) -> bool:
    """Whether ``value`` (a function, or a thread's target) is the rank machinery's own."""
    return str(getattr(value, "__module__", "") or "").startswith(HARNESS_PACKAGE)


def _torch_wrapper(value: Any) -> bool:
    """Whether ``value`` is a wrapper torch defines inside one of its own functions and
    installs lazily, once per process, as a fresh rank would too (dynamo's
    ``install_generation_tagging_init`` replaces ``torch.nn.Module.__init__`` and
    ``__setstate__`` with such closures on the first ``torch.compile``). A replacement
    by any other function, torch's public ones included, is a patch."""
    return (isinstance(value, FunctionType) and value.__module__.startswith("torch.")
            and "<locals>" in value.__qualname__)


def _harness_threads() -> set[int]:
    import threading

    return {t.ident for t in threading.enumerate()
            if t.ident is not None and _harness_code(getattr(t, "_target", None))}


def _progress_monitors() -> set[int]:
    """tqdm's monitor thread (:class:`tqdm.std.TMonitor`), which torch starts lazily, once
    per process, as a fresh rank would too: every ``torch.compile`` runs ``torch.fx``'s
    ``Interpreter``, which opens a (disabled) tqdm bar, and tqdm starts its monitor with the
    process's first bar and keeps it. The thread only watches tqdm's bars."""
    import threading

    monitor = getattr(sys.modules.get("tqdm.std"), "TMonitor", None)
    if monitor is None:
        return set()
    return {t.ident for t in threading.enumerate()
            if t.ident is not None and isinstance(t, monitor)}


class Fingerprint:
    """A rank's process state before its first job (see the module docstring)."""

    def __init__(self, exempt_threads: Callable[[], Iterable[int | None]] = lambda: ()) -> None:
        """Take the fingerprint now; ``exempt_threads`` names the harness's own threads
        (started later, and not a candidate's)."""
        self._exempt_threads = exempt_threads
        self._flags = []
        self._flag_values: list[Any] = []
        for name, get, put in _flags():
            try:
                value = get()
            except Exception:  # noqa: BLE001 - a flag this build cannot read: not watched
                continue
            self._flags.append((name, get, put))
            self._flag_values.append(value)
        self._device_context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
        self._device = torch.get_default_device()
        self._modes = (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack())
        self._hooks: dict[tuple[ModuleType, str], Any] = {}
        for path in HOOK_MODULES:
            module = _resolve(path)
            for name, value in vars(module).items():
                if name.startswith("_global_"):
                    self._hooks[(module, name)] = dict(value) if isinstance(value, dict) \
                        else value
        self._namespaces = [(path, _resolve(path)) for path in NAMESPACES]
        self._surfaces = {path: _surface(obj) for path, obj in self._namespaces}
        self._sizes = {path: len(vars(obj)) for path, obj in self._namespaces}
        #: The identities of each surface, in its keys' order (the originals are held in
        #: ``_surfaces``, so no identity can be reused): compared in C, about 0.1 ms for all.
        self._ids = {path: _ids(base, vars(obj)) for path, obj in self._namespaces
                     for base in [self._surfaces[path]]}
        self._environ = dict(os.environ)
        self._environ_data = _environ_data()
        self._interop = torch.get_num_interop_threads()
        self._threads = _python_threads()
        self._rss = resident_mib()
        #: Processes that were already below this one: not a job's to end (a rank has none;
        #: a process that takes a fingerprint of itself, a test's, keeps its own children).
        self._children = frozenset(descendants(os.getpid()))

    def check(self) -> Hygiene:
        """Compare the process with the fingerprint; put back what can be; end the
        processes the job left. Say what was found."""
        restored: list[str] = []
        retired: list[str] = []
        self._check_device(restored, retired)
        self._check_flags(restored)
        self._check_hooks(restored)
        self._check_environ(restored)
        self._check_surface(retired)
        self._check_stacks(retired)
        self._check_threads(retired)
        ended = end_descendants(skip=self._children)
        rss = resident_mib()
        if rss - self._rss > RSS_RETIRE_MIB:
            retired.append(f"resident memory {rss:.0f} MiB ({rss - self._rss:.0f} MiB over "
                           f"the rank's start)")
        return Hygiene(tuple(restored), tuple(retired), tuple(ended))

    def _check_device(self, restored: list[str], retired: list[str]) -> None:
        context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
        if context is self._device_context:
            return
        now = torch.get_default_device()
        try:
            torch.set_default_device(self._device if self._device_context is not None else None)
        except Exception as exc:  # noqa: BLE001 - the mode stack is not as torch left it
            retired.append(f"default device {now} (not put back: {type(exc).__name__})")
            return
        restored.append(f"default device {now}")

    def _check_flags(self, restored: list[str]) -> None:
        for (name, get, put), value in zip(self._flags, self._flag_values, strict=True):
            now = get()
            if now != value:
                put(value)
                restored.append(f"{name} {now!r} (was {value!r})")

    def _check_hooks(self, restored: list[str]) -> None:
        for (module, name), value in self._hooks.items():
            now = vars(module).get(name, _MISSING)
            if isinstance(value, dict) and isinstance(now, dict):
                if now.keys() != value.keys():
                    now.clear()
                    now.update(value)
                    restored.append(f"hooks in {module.__name__}.{name}")
            elif now is not value:
                setattr(module, name, value)
                restored.append(f"{module.__name__}.{name}")

    def _check_environ(self, restored: list[str]) -> None:
        if _environ_data() == self._environ_data:  # microseconds; os.environ == dict: 0.3 ms
            return
        now = os.environ
        changed = sorted({k for k in now.keys() | self._environ.keys()
                          if now.get(k) != self._environ.get(k)})
        for k in changed:
            if k in self._environ:
                os.environ[k] = self._environ[k]
            else:
                del os.environ[k]
        self._environ_data = _environ_data()
        restored.append("environment variables " + ", ".join(changed))

    def _check_surface(self, retired: list[str]) -> None:
        replaced: list[str] = []
        for path, obj in self._namespaces:
            base = self._surfaces[path]
            now = vars(obj)
            names: list[str] = []
            if _ids(base, now) != self._ids[path]:
                names = [k for k, v in base.items() if now.get(k, _MISSING) is not v]
            if isinstance(obj, type) and len(now) != self._sizes[path]:
                names += [k for k in now.keys() - base.keys() if _is_code(now[k])]
                self._sizes[path] = len(now)
            for k in names:
                if _harness_code(now.get(k)) or _torch_wrapper(now.get(k)):
                    base[k] = now[k]  # the harness's or torch's own wrapper, installed lazily
                    self._ids[path] = _ids(base, now)
                else:
                    replaced.append(f"{path}.{k}")
        if replaced:
            retired.append("replaced " + ", ".join(sorted(replaced)[:8])
                           + (f" and {len(replaced) - 8} more" if len(replaced) > 8 else ""))

    def _check_stacks(self, retired: list[str]) -> None:
        from torch.overrides import _get_current_function_mode_stack
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        functions, dispatch = self._modes
        if torch._C._len_torch_function_stack() != functions:
            names = [type(m).__name__ for m in _get_current_function_mode_stack()[functions:]]
            retired.append("torch-function mode(s) left entered: " + ", ".join(names))
        if torch._C._len_torch_dispatch_stack() != dispatch:
            names = [type(m).__name__ for m in _get_current_dispatch_mode_stack()[dispatch:]]
            retired.append("dispatch mode(s) left entered: " + ", ".join(names))
        if torch._C._autograd._top_saved_tensors_default_hooks(True) is not None:
            retired.append("saved-tensors hooks left pushed")
        if torch.is_inference_mode_enabled():
            retired.append("inference mode left on")
        if torch.get_num_interop_threads() != self._interop:
            retired.append(f"torch.get_num_interop_threads() {torch.get_num_interop_threads()}")

    def _check_threads(self, retired: list[str]) -> None:
        import threading

        foreign = _python_threads() - self._threads - set(self._exempt_threads())
        if foreign:
            harness = foreign & (_harness_threads() | _progress_monitors())
            self._threads |= harness  # started lazily by the rank machinery, or torch
            foreign -= harness
        if foreign:
            names = {t.ident: t.name for t in threading.enumerate()}
            retired.append("thread(s) left running: "
                           + ", ".join(names.get(i, f"ident {i}") for i in sorted(foreign)))
