"""Join: uneven inputs, shadowed collectives, divisor, final model sync."""
from ddp_conformance.scenario import JoinSpec, Scenario

SCENARIOS = [
    Scenario("join/uneven-divide-by-initial", "mlp", steps=4, min_world_size=2,
             join=JoinSpec(divide_by_initial_world_size=True),
             description="rank r runs 4 - r steps; gradients divided by the initial world size"),
    Scenario("join/uneven-divide-by-active", "mlp", steps=4, min_world_size=2,
             join=JoinSpec(divide_by_initial_world_size=False),
             description="rank r runs 4 - r steps; gradients divided by the active ranks"),
]
