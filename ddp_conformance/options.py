"""The one option table: every option of every command, for the command line and pytest.

Each :class:`Option` is declared once, with one default; :func:`add_to_argparse` builds a
subcommand's options from it (``run`` takes every row of the command-line route, the other
subcommands the rows :data:`COMMANDS` names) and :func:`add_to_pytest` the pytest plugin's,
and :func:`run_config` turns either route's values into the same
:class:`~ddp_conformance.config.RunConfig`, with the same checks and the same one-line
errors (pytest-timeout keeps all its options in one table the same way). A subcommand may
word an option's help for itself, or widen what it accepts (``fuzz --world-size 1-4``),
never give it another default (:class:`Use`).

Names: on the command line an option is ``--NAME`` (``--ddp-NAME`` is accepted too). Under
pytest the plugin must never break another project's run, so it always registers the
namespaced ``--ddp-NAME`` and adds the short ``--NAME`` only where nothing else (a
``conftest.py``, another plugin) has taken it: ``--device`` in a project whose conftest
defines ``--device`` stays that project's, and ``--ddp-device`` is this plugin's. Every
value lands in the destination ``ddp_NAME`` (``ddp_world_size``), never in a name another
plugin may read.

This module imports nothing heavy (no torch): the pytest plugin loads it in every pytest
run of the environment.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ddp_conformance.config import RunConfig
from ddp_conformance.errors import UsageError

CLI = "cli"
PYTEST = "pytest"


def positive(name: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value is not None and not value > 0:  # NaN too
            raise UsageError(f"--{name} must be positive, got {value:g}")

    return check


def not_negative(name: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value is not None and value < 0:
            raise UsageError(f"--{name} must be 0 or more, got {value}")

    return check


def a_path(name: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value is not None and not str(value).strip():
            raise UsageError(f"--{name} must name a directory, got {value!r}")

    return check


def at_least_one(name: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value is not None and value < 1:
            raise UsageError(f"--{name} must be at least 1, got {value}")

    return check


@dataclass(frozen=True)
class Option:
    """One option of a conformance run.

    ``config_field``: the :class:`RunConfig` field it sets (None: read by the route itself, e.g.
    ``--repeat``); ``to_config`` converts the parsed value (``--no-trace`` sets
    ``trace=False``); ``routes``: where the option exists.
    """

    name: str
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    action: str | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    config_field: str | None = None
    to_config: Callable[[Any], Any] | None = None
    check: Callable[[Any], None] | None = None
    routes: frozenset[str] = frozenset({CLI, PYTEST})
    #: Extra command-line-only spellings (``-k``).
    cli_flags: tuple[str, ...] = ()
    #: Under pytest the option is off (None) unless given: pytest writes no report
    #: directory of its own accord (``--ddp-report-dir``).
    opt_in_under_pytest: bool = False

    @property
    def dest(self) -> str:
        return "ddp_" + self.name.replace("-", "_")

    @property
    def long(self) -> str:
        return f"--{self.name}"

    @property
    def namespaced(self) -> str:
        return f"--ddp-{self.name}"

    def default_for(self, route: str) -> Any:
        """The default on ``route``: the row's, or None under pytest for an opt-in row."""
        return None if route == PYTEST and self.opt_in_under_pytest else self.default

    def argparse_kwargs(self, route: str = CLI) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"dest": self.dest, "help": self.help,
                                  "default": self.default_for(route)}
        for key in ("type", "action", "choices", "metavar"):
            value = getattr(self, key)
            if value is not None:
                kwargs[key] = value
        return kwargs


