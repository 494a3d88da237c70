"""C2SP signed notes, checkpoints and tlog-cosignatures: the shared vectors and round trips."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conftest import VECTORS
from swarmyard.audit.checkpoint import Checkpoint, open_checkpoint
from swarmyard.audit.merkle import EMPTY_ROOT
from swarmyard.audit.note import COSIGNATURE_V1, Signer, Verifier, open_note, parse_note, sign_note
from swarmyard.errors import InvalidSignatureError

NOTES = json.loads((VECTORS / "c2sp" / "signed-notes.json").read_text())


def test_vector_file_format_is_the_one_we_implement() -> None:
    fmt = NOTES["format"]
    assert "0x01 || ed25519 public key" in fmt
    assert "sha256(NAME || '\\n' || 0x01 || pubkey)[:4]" in fmt
    assert len(NOTES["cases"]) == 8


@pytest.mark.parametrize("case", NOTES["cases"], ids=[c["desc"] for c in NOTES["cases"]])
def test_signed_note_vector(case: dict[str, Any]) -> None:
    verifier = Verifier.parse(case["vkey"])
    assert verifier.vkey == case["vkey"]
    if case["valid"]:
        note, verified = open_note(case["note"], [verifier])
        assert verified == [verifier]
        assert note.render() == case["note"]
    else:
        with pytest.raises(InvalidSignatureError):
            open_note(case["note"], [verifier])


def test_deterministic_signature_matches_the_vector() -> None:
    case = next(c for c in NOTES["cases"] if c.get("deterministic_signature"))
    signer = Signer.parse(case["skey"])
    assert signer.skey == case["skey"]
    assert signer.verifier.vkey == case["vkey"]
    text = parse_note(case["note"]).text
    assert sign_note(text, [signer]).render() == case["note"]


def test_sum_golang_org_checkpoint_parses() -> None:
    case = next(c for c in NOTES["cases"] if c["vkey"].startswith("sum.golang.org") and c["valid"])
    signed, cosigners = open_checkpoint(case["note"], Verifier.parse(case["vkey"]))
    assert signed.checkpoint.origin == "go.sum database tree"
    assert signed.checkpoint.size == 6476701
    assert cosigners == []


def test_unknown_keys_and_malformed_notes_are_refused() -> None:
    case = NOTES["cases"][0]
    other = Signer("example.com/foo", Ed25519PrivateKey.generate()).verifier
    with pytest.raises(InvalidSignatureError, match="no signature from a known key"):
        open_note(case["note"], [other])
    for bad in ["no blank line\n\u2014 a AAAA\n", "text\n\n\u2014 name !!!notbase64\n", "text\n\n",
                "text\n\n- name AAAAAAA=\n", "text\n\n\u2014 name AAAA\n"]:
        with pytest.raises(InvalidSignatureError):
            parse_note(bad)
    for bad_vkey in ["name+0000+AQ==", "na me+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k",
                     "example.com/foo+530d903b+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"]:
        with pytest.raises(InvalidSignatureError):
            Verifier.parse(bad_vkey)


def test_checkpoint_body_round_trip_and_strictness() -> None:
    cp = Checkpoint("example.com/log", 42, EMPTY_ROOT)
    assert cp.body == f"example.com/log\n42\n{base64.b64encode(EMPTY_ROOT).decode()}\n"
    assert Checkpoint.parse(cp.body) == cp
    root = base64.b64encode(EMPTY_ROOT).decode()
    for bad in [f"o\n042\n{root}\n", f"o\n-1\n{root}\n", "o\n1\nAAAA\n", f"\n1\n{root}\n", f"o\n1\n{root}",
                f"o\n1\n{root}\n\n"]:
        with pytest.raises(InvalidSignatureError):
            Checkpoint.parse(bad)


def _cosign_vectors() -> tuple[Signer, Signer, Checkpoint]:
    log = Signer("example.com/log", Ed25519PrivateKey.generate())
    witness = Signer("witness.example", Ed25519PrivateKey.generate(), COSIGNATURE_V1)
    return log, witness, Checkpoint("example.com/log", 7, bytes(range(32)))


def test_cosignature_round_trip_and_layout() -> None:
    log, witness, cp = _cosign_vectors()
    note = sign_note(cp.body, [log])
    sig = witness.signature(note.text, timestamp=1_700_000_123)
    # C2SP tlog-cosignature: key id over 0x04, then an 8-byte big-endian time, then 64 signature bytes.
    import hashlib

    pub = witness.verifier.public_key
    assert sig.key_id == hashlib.sha256(b"witness.example\n\x04" + pub).digest()[:4]
    assert sig.signature[:8] == (1_700_000_123).to_bytes(8, "big")
    assert len(sig.signature) == 72
    assert sig.timestamp == 1_700_000_123
    signed, cosigners = open_checkpoint(note.with_signature(sig).render(), log.verifier, [witness.verifier])
    assert signed.checkpoint == cp
    assert cosigners == [witness.verifier]
    assert Verifier.parse(witness.verifier.vkey) == witness.verifier


def test_tampered_cosignature_time_or_body_fails() -> None:
    log, witness, cp = _cosign_vectors()
    note = sign_note(cp.body, [log])
    sig = witness.signature(note.text, timestamp=100)
    moved = type(sig)(sig.name, sig.key_id, (101).to_bytes(8, "big") + sig.signature[8:])
    with pytest.raises(InvalidSignatureError, match=r"witness\.example"):
        open_checkpoint(note.with_signature(moved).render(), log.verifier, [witness.verifier])
    # The same cosignature on another checkpoint body fails too.
    other = sign_note(Checkpoint("example.com/log", 8, bytes(range(32))).body, [log])
    with pytest.raises(InvalidSignatureError):
        open_checkpoint(other.with_signature(sig).render(), log.verifier, [witness.verifier])
    # A note signed only by the witness is not a checkpoint of the log.
    with pytest.raises(InvalidSignatureError):
        open_checkpoint(sign_note(cp.body, [witness], timestamp=5).render(), log.verifier, [witness.verifier])
    # The origin must be the log key's name.
    stranger = Signer("example.com/other", log.key)
    with pytest.raises(InvalidSignatureError, match="origin"):
        open_checkpoint(sign_note(cp.body, [stranger]).render(), stranger.verifier,
                        origin="example.com/other")
