"""Reservation arithmetic, token bounds and provider key files."""

from __future__ import annotations

import json
import os
import stat
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmyard.broker import ledger
from swarmyard.broker.chat import ChatRequest, Message, Role
from swarmyard.broker.keys import ProviderKeys, Secret
from swarmyard.broker.tokencount import ByteBoundCounter, cl100k, input_bound
from swarmyard.domain import Price
from swarmyard.errors import ConfigError

prices = st.builds(Price, st.just("m"), st.integers(0, 100_000_000), st.integers(0, 100_000_000))


@given(st.integers(0, 10**7), st.integers(0, 10**6), prices)
def test_worst_case_is_the_exact_cost_rounded_up(inputs: int, outputs: int, price: Price) -> None:
    exact = Fraction(inputs * price.input_per_mtok + outputs * price.output_per_mtok, 1_000_000)
    cost = ledger.worst_case(inputs, outputs, price)
    assert exact <= cost < exact + 1


@given(st.integers(0, 10**9), st.integers(0, 10**6), prices, st.integers(1, 10**6))
def test_largest_affordable_is_the_largest(available: int, inputs: int, price: Price, cap: int) -> None:
    granted = ledger.largest_affordable(available, inputs, price, cap)
    assert 0 <= granted <= cap
    if granted > 0:
        assert ledger.worst_case(inputs, granted, price) <= available
    if granted < cap and ledger.worst_case(inputs, 0, price) <= available:
        assert ledger.worst_case(inputs, granted + 1, price) > available


def test_negative_counts_are_refused() -> None:
    with pytest.raises(ValueError):
        ledger.worst_case(-1, 0, Price("m", 1, 1))


@given(st.text(max_size=300))
def test_cl100k_never_exceeds_the_byte_bound(text: str) -> None:
    assert cl100k().count(text) <= ByteBoundCounter().count(text)


def test_cl100k_counts_exactly_and_names_its_pinned_file() -> None:
    assert cl100k().count("hello world") == 2
    assert "sha256=223921b76ee99bde" in cl100k().method


def test_input_bound_adds_message_overhead() -> None:
    request = ChatRequest("m", (Message(Role.SYSTEM, "ab"), Message(Role.USER, "héllo")))
    assert input_bound(request, ByteBoundCounter()) == 2 + 6 + 2 * 8 + 16


def test_key_file_is_created_0600_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    ProviderKeys.write_file(path, {"openai": "sk-abc"})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(ConfigError):
        ProviderKeys.write_file(path, {"openai": "sk-other"})
    keys = ProviderKeys.from_file(path)
    secret = keys.get("openai")
    assert secret is not None and secret.reveal() == "sk-abc"
    assert "sk-abc" not in repr(keys) + repr(secret) + str(secret)


def test_loose_key_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"openai": "sk-abc"}))
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError) as caught:
        ProviderKeys.from_file(path)
    assert "sk-abc" not in str(caught.value)


def test_keys_from_env_take_only_known_names() -> None:
    keys = ProviderKeys.from_env({"OPENAI_API_KEY": "sk-1", "HOME": "/root", "ANTHROPIC_API_KEY": ""})
    assert keys.values() == ["sk-1"]
    assert isinstance(keys.get("openai"), Secret) and keys.get("anthropic") is None
