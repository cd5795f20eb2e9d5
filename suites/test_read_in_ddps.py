"""What reading real DDPs showed the catalog missed (issue 27.6): bfloat16 parameters
(apex), two backwards with ``retain_graph`` before one step (apex), an exception inside
``no_sync`` and training going on (fairseq leaves synchronisation off), a first bucket in
float16 (fairseq). torch's behaviour is the verdict."""
from ddp_conformance import Accumulate, Scenario
from ddp_conformance.catalog.rules import with_rules

SCENARIOS = [
    # DDP buckets per dtype: a bfloat16 layer's gradients are reduced in bfloat16 beside
    # float32 ones (each gradient judged with its own dtype's tolerance).
    Scenario("values/bfloat16-beside-float32", "mlp_bfloat16_first_layer",
             description="a bfloat16 first layer, float32 elsewhere: a bfloat16 bucket and "
                         "a float32 one"),
    # Buckets are built in reverse registration order: float16 parameters registered last
    # fill the first bucket, which is reduced first.
    Scenario("values/float16-first-bucket", "mlp_float16_first_bucket",
             description="float16 parameters in DDP's first bucket, float32 in the others"),
    Scenario("values/float16-first-bucket-tiny-cap", "mlp_float16_first_bucket",
             ddp_options={"bucket_cap_mb": 0.0001},
             description="float16 first buckets, one parameter per bucket"),
    # torch's DDP reduces in the first backward of a forward only: the second one's local
    # gradients are added unreduced (reduction is prepared at forward time), so on per-rank
    # data its replicas would diverge (tests/standalone/retain_graph_second_backward_local.py).
    # On the same batch on every rank a local gradient is the average (W copies of g/W:
    # float32 rounding, within the rtol), so the oracle's sum of both passes, reduced, is
    # torch's result; a DDP that raises, hangs or reduces a pass twice over fails. The
    # volume check is off: reducing the second pass too is as right as torch's once.
    Scenario("procedures/backward-twice-retain-graph", "mlp_replicated_data", backwards=2,
             trace_volume=False,
             description="loss.backward(retain_graph=True) then loss.backward() before one "
                         "step"),
    # torch's no_sync restores require_backward_grad_sync in a finally; fairseq's legacy
    # DDP restores it after the yield only, so an exception inside no_sync leaves
    # synchronisation off and every later step trains on local gradients.
    Scenario("no-sync/exception-inside", "mlp", steps=3, raise_in_no_sync=True,
             description="a forward raises inside no_sync (caught), then a synced step"),
    Scenario("no-sync/exception-inside-window", "mlp", steps=3, microbatches=2,
             accumulate=Accumulate.NO_SYNC, raise_in_no_sync=True,
             description="a forward raises inside no_sync (caught), then accumulation in "
                         "no_sync and a synced microbatch"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'values/bfloat16-beside-float32':
        "DDP buckets per dtype: a bfloat16 layer's gradients are reduced in a bfloat16 "
        'bucket beside a float32 one, each in its own dtype.',
    'values/float16-first-bucket':
        'Buckets follow reverse registration order: float16 parameters registered last fill '
        'the first bucket, reduced first and in float16.',
    'values/float16-first-bucket-tiny-cap':
        'With one parameter per bucket, each float16 gradient is reduced in its own float16 '
        'bucket and each float32 one in float32.',
    'procedures/backward-twice-retain-graph':
        "torch's DDP reduces in the first backward after a forward only; a second backward "
        'with retain_graph adds local gradients, and a DDP must neither hang nor reduce a '
        'pass twice.',
    'no-sync/exception-inside':
        'no_sync restores synchronisation in a finally: after an exception inside it '
        '(caught outside), the next backward reduces.',
    'no-sync/exception-inside-window':
        'An exception inside no_sync does not leave synchronisation off: later no_sync '
        'windows accumulate locally and the synced microbatch reduces the sum.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
