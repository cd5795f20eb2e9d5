"""The candidate contract (docs/CONTRACT.md, "The candidate contract"): what the harness asks of a
DDP implementation and how it finds out what one can do.

- :mod:`.capability`: capability names and DDP's option names (no torch import);
- :mod:`.adapter`: the :class:`~.adapter.Adapter` the engine drives on each rank;
- :mod:`.candidate`: the :class:`~.candidate.Candidate` record;
- :mod:`.ddp_like`: any callable with DDP's constructor, and capability detection;
- :mod:`.registry`: ``--candidate SPEC`` to a Candidate, built-ins included
  (:mod:`ddp_conformance.builtins`).
"""
