"""Benchmark of the pick at depth: claims of 64 from 1,000,000 queued scraping jobs, the fair
pick (`scraping.claim_jobs`) beside the FIFO claim it replaced and the claim of migrations
0011-0016 (`bench_0016.claim_jobs`), in the same run.

    PIN_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python bench/scraping_pick.py [--jobs 1000000] [--rounds 200] [--reuse]
            [--passes 1] [--database pin_bench_scraping_pick]

Database `pin_bench_scraping_pick` of its own (built set-based on the first run, kept for
`--reuse`). The queue: 200 tenants; tenant 0 is a crawler with 30 % of the jobs on 3
domains (its due head sits on domains at their limit: the pick's deep path); the others
spread over 5,000 domains, 50 each; priorities 20 % high, 60 % normal, 20 % low; 2 % of
jobs in backoff (due in an hour). Default limits (2 rps, 4 concurrent).

Each contender starts from the same state (everything queued, no domain state, clocks at
zero) and then runs `--rounds` rounds of the worker's pattern: once 556 jobs are running
(the seed's whole-pool peak) each round first finishes the 64 oldest running jobs, then
times one claim of 64 (on one connection; also the CPU time its backend ran for it, read
from /proc: what the claim costs whatever else loads the machine). Prints per contender:
claim p50 / p95 / max, backend CPU p50 and jobs per claim;
then the sensor's queue_stats time and EXPLAIN ANALYZE of the pick's statements.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._db import backend_cpu_ms, fresh_bench_database, install_claim_0016  # noqa: E402
from bench.fifo_claim import FIFO_CLAIM  # noqa: E402
from pin_orchestration.migrations import upgrade_database  # noqa: E402
from pin_orchestration.platform.db import create_db_engine, resolve_database_url  # noqa: E402
from pin_orchestration.platform.settings import Settings  # noqa: E402
from pin_orchestration.platform.sql import NamedQueries  # noqa: E402
from pin_orchestration.scraping.store.leases import DomainDefaults, queue_stats  # noqa: E402
from pin_orchestration.scraping.worker.run import claim_due_jobs  # noqa: E402

DATABASE = "pin_bench_scraping_pick"
TENANTS = 200
DOMAINS = 5000
IN_FLIGHT = 556
BATCH = 64
DEFAULTS = DomainDefaults(rps=2.0, concurrency=4)


def build(engine: Engine, jobs: int) -> None:
    started = time.monotonic()
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scraping.tenants (id, name, api_key_sha256, api_key_prefix) "
                "SELECT gen_random_uuid(), 'tenant-' || lpad(n::text, 3, '0'), "
                "       sha256(n::text::bytea), 'pin_' "
                "FROM generate_series(0, :tenants - 1) AS n"
            ),
            {"tenants": TENANTS},
        )
    # Small transactions: each job's trigger updates its tenant's tenant_vtimes row, and
    # within one transaction every update of a row lengthens the chain of versions the
    # next one walks (the crawler's row: 30,000 updates in a chunk of 100,000, which made
    # the build quadratic: 100,000 jobs took 5 minutes, the next 100,000 more than 10).
    chunk = 5_000
    for start in range(0, jobs, chunk):
        with engine.begin() as conn:
            conn.execute(
                text(
                    """
                    WITH t AS (SELECT array_agg(id ORDER BY name) AS ids FROM scraping.tenants),
                    g AS (
                        SELECT n,
                               CASE WHEN n % 10 < 3 THEN 0 ELSE 1 + (n / 10) % (:tenants - 1)
                               END AS tenant_no
                        FROM generate_series(:start, :stop - 1) AS n
                    )
                    INSERT INTO scraping.jobs
                        (id, tenant_id, url, domain, priority, next_attempt_at, created_at)
                    SELECT gen_random_uuid(), t.ids[g.tenant_no + 1],
                           'http://' || d.name || '/page/' || g.n, d.name,
                           CASE WHEN g.tenant_no = 0 THEN 'normal'
                                WHEN g.n % 10 = 3 OR g.n % 10 = 4 THEN 'high'
                                WHEN g.n % 10 >= 8 THEN 'low' ELSE 'normal' END,
                           CASE WHEN g.n % 50 = 7 THEN now() + interval '1 hour'
                                ELSE now() - interval '1 hour'
                                     + g.n * (interval '1 hour' / :jobs) END,
                           now() - interval '1 hour' + g.n * (interval '1 hour' / :jobs)
                    FROM g CROSS JOIN t
                    CROSS JOIN LATERAL (
                        SELECT CASE WHEN g.tenant_no = 0 THEN 'crawl-' || g.n % 3 || '.example'
                                    ELSE 'site-' || (g.tenant_no * 50 + g.n % 50) % :domains
                                         || '.example' END AS name
                    ) d
                    """
                ),
                {
                    "start": start,
                    "stop": min(jobs, start + chunk),
                    "tenants": TENANTS,
                    "domains": DOMAINS,
                    "jobs": jobs,
                },
            )
        if (start + chunk) % 100_000 == 0 or start + chunk >= jobs:
            print(f"  {min(jobs, start + chunk):>9,} jobs ({time.monotonic() - started:.0f} s)")
    vacuum(engine)


def vacuum(engine: Engine) -> None:
    """Every table a claim writes, so each contender starts without the dead rows and index
    entries the one before it left (the queues' pick index above all)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in (
            "jobs",
            "job_attempts",
            "domain_queues",
            "domains",
            "pick_classes",
            "pick_class_clocks",
        ):
            conn.execute(text(f"VACUUM ANALYZE scraping.{table}"))


