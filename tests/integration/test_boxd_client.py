"""The Boxd client in real ``local`` machines on an embedded plane with the scripted provider: boxd's shapes
(str output with the bytes kept, str uploads, /home/boxd, names or ids), the built-in headless agent logged in,
forks with an identity of their own, the async twin, and bad input refused with a typed error, changing nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.boxd import AsyncBoxd, Boxd
from swarmyard.broker.providers.scripted import Say, ScriptedProvider
from swarmyard.errors import InvalidInputError, NotFoundError, UserError

pytestmark = [pytest.mark.bwrap]
MODEL = "scripted-agent-model"


def _providers(folder: Path) -> Path:
    (folder / "providers.toml").write_text(
        f'[providers.script]\nkind = "scripted"\nmodels = ["{MODEL}"]\n')
    return folder / "providers.toml"


@pytest.fixture
def folder(short_tmp: Path) -> Path:
    return short_tmp


@pytest.fixture
def scripted() -> ScriptedProvider:
    return ScriptedProvider({MODEL: [Say("first answer"), Say("second answer")]}, name="script")


@pytest.fixture
def boxd(folder: Path, scripted: ScriptedProvider) -> Iterator[Boxd]:
    client = Boxd(providers=_providers(folder), provider_objects={"script": scripted}, model=MODEL)
    yield client
    client.close()


def test_boxd_shapes_home_and_the_headless_agent(boxd: Boxd, scripted: ScriptedProvider) -> None:
    machine = boxd.machines.create("alpha")
    ready = boxd.machines.wait_until_ready(machine.id, timeout=60)
    assert ready.status == "running" and boxd.machines.get("alpha").id == machine.id
    written = boxd.machines.files.upload("alpha", "/home/boxd/notes.md", "héllo\n")
    assert written == len("héllo\n".encode())
    assert boxd.machines.files.download(machine.id, "notes.md") == "héllo\n".encode()  # relative: the home
    result = boxd.machines.exec(machine.id, "printf '\\377ok'; echo err >&2; exit 3")
    assert (result.stdout, result.stdout_raw, result.stderr, result.exit_code, result.success) == (
        "\ufffdok", b"\xffok", "err\n", 3, False)
    said = boxd.machines.exec("alpha", 'swarmyard-agent -p "Say something" --dangerously-skip-permissions')
    assert said.success and said.stdout == "first answer\n", said.stderr
    assert scripted.requests[-1].messages[-1].content == "Say something"
    assert "sk-" not in repr(scripted.requests[-1])
    boxd.machines.delete("alpha")
    assert boxd.machines.list() == []
    with pytest.raises(NotFoundError):
        boxd.machines.get("alpha")


def test_a_fork_keeps_the_disk_and_has_its_own_identity(boxd: Boxd) -> None:
    source = boxd.machines.create("source")
    boxd.machines.wait_until_ready(source.id)
    boxd.machines.files.upload(source.id, "kept.txt", b"on the disk")
    fork = boxd.machines.fork("source", "copy")
    boxd.machines.wait_until_ready(fork.id)
    assert fork.source is not None and fork.source.kind == "fork"
    assert boxd.machines.files.download("copy", "/home/boxd/kept.txt") == b"on the disk"
    tokens = [boxd.machines.exec(m, "echo $SWARMYARD_TOKEN").stdout for m in ("source", "copy")]
    assert tokens[0] != tokens[1] and all(t.startswith("sy1.") for t in tokens)


def test_every_agent_login_file_is_written_private_with_the_machine_s_own_token(boxd: Boxd) -> None:
    from swarmyard.boxd import _logins
    from swarmyard.boxd._plane import Login

    source = boxd.machines.create("source")
    boxd.machines.wait_until_ready(source.id)
    fork = boxd.machines.fork("source", "copy")
    boxd.machines.wait_until_ready(fork.id)
    tokens = {name: boxd.machines.exec(name, "echo $SWARMYARD_TOKEN").stdout.strip() for name in ("source", "copy")}
    assert tokens["source"] != tokens["copy"]
    for name, token in tokens.items():
        # only the paths are read here: they depend on neither the relay nor the login
        paths = sorted(_logins.files("http://127.0.0.1:1", Login("w", "t", "task", 1, "g"), MODEL))
        assert len(paths) == 6
        modes = boxd.machines.exec(name, ["stat", "-c", "%a", *paths])
        assert modes.success and modes.stdout.split() == ["600"] * 6, modes.stderr
        texts = [boxd.machines.files.download(name, path).decode() for path in paths]
        # a fork's files are its own, written at its ready over the ones its disk copied
        assert sum(token in text for text in texts) >= 4, (name, paths)
        other = tokens["copy" if name == "source" else "source"]
        assert not any(other in text for text in texts), name


def test_bad_input_is_refused_and_changes_nothing(boxd: Boxd) -> None:
    boxd.machines.create("only")
    with pytest.raises(UserError, match="isolated"):
        boxd.machines.create("open", isolated=False)
    with pytest.raises(InvalidInputError):
        boxd.machines.create("bad name!")
    with pytest.raises(InvalidInputError):
        boxd.machines.files.upload("only", "x", 12)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        boxd.machines.wait_until_ready("only", timeout=-1)
    with pytest.raises(NotFoundError):
        boxd.machines.exec("nope", "true")
    assert [m.name for m in boxd.machines.list()] == ["only"]
    with pytest.raises(InvalidInputError):
        Boxd(budget_usd="1e3")
    with pytest.raises(InvalidInputError):
        Boxd(budget_usd="1", machine_budget_usd="2")


def test_async_boxd_is_the_same_surface(folder: Path) -> None:
    scripted = ScriptedProvider({MODEL: [Say("async answer")]}, name="script")

    async def main() -> tuple[str, list[str]]:
        async with AsyncBoxd(providers=_providers(folder), provider_objects={"script": scripted},
                             model=MODEL) as boxd:
            machine = await boxd.machines.create("a1")
            await boxd.machines.wait_until_ready(machine.id)
            await boxd.machines.files.upload(machine.id, "q.txt", "What?")
            said = await boxd.machines.exec(machine.id, "swarmyard-agent -p - < q.txt")
            names = [m.name for m in await boxd.machines.list()]
            await boxd.machines.delete(machine.id)
            return said.stdout, names

    assert asyncio.run(main()) == ("async answer\n", ["a1"])
    assert scripted.requests[0].messages[-1].content == "What?"
