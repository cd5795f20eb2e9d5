"""Whether a candidate that takes a DDP option only through ``**kwargs`` hands it on.

A subclass of torch's ``DistributedDataParallel`` whose own constructors take ``**kwargs``
and never name the option (neither as a parameter nor in their source, as a
``kwargs.pop("bucket_cap_mb")`` would) passes it on to torch's constructor untouched: the
option reaches the DDP, and a note that it "was taken only through ``**kwargs``" would be
noise. Anything else (a function, a class written from scratch, a constructor that names
the option) may have swallowed it.
"""
from __future__ import annotations

import inspect
import sys
from typing import Any

from torch.nn.parallel import DistributedDataParallel


def spec_object(spec: str) -> Any:
    """The object ``package.module:attr`` names, from the modules already imported (None
    for a built-in name or a module not imported)."""
    module_name, sep, attr = spec.partition(":")
    obj: Any = sys.modules.get(module_name) if sep else None
    for part in attr.split(".") if obj is not None else ():
        obj = getattr(obj, part, None)
    return obj


def passes_on(spec: str, option: str) -> bool:
    """Whether the candidate ``spec`` hands ``option`` on to torch's DDP (see the module
    docstring)."""
    cls = spec_object(spec)
    if not (inspect.isclass(cls) and issubclass(cls, DistributedDataParallel)):
        return False
    for klass in cls.__mro__:
        if klass is DistributedDataParallel:
            return True
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            source = inspect.getsource(init)
        except (OSError, TypeError):
            return False
        if option in source or "**" not in source:
            return False
    return False
