"""The reference pages that are read from the code, so that they cannot drift from it.

Each ``*_page()`` returns Markdown (MyST) built from what the installed package declares:
the command line from ``ddp_conformance.cli.build_parser()`` and the option table of
``ddp_conformance/options.py``; the checks from the judge's registry; the scenarios, with
their rules and needs, from the catalog; the exit codes from ``ddp_conformance/errors.py``;
the fields of ``results.jsonl``'s records from the dataclasses and functions that write them.
The Sphinx extension (``ddp_docs.py``) appends a page's text to its stub at build time;
``tests/test_docs_reference.py`` checks that nothing declared in the code is missing.

Imports no Sphinx: the test runs without the docs tooling.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import textwrap
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _md(text: str) -> str:
    """A docstring's reStructuredText roles and double backticks as Markdown code spans."""
    text = re.sub(r":[a-z]+:`~?\.?([^`]+)`", r"`\1`", text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    return text.replace("|", "\\|")


def _cell(text: str) -> str:
    return " ".join(_md(text).split())


def _sentence(text: str) -> str:
    text = _cell(text)
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _docstring(obj: Any) -> str:
    return _md(textwrap.dedent(inspect.getdoc(obj) or "").strip())


# ----------------------------------------------------------------------------- the CLI

def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return {name: (helps.get(name, ""), sub) for name, sub in action.choices.items()}
    return {}


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    main = [f for f in action.option_strings if not f.startswith("--ddp-")]
    shown = ", ".join(f"`{f}`" for f in main or action.option_strings)
    if action.metavar:
        metavar = action.metavar
        shown += f" `{' '.join(metavar) if isinstance(metavar, tuple) else metavar}`"
    elif action.choices:
        shown += " `{" + ",".join(str(c) for c in action.choices) + "}`"
    return shown


def _default(action: argparse.Action) -> str:
    default = action.default
    if not action.option_strings or default is None or default is False or default == argparse.SUPPRESS:
        return ""
    return f"`{default}`"


def _long_flags(action: argparse.Action) -> list[str]:
    """An option's long flags, less its ``--ddp-NAME`` alias where it has ``--NAME`` (the
    page says once that the alias is accepted)."""
    flags = [f for f in action.option_strings if f.startswith("--") and f != "--help"]
    plain = [f for f in flags if not f.startswith("--ddp-")]
    return plain or flags


def cli_options() -> dict[str, list[str]]:
    """Every option of every subcommand, by subcommand: its long flags."""
    from ddp_conformance.cli import build_parser

    return {name: [f for a in sub._actions for f in _long_flags(a)]
            for name, (_, sub) in _subcommands(build_parser()).items()}


def cli_page() -> str:
    from ddp_conformance.cli import build_parser
    from ddp_conformance.options import CLI, COMMANDS, OPTIONS, PYTEST

    parser = build_parser()
    out = ["## Commands", ""]
    commands = _subcommands(parser)
    out += [f"- [`ddp-conformance {name}`](#cmd-{name}): {_cell(help_)}"
            for name, (help_, _) in commands.items()]
    out.append("")
    for name, (help_, sub) in commands.items():
        out += [f"({'cmd-' + name})=", f"## `ddp-conformance {name}`", "", _sentence(help_), "",
                "| option | default | what it does |", "|---|---|---|"]
        for action in sub._actions:
            if "--help" in action.option_strings:
                continue
            out.append(f"| {_flags(action)} | {_default(action)} | {_cell(action.help or '')} |")
        out.append("")
    out += ["## The option table", "",
            "Each option below is declared once, with one default, in `ddp_conformance/options.py`; "
            "every subcommand that takes it takes it with that default. On the command line "
            "`--ddp-NAME` is accepted as well as `--NAME`. Under pytest the plugin registers "
            "`--ddp-NAME` always and the short `--NAME` only where nothing else (a `conftest.py`, "
            "another plugin) has taken it.", "",
            "| option | `run` | " + " | ".join(f"`{c}`" for c in COMMANDS) + " | pytest |",
            "|---|---|" + "---|" * len(COMMANDS) + "---|"]
    for option in OPTIONS:
        takes = ["yes" if any(u.name == option.name for u in uses) else ""
                 for uses in COMMANDS.values()]
        run = "yes" if CLI in option.routes else ""
        pytest_ = f"`{option.namespaced}`" if PYTEST in option.routes else ""
        out.append(f"| `{option.long}` | {run} | " + " | ".join(takes) + f" | {pytest_} |")
    out.append("")
    return "\n".join(out)


# ----------------------------------------------------------------------------- the checks

def check_ids() -> list[str]:
    from ddp_conformance.judge.checks import declared_ids

    return declared_ids()


def checks_page() -> str:
    from ddp_conformance.judge.checks import registered

    out = ["Every check the judge runs, in the order it runs them (the order of a case's "
           "failures follows the cause-before-effect order of "
           "`ddp_conformance/judge/cause_order.py`). A check unit may report several check ids; "
           "each unit's text is its docstring, its contract.", ""]
    for unit in registered():
        out += [f"## `{unit.name}`", "", "Reports: " + ", ".join(f"`{i}`" for i in unit.ids)
                + f". Applies: {_cell(unit.applies.__doc__ or unit.applies.__name__)}", "",
                _docstring(unit.body), ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- the catalog

def scenarios() -> list[Any]:
    from ddp_conformance.catalog.loader import load_catalog

    return list(load_catalog())


def scenarios_page() -> str:
    catalog = scenarios()
    by_concern: dict[str, list[Any]] = defaultdict(list)
    for s in catalog:
        by_concern[s.id.split("/")[0]].append(s)
    out = [f"The catalog holds {len(catalog)} scenarios in {len(by_concern)} concerns. "
           "`ddp-conformance list` prints the same (`-k` selects). *Needs* are the "
           "capabilities a candidate must have, or the scenario is N/A for it.", ""]
    for concern in sorted(by_concern):
        out += [f"## {concern}", ""]
        for s in by_concern[concern]:
            facts = []
            needs = sorted(s.needs)
            if needs:
                facts.append("needs " + ", ".join(f"`{n}`" for n in needs))
            if s.world_sizes:
                facts.append("world sizes " + ", ".join(map(str, s.world_sizes)))
            elif s.min_world_size > 1:
                facts.append(f"{s.min_world_size}+ ranks")
            if s.slow:
                facts.append("slow (`--slow`)")
            out += [f"`{s.id}`", f": {_cell(s.description)}", "",
                    f"  **Rule.** {_cell(s.rule)}" + (f" *({'; '.join(facts)})*" if facts else ""),
                    ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- exit codes

def exit_codes_page() -> str:
    errors = importlib.import_module("ddp_conformance.errors")
    source = inspect.getsource(errors)
    found = {text_name[1]: text_name[0] for text_name in re.findall(r"#: (.*)\n(EXIT_\w+) =", source)}
    meaning = {"EXIT_OK": "nothing failed unexpectedly",
               "EXIT_FAILED": "a case failed unexpectedly (FAIL, ERROR, TIMEOUT, CRASH, an "
                              "XPASS whose expectation is stale), or the backend's sanity check failed",
               "EXIT_USAGE": "usage or environment error, said in one line on stderr before any "
                             "rank starts"}
    out = ["| code | constant | when |", "|---|---|---|"]
    for name, value in vars(errors).items():
        if name.startswith("EXIT_"):
            out.append(f"| {value} | `{name}` | {_cell(found.get(name) or meaning.get(name, ''))} |")
    out += ["", "A usage or environment error (an unknown candidate, an unavailable backend, an "
            "impossible world size, a report directory that cannot be written) is one line on "
            "stderr, `ddp-conformance: error: ...`, before any rank starts. An interrupted run "
            "(SIGTERM, SIGINT) ends every rank, writes the reports of the cases finished so far "
            "marked incomplete, and exits within 30 s of the signal.", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- results.jsonl

def _field_comments(cls: type) -> list[tuple[str, str, str]]:
    """(field, annotation, its ``#:`` comment) of a dataclass, in declaration order."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    rows = []
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            comment: list[str] = []
            i = node.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#:"):
                comment.insert(0, lines[i].strip()[2:].strip())
                i -= 1
            rows.append((node.target.id, ast.unparse(node.annotation), " ".join(comment)))
    return rows


#: What a result field means, where its declaration carries no ``#:`` comment.
RESULT_FIELDS = {
    "scenario": "the scenario id", "candidate": "the candidate's SPEC",
    "verdict": "PASS, FAIL, ERROR, TIMEOUT, CRASH, N/A, XFAIL or XPASS",
    "world_size": "ranks", "backend": "the process-group backend", "device": "cpu or cuda",
    "duration_s": "the case's wall time", "reason": "why, in one line (N/A, ERROR, TIMEOUT, CRASH)",
    "failures": "each failed check: check id, step, rank, parameter, message",
    "figures": "per step, rank and parameter: max abs, max rel and max ULP error, and the "
               "tolerance, against the oracle and the reference",
    "tracebacks": "each raising rank's traceback", "stacks": "each stuck rank's Python stack",
    "exit_codes": "each dead rank's exit code or signal",
    "expectation": "the expectations-file entry that matched (XFAIL, XPASS)",
    "checks_run": "the check ids applied",
}


def result_fields() -> list[str]:
    from ddp_conformance.judge.verdict import Result

    return [name for name, _, _ in _field_comments(Result)]


def _run_keys() -> list[str]:
    from ddp_conformance.report import stream

    tree = ast.parse(textwrap.dedent(inspect.getsource(stream.run_info)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "type"
                                              for k in node.keys):
            return [str(k.value) for k in node.keys if isinstance(k, ast.Constant)]
    return []


def _diagnosis_codes() -> list[tuple[str, str]]:
    """The cause codes of the diagnosis, where this version of the package has them."""
    try:
        causes = importlib.import_module("ddp_conformance.judge.diagnose.causes")
    except ImportError:
        return []
    cause = getattr(causes, "Cause", None)
    return [(str(c), getattr(c, "doc", "") or "") for c in cause] if cause else []


def _compact_record() -> list[str]:
    """What a passing case's record carries instead of ``figures`` (report/compact.py)."""
    from ddp_conformance.report import compact

    return [f"A case that passed carries `{compact.WORST_KEY}` in place of `figures`: per "
            "check and tensor, the worst figure over steps and ranks, as "
            "`{\"tensors\": [name, ...], \"checks\": {check: [tolerance, rows]}}`; a row is "
            "`[tensor index, max abs, max rel, max ULP]` with "
            f"{compact.DIGITS} significant digits, a fifth element where the tensor's "
            "tolerance is not the check's, or the tensor index alone where all three are 0. "
            "Every other verdict keeps every figure (per step, rank and tensor).", ""]


def results_page() -> str:
    from ddp_conformance.judge.verdict import Result

    out = ["## The `run` record", "", "The first line. Its keys: "
           + ", ".join(f"`{k}`" for k in _run_keys()) + ".", "",
           "## The `result` records", "",
           "One line per case, `{\"type\": \"result\", ...}` with the fields of "
           "`ddp_conformance.judge.verdict.Result`:", "",
           "| field | type | meaning |", "|---|---|---|"]
    out += [f"| `{name}` | `{_cell(ann)}` | {_cell(doc or RESULT_FIELDS.get(name, ''))} |"
            for name, ann, doc in _field_comments(Result)]
    out += ["", *_compact_record()]
    out += ["", "## The `diagnosis` records", "",
            "One line per candidate, before the end line: "
            "`{\"type\": \"diagnosis\", \"candidate\": SPEC, \"unexpected\": N, "
            "\"findings\": [{\"code\", \"summary\", \"cases\", \"first_case\", \"repro\", "
            "\"case_ids\", \"families\", \"not_in\", \"checks\", \"note\"}, ...]}`, most "
            "explanatory first; no unexpected verdict, no finding. `code` is a stable cause code "
            "(a public contract: match on it in scripts), `summary` one line in the user's "
            "words, `cases` how many unexpected verdicts it explains (`case_ids`: which), "
            "`first_case` the smallest of them to look at first and `repro` the command that "
            "writes its reproducer (diagnosis.md).", ""]
    codes = _diagnosis_codes()
    if codes:
        out += ["| code | what it means |", "|---|---|"]
        out += [f"| `{code}` | {_cell(doc)} |" for code, doc in codes]
        out.append("")
    out += ["## The `end` record", "",
            "The last line: `counts` (cases per verdict), `notes` (the run's notes), and "
            "`incomplete` (why, when the run was interrupted or stopped by `--maxfail`). A file "
            "without its end line is read back as an incomplete run.", ""]
    return "\n".join(out)


PAGES: dict[str, Callable[[], str]] = {
    "cli": cli_page,
    "checks": checks_page,
    "scenarios": scenarios_page,
    "exit-codes": exit_codes_page,
    "results": results_page,
}
