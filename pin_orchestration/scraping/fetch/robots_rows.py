"""The robots.txt rows every worker shares (scraping.robots), as one worker run reads and
writes them: one slot at a time reads an origin's row (the others take its answer), a fresh
row is remembered for MEMO_SECONDS, and the worker that takes a stale row's lease fetches
the robots.txt and stores what its answer means (RFC 9309 section 2.3.1; robots.py says
how).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Engine

from pin_orchestration.platform.sql import NamedQueries
from pin_orchestration.scraping.fetch.client import Fetcher
from pin_orchestration.scraping.fetch.errors import FetchError
from pin_orchestration.scraping.fetch.robots_rules import (
    RobotsRules,
    crawl_delay_of,
    robots_text,
    ttl_seconds,
)
from pin_orchestration.scraping.store.leases import DomainDefaults

log = logging.getLogger(__name__)

# RFC 9309 section 2.5: at least 500 KiB is parsed; what follows is ignored.
MAX_ROBOTS_BYTES = 500 * 1024
# How long a worker trusts the row it read (fresh ones only) before reading it again.
MEMO_SECONDS = 5.0
# Rows remembered per process.
_MEMO_KEPT = 1024

_ALLOW_ALL_ERRORS = frozenset({"too_many_redirects", "refused_address", "invalid_url"})


_q = NamedQueries("pin_orchestration.scraping", "robots.sql")


class Turns(Protocol):
    """A job's turns on hosts (leases.RedirectSlots): a request waits for one."""

    def take(self, host: str) -> float: ...

    def release(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class StoredRobots:
    host_mode: str | None
    state: str | None
    body: str | None
    fetched_at: datetime | None
    expires_at: datetime | None
    failures: int
    fresh: bool
    leased: bool
    # When it stops being fresh, on this process's monotonic clock (read from PostgreSQL
    # as seconds from its now(): a worker's wall clock off by an hour moves nothing).
    fresh_until: float


class _Reading:
    """A read of an origin's row under way: the slots that want it meanwhile wait for it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.stored: StoredRobots | None = None


class RobotsRows:
    """The rows of scraping.robots as one worker run's slots share them: read one slot at a
    time and remembered while fresh, leased to the one worker that fetches a robots.txt,
    and stored with what its answer means."""

    def __init__(
        self,
        engine: Engine,
        fetcher: Fetcher,
        *,
        mode: str,
        owner: str,
        domain_defaults: DomainDefaults,
        retry_seconds: float,
        max_pause_seconds: float,
        token: str,
    ) -> None:
        self._engine = engine
        self.mode = mode
        self._owner = owner
        self._defaults = domain_defaults
        self._retry_seconds = retry_seconds
        self._max_pause_seconds = max_pause_seconds
        self.token = token
        self.timeout_seconds = fetcher.policy.timeout_seconds
        # Its own fetcher: the same guard and User-Agent, a body cut at 500 KiB.
        self._fetcher = Fetcher(
            dataclasses.replace(fetcher.policy, max_body_bytes=MAX_ROBOTS_BYTES, truncate_body=True)
        )
        self._memo: OrderedDict[str, tuple[StoredRobots, float]] = OrderedDict()
        # origin → the read of its row a slot has under way
        self._reads: dict[str, _Reading] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._fetcher.close()

    def read(self, origin: str, domain: str) -> StoredRobots:
        """The origin's row; a fresh one (not unreachable), or one of an exempt host, is
        remembered for MEMO_SECONDS (a job's check then costs no query; an operator's
        exemption reaches this worker within that). One slot at a time reads a row: the
        run's other slots wanting it meanwhile take its answer (at a run's start, or a
        memo's end, 556 slots read the same row at once: ~600 reads a run)."""
        with self._lock:
            memo = self._memo.get(origin)
            if memo is not None:
                stored = memo[0]
                usable = stored.fresh_until > time.monotonic() or self.ignored(stored)
                # Past its MEMO_SECONDS, what it said holds while a slot reads the row again.
                if usable and (memo[1] > time.monotonic() or origin in self._reads):
                    return stored
            reading = self._reads.get(origin)
            if reading is None:
                reading = self._reads[origin] = _Reading()
                mine = True
            else:
                mine = False
        if not mine:
            reading.done.wait()
            if reading.stored is not None:
                return reading.stored
            return self._read_row(origin, domain)  # its read failed: this slot's own
        try:
            reading.stored = self._read_row(origin, domain)
            return reading.stored
        finally:
            with self._lock:
                del self._reads[origin]
            reading.done.set()

    def _read_row(self, origin: str, domain: str) -> StoredRobots:
        now = time.monotonic()
        with self._engine.connect() as conn:
            row = conn.execute(_q("robots_state"), {"origin": origin, "domain": domain}).one()
        stored = self._stored(row, now)
        with self._lock:
            # An unreachable one is read each time: its jobs are claimed only when its
            # host's pause was lifted (an operator's exemption or resume), and a
            # remembered copy would pause the host again.
            if (stored.fresh and stored.state != "unreachable") or self.ignored(stored):
                self._memo[origin] = (stored, now + MEMO_SECONDS)
                while len(self._memo) > _MEMO_KEPT:
                    self._memo.popitem(last=False)
            else:
                self._memo.pop(origin, None)
        return stored

    def ignored(self, stored: StoredRobots) -> bool:
        return (stored.host_mode or self.mode) == "ignore"

    @staticmethod
    def _stored(row: Any, read_at: float) -> StoredRobots:
        return StoredRobots(
            host_mode=row.host_mode,
            state=row.state,
            body=row.body,
            fetched_at=row.fetched_at,
            expires_at=row.expires_at,
            failures=row.failures or 0,
            fresh=bool(row.fresh),
            leased=bool(row.leased),
            fresh_until=read_at + float(row.expires_in) if row.fresh else 0.0,
        )

    def take_lease(self, origin: str, domain: str, job_id: uuid.UUID) -> int | None:
        with self._engine.begin() as conn:
            return conn.execute(
                _q("robots_take_lease"),
                {
                    "origin": origin,
                    "domain": domain,
                    "owner": self._owner,
                    "job_id": job_id,
                    # its fetch, its wait for a turn, and room for a slow database
                    "lease_seconds": self.timeout_seconds * 2 + 5,
                },
            ).scalar_one_or_none()

    def fetch_and_store(
        self,
        origin: str,
        domain: str,
        failures: int,
        should_stop: Callable[[], bool],
        turns: Turns,
    ) -> None:
        url = f"{origin}/robots.txt"
        stored = False
        try:
            try:
                with self._fetcher.fetch(
                    url, should_stop=should_stop, redirect_slots=_NoRelease(turns)
                ) as answer:
                    status = answer.status_code
                    body = robots_text(answer.body.read())
                    headers = answer.headers
            except FetchError as exc:
                if exc.error_class == "cancelled":
                    raise
                state = "allow_all" if exc.error_class in _ALLOW_ALL_ERRORS else "unreachable"
                self._store(origin, domain, state, None, None, None, failures, exc.detail)
                stored = True
                return
            if 200 <= status < 300:
                delay = crawl_delay_of(RobotsRules.parse(body), self.token)
                self._store(origin, domain, "rules", status, body, delay, failures, None, headers)
            elif 400 <= status < 500 and status != 429:
                self._store(
                    origin, domain, "allow_all", status, None, None, failures, None, headers
                )
            else:
                self._store(
                    origin, domain, "unreachable", status, None, None, failures, f"HTTP {status}"
                )
            stored = True
        finally:
            if not stored:
                self.release_lease(origin)

    def release_lease(self, origin: str) -> None:
        """Give back this worker's lease of `origin`'s row, its robots.txt not fetched: the
        next slot of any worker takes it at once."""
        with self._engine.begin() as conn:
            conn.execute(_q("robots_release_lease"), {"origin": origin, "owner": self._owner})

    def _store(
        self,
        origin: str,
        domain: str,
        state: str,
        status: int | None,
        body: str | None,
        crawl_delay: float | None,
        failures: int,
        error: str | None,
        headers: Any = None,
    ) -> None:
        if state == "unreachable":
            ttl = min(self._retry_seconds * 2 ** min(failures, 30), self._max_pause_seconds)
            log.warning("%s/robots.txt unreachable (%s); asked again in %.0f s", origin, error, ttl)
        else:
            ttl = ttl_seconds(headers or {})
        with self._engine.begin() as conn:
            written = conn.execute(
                _q("robots_store"),
                {
                    "origin": origin,
                    "owner": self._owner,
                    "state": state,
                    "http_status": status,
                    "body": body,
                    "crawl_delay": crawl_delay,
                    "ttl_seconds": ttl,
                    "last_error": error.replace("\x00", "")[:512] if error else None,
                },
            ).one_or_none()
            if written is not None:
                conn.execute(
                    _q("robots_crawl_delay"),
                    {"domain": domain, "default_rps": self._defaults.rps},
                )


class _NoRelease:
    """The job's turns for the robots.txt fetch's own redirects; the job's redirect slot is
    the job's fetch's to release."""

    def __init__(self, turns: Turns) -> None:
        self._turns = turns

    def take(self, host: str) -> float:
        return self._turns.take(host)

    def release(self) -> None:
        return None
