"""Gradients: the synced gradients are the average of the ranks' local gradients."""
from ddp_conformance.scenario import Scenario

SCENARIOS = [
    Scenario("gradients/mlp-sgd-momentum", "mlp", optimizer="sgd_momentum", steps=4,
             description="MLP, SGD with momentum 0.9: every step's gradients and parameters"),
    Scenario("gradients/mlp-adam", "mlp", optimizer="adam", lr=0.01, steps=4,
             description="MLP, Adam: every step's gradients and parameters"),
    Scenario("gradients/exact-dyadic", "dyadic", exact=True, lr=0.0625, steps=3, batch_size=8,
             description="dyadic data and weights: every sum exact in any order, so the "
                         "candidate must equal the oracle bitwise"),
]
