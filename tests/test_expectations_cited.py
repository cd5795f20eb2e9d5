"""Every expectation of a built-in candidate gives its reason, and every FINDING (a defect
of someone else's code) is shown by a standalone script (tests/standalone/, or
tests/backends/ for a backend's defect).

A reason is a few words, or ``as <scenario>``: the reason of the entry covering that
scenario in the same file. A FINDING line names its script (``name.py``), or points at a
line of the same file that does: ``as <scenario>`` or ``above`` (a comment or entry
earlier in the file). A path into someone else's package (``torchft/ddp.py``) is a
citation of their source, not a script.
"""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXPECTATIONS = sorted((ROOT / "ddp_conformance" / "builtins" / "expectations").glob("*.txt"))
SCRIPT_DIRS = (ROOT / "tests" / "standalone", ROOT / "tests" / "backends")
SCRIPT = re.compile(r"(?<![\w/.])(?:tests/\w+/)?(\w+\.py)\b")
AS = re.compile(r"\bas ([a-z0-9-]+/[A-Za-z0-9_*+\-]+)")


def entries(path: Path) -> list[tuple[int, str, str]]:
    """(line number, pattern, reason) of each entry; comment lines have pattern ''."""
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        pattern, _, reason = line.partition("#")
        out.append((number, pattern.strip(), reason.strip()))
    return out


def scripts(text: str) -> list[str]:
    return SCRIPT.findall(text)


def covering(rows: list[tuple[int, str, str]], scenario: str, number: int) -> list[int]:
    """The line numbers of the entries, other than line ``number``, whose pattern covers
    ``scenario`` (a scenario id or pattern)."""
    return [n for n, pattern, _ in rows if pattern and n != number
            and (fnmatch.fnmatchcase(scenario, pattern.split("[")[0])
                 or pattern.split("[")[0] == scenario)]


@pytest.mark.parametrize("path", EXPECTATIONS, ids=lambda p: p.stem)
def test_every_expectation_gives_its_reason(path: Path) -> None:
    rows = entries(path)
    bare = [(n, p) for n, p, reason in rows if p and len(reason.split()) < 3
            and not any(covering(rows, scenario, n) for scenario in AS.findall(reason))]
    assert bare == [], f"{path.name}: entries without a reason (a few words after '#')"


@pytest.mark.parametrize("path", EXPECTATIONS, ids=lambda p: p.stem)
def test_every_finding_is_shown_by_a_standalone_script(path: Path) -> None:
    rows = entries(path)
    missing = sorted({s for _, _, reason in rows for s in scripts(reason)
                      if not any((d / s).is_file() for d in SCRIPT_DIRS)})
    assert missing == [], f"{path.name} names scripts not in {SCRIPT_DIRS}: {missing}"
    reasons = {n: reason for n, _, reason in rows}

    def cited(number: int, reason: str, seen: frozenset[int]) -> bool:
        if scripts(reason):
            return True
        if "above" in reason and any(scripts(r) for n, _, r in rows if n < number):
            return True
        return any(cited(n, reasons[n], seen | {number})
                   for scenario in AS.findall(reason)
                   for n in covering(rows, scenario, number) if n not in seen)

    unshown = [f"{path.name}:{n}: {p}" for n, p, reason in rows
               if p and "FINDING" in reason and not cited(n, reason, frozenset())]
    assert unshown == [], "FINDINGs without a standalone script:\n" + "\n".join(unshown)


def test_the_check_sees_a_finding_without_a_script(tmp_path: Path) -> None:
    """Meta: the rule above fails a FINDING that names no script and points nowhere."""
    bad = tmp_path / "bad.txt"
    bad.write_text("a/b[x]  # FINDING: a defect, said without a script\n"
                   "a/c[x]  # FINDING (as a/b): the same defect\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="a/b"):
        test_every_finding_is_shown_by_a_standalone_script(bad)
    good = tmp_path / "good.txt"
    good.write_text("a/b[x]  # FINDING: a defect (fsdp1_channels_last_grad.py)\n"
                    "a/c[x]  # FINDING (as a/b): the same defect\n", encoding="utf-8")
    test_every_finding_is_shown_by_a_standalone_script(good)
