"""Gradient accumulation under Composer's sync strategies, driven on the candidate.

``single_auto_sync``: no_sync but the last microbatch; ``multi_auto_sync``: every
microbatch synced; ``forced_sync``: every microbatch in no_sync, then one allreduce per
gradient. All three must give the averaged accumulated gradient.
"""
from ddp_conformance import Scenario

SCENARIOS = [
    Scenario(f"sync-strategy/{strategy.replace('_', '-')}-{mbs}-microbatch"
             f"{'es' if mbs > 1 else ''}", "mlp", microbatches=mbs, sync_strategy=strategy,
             optimizer="sgd_momentum",
             description=f"{strategy} with {mbs} microbatch(es)")
    for strategy in ("single_auto_sync", "multi_auto_sync", "forced_sync")
    for mbs in (1, 3)
]
