"""robots.txt (RFC 9309), obeyed by every worker and fetched once for the whole fleet.

Before a job's request (and before each redirect hop) its origin's robots.txt is read from
scraping.robots. Missing or stale, one worker takes the row's lease and fetches it; the
others wait for its answer (a poll of the row), so a host is asked once per expiry however
many workers and jobs want it. The fetch goes through the job fetcher's guard (the same
address check, timeout, User-Agent, redirect limit of 5), keeps the first 500 KiB, and
counts against the host's politeness: at the job's first hop it rides on the turn the
claim spent and the job's own request then takes another turn; at a redirect hop it takes
a turn of the hop's host first.

What an answer means (RFC 9309 section 2.3.1): 2xx, the rules of the group whose product
token matches ours (protego does the parsing), kept for its Cache-Control max-age within
[60 s, 24 h] (24 h without one); 4xx other than 429 (404 included), or more than 5
redirects, everything allowed; 5xx, 429 or no answer, everything disallowed: the host is
paused for every worker until the next try, after PIN_SCRAPING_ROBOTS_RETRY_SECONDS doubling
per failure, at most PIN_SCRAPING_MAX_PAUSE_SECONDS.

The host's Crawl-delay caps its rate in scraping.domains (trigger domains_effective_rps):
the claim already enforces that rate, for every worker.

What a robots.txt says is robots_rules.py's; the shared rows, their lease and the fetch
are robots_rows.py's; this module judges a job's URLs and hands back what a refusal means.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from protego import Protego
from sqlalchemy import Engine

from pin_orchestration.platform.sql import NamedQueries
from pin_orchestration.scraping.fetch.client import Fetcher, product_token
from pin_orchestration.scraping.fetch.robots_rows import RobotsRows, StoredRobots, Turns
from pin_orchestration.scraping.fetch.robots_rules import (
    RobotsRules,
    matched_rule,
    origin_of,
    readings,
)
from pin_orchestration.scraping.store.leases import AttemptOutcome, ClaimedJob, DomainDefaults
from pin_orchestration.scraping.store.politeness import DomainError, normalize_host

MODES = ("obey", "ignore")
# How often a worker waiting for another's fetch looks at the row again.
POLL_SECONDS = 0.05
# How often a slot waiting for its run's own fetch of the robots.txt looks up to give up
# (its wait's end, a stop): it is woken the moment the fetch is done; the watchdog looks
# at a fetch's stop as often.
LEADER_POLL_SECONDS = 0.25
# Parsed robots.txt kept per process (by origin and fetch time).
_PARSED_KEPT = 1024


_q = NamedQueries("pin_orchestration.scraping", "robots.sql")


class RobotsRefusal(Exception):
    """The job's request is not sent (yet): a subclass says why."""


class RobotsDisallowed(RobotsRefusal):
    """The URL is disallowed by its origin's robots.txt; `rule` is the line that matched."""

    def __init__(self, url: str, origin: str, rule: str) -> None:
        super().__init__(f"{origin}/robots.txt disallows {url[:300]} ({rule})")
        self.url = url
        self.rule = rule


class RobotsUnreachable(RobotsRefusal):
    """The origin's robots.txt did not answer usably: nothing goes to it before `until`
    (PostgreSQL's time), which is `retry_monotonic` on this process's monotonic clock."""

    def __init__(self, origin: str, domain: str, until: datetime, retry_monotonic: float) -> None:
        super().__init__(
            f"{origin}/robots.txt is unreachable (5xx or no answer): the host is left alone "
            f"until {until.isoformat()}, when it is asked again"
        )
        self.domain = domain  # the host paused: the job's, or a redirect hop's
        self.until = until
        self.retry_monotonic = retry_monotonic


class RobotsPending(RobotsRefusal):
    """Another worker is still fetching the origin's robots.txt (or the host gave no turn)
    within this attempt's wait."""


