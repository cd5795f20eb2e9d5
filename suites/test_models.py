"""Model structures: frozen, tied and reused parameters, embeddings dense and sparse."""
from ddp_conformance import Scenario

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
