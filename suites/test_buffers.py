"""Buffers: with ``broadcast_buffers`` every synced forward starts from rank 0's buffers."""
from ddp_conformance import Accumulate, Scenario
from ddp_conformance.catalog.rules import with_rules

SCENARIOS = [
    Scenario("buffers/conv-bn-broadcast", "conv_bn", steps=3, optimizer="sgd_momentum",
             ddp_options={"broadcast_buffers": True}, min_world_size=2,
             description="BatchNorm running statistics differ per rank; DDP broadcasts "
                         "rank 0's before each synced forward"),
    Scenario("buffers/conv-bn-no-broadcast", "conv_bn", steps=3,
             ddp_options={"broadcast_buffers": False},
             description="broadcast_buffers=False: each rank keeps its own running statistics"),
    Scenario("buffers/conv-bn-no-sync", "conv_bn", steps=3, microbatches=2,
             accumulate=Accumulate.NO_SYNC, min_world_size=2,
             description="no buffer broadcast before a forward inside no_sync"),
    # The module reassigns its buffers in every forward: the tensors DDP saw at construction
    # are no longer the module's after the first step.
    Scenario("buffers/replaced-in-forward", "buffers_replaced", steps=3,
             description="buffers reassigned to new tensors in forward, rank 0's broadcast "
                         "before each synced forward"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'buffers/conv-bn-broadcast':
        "With broadcast_buffers=True (the default) DDP broadcasts rank 0's buffers, such as "
        'BatchNorm running statistics, to every rank before each forward that follows a '
        'synced one.',
    'buffers/conv-bn-no-broadcast':
        'With broadcast_buffers=False DDP never broadcasts buffers after construction: each '
        "rank's running statistics follow its own batches.",
    'buffers/conv-bn-no-sync':
        'DDP decides the buffer broadcast from the previous forward: the first forward '
        "after one inside no_sync keeps the rank's own buffers, and the first forward after "
        "a synced one broadcasts rank 0's.",
    'buffers/replaced-in-forward':
        "DDP broadcasts the module's buffers as they are at each forward: a buffer the "
        "forward reassigned to a new tensor is broadcast, not the tensor registered at "
        "construction.",
}
SCENARIOS = with_rules(SCENARIOS, RULES)
