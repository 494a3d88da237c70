"""An incremental RFC 6962 Merkle tree that keeps every level of node hashes.

Level ``k`` holds the hash of every complete, aligned subtree of ``2**k`` leaves, packed 32 bytes apiece in
a ``bytearray`` (about 64 bytes per leaf in all, so a million leaves cost ~64 MB, not the ~200 MB of a list
of ``bytes`` objects). An append hashes the leaf and then one node per level it completes (two hashes per
append on average); the root of any prefix and every inclusion or consistency proof needs O(log n) lookups
and at most O(log n) hashes for the ragged right edge, never a pass over the leaves.
"""

from __future__ import annotations

import hashlib

from swarmyard.audit.merkle import EMPTY_ROOT, HASH_SIZE, split_point
from swarmyard.errors import InvalidInputError

_sha256 = hashlib.sha256


class MerkleTree:
    """An append-only RFC 6962 tree with O(log n) roots and proofs for every prefix size."""

    def __init__(self) -> None:
        self._levels: list[bytearray] = [bytearray()]
        self._size = 0

    @property
    def size(self) -> int:
        """How many leaves the tree holds."""
        return self._size

    def append(self, data: bytes) -> int:
        """Append one leaf's data (hashed as ``SHA-256(0x00 || data)``); return its index."""
        return self.append_hash(_sha256(b"\x00" + data).digest())

    def append_hash(self, leaf: bytes) -> int:
        """Append an already computed leaf hash; return its index."""
        if len(leaf) != HASH_SIZE:
            raise InvalidInputError(f"a leaf hash is {HASH_SIZE} bytes, not {len(leaf)}", field="leaf")
        index = self._size
        levels = self._levels
        levels[0] += leaf
        self._size = index + 1
        # Each trailing one bit of the new leaf's index closes one more complete subtree above it.
        level, position, current = 0, index, leaf
        while position & 1:
            row = levels[level]
            left = bytes(row[-2 * HASH_SIZE:-HASH_SIZE])
            current = _sha256(b"\x01" + left + current).digest()
            level += 1
            if level == len(levels):
                levels.append(bytearray())
            levels[level] += current
            position >>= 1
        return index

    def extend(self, leaves: list[bytes]) -> None:
        """Append many leaves' data in order."""
        for data in leaves:
            self.append(data)

    def leaf_hash(self, index: int) -> bytes:
        """The hash of leaf ``index``."""
        self._check_index(index, self._size)
        return bytes(self._levels[0][index * HASH_SIZE:(index + 1) * HASH_SIZE])

    def root(self, size: int | None = None) -> bytes:
        """The tree head of the first ``size`` leaves (all of them by default)."""
        size = self._size if size is None else size
        self._check_size(size)
        if size == 0:
            return EMPTY_ROOT
        return self._range_hash(0, size)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """The RFC 9162 audit path of leaf ``index`` in the tree of the first ``size`` leaves."""
        size = self._size if size is None else size
        self._check_size(size)
        self._check_index(index, size)
        proof: list[bytes] = []
        lo, hi = 0, size
        while hi - lo > 1:
            k = split_point(hi - lo)
            if index - lo < k:
                proof.append(self._range_hash(lo + k, hi))
                hi = lo + k
            else:
                proof.append(self._range_hash(lo, lo + k))
                lo = lo + k
        proof.reverse()
        return proof

    def consistency_proof(self, size1: int, size2: int | None = None) -> list[bytes]:
        """The RFC 9162 proof that the tree of ``size2`` leaves extends the one of ``size1`` (0 < size1)."""
        size2 = self._size if size2 is None else size2
        self._check_size(size2)
        if not 0 < size1 <= size2:
            raise InvalidInputError(f"no consistency proof from size {size1} to size {size2}", field="size1")
        proof: list[bytes] = []
        lo, hi, m, whole = 0, size2, size1, True
        while m != hi - lo:
            k = split_point(hi - lo)
            if m <= k:
                proof.append(self._range_hash(lo + k, hi))
                hi = lo + k
            else:
                proof.append(self._range_hash(lo, lo + k))
                lo, m, whole = lo + k, m - k, False
        if not whole:
            # The old tree's last subtree is not itself the old root, so the verifier needs it.
            proof.append(self._range_hash(lo, hi))
        proof.reverse()
        return proof

    def _range_hash(self, lo: int, hi: int) -> bytes:
        # Ranges asked for here always start on a multiple of their largest power-of-two part, so the left
        # parts are stored subtrees and only the ragged right edge is hashed (at most log n times).
        width = hi - lo
        if width & (width - 1) == 0:
            level = width.bit_length() - 1
            offset = (lo >> level) * HASH_SIZE
            return bytes(self._levels[level][offset:offset + HASH_SIZE])
        k = split_point(width)
        return _sha256(b"\x01" + self._range_hash(lo, lo + k) + self._range_hash(lo + k, hi)).digest()

    def _check_size(self, size: int) -> None:
        if not 0 <= size <= self._size:
            raise InvalidInputError(f"size {size} is outside a tree of {self._size} leaves", field="size")

    @staticmethod
    def _check_index(index: int, size: int) -> None:
        if not 0 <= index < size:
            raise InvalidInputError(f"leaf {index} is outside a tree of {size} leaves", field="index")
