"""The values and shapes real training meets (``catalog/models/value_models.py``): complex
parameters, whole models in float64 / bfloat16 / float16, one tensor above 2**18 elements,
a non-finite gradient on one rank, buffers of every kind, a parameter first used late, and
gradients as bucket views under ``no_sync`` accumulation."""
from ddp_conformance import Accumulate, Scenario
from ddp_conformance.catalog.rules import with_rules

#: torch's error when a parameter DDP waits for got no gradient (the reducer notices at
#: the next forward, on every rank).
UNFINISHED = r"RuntimeError: Expected to have finished reduction in the prior iteration"

#: torch's error when a parameter unused in static_graph's first iteration is used later.
GRAPH_CHANGED = r"RuntimeError: Your training graph has changed in this iteration"

SCENARIOS = [
    # Complex parameters: torch's DDP reduces complex gradients as view_as_real float32
    # pairs; the judge compares them the same way (tolerance.distance).
    Scenario("values/complex", "complex",
             description="complex64 weight and bias with a float32 head, real loss"),
    Scenario("values/complex-adam-tiny-cap", "complex", optimizer="adam",
             ddp_options={"bucket_cap_mb": 0.0001},
             description="complex64 parameters with Adam, one bucket per parameter"),
    # Whole models in one dtype (no autocast): each judged with its dtype's rtol.
    Scenario("values/float64", "mlp_float64", optimizer="sgd_momentum",
             description="an MLP wholly in float64"),
    Scenario("values/bfloat16", "mlp_bfloat16",
             description="an MLP wholly in bfloat16 (parameters, data, gradients, reduction)"),
    Scenario("values/float16", "mlp_float16",
             description="an MLP wholly in float16 (parameters, data, gradients, reduction)"),
    # One tensor of 307,200 elements (> 2**18), above DDP's 1 MiB first bucket.
    Scenario("values/huge-tensor", "huge_tensor", steps=2,
             description="one 600 x 512 weight, above 2**18 elements and the first bucket"),
    Scenario("values/huge-tensor-bucket-view", "huge_tensor", steps=2,
             ddp_options={"gradient_as_bucket_view": True, "bucket_cap_mb": 1},
             description="one 600 x 512 weight as a view into a bucket of its own"),
    # A non-finite gradient on one rank: every rank must see the same inf / NaN.
    Scenario("values/non-finite-grad", "non_finite_grad", steps=4,
             description="inf, -inf and NaN in the last rank's batch at step 1: the same "
                         "non-finite gradients on every rank, the step undone everywhere"),
    # Buffers of every kind, broadcast from rank 0 or each rank its own.
    Scenario("values/buffer-kinds", "buffer_kinds", steps=3,
             description="int64, running-mean and non-persistent buffers broadcast from rank 0"),
    Scenario("values/buffer-kinds-no-broadcast", "buffer_kinds", steps=3,
             ddp_options={"broadcast_buffers": False},
             description="int64, running-mean and non-persistent buffers, each rank its own"),
    Scenario("values/buffer-kinds-per-rank-init", "buffer_kinds", init="per_rank",
             description="buffers drawn per rank at init: DDP's init sync broadcasts them"),
    # A parameter first used at step 5 of 8.
    Scenario("values/late-use-find-unused", "late_use", steps=8,
             ddp_options={"find_unused_parameters": True},
             description="layer `late` unused for 5 steps, then used: find_unused_parameters"),
    Scenario("values/late-use-default", "late_use", steps=8, torch_limit=UNFINISHED,
             description="layer `late` unused for 5 steps without find_unused_parameters: "
                         "torch refuses at the second iteration (its documented limit); "
                         "going on is judged on values"),
    # static_graph records the graph of the first iteration: a parameter unused then and
    # used later is a graph change, which torch refuses (its documented limit).
    Scenario("values/late-use-static-graph", "late_use", steps=8,
             ddp_options={"static_graph": True}, torch_limit=GRAPH_CHANGED,
             description="layer `late` first used at step 5 under static_graph: torch "
                         "refuses the changed graph"),
    # Gradients as bucket views while accumulating in no_sync.
    Scenario("values/bucket-view-no-sync", "mlp", steps=3, microbatches=3,
             accumulate=Accumulate.NO_SYNC, ddp_options={"gradient_as_bucket_view": True},
             description="gradient_as_bucket_view with 3 microbatches accumulated in no_sync"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'values/complex':
        'DDP reduces a complex gradient as its real and imaginary parts (view_as_real), so '
        'the average is taken component by component.',
    'values/complex-adam-tiny-cap':
        "Complex parameters, each in its own bucket, reduced as view_as_real pairs; Adam's "
        'state built on the averages stays identical on every rank.',
    'values/float64':
        "A float64 model's gradients are reduced in float64: no precision is lost to a "
        'narrower wire dtype.',
    'values/bfloat16':
        "A bfloat16 model's gradients are divided by the world size and summed in bfloat16, "
        "the parameters' dtype, within bfloat16 rounding.",
    'values/float16':
        "A float16 model's gradients are divided by the world size before the float16 sum, "
        'so the average stays in range.',
    'values/huge-tensor':
        "A tensor above DDP's first-bucket cap (1 MiB) gets a bucket of its own and is "
        'reduced whole, never split.',
    'values/huge-tensor-bucket-view':
        'A huge parameter with gradient_as_bucket_view: its .grad is the whole of its own '
        'bucket, holding the average.',
    'values/non-finite-grad':
        "An inf or NaN in one rank's local gradient reaches every rank through the "
        'allreduce: all ranks see the same non-finite gradient, so all skip the step '
        'together.',
    'values/buffer-kinds':
        'DDP broadcasts every buffer from rank 0, whatever its dtype and whether '
        'persistent: int64 counters, running means and non-persistent buffers alike.',
    'values/buffer-kinds-no-broadcast':
        'With broadcast_buffers=False no buffer of any kind is broadcast after '
        'construction: each rank keeps its own.',
    'values/buffer-kinds-per-rank-init':
        'The constructor broadcasts every buffer, whatever its kind, so buffers drawn per '
        "rank at init all start as rank 0's.",
    'values/late-use-find-unused':
        'With find_unused_parameters a parameter unused for some steps keeps a None '
        'gradient and is reduced from the first step that uses it.',
    'values/late-use-default':
        'Without find_unused_parameters torch refuses once a parameter got no gradient (its '
        'documented limit); a DDP that goes on must reduce the layer from the step that '
        'first uses it.',
    'values/late-use-static-graph':
        "static_graph records the first iteration's graph: a parameter unused then and used "
        'later is a graph change, which torch refuses.',
    'values/bucket-view-no-sync':
        'With gradient_as_bucket_view under no_sync, microbatches accumulate into the '
        'bucket views locally and the synced backward averages the sum in place.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
