"""A coordinator machine: created with ``spawn=True``, its own ``Boxd()`` (no key, no configuration) makes, runs,
forks and deletes sibling machines through the client that made it, capped, and its siblings go when it goes.

The seed's boxd script runs unchanged inside it but for the import (``python3 swarm.py`` in the machine): three
scouts and a lead, each a sibling running Claude Code on the scripted provider.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from boxd_seed import ported

from swarmyard.boxd import Boxd
from swarmyard.broker.providers.scripted import Say, ScriptedProvider

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]
MODEL = "scripted-agent-model"
ANSWERS = ("Market: small.", "Models: two good ones.", "Risks: many.", "Recommendation: go.")


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sy-sp-"))
    (path / "providers.toml").write_text(f'[providers.script]\nkind = "scripted"\nmodels = ["{MODEL}"]\n')
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_seed_runs_inside_a_coordinator_machine(folder: Path) -> None:
    provider = ScriptedProvider({MODEL: [Say(a) for a in ANSWERS]}, name="script")
    with Boxd(providers=folder / "providers.toml", provider_objects={"script": provider}, model=MODEL) as boxd:
        coordinator = boxd.machines.create("coordinator", spawn=True)
        boxd.machines.wait_until_ready(coordinator.id)
        boxd.machines.files.upload(coordinator.id, "swarm.py", ported())  # the seed, with Boxd() as it is
        done = boxd.machines.exec(coordinator.id, "python3 swarm.py", timeout=600)
        assert done.success, done.stderr[-3000:]
        assert done.stdout.strip() == ANSWERS[-1]
        assert len(provider.requests) == 4  # one claude -p per sibling, each answered
        assert [m.name for m in boxd.machines.list()] == ["coordinator"]  # the seed deleted its siblings


def test_siblings_are_capped_scoped_and_deleted_with_their_coordinator(folder: Path) -> None:
    provider = ScriptedProvider({}, name="script")
    with Boxd(providers=folder / "providers.toml", provider_objects={"script": provider}, model=MODEL,
              spawn_cap=3) as boxd:
        coordinator = boxd.machines.create("coordinator", spawn=True)
        plain = boxd.machines.create("plain")
        for machine in (coordinator, plain):
            boxd.machines.wait_until_ready(machine.id)
        program = '''
from swarmyard.boxd import Boxd
from swarmyard.errors import SwarmyardError
boxd = Boxd()
a = boxd.machines.create("sib-a")
boxd.machines.wait_until_ready(a.id)
boxd.machines.files.upload(a.id, "kept.txt", "made by the coordinator")
b = boxd.machines.fork("sib-a", "sib-b")
print(boxd.machines.files.download("sib-b", "kept.txt").decode())
print(boxd.machines.exec("sib-b", "echo $HOME").stdout.strip())
# a name the client's other machine has is free here: this machine's names are its own
print(boxd.machines.create("plain").name)
# past the cap; then the client's machine it did not make (by id), answered as one that does not exist
other = open("plain-id.txt").read()
for refused in (lambda: boxd.machines.create("sib-c"), lambda: boxd.machines.get(other),
                lambda: boxd.machines.get("no-such-machine"), lambda: boxd.machines.exec(other, "true"),
                lambda: boxd.machines.delete(other)):
    try:
        refused()
    except SwarmyardError as exc:
        print("refused:", exc.code, exc.message.replace(other, "X").replace("no-such-machine", "X"))
print(sorted(m.name for m in boxd.machines.list()))
'''
        boxd.machines.files.upload(coordinator.id, "make.py", program)
        boxd.machines.files.upload(coordinator.id, "plain-id.txt", plain.id)
        done = boxd.machines.exec(coordinator.id, "python3 make.py", timeout=300)
        assert done.success, done.stderr[-3000:]
        lines = done.stdout.splitlines()
        assert lines[:3] == ["made by the coordinator", "/home/boxd", "plain"], done.stdout
        assert lines[3].startswith("refused: forbidden ") and lines[-1] == "['plain', 'sib-a', 'sib-b']"
        unknown = set(lines[4:-1])
        assert len(lines[4:-1]) == 4 and len(unknown) == 1 and unknown.pop().startswith("refused: not_found ")
        assert sorted(m.name for m in boxd.machines.list()) == [
            "coordinator", "coordinator.plain", "coordinator.sib-a", "coordinator.sib-b", "plain"]
        # a machine without the capability makes nothing: Boxd() says so, and its token opens no machines route
        boxd.machines.files.upload(plain.id, "make.py", program)
        refused = boxd.machines.exec(plain.id, "python3 make.py", timeout=120)
        assert not refused.success and "spawn=True" in refused.stderr
        forged = boxd.machines.exec(plain.id, 'SWARMYARD_BOXD_URL="$SWARMYARD_PLANE_URL" python3 make.py', timeout=120)
        assert not forged.success and "InvalidTokenError" in forged.stderr
        boxd.machines.delete("coordinator")
        assert [m.name for m in boxd.machines.list()] == ["plain"]
