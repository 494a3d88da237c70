"""A long prompt start the embedded model read once is saved in the model cache folder, and a fresh process
(a new provider on the same folder) restores it: its first request with that start reads only its own suffix
(llama.cpp's own count of the prompt tokens it read)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from swarmyard.broker.chat import ChatRequest, Message, Role, Tool
from swarmyard.broker.providers.local import LocalProvider, smollm2
from swarmyard.broker.providers.prefixes import KEEP, SUFFIX
from swarmyard.broker.providers.protocol import CallState

pytestmark = [pytest.mark.model, pytest.mark.slow]

SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly, cite sources." for i in range(120))
LOOKUP = Tool("lookup", "Look a word up.", {"type": "object", "properties": {"word": {"type": "string"}},
                                            "required": ["word"]})


def _ask(folder: Path, *questions: tuple[str, str]) -> int:
    """``(system, question)`` requests on one new provider: the prompt tokens it read."""

    async def run() -> int:
        provider = LocalProvider(smollm2(), slot_tokens=4096, n_parallel=2, prefix_folder=folder)
        try:
            for system, question in questions:
                request = ChatRequest("m", (Message(Role.SYSTEM, system), Message(Role.USER, question)),
                                      tools=(LOOKUP,), max_tokens=4)
                await provider.complete(request, CallState(caller="w"))
            return provider.prompt_tokens_read()
        finally:
            await provider.aclose()

    return asyncio.run(run())


def test_a_fresh_process_reads_only_the_suffix_of_a_start_saved_before(tmp_path: Path) -> None:
    assert _ask(tmp_path, (SYSTEM, "Say hi.")) > 1000
    saved = sorted(tmp_path.glob(f"*{SUFFIX}"))
    assert len(saved) == 1
    read_again = _ask(tmp_path, (SYSTEM, "Say bye, and something longer."))
    assert read_again < 50, read_again  # the question, not the start
    assert sorted(tmp_path.glob(f"*{SUFFIX}")) == saved


def test_another_start_gets_its_own_file_and_the_oldest_beyond_the_limit_go(tmp_path: Path) -> None:
    # the starts differ only in their last words: each is a start of its own (its own file), and the model reads
    # only those last words of the later ones (a slot still holds the shared part), not every start whole
    _ask(tmp_path, *[(f"{SYSTEM} Variant {n}.", "Say hi.") for n in range(KEEP + 1)])
    assert len(list(tmp_path.glob(f"*{SUFFIX}"))) == KEEP
    assert not list(tmp_path.glob("*.part"))
