"""Witnesses that share a home (every ``swarmyard run`` on a host starts one on the host's) lose nothing of one
another's logs: each check-then-record re-reads the state under a lock. Two real ``swarmyard witness serve
--home`` processes, started the way a run starts its own, on one home; checkpoints sent over their sockets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from swarmyard.audit.checkpoint import Checkpoint
from swarmyard.audit.note import Signer, sign_note
from swarmyard.audit.tree import MerkleTree
from swarmyard.audit.witness_home import WitnessHome
from swarmyard.audit.witness_process import WitnessProcess
from swarmyard.errors import WitnessRefusedError


@pytest.fixture
def home(short_tmp: Path) -> Path:
    short_tmp.chmod(0o711)  # the witness's own user (started as root) passes through to its home
    return short_tmp


class _Log:
    """A log of our own: a tree and a key, signing checkpoints of it."""

    def __init__(self, origin: str) -> None:
        self.signer = Signer(origin, Ed25519PrivateKey.generate())
        self.tree = MerkleTree()
        self.witnessed = 0

    def grow_and_cosign(self, witness: WitnessProcess, leaves: int) -> None:
        for i in range(leaves):
            self.tree.append(f"{self.signer.name} {self.tree.size} {i}".encode())
        note = sign_note(Checkpoint(self.signer.name, self.tree.size, self.tree.root()).body, [self.signer]).render()
        proof = self.tree.consistency_proof(self.witnessed, self.tree.size) if self.witnessed else []
        client = witness.client()
        try:
            client.add_checkpoint(self.witnessed, proof, note, log_vkey=self.signer.verifier.vkey)
        finally:
            client.close()
        self.witnessed = self.tree.size


def test_two_witnesses_on_one_home_keep_each_others_logs(home: Path) -> None:
    with WitnessProcess.start(run_id="run_a", home=home / "witness") as first, \
            WitnessProcess.start(run_id="run_b", home=home / "witness") as second:
        assert first.vkey == second.vkey  # one home, one key
        a, b = _Log("swarmyard.local/run_a"), _Log("swarmyard.local/run_b")
        a.grow_and_cosign(first, 3)
        b.grow_and_cosign(second, 2)
        a.grow_and_cosign(first, 4)  # the first witness now writes the file: it must keep b
        b.grow_and_cosign(second, 1)  # and the second keeps a at 7, not at 3
        # a rollback of a to what the first cosigned before is refused by either witness
        stale = sign_note(Checkpoint(a.signer.name, 3, a.tree.root(3)).body, [a.signer]).render()
        client = second.client()
        try:
            with pytest.raises(WitnessRefusedError) as refused:
                client.add_checkpoint(7, [], stale)
        finally:
            client.close()
        assert refused.value.witness_size == 7
    state = json.loads((home / "witness" / "private" / "state.json").read_text())
    assert {o: s["size"] for o, s in state["logs"].items()} == {a.signer.name: 7, b.signer.name: 3}
    published = WitnessHome(home / "witness")
    for log, size in ((a, 7), (b, 3)):
        note = published.published(log.signer.name)
        assert note is not None and note.split("\n")[1] == str(size)
