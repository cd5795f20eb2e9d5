"""Every catalog scenario's data is valid at every world size it accepts, up to 16.

A scenario's batches are a function of the rank and the group's size (``ModelSpec.batch``),
so data written with 2 to 4 ranks in mind can break beyond (``models/embedding`` indexed
``2 * rank + randint(0, 12)`` into 20 rows: out of range from rank 5 on, an ERROR of
torch's own DDP). This builds, in this process and without DDP, every rank's model and
every batch of every forward of every step at world sizes 5 to 16 (the tables the oracle
and a reproducer read: ``catalog/tables.py``), and demands of each:

- every index fed to an ``nn.Embedding`` lies in ``[0, num_embeddings)``;
- the rank's forward runs (the shapes fit) and every floating input and output is finite
  unless the scenario feeds non-finite values on purpose (its model's name says so:
  inf, nan, non_finite).
"""
from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.catalog.models import get_model
from ddp_conformance.catalog.models.synthetic import fp16_base
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.catalog.tables import scenario_case
from ddp_conformance.script import case as script_case

#: The world sizes checked: beyond the 2-4 the catalog was written for, up to the largest
#: one machine runs (issue 23: 16).
WORLD_SIZES = (5, 8, 16)


def _embedding_ranges(model: nn.Module) -> list[str]:
    """Hooks on every ``nn.Embedding`` that record an index outside its table."""
    bad: list[str] = []

    def hook(module: nn.Module, args: tuple[Any, ...], name: str) -> None:
        idx = args[0]
        assert isinstance(module, nn.Embedding)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= module.num_embeddings):
            bad.append(f"{name}: indices {int(idx.min())}..{int(idx.max())} into "
                       f"{module.num_embeddings} rows")

    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            module.register_forward_pre_hook(lambda m, a, n=name: hook(m, a, n))
    return bad


def _tensors(value: Any) -> list[Tensor]:
    """The tensors of an input or output (nested tuples, lists, dicts, dataclasses)."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    elif hasattr(value, "__dataclass_fields__"):
        value = [getattr(value, f) for f in value.__dataclass_fields__]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _non_finite(values: list[Tensor]) -> bool:
    return any((t.is_floating_point() or t.is_complex()) and not torch.isfinite(t).all()
               for t in values)


def _problems(scenario: Scenario, world_size: int) -> list[str]:
    """What is wrong with ``scenario``'s data at ``world_size`` (empty: nothing)."""
    spec = get_model(scenario.model)
    groups = scenario.groups_for(world_size)
    case = scenario_case(scenario, world_size, groups)
    on_purpose = any(word in scenario.model for word in ("inf", "nan", "non_finite"))
    problems: list[str] = []
    for group in groups:
        for rank in group:
            model = script_case.build(case, spec, rank)
            bad = _embedding_ranges(model)
            for step in range(case.steps_for[rank]):
                for mb, forward in case.plan[step]:
                    at = (rank, step, mb, forward)
                    inputs, target = script_case.batch(case, spec, at, len(group))
                    script_case.seed_forward(case, at)
                    try:
                        with torch.no_grad(), script_case.forward_context(case):
                            out = model(*inputs)
                    except Exception as exc:  # noqa: BLE001 - reported with the case
                        problems.append(f"rank {rank}, step {step}: forward raised "
                                        f"{type(exc).__name__}: {exc}")
                        break
                    if not on_purpose and _non_finite(_tensors((inputs, target, out))):
                        problems.append(f"rank {rank}, step {step}: non-finite data or output")
            problems += [f"rank {rank}: {b}" for b in bad]
    return problems


def _accepting(world_size: int) -> list[Scenario]:
    return [s for s in load_catalog() if not s.unsupported_world_size(world_size)]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_every_scenario_s_data_is_valid_at_the_world_size(world_size: int) -> None:
    torch.set_num_threads(1)
    found = {s.id: p for s in _accepting(world_size) if (p := _problems(s, world_size))}
    assert not found, "\n".join(f"{case}: {'; '.join(p[:3])}" for case, p in found.items())


def test_the_embedding_scenarios_keep_a_row_of_one_rank_and_rows_of_several() -> None:
    """The embedding models' intent at every world size 2-16: rows 0-1 are indexed by rank
    0 alone, some row by several ranks (``synthetic.index_offset``)."""
    spec = get_model("embedding")
    for world_size in range(2, 17):
        seen: dict[int, set[int]] = {}
        for rank in range(world_size):
            gen = torch.Generator().manual_seed(rank)
            (idx,), _ = spec.batch(gen, 64, rank, world_size, 0)
            for row in idx.unique().tolist():
                seen.setdefault(row, set()).add(rank)
        assert max(seen) < 20 and min(seen) >= 0, world_size
        assert seen[0] == {0} and seen[1] == {0}, (world_size, seen[0], seen[1])
        assert any(len(ranks) > 1 for ranks in seen.values()), world_size


def test_the_fp16_base_keeps_the_mean_in_range_and_the_sum_out_at_every_world_size() -> None:
    """``gradients/exact-fp16-near-range``: each rank's gradient ``W * base`` and their mean
    fit float16 (max 65504), their sum does not (from 2 ranks on)."""
    for world_size in range(2, 17):
        base = fp16_base(world_size)
        assert world_size * base < 65504 < world_size * world_size * base, world_size
        assert math.log2(base).is_integer(), base
