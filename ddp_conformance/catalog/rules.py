"""The DDP rule each catalog scenario checks, attached from its suite's table.

Every ``suites/`` module ends with ``SCENARIOS = with_rules(SCENARIOS, RULES)``: ``RULES``
maps a scenario id, or an ``fnmatch`` pattern where a whole family checks one rule, to
the rule's text (one or two sentences, torch's semantics: what a DDP must do). An exact
id wins over a pattern, a longer pattern over a shorter one. The rule is printed with
every failure of the scenario (terminal, ``summary.md``, ``report.html``) and in ``list``.
:func:`with_rules` also attaches the upstream bugs each scenario guards
(``Scenario.guards``, from :data:`~ddp_conformance.catalog.history.HISTORY`), so every
suite gets them the same way.
"""
from __future__ import annotations

import dataclasses
import fnmatch

from ddp_conformance.catalog.history import bugs_guarded_by
from ddp_conformance.catalog.scenario import Scenario


def rule_for(scenario_id: str, rules: dict[str, str]) -> str:
    """The rule of ``scenario_id`` in ``rules`` ('' when no key names it)."""
    if scenario_id in rules:
        return rules[scenario_id]
    patterns = [key for key in rules if fnmatch.fnmatchcase(scenario_id, key)]
    return rules[max(patterns, key=len)] if patterns else ""


def with_rules(scenarios: list[Scenario], rules: dict[str, str]) -> list[Scenario]:
    """``scenarios`` each carrying its rule from ``rules`` (a rule given in the scenario
    itself stays) and the bugs it guards (those given in the scenario stay first). Raises
    ``ValueError`` for a scenario left without a rule and for a key that names no scenario
    (a renamed scenario must not silently lose its rule)."""
    unused = [key for key in rules
              if not any(fnmatch.fnmatchcase(s.id, key) for s in scenarios)]
    if unused:
        raise ValueError(f"RULES key(s) naming no scenario: {', '.join(unused)}")
    out = []
    for scenario in scenarios:
        rule = scenario.rule or rule_for(scenario.id, rules)
        if not rule.strip():
            raise ValueError(f"scenario {scenario.id!r} has no rule: add it to its suite's RULES")
        guards = tuple(dict.fromkeys((*scenario.guards, *bugs_guarded_by(scenario.id))))
        out.append(dataclasses.replace(scenario, rule=rule, guards=guards))
    return out

