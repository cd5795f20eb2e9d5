"""Read a run back from ``results.jsonl`` (also a run that died before its end line)."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from ddp_conformance.errors import UsageError
from ddp_conformance.judge.verdict import BackendComparison, CheckFailure, Figure, Result, Verdict
from ddp_conformance.report.compact import WORST_KEY, figures_from
from ddp_conformance.user_files import read_user_text

RESULTS_FILE = "results.jsonl"
BENCH_FILE = "bench.json"


#: Why a results file without its end line is incomplete (the run was killed outright).
NO_END_RECORD = "the run ended without its end record"


@dataclass
class RunData:
    """One run: its info line, its results, and the end line's notes (if it got there).

    ``incomplete``: why the results are only the cases finished (the end line's reason,
    or :data:`NO_END_RECORD`); None for a complete run.
    """

    info: dict[str, Any]
    results: list[Result]
    notes: list[str] = field(default_factory=list)
    incomplete: str | None = None

    @property
    def complete(self) -> bool:
        return self.incomplete is None


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that ``cls`` has fields for (files from older or newer versions)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def result_from_json(data: dict[str, Any]) -> Result:
    data = {k: v for k, v in data.items() if k != "type"}

    def ranks(d: dict[str, Any] | None) -> dict[int, Any]:
        return {int(k): v for k, v in (d or {}).items()}

    return Result(
        scenario=data["scenario"], candidate=data["candidate"], verdict=Verdict(data["verdict"]),
        world_size=data.get("world_size", 0), backend=data.get("backend", ""),
        device=data.get("device", ""), duration_s=data.get("duration_s", 0.0),
        reason=data.get("reason", ""),
        failures=[CheckFailure(**_known(CheckFailure, f)) for f in data.get("failures", [])],
        figures=[Figure(**_known(Figure, g)) for g in data.get("figures", [])]
        or figures_from(data.get(WORST_KEY) or {"tensors": [], "checks": {}}),
        tracebacks=ranks(data.get("tracebacks")), stacks=ranks(data.get("stacks")),
        exit_codes=ranks(data.get("exit_codes")), expectation=data.get("expectation"),
        checks_run=data.get("checks_run", []),
        costs={str(k): float(v) for k, v in (data.get("costs") or {}).items()},
        desync=data.get("desync", ""), rule=data.get("rule", ""),
        comparison=BackendComparison(**_known(BackendComparison, data["comparison"]))
        if data.get("comparison") else None,
        **_known(Result, {"notes": data.get("notes", []),
                          "guards": list(data.get("guards", [])),
                          "cause": data.get("cause") or {}}))


def results_path(path: str) -> str:
    return os.path.join(path, RESULTS_FILE) if os.path.isdir(path) else path


def load_results(path: str) -> RunData:
    """Load ``path`` (a report directory or a results.jsonl file).

    A later line for the same (scenario, candidate) replaces an earlier one. Raises
    :class:`UsageError` when the file is missing or not a results stream.
    """
    file = results_path(path)
    lines = read_user_text(file, "results").splitlines()
    info: dict[str, Any] | None = None
    results: dict[tuple[str, str], Result] = {}
    notes: list[str] = []
    incomplete: str | None = NO_END_RECORD
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # the run died while writing its last line
                break
            raise UsageError(f"{file}:{number}: not JSON") from None
        kind = obj.get("type")
        if kind == "run":
            info = obj
        elif kind == "result":
            r = result_from_json(obj)
            results[(r.scenario, r.candidate)] = r
        elif kind == "end":
            notes = list(obj.get("notes", []))
            incomplete = obj.get("incomplete") or None
    if info is None:
        raise UsageError(f"{file}: no run line: not a ddp-conformance results file")
    return RunData(info, list(results.values()), notes, incomplete)


def load_bench(path: str) -> dict[str, Any] | None:
    """The timing results (``bench.json``) in a report directory, or None."""
    file = os.path.join(path, BENCH_FILE) if os.path.isdir(path) else path
    if not os.path.exists(file):
        return None
    text = read_user_text(file, "timing results")
    try:
        data: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"cannot read timing results {file!r}: {exc}") from None
    return data
