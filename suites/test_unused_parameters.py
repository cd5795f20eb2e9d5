"""Unused parameters: ``find_unused_parameters``, used on some ranks, always, alternately."""
from ddp_conformance import Accumulate, Scenario
from ddp_conformance.catalog.rules import with_rules

SCENARIOS = [
    Scenario("unused/used-on-some-ranks", "unused_on_rank1", min_world_size=2,
             ddp_options={"find_unused_parameters": True},
             description="`extra` unused on rank 1: it still gets the reduced gradient there"),
    Scenario("unused/branch-first-tiny-cap", "unused_first_on_rank1", min_world_size=2,
             ddp_options={"find_unused_parameters": True, "bucket_cap_mb": 0.0002},
             description="ranks become ready for small buckets in different orders: they "
                         "must still be reduced in bucket order"),
    Scenario("unused/always-and-alternate", "unused_always_and_alternate", steps=4,
             ddp_options={"find_unused_parameters": True},
             description="`never` keeps a None gradient; `alternate` is used on even steps"),
    Scenario("unused/always-and-alternate-zeroed", "unused_always_and_alternate", steps=4,
             zero_grad_set_to_none=False, ddp_options={"find_unused_parameters": True},
             description="zero_grad(set_to_none=False): unused gradients stay zero tensors"),
    Scenario("unused/used-on-some-ranks-no-sync", "unused_on_rank1", min_world_size=2,
             microbatches=2, accumulate=Accumulate.NO_SYNC,
             ddp_options={"find_unused_parameters": True},
             description="usage accumulates across no_sync microbatches"),
    Scenario("unused/all-used-with-flag", "mlp", ddp_options={"find_unused_parameters": True},
             description="find_unused_parameters on a model that uses everything"),
    Scenario("unused/nested-outputs", "nested_outputs",
             ddp_options={"find_unused_parameters": True},
             description="dict / dataclass / tuple outputs: DDP finds the tensors inside"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'unused/used-on-some-ranks':
        'With find_unused_parameters a parameter unused on one rank contributes zero there '
        'and still receives the averaged gradient from the ranks that used it.',
    'unused/branch-first-tiny-cap':
        'Ranks may finish buckets in different orders, but DDP launches bucket reductions '
        'in bucket-index order on every rank, so the collectives match.',
    'unused/always-and-alternate':
        'A parameter unused on every rank keeps a None gradient; one used on alternate '
        'steps gets the averaged gradient when used and is left alone otherwise.',
    'unused/always-and-alternate-zeroed':
        "With zero_grad(set_to_none=False) an unused parameter's gradient stays a zero "
        'tensor; DDP must not turn it to None or write stale values.',
    'unused/used-on-some-ranks-no-sync':
        'Under no_sync DDP accumulates which parameters were used across the window: a '
        'parameter used in any microbatch is reduced at the synced backward.',
    'unused/all-used-with-flag':
        'find_unused_parameters on a model that uses every parameter changes nothing: the '
        'same averaged gradients as without the flag.',
    'unused/nested-outputs':
        'find_unused_parameters searches the graph from every tensor in the output, inside '
        'dicts, dataclasses and tuples; an output left out of the loss is unused.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
