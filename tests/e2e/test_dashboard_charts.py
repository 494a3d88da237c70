"""The charts of a real scored run (``swarmyard run``, scripted provider with prices, the sort-numbers evaluator,
bubblewrap machines), in headless Chromium: on the finished run's dashboard (``swarmyard ui RUN_FOLDER``) and in
its report.html opened from disk with the network cut off. Each chart keeps the figures it drew (``data-points``);
they must equal the series this test computes itself from the store's tables (reservations, scores, goals), read
with sqlite3: settled spend and holds at every change of the ledger, the ceiling, calls in flight, and the best
search score each time it rose. The page also draws what it says: one step line vertex pair per point, a dot per
best score, and a legend.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from rigs.scripted import tool_call as _tool
from rigs.swarm_files import SORT_NUMBERS, SORT_OBJECTIVE, scripted_run

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SWARMYARD = Path(sys.executable).with_name("swarmyard")
SORTER = "import sys\nprint(' '.join(map(str, sorted(map(int, sys.stdin.read().split())))))\n"
HALF = "import sys\nprint(' '.join(sys.stdin.read().split()))\n"  # right only on cases already sorted


def _swarm(folder: Path) -> Path:
    worker = [_tool("submit_artifact", content=HALF), _tool("board_post", body="half sorted"),
              _tool("submit_artifact", content=SORTER),
              _tool("submit_finding", title="sorter", body="A program that sorts its input.")]
    lead = [_tool("submit_finding", title="synthesis", body="The sorter sorts.")]
    return scripted_run(folder, {"scripted-worker": worker, "scripted-lead": lead}, objective=SORT_OBJECTIVE,
                        lens=("sorter", "Submit a sorting program with submit_artifact."), budget_usd="0.05",
                        workers={"exec_timeout_s": 180, "max_steps": 8}, priced=True, bundle=SORT_NUMBERS)


def _expected(db_path: Path) -> dict[str, Any]:
    """The charts' figures, computed here from the tables (not by swarmyard's series code): at every instant the
    ledger changed, what was settled by then and what was held (reserved, and not yet settled or released)."""
    db = sqlite3.connect(db_path)
    (start, budget, settled_total, reserved_total), = db.execute(
        "SELECT created_at, budget, settled, reserved FROM goals").fetchall()
    rows = db.execute("SELECT created_at, updated_at, state, amount, actual FROM reservations").fetchall()
    scores = db.execute("SELECT created_at, score FROM scores WHERE split = 'search' ORDER BY n").fetchall()
    db.close()
    ended = {"settled", "released", "unknown"}
    times = sorted({c - start for c, _, _, _, _ in rows} | {u - start for _, u, s, _, _ in rows if s in ended})
    spend, flight = [], []
    for t in times:
        settled = sum(a or 0 for _, u, s, _, a in rows if s == "settled" and u - start <= t)
        held = sum(m for c, u, s, m, _ in rows
                   if c - start <= t and not (s in ("settled", "released") and u - start <= t))
        flying = sum(1 for c, u, s, _, _ in rows if c - start <= t and not (s in ended and u - start <= t))
        spend.append([t, settled, held])
        flight.append([t, flying])
    best: list[list[Any]] = []
    for created, score in scores:
        if not best or score > best[-1][1]:
            best.append([created - start, score])
    return {"start": start, "ceiling": budget, "spend": spend, "in_flight": flight, "best": best,
            "settled": settled_total, "reserved": reserved_total, "calls": len(rows)}


def _drawn(page: Any) -> dict[str, Any]:
    """What the page's charts drew: their data-points, vertices, dots and legends."""
    return dict(page.evaluate("""() => {
        const fig = (n) => document.getElementById('chart-' + n);
        const verts = (n, cls) => fig(n).querySelector('polyline.' + cls).getAttribute('points').trim().split(/\\s+/).length;
        return {
            spend: JSON.parse(fig('spend').dataset.points), best: JSON.parse(fig('best').dataset.points),
            in_flight: JSON.parse(fig('flight').dataset.points),
            settled_vertices: verts('spend', 'settled'), held_vertices: verts('spend', 'held'),
            flight_vertices: verts('flight', 'flight'),
            ceiling_lines: fig('spend').querySelectorAll('line.ceiling').length,
            dots: [...fig('best').querySelectorAll('circle.dot')].map((c) => [Number(c.dataset.t), Number(c.dataset.score)]),
            legends: ['spend', 'best', 'flight'].map((n) => fig(n).querySelector('.legend').textContent),
            caption: fig('spend').querySelector('figcaption').textContent,
        };
    }"""))


