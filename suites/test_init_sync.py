"""Init sync: DDP's constructor makes every rank start from rank 0's weights."""
from ddp_conformance.scenario import Scenario

SCENARIOS = [
    Scenario("init-sync/per-rank-weights", "mlp", init="per_rank", min_world_size=2,
             description="each rank builds different initial weights; after wrapping all "
                         "hold rank 0's"),
]
