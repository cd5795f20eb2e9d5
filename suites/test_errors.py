"""Errors DDP must raise, on every rank, without hanging (API contracts: refusing is the
behaviour), and two limits of torch's implementation where a DDP may refuse like torch or
go on and be judged on its values (``torch_limit``)."""
from ddp_conformance import Scenario
from ddp_conformance.catalog.rules import with_rules

SCENARIOS = [
    Scenario("errors/comm-hook-registered-twice", "mlp", comm_hook="allreduce",
             comm_hook_registrations=2, expect_error=r"can only be called once",
             description="a second register_comm_hook raises on every rank"),
    Scenario("errors/mismatched-models", "mismatched_by_rank", min_world_size=2,
             expect_error=r"(?i)(same model across all ranks|mismatch|inconsistent)",
             description="ranks built different models: the constructor raises on every "
                         "rank, no hang"),
    # torch's find_unused_parameters traverses the graph from every output tensor, so a
    # returned output left out of the loss counts as used and its gradient never comes:
    # the next iteration raises, naming the parameters (torch documents this limitation).
    # A limit of its reducer, not of DDP's semantics: a DDP that goes on must give the
    # oracle's gradients (the left-out head's stay None on every rank).
    Scenario("errors/output-left-out-of-loss", "nested_outputs_aux_left_out", steps=3,
             ddp_options={"find_unused_parameters": True},
             torch_limit=r"Expected to have finished reduction in the prior iteration",
             description="an output left out of the loss with find_unused_parameters: torch "
                         "refuses at the next iteration; going on is judged on values"),
    # Without find_unused_parameters torch's reducer waits for every parameter, so the
    # next iteration raises, naming the unused ones. A DDP that knows which gradients
    # came (all ranks agree here) may go on: unused on every rank, a gradient stays None.
    Scenario("errors/unused-without-find-unused", "unused_always_and_alternate", steps=3,
             torch_limit=r"Expected to have finished reduction in the prior iteration",
             description="a parameter unused without find_unused_parameters: torch refuses "
                         "at the next iteration; going on is judged on values"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'errors/comm-hook-registered-twice':
        'register_comm_hook may be called once per DDP instance: a second registration '
        'raises on every rank, with no collective left hanging.',
    'errors/mismatched-models':
        "DDP's constructor verifies that every rank holds the same parameter shapes; models "
        'that differ across ranks raise on every rank instead of hanging.',
    'errors/output-left-out-of-loss':
        "find_unused_parameters searches the graph from the forward's outputs, so "
        'parameters behind an output left out of the loss count as used and never get a '
        'gradient: torch refuses at the next iteration, and a DDP that goes on must still '
        'average the gradients the loss has.',
    'errors/unused-without-find-unused':
        "Without find_unused_parameters DDP waits for every parameter's gradient; torch "
        'refuses the next iteration when one was unused, and a DDP that goes on must still '
        'give every rank the averaged gradients.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
