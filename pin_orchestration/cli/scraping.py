"""`pin api`, `pin scraping …`: the scraping service from the shell (its tenants:
`pin tenant …`, cli/tenant.py)."""

from __future__ import annotations

import dataclasses
import json
import sys
import uuid
from typing import TYPE_CHECKING, Any

import click

from pin_orchestration.platform.db import engine_from_env
from pin_orchestration.platform.defaults import API_PORT, LOOPBACK
from pin_orchestration.platform.options import click_options
from pin_orchestration.platform.settings import Settings, SettingsError
from pin_orchestration.scraping.webhooks.options import DeliveryOptions
from pin_orchestration.scraping.worker.options import WORKER_RUN_OPTIONS, WorkerOptions

if TYPE_CHECKING:
    from pin_orchestration.scraping.store.leases import DomainDefaults


# How long uvicorn's supervisor waits for an API worker to answer its health check before
# killing it (uvicorn's default: 5 s). A worker answers only once its start is done, and
# spawn starts it by importing the parent's main script first — for `pin`, the whole CLI
# (~2 s of CPU, Dagster included): on a machine with a load of 6-14 that took longer than
# 5 s, so both workers were killed, restarted and killed again, and the API never served.
# The check runs in a thread of its own, so a worker that is merely busy (a slow request,
# a full collection) still answers it; only a worker that is stuck misses a minute of it.
WORKER_HEALTHCHECK_SECONDS = 60


@click.command("api")
@click.option("--host", default=LOOPBACK, show_default=True)
@click.option("--port", default=API_PORT, show_default=True, type=int)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="API processes sharing the port: one process serves on one core (its GIL); "
    "the intake limit, idempotency and the read cache's invalidations hold across them",
)
def api(host: str, port: int, workers: int) -> None:
    """Serve the scraping intake/query API (FastAPI on uvicorn)."""
    import os

    import uvicorn

    from pin_orchestration.platform.db import resolve_database_url
    from pin_orchestration.scraping.settings import ScrapingSettings

    # The local results store signs download URLs under the API's own address.
    os.environ.setdefault("PIN_API_PUBLIC_URL", f"http://{host}:{port}")
    try:
        ScrapingSettings.from_env()
        settings = Settings.from_env()
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from exc
    if workers > 1 and not settings.database_url:
        # The embedded server is started once, here, and lives while this supervisor
        # does; the workers connect to it instead of each starting it.
        os.environ["PIN_DATABASE_URL"] = resolve_database_url(settings)
    uvicorn.run(
        "pin_orchestration.scraping.api.app:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        timeout_worker_healthcheck=WORKER_HEALTHCHECK_SECONDS,
        log_level="info",
        access_log=False,
    )


@click.group()
def scraping() -> None:
    """Scraping jobs: failed ones, requeue, a worker or sweep from the shell; domain limits."""


@scraping.command("failed")
@click.option("--limit", default=100, show_default=True)
def scraping_failed(limit: int) -> None:
    """Failed jobs (attempts spent or a permanent error), newest first."""
    from pin_orchestration.scraping.store.leases import list_failed_jobs

    for j in list_failed_jobs(engine_from_env(), limit):
        click.echo(
            f"{j['id']}\t{j['tenant']}\t{j['attempts']} attempt(s)\t{j['last_error_class']}\t"
            f"{j['url']}\t{j['last_error']}"
        )


@scraping.command("requeue")
@click.argument("job_ids", nargs=-1, required=True)
def scraping_requeue(job_ids: tuple[str, ...]) -> None:
    """Put failed jobs back in the queue with a fresh attempt budget."""
    from pin_orchestration.scraping.store.leases import requeue_failed_jobs

    try:
        ids = [uuid.UUID(i) for i in job_ids]
    except ValueError as exc:
        raise click.BadParameter(f"every JOB_ID must be a uuid ({exc})") from exc
    requeued = set(requeue_failed_jobs(engine_from_env(), ids))
    for i in ids:
        click.echo(f"{i}\t{'requeued' if i in requeued else 'not failed (left as it is)'}")
    if len(requeued) != len(ids):
        sys.exit(1)


