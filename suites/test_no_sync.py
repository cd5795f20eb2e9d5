"""no_sync: gradients accumulate locally; the next synced backward reduces the sum."""
from ddp_conformance import Accumulate, Scenario

SCENARIOS = [
    Scenario("no-sync/window-of-3", "mlp", microbatches=3, accumulate=Accumulate.NO_SYNC,
             optimizer="sgd_momentum",
             description="two microbatches inside no_sync, the third synced, per step"),
    Scenario("no-sync/window-of-2-tiny-cap", "mlp", microbatches=2,
             accumulate=Accumulate.NO_SYNC, optimizer="adam", lr=0.01,
             ddp_options={"bucket_cap_mb": 0.001},
             description="no_sync with several buckets"),
    Scenario("no-sync/every-microbatch-synced", "mlp", microbatches=3,
             accumulate=Accumulate.SYNC_EACH,
             description="three synced backwards per step: reduced gradients accumulate"),
    Scenario("no-sync/nested", "conv_bn", steps=3, microbatches=4,
             accumulate=Accumulate.NESTED_NO_SYNC,
             description="no_sync nested in no_sync: leaving the inner one keeps gradients "
                         "local until the outer one ends"),
    Scenario("no-sync/nested-bucket-view", "mlp", steps=3, microbatches=4,
             accumulate=Accumulate.NESTED_NO_SYNC,
             ddp_options={"gradient_as_bucket_view": True, "bucket_cap_mb": 0.0005},
             description="nested no_sync with gradients as bucket views"),
]
