"""Rows of dimension values (``catalog/interactions.py``) as scenarios, and the rows that
cover the valid pairs the rest of the catalog leaves uncovered.

:func:`scenario_for` turns a row (dimension -> value) into a :class:`Scenario` whose
values read back as the row (``interactions.read``), with a readable id (the row's
non-default values) and a rule composed from the phrases of the two values it was chosen
for. :func:`generate` asks covertable for a pairwise covering array over every dimension,
with :mod:`.exclusions` as its constraints and the catalog's own rows as presets, and
keeps, in order, each row that covers a valid pair nothing before it covered:
deterministic for a given catalog (covertable orders pairs by a fixed hash). ``suites/
test_interactions.py`` holds its output as data (``python -m ddp_conformance.catalog.
interaction_rows`` prints it; covertable is in the ``dev`` extra, needed only to regenerate).

covertable rather than allpairspy: allpairspy applies a filter to the rows it builds and
drops what the filter blocks, so under these exclusions it stops with valid pairs left
over (974 of 1018 covered when measured), and it has no way to start from rows already
run; covertable propagates declarative constraints, covers every valid pair, and takes
the catalog's rows as presets.
"""
from __future__ import annotations

import dataclasses
import itertools
import sys
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

from ddp_conformance.catalog.exclusions import EXCLUSIONS, GAPS, LOSSY_HOOKS
from ddp_conformance.catalog.interactions import BY_NAME, DIMENSIONS, read
from ddp_conformance.catalog.pairs import Pair, coverage
from ddp_conformance.catalog.scenario import JoinSpec, Scenario

Row = Mapping[str, str]

#: The catalog model that stands for each value of the model dimension.
MODEL_FOR = {"plain": "mlp", "buffers_in_place": "conv_bn", "buffers_replaced": "buffers_replaced",
             "unused_parameters": "unused_on_rank1", "unused_output": "two_heads_one_left_out",
             "tied": "tied", "low_precision": "mlp_bfloat16", "mixed_dtypes": "mixed_dtypes",
             "sparse": "sparse_embedding"}
#: Microbatches of a step that accumulates (nested no_sync needs three).
MICROBATCHES = 3
#: float16's unit roundoff 2**-11 times (W + 1) roundings at W <= 4, with margin: the
#: tolerance of comm-hooks/fp16-compress, argued there.
LOSSY_RTOL = 4e-3
#: The id's word for a value, where the value alone would not say which dimension it is in.
WORDS = {("bucket_cap", "default"): "default-cap", ("bucket_cap", "tiny"): "tiny-cap",
         ("gradient_as_bucket_view", "off"): "own-grads",
         ("gradient_as_bucket_view", "on"): "bucket-view",
         ("static_graph", "off"): "dynamic-graph", ("static_graph", "on"): "static-graph",
         ("find_unused_parameters", "off"): "all-used", ("find_unused_parameters", "on"):
         "find-unused", ("broadcast_buffers", "on"): "broadcast",
         ("broadcast_buffers", "off"): "no-broadcast", ("precision", "full"): "full-precision",
         ("join", "off"): "no-join", ("join", "uneven"): "join", ("forwards", "one"):
         "one-forward", ("forwards", "several"): "two-forwards",
         ("eval_between_steps", "off"): "no-eval", ("eval_between_steps", "on"): "eval",
         ("checkpointing", "none"): "not-saved", ("checkpointing", "saved_mid_run"): "saved",
         ("set_to_none", "none"): "grads-to-none", ("set_to_none", "zeros"): "grads-zeroed",
         ("comm_hook", "none"): "no-hook", ("comm_hook", "allreduce"): "allreduce-hook",
         ("comm_hook", "allreduce_to_new_tensor"): "new-tensor-hook",
         ("comm_hook", "fp16_compress"): "fp16-hook", ("comm_hook", "bucket_position"):
         "position-hook", ("comm_hook", "builtin_allreduce"): "cpp-allreduce",
         ("comm_hook", "builtin_fp16_compress"): "cpp-fp16",
         ("accumulation", "single_auto_sync"): "single-auto",
         ("accumulation", "multi_auto_sync"): "multi-auto",
         ("model", "unused_parameters"): "unused-params"}
