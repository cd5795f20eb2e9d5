"""``docs/mutation.md``, generated from the sample, the results and the classification.

``python benchmarks/mutation_score.py --docs`` writes it; ``--check-docs`` (and
``tests/test_mutation_docs.py``) says whether it is fresh. Nothing here runs a rank.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchmarks.mutation.measure import Outcome, read_outcomes
from benchmarks.mutation.population import ROOT, TARGETS, Mutant, load
from benchmarks.mutation.verdicts import Verdict, excluded, read

HERE = Path(__file__).resolve().parent
DOC = ROOT / "docs" / "mutation.md"
DETECTED = ("killed", "timeout")


@dataclass(frozen=True)
class Row:
    """A mutant's final class in one measurement."""

    mutant: Mutant
    outcome: Outcome
    cls: str  # killed, timeout, incompetent, equivalent, out-of-reach, survived, not reached
    reason: str = ""


def classify(sample: list[Mutant], outcomes: dict[str, Outcome],
             verdicts: dict[str, Verdict]) -> list[Row]:
    """Every measured mutant of ``sample`` with its class: detected as measured; an
    undetected one by its verdict (equivalent, out of reach) or the exclusion file; what
    is left is a survivor (a gap, fixed or not)."""
    rows = []
    for m in sample:
        o = outcomes.get(m.id)
        v = verdicts.get(m.id)
        if o is None:
            continue  # not measured yet
        if o.status in (*DETECTED, "incompetent"):
            rows.append(Row(m, o, o.status))
            continue
        if v is not None and v.cls != "gap":
            rows.append(Row(m, o, v.cls, v.reason))
            continue
        reason = excluded(m) if o.status == "not reached" else None
        if reason:
            rows.append(Row(m, o, "out-of-reach", reason))
        else:
            rows.append(Row(m, o, o.status, v.reason if v else ""))
    return rows


def score(rows: list[Row]) -> tuple[int, int]:
    """(detected, the mutants that count: all but incompetent, equivalent, out of reach)."""
    counted = [r for r in rows if r.cls not in ("incompetent", "equivalent", "out-of-reach")]
    return sum(r.cls in DETECTED for r in counted), len(counted)


def _load() -> tuple[dict, list[Mutant], dict[str, dict[str, Outcome]], dict[str, Verdict]]:
    counts = json.loads((HERE / "population.json").read_text())
    sample = load(HERE / "sample.jsonl")
    baseline = read_outcomes(HERE / "results" / "baseline.jsonl")
    after = {**baseline, **read_outcomes(HERE / "results" / "after.jsonl")}
    return counts, sample, {"baseline": baseline, "after": after}, read()


def _figures(rows: list[Row], total: int) -> list[str]:
    c = Counter(r.cls for r in rows)
    detected, counted = score(rows)
    pct = f"{100 * detected / counted:.1f}%" if counted else "-"
    return [f"{len(rows)} of {total}", str(c["killed"]), str(c["timeout"]),
            str(c["survived"]), str(c["not reached"]), str(c["incompetent"]),
            str(c["equivalent"]), str(c["out-of-reach"]),
            f"**{pct}** ({detected} of {counted})"]


def _cell(text: str, width: int = 150) -> str:
    text = " ".join(text.split()).replace("|", "\\|").replace("`", "'")
    return text if len(text) <= width else text[:width - 3] + "..."


def _population_table(counts: dict) -> list[str]:
    out = ["| file | mutants | by operator (the largest) |", "|---|---|---|"]
    for key, ops in counts["counts"].items():
        largest = sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))[:4]
        out.append(f"| `{TARGETS[key].path}` | {sum(ops.values())} | "
                   + ", ".join(f"{op} {n}" for op, n in largest) + " |")
    return out


