"""``report.html``: one self-contained file (inline CSS, error-per-step plots as inline SVG,
timing plots as base64 PNG, no scripts, nothing fetched from the network)."""
from __future__ import annotations

import html
from typing import Any

from ddp_conformance.judge.check_rules import shown_rule
from ddp_conformance.judge.diagnose.findings import case_cause, diagnose
from ddp_conformance.judge.verdict import RULE_LABEL, Result, Verdict
from ddp_conformance.ranks.outcome import describe_exit
from ddp_conformance.report.diagnosis import (
    BY_CHECK_HEADER,
    CLOSING_ORDER,
    by_check_rows,
    diagnosis_lines,
)

from . import errorplot, plots
from .common import (
    DIVERGENCE_HEADER,
    PER_PARAMETER_HEADER,
    backend_comparison,
    count_verdicts,
    divergence_row,
    divergences,
    per_parameter,
    slowest_cases,
    slowest_count,
    slowest_intro,
    time_shares_line,
    verdict_matrix,
)
from .coverage import HEADER as COVERAGE_HEADER
from .coverage import intro as coverage_intro
from .coverage import rows as coverage_rows
from .markdown import git_line
from .timing import (
    BREAKDOWN_HEADER,
    CUDA_PHASES_NOTE,
    GPU_HEADER,
    GPU_INTRO,
    MODEL_HEADER,
    PAPER_NOTES,
    TIMING_HEADER,
    breakdown_rows,
    experiment_table,
    gpu_notes,
    gpu_notes_after,
    gpu_table,
    model_info_rows,
    observed,
    phase_clock,
    setting,
    timing_table,
)

COLOURS = {"PASS": "#2e7d32", "FAIL": "#c62828", "ERROR": "#ad1457", "TIMEOUT": "#ef6c00",
           "CRASH": "#4a148c", "N/A": "#757575", "XFAIL": "#00838f", "XPASS": "#f9a825"}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222;
 max-width:1700px}
