"""The packages are layers: each imports only from the layers below it (lazy imports inside
functions included), so the contract can be read, and the judge tested, without the rest."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ddp_conformance"

#: Lowest first. A module may import its own layer and the layers before it.
LAYERS: list[set[str]] = [
    {"script"},  # torch and the standard library only: the reproducer's modules
    {"errors", "config", "options", "user_import", "user_files", "repro_dead", "repro_oneline",
     "repro_prune"},
    {"contract", "builtins"},
    {"catalog"},
    {"ranks"},
    {"judge", "collectives"},
    {"report", "bench"},
    {"runner", "oracle_cache", "reference_cache", "backend_comparison"},
    {"session", "interruption", "deadline", "fuzz", "repro"},
    {"cli", "pytest_plugin", "pytest_items", "pytest_coverage", "__main__", "__init__"},
]


def _layer(top: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if top in layer)


def _top(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 or rel.name != "__init__.py" \
        else "__init__"


def _imported_tops(path: Path) -> set[str]:
    """The top-level names of ddp_conformance that ``path`` imports, relative imports too."""
    package = ["ddp_conformance", *path.parent.relative_to(PACKAGE).parts]
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = package[:len(package) - (node.level - 1)]
            parts = base + (node.module.split(".") if node.module else [])
            if len(parts) > 1:
                tops.add(parts[1])
            else:  # from the package root itself: each imported name is a top-level module
                tops |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and \
                node.module.startswith("ddp_conformance."):
            tops.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            tops |= {a.name.split(".")[1] for a in node.names
                     if a.name.startswith("ddp_conformance.")}
    return tops


def test_every_module_is_in_a_layer() -> None:
    for path in PACKAGE.rglob("*.py"):
        _layer(_top(path))


def test_no_module_imports_a_higher_layer() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        mine = _layer(_top(path))
        wrong += [f"{path.relative_to(PACKAGE)} imports ddp_conformance.{top}"
                  for top in _imported_tops(path) if _layer(top) > mine]
    assert not wrong, "\n".join(wrong)



def test_the_script_modules_import_only_each_other() -> None:
    """What a reproducer copies imports nothing of the harness (ddp_conformance/script)."""
    import sys

    wrong = [f"{path.name} imports ddp_conformance.{top}"
             for path in sorted((PACKAGE / "script").glob("*.py"))
             for top in _imported_tops(path) if top != "script"]
    allowed = set(sys.stdlib_module_names) | {"torch", "ddp_conformance"}
    for path in sorted((PACKAGE / "script").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            wrong += [f"{path.name} imports {n}" for n in names if n.split(".")[0] not in allowed]
    assert not wrong, "\n".join(wrong)
