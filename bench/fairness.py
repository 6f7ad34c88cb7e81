"""Fairness of the pick under a noisy tenant (issue 15): 10 tenants, one of them ("heavy")
sending 90 % of the jobs, every tenant backlogged from the start; 4 worker processes
claiming through `scraping.claim_jobs` against a loopback target that answers each GET
after `--job-ms`. Three runs on the same workload: the fair pick at weights 1, the fair
pick with one quiet tenant ("q1") at weight 2, and FIFO (bench/fifo_claim.sql, the claim
before issue 9) at weights 1.

    PIN_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python bench/fairness.py [--seconds 20] [--quiet-jobs 45] [--job-ms 500]

The quiet tenants' backlogs are sized to last most of a fair run (each gets ~1/10 of the
starts) so their waits are complete there; under FIFO they mostly are not. The backlog is
accepted in one transaction just before the workers (already running, idle) are told to
go; a wait runs from that commit.

Prints per run:
  - Jain's fairness index of jobs started per tenant in each 10 s window while every
    tenant is still backlogged, against the weighted ideal: x_i = started_i / weight_i,
    J = (sum x)^2 / (n * sum x^2); 1.0 is each tenant getting exactly its weighted share,
    1/n is one tenant getting everything (mean and worst window);
  - each tenant's share of the starts in those windows next to its weighted ideal;
  - each quiet tenant's p50 / p99 wait from accept to its first attempt. A job not started
    when the run ends counts with its wait so far, and a percentile that falls on one is
    printed as ">" that lower bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import math
import multiprocessing
import queue
import random
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._db import fresh_bench_database  # noqa: E402
from bench.fifo_claim import fifo_claim  # noqa: E402
from bench.noisy_neighbour import reset  # noqa: E402
from pin_orchestration.devstack.processes import no_survivors  # noqa: E402
from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget  # noqa: E402
from pin_orchestration.platform.db import create_db_engine  # noqa: E402
from pin_orchestration.platform.defaults import API_URL  # noqa: E402
from pin_orchestration.platform.sql import NamedQueries  # noqa: E402
from pin_orchestration.scraping.fetch.client import Fetcher  # noqa: E402
from pin_orchestration.scraping.policies import (  # noqa: E402
    fetch_policy_from,
    retry_policy_from,
)
from pin_orchestration.scraping.settings import ScrapingSettings  # noqa: E402
from pin_orchestration.scraping.store import tenancy  # noqa: E402
from pin_orchestration.scraping.store.local import (  # noqa: E402
    LocalResultStore,
    load_or_create_signing_key,
)
from pin_orchestration.scraping.worker.options import WorkerOptions  # noqa: E402
from pin_orchestration.scraping.worker.run import claim_due_jobs, run_worker  # noqa: E402

TENANTS = 10
HEAVY_SHARE = 0.9
WORKER_PROCESSES = 4
SLOTS_PER_WORKER = 4
WINDOW_SECONDS = 10.0
HOST = "127.0.0.1"
QUERIES = NamedQueries("bench", "fairness.sql")


def _store(home: Path) -> LocalResultStore:
    return LocalResultStore(
        home / "results",
        public_base_url=API_URL,
        signing_key=load_or_create_signing_key(home / "key"),
    )


def _worker_process(home: str, tasks: Any, done: Any) -> None:
    """A worker process kept for every run (spawning one costs seconds on a loaded
    machine, so the pool starts while the database is made): each task (database URL,
    claim name, seconds) is one worker run; None ends it."""
    settings = dataclasses.replace(
        ScrapingSettings(),
        slots=SLOTS_PER_WORKER,
        fetch_timeout_seconds=60,
        allowed_cidrs=(ipaddress.ip_network(f"{HOST}/32"),),
    )
    fetcher = Fetcher(fetch_policy_from(settings))
    try:
        done.put("ready")
        while (task := tasks.get()) is not None:
            db_url, claim_name, seconds = task
            engine = create_db_engine(db_url)
            try:
                _one_worker_run(engine, home, fetcher, settings, claim_name, seconds)
            finally:
                engine.dispose()
            done.put(claim_name)
    finally:
        fetcher.close()


def _one_worker_run(
    engine: Engine,
    home: str,
    fetcher: Fetcher,
    settings: ScrapingSettings,
    claim_name: str,
    seconds: float,
) -> None:
    claim = fifo_claim if claim_name == "fifo" else claim_due_jobs
    run_worker(
        engine,
        _store(Path(home)),
        fetcher,
        retry_policy_from(settings),
        WorkerOptions(
            slots=SLOTS_PER_WORKER,
            lease_seconds=60,
            idle_exit_seconds=seconds,
            max_run_duration_seconds=seconds,
            poll_seconds=0.05,
            # Politeness out of the way: one target host, this bench is about tenants.
            domain_rps=10_000,
            domain_concurrency=10_000,
        ),
        worker_id=f"fairness-{claim_name}-{uuid.uuid4().hex[:6]}",
        rng=random.Random(1),
        claim=claim,
    )


@dataclasses.dataclass(frozen=True)
class RunFigures:
    windows: list[float]  # Jain's index of each full window while all were backlogged
    shares: dict[str, float]  # of the starts in those windows
    ideal: dict[str, float]
    waits: dict[str, tuple[str, str]]  # quiet tenant -> (p50, p99) as printed
    started: int
    backlogged_seconds: float


def _percentile(waits: list[tuple[float, bool]], q: float) -> str:
    """Nearest-rank percentile of (wait, censored) pairs; a censored one is a lower bound."""
    ordered = sorted(waits)
    value, censored = ordered[max(0, math.ceil(q * len(ordered)) - 1)]
    return f"{'>' if censored else ''}{value:.1f} s"


def jain(xs: list[float]) -> float:
    total = sum(xs)
    squares = sum(x * x for x in xs)
    return total * total / (len(xs) * squares) if squares else 1.0


class WorkerPool:
    """WORKER_PROCESSES spawned processes, all started and ready before the first run."""

    def __init__(self, home: Path) -> None:
        context = multiprocessing.get_context("spawn")
        self.tasks, self.done = context.Queue(), context.Queue()
        self.processes = [
            context.Process(target=_worker_process, args=(str(home), self.tasks, self.done))
            for _ in range(WORKER_PROCESSES)
        ]
        for process in self.processes:
            process.start()

    def ready(self) -> None:
        self._wait_all()

    def run(self, db_url: str, claim_name: str, seconds: float) -> None:
        for _ in self.processes:
            self.tasks.put((db_url, claim_name, seconds))
        self._wait_all()

    def close(self) -> None:
        for _ in self.processes:
            self.tasks.put(None)
        for process in self.processes:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
                process.join()

    def _wait_all(self) -> None:
        for _ in self.processes:
            while True:
                try:
                    self.done.get(timeout=5)
                    break
                except queue.Empty:
                    if not all(p.is_alive() for p in self.processes):
                        codes = [p.exitcode for p in self.processes]
                        raise SystemExit(f"a worker process died: exit codes {codes}") from None


def fresh_tenants(engine: Engine, names: list[str]) -> dict[str, Any]:
    """An empty queue and these tenants only (each run starts from the same state)."""
    reset(engine)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM scraping.tenants"))
    return {name: tenancy.create_tenant(engine, name)[0] for name in names}


def one_run(
    engine: Engine,
    db_url: str,
    pool: WorkerPool,
    target: ScrapingTarget,
    claim_name: str,
    weights: dict[str, float],
    counts: dict[str, int],
    seconds: float,
    job_ms: int,
) -> RunFigures:
    tenants = fresh_tenants(engine, list(counts))
    for name, weight in weights.items():
        if weight != 1:
            tenancy.set_tenant_weight(engine, name, weight)
    names = list(counts)
    # Accepted the moment the (already running) workers are told to go.
    with engine.begin() as conn:
        conn.execute(text("SELECT setseed(0.15)"))
        conn.execute(
            QUERIES("submit_backlog"),
            {
                "tenant_ids": [str(tenants[n].id) for n in names],
                "counts": [counts[n] for n in names],
                # The target's slow pages: every GET answered after job_ms, 1 KB of body.
                "base_url": f"{target.url}/slow",
                "query": f"?ms={job_ms}&bytes=1024",
                "domain": HOST,
            },
        )
    with engine.connect() as conn:
        began = conn.execute(QUERIES("clock")).scalar_one()
    pool.run(db_url, claim_name, seconds)
    with engine.connect() as conn:
        ended = min(conn.execute(QUERIES("clock")).scalar_one(), began + seconds)
        rows = conn.execute(QUERIES("job_starts")).all()
    name_of = {t.id: name for name, t in tenants.items()}
    starts: dict[str, list[float]] = {n: [] for n in names}
    waits: dict[str, list[tuple[float, bool]]] = {n: [] for n in names}
    for row in rows:
        name = name_of[row.tenant_id]
        # Accepted when the backlog's transaction committed: the jobs became visible then.
        accepted = max(row.accepted, began)
        if row.started is not None and row.started <= ended:
            starts[name].append(row.started)
            waits[name].append((row.started - accepted, False))
        else:
            waits[name].append((ended - accepted, True))
    # Backlogged until its last job started (or the end, with jobs still waiting).
    backlog_end = min(
        ended if len(starts[n]) < counts[n] else max(starts[n], default=began) for n in names
    )
    windows: list[float] = []
    in_windows = dict.fromkeys(names, 0)
    k = 0
    while began + (k + 1) * WINDOW_SECONDS <= backlog_end:
        low, high = began + k * WINDOW_SECONDS, began + (k + 1) * WINDOW_SECONDS
        per = {n: sum(low <= s < high for s in starts[n]) for n in names}
        windows.append(jain([per[n] / weights[n] for n in names]))
        for n in names:
            in_windows[n] += per[n]
        k += 1
    total = sum(in_windows.values())
    return RunFigures(
        windows=windows,
        shares={n: in_windows[n] / total if total else 0.0 for n in names},
        ideal={n: weights[n] / sum(weights.values()) for n in names},
        waits={
            n: (_percentile(waits[n], 0.5), _percentile(waits[n], 0.99))
            for n in names
            if n != "heavy"
        },
        started=sum(len(s) for s in starts.values()),
        backlogged_seconds=backlog_end - began,
    )


@dataclasses.dataclass(frozen=True)
class TrickleFigures:
    submitted: int
    started: int
    all_quiet: tuple[str, str]  # p50, p99 over every quiet job
    worst_p99: str  # the worst quiet tenant's p99


def trickle_run(
    engine: Engine,
    db_url: str,
    pool: WorkerPool,
    target: ScrapingTarget,
    claim_name: str,
    heavy_jobs: int,
    quiet: list[str],
    rate: float,
    seconds: float,
    job_seconds: float,
) -> TrickleFigures:
    """The heavy tenant's backlog accepted at once; the quiet tenants' jobs one at a time
    at `rate` jobs/s in all (taking turns) until the run's last job duration."""
    tenants = fresh_tenants(engine, ["heavy", *quiet])
    with engine.begin() as conn:
        conn.execute(text("SELECT setseed(0.15)"))
        conn.execute(
            QUERIES("submit_backlog"),
            {
                "tenant_ids": [str(tenants["heavy"].id)],
                "counts": [heavy_jobs],
                "base_url": f"{target.url}/slow",
                "query": f"?ms={round(job_seconds * 1000)}&bytes=1024",
                "domain": HOST,
            },
        )
    with engine.connect() as conn:
        began = conn.execute(QUERIES("clock")).scalar_one()
    stop = threading.Event()

    def submit_trickle() -> None:
        n = 0
        deadline = time.monotonic()
        while not stop.is_set():
            name = quiet[n % len(quiet)]
            with engine.begin() as conn:
                conn.execute(
                    QUERIES("submit_one"),
                    {
                        "tenant_id": str(tenants[name].id),
                        "url": f"{target.url}/slow?ms={round(job_seconds * 1000)}&q={n}",
                        "domain": HOST,
                    },
                )
            n += 1
            deadline += 1 / rate
            stop.wait(max(0.0, deadline - time.monotonic()))

    submitter = threading.Thread(target=submit_trickle, name="trickle")
    submitter.start()
    # Stop submitting one job duration before the workers stop, so the last quiet jobs
    # had their chance to start; the workers' run is `seconds` long.
    timer = threading.Timer(max(0.0, seconds - 2 * job_seconds), stop.set)
    timer.start()
    try:
        pool.run(db_url, claim_name, seconds)
    finally:
        stop.set()
        timer.cancel()
        submitter.join()
    with engine.connect() as conn:
        ended = min(conn.execute(QUERIES("clock")).scalar_one(), began + seconds)
        rows = conn.execute(QUERIES("job_starts")).all()
    name_of = {t.id: name for name, t in tenants.items()}
    waits: dict[str, list[tuple[float, bool]]] = {n: [] for n in quiet}
    for row in rows:
        name = name_of[row.tenant_id]
        if name == "heavy":
            continue
        if row.started is not None and row.started <= ended:
            waits[name].append((row.started - row.accepted, False))
        else:
            waits[name].append((ended - row.accepted, True))
    every = [w for ws in waits.values() for w in ws]
    worst = max(
        (ws for ws in waits.values() if ws),
        key=lambda ws: sorted(ws)[max(0, math.ceil(0.99 * len(ws)) - 1)],
    )
    return TrickleFigures(
        submitted=len(every),
        started=sum(not censored for _, censored in every),
        all_quiet=(_percentile(every, 0.5), _percentile(every, 0.99)),
        worst_p99=_percentile(worst, 0.99),
    )


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # figures as they come, even into a file
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each run")
    parser.add_argument("--quiet-jobs", type=int, default=45, help="backlog of each quiet tenant")
    parser.add_argument("--job-ms", type=int, default=500, help="the target's answer time")
    parser.add_argument(
        "--trickle-rate", type=float, default=4.0, help="quiet jobs/s in the trickle runs"
    )
    args = parser.parse_args()
    for option in ("seconds", "quiet_jobs", "job_ms", "trickle_rate"):
        if getattr(args, option) <= 0:
            parser.error(f"--{option.replace('_', '-')} must be positive")

    quiet = [f"q{i}" for i in range(1, TENANTS)]
    heavy_jobs = round(args.quiet_jobs * len(quiet) * HEAVY_SHARE / (1 - HEAVY_SHARE))
    tenants = ["heavy", *quiet]
    runs = {
        "fair, weights 1": ("fair", {}),
        "fair, q1 at weight 2": ("fair", {"q1": 2.0}),
        "fifo, weights 1": ("fifo", {}),
    }
    home = Path(tempfile.mkdtemp(prefix="fairness-"))
    _store(home)  # the signing key, made once before the workers read it
    pool = WorkerPool(home)
    try:
        _runs(pool, args, heavy_jobs, tenants, runs)
    finally:
        pool.close()


