"""Completion webhooks under attack: a delivery process killed between a POST and its
record, a database that refuses a claim or a record, a delivery host whose clock is
wrong, a receiver that acknowledges with a big page. Real PostgreSQL, receivers on
loopback only."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from datetime import datetime, timedelta, tzinfo

import pytest
from sqlalchemy import Engine, text

from pin_orchestration.devstack.standins.webhook_receiver import Receiver
from pin_orchestration.scraping.policies import WEBHOOK_ANSWER_MAX_BYTES
from pin_orchestration.scraping.store.tenancy import Tenant
from pin_orchestration.scraping.webhooks import deliveries as webhooks
from tests.scraping.test_webhooks import (
    POLICY,
    Deliver,
    GatedReceiver,
    deliver,  # noqa: F401 (a fixture)
    deliveries_of,
    finished_job,
    job_row,
    make_retries_due,
    receiver,  # noqa: F401 (a fixture)
)

# A delivery loop in a process of its own, killed by the test mid-delivery.
_DELIVERY_PROCESS = """
import sys
from pin_orchestration.platform.db import create_db_engine
from pin_orchestration.scraping.policies import webhook_fetch_policy_from
from pin_orchestration.scraping.fetch.client import Fetcher
from pin_orchestration.scraping.webhooks.deliveries import run_deliveries
from tests.scraping.conftest import TEST_SETTINGS, _with_allowed
from tests.scraping.test_webhooks import POLICY

settings = _with_allowed(TEST_SETTINGS, "127.0.0.1/32")
with Fetcher(webhook_fetch_policy_from(settings)) as fetcher:
    run_deliveries(create_db_engine(sys.argv[1]), fetcher, POLICY)
