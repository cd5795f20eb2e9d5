"""Modules that a reproducer carries: torch and the standard library only.

``ddp-conformance repro`` copies these modules' code into its standalone scripts
(:func:`ddp_conformance.repro.script_modules`), and the harness runs the very same
code: the single-process loop of the oracle (:mod:`.single_process`) over a scenario's
precomputed tables (:mod:`.case`), the collective trace's rules (:mod:`.trace_rules`,
over :mod:`.collective` records, :mod:`.summed_memory`, :mod:`.extents`,
:mod:`.wire_dtypes`), one training forward's rule (:mod:`.forwards`). So each rule has one
implementation, linted and type-checked, whichever side reads it.

The rule for every module here (``tests/test_repro.py`` checks it): it imports nothing
but the standard library, torch, and other modules of this package by
``from ddp_conformance.script.<module> import <names>`` (the copy drops those imports and
keeps the code they name); it runs nothing at import but definitions.
"""
