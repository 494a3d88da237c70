"""The dashboard in headless Chromium during and after a real run (``swarmyard run --ui``, scripted provider, bwrap).

Debian's ``chromium`` driven by Playwright for Python (``executable_path``): the browser is refused without a
token and with a worker token, logs in with the operator token, then, without a reload, sees the worker appear,
board posts arrive and the spend change while the run is still going. The screenshot of the dashboard
mid-run is kept in ``$SWARMYARD_TEST_ARTIFACTS`` (default: ``swarmyard-test-artifacts`` in the temporary folder), and the time from a
post's ``created_at`` in the store to its row in the page is printed.

When the run ends the same page, never reloaded, shows the finished run read-only (the process keeps serving it
until SIGTERM, then exits with the run's status), with the workers it had live under the same slot names; then
``swarmyard ui RUN_FOLDER`` serves the same workers, trajectories and timeline (bounded by the run: its span is
the same whenever it is looked at), and no operator route. A run whose every upstream answer is dropped shows,
on its finished page, each worker's error code, the failed tasks with their reason, and the reconcile command.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from rigs.scripted import tool_call as _tool
from rigs.swarm_files import scripted_run, simulated_swarm

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SWARMYARD = Path(sys.executable).with_name("swarmyard")


class Lines:
    """A process's stderr read on a thread (its pipe never fills while the test watches a page); ``wait_for``
    blocks until a line holding a text arrives, or the stream ends."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._done = False
        self._stream = proc.stderr
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._stream:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def wait_for(self, text: str, timeout_s: float = 300) -> str:
        with self._cond:
            found = self._cond.wait_for(lambda: self._done or any(text in line for line in self.lines), timeout_s)
            line = next((line for line in self.lines if text in line), None)
        assert found and line is not None, f"no line with {text!r} in:\n{''.join(self.lines)[-3000:]}"
        return line

    def text(self) -> str:
        with self._cond:
            return "".join(self.lines)


def _served(line: str) -> tuple[str, Path]:
    """The dashboard URL and token file of a line that says where a run's dashboard is."""
    found = re.search(r"(http://\S+/ui)\b.*operator token in (.+?)\)", line)
    assert found is not None, line
    return found[1], Path(found[2])


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _login(browser: Any, url: str, token: str) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_selector("#workers tbody tr[data-worker]")
    return page


def _workers(page: Any) -> dict[str, str]:
    """The page's worker rows: worker id -> slot."""
    rows: list[list[str]] = page.eval_on_selector_all(
        "#workers tbody tr[data-worker]", "rows => rows.map(r => [r.dataset.worker, r.dataset.slot])")
    return dict((worker, slot) for worker, slot in rows)


def _finished(page: Any) -> None:
    page.wait_for_function("() => document.getElementById('live').textContent.startsWith('finished')",
                           timeout=300_000)


def _swarm(folder: Path, replies: dict[str, Any] | None = None) -> Path:
    # The worker posts, works a while in its machine (a shell command), posts again, ...: the run has a middle
    # for the browser to watch. Each reply is priced, so the spend moves with every call.
    work = [_tool("board_post", body="first: the market is large")]
    for i in range(2, 5):
        work += [_tool("shell", command="sleep 3; echo measured"), _tool("board_post", body=f"note {i}: still growing")]
    work.append(_tool("submit_finding", title="market", body="Large and growing.", cite=["1"]))
    if replies is None:
        replies = {"scripted-worker": work,
                   "scripted-lead": [_tool("submit_finding", title="synthesis", body="Go: the market is large.")]}
    return scripted_run(folder, replies, workers={"exec_timeout_s": 200, "max_steps": 12}, priced=True)


