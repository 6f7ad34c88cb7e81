"""Benchmark of the scraping pipeline, whole: API → scraping_jobs_sensor → scraping_worker
runs (launched by the real Dagster daemon) → results store, against a bare `requests`
loop at the same concurrency run just before each pipeline, in the same run.

    PIN_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python bench/scraping.py [--jobs 2000] [--slots 64] [--latency 2.0]

A target on 127.0.0.1 (its own process, asyncio, keep-alive) answers every GET after
`--latency` seconds with 10 KB (/robots.txt after `--robots-latency`, default the same:
everything allowed). The bare loop is `--slots` threads with one pooled
`requests` session making `--jobs` GETs, run again before each pipeline (the machine's
pace drifts over minutes of load; each pipeline is judged against the loop beside it).
The pipeline: `pin api` (uvicorn) and `dagster-daemon` in their own processes on a fresh
database; `--jobs` POST /jobs from 16
client threads (`--intake batch`: POST /jobs/batch of `--batch-size`; `both`, the
default: one pipeline run each, printed side by side); the daemon's sensor launches
worker runs (PIN_SCRAPING_MAX_WORKER_RUNS=1 by default so the pipeline has the same
`--slots` as the bare loop); the bench waits
until every job is terminal and reads the figures from scraping.jobs/job_attempts:
  - jobs/s: jobs / (last finish − first attempt start) — the fetch pipeline's rate, whose
    first attempts wait for the host's robots.txt: beside the bare loop's, the same loop
    had it read robots.txt first (one answer's time more);
  - end to end: jobs / (last finish − first accept), which adds the sensor tick and the
    run launch;
  - peak in flight: the most requests the target was answering at one instant;
  - p95 accept → first attempt.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._db import drop_bench_database, fresh_bench_database  # noqa: E402
from bench._scraping_timeline import timeline  # noqa: E402
from pin_orchestration.devstack.processes import no_survivors, stop_process_tree  # noqa: E402
from pin_orchestration.platform.db import create_db_engine, dagster_storage_url  # noqa: E402
from pin_orchestration.platform.defaults import (  # noqa: E402
    DAGSTER_HOME_DIR,
    DAGSTER_YAML,
    WORKSPACE_YAML,
)
from pin_orchestration.scraping.store.tenancy import create_tenant  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BODY = b"x" * 10_240


def _serve_target(
    port_queue: multiprocessing.Queue, latency: float, robots_latency: float | None = None
) -> None:
    """The target. It also counts the requests it is answering at once: GET /__peak returns
    the most since the last GET /__peak (the honest 'jobs in flight': fetches really open).
    /robots.txt is answered like any page (10 KB of no rule: everything allowed), after
    `robots_latency` s (default `latency`)."""
    in_flight = 0
    peak = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal in_flight, peak
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head:
                    break
                if head.startswith(b"GET /__peak "):
                    answer, peak = str(peak).encode(), 0
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(answer))
                    writer.write(answer)
                    await writer.drain()
                    continue
                in_flight += 1
                peak = max(peak, in_flight)
                wait = latency
                if robots_latency is not None and head.startswith(b"GET /robots.txt "):
                    wait = robots_latency
                try:
                    await asyncio.sleep(wait)
                finally:
                    in_flight -= 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
        port_queue.put(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def bare_loop(target: str, jobs: int, slots: int) -> tuple[float, float]:
    session = requests.Session()
    session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=slots))

    def get(i: int) -> None:
        answer = session.get(f"{target}/bare/{i}", timeout=30)
        assert answer.status_code == 200 and len(answer.content) == len(BODY)

    requests.get(f"{target}/__peak", timeout=5)
    started = time.monotonic()
    with ThreadPoolExecutor(slots) as pool:
        list(pool.map(get, range(jobs)))
    rate = jobs / (time.monotonic() - started)
    return rate, float(requests.get(f"{target}/__peak", timeout=5).text)


def robots_seconds(target: str) -> float:
    """How long the target takes to answer /robots.txt: what a loop obeying it waits before
    its first page (the pipeline does, once per host: scraping/fetch/robots.py)."""
    started = time.monotonic()
    answer = requests.get(f"{target}/robots.txt", timeout=30)
    assert answer.status_code == 200
    return time.monotonic() - started


def wait_for(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=5).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up in {seconds} s")


def pipeline(
    target: str,
    jobs: int,
    slots: int,
    api_port: int,
    runs: int = 1,
    rate: float = 0.0,
    intake: str = "single",
    batch_size: int = 200,
    database: str = "pin_bench_scraping",
    with_timeline: bool = False,
) -> dict[str, Any]:
    db_url = fresh_bench_database(database)
    engine = create_db_engine(db_url)
    _, key = create_tenant(engine, "bench")
    home = Path(tempfile.mkdtemp(prefix="pin-bench-scraping-"))
    dagster_home = home / DAGSTER_HOME_DIR
    dagster_home.mkdir()
    shutil.copyfile(ROOT / DAGSTER_YAML, dagster_home / DAGSTER_YAML)
    env = {
        **os.environ,
        "PIN_DATABASE_URL": db_url,
        "PIN_DAGSTER_PG_URL": dagster_storage_url(db_url),
        "PIN_HOME": str(home),
        "DAGSTER_HOME": str(dagster_home),
        # `runs` worker runs (processes) share the `slots`: the same concurrency as the bare
        # loop, over more than one interpreter.
        "PIN_SCRAPING_SLOTS": str(slots // runs),
        "PIN_SCRAPING_MAX_WORKER_RUNS": str(runs),
        "PIN_SCRAPING_ALLOWED_CIDRS": "127.0.0.1/32",
        # One local target stands for many sites: its politeness limits must not bind.
        "PIN_SCRAPING_DOMAIN_CONCURRENCY": str(min(slots * 16, 10_000)),
        "PIN_SCRAPING_DOMAIN_RPS": "10000",
        # The bench's one tenant posts every job at once (4,000 at the whole-pool peak):
        # the per-tenant intake limit (burst 400) is not what is measured here.
        "PIN_SCRAPING_INTAKE_RPS": "0",
        "PIN_API_PUBLIC_URL": f"http://127.0.0.1:{api_port}",
    }
    api_url = f"http://127.0.0.1:{api_port}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pin_orchestration.cli",
                "api",
                "--port",
                str(api_port),
            ],
            env=env,
            cwd=ROOT,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [
                str(Path(sys.executable).parent / "dagster-daemon"),
                "run",
                "-w",
                str(ROOT / WORKSPACE_YAML),
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    try:
        wait_for(f"{api_url}/healthz", 60)
        client = requests.Session()
        client.mount("http://", HTTPAdapter(pool_maxsize=16))
        headers = {"Authorization": f"Bearer {key}"}

        def post(i: int) -> None:
            if rate:  # open loop at the given rate: job i is sent at i / rate
                time.sleep(max(0.0, started + i / rate - time.monotonic()))
            answer = client.post(
                f"{api_url}/jobs", json={"url": f"{target}/job/{i}"}, headers=headers, timeout=30
            )
            assert answer.status_code == 202, answer.text

        def post_batch(first: int) -> None:
            numbers = range(first, min(first + batch_size, jobs))
            answer = client.post(
                f"{api_url}/jobs/batch",
                json={"jobs": [{"url": f"{target}/job/{i}"} for i in numbers]},
                headers=headers,
                timeout=60,
            )
            assert answer.status_code == 202, answer.text
            assert answer.json()["accepted"] == len(numbers), answer.text[:300]

        requests.get(f"{target}/__peak", timeout=5)  # forget the bare loop's peak
        started = time.monotonic()
        with ThreadPoolExecutor(16 if not rate else 64) as pool:
            if intake == "batch":
                list(pool.map(post_batch, range(0, jobs, batch_size)))
            else:
                list(pool.map(post, range(jobs)))
        accept_seconds = time.monotonic() - started
        deadline = time.monotonic() + 600
        while True:
            with engine.connect() as conn:
                left = conn.execute(
                    text("SELECT count(*) FROM scraping.jobs WHERE status IN ('queued', 'running')")
                ).scalar()
            if left == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{left} jobs still not terminal after 600 s")
            time.sleep(0.5)
        with engine.connect() as conn:
            figures = conn.execute(
                text(
                    """
                    WITH first_attempt AS (
                        SELECT j.id, j.created_at, min(a.started_at) AS started_at
                        FROM scraping.jobs j JOIN scraping.job_attempts a ON a.job_id = j.id
                        GROUP BY j.id, j.created_at
                    )
                    SELECT
                        (SELECT count(*) FILTER (WHERE status = 'succeeded')
                           FROM scraping.jobs) AS succeeded,
                        (SELECT extract(epoch FROM max(finished_at) - min(created_at))
                           FROM scraping.jobs) AS end_to_end_s,
                        (SELECT extract(epoch FROM max(j.finished_at) - min(f.started_at))
                           FROM scraping.jobs j, first_attempt f) AS processing_s,
                        (SELECT percentile_cont(0.95) WITHIN GROUP (
                                ORDER BY extract(epoch FROM started_at - created_at))
                           FROM first_attempt) AS p95_first_attempt_s
                    """
                )
            ).one()
        return {
            "timeline": timeline(engine, slots // runs) if with_timeline else "",
            "succeeded": figures.succeeded,
            "accept_s": accept_seconds,
            "jobs_per_s": jobs / float(figures.processing_s),
            "end_to_end_jobs_per_s": jobs / float(figures.end_to_end_s),
            "peak_in_flight": float(requests.get(f"{target}/__peak", timeout=5).text),
            "p95_first_attempt_s": float(figures.p95_first_attempt_s),
        }
    finally:
        # The daemon's code server ignores SIGTERM and would outlive the bench: each
        # process goes with everything it started.
        for proc in procs:
            stop_process_tree(proc.pid, grace=20)
        engine.dispose()
        drop_bench_database(database)
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument(
        "--robots-latency",
        type=float,
        default=None,
        help="seconds the target takes to answer /robots.txt (default: --latency, as a page)",
    )
    parser.add_argument("--api-port", type=int, default=0, help="default: a free port")
    parser.add_argument(
        "--runs", type=int, default=1, help="worker runs sharing the slots (one process each)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="POST jobs at this rate (jobs/s) instead of all at once, e.g. the seed's 28",
    )
    parser.add_argument(
        "--intake",
        choices=["single", "batch", "both", "batch-first"],
        default="both",
        help="how the jobs are posted: POST /jobs each, POST /jobs/batch of --batch-size "
        "(all at once only), or one pipeline run of each, printed side by side (both: "
        "POST /jobs first; batch-first: the other way round, to tell the intake from the "
        "second pipeline's place)",
    )
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument(
        "--database", default="pin_bench_scraping", help="the scratch database (dropped after)"
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="print where each pipeline run's time went (bench/_scraping_timeline.py)",
    )
    args = parser.parse_args()
    if args.api_port == 0:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            args.api_port = probe.getsockname()[1]

    ports: multiprocessing.Queue = multiprocessing.Queue()
    server = multiprocessing.Process(
        target=_serve_target, args=(ports, args.latency, args.robots_latency), daemon=True
    )
    server.start()
    target = f"http://127.0.0.1:{ports.get(timeout=10)}"
    try:
        ceiling = args.slots / args.latency
        robots_s = robots_seconds(target)
        intakes = {
            "both": ["single", "batch"],
            "batch-first": ["batch", "single"],
        }.get(args.intake, [args.intake])
        if args.rate:
            intakes = ["single"]  # an open loop posts job by job
        # Each pipeline beside a bare loop run just before it: the machine's pace drifts
        # over a run of minutes (a second pipeline read 0.1x lower than the first, in
        # either order, against one loop measured at the start).
        results: dict[str, tuple[float, float, dict[str, Any]]] = {}
        for intake in intakes:
            bare, bare_peak = bare_loop(target, args.jobs, args.slots)
            results[intake] = (
                bare,
                bare_peak,
                pipeline(
                    target,
                    args.jobs,
                    args.slots,
                    args.api_port,
                    args.runs,
                    args.rate,
                    intake=intake,
                    batch_size=args.batch_size,
                    database=args.database,
                    with_timeline=args.timeline,
                ),
            )
    finally:
        server.terminate()
    print(
        f"jobs {args.jobs} ({f'{args.rate:g}/s' if args.rate else 'all at once'}), "
        f"slots {args.slots} ({args.runs} worker run(s)), "
        f"target latency {args.latency} s, 10 KB bodies"
    )
    print(f"ceiling (slots / latency)          {ceiling:8.1f} jobs/s")
    print(f"robots.txt answered in             {robots_s:8.2f} s (the pipeline waits for it)")
    for intake, (bare, bare_peak, piped) in results.items():
        how = "POST /jobs" if intake == "single" else f"POST /jobs/batch of {args.batch_size}"
        # The same loop obeying robots.txt: its pages wait for it, once.
        polite = args.jobs / (args.jobs / bare + robots_s)
        print(f"-- intake by {how}")
        print(
            f"bare requests loop, just before    {bare:8.1f} jobs/s  "
            f"(peak {bare_peak:.0f} in flight)"
        )
        print(f"  reading robots.txt first         {polite:8.1f} jobs/s")
        print(
            f"pipeline (first attempt → last)    {piped['jobs_per_s']:8.1f} jobs/s  "
            f"({piped['jobs_per_s'] / bare:.2f}× the bare loop, "
            f"{piped['jobs_per_s'] / polite:.2f}× reading robots.txt first)"
        )
        print(f"pipeline end to end (accept → last){piped['end_to_end_jobs_per_s']:8.1f} jobs/s")
        print(f"peak jobs in flight                {piped['peak_in_flight']:8.0f}")
        print(f"p95 accept → first attempt         {piped['p95_first_attempt_s']:8.2f} s")
        print(f"intake of {args.jobs} jobs             {piped['accept_s']:8.2f} s")
        print(f"succeeded                          {piped['succeeded']:8.0f} of {args.jobs}")
        if piped["timeline"]:
            print(piped["timeline"])


if __name__ == "__main__":
    with no_survivors("bench/scraping.py"):
        main()
