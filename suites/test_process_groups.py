"""Process groups: DDP over a subgroup, with ranks outside it or in another group.

Broadcasts come from the group's rank 0 (a global rank that need not be 0), reductions
stay inside the group, and the divisor is the group's size.
"""
from ddp_conformance import Scenario
from ddp_conformance.catalog.rules import with_rules

SCENARIOS = [
    Scenario("process-groups/two-pairs-in-four", "mlp", groups=((0, 1), (2, 3)),
             world_sizes=(4,), init="per_rank",
             description="two DDP groups of 2 inside a world of 4, each synced on its own"),
    Scenario("process-groups/two-pairs-buffers", "conv_bn", groups=((0, 2), (1, 3)),
             world_sizes=(4,), init="per_rank",
             description="interleaved groups {0,2} and {1,3}; buffers broadcast in-group"),
    Scenario("process-groups/pair-in-three", "mlp", groups=((0, 1),), world_sizes=(3,),
             init="per_rank",
             description="a group of 2 inside a world of 3; rank 2 idle"),
    Scenario("process-groups/pair-without-rank-0", "dyadic", groups=((1, 2),),
             world_sizes=(3,), init="per_rank", exact=True, lr=0.0625, batch_size=8,
             description="group {1,2}: init sync from global rank 1, exact values"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'process-groups/two-pairs-in-four':
        'DDP reduces over its process_group only: two DDP groups of 2 in a world of 4 each '
        'average over their own pair, never across.',
    'process-groups/two-pairs-buffers':
        'Buffer broadcasts, like reductions, stay inside the process_group, from the '
        "group's lowest rank: interleaved groups {0,2} and {1,3} each broadcast their own.",
    'process-groups/pair-in-three':
        'Ranks outside the DDP group take part in none of its collectives: a pair trains '
        'inside a world of 3 while rank 2 stays idle, without a hang.',
    'process-groups/pair-without-rank-0':
        "Init sync broadcasts from the group's first rank: in group {1,2} every rank starts "
        "from global rank 1's weights, and gradients are averaged over the pair.",
}
SCENARIOS = with_rules(SCENARIOS, RULES)
