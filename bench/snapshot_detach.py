"""Benchmark of news-snapshot-detach-retry: drain 10,000 Pending rows against a selections
stand-in answering after 20 ms, and compare with a bare `requests` loop at the same
concurrency in the same run.

    PIN_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python bench/snapshot_detach.py [--rows 10000] [--concurrency 16] [--analyze]

The stand-in runs in its own process on 127.0.0.1 (so its threads do not share our GIL).
The job is run the way the sensor runs it: `news_snapshot_detach_retry` in process, on a
fresh database created for the benchmark and dropped afterwards. Three figures:
  - job run: wall clock of the whole Dagster run (includes Dagster's start-up);
  - drain:   the drain inside that run (claim → call → outcome), from pin.job_runs;
  - bare loop: the same number of POSTs from a thread pool sharing one pooled Session.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import requests
from dagster import DagsterInstance
from requests.adapters import HTTPAdapter
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from pin_orchestration.devstack.standins.selections import SelectionsStandIn
from pin_orchestration.jobs.news_snapshot_detach import news_snapshot_detach_retry
from pin_orchestration.migrations import upgrade_database
from pin_orchestration.platform.db import create_db_engine
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.resources.selections import SelectionsResource

LATENCY_SECONDS = 0.020


def _serve_stand_in(port_queue: multiprocessing.Queue, stop: multiprocessing.Event) -> None:
    with SelectionsStandIn(latency_seconds=LATENCY_SECONDS) as stand_in:
        port_queue.put(stand_in.url)
        stop.wait()


def _insert_pending(engine, rows: int) -> None:  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                INSERT INTO news.snapshot_detach_outbox (id, snapshot_id, post_id, reason)
                SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(),
                       CASE WHEN i % 3 = 0 THEN 'PostDeleted' ELSE 'BlockReplaced' END
                FROM generate_series(1, :rows) AS i
                """
            ),
            {"rows": rows},
        )


def bench_job(
    db_url: str, selections_url: str, rows: int, concurrency: int, *, analyze: bool = False
) -> tuple[float, float]:
    engine = create_db_engine(db_url)
    _insert_pending(engine, rows)
    if analyze:
        # A table in service has autovacuum's statistics; a fresh one has none, and the
        # planner then reads and sorts every due row for each claim instead of reading
        # ix_sdo_due in order.
        with engine.begin() as conn:
            conn.execute(text("ANALYZE news.snapshot_detach_outbox"))
    started = time.perf_counter()
    result = news_snapshot_detach_retry.execute_in_process(
        run_config={
            "ops": {
                "drain_snapshot_detach_outbox": {
                    "config": {"batch_size": 100, "max_concurrency": concurrency}
                }
            }
        },
        resources={
            "database": DatabaseResource(url=db_url),
            "selections": SelectionsResource(url=selections_url),
        },
        instance=DagsterInstance.ephemeral(),
    )
    elapsed = time.perf_counter() - started
    assert result.success
    with engine.connect() as conn:
        done = conn.execute(
            text("SELECT count(*) FROM news.snapshot_detach_outbox WHERE status = 'Done'")
        ).scalar_one()
        drain_ms = conn.execute(
            text("SELECT (result->>'duration_ms')::bigint FROM pin.job_runs WHERE run_id = :r"),
            {"r": result.run_id},
        ).scalar_one()
    if done != rows:
        raise SystemExit(f"job detached {done} of {rows} rows")
    return rows / elapsed, rows / (drain_ms / 1000)


def bench_bare_loop(selections_url: str, rows: int, concurrency: int) -> float:
    session = requests.Session()
    session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=concurrency))
    ids = [uuid.uuid4() for _ in range(rows)]

    def call(snapshot_id: uuid.UUID) -> int:
        response = session.post(
            f"{selections_url}/internal/snapshots/{snapshot_id}/detach",
            json={"reason": "BlockReplaced"},
            timeout=5,
        )
        return response.status_code

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        statuses = list(pool.map(call, ids))
    elapsed = time.perf_counter() - started
    if statuses.count(200) != rows:
        raise SystemExit("bare loop: not every call answered 200")
    return rows / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--analyze",
        action="store_true",
        help="ANALYZE the outbox after inserting the rows (a table in service has statistics)",
    )
    args = parser.parse_args()
    server_url = os.environ.get("PIN_DATABASE_URL")
    if not server_url:
        print("set PIN_DATABASE_URL to a PostgreSQL server the benchmark may create a database on")
        return 2

    name = f"pin_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    db_url = make_url(server_url).set(database=name).render_as_string(hide_password=False)

    ctx = multiprocessing.get_context("spawn")
    urls, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve_stand_in, args=(urls, stop), daemon=True)
    server.start()
    try:
        selections_url = urls.get(timeout=30)
        upgrade_database(db_url)
        print(
            f"{args.rows} rows, concurrency {args.concurrency}, stand-in latency "
            f"{LATENCY_SECONDS * 1000:.0f} ms on {selections_url}"
        )
        bare = bench_bare_loop(selections_url, args.rows, args.concurrency)
        job_rate, drain_rate = bench_job(
            db_url, selections_url, args.rows, args.concurrency, analyze=args.analyze
        )
        ideal = args.concurrency / LATENCY_SECONDS
        print(f"bare requests loop : {bare:8.0f} rows/s")
        print(f"job run (whole run): {job_rate:8.0f} rows/s  ({job_rate / bare:.2f}x bare loop)")
        print(
            f"job drain          : {drain_rate:8.0f} rows/s  ({drain_rate / bare:.2f}x bare loop)"
        )
        print(f"ceiling (concurrency / latency): {ideal:.0f} rows/s")
    finally:
        stop.set()
        server.join(10)
        create_db_engine(db_url).dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
