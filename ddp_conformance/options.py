"""The one option table: every option of a conformance run, for the command line and pytest.

Each :class:`Option` is declared once; :func:`add_to_argparse` builds ``ddp-conformance
run``'s options from it and :func:`add_to_pytest` the pytest plugin's, and
:func:`run_config` turns either route's values into the same
:class:`~ddp_conformance.config.RunConfig`, with the same checks and the same one-line
errors (pytest-timeout keeps all its options in one table the same way).

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

    @property
    def dest(self) -> str:
        return "ddp_" + self.name.replace("-", "_")

    @property
    def long(self) -> str:
        return f"--{self.name}"

    @property
    def namespaced(self) -> str:
        return f"--ddp-{self.name}"

    def argparse_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"dest": self.dest, "help": self.help, "default": self.default}
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
    Option("no-spare", "after a fault, start the replacement ranks when needed instead of "
           "keeping warm spares", action="store_true", default=False, config_field="spare",
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
    Option("report-dir", "where results.jsonl, summary.md, junit.xml and report.html go "
           "(default reports/)", default="reports", metavar="DIR", routes=frozenset({CLI})),
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


def options_for(route: str) -> list[Option]:
    return [o for o in OPTIONS if route in o.routes]


def add_to_argparse(parser: argparse.ArgumentParser) -> None:
    """``ddp-conformance run``'s options: ``--NAME`` and ``--ddp-NAME`` for every option."""
    for option in options_for(CLI):
        parser.add_argument(*option.cli_flags, option.long, option.namespaced,
                            **option.argparse_kwargs())


def add_to_pytest(group: Any) -> None:
    """The namespaced ``--ddp-NAME`` options, always (see the module docstring)."""
    for option in options_for(PYTEST):
        group.addoption(option.namespaced, **option.argparse_kwargs())


def add_short_forms_to_pytest(group: Any, taken: Iterable[str]) -> list[str]:
    """``--NAME`` for every option whose name nothing else has taken; return those added."""
    taken = set(taken)
    added = []
    for option in options_for(PYTEST):
        if option.long not in taken:
            kwargs = option.argparse_kwargs()
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
