"""The live dashboard in headless Chromium during a real run (``swarmyard run --ui``, scripted provider, bwrap).

Debian's ``chromium`` driven by Playwright for Python (``executable_path``): the browser is refused without a
token and with a worker token, logs in with the operator token, then, without a reload, sees the worker appear,
board posts arrive and the spend change while the run is still going. The screenshot of the dashboard
mid-run is kept in ``$SWARMYARD_TEST_ARTIFACTS`` (default: ``swarmyard-test-artifacts`` in the temporary folder), and the time from a
post's ``created_at`` in the store to its row in the page is printed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/test installs it)"),
]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-ui-"))  # the plane's socket lives in the run folder: keep it short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _tool(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def _swarm(folder: Path) -> Path:
    conf = folder / "conf"
    conf.mkdir()
    # The worker posts, works a while in its machine (a shell command), posts again, ...: the run has a middle
    # for the browser to watch. Each reply is priced, so the spend moves with every call.
    work = [_tool("board_post", body="first: the market is large")]
    for i in range(2, 5):
        work += [_tool("shell", command="sleep 3; echo measured"), _tool("board_post", body=f"note {i}: still growing")]
    work.append(_tool("submit_finding", title="market", body="Large and growing.", cite=["1"]))
    (conf / "replies.json").write_text(json.dumps({
        "scripted-worker": work,
        "scripted-lead": [_tool("submit_finding", title="synthesis", body="Go: the market is large.")],
    }))
    path = conf / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "Should a small team build a speech app?"
budget_usd = "1"
call_cap = 50
deadline_s = 300
[[tasks.lenses]]
title = "market"
prompt = "Size the market."
[workers]
count = 1
concurrency = 1
exec_timeout_s = 200
max_steps = 12
model = "scripted-worker"
[lead]
model = "scripted-lead"
[providers.script]
kind = "scripted"
models = ["scripted-worker", "scripted-lead"]
replies = "replies.json"
[providers.script.prices.scripted-worker]
input_usd_per_mtok = "2"
output_usd_per_mtok = "8"
[providers.script.prices.scripted-lead]
input_usd_per_mtok = "2"
output_usd_per_mtok = "8"
[run]
runs_dir = "{folder / 'runs'}"
sandbox = "local"
""")
    return path


def _announced(proc: subprocess.Popen[str]) -> tuple[str, Path]:
    """The dashboard URL and token file from the run's stderr (read line by line until it says them)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("dashboard on "):
            url = line.split()[2]
            token_file = Path(line.split("operator token in ", 1)[1].rstrip(")\n"))
            return url, token_file
    raise AssertionError(f"the run never announced its dashboard (exit {proc.wait()})")


def test_the_dashboard_shows_a_run_live_behind_the_operator_token(short_tmp: Path) -> None:
    from playwright.sync_api import sync_playwright

    artifacts = Path(os.environ.get("SWARMYARD_TEST_ARTIFACTS",
                                    Path(tempfile.gettempdir()) / "swarmyard-test-artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    swarm = _swarm(short_tmp)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "XDG_STATE_HOME": str(short_tmp / "state")}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        proc = subprocess.Popen([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--ui"], cwd=short_tmp,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            url, token_file = _announced(proc)
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
        finally:
            out, err = proc.communicate(timeout=300)
            browser.close()
    assert proc.returncode == 0, err[-3000:]
    assert out.strip() == "Go: the market is large."


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
