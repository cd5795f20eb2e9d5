"""The judge: what the ranks recorded, compared with the oracle, the reference DDP and
each other (docs/CONTRACT.md, "What every scenario checks"), and turned into a verdict.

Everything here runs in the parent on plain records (:mod:`ddp_conformance.ranks.records`):
no process, no process group.
"""
