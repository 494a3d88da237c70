"""The time series the dashboard's and the report's charts draw, read from the store's ledger and scores.

One function, one shape, for both: the dashboard puts it in each state it streams (``state["series"]``), the
report embeds it in ``report.html`` (a JSON script tag); ``swarmyard/plane/ui/charts.js`` draws it in both.

Times are seconds since the goal was created. From the reservations (the ledger of model calls):

- ``spend``: ``[t, settled, held]`` after each change: a call's hold counts from its reservation until it is
  settled (its ``actual`` then counts as settled) or released; a hold still ``held`` or ``unknown`` stays held.
- ``in_flight``: ``[t, n]``: calls reserved and not yet answered (settled or released) nor given up on
  (``unknown``, from the moment it became unknown).
- ``open_calls``: each call still ``held``, with its start: the page draws its elapsed time to now (a live run)
  or to the run's end.

From the evaluator's search scores (or, without an evaluator, the scores findings carry): ``best``, ``[t, score,
who]`` each time the best so far rose.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from swarmyard.domain import Reservation, ReservationState

#: Past this many points a series keeps every k-th one (and its last): a state streamed twice a second must
#: not grow without bound with a long run's calls. The points kept are the store's own figures.
MAX_POINTS = 4000


def _thin(points: list[list[Any]]) -> list[list[Any]]:
    if len(points) <= MAX_POINTS:
        return points
    every = -(-len(points) // MAX_POINTS)
    kept = points[::every]
    return kept if kept[-1] is points[-1] else [*kept, points[-1]]


def run_series(start: float, ceiling_micro_usd: int, reservations: Sequence[Reservation],
               scores: Iterable[tuple[float, int, str]], *, end_s: float | None = None,
               score_source: str = "evaluator") -> dict[str, Any]:
    """The charts' data: ``scores`` as ``(seconds since start, score, who)`` oldest first; ``end_s`` the run's end
    (``None`` while it runs: the page draws to now)."""
    changes: list[tuple[float, int, int, int]] = []  # (t, settled delta, held delta, in-flight delta)
    open_calls: list[dict[str, Any]] = []
    for r in reservations:
        # as plain JSON numbers whatever the store's driver hands back (PostgreSQL's NUMERIC is a Decimal)
        t0, t1, amount = float(r.created_at - start), float(r.updated_at - start), int(r.amount)
        changes.append((t0, 0, amount, 1))
        if r.state is ReservationState.SETTLED:
            changes.append((t1, int(r.actual or 0), -amount, -1))
        elif r.state is ReservationState.RELEASED:
            changes.append((t1, 0, -amount, -1))
        elif r.state is ReservationState.UNKNOWN:
            changes.append((t1, 0, 0, -1))  # no longer in flight; its hold stays until reconciled
        else:
            open_calls.append({"worker": r.worker_id or "-", "model": r.model, "start": t0})
    changes.sort(key=lambda c: c[0])
    spend: list[list[Any]] = []
    flight: list[list[Any]] = []
    settled = held = n = 0
    for i, (t, ds, dh, dn) in enumerate(changes):
        settled, held, n = settled + ds, held + dh, n + dn
        if i + 1 < len(changes) and changes[i + 1][0] == t:
            continue  # one point per instant
        spend.append([t, settled, held])
        flight.append([t, n])
    best: list[list[Any]] = []
    for t, score, who in scores:
        if not best or score > best[-1][1]:
            best.append([float(t), int(score), who])
    last = max([c[0] for c in changes] + [b[0] for b in best], default=0.0)
    return {
        "ceiling": int(ceiling_micro_usd),
        "end": end_s if end_s is None else max(float(end_s), last),
        "spend": _thin(spend),
        "in_flight": _thin(flight),
        "open_calls": open_calls[-200:],
        "best": best,
        "score_source": score_source if best else None,
    }
