"""Buckets and collectives: bucket caps, many small and one large tensor, mixed dtypes.

Besides the gradient checks, the collective trace checks that each synced backward reduces
every gradient element exactly once, the same on every rank, and (strict profile) in the
same bucket layout as torch's DDP.
"""
from ddp_conformance import Scenario

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
]