def reset(engine: Engine) -> None:
    """Everything queued again, no domain state, scheduler clocks at zero."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scraping.jobs SET status = 'queued', attempts = 0, lease_owner = NULL, "
                "lease_expires_at = NULL, started_at = NULL, finished_at = NULL "
                "WHERE status <> 'queued'"
            )
        )
        conn.execute(text("DELETE FROM scraping.job_attempts"))
        conn.execute(text("DELETE FROM scraping.domains"))
        conn.execute(text("DELETE FROM scraping.tenant_vtimes"))
        conn.execute(text("UPDATE scraping.pick_classes SET vtime = 0, last_start = 0"))
        conn.execute(text("UPDATE scraping.pick_class_clocks SET tenant_clock = '{0,0,0}'"))
    vacuum(engine)


def finish_oldest(engine: Engine, n: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scraping.jobs SET status = 'failed', lease_owner = NULL, "
                "lease_expires_at = NULL, finished_at = now() "
                "WHERE id IN (SELECT id FROM scraping.jobs WHERE status = 'running' "
                "             ORDER BY started_at, id LIMIT :n)"
            ),
            {"n": n},
        )


def contenders(engine: Engine) -> dict[str, str]:
    """The claims compared, as the statement a worker sends: FIFO (`bench/fifo_claim.sql`),
    the claim of migrations 0011-0016 (`bench_0016.claim_jobs`) and the claim at head."""
    head = NamedQueries("pin_orchestration.scraping", "queries.sql").sql("claim_due_jobs")
    baseline = install_claim_0016(engine)
    return {
        "fifo": FIFO_CLAIM.sql("fifo_claim"),
        "0016": head.replace("scraping.claim_jobs(", f"{baseline}(", 1),
        "head": head,
    }


def run(engine: Engine, claim: str, rounds: int) -> tuple[list[float], list[int], list[float]]:
    """`rounds` timed claims of the worker's pattern, on one connection: wall ms, jobs, and
    the CPU ms its backend ran for each (the machine's load aside)."""
    timings: list[float] = []
    sizes: list[int] = []
    cpu: list[float] = []
    running = 0
    params = {
        "worker": "bench",
        "limit": BATCH,
        "lease_seconds": 600,
        "default_rps": DEFAULTS.rps,
        "default_concurrency": DEFAULTS.concurrency,
    }
    with engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        conn.commit()
        while len(timings) < rounds:
            if running >= IN_FLIGHT:
                finish_oldest(engine, BATCH)
                running -= BATCH
            cpu_before = backend_cpu_ms(pid)
            began = time.perf_counter()
            with conn.begin():
                got = len(conn.execute(text(claim), params).all())
            elapsed = time.perf_counter() - began
            spent = backend_cpu_ms(pid) - cpu_before
            running += got
            if running >= IN_FLIGHT - BATCH:  # time the steady state, not the first fill
                timings.append(elapsed * 1000)
                sizes.append(got)
                cpu.append(spent)
    return timings, sizes, cpu


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def explain(engine: Engine) -> None:
    with engine.connect() as conn:
        tenant = conn.execute(
            text("SELECT id FROM scraping.tenants WHERE name = 'tenant-000'")
        ).scalar_one()
        statements = {
            "the class's domain queue with the smallest head tag (normal)": (
                "SELECT q.domain, q.head_tag FROM scraping.domain_queues q "
                "WHERE q.priority = 'normal' AND q.ready AND q.domain <> ALL ('{}') "
                "AND :t IS NOT NULL ORDER BY q.head_tag, q.domain LIMIT 1"
            ),
            "a domain's due head job (the crawler's busiest domain, normal)": (
                "SELECT j.id, j.fair_tag FROM scraping.jobs j WHERE j.domain = 'crawl-0.example' "
                "AND j.priority = 'normal' AND j.status = 'queued' AND j.next_attempt_at <= now() "
                "AND j.cancel_requested_at IS NULL AND :t IS NOT NULL "
                "ORDER BY j.fair_tag, j.id LIMIT 1"
            ),
            "a domain's running jobs": (
                "SELECT count(*) FROM scraping.jobs j WHERE j.status = 'running' "
                "AND j.domain = 'crawl-0.example' AND :t IS NOT NULL"
            ),
        }
        for title, sql in statements.items():
            plan = conn.execute(
                text(f"EXPLAIN (ANALYZE, COSTS OFF, SUMMARY ON) {sql}"), {"t": tenant}
            ).scalars()
            print(f"\n-- {title}")
            for line in plan:
                print("   " + line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--reuse", action="store_true", help="keep the queue built earlier")
    parser.add_argument("--database", default=DATABASE, help=f"default {DATABASE}")
    parser.add_argument("--passes", type=int, default=1, help="runs of 0016 and head, in turns")
    args = parser.parse_args()

    if args.reuse:
        from sqlalchemy.engine import make_url

        server = resolve_database_url(Settings.from_env())
        url = make_url(server).set(database=args.database).render_as_string(hide_password=False)
        upgrade_database(url)
        engine = create_db_engine(url)
    else:
        url = fresh_bench_database(args.database)
        engine = create_db_engine(url)
        print(f"building {args.jobs:,} queued jobs ...")
        build(engine, args.jobs)

    results: dict[str, list[float]] = {}
    claims = contenders(engine)
    # head and 0016 in turns (--passes), so a stretch of load falls on both
    order = ["fifo"] + ["0016", "head"] * args.passes
    for name in order:
        reset(engine)
        timings, sizes, cpu = run(engine, claims[name], args.rounds)
        results.setdefault(name, []).extend(timings)
        results.setdefault(f"{name} cpu", []).extend(cpu)
        print(
            f"{name:>5}: claim of {BATCH}: p50 {statistics.median(timings):6.1f} ms  "
            f"p95 {pct(timings, 0.95):6.1f} ms  max {max(timings):6.1f} ms  "
            f"backend cpu p50 {statistics.median(cpu):6.1f} ms  "
            f"jobs/claim {statistics.mean(sizes):.1f}  ({len(timings)} claims)",
            flush=True,
        )

    def median_ratio(a: str, b: str) -> float:
        return statistics.median(results[a]) / statistics.median(results[b])

    for name in ("0016", "head"):
        print(
            f"{name} / fifo, medians: wall {median_ratio(name, 'fifo'):.2f}x"
            f"  backend cpu {median_ratio(name + ' cpu', 'fifo cpu'):.2f}x"
        )

    # The worst case of the 0007 pick: every domain paused (0011: their queues are set
    # aside, so the claim looks at none of them), and the claim comes back empty.
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scraping.domains (domain, blocked_until) "
                "SELECT DISTINCT domain, now() + interval '1 hour' FROM scraping.jobs "
                "ON CONFLICT (domain) DO UPDATE SET blocked_until = EXCLUDED.blocked_until"
            )
        )
    empty = []
    for _ in range(10):
        began = time.perf_counter()
        got = claim_due_jobs(
            engine, worker="bench", limit=BATCH, lease_seconds=600, domain_defaults=DEFAULTS
        )
        empty.append((time.perf_counter() - began) * 1000)
        assert not got
    print(
        f"every domain paused (claim comes back empty): p50 {statistics.median(empty):.1f} ms"
        f"  max {max(empty):.1f} ms"
    )
    with engine.begin() as conn:
        conn.execute(text("UPDATE scraping.domains SET blocked_until = NULL"))

    with engine.connect() as conn:
        began = time.perf_counter()
        stats = queue_stats(conn, DEFAULTS)
        took = (time.perf_counter() - began) * 1000
    print(f"sensor queue_stats: {took:.0f} ms (due {stats.due:,}, claimable {stats.claimable:,})")
    explain(engine)
    engine.dispose()


if __name__ == "__main__":
    main()
