"""A hostile scout in the README's grounded demo (``examples/three-scouts.toml``): nothing it cannot back with a line of
its files is stored, and nothing of its own words reaches the synthesis uncited.

Through ``swarmyard run FILE --json`` on the scripted provider (the shipped double for a paid model), in real
governed bubblewrap machines with the real textsearch tool. The scouts cite a file outside the sources
(``/etc/passwd``, ``../``, ``task/../../etc/hostname``), a quote with a Cyrillic look-alike letter, a quote too
short to check (one character, empty, nothing but Markdown marks), a line past the end of the file, the right words
on the wrong line; each is refused with its reason. One dresses a claim as a no-result placeholder (the line an
agent ends with when it reached nothing, stored without a citation and repeated in the synthesis): refused too, so
the synthesis says only the limit that really ran out.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_demo_citations import _assert_quotes_on_their_lines

from rigs.demo import SOURCES, demo_swarm, line_of, run_demo
from rigs.scripted import tool_call
from swarmyard.wasi.catalog import built_dir

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

MADE_UP = "the sandbox hands the provider key to every worker in plain text"


def test_made_up_citations_and_a_claim_dressed_as_a_placeholder_are_refused(short_tmp: Path) -> None:
    assert (built_dir() / "textsearch.wasm").is_file(), "build the WASI tools: python -m swarmyard.wasi.build"
    key_file, key_no, key_line = line_of("provider key")
    budget_file, budget_no, budget_line = line_of("afford")
    box_file, box_no, box_line = line_of("loopback")
    replies = {
        "scripted-scout": [
            tool_call("textsearch", pattern="provider key"),
            tool_call("submit_finding", title="k1", body="passwd", cite=["/etc/passwd:1: root:x:0:0:root:/root:/bin/bash"]),
            tool_call("submit_finding", title="k2", body="up", cite=[f"../sources/{key_file}:{key_no}: {key_line}"]),
            tool_call("submit_finding", title="k3", body="look-alike",
                  cite=[f"{key_file}:{key_no}: {key_line.replace('a', chr(0x430), 1)}"]),
            tool_call("submit_finding", title="k4", body="short", cite=[f"{key_file}:{key_no}: x"]),
            # a claim of its own in the placeholder's shape, with no citation: the step cap then ends the task
            tool_call("submit_finding", title="key", body=f"No result was reached for 'the provider key': {MADE_UP}"),
            tool_call("textsearch", pattern="afford"),
            tool_call("submit_finding", title="b1", body="empty", cite=[f"{budget_file}:{budget_no}: "]),
            tool_call("submit_finding", title="b2", body="range", cite=[f"{budget_file}:999999999: {budget_line}"]),
            tool_call("submit_finding", title="b3", body="marks", cite=[f"{budget_file}:{budget_no}: ``````********````"]),
            tool_call("submit_finding", title="b4", body="wrong line", cite=[f"{budget_file}:{budget_no + 1}: {budget_line}"]),
            tool_call("submit_finding", title="budget", body="A call past the budget is refused.",
                  cite=[f"{budget_file}:{budget_no}: {budget_line}"]),
            tool_call("textsearch", pattern="loopback"),
            tool_call("submit_finding", title="sandbox", body="out", cite=[f"{box_file}:{box_no}: {box_line}",
                                                                       "task/../../etc/hostname:1: localhost"]),
            tool_call("submit_finding", title="sandbox", body="Only loopback.", cite=[f"{box_file}:{box_no}: {box_line}"]),
        ],
        "scripted-lead": [{"say": "The budget and the sandbox hold; the key was not looked at."}] * 6,
    }
    # scouts that write their findings' words themselves (finding = "free"): a hostile scout's every word reaches
    # the plane, which checks its citations whatever the agent does with them
    demo = run_demo(short_tmp, demo_swarm(short_tmp, replies, finding="free"))
    run_dir = demo.run_dir

    refused = [(r["ref"], r["reason"]) for r in demo.refusals()]
    reasons = "\n".join(f"{ref} {why}" for ref, why in refused)
    # (a quote the flow's constrained finding cannot spell may be dropped by the agent before the plane sees it:
    # these are the ones every run sends)
    for expected in ("no source file is named '/etc/passwd'", f"no source file is named '../sources/{key_file}'",
                     f"line {key_no} of {key_file} does not hold the quoted words",
                     "(none) a no-result line names this task's title", "'' is too short", "no line 999999999",
                     "'``````********````' is too short",
                     f"on line {budget_no} of {budget_file}, not line {budget_no + 1}"):
        assert expected in reasons, (expected, reasons)

    findings, scouts = demo.findings, demo.scouts()
    assert sorted(f.title for f in scouts) == ["budget", "sandbox", "the provider key (partial)"]
    [key] = [f for f in scouts if f.title.startswith("the provider key")]
    assert key.body == "No result was reached for 'the provider key': the step cap ran out (6 of 6 steps)."
    assert _assert_quotes_on_their_lines(scouts) == 2
    assert not any(MADE_UP in f.body for f in findings)
    assert MADE_UP not in (run_dir / "report.md").read_text().split("## Trajectories")[0]


def test_a_source_holding_a_form_feed_is_numbered_as_the_scouts_tools_number_it(short_tmp: Path) -> None:
    # Numbered by str.splitlines, a form feed started a line of its own: the honest citation of line 2 was refused
    # and a quote from line 1 cited as line 2 was stored. Lines end at a newline alone, as textsearch and grep say.
    sources = short_tmp / "sources"
    shutil.copytree(SOURCES, sources)
    (sources / "notes.md").write_text("Intro text.\fThe provider key is copied into every sandbox.\n"
                                      "The broker keeps the key; agents never see it.\n")
    budget_file, budget_no, budget_line = line_of("afford")
    box_file, box_no, box_line = line_of("loopback")
    replies = {
        "scripted-scout": [
            tool_call("textsearch", pattern="provider key"),
            tool_call("submit_finding", title="made up", body="No: the key is in every sandbox.",
                  cite=["notes.md:2: The provider key is copied into every sandbox."]),
            tool_call("submit_finding", title="key", body="Yes: the broker keeps the key.",
                  cite=["notes.md:2: The broker keeps the key; agents never see it."]),
            tool_call("textsearch", pattern="afford"),
            tool_call("submit_finding", title="budget", body="Yes: refused.", cite=[f"{budget_file}:{budget_no}: {budget_line}"]),
            tool_call("textsearch", pattern="loopback"),
            tool_call("submit_finding", title="sandbox", body="Yes: loopback.", cite=[f"{box_file}:{box_no}: {box_line}"]),
        ],
        "scripted-lead": [{"say": "The key, the budget and the sandbox hold."}] * 6,
    }
    demo = run_demo(short_tmp, demo_swarm(short_tmp, replies, finding="free", sources=sources))
    refused = [(r["ref"], r["reason"]) for r in demo.refusals()]
    assert ("notes.md:2", "the quoted words are on line 1 of notes.md, not line 2") in refused, refused
    findings = demo.findings
    stored = [c.quote for f in findings for c in f.citations if c.ref == "notes.md:2"]
    assert stored == ["The broker keeps the key; agents never see it."], stored
