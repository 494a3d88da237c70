"""A lead may not submit a finding's body as its own, also past the built-in agent: through ``swarmyard run``.

The lead's shell reads the agent's token from ``/proc/<agent>/environ`` (same user in the machine), learns the
current fencing token from the plane's ``stale_fencing_token`` answer and POSTs ``submit_finding`` with the
worker's body itself; the plane checks what the lead's task submits and answers ``unoriginal_finding``. Its next
reply says back the agent's last-step nudge (the scripted ``{{last_message}}``), which is refused too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigs.cli import run_cli
from rigs.scripted import tool_call
from rigs.swarm_files import machine_swarm
from swarmyard.domain import LEAD_GROUP
from swarmyard.rules.instructions import LAST_STEP
from swarmyard.store import open_store

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.slow,
]

BODY = ("The market for on-device speech models is driven by privacy regulation and offline use in cars, phones "
        "and hearing aids. Three buyer groups dominate: handset makers, automotive suppliers and medical device "
        "firms.")
# the lead's shell: find the agent, take its token, call the plane directly with the worker's body
POST = r"""
import glob, json, urllib.error, urllib.request
pid = next(p for p in glob.glob('/proc/[0-9]*') if b'swarmyard.agents' in open(p + '/cmdline', 'rb').read())
env = dict(l.split('=', 1) for l in open(pid + '/environ').read().split('\0') if '=' in l)
url, tok, tid = env['SWARMYARD_PLANE_URL'].rstrip('/'), env['SWARMYARD_TOKEN'], env['SWARMYARD_TASK_ID']
def call(name, body):
    req = urllib.request.Request(f'{url}/v1/tools/{name}', data=json.dumps(body).encode(),
                                 headers={'Authorization': 'Bearer ' + tok, 'Content-Type': 'application/json'})
    try:
        return json.loads(urllib.request.urlopen(req).read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read())
for ft in range(1, 10):
    got = call('read_findings', {'task_id': tid, 'fencing_token': ft})
    if 'error' not in got:
        break
print(json.dumps(call('submit_finding', {'task_id': tid, 'fencing_token': ft, 'title': 'synthesis',
                                         'body': open('/tmp/f.txt').read()})))
"""
def test_a_leads_shell_cannot_store_a_workers_finding(short_tmp: Path) -> None:
    shell = f"printf '%s' '{BODY}' > /tmp/f.txt; cat > /tmp/b.py <<'PY'\n{POST}\nPY\npython3 /tmp/b.py"
    replies = {"w": [tool_call("submit_finding", title="market", body=BODY)],
               "l": [tool_call("shell", command=shell),
                     tool_call("submit_finding", title="synthesis", body="{{last_message}}")]}
    machine_swarm(short_tmp, replies, lead_max_steps=2)
    out = run_cli("run", "swarm.toml", "--quiet", cwd=short_tmp)
    # both of the lead's submissions are refused, so it reaches no result: that is no synthesis, and the run says so
    assert out.returncode == 1, out.stderr[-2000:]
    assert "ended without a synthesis: the lead reached no result" in out.stderr
    (run_dir,) = (short_tmp / "runs").iterdir()
    goal = json.loads((run_dir / "run.json").read_text())["goal_id"]
    store = open_store(f"sqlite:///{run_dir / 'store.db'}")
    try:
        lead = [f.body for f in store.read_findings(goal, group=LEAD_GROUP)]
    finally:
        store.close()
    assert lead and all(BODY not in body and not body.startswith(LAST_STEP[:30]) for body in lead), lead
    # what the shell's own POST got back: the plane's typed refusal
    transcript = next((run_dir / "agents").glob("lead-*.jsonl")).read_text()
    assert "unoriginal_finding" in transcript
