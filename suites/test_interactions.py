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
      "model": "unused_output"},
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
    ({"bucket_cap": "tiny", "gradient_as_bucket_view": "on", "find_unused_parameters": "on",
      "broadcast_buffers": "off", "accumulation": "single_auto_sync", "eval_between_steps": "on",
      "set_to_none": "zeros", "optimizer": "zero_sgd", "comm_hook": "fp16_compress", "model":
      "unused_output"},
     (("bucket_cap", "tiny"), ("comm_hook", "fp16_compress"))),
    # interactions/find-unused+forced-sync
    ({"find_unused_parameters": "on", "accumulation": "forced_sync", "optimizer": "adam",
      "comm_hook": "allreduce_to_new_tensor", "model": "unused_output"},
     (("find_unused_parameters", "on"), ("accumulation", "forced_sync"))),
    # interactions/default-cap+position-hook
    ({"find_unused_parameters": "on", "accumulation": "single_auto_sync", "join": "uneven",
      "optimizer": "sgd_momentum", "comm_hook": "bucket_position", "model": "mixed_dtypes"},
     (("bucket_cap", "default"), ("comm_hook", "bucket_position"))),
    # interactions/forced-sync+zero-sgd
    ({"accumulation": "forced_sync", "forwards": "several", "eval_between_steps": "on",
      "set_to_none": "zeros", "optimizer": "zero_sgd", "comm_hook": "builtin_allreduce", "model":
      "buffers_in_place"},
     (("accumulation", "forced_sync"), ("optimizer", "zero_sgd"))),
    # interactions/static-graph+cpp-allreduce
    ({"static_graph": "on", "find_unused_parameters": "on", "broadcast_buffers": "off",
      "precision": "autocast", "accumulation": "sync_each", "eval_between_steps": "on",
      "set_to_none": "zeros", "optimizer": "zero_sgd", "comm_hook": "builtin_allreduce", "model":
      "tied"},
     (("static_graph", "on"), ("comm_hook", "builtin_allreduce"))),
    # interactions/nested-no-sync+two-forwards
    ({"accumulation": "nested_no_sync", "forwards": "several", "eval_between_steps": "on",
      "optimizer": "sgd_momentum", "comm_hook": "fp16_compress", "model": "tied"},
     (("accumulation", "nested_no_sync"), ("forwards", "several"))),
    # interactions/sync-each+new-tensor-hook
    ({"accumulation": "sync_each", "optimizer": "sgd_momentum", "comm_hook":
      "allreduce_to_new_tensor", "model": "mixed_dtypes"},
     (("accumulation", "sync_each"), ("comm_hook", "allreduce_to_new_tensor"))),
    # interactions/find-unused+buffers-replaced
    ({"find_unused_parameters": "on", "precision": "autocast", "accumulation": "forced_sync",
      "checkpointing": "saved_mid_run", "model": "buffers_replaced"},
     (("find_unused_parameters", "on"), ("model", "buffers_replaced"))),
    # interactions/static-graph+position-hook
    ({"static_graph": "on", "accumulation": "multi_auto_sync", "optimizer": "zero_sgd",
      "comm_hook": "bucket_position", "model": "buffers_replaced"},
     (("static_graph", "on"), ("comm_hook", "bucket_position"))),
    # interactions/single-auto+two-forwards
    ({"accumulation": "single_auto_sync", "forwards": "several", "eval_between_steps": "on",
      "optimizer": "zero_sgd", "comm_hook": "allreduce", "model": "low_precision"},
     (("accumulation", "single_auto_sync"), ("forwards", "several"))),
    # interactions/find-unused+cpp-fp16
    ({"find_unused_parameters": "on", "accumulation": "multi_auto_sync", "optimizer": "zero_sgd",
      "comm_hook": "builtin_fp16_compress", "model": "tied"},
     (("find_unused_parameters", "on"), ("comm_hook", "builtin_fp16_compress"))),
    # interactions/find-unused+sparse
    ({"find_unused_parameters": "on", "accumulation": "no_sync", "optimizer": "zero_sgd",
      "comm_hook": "builtin_allreduce", "model": "sparse"},
     (("find_unused_parameters", "on"), ("model", "sparse"))),
    # interactions/autocast+nested-no-sync
    ({"precision": "autocast", "accumulation": "nested_no_sync", "forwards": "several",
      "optimizer": "adam", "comm_hook": "bucket_position", "model": "tied"},
     (("precision", "autocast"), ("accumulation", "nested_no_sync"))),
    # interactions/forced-sync+allreduce-hook
    ({"accumulation": "forced_sync", "optimizer": "sgd_momentum", "comm_hook": "allreduce",
      "model": "low_precision"},
     (("accumulation", "forced_sync"), ("comm_hook", "allreduce"))),
    # interactions/no-sync+cpp-fp16
    ({"find_unused_parameters": "on", "accumulation": "no_sync", "join": "uneven", "optimizer":
      "sgd_momentum", "comm_hook": "builtin_fp16_compress", "model": "unused_output"},
     (("accumulation", "no_sync"), ("comm_hook", "builtin_fp16_compress"))),
    # interactions/nested-no-sync+allreduce-hook
    ({"accumulation": "nested_no_sync", "join": "uneven", "optimizer": "adam", "comm_hook":
      "allreduce", "model": "buffers_replaced"},
     (("accumulation", "nested_no_sync"), ("comm_hook", "allreduce"))),
    # interactions/multi-auto+sgd
    ({"accumulation": "multi_auto_sync", "comm_hook": "builtin_allreduce", "model": "mixed_dtypes"},
     (("accumulation", "multi_auto_sync"), ("optimizer", "sgd"))),
    # interactions/multi-auto+saved
    ({"find_unused_parameters": "on", "accumulation": "multi_auto_sync", "checkpointing":
      "saved_mid_run", "model": "unused_output"},
     (("accumulation", "multi_auto_sync"), ("checkpointing", "saved_mid_run"))),
    # interactions/nested-no-sync+cpp-fp16
    ({"accumulation": "nested_no_sync", "comm_hook": "builtin_fp16_compress", "model":
      "mixed_dtypes"},
     (("accumulation", "nested_no_sync"), ("comm_hook", "builtin_fp16_compress"))),
    # interactions/static-graph+fp16-hook
    ({"static_graph": "on", "find_unused_parameters": "on", "accumulation": "sync_each",
      "comm_hook": "fp16_compress", "model": "buffers_in_place"},
     (("static_graph", "on"), ("comm_hook", "fp16_compress"))),
    # interactions/nested-no-sync+new-tensor-hook
    ({"find_unused_parameters": "on", "accumulation": "nested_no_sync", "join": "uneven",
      "comm_hook": "allreduce_to_new_tensor", "model": "unused_output"},
     (("accumulation", "nested_no_sync"), ("comm_hook", "allreduce_to_new_tensor"))),
    # interactions/no-sync+new-tensor-hook
    ({"accumulation": "no_sync", "optimizer": "adam", "comm_hook": "allreduce_to_new_tensor",
      "model": "buffers_in_place"},
     (("accumulation", "no_sync"), ("comm_hook", "allreduce_to_new_tensor"))),
    # interactions/sync-each+saved
    ({"find_unused_parameters": "on", "accumulation": "sync_each", "checkpointing":
      "saved_mid_run", "model": "unused_parameters"},
     (("accumulation", "sync_each"), ("checkpointing", "saved_mid_run"))),
    # interactions/sync-each+adam
    ({"find_unused_parameters": "on", "accumulation": "sync_each", "optimizer": "adam",
      "comm_hook": "allreduce", "model": "unused_output"},
     (("accumulation", "sync_each"), ("optimizer", "adam"))),
    # interactions/single-auto+saved
    ({"accumulation": "single_auto_sync", "checkpointing": "saved_mid_run", "model": "tied"},
     (("accumulation", "single_auto_sync"), ("checkpointing", "saved_mid_run"))),
    # interactions/static-graph+low-precision
    ({"static_graph": "on", "accumulation": "multi_auto_sync", "comm_hook": "bucket_position",
      "model": "low_precision"},
     (("static_graph", "on"), ("model", "low_precision"))),
    # interactions/multi-auto+buffers-in-place
    ({"accumulation": "multi_auto_sync", "comm_hook": "bucket_position", "model":
      "buffers_in_place"},
     (("accumulation", "multi_auto_sync"), ("model", "buffers_in_place"))),
    # interactions/nested-no-sync+saved
    ({"accumulation": "nested_no_sync", "checkpointing": "saved_mid_run", "model": "sparse"},
     (("accumulation", "nested_no_sync"), ("checkpointing", "saved_mid_run"))),
    # interactions/sync-each+low-precision
    ({"accumulation": "sync_each", "comm_hook": "allreduce_to_new_tensor", "model":
      "low_precision"},
     (("accumulation", "sync_each"), ("model", "low_precision"))),
    # interactions/forced-sync+fp16-hook
    ({"accumulation": "forced_sync", "comm_hook": "fp16_compress", "model": "mixed_dtypes"},
     (("accumulation", "forced_sync"), ("comm_hook", "fp16_compress"))),
    # interactions/nested-no-sync+zero-sgd
    ({"find_unused_parameters": "on", "accumulation": "nested_no_sync", "optimizer": "zero_sgd",
      "comm_hook": "builtin_fp16_compress", "model": "unused_parameters"},
     (("accumulation", "nested_no_sync"), ("optimizer", "zero_sgd"))),
    # interactions/no-sync+fp16-hook
    ({"find_unused_parameters": "on", "accumulation": "no_sync", "comm_hook": "fp16_compress",
      "model": "unused_parameters"},
     (("accumulation", "no_sync"), ("comm_hook", "fp16_compress"))),
    # interactions/single-auto+cpp-fp16
    ({"accumulation": "single_auto_sync", "comm_hook": "builtin_fp16_compress", "model":
      "buffers_in_place"},
     (("accumulation", "single_auto_sync"), ("comm_hook", "builtin_fp16_compress"))),
    # interactions/no-sync+allreduce-hook
    ({"find_unused_parameters": "on", "accumulation": "no_sync", "comm_hook": "allreduce",
      "model": "unused_parameters"},
     (("accumulation", "no_sync"), ("comm_hook", "allreduce"))),
    # interactions/single-auto+new-tensor-hook
    ({"accumulation": "single_auto_sync", "comm_hook": "allreduce_to_new_tensor", "model":
      "sparse"},
     (("accumulation", "single_auto_sync"), ("comm_hook", "allreduce_to_new_tensor"))),
    # interactions/allreduce-hook+buffers-in-place
    ({"comm_hook": "allreduce", "model": "buffers_in_place"},
     (("comm_hook", "allreduce"), ("model", "buffers_in_place"))),
    # interactions/forced-sync+tied
    ({"accumulation": "forced_sync", "comm_hook": "allreduce", "model": "tied"},
     (("accumulation", "forced_sync"), ("model", "tied"))),
    # interactions/fused-sgd+mixed-dtypes
    ({"optimizer": "fused_sgd", "model": "mixed_dtypes"},
     (("optimizer", "fused_sgd"), ("model", "mixed_dtypes"))),
    # interactions/new-tensor-hook+tied
    ({"comm_hook": "allreduce_to_new_tensor", "model": "tied"},
     (("comm_hook", "allreduce_to_new_tensor"), ("model", "tied"))),
    # interactions/static-graph+sparse
    ({"static_graph": "on", "accumulation": "multi_auto_sync", "comm_hook": "allreduce", "model":
      "sparse"},
     (("static_graph", "on"), ("model", "sparse"))),
    # interactions/fused-sgd+tied
    ({"optimizer": "fused_sgd", "model": "tied"},
     (("optimizer", "fused_sgd"), ("model", "tied"))),
    # interactions/no-sync+low-precision
    ({"accumulation": "no_sync", "checkpointing": "saved_mid_run", "model": "low_precision"},
     (("accumulation", "no_sync"), ("model", "low_precision"))),
    # interactions/no-sync+buffers-replaced
    ({"accumulation": "no_sync", "comm_hook": "builtin_allreduce", "model": "buffers_replaced"},
     (("accumulation", "no_sync"), ("model", "buffers_replaced"))),
    # interactions/fused-sgd+buffers-in-place
    ({"optimizer": "fused_sgd", "model": "buffers_in_place"},
     (("optimizer", "fused_sgd"), ("model", "buffers_in_place"))),
    # interactions/cpp-allreduce+unused-output
    ({"find_unused_parameters": "on", "comm_hook": "builtin_allreduce", "model": "unused_output"},
     (("comm_hook", "builtin_allreduce"), ("model", "unused_output"))),
    # interactions/single-auto+buffers-replaced
    ({"accumulation": "single_auto_sync", "comm_hook": "allreduce_to_new_tensor", "model":
      "buffers_replaced"},
     (("accumulation", "single_auto_sync"), ("model", "buffers_replaced"))),
    # interactions/multi-auto+fp16-hook
    ({"accumulation": "multi_auto_sync", "comm_hook": "fp16_compress", "model": "buffers_replaced"},
     (("accumulation", "multi_auto_sync"), ("comm_hook", "fp16_compress"))),
    # interactions/sync-each+position-hook
    ({"accumulation": "sync_each", "comm_hook": "bucket_position", "model": "sparse"},
     (("accumulation", "sync_each"), ("comm_hook", "bucket_position"))),
    # interactions/fused-sgd+low-precision
    ({"optimizer": "fused_sgd", "model": "low_precision"},
     (("optimizer", "fused_sgd"), ("model", "low_precision"))),
    # interactions/no-sync+position-hook
    ({"find_unused_parameters": "on", "accumulation": "no_sync", "comm_hook": "bucket_position",
      "model": "unused_parameters"},
     (("accumulation", "no_sync"), ("comm_hook", "bucket_position"))),
    # interactions/no-broadcast+plain
    ({"broadcast_buffers": "off", "accumulation": "forced_sync", "eval_between_steps": "on",
      "comm_hook": "builtin_fp16_compress"},
     (("broadcast_buffers", "off"), ("model", "plain"))),
    # interactions/fused-sgd+buffers-replaced
    ({"optimizer": "fused_sgd", "model": "buffers_replaced"},
     (("optimizer", "fused_sgd"), ("model", "buffers_replaced"))),
    # interactions/position-hook+unused-output
    ({"find_unused_parameters": "on", "comm_hook": "bucket_position", "model": "unused_output"},
     (("comm_hook", "bucket_position"), ("model", "unused_output"))),
]

#: The first DEFAULT_RUN rows (they cover the most new pairs) run by default; the others
#: are slow scenarios, run with --slow (docs/interactions.md gives both coverage figures).
DEFAULT_RUN = 37
SCENARIOS = [suite_scenario(values, pair, slow=i >= DEFAULT_RUN)
             for i, (values, pair) in enumerate(ROWS)]
#: Each scenario carries its rule, composed from the phrases of the pair it covers first.
RULES: dict[str, str] = {}
SCENARIOS = with_rules(SCENARIOS, RULES)
