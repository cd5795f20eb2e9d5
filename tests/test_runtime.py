"""One job procedure for every transport: the pool's worker and torchrun mode both hand
each job to ``RankRuntime.execute`` and never manage process groups themselves."""
from __future__ import annotations

import ast
import inspect

from ddp_conformance.ranks import pool, runtime, torchrun, worker

GROUP_CALLS = {"init_process_group", "destroy_process_group", "manual_seed", "set_grad_enabled"}


def _calls(module: object) -> set[str]:
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    return {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            for node in ast.walk(tree) if isinstance(node, ast.Call)}


def test_transports_delegate_the_job_procedure_to_the_runtime() -> None:
    for transport in (worker, torchrun):
        calls = _calls(transport)
        assert "execute" in calls, transport.__name__  # RankRuntime.execute
        assert "RankRuntime" in calls, transport.__name__
        assert not calls & GROUP_CALLS, (transport.__name__, calls & GROUP_CALLS)
    assert not _calls(pool) & GROUP_CALLS
    assert GROUP_CALLS <= _calls(runtime)
