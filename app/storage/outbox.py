"""The webhook outbox: messages a run's writes queue for delivery, and their attempts.

A message is written in the same transaction as the run's write it reports (the final
status, or the move to ``waiting`` for a confirmation), under the same fence, so a run whose
end is stored has its message stored too, whatever happens to the worker next. Delivery
(``app.webhooks.delivery``) claims due messages with a time-limited claim, one worker per
message at a time, and records each attempt under that claim::

    pending ──claim──▶ pending (claimed until T) ──attempt──▶ pending (due later)
                                                         └──▶ delivered | failed

A delivered or failed message is kept for the retention (``AGENT_WEBHOOK_RETENTION``), then
deleted with its attempts (``prune``); a pending one is never deleted.

Times are seconds since the epoch (floats): the workers' wall clocks order the claims.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, Final, Literal

import asyncpg

__all__ = [
    "POSTGRES_MIGRATION",
    "SQLITE_MIGRATION",
    "ClaimedWebhook",
    "WebhookAttempt",
    "WebhookMessage",
    "WebhookState",
    "WebhookStatus",
]

WebhookStatus = Literal["pending", "delivered", "failed"]

# a schema version of each backend (its place in their _MIGRATIONS is the one line to move)
SQLITE_MIGRATION: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS webhook_outbox (
        id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        url TEXT NOT NULL,
        event_type TEXT NOT NULL,
        body TEXT NOT NULL,
        created_at REAL NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending',
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at REAL NOT NULL,
        claim TEXT,
        claimed_until REAL NOT NULL DEFAULT 0
    )""",
    """CREATE INDEX IF NOT EXISTS webhook_outbox_due ON webhook_outbox (next_attempt_at)
        WHERE state = 'pending'""",
    "CREATE INDEX IF NOT EXISTS webhook_outbox_by_run ON webhook_outbox (run_id)",
    """CREATE TABLE IF NOT EXISTS webhook_attempts (
        message_id TEXT NOT NULL REFERENCES webhook_outbox (id) ON DELETE CASCADE,
        attempt INTEGER NOT NULL,
        at REAL NOT NULL,
        status_code INTEGER,
        error TEXT,
        PRIMARY KEY (message_id, attempt)
    )""",
)
POSTGRES_MIGRATION: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS webhook_outbox (
        id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        url TEXT NOT NULL,
        event_type TEXT NOT NULL,
        body TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending',
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at DOUBLE PRECISION NOT NULL,
        claim TEXT,
        claimed_until DOUBLE PRECISION NOT NULL DEFAULT 0
    )""",
    """CREATE INDEX IF NOT EXISTS webhook_outbox_due ON webhook_outbox (next_attempt_at)
        WHERE state = 'pending'""",
    "CREATE INDEX IF NOT EXISTS webhook_outbox_by_run ON webhook_outbox (run_id)",
    """CREATE TABLE IF NOT EXISTS webhook_attempts (
        message_id TEXT NOT NULL REFERENCES webhook_outbox (id) ON DELETE CASCADE,
        attempt INTEGER NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        status_code INTEGER,
        error TEXT,
        PRIMARY KEY (message_id, attempt)
    )""",
)

_COLUMNS: Final = "id, run_id, url, event_type, body, created_at"


@dataclass(frozen=True, slots=True)
class WebhookMessage:
    """One notification: its ``webhook-id`` (the same on every attempt), target and body."""

    id: str
    run_id: str
    url: str
    event_type: str
    body: str
    """The JSON text that is sent and signed, byte for byte, on every attempt."""
    created_at: float


@dataclass(frozen=True, slots=True)
class ClaimedWebhook:
    """A message this worker may attempt now: ``attempts`` were made before."""

    message: WebhookMessage
    attempts: int
    claim: str


@dataclass(frozen=True, slots=True)
class WebhookAttempt:
    """One delivery attempt: the receiver's status, or why there was none (``error``)."""

    attempt: int
    at: float
    status_code: int | None
    error: str | None


