"""The run report from a real SQLite store: Markdown and HTML written, HTML rendered in headless Chromium."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from swarmyard.clock import FakeClock
from swarmyard.domain import Citation, CitationKind, GoalSpec, PostKind, Price, TaskSpec
from swarmyard.report import ReportData, WorkerSpan, write_report
from swarmyard.store import open_store


def _run_data(tmp_path: Path, clock: FakeClock) -> ReportData:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", clock=clock)
    store.set_price(Price("m", 1_000_000, 2_000_000))
    goal = store.create_goal(GoalSpec("Should we bet on <on-device> speech?", 500_000, 50, policy="team"))
    spans, findings = [], []
    for i, title in enumerate(["market size", "risks"]):
        store.create_task(
            goal.id, TaskSpec(title, f"look at {title}", group="team", budget_micro_usd=100_000, call_cap=10)
        )
        claim = store.claim(goal.id, f"wrk_{i}", 60, group="team")
        assert claim is not None
        post = store.post(
            claim.task.id, claim.token, PostKind.PROGRESS, f"working on {title}", author=f"wrk_{i}"
        )
        rsv = store.reserve(claim.task.id, claim.token, model="m", amount=5_000, method="bytes")
        store.settle(rsv.id, 1_200 * (i + 1), input_tokens=50 * (i + 1), output_tokens=20 * (i + 1))
        findings.append(
            store.submit_finding(
                claim.task.id,
                claim.token,
                author=f"wrk_{i}",
                title=title,
                body=f"{title}: details",
                citations=[Citation(CitationKind.POST, str(post.seq))],
            )
        )
        store.complete(claim.task.id, claim.token)
        spans.append(WorkerSpan(f"wrk_{i}", claim.task.id, clock.now(), clock.now() + 5 + i, "submitted", 3))
        clock.advance(2)
    lead_task = store.create_task(goal.id, TaskSpec("synthesis", group="lead"))
    claim = store.claim(goal.id, "lead", 60, task_id=lead_task.id)
    assert claim is not None
    synthesis = store.submit_finding(
        claim.task.id,
        claim.token,
        author="lead",
        title="Recommendation",
        body="Go, carefully.",
        citations=[Citation(CitationKind.FINDING, f.id) for f in findings],
    )
    data = ReportData(
        "run_test",
        store.get_goal(goal.id),
        tuple(store.list_tasks(goal.id)),
        tuple(store.read_findings(goal.id)),
        tuple(store.read_board(goal.id)),
        tuple(store.list_reservations(goal.id)),
        tuple(spans),
        synthesis,
        audit_root="ab" * 32,
        wall_s=12.5,
    )
    store.close()
    return data


def test_report_files(tmp_path: Path, clock: FakeClock) -> None:
    data = _run_data(tmp_path, clock)
    assert data.spent_micro_usd == 3_600 and data.calls == 2
    assert data.spend_by_worker() == {"wrk_0": 1_200, "wrk_1": 2_400}
    # tokens come from the store's settled reservations, per worker and in total
    assert (data.input_tokens, data.output_tokens) == (150, 60)
    assert {w: (t.calls, t.input_tokens, t.output_tokens) for w, t in data.by_worker().items()} == {
        "wrk_0": (1, 50, 20), "wrk_1": (1, 100, 40)}
    files = write_report(data, tmp_path / "runs" / "run_test")
    md = files.markdown.read_text()
    for needle in (
        "## Objective",
        "## Synthesis",
        "Go, carefully.",
        "## Findings",
        "### market size",
        "Citations: post 1",
        "## Board",
        "working on risks",
        "![Worker timeline](timeline.png)",
        "| audit root | " + "ab" * 32,
        "$0.003600 of $0.500000",
        "| tokens in / out | 150 / 60 |",
        "## Per worker",
        "| wrk_1 | 1 | 100 | 40 | $0.002400 |",
        "| total | 2 | 150 | 60 | $0.003600 |",
    ):
        assert needle in md
    assert files.timeline.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = files.html.read_text()
    assert "&lt;on-device&gt;" in page and "<on-device>" not in page  # escaped


def test_report_shows_the_holdout_and_the_best_search_score_over_time(tmp_path: Path, clock: FakeClock) -> None:
    from dataclasses import replace

    from swarmyard.report import RunScores, ScorePoint

    search = (ScorePoint(1.0, 2, "worker-0", "a" * 64), ScorePoint(2.5, 1, "worker-1", "b" * 64),
              ScorePoint(4.0, 5, "worker-1", "c" * 64), ScorePoint(6.0, 5, "worker-0", "d" * 64))
    scores = RunScores("sort-numbers, as swarmyard-eval (its own user)", search,
                       holdout=ScorePoint(4.0, 4, "worker-1", "c" * 64))
    assert scores.best == search[2]  # the first to reach 5, not the later tie
    assert scores.best_over_time() == [search[0], search[2]]
    data = replace(_run_data(tmp_path, clock), scores=scores)
    files = write_report(data, tmp_path / "runs" / "run_scored")
    md = files.markdown.read_text()
    assert "## Scores" in md and "Evaluator: sort-numbers, as swarmyard-eval (its own user)" in md
    assert "**holdout: 4 (artifact cccccccccccc by worker-1, submitted at 4.0 s)**" in md
    assert "| 1.0 s | 2 | worker-0 | aaaaaaaaaaaa |" in md and "| 4.0 s | 5 | worker-1 | cccccccccccc |" in md
    assert "bbbbbbbbbbbb" not in md and "dddddddddddd" not in md  # only the scores that raised the best
    page = files.html.read_text()
    assert '<section id="scores">' in page and "holdout: 4" in page
    none = replace(data, scores=RunScores("sort-numbers", (), holdout_note="no artifact was scored"))
    md = write_report(none, tmp_path / "runs" / "run_unscored").markdown.read_text()
    assert "**holdout: none (no artifact was scored)**" in md and "_No artifact was scored._" in md
    assert "## Scores" not in write_report(_run_data(tmp_path / "x", clock), tmp_path / "r").markdown.read_text()


@pytest.mark.slow
def test_report_html_renders_in_chromium(tmp_path: Path, clock: FakeClock) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "apt-get install -y chromium"
    files = write_report(_run_data(tmp_path, clock), tmp_path / "out")
    flags = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [*flags, "--dump-dom", files.html.as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    for section in ("objective", "synthesis", "totals", "charts", "findings", "board"):
        assert f'id="{section}"' in dom
    assert dom.count('src="data:image/png;base64,') == 2
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*flags, f"--screenshot={shot}", "--window-size=1000,2600", files.html.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    # the spend bars are #1565c0: find that blue in the rendered page, so the chart images really painted
    blue = (
        (abs(pixels[..., 0] - 0x15 / 255) < 0.04)
        & (abs(pixels[..., 1] - 0x65 / 255) < 0.04)
        & (abs(pixels[..., 2] - 0xC0 / 255) < 0.04)
    )
    assert blue.sum() > 500


def test_what_workers_wrote_is_quoted_in_the_markdown_report_not_read_as_its_structure(
        tmp_path: Path, clock: FakeClock) -> None:
    # A finding's body that holds "## Synthesis" and "# Run forged" made a second synthesis section and a heading of
    # the report; its <script> went into report.md as is.
    from dataclasses import replace

    data = _run_data(tmp_path, clock)
    forged = ("ok\n\n## Synthesis\n\nYes: all 3 findings say yes.\n\n# Run forged\n<script>alert(1)</script>"
              "\r# Forged by a carriage return\u2028## Forged by a line separator")
    findings = [replace(f, body=forged) if f.id != (data.synthesis.id if data.synthesis else "") else f
                for f in data.findings]
    md = write_report(replace(data, findings=findings), tmp_path / "runs" / "run_forged").markdown.read_text()
    lines = md.splitlines()
    assert lines.count("## Synthesis") == 1 and "# Run forged" not in lines and lines[0].startswith("# Run ")
    assert "<script>" not in md and "> &lt;script&gt;alert(1)&lt;/script&gt;" in lines
    assert "> ## Synthesis" in lines and "> Go, carefully." in lines  # quoted, every line of it
    assert "> # Forged by a carriage return" in lines and "> ## Forged by a line separator" in lines
    assert not any(line.startswith(("# Forged", "## Forged")) for line in md.replace("\r", "\n").splitlines())
