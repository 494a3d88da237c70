"""The report's two pictures: a per-worker timeline and a spend chart, as PNG bytes (matplotlib, Agg)."""

from __future__ import annotations

import io
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


def timeline_png(data: ReportData) -> bytes:
    """One row per worker, one bar per agent run, coloured by how it ended."""
    plt = _pyplot()
    workers = sorted({s.row for s in data.spans})
    start = min((s.started_at for s in data.spans), default=0.0)
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * max(1, len(workers))))
    for row, worker in enumerate(workers):
        spans = [s for s in data.spans if s.row == worker]
        bars = [(s.started_at - start, max(s.ended_at - s.started_at, 0.01)) for s in spans]
        ax.broken_barh(bars, (row - 0.35, 0.7), facecolors=[_COLOURS.get(s.ending, "#1565c0") for s in spans])
    ax.set_yticks(range(len(workers)), labels=workers)
    ax.set_xlabel("seconds since the first worker started")
    ax.set_title("Worker timeline")
    ax.invert_yaxis()
    return _png(fig)


def spend_png(data: ReportData) -> bytes:
    """Settled spend per worker in USD."""
    plt = _pyplot()
    spend = data.spend_by_worker()
    names = sorted(spend) or ["(no spend)"]
    values = [spend.get(n, 0) / MICRO_PER_USD for n in names]
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.bar(names, values, color="#1565c0")
    ax.set_ylabel("USD")
    ax.set_title("Spend per worker")
    ax.tick_params(axis="x", labelrotation=30)
    return _png(fig)