OPTIONS: tuple[Option, ...] = (
    Option("candidate", "candidate DDP: a built-in (torch, reference, the ecosystem adapters) or "
           "package.module:attr; repeatable (default: torch)", action="append", metavar="SPEC",
           config_field="candidates", to_config=lambda v: list(v) if v else ["torch"]),
    Option("backend", "process-group backend: gloo (default), nccl, or MODULE:NAME, a backend "
           "that importing MODULE registers as NAME (torch.distributed.Backend."
           "register_backend)", default="gloo", metavar="NAME", config_field="backend"),
    Option("device", "tensor device: cpu (default) or cuda (nccl, and a backend registered "
           "for cuda only, imply cuda)", default="cpu", metavar="DEV", config_field="device"),
    Option("collectives", "the backend's own collective checks before the DDP catalog: auto "
           "(default: for a MODULE:NAME backend), on, off, or only (no DDP scenario)",
           default="auto", choices=("auto", "on", "off", "only"), config_field="collectives"),
    Option("compare-backend", "run every scenario on this backend too and report both side by "
           "side: auto (default: gloo for a MODULE:NAME backend), none, or a backend",
           default="auto", metavar="NAME", config_field="compare_backend"),
    Option("world-size", "ranks per scenario (default 2)", default=2, type=int, metavar="N",
           config_field="world_size", check=at_least_one("world-size")),
    Option("timeout", "deadline of one case in seconds (default 60)", default=60.0, type=float,
           metavar="S", config_field="timeout_s", check=positive("timeout")),
    Option("pool", "reuse rank processes (persistent, default) or start new ones per case "
           "(fresh)", default="persistent", choices=("persistent", "fresh"), config_field="pool"),
    Option("no-spare", "without a zygote (off Linux, --pool fresh, --coverage), start "
           "replacement ranks when needed instead of keeping warm spares (ranks forked from "
           "the zygote need none)", action="store_true", default=False, config_field="spare",
           to_config=lambda v: not v),
    Option("allow-oversubscribe", "run a world size that does not fit this machine (more ranks "
           "than 8 per core, or than its memory holds) instead of refusing it",
           action="store_true", default=False, config_field="allow_oversubscribe"),
    Option("expectations", "known deviations of the candidate: scenario-id patterns with "
           "reasons", metavar="FILE", config_field="expectations"),
    Option("strict-profile", "hold every candidate to torch's bucket layout and wire dtype "
           "(trace.buckets, trace.dtype)", action="store_true", default=False,
           config_field="strict_profile"),
    Option("no-trace", "plain process groups: no collective trace, no trace checks",
           action="store_true", default=False, config_field="trace", to_config=lambda v: not v),
    Option("coverage", "measure what the run executes of TARGET (a module, package or path) in "
           "the parent and every rank, with coverage.py; repeatable; a section in summary.md "
           "and report.html", action="append", metavar="TARGET", config_field="coverage",
           to_config=lambda v: list(v) if v else []),
    Option("slow", "also run the scenarios marked slow (seconds each; N/A otherwise)",
           action="store_true", default=False, config_field="slow"),
    Option("strict-messages", "a refusal (an expected error, or one at a limit of torch's) "
           "must carry torch's message text; without it any clear error on every rank passes",
           action="store_true", default=False, config_field="strict_messages"),
    Option("keyword", "only cases whose id matches, as pytest -k reads it", metavar="EXPR",
           routes=frozenset({CLI}), cli_flags=("-k",)),
    Option("pairs", "instead of the scenarios, the pair coverage: how many valid pairs of "
           "dimension values (options, procedures, comm hooks, models) the scenarios cover, "
           "and which they do not", action="store_true", default=False, routes=frozenset({CLI})),
    Option("report-dir", "where results.jsonl, summary.md, junit.xml and report.html go "
           "(default reports/; under pytest none is written unless given)", default="reports",
           metavar="DIR", check=a_path("report-dir"), opt_in_under_pytest=True),
    Option("repeat", "run everything N times; report flaky cases and rank memory growth",
           default=1, type=int, metavar="N", routes=frozenset({CLI}), check=at_least_one("repeat")),
    Option("maxfail", "stop after N unexpected verdicts (FAIL, ERROR, TIMEOUT, CRASH), the "
           "reports written for the cases run", type=int, metavar="N", routes=frozenset({CLI}),
           check=at_least_one("maxfail")),
    Option("exitfirst", "stop at the first unexpected verdict (--maxfail 1)", action="store_true",
           default=False, routes=frozenset({CLI}), cli_flags=("-x",)),
    Option("durations", "list the N slowest cases and where their time went in summary.md "
           "(default 10; 0: every case)", default=10, type=int, metavar="N",
           config_field="durations", routes=frozenset({CLI}), check=not_negative("durations")),
)


@dataclass(frozen=True)
class Use:
    """A subcommand's use of a row of :data:`OPTIONS`: the row's default always; its own
    ``help`` where the row's wording would be wrong for it; its own ``type`` where it
    accepts more (then it checks the value itself, and the row's ``check`` is skipped)."""

    name: str
    help: str | None = None
    type: Callable[[str], Any] | None = None


