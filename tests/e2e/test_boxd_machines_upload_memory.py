"""Concurrent large uploads from a coordinator cost its Boxd client's process a bounded amount of memory.

Found from outside: each 60 MiB upload body a coordinator sent to ``/v1/machines/NAME/upload`` was read whole,
parsed and decoded in the client's process (about 85 MB each), and nothing but the connection cap limited how many
at once: 20 took the client from 1.4 GB to 3.2 GB. The routes now hold at most ``MAX_BODIES_BYTES`` of bodies at
once and refuse the rest unread, 503 ``machines_busy`` (retryable). Here a coordinator sends many such uploads at
once and the client process's peak memory (``VmHWM``, reset before the uploads) stays within a bound computed from
that budget, whatever their number.
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

from swarmyard.boxd._spawn import MAX_BODIES_BYTES

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

_UPLOADS = 10  # at 60 MiB each, ~850 MB in the client before the budget; the budget bounds it to ~3 x 128 MiB

#: Run inside the coordinator: ``_UPLOADS`` uploads of 60 MiB at once to a machine of its own; one line per answer.
_INNER = '''
import http.client, json, os, sys, threading, urllib.parse, urllib.request
url, token = os.environ["SWARMYARD_BOXD_URL"].rstrip("/"), os.environ["SWARMYARD_TOKEN"]
headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
made = urllib.request.urlopen(urllib.request.Request(url + "/v1/machines", data=b'{"name": "t"}', headers=headers))
assert made.status == 200
body = b'{"path": "/home/boxd/x", "data_b64": "' + b"A" * ((60 << 20) - 40) + b'"}'
where = urllib.parse.urlparse(url)
answers = []

def send():
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=600)
    connection.request("POST", "/v1/machines/t/upload", body=body, headers=headers)
    answer = connection.getresponse()
    data = answer.read()
    code = json.loads(data)["error"]["code"] if answer.status != 200 else None
    answers.append([answer.status, code])

threads = [threading.Thread(target=send) for _ in range(int(sys.argv[1]))]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(answers))
'''

_SCRIPT = '''
import json, sys
from pathlib import Path
from swarmyard.boxd import Boxd

def kib(field):
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(field + ":"))
    return int(line.split()[1])

with Boxd(root=sys.argv[1]) as boxd:
    lead = boxd.machines.create("lead", spawn=True)
    boxd.machines.wait_until_ready(lead.id)
    boxd.machines.files.upload(lead.id, "/home/boxd/inner.py", Path(sys.argv[2]).read_bytes())
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) from here on
    before = kib("VmRSS")
    ran = boxd.machines.exec(lead.id, ["python3", "/home/boxd/inner.py", sys.argv[3]], timeout=600)
    print(json.dumps({"answers": json.loads(ran.stdout) if ran.exit_code == 0 else ran.stderr,
                      "rss_before": before << 10, "peak": kib("VmHWM") << 10}), flush=True)
'''


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-um-"))
    (path / "root").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_many_concurrent_large_uploads_are_answered_and_the_client_memory_stays_within_the_body_budget(
        folder: Path) -> None:
    (folder / "script.py").write_text(_SCRIPT)
    (folder / "inner.py").write_text(_INNER)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8"}
    ran = subprocess.run([sys.executable, "script.py", str(folder / "root"), str(folder / "inner.py"),
                          str(_UPLOADS)], cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stderr[-3000:]
    report = json.loads(ran.stdout.strip().splitlines()[-1])
    answers = report["answers"]
    assert isinstance(answers, list) and len(answers) == _UPLOADS, answers
    # every upload is answered: written, or refused unread with the typed, retryable error
    assert all(answer in ([200, None], [503, "machines_busy"]) for answer in answers), answers
    assert [200, None] in answers and [503, "machines_busy"] in answers, answers
    # a body held costs about three times its size (read, parsed, decoded); the rest is the process's own
    growth = report["peak"] - report["rss_before"]
    assert growth <= 3 * MAX_BODIES_BYTES + (128 << 20), (growth, answers)
