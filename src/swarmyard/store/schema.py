"""The schema as an ordered list of migrations, each a small function from a dialect to SQL statements.

A store records the number of migrations applied in ``meta.schema_version``; opening a store applies the
missing ones in order, under a lock, and refuses a schema newer than this code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Types:
    """Column types that differ between engines."""

    bigint: str
    real: str
    blob: str
    serial_pk: str


SQLITE_TYPES = Types(bigint="INTEGER", real="REAL", blob="BLOB", serial_pk="INTEGER PRIMARY KEY AUTOINCREMENT")
POSTGRES_TYPES = Types(bigint="BIGINT", real="DOUBLE PRECISION", blob="BYTEA", serial_pk="BIGSERIAL PRIMARY KEY")


def _m001_initial(t: Types, postgres: bool) -> list[str]:
    txid = ", txid XID8 NOT NULL DEFAULT pg_current_xact_id()" if postgres else ""
    statements = [
        "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value {b} NOT NULL)",
        "INSERT INTO counters (name, value) VALUES ('fencing', 0) ON CONFLICT (name) DO NOTHING",
        """CREATE TABLE goals (
            id TEXT PRIMARY KEY, objective TEXT NOT NULL, budget {b} NOT NULL, call_cap {b} NOT NULL,
            deadline {r}, max_depth INTEGER NOT NULL, policy TEXT NOT NULL, evaluator TEXT,
            created_at {r} NOT NULL, board_seq {b} NOT NULL DEFAULT 0, allocated {b} NOT NULL DEFAULT 0,
            reserved {b} NOT NULL DEFAULT 0, settled {b} NOT NULL DEFAULT 0, calls {b} NOT NULL DEFAULT 0,
            CHECK (reserved >= 0 AND settled >= 0 AND allocated >= 0 AND reserved + settled <= budget))""",
        """CREATE TABLE tasks (
            n {serial}, id TEXT NOT NULL UNIQUE, goal_id TEXT NOT NULL REFERENCES goals(id),
            parent_id TEXT REFERENCES tasks(id), depth INTEGER NOT NULL, group_name TEXT NOT NULL,
            title TEXT NOT NULL, prompt TEXT NOT NULL, priority INTEGER NOT NULL, state TEXT NOT NULL,
            revision {b} NOT NULL DEFAULT 0, fencing_token {b}, worker_id TEXT, lease_expires_at {r},
            attempts INTEGER NOT NULL DEFAULT 0, result TEXT, created_at {r} NOT NULL,
            budget {b} NOT NULL, reserved {b} NOT NULL DEFAULT 0, settled {b} NOT NULL DEFAULT 0,
            call_cap {b} NOT NULL, calls {b} NOT NULL DEFAULT 0,
            CHECK (budget >= 0 AND reserved >= 0 AND settled >= 0 AND reserved + settled <= budget))""",
        "CREATE INDEX tasks_claimable ON tasks (goal_id, state, group_name, priority, n)",
        "CREATE INDEX tasks_worker ON tasks (worker_id)",
        """CREATE TABLE posts (
            goal_id TEXT NOT NULL REFERENCES goals(id), seq {b} NOT NULL, kind TEXT NOT NULL,
            group_name TEXT NOT NULL, author TEXT NOT NULL, task_id TEXT, fencing_token {b}, body TEXT NOT NULL,
            created_at {r} NOT NULL, PRIMARY KEY (goal_id, seq))""",
        """CREATE TABLE artifacts (
            goal_id TEXT NOT NULL REFERENCES goals(id), sha256 TEXT NOT NULL, task_id TEXT NOT NULL,
            size {b} NOT NULL, media_type TEXT NOT NULL, author TEXT NOT NULL, created_at {r} NOT NULL,
            PRIMARY KEY (goal_id, sha256))""",
        """CREATE TABLE findings (
            n {serial}, id TEXT NOT NULL UNIQUE, goal_id TEXT NOT NULL REFERENCES goals(id),
            task_id TEXT NOT NULL, group_name TEXT NOT NULL, author TEXT NOT NULL, title TEXT NOT NULL,
            body TEXT NOT NULL, citations TEXT NOT NULL, status TEXT NOT NULL, score {b}, created_at {r} NOT NULL)""",
        "CREATE INDEX findings_goal ON findings (goal_id, n)",
        """CREATE TABLE reservations (
            id TEXT PRIMARY KEY, goal_id TEXT NOT NULL REFERENCES goals(id), task_id TEXT NOT NULL,
            model TEXT NOT NULL, amount {b} NOT NULL, actual {b}, overage {b} NOT NULL DEFAULT 0,
            state TEXT NOT NULL, method TEXT NOT NULL, created_at {r} NOT NULL, updated_at {r} NOT NULL)""",
        "CREATE INDEX reservations_goal ON reservations (goal_id, created_at)",
        """CREATE TABLE prices (model TEXT PRIMARY KEY, input_per_mtok {b} NOT NULL,
            output_per_mtok {b} NOT NULL)""",
        """CREATE TABLE workers (
            id TEXT PRIMARY KEY, goal_id TEXT NOT NULL REFERENCES goals(id), group_name TEXT NOT NULL,
            token_hash TEXT NOT NULL, expires_at {r} NOT NULL, revoked INTEGER NOT NULL DEFAULT 0,
            created_at {r} NOT NULL)""",
        f"""CREATE TABLE events (
            id {{serial}}, leaf_index {{b}}, kind TEXT NOT NULL, body {{blob}} NOT NULL,
            created_at {{r}} NOT NULL{txid})""",
        # Partial: an event is written with no leaf index, so writing one touches no index but the table's.
        "CREATE UNIQUE INDEX events_leaf ON events (leaf_index) WHERE leaf_index IS NOT NULL",
        "CREATE INDEX events_unsequenced ON events (id) WHERE leaf_index IS NULL",
    ]
    if postgres:
        statements.append("CREATE SEQUENCE IF NOT EXISTS fencing_seq")
    return [s.format(b=t.bigint, r=t.real, blob=t.blob, serial=t.serial_pk) for s in statements]


def _m002_claim_indexes(t: Types, postgres: bool) -> list[str]:
    # Serve "best pending task by priority" with and without a group, and "expired leases", from indexes.
    return [
        "DROP INDEX IF EXISTS tasks_claimable",
        "CREATE INDEX tasks_pick ON tasks (goal_id, state, priority DESC, n)",
        "CREATE INDEX tasks_pick_group ON tasks (goal_id, group_name, state, priority DESC, n)",
        "CREATE INDEX tasks_leases ON tasks (goal_id, state, lease_expires_at)",
    ] + ([] if postgres else [
        # SQLite commits events in id order, so the unsequenced ones are found by id (see sequence_events):
        # one index less to write per event.
        "DROP INDEX IF EXISTS events_unsequenced",
    ])


def _m003_reservation_usage(t: Types, postgres: bool) -> list[str]:
    # Tokens a settled call used and the worker that held the task, so a run can report them per worker.
    return [
        f"ALTER TABLE reservations ADD COLUMN input_tokens {t.bigint} NOT NULL DEFAULT 0",
        f"ALTER TABLE reservations ADD COLUMN output_tokens {t.bigint} NOT NULL DEFAULT 0",
        "ALTER TABLE reservations ADD COLUMN worker_id TEXT",
    ]


def _m004_quotas(t: Types, postgres: bool) -> list[str]:
    # What a goal may store (see domain.Quotas; NULL: the store's defaults, for goals made before this) beside
    # what it has stored, so a write checks and counts in one row it already locks. Counted from what is there.
    b = t.bigint
    octets = "OCTET_LENGTH(p.body)" if postgres else "LENGTH(CAST(p.body AS BLOB))"
    return [
        f"ALTER TABLE goals ADD COLUMN artifact_quota {b}",
        f"ALTER TABLE goals ADD COLUMN task_artifact_quota {b}",
        f"ALTER TABLE goals ADD COLUMN post_quota {b}",
        f"ALTER TABLE goals ADD COLUMN post_bytes_quota {b}",
        f"ALTER TABLE goals ADD COLUMN artifact_bytes {b} NOT NULL DEFAULT 0",
        f"ALTER TABLE goals ADD COLUMN worker_posts {b} NOT NULL DEFAULT 0",
        f"ALTER TABLE goals ADD COLUMN worker_post_bytes {b} NOT NULL DEFAULT 0",
        f"ALTER TABLE tasks ADD COLUMN artifact_bytes {b} NOT NULL DEFAULT 0",
        "UPDATE goals SET artifact_bytes = COALESCE((SELECT SUM(size) FROM artifacts a WHERE a.goal_id = goals.id), 0),"
        " worker_posts = (SELECT COUNT(*) FROM posts p WHERE p.goal_id = goals.id AND p.task_id IS NOT NULL),"
        f" worker_post_bytes = COALESCE((SELECT SUM({octets}) FROM posts p"
        " WHERE p.goal_id = goals.id AND p.task_id IS NOT NULL), 0)",
        "UPDATE tasks SET artifact_bytes = COALESCE((SELECT SUM(size) FROM artifacts a WHERE a.task_id = tasks.id), 0)",
    ]


def _m005_directions_scores(t: Types, postgres: bool) -> list[str]:
    # explore: directions held like tasks (one row each, the hold expiring with the claim it was taken under),
    # the policy's settings per group, and the evaluator's scores, attributed so policies can rank by them.
    b, r = t.bigint, t.real
    return [
        f"""CREATE TABLE directions (
            goal_id TEXT NOT NULL REFERENCES goals(id), group_name TEXT NOT NULL, name TEXT NOT NULL,
            offered INTEGER NOT NULL DEFAULT 0, holder TEXT, task_id TEXT, fencing_token {b}, held_until {r},
            taken_at {r}, created_at {r} NOT NULL, PRIMARY KEY (goal_id, group_name, name))""",
        "CREATE INDEX directions_task ON directions (task_id)",
        f"""CREATE TABLE explore_settings (
            goal_id TEXT NOT NULL REFERENCES goals(id), group_name TEXT NOT NULL, patience INTEGER NOT NULL,
            adopt_margin {b} NOT NULL, PRIMARY KEY (goal_id, group_name))""",
        f"""CREATE TABLE scores (
            n {t.serial_pk}, goal_id TEXT NOT NULL REFERENCES goals(id), task_id TEXT NOT NULL,
            worker_id TEXT NOT NULL, group_name TEXT NOT NULL, direction TEXT, sha256 TEXT NOT NULL,
            split TEXT NOT NULL, score {b} NOT NULL, created_at {r} NOT NULL)""",
        "CREATE INDEX scores_goal ON scores (goal_id, split, n)",
    ]


def _m006_direction_order(t: Types, postgres: bool) -> list[str]:
    # Offered directions are handed out in the order the swarm file lists them.
    return ["ALTER TABLE directions ADD COLUMN ordinal INTEGER NOT NULL DEFAULT 0"]


def _m007_replicas(t: Types, postgres: bool) -> list[str]:
    # Several serve replicas over one store: a worker's rate bucket shared by all of them, and which replica
    # made each hold, so the holds of one that died are marked unknown (see swarmyard.store.replicas).
    return [
        f"CREATE TABLE rate_buckets (key TEXT PRIMARY KEY, tokens {t.real} NOT NULL, updated_at {t.real} NOT NULL)",
        f"CREATE TABLE planes (id TEXT PRIMARY KEY, started_at {t.real} NOT NULL, seen_at {t.real} NOT NULL)",
        "ALTER TABLE reservations ADD COLUMN plane_id TEXT",
        "CREATE INDEX reservations_plane ON reservations (plane_id, state)",
    ]


def _m008_lost_bodies(t: Types, postgres: bool) -> list[str]:
    # A digest of each model call's request body, so a resend of a call whose hold is unknown is refused by
    # whichever replica it reaches (the index holds only the unknown ones: a handful).
    return [
        "ALTER TABLE reservations ADD COLUMN body_digest TEXT",
        "CREATE INDEX reservations_lost ON reservations (worker_id, body_digest) WHERE state = 'unknown'",
    ]


def _m009_bodies_in_flight(t: Types, postgres: bool) -> list[str]:
    # The same for the bodies still held: a replica killed mid-call leaves its hold held for the sweep's grace,
    # and a resend reaching another replica then is refused too (the index holds the calls in flight).
    return ["CREATE INDEX reservations_in_flight ON reservations (worker_id, body_digest) WHERE state = 'held'"]


def _m010_escrow(t: Types, postgres: bool) -> list[str]:
    # Escrow: a claim moves its task's slice of the budget (and of the goal's call cap, when it has one) from
    # the goal's envelope to the task's row, so a model call's hold touches only its task's row; the claim's
    # end returns what the slice did not settle. ``slice_token`` is the claim (fencing token) whose slice is
    # live, NULL when none is: the state that makes the return happen exactly once. A hold records the slice
    # it was charged to (``reservations.slice_token``; NULL: charged to the goal's row). Every existing task
    # starts with no live slice, so an upgraded store charges the goal as before until its next claims.
    b = t.bigint
    return [
        f"ALTER TABLE goals ADD COLUMN escrowed {b} NOT NULL DEFAULT 0",
        f"ALTER TABLE goals ADD COLUMN escrowed_calls {b} NOT NULL DEFAULT 0",
        f"ALTER TABLE tasks ADD COLUMN slice_token {b}",
        f"ALTER TABLE tasks ADD COLUMN slice {b} NOT NULL DEFAULT 0",
        f"ALTER TABLE tasks ADD COLUMN slice_call_cap {b} NOT NULL DEFAULT 0",
        f"ALTER TABLE tasks ADD COLUMN slice_reserved {b} NOT NULL DEFAULT 0",
        f"ALTER TABLE tasks ADD COLUMN slice_settled {b} NOT NULL DEFAULT 0",
        f"ALTER TABLE tasks ADD COLUMN slice_calls {b} NOT NULL DEFAULT 0",
        f"ALTER TABLE reservations ADD COLUMN slice_token {b}",
        # the live slices of a goal, for its envelope's sums and the sweep (a handful per goal: the claims)
        "CREATE INDEX tasks_live_slices ON tasks (goal_id) WHERE slice_token IS NOT NULL",
    ]


def _m011_call_allocation(t: Types, postgres: bool) -> list[str]:
    # A goal that caps calls allocates them to its tasks as they are made, like its budget: ``allocated_calls`` is
    # what its tasks' own caps hold (a top-level task's carved from the goal's, a delegated one's from its
    # parent's, or from the goal's when the parent has no cap) plus the calls made by its tasks with no cap of
    # their own, each taken from the unallocated ones as it is made. A claim then carves the task's remaining calls
    # into its slice without taking its peers' (the hoard of e62c9b0). An ended task's unused calls go back.
    # An existing goal's is counted from its tasks; one whose tasks' caps add up to more than its cap (allowed
    # before) gives no slices: its tasks share its calls on its row, as before.
    return [
        f"ALTER TABLE goals ADD COLUMN allocated_calls {t.bigint} NOT NULL DEFAULT 0",
        "UPDATE goals SET allocated_calls = COALESCE((SELECT SUM(CASE WHEN t.call_cap > 0 THEN t.call_cap "
        "ELSE t.calls END) FROM tasks t WHERE t.goal_id = goals.id), 0) WHERE call_cap > 0",
    ]


Migration = Callable[[Types, bool], list[str]]

#: Applied in order; append new migrations, never edit old ones.
MIGRATIONS: list[Migration] = [_m001_initial, _m002_claim_indexes, _m003_reservation_usage, _m004_quotas,
                          _m005_directions_scores, _m006_direction_order,
                          _m007_replicas, _m008_lost_bodies, _m009_bodies_in_flight, _m010_escrow,
                          _m011_call_allocation]
