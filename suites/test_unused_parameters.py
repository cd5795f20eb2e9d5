"""Unused parameters: ``find_unused_parameters``, used on some ranks, always, alternately."""
from ddp_conformance import Accumulate, Scenario

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