def _runs(
    pool: WorkerPool,
    args: argparse.Namespace,
    heavy_jobs: int,
    tenants: list[str],
    runs: dict[str, tuple[str, dict[str, float]]],
) -> None:
    db_url = fresh_bench_database("pin_bench_fairness")
    engine = create_db_engine(db_url)
    target = ScrapingTarget(HOST).start()
    print(
        f"{TENANTS} tenants: heavy {heavy_jobs} jobs ({HEAVY_SHARE:.0%}), 9 quiet x "
        f"{args.quiet_jobs}; {WORKER_PROCESSES} worker processes x {SLOTS_PER_WORKER} slots, "
        f"{args.job_ms} ms per job, {args.seconds:g} s per run, windows of {WINDOW_SECONDS:g} s"
    )
    try:
        pool.ready()
        for label, (claim_name, overrides) in runs.items():
            weights = {n: overrides.get(n, 1.0) for n in tenants}
            # A quiet tenant's backlog in proportion to its weight: all last as long.
            counts = {
                n: heavy_jobs if n == "heavy" else round(args.quiet_jobs * weights[n])
                for n in tenants
            }
            started = time.monotonic()
            figures = one_run(
                engine, db_url, pool, target, claim_name, weights, counts, args.seconds, args.job_ms
            )
            print(
                f"\n== {label}: {figures.started} jobs started, all backlogged for "
                f"{figures.backlogged_seconds:.1f} s (run took {time.monotonic() - started:.0f} s)"
            )
            if figures.windows:
                print(
                    f"   Jain's index (weighted), {len(figures.windows)} windows: mean "
                    f"{sum(figures.windows) / len(figures.windows):.3f}, worst "
                    f"{min(figures.windows):.3f} (ideal 1.000)"
                )
            else:
                print("   no full window while all were backlogged (raise --quiet-jobs)")
            print(
                f"   {'tenant':<7} {'weight':>6} {'share':>7} {'ideal':>7} {'wait p50':>10} "
                f"{'wait p99':>10}"
            )
            for name in counts:
                p50, p99 = figures.waits.get(name, ("", ""))
                print(
                    f"   {name:<7} {weights[name]:>6g} {figures.shares[name]:>7.1%} "
                    f"{figures.ideal[name]:>7.1%} {p50:>10} {p99:>10}"
                )
        quiet = [n for n in tenants if n != "heavy"]
        for claim_name in ("fair", "fifo"):
            started = time.monotonic()
            trickle = trickle_run(
                engine,
                db_url,
                pool,
                target,
                claim_name,
                heavy_jobs,
                quiet,
                args.trickle_rate,
                args.seconds,
                args.job_ms / 1000,
            )
            p50, p99 = trickle.all_quiet
            print(
                f"\n== {claim_name}, heavy backlogged, quiet tenants trickling "
                f"{args.trickle_rate:g} jobs/s: {trickle.started} of {trickle.submitted} quiet "
                f"jobs started (run took {time.monotonic() - started:.0f} s)"
            )
            print(
                f"   quiet wait p50 {p50}, p99 {p99}, worst tenant's p99 {trickle.worst_p99} "
                f"(target p99 <= {2 * args.job_ms / 1000:g} s, 2x one job)"
            )
    finally:
        target.stop()
        engine.dispose()


if __name__ == "__main__":
    with no_survivors("bench/fairness.py"):
        main()