#: The rows each subcommand other than ``run`` takes (``run`` takes every row of the
#: command-line route). ``list`` reads and writes no file, so it has no ``--report-dir``.
COMMANDS: dict[str, tuple[Use, ...]] = {
    "fuzz": (
        Use("candidate", "the candidate DDP to fuzz, as for run; exactly one (fuzz each "
                         "candidate with its own command): only what it supports is drawn, "
                         "and torch's DDP runs each scenario it fails"),
        Use("backend"), Use("device"),
        Use("world-size", "ranks (default 2), or world sizes drawn in turn: 1-4, 1,3",
            type=str),
        Use("timeout"), Use("allow-oversubscribe"),
        Use("report-dir", "each finding's standalone reproducer goes to DIR/repro, the "
                          "scenarios set aside to DIR/fuzz-set-aside.txt, hypothesis's files "
                          "to DIR/.hypothesis (default reports/)"),
    ),
    "repro": (
        Use("candidate", "module:attr, a callable with DDP's constructor (or torch); exactly "
                         "one"),
        Use("world-size"),
        Use("report-dir", "the script goes to DIR/repro unless --out says otherwise "
                          "(default reports/)"),
    ),
    "bench": (
        Use("candidate", "as for run; repeatable (default: torch and reference; torch is "
                         "always timed as the baseline)"),
        Use("world-size"), Use("backend"),
        Use("device", "cpu (default) or cuda (nccl implies cuda); on CUDA the phases are "
                      "timed with CUDA events (one device synchronisation per step) and the "
                      "overlap is measured on the GPU timeline too (profiler kernels)"),
        Use("report-dir", "bench.json goes here, merged with what is there; the report set is "
                          "re-rendered with it (default reports/)"),
    ),
    "list": (Use("keyword", "only scenarios whose id matches, as pytest -k reads it"),
             Use("pairs")),
    "report": (Use("report-dir", "the run whose report set to re-render, as RESULTS_DIR "
                                 "(default reports/)"),),
}


def options_for(route: str) -> list[Option]:
    return [o for o in OPTIONS if route in o.routes]


def default_of(name: str) -> Any:
    """The one default of the row ``name``."""
    return next(o.default for o in OPTIONS if o.name == name)


def uses_of(command: str) -> list[tuple[Option, Use]]:
    """The rows ``command`` takes, each with how it takes it."""
    if command == "run":
        return [(o, Use(o.name)) for o in options_for(CLI)]
    rows = {o.name: o for o in OPTIONS}
    return [(rows[use.name], use) for use in COMMANDS[command]]


def add_to_argparse(parser: argparse.ArgumentParser, command: str = "run") -> None:
    """``ddp-conformance COMMAND``'s options: ``--NAME`` and ``--ddp-NAME`` for every row
    it takes (:func:`uses_of`), into ``ddp_NAME``."""
    for option, use in uses_of(command):
        kwargs = option.argparse_kwargs()
        kwargs.update({k: v for k, v in (("help", use.help), ("type", use.type)) if v})
        parser.add_argument(*option.cli_flags, option.long, option.namespaced, **kwargs)


def check_options(get: Callable[[str], Any], command: str) -> None:
    """Run the checks of the rows ``command`` takes on its parsed values (``get(dest)``):
    a value out of range is a :class:`UsageError`, before anything runs."""
    for option, use in uses_of(command):
        if option.check is not None and use.type is None:
            option.check(get(option.dest))


def one_candidate(specs: list[str] | None, command: str) -> str:
    """The one ``--candidate`` of ``fuzz`` or ``repro``: none, or several, is a
    :class:`UsageError` naming them (never one fuzzed and the others dropped)."""
    if not specs:
        raise UsageError(f"{command} needs --candidate SPEC (one candidate)")
    if len(specs) > 1:
        raise UsageError(f"{command} takes one --candidate, got {len(specs)} "
                         f"({', '.join(specs)}); run {command} once per candidate")
    return specs[0]


def add_to_pytest(group: Any) -> None:
    """The namespaced ``--ddp-NAME`` options, always (see the module docstring)."""
    for option in options_for(PYTEST):
        group.addoption(option.namespaced, **option.argparse_kwargs(PYTEST))


def named(get: Callable[[str], Any], route: str) -> list[str]:
    """The options of ``route`` given a value other than their default (``get(dest)``)."""
    return [o.long for o in options_for(route) if get(o.dest) != o.default_for(route)]


def add_short_forms_to_pytest(group: Any, taken: Iterable[str]) -> list[str]:
    """``--NAME`` for every option whose name nothing else has taken; return those added."""
    taken = set(taken)
    added = []
    for option in options_for(PYTEST):
        if option.long not in taken:
            kwargs = option.argparse_kwargs(PYTEST)
            kwargs["help"] = f"short for {option.namespaced}"
            group.addoption(option.long, **kwargs)
            added.append(option.long)
    return added


def run_config(get: Callable[[str], Any], route: str) -> RunConfig:
    """The :class:`RunConfig` of one route's parsed values (``get(dest)``), checked."""
    values: dict[str, Any] = {}
    for option in options_for(route):
        value = get(option.dest)
        if option.check is not None:
            option.check(value)
        if option.config_field is not None:
            values[option.config_field] = option.to_config(value) if option.to_config else value
    return RunConfig(**values)
