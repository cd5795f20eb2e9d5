"""Run by ``tests/test_cli.py`` in a fresh interpreter: the command line answers ``--help``
and usage errors without importing torch (or hypothesis).

Prints one JSON object: the exit code of each command line tried, and which of the heavy
modules were imported by the end.
"""
from __future__ import annotations

import contextlib
import io
import json
import sys

from ddp_conformance.cli import main
from ddp_conformance.options import COMMANDS

#: Command lines that must end before any command runs, with their exit codes.
USAGE_ERRORS: list[list[str]] = [
    ["run", "--world-size", "0"], ["run", "--timeout", "nan"], ["run", "--no-such-option"],
    ["fuzz"], ["fuzz", "--candidate", "mydp:MyDDP", "--candidate", "torch"],
    ["fuzz", "--candidate", "torch", "--timeout", "0"],
    ["repro", "gradients/mlp-sgd", "--candidate", "a:A", "--candidate", "b:B"],
    ["bench", "--world-size", "0"], ["report", "old", "--report-dir", "new"],
    ["report", "--report-dir", ""],
]


def exit_code(argv: list[str]) -> int:
    """``ddp-conformance ARGV``'s exit code, its output swallowed."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return main(argv)
        except SystemExit as exc:
            return int(exc.code or 0)


if __name__ == "__main__":
    lines = [["--help"], *([command, "--help"] for command in ["run", *COMMANDS]), *USAGE_ERRORS]
    codes = {" ".join(argv): exit_code(argv) for argv in lines}
    heavy = sorted(m for m in ("torch", "hypothesis", "numpy") if m in sys.modules)
    print(json.dumps({"codes": codes, "imported": heavy}))
