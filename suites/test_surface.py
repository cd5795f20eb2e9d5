"""torch 2.13 DDP's surface beyond the classic options: the newer constructor keywords,
torch's comm-hook modules and C++ hooks, buffer comm hooks, the fused optimizer,
``_update_process_group`` and a wrapper copied mid-run."""
from ddp_conformance import JoinSpec, Scenario
from ddp_conformance.catalog.rules import with_rules

SCENARIOS = [
    # --- constructor keywords ------------------------------------------------------------
    Scenario("surface/bucket-cap-mb-list", "mlp", steps=3,
             ddp_options={"bucket_cap_mb_list": [0.0002, 0.0005, 1]},
             description="bucket_cap_mb_list: a cap per bucket, for the first layout and the "
                         "rebuild"),
    Scenario("surface/bucket-cap-mb-list-find-unused", "unused_always_and_alternate", steps=4,
             ddp_options={"bucket_cap_mb_list": [0.0001, 0.001],
                          "find_unused_parameters": True},
             description="bucket_cap_mb_list with find_unused_parameters (initial buckets "
                         "from the list)"),
    Scenario("surface/forward-sync-buffers-off", "conv_bn", steps=3, init="per_rank",
             ddp_options={"forward_sync_buffers": False},
             description="forward_sync_buffers=False: buffers synced at init, never in "
                         "forward"),
    Scenario("surface/forward-sync-buffers-wins", "conv_bn", steps=3,
             ddp_options={"forward_sync_buffers": True, "broadcast_buffers": False},
             description="forward_sync_buffers given: the deprecated broadcast_buffers is "
                         "ignored (a FutureWarning)"),
    Scenario("surface/broadcast-buffers-explicit", "conv_bn", steps=2,
             ddp_options={"broadcast_buffers": True},
             description="broadcast_buffers given (deprecated, a FutureWarning): still "
                         "honoured"),
    Scenario("surface/skip-all-reduce-unused", "unused_always_and_alternate", steps=4,
             ddp_options={"find_unused_parameters": True,
                          "skip_all_reduce_unused_params": True},
             description="skip_all_reduce_unused_params: parameters unused on every rank "
                         "are not reduced; their gradients stay None"),
    Scenario("surface/batched-grad-copy", "mlp", steps=3,
             ddp_options={"batched_grad_copy": True, "bucket_cap_mb": 0.0005},
             description="batched_grad_copy: the same gradients"),
    Scenario("surface/device-mesh", "mlp", steps=3, ddp_options={"device_mesh": True},
             description="a 1-D DeviceMesh over the group instead of process_group"),
    Scenario("surface/check-reduction", "mlp", steps=2, ddp_options={"check_reduction": True},
             description="check_reduction (deprecated, a FutureWarning): no effect"),
    # torch's DDP launches the delayed all-reduce from a hook on the first layer's weight,
    # whose gradient comes last, so the last layer's (delayed) gradients are in the flat
    # buffer by then; it never waits for it (barrier_after_backward: what a Gloo user does).
    Scenario("surface/delay-all-reduce", "mlp", steps=3, barrier_after_backward=True,
             ddp_options={"delay_all_reduce_named_params": ["4.weight", "4.bias"],
                          "param_to_hook_all_reduce": "0.weight"},
             description="delay_all_reduce_named_params: the last layer reduced in one "
                         "flat buffer, launched from the first layer's gradient hook"),
    # --- comm hooks --------------------------------------------------------------------
    Scenario("surface/builtin-allreduce", "mlp", comm_hook="builtin_allreduce",
             ddp_options={"bucket_cap_mb": 0.0005},
             description="_register_builtin_comm_hook(ALLREDUCE): torch's C++ allreduce hook"),
    # A float16 reduction: the argument of comm-hooks/fp16-compress (8 u of float16).
    Scenario("surface/builtin-fp16-compress", "mlp", comm_hook="builtin_fp16_compress",
             rtol=4e-3, description="_register_builtin_comm_hook(FP16_COMPRESS)"),
    Scenario("surface/fp16-compress-wrapper", "mlp", comm_hook="fp16_compress_wrapper",
             rtol=4e-3, description="fp16_compress_wrapper(allreduce_hook): float16 bucket, "
                                    "float16 tolerance"),
    # torch 2.13's batched_powerSGD_hook raises AssertionError at its first compressed
    # step, on any backend (it hands a 2-D Q to _orthogonalize, which takes 3-D batches:
    # tests/standalone/batched_powersgd_hook.py). Its vanilla phase (start_powerSGD_iter=2:
    # an allreduce of the bucket divided by the group size) is what torch can run.
    Scenario("surface/batched-powersgd-vanilla-phase", "mlp", comm_hook="batched_powersgd",
             steps=2, description="batched_powerSGD_hook's two vanilla steps (torch 2.13 "
                                  "fails at its first compressed step)"),
    Scenario("surface/post-local-sgd", "mlp", comm_hook="post_local_sgd", steps=4,
             description="post_localSGD_hook with the whole group as the local subgroup: "
                         "global allreduce, then the subgroup's, the same values"),
    Scenario("surface/buffer-comm-hook", "conv_bn", steps=3,
             buffer_comm_hook="broadcast_pre_forward",
             description="_register_buffer_comm_hook (PRE_FORWARD): the hook broadcasts "
                         "buffers where DDP would"),
    # --- methods -----------------------------------------------------------------------
    Scenario("surface/fused-sgd", "mlp", steps=3, optimizer="fused_sgd",
             ddp_options={"bucket_cap_mb": 0.0005},
             description="_register_fused_optim(SGD): parameters stepped in backward after "
                         "their bucket's reduction"),
    Scenario("surface/update-process-group", "conv_bn", steps=4, update_process_group_at=2,
             description="_update_process_group to a new group of the same ranks before "
                         "step 2: buckets rebuilt, training goes on"),
    Scenario("surface/copy-pickle", "conv_bn", steps=3, copy_wrapper="pickle",
             copy_wrapper_at=1, description="the wrapper pickled after a step; the copy "
                                            "trains on"),
    Scenario("surface/copy-deepcopy", "used_twice", steps=3, copy_wrapper="deepcopy",
             copy_wrapper_at=2, ddp_options={"find_unused_parameters": True},
             description="copy.deepcopy of the wrapper; the copy trains on"),
    # torch 2.13 does not reduce the copy's first backward here (its copied state says the
    # static graph's delayed all-reduce is already enqueued: tests/standalone/
    # static_graph_deepcopy.py); expected of torch in builtins/expectations/torch.txt.
    Scenario("surface/copy-deepcopy-static-graph", "mlp", steps=3, copy_wrapper="deepcopy",
             copy_wrapper_at=2, ddp_options={"static_graph": True},
             description="copy.deepcopy of a static-graph wrapper after training began; "
                         "the copy's first iteration is a static graph's first again"),
    Scenario("surface/copy-torch-save", "mlp", steps=3, copy_wrapper="torch_save",
             copy_wrapper_at=1, ddp_options={"gradient_as_bucket_view": True},
             description="torch.save/torch.load of the wrapper; the copy trains on"),
]

