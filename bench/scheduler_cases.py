"""Benchmark of the claim at scale (issue 15): the issue's four cases, the claim at head
(`scraping.claim_jobs`) beside the claim of migrations 0011-0016 and the 0007 claim, in
the same run.

    PIN_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python bench/scheduler_cases.py [--cases tenants,deep,paused,throughput]
            [--tenants 100,1000,5000,20000] [--deep 1000,10000,30000]
            [--paused 1000,10000,50000] [--seconds 8] [--rounds 3] [--repeat 7]
            [--claims head,0016,0007,fifo] [--database pin_bench_scheduler]

Database `pin_bench_scheduler` of its own. The 0016 claim is created there as
`bench_0016.claim_jobs` from migration 0017's down step (the body it restores); the 0007
claim as `bench_0007.claim_jobs` from migration 0007's own text; FIFO (the floor) as
`bench_fifo.claim_jobs` from bench/fifo_claim.sql, with the two indexes it reads
(0011 dropped them; both contenders pay their upkeep). Cases:

- tenants: N active tenants, 5 due jobs each on a domain of their own; claim of 64 and of 1;
- deep: one tenant, its 300 oldest jobs on a paused domain, then N one-job domains, all but
  64 paused (in name order); claim of 64;
- paused: every queued domain paused, N domains, one job each; the empty claim;
- blocked: N tenants with jobs only on one domain at its connection limit, 100 tenants
  with claimable jobs; claim of 64;
- spread: one tenant with jobs on N domains, all but 64 at their connection limit;
  claim of 64;
- throughput: 2,000 tenants x 40 jobs on 20,000 domains, claims of 16 committed for
  --seconds, 1 claimer then 4 (threads, a connection each), --rounds times; each round's
  4 / 1 ratio and the medians.
Claims in the first three are rolled back; each figure is the median of --repeat.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._db import backend_cpu_ms, fresh_bench_database, install_claim_0016  # noqa: E402
from bench._machine import CpuTimes, cpu_shares_since  # noqa: E402
from pin_orchestration.platform.db import create_db_engine  # noqa: E402

DATABASE = "pin_bench_scheduler"
ROOT = Path(__file__).resolve().parent.parent
CLAIMS = {
    "head": "scraping.claim_jobs",
    "0016": "bench_0016.claim_jobs",
    "0007": "bench_0007.claim_jobs",
    "fifo": "bench_fifo.claim_jobs",
}


def install_fifo(engine: Engine) -> None:
    """The FIFO claim (`bench/fifo_claim.sql`: oldest due first, nothing else) as a function
    of the claim's signature: the floor, what claiming a batch costs without any pick."""
    fifo = (ROOT / "bench/fifo_claim.sql").read_text(encoding="utf-8")
    body = fifo[fifo.index("WITH picked AS (") :].rstrip().rstrip(";")
    body = body.replace(":limit", "p_limit").replace(":worker", "p_worker")
    body = body.replace(":lease_seconds", "p_lease_seconds")
    body = body[: body.index("SELECT id, tenant_id, url")] + "SELECT * FROM claimed"
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE SCHEMA bench_fifo")
        conn.exec_driver_sql(
            "CREATE FUNCTION bench_fifo.claim_jobs(p_worker text, p_limit integer, "
            "p_lease_seconds double precision, p_default_rps double precision, "
            "p_default_concurrency integer) RETURNS SETOF scraping.jobs LANGUAGE sql AS "
            f"$fn$ {body} $fn$"
        )


# the contenders of this run (--claims)
claims: dict[str, str] = {}


def install_0007(engine: Engine) -> None:
    """Migration 0007's claim, as its frozen SQL holds it, under another schema."""
    frozen = (
        ROOT / "pin_orchestration/migrations/versions/0007_scraping_scheduling.sql"
    ).read_text(encoding="utf-8")
    start = frozen.index("CREATE FUNCTION scraping.claim_jobs(")
    end = frozen.index("$fn$;", start) + len("$fn$;")
    body = frozen[start:end].replace(
        "CREATE FUNCTION scraping.claim_jobs(", "CREATE FUNCTION bench_0007.claim_jobs(", 1
    )
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE SCHEMA bench_0007")
        conn.exec_driver_sql(body)
        conn.exec_driver_sql(
            "CREATE INDEX ix_jobs_pick ON scraping.jobs (priority, tenant_id, next_attempt_at, "
            "id) INCLUDE (domain) WHERE status = 'queued'"
        )
        conn.exec_driver_sql(
            "CREATE INDEX ix_jobs_pick_domain ON scraping.jobs "
            "(priority, tenant_id, domain, next_attempt_at, id) WHERE status = 'queued'"
        )
    own_domain_indexes(engine, "0007")


