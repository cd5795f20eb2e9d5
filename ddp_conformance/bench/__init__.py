"""Timing of candidates on benchmark models, and the DDP paper's experiments.

``ddp-conformance bench`` (see :mod:`ddp_conformance.bench.run`) runs them on the rank
pool; the rank-side code is in :mod:`.timing` and :mod:`.experiments`, the bandwidth
arithmetic and the tracing process group in :mod:`.busbw`.
"""
