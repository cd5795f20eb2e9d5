"""Pairwise feature interactions: scenarios that cover the valid pairs of dimension values
the rest of the catalog leaves uncovered (docs/interactions.md).

Generated, do not edit by hand: ``python -m ddp_conformance.catalog.interaction_rows >
suites/test_interactions.py`` (a covering array over ddp_conformance/catalog/interactions.py's
dimensions, under catalog/exclusions.py's exclusions, starting from the catalog's own rows).
Each row gives its non-default values and the pair its rule names; rows come in the
generator's order, which covers the most new pairs first.
"""
from ddp_conformance.catalog.interaction_rows import suite_scenario
from ddp_conformance.catalog.rules import with_rules

ROWS = [
    # interactions/tiny-cap+no-broadcast
    ({"bucket_cap": "tiny", "gradient_as_bucket_view": "on", "static_graph": "on",
      "broadcast_buffers": "off", "precision": "autocast", "accumulation": "multi_auto_sync",
      "forwards": "several", "eval_between_steps": "on", "set_to_none": "zeros", "optimizer":
      "zero_sgd", "comm_hook": "allreduce_to_new_tensor", "model": "unused_parameters"},
     (("bucket_cap", "tiny"), ("broadcast_buffers", "off"))),
    # interactions/tiny-cap+allreduce-hook
    ({"bucket_cap": "tiny", "gradient_as_bucket_view": "on", "static_graph": "on",
      "find_unused_parameters": "on", "broadcast_buffers": "off", "precision": "autocast",
      "accumulation": "multi_auto_sync", "eval_between_steps": "on", "set_to_none": "zeros",
      "optimizer": "adam", "comm_hook": "allreduce", "model": "mixed_dtypes"},
     (("bucket_cap", "tiny"), ("comm_hook", "allreduce"))),
    # interactions/tiny-cap+sync-each
    ({"bucket_cap": "tiny", "gradient_as_bucket_view": "on", "static_graph": "on",
      "broadcast_buffers": "off", "accumulation": "sync_each", "forwards": "several",
      "eval_between_steps": "on", "set_to_none": "zeros", "optimizer": "sgd_momentum",
      "comm_hook": "builtin_fp16_compress", "model": "buffers_replaced"},
     (("bucket_cap", "tiny"), ("accumulation", "sync_each"))),
    # interactions/default-cap+fused-sgd
    ({"gradient_as_bucket_view": "on", "find_unused_parameters": "on", "broadcast_buffers": "off",
      "precision": "autocast", "join": "uneven", "set_to_none": "zeros", "optimizer": "fused_sgd",
      "model": "buffers_replaced"},
     (("bucket_cap", "default"), ("optimizer", "fused_sgd"))),
    # interactions/tiny-cap+forced-sync
    ({"bucket_cap": "tiny", "gradient_as_bucket_view": "on", "broadcast_buffers": "off",
      "precision": "autocast", "accumulation": "forced_sync", "forwards": "several",
      "eval_between_steps": "on", "set_to_none": "zeros", "optimizer": "sgd_momentum",
      "comm_hook": "bucket_position", "model": "sparse"},
     (("bucket_cap", "tiny"), ("accumulation", "forced_sync"))),
    # interactions/default-cap+cpp-allreduce
    ({"gradient_as_bucket_view": "on", "find_unused_parameters": "on", "broadcast_buffers": "off",
      "accumulation": "nested_no_sync", "join": "uneven", "set_to_none": "zeros", "optimizer":
      "sgd_momentum", "comm_hook": "builtin_allreduce", "model": "low_precision"},
     (("bucket_cap", "default"), ("comm_hook", "builtin_allreduce"))),
    # interactions/tiny-cap+single-auto
    ({"bucket_cap": "tiny", "gradient_as_bucket_view": "on", "find_unused_parameters": "on",
      "broadcast_buffers": "off", "precision": "autocast", "accumulation": "single_auto_sync",
      "join": "uneven", "set_to_none": "zeros", "optimizer": "adam", "comm_hook":
      "builtin_allreduce", "model": "unused_parameters"},
     (("bucket_cap", "tiny"), ("accumulation", "single_auto_sync"))),
    # interactions/tiny-cap+saved
    ({"bucket_cap": "tiny", "broadcast_buffers": "off", "precision": "autocast", "accumulation":
      "no_sync", "forwards": "several", "eval_between_steps": "on", "checkpointing":
      "saved_mid_run", "set_to_none": "zeros", "model": "mixed_dtypes"},
     (("bucket_cap", "tiny"), ("checkpointing", "saved_mid_run"))),
    # interactions/static-graph+fused-sgd
    ({"static_graph": "on", "forwards": "several", "eval_between_steps": "on", "optimizer":
      "fused_sgd", "model": "unused_parameters"},
     (("static_graph", "on"), ("optimizer", "fused_sgd"))),
    # interactions/tiny-cap+fp16-hook
    ({"bucket_cap": "tiny", "gradient_as_bucket_view": "on", "broadcast_buffers": "off",
      "accumulation": "single_auto_sync", "forwards": "several", "eval_between_steps": "on",
      "set_to_none": "zeros", "optimizer": "sgd_momentum", "comm_hook": "fp16_compress", "model":
      "mixed_dtypes"},
     (("bucket_cap", "tiny"), ("comm_hook", "fp16_compress"))),
    # interactions/find-unused+forced-sync
    ({"find_unused_parameters": "on", "accumulation": "forced_sync", "eval_between_steps": "on",
      "set_to_none": "zeros", "optimizer": "zero_sgd", "comm_hook": "builtin_allreduce", "model":
      "buffers_in_place"},
     (("find_unused_parameters", "on"), ("accumulation", "forced_sync"))),
    # interactions/no-broadcast+tied
    ({"broadcast_buffers": "off", "precision": "autocast", "accumulation": "nested_no_sync",
      "forwards": "several", "eval_between_steps": "on", "set_to_none": "zeros", "optimizer":
      "adam", "comm_hook": "builtin_allreduce", "model": "tied"},
     (("broadcast_buffers", "off"), ("model", "tied"))),
    # interactions/find-unused+fp16-hook
    ({"find_unused_parameters": "on", "accumulation": "nested_no_sync", "optimizer": "zero_sgd",
      "comm_hook": "fp16_compress", "model": "buffers_replaced"},
     (("find_unused_parameters", "on"), ("comm_hook", "fp16_compress"))),
    # interactions/default-cap+position-hook
    ({"find_unused_parameters": "on", "precision": "autocast", "accumulation": "sync_each",
      "optimizer": "adam", "comm_hook": "bucket_position", "model": "mixed_dtypes"},
     (("bucket_cap", "default"), ("comm_hook", "bucket_position"))),
    # interactions/forced-sync+saved
    ({"accumulation": "forced_sync", "forwards": "several", "eval_between_steps": "on",
      "checkpointing": "saved_mid_run", "model": "low_precision"},
     (("accumulation", "forced_sync"), ("checkpointing", "saved_mid_run"))),
    # interactions/static-graph+position-hook
    ({"static_graph": "on", "accumulation": "multi_auto_sync", "optimizer": "zero_sgd",
      "comm_hook": "bucket_position", "model": "buffers_replaced"},
     (("static_graph", "on"), ("comm_hook", "bucket_position"))),
    # interactions/no-sync+zero-sgd
    ({"accumulation": "no_sync", "forwards": "several", "optimizer": "zero_sgd", "comm_hook":
      "allreduce", "model": "sparse"},
     (("accumulation", "no_sync"), ("optimizer", "zero_sgd"))),
    # interactions/find-unused+cpp-fp16
    ({"find_unused_parameters": "on", "accumulation": "multi_auto_sync", "optimizer": "zero_sgd",
      "comm_hook": "builtin_fp16_compress", "model": "tied"},
     (("find_unused_parameters", "on"), ("comm_hook", "builtin_fp16_compress"))),
    # interactions/single-auto+zero-sgd
    ({"accumulation": "single_auto_sync", "optimizer": "zero_sgd", "comm_hook": "bucket_position",
      "model": "low_precision"},
     (("accumulation", "single_auto_sync"), ("optimizer", "zero_sgd"))),
    # interactions/no-sync+cpp-fp16
    ({"accumulation": "no_sync", "join": "uneven", "comm_hook": "builtin_fp16_compress", "model":
      "mixed_dtypes"},
     (("accumulation", "no_sync"), ("comm_hook", "builtin_fp16_compress"))),
    # interactions/find-unused+sparse
    ({"find_unused_parameters": "on", "accumulation": "nested_no_sync", "optimizer":
      "sgd_momentum", "comm_hook": "allreduce", "model": "sparse"},
     (("find_unused_parameters", "on"), ("model", "sparse"))),
    # interactions/forced-sync+adam
    ({"accumulation": "forced_sync", "optimizer": "adam", "comm_hook": "builtin_allreduce",
      "model": "mixed_dtypes"},
     (("accumulation", "forced_sync"), ("optimizer", "adam"))),
    # interactions/find-unused+new-tensor-hook
    ({"find_unused_parameters": "on", "accumulation": "sync_each", "optimizer": "zero_sgd",
      "comm_hook": "allreduce_to_new_tensor", "model": "tied"},
     (("find_unused_parameters", "on"), ("comm_hook", "allreduce_to_new_tensor"))),
    # interactions/forced-sync+new-tensor-hook
    ({"accumulation": "forced_sync", "optimizer": "adam", "comm_hook": "allreduce_to_new_tensor",
      "model": "buffers_replaced"},
     (("accumulation", "forced_sync"), ("comm_hook", "allreduce_to_new_tensor"))),
    # interactions/nested-no-sync+new-tensor-hook
    ({"accumulation": "nested_no_sync", "join": "uneven", "optimizer": "sgd_momentum",
      "comm_hook": "allreduce_to_new_tensor", "model": "mixed_dtypes"},
     (("accumulation", "nested_no_sync"), ("comm_hook", "allreduce_to_new_tensor"))),
    # interactions/static-graph+fp16-hook
    ({"static_graph": "on", "accumulation": "sync_each", "comm_hook": "fp16_compress", "model":
      "buffers_in_place"},
     (("static_graph", "on"), ("comm_hook", "fp16_compress"))),
    # interactions/no-sync+new-tensor-hook
    ({"accumulation": "no_sync", "optimizer": "adam", "comm_hook": "allreduce_to_new_tensor",
      "model": "buffers_in_place"},
     (("accumulation", "no_sync"), ("comm_hook", "allreduce_to_new_tensor"))),
    # interactions/static-graph+cpp-allreduce
    ({"static_graph": "on", "accumulation": "multi_auto_sync", "comm_hook": "builtin_allreduce",
      "model": "sparse"},
     (("static_graph", "on"), ("comm_hook", "builtin_allreduce"))),
    # interactions/single-auto+sgd
    ({"accumulation": "single_auto_sync", "join": "uneven", "comm_hook": "bucket_position",
      "model": "tied"},
     (("accumulation", "single_auto_sync"), ("optimizer", "sgd"))),
    # interactions/sync-each+saved
    ({"find_unused_parameters": "on", "accumulation": "sync_each", "checkpointing":
      "saved_mid_run", "model": "unused_parameters"},
     (("accumulation", "sync_each"), ("checkpointing", "saved_mid_run"))),
    # interactions/single-auto+saved
    ({"accumulation": "single_auto_sync", "checkpointing": "saved_mid_run", "model":
      "buffers_replaced"},
     (("accumulation", "single_auto_sync"), ("checkpointing", "saved_mid_run"))),
    # interactions/static-graph+low-precision
    ({"static_graph": "on", "accumulation": "multi_auto_sync", "comm_hook": "allreduce", "model":
      "low_precision"},
     (("static_graph", "on"), ("model", "low_precision"))),
    # interactions/nested-no-sync+position-hook
    ({"accumulation": "nested_no_sync", "comm_hook": "bucket_position", "model":
      "buffers_in_place"},
     (("accumulation", "nested_no_sync"), ("comm_hook", "bucket_position"))),
    # interactions/single-auto+allreduce-hook
    ({"accumulation": "single_auto_sync", "join": "uneven", "comm_hook": "allreduce", "model":
      "buffers_replaced"},
     (("accumulation", "single_auto_sync"), ("comm_hook", "allreduce"))),
    # interactions/sync-each+cpp-allreduce
    ({"accumulation": "sync_each", "comm_hook": "builtin_allreduce", "model": "low_precision"},
     (("accumulation", "sync_each"), ("comm_hook", "builtin_allreduce"))),
    # interactions/forced-sync+fp16-hook
    ({"accumulation": "forced_sync", "comm_hook": "fp16_compress", "model": "tied"},
     (("accumulation", "forced_sync"), ("comm_hook", "fp16_compress"))),
    # interactions/nested-no-sync+cpp-fp16
    ({"find_unused_parameters": "on", "accumulation": "nested_no_sync", "comm_hook":
      "builtin_fp16_compress", "model": "unused_parameters"},
     (("accumulation", "nested_no_sync"), ("comm_hook", "builtin_fp16_compress"))),
    # interactions/no-sync+fp16-hook
    ({"find_unused_parameters": "on", "accumulation": "no_sync", "join": "uneven", "comm_hook":
      "fp16_compress", "model": "unused_parameters"},
     (("accumulation", "no_sync"), ("comm_hook", "fp16_compress"))),
    # interactions/single-auto+cpp-fp16
    ({"accumulation": "single_auto_sync", "comm_hook": "builtin_fp16_compress", "model":
      "buffers_in_place"},
     (("accumulation", "single_auto_sync"), ("comm_hook", "builtin_fp16_compress"))),
    # interactions/sync-each+allreduce-hook
    ({"find_unused_parameters": "on", "accumulation": "sync_each", "comm_hook": "allreduce",
      "model": "unused_parameters"},
     (("accumulation", "sync_each"), ("comm_hook", "allreduce"))),
    # interactions/single-auto+new-tensor-hook
    ({"accumulation": "single_auto_sync", "comm_hook": "allreduce_to_new_tensor", "model":
      "sparse"},
     (("accumulation", "single_auto_sync"), ("comm_hook", "allreduce_to_new_tensor"))),
    # interactions/multi-auto+buffers-in-place
    ({"accumulation": "multi_auto_sync", "comm_hook": "allreduce", "model": "buffers_in_place"},
     (("accumulation", "multi_auto_sync"), ("model", "buffers_in_place"))),
    # interactions/forced-sync+allreduce-hook
    ({"accumulation": "forced_sync", "comm_hook": "allreduce", "model": "tied"},
     (("accumulation", "forced_sync"), ("comm_hook", "allreduce"))),
    # interactions/fused-sgd+mixed-dtypes
    ({"optimizer": "fused_sgd", "model": "mixed_dtypes"},
     (("optimizer", "fused_sgd"), ("model", "mixed_dtypes"))),
    # interactions/no-sync+cpp-allreduce
    ({"accumulation": "no_sync", "comm_hook": "builtin_allreduce", "model": "buffers_replaced"},
     (("accumulation", "no_sync"), ("comm_hook", "builtin_allreduce"))),
    # interactions/nested-no-sync+saved
    ({"accumulation": "nested_no_sync", "checkpointing": "saved_mid_run", "model": "sparse"},
     (("accumulation", "nested_no_sync"), ("checkpointing", "saved_mid_run"))),
    # interactions/fused-sgd+tied
    ({"optimizer": "fused_sgd", "model": "tied"},
     (("optimizer", "fused_sgd"), ("model", "tied"))),
    # interactions/no-sync+low-precision
    ({"accumulation": "no_sync", "comm_hook": "allreduce_to_new_tensor", "model": "low_precision"},
     (("accumulation", "no_sync"), ("model", "low_precision"))),
    # interactions/fused-sgd+buffers-in-place
    ({"optimizer": "fused_sgd", "model": "buffers_in_place"},
     (("optimizer", "fused_sgd"), ("model", "buffers_in_place"))),
    # interactions/sync-each+sparse
    ({"accumulation": "sync_each", "model": "sparse"},
     (("accumulation", "sync_each"), ("model", "sparse"))),
    # interactions/fused-sgd+low-precision
    ({"optimizer": "fused_sgd", "model": "low_precision"},
     (("optimizer", "fused_sgd"), ("model", "low_precision"))),
    # interactions/no-sync+position-hook
    ({"find_unused_parameters": "on", "accumulation": "no_sync", "comm_hook": "bucket_position",
      "model": "unused_parameters"},
     (("accumulation", "no_sync"), ("comm_hook", "bucket_position"))),
    # interactions/no-broadcast+plain
    ({"broadcast_buffers": "off", "accumulation": "multi_auto_sync", "eval_between_steps": "on",
      "comm_hook": "fp16_compress"},
     (("broadcast_buffers", "off"), ("model", "plain"))),
    # interactions/multi-auto+saved
    ({"accumulation": "multi_auto_sync", "checkpointing": "saved_mid_run", "model": "tied"},
     (("accumulation", "multi_auto_sync"), ("checkpointing", "saved_mid_run"))),
    # interactions/forced-sync+cpp-fp16
    ({"accumulation": "forced_sync", "comm_hook": "builtin_fp16_compress"},
     (("accumulation", "forced_sync"), ("comm_hook", "builtin_fp16_compress"))),
]

#: The first DEFAULT_RUN rows (they cover the most new pairs) run by default; the others
#: are slow scenarios, run with --slow (docs/interactions.md gives both coverage figures).
DEFAULT_RUN = 35
SCENARIOS = [suite_scenario(values, pair, slow=i >= DEFAULT_RUN)
             for i, (values, pair) in enumerate(ROWS)]
#: Each scenario carries its rule, composed from the phrases of the pair it covers first.
RULES: dict[str, str] = {}
SCENARIOS = with_rules(SCENARIOS, RULES)
