"""Where two features meet: the combinations in which DDP implementations have shipped
defects (``ddp_conformance/catalog/history.py`` lists them, with the scenarios that guard
each): Join with a comm hook and with ``no_sync``, a compressing hook's arithmetic near
float16's range, outputs made outside autograd under ``find_unused_parameters``."""
from ddp_conformance import Accumulate, JoinSpec, Scenario
from ddp_conformance.catalog.rules import with_rules

SCENARIOS = [
    # fp16_compress_hook reduces in float16 (u = 2**-11): the tolerance of
    # comm-hooks/fp16-compress, argued there. A joined rank must run the same hook on zero
    # buckets, or its collectives (float32) do not match the active ranks' (float16).
    Scenario("history/join-fp16-compress-hook", "mlp", steps=4, min_world_size=2,
             join=JoinSpec(), comm_hook="fp16_compress", rtol=4e-3,
             description="uneven inputs under Join with fp16_compress_hook registered"),
    Scenario("history/join-no-sync", "mlp", steps=3, microbatches=2,
             accumulate=Accumulate.NO_SYNC, min_world_size=2, join=JoinSpec(),
             description="uneven inputs under Join, two microbatches, the first in no_sync"),
    # The float16 model whose per-rank gradients are near 65504 (gradients/exact-fp16-near-
    # range): the hook's buffer is already float16, so dividing before the allreduce keeps
    # every sum exact and in range, as without a hook.
    Scenario("history/fp16-compress-near-range", "fp16_overflow", exact=True, lr=2.0**-16,
             steps=2, min_world_size=2, comm_hook="fp16_compress",
             description="fp16_compress_hook on float16 gradients whose sum exceeds 65504"),
    # Rank 0 uses a layer on some microbatches only (the seed makes steps where it uses it
    # inside no_sync and not in the synced microbatch): the layer is used in the step.
    # The same near-range float16 gradients under the other float16 hooks: the Python
    # wrapper around allreduce_hook and the C++ built-in, both dividing before the sum.
    Scenario("history/fp16-compress-wrapper-near-range", "fp16_overflow", exact=True,
             lr=2.0**-16, steps=2, min_world_size=2, comm_hook="fp16_compress_wrapper",
             description="fp16_compress_wrapper(allreduce_hook) on float16 gradients whose "
                         "sum exceeds 65504"),
    Scenario("history/builtin-fp16-compress-near-range", "fp16_overflow", exact=True,
             lr=2.0**-16, steps=2, min_world_size=2, comm_hook="builtin_fp16_compress",
             description="the built-in FP16_COMPRESS hook on float16 gradients whose sum "
                         "exceeds 65504"),
    # A plain tuple output (DDP finds and passes through every tensor in it) whose second
    # head is left out of the loss: its parameters keep None gradients on every rank.
    Scenario("history/find-unused-output-left-out", "two_heads_one_left_out", steps=3,
             ddp_options={"find_unused_parameters": True},
             description="find_unused_parameters; a tuple output whose second head is left "
                         "out of the loss"),
    Scenario("history/no-sync-find-unused-used-early", "used_on_some_microbatches", steps=4,
             microbatches=3, accumulate=Accumulate.NO_SYNC,
             ddp_options={"find_unused_parameters": True},
             description="find_unused_parameters; a layer used on microbatches inside "
                         "no_sync, not in the synced one"),
    # Join in a group of global ranks 1 and 2 (world of 3): the rank whose buffers all
    # ranks take is chosen by group rank, and buffers are broadcast within the group.
    Scenario("history/join-buffers-subgroup", "conv_bn", steps=3, groups=((1, 2),),
             world_sizes=(3,), join=JoinSpec(),
             description="uneven inputs under Join with BatchNorm buffers, DDP on a subgroup "
                         "without global rank 0"),
    Scenario("history/find-unused-memory-fed-back", "memory_fed_back", steps=3,
             ddp_options={"find_unused_parameters": True},
             description="find_unused_parameters; an output made outside autograd is fed "
                         "into the next forward"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'history/join-fp16-compress-hook':
        "Under Join a joined rank shadows each bucket's reduction through the registered "
        "comm hook, on zeros, so its collectives match the hook's on the active ranks.",
    'history/join-no-sync':
        "Under Join the ranks agree each iteration whether the backward synchronises: a "
        "joined rank shadows no reduction while the active ranks are inside no_sync.",
    'history/fp16-compress-near-range':
        "fp16_compress_hook divides each bucket by the group size before the allreduce: "
        "float16 gradients whose sum exceeds 65504 still average to finite values.",
    'history/fp16-compress-wrapper-near-range':
        "fp16_compress_wrapper hands allreduce_hook a float16 bucket, which it divides by "
        "the group size before summing: near-range float16 gradients average to finite "
        "values.",
    'history/builtin-fp16-compress-near-range':
        "The built-in FP16_COMPRESS hook divides the float16 bucket by the group size "
        "before the allreduce, as the Python hook does: the sum stays in float16's range.",
    'history/find-unused-output-left-out':
        "Under find_unused_parameters an output left out of the loss is allowed: its "
        "parameters get no gradient (None on every rank) and the next iteration goes on.",
    'history/no-sync-find-unused-used-early':
        "Under find_unused_parameters a parameter counts as used in a step if any "
        "microbatch of it used it, inside no_sync or not: its accumulated gradient is "
        "reduced.",
    'history/join-buffers-subgroup':
        "On a process subgroup DDP works in group ranks: under Join the ranks agree on "
        "the group rank whose buffers everyone takes, and broadcast from it within the "
        "group.",
    'history/find-unused-memory-fed-back':
        "DDP hands back the outputs autograd did not produce (no grad_fn) as they are, "
        "even under find_unused_parameters: fed into the next forward, they carry no "
        "history of the previous iteration.",
}
SCENARIOS = with_rules(SCENARIOS, RULES)
