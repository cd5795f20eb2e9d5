"""no_sync: gradients accumulate locally; the next synced backward reduces the sum."""
from ddp_conformance.scenario import Accumulate, Scenario

SCENARIOS = [
    Scenario("no-sync/window-of-3", "mlp", microbatches=3, accumulate=Accumulate.NO_SYNC,
             optimizer="sgd_momentum",
             description="two microbatches inside no_sync, the third synced, per step"),
]
