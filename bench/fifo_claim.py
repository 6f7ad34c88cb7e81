"""The claim order before issue 9 (oldest due first, nothing else), as a drop-in `claim`
for `run_worker`: the baseline of bench/noisy_neighbour.py and bench/scraping_pick.py."""

from __future__ import annotations

from sqlalchemy import Engine

from pin_orchestration.platform.sql import NamedQueries
from pin_orchestration.scraping.store.leases import ClaimedJob, DomainDefaults

FIFO_CLAIM = NamedQueries("bench", "fifo_claim.sql")


def fifo_claim(
    engine: Engine,
    *,
    worker: str,
    limit: int,
    lease_seconds: float,
    domain_defaults: DomainDefaults,  # ignored: FIFO knows no domains
) -> list[ClaimedJob]:
    if limit <= 0:
        return []
    with engine.begin() as conn:
        rows = conn.execute(
            FIFO_CLAIM("fifo_claim"),
            {"worker": worker, "limit": limit, "lease_seconds": lease_seconds},
        ).all()
    return [
        ClaimedJob(
            id=r.id,
            tenant_id=r.tenant_id,
            url=r.url,
            params=r.params,
            attempt=r.attempts,
            budget_used=r.budget_used,
            created_at=r.created_at,
            domain=r.domain,
            priority=r.priority,
        )
        for r in rows
    ]
