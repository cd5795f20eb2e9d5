"""A backend whose process group creates its own subgroups (``new_group``).

torch 2.13's ``dist.new_group`` hands subgroup creation to a default group that has a
``new_group`` method (a Python process group's own way to build them) instead of calling
the backend's creator again. Traced, the harness must do the same, and trace the result::

    --backend tests.backends.own_subgroups:own_subgroups

Importing this module registers ``own_subgroups`` (CPU).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed import Store

from tests.backends.example import ExampleProcessGroup, register

#: How many subgroups the backend's own ``new_group`` made in this process.
MADE = [0]


class OwnSubgroupsProcessGroup(ExampleProcessGroup):
    """The example backend, which makes its subgroups itself."""

    backend_name = "own_subgroups"

    def __init__(self, store: Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(store, rank, size, timeout)
        self._store, self._rank, self._timeout = store, rank, timeout

    def new_group(self, ranks: list[int], timeout: Any = None, pg_options: Any = None,
                  group_name: str = "", group_desc: str = "") -> dist.ProcessGroup | None:
        if self._rank not in ranks:
            return None
        MADE[0] += 1
        return OwnSubgroupsProcessGroup(dist.PrefixStore(f"own/{group_name}", self._store),
                                        ranks.index(self._rank), len(ranks),
                                        timeout or self._timeout)


register(OwnSubgroupsProcessGroup)
own_subgroups = OwnSubgroupsProcessGroup.backend_name