SCENARIOS += [
    # --- Join ----------------------------------------------------------------------------
    # Join refuses joinables on different process groups: DDP on a group of its own and a
    # ZeroRedundancyOptimizer on the default group (each candidate's join_process_group
    # must name the group it reduces over for Join to see it).
    Scenario("surface/join-across-process-groups", "mlp", steps=2, groups=((0, 1),),
             world_sizes=(2,), optimizer="zero_sgd", join=JoinSpec(),
             expect_error=r"multiple process groups",
             description="Join over DDP on a subgroup and ZeRO on the default group raises"),
    # Join warns once a rank has shadowed more than 1000 iterations of the others
    # (torch's WARN_THRESHOLD). Rank 1 joins after one step; rank 0 then runs 20 steps of
    # 51 microbatches under no_sync, each forward one shadowed iteration: 1020 shadowed
    # forwards but 20 reductions and records (a tiny model keeps them short). About 2 s:
    # slow, run with --slow (and by the yardstick).
    Scenario("surface/join-skew-over-1000", "mlp", steps=21, microbatches=51,
             accumulate="no_sync", min_world_size=2, world_sizes=(2,), slow=True,
             model_kwargs={"width": 2, "depth": 1}, batch_size=1,
             join=JoinSpec(fewer_steps_per_rank=20),
             description="uneven inputs with a skew over 1000 iterations: Join warns and "
                         "shadows on"),
]

SCENARIOS += [
    # --- refusals at registration (the API contract of register_comm_hook) ---------------
    Scenario("surface/comm-hook-misannotated-bucket", "mlp", comm_hook="misannotated_bucket",
             expect_error=r"ValueError: .*bucket annotation should be dist.GradBucket",
             description="a hook whose bucket is not annotated dist.GradBucket is refused"),
    Scenario("surface/comm-hook-misannotated-return", "mlp", comm_hook="misannotated_return",
             expect_error=r"ValueError: .*return annotation should be "
                          r"torch.futures.Future\[torch.Tensor\]",
             description="a hook whose return annotation is not Future[Tensor] is refused"),
]