def test_the_dashboard_shows_a_run_live_behind_the_operator_token_and_the_same_run_once_it_ended(
        short_tmp: Path) -> None:
    from playwright.sync_api import sync_playwright

    artifacts = Path(os.environ.get("SWARMYARD_TEST_ARTIFACTS",
                                    Path(tempfile.gettempdir()) / "swarmyard-test-artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    swarm = _swarm(short_tmp)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "XDG_STATE_HOME": str(short_tmp / "state")}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        proc = subprocess.Popen([str(SWARMYARD), "run", str(swarm), "--ui"], cwd=short_tmp,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        err = Lines(proc)
        try:
            line = err.wait_for("dashboard on ")
            url = line.split()[2]
            token_file = Path(line.split("operator token in ", 1)[1].rstrip(")\n"))
            assert url.startswith("http://127.0.0.1:")
            assert (token_file.stat().st_mode & 0o777) == 0o600
            operator = token_file.read_text().strip()
            page = browser.new_page()

            # no token: the login page, and no data
            answer = page.goto(url)
            assert answer is not None and answer.status == 401
            assert page.locator("form[action='/ui/login']").count() == 1 and page.locator("#workers").count() == 0
            assert httpx.get(url.replace("/ui", "/ui/api/goals")).status_code == 401

            # a wrong token and a worker's token are refused at the form
            page.fill("#token", "not-a-token")
            with page.expect_response(lambda r: r.url.endswith("/ui/login")) as login:
                page.click("button[type=submit]")
            assert login.value.status == 401 and "not a valid operator token" in page.inner_text("#message")
            worker = _worker_token(url, operator)
            page.fill("#token", worker)
            with page.expect_response(lambda r: r.url.endswith("/ui/login")) as login:
                page.click("button[type=submit]")
            assert login.value.status == 403 and "worker token" in page.inner_text("#message")
            assert httpx.get(url.replace("/ui", "/ui/api/goals"),
                             headers={"Authorization": f"Bearer {worker}"}).status_code == 403

            # the operator token: an HttpOnly, SameSite=Strict cookie, then the dashboard itself
            page.fill("#token", operator)
            page.click("button[type=submit]")
            page.wait_for_selector("#workers")
            [cookie] = [c for c in page.context.cookies() if c["name"] == "swarmyard_ui"]
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            assert page.evaluate("document.cookie") == ""  # the page's own script cannot read it
            page.evaluate("window.__loaded = performance.timeOrigin")
            page.evaluate("""() => {
                window.__seen = {};
                new MutationObserver(() => {
                    for (const li of document.querySelectorAll('#board li[data-seq]'))
                        window.__seen[li.dataset.seq] ??= performance.timeOrigin + performance.now();
                }).observe(document.getElementById('board'), {childList: true, subtree: true});
                window.__workers = {};  // every worker row the live page showed, with its slot
                new MutationObserver(() => {
                    for (const tr of document.querySelectorAll('#workers tbody tr[data-worker]'))
                        if (tr.dataset.slot) window.__workers[tr.dataset.worker] = tr.dataset.slot;
                }).observe(document.getElementById('workers'), {childList: true, subtree: true});
            }""")
            page.wait_for_selector("#workers tbody tr[data-worker]")
            first_spend = page.inner_text("#spend")
            seqs_at_start = set(page.eval_on_selector_all("#board li[data-seq]", "els => els.map(e => e.dataset.seq)"))
            # progress, not time: a board post this page did not have yet arrives, and the spend moves
            page.wait_for_function("(n) => Object.keys(window.__seen).length > n", arg=len(seqs_at_start),
                                   timeout=120_000)
            page.wait_for_function("(s) => document.getElementById('spend').textContent !== s", arg=first_spend,
                                   timeout=120_000)
            assert proc.poll() is None, "the run ended before the page could watch it"
            shot = artifacts / "dashboard-mid-run.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            assert page.evaluate("window.__loaded") == page.evaluate("performance.timeOrigin")  # never reloaded
            # a worker's trajectory opens on a click
            page.click("#workers tbody tr:has-text('worker-0')")
            page.wait_for_selector("#steps li[data-step]")
            latency = _post_latency_ms(page, url, operator, seqs_at_start)
            print(f"\ndashboard screenshot: {shot}\nboard post to page: {latency}")
            assert all(ms >= 0 for ms in latency.values())

            # the run ends, and the page left open shows it finished, read-only, without a reload
            _finished(page)
            stays = err.wait_for("its dashboard stays on")
            assert "press Ctrl-C" in stays and _served(stays)[0] == url  # the live one's address, taken again
            assert page.evaluate("window.__loaded") == page.evaluate("performance.timeOrigin")
            assert "read-only" in page.inner_text("#live") and "synthesis" in page.inner_text("#live")
            live_workers: dict[str, str] = page.evaluate("window.__workers")
            ended = _workers(page)
            assert live_workers and all(ended.get(w) == slot for w, slot in live_workers.items())
            # every agent run under its slot (the one worker without a slot is this test's own, issued above)
            assert {"worker-0", "lead"} <= set(ended.values()) and list(ended.values()).count("") <= 1
            span = page.eval_on_selector("#timeline [data-span]", "e => e.dataset.span")
            bars = page.locator("#timeline rect.call").count()
            assert bars >= 2
            totals = err.wait_for("tokens, ")
            wall = float(re.search(r": ([\d.]+) s, ", totals)[1])  # type: ignore[index]
            assert 0 < float(span) <= wall + 1.0, (span, totals)
            assert proc.poll() is None  # it serves until stopped
            page.screenshot(path=str(artifacts / "dashboard-finished.png"), full_page=True)
        finally:
            _stop(proc)
        assert proc.returncode == 0, err.text()[-3000:]
        assert proc.stdout is not None and proc.stdout.read().strip() == "Go: the market is large."

        # later, from the run folder: the same workers, slots, trajectories and timeline; no operator route
        (run_dir,) = (short_tmp / "runs").iterdir()
        viewer = subprocess.Popen([str(SWARMYARD), "ui", str(run_dir)], cwd=short_tmp, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        shown = Lines(viewer)
        try:
            again, token_file = _served(shown.wait_for("its dashboard on "))
            operator = token_file.read_text().strip()
            later = _login(browser, again, operator)
            _finished(later)
            assert _workers(later) == ended
            # filtered by state: the two agent runs have ended; the test's own worker never ran an agent
            assert later.inner_text("#worker-filter option[value='ended']") == "ended (2)"
            later.select_option("#worker-filter", "ended")
            assert set(_workers(later).values()) == {"worker-0", "lead"}
            later.select_option("#worker-filter", "all")
            assert later.eval_on_selector("#timeline [data-span]", "e => e.dataset.span") == span
            assert later.locator("#timeline rect.call").count() == bars
            later.click("#workers tbody tr[data-slot='worker-0']")
            later.wait_for_selector("#steps li[data-step]")
            assert "keeps no trajectories" not in later.inner_text("#steps")
            base = again.removesuffix("/ui")
            auth = {"Authorization": f"Bearer {operator}"}
            assert httpx.get(f"{base}/v1/operator/goals", headers=auth).status_code == 404
            assert httpx.post(f"{base}/v1/operator/goals/x/workers", headers=auth, json={}).status_code == 404
        finally:
            _stop(viewer)
            browser.close()
        assert viewer.returncode == 0, shown.text()


def _worker_token(url: str, operator: str) -> str:
    """A worker token of the run's goal, issued through the operator API on the same address."""
    base = url.removesuffix("/ui")
    auth = {"Authorization": f"Bearer {operator}"}
    goal = httpx.get(f"{base}/v1/operator/goals", headers=auth).json()["goals"][0]["id"]
    issued = httpx.post(f"{base}/v1/operator/goals/{goal}/workers", headers=auth, json={"group": "team", "ttl_s": 600})
    assert issued.status_code == 201, issued.text
    return str(issued.json()["token"])


def _post_latency_ms(page: Any, url: str, operator: str, before: set[str]) -> dict[str, int]:
    """For each post that arrived while the page watched: milliseconds from its write to its row in the page."""
    base = url.removesuffix("/ui")
    auth = {"Authorization": f"Bearer {operator}"}
    goal = httpx.get(f"{base}/v1/operator/goals", headers=auth).json()["goals"][0]["id"]
    posts = httpx.get(f"{base}/v1/operator/goals/{goal}/board", headers=auth).json()["posts"]
    seen: dict[str, float] = page.evaluate("window.__seen")
    return {str(p["seq"]): round(seen[str(p["seq"])] - p["created_at"] * 1000)
            for p in posts if str(p["seq"]) in seen and str(p["seq"]) not in before}



@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "example.com"])
def test_a_dashboard_beyond_loopback_is_refused_before_anything(short_tmp: Path, host: str) -> None:
    swarm = _swarm(short_tmp)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8"}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--ui", "--host", host],
                          cwd=short_tmp, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "beyond loopback" in done.stderr and "--tls-cert" in done.stderr
    assert not (short_tmp / "runs").exists()


