"""report.html embeds its charts' series as JSON in a script element; a call still held when the run ended is
listed there with its model's name. A model named ``sim<!--<script>`` (a name the swarm file may give) put the
HTML parser in its double-escaped script state, where the element's end is not seen: the page drew no chart and
lost every section after the charts. Through the console script on the simulated provider (process sandbox): its
answer is slower than the agents' exec timeout, which ends the worker's agent and then the lead's with a call of
each still held, and the run ends there, long before its deadline (a call in flight at the deadline is cut and
its hold is ``unknown``, no longer held). report.html is opened in headless Chromium with every request but its
own file refused: the charts are drawn, both calls are listed with their model's name as written, and the
sections after the charts are there.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SWARMYARD = Path(sys.executable).with_name("swarmyard")
MODEL = "sim<!--<script>"


def test_a_held_calls_model_name_does_not_break_the_reports_page(short_tmp: Path) -> None:
    from playwright.sync_api import sync_playwright

    swarm = short_tmp / "swarm.toml"
    swarm.write_text(f"""
[goal]
objective = "o"
budget_usd = "0.05"
call_cap = 5
deadline_s = 300
[[tasks.lenses]]
title = "t"
prompt = "p"
[workers]
count = 1
concurrency = 1
exec_timeout_s = 8
max_failures = 1
max_steps = 4
model = "{MODEL}"
[lead]
model = "{MODEL}"
[providers.sim]
kind = "simulated"
models = ["{MODEL}"]
latency_s = 200
[providers.sim.prices."{MODEL}"]
input_usd_per_mtok = "2"
output_usd_per_mtok = "8"
[run]
runs_dir = "{short_tmp / 'runs'}"
sandbox = "process"
""")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "XDG_STATE_HOME": str(short_tmp / "state"), "SWARMYARD_STATE_DIR": str(short_tmp / "state")}
    done = subprocess.run([str(SWARMYARD), "run", str(swarm), "--no-witness", "--quiet"], cwd=short_tmp, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]  # no synthesis: the lead's agent timed out
    [run_dir] = (short_tmp / "runs").iterdir()
    db = sqlite3.connect(run_dir / "store.db")
    held = db.execute("SELECT model FROM reservations WHERE state = 'held'").fetchall()
    db.close()
    assert held == [(MODEL,), (MODEL,)]  # the worker's call and the lead's

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            context = browser.new_context()
            asked: list[str] = []
            context.route("**/*", lambda route: (asked.append(route.request.url), route.abort())
                          if not route.request.url.startswith("file:") else route.continue_())
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto((run_dir / "report.html").as_uri())
            assert page.locator("#chart-spend").count() == 1
            listed = page.locator("#chart-flight .open-calls li").all_inner_texts()
            assert len(listed) == 2 and all(MODEL in text for text in listed), listed
            assert page.locator("section#workers").count() == 1
            assert errors == [] and asked == []
        finally:
            browser.close()
