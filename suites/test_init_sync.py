"""Init sync: DDP's constructor makes every rank start from rank 0's weights."""
from ddp_conformance import Scenario
from ddp_conformance.catalog.rules import with_rules

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

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'init-sync/per-rank-weights':
        "DDP's constructor broadcasts rank 0's parameters to every rank, so ranks that "
        "built different initial weights all start from rank 0's.",
    'init-sync/per-rank-weights-and-buffers':
        "With broadcast_buffers on, the constructor broadcasts rank 0's buffers as well as "
        'its parameters.',
    'init-sync/per-rank-random-buffer':
        "The constructor's broadcast covers every buffer, including one drawn at random at "
        "init: all ranks start with rank 0's.",
    'init-sync/per-rank-buffers-kept':
        'With broadcast_buffers=False the constructor broadcasts the parameters only: each '
        'rank keeps its own buffers.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
