"""Benchmarks and measurements that are not tests (each module is a script; ``mutation`` is a
package the mutation-score script and ``tests/test_mutation_score.py`` import).

A regular package, not a namespace one: an installed distribution that ships its own
top-level ``benchmarks`` package (fairscale does) would otherwise win the import over this
directory even with the repository root first on ``sys.path``.
"""
