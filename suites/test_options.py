"""Constructor options: gradient_as_bucket_view, static_graph, zero_grad both ways."""
from ddp_conformance import Scenario
from ddp_conformance.catalog.rules import with_rules

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

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'options/gradient-as-bucket-view':
        "With gradient_as_bucket_view=True, parameters' .grad are views into DDP's buckets; "
        'after zero_grad(set_to_none=True) the next backward must rebuild them with the '
        'same values.',
    'options/gradient-as-bucket-view-zeroed':
        'Bucket-view gradients zeroed in place by zero_grad(set_to_none=False) stay views: '
        'the next reduction writes the new average into them.',
    'options/static-graph':
        "static_graph=True lets DDP record the first iteration's graph and rebuild its "
        'buckets once; the gradients are the same averages as without it.',
    'options/static-graph-tiny-cap':
        'Under static_graph a layer reused in one forward is reduced once, after its last '
        'use, in every bucket layout.',
    'options/zero-grad-to-zeros':
        'After zero_grad(set_to_none=False) gradients are zero tensors that the next '
        'backward fills: DDP reduces into them exactly as into fresh gradients.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
