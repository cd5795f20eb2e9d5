"""A scenario's DDP options as data, and as the objects torch's constructor takes.

Scenarios stay plain, picklable data: an option whose torch value is an object is written
as names, and :func:`materialize` builds the object on the rank, right before the
candidate is constructed:

- ``mixed_precision``: ``{"param_dtype": "float16", "reduce_dtype": ..., "buffer_dtype":
  ...}`` becomes torch's ``_MixedPrecision`` (dtype names as in ``torch.<name>``);
- ``delay_all_reduce_named_params``: parameter names become ``[(name, parameter)]``;
- ``param_to_hook_all_reduce``: a parameter name becomes the parameter;
- ``device_mesh``: ``True`` becomes a 1-D ``DeviceMesh`` over the DDP group (torch then
  takes the group from the mesh; the candidate is given no ``process_group``).

Every other option is passed as written.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn


def materialize(options: dict[str, Any], module: nn.Module, process_group: Any,
                device: torch.device) -> dict[str, Any]:
    """The keyword arguments for the candidate's constructor (see the module docstring)."""
    out = dict(options)
    params = dict(module.named_parameters())
    if "mixed_precision" in out:
        from torch.nn.parallel.distributed import _MixedPrecision

        out["mixed_precision"] = _MixedPrecision(
            **{k: getattr(torch, v) for k, v in out["mixed_precision"].items()})
    if "delay_all_reduce_named_params" in out:
        out["delay_all_reduce_named_params"] = [
            (name, params[name]) for name in out["delay_all_reduce_named_params"]]
    if "param_to_hook_all_reduce" in out:
        out["param_to_hook_all_reduce"] = params[out["param_to_hook_all_reduce"]]
    if out.get("device_mesh"):
        from torch.distributed.device_mesh import DeviceMesh

        out["device_mesh"] = DeviceMesh.from_group(process_group, device.type)
    elif "device_mesh" in out:
        del out["device_mesh"]
    return out
