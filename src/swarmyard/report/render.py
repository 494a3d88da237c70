"""Writing ``runs/<id>/report.md`` and ``runs/<id>/report.html`` (charts as PNG files and inline images)."""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from swarmyard.controls import html_shown, shown
from swarmyard.domain import Citation, CitationKind, Finding, Task, TaskState
from swarmyard.money import format_usd
from swarmyard.report.charts import spend_png, timeline_png
from swarmyard.report.data import ReportData
from swarmyard.report.series import run_series
from swarmyard.report.steps import Steps, html_steps, load_steps, markdown_steps


@dataclass(frozen=True, slots=True)
class ReportFiles:
    """Where the report went."""

    markdown: Path
    html: Path
    timeline: Path
    spend: Path


def _totals(data: ReportData) -> list[tuple[str, str]]:
    rows = [
        ("run", data.run_id),
        ("goal", data.goal.id),
        ("policy", data.goal.policy),
        ("wall time", f"{data.wall_s:.1f} s"),
        ("model calls", str(data.calls)),
        ("tokens in / out", f"{data.input_tokens} / {data.output_tokens}"),
        ("spend", f"{format_usd(data.spent_micro_usd)} of {format_usd(data.goal.budget_micro_usd)}"),
        ("tasks", str(len(data.tasks))),
        ("findings", str(len(data.findings))),
    ]
    if data.audit_root:
        rows.append(("audit root", data.audit_root))
    if data.audit_key:
        rows.append(("audit key", data.audit_key))
    rows += list(data.extra.items())
    return rows


_WORKER_HEAD = ("worker", "calls", "tokens in", "tokens out", "spend")
_SCORE_HEAD = ("time", "best search score", "worker", "artifact")


def _holdout_line(data: ReportData) -> str | None:
    """The final holdout score in a line, or why there is none; ``None`` when the run had no evaluator."""
    scores = data.scores
    if scores is None:
        return None
    if scores.holdout is None:
        return f"holdout: none ({scores.holdout_note or 'not scored'})"
    h = scores.holdout
    return f"holdout: {h.score} (artifact {h.sha256[:12]} by {h.worker}, submitted at {h.at_s:.1f} s)"


def _score_rows(data: ReportData) -> list[tuple[str, ...]]:
    points = data.scores.best_over_time() if data.scores else []
    return [(f"{p.at_s:.1f} s", str(p.score), p.worker, p.sha256[:12]) for p in points]


def _worker_rows(data: ReportData) -> list[tuple[str, ...]]:
    rows = [(name, str(t.calls), str(t.input_tokens), str(t.output_tokens), format_usd(t.spent_micro_usd))
            for name, t in data.by_worker().items()]
    total = (str(data.calls), str(data.input_tokens), str(data.output_tokens), format_usd(data.spent_micro_usd))
    return [*rows, ("total", *total)]


def _failed(data: ReportData) -> list[Task]:
    """Tasks that were given up on, with why (``Task.result``)."""
    return [t for t in data.tasks if t.state is TaskState.FAILED]


_CROSS_HEAD = ("after broadcast", "group", "best attempt", "score", "best carried from other groups",
               "built on it", "beat it")
_CROSS_NOTE = ("For each broadcast between rounds and each group, the group's best attempt of the next round. "
               "Built on it: that finding cites another group's finding the broadcast carried, or the broadcast "
               "itself. Beat it: it scored above the best score the broadcast carried from other groups.")


def _cross_rows(data: ReportData) -> list[tuple[str, ...]]:
    def num(value: int | None) -> str:
        return "-" if value is None else str(value)

    return [(str(f.broadcast), f.group, f.finding, num(f.score), num(f.carried_best), "yes" if f.built_on else "no",
             "yes" if f.improved_on else "no") for f in data.cross_group().followups]


def _cross_summary(data: ReportData) -> str | None:
    """The figure in a line, ``None`` when the run broadcast nothing between rounds."""
    cross = data.cross_group()
    if not cross.broadcasts:
        return None
    n = len(cross.followups)
    return (f"{cross.built_on} of {n} best attempts built on another group's broadcast; {cross.improved_on} of {n} "
            f"beat it ({cross.broadcasts} broadcast{'s' if cross.broadcasts != 1 else ''}).")


def _cites(f: Finding) -> str:
    # a source line is shown with the words quoted from it, which the plane found there; another kind's quote
    # (a run without sources takes one unchecked) is said to be the worker's
    return ", ".join(f"{c.kind.value} {c.ref}" + (f" \"{c.quote}\"{_unchecked(c)}" if c.quote else "")
                     for c in f.citations) or "none"


def _unchecked(c: Citation) -> str:
    return "" if c.kind is CitationKind.SOURCE else " (the worker's words, not checked)"


