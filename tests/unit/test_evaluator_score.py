"""Signed scores: a valid score verifies; any changed field, flipped signature bit or other key does not."""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from swarmyard.cli.evaluator import app
from swarmyard.errors import InvalidInputError
from swarmyard.evaluator.score import SignedScore, sign_score, signing_message, verify_score
from swarmyard.secret_files import public_bytes

SHA = "ab" * 32


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def signed(key: Ed25519PrivateKey) -> SignedScore:
    return sign_score(key, goal="goal_1", artifact_sha256=SHA, split="search", score=7,
                      issued_at=1_700_000_000_123)


def test_a_fresh_score_verifies(signed: SignedScore, key: Ed25519PrivateKey) -> None:
    assert verify_score(signed, public_bytes(key))
    assert verify_score(signed, key.public_key())
    assert signing_message(**signed.signed_fields()) == (
        b'{"artifact_sha256":"' + SHA.encode() + b'","goal":"goal_1","issued_at":1700000000123,'
        b'"score":7,"split":"search"}')


@pytest.mark.parametrize(("field", "value"), [
    ("goal", "goal_2"),
    ("artifact_sha256", "cd" * 32),
    ("split", "holdout"),
    ("score", 8),
    ("score", -7),
    ("issued_at", 1_700_000_000_124),
])
def test_any_changed_field_fails(signed: SignedScore, key: Ed25519PrivateKey, field: str,
                                 value: object) -> None:
    tampered = SignedScore.from_dict({**signed.to_dict(), field: value})
    assert not verify_score(tampered, public_bytes(key))


@pytest.mark.parametrize("bit", [0, 7, 100, 255, 256, 300, 511])
def test_a_flipped_signature_bit_fails(signed: SignedScore, key: Ed25519PrivateKey, bit: int) -> None:
    raw = bytearray(base64.b64decode(signed.signature))
    raw[bit // 8] ^= 1 << (bit % 8)
    tampered = dataclasses.replace(signed, signature=base64.b64encode(bytes(raw)).decode())
    assert not verify_score(tampered, public_bytes(key))


def test_another_key_fails(signed: SignedScore) -> None:
    assert not verify_score(signed, public_bytes(Ed25519PrivateKey.generate()))


@pytest.mark.parametrize("signature", ["", "not base64!", base64.b64encode(b"x" * 63).decode(),
                                       base64.b64encode(b"x" * 64).decode()])
def test_malformed_signatures_fail(signed: SignedScore, key: Ed25519PrivateKey, signature: str) -> None:
    assert not verify_score(dataclasses.replace(signed, signature=signature), public_bytes(key))


def test_non_canonical_base64_of_the_same_signature_fails(signed: SignedScore,
                                                          key: Ed25519PrivateKey) -> None:
    # 64 bytes leave 4 unused bits in the last base64 digit; setting one decodes to the same bytes
    text = signed.signature
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = alphabet.index(text[-3])
    variant = text[:-3] + alphabet[last ^ 1] + text[-2:]
    assert base64.b64decode(variant) == base64.b64decode(text)
    assert not verify_score(dataclasses.replace(signed, signature=variant), public_bytes(key))


def test_a_boolean_score_is_refused(signed: SignedScore, key: Ed25519PrivateKey) -> None:
    one = sign_score(key, goal="g", artifact_sha256=SHA, split="search", score=1, issued_at=5)
    assert not verify_score(dataclasses.replace(one, score=True), public_bytes(key))


def test_round_trip_through_json(signed: SignedScore, key: Ed25519PrivateKey) -> None:
    again = SignedScore.from_dict(json.loads(json.dumps(signed.to_dict())))
    assert again == signed
    assert verify_score(again, public_bytes(key))


@pytest.mark.parametrize(("change", "field"), [
    ({"score": "7"}, "score"),
    ({"score": True}, "score"),
    ({"issued_at": 1.5}, "issued_at"),
    ({"goal": None}, "goal"),
    ({"extra": 1}, "extra"),
])
def test_from_dict_names_the_bad_field(signed: SignedScore, change: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        SignedScore.from_dict({**signed.to_dict(), **change})
    assert caught.value.field == field


def test_sign_refuses_a_bad_digest(key: Ed25519PrivateKey) -> None:
    with pytest.raises(InvalidInputError) as caught:
        sign_score(key, goal="g", artifact_sha256="AB" * 32, split="search", score=1, issued_at=1)
    assert caught.value.field == "artifact_sha256"


def test_cli_verify_accepts_the_score_and_rejects_a_tampered_one(
        signed: SignedScore, key: Ed25519PrivateKey, tmp_path: Path) -> None:
    pub = base64.b64encode(public_bytes(key)).decode()
    good = tmp_path / "score.json"
    good.write_text(json.dumps(signed.to_dict()))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**signed.to_dict(), "score": 99}))
    keyfile = tmp_path / "eval.pub"
    keyfile.write_text(pub + "\n")
    runner = CliRunner()
    ok = runner.invoke(app, ["verify", str(good), "--public-key", pub, "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["valid"] is True
    assert runner.invoke(app, ["verify", str(good), "--public-key", str(keyfile)]).exit_code == 0
    refused = runner.invoke(app, ["verify", str(bad), "--public-key", pub, "--json"])
    assert refused.exit_code == 1
    assert json.loads(refused.stdout)["valid"] is False


def test_cli_keygen_creates_the_key_once(tmp_path: Path) -> None:
    runner = CliRunner()
    first = runner.invoke(app, ["keygen", "--state", str(tmp_path / "state")])
    second = runner.invoke(app, ["keygen", "--state", str(tmp_path / "state")])
    assert first.exit_code == 0, first.output
    assert first.stdout == second.stdout
    assert len(base64.b64decode(first.stdout.strip())) == 32
    assert (tmp_path / "state" / "evaluator.key").stat().st_mode & 0o777 == 0o600


def test_the_evaluator_noun_is_registered_in_the_cli() -> None:
    from swarmyard.cli.main import app as root

    shown = CliRunner().invoke(root, ["evaluator", "--help"])
    assert shown.exit_code == 0, shown.output
    assert "verify" in shown.stdout and "serve" in shown.stdout
