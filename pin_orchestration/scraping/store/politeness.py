"""The politeness limits of the hosts jobs are fetched from, as the operator sets them (`pin
scraping domain …`): a host's rate and connections, its pauses, and the list of them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from pin_orchestration.platform.sql import NamedQueries
from pin_orchestration.scraping.fetch import hosts

_q = NamedQueries("pin_orchestration.scraping", "queries.sql")


def normalize_host(host: str) -> str:
    """A host an operator names (`pin scraping domain …`) as the politeness limits key it:
    hosts.host_key, the key intake gives a job's URL. DomainError saying why."""
    try:
        return hosts.host_key(host.strip(), "the host")
    except ValueError as exc:
        raise DomainError(str(exc)) from None


class DomainError(ValueError):
    """A domain command that cannot be carried out (bad host, bad limit)."""


# An empty bucket gets a token back within 100 s (the claim relies on it).
MIN_DOMAIN_RPS = 0.01
MAX_DOMAIN_RPS = 10_000.0
MAX_DOMAIN_CONCURRENCY = 10_000


def set_domain_limits(
    engine: Engine, host: str, *, rps: float | None, concurrency: int | None
) -> dict[str, Any]:
    """Override a domain's requests per second and/or concurrent connections (what is not
    given stays as it is); every worker obeys it from its next claim."""
    domain = normalize_host(host)
    if rps is not None and not MIN_DOMAIN_RPS <= rps <= MAX_DOMAIN_RPS:
        raise DomainError(
            f"--rps must be between {MIN_DOMAIN_RPS:g} and {MAX_DOMAIN_RPS:g} (got {rps})"
        )
    if concurrency is not None and not 0 < concurrency <= MAX_DOMAIN_CONCURRENCY:
        raise DomainError(
            f"--concurrency must be > 0 and <= {MAX_DOMAIN_CONCURRENCY} (got {concurrency})"
        )
    if rps is None and concurrency is None:
        raise DomainError("give --rps and/or --concurrency")
    with engine.begin() as conn:
        row = conn.execute(
            _q("set_domain_limits"), {"domain": domain, "rps": rps, "concurrency": concurrency}
        ).one()
    return dict(row._mapping)


def clear_domain_limits(engine: Engine, host: str) -> bool:
    """Back to the defaults; False when the domain had no row."""
    domain = normalize_host(host)
    with engine.begin() as conn:
        return conn.execute(_q("clear_domain_limits"), {"domain": domain}).one_or_none() is not None


def pause_domain(
    engine: Engine, host: str, *, seconds: float, max_pause_seconds: float
) -> datetime:
    """Pause a domain for every worker (what a 429 does), through scraping.pause_domain:
    capped at `max_pause_seconds`; a longer pause in force stands. Returns the pause kept."""
    if not seconds > 0:
        raise DomainError(f"--for must be a duration > 0 (got {seconds:g} s)")
    domain = normalize_host(host)
    with engine.begin() as conn:
        conn.execute(_q("set_max_pause"), {"seconds": max_pause_seconds})
        # a job's wait says the host is paused by an operator (scraping/worker/wait_reasons.py)
        conn.execute(_q("set_pause_cause"))
        return conn.execute(_q("pause_domain"), {"domain": domain, "seconds": seconds}).scalar_one()


def resume_domain(engine: Engine, host: str) -> bool:
    """Lift a domain's pause at once; False when none was in force."""
    domain = normalize_host(host)
    with engine.begin() as conn:
        return bool(conn.execute(_q("resume_domain"), {"domain": domain}).one().was_paused)


def list_domains(engine: Engine) -> list[dict[str, Any]]:
    """Domains with an override, a pause in force, or queued or running jobs."""
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(_q("list_domains"))]