def _audit_lines(data: ReportData) -> list[str]:
    """What checks the run's log: its root and keys, and the command that verifies it against them."""
    if not data.audit_root:
        return []
    lines = [f"Root of the audit log (RFC 6962, base64): `{data.audit_root}`"]
    if data.audit_key:
        lines.append(f"Log key: `{data.audit_key}`")
    witness = data.extra.get("audit witness")
    if witness:
        lines.append(f"Witness: `{witness}`")
    if data.audit_key:
        alone = "" if witness else " --no-witness"  # a log no witness cosigned verifies only when told so
        lines.append(f"Check it: `swarmyard audit verify runs/{data.run_id} --log-key '{data.audit_key}'{alone}`")
    return lines


def _cite_link(f: Finding) -> str:
    e = html_shown  # control characters as U+FFFD too: the page is read in terminals
    links = [f"{e(c.kind.value)} {e(c.ref)} <q>{e(c.quote)}</q>{e(_unchecked(c))}" if c.quote else  # no anchor
             f'<a href="#{"post-" + e(c.ref) if c.kind.value == "post" else e(c.ref)}">{e(c.kind.value)} {e(c.ref)}</a>'
             for c in f.citations]
    return ", ".join(links) or "none"


def _md_said(text: str) -> str:
    """What a worker or a model wrote, as a Markdown block quote with its HTML escaped: a body's own ``# ...`` or
    ``## Synthesis`` line is not a heading of the report, nor its ``<script>`` markup. Every line break counts
    (``\\r`` and U+2028 end a Markdown line too). Other control characters (ESC, ...) are U+FFFD (``shown``): the
    file is read in terminals too."""
    lines = html.escape(text, quote=False).splitlines() or [""]
    return "\n".join(f"> {shown(line)}".rstrip() for line in lines)


def _md_inline(text: str) -> str:
    """What a worker wrote, on one line of the report (a board post's list item), with its HTML escaped and its
    other control characters (ESC, ...) as U+FFFD (``shown``)."""
    # every line break: CR ends a Markdown line too
    return shown(" ".join(html.escape(text, quote=False).splitlines()))


def markdown(data: ReportData, steps: Steps | None = None) -> str:
    """The report as Markdown. What workers and models wrote (the synthesis, findings, posts) is quoted, so that
    none of it reads as the report's own structure."""
    out = [f"# Run {data.run_id}", "", "## Objective", "", data.goal.objective, "", "## Synthesis", ""]
    out += [_md_said(data.synthesis.body) if data.synthesis else "_No synthesis was written._", ""]
    if data.synthesis:
        out += [f"Cites: {_md_inline(_cites(data.synthesis))}", ""]
    out += ["## Totals", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in _totals(data)] + [""]
    if data.scores is not None:
        out += ["## Scores", "", f"Evaluator: {data.scores.evaluator}", ""]
        if data.scores.public_key:
            out += [f"Its scores verify with its key `{data.scores.public_key}` (`swarmyard evaluator verify`).", ""]
        out += [f"**{_holdout_line(data)}**", ""]
        rows = _score_rows(data)
        out += (["| " + " | ".join(_SCORE_HEAD) + " |", "|---:|---:|---|---|"]
                + ["| " + " | ".join(row) + " |" for row in rows] if rows else ["_No artifact was scored._"]) + [""]
    failed = _failed(data)
    if failed:
        out += ["## Failed tasks", "", "| task | id | tries | why |", "|---|---|---:|---|"]
        # why a task failed may be a worker's words (its agent's stderr), a title a worker's too (a subtask)
        out += [f"| {shown(t.title)} | `{t.id}` | {t.attempts} | {shown(t.result or '-').replace('|', '/')} |"
                for t in failed]
        out += [""]
    summary = _cross_summary(data)
    if summary is not None:
        rows = _cross_rows(data)
        out += ["## Consolidation across groups", "", f"**{summary}**", "", _CROSS_NOTE, ""]
        out += (["| " + " | ".join(_CROSS_HEAD) + " |", "|---:|---|---|---:|---:|---|---|"]
                + ["| " + " | ".join(row) + " |" for row in rows] if rows else ["_No group worked after a broadcast._"])
        out += [""]
    out += ["## Per worker", "", "| " + " | ".join(_WORKER_HEAD) + " |", "|---|---:|---:|---:|---:|"]
    out += ["| " + " | ".join(row) + " |" for row in _worker_rows(data)] + [""]
    out += ["## Findings", ""]
    for f in data.findings:
        if data.synthesis and f.id == data.synthesis.id:
            continue
        out += [
            f"### {_md_inline(f.title)}",
            "",
            f"`{f.id}` by {f.author} (group {f.group}, task {f.task_id})",
            "",
            _md_said(f.body),
            "",
            f"Citations: {_md_inline(_cites(f))}",
            "",
        ]
    out += (
        ["## Board", ""]
        + [f"- **{p.seq}** [{p.kind.value}] {p.author} ({p.group}): {_md_inline(p.body)}" for p in data.posts]
        + [""]
    )
    out += ["## Charts", "", "![Worker timeline](timeline.png)", "",
            "![Calls, tokens and spend per worker](spend.png)", ""]
    out += markdown_steps(data, steps or {})
    audit = _audit_lines(data)
    if audit:
        out += ["## Audit", "", *[f"- {line}" for line in audit], ""]
    return "\n".join(out)


