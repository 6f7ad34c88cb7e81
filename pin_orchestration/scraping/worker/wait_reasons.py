"""Why a queued job waits, and until when: GET /jobs/{id}'s `wait`, `pin scraping job
explain ID` (docs/jobs/scraping.md, "Why is my job waiting").

Computed when asked, from the state the claim keeps, with the claim's own predicates in
the claim's order (scraping/sql/claim_jobs.sql: pause → due → token → connection → the
tenant's own jobs on the host, other tenants' turns → the class's turn), then what the
worker checks after the claim (the host's robots.txt); nothing is written per claim for
it. The reason is true at `as_of`; `until`, where known, is the earliest the reason
lifts (the job may then wait for the next one).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import Connection, Engine

from pin_orchestration.platform.sql import NamedQueries
from pin_orchestration.scraping.fetch.robots_rules import origin_of
from pin_orchestration.scraping.store.leases import DomainDefaults

WaitReason = Literal[
    "retry_backoff",
    "host_paused",
    "host_rate",
    "host_connections",
    "robots_pending",
    "tenant_turn",
    "class_share",
    "no_free_worker",
]
REASONS: tuple[str, ...] = WaitReason.__args__  # type: ignore[attr-defined]
PauseCause = Literal["retry_after", "operator", "robots_unreachable"]


class WaitView(BaseModel):
    reason: WaitReason = Field(
        description="Why the job is not running: retry_backoff (its next attempt is not due), "
        "host_paused (its host is paused, see cause), host_rate (its host's requests per "
        "second are spent), host_connections (its host's connections are all in use), "
        "robots_pending (its host's robots.txt is being fetched), tenant_turn (this "
        "tenant's earlier jobs on its host, or other tenants' turns there, go first), "
        "class_share (another priority class has the next turns of its 6:3:1 share), "
        "no_free_worker (it is next: no worker has a free slot yet)"
    )
    cause: PauseCause | None = Field(
        None,
        description="host_paused only: retry_after (the host answered 429 / Retry-After), "
        "operator (paused by an operator), robots_unreachable (its robots.txt does not "
        "answer: nothing is sent to the host until it does)",
    )
    until: datetime | None = Field(
        None, description="When the reason lifts at the earliest; null when not known"
    )
    as_of: datetime = Field(description="When this was true (a cached answer is older)")
    message: str = Field(description="One sentence for a person")


_q = NamedQueries("pin_orchestration.scraping", "wait_reasons.sql")


def job_wait(
    conn: Connection,
    job: dict[str, Any],
    *,
    domain_defaults: DomainDefaults,
    robots_mode: str,
) -> WaitView | None:
    """The wait of `job` (a row of get_job), None unless it is queued."""
    if job["status"] != "queued":
        return None
    row = conn.execute(
        _q("job_wait"),
        {
            "job_id": job["id"],
            "origin": origin_of(job["url"]),
            "default_rps": domain_defaults.rps,
            "default_concurrency": domain_defaults.concurrency,
        },
    ).one_or_none()
    if row is None:  # it left the queue since it was read
        return None
    return decide(row, robots_mode=robots_mode)


def decide(row: Any, *, robots_mode: str) -> WaitView:
    """The first of the claim's predicates that holds the job, in the claim's order, then
    what the worker checks after the claim."""
    return (
        _host_paused(row)
        or _due_later(row)
        or _host_at_its_limits(row)
        or _turns_ahead(row)
        or _after_the_claim(row, robots_mode)
    )


def _view(
    row: Any, reason: str, message: str, until: datetime | None = None, cause: str | None = None
) -> WaitView:
    return WaitView(
        reason=reason,  # type: ignore[arg-type]
        cause=cause,  # type: ignore[arg-type]
        until=until,
        as_of=row.as_of,
        message=message,
    )


def _host_paused(row: Any) -> WaitView | None:
    now: datetime = row.as_of
    paused = row.blocked_until is not None and row.blocked_until > now
    due_later = row.next_attempt_at is not None and row.next_attempt_at > now
    # The later of the two is what holds the job.
    if not paused or (due_later and row.next_attempt_at > row.blocked_until):
        return None
    # The robots.txt's pause ends at its next try; a pause past that is someone else's (an
    # operator's, a Retry-After), set since, and what the job waits for.
    if (
        row.robots_state == "unreachable"
        and row.robots_expires_at is not None
        and row.robots_expires_at >= row.blocked_until - _SAME_PAUSE
    ):
        return _view(
            row,
            "host_paused",
            "Its host's robots.txt does not answer, so nothing is sent to the host until "
            f"it is asked again at {_at(row.blocked_until)}.",
            row.blocked_until,
            "robots_unreachable",
        )
    if row.pause_cause == "operator":
        return _view(
            row,
            "host_paused",
            f"An operator paused its host until {_at(row.blocked_until)}.",
            row.blocked_until,
            "operator",
        )
    return _view(
        row,
        "host_paused",
        f"Its host asked to be left alone (429 / Retry-After) until {_at(row.blocked_until)}.",
        row.blocked_until,
        "retry_after",
    )


def _due_later(row: Any) -> WaitView | None:
    if row.next_attempt_at is None or row.next_attempt_at <= row.as_of:
        return None
    if row.last_error_class == "robots_pending":
        return _view(
            row,
            "robots_pending",
            "Its host's robots.txt was being fetched by another worker; it is asked for "
            f"again at {_at(row.next_attempt_at)}.",
            row.next_attempt_at,
        )
    if row.last_error_class == "robots_unreachable":
        # handed back for a redirect hop's host (its own host would be the pause above)
        return _view(
            row,
            "host_paused",
            "A host it is redirected to has a robots.txt that does not answer; it is tried "
            f"again at {_at(row.next_attempt_at)}.",
            row.next_attempt_at,
            "robots_unreachable",
        )
    return _view(
        row,
        "retry_backoff",
        f"Its next attempt is due at {_at(row.next_attempt_at)} (backoff after the last).",
        row.next_attempt_at,
    )


def _host_at_its_limits(row: Any) -> WaitView | None:
    if row.tokens is not None and row.tokens < 1:
        lifts = row.as_of + timedelta(seconds=(1 - row.tokens) / row.rps)
        return _view(
            row,
            "host_rate",
            f"Its host's rate ({row.rps:g} requests per second) allows the next request at "
            f"{_at(lifts)}.",
            lifts,
        )
    if row.concurrency is not None and row.connections >= row.concurrency:
        return _view(
            row,
            "host_connections",
            f"All {row.concurrency} connections its host allows are in use; it waits for "
            "one to end.",
        )
    return None


def _turns_ahead(row: Any) -> WaitView | None:
    # The pick goes by tenant (start tags), then within the tenant by its own jobs' fair
    # tags: other tenants' jobs on the host are not in a line with this one, they take
    # turns with it.
    if row.ahead:
        goes = "goes" if row.ahead == 1 else "go"
        shared = ""
        if row.others:
            take = "takes" if row.others == 1 else "take"
            shared = f"; {_tenants(row.others)} with jobs there {take} turns with it"
        return _view(
            row,
            "tenant_turn",
            f"{_count(row.ahead)} of this tenant's jobs on its host {goes} first{shared}.",
        )
    if row.others_first:
        their = "has its" if row.others_first == 1 else "have their"
        return _view(
            row,
            "tenant_turn",
            f"It is this tenant's next job on its host; {_tenants(row.others_first)} with "
            f"jobs there {their} turn first.",
        )
    if row.class_ahead is not None:
        return _view(
            row,
            "class_share",
            f"The {row.class_ahead} priority class has the next turns of the 6:3:1 share; "
            "its own class follows.",
        )
    return None


def _after_the_claim(row: Any, robots_mode: str) -> WaitView:
    # robots.txt is read by the worker after the claim: it holds a job that is next.
    obeyed = (row.robots_mode or robots_mode) == "obey"
    if obeyed and (row.robots_leased or not row.robots_fresh):
        return _view(
            row,
            "robots_pending",
            "Its host's robots.txt is not known yet; a worker fetches it before the job's request.",
        )
    return _view(
        row,
        "no_free_worker",
        "It is next on its host, which has room: it starts when a worker has a free slot.",
    )


# A robots.txt's pause and its next try are written from one reading, apart by the time
# between the read and the write.
_SAME_PAUSE = timedelta(seconds=1)


def _count(n: int) -> str:
    # the counts stop at 1000
    return f"{n}+" if n >= 1000 else str(n)


def _tenants(n: int) -> str:
    return f"{_count(n)} other tenant" + ("" if n == 1 else "s")


def _at(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


def explain(
    engine: Engine, job_id: uuid.UUID, *, domain_defaults: DomainDefaults, robots_mode: str
) -> tuple[dict[str, Any], WaitView | None] | None:
    """An operator's view of any job and its wait (`pin scraping job explain`); None when
    there is no such job."""
    with engine.connect() as conn:
        row = conn.execute(_q("job_by_id"), {"job_id": job_id}).one_or_none()
        if row is None:
            return None
        job = dict(row._mapping)
        return job, job_wait(conn, job, domain_defaults=domain_defaults, robots_mode=robots_mode)
