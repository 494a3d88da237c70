"""The seed's boxd script runs on swarmyard with two lines changed: its import and its client's construction.

Run as a user runs it: ``python script.py`` from an ordinary folder, in real ``local`` machines, with Claude Code
(installed by scripts/test) answering from the scripted provider through the broker. Once against a running
``swarmyard serve`` (``SWARMYARD_SERVER``), whose store then shows one worker per machine, each paying for its
own calls and revoked at the machine's delete; once with no configuration beyond a providers file, on a plane
the client starts itself and leaves nothing of behind; and once with no configuration at all, on the embedded
model with no key, where every ``claude -p`` must answer.
"""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from boxd_seed import SEED, ported

from swarmyard.bench.agents import SCOUTS, cache_with_model, run_seed
from swarmyard.boxd import Boxd
from swarmyard.boxd._plane import OBJECTIVE
from swarmyard.broker.providers.scripted import CallTools, Say, ScriptedProvider
from swarmyard.config import DEFAULT_MODEL
from swarmyard.domain import ReservationState
from swarmyard.store import open_store

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

MODEL = "scripted-agent-model"
PLANTED = "sk-host-key-that-must-never-reach-a-sandbox-0123456789"
ANSWERS = ("Market: a few million devices a year.", "Models: Whisper and Moonshine lead.",
           "Risks: the platforms ship it free.", "Recommendation: go, small and fast, citing the risks.")


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-seed-"))  # short: sockets live under it
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _providers(folder: Path) -> Path:
    (folder / "replies.toml").write_text("".join(f'[[{MODEL}]]\nsay = "{a}"\n' for a in ANSWERS))
    (folder / "providers.toml").write_text(
        f'[providers.script]\nkind = "scripted"\nmodels = ["{MODEL}"]\nreplies = "replies.toml"\n')
    return folder / "providers.toml"


def _env(folder: Path, **extra: str) -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV", "SWARMYARD_STATE_DIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    tmp = folder / "tmp"
    tmp.mkdir(exist_ok=True)
    # a key in the user's environment must stay out of every machine
    return env | {"TMPDIR": str(tmp), "ANTHROPIC_API_KEY": PLANTED, "OPENAI_API_KEY": PLANTED} | extra


