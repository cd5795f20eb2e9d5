"""The reference DDP matches torch's DDP bitwise, step by step, on real Gloo ranks:
gradients and their ``None``-ness, parameters after the optimizer, buffers, bucket layouts
(initial and rebuilt) and the collectives issued per step (kind, dtype, element count,
order, seen at the process-group level). See ``workers.py`` for why bitwise."""
from __future__ import annotations

import pytest

from tests.deadlines import deadline
from tests.distributed import run_distributed
from tests.reference import workers

NAMES = sorted(workers.SCENARIOS)


@pytest.fixture(scope="module")
def results() -> list[dict[str, list[str]]]:
    # One distributed run for every scenario keeps the suite fast.
    return run_distributed(workers.compare_scenarios, 2, NAMES, timeout=deadline(300))


@pytest.mark.parametrize("name", NAMES)
def test_matches_torch_ddp(results: list[dict[str, list[str]]], name: str) -> None:
    for rank, per_rank in enumerate(results):
        assert per_rank[name] == [], f"rank {rank}: " + "\n".join(per_rank[name])


def test_world_size_three() -> None:
    names = ["mlp_tiny_cap", "unused_find", "convbn_no_sync", "mixed"]
    for rank, per_rank in enumerate(run_distributed(workers.compare_scenarios, 3, names)):
        for name in names:
            assert per_rank[name] == [], f"rank {rank} {name}: " + "\n".join(per_rank[name])


def test_subgroup_of_a_larger_world() -> None:
    # A group of 2 inside a world of 3 whose group rank 0 is global rank 1: init sync and
    # buffer broadcasts must come from the group's rank 0.
    for rank, diffs in enumerate(run_distributed(workers.subgroup, 3, [1, 2])):
        assert diffs == [], f"rank {rank}: " + "\n".join(diffs)