def own_domain_indexes(engine: Engine, name: str) -> None:
    """The index of domains by last token spend that 0007's claim reads and 0022 dropped:
    there for 0007, gone for the others. It is the one index whose upkeep is per pick (it
    made every token spend a new tuple), so the throughput case gives each contender the
    domains table its own schema has."""
    with engine.begin() as conn:
        if name == "0007":
            conn.exec_driver_sql(
                "CREATE INDEX IF NOT EXISTS ix_domains_tokens_at ON scraping.domains (tokens_at)"
            )
        else:
            conn.exec_driver_sql("DROP INDEX IF EXISTS scraping.ix_domains_tokens_at")


def clear(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "TRUNCATE scraping.job_attempts, scraping.jobs, scraping.domain_queues, "
                "scraping.domains, scraping.tenant_vtimes, scraping.intake_buckets, "
                "scraping.webhook_deliveries, scraping.tenants CASCADE"
            )
        )
        conn.execute(text("UPDATE scraping.pick_classes SET vtime = 0, last_start = 0"))
        conn.execute(text("UPDATE scraping.pick_class_clocks SET tenant_clock = '{0,0,0}'"))


def tenants(engine: Engine, n: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scraping.tenants (id, name, api_key_sha256, api_key_prefix) "
                "SELECT gen_random_uuid(), 't' || g, sha256(g::text::bytea), 'pin_' "
                "FROM generate_series(1, :n) AS g"
            ),
            {"n": n},
        )


