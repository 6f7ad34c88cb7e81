"""The scraping workers' path alone, against a bare `requests` loop in the same run: what
bench/scraping.py measures without the API and the Dagster daemon, with the cost per job.

    PIN_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python bench/scraping_workers.py [--jobs 1500] [--slots 556] [--runs 2]

The jobs are queued first (scraping.submit_job, one statement), then `--runs` processes of
`pin scraping work --slots slots/runs` drain them from the same loopback target as
bench/scraping.py (every GET answered after `--latency` s with 10 KB). Printed:
  - jobs/s, first attempt → last finish, and its ratio to the bare loop (and to the bare
    loop reading robots.txt first); the first attempt to the first finish and to the
    `slots`-th (robots.txt, then the first wave: the turns its jobs take again after it);
  - worker CPU per job (the processes' own rusage; and from their first claim on, without
    the second or more of imports and setup before it) and PostgreSQL backend CPU per job
    (the database's backends' schedstat, polled), so a loaded machine still shows the cost;
  - transactions per job (pg_stat_database) and, by statement, calls and time per job as
    the workers' SQLAlchemy engines saw them (`--statements`).
`--database` names the scratch database (default pin_bench_scraping_workers).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._db import drop_bench_database, fresh_bench_database  # noqa: E402
from bench._scraping_timeline import timeline  # noqa: E402
from bench.scraping import _serve_target, bare_loop, robots_seconds  # noqa: E402
from pin_orchestration.platform.db import create_db_engine  # noqa: E402
from pin_orchestration.scraping.store.tenancy import create_tenant  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _child(out: str, argv: list[str]) -> None:
    """A worker process: `pin scraping work` with its statements counted and timed, and
    its own CPU written to `out` at exit."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    calls: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    lock = threading.Lock()
    local = threading.local()
    # The process's CPU when it sent its first claim: what it spent on imports and setup
    # before (a second or more) is not the cost of its jobs.
    at_first_claim: list[float] = []

    def cpu_s() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def name(statement: str) -> str:
        for line in statement.splitlines():
            line = line.strip()
            if line and not line.startswith("--"):
                return line[:90]
        return statement[:90]

    @event.listens_for(Engine, "before_cursor_execute")
    def before(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if not at_first_claim and "scraping.claim_jobs(" in statement:
            at_first_claim.append(cpu_s())
        local.started = time.perf_counter()

    @event.listens_for(Engine, "after_cursor_execute")
    def after(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        took = time.perf_counter() - local.started
        key = name(statement)
        with lock:
            calls[key] += 1
            seconds[key] += took

    @event.listens_for(Engine, "commit")
    def commit(conn):  # type: ignore[no-untyped-def]
        with lock:
            calls["COMMIT"] += 1

    @event.listens_for(Engine, "rollback")
    def rollback(conn):  # type: ignore[no-untyped-def]
        with lock:
            calls["ROLLBACK"] += 1

    from pin_orchestration.cli import main

    try:
        main.main(argv, standalone_mode=False)
    finally:
        spent = cpu_s()
        Path(out).write_text(
            json.dumps(
                {
                    "cpu_s": spent,
                    "cpu_from_claim_s": spent - (at_first_claim or [spent])[0],
                    "calls": dict(calls),
                    "seconds": dict(seconds),
                }
            )
        )


def _backend_cpu(engine, database: str, stop: threading.Event, seen: dict[int, float]) -> None:  # type: ignore[no-untyped-def]
    while not stop.is_set():
        with engine.connect() as conn:
            pids = (
                conn.execute(
                    text(
                        "SELECT pid FROM pg_stat_activity "
                        "WHERE datname = :d AND pid <> pg_backend_pid()"
                    ),
                    {"d": database},
                )
                .scalars()
                .all()
            )
        for pid in pids:
            with contextlib.suppress(OSError, ValueError, IndexError):
                seen[pid] = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
        stop.wait(0.25)


def run(args: argparse.Namespace, target: str) -> dict[str, object]:
    db_url = fresh_bench_database(args.database)
    engine = create_db_engine(db_url)
    tenant, _ = create_tenant(engine, "bench")
    tenant_id = getattr(tenant, "id", tenant)
    home = Path(tempfile.mkdtemp(prefix="pin-bench-workers-"))
    with engine.begin() as conn:
        conn.execute(
            text(
                "SELECT scraping.submit_job(CAST(:t AS uuid), :target || '/job/' || n) "
                "FROM generate_series(1, :jobs) n"
            ),
            {"t": str(tenant_id), "target": target, "jobs": args.jobs},
        )
        xact_before = conn.execute(
            text("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = :d"),
            {"d": args.database},
        ).scalar_one()
    env = {
        **os.environ,
        "PIN_DATABASE_URL": db_url,
        "PIN_HOME": str(home),
        "PIN_SCRAPING_ALLOWED_CIDRS": "127.0.0.1/32",
        "PIN_SCRAPING_DOMAIN_CONCURRENCY": str(min(args.slots * 16, 10_000)),
        "PIN_SCRAPING_DOMAIN_RPS": "10000",
    }
    seen: dict[int, float] = {}
    stop = threading.Event()
    poller = threading.Thread(target=_backend_cpu, args=(engine, args.database, stop, seen))
    poller.start()
    outs = [str(home / f"worker-{n}.json") for n in range(args.runs)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--child",
                out,
                "scraping",
                "work",
                "--slots",
                str(args.slots // args.runs),
                "--idle-exit-seconds",
                "3",
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        for out in outs
    ]
    try:
        for proc in procs:
            proc.wait(timeout=900)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        stop.set()
        poller.join()
    time.sleep(1.0)  # backends report their counters as they leave
    with engine.connect() as conn:
        figures = conn.execute(
            text(
                """
                WITH first_attempt AS (
                    SELECT j.id, min(a.started_at) AS started_at
                    FROM scraping.jobs j JOIN scraping.job_attempts a ON a.job_id = j.id
                    GROUP BY j.id
                )
                SELECT
                    (SELECT count(*) FILTER (WHERE status = 'succeeded') FROM scraping.jobs)
                        AS succeeded,
                    (SELECT count(*) FROM scraping.job_attempts) AS attempts,
                    (SELECT extract(epoch FROM max(j.finished_at) - min(f.started_at))
                       FROM scraping.jobs j, first_attempt f) AS processing_s,
                    (SELECT xact_commit + xact_rollback FROM pg_stat_database
                      WHERE datname = :d) AS xacts,
                    (SELECT extract(epoch FROM min(j.finished_at) - min(f.started_at))
                       FROM scraping.jobs j, first_attempt f) AS first_finish_s,
                    (SELECT extract(epoch FROM (
                                SELECT finished_at FROM scraping.jobs
                                ORDER BY finished_at OFFSET :slots - 1 LIMIT 1)
                              - (SELECT min(started_at) FROM first_attempt))) AS first_wave_s
                """
            ),
            {"d": args.database, "slots": min(args.slots, args.jobs)},
        ).one()
    where = timeline(engine, args.slots // args.runs) if args.timeline else ""
    engine.dispose()
    reports = [json.loads(Path(out).read_text()) for out in outs if Path(out).exists()]
    calls: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    for r in reports:
        calls.update(r["calls"])
        seconds.update(r["seconds"])
    shutil.rmtree(home, ignore_errors=True)
    drop_bench_database(args.database)
    return {
        "succeeded": figures.succeeded,
        "attempts": figures.attempts,
        "jobs_per_s": args.jobs / float(figures.processing_s),
        "worker_cpu_ms_per_job": 1000 * sum(r["cpu_s"] for r in reports) / args.jobs,
        "worker_run_cpu_ms_per_job": 1000
        * sum(r.get("cpu_from_claim_s", 0.0) for r in reports)
        / args.jobs,
        "backend_cpu_ms_per_job": 1000 * sum(seen.values()) / args.jobs,
        "xacts_per_job": (figures.xacts - xact_before) / args.jobs,
        "first_finish_s": float(figures.first_finish_s),
        "first_wave_s": float(figures.first_wave_s),
        "calls": calls,
        "seconds": seconds,
        "timeline": where,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1500)
    parser.add_argument("--slots", type=int, default=556)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument(
        "--robots-latency",
        type=float,
        default=None,
        help="seconds the target takes to answer /robots.txt (default: --latency, as a page)",
    )
    parser.add_argument("--database", default="pin_bench_scraping_workers")
    parser.add_argument("--statements", action="store_true", help="print calls per statement")
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="print where the runs' time went (bench/_scraping_timeline.py)",
    )
    args = parser.parse_args()
    ports: multiprocessing.Queue = multiprocessing.Queue()
    server = multiprocessing.Process(
        target=_serve_target, args=(ports, args.latency, args.robots_latency), daemon=True
    )
    server.start()
    target = f"http://127.0.0.1:{ports.get(timeout=10)}"
    try:
        load = os.getloadavg()[0]
        bare, _ = bare_loop(target, args.jobs, args.slots)
        robots_s = robots_seconds(target)
        polite = args.jobs / (args.jobs / bare + robots_s)
        result = run(args, target)
    finally:
        server.terminate()
    print(
        f"jobs {args.jobs}, slots {args.slots} ({args.runs} worker processes), "
        f"latency {args.latency} s; load average at start {load:.2f}, at end "
        f"{os.getloadavg()[0]:.2f}"
    )
    print(f"bare requests loop        {bare:8.1f} jobs/s")
    print(f"  reading robots.txt first{polite:8.1f} jobs/s  (its answer took {robots_s:.2f} s)")
    print(
        f"workers (first → last)    {result['jobs_per_s']:8.1f} jobs/s  "
        f"({result['jobs_per_s'] / bare:.2f}× the bare loop, "
        f"{result['jobs_per_s'] / polite:.2f}× reading robots.txt first)"
    )
    print(
        f"first attempt → first finish {result['first_finish_s']:5.2f} s, → the "
        f"{min(args.slots, args.jobs)}th {result['first_wave_s']:5.2f} s"
    )
    print(f"succeeded / attempts      {result['succeeded']} / {result['attempts']}")
    print(
        f"worker CPU per job        {result['worker_cpu_ms_per_job']:8.2f} ms  "
        f"({result['worker_run_cpu_ms_per_job']:.2f} ms from the first claim on)"
    )
    print(f"backend CPU per job       {result['backend_cpu_ms_per_job']:8.2f} ms")
    print(f"transactions per job      {result['xacts_per_job']:8.2f}")
    if result["timeline"]:
        print(result["timeline"])
    if args.statements:
        calls, seconds = result["calls"], result["seconds"]
        for key, n in sorted(calls.items(), key=lambda kv: -kv[1]):
            print(
                f"  {n / args.jobs:7.3f}/job {1000 * seconds.get(key, 0) / max(n, 1):7.2f} ms  "
                f"{key}"
            )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3:])
    else:
        main()
