"""Model structures: frozen, tied and reused parameters, embeddings dense and sparse."""
from ddp_conformance import Scenario
from ddp_conformance.catalog.rules import with_rules

SCENARIOS = [
    Scenario("models/frozen", "frozen",
             description="a frozen layer is neither reduced nor updated"),
    Scenario("models/tied", "tied", description="a weight shared by two layers, reduced once"),
    Scenario("models/used-twice", "used_twice",
             description="a layer applied twice per forward"),
    Scenario("models/embedding", "embedding", description="dense nn.Embedding"),
    Scenario("models/sparse-embedding", "sparse_embedding", trace_volume=False,
             description="nn.Embedding(sparse=True): sparse gradients, reduced as sparse"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'models/frozen':
        'DDP registers only parameters with requires_grad: a frozen layer is neither '
        'reduced nor updated, and its gradient stays None.',
    'models/tied':
        'A parameter shared by two layers is one parameter to DDP: its gradient (the sum of '
        'both uses) is reduced once.',
    'models/used-twice':
        'A layer applied twice in one forward accumulates both uses into one gradient, '
        'which DDP reduces once, after both have arrived.',
    'models/embedding':
        "A dense embedding's gradient is an ordinary dense tensor: DDP averages it over "
        'ranks like any other.',
    'models/sparse-embedding':
        'A sparse gradient is reduced as a sparse tensor, in a bucket of its own, and '
        'averaged over ranks like a dense one.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