SCENARIOS += [
    # --- what the constructor refuses, on every rank ------------------------------------
    Scenario("surface/no-trainable-parameters", "all_frozen",
             expect_error=r"not needed when a module doesn't have any parameter that "
                          r"requires a gradient",
             description="a module with no parameter requiring a gradient is refused"),
    Scenario("surface/uninitialized-parameters", "lazy",
             expect_error=r"(?i)uninitialized parameter",
             description="a module with uninitialized (lazy) parameters is refused"),
    Scenario("surface/delay-all-reduce-without-hook-parameter", "mlp",
             ddp_options={"delay_all_reduce_named_params": ["4.weight"]},
             expect_error=r"ValueError: .*set at the same time",
             description="delay_all_reduce_named_params without param_to_hook_all_reduce"),
    Scenario("surface/sync-batchnorm-on-cpu", "sync_bn", backends=("gloo",),
             expect_error=r"SyncBatchNorm",
             description="SyncBatchNorm in a CPU module: refused (SyncBatchNorm runs on GPU "
                         "modules only)"),
    Scenario("surface/copy-on-a-subgroup", "mlp", steps=2, groups=((0, 1),), world_sizes=(2,),
             copy_wrapper="pickle", copy_wrapper_at=1,
             torch_limit=r"(?i)pickling.*only supported .*default process group",
             description="pickling a DDP on a group other than the default one: torch "
                         "refuses (its copy would re-attach the default group)"),
    # --- what DDP must leave alone ---------------------------------------------------------
    Scenario("surface/ignored-parameters-and-buffers", "ignored", steps=3,
             description="a frozen layer and a buffer named by "
                         "_set_params_and_buffers_to_ignore_for_model: neither broadcast "
                         "nor reduced"),
    Scenario("surface/static-graph-with-find-unused", "unused_on_rank1", steps=4,
             ddp_options={"static_graph": True, "find_unused_parameters": True},
             description="static_graph with find_unused_parameters (a warning: the static "
                         "graph finds unused parameters itself)"),
]

SCENARIOS += [
    # --- mixed precision: torch 2.13 runs it with CUDA streams and events only -----------
    # On CPU torch's first forward raises ("cpu backend doesn't support events"): a limit of
    # its implementation. A DDP that goes on is judged on its values. Forward and backward
    # run on float16 copies of the parameters (u = 2**-11 = 4.9e-4 per rounded result): the
    # three layers' forward and backward round ~10 results on the way to each gradient,
    # and the float16 reduction of W <= 4 terms adds W u: 5e-3 (10 u) bounds the norm-wise
    # error against the float32 oracle (measured: 1.3e-4 at 2 ranks); a reduction in
    # another dtype is caught by trace.dtype.
    Scenario("surface/mixed-precision-fp16", "mlp", steps=3, rtol=5e-3,
             ddp_options={"mixed_precision": {"param_dtype": "float16"}},
             torch_limit=r"cpu backend doesn't support events",
             description="mixed_precision(param_dtype=float16): float16 forward and "
                         "backward, reduced in float16, full-precision parameters and "
                         "gradients outside"),
    Scenario("surface/mixed-precision-reduce-fp32", "mlp", steps=3, rtol=5e-3,
             ddp_options={"mixed_precision": {"param_dtype": "float16",
                                              "reduce_dtype": "float32"}},
             torch_limit=r"cpu backend doesn't support events",
             description="mixed_precision(param_dtype=float16, reduce_dtype=float32): "
                         "gradients reduced in float32"),
]