class RobotsGuard:
    """One worker run's robots.txt: shared by its slots (thread-safe)."""

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
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"robots mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self._clock = clock
        self.token = product_token(fetcher.policy.user_agent).lower()
        self.timeout_seconds = fetcher.policy.timeout_seconds
        self._rows = RobotsRows(
            engine,
            fetcher,
            mode=mode,
            owner=owner,
            domain_defaults=domain_defaults,
            retry_seconds=retry_seconds,
            max_pause_seconds=max_pause_seconds,
            token=self.token,
        )
        self._parsed: OrderedDict[tuple[str, datetime], Protego] = OrderedDict()
        # origin → set when the slot reading (and maybe fetching) its robots.txt is done
        self._pending: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._rows.close()

    # --- the worker's hooks ------------------------------------------------------------

    def before_fetch(
        self, job: ClaimedJob, url: str, turns: Turns, should_stop: Callable[[], bool]
    ) -> None:
        """Raise a RobotsRefusal unless `url` (the job's first request) may be sent now.
        When its robots.txt was not known at once, the job's request waits for a new turn
        of its host: the claim's was spent on the robots.txt request, or under the rate
        from before its Crawl-delay."""
        try:
            if self._check(url, job, turns, should_stop, first_hop=True):
                until = time.monotonic() + self.timeout_seconds
                self._wait_turn(job.domain, turns, should_stop, until)
        finally:
            # What the robots.txt fetch's redirects held is given back now, so the job's
            # fetch ends holding only what its own redirects take (and, holding nothing,
            # needs no database to end: a fetch rides out an outage).
            turns.release()

    def hop_checker(
        self, job: ClaimedJob, turns: Turns, should_stop: Callable[[], bool]
    ) -> Callable[[str], None]:
        """For Fetcher.fetch's `check_hop`: a redirect hop into a disallowed path raises."""

        def check(url: str) -> None:
            self._check(url, job, turns, should_stop, first_hop=False)

        return check

    def outcome(self, job: ClaimedJob, refusal: RobotsRefusal, duration_ms: int) -> AttemptOutcome:
        """The attempt's end for a refusal: disallowed fails the job for good (nothing was
        sent to the URL); unreachable hands it back until the next try of the robots.txt
        and pauses its host for every worker until then; pending hands it back soon. Neither
        hand-back spends an attempt of the job's budget: nothing was sent to its URL."""
        if isinstance(refusal, RobotsDisallowed):
            return AttemptOutcome(
                job_id=job.id,
                job_domain=job.domain,
                attempt=job.attempt,
                status="failed",
                outcome="failed",
                error_class="robots_disallowed",
                error_detail=str(refusal),
                duration_ms=duration_ms,
            )
        if isinstance(refusal, RobotsUnreachable):
            # `until` is PostgreSQL's time; the write turns moments into delays from the
            # worker's clock reading beside its monotonic one, so the next try is given
            # as that clock reads it (a worker clock an hour ahead unpaused the host and
            # made the job due at once; an hour behind, the job waited an hour more).
            decided_at, decided_monotonic = self._clock(), time.monotonic()
            until = decided_at + timedelta(
                seconds=max(refusal.retry_monotonic - decided_monotonic, 0.0)
            )
            # A redirect hop's host is paused, not the job's (every tenant's jobs there
            # were held by another host's robots.txt); the job then waits itself.
            own_host = refusal.domain == job.domain
            return AttemptOutcome(
                job_id=job.id,
                attempt=job.attempt,
                status="queued",
                outcome="retry",
                error_class="robots_unreachable",
                error_detail=str(refusal),
                duration_ms=duration_ms,
                # Held by its host's pause, not by its own due time: an operator who
                # exempts the host (or resumes it) lets it go at once.
                next_attempt_at=decided_at if own_host else until,
                job_domain=job.domain,
                domain=refusal.domain,
                domain_paused_until=until,
                robots_wait=True,
                decided_at=decided_at,
                decided_monotonic=decided_monotonic,
            )
        return AttemptOutcome(
            job_id=job.id,
            job_domain=job.domain,
            attempt=job.attempt,
            status="queued",
            outcome="retry",
            error_class="robots_pending",
            error_detail=str(refusal),
            duration_ms=duration_ms,
            next_attempt_at=self._clock() + timedelta(seconds=1),
            robots_wait=True,
        )

    # --- the rules ---------------------------------------------------------------------

    def _check(
        self,
        url: str,
        job: ClaimedJob,
        turns: Turns,
        should_stop: Callable[[], bool],
        *,
        first_hop: bool,
    ) -> bool:
        """Judge `url`; True when it was not known at once (this call fetched it, or waited
        for another worker's fetch): the turn the claim gave was spent on the robots.txt
        request or under a rate its Crawl-delay may since have lowered. So is a robots.txt
        another worker stored after this job's claim: the claim's turn was taken at the
        rate from before it (with a Crawl-delay, two starts came milliseconds apart)."""
        origin = origin_of(url)
        # A hop's URL was never through intake: its host is keyed as the fetcher reached it.
        domain = normalize_host(urlsplit(url).hostname or "")
        until = time.monotonic() + self.timeout_seconds
        waited = False
        gate: threading.Event | None = None  # set: this slot speaks for the run's others
        try:
            while True:
                stored = self._rows.read(origin, domain)
                if self._rows.ignored(stored):
                    return waited
                if stored.fresh:
                    self._judge(origin, domain, url, stored)
                    return waited or (
                        first_hop
                        and job.claimed_at is not None
                        and stored.fetched_at is not None
                        and stored.fetched_at > job.claimed_at
                    )
                waited = True
                if gate is None:
                    # One slot of the run takes the lease and fetches, or polls the row
                    # while another worker fetches; the run's other slots of the origin
                    # wait for it here (556 slots polling read the row ~6,000 times in
                    # one robots.txt's 2 s), then read its answer from the memo.
                    with self._lock:
                        leader = self._pending.get(origin)
                        if leader is None:
                            gate = self._pending[origin] = threading.Event()
                    if leader is not None:
                        self._wait_for(leader, origin, until, should_stop)
                        continue
                if not stored.leased and self._rows.take_lease(origin, domain, job.id) is not None:
                    if not first_hop:
                        try:
                            self._wait_turn(domain, turns, should_stop, until)
                        except BaseException:
                            # Given up before fetching: a lease kept would tell every other
                            # slot of the origin it is being fetched, for as long as the
                            # job stays claimed by this worker.
                            self._rows.release_lease(origin)
                            raise
                    self._rows.fetch_and_store(origin, domain, stored.failures, should_stop, turns)
                    continue
                # Another worker is fetching it: its answer is everyone's.
                self._give_up_if_late(origin, until, should_stop)
                time.sleep(POLL_SECONDS)
        finally:
            if gate is not None:
                with self._lock:
                    del self._pending[origin]
                gate.set()

    def _wait_for(
        self,
        leader: threading.Event,
        origin: str,
        until: float,
        should_stop: Callable[[], bool],
    ) -> None:
        """Until the run's slot that speaks for `origin` is done (its answer stored, or it
        gave up: then another slot takes over), within this attempt's wait."""
        while not leader.wait(LEADER_POLL_SECONDS):
            self._give_up_if_late(origin, until, should_stop)

    @staticmethod
    def _give_up_if_late(origin: str, until: float, should_stop: Callable[[], bool]) -> None:
        if time.monotonic() >= until or should_stop():
            raise RobotsPending(
                f"{origin}/robots.txt is being fetched by another worker; the job waits "
                "for its answer"
            )

    def _judge(self, origin: str, domain: str, url: str, stored: StoredRobots) -> None:
        if stored.state == "allow_all":
            return
        if stored.state == "unreachable":
            assert stored.expires_at is not None
            raise RobotsUnreachable(origin, domain, stored.expires_at, stored.fresh_until)
        assert stored.fetched_at is not None
        parser = self._parser(origin, stored.fetched_at, stored.body or "")
        for read in readings(url):
            if not parser.can_fetch(read, self.token):
                raise RobotsDisallowed(url, origin, matched_rule(parser, read, self.token))

    def _parser(self, origin: str, fetched_at: datetime, body: str) -> Protego:
        key = (origin, fetched_at)
        with self._lock:
            parser = self._parsed.get(key)
            if parser is not None:
                self._parsed.move_to_end(key)
                return parser
        parser = RobotsRules.parse(body)
        with self._lock:
            self._parsed[key] = parser
            while len(self._parsed) > _PARSED_KEPT:
                self._parsed.popitem(last=False)
        return parser

    def _wait_turn(
        self, host: str, turns: Turns, should_stop: Callable[[], bool], until: float
    ) -> None:
        while (wait := turns.take(host)) > 0:
            if time.monotonic() + wait > until or should_stop():
                raise RobotsPending(f"{host} gave no request turn within the attempt's wait")
            time.sleep(min(wait, POLL_SECONDS))


# --- operators ---------------------------------------------------------------------------


def set_robots_mode(
    engine: Engine, host: str, *, mode: str, reason: str, set_by: str
) -> dict[str, Any]:
    """An operator's exemption (`ignore`) of a host, or its end (`obey`), with who and why;
    every worker follows it from its next request to the host."""
    if mode not in MODES:
        raise DomainError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
    if not reason.strip():
        raise DomainError("--reason must say why (it is kept with the setting)")
    try:
        domain = normalize_host(host)
    except ValueError as exc:
        raise DomainError(str(exc)) from None
    with engine.begin() as conn:
        row = conn.execute(
            _q("set_robots_mode"),
            {"domain": domain, "mode": mode, "reason": reason.strip(), "set_by": set_by},
        ).one()
        if mode == "ignore":
            # Its robots.txt no longer holds it: nor does the pause an unreachable one set.
            conn.execute(_q("lift_robots_pause"), {"domain": domain})
    return dict(row._mapping)


def list_robots(engine: Engine, host: str | None = None) -> list[dict[str, Any]]:
    domain = normalize_host(host) if host else None
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(_q("list_robots"), {"domain": domain})]
