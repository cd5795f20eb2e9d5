"""The deadlines of the suite's slow tests, from one place, scaled to the machine.

A test that waits on a subprocess (a command-line run, a pytest run, ranks under torchrun)
passes ``deadline(BASE)`` as its timeout, never a bare number: ``BASE`` is the seconds the
wait may take on a quiet 2-core machine (this repository's), with room for noise, and
:func:`scale` stretches it where the machine is busier or slower:

- ``DDP_TEST_DEADLINE_SCALE=F`` (a positive number) multiplies every deadline by ``F``
  (a slow CI runner: ``3``);
- otherwise the machine's load per CPU (the 1-minute load average over the CPU count),
  when above 1: on a 2-core machine with a load of 8 (other jobs, ``pytest -n``), the ranks
  get a quarter of the CPU time they get alone, so each deadline is 4 times its base.

The load's scale is capped at :data:`MAX_SCALE`, so that a wait always ends: a hang is
still found, later (the variable is taken as given).
"""
from __future__ import annotations

import os

ENV = "DDP_TEST_DEADLINE_SCALE"
#: The longest stretch: a base of 300 s waits 40 minutes at most.
MAX_SCALE = 8.0


def scale() -> float:
    """How much longer than its base a deadline is now (1 on a quiet machine)."""
    given = os.environ.get(ENV)
    if given:
        try:
            value = float(given)
        except ValueError:
            raise ValueError(f"{ENV} must be a positive number, got {given!r}") from None
        if not value > 0:
            raise ValueError(f"{ENV} must be a positive number, got {given!r}")
        return value
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 1.0
    return min(max(1.0, load / (os.cpu_count() or 1)), MAX_SCALE)


def deadline(base_s: float) -> float:
    """``base_s`` seconds stretched by :func:`scale`: the timeout to give the wait."""
    return base_s * scale()
