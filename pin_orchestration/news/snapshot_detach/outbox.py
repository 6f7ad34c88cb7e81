"""The outbox row's transactions: enqueue (in the owning operation's transaction), claim,
record outcomes, give back unstarted claims, and the runbook's requeue."""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine

from pin_orchestration.news.snapshot_detach.policy import (
    ClaimedEntry,
    DetachOptions,
    Outcome,
    RandomSource,
    Reason,
    claim_lease_seconds,
)
from pin_orchestration.platform.sql import NamedQueries

log = logging.getLogger(__name__)


query = NamedQueries("pin_orchestration.news.snapshot_detach", "queries.sql")


# --- enqueue (the owning operations: set-blocks / delete-post) ------------------------------


def enqueue_snapshot_detach(
    conn: Connection, snapshot_id: uuid.UUID, post_id: uuid.UUID, reason: Reason | str
) -> uuid.UUID:
    """Write the detach intent in the caller's transaction; return the active row's id.

    A snapshot that already has an active (not Done) row gets no second one: the existing
    row's id is returned (ux_sdo_snapshot dedupe). The SQL function
    news.enqueue_snapshot_detach does the work — the same one other services call — and
    cannot fail inside the caller's transaction because the active row turned Done at the
    wrong moment.
    """
    params = {"snapshot_id": snapshot_id, "post_id": post_id, "reason": Reason(reason).value}
    return conn.execute(query("enqueue"), params).scalar_one()


# --- claim / outcome / release ---------------------------------------------------------------


def _stamp_params(entries: Sequence[ClaimedEntry]) -> dict[str, list[Any]]:
    return {
        "ids": [e.id for e in entries],
        "attempts": [e.attempts for e in entries],
        "next_attempt_ats": [e.next_attempt_at for e in entries],
    }


AUTOCOMMIT = "AUTOCOMMIT"


def autocommit(conn: Connection) -> Connection:
    """`conn` with every statement its own transaction: a drain's connection for the run.
    A claim is then 2 round trips (lock_due, mark_claimed) instead of 4 with BEGIN and
    COMMIT, and a group of outcomes 1 instead of 3."""
    return conn.execution_options(isolation_level=AUTOCOMMIT)


@contextmanager
def _transaction(bind: Engine | Connection) -> Iterator[Connection]:
    """A short transaction: on one of the engine's connections, or on the connection a
    drain holds for its run (no pool checkout and ping each time; after a disconnect
    SQLAlchemy reconnects it on next use) — there, when it is in autocommit, each
    statement is its own transaction and no BEGIN / COMMIT round trip is made."""
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            yield conn
    elif bind.get_execution_options().get("isolation_level") == AUTOCOMMIT:
        yield bind
    else:
        with bind.begin():
            yield bind


def claim_due(
    conn: Connection,
    options: DetachOptions,
    rand: RandomSource = random.random,
    *,
    limit: int | None = None,
    call_timeout_seconds: float = 0.0,
) -> list[ClaimedEntry]:
    """Lock up to `limit` (default batch_size) rows due on the database's clock (SKIP
    LOCKED) and stamp the attempt, leasing each row for `call_timeout_seconds` plus the
    backoff from the database's now(); the caller commits (or `conn` is in autocommit).

    A row is stamped only if it still carries what was read (mark_claimed), so on an
    autocommit connection, where lock_due's row locks end with its statement, a row a
    parallel claimer stamped in between is not claimed twice; when every row read went
    that way, the claim reads again (those rows are no longer due), so an empty answer
    still means nothing was due.
    """
    size = options.batch_size if limit is None else min(limit, options.batch_size)
    while True:
        rows = conn.execute(query("lock_due"), {"batch_size": size}).all()
        if not rows:
            return []
        leases = [
            claim_lease_seconds(row.attempts + 1, options, call_timeout_seconds, rand)
            for row in rows
        ]
        stamped = dict(
            conn.execute(
                query("mark_claimed"),
                {
                    "ids": [row.id for row in rows],
                    "attempts": [row.attempts + 1 for row in rows],
                    "lease_seconds": leases,
                    "previous_next_attempt_ats": [row.next_attempt_at for row in rows],
                },
            ).all()
        )
        if stamped:
            break
    return [
        ClaimedEntry(
            id=row.id,
            snapshot_id=row.snapshot_id,
            post_id=row.post_id,
            reason=row.reason,
            attempts=row.attempts + 1,
            next_attempt_at=stamped[row.id],
            previous_attempts=row.attempts,
            previous_next_attempt_at=row.next_attempt_at,
        )
        for row in rows
        if row.id in stamped
    ]


def claim_batch(
    bind: Engine | Connection,
    options: DetachOptions,
    rand: RandomSource = random.random,
    *,
    limit: int | None = None,
    call_timeout_seconds: float = 0.0,
) -> list[ClaimedEntry]:
    """The claim as its own transaction(s): committed (row locks released) on return."""
    with _transaction(bind) as conn:
        return claim_due(
            conn, options, rand, limit=limit, call_timeout_seconds=call_timeout_seconds
        )


def record_outcomes(
    bind: Engine | Connection, outcomes: Sequence[Outcome]
) -> dict[uuid.UUID, datetime]:
    """Write outcomes in one short transaction; return the rows actually updated, each with its
    next_attempt_at (a Pending row's next attempt).

    A Pending outcome sets the next attempt (counted from the end of its call). An outcome
    whose row no longer carries its claim's stamp (a newer claim took the row,
    or an operator changed it) is not applied. Committed without waiting for the WAL
    flush (set_config in the statement): an outcome lost to a crash only means one more
    (idempotent) call. One statement: on an autocommit connection, one round trip.
    """
    if not outcomes:
        return {}
    params = {
        **_stamp_params([o.entry for o in outcomes]),
        "statuses": [o.status.value for o in outcomes],
        "last_errors": [o.last_error for o in outcomes],
        "retry_afters": [o.retry_after_seconds for o in outcomes],
    }
    with _transaction(bind) as conn:
        return dict(conn.execute(query("record_outcomes"), params).all())


def release_claims(bind: Engine | Connection, entries: Sequence[ClaimedEntry]) -> int:
    """Give back claims whose call never started (stop requested); returns rows released."""
    if not entries:
        return 0
    params = {
        **_stamp_params(entries),
        "previous_attempts": [e.previous_attempts for e in entries],
        "previous_next_attempt_ats": [e.previous_next_attempt_at for e in entries],
    }
    with _transaction(bind) as conn:
        return conn.execute(query("release_claims"), params).rowcount


# --- runbook ---------------------------------------------------------------------------------


class RequeueError(ValueError):
    """The runbook action found nothing to re-enqueue."""


def requeue_quarantined(
    engine: Engine, *, entry_id: uuid.UUID | None = None, snapshot_id: uuid.UUID | None = None
) -> uuid.UUID:
    """DET-7 runbook: Quarantined → Pending with attempts 0, due now. Returns the row id."""
    if (entry_id is None) == (snapshot_id is None):
        raise RequeueError("give exactly one of entry_id / snapshot_id")
    with engine.begin() as conn:
        row = conn.execute(
            query("requeue_quarantined"), {"id": entry_id, "snapshot_id": snapshot_id}
        ).first()
    if row is None:
        which = f"id {entry_id}" if entry_id else f"snapshot_id {snapshot_id}"
        raise RequeueError(f"no Quarantined snapshot-detach entry with {which}")
    log.info("entry re-enqueued: snapshotId=%s postId=%s", row.snapshot_id, row.post_id)
    return row.id
