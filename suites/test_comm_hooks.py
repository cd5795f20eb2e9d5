"""Comm hooks: torch's built-in hooks registered on the candidate."""
from ddp_conformance import Scenario
from ddp_conformance.catalog.rules import with_rules

SCENARIOS = [
    Scenario("comm-hooks/allreduce", "mlp", comm_hook="allreduce",
             description="torch's allreduce_hook: the same result as no hook"),
    Scenario("comm-hooks/returns-new-tensor", "mlp", comm_hook="allreduce_to_new_tensor",
             ddp_options={"bucket_cap_mb": 0.001},
             description="a hook whose future returns a new tensor: DDP must copy it back"),
    # A complex bucket is reduced as its real view: the hook gets a float buffer of twice
    # the complex element count, and DDP reads the new tensor back the same way.
    Scenario("comm-hooks/returns-new-tensor-complex", "complex",
             comm_hook="allreduce_to_new_tensor",
             description="complex64 parameters under a hook whose future returns a new tensor"),
    # A hook that relies on the bucket's position (index() and is_last()), as PowerSGD's
    # iteration count does: a tiny cap gives the MLP several buckets, so a wrong position
    # scales a bucket by a power of two; the right one leaves allreduce's values exactly.
    Scenario("comm-hooks/bucket-position", "mlp", comm_hook="bucket_position", steps=3,
             ddp_options={"bucket_cap_mb": 0.001},
             description="a hook counting buckets by index() and is_last(), several buckets"),
    # fp16_compress_hook casts each bucket to float16 (u = 2**-11), sums in float16 and
    # casts back: at most (W + 1) roundings of u relative to the summed magnitude, 2.4e-3 for
    # W = 4; parameters move by lr times that. 4e-3 (8 u) bounds it; float32 arithmetic is
    # still checked elsewhere with 1e-5.
    Scenario("comm-hooks/fp16-compress", "mlp", comm_hook="fp16_compress", rtol=4e-3,
             description="fp16_compress_hook: a float16 reduction, float16 tolerance"),
    # PowerSGD with rank >= the smaller side of every matrix and compression forced on
    # all of them approximates each gradient by P Q^T spanning it exactly: the error is
    # rounding in the orthogonalisation and the two allreduces (a few hundred u on these
    # 16-wide matrices), so 1e-4; a wrong low-rank result is off by O(1).
    # Its hook captures the process group in future callbacks that Gloo's threads release;
    # the harness keeps destroyed groups alive until the next job so that the group is
    # never destroyed on its own worker thread (see ddp_conformance/worker.py).
    Scenario("comm-hooks/powersgd-full-rank", "mlp", comm_hook="powersgd", steps=4,
             rtol=1e-4, trace_volume=False,
             description="PowerSGD after two vanilla steps, rank covering every matrix"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'comm-hooks/allreduce':
        "A registered comm hook replaces DDP's reduction of each bucket: torch's "
        'allreduce_hook divides by the group size and allreduces, so the gradients equal '
        'those without a hook.',
    'comm-hooks/returns-new-tensor':
        "DDP copies the tensor a comm hook's future returns back into the bucket's "
        "gradients: a hook may return a new tensor rather than the bucket's buffer.",
    'comm-hooks/returns-new-tensor-complex':
        "DDP hands a comm hook a complex bucket as its real view (float, twice the "
        "elements) and reads the hook's new tensor back as real and imaginary pairs.",
    'comm-hooks/bucket-position':
        "DDP hands a comm hook the buckets of an iteration in order, index() counting from "
        "0 and is_last() true on the final one only, so a hook may key its state on them.",
    'comm-hooks/fp16-compress':
        'fp16_compress_hook casts the bucket to float16, divides by the group size, '
        'allreduces and casts back: gradients are the average within float16 rounding.',
    'comm-hooks/powersgd-full-rank':
        'PowerSGD allreduces the first start_powerSGD_iter steps uncompressed, then reduces '
        'low-rank factors with error feedback; at a rank covering every matrix the result '
        'equals plain averaging up to rounding.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
