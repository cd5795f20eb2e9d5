"""The DDP rule each check stands for: shown under a failure when the failing check is about
something else than the scenario's own rule (buffers failing under a strides rule).

A scenario's rule (``Scenario.rule``) says what that scenario is about; a case's first
failure may be of another concern. :func:`shown_rule` keeps the scenario's rule when it
speaks of the failing check's subject (one of the check's words appears in it), and gives
the check's own rule otherwise.
"""
from __future__ import annotations

#: Check id (or its prefix before the dot) -> (words of its subject, its rule).
CHECK_RULES: dict[str, tuple[tuple[str, ...], str]] = {
    "expected_error": (("raise", "refus", "error"),
                       "Where torch refuses, every rank raises a clear error, and none hangs."),
    "init": (("init", "broadcast", "construct", "rank 0"),
             "The constructor broadcasts rank 0's parameters and buffers to every rank."),
    "replica.buffer_broadcast": (("buffer",),
                                 "With broadcast_buffers, every forward after a synced one "
                                 "starts from the source rank's buffers on every rank."),
    "oracle.buffer": (("buffer",), "Buffers follow the single-process run: each rank's own, "
                                   "broadcast from the source where DDP broadcasts them."),
    "reference.buffer": (("buffer",), "Buffers follow the reference DDP's, step by step."),
    "oracle.grad_none": (("unused", "none", "find_unused"),
                         "A gradient is None exactly where DDP leaves it None (a parameter "
                         "unused on every rank)."),
    "oracle.grad": (("gradient", "average", "reduc"),
                    "After a synced backward every rank holds the average over ranks of the "
                    "local gradients."),
    "trace.no_sync": (("no_sync",), "Inside no_sync nothing is reduced; the gradients "
                                    "accumulate locally until the next synced backward."),
    "trace.reduced_once": (("reduc", "bucket", "gradient"),
                           "Each synced backward reduces every needed gradient element "
                           "exactly once."),
    "trace.dtype": (("dtype", "precision", "float16", "bfloat16", "hook"),
                    "Gradients are reduced in their own dtype unless a comm hook says "
                    "otherwise."),
    "trace.buckets": (("bucket",), "Gradients are reduced in torch's bucket layout "
                                   "(bucket_cap_mb, reverse parameter order, one dtype each)."),
    "replica.final": (("join", "final", "end"),
                      "After training (and Join's final sync) every rank holds the same model."),
}


def check_rule(check: str) -> tuple[tuple[str, ...], str] | None:
    """The subject words and rule of ``check`` (its own entry, else its prefix's)."""
    return CHECK_RULES.get(check) or CHECK_RULES.get(check.split(".", 1)[0])


def shown_rule(scenario_rule: str, check: str) -> str:
    """The rule to show under a failure of ``check`` in a scenario whose rule is
    ``scenario_rule``: the scenario's when it speaks of the check's subject (or the check
    has no rule), else the check's."""
    own = check_rule(check)
    if own is None or not scenario_rule:
        return scenario_rule
    words, rule = own
    lowered = scenario_rule.lower()
    return scenario_rule if any(w in lowered for w in words) else rule
