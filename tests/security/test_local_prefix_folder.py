"""The embedded model's saved prompt starts (``prefixes/`` in the model cache) are this user's alone.

A saved start is a llama.cpp slot's state: the prompt it read, and what a later request with the same start
answers from. Its name is a hash of the model and the start, which anyone can compute for a well-known start
(an agent CLI's system prompt). So the folder is made 0700 (one left open to others is closed), and a folder
another user owns, where that user could read the states or put one of their own under a start's name, is not
used: nothing is saved there and the provider still answers. The folder rule on real folders (one left open,
another user's, a link to one, a file in its place); then a real LocalProvider on the bundled SmolLM2 (135M).
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from swarmyard.broker.chat import ChatRequest, Message, Role, Tool
from swarmyard.broker.providers.local import LocalProvider, smollm2
from swarmyard.broker.providers.prefixes import SUFFIX, private_folder
from swarmyard.broker.providers.protocol import CallState

SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly, cite sources." for i in range(120))


def _ask(folder: Path) -> None:
    async def run() -> None:
        provider = LocalProvider(smollm2(), slot_tokens=4096, n_parallel=1, prefix_folder=folder)
        try:
            # with a tool: only a tool request's long start is kept in a slot and saved (a plain one is not)
            say = Tool("say", "Say something.", {"type": "object", "properties": {"text": {"type": "string"}},
                                                 "required": ["text"]})
            request = ChatRequest("m", (Message(Role.SYSTEM, SYSTEM), Message(Role.USER, "Say hi.")), tools=(say,),
                                  max_tokens=16)
            await provider.complete(request, CallState(caller="w"))
        finally:
            await provider.aclose()

    asyncio.run(run())


@pytest.mark.skipif(os.getuid() != 0, reason="gives a folder to another user (chown)")
def test_the_folder_is_made_this_users_alone_or_not_used(tmp_path: Path) -> None:
    opened = tmp_path / "opened"
    opened.mkdir()
    opened.chmod(0o777)
    assert private_folder(opened) == opened and stat.S_IMODE(opened.stat().st_mode) == 0o700
    made = tmp_path / "cache" / "prefixes"
    assert private_folder(made) == made and stat.S_IMODE(made.stat().st_mode) == 0o700
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o777)
    os.chown(theirs, 65534, 65534)
    assert private_folder(theirs) is None
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o777 and theirs.stat().st_uid == 65534  # left as it was
    linked = tmp_path / "linked"
    linked.symlink_to(opened)
    assert private_folder(linked) is None
    (tmp_path / "file").write_text("")
    assert private_folder(tmp_path / "file") is None


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.skipif(os.getuid() != 0, reason="gives a folder to another user (chown)")
def test_saved_starts_go_only_to_a_folder_of_this_users_that_no_one_else_opens(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o777)
    mine.chmod(0o777)
    _ask(mine)
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700
    assert list(mine.glob(f"*{SUFFIX}"))  # it is still used: the start was saved

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o777)
    os.chown(theirs, 65534, 65534)
    _ask(theirs)  # answers all the same
    assert not list(theirs.iterdir())
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o777 and theirs.stat().st_uid == 65534  # not touched

    linked = tmp_path / "linked"
    linked.symlink_to(theirs)
    _ask(linked)
    assert not list(theirs.iterdir())
