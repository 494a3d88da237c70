"""``swarmyard bench audit``: Merkle appends per second and proof times at 1,000,000 leaves.

Baselines run in the same process: appends against plain ``hashlib.sha256`` of the same leaves (the ratio
is the tree's own cost), and each proof at 1,000,000 leaves against the same proof at 1,000 leaves (O(log n)
proofs stay within a small factor; a per-proof pass over the leaves would be ~1000x).
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable

from swarmyard.audit.merkle import leaf_hash, verify_consistency, verify_inclusion
from swarmyard.audit.tree import MerkleTree
from swarmyard.bench.result import BenchResult, BenchRow
from swarmyard.canonical import canonical_json

_SMALL_TREE = 1_000


def _leaves(n: int) -> list[bytes]:
    # Shaped like real events: a canonical JSON object of a few ids and a short text.
    return [canonical_json({"kind": "board.post", "goal": "goal_01hx", "seq": i, "body": f"note {i}"})
            for i in range(n)]


def _per_second(n: int, work: Callable[[], None]) -> float:
    start = time.perf_counter()
    work()
    return n / (time.perf_counter() - start)


def _mean_ms(samples: int, work: Callable[[int], object]) -> float:
    start = time.perf_counter()
    for i in range(samples):
        work(i)
    return (time.perf_counter() - start) * 1000 / samples


def _build(size: int) -> MerkleTree:
    tree = MerkleTree()
    seed = hashlib.sha256(b"bench").digest()
    for i in range(size):
        tree.append_hash(hashlib.sha256(seed + i.to_bytes(8, "big")).digest())
    return tree


def _proof_times(tree: MerkleTree, samples: int, rng: random.Random) -> dict[str, float]:
    size = tree.size
    indexes = [rng.randrange(size) for _ in range(samples)]
    olds = [rng.randrange(1, size) for _ in range(samples)]
    root = tree.root()
    incl = [tree.inclusion_proof(i) for i in indexes]
    cons = [tree.consistency_proof(o) for o in olds]
    old_roots = [tree.root(o) for o in olds]
    return {
        "inclusion": _mean_ms(samples, lambda k: tree.inclusion_proof(indexes[k])),
        "consistency": _mean_ms(samples, lambda k: tree.consistency_proof(olds[k])),
        "verify_inclusion": _mean_ms(samples, lambda k: verify_inclusion(
            indexes[k], size, tree.leaf_hash(indexes[k]), incl[k], root)),
        "verify_consistency": _mean_ms(samples, lambda k: verify_consistency(
            olds[k], size, cons[k], old_roots[k], root)),
    }


def run(quick: bool = False, **options: object) -> BenchResult:
    """Measure appends/s (vs hashlib) and proof times at ``proof_leaves`` leaves (default 1,000,000)."""
    appends = int(str(options.get("appends", 20_000 if quick else 200_000)))
    proof_leaves = int(str(options.get("proof_leaves", 1_000_000)))
    samples = int(str(options.get("samples", 200 if quick else 2_000)))
    rng = random.Random(7)
    result = BenchResult(area="audit")

    data = _leaves(appends)
    def hash_only() -> None:
        for d in data:
            hashlib.sha256(b"\x00" + d).digest()

    baseline = _per_second(appends, hash_only)
    tree = MerkleTree()
    rate = _per_second(appends, lambda: tree.extend(data))
    assert tree.leaf_hash(appends - 1) == leaf_hash(data[-1])
    result.add(BenchRow("appends", rate, "leaves/s", baseline=baseline,
                        baseline_name="hashlib.sha256 per leaf", target=">= 50,000/s"))

    start = time.perf_counter()
    big = _build(proof_leaves)
    build_s = time.perf_counter() - start
    small = _build(min(_SMALL_TREE, proof_leaves))
    at_big, at_small = _proof_times(big, samples, rng), _proof_times(small, samples, rng)
    label = f"{proof_leaves:,} leaves"
    for name in ("inclusion", "consistency", "verify_inclusion", "verify_consistency"):
        result.add(BenchRow(f"{name} proof @ {label}", at_big[name], "ms", baseline=at_small[name],
                            baseline_name=f"same @ {small.size:,} leaves", target="O(log n)"))

    result.summary = {
        "appends_per_s": round(rate),
        "baseline_sha256_per_s": round(baseline),
        "append_cost_ratio": round(baseline / rate, 2),
        "proof_ms_1m": round(max(at_big["inclusion"], at_big["consistency"]), 4),
        "inclusion_proof_ms_1m": round(at_big["inclusion"], 4),
        "consistency_proof_ms_1m": round(at_big["consistency"], 4),
        "verify_inclusion_ms_1m": round(at_big["verify_inclusion"], 4),
        "verify_consistency_ms_1m": round(at_big["verify_consistency"], 4),
        "proof_tree_size": proof_leaves,
        "tree_build_s": round(build_s, 2),
    }
    if proof_leaves != 1_000_000:
        result.notes.append(f"proof times were measured at {proof_leaves:,} leaves, not 1,000,000")
    return result