def _survivor_rows(rows: list[Row], verdicts: dict[str, Verdict],
                   after: dict[str, Outcome]) -> list[str]:
    out = ["| mutant | line | change | class | why / what catches it now |",
           "|---|---|---|---|---|"]
    for r in rows:
        if r.cls in (*DETECTED, "incompetent"):
            continue
        v = verdicts.get(r.mutant.id)
        cls = v.cls if v else ("out-of-reach" if r.cls == "out-of-reach" else r.cls)
        why = v.reason if v else r.reason
        if v and v.cls == "gap" and v.fixed_by:
            now = after.get(r.mutant.id)
            caught = f": now {now.status} by `{now.scenario}` (`{now.check}`)" \
                if now and now.status in DETECTED else ": still survives"
            why = f"{why} **Added**: {v.fixed_by}{caught}."
        elif v and v.cls == "gap":
            why = f"{why} **Open.**"
        out.append(f"| `{r.mutant.id}` | {TARGETS[r.mutant.target].path.rsplit('/', 1)[-1]}:"
                   f"{r.mutant.first_line} | `{_cell(r.mutant.change, 110)}` | {cls} | "
                   f"{_cell(why or 'not classified yet', 400)} |")
    return out


def _kills(rows: list[Row], top: int = 15) -> list[str]:
    by = Counter(r.outcome.scenario for r in rows if r.cls in DETECTED)
    checks = Counter(r.outcome.check for r in rows if r.cls in DETECTED)
    out = ["| scenario | mutants it killed first |", "|---|---|"]
    out += [f"| `{s}` | {n} |" for s, n in by.most_common(top)]
    out.append("")
    out.append("By check: " + ", ".join(f"`{c}` {n}" for c, n in checks.most_common()) + ".")
    return out


def _killed_rows(rows: list[Row]) -> list[str]:
    out = ["| mutant | line | change | caught by (ranks) | check |", "|---|---|---|---|---|"]
    for r in rows:
        if r.cls in DETECTED:
            o = r.outcome
            out.append(f"| `{r.mutant.id}` | {r.mutant.first_line} | "
                       f"`{_cell(r.mutant.change, 90)}` | `{o.scenario}` ({o.world_size}) | "
                       f"`{o.check}` |")
    return out


def _world_sizes(outcomes: dict[str, Outcome]) -> str:
    survivors = [o for o in outcomes.values() if o.status == "survived" and o.id != "identity"]
    at3 = sum(not o.partial and o.world_size == 3 for o in survivors)
    return f"{at3} of the {len(survivors)} survivors also ran at 3 ranks"


def render() -> str:
    """The whole page."""
    counts, sample, measured, verdicts = _load()
    rows = {name: classify(sample, outcomes, verdicts) for name, outcomes in measured.items()}
    seconds = sum(o.seconds for o in measured["baseline"].values())
    head = ["| measurement | measured | killed | timeout | survived | not reached | "
            "incompetent | equivalent | out of reach | score |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name, label in (("baseline", "before (the catalog as it was)"),
                        ("after", "after (with the new scenarios and checks)")):
        head.append(f"| {label} | " + " | ".join(_figures(rows[name], len(sample))) + " |")
    text = TEMPLATE.format(
        figures="\n".join(head), seed=counts["seed"], size=len(sample),
        population=counts["population"], cosmic_ray=counts["cosmic_ray"],
        population_table="\n".join(_population_table(counts)),
        sample_by_file=", ".join(f"{k} {n}" for k, n in
                                 Counter(m.target for m in sample).most_common()),
        minutes=seconds / 60,
        survivors="\n".join(_survivor_rows(rows["baseline"], verdicts, measured["after"])),
        kills="\n".join(_kills(rows["baseline"])),
        killed="\n".join(_killed_rows(rows["after"])),
        ws_before=_world_sizes(measured["baseline"]),
        ws_after=_world_sizes(read_outcomes(HERE / "results" / "after.jsonl")))
    return text


