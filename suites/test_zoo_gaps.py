"""Scenarios added for defects of the mutant zoo (``tests/mutants``) that slipped through.

``gaps/static-graph-unused-on-some-ranks-tiny-cap``: with ``static_graph`` DDP rebuilds
its buckets once, from each rank's gradient-ready order, and every rank adopts rank 0's
layout. The ready orders differ only where ranks use different parameters: rank 1 never
uses ``extra`` here, so it appends ``extra`` last, and a 104-byte cap puts every tensor in
a bucket of its own, so the rebuilt layouts differ. A DDP that keeps its local layout
(``RebuildKeepsLocalLayout``: no broadcast of rank 0's) reduces mismatched buckets from
step 1 on. No other scenario combines a rank-dependent ready order with several buckets
and a layout rebuild (``find_unused_parameters`` does not rebuild).
"""
from ddp_conformance import Scenario
from ddp_conformance.catalog.rules import with_rules

SCENARIOS = [
    Scenario("gaps/static-graph-unused-on-some-ranks-tiny-cap", "unused_on_rank1",
             min_world_size=2, steps=3,
             ddp_options={"static_graph": True, "bucket_cap_mb": 0.0001},
             description="static graph, `extra` unused on rank 1: the rebuilt bucket layout "
                         "differs per rank, rank 0's is used"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'gaps/static-graph-unused-on-some-ranks-tiny-cap':
        "Under static_graph DDP rebuilds its buckets once from rank 0's gradient order and "
        'broadcasts that layout, so every rank reduces the same buckets even if a parameter '
        'is unused on one.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
