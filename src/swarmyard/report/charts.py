"""The report's two pictures, as PNG bytes (matplotlib, Agg): a per-worker timeline of agent runs, their steps
and their model calls; and calls, tokens and spend per worker side by side (meaningful on a free model too)."""

from __future__ import annotations

import io
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


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    _pyplot().close(fig)
    return buffer.getvalue()


def timeline_png(data: ReportData, steps: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> bytes:
    """One row per worker: a pale bar per agent run (its edge coloured by how it ended), a bar per step the
    agent reported inside it (a step that only re-asked is grey), and a tick per model call."""
    plt = _pyplot()
    workers = sorted({s.row for s in data.spans})
    start = min((s.started_at for s in data.spans), default=0.0)
    row_of = {s.worker_id: s.row for s in data.spans}
    fig, ax = plt.subplots(figsize=(9, 0.6 + 0.55 * max(1, len(workers))))
    for row, worker in enumerate(workers):
        spans = [s for s in data.spans if s.row == worker]
        bars = [(s.started_at - start, max(s.ended_at - s.started_at, 0.01)) for s in spans]
        ax.broken_barh(bars, (row - 0.4, 0.8), facecolors="#e8eef9",
                       edgecolors=[_COLOURS.get(s.ending, "#1565c0") for s in spans], linewidth=1.5)
        for span in spans:
            mine = (steps or {}).get(span.worker_id, ())
            step_bars = [(int(st.get("started_ms", 0)) / 1000 - start,
                          max(int(st.get("ended_ms", 0)) - int(st.get("started_ms", 0)), 10) / 1000) for st in mine]
            colours = ["#1565c0" if isinstance(st.get("action"), dict) else "#9e9e9e" for st in mine]
            if step_bars:
                ax.broken_barh(step_bars, (row - 0.25, 0.5), facecolors=colours, edgecolors="white", linewidth=0.5)
    for r in data.reservations:
        row_name = row_of.get(r.worker_id or "")
        if row_name is not None:
            y = workers.index(row_name)
            ax.plot([r.created_at - start] * 2, [y + 0.28, y + 0.4], color="#ef6c00", linewidth=1)
    ax.set_yticks(range(len(workers)), labels=workers)
    ax.set_xlabel("seconds since the first worker started (bars: agent runs and their steps; ticks: model calls)")
    ax.set_title("Worker timeline")
    ax.invert_yaxis()
    return _png(fig)


def spend_png(data: ReportData) -> bytes:
    """Model calls, tokens (in and out) and spend per worker, side by side: on a free model the first two still
    say who did the work."""
    plt = _pyplot()
    totals = data.by_worker()
    names = list(totals) or ["(no calls)"]
    fig, (calls, tokens, spend) = plt.subplots(1, 3, figsize=(11, 3.2))
    calls.bar(names, [totals[n].calls if n in totals else 0 for n in names], color="#1565c0")
    calls.set_title("Model calls per worker")
    calls.yaxis.get_major_locator().set_params(integer=True)
    ins = [totals[n].input_tokens if n in totals else 0 for n in names]
    outs = [totals[n].output_tokens if n in totals else 0 for n in names]
    tokens.bar(names, ins, color="#90caf9", label="in")
    tokens.bar(names, outs, bottom=ins, color="#1565c0", label="out")
    tokens.set_title("Tokens per worker")
    tokens.legend(fontsize="small")
    values = [totals[n].spent_micro_usd / MICRO_PER_USD if n in totals else 0 for n in names]
    spend.bar(names, values, color="#2e7d32")
    spend.set_title("Spend per worker (USD)")
    if not any(values):
        spend.text(0.5, 0.5, "$0: no priced call", ha="center", va="center", transform=spend.transAxes,
                   color="#555555")
    for ax in (calls, tokens, spend):
        ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    return _png(fig)