h1{font-size:22px;margin:0 0 8px}
h2{font-size:18px;border-bottom:2px solid #ddd;padding-bottom:3px;margin-top:32px}
h3{font-size:15px;margin:22px 0 6px} table{border-collapse:collapse;margin:8px 0}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f1f3f5} td.num{text-align:right;font-variant-numeric:tabular-nums}
.v{color:#fff;font-weight:600;text-align:center;white-space:nowrap} .v a{color:#fff;text-decoration:none}
.badge{display:inline-block;color:#fff;border-radius:3px;padding:1px 8px;margin-right:6px;font-weight:600}
pre{background:#f6f8fa;border:1px solid #e1e4e8;padding:8px;overflow-x:auto;font-size:12px;max-height:420px}
.case{border-left:5px solid #ccc;padding-left:12px;margin:18px 0;content-visibility:auto;
 contain-intrinsic-size:auto 700px} .muted{color:#666}
img{max-width:100%;border:1px solid #eee} details summary{cursor:pointer;color:#0b5394}
.info td:first-child{font-weight:600;background:#fafafa}
.note{background:#fffbe6;border:1px solid #f0e0a0;padding:8px 12px}
.incomplete{background:#fdecea;border:2px solid #d9534f;padding:8px 12px;font-size:15px}
.n1 td+td,.n2 td+td+td,.n3 td+td+td+td,.n4 td+td+td+td+td{text-align:right;
 font-variant-numeric:tabular-nums}
.rule{background:#eef5fb;border-left:3px solid #0b5394;padding:4px 10px}
"""


def esc(x: Any) -> str:
    """``x`` as the text of an element (quotes left as they are: they need no escape there)."""
    return html.escape(str(x), quote=False)


def attr(x: Any) -> str:
    """``x`` as a double-quoted attribute value."""
    return html.escape(str(x))


def anchor(r: Result) -> str:
    return "case-" + "".join(ch if ch.isalnum() else "-" for ch in r.case_id)


def table(header: list[str] | None, rows: list[list[str]], numeric_from: int | None = None,
          cls: str = "") -> str:
    """A table; ``header`` None: none (no empty first row). Cells from column
    ``numeric_from`` on are right-aligned by the table's class (``n1``..``n4`` in
    :data:`CSS`), not one attribute a cell; end tags HTML leaves optional are left out:
    a run's tables are most of the report's bytes."""
    classes = " ".join(c for c in (cls, f"n{numeric_from}" if numeric_from else "") if c)
    out = [f'<table class="{classes}">' if classes else "<table>"]
    if header is not None:
        out.append("<tr><th>" + "<th>".join(map(esc, header)))
    out += ["<tr><td>" + "<td>".join(map(esc, row)) for row in rows]
    return "\n".join(out) + "</table>"


def img(png: str | None, alt: str) -> str:
    return f'<p><img alt="{attr(alt)}" src="data:image/png;base64,{png}"></p>' if png else ""


def badge(verdict: str, text: str | None = None) -> str:
    colour = COLOURS.get(verdict, "#999")
    return f'<span class="badge" style="background:{colour}">{esc(text or verdict)}</span>'


def run_info_html(info: dict[str, Any]) -> str:
    devices = f"{info.get('backend')} / {info.get('device')} {info.get('devices', '')}"
    rows: list[tuple[str, Any]] = [
            ("torch", info.get("torch")), ("python", info.get("python")), ("backend / device", devices),
            ("world size", info.get("world_size")), ("CPUs", info.get("cpu_count")),
            ("host / platform", f"{info.get('host')} / {info.get('platform')}"),
            ("started", info.get("started"))]
    if info.get("backend_spec"):
        rows.append(("backend registered by", info["backend_spec"]))
    if info.get("compare_backend"):
        rows.append(("scenarios compared with", f"backend {info['compare_backend']}"))
    if "project_git" in info:
        rows.append(("ddp-conformance commit", git_line(info["project_git"])))
    for c in info.get("candidates", []):
        git = f"; git {git_line(c['git'])}" if "git" in c else ""
        said = " — ".join(x for x in (c.get("version") or "(no version)", c.get("description"))
                          if x)
        rows.append((f"candidate {c['name']}", f"{said}{git}"))
    if info.get("argv"):
        rows.append(("command", " ".join(map(str, info["argv"]))))
    return table(None, [[str(a), str(b)] for a, b in rows], cls="info")


def matrix_html(results: list[Result]) -> str:
    header, rows = verdict_matrix(results)
    by_key = {(r.scenario, r.candidate): r for r in results}
    out = ["<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"]
    for row in rows:
        cells = [f"<td>{esc(row[0])}</td>"]
        for cand, v in zip(header[1:], row[1:], strict=True):
            r = by_key.get((row[0], cand))
            if r is None:
                cells.append("<td></td>")
                continue
            # Every verdict but PASS has its anchor: a case's evidence, or its N/A line.
            label = esc(v) if v == "PASS" else f'<a href="#{anchor(r)}">{esc(v)}</a>'
            title = f' title="{attr(r.summary_line())}"' if r.verdict is not Verdict.PASS else ""
            colour = COLOURS.get(v, "#999")
            cells.append(f'<td class="v" style="background:{colour}"{title}>{label}</td>')
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


#: Failure messages shown per case (a run that fails everywhere has hundreds per case; the
#: divergence table above them already gives every failed check's first step and worst
#: figures).
MAX_MESSAGES = 10
#: Rows of a case's per-parameter figures table.
MAX_FIGURE_ROWS = 60
#: Where everything a capped section leaves out is.
SEE_RESULTS = "every one is in results.jsonl"


def more_line(shown: int, total: int, what: str) -> str:
    """"... and 12 more failure messages (every one is in results.jsonl)", or ""."""
    if total <= shown:
        return ""
    return f"... and {total - shown} more {what} ({SEE_RESULTS})"


def case_html(r: Result) -> str:
    """One case's evidence, its long lists capped (:data:`MAX_MESSAGES`,
    :data:`MAX_FIGURE_ROWS`) with a line saying how many more results.jsonl holds."""
    colour = COLOURS.get(r.verdict.value, "#999")
    parts = [f'<div class="case" id="{anchor(r)}" style="border-color:{colour}">',
             f"<h3>{badge(r.verdict.value)}<code>{esc(r.case_id)}</code> "
             f'<span class="muted">({r.duration_s:.2f}s)</span></h3>',
             *(f"<p>{esc(line)}</p>" for line in r.explanation_lines(10**6)
               if not line.startswith(RULE_LABEL))]
    if r.rule:
        rule = shown_rule(r.rule, r.failures[0].check if r.failures else "")
        parts.append(f'<p class="rule"><b>Rule:</b> {esc(rule)}</p>')
    if r.guards:
        parts.append(f"<p><b>Guards:</b> {esc(', '.join(r.guards))}</p>")
    if r.expectation:
        parts.append(f"<p><b>Expected to fail:</b> {esc(r.expectation)}</p>")
    divs = divergences(r)
    if divs:
        parts.append("<p>First divergence per check (worst error over all steps and ranks):</p>")
        parts.append(table(DIVERGENCE_HEADER, [divergence_row(d, max_names=6) for d in divs], numeric_from=4))
        for d in divs:
            for detail in d.details[:3]:
                parts.append(f"<p><code>{esc(d.check)}</code>:</p><pre>{esc(detail)}</pre>")
        messages = [f.message for f in r.failures[:MAX_MESSAGES]]
        more = more_line(MAX_MESSAGES, len(r.failures), "failure messages")
        parts.append(f"<details><summary>failure messages ({len(r.failures)})</summary><pre>"
                     + esc("\n".join([*messages, more] if more else messages))
                     + "</pre></details>")
    if r.verdict in (Verdict.FAIL, Verdict.XFAIL, Verdict.XPASS):
        svg = errorplot.error_per_step(r)
        if svg:
            parts.append(f"<p>{svg}</p>")
    for rank, code in sorted(r.exit_codes.items()):
        parts.append(f"<p><b>rank {rank}</b> ended with {esc(describe_exit(code))}</p>")
    if r.desync:
        parts.append(f"<p>The ranks' collective streams:</p><pre>{esc(r.desync.rstrip())}</pre>")
    for kind, texts in (("traceback", r.tracebacks), ("stack", r.stacks)):
        for rank, text in sorted(texts.items()):
            parts.append(f"<p><b>rank {rank} {kind}</b>:</p><pre>{esc(text.rstrip())}</pre>")
    for note in getattr(r, "notes", []):
        parts.append(f'<p class="muted">note: {esc(note)}</p>')
    if r.figures:
        parts.append("<details><summary>per-parameter error figures (worst over steps and ranks)"
                     "</summary>" + figures_table(r) + "</details>")
    parts.append("</div>")
    return "\n".join(parts)


def figures_table(r: Result) -> str:
    """The per-parameter figures of ``r``, at most :data:`MAX_FIGURE_ROWS` rows; a check
    whose every parameter has the same figures and passed is one row ("all 6")."""
    rows = collapse_same(per_parameter(r.figures))
    more = more_line(MAX_FIGURE_ROWS, len(rows), "rows")
    return (table(PER_PARAMETER_HEADER, rows[:MAX_FIGURE_ROWS], numeric_from=2)
            + (f'<p class="muted">{esc(more)}</p>' if more else ""))


def collapse_same(rows: list[list[str]]) -> list[list[str]]:
    """Rows of :func:`per_parameter` with each check's rows made one ("all N") where they
    passed with the same figures (often all 0: init, replica): nothing is lost."""
    by_check: dict[str, list[list[str]]] = {}
    for row in rows:
        by_check.setdefault(row[0], []).append(row)
    out: list[list[str]] = []
    for check, group in by_check.items():
        same = len({tuple(row[2:]) for row in group}) == 1 and group[0][-1] == "ok"
        out += [[check, f"all {len(group)}", *group[0][2:]]] if same and len(group) > 1 else group
    return out


def slowest_html(results: list[Result], n: int) -> str:
    """'Slowest cases': the ``n`` slowest (0: all) with their costs per phase, and the
    run's shares per phase (as in summary.md)."""
    header, rows = slowest_cases(results, n)
    parts = ["<h2>Slowest cases</h2>", f"<p>{esc(slowest_intro(results, n))}</p>"]
    shares = time_shares_line(results)
    if shares:
        parts.append(f"<p>Where the run's time went: {esc(shares)}</p>")
    return "\n".join([*parts, table(header, rows, numeric_from=2)])


def timing_html(bench: dict[str, Any]) -> str:
    parts = ['<h2 id="timing">Timing</h2>']
    timing = bench.get("timing")
    if timing:
        info, cfg = timing.get("info", {}), timing.get("config", {})
        parts.append(
            f"<p>{esc(info.get('world_size'))} ranks, {esc(setting(info).replace('/', ' on '))}, "
            f"{esc(info.get('threads', 1))} intra-op "
            f"thread(s) per rank, {esc(info.get('cpu_count'))} CPUs, torch {esc(info.get('torch'))}; "
            f"candidates interleaved, {esc(cfg.get('rounds'))} rounds x {esc(cfg.get('steps'))} timed "
            f"steps each after {esc(cfg.get('warmup'))} warm-up steps; commit "
            f"{esc(str(info.get('commit', '?'))[:12])}{' (dirty)' if info.get('dirty') else ''}; "
            f"{esc(info.get('started', ''))}. Step time is rank 0's (ranks are held in step by the "
            "collectives); the ratio's spread is the IQR of per-round ratios to torch DDP. busbw = "
            "algbw x 2(n-1)/n; the gradient communication's time is the union of its allreduces' "
            "launch-to-completion intervals. Overlap: share of gradient allreduces launched / completed "
            "before backward's last gradient-accumulation hook fired.</p>")
        parts.append(table(MODEL_HEADER, model_info_rows(bench), numeric_from=2))
        parts.append(table(TIMING_HEADER, timing_table(bench), numeric_from=2))
        parts += [f"<p>{esc(note)}</p>" for note in gpu_notes(bench)]
        gpu_rows = gpu_table(bench)
        if gpu_rows:
            parts.append(f"<p>{esc(GPU_INTRO)}</p>")
            parts.append(table(GPU_HEADER, gpu_rows, numeric_from=2))
            parts += [f"<p>{esc(note)}</p>" for note in gpu_notes_after(bench)]
        parts.append(img(plots.step_times(bench), "step times"))
        parts.append(img(plots.bandwidth(bench), "bus bandwidth"))
    experiments = bench.get("experiments") or {}
    if experiments:
        parts.append('<h2 id="paper">The DDP paper\'s experiments on this backend</h2>')
        parts.append("<p>Li et al., <i>PyTorch Distributed: Experiences on Accelerating Data Parallel "
                     "Training</i>, VLDB 2020; here on Gloo over loopback, CPU ranks.</p>")
    for name, exp in experiments.items():
        info = exp.get("info", {})
        parts.append(f"<h3>{esc(name)}</h3><p class='muted'>command: <code>{esc(exp.get('command', ''))}"
                     f"</code>; commit {esc(str(info.get('commit', '?'))[:12])}"
                     f"{' (dirty)' if info.get('dirty') else ''}; {esc(info.get('started', ''))}</p>")
        parts.append(img(plots.experiment_plot(name, exp), name))
        if name.split(":")[0] == "breakdown":
            parts.append(table(BREAKDOWN_HEADER, breakdown_rows(exp), numeric_from=2))
            if phase_clock(exp["data"]) == "cuda_events":
                parts.append(f"<p>{esc(CUDA_PHASES_NOTE)}</p>")
        else:
            header, rows = experiment_table(name, exp)
            parts.append(table(header, rows, numeric_from=1))
        seen = observed(name, exp)
        if seen:
            parts.append(f'<p class="note"><b>Observed in this run:</b> {esc(seen)}</p>')
        if name.split(":")[0] in PAPER_NOTES:
            parts.append(f'<p class="note"><b>The paper, and why it differs here:</b> '
                         f'{esc(PAPER_NOTES[name.split(":")[0]])}</p>')
    return "\n".join(parts)


def diagnosis_html(results: list[Result]) -> list[str]:
    """The report's opening: the diagnosis and by-check table, the unexpected verdicts
    grouped by cause, the expected failures, N/A grouped by what is missing (each case
    keeps its anchor, which the matrix links to)."""
    lines = diagnosis_lines(diagnose(results))
    parts = ["<h2>Diagnosis</h2>", f"<pre>{esc(chr(10).join(lines))}</pre>" if lines else
             "<p>No unexpected verdict: nothing to diagnose.</p>"]
    groups: dict[str, list[Result]] = {}
    for r in results:
        if r.verdict.unexpected:
            groups.setdefault(str(case_cause(r).code), []).append(r)
    if groups:
        parts.append("<p>Unexpected verdicts by the check that failed first:</p>"
                     + table(BY_CHECK_HEADER, by_check_rows(results)))
        parts.append("<h2>Failures by cause</h2>")
        for code, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            parts.append(f"<h3><code>{esc(code)}</code>: {len(members)} case(s)</h3>")
            parts += [case_html(r) for r in members]
    other = [r for r in results if r.verdict in (Verdict.XFAIL, Verdict.XPASS)]
    if other:
        parts.append("<h2>Expected failures and stale expectations</h2>")
        parts += [case_html(r) for r in other]
    na: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        if r.verdict is Verdict.NA:
            na.setdefault((r.candidate, r.reason), []).append(r)
    if na:
        parts.append("<h2>Not applicable, by what is missing</h2>")
        for (candidate, reason), members in sorted(na.items(), key=lambda kv: -len(kv[1])):
            parts.append(f"<p><code>{esc(candidate)}</code>: {len(members)} N/A: {esc(reason)}</p>"
                         "<ul>" + "".join(f'<li id="{anchor(r)}"><code>{esc(r.case_id)}</code></li>'
                                          for r in members) + "</ul>")
    return parts


def render_html(info: dict[str, Any] | None, results: list[Result], notes: list[str],
                bench: dict[str, Any] | None = None, incomplete: str | None = None,
                coverage: dict[str, Any] | None = None) -> str:
    """The self-contained report; ``incomplete`` (why the run holds only its finished
    cases) puts a banner at the top; ``coverage``: the ``--coverage`` section."""
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
             "<title>ddp-conformance report</title>", f"<style>{CSS}</style></head><body>",
             "<h1>ddp-conformance report</h1>"]
    if info is None and bench:
        sections: list[dict[str, Any]] = [bench.get("timing") or {},
                                          *(bench.get("experiments") or {}).values()]
        info = next((s["info"] for s in sections if s.get("info")), {})
    if incomplete is not None:
        parts.append(f'<p class="incomplete"><b>Incomplete run</b>: {esc(incomplete)}; the '
                     'verdicts below are the finished cases only.</p>')
    if info:
        parts.append(run_info_html(info))
    if results:
        counts = count_verdicts(results)
        parts.append("<h2>Verdicts</h2><p>" + "".join(
            badge(v, f"{v} {n}") for v, n in sorted(counts.items(), key=lambda kv: CLOSING_ORDER.index(kv[0])
                                                    if kv[0] in CLOSING_ORDER else 99)) + "</p>")
        parts += diagnosis_html(results)
        parts.append(matrix_html(results))
        parts.append(slowest_html(results, slowest_count(info)))
        comparison = backend_comparison(results)
        if comparison is not None:
            intro, header, rows = comparison
            parts.append(f"<h2>Backend comparison: {esc(header[2])} and {esc(header[3])}</h2>"
                         f"<p>{esc(intro)}</p>" + table(header, rows))
        passed = [r for r in results if r.verdict is Verdict.PASS and r.figures]
        if passed:
            parts.append("<h2>Passed cases: error figures</h2>")
            for r in passed:
                figures = figures_table(r)
                parts.append(f"<details><summary><code>{esc(r.case_id)}</code> ({len(r.checks_run)} "
                             f"checks)</summary>{figures}</details>")
    if bench:
        parts.append(timing_html(bench))
    if coverage:
        parts.append(f"<h2>Coverage</h2><p>{esc(coverage_intro(coverage))}</p>"
                     + table(COVERAGE_HEADER, coverage_rows(coverage), numeric_from=1))
    if notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)
