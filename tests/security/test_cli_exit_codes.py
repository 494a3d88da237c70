"""Evidence that can fail: the ``swarmyard`` console script exits 0 only on success, 1 on a swarmyard error or a
failed check (one line on stderr, the traceback with ``--debug``), 2 on usage and 130 on Ctrl-C, for every noun;
and ``audit verify`` / ``evaluator verify`` exit 1 on a tampered store, a body rewritten as text, a log rolled back
below what the witness cosigned, and a forged score.

Everything runs the installed console script in a subprocess with a clean environment (no provider key), in a
throwaway folder; fixtures (a run's audit log, a signed score) are made with the library, the verdicts only
through the command.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conftest import serving_witness
from rigs.network import free_port as _free_port
from swarmyard.audit.log import AuditLog, checkpoint_path
from swarmyard.audit.note import COSIGNATURE_V1, Signer
from swarmyard.audit.witness import Witness, WitnessState
from swarmyard.cli.main import NOUNS
from swarmyard.domain import GoalSpec, TaskSpec
from swarmyard.store import open_store

SWARMYARD = Path(sys.executable).with_name("swarmyard")
ORIGIN = "swarmyard.test/run-1"
GROUPS = sorted(n for n in NOUNS if n not in ("run", "serve", "mcp", "campaign", "ui"))  # nouns with verbs


def _env(home: Path, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
            "SWARMYARD_STATE_DIR": str(home / "state"), **extra}


def sy(cwd: Path, *args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """The console script, run to its end."""
    return subprocess.run([str(SWARMYARD), *args], cwd=cwd, env=_env(cwd, **env), input=stdin,
                          capture_output=True, text=True, timeout=120)


def failed(done: subprocess.CompletedProcess[str], code: str) -> str:
    """Assert exit 1 with exactly one line on stderr naming ``code``, and no traceback; return the line."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"({code})" in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def usage(done: subprocess.CompletedProcess[str]) -> None:
    """Assert exit 2 with a usage message on stderr and no traceback."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert "Usage:" in done.stderr + done.stdout


def wait_until(ready: Callable[[], bool], proc: subprocess.Popen[str]) -> None:
    """Poll ``ready`` (bounded) while ``proc`` lives: readiness of a server, not a sleep standing in for it."""
    pause = threading.Event()
    for _ in range(600):
        if proc.poll() is not None:
            break
        try:
            if ready():
                return
        except (OSError, httpx.HTTPError):
            pass
        pause.wait(0.05)
    proc.kill()
    raise AssertionError(f"not ready; exit {proc.wait()}: {proc.stderr.read() if proc.stderr else ''}")


@pytest.fixture
def home() -> Iterator[Path]:
    """A short throwaway folder (Unix sockets live in it) as cwd and $HOME."""
    path = Path(tempfile.mkdtemp(prefix="sy-"))
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


# -- usage: 2, help: 0 ----------------------------------------------------------------------------------------

def test_the_console_script_is_installed() -> None:
    assert SWARMYARD.is_file(), f"no console script beside {sys.executable}"


def test_the_root_command(home: Path) -> None:
    assert sy(home, "--help").returncode == 0
    usage(sy(home))  # no noun: help, but nothing was done
    usage(sy(home, "no-such-noun"))
    usage(sy(home, "--no-such-flag"))


@pytest.mark.parametrize("noun", sorted(NOUNS))
def test_every_noun_help_is_0_and_a_usage_error_is_2(home: Path, noun: str) -> None:
    shown = sy(home, noun, "--help")
    assert shown.returncode == 0 and "Usage:" in shown.stdout, shown.stderr
    usage(sy(home, noun, "--no-such-flag"))
    if noun in GROUPS:
        usage(sy(home, noun))
        usage(sy(home, noun, "no-such-verb"))
    assert sorted(p.name for p in home.iterdir()) == []  # a usage error changes nothing


def test_a_bad_option_value_is_2(home: Path) -> None:
    usage(sy(home, "goal", "create", "x", "--budget-usd", "1", "--call-cap", "-3"))
    usage(sy(home, "audit", "verify", str(home), "--min-size", "many"))


# -- a swarmyard error: 1, one line; success: 0 -----------------------------------------------------------------

def test_store_nouns(home: Path) -> None:
    store = f"sqlite:///{home / 'store.db'}"
    made = sy(home, "goal", "create", "find x", "--budget-usd", "1", "--call-cap", "5", "--store", store)
    assert made.returncode == 0, made.stderr
    goal = made.stdout.strip()
    listed = sy(home, "goal", "list", "--json", "--store", store)
    assert listed.returncode == 0 and [g["id"] for g in json.loads(listed.stdout)] == [goal]
    failed(sy(home, "goal", "show", "g_missing", "--store", store), "not_found")
    # an id that looks like markup is printed as it is (it crashed the error line with a MarkupError)
    assert "'g_[/bold][x]'" in failed(sy(home, "goal", "show", "g_[/bold][x]", "--store", store), "not_found")
    failed(sy(home, "goal", "create", "x", "--budget-usd", "ten", "--call-cap", "1", "--store", store),
           "invalid_input")

    task = sy(home, "task", "create", goal, "t1", "--budget-usd", "0.5", "--call-cap", "2", "--store", store)
    assert task.returncode == 0, task.stderr
    tasks = sy(home, "task", "list", goal, "--json", "--store", store)
    assert tasks.returncode == 0 and [t["id"] for t in json.loads(tasks.stdout)] == [task.stdout.strip()]
    failed(sy(home, "task", "list", "g_missing", "--store", store), "not_found")  # was an empty list, exit 0
    failed(sy(home, "task", "create", "g_missing", "t", "--store", store), "not_found")
    failed(sy(home, "task", "create", goal, "t2", "--budget-usd", "5", "--store", store), "budget_exceeded")

    board = sy(home, "board", "read", goal, "--json", "--store", store)
    assert board.returncode == 0 and json.loads(board.stdout) == []
    failed(sy(home, "board", "read", "g_missing", "--store", store), "not_found")

    budget = sy(home, "budget", "show", goal, "--json", "--store", store)
    assert budget.returncode == 0 and json.loads(budget.stdout)["goal"]["limit"] == 1_000_000
    failed(sy(home, "budget", "show", "g_missing", "--store", store), "not_found")
    failed(sy(home, "budget", "reconcile", "r_missing", "--release", "--store", store), "not_found")
    failed(sy(home, "budget", "reconcile", "r_missing", "--store", store), "user_error")

    workers = sy(home, "worker", "list", goal, "--json", "--store", store)
    assert workers.returncode == 0 and json.loads(workers.stdout) == []
    failed(sy(home, "worker", "list", "g_missing", "--store", store), "not_found")
    failed(sy(home, "worker", "revoke", "w_missing", "--store", store), "not_found")
    failed(sy(home, "goal", "list", "--server", str(home / "no.sock"), "--operator-token-file",
              str(home / "no-token")), "user_error")


def test_debug_shows_the_traceback(home: Path) -> None:
    store = f"sqlite:///{home / 'store.db'}"
    done = sy(home, "--debug", "goal", "show", "g_missing", "--store", store)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "NotFoundError" in done.stderr
    # not a refusal but a failure swarmyard did not name: still one line and 1, the traceback with --debug
    (home / "junk.db").write_bytes(b"not a database " * 16)
    junk = f"sqlite:///{home / 'junk.db'}"
    assert "DatabaseError" in failed(sy(home, "goal", "list", "--store", junk), "internal")
    done = sy(home, "--debug", "goal", "list", "--store", junk)
    assert done.returncode == 1 and "Traceback" in done.stderr


def test_bench_machines_and_certs(home: Path) -> None:
    bench = sy(home, "bench", "audit", "--quick", "--json")
    assert bench.returncode == 0, bench.stderr
    assert json.loads(bench.stdout)["area"] == "audit"
    failed(sy(home, "bench", "audit", "--workers", "2"), "user_error")  # was silently ignored

    (home / "machines").mkdir()
    listed = sy(home, "machines", "list", "--root", str(home / "machines"), "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    failed(sy(home, "machines", "list", "--root", str(home / "nowhere")), "user_error")  # was an empty list

    made = sy(home, "certs", "init", "--dir", str(home / "certs"), "--host", "localhost", "--json")
    assert made.returncode == 0, made.stderr
    assert Path(json.loads(made.stdout)["ca_cert"]).is_file()
    failed(sy(home, "certs", "init", "--dir", str(home / "certs"), "--host", "localhost"), "user_error")


def test_evaluator_verify_fails_on_a_forged_score(home: Path) -> None:
    from swarmyard.evaluator.score import sign_score
    from swarmyard.secret_files import load_or_create_ed25519

    made = sy(home, "evaluator", "keygen", "--state", str(home / "eval"))
    assert made.returncode == 0, made.stderr
    public_key = made.stdout.strip()
    key = load_or_create_ed25519(home / "eval" / "evaluator.key")
    score = sign_score(key, goal="g_1", artifact_sha256="ab" * 32, split="search", score=7, issued_at=1)
    (home / "score.json").write_text(json.dumps(score.to_dict()))
    (home / "forged.json").write_text(json.dumps({**score.to_dict(), "score": 100}))
    (home / "junk.json").write_text("{not json")

    good = sy(home, "evaluator", "verify", "score.json", "--public-key", public_key, "--json")
    assert good.returncode == 0 and json.loads(good.stdout)["valid"] is True
    forged = sy(home, "evaluator", "verify", "forged.json", "--public-key", public_key)
    assert forged.returncode == 1, forged.stdout  # printed "invalid" and exited 0 before
    assert "invalid" in forged.stderr
    forged_json = sy(home, "evaluator", "verify", "-", "--public-key", public_key, "--json",
                     stdin=(home / "forged.json").read_text())
    assert forged_json.returncode == 1 and json.loads(forged_json.stdout)["valid"] is False
    other_key = base64.b64encode(bytes(32)).decode()
    assert sy(home, "evaluator", "verify", "score.json", "--public-key", other_key).returncode == 1
    failed(sy(home, "evaluator", "verify", "junk.json", "--public-key", public_key), "invalid_input")
    failed(sy(home, "evaluator", "verify", "score.json", "--public-key", "not-a-key"), "invalid_input")


def test_run_and_mcp(home: Path) -> None:
    failed(sy(home, "run", "missing.toml"), "config_error")
    failed(sy(home, "mcp"), "user_error")  # no SWARMYARD_TOKEN
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    served = sy(home, "mcp", stdin=json.dumps(hello) + "\n", SWARMYARD_TOKEN="t",
                SWARMYARD_PLANE_SOCKET=str(home / "plane.sock"))
    assert served.returncode == 0, served.stderr  # answered, then ended at the end of its input
    assert json.loads(served.stdout.splitlines()[0])["result"]["serverInfo"]["name"] == "swarmyard"


_MONEY_SWARM = """
[goal]
objective = "x"
budget_usd = {budget}
[[tasks.lenses]]
title = "one"
prompt = "p"
[workers]
model = "up-1"
[lead]
model = "up-1"
[providers.up]
kind = "openai_compatible"
base_url = "http://127.0.0.1:9/v1"
models = ["up-1"]
[providers.up.prices.up-1]
input_usd_per_mtok = {price}
output_usd_per_mtok = "2"
[run]
runs_dir = "runs"
"""

ODD_MONEY = ['"1e3"', '"1_0"', '"\u0661"', '" 1"', '"1 "', '"+1"', '"-1"', '"1e30"', '"1."', '".5"',
             '"0.0000001"', '"NaN"', '"Infinity"', '"0x10"', '"\uff11"', '"' + "9" * 5000 + '"',
             '"1000000001"', "1000000000000000000000"]


@pytest.mark.parametrize("odd", ODD_MONEY)
def test_odd_money_in_a_swarm_file_is_a_config_error_before_anything_exists(home: Path, odd: str) -> None:
    for budget, price, field in ((odd, '"1"', "goal.budget_usd"), ('"1"', odd, "input_usd_per_mtok")):
        if field == "input_usd_per_mtok" and not odd.startswith('"'):
            continue  # a price is a string; an integer there is refused as not one
        (home / "swarm.toml").write_text(_MONEY_SWARM.format(budget=budget, price=price))
        line = failed(sy(home, "run", "swarm.toml"), "config_error")
        assert field in line, line
        assert not (home / "runs").exists()  # refused at parse time: no run folder, no store


def test_plain_dollar_strings_still_parse(home: Path) -> None:
    # the same file with good amounts gets past parsing: it fails only where the unreachable provider is used
    from swarmyard.config import loads_config

    config = loads_config(_MONEY_SWARM.format(budget='"12.5"', price='"0.000001"'))
    assert config.goal.budget_micro_usd == 12_500_000


def test_servers_refuse_bad_setups_with_1(home: Path) -> None:
    failed(sy(home, "serve", "--tls-cert", "c.pem", "--store", f"sqlite:///{home / 's.db'}"), "user_error")
    failed(sy(home, "broker", "serve", "--local", "none", "--store", f"sqlite:///{home / 's.db'}"), "user_error")
    failed(sy(home, "witness", "serve", "--key", "k", "--state", "s.json"), "invalid_input")  # no socket or port
    failed(sy(home, "witness", "checkpoint", ORIGIN), "user_error")
    failed(sy(home, "witness", "checkpoint", ORIGIN, "--state", "missing.json"), "user_error")
    assert not (home / "s.db").exists() and not (home / "k").exists()


def _server(home: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(SWARMYARD), *args], cwd=home, env=_env(home, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_ctrl_c_stops_the_witness_and_the_broker_with_130(home: Path) -> None:
    sock = home / "w.sock"
    witness = _server(home, "witness", "serve", "--key", "w.key", "--state", "w.json", "--socket", str(sock))
    client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://witness")
    wait_until(lambda: client.get("/key").status_code == 200, witness)
    assert client.get("/checkpoint", params={"origin": ORIGIN}).status_code == 404  # a typed miss, not a 500
    client.close()
    witness.send_signal(signal.SIGINT)
    assert witness.wait(30) == 130

    port = _free_port()
    broker = _server(home, "broker", "serve", "--local", "none", "--port", str(port),
                     "--store", f"sqlite:///{home / 'b.db'}", OPENAI_API_KEY="sk-test-not-a-key")
    # the broker answers (401: no worker token); its upstream is never called
    wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 401, broker)
    taken = sy(home, "broker", "serve", "--local", "none", "--port", str(port),
               "--store", f"sqlite:///{home / 'b2.db'}", OPENAI_API_KEY="sk-test-not-a-key")
    assert taken.returncode == 1, taken.stderr  # a port in use was uvicorn's exit 3
    broker.send_signal(signal.SIGINT)
    assert broker.wait(30) == 130


def test_ctrl_c_while_a_command_waits_is_130(home: Path) -> None:
    proc = subprocess.Popen([str(SWARMYARD), "evaluator", "verify", "-", "--public-key",
                             base64.b64encode(bytes(32)).decode()], cwd=home, env=_env(home),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def reading_stdin() -> bool:  # blocked in read(0, ...): the command runs, the interpreter is not starting
        return Path(f"/proc/{proc.pid}/syscall").read_text().split()[:2] == ["0", "0x0"]

    wait_until(reading_stdin, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err


@pytest.mark.parametrize(("processes", "sig", "code"), [
    (1, signal.SIGINT, 130), (1, signal.SIGTERM, 0), (2, signal.SIGINT, 130), (2, signal.SIGTERM, 0)])
def test_serve_answers_and_stops_on_ctrl_c(home: Path, processes: int, sig: signal.Signals, code: int) -> None:
    sock = home / "p.sock"
    plane = _server(home, "serve", "--socket", str(sock), "--store", f"sqlite:///{home / 'p.db'}",
                    "--workers", str(processes))
    client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://plane")
    wait_until(lambda: client.get("/healthz").status_code == 200, plane)
    assert client.get("/v1/operator/goals").status_code == 401
    client.close()
    plane.send_signal(sig)
    _, err = plane.communicate(timeout=60)
    assert "Traceback" not in err
    # Ctrl-C is 130, as for every command; SIGTERM is a supervisor's ordinary stop: a clean shutdown, exit 0
    assert plane.returncode == code, err
    assert not sock.exists()


# -- audit verify: BAD is 1 ------------------------------------------------------------------------------------

def _finished_run(home: Path) -> tuple[Path, Witness]:
    """A run folder (store.db, audit/) with two cosigned checkpoints (sizes 3 and 6+) and its witness."""
    run = home / "runs" / "run_1"
    run.mkdir(parents=True)
    store = open_store(f"sqlite:///{run / 'store.db'}", blob_dir=run / "blobs")
    witness = Witness(Signer("witness.test", Ed25519PrivateKey.generate(), COSIGNATURE_V1),
                      WitnessState(home / "witness-state.json"))
    try:
        log = AuditLog(store, run / "audit", ORIGIN, witness=witness)
        goal = store.create_goal(GoalSpec(objective="audit me", budget_micro_usd=1_000_000, call_cap=10))
        store.create_task(goal.id, TaskSpec(title="t0", budget_micro_usd=1000, call_cap=2))
        log.checkpoint()
        for i in range(1, 4):
            store.create_task(goal.id, TaskSpec(title=f"t{i}", budget_micro_usd=1000, call_cap=2))
        store.record_event("machine.created", {"machine": "m1"})
        log.checkpoint()
        log.close()
    finally:
        store.close()
    return run, witness


#: The fixture's witness is in this process, with no home to read, and its origin is not the one a run folder's
#: name fixes: verify is told both.
ALONE = ["--origin", ORIGIN, "--no-witness"]


def _sizes(run: Path) -> list[int]:
    return [int(checkpoint_path(run / "audit", n).read_text().split("\n")[1]) for n in (1, 2)]


def _sql(run: Path, statement: str, *params: object) -> None:
    with sqlite3.connect(run / "store.db") as db:
        db.execute(statement, params)


def _keys(run: Path) -> list[str]:
    log_key = (run / "audit" / "log.vkey").read_text().strip()
    witness_key = (run / "audit" / "witness.vkey").read_text().strip()
    return ["--log-key", log_key, "--witness-key", witness_key]


def test_audit_verify_ok_says_what_it_checked(home: Path) -> None:
    run, _ = _finished_run(home)
    plain = sy(home, "audit", "verify", str(run), *ALONE)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.startswith(f"OK {ORIGIN} size {_sizes(run)[1]} ")
    assert "log key from the folder; not witnessed" in plain.stdout and "self-consistency only" in plain.stderr
    assert "rollback not checked" in plain.stdout
    pinned = sy(home, "audit", "verify", str(run), *ALONE, *_keys(run), "--json")
    assert pinned.returncode == 0, pinned.stderr
    report = json.loads(pinned.stdout)
    assert (report["ok"], report["pinned"], report["fresh_size"], report["cosigned"]) == (True, True, None, 2)
    assert "self-consistency" not in pinned.stderr


def test_audit_verify_tampered_body_is_1(home: Path) -> None:
    run, _ = _finished_run(home)
    with sqlite3.connect(run / "store.db") as db:
        (body,) = db.execute("SELECT body FROM events WHERE leaf_index = 2").fetchone()
    _sql(run, "UPDATE events SET body = ? WHERE leaf_index = 2", bytes(body).replace(b"}", b',"x":1}'))
    done = sy(home, "audit", "verify", str(run), *ALONE)
    assert done.returncode == 1, done.stdout  # printed BAD and exited 0 before
    assert done.stdout.startswith("BAD event 2:")
    assert sy(home, "audit", "verify", str(run), *ALONE, "--json").returncode == 1


def test_audit_verify_bodies_rewritten_as_text_is_1(home: Path) -> None:
    run, _ = _finished_run(home)
    # The same bytes, stored as TEXT instead of BLOB (SQLite keeps the type an UPDATE gives it).
    _sql(run, "UPDATE events SET body = CAST(body AS TEXT) WHERE leaf_index >= 3")
    done = sy(home, "audit", "verify", str(run), *ALONE)
    assert done.returncode == 1, done.stderr  # a TypeError traceback before
    assert done.stdout.startswith("BAD event 3: its body is stored as text"), done.stdout
    assert "Traceback" not in done.stderr
    # an earlier event that is bad in another way is still the one named
    with sqlite3.connect(run / "store.db") as db:
        (body,) = db.execute("SELECT body FROM events WHERE leaf_index = 1").fetchone()
    _sql(run, "UPDATE events SET body = ? WHERE leaf_index = 1", bytes(body).replace(b"}", b',"x":1}'))
    assert sy(home, "audit", "verify", str(run), *ALONE).stdout.startswith("BAD event 1:")


def _roll_back(run: Path) -> int:
    """Cut the log back to its first checkpoint: later events, checkpoint files and leaves deleted."""
    first, _ = _sizes(run)
    _sql(run, "DELETE FROM events WHERE leaf_index >= ?", first)
    checkpoint_path(run / "audit", 2).unlink()
    leaves = run / "audit" / "leaves"
    leaves.write_bytes(leaves.read_bytes()[:first * 32])
    return first


def test_audit_verify_rollback_below_the_witness_is_1(home: Path) -> None:
    run, witness = _finished_run(home)
    _, cosigned = _sizes(run)
    saved = sy(home, "witness", "checkpoint", ORIGIN, "--state", str(home / "witness-state.json"))
    assert saved.returncode == 0, saved.stderr
    assert saved.stdout.split("\n")[:2] == [ORIGIN, str(cosigned)] and "\u2014 witness.test " in saved.stdout
    (home / "witnessed.note").write_text(saved.stdout)
    keys = _keys(run)
    assert sy(home, "audit", "verify", str(run), *ALONE, *keys, "--witness-checkpoint", "witnessed.note").returncode == 0

    first = _roll_back(run)
    rolled = sy(home, "audit", "verify", str(run), *ALONE, *keys)
    # the tasks the deleted events made are still rows, which no event describes now
    assert rolled.returncode == 1 and "no event in the log describes this row" in rolled.stdout, rolled.stdout
    _sql(run, "DELETE FROM tasks WHERE title != 't0'")
    rolled = sy(home, "audit", "verify", str(run), *ALONE, *keys)
    assert rolled.returncode == 0 and "rollback not checked" in rolled.stdout  # what pinned keys alone can see

    caught = sy(home, "audit", "verify", str(run), *ALONE, *keys, "--witness-checkpoint", "witnessed.note")
    assert caught.returncode == 1, caught.stdout
    assert caught.stdout.startswith(f"BAD event {first}: missing: the witness cosigned {cosigned} events")
    caught = sy(home, "audit", "verify", str(run), *ALONE, *keys, "--min-size", str(cosigned), "--json")
    assert caught.returncode == 1 and json.loads(caught.stdout)["index"] == first
    assert sy(home, "audit", "verify", str(run), *ALONE, *keys, "--min-size", str(first)).returncode == 0

    # asking the witness itself, over its socket
    with serving_witness(witness, home / "w.sock"):
        asked = sy(home, "witness", "checkpoint", ORIGIN, "--witness", str(home / "w.sock"))
        assert asked.returncode == 0 and asked.stdout == saved.stdout
        failed(sy(home, "witness", "checkpoint", "other.test/run", "--witness", str(home / "w.sock")), "not_found")
        caught = sy(home, "audit", "verify", str(run), *ALONE, *keys, "--witness", str(home / "w.sock"))
        assert caught.returncode == 1 and caught.stdout.startswith(f"BAD event {first}: missing"), caught.stdout
        unknown = sy(home, "audit", "verify", str(run), *ALONE, "--witness", str(home / "w.sock"),
                     "--log-key", "other.test/run+00000000+" + base64.b64encode(b"\x01" + bytes(32)).decode())
        assert unknown.returncode == 1  # the witness never cosigned that origin
    failed(sy(home, "audit", "verify", str(run), *ALONE, "--witness", str(home / "w.sock")), "audit_error")  # gone


def test_audit_verify_a_forged_witness_checkpoint_is_1(home: Path) -> None:
    run, _ = _finished_run(home)
    saved = sy(home, "witness", "checkpoint", ORIGIN, "--state", str(home / "witness-state.json")).stdout
    lines = saved.split("\n")
    lines[1] = str(int(lines[1]) + 5)  # claim a larger size under the same signatures
    (home / "forged.note").write_text("\n".join(lines))
    done = sy(home, "audit", "verify", str(run), *ALONE, *_keys(run), "--witness-checkpoint", "forged.note")
    assert done.returncode == 1 and done.stdout.startswith("BAD witnessed 0:"), done.stdout
    failed(sy(home, "audit", "verify", str(run), *ALONE, "--witness-checkpoint", "missing.note"), "user_error")


def test_audit_verify_usage_and_errors(home: Path) -> None:
    failed(sy(home, "audit", "verify", str(home)), "user_error")  # no audit/ folder
    failed(sy(home, "audit", "verify", str(home), "--log-key", "nope"), "user_error")


def test_audit_verify_writes_nothing_to_the_store_it_checks(home: Path) -> None:
    run, _ = _finished_run(home)
    _sql(run, "INSERT INTO events (kind, body, created_at) VALUES ('forged', ?, 0)", b'{"kind":"forged"}')

    def events() -> list[tuple[object, ...]]:
        with sqlite3.connect(run / "store.db") as db:
            return list(db.execute("SELECT id, leaf_index, kind, body FROM events ORDER BY id"))

    before = events()
    done = sy(home, "audit", "verify", str(run), *ALONE, "--json")
    assert done.returncode == 1 and json.loads(done.stdout)["what"] == "unsequenced"  # no checkpoint covers it
    assert events() == before  # the unsequenced row was not given a leaf index by the check
    assert before[-1][1] is None
