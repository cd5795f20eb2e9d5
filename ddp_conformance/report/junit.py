"""JUnit XML for CI: one testcase per (scenario, candidate)."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from ddp_conformance.judge.diagnose.findings import diagnose
from ddp_conformance.judge.verdict import Result, Verdict

from .common import count_verdicts, divergence_row, divergences


def junit_detail(r: Result) -> str:
    lines = []
    for d in divergences(r):
        check, step, ranks, names, mabs, mrel, mulp, tol = divergence_row(d, max_names=8)
        lines.append(f"{check}: first at step {step}, rank(s) {ranks}, parameter(s) {names}; "
                     f"max abs {mabs}, max rel {mrel}, max ULP {mulp}, tolerance {tol}")
    lines += [f.message for f in r.failures]
    lines += [f"rank {k} traceback:\n{v}" for k, v in sorted(r.tracebacks.items())]
    lines += [f"rank {k} stack:\n{v}" for k, v in sorted(r.stacks.items())]
    return "\n".join(lines)


def write_junit(path: str, results: list[Result], incomplete: str | None = None) -> None:
    """One testsuite, one testcase per result; the counts are those of ``results``.
    ``incomplete`` (why only the finished cases are there) becomes the suite's property
    ``incomplete``."""
    counts = count_verdicts(results)
    suite = ET.Element("testsuite", name="ddp-conformance", tests=str(len(results)),
                       failures=str(counts["FAIL"]),
                       errors=str(counts["ERROR"] + counts["TIMEOUT"] + counts["CRASH"]),
                       skipped=str(counts["N/A"] + counts["XFAIL"]),
                       time=f"{sum(r.duration_s for r in results):.3f}")
    properties = ET.SubElement(suite, "properties")
    if incomplete is not None:
        ET.SubElement(properties, "property", name="incomplete", value=incomplete)
    for d in diagnose(results):  # the diagnosis first: the causes, most explanatory first
        for i, f in enumerate(d.findings, 1):
            ET.SubElement(properties, "property", name=f"diagnosis {d.candidate} {i}",
                          value=f"{f.code} ({f.cases} cases): {f.summary}; look first at "
                                f"{f.first_case}: {f.repro}")
    if not len(properties):
        suite.remove(properties)
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=r.scenario.split("/")[0],
                             name=r.case_id, time=f"{r.duration_s:.3f}")
        detail = junit_detail(r)
        if r.cause:
            ET.SubElement(ET.SubElement(case, "properties"), "property", name="cause",
                          value=f"{r.cause.get('code', '')}: {r.cause.get('relation', '')}")
        if r.verdict is Verdict.FAIL:
            ET.SubElement(case, "failure", message=r.summary_line(), type="FAIL").text = detail
        elif r.verdict in (Verdict.ERROR, Verdict.TIMEOUT, Verdict.CRASH):
            ET.SubElement(case, "error", message=r.summary_line(), type=r.verdict.value).text = detail
        elif r.verdict in (Verdict.NA, Verdict.XFAIL):
            ET.SubElement(case, "skipped", message=f"{r.verdict.value}: {r.summary_line()}"
                          + (f" ({r.expectation})" if r.expectation else ""))
        elif r.verdict is Verdict.XPASS:
            ET.SubElement(case, "system-out").text = f"XPASS: expected to fail ({r.expectation})"
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