TEMPLATE = """\
# Mutation score: torch's own DDP as the yardstick

<!-- Generated by `python benchmarks/mutation_score.py --docs` from benchmarks/mutation/
(sample.jsonl, population.json, results/*.jsonl, verdicts.toml): do not edit by hand. -->

Executing a line is not checking what it does. The catalog's strength is measured here the
way the field measures a test suite's: **mutants** of torch 2.13's own DDP sources, each
torch's DDP with one small change (an operator, a constant, a condition), run as
candidates; a mutant is **killed** when some scenario fails it. A change no scenario
notices is either harmless (**equivalent**: no behaviour a user can observe changes),
**out of reach** on Gloo/CPU (a CUDA-only branch, NCCL-only code), or a gap in the catalog.

**Score = mutants killed (or timed out) / mutants not incompetent, not equivalent and not
out of reach.**

{figures}

*killed*: a scenario FAILs, ERRORs or CRASHes on it; *timeout*: a case ran past its
deadline (the harness's TIMEOUT: a hang it diagnosed, counted as detected, as mutation tools
count timeouts); *survived*: every scenario that runs its lines passes (at 2 ranks, and at
3 where the next paragraph says so);
*not reached*: no scenario runs its lines (measured by coverage); *incompetent*: its module
does not import (cosmic-ray's operators also rewrite `*args` into invalid syntax).
Measured on {size} mutants in {minutes:.0f} minutes of mutant runs on a 2-core machine
shared with other work. Before: every mutant at 2 ranks; {ws_before} (a survivor argued
equivalent or out of reach is not run at 3 ranks: it does not count whatever happens
there). After: the mutants classified as gaps with a fix, measured again (at 2 ranks, then
at 3 for what survives), and then every mutant still undetected measured again against the
whole catalog of the day (the bug-history scenarios included), with the coverage of both
reducer modes at 2 ranks (at 3 ranks, the earlier coverage: the C++ reducer's, before the
bug-history scenarios; `--coverage-dir` names such a mix; the scenarios added last,
gaps/powersgd-from-start, then gaps/broadcast-buffers-off-mid-run, gaps/device-ids-on-cpu,
gaps/powersgd-gram-schmidt and gaps/post-local-sgd-before-start, were measured with
coverage on their own and merged into the 2-rank data); {ws_after}.

What is not judged, stated once: warnings, log records and the statistics PowerSGD keeps
for its log (`compression_stats()`) are not DDP semantics, so a mutant that only changes
them is equivalent; a refusal is judged as the catalog's contract says (a clear error on
every rank, no hang), so a mutant that refuses the same input with another exception is
equivalent unless `--strict-messages` is given.

## How the figures are made

```sh
pip install -e '.[mutation]'                              # cosmic-ray 8.7.0, coverage.py
python benchmarks/mutation_score.py --measure-coverage    # per-case coverage of torch's run, 2 and 3 ranks
python benchmarks/mutation_score.py --sample              # seed {seed}: sample.jsonl, population.json
nice -n 10 python benchmarks/mutation_score.py --run      # results/baseline.jsonl
# ... classify the survivors (verdicts.toml), add scenarios and checks, then:
python benchmarks/mutation_score.py --measure-coverage --slow   # the new scenarios' coverage
nice -n 10 python benchmarks/mutation_score.py --run --results after --gaps --slow
# ... then the mutants still undetected, their lines dropped from results/after.jsonl:
nice -n 10 python benchmarks/mutation_score.py --run --results after --slow --only ID...
python benchmarks/mutation_score.py --docs                # this page
```

`--run --part K/N` splits the sample over N processes side by side (one results file);
`--coverage-dir` reads coverage measured elsewhere (the baseline's last mutant was run
against the coverage of the catalog before the new scenarios); `--slow` includes the
scenarios behind `--slow` (the after measurement does: one new scenario is slow). `--run`
is resumable (it appends each mutant's outcome to the JSONL file as soon as it is known
and skips those already there). One mutant by hand, as the harness runs it:

```sh
ddp-conformance run --candidate 'benchmarks.mutation.live:distributed/ReplaceComparisonOperator_Eq_NotEq/5' \\
    --strict-profile -x --world-size 2      # then --world-size 3
```

Per mutant: the scenarios that run its lines, from coverage measured once with one
coverage context per case (`--coverage` labels what each rank executes with its case,
`scenario-id[candidate]`); a line run only at import (a `def`, a module constant) is run by
every scenario. The coverage run runs torch's DDP in both reducer modes: `torch`, and
`torch-python-reducer` (the Python reducer, `optimize_ddp="python_reducer"`, whose lines
the C++ reducer's runs never execute). Where a `[torch-python-reducer]` case ran a mutant's
lines, the mutant runs that scenario in python-reducer mode, as
`benchmarks.mutation.live:<mutant id>@python-reducer` (the mutant's DDP class built as the
built-in `torch-python-reducer` builds torch's, with that candidate's capabilities); a line
run only at import reaches the C++-reducer runs only. Only scenarios torch's DDP passes (in
that mode) count (a scenario torch itself fails
cannot tell a mutant from torch). They run with `-x` semantics, those that killed most
mutants so far first, then the cheapest; at 2 ranks, then, for the survivors, at 3. The
candidates are held to the strict profile (torch's bucket layout and wire dtype), as torch
is. Several mutants share one rank pool (one `Runner`, 25 mutants).

## The tool: cosmic-ray {cosmic_ray}, and why

Both well-kept Python mutation tools can enumerate the same operator mutations; what
differs is how they apply and run them.
- **mutmut** (3.x) is built around its own runner over *the project's own sources*: it
  copies the project into `mutants/`, rewrites every function into a trampoline that picks
  the original or a mutant from an environment variable, and runs the project's pytest
  with its own per-test statistics. The code mutated here is not this project's: it is
  torch's installed `distributed.py`; the tests are conformance cases run in rank
  processes forked from a zygote; and which cases run a mutant comes from the harness's own
  per-case coverage. mutmut would have to trampoline files inside site-packages and be
  taught to drive the rank pool.
- **cosmic-ray**'s operators and AST machinery are a library: an operator lists the
  positions it can mutate in a parso tree (`mutation_positions`), and
  `cosmic_ray.mutating.mutate_code(source, operator, occurrence)` returns the source with
  that one mutation, which is exactly what a candidate needs. Nothing on disk is changed
  (cosmic-ray's own worker writes the mutant into the file, which would change torch for
  every process on the machine, the reference and the harness included). A mutant is
  named by operator and occurrence, stable for a given torch, so the sample is reproducible.
The core operators that need no arguments are used (cosmic-ray's `init` uses the same set
without a configuration).

## How a mutant becomes a candidate

`--candidate benchmarks.mutation.live:<mutant id>` resolves, in the harness and in the
pool's zygote, to a candidate with torch's DDP's constructor and capabilities; nothing of
the mutant runs there. At the candidate's first `wrap` in a rank:

1. the mutated file is executed into a module of its own (`_ddp_mutant_<file>`, in
   `sys.modules` so that pickling a DDP finds its class); torch's modules are untouched, so
   the reference DDP, the oracle, the harness and the hygiene's fingerprint of torch's
   surface see torch as it is;
2. `distributed.py` (mutated, or the original when another file is mutated) is executed the
   same way with an `__import__` that answers `from <mutated module> import ...` with the
   mutant's module. So **a mutant of `join.py` is the `Join`, `Joinable` and `JoinHook` this
   DDP subclasses and calls**: `DDP.join()` (which the harness uses when the optimizer is
   not joinable), the join hook, and the `Join.notify_join_context` of every forward; and a
   mutant of `optimizer_overlap_hooks.py` is what `_register_fused_optim` and the optimizer
   in backward import;
3. the DDP class handed over translates what a scenario builds with torch's modules: **a comm
   hook of the mutated hook module is replaced by the mutated module's function of the same
   name** (a closure such as `fp16_compress_wrapper(allreduce_hook)` or the fused optimizer's
   `_hook_then_optimizer(...)` is rebuilt by calling the mutated factory with the
   closure's values, translated in turn), and its state object is rebuilt by the mutated
   class from its attributes (`PowerSGDState`, `PostLocalSGDState`: the mutated
   constructor runs);
4. where the harness builds a `Join` itself (the DDP with a ZeroRedundancyOptimizer), the
   mutant's adapter uses the mutant's `Join` class.

Not reached this way: ZeroRedundancyOptimizer's own `Join.notify_join_context` (torch's
class, which reads the configuration the mutant's `Join` set), and the state classes torch's
fused-optimizer module builds itself. The control,
`benchmarks.mutation.live:identity` (torch's sources unmutated, built the same way), passes
every scenario torch passes.

## The sample

A uniform random sample of **{size}** of the **{population}** mutants (seed **{seed}**,
`random.Random(seed).sample` over the population in cosmic-ray's order), per file:
{sample_by_file}. The population, per file (all operators of cosmic-ray's core set that
take no arguments):

{population_table}

## The mutants no scenario kills

{survivors}

## What kills

{kills}

<details><summary>Every detected mutant, with the scenario and check that caught it first
(after the new scenarios)</summary>

{killed}

</details>
"""
