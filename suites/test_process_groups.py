"""Process groups: DDP over a subgroup, with ranks outside it or in another group.

Broadcasts come from the group's rank 0 (a global rank that need not be 0), reductions
stay inside the group, and the divisor is the group's size.
"""
from ddp_conformance import Scenario

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
