"""The swarm script swarmyard starts from, written for boxd's SDK: three scouts and a lead, each in a machine of
its own, each running Claude Code headless; the lead reads the scouts' reports from its home folder.

``SEED`` is that script as its shape is described (three scouts and a lead, each ``machines.create``,
``wait_until_ready``, ``exec`` of ``claude -p "..." --dangerously-skip-permissions`` with ``timeout=600``,
``files.upload`` of the reports to ``/home/boxd/reports.md``, ``delete``), written against boxd 0.2.19's SDK names;
the seed's own text was not available to this project, so this is a reconstruction, not a copy. ``ported`` makes
the only two changes a user makes to run it on swarmyard: the import line, and the client's construction (no boxd
API key).
"""

from __future__ import annotations

SEED = '''\
import os

from boxd import Boxd

boxd = Boxd(api_key=os.environ["BOXD_API_KEY"])

QUESTION = "Should a small team bet on building an on-device speech model product in the next year?"
SCOUTS = {
    "market": "Estimate the market size for on-device speech models: who buys, how many, and how fast it grows.",
    "models": "Name the strongest open-source on-device speech models and what each is good and bad at.",
    "risks": "List the risks that would kill the bet, most likely first, each with an early warning sign.",
}

reports = []
for lens, brief in SCOUTS.items():
    machine = boxd.machines.create(f"scout-{lens}")
    boxd.machines.wait_until_ready(machine.id)
    result = boxd.machines.exec(
        machine.id,
        f'claude -p "{QUESTION} {brief}" --dangerously-skip-permissions',
        timeout=600,
    )
    reports.append(f"## {lens}\\n\\n{result.stdout}")
    boxd.machines.delete(machine.id)

lead = boxd.machines.create("lead")
boxd.machines.wait_until_ready(lead.id)
boxd.machines.files.upload(lead.id, "/home/boxd/reports.md", "\\n\\n".join(reports))
result = boxd.machines.exec(
    lead.id,
    'claude -p "Read /home/boxd/reports.md and write one recommendation: go or no-go, and why." '
    "--dangerously-skip-permissions",
    timeout=600,
)
print(result.stdout)
boxd.machines.delete(lead.id)
'''

IMPORT = "from boxd import Boxd"
CONSTRUCTION = 'boxd = Boxd(api_key=os.environ["BOXD_API_KEY"])'


def ported(construction: str = "boxd = Boxd()") -> str:
    """The seed with swarmyard's import and ``construction`` in place of boxd's: nothing else changes."""
    assert SEED.count(IMPORT) == 1 and SEED.count(CONSTRUCTION) == 1
    return SEED.replace(IMPORT, "from swarmyard.boxd import Boxd").replace(CONSTRUCTION, construction)