@dataclass(frozen=True, slots=True)
class WebhookState:
    """A message as stored, with its attempts (oldest first)."""

    message: WebhookMessage
    state: WebhookStatus
    next_attempt_at: float
    attempts: tuple[WebhookAttempt, ...]


def _message(row: Any) -> WebhookMessage:
    return WebhookMessage(
        id=row["id"],
        run_id=row["run_id"],
        url=row["url"],
        event_type=row["event_type"],
        body=row["body"],
        created_at=float(row["created_at"]),
    )


def _attempt(row: Any) -> WebhookAttempt:
    return WebhookAttempt(
        attempt=int(row["attempt"]),
        at=float(row["at"]),
        status_code=row["status_code"],
        error=row["error"],
    )


# --- SQLite: plain functions, run on the store's thread in one transaction ------------------


def sqlite_enqueue(db: sqlite3.Connection, message: WebhookMessage) -> None:
    """Queue ``message`` (its id once: a repeat of the same notification adds nothing)."""
    db.execute(
        f"INSERT OR IGNORE INTO webhook_outbox ({_COLUMNS}, next_attempt_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            message.id,
            message.run_id,
            message.url,
            message.event_type,
            message.body,
            message.created_at,
            message.created_at,
        ),
    )


def sqlite_claim(
    db: sqlite3.Connection, claim: str, now: float, until: float, limit: int
) -> list[ClaimedWebhook]:
    # one statement under the write lock (BEGIN IMMEDIATE): two processes never claim a
    # message both, and an expired claim is taken over
    rows = db.execute(
        "UPDATE webhook_outbox SET claim = ?, claimed_until = ? WHERE id IN ("
        " SELECT id FROM webhook_outbox WHERE state = 'pending' AND next_attempt_at <= ?"
        " AND claimed_until <= ? ORDER BY next_attempt_at LIMIT ?)"
        f" RETURNING {_COLUMNS}, attempts",
        (claim, until, now, now, limit),
    ).fetchall()
    return [ClaimedWebhook(_message(row), int(row["attempts"]), claim) for row in rows]


def sqlite_record(
    db: sqlite3.Connection,
    claimed: ClaimedWebhook,
    attempt: WebhookAttempt,
    state: WebhookStatus,
    next_attempt_at: float,
) -> bool:
    changed = db.execute(
        "UPDATE webhook_outbox SET attempts = attempts + 1, state = ?, next_attempt_at = ?,"
        " claim = NULL, claimed_until = 0 WHERE id = ? AND claim = ? AND attempts = ?",
        (state, next_attempt_at, claimed.message.id, claimed.claim, claimed.attempts),
    ).rowcount
    if changed != 1:
        return False
    db.execute(
        "INSERT INTO webhook_attempts (message_id, attempt, at, status_code, error)"
        " VALUES (?, ?, ?, ?, ?)",
        (claimed.message.id, attempt.attempt, attempt.at, attempt.status_code, attempt.error),
    )
    return True


def sqlite_prune(db: sqlite3.Connection, before: float, limit: int) -> int:
    """Delete up to ``limit`` settled messages created before ``before``; how many."""
    ids = [
        row["id"]
        for row in db.execute(
            "SELECT id FROM webhook_outbox WHERE state <> 'pending' AND created_at < ? LIMIT ?",
            (before, limit),
        )
    ]
    if not ids:
        return 0
    marks = ", ".join("?" * len(ids))
    db.execute(f"DELETE FROM webhook_attempts WHERE message_id IN ({marks})", ids)
    return int(db.execute(f"DELETE FROM webhook_outbox WHERE id IN ({marks})", ids).rowcount)


def sqlite_states(db: sqlite3.Connection, run_id: str) -> list[WebhookState]:
    rows = db.execute(
        f"SELECT {_COLUMNS}, state, next_attempt_at FROM webhook_outbox WHERE run_id = ?"
        " ORDER BY created_at, rowid",
        (run_id,),
    ).fetchall()
    states = []
    for row in rows:
        attempts = db.execute(
            "SELECT attempt, at, status_code, error FROM webhook_attempts"
            " WHERE message_id = ? ORDER BY attempt",
            (row["id"],),
        ).fetchall()
        states.append(
            WebhookState(
                _message(row),
                row["state"],
                float(row["next_attempt_at"]),
                tuple(_attempt(a) for a in attempts),
            )
        )
    return states


