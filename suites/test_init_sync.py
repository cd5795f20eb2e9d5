"""Init sync: DDP's constructor makes every rank start from rank 0's weights."""
from ddp_conformance import Scenario

SCENARIOS = [
    Scenario("init-sync/per-rank-weights", "mlp", init="per_rank", min_world_size=2,
             description="each rank builds different initial weights; after wrapping all "
                         "hold rank 0's"),
    Scenario("init-sync/per-rank-weights-and-buffers", "conv_bn", init="per_rank",
             min_world_size=2,
             description="per-rank weights; broadcast_buffers: buffers start as rank 0's too"),
    Scenario("init-sync/per-rank-random-buffer", "random_buffer", init="per_rank",
             min_world_size=2,
             description="a buffer drawn at init differs per rank: init sync broadcasts it"),
    Scenario("init-sync/per-rank-buffers-kept", "conv_bn", init="per_rank", min_world_size=2,
             ddp_options={"broadcast_buffers": False},
             description="broadcast_buffers=False: parameters synced, buffers left per rank"),
]