def report_series(data: ReportData) -> dict[str, Any]:
    """The charts' data of a run (``swarmyard.report.series``): the evaluator's search scores, else the findings'."""
    start = data.goal.created_at
    points = [(p.at_s, p.score, p.worker) for p in data.scores.search] if data.scores is not None else []
    source = "evaluator"
    if not points:
        source = "findings"
        points = [(f.created_at - start, f.score, f.author) for f in data.findings if f.score is not None]
    return run_series(start, data.goal.budget_micro_usd, data.reservations, points, end_s=data.wall_s,
                      score_source=source)


#: The charts' look in the report (the dashboard's app.css says the same for its page).
_CHART_CSS = """#run-charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(440px,1fr));gap:.8rem 1.5rem} .chart-figure{margin:0} .chart-figure figcaption{font-weight:600}
svg.chart{width:100%;height:auto;font-size:11px} svg.chart .axis-line{stroke:#9aa1ad} svg.chart .axis{fill:#687083}
svg.chart .line{fill:none;stroke-width:2} .settled{stroke:#2f6fde;background:#2f6fde}
.held{stroke:#e8a33d;background:#e8a33d} .ceiling{stroke:#c8433a;stroke-dasharray:6 4;background:#c8433a}
.best{stroke:#2e9b5f;fill:none;background:#2e9b5f} svg.chart .dot.best{fill:#2e9b5f}
.flight{stroke:#7b4fc4;background:#7b4fc4} .legend{display:flex;flex-wrap:wrap;gap:1em;font-size:.85em;color:#687083}
.legend .key{display:inline-block;width:1.4em;height:3px;margin-right:.35em;vertical-align:middle}"""


def _charts_section(data: ReportData) -> str:
    """The run's charts, drawn in the page by the dashboard's own charts.js from the series embedded beside it
    (nothing fetched: the report stays one self-contained file)."""
    # every '<' as \u003c: '</' would end the script element, and '<!--<script' (a model's name) put the HTML parser
    # in its double-escaped state, where the element's end is not seen: the charts and the rest of the page were
    # read as script text
    series = json.dumps(report_series(data), separators=(",", ":")).replace("<", "\\u003c")
    script = resources.files("swarmyard.plane").joinpath("ui", "charts.js").read_text(encoding="utf-8")
    return (f'<section id="charts-over-time"><h2>Over time</h2><div id="run-charts">'
            f"<noscript>These charts are drawn by the page's script.</noscript></div>"
            f'<script type="application/json" id="series-data">{series}</script>'
            f"<script>{script}</script></section>\n")