def jobs(engine: Engine, select: str, params: dict[str, object]) -> None:
    """Jobs from a SELECT of (tenant_no, domain, age_order), due an hour ago onwards."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "WITH t AS (SELECT array_agg(id ORDER BY name) AS ids FROM scraping.tenants) "
                "INSERT INTO scraping.jobs (id, tenant_id, url, domain, next_attempt_at) "
                "SELECT gen_random_uuid(), t.ids[s.tenant_no], 'http://' || s.domain || '/', "
                "       s.domain, now() - interval '1 hour' + s.age * interval '1 ms' "
                f"FROM ({select}) AS s(tenant_no, domain, age), t ORDER BY s.age"
            ),
            params,
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE scraping.jobs"))
        conn.execute(text("VACUUM ANALYZE scraping.domain_queues"))
        conn.execute(text("VACUUM ANALYZE scraping.domains"))


def pause(engine: Engine, where: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scraping.domains SET blocked_until = now() + interval '1 hour' "
                f"WHERE {where}"
            )
        )


def timed_claims(engine: Engine, limit: int, repeat: int) -> dict[str, tuple[float, int, float]]:
    """Per contender: median ms of `repeat` claims, each rolled back; jobs the claim
    returned; median ms of CPU its backend ran for it (the machine's load aside). The
    contenders take turns, one claim each, so a burst of load falls on all of them."""
    times: dict[str, list[float]] = {name: [] for name in claims}
    cpu: dict[str, list[float]] = {name: [] for name in claims}
    got: dict[str, int] = {}
    with engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        conn.commit()
        for _ in range(repeat):
            for name, claim in claims.items():
                with conn.begin() as tx:
                    cpu_before = backend_cpu_ms(pid)
                    began = time.perf_counter()
                    got[name] = len(
                        conn.execute(
                            text(f"SELECT id FROM {claim}('bench', :n, 600, 2, 4)"), {"n": limit}
                        ).all()
                    )
                    times[name].append((time.perf_counter() - began) * 1000)
                    cpu[name].append(backend_cpu_ms(pid) - cpu_before)
                    tx.rollback()
    return {
        name: (statistics.median(times[name]), got[name], statistics.median(cpu[name]))
        for name in claims
    }


def case_tenants(engine: Engine, sizes: list[int], repeat: int) -> None:
    for n in sizes:
        clear(engine)
        tenants(engine, n)
        jobs(
            engine,
            "SELECT 1 + g % :n, 'd' || (g % :n) || '.example', g "
            "FROM generate_series(0, 5 * :n - 1) AS g",
            {"n": n},
        )
        of64, of1 = timed_claims(engine, 64, repeat), timed_claims(engine, 1, repeat)
        for name in claims:
            (ms64, got64, cpu64), (ms1, _, cpu1) = of64[name], of1[name]
            print(
                f"tenants {n:>6,}  {name}: claim of 64 {ms64:8.1f} ms ({got64} jobs,"
                f" cpu {cpu64:.1f} ms)   claim of 1 {ms1:7.1f} ms (cpu {cpu1:.1f} ms)"
            )


def case_deep(engine: Engine, sizes: list[int], repeat: int) -> None:
    for n in sizes:
        clear(engine)
        tenants(engine, 1)
        jobs(
            engine,
            "SELECT 1, 'a-paused.example', g FROM generate_series(0, 299) AS g "
            "UNION ALL SELECT 1, 'd' || lpad(g::text, 6, '0') || '.example', 300 + g "
            "FROM generate_series(0, :n - 1) AS g",
            {"n": n},
        )
        pause(
            engine,
            "domain = 'a-paused.example' OR domain IN (SELECT domain FROM scraping.domains "
            "WHERE domain LIKE 'd%' ORDER BY domain LIMIT :keep)".replace(
                ":keep", str(max(n - 64, 0))
            ),
        )
        for name, (ms, got, cpu) in timed_claims(engine, 64, repeat).items():
            print(
                f"deep walk {n:>6,} domains  {name}: claim of 64 {ms:8.1f} ms ({got} jobs,"
                f" cpu {cpu:.1f} ms)"
            )


def case_paused(engine: Engine, sizes: list[int], repeat: int) -> None:
    for n in sizes:
        clear(engine)
        tenants(engine, 100)
        jobs(
            engine,
            "SELECT 1 + g % 100, 'd' || g || '.example', g FROM generate_series(0, :n - 1) AS g",
            {"n": n},
        )
        pause(engine, "true")
        for name, (ms, got, cpu) in timed_claims(engine, 64, repeat).items():
            assert got == 0 or name == "fifo"  # FIFO knows no pauses
            print(
                f"all {n:>6,} domains paused  {name}: empty claim {ms:8.1f} ms (cpu {cpu:.1f} ms)"
            )


def case_blocked(engine: Engine, sizes: list[int], repeat: int) -> None:
    """N tenants whose jobs are all on one domain at its connection limit (4 running), then
    100 tenants with 5 claimable jobs each on domains of their own; claim of 64, rolled
    back: every claim is the first to meet the blocked tenants."""
    for n in sizes:
        clear(engine)
        tenants(engine, n + 100)
        jobs(
            engine,
            "SELECT g, 'full.example', g FROM generate_series(1, :n) AS g "
            "UNION ALL SELECT :n + 1 + g % 100, 'd' || (g % 100) || '.example', :n + 1 + g "
            "FROM generate_series(0, 499) AS g",
            {"n": n},
        )
        with engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE scraping.jobs SET status = 'running', attempts = 1, "
                    "lease_owner = 'bench', lease_expires_at = now() + interval '1 hour' "
                    "WHERE id IN (SELECT id FROM scraping.jobs WHERE domain = 'full.example' "
                    "LIMIT 4)"
                )
            )
        for name, (ms, got, cpu) in timed_claims(engine, 64, repeat).items():
            print(
                f"{n:>6,} tenants on one full domain  {name}: claim of 64 {ms:8.1f} ms "
                f"({got} jobs, cpu {cpu:.1f} ms)"
            )


def case_spread(engine: Engine, sizes: list[int], repeat: int) -> None:
    """One tenant with one job on each of N domains, all but 64 at their connection limit
    (a running job each, concurrency 1), in name order; claim of 64, rolled back."""
    for n in sizes:
        clear(engine)
        tenants(engine, 1)
        jobs(
            engine,
            "SELECT 1, 'd' || lpad((g % :n)::text, 6, '0') || '.example', g "
            "FROM generate_series(0, 2 * :n - 1) AS g",
            {"n": n},
        )
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO scraping.domains (domain, concurrency) "
                    "SELECT 'd' || lpad(g::text, 6, '0') || '.example', 1 "
                    "FROM generate_series(0, :n - 65) AS g "
                    "ON CONFLICT (domain) DO UPDATE SET concurrency = 1"
                ),
                {"n": n},
            )
            conn.execute(
                text(
                    "UPDATE scraping.jobs SET status = 'running', attempts = 1, "
                    "lease_owner = 'bench', lease_expires_at = now() + interval '1 hour' "
                    "WHERE id IN (SELECT DISTINCT ON (domain) id FROM scraping.jobs "
                    "WHERE domain < 'd' || lpad((:n - 64)::text, 6, '0') "
                    "ORDER BY domain, id)"
                ),
                {"n": n},
            )
        for name, (ms, got, cpu) in timed_claims(engine, 64, repeat).items():
            print(
                f"one tenant, {n:>6,} domains, all but 64 full  {name}: claim of 64 "
                f"{ms:8.1f} ms ({got} jobs, cpu {cpu:.1f} ms)"
            )


def _claim_for(
    url: str, claim: str, i: int, counts: list[int], gate: threading.Barrier, seconds: float
) -> None:
    """One claimer: claims of 16, each committed, for `seconds` after the gate opens."""
    own = create_db_engine(url)
    with own.connect() as conn:
        conn.execute(text("SELECT 1"))  # connected before the clock starts
        conn.commit()
        gate.wait()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with conn.begin():
                counts[i] += len(
                    conn.execute(
                        text(f"SELECT id FROM {claim}(:w, 16, 600, 2, 4)"), {"w": f"b{i}"}
                    ).all()
                )
    own.dispose()


def case_throughput(engine: Engine, url: str, seconds: float, rounds: int) -> None:
    """Each contender at 1 claimer then 4, `rounds` times over, the contenders taking turns
    within a round: on this 2-core VM the same run moves by up to 2x with the neighbours
    (steal), so a ratio is taken within a round, and the medians are the figures."""
    rates: dict[tuple[str, int], list[float]] = {}
    for round_no in range(1, rounds + 1):
        for name, claim in claims.items():
            own_domain_indexes(engine, name)
            for claimers in (1, 4):
                clear(engine)
                tenants(engine, 2000)
                jobs(
                    engine,
                    "SELECT 1 + g % 2000, 'd' || (g % 20000) || '.example', g "
                    "FROM generate_series(0, 80000 - 1) AS g",
                    {},
                )
                counts = [0] * claimers
                gate = threading.Barrier(claimers + 1)
                threads = [
                    threading.Thread(target=_claim_for, args=(url, claim, i, counts, gate, seconds))
                    for i in range(claimers)
                ]
                for t in threads:
                    t.start()
                gate.wait()  # every claimer connected: the clock starts
                began = time.monotonic()
                machine_before = CpuTimes.now()
                for t in threads:
                    t.join()
                took = time.monotonic() - began
                machine = cpu_shares_since(machine_before)
                rate = sum(counts) / took
                rates.setdefault((name, claimers), []).append(rate)
                ratio = f"  {rate / rates[name, 1][-1]:.2f}x one" if claimers == 4 else ""
                print(
                    f"throughput round {round_no} {name}, {claimers} claimer(s): {rate:7.0f} "
                    f"jobs/s ({sum(counts):,} jobs in {took:.1f} s){ratio}"
                    + (f"  machine {machine}" if machine else ""),
                    flush=True,
                )
    for name in claims:
        one, four = rates[name, 1], rates[name, 4]
        ratios = sorted(f / o for f, o in zip(four, one, strict=True))
        print(
            f"throughput {name}, median of {rounds}: 1 claimer {statistics.median(one):7.0f} "
            f"jobs/s, 4 claimers {statistics.median(four):7.0f} jobs/s, 4 / 1 per round "
            + " ".join(f"{r:.2f}x" for r in ratios)
            + f" (median {statistics.median(ratios):.2f}x)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="tenants,deep,paused,throughput")
    parser.add_argument("--tenants", default="100,1000,5000,20000")
    parser.add_argument("--deep", default="1000,10000,30000")
    parser.add_argument("--paused", default="1000,10000,50000")
    parser.add_argument("--blocked", default="20000", help="tenants on one full domain")
    parser.add_argument("--spread", default="1000", help="one tenant's domains, most full")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds (default 3)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--claims",
        default="head,0016,0007",
        help="contenders, in this order, of head,0016,0007,fifo",
    )
    parser.add_argument("--database", default=DATABASE, help=f"default {DATABASE}")
    args = parser.parse_args()
    claims.update({name: CLAIMS[name] for name in args.claims.split(",") if name})

    def sizes(raw: str) -> list[int]:
        return [int(s) for s in raw.split(",") if s]

    url = fresh_bench_database(args.database)
    engine = create_db_engine(url)
    install_0007(engine)
    install_claim_0016(engine)
    install_fifo(engine)
    cases: dict[str, Callable[[], None]] = {
        "tenants": lambda: case_tenants(engine, sizes(args.tenants), args.repeat),
        "deep": lambda: case_deep(engine, sizes(args.deep), args.repeat),
        "paused": lambda: case_paused(engine, sizes(args.paused), args.repeat),
        "blocked": lambda: case_blocked(engine, sizes(args.blocked), args.repeat),
        "spread": lambda: case_spread(engine, sizes(args.spread), args.repeat),
        "throughput": lambda: case_throughput(engine, url, args.seconds, args.rounds),
    }
    for name in args.cases.split(","):
        cases[name]()
    engine.dispose()


if __name__ == "__main__":
    main()
