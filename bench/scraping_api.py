"""Benchmark of the scraping API at the seed's peak: 28 POST/s + 167 GET/s for 60 s from a
separate load process, intake p99 with and without the Redis read cache, the same peak
with crawler batches beside it (POST /jobs/batch of 400 jobs, 0.5 a second: target p99
≤ 100 ms), then a stepped ramp of the POST rate to the highest one whose p99 stays under
the seed's 200 ms SLO.

    PIN_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/scraping_api.py [--duration 60] [--step-seconds 15]

`pin api` (uvicorn) runs as a subprocess on a fresh database `pin_bench_scraping_api`;
with Redis, a `redis-server` of the bench's own on a free loopback port (the machine's on
127.0.0.1:6379 when the binary is missing). The load process is open-loop: requests leave
at Poisson arrival times whatever the server's pace, and each latency runs from the
scheduled departure, so a slow server cannot hide its queue (no coordinated omission).
GETs poll jobs accepted in the last 30 s, each about every 5 s (the seed's polling), over
10 tenants. A finisher stands in for the workers: every second it marks jobs accepted
more than 20 s ago succeeded (the seed's ~20 s per job), so terminal jobs, their NOTIFY
and the cache's long TTL are part of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import multiprocessing
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path

import psutil
import requests
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._db import fresh_bench_database  # noqa: E402
from bench._machine import CpuTimes, cpu_shares_since  # noqa: E402
from pin_orchestration.devstack.processes import no_survivors  # noqa: E402
from pin_orchestration.platform.db import create_db_engine  # noqa: E402
from pin_orchestration.scraping.store.tenancy import create_tenant  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
METRICS_TOKEN = "bench-metrics-token"
SLO_P99_MS = 200.0
TARGET_P99_MS = 20.0
BATCH_TARGET_P99_MS = 100.0
POLL_WINDOW_SECONDS = 30.0


# --- the load process -------------------------------------------------------------------


@dataclass
class Load:
    port: int
    keys: list[str]
    post_rate: float
    get_rate: float
    duration: float
    seed: int
    # Baseline: the same arrivals, each a GET of an unknown path (404 from the same uvicorn
    # and Starlette stack, no database): the machine's and the HTTP stack's floor.
    floor: bool = False
    # Crawler bursts: POST /jobs/batch of `batch_size` jobs at `batch_rate` a second, from
    # crawler tenants of their own (`batch_keys`) taking turns.
    batch_rate: float = 0.0
    batch_size: int = 400
    batch_keys: tuple[str, ...] = ()


async def _request(
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
    port: int,
    raw: bytes,
) -> tuple[int, bytes]:
    """One request on an idle keep-alive connection (a new one if none). A reused
    connection the server closed meanwhile (uvicorn's keep-alive timeout) is retried once
    on a new connection, as HTTP clients do."""
    reused = bool(idle)
    conn = idle.pop() if idle else await asyncio.open_connection("127.0.0.1", port)
    reader, writer = conn
    try:
        writer.write(raw)
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionResetError) as exc:
        writer.close()
        if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
            raise
        conn = await asyncio.open_connection("127.0.0.1", port)
        reader, writer = conn
        writer.write(raw)
        head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.lower() == "content-length":
            length = int(value)
    body = await reader.readexactly(length)
    idle.append(conn)
    return status, body


def _raw(method: str, path: str, key: str, body: bytes = b"") -> bytes:
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _run_load(load: Load) -> dict[str, list[float] | int]:
    rng = random.Random(load.seed)
    loop = asyncio.get_running_loop()
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    recent: deque[tuple[float, str, str]] = deque()  # (accepted at, job id, key)
    latencies: dict[str, list[float]] = {"post": [], "get": [], "batch": []}
    errors = {"post": 0, "get": 0, "batch": 0}
    reasons: Counter[str] = Counter()
    tasks: set[asyncio.Task[None]] = set()
    batch_turn = itertools.count()

    async def one(kind: str, scheduled: float) -> None:
        try:
            if load.floor:
                status, _ = await _request(idle, load.port, _raw("GET", "/nope", load.keys[0]))
                ok = status == 404
            elif kind == "post":
                key = rng.choice(load.keys)
                body = json.dumps({"url": f"https://t{rng.randrange(50)}.example/{rng.random()}"})
                status, answer = await _request(
                    idle, load.port, _raw("POST", "/jobs", key, body.encode())
                )
                ok = status == 202
                if not ok:
                    reasons[f"{kind} {status}"] += 1
                if ok:
                    recent.append((loop.time(), json.loads(answer)["id"], key))
            elif kind == "batch":
                # Round robin: each crawler's bucket refills between its batches.
                key = load.batch_keys[next(batch_turn) % len(load.batch_keys)]
                jobs = [
                    {"url": f"https://t{rng.randrange(50)}.example/{rng.random()}"}
                    for _ in range(load.batch_size)
                ]
                status, answer = await _request(
                    idle,
                    load.port,
                    _raw("POST", "/jobs/batch", key, json.dumps({"jobs": jobs}).encode()),
                )
                ok = status == 202 and json.loads(answer)["accepted"] == load.batch_size
            else:
                now = loop.time()
                while recent and recent[0][0] < now - POLL_WINDOW_SECONDS:
                    recent.popleft()
                if not recent:
                    return
                _, job_id, key = recent[rng.randrange(len(recent))]
                status, _ = await _request(idle, load.port, _raw("GET", f"/jobs/{job_id}", key))
                ok = status == 200
            if not ok:
                reasons[f"{kind} {status}"] += 1
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            reasons[f"{kind} {type(exc).__name__}"] += 1
            ok = False
        if ok:
            latencies[kind].append((loop.time() - scheduled) * 1000)
        else:
            errors[kind] += 1

    start = loop.time() + 0.1
    arrivals: list[tuple[float, str]] = []
    rates = (("post", load.post_rate), ("get", load.get_rate), ("batch", load.batch_rate))
    for kind, rate in rates:
        t = 0.0
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= load.duration:
                break
            arrivals.append((start + t, kind))
    arrivals.sort()
    # What the load process holds by now (its modules, the arrival schedule) lives for the
    # phase: frozen, the collector's full passes no longer walk it. One such pass stopped
    # this loop for ~50 ms, and the request in flight then was counted that much slower.
    gc.freeze()
    for scheduled, kind in arrivals:
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(kind, scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    for _, writer in idle:
        writer.close()
    return {
        **latencies,
        "post_errors": errors["post"],
        "get_errors": errors["get"],
        "batch_errors": errors["batch"],
        "reasons": dict(reasons),
    }


def _load_process(load: Load, out: multiprocessing.Queue) -> None:
    out.put(asyncio.run(_run_load(load)))


def run_load(load: Load) -> dict[str, list[float] | int]:
    """The load in a process of its own (the API's CPU is not the load's)."""
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()
    proc = ctx.Process(target=_load_process, args=(load, out))
    proc.start()
    result = out.get(timeout=load.duration + 300)
    proc.join(30)
    return result


# --- servers ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=1).status_code < 500:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up in {seconds} s")


def start_redis() -> tuple[str, subprocess.Popen | None]:
    binary = shutil.which("redis-server")
    if binary is None:
        return "redis://127.0.0.1:6379/14", None
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    return f"redis://127.0.0.1:{port}/0", proc


class Api:
    def __init__(
        self, db_url: str, redis_url: str | None, home: Path, extra_env: dict, workers: int = 1
    ) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "PIN_DATABASE_URL": db_url,
            "PIN_HOME": str(home),
            "PIN_API_PUBLIC_URL": f"http://127.0.0.1:{self.port}",
            # /metrics answers only with the operators' token (issue 16).
            "PIN_METRICS_TOKEN": METRICS_TOKEN,
            **extra_env,
        }
        env.pop("PIN_REDIS_URL", None)
        if redis_url:
            env["PIN_REDIS_URL"] = redis_url
        self.proc = subprocess.Popen(
            [
                *(str(Path(sys.executable).parent / "pin"), "api", "--port", str(self.port)),
                *("--workers", str(workers)),
            ],
            env=env,
            cwd=ROOT,
            stderr=subprocess.DEVNULL,
        )
        wait_for(f"http://127.0.0.1:{self.port}/healthz", 60)

    def metrics(self) -> dict[str, float]:
        from prometheus_client.parser import text_string_to_metric_families

        response = requests.get(
            f"http://127.0.0.1:{self.port}/metrics",
            headers={"Authorization": f"Bearer {METRICS_TOKEN}"},
            timeout=30,
        )
        response.raise_for_status()
        body = response.text
        return {
            s.name: s.value
            for family in text_string_to_metric_families(body)
            for s in family.samples
            if s.name.startswith("scraping_job_cache")
        }

    def cpu_seconds(self) -> float:
        """CPU time of `pin api` and its worker processes (--workers)."""
        root = psutil.Process(self.proc.pid)
        total = 0.0
        for process in (root, *root.children(recursive=True)):
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Finisher:
    """Stands in for the workers: jobs accepted more than 20 s ago become succeeded."""

    def __init__(self, db_url: str) -> None:
        self.engine = create_db_engine(db_url)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop_event.wait(1.0):
            with self.engine.begin() as conn:
                conn.execute(
                    text(
                        """
                        UPDATE scraping.jobs
                        SET status = 'succeeded', started_at = created_at, finished_at = now(),
                            attempts = 1, result_key = 'results/bench', result_size = 10240,
                            result_sha256 = 'bench', updated_at = now()
                        WHERE status = 'queued' AND next_attempt_at < now() - interval '20 s'
                        """
                    )
                )

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join()


# --- figures ------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def phase(
    name: str,
    db_url: str,
    redis_url: str | None,
    keys: list[str],
    args: argparse.Namespace,
    post_rate: float,
    duration: float,
    home: Path,
    floor: bool = False,
    batch_rate: float = 0.0,
    batch_keys: tuple[str, ...] = (),
) -> dict[str, float]:
    api = Api(db_url, redis_url, home, {}, workers=args.api_workers)
    finisher = Finisher(db_url)
    try:
        cpu_before = api.cpu_seconds()
        machine_before = CpuTimes.now()
        result = run_load(
            Load(
                api.port,
                keys,
                post_rate,
                args.get_rate,
                duration,
                args.seed,
                floor=floor,
                batch_rate=batch_rate,
                batch_size=args.batch_size,
                batch_keys=batch_keys,
            )
        )
        cpu = api.cpu_seconds() - cpu_before
        machine = cpu_shares_since(machine_before)
        cache = api.metrics() if redis_url else {}
    finally:
        finisher.stop()
        api.stop()
    post, get, batch = result["post"], result["get"], result["batch"]
    assert isinstance(post, list) and isinstance(get, list) and isinstance(batch, list)
    figures = {
        "post_rate": post_rate,
        "posts": len(post),
        "post_p50": pct(post, 0.50),
        "post_p99": pct(post, 0.99),
        "post_max": max(post, default=float("nan")),
        "gets": len(get),
        "get_p50": pct(get, 0.50),
        "get_p99": pct(get, 0.99),
        "batches": len(batch),
        "batch_p50": pct(batch, 0.50),
        "batch_p99": pct(batch, 0.99),
        "batch_max": max(batch, default=float("nan")),
        "errors": float(result["post_errors"])  # type: ignore[arg-type]
        + float(result["get_errors"])  # type: ignore[arg-type]
        + float(result["batch_errors"]),  # type: ignore[arg-type]
        "api_cpu_share": cpu / duration,
        "cache_hit_ratio": cache.get("scraping_job_cache_hit_ratio", float("nan")),
    }
    print(
        f"{name:<22} POST {post_rate:6.0f}/s n={figures['posts']:6.0f} "
        f"p50 {figures['post_p50']:6.1f} ms p99 {figures['post_p99']:7.1f} ms "
        f"max {figures['post_max']:7.1f} ms | GET n={figures['gets']:6.0f} "
        f"p50 {figures['get_p50']:6.1f} ms p99 {figures['get_p99']:7.1f} ms | "
        f"errors {figures['errors']:.0f} | API CPU {figures['api_cpu_share']:.2f} cores"
        + (f" | cache hit ratio {figures['cache_hit_ratio']:.2f}" if redis_url else "")
        + (f" | machine {machine}" if machine else ""),
        flush=True,
    )
    if batch:
        print(
            f"{'':<22} BATCH of {args.batch_size} n={figures['batches']:4.0f} "
            f"p50 {figures['batch_p50']:6.1f} ms p99 {figures['batch_p99']:7.1f} ms "
            f"max {figures['batch_max']:7.1f} ms",
            flush=True,
        )
    if result["reasons"]:
        print(f"{'':<22} errors: {result['reasons']}", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--post-rate", type=float, default=28.0)
    parser.add_argument("--get-rate", type=float, default=167.0)
    parser.add_argument("--step-seconds", type=float, default=15.0)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-ramp", action="store_true")
    parser.add_argument("--batch-size", type=int, default=400)
    parser.add_argument(
        "--batch-tenants",
        type=int,
        default=20,
        help="crawler tenants sending the batches, in turn (not the POST tenants): each "
        "one's bucket (400 jobs, 28/s) is full again by its next turn, so the phase measures "
        "the batch, not the intake limit",
    )
    parser.add_argument(
        "--batch-rate",
        type=float,
        default=0.5,
        help="batches a second beside the peak (0: no batch phase)",
    )
    parser.add_argument(
        "--api-workers",
        type=int,
        default=1,
        help="`pin api --workers`: API processes sharing the port (1: one process, one GIL)",
    )
    parser.add_argument("--database", default="pin_bench_scraping_api")
    args = parser.parse_args()

    db_url = fresh_bench_database(args.database)
    engine = create_db_engine(db_url)
    keys = [create_tenant(engine, f"tenant-{i}")[1] for i in range(args.tenants)]
    crawlers = tuple(create_tenant(engine, f"crawler-{i}")[1] for i in range(args.batch_tenants))
    home = Path(tempfile.mkdtemp(prefix="pin-bench-api-"))
    redis_url, redis_proc = start_redis()
    try:
        print(
            f"seed peak: {args.post_rate:g} POST/s + {args.get_rate:g} GET/s, {args.duration:g} s"
        )
        phase(
            "floor (404, no DB)",
            db_url,
            None,
            keys,
            args,
            args.post_rate,
            args.duration,
            home,
            floor=True,
        )
        peak = {
            "PostgreSQL only": phase(
                "PostgreSQL only", db_url, None, keys, args, args.post_rate, args.duration, home
            ),
            "Redis read cache": phase(
                "Redis read cache",
                db_url,
                redis_url,
                keys,
                args,
                args.post_rate,
                args.duration,
                home,
            ),
        }
        for name, f in peak.items():
            verdict = "met" if f["post_p99"] <= TARGET_P99_MS and f["errors"] == 0 else "MISSED"
            print(
                f"  {name}: intake p99 {f['post_p99']:.1f} ms (target {TARGET_P99_MS:g}): {verdict}"
            )
        if args.batch_rate > 0:
            f = phase(
                "peak + batches",
                db_url,
                redis_url,
                keys,
                args,
                args.post_rate,
                args.duration,
                home,
                batch_rate=args.batch_rate,
                batch_keys=crawlers,
            )
            verdict = (
                "met" if f["batch_p99"] <= BATCH_TARGET_P99_MS and f["errors"] == 0 else "MISSED"
            )
            print(
                f"  batch of {args.batch_size}: p99 {f['batch_p99']:.1f} ms "
                f"(target {BATCH_TARGET_P99_MS:g}): {verdict}; single intake beside it p99 "
                f"{f['post_p99']:.1f} ms"
            )
        if args.no_ramp:
            return
        print(f"ramp (Redis read cache, GET {args.get_rate:g}/s, {args.step_seconds:g} s a step)")
        best = None
        rate = args.post_rate
        while True:
            f = phase(
                f"ramp {rate:.0f} POST/s",
                db_url,
                redis_url,
                keys,
                args,
                rate,
                args.step_seconds,
                home,
            )
            if f["post_p99"] > SLO_P99_MS or f["errors"] > 0:
                break
            best = rate
            rate = rate * 1.5
        print(
            f"highest POST rate with intake p99 < {SLO_P99_MS:g} ms: {best:.0f}/s"
            if best
            else "even the first step missed the SLO"
        )
    finally:
        if redis_proc is not None:
            redis_proc.terminate()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    with no_survivors("bench/scraping_api.py"):
        main()
