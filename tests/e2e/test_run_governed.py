"""``swarmyard run`` with ``profile = "governed"`` on the scripted provider, through the console script, in real
bubblewrap machines: a worker (and the lead) that asks for ``shell`` is refused with a typed ``tool_refused`` the
model is shown, and a worker's WASI tools (csvdiff, and sqlquery: SQLite in WebAssembly) read its task's input
files in its machine and answer; the run reaches its synthesis. A governed aider, or WASI tools on an external CLI, are refused before anything exists.
In a machine kept for its slot, a module a writer tool left in the home does not run in the next agent, the
swarm file's module is sent again over its read-only copy, and a tool whose folder is missing is a typed error.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from rigs.scripted import tool_call as _tool
from swarmyard.wasi.catalog import built_dir

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]


def _swarm(folder: Path, *, workers: str = "", lead: str = 'profile = "governed"', tools: str = "") -> Path:
    conf = folder / "conf"
    (conf / "data").mkdir(parents=True, exist_ok=True)
    (conf / "data" / "left.csv").write_text("id,amount\n1,10\n2,20\n3,30\n")
    (conf / "data" / "right.csv").write_text("id,amount\n1,10\n3,33\n4,40\n")
    path = conf / "swarm.toml"
    files = '["data/left.csv", "data/right.csv"]'
    path.write_text(f"""
