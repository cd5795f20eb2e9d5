"""``expected_error``: a refusal, on every rank: an API contract's (``expect_error``), or
one at a limit of torch's implementation (``torch_limit``) where the candidate refused."""
from __future__ import annotations

import re

from ddp_conformance.judge.registry import Context, check, expecting_error


def clear(raised: str) -> bool:
    """Whether an error, as a rank records it ("Type: message"), says something: it has a
    message (a bare ``AssertionError`` or ``KeyError()`` tells the user nothing)."""
    _, _, message = raised.partition(": ")
    return bool(message.strip())


@check("expected_error", when=expecting_error)
def expected_error(ctx: Context) -> None:
    """Every rank raised a clear error (one with a message), e.g. for a second
    ``register_comm_hook`` or models that differ across ranks (``Scenario.expect_error``:
    refusing is the behaviour), or, at a torch limit (``Scenario.torch_limit``) where the
    candidate refused, as torch does: "refused, like torch". A rank that went on while the
    others raised fails it. No hang: the deadline turns a hang into TIMEOUT before this
    check runs. The failing iteration is no DDP step, so no value check runs with it
    (``trace.consistent`` still does); a candidate that goes on at a torch limit is judged
    by the value checks instead ("beyond torch").

    torch's message (the scenario's regular expression on "Type: message") is demanded
    only under ``--strict-messages``: the text is torch's, not the contract."""
    ev, scenario = ctx.evidence, ctx.scenario
    ev.ran("expected_error")
    pattern = scenario.expect_error if scenario.expect_error is not None else scenario.torch_limit
    limit = scenario.expect_error is None
    for rank, rec in sorted(ctx.records.items()):
        if rec.accepted:
            ev.fail("expected_error", f"rank {rank} accepted what torch refuses (torch's: "
                    f"{pattern!r}): it constructed, and reading its state then raised "
                    f"{_first_sentence(rec.accepted)}", None, rank)
        elif not rec.raised:
            ev.fail("expected_error",
                    f"rank {rank} went on while other ranks refused (torch's limit here: "
                    f"{pattern!r}); a refusal must be on every rank" if limit else
                    f"rank {rank} finished its {len(rec.steps)} steps without raising; "
                    f"expected a clear error on every rank (torch's: {pattern!r})", None, rank)
        elif not clear(rec.raised):
            ev.fail("expected_error", f"rank {rank} raised {rec.raised!r}, an error without a "
                    f"message (torch's: {pattern!r})", len(rec.steps), rank)
        elif ctx.strict_messages and pattern is not None and not re.search(pattern, rec.raised):
            ev.fail("expected_error", f"rank {rank} raised {rec.raised!r}; --strict-messages "
                    f"expects torch's message, matching {pattern!r}", len(rec.steps), rank)


def _first_sentence(raised: str) -> str:
    """An error as a rank records it ("Type: message"), up to the end of its first
    sentence (torch's ``UninitializedParameter`` goes on for three more)."""
    head, dot, _ = raised.splitlines()[0].partition(". ") if raised else ("", "", "")
    return head + dot.strip()
