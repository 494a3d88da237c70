"""The charts' series (swarmyard.report.series) from a real SQLite store's ledger, and report.html carrying them
with the script that draws them (nothing fetched)."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

from swarmyard.clock import FakeClock
from swarmyard.domain import GoalSpec, Price, TaskSpec
from swarmyard.plane.dashboard import RunFacts, goal_state
from swarmyard.report import ReportData, write_report
from swarmyard.report.render import report_series
from swarmyard.report.series import run_series
from swarmyard.store import open_store


def test_spend_holds_and_calls_in_flight_follow_the_ledger(tmp_path: Path, clock: FakeClock) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=clock)
    store.set_price(Price("m", 1_000_000, 2_000_000))
    goal = store.create_goal(GoalSpec("chart me", 500_000, 50, policy="team"))
    store.create_task(goal.id, TaskSpec("t", "p", group="team", budget_micro_usd=100_000, call_cap=10))
    claim = store.claim(goal.id, "wrk_0", 60, group="team")
    assert claim is not None
    clock.advance(1)
    a = store.reserve(claim.task.id, claim.token, model="m", amount=5_000, method="bytes")  # t=1
    clock.advance(1)
    b = store.reserve(claim.task.id, claim.token, model="m", amount=3_000, method="bytes")  # t=2
    clock.advance(2)
    store.settle(a.id, 1_200, input_tokens=10, output_tokens=5)  # t=4
    clock.advance(1)
    store.release_reservation(b.id)  # t=5
    clock.advance(1)
    c = store.reserve(claim.task.id, claim.token, model="m", amount=2_000, method="bytes")  # t=6
    clock.advance(1)
    d = store.reserve(claim.task.id, claim.token, model="m", amount=1_000, method="bytes")  # t=7
    clock.advance(1)
    store.mark_unknown(d.id)  # t=8
    reservations = store.list_reservations(goal.id)
    series = run_series(goal.created_at, goal.budget_micro_usd, reservations,
                        [(1.0, 3, "w"), (2.0, 2, "w"), (3.0, 7, "v")])
    assert series["ceiling"] == 500_000 and series["end"] is None
    assert series["spend"] == [[1.0, 0, 5_000], [2.0, 0, 8_000], [4.0, 1_200, 3_000], [5.0, 1_200, 0],
                               [6.0, 1_200, 2_000], [7.0, 1_200, 3_000], [8.0, 1_200, 3_000]]
    assert series["in_flight"] == [[1.0, 1], [2.0, 2], [4.0, 1], [5.0, 0], [6.0, 1], [7.0, 2], [8.0, 1]]
    assert series["open_calls"] == [{"worker": c.worker_id or "-", "model": "m", "start": 6.0}]
    assert series["best"] == [[1.0, 3, "w"], [3.0, 7, "v"]]  # only the scores that raised the best
    # the last point is the goal's own envelope: settled, and held (the held call and the unknown one)
    final = store.get_goal(goal.id).envelope
    assert series["spend"][-1][1:] == [final.settled, final.reserved]
    # a finished run's series ends with the run (never before its last change)
    assert run_series(goal.created_at, 1, reservations, [], end_s=20.0)["end"] == 20.0
    assert run_series(goal.created_at, 1, reservations, [], end_s=3.0)["end"] == 8.0
    # the dashboard's state carries the same series
    state = goal_state(store, goal.id, facts=RunFacts(True, goal.created_at + 9, "synthesis", "run_x"))
    assert state["series"]["spend"] == series["spend"] and state["series"]["end"] == 9.0
    assert state["series"]["best"] == [] and state["series"]["score_source"] is None
    data = ReportData("run_x", store.get_goal(goal.id), tuple(store.list_tasks(goal.id)), (), (),
                      tuple(reservations), wall_s=9.0)
    store.close()
    files = write_report(data, tmp_path / "runs" / "run_x")
    page = files.html.read_text()
    embedded = re.search(r'<script type="application/json" id="series-data">(.*?)</script>', page, re.S)
    assert embedded is not None and json.loads(embedded[1]) == report_series(data)
    assert json.loads(embedded[1])["spend"] == series["spend"]
    script = resources.files("swarmyard.plane").joinpath("ui", "charts.js").read_text(encoding="utf-8")
    assert "</" not in script and f"<script>{script}</script>" in page  # inline, as shipped
    assert not re.search(r'(src|href)="https?:', page)  # nothing fetched


def test_a_long_series_is_thinned_to_the_store_figures_it_keeps() -> None:
    from swarmyard.domain import Reservation, ReservationState
    from swarmyard.report import series as module

    rs = [Reservation(f"r{i}", "g", "t", "m", 10, 7, ReservationState.SETTLED, "bytes", float(i), i + 0.5)
          for i in range(3_000)]
    s = run_series(0.0, 100_000, rs, [])
    assert len(s["spend"]) <= module.MAX_POINTS + 1
    assert s["spend"][-1] == [2_999.5, 21_000, 0]  # the last point is always kept
    full = {p[0]: p for p in run_series(0.0, 100_000, rs[:1_000], [])["spend"]}
    assert all(full.get(p[0], p) == p for p in s["spend"] if p[0] < 999)  # every kept point is a true one