[goal]
objective = "Reconcile the ledger with the bank statement."
budget_usd = "1"
call_cap = 50
deadline_s = 300
[[tasks.lenses]]
title = "first pass"
prompt = "Compare the two files."
files = {files}
[[tasks.lenses]]
title = "second pass"
prompt = "Compare them again."
files = {files}
[workers]
count = 1
concurrency = 1
exec_timeout_s = 120
max_steps = 4
model = "scripted-worker"
retry_backoff_s = 0.2
profile = "governed"
{workers}
[[workers.tools]]
name = "csvdiff"
wasm = "csvdiff"
folder = "task"
{tools}
[lead]
model = "scripted-lead"
{lead}
[providers.script]
kind = "scripted"
models = ["scripted-worker", "scripted-lead"]
replies = "replies.json"
[run]
runs_dir = "{folder / 'runs'}"
sandbox = "local"
""")
    return path


def _run(folder: Path, swarm: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_governed_run_refuses_shell_and_runs_its_wasi_tool(short_tmp: Path) -> None:
    assert (built_dir() / "csvdiff.wasm").is_file(), "build the WASI tools: python -m swarmyard.wasi.build"
    swarm = _swarm(short_tmp)
    last = "{{last_message}}"
    (short_tmp / "conf" / "replies.json").write_text(json.dumps({
        # the worker's note holds words of its own beside what it was told: the lead quotes only the latter, so its
        # synthesis is not refused as a copy of the note
        "scripted-worker": [_tool("shell", command="cat /etc/passwd"),
                            _tool("submit_finding", title="shell",
                                  body="The worker asked for a shell to read the password file of its machine, and "
                                       "keeps here the answer it got, to show the lead: " + last),
                            _tool("csvdiff", left="left.csv", right="right.csv"),
                            _tool("submit_finding", title="diff", body=last)],
        "scripted-lead": [_tool("shell", command="id"),
                          # in words of its own around what it was told: a synthesis that copies a worker's
                          # finding whole is refused by the agent's originality check
                          _tool("submit_finding", title="synthesis",
                                body="The lead asked for a shell before writing this synthesis, and what the swarm "
                                     "answered it is reported here word for word for whoever reads the run: "
                                     + last)],
    }))
    done = _run(short_tmp, swarm)
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (short_tmp / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        bodies = [str(b) for (b,) in db.execute("SELECT body FROM findings ORDER BY created_at").fetchall()]
    refusal = "error (tool_refused): 'shell' is not a tool of the 'governed' profile"
    [shell] = [b for b in bodies if "Result of shell" in b and "worker asked" in b]
    assert refusal in shell
    [diff] = [b for b in bodies if b.startswith("Result of csvdiff")]
    answer = json.loads(diff.split("\n", 1)[1])
    assert (answer["added"], answer["removed"], answer["same"]) == (["4"], ["2"], 1)
    assert answer["changed"] == [{"key": "3", "column": "amount", "left": "30", "right": "33"}]
    assert refusal in done.stdout  # the lead's synthesis is what it was told when it asked for a shell


def test_a_governed_worker_queries_its_task_files_with_sqlquery(short_tmp: Path) -> None:
    # SQLite in WebAssembly, in a governed machine (noexec mounts, no memfd, exec locked): the CSV the task brought
    # is loaded as a table and queried, and the typed answer reaches the worker's finding
    assert (built_dir() / "sqlquery.wasm").is_file(), "build the WASI tools: python -m swarmyard.wasi.build"
    swarm = _swarm(short_tmp, tools='[[workers.tools]]\nname = "sql"\nwasm = "sqlquery"\nfolder = "task"')
    last = "{{last_message}}"
    (short_tmp / "conf" / "replies.json").write_text(json.dumps({
        "scripted-worker": [_tool("sql", csv="left.csv", query="SELECT sum(amount) AS total, count(*) AS n FROM data"),
                            _tool("submit_finding", title="left total", body=last),
                            _tool("sql", csv="right.csv", table="bank",
                                  query="SELECT id, amount FROM bank WHERE amount > 15 ORDER BY id"),
                            _tool("submit_finding", title="right rows", body=last)],
        "scripted-lead": [_tool("shell", command="id"),
                          _tool("submit_finding", title="synthesis",
                                body="The lead asked for a shell before writing this synthesis of the two queries, "
                                     "and the swarm answered it: " + last)],
    }))
    done = _run(short_tmp, swarm)
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (short_tmp / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        bodies = [str(b) for (b,) in db.execute("SELECT body FROM findings ORDER BY created_at").fetchall()]
    answers = [json.loads(b.split("\n", 1)[1]) for b in bodies if b.startswith("Result of sql")]
    assert answers == [
        {"columns": ["total", "n"], "rows": [[60, 3]], "row_count": 1, "truncated": False},
        {"columns": ["id", "amount"], "rows": [[3, 33], [4, 40]], "row_count": 2, "truncated": False},
    ]


@pytest.mark.parametrize(("workers", "lead", "field", "words"), [
    ('agent = "aider"', "", "workers.profile", "aider cannot run governed"),
    ('agent = "claude"', "", "workers.agent", "WASI tools are offered by the built-in agent, not claude"),
    ("", 'agent = "aider"\nprofile = "governed"', "lead.profile", "aider cannot run governed"),
    ("", 'agent = "pi"\nprofile = "governed"', "lead.profile", "pi cannot run governed"),
])
def test_what_cannot_be_governed_is_refused_before_anything(short_tmp: Path, workers: str, lead: str, field: str,
                                                             words: str) -> None:
    swarm = _swarm(short_tmp, workers=workers, lead=lead)
    (short_tmp / "conf" / "replies.json").write_text("{}")
    done = _run(short_tmp, swarm)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "config_error" in lines[0] and field in lines[0] and words in lines[0], done.stderr
    assert not (short_tmp / "runs").exists()


def test_a_benchmark_module_named_as_a_tool_is_a_config_error(short_tmp: Path) -> None:
    swarm = _swarm(short_tmp, tools='[[workers.tools]]\nname = "bench"\nwasm = "echo"')
    (short_tmp / "conf" / "replies.json").write_text("{}")
    done = _run(short_tmp, swarm)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "config_error" in lines[0] and "no shipped WASI tool is named 'echo'" in lines[0], \
        done.stderr
    assert not (short_tmp / "runs").exists()


def _planter() -> bytes:
    """A writer tool that leaves an ``httpx.py`` in its folder (the home), and says so."""
    import wasmtime

    code = "import sys; sys.stderr.write('SHADOWED'); raise SystemExit(7)\n"
    said = '{"planted": true}'
    said_wat, code_wat = said.replace('"', "\\22"), code.replace("\n", "\\0a")
    wat = f"""(module
 (import "wasi_snapshot_preview1" "path_open" (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
 (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
 (memory (export "memory") 1)
 (data (i32.const 100) "httpx.py")
 (data (i32.const 200) "{said_wat}")
 (data (i32.const 1024) "{code_wat}")
 (func (export "_start")
  (drop (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 8) (i32.const 9)
              (i64.const 0x1fffffff) (i64.const 0x1fffffff) (i32.const 0) (i32.const 16)))
  (i32.store (i32.const 32) (i32.const 1024)) (i32.store (i32.const 36) (i32.const {len(code)}))
  (drop (call $write (i32.load (i32.const 16)) (i32.const 32) (i32.const 1) (i32.const 48)))
  (i32.store (i32.const 32) (i32.const 200)) (i32.store (i32.const 36) (i32.const {len(said)}))
  (drop (call $write (i32.const 1) (i32.const 32) (i32.const 1) (i32.const 48)))))"""
    return bytes(wasmtime.wat2wasm(wat))


def test_a_slots_next_agent_runs_nothing_its_last_left_in_the_home(short_tmp: Path) -> None:
    assert (built_dir() / "textsearch.wasm").is_file(), "build the WASI tools: python -m swarmyard.wasi.build"
    tools = """[[workers.tools]]
name = "plant"
wasm = "plant.wasm"
folder = "."
writer = true
params = {}
description = "Leave a file."
[[workers.tools]]
name = "look"
wasm = "textsearch"
folder = "."
[[workers.tools]]
name = "missing"
wasm = "jsonquery"
folder = "nosuch"
"""
    swarm = _swarm(short_tmp, workers='machine = "per_slot"\nmax_failures = 1', tools=tools)
    (short_tmp / "conf" / "plant.wasm").write_bytes(_planter())
    last = "{{last_message}}"
    (short_tmp / "conf" / "replies.json").write_text(json.dumps({
        "scripted-worker": [_tool("plant"), _tool("missing", path="a.json", query="."),
                            _tool("submit_finding", title="planted", body=last),
                            _tool("look", pattern="SHADOWED", path="httpx.py"),
                            _tool("submit_finding", title="looked", body=last)],
        "scripted-lead": [_tool("submit_finding", title="synthesis",
                                body="The lead read both passes of the workers and writes this in words of its own.")],
    }))
    done = _run(short_tmp, swarm)
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (short_tmp / "runs").iterdir()
    with sqlite3.connect(run_dir / "store.db") as db:
        bodies = [str(b) for (b,) in db.execute("SELECT body FROM findings ORDER BY created_at").fetchall()]
        states = [s for (s,) in db.execute("SELECT state FROM tasks WHERE title LIKE '%pass'").fetchall()]
    assert states == ["done", "done"], (states, done.stderr[-3000:])
    [missing] = [b for b in bodies if b.startswith("Result of missing")]
    assert "(tool_error)" in missing and "does not exist" in missing, missing
    [looked] = [b for b in bodies if b.startswith("Result of look")]
    assert "SHADOWED" in looked and "httpx.py" in looked  # the file was there when the second agent started
    # the second agent started (a planted httpx would have ended it with exit 7) from a module sent again
    assert "exit 7" not in done.stderr and "Permission denied" not in done.stderr, done.stderr[-3000:]
