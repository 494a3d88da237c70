"""RFC 6962 / RFC 9162 Merkle tree hashing and proof verification, as pure functions.

Leaf hash ``SHA-256(0x00 || data)``, node hash ``SHA-256(0x01 || left || right)``, the empty tree's root
``SHA-256("")``. Verification follows RFC 9162 section 2.1.3 and 2.1.4 with the strict policy: every hash is
32 bytes, and a consistency proof from an empty tree is refused (it proves nothing).
A proof that does not verify raises ``InvalidProofError`` naming why.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from swarmyard.errors import InvalidProofError

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()

_sha256 = hashlib.sha256


def leaf_hash(data: bytes) -> bytes:
    """The RFC 6962 hash of one leaf's data."""
    return _sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """The RFC 6962 hash of an interior node."""
    return _sha256(b"\x01" + left + right).digest()


def split_point(size: int) -> int:
    """The largest power of two strictly less than ``size`` (``size`` >= 2): where RFC 6962 splits a tree."""
    return 1 << ((size - 1).bit_length() - 1)


def root_of(leaf_hashes: Sequence[bytes]) -> bytes:
    """The tree head of ``leaf_hashes`` from scratch; the reference the incremental tree must match."""
    if not leaf_hashes:
        return EMPTY_ROOT
    if len(leaf_hashes) == 1:
        return leaf_hashes[0]
    k = split_point(len(leaf_hashes))
    return node_hash(root_of(leaf_hashes[:k]), root_of(leaf_hashes[k:]))


def _check_hash(value: bytes, what: str) -> None:
    if len(value) != HASH_SIZE:
        raise InvalidProofError(f"{what} is {len(value)} bytes, not {HASH_SIZE}")


def _decompose(index: int, size: int) -> tuple[int, int]:
    # The inner part of an inclusion path is where the paths to ``index`` and to the last leaf differ; the
    # border part is the rest, where ``index``'s path runs along the right edge of the tree.
    inner = (index ^ (size - 1)).bit_length()
    border = bin(index >> inner).count("1")
    return inner, border


def _chain_inner(seed: bytes, proof: Sequence[bytes], index: int) -> bytes:
    for i, sibling in enumerate(proof):
        seed = node_hash(seed, sibling) if (index >> i) & 1 == 0 else node_hash(sibling, seed)
    return seed


def _chain_inner_right(seed: bytes, proof: Sequence[bytes], index: int) -> bytes:
    for i, sibling in enumerate(proof):
        if (index >> i) & 1 == 1:
            seed = node_hash(sibling, seed)
    return seed


def _chain_border_right(seed: bytes, proof: Sequence[bytes]) -> bytes:
    for sibling in proof:
        seed = node_hash(sibling, seed)
    return seed


def root_from_inclusion_proof(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """The root that ``proof`` implies for leaf hash ``leaf`` at ``index`` in a tree of ``size`` leaves."""
    if index < 0 or index >= size:
        raise InvalidProofError(f"leaf index {index} is outside a tree of size {size}")
    _check_hash(leaf, "leaf hash")
    for i, sibling in enumerate(proof):
        _check_hash(sibling, f"proof hash {i}")
    inner, border = _decompose(index, size)
    if len(proof) != inner + border:
        raise InvalidProofError(f"inclusion proof has {len(proof)} hashes, expected {inner + border}")
    return _chain_border_right(_chain_inner(leaf, proof[:inner], index), proof[inner:])


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> None:
    """Check that leaf hash ``leaf`` is at ``index`` in the tree of ``size`` leaves with head ``root``."""
    _check_hash(root, "root")
    if root_from_inclusion_proof(index, size, leaf, proof) != root:
        raise InvalidProofError(f"inclusion proof for leaf {index} does not lead to the root of size {size}")


def verify_consistency(size1: int, size2: int, proof: Sequence[bytes], root1: bytes, root2: bytes) -> None:
    """Check that the tree of ``size2`` leaves (head ``root2``) extends the one of ``size1`` (``root1``)."""
    if size1 < 0 or size2 < size1:
        raise InvalidProofError(f"size {size2} cannot extend size {size1}")
    if size1 == 0:
        raise InvalidProofError("a consistency proof from the empty tree proves nothing")
    for i, sibling in enumerate(proof):
        _check_hash(sibling, f"proof hash {i}")
    if size1 == size2:
        if proof:
            raise InvalidProofError("equal sizes need an empty consistency proof")
        if root1 != root2:
            raise InvalidProofError(f"two different roots for the same size {size1}")
        return
    if not proof:
        raise InvalidProofError("an empty consistency proof for different sizes")
    _check_hash(root1, "first root")
    _check_hash(root2, "second root")
    inner, border = _decompose(size1 - 1, size2)
    shift = (size1 & -size1).bit_length() - 1  # trailing zero bits of size1
    inner -= shift
    # When size1 is a power of two its root is itself a node on the path and the proof omits it.
    if size1 == 1 << shift:
        seed, start = root1, 0
    else:
        seed, start = proof[0], 1
    if len(proof) != start + inner + border:
        expected = start + inner + border
        raise InvalidProofError(f"consistency proof has {len(proof)} hashes, expected {expected}")
    rest = proof[start:]
    mask = (size1 - 1) >> shift
    hash1 = _chain_border_right(_chain_inner_right(seed, rest[:inner], mask), rest[inner:])
    if hash1 != root1:
        raise InvalidProofError(f"consistency proof does not lead to the root of size {size1}")
    hash2 = _chain_border_right(_chain_inner(seed, rest[:inner], mask), rest[inner:])
    if hash2 != root2:
        raise InvalidProofError(f"consistency proof does not lead to the root of size {size2}")
