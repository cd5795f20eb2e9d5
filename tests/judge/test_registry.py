"""The registry: named units, declared ids enforced (the documentation's checks page is read
from it: tests/test_docs_reference.py)."""
from __future__ import annotations

import pytest
import torch

from ddp_conformance.judge.checks import declared_ids, registered
from ddp_conformance.judge.evidence import Evidence
from ddp_conformance.judge.registry import Context, check, values

UNITS_IN_ORDER = ["expected_error", "init", "oracle", "replica", "reference", "trace.dtype",
                  "trace.no_sync", "trace.reduced_once", "trace.consistent", "trace.buckets"]


def test_units_run_in_order_and_declare_disjoint_ids() -> None:
    units = registered()
    assert [u.name for u in units] == UNITS_IN_ORDER
    ids = declared_ids()
    assert len(ids) == len(set(ids))
    assert all(u.contract.strip() for u in units)


def test_the_units_declare_the_ids_of_the_spec() -> None:
    by_unit = {u.name: set(u.ids) for u in registered()}
    assert by_unit["init"] == {"init.param", "init.buffer"}
    assert by_unit["oracle"] == {"oracle.grad", "oracle.grad_none", "oracle.param",
                                 "oracle.buffer"}
    assert by_unit["replica"] == {"replica.param", "replica.buffer_broadcast", "replica.final"}
    assert by_unit["reference"] == {"reference.grad", "reference.grad_none", "reference.param",
                                    "reference.buffer", "reference.steps"}
    for name in UNITS_IN_ORDER:
        if name.startswith("trace.") or name == "expected_error":
            assert by_unit[name] == {name}


def test_reporting_an_undeclared_id_raises() -> None:
    ev = Evidence()
    with ev.reporting("unit", ["unit.ok"]):
        ev.fail("unit.ok", "fine")
        with pytest.raises(AssertionError, match="does not declare"):
            ev.fail("unit.other", "not declared")
        with pytest.raises(AssertionError):
            ev.ran("unit.other")
        with pytest.raises(AssertionError):
            ev.compare("unit.other", 0, 0, "x", torch.zeros(1), torch.zeros(1), 0.0, "it")
        with pytest.raises(AssertionError):
            ev.compare_all("unit.other", 0, 0, {}, {}, None, "it")  # type: ignore[arg-type]
    ev.fail("anything", "outside a unit nothing is enforced")
    assert [f.check for f in ev.failures] == ["unit.ok", "anything"]


def test_a_unit_reporting_an_undeclared_id_raises_when_judged() -> None:
    unit = registered()[UNITS_IN_ORDER.index("init")]
    ev = Evidence()

    def body(ctx: Context) -> None:
        ctx.evidence.fail("oracle.grad", "not init's to report")

    from .world import make_world

    world = make_world()
    rogue = type(unit)(unit.name, unit.ids, unit.applies, body)
    with pytest.raises(AssertionError, match="'init' reported 'oracle.grad'"):
        rogue(Context(world.scenario, world.records, world.oracle, None, False, False, ev))


def test_registration_refuses_duplicates_and_undocumented_units() -> None:
    registered()

    def documented(ctx: Context) -> None:
        """A contract."""

    def undocumented(ctx: Context) -> None:
        pass

    with pytest.raises(ValueError, match="registered twice"):
        check("init", "init.other", when=values)(documented)
    with pytest.raises(ValueError, match="ids of another unit"):
        check("init.again", "init.param", when=values)(documented)
    with pytest.raises(ValueError, match="no docstring"):
        check("undocumented", when=values)(undocumented)
    assert [u.name for u in registered()] == UNITS_IN_ORDER
