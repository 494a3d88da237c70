"""The witness over real HTTP on a Unix socket: cosigns consistent checkpoints, refuses forks, rewrites and
rollbacks with HTTP 409, and remembers what it cosigned across a restart."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conftest import serving_witness as serving
from swarmyard.audit.checkpoint import Checkpoint, open_checkpoint
from swarmyard.audit.note import Signer, sign_note
from swarmyard.audit.tree import MerkleTree
from swarmyard.audit.witness import (
    HttpWitnessClient,
    Witness,
    WitnessState,
    format_add_checkpoint,
)
from swarmyard.clock import FakeClock
from swarmyard.errors import AuditError, InvalidSignatureError, WitnessRefusedError

ORIGIN = "swarmyard.test/log"


def _tree(prefix: bytes, n: int) -> MerkleTree:
    tree = MerkleTree()
    for i in range(n):
        tree.append(prefix + str(i).encode())
    return tree


def _note(signer: Signer, tree: MerkleTree, size: int) -> str:
    return sign_note(Checkpoint(ORIGIN, size, tree.root(size)).body, [signer]).render()


@pytest.fixture
def signer() -> Signer:
    return Signer(ORIGIN, Ed25519PrivateKey.generate())


def _witness(tmp_path: Path, clock: FakeClock) -> Witness:
    return Witness.from_files("witness.test", tmp_path / "witness.key", tmp_path / "witness.json",
                              clock=clock)


def test_cosigns_consistent_checkpoints_and_refuses_forks(tmp_path: Path, clock: FakeClock,
                                                           signer: Signer) -> None:
    tree = _tree(b"leaf", 40)
    fork = _tree(b"fork", 40)
    vkey = signer.verifier.vkey
    with serving(_witness(tmp_path, clock), tmp_path / "w.sock") as client:
        first = _note(signer, tree, 10)
        cosig = client.add_checkpoint(0, [], first, log_vkey=vkey)
        assert cosig.timestamp == int(clock.now())
        signed, cosigners = open_checkpoint(first + cosig.line, signer.verifier, [client.verifier()])
        assert signed.checkpoint.size == 10
        assert cosigners == [client.verifier()]

        clock.advance(60)
        client.add_checkpoint(10, tree.consistency_proof(10, 25), _note(signer, tree, 25), log_vkey=vkey)

        # A fork: another history of 30 leaves, with a proof from the fork's own size-25 tree.
        with pytest.raises(WitnessRefusedError, match="fork or rewrite") as refused:
            client.add_checkpoint(25, fork.consistency_proof(25, 30), _note(signer, fork, 30), log_vkey=vkey)
        assert refused.value.witness_size == 25
        # A rewrite: the same size with another root.
        with pytest.raises(WitnessRefusedError):
            client.add_checkpoint(25, [], _note(signer, fork, 25), log_vkey=vkey)
        # A rollback to a smaller size.
        with pytest.raises(WitnessRefusedError, match="rolls back"):
            client.add_checkpoint(25, [], _note(signer, tree, 20), log_vkey=vkey)
        # A stale old size names the witness's size so an honest log can retry.
        with pytest.raises(WitnessRefusedError) as stale:
            client.add_checkpoint(10, tree.consistency_proof(10, 30), _note(signer, tree, 30), log_vkey=vkey)
        assert stale.value.witness_size == 25
        # The same checkpoint again is fine (idempotent), and the honest extension still is.
        client.add_checkpoint(25, [], _note(signer, tree, 25), log_vkey=vkey)
        client.add_checkpoint(25, tree.consistency_proof(25, 40), _note(signer, tree, 40), log_vkey=vkey)

    state = WitnessState(tmp_path / "witness.json").get(ORIGIN)
    assert state is not None and state.size == 40 and state.root_hash == tree.root()
    assert stat.S_IMODE(os.stat(tmp_path / "witness.key").st_mode) == 0o600


def test_refusals_survive_a_restart(tmp_path: Path, clock: FakeClock, signer: Signer) -> None:
    tree, fork = _tree(b"leaf", 20), _tree(b"fork", 20)
    vkey = signer.verifier.vkey
    with serving(_witness(tmp_path, clock), tmp_path / "w.sock") as client:
        client.add_checkpoint(0, [], _note(signer, tree, 12), log_vkey=vkey)
        before = client.verifier()
    # A new process: same key file and state file.
    with serving(_witness(tmp_path, clock), tmp_path / "w2.sock") as client:
        assert client.verifier() == before
        with pytest.raises(WitnessRefusedError):
            client.add_checkpoint(0, [], _note(signer, fork, 15), log_vkey=vkey)
        with pytest.raises(WitnessRefusedError):
            client.add_checkpoint(12, fork.consistency_proof(12, 15), _note(signer, fork, 15), log_vkey=vkey)
        client.add_checkpoint(12, tree.consistency_proof(12, 20), _note(signer, tree, 20), log_vkey=vkey)


def test_refuses_forged_and_unknown_logs(tmp_path: Path, clock: FakeClock, signer: Signer) -> None:
    tree = _tree(b"leaf", 5)
    impostor = Signer(ORIGIN, Ed25519PrivateKey.generate())
    with serving(_witness(tmp_path, clock), tmp_path / "w.sock") as client:
        with pytest.raises(AuditError, match="log"):
            client.add_checkpoint(0, [], _note(signer, tree, 5))  # no key offered, none pinned: 404
        client.add_checkpoint(0, [], _note(signer, tree, 3), log_vkey=signer.verifier.vkey)
        # Another key under the same origin cannot take the log over, offered or not.
        with pytest.raises(WitnessRefusedError, match="pinned"):
            client.add_checkpoint(3, tree.consistency_proof(3, 5), _note(impostor, tree, 5),
                                  log_vkey=impostor.verifier.vkey)
        with pytest.raises(InvalidSignatureError):
            client.add_checkpoint(3, tree.consistency_proof(3, 5), _note(impostor, tree, 5))
        # A key not named after the origin is not pinned.
        other = Signer("swarmyard.test/other", Ed25519PrivateKey.generate())
        with pytest.raises(WitnessRefusedError, match="not after the origin"):
            client.add_checkpoint(0, [], sign_note(Checkpoint("swarmyard.test/new", 1, tree.root(1)).body,
                                                   [other]).render(), log_vkey=other.verifier.vkey)
        # Malformed bodies are a 400, not a crash.
        raw = httpx.Client(transport=httpx.HTTPTransport(uds=str(tmp_path / "w.sock")), base_url="http://w")
        assert raw.post("/add-checkpoint", content=b"garbage").status_code == 400
        assert raw.post("/add-checkpoint", content=b"old x\n\nnote").status_code == 400
        assert raw.post("/add-checkpoint", content=b"\xff\xfe").status_code == 400
        body = format_add_checkpoint(3, [b"short"], _note(signer, tree, 5))
        assert raw.post("/add-checkpoint", content=body).status_code == 409
        raw.close()
    state = WitnessState(tmp_path / "witness.json").get(ORIGIN)
    assert state is not None and state.size == 3


def test_witness_serve_command(tmp_path: Path, signer: Signer) -> None:
    sock = tmp_path / "cli.sock"
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    command = [sys.executable, "-c", "from swarmyard.cli.main import main; main()", "witness", "serve",
               "--key", str(tmp_path / "k"), "--state", str(tmp_path / "s.json"), "--socket", str(sock)]
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()  # printed just before the server binds
        assert banner.startswith("witness swarmyard-witness+")
        client = HttpWitnessClient(socket=sock)
        ready = threading.Event()
        for _ in range(1000):
            if sock.exists():
                break
            ready.wait(0.01)
        tree = _tree(b"leaf", 4)
        cosig = client.add_checkpoint(0, [], _note(signer, tree, 4), log_vkey=signer.verifier.vkey)
        assert cosig.name == "swarmyard-witness"
        assert banner.split()[1] == client.verifier().vkey
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)


def _raw_exchange(sock: Path, request: bytes) -> bytes:
    """Send ``request`` on a fresh connection and read the answer until the witness closes it."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(60)  # a failure bound only: a witness waiting for the rest of the body hangs here
        conn.connect(str(sock))
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and b"payload_too_large" in answer:
                break
        return answer


