"""The evaluator's own Unix user: created when missing, given the bundle and state, and switched to for good.

Run as root, ``serve`` makes the system user ``swarmyard-eval`` (no shell, no home), hands it the bundle and
the state folder (owner only: folders 0700, files 0600) and drops to it (setgroups, setgid, setuid),
so neither the control plane's user nor a worker can read the hidden data or the signing key. The mechanics are
``swarmyard.identity``'s, shared with the control plane and the witness; failures here are ``EvaluatorError``.
"""

from __future__ import annotations

from swarmyard.errors import EvaluatorError
from swarmyard.identity import EVAL_USER, Identity, current_identity, protect_tree
from swarmyard.identity import drop_privileges as _drop
from swarmyard.identity import ensure_system_user as _ensure

__all__ = ["EVAL_USER", "Identity", "current_identity", "drop_privileges", "ensure_system_user", "protect_tree"]


def ensure_system_user(name: str = EVAL_USER) -> Identity:
    """Return the system user ``name``, creating it (no shell, no home) if it does not exist yet."""
    return _ensure(name, error=EvaluatorError)


def drop_privileges(to: Identity) -> None:
    """Switch this process to ``to`` for good (supplementary groups cleared); check that root is gone."""
    _drop(to, error=EvaluatorError)