def test_a_run_whose_upstream_answers_are_all_dropped_shows_its_errors_and_the_reconcile_command(
        short_tmp: Path) -> None:
    from playwright.sync_api import sync_playwright

    # every answer is lost after the request left: each call is an unknown hold, each agent run fails
    dropped = [{"fail": "after_send"}] * 12
    swarm = _swarm(short_tmp, {"scripted-worker": dropped, "scripted-lead": dropped})
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "XDG_STATE_HOME": str(short_tmp / "state")}
    proc = subprocess.Popen([str(SWARMYARD), "run", str(swarm), "--ui", "--no-witness"], cwd=short_tmp, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = Lines(proc)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            url, token_file = _served(err.wait_for("its dashboard stays on"))
            text = err.text()
            # the terminal: text, not Python bytes; settled apart from held; the way to settle what is held
            assert "b'" not in text and 'b"' not in text, text[-3000:]
            totals = err.wait_for("tokens, ")
            assert "$0.000000 settled, $" in totals and " held; report " in totals, totals
            holds = err.wait_for("left open")
            assert "unknown" in holds and "swarmyard budget reconcile RESERVATION --actual" in holds, holds

            page = _login(browser, url, token_file.read_text().strip())
            _finished(page)
            banner = page.inner_text("#banner")
            assert "The run ended without a synthesis." in banner
            assert "upstream_unknown" in page.inner_text("#error-codes")
            assert "swarmyard budget reconcile" in page.inner_text("#reconcile")
            assert "swarmyard budget show" in page.inner_text("#reconcile")
            assert page.locator("[data-failed-task]").count() == 2  # the lens and the synthesis
            assert "answer was lost" in page.inner_text("[data-failed-task] >> nth=0")
            rows = page.locator("#workers tbody tr[data-worker]")
            assert rows.count() >= 2
            codes = page.eval_on_selector_all("#workers tbody tr[data-worker] td.error code",
                                              "cs => cs.map(c => c.textContent)")
            assert codes and set(codes) == {"upstream_unknown"}, codes
            # the workers' filter counts them by state, and shows only the state chosen
            failed = rows.count()
            assert page.inner_text("#worker-filter option[value='failed']") == f"failed ({failed})"
            assert page.inner_text("#worker-filter option[value='all']") == f"all ({failed})"
            page.select_option("#worker-filter", "failed")
            assert rows.count() == failed
            assert "b'" not in page.inner_text("#workers")
            page.screenshot(path=str(short_tmp / "dropped.png"), full_page=True)
        finally:
            _stop(proc)
            browser.close()
    assert proc.returncode == 1, err.text()[-3000:]  # stopping the dashboard keeps the run's own status

    # runs list: its state, wall time, settled spend apart from what is held
    listed = subprocess.run([str(SWARMYARD), "runs", "list", "--runs-dir", str(short_tmp / "runs"), "--json"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["status"] == "no synthesis" and row["score"] is None and row["wall_s"] > 0
    assert row["settled_micro_usd"] == 0 < row["held_micro_usd"] and row["calls"] >= 2
    table = subprocess.run([str(SWARMYARD), "runs", "list", "--runs-dir", str(short_tmp / "runs")],
                           env={**env, "COLUMNS": "250"}, capture_output=True, text=True, timeout=120)
    header = next(line for line in table.stdout.splitlines() if " run " in line)
    assert [c.strip() for c in header.strip("┃ ").split("┃")][:9] == [
        "run", "state", "score", "wall", "tasks", "calls", "tokens", "spend", "held"], table.stdout
    assert f"{row['wall_s']:.1f} s" in table.stdout and "no synthesis" in table.stdout

    # runs show RUN --ui: the same read-only dashboard, by run id
    shower = subprocess.Popen([str(SWARMYARD), "runs", "show", row["run"], "--runs-dir", str(short_tmp / "runs"),
                               "--ui"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    said = Lines(shower)
    try:
        url, token_file = _served(said.wait_for("its dashboard on "))
        auth = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        goals = httpx.get(url.replace("/ui", "/ui/api/goals"), headers=auth)
        assert goals.status_code == 200 and [g["id"] for g in goals.json()["goals"]] == [row["goal"]]
        state = httpx.get(url.replace("/ui", "/ui/api/state"), params={"goal": row["goal"]}, headers=auth).json()
        assert state["run"]["finished"] and state["holds"]["unknown"] == row["calls"]
    finally:
        _stop(shower)
    assert shower.returncode == 0, said.text()


def test_a_call_in_flight_grows_on_the_timeline_while_it_waits(short_tmp: Path) -> None:
    """A model call that takes a while (the simulated provider's latency) is drawn from its start to now, and
    its bar grows on the page between two states of the store (the page draws the timeline again every second).

    Only the worker's model is slow (its step is three calls, 24 s to watch): the lead's six calls, which the
    page does not need to watch, are answered at once (at 8 s each they were most of the test's time)."""
    from playwright.sync_api import sync_playwright

    path = simulated_swarm(short_tmp, objective="Wait for a slow model", lenses=[("slow", "Say one fact.")],
                           workers={"count": 1, "concurrency": 1, "max_steps": 1}, lead={"max_steps": 2},
                           latency_s=8, fast_lead=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "XDG_STATE_HOME": str(short_tmp / "state")}
    proc = subprocess.Popen([str(SWARMYARD), "run", str(path), "--ui", "--no-witness"], cwd=short_tmp, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = Lines(proc)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            line = err.wait_for("dashboard on ")
            url, token_file = line.split()[2], Path(line.split("operator token in ", 1)[1].rstrip(")\n"))
            page = _login(browser, url, token_file.read_text().strip())
            page.wait_for_selector("#timeline rect.in-flight", timeout=120_000)
            first = float(page.get_attribute("#timeline rect.in-flight", "width") or 0)
            # progress: the same call, still held, is drawn wider as it waits
            page.wait_for_function("(w) => { const r = document.querySelector('#timeline rect.in-flight');"
                                   " return r !== null && Number(r.getAttribute('width')) > w + 2; }",
                                   arg=first, timeout=60_000)
            # once answered it is settled, and no longer drawn to now
            _finished(page)
            assert page.locator("#timeline rect.in-flight").count() == 0
            assert page.locator("#timeline rect.call-settled").count() >= 2
        finally:
            _stop(proc)
            browser.close()
    assert proc.returncode in (0, 1) and "its dashboard stays on" in err.text()  # stopped by SIGTERM, not killed
