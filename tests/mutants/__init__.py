"""The mutant zoo: defective DDPs, each a correct DDP with ONE defect, named for it.

Almost all subclass the reference DDP (``ddp_reference``, faithful to torch's DDP) and
override the smallest piece (see :mod:`._base`); two wrap torch's own DDP. Each class has
DDP's constructor signature, so it is a candidate as ``tests.mutants.<module>:<Class>``.
``tests/test_mutant_zoo.py`` runs the catalog against every one and requires each to be
caught by at least one scenario; ``benchmarks/mutant_zoo.py`` prints the table.
"""
from __future__ import annotations

import importlib
import inspect

MODULES = ("reduction", "sync", "unused", "join", "hooks", "groups", "subtle", "modern")
#: Realistic defects that no scenario catches with today's checks (each says which check
#: would): kept apart, and tested to stay uncaught until that check exists. None today.
GAP_MODULES: tuple[str, ...] = ()


def zoo() -> dict[str, str]:
    """Every mutant: candidate spec -> its docstring (one sentence: the defect, where real
    DDPs make it)."""
    return _collect(MODULES)


def gap_mutants() -> dict[str, str]:
    """The known gaps: candidate spec -> docstring (the defect and the check that would
    catch it)."""
    return _collect(GAP_MODULES)


def _collect(modules: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in modules:
        module = importlib.import_module(f"{__name__}.{name}")
        for attr, obj in vars(module).items():
            if (inspect.isclass(obj) and obj.__module__ == module.__name__
                    and not attr.startswith("_")):
                out[f"{module.__name__}:{attr}"] = " ".join((inspect.getdoc(obj) or "").split())
    return out
