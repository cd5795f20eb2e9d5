"""Every catalog scenario carries the DDP rule it checks, and the rules are worth reading.

A rule is printed under every failure of its scenario: it must exist, be short enough to
read in a terminal, and say something the scenario's id and description do not already
say. What "distinct enough to be useful" means here, and why:

- a rule shared by scenarios of two concerns (two ``suites/`` modules) is generic ("DDP
  averages gradients"): it cannot tell a candidate's author which mechanism failed;
- inside one concern a rule may name a family (one sync strategy at 1 and at 3
  microbatches), but a rule shared by more than :data:`MAX_FAMILY` scenarios no longer
  tells them apart;
- two different rules that share nearly all their words (:data:`MAX_OVERLAP`) are one rule
  written twice, with the same weakness;
- a rule that repeats the scenario's description adds nothing to ``list``.
"""
from __future__ import annotations

import re
from collections import defaultdict

import pytest

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.catalog.rules import rule_for, with_rules
from ddp_conformance.catalog.scenario import Scenario

#: Scenarios one rule may cover inside one concern (the sync strategies: 1 and 3
#: microbatches each).
MAX_FAMILY = 2
#: Words two different rules may share, as a share of the smaller one's words (Jaccard
#: would let a short rule hide inside a long one).
MAX_OVERLAP = 0.8
#: A terminal's three wrapped lines: longer is no longer "one or two sentences".
MAX_CHARS = 300


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9_]+", text.lower()))


def _sentences(text: str) -> int:
    """Sentences, not counting the dots inside names (``torch.save``, ``1.0``)."""
    return len(re.findall(r"[.!?](\s|$)", text))


CATALOG = load_catalog()


def test_every_scenario_has_a_short_rule_of_its_own() -> None:
    for s in CATALOG:
        assert s.rule.strip(), f"{s.id} has no rule"
        assert len(s.rule) <= MAX_CHARS, f"{s.id}: rule of {len(s.rule)} characters"
        assert 1 <= _sentences(s.rule) <= 2, f"{s.id}: {_sentences(s.rule)} sentences"
        assert s.rule.rstrip().endswith("."), s.id
        assert s.rule.strip().lower() != s.description.strip().lower(), s.id


def test_no_rule_is_generic_across_concerns_or_covers_a_big_family() -> None:
    holders: dict[str, list[Scenario]] = defaultdict(list)
    for s in CATALOG:
        holders[s.rule].append(s)
    for rule, scenarios in holders.items():
        concerns = {s.id.split("/")[0] for s in scenarios}
        assert len(concerns) == 1, f"one rule for {sorted(concerns)}: {rule}"
        assert len(scenarios) <= MAX_FAMILY, f"{len(scenarios)} scenarios share: {rule}"


def test_different_rules_do_not_say_the_same_thing() -> None:
    rules = sorted({s.rule for s in CATALOG})
    words = [_words(r) for r in rules]
    for i in range(len(rules)):
        for j in range(i + 1, len(rules)):
            shared = len(words[i] & words[j]) / min(len(words[i]), len(words[j]))
            assert shared <= MAX_OVERLAP, f"{shared:.2f} of the words shared:\n{rules[i]}\n{rules[j]}"


def test_the_rule_of_the_issue_example_says_divide_before_summing() -> None:
    rule = {s.id: s.rule for s in CATALOG}["gradients/exact-fp16-near-range"]
    assert "divides each gradient by the world size before summing" in rule


def test_with_rules_picks_the_id_then_the_longest_pattern() -> None:
    rules = {"a/*": "Family.", "a/x-*": "Narrower family.", "a/x-1": "Exactly this one."}
    assert rule_for("a/x-1", rules) == "Exactly this one."
    assert rule_for("a/x-2", rules) == "Narrower family."
    assert rule_for("a/y", rules) == "Family."
    assert rule_for("b/y", rules) == ""
    scenarios = with_rules([Scenario("a/x-1", "mlp"), Scenario("a/y", "mlp"),
                            Scenario("a/z", "mlp", rule="Its own.")], rules)
    assert [s.rule for s in scenarios] == ["Exactly this one.", "Family.", "Its own."]


def test_with_rules_refuses_a_scenario_without_rule_and_a_key_naming_none() -> None:
    with pytest.raises(ValueError, match="scenario 'a/x' has no rule"):
        with_rules([Scenario("a/x", "mlp"), Scenario("b/y", "mlp")], {"b/*": "Other."})
    with pytest.raises(ValueError, match="RULES key\\(s\\) naming no scenario: a/renamed"):
        with_rules([Scenario("a/x", "mlp")], {"a/x": "Rule.", "a/renamed": "Stale."})
