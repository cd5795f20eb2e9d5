"""The scenario catalog: every ``SCENARIOS`` list in the modules of ``suites/``.

``suites/`` installs as the package ``ddp_conformance_suites``, so ``ddp-conformance run``
finds the same catalog that ``pytest`` collects from the source tree.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from ddp_conformance.catalog.collective import CollectiveCase
from ddp_conformance.catalog.scenario import Scenario


def _lists(name: str) -> list[Any]:
    """Every ``name`` list of the modules of ``suites/``, in module order."""
    import ddp_conformance_suites as suites

    found: list[Any] = []
    for info in sorted(pkgutil.iter_modules(suites.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{suites.__name__}.{info.name}")
        found.extend(getattr(module, name, []))
    return found


def load_collectives() -> list[CollectiveCase]:
    """The backend's collective checks: every ``COLLECTIVES`` list of ``suites/``."""
    cases: list[CollectiveCase] = _lists("COLLECTIVES")
    ids = [c.id for c in cases]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ValueError(f"collective case id(s) defined twice in suites/: {', '.join(twice)}")
    return cases


def load_catalog() -> list[Scenario]:
    scenarios: list[Scenario] = _lists("SCENARIOS")
    seen: set[str] = set()
    for s in scenarios:
        if s.id in seen:
            raise ValueError(f"scenario id {s.id!r} defined twice in suites/")
        seen.add(s.id)
        validate(s)
    return scenarios


def validate(scenario: Scenario) -> None:
    """Fail at load, not as a candidate's ERROR, when a scenario names what does not exist
    (field values are checked when the scenario is built: see ``Scenario.__post_init__``)."""
    from ddp_conformance.catalog.models import MODELS

    if scenario.model not in MODELS:
        raise ValueError(f"scenario {scenario.id!r}: unknown model {scenario.model!r}; known: "
                         f"{', '.join(sorted(MODELS))}")


def keyword_matcher(expression: str | None) -> Callable[[str], bool]:
    """``-k`` as pytest reads it (``and``, ``or``, ``not``, substrings of the case id)."""
    if not expression:
        return lambda case_id: True
    from _pytest.mark.expression import Expression

    try:
        compiled = Expression.compile(expression)
    except SyntaxError as exc:
        from ddp_conformance.errors import UsageError

        raise UsageError(f"-k {expression!r} is not a valid expression: {exc.msg} "
                         f"(at column {exc.offset})") from None

    def matches(case_id: str) -> bool:
        def contains(word: str, /, **kwargs: str | int | bool | None) -> bool:
            return word.lower() in case_id.lower()

        return compiled.evaluate(contains)

    return matches
