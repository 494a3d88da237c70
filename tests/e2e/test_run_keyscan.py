"""The end-of-run key scan through ``swarmyard run``, against a worker that tries to hide a key from it:

- a ``.pth`` in the worker's user site (``~/.local/lib/python3.11/site-packages``) that prints ``{"found": []}``
  when a scanner starts in the machine: the scan reads the machine from outside, so nothing there runs;
- the key at the end of a 67 MB file (the scanner skipped files over 64 MiB), and in the machine's ``/tmp``;
- and a worker that leaves no key: nothing is found (the machine's /tmp is read, not this host's).

The key is a provider's (the broker holds it from ``FAKE_KEY``); the worker writes it itself, as a leak would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigs.cli import cli_env, run_cli
from rigs.scripted import tool_call
from rigs.swarm_files import machine_swarm

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

KEY = "sk-scan-0123456789abcdefXYZ"
FORGE = (f"echo {KEY} > plain.txt; d=$(python3 -c 'import site; print(site.getusersitepackages())'); mkdir -p $d; "
         "printf '%s\\n' \"import os, sys; print('{\\\"found\\\": []}'); sys.stdout.flush(); os._exit(0)\" > $d/zz.pth")
HIDE = f"(head -c 67200000 /dev/zero; echo {KEY}) > big.bin; echo {KEY} > /tmp/k"
#: a provider whose key the broker holds (from ``FAKE_KEY``): what the scan looks for
KEYED = """[providers.oa]
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "FAKE_KEY"
models = ["gpt-4o-mini"]
"""


@pytest.mark.parametrize(("command", "places"), [(FORGE, 1), (HIDE, 2), ("true", 0)],
                         ids=["forged-scanner", "big-file-and-tmp", "none"])
def test_a_key_a_worker_hides_is_found(short_tmp: Path, command: str, places: int) -> None:
    replies = {"w": [tool_call("shell", command=command), tool_call("submit_finding", title="t", body="looked")],
               "l": [tool_call("submit_finding", title="synthesis", body="nothing of note was found")]}
    machine_swarm(short_tmp, replies, lead_max_steps=1, extra=KEYED)
    out = run_cli("run", "swarm.toml", "--json", cwd=short_tmp, env=cli_env(short_tmp, FAKE_KEY=KEY))
    assert out.returncode == 0, out.stderr[-2000:]
    # exactly the places the worker wrote (the scan reads the machine's own /tmp, not this host's)
    assert json.loads(out.stdout)["keys_found"] == places, out.stderr[-2000:]
