"""Join: uneven inputs, shadowed collectives, divisor, final model sync, early termination."""
from ddp_conformance import JoinSpec, Scenario
from ddp_conformance.catalog.rules import with_rules

SCENARIOS = [
    Scenario("join/uneven-divide-by-initial", "mlp", steps=4, min_world_size=2,
             join=JoinSpec(divide_by_initial_world_size=True),
             description="rank r runs 4 - r steps; gradients divided by the initial world size"),
    Scenario("join/uneven-divide-by-active", "mlp", steps=4, min_world_size=2,
             join=JoinSpec(divide_by_initial_world_size=False),
             description="rank r runs 4 - r steps; gradients divided by the active ranks"),
    Scenario("join/uneven-buffers", "conv_bn", steps=3, min_world_size=2, join=JoinSpec(),
             description="joined ranks shadow the buffer broadcast; final buffers from the "
                         "last joiner"),
    Scenario("join/uneven-tiny-cap", "mlp", steps=4, min_world_size=2, join=JoinSpec(),
             ddp_options={"bucket_cap_mb": 0.001},
             description="one zero allreduce per bucket shadowed on joined ranks"),
    # A joined rank's ZeRO hook still steps its shard of the parameters, with the last
    # gradient it holds (torch's _ZeROJoinHook), so once a rank has joined the training
    # leaves the single-process trajectory by design: the oracle is compared while every
    # rank is active; after that the reference DDP running the same ZeRO, and the ranks
    # against each other (bitwise).
    Scenario("join/zero-redundancy-optimizer", "mlp", steps=4, min_world_size=2,
             optimizer="zero_sgd", join=JoinSpec(), oracle_after_join=False,
             description="ZeroRedundancyOptimizer joined with DDP"),
    Scenario("join/throw-on-early-termination", "mlp", steps=4, min_world_size=2,
             join=JoinSpec(throw_on_early_termination=True),
             # The rank that ran out says so; the others learn it at their next forward.
             expect_error=r"RuntimeError: (Rank \d+ exhausted all inputs|Detected at least "
                          r"one rank that exhausted inputs)",
             description="every rank raises once one rank runs out of inputs"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'join/uneven-divide-by-initial':
        'Under Join, ranks that ran out of inputs shadow the allreduces with zeros and DDP '
        'divides by the initial world size (divide_by_initial_world_size=True), so later '
        "steps' gradients shrink.",
    'join/uneven-divide-by-active':
        'With divide_by_initial_world_size=False, DDP under Join divides each reduction by '
        'the number of ranks still training, not the initial world size.',
    'join/uneven-buffers':
        'Joined ranks shadow the buffer broadcast too: at the end every rank holds the '
        'buffers of the last rank to join.',
    'join/uneven-tiny-cap':
        "A joined rank shadows one zero allreduce per bucket of the active ranks' backward, "
        'in bucket order, so the collectives still match.',
    'join/zero-redundancy-optimizer':
        "Join drives every joinable's hook: DDP's shadows its allreduces and "
        "ZeroRedundancyOptimizer's its broadcasts, so uneven inputs end with the same "
        'parameters on all ranks.',
    'join/throw-on-early-termination':
        'With throw_on_early_termination=True, once one rank runs out of inputs every rank '
        'raises at its next iteration instead of shadowing.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
