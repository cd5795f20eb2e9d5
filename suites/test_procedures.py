"""Procedures of modern training: activation checkpointing, autocast, several forwards per
backward, an eval forward between steps, uneven per-rank batches."""
from ddp_conformance import Accumulate, Scenario
from ddp_conformance.catalog.rules import with_rules

REENTRANT = {"checkpoint": "reentrant"}
NON_REENTRANT = {"checkpoint": "non_reentrant"}

SCENARIOS = [
    # Activation checkpointing (every GPT block). torch's rules: reentrant checkpointing
    # marks parameters ready inside a nested backward, which find_unused_parameters
    # cannot see (torch raises: a limit of its reducer; a DDP that goes on is judged on
    # values); static_graph or non-reentrant checkpointing work.
    Scenario("procedures/checkpoint-reentrant", "gpt", model_kwargs=REENTRANT,
             description="reentrant activation checkpointing"),
    Scenario("procedures/checkpoint-reentrant-static-graph", "gpt", model_kwargs=REENTRANT,
             ddp_options={"static_graph": True},
             description="reentrant checkpointing under static_graph"),
    Scenario("procedures/checkpoint-reentrant-find-unused", "gpt", model_kwargs=REENTRANT,
             ddp_options={"find_unused_parameters": True},
             torch_limit=r"RuntimeError: Expected to mark a variable ready only once",
             description="reentrant checkpointing with find_unused_parameters: torch "
                         "refuses; going on is judged on values"),
    Scenario("procedures/checkpoint-non-reentrant", "gpt", model_kwargs=NON_REENTRANT,
             description="non-reentrant activation checkpointing"),
    Scenario("procedures/checkpoint-non-reentrant-static-graph", "gpt",
             model_kwargs=NON_REENTRANT, ddp_options={"static_graph": True},
             description="non-reentrant checkpointing under static_graph"),
    Scenario("procedures/checkpoint-non-reentrant-find-unused", "gpt",
             model_kwargs=NON_REENTRANT, ddp_options={"find_unused_parameters": True},
             description="non-reentrant checkpointing with find_unused_parameters"),
    Scenario("procedures/checkpoint-non-reentrant-no-sync", "gpt", model_kwargs=NON_REENTRANT,
             steps=2, microbatches=2, accumulate=Accumulate.NO_SYNC,
             description="non-reentrant checkpointing, accumulation in no_sync"),
    # autocast: bfloat16 forward, float32 master weights and float32 gradients reduced.
    Scenario("procedures/autocast-bf16", "mlp", autocast="bfloat16", optimizer="adam",
             description="autocast bfloat16 forward, float32 weights"),
    Scenario("procedures/autocast-bf16-gpt", "gpt", autocast="bfloat16",
             description="GPT-style under autocast bfloat16"),
    Scenario("procedures/autocast-bf16-no-sync", "conv_bn", autocast="bfloat16", steps=2,
             microbatches=2, accumulate=Accumulate.NO_SYNC, min_world_size=2,
             description="autocast bfloat16 conv + BatchNorm, accumulation in no_sync"),
    # Several forwards before one backward.
    Scenario("procedures/forward-twice", "mlp", forwards=2,
             description="two forwards, one backward through the sum of their losses"),
    Scenario("procedures/forward-twice-buffers", "conv_bn", forwards=2, min_world_size=2,
             description="two forwards of conv + BatchNorm: the second starts from rank 0's "
                         "buffers again"),
    Scenario("procedures/forward-twice-unused", "unused_on_rank1", forwards=2,
             ddp_options={"find_unused_parameters": True},
             description="two forwards, a branch unused on rank 1"),
    Scenario("procedures/forward-twice-no-sync", "conv_bn", forwards=2, steps=2,
             microbatches=2, accumulate=Accumulate.NO_SYNC, min_world_size=2,
             description="two forwards per microbatch, accumulation in no_sync"),
    # A validation forward under torch.no_grad() and eval() between steps.
    Scenario("procedures/eval-between-steps", "conv_bn", eval_between_steps=True,
             min_world_size=2,
             description="an eval forward under no_grad between steps: DDP broadcasts buffers "
                         "before it, and not before the next training forward"),
    Scenario("procedures/eval-between-steps-no-sync", "conv_bn", eval_between_steps=True,
             steps=3, microbatches=2, accumulate=Accumulate.NO_SYNC, min_world_size=2,
             description="eval forwards between no_sync accumulation steps"),
    Scenario("procedures/eval-between-steps-resnet", "resnet_channels_last",
             eval_between_steps=True, min_world_size=2,
             description="eval forwards of a channels_last ResNet between steps"),
    # Uneven per-rank batches: DDP averages the per-rank means, not the sample-weighted
    # mean over the global batch.
    Scenario("procedures/uneven-batches", "mlp", batch_size=2, batch_size_step=3,
             min_world_size=2,
             description="rank r trains on 2 + 3r samples: DDP's gradient is the mean of "
                         "per-rank means, not the sample-weighted mean"),
    Scenario("procedures/uneven-batches-exact", "dyadic", batch_size=1, batch_size_step=2,
             exact=True, lr=0.125, min_world_size=2,
             description="uneven batches, exact-valued: bitwise the mean of per-rank means"),
    Scenario("procedures/uneven-batches-buffers", "conv_bn", batch_size=2, batch_size_step=2,
             min_world_size=2,
             description="uneven batches through BatchNorm (per-rank statistics)"),
    Scenario("procedures/uneven-batches-no-sync", "gpt", batch_size=1, batch_size_step=1,
             steps=2, microbatches=2, accumulate=Accumulate.NO_SYNC, min_world_size=2,
             description="uneven batches, GPT-style, accumulation in no_sync"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'procedures/checkpoint-reentrant':
        'Reentrant activation checkpointing recomputes the forward inside backward; DDP '
        "must still reduce every checkpointed parameter's gradient once, after its "
        'recomputed backward.',
    'procedures/checkpoint-reentrant-static-graph':
        'Under static_graph DDP learns from the first iteration when each parameter becomes '
        'ready, so reentrant checkpointing reduces every gradient once with the usual '
        'averages.',
    'procedures/checkpoint-reentrant-find-unused':
        'find_unused_parameters cannot see parameters marked ready inside reentrant '
        "checkpointing's nested backward: torch refuses (a limit of its reducer), and a DDP "
        'that goes on must still average every gradient.',
    'procedures/checkpoint-non-reentrant':
        'Non-reentrant checkpointing recomputes activations with saved-tensor hooks inside '
        "the same backward: DDP's gradient hooks fire as usual and every gradient is "
        'averaged once.',
    'procedures/checkpoint-non-reentrant-static-graph':
        'static_graph with non-reentrant checkpointing: the recorded graph is the '
        'recomputed one, and every gradient is averaged once per synced backward.',
    'procedures/checkpoint-non-reentrant-find-unused':
        'find_unused_parameters sees through non-reentrant checkpointing (one autograd '
        'graph): no parameter is marked unused wrongly and every gradient is averaged.',
    'procedures/checkpoint-non-reentrant-no-sync':
        'Checkpointed microbatches inside no_sync accumulate local gradients; the synced '
        "microbatch's backward, recomputation included, reduces the sum once.",
    'procedures/autocast-bf16':
        'Under autocast the forward runs in bfloat16 but parameters and their gradients '
        'stay float32: DDP reduces float32 gradients, exactly as without autocast.',
    'procedures/autocast-bf16-gpt':
        "autocast changes the forward's compute dtype, not the parameters': a GPT's float32 "
        'gradients are averaged in float32, with its tied embedding reduced once.',
    'procedures/autocast-bf16-no-sync':
        "autocast and no_sync together: BatchNorm's float32 buffers and the float32 "
        'gradients accumulate locally under no_sync and are averaged at the synced '
        'microbatch.',
    'procedures/forward-twice':
        'Two forwards before one backward: the gradient is the sum over both forwards, '
        'reduced once by the backward through the summed loss.',
    'procedures/forward-twice-buffers':
        'A forward with gradient sync on makes the next forward broadcast buffers: the '
        "second of two forwards before a backward starts from rank 0's buffers again.",
    'procedures/forward-twice-unused':
        "With find_unused_parameters DDP searches the graph from the last forward's outputs "
        'before its backward: a branch unused on one rank must still get the averaged '
        'gradient there.',
    'procedures/forward-twice-no-sync':
        'Two forwards per microbatch under no_sync accumulate locally; buffers are '
        'broadcast only at the forwards that follow a synced one.',
    'procedures/eval-between-steps':
        "An eval forward under no_grad after a synced step broadcasts rank 0's buffers and "
        'disables the broadcast before the next training forward.',
    'procedures/eval-between-steps-no-sync':
        "An eval forward between no_sync accumulation steps takes part in DDP's "
        'buffer-broadcast decision like any forward: it broadcasts only after a synced '
        'training forward.',
    'procedures/eval-between-steps-resnet':
        "A channels_last ResNet's eval forward between steps follows the same "
        'buffer-broadcast rule: BatchNorm statistics from rank 0 after a synced step, none '
        'before the next training forward.',
    'procedures/uneven-batches':
        'DDP averages per-rank gradients with equal weights: with uneven batch sizes the '
        'gradient is the mean of per-rank means, not the sample-weighted mean.',
    'procedures/uneven-batches-exact':
        'The mean of per-rank mean gradients, each rank weighted equally whatever its batch '
        'size, bitwise on exact data.',
    'procedures/uneven-batches-buffers':
        "BatchNorm running statistics come from each rank's own batch; with uneven batches "
        "the broadcast still hands every rank rank 0's statistics.",
    'procedures/uneven-batches-no-sync':
        "Uneven batches with no_sync accumulation: each rank's accumulated local gradient "
        'counts equally in the average, whatever its batch sizes.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
