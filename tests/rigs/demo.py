"""The README's grounded demo (``examples/three-scouts.toml``) on the scripted provider: the example as a user gets
it, its scouts' and lead's replies scripted, run through ``swarmyard run --json``; what the run stored and what the
plane refused its agents."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigs.cli import run_cli
from swarmyard.domain import Finding, TaskState
from swarmyard.store import open_store

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "three-scouts.toml"
SOURCES = EXAMPLES / "three-scouts" / "sources"
_QWEN = "qwen2.5-coder-0.5b-instruct"


def replaced(text: str, old: str, new: str) -> str:
    """``text`` with its one ``old`` made ``new`` (the example no longer holding ``old`` fails the test)."""
    assert text.count(old) == 1, f"the example no longer holds {old!r}"
    return text.replace(old, new)


def line_of(words: str) -> tuple[str, int, str]:
    """The source file, line number and line holding ``words`` (exactly one in the example's sources)."""
    found = [(path.name, number, line) for path in sorted(SOURCES.iterdir())
             for number, line in enumerate(path.read_text().splitlines(), 1) if words in line]
    assert len(found) == 1, (words, found)
    return found[0]


def demo_swarm(folder: Path, replies: dict[str, Any], *, finding: str = "quoted", sources: Path = SOURCES) -> Path:
    """``folder/three-scouts.toml`` and its ``replies.json``: the example on the scripted provider (models
    ``scripted-scout`` and ``scripted-lead``), one scout at a time (so the replies go to the scouts in order), its
    scouts' ``finding`` as given (``"free"``: they write their own words) and their files ``sources``."""
    text = EXAMPLE.read_text().split("# The same file on hosted models")[0]
    assert 'files = ["three-scouts/sources"]' in text, "the example's scouts no longer name their files so"
    text = text.replace('files = ["three-scouts/sources"]', f'files = ["{sources}"]')  # every scout's
    text = replaced(text, "concurrency = 3", "concurrency = 1")
    text = replaced(text, 'finding = "quoted"', f'finding = "{finding}"')
    text = replaced(text, f'max_steps = 6\nmodel = "{_QWEN}"', 'max_steps = 6\nmodel = "scripted-scout"')
    text = replaced(text, f'[lead]\nagent = "builtin"\nmodel = "{_QWEN}"',
                    '[lead]\nagent = "builtin"\nmodel = "scripted-lead"')
    text = replaced(text, f'[providers.local]\nkind = "local"\nmodels = ["{_QWEN}"]',
                    '[providers.script]\nkind = "scripted"\nmodels = ["scripted-scout", "scripted-lead"]\n'
                    'replies = "replies.json"')
    (folder / "replies.json").write_text(json.dumps(replies))
    path = folder / "three-scouts.toml"
    path.write_text(text)
    return path


@dataclass(frozen=True)
class DemoRun:
    """A demo run that ended with exit 0, every task done: its output, its folder and the findings it stored."""

    done: subprocess.CompletedProcess[str]
    run_dir: Path
    findings: list[Finding]
    #: each task's group, by task id (the lead's is ``lead``)
    groups: dict[str, str]

    def scouts(self) -> list[Finding]:
        """The scouts' findings (every one but the lead's)."""
        return [f for f in self.findings if self.groups[f.task_id] != "lead"]

    def refusals(self, code: str = "unverified_citation") -> list[dict[str, str]]:
        """The plane's refusals with ``code`` that the agents were answered, from their trajectories."""
        steps = [json.loads(line) for path in sorted((self.run_dir / "agents").glob("*.jsonl"))
                 for line in path.read_text().splitlines() if line.strip()]
        results = [json.loads(s["result"]) for s in steps if str(s.get("result", "")).startswith('{"error"')]
        return [r["error"] for r in results if r["error"].get("code") == code]


def run_demo(folder: Path, swarm: Path) -> DemoRun:
    """``swarmyard run SWARM --json`` from ``folder`` (a clean environment, as a user's shell gives: no provider
    key), which must end with exit 0 and every task done; what it stored."""
    done = run_cli("run", str(swarm), "--json", cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (folder / "runs").iterdir()
    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    try:
        (goal,) = store.list_goals()
        tasks = store.list_tasks(goal.id)
        assert all(t.state is TaskState.DONE for t in tasks), [(t.title, t.state, t.result) for t in tasks]
        findings = store.read_findings(goal.id, limit=100)
    finally:
        store.close()
    return DemoRun(done, run_dir, findings, {t.id: t.group for t in tasks})
