"""The cause codes: a public contract (``results.jsonl``'s ``diagnosis`` records, every report).

A code names what a DDP does wrong, in the user's words, and is derived from recorded
values and traces only (:mod:`.signatures` states each numerical argument). Codes are
stable: new ones are added, none is renamed or removed. Each member's docstring is the
exact evidence that yields it; ``docs/diagnosis.md`` lists them
(``python -m ddp_conformance.judge.diagnose.table``).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Cause(enum.StrEnum):
    """One cause of unexpected verdicts. ``str(cause)`` is its code."""

    doc: str

    def __new__(cls, code: str, doc: str) -> Cause:
        member = str.__new__(cls, code)
        member._value_ = code
        member.doc = doc
        member.__doc__ = doc
        return member

    NO_DIVISION = ("no-division",
                   "Every wrong gradient at the first failing step is the expected one times "
                   "the DDP group's size (a constant ratio within the rounding bound): "
                   "the local gradients were summed and never divided.")
    DOUBLE_DIVISION = ("double-division",
                       "Every wrong gradient is the expected one divided by the group's size "
                       "(ratio 1/W): the average was divided again.")
    SCALED = ("scaled",
              "Every wrong gradient is the expected one times one constant that is neither "
              "W nor 1/W nor a Join divisor ratio (the constant is given).")
    NOT_REDUCED = ("not-reduced",
                   "Some wrong gradient equals this rank's own local gradient (or it divided "
                   "by W), bitwise up to the reduction's rounding: it was never reduced "
                   "(the parameters, or the bucket, are named); or the trace shows a "
                   "synced backward that reduced fewer elements than the gradients need.")
    STALE_GRADIENT = ("stale-gradient",
                      "Every wrong gradient equals the expected gradient of an earlier step "
                      "(the previous one is tried first): a reduction's result arrived late.")
    LAYOUT_MISMATCH = ("layout-mismatch",
                       "A wrong gradient holds the expected elements in another order "
                       "(the sorted values agree within the tolerance, the positions do "
                       "not), or the ranks' gradients are permutations of each other: "
                       "buckets laid out differently on different ranks.")
    NARROWED_PRECISION = ("narrowed-precision",
                          "Every wrong gradient is representable in a narrower dtype "
                          "(float16, bfloat16) that the expected one is not, and its "
                          "relative error is within that dtype's rounding; or the trace "
                          "shows gradients reduced in a narrower dtype.")
    WRONG_GROUP = ("wrong-group",
                   "The backward's reductions ran on a group of another size than the DDP "
                   "group the candidate was given.")
    REDUCED_TWICE = ("reduced-twice",
                     "The trace shows a synced backward that summed some gradient memory "
                     "twice (``trace.reduced_once``).")
    NO_SYNC_IGNORED = ("no-sync-ignored",
                       "The trace shows gradient reductions inside every ``no_sync`` "
                       "microbatch.")
    NO_SYNC_NOT_RESTORED = ("no-sync-not-restored",
                            "The trace shows reductions inside only some ``no_sync`` "
                            "microbatches (those after a nested ``no_sync`` ended): leaving "
                            "``no_sync`` switched synchronisation on instead of restoring it.")
    BUFFERS_NOT_BROADCAST = ("buffers-not-broadcast",
                             "A rank's buffers at a forward are its own, where DDP broadcasts "
                             "the source rank's (``replica.buffer_broadcast`` or the "
                             "oracle's buffers at that forward).")
    BUFFERS_WRONG_SOURCE = ("buffers-wrong-source",
                            "A rank's buffers at a forward equal another rank's than the "
                            "source DDP broadcasts from.")
    NO_INIT_SYNC = ("no-init-sync",
                    "A rank's parameters or buffers after construction differ from the "
                    "first rank's (``init.*``): the constructor did not broadcast them.")
    UNUSED_NOT_NONE = ("unused-not-none",
                       "A gradient is a tensor where DDP leaves it None (a parameter unused "
                       "on every rank).")
    UNUSED_NOT_REDUCED = ("unused-not-reduced",
                          "A gradient is None on a rank where DDP gives the reduced one (a "
                          "parameter unused on this rank only), or equals the local gradient "
                          "of the ranks that used it.")
    JOIN_DIVISOR = ("join-divisor",
                    "Under Join, the wrong gradients are the expected ones times the ratio "
                    "of the group size to the active ranks (or its inverse): the divisor "
                    "ignored ``divide_by_initial_world_size``.")
    JOIN_NOT_SHADOWED = ("join-not-shadowed",
                         "Under Join, the ranks hung (TIMEOUT) or disagreed on collectives "
                         "after a rank ran out of inputs: the joined rank did not shadow the "
                         "active ranks' collectives.")
    JOIN_FINAL_SYNC = ("join-final-sync",
                       "Under Join, only the end state differs (``replica.final``): the "
                       "model was not synced from the last joined rank at the end.")
    HANG_IN_COLLECTIVE = ("hang-in-collective",
                          "TIMEOUT with ranks waiting in collectives that cannot match (a "
                          "desync), or a stuck rank's innermost frame in torch.distributed.")
    HANG_OUTSIDE_COLLECTIVE = ("hang-outside-collective",
                               "TIMEOUT with no rank waiting in a collective.")
    CRASH = ("crash",
             "A rank died (CRASH): its exit code or signal, and the backend's last message "
             "from its output when there is one.")
    RAISES = ("raises",
              "The candidate raised (ERROR): the exception and the innermost frame in the "
              "candidate's own files (file:line).")
    API_REFUSAL_MISSING = ("api-refusal-missing",
                           "Where torch refuses (``expected_error``), the candidate raised "
                           "nothing, or something else.")
    UNSUPPORTED_FEATURE = ("unsupported-feature",
                           "N/A: the candidate lacks a capability the scenario needs (grouped "
                           "by capability; never a finding: N/A fails nothing).")
    BUCKET_LAYOUT = ("bucket-layout",
                     "Only ``trace.buckets`` failed: the values are right, the reductions are "
                     "grouped into other buckets than torch's.")
    REPLICAS_DIVERGE = ("replicas-diverge",
                        "Ranks end a step with different parameters (``replica.param``) "
                        "while no gradient relation explains it.")
    UNEXPLAINED = ("unexplained",
                   "No relation above holds; the evidence (first failing check and its "
                   "figures) is given as is.")


#: The verdict-level causes: what an ERROR, CRASH or TIMEOUT is, before any value.
ENDINGS = frozenset({Cause.CRASH, Cause.RAISES, Cause.HANG_IN_COLLECTIVE,
                     Cause.HANG_OUTSIDE_COLLECTIVE, Cause.JOIN_NOT_SHADOWED})


@dataclass
class CaseCause:
    """A case's cause: its code, the relation seen (the case's first line) and the check
    whose evidence it reads."""

    code: Cause
    relation: str
    check: str = ""

    def to_json(self) -> dict[str, str]:
        return {"code": str(self.code), "relation": self.relation, "check": self.check}

    @staticmethod
    def from_json(data: dict[str, Any] | None) -> CaseCause | None:
        if not data or "code" not in data:
            return None
        # A code of a newer version is read as unexplained.
        code = next((c for c in Cause if c.value == data["code"]), Cause.UNEXPLAINED)
        return CaseCause(code, str(data.get("relation", "")), str(data.get("check", "")))
