"""The README's demo (``examples/three-scouts.toml``) prints nothing a model wrote: every sentence of every finding
and of the synthesis is swarmyard's fixed text or a quote found on the line it cites.

Its scouts' model chooses a verdict and the lines its search returned (``[workers] finding = "quoted"``) and the
lead makes no model call (``[lead] synthesis = "quoted"``): the synthesis is the tally of the findings' first
words, then each finding's verdict and the lines it cites. Through ``swarmyard run FILE --json`` in a subprocess,
in real governed bubblewrap machines with the real textsearch tool, on the scripted provider (the shipped double
for a paid model). The test on the embedded model (``model``) is ``test_demo_citations``'s, which checks the same.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_demo_citations import (
    EXAMPLE,
    _findings,
    _line_of,
    _replace,
    _run,
    _scripted_variant,
    _tool,
    assert_only_template_and_quotes,
    short_tmp,
)

from swarmyard.agents import quoted
from swarmyard.domain import CitationKind
from swarmyard.wasi.catalog import built_dir

__all__ = ["short_tmp"]  # the fixture, shared with the demo's own test

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

MADE_UP = "The broker copies the provider key into every sandbox"


def _refusals(run_dir: Path) -> list[dict[str, str]]:
    steps = [json.loads(line) for path in sorted((run_dir / "agents").glob("*.jsonl"))
             for line in path.read_text().splitlines() if line.strip()]
    results = [json.loads(s["result"]) for s in steps if str(s.get("result", "")).startswith('{"error"')]
    return [r["error"] for r in results if r["error"].get("code") == "unverified_citation"]


def test_the_findings_and_the_synthesis_are_verdicts_and_quotes_and_a_made_up_quote_is_refused(
        short_tmp: Path) -> None:
    assert (built_dir() / "textsearch.wasm").is_file(), "build the WASI tools: python -m swarmyard.wasi.build"
    key_file, key_no, key_line = _line_of("provider key")
    budget_file, budget_no, budget_line = _line_of("afford")
    box_file, box_no, box_line = _line_of("loopback")
    replies = {
        "scripted-scout": [
            # the key's scout cites a line its file does not hold: refused with the reason, asked again
            _tool("textsearch", pattern="provider key"),
            _tool("submit_finding", verdict="no", cite=[f"{key_file}:{key_no}: {MADE_UP}"]),
            # words the model adds of its own (a title, a body) are not what its finding is written from
            _tool("submit_finding", verdict="yes", cite=[f"{key_file}:{key_no}: {key_line}"],
                  title="Key leaked", body="The budget for the API key has been exceeded."),
            _tool("textsearch", pattern="afford"),
            _tool("submit_finding", verdict="no", cite=[f"{budget_file}:{budget_no}: {budget_line}"]),
            _tool("textsearch", pattern="loopback"),
            # a line named by its path:line alone: its words are the search's
            _tool("submit_finding", verdict="yes", cite=[f"{box_file}:{box_no}"]),
        ],
        "scripted-lead": [],  # a lead that asked its model anything would fail: the script holds no reply
    }
    done = _run(short_tmp, _scripted_variant(short_tmp, replies))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["calls"] == 7  # the scouts' 2 + 3 + 2; the lead's none
    [run_dir] = (short_tmp / "runs").iterdir()
    findings, groups = _findings(run_dir)

    # (c) the made-up quote was refused, with the line as it reads, and stored nowhere
    [refusal] = _refusals(run_dir)
    assert refusal["ref"] == f"{key_file}:{key_no}" and key_line.strip() in refusal["reason"], refusal
    assert not any(MADE_UP in f.body or any(MADE_UP in c.quote for c in f.citations) for f in findings)
    assert not any("exceeded" in f.body or f.title == "Key leaked" for f in findings)

    # (a) every finding and the synthesis: swarmyard's words and quotes found on their lines, nothing else
    scouts = [f for f in findings if groups[f.task_id] != "lead"]
    by_title = {f.title: f for f in scouts}
    assert by_title["the budget"].body == f'No: "{budget_line}" ({budget_file}:{budget_no})'
    assert by_title["the sandbox"].body == f'Yes: "{box_line}" ({box_file}:{box_no})'
    (synthesis,) = [f for f in findings if groups[f.task_id] == "lead"]
    assert_only_template_and_quotes(scouts, synthesis, EXAMPLE)

    # (b) the tally is the findings' own first words: the budget's "No" is counted as no
    key, budget, box = by_title["the provider key"], by_title["the budget"], by_title["the sandbox"]
    assert synthesis.body.startswith(
        f"Mixed: 2 of 3 findings say yes [{key.id}] [{box.id}]; 1 of 3 findings says no [{budget.id}].\n\n"
    ), synthesis.body
    assert {c.ref for c in synthesis.citations if c.kind is CitationKind.FINDING} == {f.id for f in scouts}


def test_the_tally_follows_each_findings_first_word_when_scouts_write_their_own(short_tmp: Path) -> None:
    # Scouts that write their own bodies ([workers] finding = "free") and a quoted lead: a finding opening "No:"
    # is counted as no (the digest lead's own verdict once counted such a one as yes), and none of the scouts'
    # sentences reaches the synthesis, only the lines the plane checked for them.
    key_file, key_no, key_line = _line_of("provider key")
    budget_file, budget_no, budget_line = _line_of("afford")
    box_file, box_no, box_line = _line_of("loopback")
    invented = "The team may need to adjust their budget or consider alternative payment methods."
    replies = {
        "scripted-scout": [
            _tool("textsearch", pattern="provider key"),
            _tool("submit_finding", title="key", body="Yes, the key stays with the broker.",
                  cite=[f"{key_file}:{key_no}: {key_line}"]),
            _tool("textsearch", pattern="afford"),
            _tool("submit_finding", title="budget", body=f"No: the budget has been exceeded. {invented}",
                  cite=[f"{budget_file}:{budget_no}: {budget_line}"]),
            _tool("textsearch", pattern="loopback"),
            _tool("submit_finding", title="sandbox", body="Probably, though it depends.",
                  cite=[f"{box_file}:{box_no}: {box_line}"]),
        ],
        "scripted-lead": [],
    }
    swarm = _scripted_variant(short_tmp, replies)
    swarm.write_text(_replace(swarm.read_text(), 'finding = "quoted"', 'finding = "free"'))
    done = _run(short_tmp, swarm)
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (short_tmp / "runs").iterdir()
    findings, groups = _findings(run_dir)
    by_title = {f.title: f for f in findings if groups[f.task_id] != "lead"}
    (synthesis,) = [f for f in findings if groups[f.task_id] == "lead"]
    key, budget, box = by_title["key"], by_title["budget"], by_title["sandbox"]
    assert [quoted.verdict_of(f.body) for f in (key, budget, box)] == ["yes", "no", "unclear"]
    assert synthesis.body.startswith(
        f"Mixed: 1 of 3 findings says yes [{key.id}]; 1 of 3 findings says no [{budget.id}]; 1 of 3 findings is "
        f"unclear [{box.id}].\n\n"), synthesis.body
    assert f'- No: "{budget_line}" ({budget_file}:{budget_no}) [{budget.id}]' in synthesis.body.splitlines()
    for sentence in ("exceeded", invented, "stays with the broker", "depends"):
        assert sentence not in synthesis.body
    assert re.search(r"\[fnd_", synthesis.body)
