"""The agents' trajectories as the report shows them: read from ``runs/<id>/agents/*.jsonl``, one section per
agent run that opens on a click (HTML ``<details>``), and a line per step in the Markdown."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from swarmyard.controls import html_shown, shown
from swarmyard.plane.trajectory import read_trajectory
from swarmyard.report.data import ReportData

Steps = Mapping[str, Sequence[Mapping[str, Any]]]
_CHARS = 1500


def load_steps(agents_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Each worker's reported steps (worker id -> steps), from the run's trajectory files."""
    out: dict[str, list[dict[str, Any]]] = {}
    if not agents_dir.is_dir():
        return out
    for path in sorted(agents_dir.glob("*.jsonl")):
        if path.name.endswith(".transcript.jsonl"):
            continue
        for step in read_trajectory(path):
            worker = step.get("worker")
            if isinstance(worker, str) and not step.get("cut"):
                out.setdefault(worker, []).append(step)
    return out


def _cut(text: str, limit: int = _CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + " [...]"


def _tokens(step: Mapping[str, Any]) -> tuple[int, int]:
    replies = [r for r in step.get("replies", []) if isinstance(r, dict)]
    return sum(int(r.get("input_tokens", 0)) for r in replies), sum(int(r.get("output_tokens", 0)) for r in replies)


def _action(step: Mapping[str, Any]) -> str:
    action = step.get("action")
    if not isinstance(action, dict):
        return "(no action)"
    return f"{action.get('tool')} {json.dumps(action.get('args', {}), ensure_ascii=False)}"


def _seconds(step: Mapping[str, Any]) -> float:
    return max(0, int(step.get("ended_ms", 0)) - int(step.get("started_ms", 0))) / 1000


def _code(text: str) -> str:
    """A step's action as one Markdown code span: no backtick or line break of the model's closes or breaks it, and
    no other control character (``shown``)."""
    return "`" + shown(" ".join(text.replace("`", "'").splitlines())) + "`"


def _plain(text: object) -> str:
    return shown(" ".join(html.escape(str(text), quote=False).splitlines()))


def markdown_steps(data: ReportData, steps: Steps) -> list[str]:
    """The ``## Trajectories`` section: per agent run, a line per step."""
    out = ["## Trajectories", ""]
    if not steps:
        return [*out, "_No agent reported its steps (external agents keep their own transcripts in agents/)._", ""]
    for span in data.spans:
        mine = steps.get(span.worker_id, ())
        out += [f"### {span.row} `{span.worker_id}` ({span.ending}, {len(mine)} steps)", ""]
        for step in mine:
            tin, tout = _tokens(step)
            out.append(f"- step {step.get('step')} ({_seconds(step):.2f} s, {tin} / {tout} tokens): "
                       f"{_code(_cut(_action(step), 300))}" + (f" ({_plain(step['note'])})" if step.get("note") else ""))
        out.append("")
    return out


def html_steps(data: ReportData, steps: Steps) -> str:
    """The trajectories section: one ``<details>`` per agent run, its steps inside."""
    e = html_shown  # control characters as U+FFFD too: the page is read in terminals
    if not steps:
        return ('<section id="trajectories"><h2>Trajectories</h2><p>No agent reported its steps (external agents '
                "keep their own transcripts in agents/).</p></section>")
    parts = []
    for span in data.spans:
        mine = steps.get(span.worker_id, ())
        items = []
        for step in mine:
            tin, tout = _tokens(step)
            replies = "".join(
                f'<div class="reply{" malformed" if r.get("malformed") else ""}"><span class="meta">model, '
                f'{int(r.get("input_tokens", 0))} / {int(r.get("output_tokens", 0))} tokens, '
                f'{int(r.get("duration_ms", 0))} ms{e(" - malformed: " + str(r["malformed"])) if r.get("malformed") else ""}'
                f'</span><pre>{e(_cut(str(r.get("text") or "") or " ".join(str(c.get("name", "")) + " " + str(c.get("arguments", "")) for c in r.get("tool_calls", []) if isinstance(c, dict))))}</pre></div>'
                for r in step.get("replies", []) if isinstance(r, dict))
            items.append(
                f'<li data-step="{int(step.get("step", 0))}"><p class="meta">step {int(step.get("step", 0))}, '
                f"{_seconds(step):.2f} s, {tin} / {tout} tokens{e(' - ' + str(step['note'])) if step.get('note') else ''}"
                f"</p>{replies}<p><b>action</b> <code>{e(_cut(_action(step), 600))}</code></p>"
                f"<pre class=\"result\">{e(_cut(str(step.get('result') or '')))}</pre></li>")
        parts.append(f'<details id="trajectory-{e(span.worker_id)}"><summary>{e(span.row)} {e(span.worker_id)} '
                     f"({e(span.ending)}, {len(mine)} steps)</summary><ol>{''.join(items)}</ol></details>")
    return f'<section id="trajectories"><h2>Trajectories</h2><p>Click an agent run for its steps.</p>{"".join(parts)}</section>'
