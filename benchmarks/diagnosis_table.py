"""docs/diagnosis.md: the cause codes, and what the diagnosis names for each defective DDP.

    python benchmarks/diagnosis_table.py [--scope planted|families|catalog] [--timeout S]
                                         [--write docs/diagnosis.md]
    python benchmarks/diagnosis_table.py --readme   # README.md's short table, from the page

Runs every defective DDP of ``tests/diagnosed.py`` (one planted defect each) and the correct
ones on the chosen scenarios (``planted``: the few the tests use; ``families``: those plus
the first scenario of every catalog family; ``catalog``: the whole catalog), one runner per
world size, and prints the table: DDP, planted defect, the code expected, the first
finding, how many unexpected verdicts it explains. ``--write`` regenerates the whole of
docs/diagnosis.md (codes from :class:`~ddp_conformance.judge.diagnose.causes.Cause`,
the table from this run).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ddp_conformance.catalog.loader import load_catalog  # noqa: E402
from ddp_conformance.catalog.scenario import Scenario  # noqa: E402
from ddp_conformance.config import RunConfig  # noqa: E402
from ddp_conformance.judge.diagnose.causes import Cause  # noqa: E402
from ddp_conformance.judge.diagnose.findings import diagnose  # noqa: E402
from ddp_conformance.runner import Runner  # noqa: E402
from tests.diagnosed import CORRECT, PLANTED  # noqa: E402

HEADER = ["DDP", "planted defect", "expected", "first finding", "cases explained",
          "other findings", "cases run"]


def scenarios(scope: str, planted: tuple[str, ...], catalog: list[Scenario]) -> list[Scenario]:
    if scope == "catalog":
        return catalog
    ids = set(planted)
    if scope == "families":
        first: dict[str, str] = {}
        for s in catalog:
            first.setdefault(s.id.split("/", 1)[0], s.id)
        ids |= set(first.values())
    return [s for s in catalog if s.id in ids]


def rows(scope: str, timeout_s: float) -> list[list[str]]:
    catalog = load_catalog()
    out = []
    for world in sorted({p.world_size for p in PLANTED}):
        entries = [(p.spec, p.defect, p.code, p.scenarios) for p in PLANTED
                   if p.world_size == world]
        if world == 2:
            entries += [(spec, "none (correct)", "no finding", ids) for spec, ids in CORRECT]
        specs = list(dict.fromkeys(e[0] for e in entries))
        with Runner(RunConfig(candidates=specs, world_size=world, timeout_s=timeout_s)) as run:
            for spec, defect, code, ids in entries:
                results = [run.run_case(s, spec) for s in scenarios(scope, ids, catalog)]
                (d,) = diagnose(results)
                first = d.findings[0] if d.findings else None
                got = first.code if first else "no finding"
                mark = "" if got == code else " (differs)"
                others = ", ".join(f"`{f.code}` {f.cases}" for f in d.findings[1:]) or "-"
                out.append([f"`{spec}`", defect, f"`{code}`", f"`{got}`{mark}",
                            f"{first.cases} of {d.unexpected}" if first else "0 of 0",
                            others, str(len(results))])
                print(" | ".join(out[-1]), flush=True)
    return out


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


INTRO = """# Diagnosis: from a failing run to its cause

A run with unexpected verdicts (FAIL, ERROR, TIMEOUT, CRASH) opens on a **diagnosis** per
candidate: the few causes that explain most of them, each a stable code, one line in the
user's words, the number of cases it explains, the scenario families where it shows and
where it does not, the smallest case to look at first and its `repro` command. It is the
first thing in the terminal's closing block, in `summary.md`, in `report.html` and in the
pytest route's terminal summary, and one record per candidate in `results.jsonl`:

```json
{"type": "diagnosis", "candidate": "SPEC", "unexpected": 136,
 "findings": [{"code": "no-division",
               "summary": "every wrong gradient at step 0 is 2.000x the expected ...",
               "cases": 136, "first_case": "...", "repro": "ddp-conformance repro ...",
               "case_ids": ["..."], "families": ["..."], "not_in": ["..."],
               "checks": {"oracle.grad": 120}, "note": ""}]}
```

Findings are ordered by the cases they explain. Only unexpected verdicts count: an XFAIL
listed in an expectations file is not diagnosed, and a run with none has no finding. Each
case's own first line states its cause (`[no-division] every wrong gradient ...`), and in
`results.jsonl` each `result` carries `cause` (`code`, `relation`, `check`).

Below the diagnosis every report lists the unexpected verdicts grouped by cause, a table
of how many cases failed first in each check, and N/A cases grouped by what they lack;
then the verdict matrix; the closing line counts FAIL, ERROR, TIMEOUT, CRASH, N/A, XFAIL,
XPASS, PASS in that order. The rule shown under a failure is the failing check's own when
the scenario's rule is about something else.

## How a cause is derived

