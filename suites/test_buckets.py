"""Buckets and collectives: bucket caps, many small and one large tensor, mixed dtypes.

Besides the gradient checks, the collective trace checks that each synced backward reduces
every gradient element exactly once, the same on every rank, and (strict profile) in the
same bucket layout as torch's DDP.
"""
from ddp_conformance import Scenario
from ddp_conformance.catalog.rules import with_rules

SCENARIOS = [
    Scenario("buckets/mlp-tiny-cap", "mlp", ddp_options={"bucket_cap_mb": 0.001},
             description="a 1 KB bucket cap: several buckets, reduced in order"),
    Scenario("buckets/many-tiny-default-cap", "many_tiny", steps=2,
             description="204 tiny parameter tensors in one bucket"),
    Scenario("buckets/many-tiny-tiny-cap", "many_tiny", steps=2,
             ddp_options={"bucket_cap_mb": 0.0005},
             description="204 tiny parameter tensors in many 512-byte buckets"),
    Scenario("buckets/one-large-above-cap", "one_large", ddp_options={"bucket_cap_mb": 0.01},
             description="a 64 KiB weight alone above a 10 KB cap: a bucket of its own"),
    Scenario("buckets/mixed-dtypes", "mixed_dtypes",
             description="float32 and float64 parameters: one bucket per dtype"),
    Scenario("buckets/mixed-dtypes-tiny-cap", "mixed_dtypes",
             ddp_options={"bucket_cap_mb": 0.0002},
             description="mixed dtypes with a 200-byte cap"),
    # torch's _ddp_init_helper takes the constructor's static_graph: its first iteration
    # reduces one bucket per dtype even with find_unused_parameters, then the rebuilt layout.
    Scenario("buckets/static-graph-find-unused-tiny-cap", "mlp", steps=3,
             ddp_options={"static_graph": True, "find_unused_parameters": True,
                          "bucket_cap_mb": 0.001},
             description="static_graph with find_unused_parameters and a 1 KB cap: one "
                         "bucket in the first iteration, the rebuilt layout after"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'buckets/mlp-tiny-cap':
        'DDP packs gradients into buckets of at most bucket_cap_mb and reduces each bucket '
        'once all its gradients are ready; however many buckets there are, every gradient '
        'comes back as the average over ranks.',
    'buckets/many-tiny-default-cap':
        'Many small gradients share one flat bucket: DDP copies each into the bucket, '
        "reduces it once and copies every slice back into its own parameter's gradient.",
    'buckets/many-tiny-tiny-cap':
        'With a tiny bucket_cap_mb the gradients spread over many buckets, each reduced '
        'exactly once: none is lost or reduced twice at a bucket boundary.',
    'buckets/one-large-above-cap':
        'DDP never splits a tensor across buckets: one larger than bucket_cap_mb gets a '
        'bucket of its own and is reduced whole.',
    'buckets/mixed-dtypes':
        'A bucket holds one dtype: DDP buckets float32 and float64 gradients apart and '
        'reduces each in its own dtype, never casting one to the other.',
    'buckets/mixed-dtypes-tiny-cap':
        "Buckets are split by dtype and by the cap at once: each dtype's gradients fill "
        'their own buckets of at most bucket_cap_mb, each reduced in that dtype.',
    'buckets/static-graph-find-unused-tiny-cap':
        'A DDP constructed with static_graph starts with one bucket per dtype, even with '
        'find_unused_parameters, and reduces the first iteration in it; from the second '
        'iteration on it uses buckets of bucket_cap_mb in gradient-ready order.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
