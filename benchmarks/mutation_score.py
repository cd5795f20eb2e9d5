"""Mutation score of the catalog, with torch 2.13's own DDP as the yardstick.

    python benchmarks/mutation_score.py --measure-coverage   # once: per-case coverage, 2 and 3 ranks
    python benchmarks/mutation_score.py --sample              # the seeded sample (sample.jsonl)
    python benchmarks/mutation_score.py --run                 # the catalog against each mutant
    python benchmarks/mutation_score.py --run --results after # ... into results/after.jsonl
    python benchmarks/mutation_score.py --docs                # writes docs/mutation.md
    python benchmarks/mutation_score.py --check-docs          # exit 1 if docs/mutation.md is stale

Mutants are made by cosmic-ray's operators (used as a library) on torch's DDP sources
(``benchmarks/mutation/population.py``); each runs as a candidate, built in the ranks
(``benchmarks/mutation/install.py``). ``--run`` is resumable: it appends each mutant's
outcome to ``benchmarks/mutation/results/<name>.jsonl`` and skips what is there. Run it
under ``nice`` on a shared machine. See ``docs/mutation.md``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.mutation import population as pop  # noqa: E402

HERE = ROOT / "benchmarks" / "mutation"
SAMPLE = HERE / "sample.jsonl"
COUNTS = HERE / "population.json"
RESULTS = HERE / "results"
COVERAGE_DIR = ROOT / "reports" / "mutation"
SEED = 2013
SIZE = 320


def coverage_dir(world_size: int, base: Path = COVERAGE_DIR) -> Path:
    return base / f"coverage-ws{world_size}"


def measure_coverage(world_size: int, slow: bool = False) -> int:
    """The catalog on torch's DDP, in both reducer modes, with per-case coverage of every
    target (the Python reducer's lines run only under ``torch-python-reducer``)."""
    command = [sys.executable, "-m", "ddp_conformance", "run", "--candidate", "torch",
               "--candidate", "torch-python-reducer",
               "--world-size", str(world_size), "--strict-profile",
               "--report-dir", str(coverage_dir(world_size)), *(["--slow"] if slow else [])]
    for target in pop.TARGETS.values():
        command += ["--coverage", target.module]
    print(" ".join(command[1:]), flush=True)
    return subprocess.run(command, cwd=ROOT, check=False).returncode


def write_sample(seed: int, size: int) -> None:
    import json
    from collections import Counter

    mutants = pop.population()
    counts = Counter((m.target, m.operator) for m in mutants)
    table: dict[str, dict[str, int]] = {}
    for (target, operator), n in sorted(counts.items()):
        table.setdefault(target, {})[operator] = n
    COUNTS.write_text(json.dumps({"seed": seed, "size": size, "population": len(mutants),
                                  "cosmic_ray": _version("cosmic-ray"),
                                  "counts": table}, indent=1) + "\n")
    # every source generated now (the ranks only read them), its change kept for the docs
    chosen = [pop.describe(m) for m in pop.sample(mutants, size, seed)]
    pop.save(chosen, SAMPLE)
    print(f"{len(chosen)} of {len(mutants)} mutants sampled (seed {seed}) -> {SAMPLE}")


def _version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


def run(results: str, timeout_s: float, batch: int, only: list[str] | None,
        part: tuple[int, int] = (0, 1), coverage: Path = COVERAGE_DIR,
        slow: bool = False) -> None:
    from benchmarks.mutation.measure import measure
    from benchmarks.mutation.select import Reach

    sample = pop.load(SAMPLE)
    for m in sample:
        pop.mutated_source(m.id)
    if only is not None:
        sample = [m for m in sample if m.id in only]
    sample = sample[part[0]::part[1]]
    reaches = {ws: Reach.read(coverage_dir(ws, coverage), ws) for ws in (2, 3)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    measure(sample, reaches, RESULTS / f"{results}.jsonl", timeout_s, batch, slow)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--measure-coverage", action="store_true")
    parser.add_argument("--sample", action="store_true")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--size", type=int, default=SIZE)
    parser.add_argument("--run", action="store_true")
    parser.add_argument("--results", default="baseline", help="results/NAME.jsonl")
    parser.add_argument("--only", nargs="*", default=[], help="these mutant ids only")
    parser.add_argument("--gaps", action="store_true",
                        help="only the mutants verdicts.toml classifies as gaps with a fix")
    parser.add_argument("--part", default="0/1",
                        help="K/N: every N-th mutant from the K-th (N processes side by side, "
                             "one results file)")
    parser.add_argument("--coverage-dir", default=str(COVERAGE_DIR),
                        help="where --measure-coverage's runs are (coverage-ws2, coverage-ws3)")
    parser.add_argument("--slow", action="store_true",
                        help="the --slow scenarios too (coverage and mutant runs)")
    parser.add_argument("--timeout", type=float, default=30.0, help="per-case deadline (s)")
    parser.add_argument("--batch", type=int, default=25, help="mutants per rank pool")
    parser.add_argument("--docs", action="store_true")
    parser.add_argument("--check-docs", action="store_true")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    if args.measure_coverage:
        for ws in (2, 3):
            if measure_coverage(ws, args.slow) not in (0, 1):
                return 2
    if args.sample:
        write_sample(args.seed, args.size)
    if args.run:
        only = list(args.only)
        if args.gaps:
            from benchmarks.mutation.verdicts import read

            only += [i for i, v in read().items() if v.cls == "gap" and v.fixed_by]
        k, _, n = args.part.partition("/")
        run(args.results, args.timeout, args.batch,
            only if args.only or args.gaps else None, (int(k), int(n)), Path(args.coverage_dir),
            args.slow)
    if args.docs or args.check_docs:
        from benchmarks.mutation.page import DOC, render

        text = render()
        if args.check_docs:
            fresh = DOC.exists() and DOC.read_text() == text
            print("docs/mutation.md is " + ("fresh" if fresh else "stale: run --docs"))
            return 0 if fresh else 1
        DOC.write_text(text)
        print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
