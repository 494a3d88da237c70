"""The audit log: RFC 6962 Merkle tree, C2SP checkpoints and cosignatures, the witness and the verifier.

Modules, each imported only when used:

- ``merkle``: pure RFC 6962 / RFC 9162 hashing and proof verification.
- ``tree``: the incremental Merkle tree that keeps every level of node hashes, so proofs are O(log n).
- ``signing``: Ed25519 sign and strict verify (shared with the evaluator's signed scores).
- ``note``: C2SP signed notes and their verifier / signer key strings.
- ``checkpoint``: C2SP tlog-checkpoint bodies and tlog-cosignatures.
- ``witness``: the witness (its state, its HTTP app) and a client for it.
- ``log``: the ``AuditLog`` that turns store events into leaves and writes checkpoints.
- ``verify``: recomputes a run's tree and checks every checkpoint, cosignature and consistency step.
"""