def _run_script(folder: Path, text: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = folder / "swarm.py"
    script.write_text(text)
    return subprocess.run([sys.executable, str(script)], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600)


def test_only_the_import_and_the_construction_change() -> None:
    changed = [line for line in difflib.ndiff(SEED.splitlines(), ported().splitlines())
               if line.startswith(("- ", "+ "))]
    assert sorted(changed) == sorted(["- from boxd import Boxd", '- boxd = Boxd(api_key=os.environ["BOXD_API_KEY"])',
                                      "+ from swarmyard.boxd import Boxd", "+ boxd = Boxd()"])


def test_the_seed_runs_against_a_running_serve(folder: Path) -> None:
    providers = _providers(folder)
    sock, store_url = folder / "plane.sock", f"sqlite:///{folder / 'store.db'}"
    serve = subprocess.Popen(
        [sys.executable, "-m", "swarmyard.cli", "serve", "--socket", str(sock), "--store", store_url,
         "--providers", str(providers), "--secret-file", str(folder / "secret"),
         "--operator-token-file", str(folder / "operator-token")],
        cwd=folder, env=_env(folder), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://plane") as http:
            while True:  # readiness, bounded
                assert serve.poll() is None, serve.stderr.read().decode() if serve.stderr else ""
                assert time.monotonic() < deadline, "serve did not start"
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.05)
        done = _run_script(folder, ported(), _env(
            folder, SWARMYARD_SERVER=str(sock), SWARMYARD_OPERATOR_TOKEN_FILE=str(folder / "operator-token"),
            SWARMYARD_MODEL=MODEL))
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip() == ANSWERS[-1]
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    store = open_store(store_url)
    try:
        (goal,) = [g for g in store.list_goals() if g.objective == OBJECTIVE]
        workers = store.list_workers(goal.id)
        assert len(workers) == 4 and all(w.revoked for w in workers)  # one a machine, revoked at its delete
        tasks = {t.id: t.title for t in store.list_tasks(goal.id)}
        assert sorted(tasks.values()) == ["machine lead", "machine scout-market", "machine scout-models",
                                          "machine scout-risks"]
        held = store.list_reservations(goal.id)
        assert {r.worker_id for r in held} == {w.id for w in workers}  # every machine paid with its own token
        assert all(r.state is ReservationState.SETTLED for r in held)
    finally:
        store.close()
    for path in folder.rglob("*"):
        if path.is_file() and path.stat().st_size < 1_000_000 and path.name != "swarm.py":
            assert PLANTED.encode() not in path.read_bytes(), path


def test_the_seed_runs_on_a_plane_of_its_own_and_leaves_nothing(folder: Path) -> None:
    providers = _providers(folder)
    construction = f'boxd = Boxd(providers="{providers}", model="{MODEL}")'
    done = _run_script(folder, ported(construction), _env(folder))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == ANSWERS[-1]
    tmp = folder / "tmp"
    assert not list(tmp.glob("sy-boxd-*")), "the embedded plane's folder was left behind"
    assert not [p for root in tmp.glob("swarmyard-machines-*") for p in (root / "m").iterdir()]


@pytest.mark.model
def test_the_seed_runs_on_the_embedded_model_with_no_key_and_every_claude_answers(folder: Path) -> None:
    # Bounded by progress: each of the script's four execs gives up after its own 600 s, and an exec that gave
    # up answers nothing, which fails below. The prompt-start cache is this test's own and starts empty.
    seed = run_seed(folder / "run", cache_with_model(folder), timeout_s=1700)
    assert seed.exit_code == 0, seed.stderr_tail
    assert sorted(seed.answers) == sorted([*SCOUTS, "lead"])
    for name, answer in seed.answers.items():
        assert answer.strip(), f"claude -p of {name} answered nothing: {seed.stderr_tail}"
        assert "API Error" not in answer, (name, answer)


def _claude_in_a_machine(folder: Path, model: str, replies: list[Say | CallTools],
                         asks: dict[str, str]) -> tuple[ScriptedProvider, dict[str, str]]:
    """Each of ``asks`` (machine name -> prompt) as the seed runs it: a bare ``claude -p`` in a machine of its own,
    on ``model`` served by a scripted provider; the lead's machine gets a reports file first."""
    (folder / "providers.toml").write_text(f'[providers.script]\nkind = "scripted"\nmodels = ["{model}"]\n')
    provider = ScriptedProvider({model: replies}, name="script")
    answers = {}
    with Boxd(providers=folder / "providers.toml", provider_objects={"script": provider}, model=model) as boxd:
        for name, prompt in asks.items():
            machine = boxd.machines.create(name)
            boxd.machines.wait_until_ready(machine.id)
            boxd.machines.files.upload(machine.id, "/home/boxd/reports.md", "## market\n\nplanted-report-line\n")
            done = boxd.machines.exec(machine.id, f'claude -p "{prompt}" --dangerously-skip-permissions',
                                      timeout=300)
            assert done.success, done.stderr[-3000:]
            answers[name] = done.stdout.strip()
            boxd.machines.delete(machine.id)
    return provider, answers


def test_on_the_embedded_model_claude_in_a_machine_is_offered_read_only_and_the_lead_reads(folder: Path) -> None:
    # the scripted provider serves the embedded model's name: the machines are set up as for that model
    replies: list[Say | CallTools] = [Say("Market: small."), CallTools((("Read", {"file_path": "/home/boxd/reports.md"}),)),
                                      Say("Recommendation: go.")]
    provider, answers = _claude_in_a_machine(folder, DEFAULT_MODEL, replies, {
        "scout-market": "Estimate the market size.",
        "lead": "Read /home/boxd/reports.md and write one recommendation: go or no-go, and why."})
    assert answers == {"scout-market": "Market: small.", "lead": "Recommendation: go."}
    # one call a scout, two for the lead (its read, then its answer), every one offered the same single tool
    assert [tuple(t.name for t in r.tools) for r in provider.requests] == [("Read",)] * 3
    # the lead's read ran: the file's text came back to the model as the tool's result
    assert "planted-report-line" in repr(provider.requests[2].messages)
    assert "planted-report-line" not in repr(provider.requests[1].messages)


def test_on_another_model_claude_in_a_machine_keeps_its_tools(folder: Path) -> None:
    provider, answers = _claude_in_a_machine(folder, MODEL, [Say("Market: small.")],
                                             {"scout-market": "Estimate the market size."})
    assert answers == {"scout-market": "Market: small."}
    (request,) = provider.requests
    offered = {t.name for t in request.tools}
    assert {"Read", "Bash", "Write", "Edit"} <= offered
    assert any(name.startswith("mcp__swarmyard__") for name in offered)
