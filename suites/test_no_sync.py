"""no_sync: gradients accumulate locally; the next synced backward reduces the sum."""
from ddp_conformance import Accumulate, Scenario
from ddp_conformance.catalog.rules import with_rules

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

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'no-sync/window-of-3':
        'Inside no_sync DDP does not reduce: gradients accumulate locally, and the first '
        'backward outside it reduces the accumulated sum.',
    'no-sync/window-of-2-tiny-cap':
        "no_sync holds back every bucket's reduction: with many buckets, none is reduced "
        'until the synced backward, which reduces each once.',
    'no-sync/every-microbatch-synced':
        'Without no_sync every backward reduces: reduced gradients accumulate over the '
        'microbatches, summing the averages.',
    'no-sync/nested':
        'no_sync restores the previous require_backward_grad_sync on exit: leaving a nested '
        'no_sync keeps synchronisation off until the outer one ends.',
    'no-sync/nested-bucket-view':
        'Nested no_sync with gradient_as_bucket_view: gradients accumulate in the bucket '
        'views unreduced until the outer no_sync ends, then are reduced once.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
