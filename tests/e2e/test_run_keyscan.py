"""The end-of-run key scan through ``swarmyard run``, against a worker that tries to hide a key from it:

- a ``.pth`` in the worker's user site (``~/.local/lib/python3.11/site-packages``) that prints ``{"found": []}``
  when a scanner starts in the machine: the scan reads the machine from outside, so nothing there runs;
- the key at the end of a 67 MB file (the scanner skipped files over 64 MiB), and in the machine's ``/tmp``;
- and a worker that leaves no key: nothing is found (the machine's /tmp is read, not this host's).

The key is a provider's (the broker holds it from ``FAKE_KEY``); the worker writes it itself, as a leak would.
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

import pytest

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

CLI = "from swarmyard.cli.main import main; main()"
KEY = "sk-scan-0123456789abcdefXYZ"
FORGE = (f"echo {KEY} > plain.txt; d=$(python3 -c 'import site; print(site.getusersitepackages())'); mkdir -p $d; "
         "printf '%s\\n' \"import os, sys; print('{\\\"found\\\": []}'); sys.stdout.flush(); os._exit(0)\" > $d/zz.pth")
HIDE = f"(head -c 67200000 /dev/zero; echo {KEY}) > big.bin; echo {KEY} > /tmp/k"
SWARM = """
[goal]
objective = "Look around the machine."
budget_usd = "0.50"
call_cap = 20
deadline_s = 200
max_depth = 1
[[tasks.lenses]]
title = "look"
prompt = "Look around your machine."
[policy]
kind = "team"
[workers]
agent = "builtin"
count = 1
concurrency = 1
max_steps = 2
model = "w"
[lead]
agent = "builtin"
model = "l"
max_steps = 1
[providers.s]
kind = "scripted"
models = ["w", "l"]
replies = "replies.json"
[providers.oa]
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "FAKE_KEY"
models = ["gpt-4o-mini"]
"""


@pytest.fixture
def folder() -> Iterator[Path]:
    """An ordinary folder with a short path (the plane's Unix socket lives in the run folder)."""
    path = Path(tempfile.mkdtemp(prefix="sy-ks-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize(("command", "places"), [(FORGE, 1), (HIDE, 2), ("true", 0)],
                         ids=["forged-scanner", "big-file-and-tmp", "none"])
def test_a_key_a_worker_hides_is_found(folder: Path, command: str, places: int) -> None:
    replies = {"w": [{"tool_calls": [{"name": "shell", "arguments": {"command": command}}]},
                     {"tool_calls": [{"name": "submit_finding", "arguments": {"title": "t", "body": "looked"}}]}],
               "l": [{"tool_calls": [{"name": "submit_finding",
                                      "arguments": {"title": "synthesis", "body": "nothing of note was found"}}]}]}
    (folder / "replies.json").write_text(json.dumps(replies))
    (folder / "swarm.toml").write_text(SWARM)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
           "FAKE_KEY": KEY}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    out = subprocess.run([sys.executable, "-c", CLI, "run", "swarm.toml", "--json"], cwd=folder, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    # exactly the places the worker wrote (the scan reads the machine's own /tmp, not this host's)
    assert json.loads(out.stdout)["keys_found"] == places, out.stderr[-2000:]
