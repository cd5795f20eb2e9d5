"""``expected_error``: a scenario that expects an error gets it, on every rank."""
from __future__ import annotations

import re

from ddp_conformance.judge.registry import Context, check, expecting_error


@check("expected_error", when=expecting_error)
def expected_error(ctx: Context) -> None:
    """Every rank raised an error matching ``scenario.expect_error`` (a regular expression
    on "Type: message"), e.g. torch's "Expected to have finished reduction in the prior
    iteration" for a parameter unused without ``find_unused_parameters``, or the
    ``RuntimeError`` of a second ``register_comm_hook``. No hang: the deadline turns a hang
    into TIMEOUT before this check runs. The failing iteration is no DDP step, so no value
    check runs with it (``trace.consistent`` still does).

    At a torch limit (``scenario.torch_limit``) where the candidate refused: an error on
    every rank, of any text ("refused, like torch"); a candidate that goes on there is
    judged by the value checks instead."""
    ev, pattern = ctx.evidence, ctx.scenario.expect_error
    ev.ran("expected_error")
    if pattern is None:  # a refusal at a torch limit: any error, but on every rank
        for rank, rec in sorted(ctx.records.items()):
            if not rec.raised:
                ev.fail("expected_error", f"rank {rank} went on while other ranks refused "
                        f"(torch's limit here: {ctx.scenario.torch_limit!r}); a refusal must "
                        f"be on every rank", None, rank)
        return
    for rank, rec in sorted(ctx.records.items()):
        if not rec.raised:
            ev.fail("expected_error", f"rank {rank} finished its {len(rec.steps)} steps without "
                    f"raising; expected an error matching {pattern!r}", None, rank)
        elif not re.search(pattern, rec.raised):
            ev.fail("expected_error", f"rank {rank} raised {rec.raised!r}, expected an error "
                    f"matching {pattern!r}", len(rec.steps), rank)