def _check(drawn: dict[str, Any], want: dict[str, Any], label: str) -> None:
    assert drawn["spend"] == want["spend"], label
    assert drawn["in_flight"] == want["in_flight"], label
    assert [[t, s] for t, s, *_ in drawn["best"]] == want["best"], label
    n = len(want["spend"])
    # a step line: the origin, two vertices per change, and the run's end
    assert drawn["settled_vertices"] == drawn["held_vertices"] == drawn["flight_vertices"] == 2 * n + 2, label
    assert drawn["ceiling_lines"] == 1, label
    assert drawn["dots"] == want["best"], label
    assert "settled spend" in drawn["legends"][0] and "ceiling" in drawn["legends"][0], label
    assert "best so far" in drawn["legends"][1] and "not yet answered" in drawn["legends"][2], label
    assert "$0.05" in drawn["caption"], label


def test_the_charts_of_a_scored_run_draw_the_stores_figures_on_the_dashboard_and_in_the_report(
        short_tmp: Path) -> None:
    from playwright.sync_api import sync_playwright

    swarm = _swarm(short_tmp)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "TMPDIR": tempfile.gettempdir(), "SWARMYARD_STATE_DIR": str(short_tmp / "state"),
           "XDG_STATE_HOME": str(short_tmp / "state")}
    done = subprocess.run([str(SWARMYARD), "run", str(swarm), "--no-witness", "--quiet"], cwd=short_tmp, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (short_tmp / "runs").iterdir()
    want = _expected(run_dir / "store.db")
    # the run scored twice (the half sorter, then the sorter: the best rose twice) and spent on every call
    assert [s for _, s in want["best"]][-1] == 5 and len(want["best"]) == 2
    assert want["calls"] >= 5 and want["spend"][-1][1:] == [want["settled"], want["reserved"]] and want["settled"] > 0

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            # report.html from disk, with every request but its own file refused: it needs nothing else
            context = browser.new_context()
            asked: list[str] = []
            context.route("**/*", lambda route: (asked.append(route.request.url), route.abort())
                          if not route.request.url.startswith("file:") else route.continue_())
            report = context.new_page()
            report.goto((run_dir / "report.html").as_uri())
            report.wait_for_selector("#chart-spend")
            _check(_drawn(report), want, "report")
            assert asked == []
            context.close()

            viewer = subprocess.Popen([str(SWARMYARD), "ui", str(run_dir)], cwd=short_tmp, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                assert viewer.stderr is not None
                line = ""
                while "its dashboard on " not in line:
                    line = viewer.stderr.readline()
                    assert line, "swarmyard ui ended before it served"
                served = re.search(r"(http://\S+/ui)\b.*operator token in (.+?)\)", line)
                assert served is not None, line
                url, token = served[1], Path(served[2]).read_text().strip()
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(url)
                page.fill("#token", token)
                page.click("button[type=submit]")
                page.wait_for_selector("#chart-spend")
                _check(_drawn(page), want, "dashboard")
                # the run has ended: nothing is drawn as still waiting
                assert page.locator("#chart-flight .open-calls li").count() == 0
                # counts and filters for tasks as for workers, and a sort that a click turns
                total = page.locator("#tasks tbody tr").count()
                assert page.inner_text("#tasks-count") == f"({total} of {total})"
                assert page.inner_text("#task-filter option[value='all']") == f"all ({total})"
                page.select_option("#task-filter", "done")
                done_rows = page.eval_on_selector_all("#tasks tbody tr", "rs => rs.map(r => r.dataset.state)")
                assert done_rows and set(done_rows) == {"done"}
                assert page.inner_text("#tasks-count") == f"({len(done_rows)} of {total})"
                slots = page.eval_on_selector_all("#workers tbody tr", "rs => rs.map(r => r.dataset.slot)")
                page.click("#workers th[data-sort='calls']")
                calls = page.eval_on_selector_all("#workers tbody tr", "rs => rs.map(r => Number(r.cells[5].textContent))")
                assert calls == sorted(calls)
                assert page.get_attribute("#workers th[data-sort='calls']", "aria-sort") == "ascending"
                page.click("#workers th[data-sort='calls']")
                calls = page.eval_on_selector_all("#workers tbody tr", "rs => rs.map(r => Number(r.cells[5].textContent))")
                assert calls == sorted(calls, reverse=True)
                page.click("#workers th[data-sort='calls']")  # the third click: slot order again
                assert page.eval_on_selector_all("#workers tbody tr", "rs => rs.map(r => r.dataset.slot)") == slots
            finally:
                viewer.terminate()
                viewer.wait(60)
        finally:
            browser.close()
