"""Backend conformance: collective-level checks of a c10d backend, before any DDP.

In the spirit of nccl-tests' correctness mode: each
:class:`~ddp_conformance.catalog.collective.CollectiveCase` (one operation, reduce op,
dtype, layout, way of completing, group) runs on every rank of the pool with exact-valued
data at the dtype's full precision (:mod:`.values`: inputs need every significand bit, so
a narrowing wire changes them, and every result is exactly representable, in any order
of reduction), so results are compared bitwise (:mod:`.execute`, on the ranks), and ends with its own
verdict (:mod:`.verdict`). What the backend does not implement is N/A with the backend's
own words, never a silent pass.
"""
