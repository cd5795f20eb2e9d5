"""Real-world models (``catalog/models/real_models.py``): a GPT-style stack, a channels_last
ResNet, an LSTM, a top-1 mixture of experts, a layer frozen mid-run."""
from ddp_conformance import Accumulate, JoinSpec, Scenario
from ddp_conformance.catalog.rules import with_rules

#: A bucket cap of about 100 bytes: every parameter in a bucket of its own.
TINY = 0.0001
#: torch's error when a parameter DDP waits for got no gradient (the reducer notices at
#: the next forward, on every rank).
UNFINISHED = r"RuntimeError: Expected to have finished reduction in the prior iteration"

SCENARIOS = [
    # GPT-style: tied embedding/head (one parameter, two uses), LayerNorm, attention, and
    # dropout whose masks the oracle reproduces per rank.
    # SGD with momentum, not Adam: Adam's first step moves a parameter by about
    # lr * g / (|g| + 1e-8), so a gradient element that cancels across ranks to ~1e-8 turns
    # the reduction order's rounding into a parameter difference no float32 tolerance
    # bounds (judge/tolerance.py, "Adam"): at 8 ranks, torch's DDP failed oracle.param here.
    Scenario("real/gpt", "gpt", optimizer="sgd_momentum",
             description="GPT-style blocks with tied embedding and dropout, SGD with momentum"),
    Scenario("real/gpt-tiny-cap-bucket-view", "gpt", optimizer="sgd_momentum",
             ddp_options={"bucket_cap_mb": TINY, "gradient_as_bucket_view": True},
             description="GPT-style, one bucket per parameter, gradients as bucket views"),
    Scenario("real/gpt-no-sync", "gpt", steps=2, microbatches=3, accumulate=Accumulate.NO_SYNC,
             description="GPT-style, gradient accumulation over 3 microbatches in no_sync"),
    Scenario("real/gpt-static-graph", "gpt", ddp_options={"static_graph": True},
             description="GPT-style under static_graph (buckets rebuilt after step 0)"),
    Scenario("real/gpt-per-rank-init", "gpt", init="per_rank",
             description="GPT-style, each rank its own initial weights: init sync"),
    Scenario("real/gpt-join", "gpt", steps=3, min_world_size=2, join=JoinSpec(),
             description="GPT-style with uneven inputs under Join"),
    # ResNet-style in channels_last: DDP's buckets must take 4-d gradients in that layout.
    Scenario("real/resnet-channels-last", "resnet_channels_last", optimizer="sgd_momentum",
             min_world_size=2,
             description="channels_last residual net; BatchNorm buffers broadcast from rank 0"),
    Scenario("real/resnet-channels-last-bucket-view", "resnet_channels_last",
             ddp_options={"gradient_as_bucket_view": True, "bucket_cap_mb": TINY},
             description="channels_last gradients as views into DDP's buckets"),
    Scenario("real/resnet-channels-last-no-broadcast", "resnet_channels_last",
             ddp_options={"broadcast_buffers": False},
             description="channels_last, each rank keeps its own BatchNorm statistics"),
    Scenario("real/resnet-channels-last-no-sync", "resnet_channels_last", steps=2,
             microbatches=2, accumulate=Accumulate.NO_SYNC, min_world_size=2,
             description="channels_last, accumulation in no_sync (no broadcast inside)"),
    # LSTM: torch keeps the weights of all layers as one flat list.
    Scenario("real/lstm", "lstm", optimizer="adam", description="two-layer LSTM, Adam"),
    Scenario("real/lstm-tiny-cap-bucket-view", "lstm",
             ddp_options={"bucket_cap_mb": TINY, "gradient_as_bucket_view": True},
             description="LSTM, one bucket per weight, gradients as bucket views"),
    # Mixture of experts: which experts run depends on the data, per rank and step.
    Scenario("real/moe", "moe", steps=4, ddp_options={"find_unused_parameters": True},
             description="top-1 MoE: experts unused on some ranks and steps"),
    Scenario("real/moe-tiny-cap", "moe", steps=4, optimizer="sgd_momentum",
             ddp_options={"find_unused_parameters": True, "bucket_cap_mb": TINY},
             description="top-1 MoE, one bucket per parameter"),
    Scenario("real/moe-no-sync", "moe", steps=2, microbatches=3, accumulate=Accumulate.NO_SYNC,
             ddp_options={"find_unused_parameters": True},
             description="top-1 MoE, accumulation in no_sync: an expert used in any "
                         "microbatch is reduced"),
    # torch's limits, not DDP's semantics: a DDP may refuse (every rank, no hang) or go on,
    # and then must give the oracle's gradients: an expert used on some ranks gets the
    # average with zeros from the others on every rank (as find_unused_parameters does),
    # one unused on every rank keeps None. Here experts differ per rank, so ranks
    # disagree on which local gradients exist: a DDP reducing only what it has fails.
    Scenario("real/moe-without-find-unused", "moe", steps=4, min_world_size=2,
             torch_limit=UNFINISHED,
             description="top-1 MoE without find_unused_parameters: torch refuses (every "
                         "rank, no hang); going on is judged on values"),
    # Defined for 2 and 3 ranks: whether a rank's graph changes depends on its data, and
    # with 4 ranks rank 3's does not at step 1, so torch's DDP raises on ranks 0-2 only
    # and rank 3 waits in its allreduce forever (static_graph promises an unchanging graph).
    Scenario("real/moe-static-graph", "moe", steps=4, world_sizes=(2, 3),
             ddp_options={"static_graph": True},
             torch_limit=r"RuntimeError: Your training graph has changed in this iteration",
             description="top-1 MoE under static_graph: the graph changes; torch refuses, "
                         "going on is judged on values"),
    # requires_grad changes mid-run.
    Scenario("real/freeze-mid-run", "freeze_mid_run", steps=4,
             ddp_options={"find_unused_parameters": True},
             description="a layer frozen at step 2 and unfrozen at step 3"),
    Scenario("real/freeze-mid-run-momentum-zeroed", "freeze_mid_run", steps=4,
             optimizer="sgd_momentum", zero_grad_set_to_none=False,
             ddp_options={"find_unused_parameters": True},
             description="frozen at step 2 with zeroed (not None) gradients: momentum moves it"),
    Scenario("real/freeze-mid-run-without-find-unused", "freeze_mid_run", steps=4,
             torch_limit=UNFINISHED,
             description="freezing without find_unused_parameters: torch refuses at step 3; "
                         "going on is judged on values"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'real/gpt':
        "A GPT's tied embedding and head are one parameter whose two uses' gradients DDP "
        'reduces once; dropout masks differ per rank, and the gradients are still each '
        "rank's own averaged.",
    'real/gpt-tiny-cap-bucket-view':
        'With one bucket per parameter and gradient_as_bucket_view, each GPT gradient is a '
        'view into its own bucket and holds the average after backward.',
    'real/gpt-no-sync':
        'A GPT accumulating three microbatches under no_sync reduces once, at the last '
        'microbatch: the average over ranks of the summed local gradients.',
    'real/gpt-static-graph':
        "Under static_graph DDP rebuilds a GPT's buckets after the first iteration in the "
        'order gradients arrived; values stay the plain averages before and after.',
    'real/gpt-per-rank-init':
        "DDP's constructor broadcasts rank 0's GPT weights, so ranks that initialised their "
        'own start from the same model.',
    'real/gpt-join':
        "A GPT under Join with uneven inputs: joined ranks shadow every bucket's allreduce "
        'with zeros, divided by the initial world size by default.',
    'real/resnet-channels-last':
        "DDP's buckets keep a channels_last gradient's strides (its bucket view follows the "
        "parameter's layout), so each 4-d gradient is averaged element for element.",
    'real/resnet-channels-last-bucket-view':
        "With gradient_as_bucket_view, a channels_last parameter's .grad is a bucket view "
        "with the parameter's strides, holding the averaged gradient.",
    'real/resnet-channels-last-no-broadcast':
        "With broadcast_buffers=False a ResNet's BatchNorm statistics stay per rank while "
        'its channels_last gradients are still averaged.',
    'real/resnet-channels-last-no-sync':
        'Under no_sync a channels_last ResNet accumulates local gradients and does not '
        'broadcast buffers before the forwards that follow a no_sync one.',
    'real/lstm':
        "An LSTM's flat weights are ordinary parameters to DDP: every layer's weights and "
        'biases get the averaged gradient.',
    'real/lstm-tiny-cap-bucket-view':
        "An LSTM with one bucket per weight and bucket-view gradients: each weight's .grad "
        'is its bucket, averaged over ranks.',
    'real/moe':
        'With find_unused_parameters an expert unused on a rank contributes zero there, is '
        'reduced with the others and gets the average on every rank; one unused everywhere '
        'keeps None.',
    'real/moe-tiny-cap':
        'Mixture of experts with one bucket per parameter: whichever experts ran on each '
        'rank, every rank reduces the same buckets in the same order.',
    'real/moe-no-sync':
        'Under no_sync DDP accumulates parameter usage over the window: an expert used in '
        'any microbatch on any rank is reduced at the synced one.',
    'real/moe-without-find-unused':
        'Without find_unused_parameters torch refuses when an expert got no gradient; a DDP '
        "that goes on must average every used expert's gradient with zeros from the ranks "
        'that skipped it.',
    'real/moe-static-graph':
        'static_graph promises the same graph every iteration; a mixture of experts changes '
        'it, which torch refuses, and a DDP that goes on is judged on the averaged '
        'gradients.',
    'real/freeze-mid-run':
        'A parameter frozen mid-run (requires_grad=False) gets no gradient and is neither '
        'reduced nor stepped; unfrozen, it is reduced again from the next step.',
    'real/freeze-mid-run-momentum-zeroed':
        "A frozen parameter whose gradient was zeroed (not None) is still stepped by SGD's "
        'momentum: DDP must leave the zero gradient as it is, identical on every rank.',
    'real/freeze-mid-run-without-find-unused':
        'Without find_unused_parameters, freezing a parameter after construction leaves DDP '
        'waiting for its gradient: torch refuses at the next step, and a DDP that goes on '
        'must keep averaging the rest.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