_PREFIX = "interactions/"
#: How many generated rows a default run holds (the rest are slow): the fewest that keep
#: 95% of the valid pairs covered without --slow. Measured side by side with the catalog
#: before them (benchmarks/catalog_time.py, 2 ranks, torch and reference, 3 interleaved
#: pairs on a loaded machine): 35 rows cost 1.18x the catalog's time (median per-pair
#: ratio), 30 rows 1.14x, all 55 of the time 1.33x.
DEFAULT_RUN = 37


def default(dimension: str) -> str:
    """A dimension's default: its first value."""
    return next(iter(BY_NAME[dimension].values))


def word(point: tuple[str, str]) -> str:
    """A value as a word of an id."""
    return WORDS.get(point, point[1].replace("_", "-"))


def scenario_id(pair: Pair) -> str:
    """``interactions/<value>+<value>``: the pair the row was chosen for (one row per pair,
    so the id is unique)."""
    return f"{_PREFIX}{word(pair[0])}+{word(pair[1])}"


def _fields(row: Row) -> dict[str, Any]:
    """The scenario's fields, dimension by dimension."""
    options: dict[str, Any] = {}
    if row["bucket_cap"] == "tiny":
        options["bucket_cap_mb"] = 0.0001
    for name in ("gradient_as_bucket_view", "static_graph", "find_unused_parameters"):
        if row[name] == "on":
            options[name] = True
    if row["broadcast_buffers"] == "off":
        options["broadcast_buffers"] = False
    fields: dict[str, Any] = dict(model=MODEL_FOR[row["model"]], ddp_options=options,
                                  optimizer=row["optimizer"],
                                  zero_grad_set_to_none=row["set_to_none"] == "none")
    accumulation = row["accumulation"]
    if accumulation != "one_microbatch":
        fields["microbatches"] = MICROBATCHES
        key = "accumulate" if accumulation in ("sync_each", "no_sync", "nested_no_sync") \
            else "sync_strategy"
        fields[key] = accumulation
    if row["precision"] == "autocast":
        fields["autocast"] = "bfloat16"
    if row["join"] == "uneven":
        fields["join"] = JoinSpec()
    if row["forwards"] == "several":
        fields["forwards"] = 2
    if row["eval_between_steps"] == "on":
        fields["eval_between_steps"] = True
    if row["checkpointing"] == "saved_mid_run":
        fields.update(copy_wrapper="torch_save", copy_wrapper_at=1)
    if row["comm_hook"] != "none":
        fields["comm_hook"] = row["comm_hook"]
        if row["comm_hook"] in LOSSY_HOOKS:
            fields["rtol"] = LOSSY_RTOL
    if row["model"] == "sparse":  # a sparse gradient is not reduced element by element
        fields["trace_volume"] = False
    return fields


def rule(row: Row, pair: Pair) -> str:
    """The rule of the row chosen for ``pair``: its two values' phrases, held together."""
    (d1, v1), (d2, v2) = pair
    first, second = BY_NAME[d1].values[v1], BY_NAME[d2].values[v2]
    return f"{first[0].upper()}{first[1:]}, while {second}."


def description(row: Row) -> str:
    """Every value of the row, non-default ones first."""
    parts = [f"{d.name}={row[d.name]}" for d in DIMENSIONS if row[d.name] != default(d.name)]
    return "; ".join(parts) or "every dimension at its default"


def scenario_for(row: Row, pair: Pair) -> Scenario:
    """The scenario of ``row``, whose rule names ``pair`` (the pair it was chosen for)."""
    return Scenario(scenario_id(pair), description=description(row), rule=rule(row, pair),
                    **_fields(row))


def _presets(scenarios: Iterable[Scenario]) -> list[dict[str, str]]:
    """Every full row a catalog scenario takes (set values expanded; a scenario with no
    value in a dimension gives none): the covering array starts from them."""
    names = [d.name for d in DIMENSIONS]
    rows = []
    for s in scenarios:
        values = read(s)
        rows += [dict(zip(names, r, strict=True))
                 for r in itertools.product(*(sorted(values[n]) for n in names))]
    return rows


def _constraints() -> list[dict[str, Any]]:
    """:data:`~.exclusions.EXCLUSIONS` and :data:`~.exclusions.GAPS` as covertable's
    declarative constraints."""
    return [{"operator": "not", "condition": {"operator": "and", "conditions": [
        {"operator": "in", "left": dim, "values": sorted(values)}
        for dim, values in x.when.items()]}} for x in EXCLUSIONS + GAPS]