def test_witness_serve_refuses_big_bodies_unread_and_odd_sizes_with_a_400(tmp_path: Path,
                                                                          signer: Signer) -> None:
    sock = tmp_path / "odd.sock"
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    command = [sys.executable, "-m", "swarmyard.cli", "witness", "serve", "--key", str(tmp_path / "k"),
               "--state", str(tmp_path / "s.json"), "--socket", str(sock)]
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("witness ")
        ready = threading.Event()
        for _ in range(1000):
            if sock.exists():
                break
            ready.wait(0.01)
        # 400 MiB declared, 5 bytes sent: the answer comes by the declared length, nothing more is read
        declared = (b"POST /add-checkpoint HTTP/1.1\r\nhost: w\r\ncontent-length: 419430400\r\n\r\nold 0")
        answer = _raw_exchange(sock, declared)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        # a chunked body that declares nothing is cut off by the running count
        chunk = b"x" * 16384
        chunked = (b"POST /add-checkpoint HTTP/1.1\r\nhost: w\r\ntransfer-encoding: chunked\r\n\r\n"
                   + (b"4000\r\n" + chunk + b"\r\n") * 5 + b"0\r\n\r\n")
        answer = _raw_exchange(sock, chunked)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]

        raw = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://w")
        tree = _tree(b"leaf", 4)
        note = _note(signer, tree, 4)
        for head in ("old \u00b2", "old \u2460", "old " + "9" * 5000, "old \u0661", "old 01", "old +1",
                     "old  1", "old 1_0"):
            response = raw.post("/add-checkpoint", content=f"{head}\n\n{note}".encode())
            assert response.status_code == 400, (head[:10], response.text)
            assert response.json()["error"]["code"] == "invalid_input"
        # a checkpoint note whose own size is 5000 digits is refused as malformed, not a crash
        big = note.replace("\n4\n", "\n" + "9" * 5000 + "\n", 1)
        response = raw.post("/add-checkpoint", content=f"old 0\n\n{big}".encode(),
                            headers={"x-swarmyard-log-key": signer.verifier.vkey})
        assert response.status_code == 403, response.text
        assert response.json()["error"]["code"] == "invalid_signature"
        # and the witness still cosigns a good one
        response = raw.post("/add-checkpoint", content=f"old 0\n\n{note}".encode(),
                            headers={"x-swarmyard-log-key": signer.verifier.vkey})
        assert response.status_code == 200, response.text
        raw.close()
    finally:
        proc.terminate()
        proc.wait(10)
