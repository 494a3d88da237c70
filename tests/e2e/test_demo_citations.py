"""The README's demo (``examples/three-scouts.toml``) is grounded: its scouts search files shipped with it and every
quote a finding cites is checked by the plane against the cited file and line before the finding is stored.

Through the door a user uses: ``swarmyard run FILE`` in a subprocess, in real governed bubblewrap machines with
the real textsearch WASI tool. Once on the scripted provider (the shipped double for a paid model), with ``--json``,
whose first scout makes a quote up: the plane refuses the finding with the reason, the scout is asked again with
it and its corrected finding is stored. Once on the embedded Qwen model (``model``, ``slow``), as ``bash
scripts/demo`` runs it: every scout stores one finding, that cites its files (none ends with a no-result
placeholder), every quote of every stored finding is found, by this test, on the cited line of the cited file, and
the synthesis cites those findings and nothing else, each of its claims naming one; the synthesis is what the run
prints on stdout and its last line of stderr is the totals line. In both, every finding and the synthesis hold only
swarmyard's fixed text and quotes found on their lines (``assert_only_template_and_quotes``): no sentence of a
model's.

The model run also holds what a run of the same example on SmolLM2 (two steps a scout) showed: the run's
structure (the three scouts' tasks, one finding each, a synthesis citing them, the report, the totals line).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rigs.demo import demo_swarm
from rigs.model_runs import model_env, run_while_progressing
from swarmyard.agents import quoted
from swarmyard.cli.render import shown
from swarmyard.config import load_config
from swarmyard.domain import CitationKind, Finding, Goal, Task, TaskState
from swarmyard.plane.sources import normalized
from swarmyard.rules import grounding, no_result, quotes
from swarmyard.store import open_store
from swarmyard.wasi.catalog import built_dir

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/test installs it)"),
]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "three-scouts.toml"
SOURCES = EXAMPLES / "three-scouts" / "sources"


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-d-"))  # the plane's socket lives in the run folder: keep it short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _run(folder: Path, swarm: Path) -> subprocess.CompletedProcess[str]:
    # a clean environment, as a user's shell gives: no provider key, never the test runner's own
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm), "--json"], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=600, check=False)


def _line_of(words: str) -> tuple[str, int, str]:
    """The source file, line number and line holding ``words`` (exactly one in the example's sources)."""
    found = [(path.name, number, line) for path in sorted(SOURCES.iterdir())
             for number, line in enumerate(path.read_text().splitlines(), 1) if words in line]
    assert len(found) == 1, (words, found)
    return found[0]


def _tool(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def _findings(run_dir: Path) -> tuple[list[Finding], dict[str, str]]:
    findings, tasks, _ = _run_records(run_dir)
    return findings, {t.id: t.group for t in tasks}


def _run_records(run_dir: Path) -> tuple[list[Finding], list[Task], Goal]:
    """The run's findings, its tasks (every one done) and its goal, from its store."""
    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    try:
        (goal,) = store.list_goals()
        tasks = store.list_tasks(goal.id)
        assert all(t.state is TaskState.DONE for t in tasks), [(t.title, t.state, t.result) for t in tasks]
        return store.read_findings(goal.id, limit=100), tasks, goal
    finally:
        store.close()


def _assert_quotes_on_their_lines(findings: list[Finding]) -> int:
    """Every source citation's quote is on the cited line of the cited file, read here from the example's sources;
    the number of source citations checked."""
    checked = 0
    for finding in findings:
        for citation in finding.citations:
            if citation.kind is not CitationKind.SOURCE:
                continue
            path, _, number = citation.ref.removeprefix("./").removeprefix("task/").rpartition(":")
            lines = (SOURCES / path).read_text().splitlines()
            assert citation.quote.strip() and normalized(citation.quote) in normalized(lines[int(number) - 1]), (
                finding.id, citation)
            checked += 1
    return checked


#: A finding written from the lines the model cited: ``"the line" (path:line); ...``.
_SPAN = quotes.SPAN.pattern.replace("?P<quote>", "?:").replace("?P<ref>", "?:")
_QUOTED_FINDING = re.compile(rf'{_SPAN}(?:; {_SPAN})*')
_POINT = re.compile(r'- (.*) \[(fnd_[0-9a-z]+)\]')


def asked_again(run_dir: Path) -> int:
    """How many times a quoted scout's model was asked again for citing no line its search returned."""
    said = [line for path in sorted((run_dir / "agents" / "messages").glob("*.jsonl"))
            for line in path.read_text().splitlines() if "could not be used (cite the line" in line]
    return len(said)


def _assert_quotes_hold(text: str) -> int:
    """Every ``"quote" (path:line)`` in ``text`` is on that line of the example's sources; how many there are."""
    found = quotes.spans(text)
    for ref, quote in found:
        path, _, number = ref.rpartition(":")
        lines = (SOURCES / path).read_text().splitlines()
        assert quote.strip() and normalized(quote) in normalized(lines[int(number) - 1]), (ref, quote)
    return len(found)


def assert_only_template_and_quotes(scouts: list[Finding], synthesis: Finding, swarm: Path) -> None:
    """Every sentence of every finding and of the synthesis is swarmyard's fixed text or a quote found on the
    line it cites: a scout's finding is its lens's title and ``"quote" (path:line)``; the synthesis is the heading
    with the objective, then per finding the quotes it cites and its id; with nothing else (no verdict, no tally,
    not even a note: every task reached one)."""
    config = load_config(swarm)
    titles = {lens.title for lens in config.tasks.lenses}
    ids = set()
    for finding in scouts:
        assert finding.title in titles, finding.title
        assert _QUOTED_FINDING.fullmatch(finding.body) is not None, finding.body
        assert _assert_quotes_hold(finding.body) >= 1
        cited = {(c.ref, normalized(c.quote)) for c in finding.citations if c.kind is CitationKind.SOURCE}
        assert {(ref, normalized(quote)) for ref, quote in quotes.spans(finding.body)} <= cited, finding
        ids.add(finding.id)
    heading, *points = synthesis.body.splitlines()
    assert heading == quoted.HEADING.format(objective=config.goal.objective), heading
    seen = []
    for point in points:
        shape = _POINT.fullmatch(point)
        assert shape is not None, point
        said, ref = shape.groups()
        assert said == quoted.NO_LINE or quotes.without(said).replace(";", "").strip() == "", point
        assert said == quoted.NO_LINE or _assert_quotes_hold(said) >= 1
        seen.append(ref)
    assert sorted(seen) == sorted(ids)


def test_a_made_up_quote_is_refused_with_the_reason_and_the_corrected_finding_is_stored(short_tmp: Path) -> None:
    assert (built_dir() / "textsearch.wasm").is_file(), "build the WASI tools: python -m swarmyard.wasi.build"
    key_file, key_no, key_line = _line_of("provider key")
    budget_file, budget_no, budget_line = _line_of("afford")
    box_file, box_no, box_line = _line_of("loopback")
    made_up = "The worker keeps a copy of the provider key in its sandbox"
    replies = {
        "scripted-scout": [
            # the first scout searches, then cites words its file does not hold; asked again, it copies the line
            _tool("textsearch", pattern="provider key"),
            # (on a line its search did not return: a searched line is quoted whole, whatever words are given)
            _tool("submit_finding", cite=[f"{key_file}:1: {made_up}"]),
            _tool("submit_finding", cite=[f"{key_file}:{key_no}: {key_line}"]),
            _tool("textsearch", pattern="afford"),
            _tool("submit_finding", cite=[f"{budget_file}:{budget_no}: {budget_line}"]),
            _tool("textsearch", pattern="loopback"),
            # a part of the line is a quote too
            _tool("submit_finding", cite=[f"{box_file}:{box_no}: {box_line.split(':')[0]}"]),
        ],
        "scripted-lead": [],  # the lead's synthesis is written from the findings: no model call
    }
    done = _run(short_tmp, demo_swarm(short_tmp, replies))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["calls"] == 7
    [run_dir] = (short_tmp / "runs").iterdir()
    findings, groups = _findings(run_dir)

    # the refusal: a quoted finding cites only lines its search returned, so the agent asked its model again
    # (the plane's own refusal of a made-up quote, in free mode: test_demo_citations_hostile)
    assert asked_again(run_dir) == 1

    # nothing made up was stored: the first scout's finding is its corrected one, with the real line quoted
    scouts = [f for f in findings if groups[f.task_id] != "lead"]
    assert len(scouts) == 3 and not any(made_up in c.quote for f in findings for c in f.citations)
    [key] = [f for f in scouts if f.title == "the provider key"]
    assert key.body == f'"{key_line}" ({key_file}:{key_no})'
    assert [(c.kind, c.ref) for c in key.citations] == [(CitationKind.SOURCE, f"{key_file}:{key_no}")]
    assert _assert_quotes_on_their_lines(scouts) == 3
    assert f'source {key_file}:{key_no} "{key_line}"' in (run_dir / "report.md").read_text()  # shown as quoted
    # the quotes are in the audit log's leaves as in the store's tables
    verified = subprocess.run([sys.executable, "-m", "swarmyard.cli", "audit", "verify", str(run_dir)], cwd=short_tmp,
                              capture_output=True, text=True, timeout=300, check=False)
    assert verified.returncode == 0 and "tables match" in verified.stdout, verified.stderr[-2000:]
    # the lead's synthesis cites the scouts' findings
    (synthesis,) = [f for f in findings if groups[f.task_id] == "lead"]
    assert {c.ref for c in synthesis.citations if c.kind is CitationKind.FINDING} == {f.id for f in scouts}
    # it is the question, then each finding's quotes and id: nothing else
    assert_only_template_and_quotes(scouts, synthesis, EXAMPLE)


@pytest.mark.model
def test_the_demo_on_the_embedded_model_ends_with_findings_whose_quotes_are_on_their_lines(short_tmp: Path) -> None:
    assert (built_dir() / "textsearch.wasm").is_file(), "build the WASI tools: python -m swarmyard.wasi.build"
    # the example itself, as `bash scripts/demo` runs it (its runs folder under this test's folder), killed only
    # when it stops making progress: on a busy 2-core host a model call may take minutes
    done = run_while_progressing([sys.executable, "-m", "swarmyard.cli", "run", str(EXAMPLE)],
                                 cwd=short_tmp, env=model_env(short_tmp), idle_s=900)
    assert done.returncode == 0, done.stderr[-3000:]
    totals = done.stderr.strip().splitlines()[-1]
    assert totals.startswith("run run_") and " calls, " in totals and " tokens, " in totals, done.stderr[-2000:]
    [run_dir] = (short_tmp / "runs").iterdir()
    findings, tasks, goal = _run_records(run_dir)
    groups = {t.id: t.group for t in tasks}
    scouts = [f for f in findings if groups[f.task_id] != "lead"]
    (synthesis,) = [f for f in findings if groups[f.task_id] == "lead"]
    assert len(scouts) == 3 and synthesis.body.strip(), done.stderr[-2000:]
    # the synthesis is what the run prints; each scout's task is one of the example's, and every task (the lead's
    # too) stored one finding
    assert done.stdout.strip() == shown(synthesis.body).strip(), done.stdout
    assert sorted(t.title for t in tasks if t.group != "lead") == ["the budget", "the provider key", "the sandbox"]
    per_task = Counter(f.task_id for f in findings)
    assert set(per_task) == {t.id for t in tasks} and max(per_task.values()) == 1, per_task
    report = (run_dir / "report.md").read_text()
    assert goal.objective in report and synthesis.body.strip()[:50] in report
    # every scout reached a finding that cites lines of its files, and every quote is found on its line, here
    assert not any(no_result.is_placeholder(f.body) for f in scouts), [f.body for f in scouts]
    grounded = [f for f in scouts if any(c.kind is CitationKind.SOURCE for c in f.citations)]
    assert len(grounded) == 3, [(f.body, f.citations) for f in scouts]
    assert _assert_quotes_on_their_lines(scouts) >= 3
    # the synthesis rests on those findings only: its citations and every id it names are real findings, and
    # each of its claims names one
    real = {f.id for f in scouts}
    assert {c.ref for c in synthesis.citations} == real, synthesis.citations  # findings only, each of them
    assert all(c.kind is CitationKind.FINDING for c in synthesis.citations), synthesis.citations
    assert set(grounding.FINDING_ID.findall(synthesis.body)) == real, synthesis.body
    assert grounding.problem(synthesis.body, [], {f.id: f.title for f in scouts}, [], "") is None, synthesis.body
    # and nothing in any finding or in the synthesis is the model's: fixed text and quotes on their lines
    assert_only_template_and_quotes(scouts, synthesis, EXAMPLE)
