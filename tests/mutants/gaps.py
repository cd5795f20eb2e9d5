"""Realistic defects that slip through every scenario of the catalog today.

Kept out of the zoo (``tests/mutants/__init__.py``: ``GAP_MODULES``); each docstring says
which check would catch it. ``tests/test_mutant_zoo.py`` keeps them uncaught on record.
"""
from __future__ import annotations
