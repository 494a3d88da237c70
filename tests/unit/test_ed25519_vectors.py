"""Every Wycheproof Ed25519 case through the verify function the audit log and the evaluator share."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import VECTORS
from swarmyard.audit.signing import sign_ed25519, verify_ed25519

WYCHEPROOF = json.loads((VECTORS / "ed25519" / "wycheproof_ed25519_test.json").read_text())
CASES: list[tuple[str, dict[str, Any]]] = [
    (group["publicKey"]["pk"], test) for group in WYCHEPROOF["testGroups"] for test in group["tests"]
]


def test_every_case_is_collected() -> None:
    assert len(CASES) == WYCHEPROOF["numberOfTests"] == 151


@pytest.mark.parametrize(("public_key", "case"), CASES, ids=[f"tc{case['tcId']}" for _, case in CASES])
def test_wycheproof_case(public_key: str, case: dict[str, Any]) -> None:
    assert case["result"] in ("valid", "invalid")
    got = verify_ed25519(bytes.fromhex(public_key), bytes.fromhex(case["msg"]), bytes.fromhex(case["sig"]))
    assert got is (case["result"] == "valid"), case["flags"]


def test_wrong_lengths_are_refused_not_raised() -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from swarmyard.secret_files import public_bytes

    key = Ed25519PrivateKey.generate()
    sig = sign_ed25519(key, b"m")
    assert verify_ed25519(public_bytes(key), b"m", sig)
    assert not verify_ed25519(public_bytes(key)[:31], b"m", sig)
    assert not verify_ed25519(public_bytes(key), b"m", sig + b"\x00")
    assert not verify_ed25519(b"\xff" * 32, b"m", sig)
