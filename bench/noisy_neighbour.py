"""The seed's noisy neighbour, replayed: a crawler dumps a burst of jobs while a shop and an
analyst keep a small stream going; 8 slots, every job takes ~4 s at the target. Run under
FIFO (the claim before issue 9: oldest due first) and under the fair pick, first with every
job `normal`, then with priorities shop=high, crawler=normal, analyst=low — four runs in
one invocation, the same workload each time.

    PIN_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python bench/noisy_neighbour.py [--burst 100] [--job-seconds 4]

Scaled down from the seed to keep a run near a minute: the crawler's burst is 100 jobs
(`--burst 400` for the seed's, four times as long); slots (8) and the job time (4 s) are
the seed's. The shop and the analyst each submit one job every 2 s for 40 s (20 jobs). Each
tenant's target is its own loopback host (127.0.0.2 crawler, .3 shop, .4 analyst), with
domain limits that do not bind (8 connections): this bench is about tenants and classes.
The worker is `run_worker` in this process (not through the Dagster daemon), claiming with
FIFO or with the fair pick. Prints per tenant: time from its first submission to its first
result and to its last result.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._db import fresh_bench_database  # noqa: E402
from bench.fifo_claim import fifo_claim  # noqa: E402
from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget  # noqa: E402
from pin_orchestration.platform.db import create_db_engine  # noqa: E402
from pin_orchestration.platform.defaults import API_URL  # noqa: E402
from pin_orchestration.scraping.fetch.client import Fetcher  # noqa: E402
from pin_orchestration.scraping.policies import (  # noqa: E402
    fetch_policy_from,
    retry_policy_from,
)
from pin_orchestration.scraping.settings import ScrapingSettings  # noqa: E402
from pin_orchestration.scraping.store import repository, tenancy  # noqa: E402
from pin_orchestration.scraping.store.local import (  # noqa: E402
    LocalResultStore,
    load_or_create_signing_key,
)
from pin_orchestration.scraping.store.repository import JobRequest  # noqa: E402
from pin_orchestration.scraping.worker.options import WorkerOptions  # noqa: E402
from pin_orchestration.scraping.worker.run import claim_due_jobs, run_worker  # noqa: E402

HOSTS = {"crawler": "127.0.0.2", "shop": "127.0.0.3", "analyst": "127.0.0.4"}
SLOTS = 8
STREAM_EVERY_SECONDS = 2.0
STREAM_JOBS = 20


def reset(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE scraping.job_attempts, scraping.jobs CASCADE"))
        conn.execute(text("DELETE FROM scraping.domains"))
        conn.execute(text("DELETE FROM scraping.tenant_vtimes"))
        conn.execute(text("UPDATE scraping.pick_classes SET vtime = 0, last_start = 0"))
        conn.execute(text("UPDATE scraping.pick_class_clocks SET tenant_clock = '{0,0,0}'"))


def one_run(
    engine: Engine,
    tenants: dict[str, tenancy.Tenant],
    targets: dict[str, ScrapingTarget],
    store: LocalResultStore,
    claim,
    priorities: dict[str, str],
    burst: int,
    job_seconds: float,
) -> dict[str, tuple[float, float]]:
    reset(engine)
    # The target's slow page: every GET answered after job_seconds, 1 KB of body.
    slow = {"ms": round(job_seconds * 1000), "bytes": 1024}
    settings = dataclasses.replace(
        ScrapingSettings(),
        slots=SLOTS,
        fetch_timeout_seconds=60,
        allowed_cidrs=(ipaddress.ip_network("127.0.0.0/8"),),
    )

    def submit(name: str, n: int) -> None:
        request = JobRequest(
            url=f"{targets[name].url}/slow/{name}/{n}", params=slow, priority=priorities[name]
        )
        repository.submit_job(engine, tenants[name].id, request, None)

    for n in range(burst):
        submit("crawler", n)

    def stream() -> None:
        for n in range(STREAM_JOBS):
            time.sleep(STREAM_EVERY_SECONDS if n else 1.0)
            submit("shop", n)
            submit("analyst", n)

    streamer = threading.Thread(target=stream)
    streamer.start()
    fetcher = Fetcher(fetch_policy_from(settings))
    try:
        run_worker(
            engine,
            store,
            fetcher,
            retry_policy_from(settings),
            WorkerOptions(
                slots=SLOTS,
                lease_seconds=60,
                idle_exit_seconds=STREAM_EVERY_SECONDS * 2,
                max_run_duration_seconds=3600,
                domain_rps=1000,
                domain_concurrency=SLOTS,
            ),
            worker_id="noisy-neighbour",
            rng=random.Random(1),
            claim=claim,
        )
    finally:
        fetcher.close()
        streamer.join()
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT t.name, count(*) FILTER (WHERE j.status <> 'succeeded') AS unfinished, "
                "EXTRACT(EPOCH FROM min(j.finished_at) - min(j.created_at)) AS first, "
                "EXTRACT(EPOCH FROM max(j.finished_at) - min(j.created_at)) AS last "
                "FROM scraping.jobs j JOIN scraping.tenants t ON t.id = j.tenant_id "
                "GROUP BY t.name"
            )
        ).all()
    for row in rows:
        if row.unfinished:
            raise SystemExit(f"{row.name}: {row.unfinished} job(s) did not succeed")
    return {row.name: (float(row.first), float(row.last)) for row in rows}


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # figures as they come, even into a file
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--burst", type=int, default=100, help="the crawler's burst (seed: 400)")
    parser.add_argument("--job-seconds", type=float, default=4.0)
    args = parser.parse_args()

    engine = create_db_engine(fresh_bench_database("pin_bench_noisy_neighbour"))
    tenants = {name: tenancy.create_tenant(engine, name)[0] for name in HOSTS}
    targets = {name: ScrapingTarget(host).start() for name, host in HOSTS.items()}
    home = Path(tempfile.mkdtemp(prefix="noisy-neighbour-"))
    store = LocalResultStore(
        home / "results",
        public_base_url=API_URL,
        signing_key=load_or_create_signing_key(home / "key"),
    )
    scenarios = {
        "all normal": {"crawler": "normal", "shop": "normal", "analyst": "normal"},
        "shop=high crawler=normal analyst=low": {
            "crawler": "normal",
            "shop": "high",
            "analyst": "low",
        },
    }
    print(
        f"crawler burst {args.burst}, shop and analyst 1 job / {STREAM_EVERY_SECONDS:g} s "
        f"x {STREAM_JOBS}, {SLOTS} slots, {args.job_seconds:g} s per job"
    )
    print(f"{'scenario':<38} {'claim':<10} {'tenant':<8} {'first result':>13} {'last result':>12}")
    try:
        for scenario, priorities in scenarios.items():
            for claim_name, claim in (("fifo", fifo_claim), ("fair", claim_due_jobs)):
                began = time.monotonic()
                figures = one_run(
                    engine, tenants, targets, store, claim, priorities, args.burst, args.job_seconds
                )
                for tenant in ("shop", "analyst", "crawler"):
                    first, last = figures[tenant]
                    print(
                        f"{scenario:<38} {claim_name:<10} {tenant:<8} {first:>11.1f} s "
                        f"{last:>10.1f} s"
                    )
                print(f"{'':<38} {claim_name:<10} (run took {time.monotonic() - began:.0f} s)")
    finally:
        for target in targets.values():
            target.stop()
        engine.dispose()


if __name__ == "__main__":
    main()