def _img(png: bytes, alt: str, ident: str) -> str:
    return f'<img id="{ident}" alt="{alt}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def html_page(data: ReportData, timeline: bytes, spend: bytes, steps: Steps | None = None) -> str:
    """The report as one self-contained HTML page (charts inline)."""
    e = html_shown  # control characters as U+FFFD too: the page is read in terminals
    row_of = {s.worker_id: s.row for s in data.spans}
    start = data.goal.created_at
    findings = "".join(
        f'<article class="finding" id="{e(f.id)}"><h3>{e(f.title)}</h3>'
        f'<p class="meta">{e(f.id)} by {e(row_of.get(f.author, f.author))} (group {e(f.group)}, '
        f"{f.created_at - start:.1f} s{f', score {f.score}' if f.score is not None else ''})</p>"
        f"<div class=\"body\">{e(f.body)}</div><p>Citations: {_cite_link(f)}</p></article>"
        for f in data.findings
        if not (data.synthesis and f.id == data.synthesis.id)
    )
    board = "".join(
        f'<tr id="post-{p.seq}"><td>{p.seq}</td><td>{p.created_at - start:.1f} s</td><td>{e(p.kind.value)}</td>'
        f"<td>{e(row_of.get(p.author, p.author))}</td><td>{e(p.group)}</td><td class=\"body\">{e(p.body)}</td></tr>"
        for p in data.posts
    )
    audit = "".join(f"<li>{e(line)}</li>" for line in _audit_lines(data))
    totals = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _totals(data))
    per_worker = "<tr>" + "".join(f"<th>{e(h)}</th>" for h in _WORKER_HEAD) + "</tr>" + "".join(
        "<tr>" + "".join(f"<td>{e(cell)}</td>" for cell in row) + "</tr>" for row in _worker_rows(data))
    synthesis = e(data.synthesis.body) if data.synthesis else "No synthesis was written."
    failed = "".join(f"<tr><td>{e(t.title)}</td><td>{e(t.id)}</td><td>{t.attempts}</td><td>{e(t.result or '-')}</td>"
                     "</tr>" for t in _failed(data))
    scores_section = ""
    if data.scores is not None:
        rows = "".join("<tr>" + "".join(f"<td>{e(cell)}</td>" for cell in row) + "</tr>" for row in _score_rows(data))
        head = "<tr>" + "".join(f"<th>{e(h)}</th>" for h in _SCORE_HEAD) + "</tr>"
        table = f"<table>{head}{rows}</table>" if rows else "<p>No artifact was scored.</p>"
        key = (f"<p>Its scores verify with its key <code>{e(data.scores.public_key)}</code>.</p>"
               if data.scores.public_key else "")
        scores_section = (f'<section id="scores"><h2>Scores</h2><p>Evaluator: {e(data.scores.evaluator)}</p>{key}'
                          f'<p class="holdout"><b>{e(_holdout_line(data) or "")}</b></p>{table}</section>\n')
    cross_section = ""
    summary = _cross_summary(data)
    if summary is not None:
        rows = "".join("<tr>" + "".join(f"<td>{e(cell)}</td>" for cell in row) + "</tr>" for row in _cross_rows(data))
        head = "<tr>" + "".join(f"<th>{e(h)}</th>" for h in _CROSS_HEAD) + "</tr>"
        cross_section = (f'<section id="cross-group"><h2>Consolidation across groups</h2><p><b>{e(summary)}</b></p>'
                         f"<p>{e(_CROSS_NOTE)}</p><table>{head}{rows}</table></section>\n")
    failed_section = (f'<section id="failed"><h2>Failed tasks</h2><table><tr><th>task</th><th>id</th>'
                      f"<th>tries</th><th>why</th></tr>{failed}</table></section>\n" if failed else "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>swarmyard run {e(data.run_id)}</title>
<style>body{{font-family:sans-serif;max-width:64rem;margin:2rem auto;padding:0 1rem;color:#1d2330}}
pre,.body{{white-space:pre-wrap;word-break:break-word}} img{{max-width:100%}}
table{{border-collapse:collapse}}th,td{{text-align:left;padding:.2rem .8rem;vertical-align:top}}
#board td{{border-bottom:1px solid #e3e6ec}} .finding{{border-left:3px solid #1565c0;padding:.1rem 1rem;margin:1rem 0}}
details{{margin:.4rem 0}} summary{{cursor:pointer;font-weight:600}} .malformed pre{{background:#fbeceb}}
pre{{background:#f3f4f7;padding:.3rem .5rem}} code{{word-break:break-all}}
.meta{{color:#555}}
{_CHART_CSS}</style></head><body>
<h1>Run {e(data.run_id)}</h1>
<section id="objective"><h2>Objective</h2><p>{e(data.goal.objective)}</p></section>
<section id="synthesis"><h2>Synthesis</h2><pre>{synthesis}</pre></section>
<section id="totals"><h2>Totals</h2><table>{totals}</table></section>
{_charts_section(data)}{scores_section}{cross_section}{failed_section}<section id="workers"><h2>Per worker</h2><table>{per_worker}</table></section>
<section id="charts"><h2>Charts</h2>{_img(timeline, "Worker timeline", "timeline")}
{_img(spend, "Calls, tokens and spend per worker", "spend")}</section>
<section id="findings"><h2>Findings</h2>{findings}</section>
<section id="board"><h2>Board</h2><table><tr><th>#</th><th>at</th><th>kind</th><th>author</th><th>group</th>
<th>post</th></tr>{board}</table></section>
{html_steps(data, steps or {})}
<section id="audit"><h2>Audit</h2><ul>{audit or "<li>No audit root was recorded.</li>"}</ul></section>
</body></html>
"""


def write_report(data: ReportData, out_dir: Path) -> ReportFiles:
    """Write the Markdown, the HTML and the two chart images into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = load_steps(out_dir / "agents")
    timeline, spend = timeline_png(data, steps), spend_png(data)
    files = ReportFiles(
        out_dir / "report.md", out_dir / "report.html", out_dir / "timeline.png", out_dir / "spend.png"
    )
    files.timeline.write_bytes(timeline)
    files.spend.write_bytes(spend)
    files.markdown.write_text(markdown(data, steps), encoding="utf-8")
    files.html.write_text(html_page(data, timeline, spend, steps), encoding="utf-8")
    return files
