"""Gradient accumulation under Composer's sync strategies, driven on the candidate.

``single_auto_sync``: no_sync but the last microbatch; ``multi_auto_sync``: every
microbatch synced; ``forced_sync``: every microbatch in no_sync, then one allreduce per
gradient. All three must give the averaged accumulated gradient.
"""
from ddp_conformance import Scenario
from ddp_conformance.catalog.rules import with_rules

SCENARIOS = [
    Scenario(f"sync-strategy/{strategy.replace('_', '-')}-{mbs}-microbatch"
             f"{'es' if mbs > 1 else ''}", "mlp", microbatches=mbs, sync_strategy=strategy,
             optimizer="sgd_momentum",
             description=f"{strategy} with {mbs} microbatch(es)")
    for strategy in ("single_auto_sync", "multi_auto_sync", "forced_sync")
    for mbs in (1, 3)
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'sync-strategy/single-auto-sync-*':
        'single_auto_sync runs every microbatch but the last inside no_sync: the last '
        'backward reduces the accumulated gradient, averaged over ranks.',
    'sync-strategy/multi-auto-sync-*':
        "multi_auto_sync reduces at every microbatch's backward: the averaged gradients of "
        'the microbatches accumulate.',
    'sync-strategy/forced-sync-*':
        'forced_sync runs every microbatch inside no_sync, then allreduces each gradient '
        "itself: the result is the averaged accumulated gradient, as DDP's own.",
}
SCENARIOS = with_rules(SCENARIOS, RULES)