@scraping.command("sweep")
def scraping_sweep() -> None:
    """Return jobs whose lease expired to the queue (what the every-minute schedule does)."""
    from pin_orchestration.scraping.settings import ScrapingSettings
    from pin_orchestration.scraping.store.leases import sweep_expired_leases

    swept = sweep_expired_leases(
        engine_from_env(), max_attempts=ScrapingSettings.from_env().max_attempts
    )
    for row in swept:
        click.echo(f"{row.id}\tattempt {row.attempts}\t→ {row.status}")


@scraping.command("work")
@click_options(WorkerOptions, WORKER_RUN_OPTIONS)
def scraping_work(**given: Any) -> None:
    """Run one worker from the shell (what a scraping_worker run does)."""
    from pin_orchestration.coordination.cancellation import stop_requested_on_signals
    from pin_orchestration.scraping.fetch.client import Fetcher
    from pin_orchestration.scraping.policies import fetch_policy_from, retry_policy_from
    from pin_orchestration.scraping.settings import ScrapingSettings
    from pin_orchestration.scraping.store.local import result_store_from
    from pin_orchestration.scraping.worker.options import WorkerConfigError
    from pin_orchestration.scraping.worker.run import run_worker

    try:
        settings = ScrapingSettings.from_env()
        options = WorkerOptions.from_settings(settings, **given)
        options.validate()
    except (SettingsError, WorkerConfigError) as exc:
        raise click.ClickException(str(exc)) from exc
    fetcher = Fetcher(fetch_policy_from(settings))
    try:
        with stop_requested_on_signals() as stop:
            report = run_worker(
                engine_from_env(),
                result_store_from(settings),
                fetcher,
                retry_policy_from(settings),
                options,
                worker_id=f"cli-{uuid.uuid4()}",
                stop=stop,
            )
    finally:
        fetcher.close()
    click.echo(
        json.dumps(
            {
                "worker": report.worker,
                "claimed": report.claimed,
                "succeeded": report.succeeded,
                "retried": report.retried,
                "failed": report.failed,
                "cancelled": report.cancelled,
                "lease_lost": report.lease_lost,
                "peak_in_flight": report.peak_in_flight,
            }
        )
    )


@scraping.group("domain")
def scraping_domain() -> None:
    """Per-domain politeness: requests per second and concurrent connections per target
    host (defaults PIN_SCRAPING_DOMAIN_RPS / PIN_SCRAPING_DOMAIN_CONCURRENCY)."""


@scraping_domain.command("set")
@click.argument("host")
@click.option("--rps", type=float, default=None, help="Requests per second (fractions allowed)")
@click.option("--concurrency", type=int, default=None, help="Connections open at once")
def scraping_domain_set(host: str, rps: float | None, concurrency: int | None) -> None:
    """Override HOST's limits; every worker obeys them from its next claim."""
    from pin_orchestration.scraping.store.politeness import DomainError, set_domain_limits

    try:
        row = set_domain_limits(engine_from_env(), host, rps=rps, concurrency=concurrency)
    except DomainError as exc:
        raise click.ClickException(str(exc)) from exc
    defaults = _domain_defaults()
    click.echo(f"{row['domain']}\t{_limits(row, defaults.rps, defaults.concurrency)}")


@scraping_domain.command("unset")
@click.argument("host")
def scraping_domain_unset(host: str) -> None:
    """Drop HOST's overrides: back to the defaults."""
    from pin_orchestration.scraping.store.politeness import DomainError, clear_domain_limits

    try:
        cleared = clear_domain_limits(engine_from_env(), host)
    except DomainError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{host}\t{'back to the defaults' if cleared else 'had no override'}")


class _Duration(click.ParamType):
    """A duration: seconds, or a number with s, m, h or d (`90`, `90s`, `10m`, `2h`)."""

    name = "duration"
    _UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        text = str(value).strip().lower()
        unit = self._UNITS.get(text[-1:], None)
        number = text[:-1] if unit else text
        try:
            seconds = float(number) * (unit or 1)
        except ValueError:
            self.fail(f"{value!r} is not a duration: use e.g. 90, 90s, 10m, 2h", param, ctx)
        if not seconds > 0:
            self.fail(f"{value!r} must be longer than 0", param, ctx)
        return seconds


