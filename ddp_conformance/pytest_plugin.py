"""The pytest plugin (entry point ``pytest11``): options only, and nothing else until needed.

Installing this package must never change another project's pytest run, so this module:

- registers the namespaced options ``--ddp-NAME`` (the one option table,
  :mod:`ddp_conformance.options`), and the short ``--NAME`` only where no ``conftest.py``
  or other plugin has taken it: the short forms are added after the initial conftests
  have registered theirs, so a project whose conftest defines ``--device``,
  ``--backend``, ``--world-size`` or ``--candidate`` keeps them;
- imports nothing heavy (no torch): a pytest run that collects no conformance scenario
  pays nothing and sees nothing (no header line, no marker, no item);
- turns a test module's ``SCENARIOS`` into items only when it is a list of
  :class:`~ddp_conformance.catalog.scenario.Scenario` (the files of ``suites/``, installed
  as ``ddp_conformance_suites``), and its ``COLLECTIVES`` only when it is a list of
  :class:`~ddp_conformance.catalog.collective.CollectiveCase` and the run checks the
  backend's collectives (``--collectives``); the items, their session and their
  reporting live in :mod:`ddp_conformance.pytest_items`, imported then.

So ``pytest`` from this repository's root, and ``pytest --pyargs ddp_conformance_suites
--ddp-candidate mypkg.ddp:MyDDP`` anywhere, run the catalog; ``-p no:ddp_conformance``
switches the plugin off entirely.
"""
from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from ddp_conformance.options import PYTEST, add_short_forms_to_pytest, add_to_pytest, named

GROUP = "ddp-conformance"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_to_pytest(parser.getgroup(GROUP, "DDP conformance suite (ddp-conformance)"))


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser,
                                  args: list[str]) -> Generator[None, None, None]:
    """After the initial conftests registered their options, add the free short forms."""
    try:
        return (yield)
    finally:
        add_short_forms_to_pytest(parser.getgroup(GROUP), _taken_names(parser))


def pytest_configure(config: pytest.Config) -> None:
    """The controller of pytest-xdist workers checks the conformance options it was given
    before any worker starts (:func:`~ddp_conformance.pytest_items.check_options`: a bad
    candidate, backend or value is one line and exit 4, as without ``-n``); and
    ``--ddp-coverage``: its controller hooks (:mod:`ddp_conformance.pytest_coverage`)."""
    if _controls_workers(config) and named(lambda dest: config.getoption(dest, None), PYTEST):
        from ddp_conformance.pytest_items import check_options

        check_options(config)
    if config.getoption("ddp_coverage", None):
        from ddp_conformance.pytest_coverage import configure

        configure(config)


def _controls_workers(config: pytest.Config) -> bool:
    """Whether this process is pytest-xdist's controller (it collects nothing itself, so a
    bad option would otherwise first show as a crashed worker)."""
    return (not hasattr(config, "workerinput")
            and getattr(config.option, "dist", "no") not in ("no", None))


def _taken_names(parser: pytest.Parser) -> set[str]:
    """Every option name registered so far, by any plugin or conftest."""
    groups = [getattr(parser, "_anonymous", None), *getattr(parser, "_groups", [])]
    return {name for group in groups if group is not None
            for option in getattr(group, "options", []) for name in option.names()}


def pytest_pycollect_makeitem(collector: pytest.Collector, name: str,
                              obj: Any) -> list[pytest.Item] | None:
    if name not in ("SCENARIOS", "COLLECTIVES") or not isinstance(collector, pytest.Module):
        return None
    if name == "SCENARIOS":
        from ddp_conformance.catalog.scenario import Scenario as kind
    else:
        from ddp_conformance.catalog.collective import CollectiveCase as kind  # type: ignore[assignment]

    if not isinstance(obj, (list, tuple)) or not obj or \
            not all(isinstance(s, kind) for s in obj):
        return None  # another project's list: not ours
    from ddp_conformance.pytest_items import make_collective_items, make_items

    return make_items(collector, list(obj)) if name == "SCENARIOS" else \
        make_collective_items(collector, list(obj))
