"""Gradients: the synced gradients are the average of the ranks' local gradients.

The exact-valued scenarios (nccl-tests style) use data whose every sum is exact in any
order, so a correct DDP equals the oracle bitwise at any world size.
"""
from ddp_conformance import Accumulate, Scenario
from ddp_conformance.catalog.rules import with_rules

SCENARIOS = [
    Scenario("gradients/mlp-sgd", "mlp", steps=4,
             description="MLP, plain SGD: every step's gradients and parameters"),
    Scenario("gradients/mlp-sgd-momentum", "mlp", optimizer="sgd_momentum", steps=4,
             description="MLP, SGD with momentum 0.9"),
    Scenario("gradients/mlp-adam", "mlp", optimizer="adam", lr=0.01, steps=4,
             description="MLP, Adam"),
    Scenario("gradients/exact-dyadic", "dyadic", exact=True, lr=0.0625, steps=3, batch_size=8,
             description="dyadic data and weights: every sum exact in any order, so the "
                         "candidate must equal the oracle bitwise"),
    Scenario("gradients/exact-dyadic-microbatches", "dyadic", exact=True, lr=0.0625, steps=3,
             batch_size=4, microbatches=2, accumulate=Accumulate.NO_SYNC,
             description="exact-valued, two microbatches accumulated under no_sync"),
    Scenario("gradients/exact-fp16-near-range", "fp16_overflow", exact=True, lr=2.0**-16,
             steps=2, batch_size=4, min_world_size=2,
             description="float16 gradients whose sum over ranks exceeds 65504: DDP divides "
                         "before summing, so the mean is exact; dividing after overflows"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'gradients/mlp-sgd':
        "After backward every rank's gradient is the average of the ranks' local gradients, "
        'so plain SGD on any rank follows the single-process run on the concatenated batch.',
    'gradients/mlp-sgd-momentum':
        "DDP averages the gradient before the optimizer sees it: SGD's momentum buffers, "
        'built from averaged gradients, stay identical on every rank.',
    'gradients/mlp-adam':
        "Adam's per-parameter state is built from the averaged gradients, so it and the "
        'parameters stay identical on every rank and equal the single-process run.',
    'gradients/exact-dyadic':
        "DDP's gradient is the sum of the local gradients divided by the world size; on "
        "data whose sums are exact in any order, that is bitwise the oracle's.",
    'gradients/exact-dyadic-microbatches':
        'Gradients accumulated under no_sync are reduced once by the synced microbatch: the '
        "sum of the microbatches' local gradients averaged over ranks, bitwise on exact "
        'data.',
    'gradients/exact-fp16-near-range':
        'torch divides each gradient by the world size before summing over ranks, so the '
        'float16 sum stays in range; summing first and dividing after overflows to inf.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
