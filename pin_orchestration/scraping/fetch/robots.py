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
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from protego import Protego
from sqlalchemy import Engine, text

from pin_orchestration.platform.sql import load_queries
from pin_orchestration.scraping.fetch.client import Fetcher, product_token
from pin_orchestration.scraping.fetch.errors import FetchError
from pin_orchestration.scraping.store.leases import AttemptOutcome, ClaimedJob, DomainDefaults
from pin_orchestration.scraping.store.politeness import DomainError, normalize_host

log = logging.getLogger(__name__)

MODES = ("obey", "ignore")
# RFC 9309 section 2.5: at least 500 KiB is parsed; what follows is ignored.
MAX_ROBOTS_BYTES = 500 * 1024
# Section 2.4: a robots.txt is cached at most 24 h. The floor keeps a host answering
# `max-age=0` from being asked before every job.
MAX_TTL_SECONDS = 24 * 3600.0
MIN_TTL_SECONDS = 60.0
# A Crawl-delay's bounds (crawl_delay_of).
MIN_CRAWL_DELAY_SECONDS = 0.001
MAX_CRAWL_DELAY_SECONDS = 24 * 3600.0
# How often a worker waiting for another's fetch looks at the row again.
POLL_SECONDS = 0.05
# How long a worker trusts the row it read (fresh ones only) before reading it again.
MEMO_SECONDS = 5.0
# Parsed robots.txt kept per process (by origin and fetch time).
_PARSED_KEPT = 1024

_ALLOW_ALL_ERRORS = frozenset({"too_many_redirects", "refused_address", "invalid_url"})


@functools.cache
def _q(name: str) -> Any:
    return text(load_queries("pin_orchestration.scraping", "robots.sql")[name])


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


