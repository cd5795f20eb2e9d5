"""Buffers: with ``broadcast_buffers`` every synced forward starts from rank 0's buffers."""
from ddp_conformance import Accumulate, Scenario

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
]