SCENARIOS += [
    Scenario("surface/mixed-precision-ignored", "ignored", steps=3, rtol=5e-3,
             ddp_options={"mixed_precision": {"param_dtype": "float16",
                                              "buffer_dtype": "float16"}},
             torch_limit=r"cpu backend doesn't support events",
             description="mixed_precision with parameters and a buffer DDP ignores: they "
                         "are neither cast nor reduced (the argument of "
                         "surface/mixed-precision-fp16)"),
    # noop_hook communicates nothing: on data that is the same on every rank each local
    # gradient already is the average (W copies of g/W summed: within float32 rounding).
    Scenario("surface/noop-hook-replicated-data", "mlp_replicated_data", steps=3,
             comm_hook="noop", trace_volume=False,
             description="debugging_hooks.noop_hook: no collective, the local gradient "
                         "kept"),
    # bf16_compress_hook: torch refuses it without CUDA and NCCL (a limit of its build). A
    # DDP that runs it reduces in bfloat16 (u = 2**-8 = 3.9e-3): (W + 1) roundings of u
    # relative to the summed magnitude, 2e-2 for W = 4; 3e-2 is the bfloat16 rtol.
    Scenario("surface/bf16-compress-hook", "mlp", comm_hook="bf16_compress", rtol=3e-2,
             torch_limit=r"BF16 all reduce communication hook required CUDA",
             description="bf16_compress_hook: a bfloat16 reduction, bfloat16 tolerance"),
]

