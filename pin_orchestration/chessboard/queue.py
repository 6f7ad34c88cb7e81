"""The debounce queue chessboard.project_recalc_requests (seed 002, AGG-1 and runbook edits).

One row per project (PK = the coalescing key). Raisers call `request_project_recalc` in the
same transaction as the mutation that made the aggregates stale, so the trigger cannot be
lost: a new row is due `debounce` from now; each further request pushes the due time out
by `debounce` again (trailing), but never past `first_requested_at + starvation_cap`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Engine

from pin_orchestration.platform.options import option
from pin_orchestration.platform.sql import NamedQueries

# Tenant recorded for a forced recalc of a project whose row has no tenant_id.
UNKNOWN_TENANT = uuid.UUID(int=0)


# The named statements of chessboard/queries.sql, used across the area.
query = NamedQueries("pin_orchestration.chessboard", "queries.sql")


class RecalcTriggerReason(StrEnum):
    """last_reason values (seed: RecalcTriggerReason, stored as a string, varchar(32))."""

    PROPERTY_OBJECT_STATUS_CHANGED = "PropertyObjectStatusChanged"
    PROPERTY_OBJECT_PRICE_CHANGED = "PropertyObjectPriceChanged"
    PROPERTY_OBJECT_UPSERTED = "PropertyObjectUpserted"
    LAYOUT_CHANGED = "LayoutChanged"
    TALENT_SYNC = "TalentSync"
    CRUD = "Crud"
    # Not in the seed's list: the runbook's force recalc, so operators' requests are
    # distinguishable from the domain's in the queue.
    MANUAL = "Manual"


class RecalcConfigError(ValueError):
    """A recalc policy or a request names an invalid value."""


# A drain's transactions are a few statements with milliseconds of Python between them;
# one idle this long is a client cut off (a hung network, a stalled process), and
# PostgreSQL ends it, so the queue row, the project's rows or the shared metrics rows it
# holds do not keep raisers and other drains waiting until the server notices the dead
# connection (hours of TCP keepalive). A statement that runs long is not idle.
DRAIN_IDLE_SECONDS = 5.0


@dataclass(frozen=True)
class RecalcPolicy:
    """The chessboard recalc options, declared once: the seed's thresholds (debounce 30 s,
    cap 5 min, batch 50, poison 5, the 5 s tick) and the drain's own. The drain run's
    Dagster config and `pin chessboard drain`'s options are derived from these fields."""

    debounce_seconds: float = option(30.0, "A request is due this long after the last one")
    starvation_cap_seconds: float = option(
        300.0, "…but never later than this after the first request of its window"
    )
    batch_size: int = option(50, "Due rows per tick (seed: 50)")
    poison_threshold: int = option(5, "Failed attempts after which a row is poison (seed: 5)")
    tick_seconds: float = option(
        5.0,
        "Longest sleep between drain passes, and the least time before any drain retries a "
        "failed row (seed: the 5 s tick)",
    )
    floor_seconds: float = option(
        0.05, "Shortest sleep between passes, so a row held by another drain is no spin"
    )
    claim_lease_seconds: float = option(
        60.0,
        "A claimed row is reserved for its drain this long; after that (a killed drain) "
        "another drain takes it. Keep it well above a recalc's duration (p99 < 2 s)",
    )
    conflict_retry_seconds: float = option(
        1.0,
        "A project whose rows another transaction held (a raiser) is retried this long "
        "after, without counting an attempt",
    )
    max_run_duration_seconds: float = option(
        240.0,
        "Keep draining, waking as rows fall due, for at most this long; the run ends earlier "
        "when nothing is queued that falls due before then",
    )

    def validate(self) -> None:
        rules: list[tuple[str, bool, str]] = [
            *((name, getattr(self, name) > 0, "must be > 0") for name in _POSITIVE),
            (
                "starvation_cap_seconds",
                self.starvation_cap_seconds >= self.debounce_seconds,
                f"must be >= debounce_seconds ({self.debounce_seconds})",
            ),
            (
                "floor_seconds",
                self.floor_seconds <= self.tick_seconds,
                f"must be <= tick_seconds ({self.tick_seconds})",
            ),
        ]
        problems = [
            f"{name} {rule} (got {getattr(self, name)!r})" for name, ok, rule in rules if not ok
        ]
        if problems:
            raise RecalcConfigError("invalid recalc policy: " + "; ".join(problems))


