"""The documentation's reference is read from the code: nothing the code declares is missing.

``docs/_ext/generate.py`` builds the reference pages (command line, checks, scenarios, exit
codes, ``results.jsonl``) from the package when the site is built. These tests hold each
page to what the code declares: every option of every subcommand and of the option table,
every check id of the judge's registry, every catalog scenario with its rule, every exit
code, every field of a result record. Without the docs tooling (Sphinx, MyST, Furo: the
``docs`` extra) the pages are checked as generated text; with it the site is built with
warnings as errors and the checks run on the built HTML too. No rank starts.
"""
from __future__ import annotations

import html
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from ddp_conformance.errors import EXIT_FAILED, EXIT_OK, EXIT_SIGTERM, EXIT_USAGE
from ddp_conformance.judge.checks import declared_ids
from ddp_conformance.options import OPTIONS, PYTEST
from tests.deadlines import deadline

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _generate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ddp_docs_generate", DOCS / "_ext" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATE = _generate()


def _text(markdown_or_html: str) -> str:
    """What a reader sees: tags dropped, entities and escapes undone, whitespace collapsed."""
    text = html.unescape(re.sub(r"<[^>]+>", " ", markdown_or_html)).replace("\\|", "|")
    return " ".join(text.split())


def missing(page: str, expected: list[str]) -> list[str]:
    """The expected strings (whitespace collapsed) that ``page`` does not contain."""
    seen = _text(page)
    return [item for item in expected if " ".join(item.split()) not in seen]


def expected_options() -> dict[str, list[str]]:
    """What the CLI page must name: every subcommand's options, every row of the table (and
    its pytest spelling)."""
    options = GENERATE.cli_options()
    table = [o.long for o in OPTIONS] + [o.namespaced for o in OPTIONS if PYTEST in o.routes]
    return {"subcommands": [f"ddp-conformance {name}" for name in options],
            "options": sorted({f for flags in options.values() for f in flags} | set(table))}


def expected_scenarios() -> list[str]:
    return [item for s in GENERATE.scenarios() for item in (s.id, s.rule)]


def expected_results() -> list[str]:
    return [f"`{name}`" for name in GENERATE.result_fields()]


def test_missing_finds_what_a_page_lacks() -> None:
    page = "| `--candidate` `SPEC` | | ... |\n`gradients/mlp-sgd`\n: the rule,\n  wrapped."
    assert missing(page, ["--candidate", "the rule, wrapped.", "--backend"]) == ["--backend"]


def test_every_cli_option_is_in_the_generated_reference() -> None:
    page, expected = GENERATE.cli_page(), expected_options()
    assert len(expected["options"]) >= len(OPTIONS) + 6  # fuzz, repro, bench, report add theirs
    assert not missing(page, expected["subcommands"] + expected["options"])
    for command, flags in GENERATE.cli_options().items():
        section = page.split(f"## `ddp-conformance {command}`", 1)[1].split("\n## ", 1)[0]
        assert not missing(section, flags), command


def test_every_check_id_is_in_the_generated_reference() -> None:
    page = GENERATE.checks_page()
    assert len(declared_ids()) >= 15
    assert not missing(page, [f"`{i}`" for i in declared_ids()])
    reported = re.findall(r"`([a-z_.]+)`", "".join(re.findall(r"^Reports: (.*?)\. Applies", page, re.M)))
    assert sorted(reported) == sorted(declared_ids())


def test_every_scenario_and_its_rule_is_in_the_generated_reference() -> None:
    page, expected = GENERATE.scenarios_page(), expected_scenarios()
    assert len(expected) >= 2 * 150
    assert not missing(page, expected)


def test_exit_codes_and_result_fields_are_in_the_generated_reference() -> None:
    codes = GENERATE.exit_codes_page()
    assert not missing(codes, [f"| {c} |" for c in (EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SIGTERM)])
    results = GENERATE.results_page()
    assert not missing(results, expected_results() + ['"type": "diagnosis"'])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as .ci/run builds it (warnings are errors); skipped without the tooling."""
    for module in ("sphinx", "myst_parser", "furo"):
        pytest.importorskip(module, reason="the docs extra is not installed")
    from sphinx.cmd.build import build_main

    out = tmp_path_factory.mktemp("docs-html")
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        status = build_main(["-W", "--keep-going", "-E", "-q", "-b", "html", str(DOCS), str(out)])
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    assert status == 0, "the documentation build warned (see above)"
    return out


@pytest.mark.filterwarnings("ignore:.*Check CHANGES for Sphinx API modifications")
def test_the_built_reference_names_every_option_check_and_scenario(built: Path) -> None:
    page = {name: (built / "reference" / f"{name}.html").read_text()
            for name in ("cli", "checks", "scenarios", "results")}
    expected = expected_options()
    assert not missing(page["cli"], expected["subcommands"] + expected["options"])
    assert not missing(page["checks"], declared_ids())
    assert not missing(page["scenarios"], expected_scenarios())
    assert not missing(page["results"], [f.strip("`") for f in expected_results()])


def test_the_tutorial_shows_the_example_file_it_ships() -> None:
    """The tutorial's DDP is docs/examples/my_ddp.py, which a reader may copy instead."""
    page = (DOCS / "tutorial" / "first-ddp.md").read_text()
    shown = next(block for block in re.findall(r"```python\n(.*?)```", page, re.S)
                 if "class MyDDP" in block)
    assert shown.strip() in (DOCS / "examples" / "my_ddp.py").read_text()


#: Opt-in (it starts ranks, about 20-40 s): ``DDP_TEST_TUTORIAL=1`` runs the tutorial's steps.
TUTORIAL = "DDP_TEST_TUTORIAL"
#: The tutorial's fix: divide, then sum.
FIX = ("        dist.all_reduce(p.grad, group=self.process_group)  # sums over the ranks",
       "        p.grad.div_(self.world_size)  # DDP divides first, then sums: the mean\n"
       "        dist.all_reduce(p.grad, group=self.process_group)")


def _run_gradients(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddp_conformance", "run", "--candidate",
                           "my_ddp:MyDDP", "-k", "gradients"], cwd=directory, text=True,
                          capture_output=True, timeout=deadline(120))


@pytest.mark.skipif(not os.environ.get(TUTORIAL), reason=f"{TUTORIAL}=1 runs the tutorial")
def test_the_tutorial_finds_the_planted_bug_and_its_fix_passes(tmp_path: Path) -> None:
    shutil.copy(DOCS / "examples" / "my_ddp.py", tmp_path / "my_ddp.py")
    planted = _run_gradients(tmp_path)
    assert planted.returncode == 1, planted.stderr
    assert "5 FAIL, 1 N/A" in planted.stdout and "oracle.grad: step 0" in planted.stdout
    source = (tmp_path / "my_ddp.py").read_text()
    assert FIX[0] in source
    (tmp_path / "my_ddp.py").write_text(source.replace(FIX[0], FIX[1]))
    fixed = _run_gradients(tmp_path)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "1 N/A, 5 PASS" in fixed.stdout
