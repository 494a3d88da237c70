"""Snapshots through the Boxd client in real ``local`` machines: versions from a folder and from a machine, the
same disk digest in every machine made from one version, ``from_snapshot=NAME[:VERSION]``, and refusals.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.boxd import Boxd
from swarmyard.broker.providers.scripted import ScriptedProvider
from swarmyard.errors import ConflictError, InvalidInputError, NotFoundError

pytestmark = [pytest.mark.bwrap]


@pytest.fixture
def folder(short_tmp: Path) -> Path:
    return short_tmp


@pytest.fixture
def boxd(folder: Path) -> Iterator[Boxd]:
    (folder / "providers.toml").write_text('[providers.script]\nkind = "scripted"\nmodels = ["m"]\n')
    client = Boxd(providers=folder / "providers.toml", provider_objects={"script": ScriptedProvider({})}, model="m",
                  root=folder / "machines")
    yield client
    client.close()


def test_machines_from_one_snapshot_start_identical(boxd: Boxd, folder: Path) -> None:
    golden = folder / "golden"
    (golden / "repo").mkdir(parents=True)
    (golden / "repo" / "main.py").write_text("print('v1')\n")
    (golden / "notes.md").write_text("warm start\n")
    first = boxd.snapshots.create_from_folder(golden, "golden")
    assert (first.name, first.version) == ("golden", 1)
    a = boxd.machines.create("a", from_snapshot="golden")
    b = boxd.machines.create("b", from_snapshot="golden:1")
    for machine in (a, b):
        boxd.machines.wait_until_ready(machine.id)
    assert a.source is not None and (a.source.kind, a.source.name, a.source.version) == ("snapshot", "golden", 1)
    assert boxd.machines.disk_digest("a") == boxd.machines.disk_digest("b") == first.digest
    assert boxd.machines.exec("b", "python3 repo/main.py").stdout == "v1\n"
    boxd.machines.files.upload("a", "repo/main.py", "print('v2')\n")
    assert boxd.machines.disk_digest("a") != first.digest  # the digest sees a change
    second = boxd.snapshots.create("a", "golden")
    assert second.version == 2 and second.digest == boxd.machines.disk_digest("a")
    assert [s.version for s in boxd.snapshots.versions("golden")] == [1, 2]
    newest = boxd.machines.create("c", from_snapshot="golden")
    older = boxd.machines.create("d", from_snapshot="golden:1")
    assert boxd.machines.exec(newest.id, "python3 repo/main.py").stdout == "v2\n"
    assert boxd.machines.exec(older.id, "python3 repo/main.py").stdout == "v1\n"
    assert [(s.name, s.version) for s in boxd.snapshots.list()] == [("golden", 2)]
    with pytest.raises(ConflictError, match="live machine"):
        boxd.snapshots.delete("golden:1")  # a, b and d run on it
    for name in ("a", "b", "d"):
        boxd.machines.delete(name)
    boxd.snapshots.delete("golden:1")
    assert [s.version for s in boxd.snapshots.versions("golden")] == [2]
    with pytest.raises(NotFoundError):
        boxd.machines.create("e", from_snapshot="golden:1")


def test_bad_snapshot_names_are_refused_and_change_nothing(boxd: Boxd, folder: Path) -> None:
    for ref in ("golden:0", "golden:x", "gol den", "golden:01", ""):
        with pytest.raises(InvalidInputError):
            boxd.machines.create("x", from_snapshot=ref)
    with pytest.raises(NotFoundError):
        boxd.machines.create("x", from_snapshot="nothing")
    with pytest.raises(InvalidInputError):
        boxd.snapshots.create_from_folder(folder / "missing", "golden")
    with pytest.raises(InvalidInputError):
        boxd.snapshots.create_from_folder(folder, "golden:3")
    assert boxd.machines.list() == [] and boxd.snapshots.list() == []