def origin_of(url: str) -> str:
    """scheme://host:port of a URL, with the scheme's default port written out."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = normalize_host(parts.hostname or "")
    port = parts.port or (443 if scheme == "https" else 80)
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


def ttl_seconds(headers: Any) -> float:
    """How long a fetched robots.txt is kept: its Cache-Control max-age within the bounds."""
    for directive in str(headers.get("cache-control") or "").split(","):
        name, _, value = directive.strip().partition("=")
        if name.strip().lower() == "max-age":
            try:
                seconds = float(value.strip().strip('"'))
            except ValueError:
                break
            if math.isnan(seconds):  # a number to Python, no interval to PostgreSQL
                break
            return min(max(seconds, MIN_TTL_SECONDS), MAX_TTL_SECONDS)
    return MAX_TTL_SECONDS


class RobotsRules(Protego):
    """protego's parser, its rules and matching, with RFC 9309's choice of group (section
    2.2.1): the group whose user-agent is our product token, case-insensitively (a line's
    own product token: `pin-scraper/2.0` is `pin-scraper`), else the `*` group, else none.
    protego takes the group whose name begins any word of the name it is given (made for
    whole User-Agent headers): `User-agent: pin` (another crawler) was ours, and let us into
    what `*` disallows; `User-agent: pin-scraper/2.0` was not, and its Disallow went
    unobeyed."""

    def _get_matching_rule_set(self, user_agent: str) -> Any:
        token = user_agent.strip().lower()
        groups = self._user_agents
        for name, group in groups.items():
            if name != "*" and _leading_token(name) == token:
                return group
        return groups.get("*")


def _leading_token(name: str) -> str:
    try:
        return product_token(name)
    except ValueError:  # no product token: no crawler's group
        return ""


def crawl_delay_of(parser: Protego, token: str) -> float | None:
    """The group's Crawl-delay in seconds, kept to what the host's rate can use: at most a
    day (past ~91 s the rate's floor of 0.01 per second binds anyway); under a millisecond,
    none. Unbounded, 1 / (delay x 1.1) overflowed PostgreSQL's double precision for 1.7e308
    and for a denormal like 1e-320: the store failed, and every job of the host asked for
    robots.txt again."""
    delay = parser.crawl_delay(token)
    if delay is None or not math.isfinite(delay) or delay < MIN_CRAWL_DELAY_SECONDS:
        return None
    return min(delay, MAX_CRAWL_DELAY_SECONDS)


# RFC 3986 section 2.3: unreserved characters, the same decoded or percent-encoded.
_ENCODED_UNRESERVED = re.compile(r"%(?:[46][1-9A-Fa-f]|[57][0-9Aa]|3[0-9]|2[Dd]|2[Ee]|5[Ff]|7[Ee])")


def readings(url: str) -> list[str]:
    """`url` as sent, and as a server reads its path when that differs: unreserved
    characters decoded (the fetcher sends `%2E` as `.`), dot segments resolved (RFC 3986
    section 5.2.4) and runs of slashes merged (nginx's default). RFC 9309 compares the path
    as written; a client could then write a disallowed path the check did not recognise
    (`/x/%2e%2e/private`, `//private`) and the server served it. Each reading is judged;
    any disallowed one refuses the URL."""
    parts = urlsplit(url)
    path = _ENCODED_UNRESERVED.sub(lambda m: chr(int(m.group(0)[1:], 16)), parts.path)
    path = re.sub(r"/{2,}", "/", _remove_dot_segments(path)) or "/"
    if path == parts.path:
        return [url]
    return [url, urlunsplit(parts._replace(path=path))]


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4, for an absolute path."""
    kept: list[str] = []
    segments = path.split("/")
    for segment in segments[1:]:
        if segment == "..":
            if kept:
                kept.pop()
        elif segment != ".":
            kept.append(segment)
    ends_in_dir = segments[-1] in (".", "..")
    return "/" + "/".join(kept) + ("/" if ends_in_dir and kept else "")


def robots_text(raw: bytes) -> str:
    """A robots.txt body as text to parse and store: UTF-8 (RFC 9309 section 2.3), a byte
    order mark dropped (left in, it hid the first line, a User-agent, from the parser, and
    its group's rules were not obeyed), NUL bytes dropped (PostgreSQL's text cannot hold
    them: storing failed and every job of the host asked for robots.txt again)."""
    return raw.decode("utf-8-sig", errors="replace").replace("\x00", "")


def matched_rule(parser: Protego, url: str, token: str) -> str:
    """The rule that disallows `url` for `token`, as a person reads it. protego answers
    allowed or not; which rule decided is read from its group the way it decides."""
    try:
        from protego._utils import _quote_path

        group = parser._get_matching_rule_set(token)
        if group is not None:
            path = _quote_path(url)
            for rule in group._rules:
                if rule.value.match(path):
                    field = "Disallow" if rule.field == "disallow" else "Allow"
                    return f"{field}: {rule.value._pattern} (group User-agent: {group.user_agent})"
    except Exception:  # protego's internals moved: the verdict stands, the detail is lost
        log.debug("could not name the matching robots.txt rule", exc_info=True)
    return f"a Disallow rule of the group matching {token!r}"


class Turns(Protocol):
    """A job's turns on hosts (leases.RedirectSlots): a request waits for one."""

    def take(self, host: str) -> float: ...

    def release(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class _Stored:
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
        self.stored: _Stored | None = None


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
        self._engine = engine
        self.mode = mode
        self._owner = owner
        self._defaults = domain_defaults
        self._retry_seconds = retry_seconds
        self._max_pause_seconds = max_pause_seconds
        self._clock = clock
        self.token = product_token(fetcher.policy.user_agent).lower()
        self.timeout_seconds = fetcher.policy.timeout_seconds
        # Its own fetcher: the same guard and User-Agent, a body cut at 500 KiB.
        self._fetcher = Fetcher(
            dataclasses.replace(fetcher.policy, max_body_bytes=MAX_ROBOTS_BYTES, truncate_body=True)
        )
        self._parsed: OrderedDict[tuple[str, datetime], Protego] = OrderedDict()
        self._memo: OrderedDict[str, tuple[_Stored, float]] = OrderedDict()
        # origin → set when the slot reading (and maybe fetching) its robots.txt is done
        self._pending: dict[str, threading.Event] = {}
        # origin → the read of its row a slot has under way
        self._reads: dict[str, _Reading] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._fetcher.close()

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
                stored = self._read(origin, domain)
                if self._ignored(stored):
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
                if not stored.leased and self._take_lease(origin, domain, job.id) is not None:
                    if not first_hop:
                        self._wait_turn(domain, turns, should_stop, until)
                    self._fetch_and_store(origin, domain, stored.failures, should_stop, turns)
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
        while not leader.wait(POLL_SECONDS):
            self._give_up_if_late(origin, until, should_stop)

    @staticmethod
    def _give_up_if_late(origin: str, until: float, should_stop: Callable[[], bool]) -> None:
        if time.monotonic() >= until or should_stop():
            raise RobotsPending(
                f"{origin}/robots.txt is being fetched by another worker; the job waits "
                "for its answer"
            )

    def _judge(self, origin: str, domain: str, url: str, stored: _Stored) -> None:
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

    # --- the shared row ----------------------------------------------------------------

    def _read(self, origin: str, domain: str) -> _Stored:
        """The origin's row; a fresh one (not unreachable), or one of an exempt host, is
        remembered for MEMO_SECONDS (a job's check then costs no query; an operator's
        exemption reaches this worker within that). One slot at a time reads a row: the
        run's other slots wanting it meanwhile take its answer (at a run's start, or a
        memo's end, 556 slots read the same row at once: ~600 reads a run)."""
        with self._lock:
            memo = self._memo.get(origin)
            if memo is not None:
                stored = memo[0]
                usable = stored.fresh_until > time.monotonic() or self._ignored(stored)
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

    def _read_row(self, origin: str, domain: str) -> _Stored:
        now = time.monotonic()
        with self._engine.connect() as conn:
            row = conn.execute(_q("robots_state"), {"origin": origin, "domain": domain}).one()
        stored = self._stored(row, now)
        with self._lock:
            # An unreachable one is read each time: its jobs are claimed only when its
            # host's pause was lifted (an operator's exemption or resume), and a
            # remembered copy would pause the host again.
            if (stored.fresh and stored.state != "unreachable") or self._ignored(stored):
                self._memo[origin] = (stored, now + MEMO_SECONDS)
                while len(self._memo) > _PARSED_KEPT:
                    self._memo.popitem(last=False)
            else:
                self._memo.pop(origin, None)
        return stored

    def _ignored(self, stored: _Stored) -> bool:
        return (stored.host_mode or self.mode) == "ignore"

    @staticmethod
    def _stored(row: Any, read_at: float) -> _Stored:
        return _Stored(
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

    def _take_lease(self, origin: str, domain: str, job_id: uuid.UUID) -> int | None:
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

    def _fetch_and_store(
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
                with self._engine.begin() as conn:
                    conn.execute(
                        _q("robots_release_lease"), {"origin": origin, "owner": self._owner}
                    )

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
