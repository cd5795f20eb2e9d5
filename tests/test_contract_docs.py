"""The contract in the repository (issue 25): docs/CONTRACT.md is what the docstrings cite,
its adapter table is the code's binding of capabilities to adapter methods, every adapter
method says when it is called and which capability it belongs to, and the docstrings'
cross-references name objects that exist."""
from __future__ import annotations

import ast
import pkgutil
import re
from pathlib import Path

import pytest

from ddp_conformance.contract.adapter import CAPABILITY_METHODS, Adapter, unimplemented
from ddp_conformance.contract.capability import Capability
from ddp_conformance.contract.registry import builtin_candidates
from ddp_conformance.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "docs" / "CONTRACT.md"
SOURCES = sorted([*(ROOT / "ddp_conformance").rglob("*.py"), *(ROOT / "reference").rglob("*.py")])
#: ``docs/CONTRACT.md, "Section"``, the section's name possibly wrapped over two lines.
CITATION = re.compile(r'docs/CONTRACT\.md, "([^"]+)"')
#: A Sphinx role naming an object of the package: ``:class:`~ddp_conformance.x.Y```.
CROSS_REFERENCE = re.compile(r":(?:mod|class|func|meth|attr|data|exc):`~?(ddp_conformance\.[\w.]+)`")


def _headings() -> set[str]:
    return {line[3:].strip() for line in CONTRACT.read_text().splitlines()
            if line.startswith("## ")}


def test_every_citation_of_the_contract_names_one_of_its_sections() -> None:
    cited = {(path.relative_to(ROOT).as_posix(), " ".join(m.split()))
             for path in [*SOURCES, *(ROOT / "tests").rglob("*.py")]
             if path != Path(__file__).resolve()
             for m in CITATION.findall(re.sub(r"\n\s*", " ", path.read_text()))}
    assert len(cited) >= 15, cited  # the modules that state a part of the contract
    headings = _headings()
    wrong = sorted(f"{path}: {section!r}" for path, section in cited if section not in headings)
    assert not wrong, f"sections not in docs/CONTRACT.md ({sorted(headings)}):\n" + "\n".join(wrong)


def test_no_source_cites_a_spec_outside_the_repository() -> None:
    outside = [path.relative_to(ROOT).as_posix() for path in SOURCES
               if "SPEC.md" in path.read_text()]
    assert not outside, outside


def test_the_contract_s_adapter_table_is_the_code_s_binding() -> None:
    rows = re.findall(r"^\| `([a-z_]+)` \| `([a-z_]+)` \|", CONTRACT.read_text(), re.M)
    assert dict(rows) == CAPABILITY_METHODS
    assert set(CAPABILITY_METHODS) == {c.value for c in Capability}


def test_every_adapter_method_says_when_it_is_called_and_its_capability() -> None:
    methods = {name: value for name, value in vars(Adapter).items()
               if callable(value) and not name.startswith("_")}
    assert {"forward", "backward", "step", "zero_grad", "no_sync", "join"} <= set(methods)
    vague = []
    for name, method in methods.items():
        doc = " ".join((method.__doc__ or "").split())
        capability = getattr(method, "capability", None)
        says_whose = (f"Capability ``{capability.value}``" in doc if capability is not None
                      else "Every adapter" in doc or "(no capability)" in doc)
        if "alled" not in doc or not says_whose:
            vague.append(name)
    assert not vague, f"Adapter methods without 'when called' or their capability: {vague}"


def test_an_adapter_claiming_a_capability_it_does_not_implement_is_found() -> None:
    class Claims(Adapter):
        capabilities = frozenset({"no_sync", "join", "option:static_graph"})

        def join(self, **join_kwargs: object) -> object:  # type: ignore[override]
            """Called around the loop. Capability ``join``."""
            raise AssertionError

    assert unimplemented(Claims, Claims.capabilities) == ["no_sync"]


@pytest.mark.parametrize("name", sorted(builtin_candidates()))
def test_no_builtin_adapter_claims_a_capability_it_does_not_implement(name: str) -> None:
    try:
        candidate = builtin_candidates()[name]()
    except UsageError as exc:  # its package is not installed here
        pytest.skip(str(exc))
    wrap = candidate.wrap
    if not (isinstance(wrap, type) and issubclass(wrap, Adapter)):
        pytest.skip(f"{name} wraps through a function: its adapter class is chosen per call")
    assert unimplemented(wrap, candidate.capabilities) == []


def test_adapters_of_ddp_like_candidates_implement_every_capability() -> None:
    """They may claim any capability (read from the DDP-like object's attributes), so
    they implement every method."""
    from ddp_conformance.builtins.torch_compile import CompiledDDPAdapter
    from ddp_conformance.contract.ddp_like import DDPLikeAdapter

    for adapter in (DDPLikeAdapter, CompiledDDPAdapter):
        assert unimplemented(adapter, CAPABILITY_METHODS) == [], adapter


def _resolves(target: str) -> bool:
    """Whether ``target`` (``package.module.Name.attr``) names a module or an attribute of
    one, declared at least (a dataclass field or an annotated attribute counts)."""
    try:
        pkgutil.resolve_name(target)
        return True
    except (ImportError, AttributeError, ValueError):
        pass
    owner_name, _, name = target.rpartition(".")
    try:
        owner = pkgutil.resolve_name(owner_name)
    except (ImportError, AttributeError, ValueError):
        return False
    return name in getattr(owner, "__annotations__", {})


def test_cross_references_in_docstrings_name_what_exists() -> None:
    stale = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                stale += [f"{path.relative_to(ROOT)}:{node.lineno}: {t}"
                          for t in CROSS_REFERENCE.findall(node.value) if not _resolves(t)]
    assert not stale, "\n".join(stale)
