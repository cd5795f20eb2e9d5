"""Constructor options: gradient_as_bucket_view, static_graph, zero_grad both ways."""
from ddp_conformance import Scenario

SCENARIOS = [
    Scenario("options/gradient-as-bucket-view", "mlp", steps=3,
             ddp_options={"gradient_as_bucket_view": True},
             description="gradients are views of the buckets; zero_grad(set_to_none=True)"),
    Scenario("options/gradient-as-bucket-view-zeroed", "mlp", steps=3,
             zero_grad_set_to_none=False,
             ddp_options={"gradient_as_bucket_view": True, "bucket_cap_mb": 0.001},
             description="bucket views with zero_grad(set_to_none=False) and several buckets"),
    Scenario("options/static-graph", "mlp", steps=4, ddp_options={"static_graph": True},
             description="static_graph=True"),
    Scenario("options/static-graph-tiny-cap", "used_twice", steps=4,
             ddp_options={"static_graph": True, "bucket_cap_mb": 0.0005},
             description="static_graph with a reused layer and several buckets"),
    Scenario("options/zero-grad-to-zeros", "mlp", zero_grad_set_to_none=False,
             description="zero_grad(set_to_none=False)"),
]