@scraping_domain.command("pause")
@click.argument("host")
@click.option(
    "--for",
    "duration",
    type=_Duration(),
    required=True,
    help="How long: 90, 90s, 10m, 2h (capped at PIN_SCRAPING_MAX_PAUSE_SECONDS)",
)
def scraping_domain_pause(host: str, duration: float) -> None:
    """No worker sends HOST anything for a while (what a 429 from it does)."""
    from pin_orchestration.scraping.settings import ScrapingSettings
    from pin_orchestration.scraping.store.politeness import DomainError, pause_domain

    try:
        cap = ScrapingSettings.from_env().max_pause_seconds
        until = pause_domain(engine_from_env(), host, seconds=duration, max_pause_seconds=cap)
    except (DomainError, SettingsError) as exc:
        raise click.ClickException(str(exc)) from exc
    capped = " (capped by PIN_SCRAPING_MAX_PAUSE_SECONDS)" if duration > cap else ""
    click.echo(f"{host}	paused until {until.isoformat()}{capped}")


@scraping_domain.command("resume")
@click.argument("host")
def scraping_domain_resume(host: str) -> None:
    """Lift HOST's pause (a 429's or an operator's): workers take its jobs again now."""
    from pin_orchestration.scraping.store.politeness import DomainError, resume_domain

    try:
        was_paused = resume_domain(engine_from_env(), host)
    except DomainError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{host}	{'resumed' if was_paused else 'was not paused'}")


@scraping_domain.command("list")
def scraping_domain_list() -> None:
    """Domains with an override, a pause in force, or queued or running jobs."""
    from pin_orchestration.scraping.fetch.robots import list_robots
    from pin_orchestration.scraping.store.politeness import list_domains

    defaults = _domain_defaults()
    engine = engine_from_env()
    domains = list_domains(engine)
    # robots.txt that does not answer: its host is held until the next try
    unreachable: dict[str, list[dict[str, Any]]] = {}
    for robots in list_robots(engine):
        if robots["state"] == "unreachable":
            unreachable.setdefault(robots["domain"], []).append(robots)
    if not domains:
        click.echo(
            "no domain has an override, a pause, or queued or running jobs: every host gets "
            f"the defaults, {defaults.rps:g} rps and {defaults.concurrency} concurrent "
            "(PIN_SCRAPING_DOMAIN_RPS, PIN_SCRAPING_DOMAIN_CONCURRENCY; overrides: "
            "pin scraping domain set HOST)"
        )
    for d in domains:
        paused = f"\tpaused until {d['blocked_until'].isoformat()}" if d["blocked_until"] else ""
        click.echo(
            f"{d['domain']}\t{_limits(d, defaults.rps, defaults.concurrency)}\t"
            f"{d['running']} running\t{d['queued']} queued{paused}{_robots_shown(d)}"
        )
        for robots in unreachable.get(d["domain"], []):
            click.echo(
                f"  {robots['origin']}/robots.txt unreachable ({robots['failures']} failures in "
                f"a row, last: {robots['last_error']}); asked again at "
                f"{robots['expires_at'].isoformat()}"
            )


def _robots_shown(row: dict[str, Any]) -> str:
    """The robots.txt part of a host's line: its Crawl-delay, an operator's exemption."""
    shown = ""
    if row.get("crawl_delay"):
        shown += f"\tCrawl-delay {row['crawl_delay']:g} s"
    if row.get("robots_mode") == "ignore":
        shown += f"\trobots.txt ignored ({row['robots_set_by']}: {row['robots_reason']})"
    return shown


