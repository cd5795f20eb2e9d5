"""Unused parameters: ``find_unused_parameters`` and parameters used on some ranks only."""
from ddp_conformance.scenario import Scenario

SCENARIOS = [
    Scenario("unused/used-on-some-ranks", "unused_on_rank1", min_world_size=2,
             ddp_options={"find_unused_parameters": True},
             description="`extra` unused on rank 1: it still gets the reduced gradient there"),
]
