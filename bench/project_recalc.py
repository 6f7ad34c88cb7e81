"""Bench of chessboard project-aggregates-recalc (issue 4, seed 002 AGG-7).

    PIN_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python bench/project_recalc.py [--projects 2000] [--objects 2000]

Uses a database of its own (pin_bench_chessboard on the PIN_DATABASE_URL server, created
and migrated if missing; the generated world is reused by later runs). Phase 1 queues
every project and drains them: per-project recalc time (claim → recalc commit → finish,
three short transactions).
Phase 2 streams change events (a property object's price or status changes and the
raiser queues a recalc in the same transaction) at --rate events/s for --stream-seconds,
while --workers drain workers run the production loop (`drain_loop`: sleep until the next
row falls due, at most --tick-seconds, at least --floor-seconds); prints the
event → updated-aggregates lag, whose target is debounce (30 s) + 5 s.
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
import uuid

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from pin_orchestration.chessboard.drain import drain_loop, drain_tick
from pin_orchestration.chessboard.outcomes import ProjectOutcome
from pin_orchestration.chessboard.queue import DEFAULT_POLICY, RecalcPolicy, request_project_recalc
from pin_orchestration.chessboard.sample import WorldShape, generate_world
from pin_orchestration.migrations import upgrade_database

BENCH_DB = "pin_bench_chessboard"
PREFIX = "bench"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def prepare(server_url: str, shape: WorldShape, database: str = BENCH_DB) -> str:
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        exists = conn.execute(
            text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": database}
        ).scalar()
        if not exists:
            conn.execute(text(f'CREATE DATABASE "{database}"'))
    admin.dispose()
    url = make_url(server_url).set(database=database).render_as_string(hide_password=False)
    upgrade_database(url)
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    started = time.monotonic()
    counts = generate_world(create_engine(url), shape, prefix=PREFIX, enqueue_new=False)
    with engine.connect() as conn:
        conn.execute(text("VACUUM ANALYZE"))
        total = conn.execute(text("SELECT count(*) FROM chessboard.property_objects")).scalar()
    print(
        f"world: {total:,} property objects ({counts}) ready in {time.monotonic() - started:.0f} s"
    )
    return url


def phase_recalc(url: str) -> None:
    engine = create_engine(url, pool_size=4)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM chessboard.project_recalc_requests"))
        projects = conn.execute(text("SELECT id, tenant_id FROM chessboard.projects")).all()
        past = conn.execute(text("SELECT now() - interval '1 hour'")).scalar()
        for p in projects:
            request_project_recalc(conn, p.id, p.tenant_id, "Crud", now=past)
    durations: list[float] = []
    started = time.monotonic()
    while True:
        tick = drain_tick(engine, on_outcome=lambda o: durations.append(o.duration_seconds))
        if not tick.outcomes:
            break
    wall = time.monotonic() - started
    ms = [d * 1000 for d in durations]
    print(f"phase 1: {len(ms)} projects recalculated in {wall:.1f} s, one worker")
    print(
        f"  per-project recalc  p50 {pct(ms, 50):6.1f} ms   p99 {pct(ms, 99):6.1f} ms   "
        f"max {max(ms):6.1f} ms"
    )
    engine.dispose()


def phase_stream(url: str, rate: float, seconds: float, workers: int, wake: RecalcPolicy) -> None:
    engine = create_engine(url, pool_size=workers + 4)
    with engine.connect() as conn:
        objects = conn.execute(
            text(
                "SELECT DISTINCT ON (project_id) id, project_id FROM chessboard.property_objects "
                "WHERE deleted_at IS NULL ORDER BY project_id, id"
            )
        ).all()
        tenants = dict(conn.execute(text("SELECT id, tenant_id FROM chessboard.projects")).all())
    rand = random.Random(7)
    events: list[tuple[uuid.UUID, float]] = []
    recalcs: dict[uuid.UUID, list[tuple[float, float]]] = {}
    lock = threading.Lock()
    stream_done = threading.Event()
    stop = threading.Event()

    def on_outcome(o: ProjectOutcome) -> None:
        committed = time.time()
        with lock:
            recalcs.setdefault(o.project_id, []).append((committed - o.duration_seconds, committed))

    def worker() -> None:
        drain_loop(engine, stop, policy=wake, on_outcome=on_outcome)

    def producer() -> None:
        interval = 1 / rate
        next_at = time.monotonic()
        end = next_at + seconds
        while next_at < end:
            obj = rand.choice(objects)
            with engine.begin() as conn:
                conn.execute(
                    text(
                        "UPDATE chessboard.property_objects SET price = price + 1000, "
                        "status = CASE WHEN status = 'Free' THEN 'Booked' ELSE 'Free' END "
                        "WHERE id = :id"
                    ),
                    {"id": obj.id},
                )
                request_project_recalc(
                    conn, obj.project_id, tenants[obj.project_id], "PropertyObjectStatusChanged"
                )
            events.append((obj.project_id, time.time()))
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        stream_done.set()

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    started = time.monotonic()
    producer()
    # Let the last debounce windows mature and drain.
    deadline = time.monotonic() + DEFAULT_POLICY.debounce_seconds + 4 * wake.tick_seconds + 10
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if (
                conn.execute(
                    text("SELECT count(*) FROM chessboard.project_recalc_requests")
                ).scalar()
                == 0
            ):
                break
        time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    lags: list[float] = []
    unserved = 0
    for project_id, at in events:
        served = [done for start, done in recalcs.get(project_id, []) if start >= at]
        if served:
            lags.append(min(served) - at)
        else:
            unserved += 1
    # The trailing debounce waits for 30 s of quiet: an event followed by another change of
    # the same project within 30 s waits for the later one's window. Lag of the event that
    # closed each window (the last one before the recalc claimed the row):
    by_project: dict[uuid.UUID, list[float]] = {}
    for project_id, at in events:
        by_project.setdefault(project_id, []).append(at)
    window_lags = []
    for project_id, runs in recalcs.items():
        for start, done in runs:
            before = [at for at in by_project.get(project_id, []) if at <= start]
            if before:
                window_lags.append(done - max(before))
    extended = len(events) - len(window_lags)
    durations = [done - start for runs in recalcs.values() for start, done in runs]
    print(
        f"phase 2: {len(events)} change events at {rate:g}/s over {seconds:g} s "
        f"({time.monotonic() - started:.0f} s with the tail), {workers} workers, "
        f"wake on due (tick {wake.tick_seconds:g} s, floor {wake.floor_seconds:g} s), "
        f"{sum(len(r) for r in recalcs.values())} recalcs, "
        f"{unserved} events unserved"
    )
    print(
        f"  event → updated lag p50 {pct(lags, 50):6.1f} s    p99 {pct(lags, 99):6.1f} s   "
        f"(target p99 <= debounce {DEFAULT_POLICY.debounce_seconds:g} s + 5 s)"
    )
    print(
        f"  last event of each debounce window → updated  p50 {pct(window_lags, 50):6.1f} s    "
        f"p99 {pct(window_lags, 99):6.1f} s   ({extended} events were coalesced into a "
        "later change's window)"
    )
    print(
        f"  per-project recalc under load p50 {pct(durations, 50) * 1000:.1f} ms   "
        f"p99 {pct(durations, 99) * 1000:.1f} ms"
    )
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database",
        default=BENCH_DB,
        help="scratch database (another name keeps branches with other migrations apart)",
    )
    parser.add_argument("--projects", type=int, default=2000)
    parser.add_argument("--objects", type=int, default=2000, help="property objects a project")
    parser.add_argument("--rate", type=float, default=20.0, help="change events per second")
    parser.add_argument("--stream-seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--tick-seconds", type=float, default=5.0, help="longest sleep between drain passes"
    )
    parser.add_argument(
        "--floor-seconds", type=float, default=0.05, help="shortest sleep between drain passes"
    )
    args = parser.parse_args()
    server = os.environ.get("PIN_DATABASE_URL")
    if not server:
        raise SystemExit(
            "set PIN_DATABASE_URL to a PostgreSQL server the bench may create "
            f"database {BENCH_DB} on"
        )
    shape = WorldShape(
        projects=args.projects, buildings=10, groups=10, layouts_per_group=5, objects=args.objects
    )
    url = prepare(server, shape, args.database)
    phase_recalc(url)
    wake = RecalcPolicy(tick_seconds=args.tick_seconds, floor_seconds=args.floor_seconds)
    wake.validate()
    phase_stream(url, args.rate, args.stream_seconds, args.workers, wake)


if __name__ == "__main__":
    main()
