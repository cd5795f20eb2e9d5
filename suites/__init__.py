"""The conformance catalog: one module per concern, each a ``SCENARIOS`` list of data.

``pytest`` collects every ``SCENARIOS`` list here as one test item per (scenario,
candidate) through the ``ddp_conformance`` plugin; ``ddp-conformance run`` reads the same
lists (this folder installs as ``ddp_conformance_suites``).
"""