SCENARIOS += [
    # An optimizer applied in backward to the model (_apply_optimizer_in_backward): DDP
    # runs it right after each bucket's reduction. torch 2.13's end-of-backward callback
    # then waits on an accelerator stream and raises on CPU ("Cannot access accelerator
    # device when none is available"): a limit of its implementation.
    Scenario("surface/optimizer-in-backward", "mlp", steps=3, optimizer="in_backward_sgd",
             ddp_options={"bucket_cap_mb": 0.0005},
             torch_limit=r"Cannot access accelerator device",
             description="_apply_optimizer_in_backward(SGD): each parameter stepped in "
                         "backward with its reduced gradient"),
    Scenario("surface/join-find-unused", "unused_on_rank1", steps=4, min_world_size=2,
             ddp_options={"find_unused_parameters": True}, join=JoinSpec(),
             description="Join with find_unused_parameters: joined ranks shadow the "
                         "used-parameter map's allreduce"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'surface/bucket-cap-mb-list':
        'bucket_cap_mb_list gives each bucket its own cap: DDP lays out the first buckets '
        'and the rebuilt ones by the list, and every gradient is still averaged once.',
    'surface/bucket-cap-mb-list-find-unused':
        'With find_unused_parameters DDP never rebuilds its buckets, so the initial layout '
        'from bucket_cap_mb_list stays, and unused parameters are handled as usual.',
    'surface/forward-sync-buffers-off':
        "forward_sync_buffers=False: buffers are broadcast by the constructor's init sync "
        'and never before a forward.',
    'surface/forward-sync-buffers-wins':
        'When forward_sync_buffers is given it decides the forward broadcast, and the '
        'deprecated broadcast_buffers is ignored with a FutureWarning.',
    'surface/broadcast-buffers-explicit':
        'The deprecated broadcast_buffers, given alone, is still honoured (with a '
        'FutureWarning): buffers are broadcast before forwards as before.',
    'surface/skip-all-reduce-unused':
        'skip_all_reduce_unused_params: a parameter unused on every rank is not reduced and '
        'its gradient stays None; one used anywhere is averaged.',
    'surface/batched-grad-copy':
        'batched_grad_copy changes how DDP copies gradients into buckets, not the values: '
        'the same averaged gradients as without it.',
    'surface/device-mesh':
        "A 1-D device_mesh stands for the process_group: DDP reduces over the mesh's group "
        'with the same averages.',
    'surface/check-reduction':
        'check_reduction is deprecated and has no effect (a FutureWarning): training and '
        'gradients are the same as without it.',
    'surface/delay-all-reduce':
        'delay_all_reduce_named_params: DDP leaves those parameters out of its buckets and '
        "allreduces them in one flat buffer launched from param_to_hook_all_reduce's "
        'gradient hook, averaged like the rest.',
    'surface/builtin-allreduce':
        'The C++ built-in ALLREDUCE comm hook allreduces each bucket and divides by the '
        'group size: the same gradients as no hook.',
    'surface/builtin-fp16-compress':
        'The C++ built-in FP16_COMPRESS hook reduces each bucket in float16 and casts back: '
        'the average within float16 rounding.',
    'surface/fp16-compress-wrapper':
        'fp16_compress_wrapper casts the bucket to float16 before the wrapped hook and back '
        "after it: the allreduce hook's average within float16 rounding.",
    'surface/batched-powersgd-vanilla-phase':
        'Before start_powerSGD_iter, batched_powerSGD_hook allreduces the whole bucket '
        'divided by the group size: plain averaging.',
    'surface/post-local-sgd':
        'post_localSGD_hook allreduces over the global group before start_localSGD_iter and '
        'over the local subgroup after; with the whole group as subgroup both are the plain '
        'average.',
    'surface/buffer-comm-hook':
        "A buffer comm hook registered at PRE_FORWARD replaces DDP's buffer broadcast and "
        'runs where DDP would broadcast.',
    'surface/fused-sgd':
        '_register_fused_optim steps each parameter inside backward, right after its '
        "bucket's reduction: with the averaged gradient, never the local one.",
    'surface/update-process-group':
        '_update_process_group switches DDP to a new group and rebuilds its buckets; '
        'training goes on with the same averages over the new group.',
    'surface/copy-pickle':
        'A pickled DDP wrapper restores a working DDP: the copy keeps its parameters, '
        'rebuilds its reducer and trains with the same averages.',
    'surface/copy-deepcopy':
        'copy.deepcopy of a DDP wrapper gives an independent DDP that trains with the same '
        'averages, a layer used twice included.',
    'surface/copy-deepcopy-static-graph':
        'A deep copy of a static-graph DDP starts over: its first iteration is a static '
        "graph's first again, and it reduces every gradient.",
    'surface/copy-torch-save':
        'torch.save and torch.load of a DDP wrapper restore a working DDP that trains on '
        'with the same averages.',
    'surface/join-across-process-groups':
        'Join requires every joinable on the same process group: DDP on a subgroup joined '
        'with ZeroRedundancyOptimizer on the default group raises.',
    'surface/join-skew-over-1000':
        'Join shadows the active ranks for as long as they train: past 1000 shadowed '
        'iterations it warns and goes on shadowing.',
    'surface/comm-hook-misannotated-bucket':
        "register_comm_hook checks the hook's annotations: a bucket argument annotated as "
        'other than dist.GradBucket is refused.',
    'surface/comm-hook-misannotated-return':
        'register_comm_hook refuses a hook whose return annotation is not '
        'torch.futures.Future[torch.Tensor].',
    'surface/no-trainable-parameters':
        "DDP's constructor refuses a module with no parameter that requires a gradient.",
    'surface/uninitialized-parameters':
        "DDP's constructor refuses a module with uninitialized (lazy) parameters: run a "
        'forward first.',
    'surface/delay-all-reduce-without-hook-parameter':
        'delay_all_reduce_named_params needs param_to_hook_all_reduce, the parameter whose '
        'hook launches the delayed allreduce: the constructor refuses it alone.',
    'surface/sync-batchnorm-on-cpu':
        "SyncBatchNorm runs on GPU modules only: DDP's constructor refuses a CPU module "
        'holding one.',
    'surface/copy-on-a-subgroup':
        'torch refuses to pickle a DDP whose process group is not the default group, a '
        'limit of its implementation (unpickling re-attaches the default group); a DDP '
        'whose copy keeps its group trains it on that group like the original.',
    'surface/ignored-parameters-and-buffers':
        'Parameters and buffers named by _set_params_and_buffers_to_ignore_for_model are '
        'neither broadcast nor reduced: each rank keeps its own.',
    'surface/static-graph-with-find-unused':
        'static_graph finds unused parameters itself: find_unused_parameters beside it only '
        'warns, and gradients are the same averages.',
    'surface/mixed-precision-fp16':
        'mixed_precision(param_dtype=float16) runs forward and backward on float16 copies '
        'and reduces in float16, while the parameters and their gradients outside stay full '
        'precision.',
    'surface/mixed-precision-reduce-fp32':
        "mixed_precision's reduce_dtype=float32 reduces the float16 copies' gradients in "
        'float32, then hands full-precision gradients back.',
    'surface/mixed-precision-ignored':
        'Parameters and buffers DDP ignores are left alone under mixed_precision as well: '
        'neither cast to the low-precision dtype nor reduced.',
    'surface/noop-hook-replicated-data':
        "noop_hook issues no collective and leaves each rank's local gradient as DDP's "
        'result.',
    'surface/bf16-compress-hook':
        "bf16_compress_hook reduces each bucket in bfloat16 (float32's range, an 8-bit "
        'mantissa) and writes the result back: every gradient is the average within '
        'bfloat16 rounding, never out of range.',
    'surface/optimizer-in-backward':
        "With _apply_optimizer_in_backward DDP runs each parameter's optimizer after that "
        "gradient's reduction: parameters are stepped with the averaged gradient.",
    'surface/join-find-unused':
        'Under Join with find_unused_parameters, joined ranks also shadow the allreduce of '
        "the used-parameter map, so the active ranks' collectives match.",
}
SCENARIOS = with_rules(SCENARIOS, RULES)