# --- PostgreSQL: on one pooled connection ---------------------------------------------------


async def postgres_enqueue(conn: Any, message: WebhookMessage) -> None:
    """Queue ``message`` (its id once)."""
    await conn.execute(
        f"INSERT INTO webhook_outbox ({_COLUMNS}, next_attempt_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $6) ON CONFLICT (id) DO NOTHING",
        message.id,
        message.run_id,
        message.url,
        message.event_type,
        message.body,
        message.created_at,
    )


async def postgres_claim(
    conn: Any, claim: str, now: float, until: float, limit: int
) -> list[ClaimedWebhook]:
    # SKIP LOCKED: workers claiming at once take different messages instead of waiting
    rows: list[asyncpg.Record] = await conn.fetch(
        "UPDATE webhook_outbox SET claim = $1, claimed_until = $2 WHERE id IN ("
        " SELECT id FROM webhook_outbox WHERE state = 'pending' AND next_attempt_at <= $3"
        " AND claimed_until <= $3 ORDER BY next_attempt_at LIMIT $4 FOR UPDATE SKIP LOCKED)"
        f" RETURNING {_COLUMNS}, attempts",
        claim,
        until,
        now,
        limit,
    )
    return [ClaimedWebhook(_message(row), int(row["attempts"]), claim) for row in rows]


async def postgres_record(
    conn: Any,
    claimed: ClaimedWebhook,
    attempt: WebhookAttempt,
    state: WebhookStatus,
    next_attempt_at: float,
) -> bool:
    async with conn.transaction():
        status = await conn.execute(
            "UPDATE webhook_outbox SET attempts = attempts + 1, state = $1,"
            " next_attempt_at = $2, claim = NULL, claimed_until = 0"
            " WHERE id = $3 AND claim = $4 AND attempts = $5",
            state,
            next_attempt_at,
            claimed.message.id,
            claimed.claim,
            claimed.attempts,
        )
        if status != "UPDATE 1":
            return False
        await conn.execute(
            "INSERT INTO webhook_attempts (message_id, attempt, at, status_code, error)"
            " VALUES ($1, $2, $3, $4, $5)",
            claimed.message.id,
            attempt.attempt,
            attempt.at,
            attempt.status_code,
            attempt.error,
        )
    return True


async def postgres_prune(conn: Any, before: float, limit: int) -> int:
    """Delete up to ``limit`` settled messages created before ``before``; how many."""
    async with conn.transaction():
        # SKIP LOCKED: two workers pruning at once take different rows
        rows = await conn.fetch(
            "SELECT id FROM webhook_outbox WHERE state <> 'pending' AND created_at < $1"
            " LIMIT $2 FOR UPDATE SKIP LOCKED",
            before,
            limit,
        )
        ids = [row["id"] for row in rows]
        if not ids:
            return 0
        await conn.execute("DELETE FROM webhook_attempts WHERE message_id = ANY($1::text[])", ids)
        status: str = await conn.execute(
            "DELETE FROM webhook_outbox WHERE id = ANY($1::text[])", ids
        )
    return int(status.rsplit(" ", 1)[-1])


async def postgres_states(conn: Any, run_id: str) -> list[WebhookState]:
    rows = await conn.fetch(
        f"SELECT {_COLUMNS}, state, next_attempt_at FROM webhook_outbox WHERE run_id = $1"
        " ORDER BY created_at, id",
        run_id,
    )
    states = []
    for row in rows:
        attempts = await conn.fetch(
            "SELECT attempt, at, status_code, error FROM webhook_attempts"
            " WHERE message_id = $1 ORDER BY attempt",
            row["id"],
        )
        states.append(
            WebhookState(
                _message(row),
                row["state"],
                float(row["next_attempt_at"]),
                tuple(_attempt(a) for a in attempts),
            )
        )
    return states
