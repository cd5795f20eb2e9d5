"""``--ddp-coverage`` under pytest: registered by the plugin only when the option is given.

Every pytest process that runs conformance items measures itself and its ranks (its
:class:`~ddp_conformance.session.Session` does, see ``pytest_items``), and saves when its
items are done. The process that is not a pytest-xdist worker (the controller, or the only
process) clears the data directory before anyone measures and, at the terminal summary,
once every worker has finished, combines everyone's data into ``reports/coverage/``
(``summary.json``, coverage.py's ``coverage.json``) and prints the table.
"""
from __future__ import annotations

import os
from typing import Any

import pytest

#: Where the pytest route writes coverage (the command line's default report directory).
REPORT_DIR = "reports"


def report_dir(config: pytest.Config) -> str:
    return os.path.join(str(config.invocation_params.dir), REPORT_DIR)


class CoverageHooks:
    """The controller's share: clear before, combine and print after."""

    def __init__(self, config: pytest.Config) -> None:
        from ddp_conformance.ranks.coverage_hook import clear_data, setup_for

        try:
            self.setup = setup_for(list(config.getoption("ddp_coverage")), report_dir(config))
        except Exception as exc:  # UsageError: one line, pytest's usage error
            raise pytest.UsageError(f"ddp-conformance: {exc}") from None
        self.directory = report_dir(config)
        clear_data(self.setup)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from tabulate import tabulate

        from ddp_conformance.report.coverage import HEADER, combine_and_summarise, intro, rows

        data_dir = os.path.dirname(self.setup.data_file)
        if not os.path.isdir(data_dir) or not any(
                n.startswith(".coverage.") for n in os.listdir(data_dir)):
            return  # no conformance item ran: nothing was measured
        summary = combine_and_summarise(self.setup, self.directory)
        terminalreporter.write_sep("-", "ddp-conformance coverage")
        terminalreporter.write_line(intro(summary))
        terminalreporter.write_line(tabulate([r[:6] for r in rows(summary)], HEADER[:6],
                                             tablefmt="simple", disable_numparse=True))
        never = sum(len(r["never_entered"]) for r in summary["files"])
        terminalreporter.write_line(
            f"{never} functions never entered, listed per file in "
            f"{os.path.join(self.directory, 'coverage', 'summary.json')}")


def configure(config: pytest.Config) -> None:
    """From the plugin's ``pytest_configure``: only with ``--ddp-coverage``, and only in
    the process that is not an xdist worker."""
    if not config.getoption("ddp_coverage", None) or hasattr(config, "workerinput"):
        return
    config.pluginmanager.register(CoverageHooks(config), "ddp_conformance_coverage")
