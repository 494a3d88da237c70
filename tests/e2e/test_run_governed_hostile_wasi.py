"""A swarm file's own WASI module that misbehaves in its WASI calls, through ``swarmyard run`` on the scripted
provider in real governed machines: a module that asks WASI to sleep for an hour (``poll_oneoff``, where no wasm
runs, so neither fuel nor the epoch deadline would end it) is answered ``notsup`` at once, and one that hands WASI
a pointer outside its memory gets a typed ``tool_error`` the model is shown, not an exception that ends the agent;
the task is done and the run reaches its synthesis.
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

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

#: prints {"slept": false} when poll_oneoff (one clock subscription of an hour) answers an error, else sleeps it
_SLEEPER = """(module
 (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
 (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
 (memory (export "memory") 1)
 (data (i32.const 512) "{\\22slept\\22: false}")
 (func (export "_start")
  (i32.store8 (i32.const 8) (i32.const 0))
  (i32.store (i32.const 16) (i32.const 1))
  (i64.store (i32.const 24) (i64.const 3600000000000))
  (if (i32.eqz (call $poll (i32.const 0) (i32.const 128) (i32.const 1) (i32.const 256))) (then (return)))
  (i32.store (i32.const 32) (i32.const 512)) (i32.store (i32.const 36) (i32.const 16))
  (drop (call $write (i32.const 1) (i32.const 32) (i32.const 1) (i32.const 48)))))"""
#: hands fd_write an iovec array past the end of its one page of memory
_BAD_POINTER = """(module
 (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
 (memory (export "memory") 1)
 (func (export "_start") (drop (call $write (i32.const 1) (i32.const 70000) (i32.const 1) (i32.const 64)))))"""


def _run(folder: Path, swarm: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    done = subprocess.run([sys.executable, "-m", "swarmyard.cli", "run", str(swarm)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [run_dir] = (folder / "runs").iterdir()
    return run_dir, done


def test_a_hostile_modules_wasi_calls_are_answered_and_the_agent_carries_on(short_tmp: Path) -> None:
    import wasmtime

    conf = short_tmp / "conf"
    conf.mkdir()
    (conf / "sleeper.wasm").write_bytes(wasmtime.wat2wasm(_SLEEPER))
    (conf / "badptr.wasm").write_bytes(wasmtime.wat2wasm(_BAD_POINTER))
    last = "{{last_message}}"
    (conf / "replies.json").write_text(json.dumps({
        "scripted-worker": [_tool("sleeper"), _tool("badptr"),
                            _tool("submit_finding", title="bad pointer", body=last)],
        "scripted-lead": [_tool("submit_finding", title="synthesis",
                                body="The lead read what the worker's two tools answered and writes this itself.")],
    }))
    swarm = conf / "swarm.toml"
    swarm.write_text(f"""
[goal]
objective = "Call the two tools."
budget_usd = "1"
call_cap = 30
deadline_s = 300
[[tasks.lenses]]
title = "call"
prompt = "Call both tools."
[workers]
count = 1
concurrency = 1
exec_timeout_s = 120
max_steps = 4
max_failures = 1
model = "scripted-worker"
profile = "governed"
[[workers.tools]]
name = "sleeper"
wasm = "sleeper.wasm"
params = {{}}
description = "Sleep for an hour."
timeout_s = 2.0
[[workers.tools]]
name = "badptr"
wasm = "badptr.wasm"
params = {{}}
description = "Write through a bad pointer."
[lead]
model = "scripted-lead"
profile = "governed"
[providers.script]
kind = "scripted"
models = ["scripted-worker", "scripted-lead"]
replies = "replies.json"
[run]
runs_dir = "{short_tmp / 'runs'}"
sandbox = "local"
""")
    run_dir, done = _run(short_tmp, swarm)
    with sqlite3.connect(run_dir / "store.db") as db:
        bodies = [str(b) for (b,) in db.execute("SELECT body FROM findings ORDER BY created_at").fetchall()]
        [state] = [s for (s,) in db.execute("SELECT state FROM tasks WHERE title = 'call'").fetchall()]
    assert state == "done", done.stderr[-3000:]
    [bad] = [b for b in bodies if b.startswith("Result of badptr")]
    assert "error (tool_error): badptr failed in a WASI call: Pointer out of bounds" in bad, bad
    # the sleeper's answer is the step before: the agent got it (an hour's sleep would have outlived the exec)
    [log] = [p for p in (run_dir / "agents").iterdir() if p.name.startswith("worker-") and p.suffix == ".jsonl"]
    results = [json.loads(line).get("result") for line in log.read_text().splitlines()]
    assert '{"slept": false}' in results, results


def test_a_governed_worker_is_never_told_of_a_machine_tool(short_tmp: Path) -> None:
    # a tool it does not have is answered with the tools it is offered (no shell, read_file or write_file among
    # them), and a call for shell without arguments is refused by name, not told what shell needs
    conf = short_tmp / "conf"
    conf.mkdir()
    (conf / "replies.json").write_text(json.dumps({
        "scripted-worker": [_tool("python", code="import os"), _tool("shell"),
                            _tool("submit_finding", title="refused", body="The worker was refused: {{last_message}}")],
        "scripted-lead": [_tool("submit_finding", title="synthesis",
                                body="The lead read the worker's refusals and writes this synthesis itself.")],
    }))
    swarm = conf / "swarm.toml"
    swarm.write_text(f"""
[goal]
objective = "Ask for tools."
budget_usd = "1"
call_cap = 30
deadline_s = 300
[[tasks.lenses]]
title = "ask"
prompt = "Ask."
[workers]
count = 1
concurrency = 1
exec_timeout_s = 120
max_steps = 4
max_failures = 1
model = "scripted-worker"
profile = "governed"
[lead]
model = "scripted-lead"
profile = "governed"
[providers.script]
kind = "scripted"
models = ["scripted-worker", "scripted-lead"]
replies = "replies.json"
[run]
runs_dir = "{short_tmp / 'runs'}"
sandbox = "local"
""")
    run_dir, _ = _run(short_tmp, swarm)
    [log] = [p for p in (run_dir / "agents").iterdir() if p.name.startswith("worker-") and p.suffix == ".jsonl"]
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    said = [r["malformed"] for s in steps for r in s["replies"] if "malformed" in r]
    assert len(said) == 1 and said[0].startswith("unknown tool 'python'; choose one of "), said
    offered = said[0].split("choose one of ", 1)[1].split(", ")
    assert "board_post" in offered and not {"shell", "read_file", "write_file"} & set(offered), offered
    assert steps[0]["action"]["tool"] == "shell"
    assert steps[0]["result"] == "error (tool_refused): 'shell' is not a tool of the 'governed' profile"