def generate(scenarios: list[Scenario]) -> list[tuple[dict[str, str], Pair]]:
    """The rows that cover the valid pairs ``scenarios`` leave uncovered, each with the
    first pair (in the table's order) it covers that nothing before it did."""
    from covertable import make  # type: ignore[import-untyped]

    base = [s for s in scenarios if not s.id.startswith(_PREFIX) and not s.may_raise]
    state = coverage(base)
    order = {p: i for i, p in enumerate(state.valid)}
    covered = set(state.covered)
    presets = _presets(base)
    known = {tuple(sorted(p.items())) for p in presets}
    rows = make({d.name: list(d.values) for d in DIMENSIONS}, constraints=_constraints(),
                presets=presets)
    kept = []
    for row in rows:
        if tuple(sorted(row.items())) in known:
            continue
        row = {d.name: row[d.name] for d in DIMENSIONS}
        new = sorted((_row_pairs(row) & set(order)) - covered, key=order.__getitem__)
        if new:
            kept.append((row, new[0]))
            covered |= set(new)
    return kept


def _row_pairs(row: Row) -> set[Pair]:
    names = [d.name for d in DIMENSIONS]
    return {((a, row[a]), (b, row[b])) for a, b in itertools.combinations(names, 2)}


def full_row(values: Row) -> dict[str, str]:
    """``values`` (the non-default ones) with every other dimension at its default."""
    unknown = sorted(set(values) - set(BY_NAME))
    if unknown:
        raise ValueError(f"unknown dimension(s) {unknown}; known: {', '.join(BY_NAME)}")
    return {d.name: values.get(d.name, default(d.name)) for d in DIMENSIONS}


def suite_scenario(values: Row, pair: Pair, slow: bool = False) -> Scenario:
    """The suite's scenario of a row given by its non-default ``values``."""
    scenario = scenario_for(full_row(values), pair)
    return dataclasses.replace(scenario, slow=True) if slow else scenario


def suite_text(kept: list[tuple[dict[str, str], Pair]],
               default_run: int = DEFAULT_RUN) -> str:
    """``suites/test_interactions.py`` holding ``kept`` as data, a row per entry under a
    comment naming its scenario; rows past the first ``default_run`` are slow."""
    lines = []
    for row, pair in kept:
        items = [f'"{k}": "{v}"' for k, v in row.items() if v != default(k)]
        body = textwrap.wrap(", ".join(items), 92, break_long_words=False,
                             break_on_hyphens=False)
        (d1, v1), (d2, v2) = pair
        lines += [f"    # {scenario_id(pair)}", "    ({" + "\n      ".join(body) + "},",
                  f'     (("{d1}", "{v1}"), ("{d2}", "{v2}"))),']
    return (_HEADER + "\n".join(lines) + "\n]\n\n"
            + _FOOTER.format(default_run=default_run))


_HEADER = '''"""Pairwise feature interactions: scenarios that cover the valid pairs of dimension values
the rest of the catalog leaves uncovered (docs/interactions.md).

Generated, do not edit by hand: ``python -m ddp_conformance.catalog.interaction_rows >
suites/test_interactions.py`` (a covering array over ddp_conformance/catalog/interactions.py's
dimensions, under catalog/exclusions.py's exclusions, starting from the catalog's own rows).
Each row gives its non-default values and the pair its rule names; rows come in the
generator's order, which covers the most new pairs first.
"""
from ddp_conformance.catalog.interaction_rows import suite_scenario
from ddp_conformance.catalog.rules import with_rules

ROWS = [
'''
_FOOTER = '''#: The first DEFAULT_RUN rows (they cover the most new pairs) run by default; the others
#: are slow scenarios, run with --slow (docs/interactions.md gives both coverage figures).
DEFAULT_RUN = {default_run}
SCENARIOS = [suite_scenario(values, pair, slow=i >= DEFAULT_RUN)
             for i, (values, pair) in enumerate(ROWS)]
#: Each scenario carries its rule, composed from the phrases of the pair it covers first.
RULES: dict[str, str] = {{}}
SCENARIOS = with_rules(SCENARIOS, RULES)
'''


def main() -> None:
    """Print ``suites/test_interactions.py`` for the catalog as it is."""
    from ddp_conformance.catalog.loader import load_catalog

    sys.stdout.write(suite_text(generate(load_catalog())))


if __name__ == "__main__":
    main()
