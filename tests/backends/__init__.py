"""Example and deliberately defective c10d backends used by the tests and the docs."""
