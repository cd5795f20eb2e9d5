"""Timing of candidates on benchmark models, and the DDP paper's experiments.

``ddp-conformance bench`` (see :mod:`ddp_conformance.bench.run`) runs them on the rank
pool; the rank-side code is in :mod:`.timing` and :mod:`.experiments`, the statistics
and the bandwidth arithmetic in :mod:`.stats` (no torch: the report uses them too). The
candidates' collectives are traced by :class:`ddp_conformance.ranks.tracing.TracingProcessGroup`.
"""

#: ``ddp-conformance bench --experiment``'s choices (:mod:`ddp_conformance.bench.run` runs
#: them; :mod:`ddp_conformance.bench.command` offers them without importing torch).
EXPERIMENTS = ("timing", "bucket-sweep", "no-sync", "overlap", "breakdown")