_POSITIVE = [f.name for f in fields(RecalcPolicy)]
# What a drain run (Dagster config) and `pin chessboard drain` let an operator set: the
# debounce belongs to the raisers, the run duration to runs that loop.
DRAIN_RUN_OPTIONS = (
    "batch_size",
    "poison_threshold",
    "max_run_duration_seconds",
    "tick_seconds",
    "floor_seconds",
    "claim_lease_seconds",
)
DRAIN_TICK_OPTIONS = ("batch_size", "poison_threshold", "tick_seconds", "claim_lease_seconds")


DEFAULT_POLICY = RecalcPolicy()


@dataclass(frozen=True)
class QueueStats:
    depth: int
    due: int
    poison: int
    next_due_at: datetime | None
    # On the database clock, the one the claim uses (<= 0: due already).
    next_due_in_seconds: float | None
    pending_requests: int
    oldest_due_age_seconds: float | None


def _reason(reason: RecalcTriggerReason | str) -> RecalcTriggerReason:
    try:
        return RecalcTriggerReason(reason)
    except ValueError:
        allowed = ", ".join(r.value for r in RecalcTriggerReason)
        raise RecalcConfigError(f"reason must be one of {allowed} (got {reason!r})") from None


def request_project_recalc(
    conn: Connection,
    project_id: uuid.UUID,
    tenant_id: uuid.UUID,
    reason: RecalcTriggerReason | str,
    *,
    now: datetime | None = None,
    policy: RecalcPolicy = DEFAULT_POLICY,
) -> datetime:
    """Debounce upsert (AGG-1) in the caller's transaction; returns the row's new due time.

    `now` defaults to the database clock (transaction start); tests pass their own. The
    SQL function chessboard.request_project_recalc_at does the upsert; other services call
    chessboard.request_project_recalc, the same with the default policy and clock.
    """
    row = conn.execute(
        query("request_recalc"),
        {
            "project_id": project_id,
            "tenant_id": tenant_id,
            "reason": _reason(reason).value,
            "now": now,
            "debounce_seconds": policy.debounce_seconds,
            "cap_seconds": policy.starvation_cap_seconds,
        },
    ).one()
    return row.due_at


def force_recalc_now(engine: Engine, project_id: uuid.UUID, *, now: datetime | None = None) -> bool:
    """Runbook "force recalc": the project's row is due now. False when no such project."""
    with engine.begin() as conn:
        row = conn.execute(
            query("force_due_now"),
            {
                "project_id": project_id,
                "reason": RecalcTriggerReason.MANUAL.value,
                "now": now,
                "unknown_tenant": UNKNOWN_TENANT,
            },
        ).first()
    return row is not None


def reset_poison_row(engine: Engine, project_id: uuid.UUID, *, now: datetime | None = None) -> bool:
    """Runbook "reset a poison row": attempt_count = 0, last_error cleared, due now."""
    with engine.begin() as conn:
        row = conn.execute(query("reset_poison"), {"project_id": project_id, "now": now}).first()
    return row is not None


def queue_stats(
    conn: Connection, *, now: datetime | None = None, policy: RecalcPolicy = DEFAULT_POLICY
) -> QueueStats:
    """Depth, due rows, poison rows and the next due time — one cheap aggregate query."""
    row = conn.execute(
        query("queue_stats"), {"now": now, "poison_threshold": policy.poison_threshold}
    ).one()
    age = row.oldest_due_age_seconds
    return QueueStats(
        depth=row.depth,
        due=row.due,
        poison=row.poison,
        next_due_at=row.next_due_at,
        next_due_in_seconds=(
            float(row.next_due_in_seconds) if row.next_due_in_seconds is not None else None
        ),
        pending_requests=int(row.pending_requests),
        oldest_due_age_seconds=float(age) if age is not None and age > 0 else None,
    )


def poison_rows(conn: Connection, *, policy: RecalcPolicy = DEFAULT_POLICY) -> list[dict[str, Any]]:
    rows = conn.execute(query("poison_rows"), {"poison_threshold": policy.poison_threshold})
    return [dict(r._mapping) for r in rows]
