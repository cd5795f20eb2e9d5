"""The mutants: every mutation cosmic-ray's core operators make to torch's DDP sources.

cosmic-ray is used as a library: its operators (``cosmic_ray.plugins``) enumerate the
positions each can mutate in a parso tree, and ``cosmic_ray.mutating.mutate_code`` applies
one of them (operator, occurrence) to a source string. A mutant's id is
``<target>/<operator>/<occurrence>``, e.g. ``distributed/ReplaceComparisonOperator_Eq_NotEq/3``:
stable for a given torch and cosmic-ray, so a sample is reproducible from its seed.
Operators that need arguments (``VariableReplacer``, ``VariableInserter``) are left out, as
cosmic-ray's own ``init`` leaves them out without a configuration.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
TORCH_DIR = Path(torch.__file__).resolve().parent
#: Where generated mutant sources are kept (one file per mutant, made on first use).
CACHE = ROOT / "reports" / "mutation" / "sources"
HOOKS = "torch.distributed.algorithms.ddp_comm_hooks"


@dataclass(frozen=True)
class Target:
    """One mutated module: its short key (the first part of a mutant id), its import name
    and its path relative to torch's package directory."""

    key: str
    module: str
    path: str

    @property
    def file(self) -> Path:
        return TORCH_DIR / self.path


#: The DDP Python sources the catalog runs: the wrapper, Join, and the comm-hook modules
#: the catalog registers (``make_comm_hook``) or torch's DDP imports (the fused optimizer).
TARGETS: dict[str, Target] = {t.key: t for t in (
    Target("distributed", "torch.nn.parallel.distributed", "nn/parallel/distributed.py"),
    Target("join", "torch.distributed.algorithms.join", "distributed/algorithms/join.py"),
    *(Target(name, f"{HOOKS}.{name}", f"distributed/algorithms/ddp_comm_hooks/{name}.py")
      for name in ("default_hooks", "powerSGD_hook", "post_localSGD_hook", "debugging_hooks",
                   "optimizer_overlap_hooks")),
)}
#: The control: torch's sources unmutated, built and driven exactly as a mutant is.
IDENTITY = "identity"


@dataclass(frozen=True)
class Mutant:
    """One mutation: where (target, lines) and what (cosmic-ray's operator, occurrence)."""

    id: str
    target: str
    operator: str  # cosmic-ray's name without the provider, e.g. "NumberReplacer"
    occurrence: int
    first_line: int  # the mutated node's lines
    last_line: int
    statement_line: int  # the first line of the statement that holds it
    #: The changed lines, ``- old`` / ``+ new`` (filled in when sampled, for the docs).
    change: str = ""

    @property
    def lines(self) -> range:
        return range(min(self.first_line, self.statement_line), self.last_line + 1)


def parse_id(mutant_id: str) -> tuple[str, str, int]:
    """``(target, operator, occurrence)`` of a mutant id; ValueError when malformed."""
    target, operator, occurrence = mutant_id.split("/")
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r} (known: {', '.join(TARGETS)})")
    return target, operator, int(occurrence)


def _operators() -> list[tuple[str, object]]:
    import cosmic_ray.plugins

    out = []
    for name in cosmic_ray.plugins.operator_names():
        cls = cosmic_ray.plugins.get_operator(name)
        if name.startswith("core/") and not cls.arguments():
            out.append((name.removeprefix("core/"), cls()))
    return out


_STATEMENTS = ("simple_stmt", "if_stmt", "for_stmt", "while_stmt", "with_stmt", "try_stmt",
               "funcdef", "classdef", "decorated", "async_stmt")


def _statement_line(node: object) -> int:
    """The first line of the statement (or compound statement header) holding ``node``."""
    current = node
    while current is not None and getattr(current, "type", "") not in _STATEMENTS:
        current = getattr(current, "parent", None)
    return int((current or node).start_pos[0])  # type: ignore[attr-defined]


def enumerate_target(target: Target) -> list[Mutant]:
    """Every mutant of ``target``, in cosmic-ray's order (operator, then occurrence)."""
    from cosmic_ray.ast import ast_nodes, get_ast

    tree = get_ast(target.file.read_text())
    nodes = list(ast_nodes(tree))
    out = []
    for name, operator in _operators():
        occurrence = 0
        for node in nodes:
            for start, end in operator.mutation_positions(node):  # type: ignore[attr-defined]
                out.append(Mutant(f"{target.key}/{name}/{occurrence}", target.key, name,
                                  occurrence, start[0], end[0], _statement_line(node)))
                occurrence += 1
    return out


def population() -> list[Mutant]:
    """Every mutant of every target (seconds: parso parses each file once)."""
    return [m for t in TARGETS.values() for m in enumerate_target(t)]


def sample(mutants: list[Mutant], size: int, seed: int) -> list[Mutant]:
    """A uniform random sample of ``size`` mutants, the same for the same seed and
    population; in population order."""
    chosen = set(random.Random(seed).sample(range(len(mutants)), min(size, len(mutants))))
    return [m for i, m in enumerate(mutants) if i in chosen]


def save(mutants: list[Mutant], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(asdict(m)) for m in mutants) + "\n")


def load(path: Path) -> list[Mutant]:
    return [Mutant(**json.loads(line)) for line in path.read_text().splitlines() if line]


def describe(mutant: Mutant) -> Mutant:
    """``mutant`` with its :attr:`Mutant.change` filled in (generates its source)."""
    import dataclasses
    import difflib

    before = TARGETS[mutant.target].file.read_text().splitlines()
    after = mutated_source(mutant.id).splitlines()
    lines = [line for line in difflib.unified_diff(before, after, lineterm="", n=0)
             if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    change = " / ".join(f"{line[0]} {line[1:].strip()}" for line in lines)
    return dataclasses.replace(mutant, change=change)


def mutated_source(mutant_id: str) -> str:
    """The source of the target with this one mutation (the original for the identity),
    generated with cosmic-ray on first use and kept under :data:`CACHE`."""
    if mutant_id == IDENTITY:
        return TARGETS["distributed"].file.read_text()
    target, operator, occurrence = parse_id(mutant_id)
    cached = CACHE / (mutant_id.replace("/", "__") + ".py")
    if cached.exists():
        return cached.read_text()
    import cosmic_ray.plugins
    from cosmic_ray.mutating import mutate_code

    op = cosmic_ray.plugins.get_operator(f"core/{operator}")()
    code = mutate_code(TARGETS[target].file.read_text(), op, occurrence)
    if code is None:
        raise ValueError(f"mutant {mutant_id}: cosmic-ray makes no such mutation")
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{random.getrandbits(32):08x}.tmp")
    tmp.write_text(code)
    tmp.replace(cached)
    return code
