"""The report's two pictures, as PNG bytes (matplotlib, Agg): a per-worker timeline of agent runs, their steps
and their model calls; and calls, tokens and spend per worker side by side (meaningful on a free model too)."""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from swarmyard.errors import MissingExtraError
from swarmyard.money import MICRO_PER_USD
from swarmyard.report.data import ReportData

_COLOURS = {
    "submitted": "#2e7d32",
    "step_cap": "#f9a825",
    "budget": "#ef6c00",
    "no_task": "#9e9e9e",
    "lost_claim": "#c62828",
    "timeout": "#c62828",
    "error": "#6a1b9a",
}


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: charts are files
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingExtraError("the run report's charts", "report", "matplotlib") from exc
    return plt


def prepare() -> None:
    """Import matplotlib in a background thread now, so the report at the run's end does not wait for it.

    The import takes half a second on an idle host and seconds on a busy one, and the report is written after the
    run's last event: a run starts this as it starts. Without the ``report`` extra it does nothing here (the
    report says what to install when it is written)."""

    def load() -> None:
        with contextlib.suppress(MissingExtraError):
            _pyplot()

    threading.Thread(target=load, name="report-charts", daemon=True).start()


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    _pyplot().close(fig)
    return buffer.getvalue()


#: Past this many worker rows the timeline gives each row less height and labels only some of them: a figure
#: 0.55 inch a row for hundreds of workers is a tall PNG whose drawing and encoding grow with the run.
_LABELLED_ROWS = 60


def timeline_png(data: ReportData, steps: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> bytes:
    """One row per worker: a pale bar per agent run (its edge coloured by how it ended), a bar per step the
    agent reported inside it (a step that only re-asked is grey), and a tick per model call.

    Drawn as three collections whatever the run's size (not an artist per worker, step or call): the report is
    written after the run's last event, and its time must not grow with the number of workers and calls."""
    plt = _pyplot()
    workers = sorted({s.row for s in data.spans})
    y_of = {worker: y for y, worker in enumerate(workers)}
    start = min((s.started_at for s in data.spans), default=0.0)
    row_of = {s.worker_id: s.row for s in data.spans}
    per_row = 0.55 if len(workers) <= _LABELLED_ROWS else 0.18
    fig, ax = plt.subplots(figsize=(9, 0.6 + per_row * max(1, len(workers))))
    run_boxes: list[tuple[float, float, float]] = []  # (x, width, y)
    run_edges: list[str] = []
    step_boxes: list[tuple[float, float, float]] = []
    step_colours: list[str] = []
    for span in data.spans:
        y = y_of[span.row]
        run_boxes.append((span.started_at - start, max(span.ended_at - span.started_at, 0.01), y))
        run_edges.append(_COLOURS.get(span.ending, "#1565c0"))
        for st in (steps or {}).get(span.worker_id, ()):
            began, ended = int(st.get("started_ms", 0)), int(st.get("ended_ms", 0))
            step_boxes.append((began / 1000 - start, max(ended - began, 10) / 1000, y))
            step_colours.append("#1565c0" if isinstance(st.get("action"), dict) else "#9e9e9e")
    _boxes(ax, run_boxes, 0.4, facecolor="#e8eef9", edgecolors=run_edges, linewidth=1.5)
    _boxes(ax, step_boxes, 0.25, facecolor=step_colours, edgecolors="white", linewidth=0.5)
    ticks = [(r.created_at - start, y_of[row_of[r.worker_id]]) for r in data.reservations
             if r.worker_id in row_of]
    if ticks:
        ax.vlines([x for x, _ in ticks], [y + 0.28 for _, y in ticks], [y + 0.4 for _, y in ticks],
                  color="#ef6c00", linewidth=1)
    every = max(1, -(-len(workers) // _LABELLED_ROWS))
    ax.set_yticks(range(0, len(workers), every), labels=workers[::every])
    ax.set_xlabel("seconds since the first worker started (bars: agent runs and their steps; ticks: model calls)")
    ax.set_title("Worker timeline")
    ax.autoscale_view()
    ax.invert_yaxis()
    return _png(fig)


def _boxes(ax: Any, boxes: Sequence[tuple[float, float, float]], half: float, **style: Any) -> None:
    """Rectangles ``(x, width, row)``, ``half`` a row high either side of its centre, as one collection."""
    if not boxes:
        return
    from matplotlib.collections import PolyCollection

    ax.add_collection(PolyCollection(
        [[(x, y - half), (x, y + half), (x + w, y + half), (x + w, y - half)] for x, w, y in boxes], **style))


def spend_png(data: ReportData) -> bytes:
    """Model calls, tokens (in and out) and spend per worker, side by side: on a free model the first two still
    say who did the work. Each series is one collection, whatever the number of workers (see ``timeline_png``)."""
    plt = _pyplot()
    totals = data.by_worker()
    names = list(totals) or ["(no calls)"]
    # margins set here, not by tight_layout: that draws the whole figure once more before savefig draws it
    fig, (calls, tokens, spend) = plt.subplots(1, 3, figsize=(11, 3.2))
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.25, top=0.9, wspace=0.3)
    calls_of = [totals[n].calls if n in totals else 0 for n in names]
    _columns(calls, calls_of, color="#1565c0")
    calls.set_title("Model calls per worker")
    calls.yaxis.get_major_locator().set_params(integer=True)
    ins = [totals[n].input_tokens if n in totals else 0 for n in names]
    outs = [totals[n].output_tokens if n in totals else 0 for n in names]
    _columns(tokens, ins, color="#90caf9", label="in")
    _columns(tokens, outs, bottom=ins, color="#1565c0", label="out")
    tokens.set_title("Tokens per worker")
    tokens.legend(fontsize="small")
    values = [totals[n].spent_micro_usd / MICRO_PER_USD if n in totals else 0 for n in names]
    _columns(spend, values, color="#2e7d32")
    spend.set_title("Spend per worker (USD)")
    if not any(values):
        spend.text(0.5, 0.5, "$0: no priced call", ha="center", va="center", transform=spend.transAxes,
                   color="#555555")
    # a third of the figure's width holds about a dozen rotated names; hundreds are unreadable and slow to draw
    every = max(1, -(-len(names) // 12))
    for ax in (calls, tokens, spend):
        ax.set_xticks(range(0, len(names), every), labels=names[::every])
        ax.tick_params(axis="x", labelrotation=30)
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.set_ylim(bottom=0)
    return _png(fig)


def _columns(ax: Any, heights: Sequence[float], *, bottom: Sequence[float] | None = None, color: str,
             label: str | None = None) -> None:
    """A bar per worker (0.8 wide at x = 0, 1, ...) as one collection, on ``bottom`` when stacked."""
    from matplotlib.collections import PolyCollection

    base = bottom or [0.0] * len(heights)
    ax.add_collection(PolyCollection(
        [[(i - 0.4, b), (i - 0.4, b + h), (i + 0.4, b + h), (i + 0.4, b)]
         for i, (b, h) in enumerate(zip(base, heights, strict=True))], facecolor=color, label=label))
    ax.autoscale_view()