From recorded values and traces only, never guessed. The case's first failure (checks
ordered cause before effect) says where to look; for a value check, every wrong gradient
of the first failing step (where the candidate's trajectory still equals the oracle's) is
compared with the expected one, the ranks' local gradients and earlier steps' averages.
A relation is stated only when it holds for *every* wrong gradient, to the rounding bound
`4 W u scale max(1, |c|)` (W ranks summed, `u` the dtype's unit roundoff, `scale` the
magnitude the reduction sums): for float32 and two ranks 4.8e-7 relative, so a ratio of
1.98 is never "2x" (`ddp_conformance/judge/diagnose/signatures.py` argues each bound; its
tests use near misses). When nothing holds the answer is `unexplained`, with the evidence.

An ERROR names the innermost frame in the candidate's own files (`file:line`), a CRASH
quotes the backend's last message from the dead rank's output, a TIMEOUT says whether the
ranks wait in collectives or a rank is stuck in the candidate's own code. No message names
the harness's own types. The note that an option was "taken only through `**kwargs`"
is kept for candidates that do not hand it on to torch's DDP, and repeated on a finding
only where every case it explains set such an option.

## The codes

Codes are a public contract: new ones are added, none is renamed or removed.

"""


def document(table: str, scope: str, seconds: float) -> str:
    codes = markdown_table(["code", "evidence"],
                           [[f"`{c.value}`", " ".join(c.doc.split())] for c in Cause])
    return (INTRO + codes + "\n\n## Defective DDPs and what the diagnosis names\n\n"
            "Each DDP of `tests/diagnosed.py` (and `tests/defective.py`) has one planted "
            "defect; some subclass torch's DDP, some (`Scratch*`) are written from scratch "
            "on `torch.distributed`. `tests/test_diagnosed.py` checks that the first "
            "finding of each is the planted one on a few scenarios; this table is "
            f"`python benchmarks/diagnosis_table.py --scope {scope} --write docs/diagnosis.md` "
            f"({seconds:.0f} s on the 2-core machine). \"cases explained\": unexpected "
            "verdicts the first finding explains, of all the DDP's unexpected verdicts; "
            "\"other findings\": the rest of its diagnosis (a scenario that shows another "
            "side of the same defect; a feature a DDP written from scratch lacks; or, for "
            "the DDPs that register a comm hook at construction, torch's refusal of the "
            "scenario's own second hook).\n\n"
            + table + "\n")


#: Where README.md holds its short form of the table (:func:`readme_table`).
README_MARKS = ("<!-- diagnosis table: benchmarks/diagnosis_table.py --readme -->",
                "<!-- end of the diagnosis table -->")


def page_table(doc: str) -> tuple[list[str], list[list[str]]]:
    """The header and the rows of docs/diagnosis.md's table of defective DDPs (``doc``,
    the page's text), as cells."""
    lines = doc.split("## Defective DDPs and what the diagnosis names", 1)[1].splitlines()
    header, *rows = [[c.strip() for c in line.strip().strip("|").split("|")]
                     for line in lines if line.startswith("| ")]
    return header, rows


def readme_table(doc: str) -> str:
    """README's short form of docs/diagnosis.md's table (``doc``, the page's text): DDP
    (class name), planted defect, first finding, cases explained; the correct DDPs on one
    row."""
    cells = page_table(doc)[1]
    defective = [[f"`{r[0].strip('`').rsplit(':', 1)[-1]}`", r[1], r[3], r[4]]
                 for r in cells if r[1] != "none (correct)"]
    correct = ", ".join(r[0].strip("`").rsplit(":", 1)[-1] for r in cells
                        if r[1] == "none (correct)")
    findings = {r[3] for r in cells if r[1] == "none (correct)"}
    body = defective + [[correct, "none (correct)", " ".join(sorted(findings)), "-"]]
    return markdown_table(["DDP", "planted defect", "first finding", "cases explained"], body)


def update_readme(path: str, doc: str) -> None:
    """Replace README's table (between :data:`README_MARKS`) by :func:`readme_table`."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    head, rest = text.split(README_MARKS[0], 1)
    tail = rest.split(README_MARKS[1], 1)[1]
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{README_MARKS[0]}\n{readme_table(doc)}\n{README_MARKS[1]}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scope", choices=("planted", "families", "catalog"),
                        default="families")
    parser.add_argument("--timeout", type=float, default=8.0)
    parser.add_argument("--write", metavar="FILE")
    parser.add_argument("--readme", action="store_true",
                        help="only rewrite README.md's short table from docs/diagnosis.md")
    args = parser.parse_args()
    if args.readme:
        with open(os.path.join(ROOT, "docs", "diagnosis.md"), encoding="utf-8") as f:
            update_readme(os.path.join(ROOT, "README.md"), f.read())
        return
    started = time.monotonic()
    table = markdown_table(HEADER, rows(args.scope, args.timeout))
    took = time.monotonic() - started
    print(table)
    if args.write:
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(document(table, args.scope, took))
        print(f"wrote {args.write} in {took:.0f} s")


if __name__ == "__main__":
    main()
