"""RFC 6962 hashing and proofs: all 196 transparency-dev vectors and Hypothesis properties on random trees."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import VECTORS
from swarmyard.audit import merkle
from swarmyard.audit.tree import MerkleTree
from swarmyard.errors import InvalidInputError, InvalidProofError

RFC6962 = VECTORS / "rfc6962"
INCLUSION = sorted((RFC6962 / "inclusion").rglob("*.json"))
CONSISTENCY = sorted((RFC6962 / "consistency").rglob("*.json"))


def _b64(value: str) -> bytes:
    return base64.b64decode(value)


def _proof(case: dict[str, Any]) -> list[bytes]:
    return [_b64(h) for h in case["proof"] or []]


def _id(path: Path) -> str:
    return str(path.relative_to(RFC6962))


def test_all_196_vectors_are_present() -> None:
    assert len(INCLUSION) == 98
    assert len(CONSISTENCY) == 98


@pytest.mark.parametrize("path", INCLUSION, ids=_id)
def test_inclusion_vector(path: Path) -> None:
    case = json.loads(path.read_text())
    args = (case["leafIdx"], case["treeSize"], _b64(case["leafHash"]), _proof(case), _b64(case["root"]))
    if case["wantErr"]:
        with pytest.raises(InvalidProofError):
            merkle.verify_inclusion(*args)
    else:
        merkle.verify_inclusion(*args)


@pytest.mark.parametrize("path", CONSISTENCY, ids=_id)
def test_consistency_vector(path: Path) -> None:
    case = json.loads(path.read_text())
    args = (case["size1"], case["size2"], _proof(case), _b64(case["root1"]), _b64(case["root2"]))
    if case["wantErr"]:
        with pytest.raises(InvalidProofError):
            merkle.verify_consistency(*args)
    else:
        merkle.verify_consistency(*args)


def test_known_roots() -> None:
    assert merkle.EMPTY_ROOT.hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    tree = MerkleTree()
    assert tree.root() == merkle.EMPTY_ROOT
    # The RFC 6962 test tree of 8 leaves (transparency-dev testdata): its root is the inclusion vectors' root.
    for data in [b"", b"\x00", b"\x10", b"\x20\x21", b"\x30\x31", b"\x40\x41\x42\x43",
                 bytes(range(0x50, 0x58)), bytes(range(0x60, 0x70))]:
        tree.append(data)
    happy = json.loads((RFC6962 / "inclusion" / "1" / "happy-path.json").read_text())
    assert tree.root() == _b64(happy["root"])
    assert tree.inclusion_proof(happy["leafIdx"]) == _proof(happy)


def test_tree_refuses_bad_sizes_and_hashes() -> None:
    tree = MerkleTree()
    tree.extend([b"a", b"b", b"c"])
    with pytest.raises(InvalidInputError):
        tree.root(4)
    with pytest.raises(InvalidInputError):
        tree.inclusion_proof(3)
    with pytest.raises(InvalidInputError):
        tree.consistency_proof(0, 3)
    with pytest.raises(InvalidInputError):
        tree.append_hash(b"short")
    assert tree.size == 3


def _flip(value: bytes, bit: int) -> bytes:
    out = bytearray(value)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


@st.composite
def _trees(draw: st.DrawFn) -> tuple[MerkleTree, list[bytes]]:
    leaves = draw(st.lists(st.binary(max_size=12), min_size=1, max_size=140))
    tree = MerkleTree()
    tree.extend(leaves)
    return tree, leaves


@settings(max_examples=150, deadline=None)
@given(_trees(), st.data())
def test_incremental_tree_matches_reference(built: tuple[MerkleTree, list[bytes]],
                                            data: st.DataObject) -> None:
    tree, leaves = built
    size = data.draw(st.integers(0, len(leaves)))
    assert tree.root(size) == merkle.root_of([merkle.leaf_hash(x) for x in leaves[:size]])


@settings(max_examples=200, deadline=None)
@given(_trees(), st.data())
def test_inclusion_proofs_verify_and_any_bit_flip_fails(built: tuple[MerkleTree, list[bytes]],
                                                        data: st.DataObject) -> None:
    tree, leaves = built
    size = data.draw(st.integers(1, len(leaves)))
    index = data.draw(st.integers(0, size - 1))
    leaf, root, proof = merkle.leaf_hash(leaves[index]), tree.root(size), tree.inclusion_proof(index, size)
    merkle.verify_inclusion(index, size, leaf, proof, root)

    parts = [leaf, root, *proof]
    which = data.draw(st.integers(0, len(parts) - 1))
    bit = data.draw(st.integers(0, 255))
    parts[which] = _flip(parts[which], bit)
    with pytest.raises(InvalidProofError):
        merkle.verify_inclusion(index, size, parts[0], parts[2:], parts[1])


@settings(max_examples=200, deadline=None)
@given(_trees(), st.data())
def test_consistency_proofs_verify_and_any_bit_flip_fails(built: tuple[MerkleTree, list[bytes]],
                                                          data: st.DataObject) -> None:
    tree, leaves = built
    size2 = data.draw(st.integers(1, len(leaves)))
    size1 = data.draw(st.integers(1, size2))
    root1, root2, proof = tree.root(size1), tree.root(size2), tree.consistency_proof(size1, size2)
    merkle.verify_consistency(size1, size2, proof, root1, root2)

    parts = [root1, root2, *proof]
    which = data.draw(st.integers(0, len(parts) - 1))
    bit = data.draw(st.integers(0, 255))
    parts[which] = _flip(parts[which], bit)
    with pytest.raises(InvalidProofError):
        merkle.verify_consistency(size1, size2, parts[2:], parts[0], parts[1])


@settings(max_examples=60, deadline=None)
@given(_trees(), st.data())
def test_a_proof_for_another_leaf_fails(built: tuple[MerkleTree, list[bytes]], data: st.DataObject) -> None:
    tree, leaves = built
    if len(set(leaves)) < 2:
        return
    size = len(leaves)
    index = data.draw(st.integers(0, size - 1))
    other = data.draw(st.integers(0, size - 1).filter(lambda i: leaves[i] != leaves[index]))
    with pytest.raises(InvalidProofError):
        merkle.verify_inclusion(index, size, merkle.leaf_hash(leaves[other]), tree.inclusion_proof(index),
                                tree.root())