"""


def test_a_last_attempt_sent_but_never_recorded_is_not_followed_by_one_past_the_cap(
    db_engine: Engine,
    db_url: str,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    deliver: Deliver,  # noqa: F811
) -> None:
    """The receiver fails the first attempts. The last one the budget allows is POSTed,
    and the delivery process is killed before it can record the answer; once the lease
    ends the loop claims the delivery again — as attempt max + 1. That one must not be
    sent: the budget is spent (it was, and POST number max + 1 reached the receiver),
    and the delivery is closed as given up."""
    hooks = GatedReceiver([500] * (POLICY.max_attempts - 1) + [0])
    try:
        tenant, _ = make_tenant("acme")
        job_id = finished_job(db_engine, tenant, hooks.url())
        for _ in range(POLICY.max_attempts - 1):
            assert deliver().retried == 1
            make_retries_due(db_engine)
        process = subprocess.Popen([sys.executable, "-c", _DELIVERY_PROCESS, db_url])
        try:
            assert hooks.holding.wait(120)  # the last attempt is at the receiver
        finally:
            process.kill()
            process.wait(30)
        hooks.release.set()
        assert len(hooks.bodies) == POLICY.max_attempts
        make_retries_due(db_engine)  # its lease ends (the hostile clock: moved, not waited)

        deliver()
        deliver()

        assert len(hooks.bodies) == POLICY.max_attempts, "a POST past the attempt budget"
        assert job_row(db_engine, job_id).finish_published_at is not None
        outcomes = deliveries_of(db_engine, job_id)
        assert outcomes[:-1] == [("retry", "http_500")] * (POLICY.max_attempts - 1)
        assert outcomes[-1] == ("gave_up", webhooks.ATTEMPT_UNRECORDED)
    finally:
        hooks.close()


def test_a_retry_backs_off_by_the_databases_clock_whatever_the_loops_clock_says(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,  # noqa: F811
    deliver: Deliver,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The delivery loop's host runs an hour slow (a hostile clock: another machine than
    the database's). A failed delivery is due again only after its backoff, by the clock
    the claim reads (PostgreSQL's): a due time computed on the loop's clock was already
    an hour past, so the receiver got its retry at once, and again every run."""

    class SlowClock(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> datetime:  # type: ignore[override]
            return datetime.now(tz) - timedelta(hours=1)

    monkeypatch.setattr(webhooks, "datetime", SlowClock)
    tenant, _ = make_tenant("acme")
    receiver.status = 500
    job_id = finished_job(db_engine, tenant, receiver.url())

    assert deliver().retried == 1
    assert deliver().claimed == 0, "retried at once: the backoff was lost to the clock skew"
    assert len(receiver.received) == 1
    with db_engine.connect() as conn:
        due_in = conn.execute(
            text(
                "SELECT extract(epoch FROM webhook_next_attempt_at - now()) "
                "FROM scraping.jobs WHERE id = :id"
            ),
            {"id": job_id},
        ).scalar_one()
    assert 0 < due_in <= POLICY.backoff_base_seconds


def test_a_failed_claim_still_records_the_deliveries_in_flight(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,  # noqa: F811
    deliver: Deliver,  # noqa: F811
) -> None:
    """A delivery is in flight (its receiver holds the POST) when the loop's next claim
    fails (the database blips). The run must still record the answer it then gets — a
    204 is an acknowledgement — before it ends with the claim's error: dropped, the
    webhook was POSTed again once its lease ended and an attempt of the budget was
    spent on nothing."""
    hooks = GatedReceiver([0])
    try:
        tenant, _ = make_tenant("acme")
        held = finished_job(db_engine, tenant, hooks.url())
        errors: list[BaseException] = []

        def run() -> None:
            try:
                deliver()
            except Exception as exc:  # the claim's failure, surfaced once the run ends
                errors.append(exc)

        loop = threading.Thread(target=run)
        loop.start()
        assert hooks.holding.wait(120)  # a bound for a broken run only
        # The next claim of an attempt fails, once (a sequence is outside transactions, so
        # it counts the refused claim and the test sees when it happened).
        with db_engine.begin() as conn:
            conn.execute(text("CREATE SEQUENCE public.attack1_claims"))
            conn.execute(
                text(
                    "CREATE FUNCTION public.attack1_refuse_claim() RETURNS trigger "
                    "LANGUAGE plpgsql AS $$BEGIN "
                    "IF nextval('public.attack1_claims') = 1 THEN "
                    "RAISE EXCEPTION 'the database went away'; END IF; "
                    "RETURN NEW; END$$"
                )
            )
            conn.execute(
                text(
                    "CREATE TRIGGER attack1_refuse_claim BEFORE UPDATE ON scraping.jobs "
                    "FOR EACH ROW WHEN (NEW.webhook_attempts > OLD.webhook_attempts) "
                    "EXECUTE FUNCTION public.attack1_refuse_claim()"
                )
            )
        finished_job(db_engine, tenant, receiver.url())  # due: the loop claims it
        claimed_once = text("SELECT is_called FROM public.attack1_claims")
        deadline = time.monotonic() + 120  # a bound for a broken run only
        while time.monotonic() < deadline:
            with db_engine.connect() as conn:
                if conn.execute(claimed_once).scalar_one():
                    break
            time.sleep(0.02)
        with db_engine.begin() as conn:
            conn.execute(text("DROP TRIGGER attack1_refuse_claim ON scraping.jobs"))
            conn.execute(text("DROP FUNCTION public.attack1_refuse_claim()"))
            conn.execute(text("DROP SEQUENCE public.attack1_claims"))
        hooks.release.set()
        loop.join(120)
        assert not loop.is_alive()

        assert len(errors) == 1, "the claim's failure must not pass unseen"
        assert deliveries_of(db_engine, held) == [("delivered", None)]
        assert job_row(db_engine, held).finish_published_at is not None
        assert len(hooks.bodies) == 1
    finally:
        hooks.close()


class ChattyReceiver:
    """A loopback receiver that acknowledges every POST with a 200 and a body of
    `size` bytes, well framed (Content-Length): a web framework's whole page, say."""

    def __init__(self, size: int) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.posts = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.posts += 1
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                # The client may read what it needs and go away.
                with suppress(OSError):
                    self.wfile.write(b"<p>thanks</p>" * (size // 13) + b" " * (size % 13))

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_a_2xx_with_a_body_past_the_answer_limit_is_an_acknowledgement(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    deliver: Deliver,  # noqa: F811
) -> None:
    """The receiver answers 200 with a well-framed body four times the 64 KiB the loop
    reads of an answer. "Answer any 2xx to acknowledge" (docs/integration.md): the
    webhook is delivered, at its first attempt; the body is only cut short. It was a
    `body_too_large` failure, POSTed again up to the cap and given up."""
    chatty = ChattyReceiver(4 * WEBHOOK_ANSWER_MAX_BYTES)
    try:
        tenant, _ = make_tenant("acme")
        job_id = finished_job(db_engine, tenant, chatty.url())
        report = deliver()
        assert (report.claimed, report.delivered) == (1, 1), report.by_error_class
        assert deliveries_of(db_engine, job_id) == [("delivered", None)]
        assert chatty.posts == 1
    finally:
        chatty.close()


def test_a_record_refused_once_is_written_on_a_later_try_not_sent_again(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,  # noqa: F811
    deliver: Deliver,  # noqa: F811
) -> None:
    """The receiver acknowledges; the database refuses that attempt's record once (a
    blip). The run tries the record again while the claim is still its own: the webhook
    is closed as delivered by this run, at one POST. Dropped, it stayed owed, was POSTed
    again when its lease ended, and an attempt of its budget was spent on nothing."""
    tenant, _ = make_tenant("acme")
    job_id = finished_job(db_engine, tenant, receiver.url())
    with db_engine.begin() as conn:
        conn.execute(text("CREATE SEQUENCE public.attack1_records"))
        conn.execute(
            text(
                "CREATE FUNCTION public.attack1_refuse_once() RETURNS trigger "
                "LANGUAGE plpgsql AS $$BEGIN "
                "IF nextval('public.attack1_records') = 1 THEN "
                "RAISE EXCEPTION 'the database went away'; END IF; "
                "RETURN NEW; END$$"
            )
        )
        conn.execute(
            text(
                "CREATE TRIGGER attack1_refuse_once BEFORE INSERT ON "
                "scraping.webhook_deliveries FOR EACH ROW "
                "EXECUTE FUNCTION public.attack1_refuse_once()"
            )
        )

    report = deliver()

    assert (report.claimed, report.delivered) == (1, 1)
    assert deliveries_of(db_engine, job_id) == [("delivered", None)]
    assert job_row(db_engine, job_id).finish_published_at is not None
    assert len(receiver.received) == 1
