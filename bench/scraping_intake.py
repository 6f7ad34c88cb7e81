"""Benchmark of intake alone (issue 30): POST /jobs throughput of `pin api` with its
defaults, closed loop from `--threads` client threads, nothing else running — against a
baseline measured in the same run, so a shared machine's load weighs on both alike.

    PIN_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/scraping_intake.py [--jobs 3000] [--rounds 2] \\
        [--baseline-ref 38ba3fd]

Variants, measured in turn round after round (A B A B …):
  - `tree`: this checkout's `pin api` on a fresh migrated database;
  - `echo`: a bare FastAPI app on the same uvicorn settings whose POST /jobs parses the
    same body into a one-field model and answers 202 (no database): the ceiling of the
    HTTP stack on this machine;
  - `ref` (with `--baseline-ref REF`): `pin api` of git revision REF, from a temporary
    `git worktree` of it, on a database migrated by that revision.

Each round: a fresh database, a tenant, 200 warm-up POSTs, then `--jobs` POSTs (each a
distinct URL, no Idempotency-Key, the intake limit off as in bench/scraping.py); printed:
POST/s, p50/p99 latency and the API process's CPU seconds per 1,000 POSTs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import requests
from sqlalchemy import text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._db import drop_bench_database  # noqa: E402
from bench._machine import CpuTimes, cpu_shares_since  # noqa: E402
from pin_orchestration.devstack.processes import no_survivors, stop_process_tree  # noqa: E402
from pin_orchestration.platform.db import create_db_engine, resolve_database_url  # noqa: E402
from pin_orchestration.platform.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "pin_bench_scraping_intake"

ECHO_APP = """
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel


class Body(BaseModel):
    url: str


def app():
    app = FastAPI()

    @app.post("/jobs", status_code=202)
    def submit(body: Body) -> JSONResponse:
        return JSONResponse({"id": "0", "status": "queued"}, status_code=202)

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": True}

    return app
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if requests.get(url, timeout=1).status_code < 500:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer within {seconds} s")
        time.sleep(0.2)


def fresh_database(tree: Path) -> str:
    """Database DATABASE, recreated and migrated by `tree`'s own migrations."""
    server_url = resolve_database_url(Settings.from_env(os.environ))
    admin = create_db_engine(server_url)
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{DATABASE}"'))
    admin.dispose()
    url = make_url(server_url).set(database=DATABASE).render_as_string(hide_password=False)
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pin_orchestration.migrations import "
            "upgrade_database; upgrade_database(sys.argv[1])",
            url,
        ],
        env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return url


def start_api(tree: Path, db_url: str, port: int) -> tuple[subprocess.Popen, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "PIN_DATABASE_URL": db_url,
        "PIN_HOME": tempfile.mkdtemp(prefix="pin-bench-intake-"),
        "PIN_SCRAPING_INTAKE_RPS": "0",
    }
    created = subprocess.run(
        [sys.executable, "-m", "pin_orchestration.cli", "tenant", "create", "bench", "--json"],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    key = json.loads(created.stdout)["api_key"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pin_orchestration.cli", "api", "--port", str(port)],
        env=env,
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, key


def start_echo(port: int, workdir: Path) -> subprocess.Popen:
    (workdir / "bench_echo_app.py").write_text(ECHO_APP)
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import uvicorn; uvicorn.run('bench_echo_app:app', factory=True, "
            f"host='127.0.0.1', port={port}, log_level='warning', access_log=False)",
        ],
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": str(workdir)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def post_all(base: str, key: str, jobs: int, threads: int, tag: str) -> list[float]:
    """`jobs` POST /jobs from `threads` threads, each with its own keep-alive session."""
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(jobs))

    def run() -> None:
        session = requests.Session()
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        mine: list[float] = []
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                break
            body = json.dumps({"url": f"http://127.0.0.1:9/{tag}/{i}"})
            sent = time.perf_counter()
            answer = session.post(f"{base}/jobs", data=body, headers=headers, timeout=60)
            mine.append(time.perf_counter() - sent)
            if answer.status_code != 202:
                raise RuntimeError(f"{answer.status_code}: {answer.text[:300]}")
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if len(latencies) != jobs:
        raise RuntimeError(f"{jobs - len(latencies)} POSTs failed")
    return latencies


def measure(variant: str, tree: Path | None, args: argparse.Namespace) -> dict[str, float]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    workdir = Path(tempfile.mkdtemp(prefix="pin-bench-intake-"))
    if variant == "echo":
        proc, key = start_echo(port, workdir), "none"
    else:
        assert tree is not None
        proc, key = start_api(tree, fresh_database(tree), port)
    try:
        wait_for(f"{base}/healthz", 60)
        post_all(base, key, 200, args.threads, "warm")
        server = psutil.Process(proc.pid)
        cpu_before = sum(server.cpu_times()[:2])
        machine = CpuTimes.now()
        started = time.perf_counter()
        latencies = post_all(base, key, args.jobs, args.threads, "run")
        elapsed = time.perf_counter() - started
        cpu = sum(server.cpu_times()[:2]) - cpu_before
        shares = cpu_shares_since(machine)
    finally:
        stop_process_tree(proc.pid, grace=10)
    latencies.sort()
    return {
        "posts_per_s": args.jobs / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "cpu_s_per_1000": cpu / args.jobs * 1000,
        "machine": shares,  # type: ignore[dict-item]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline-ref", help="also measure `pin api` of this git revision")
    parser.add_argument("--no-echo", action="store_true", help="skip the bare FastAPI echo")
    args = parser.parse_args()

    variants: list[tuple[str, Path | None]] = [("tree", ROOT)]
    baseline_dir: Path | None = None
    if args.baseline_ref:
        baseline_dir = Path(tempfile.mkdtemp(prefix="pin-bench-intake-ref-")) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(baseline_dir), args.baseline_ref],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        variants.append((f"ref {args.baseline_ref}", baseline_dir))
    if not args.no_echo:
        variants.append(("echo", None))
    print(f"POST /jobs, {args.jobs} per round from {args.threads} threads, `pin api` defaults")
    try:
        with no_survivors("bench/scraping_intake.py"):
            for round_ in range(1, args.rounds + 1):
                for name, tree in variants:
                    figures = measure("echo" if name == "echo" else name, tree, args)
                    print(
                        f"round {round_}  {name:<16} {figures['posts_per_s']:7.1f} POST/s  "
                        f"p50 {figures['p50_ms']:6.1f} ms  p99 {figures['p99_ms']:6.1f} ms  "
                        f"API CPU {figures['cpu_s_per_1000']:5.2f} s/1000  "
                        f"({figures['machine']})",
                        flush=True,
                    )
    finally:
        drop_bench_database(DATABASE)
        if baseline_dir is not None:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(baseline_dir)],
                cwd=ROOT,
                check=False,
                capture_output=True,
            )


if __name__ == "__main__":
    # Every folder the run makes (API homes, the baseline's worktree) under one, removed
    # at the end: each run left ~20 pin-bench-intake-* folders in /tmp.
    with tempfile.TemporaryDirectory(prefix="pin-bench-intake-") as scratch:
        tempfile.tempdir = scratch
        try:
            main()
        finally:
            tempfile.tempdir = None
