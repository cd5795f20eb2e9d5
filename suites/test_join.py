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
    # Several synced backwards per step: each reduces the accumulated gradient, and the
    # joined ranks shadow every reduction with zeros. Divided by the active ranks, the
    # first microbatch's average is kept by the second reduction. Divided by the initial
    # world size, torch 2.13 halves it once more (tests/standalone/
    # join_synced_microbatches.py), against the equal weight per sample it documents:
    # no such scenario here (docs/interactions.md, "Valid pairs left uncovered").
    Scenario("join/synced-microbatches-divide-by-active", "mlp", steps=3, min_world_size=2,
             join=JoinSpec(divide_by_initial_world_size=False), microbatches=2,
             description="two synced microbatches per step under Join, divided by the "
                         "active ranks"),
    Scenario("join/multi-auto-sync-divide-by-active", "mlp", steps=3, min_world_size=2,
             join=JoinSpec(divide_by_initial_world_size=False), microbatches=2,
             sync_strategy="multi_auto_sync",
             description="Composer's multi_auto_sync under Join (every microbatch synced), "
                         "divided by the active ranks"),
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
    'join/synced-microbatches-divide-by-active':
        'Under Join with divide_by_initial_world_size=False, every synced backward of a step '
        'averages the accumulated gradients over the ranks still training, the joined ones '
        'shadowing each reduction: every sample of the active ranks weighs the same.',
    'join/multi-auto-sync-divide-by-active':
        "Composer's multi_auto_sync synchronises every microbatch: under Join with "
        'divide_by_initial_world_size=False each reduction averages over the ranks still '
        'training, so every sample of the active ranks weighs the same.',
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