@scraping_domain.command("robots")
@click.argument("host")
@click.option("--ignore", "mode", flag_value="ignore", help="Exempt HOST: robots.txt not obeyed")
@click.option("--obey", "mode", flag_value="obey", help="Obey HOST's robots.txt again")
@click.option("--reason", required=True, help="Why (kept with the setting, shown in the list)")
@click.option("--by", "set_by", default=None, help="Who decided (default: your login name)")
def scraping_domain_robots(host: str, mode: str | None, reason: str, set_by: str | None) -> None:
    """Exempt HOST from its robots.txt (--ignore) or obey it again (--obey), with why; every
    worker follows it from its next request to HOST. PIN_SCRAPING_ROBOTS is the default of
    hosts without a setting; tenants cannot change either."""
    import getpass

    from pin_orchestration.scraping.fetch.robots import set_robots_mode
    from pin_orchestration.scraping.store.politeness import DomainError

    if mode is None:
        raise click.UsageError("give --ignore or --obey")
    try:
        row = set_robots_mode(
            engine_from_env(), host, mode=mode, reason=reason, set_by=set_by or getpass.getuser()
        )
    except DomainError as exc:
        raise click.ClickException(str(exc)) from exc
    verb = "robots.txt ignored" if row["robots_mode"] == "ignore" else "robots.txt obeyed"
    click.echo(f"{row['domain']}\t{verb}\t{row['robots_set_by']}: {row['robots_reason']}")


def _domain_defaults() -> DomainDefaults:
    from pin_orchestration.scraping.settings import ScrapingSettings

    try:
        return ScrapingSettings.from_env().domain_defaults
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from exc


def _limits(row: dict[str, Any], default_rps: float, default_concurrency: int) -> str:
    rps = f"{row['rps']:g} rps" if row["rps"] is not None else f"{default_rps:g} rps (default)"
    concurrency = (
        f"{row['concurrency']} concurrent"
        if row["concurrency"] is not None
        else f"{default_concurrency} concurrent (default)"
    )
    return f"{rps}\t{concurrency}"


@scraping.group("job")
def scraping_job() -> None:
    """One job, any tenant's (operators)."""


@scraping_job.command("explain")
@click.argument("job_id", type=click.UUID)
def scraping_job_explain(job_id: uuid.UUID) -> None:
    """Why JOB_ID waits and until when (what GET /jobs/{id} says in `wait`), or how it
    ended."""
    from pin_orchestration.scraping.settings import ScrapingSettings
    from pin_orchestration.scraping.worker.wait_reasons import explain

    try:
        settings = ScrapingSettings.from_env()
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from exc
    found = explain(
        engine_from_env(),
        job_id,
        domain_defaults=settings.domain_defaults,
        robots_mode=settings.robots,
    )
    if found is None:
        raise click.ClickException(f"no job {job_id}")
    job, wait = found
    click.echo(f"{job['id']}\t{job['status']}\t{job['tenant']}\t{job['priority']}\t{job['url']}")
    if wait is not None:
        cause = f" ({wait.cause})" if wait.cause else ""
        until = f"\tuntil {wait.until.isoformat()}" if wait.until else ""
        click.echo(f"waiting: {wait.reason}{cause}{until}")
        click.echo(wait.message)
    elif job["last_error_class"]:
        click.echo(f"last error: {job['last_error_class']}: {job['last_error']}")


@scraping.command("deliver")
@click_options(DeliveryOptions)
def scraping_deliver(**fields: object) -> None:
    """Deliver due completion webhooks once (what a scraping_webhook_delivery run does)."""
    from pin_orchestration.coordination.cancellation import stop_requested_on_signals
    from pin_orchestration.scraping.fetch.client import Fetcher
    from pin_orchestration.scraping.policies import (
        webhook_fetch_policy_from,
        webhook_policy_from,
    )
    from pin_orchestration.scraping.settings import ScrapingSettings
    from pin_orchestration.scraping.webhooks.deliveries import run_deliveries
    from pin_orchestration.scraping.webhooks.options import WebhookConfigError

    options = DeliveryOptions(**fields)  # type: ignore[arg-type]
    try:
        settings = ScrapingSettings.from_env()
        policy = webhook_policy_from(settings)
        options.validate()
        policy.validate()
    except (SettingsError, WebhookConfigError) as exc:
        raise click.ClickException(str(exc)) from exc
    with (
        Fetcher(webhook_fetch_policy_from(settings)) as fetcher,
        stop_requested_on_signals() as stop,
    ):
        report = run_deliveries(engine_from_env(), fetcher, policy, options, stop=stop)
    click.echo(json.dumps(dataclasses.asdict(report)))
