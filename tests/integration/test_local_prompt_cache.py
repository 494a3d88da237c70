"""The embedded model keeps each slot's prompt: a request that starts as the last one did (an agent CLI's system
prompt and tools) has that start read from the cache, not again (llama.cpp's own ``timings`` say how much)."""

from __future__ import annotations

import httpx
import pytest

from swarmyard.broker.providers.local import LocalProvider, smollm2

pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_a_second_request_with_the_same_start_reads_only_what_is_new() -> None:
    provider = LocalProvider(smollm2(), slot_tokens=2048, n_parallel=2)
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly, cite sources." for i in range(60))
    timings = []
    with httpx.Client(base_url=provider.base_url, timeout=300) as http:
        for question in ("Say hi.", "Say bye."):
            answer = http.post("/v1/chat/completions", json={
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                "max_tokens": 2})
            assert answer.status_code == 200, answer.text
            timings.append(answer.json()["timings"])
    first, second = timings
    assert first["cache_n"] == 0 and first["prompt_n"] > 500
    assert second["cache_n"] > 500 and second["prompt_n"] < 50  # only the new question was read
