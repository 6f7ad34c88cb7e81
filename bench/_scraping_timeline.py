"""Where a scraping pipeline run's time went, from its database (bench/scraping.py
--timeline, bench/scraping_workers.py --timeline): per worker run, when Dagster created
and started it, its first claim, its claims (picks stamped within a few ms of each other
are one claim), and, per 0.25 s bucket from the first attempt to the last finish, the
slots fetching (claim -> claim + the attempt's duration) and the attempts held (claim ->
its outcome written) of each run. Slots idle between a fetch's end and the next claim,
a run started late, a tail where few jobs run: each shows in these columns."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, text

BUCKET_S = 0.25
# Picks of one claim are stamped clock_timestamp() apart by a pick's work (< 1 ms): a gap
# longer than this starts another claim.
CLAIM_GAP_S = 0.005


def _dagster_runs(engine: Engine) -> dict[str, tuple[float | None, float | None, float | None]]:
    """run id -> (created, started, ended) epoch seconds, when Dagster's storage is here."""
    with engine.connect() as conn:
        exists = conn.execute(text("SELECT to_regclass('public.runs')")).scalar()
        if exists is None:
            return {}
        rows = conn.execute(
            text(
                "SELECT run_id, extract(epoch FROM create_timestamp) AS created, "
                "start_time, end_time FROM runs"
            )
        ).all()
    return {r.run_id: (float(r.created), r.start_time, r.end_time) for r in rows}


def timeline(engine: Engine, slots_per_run: int) -> str:
    with engine.connect() as conn:
        attempts = conn.execute(
            text(
                """
                SELECT a.worker, a.job_id, a.number, a.started_at, a.finished_at,
                       a.duration_ms, a.outcome, a.error_class, j.created_at
                FROM scraping.job_attempts a JOIN scraping.jobs j ON j.id = a.job_id
                ORDER BY a.started_at
                """
            )
        ).all()
    if not attempts:
        return "timeline: no attempts"
    runs = _dagster_runs(engine)
    t0 = min(a.started_at for a in attempts)
    first_accept = min(a.created_at for a in attempts)
    last_accept = max(a.created_at for a in attempts)
    end = max(a.finished_at for a in attempts if a.finished_at is not None)

    def rel(moment: datetime | float | None) -> str:
        if moment is None:
            return "    -"
        if isinstance(moment, float | int):
            return f"{moment - t0.timestamp():6.2f}"
        return f"{(moment - t0).total_seconds():6.2f}"

    lines = [
        f"timeline (s from the first attempt's claim; first accept {rel(first_accept)}, "
        f"last accept {rel(last_accept)}, last finish {rel(end)})"
    ]
    by_worker: dict[str, list[Any]] = defaultdict(list)
    for a in attempts:
        by_worker[a.worker].append(a)
    workers = sorted(by_worker, key=lambda w: by_worker[w][0].started_at)
    for i, worker in enumerate(workers):
        mine = by_worker[worker]
        claims: list[tuple[datetime, int]] = []
        for before, a in zip([None, *mine], mine, strict=False):
            if before is not None and (a.started_at - before.started_at).total_seconds() <= (
                CLAIM_GAP_S
            ):
                claims[-1] = (claims[-1][0], claims[-1][1] + 1)
            else:
                claims.append((a.started_at, 1))
        created, started, ended = runs.get(worker.removeprefix("run-"), (None, None, None))
        finished = [a.finished_at for a in mine if a.finished_at is not None]
        lines.append(
            f"run {i} {worker[:16]}: dagster created {rel(created)} started {rel(started)} "
            f"ended {rel(ended)}; first claim {rel(mine[0].started_at)}, last finish "
            f"{rel(max(finished))}; {len(mine)} attempts in {len(claims)} claims"
        )
        sizes = ", ".join(f"{rel(at).strip()}:{n}" for at, n in claims[:40])
        lines.append(f"  claims (at:size) {sizes}{' …' if len(claims) > 40 else ''}")
    lines.extend(_reuse(by_worker, workers, slots_per_run))
    not_ok: dict[tuple[str, str | None], int] = defaultdict(int)
    for a in attempts:
        if a.outcome != "succeeded":
            not_ok[a.outcome, a.error_class] += 1
    if not_ok:
        lines.append(
            "  attempts not succeeded: "
            + ", ".join(f"{o}/{e}: {n}" for (o, e), n in sorted(not_ok.items(), key=str))
        )
    span = (end - t0).total_seconds()
    buckets = int(span / BUCKET_S) + 1
    fetching = [[0.0] * buckets for _ in workers]
    held = [[0.0] * buckets for _ in workers]

    def add(row: list[float], start: float, stop: float) -> None:
        # slot-seconds of [start, stop) per bucket, as the mean in flight over the bucket
        b = max(int(start / BUCKET_S), 0)
        while b < buckets and b * BUCKET_S < stop:
            lo, hi = max(start, b * BUCKET_S), min(stop, (b + 1) * BUCKET_S)
            if hi > lo:
                row[b] += (hi - lo) / BUCKET_S
            b += 1

    for wi, worker in enumerate(workers):
        for a in by_worker[worker]:
            start = (a.started_at - t0).total_seconds()
            if a.duration_ms is not None:
                add(fetching[wi], start, start + a.duration_ms / 1000)
            if a.finished_at is not None:
                add(held[wi], start, (a.finished_at - t0).total_seconds())
    idle = 0.0
    for wi in range(len(workers)):
        live = [b for b in range(buckets) if held[wi][b] > 0]
        for b in range(live[0], live[-1] + 1) if live else ():
            idle += max(slots_per_run - fetching[wi][b], 0.0) * BUCKET_S
    fetched = sum(sum(row) for row in fetching) * BUCKET_S
    lines.append(
        f"  slot-seconds fetching {fetched:.0f}; idle within each run's life {idle:.0f} "
        f"({slots_per_run} slots a run); whole span {span:.2f} s"
    )
    head = " ".join(f"fetch{i} held{i}" for i in range(len(workers)))
    lines.append(f"     t  {head}  fetching")
    for b in range(buckets):
        cols = " ".join(f"{fetching[w][b]:6.0f} {held[w][b]:5.0f}" for w in range(len(workers)))
        total = sum(fetching[w][b] for w in range(len(workers)))
        lines.append(f"{b * BUCKET_S:6.2f}  {cols}  {total:6.0f}")
    return "\n".join(lines)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def _reuse(by_worker: dict[str, list[Any]], workers: list[str], slots: int) -> list[str]:
    """Per run: how long its attempts took (the first wave, which waits for robots.txt and
    then a turn, and the rest), and how long a slot stood idle between a fetch's end and
    the claim that filled it again (the k-th claim after the first `slots` takes the slot
    the k-th fetch to end freed)."""
    lines = []
    for i, worker in enumerate(workers):
        mine = by_worker[worker]
        starts = [a.started_at.timestamp() for a in mine]
        ends = sorted(
            a.started_at.timestamp() + a.duration_ms / 1000
            for a in mine
            if a.duration_ms is not None
        )
        first = [a.duration_ms / 1000 for a in mine[:slots] if a.duration_ms is not None]
        rest = [a.duration_ms / 1000 for a in mine[slots:] if a.duration_ms is not None]
        gaps = [c - e for c, e in zip(starts[slots:], ends, strict=False)]
        written = [
            (a.finished_at.timestamp() - a.started_at.timestamp() - a.duration_ms / 1000)
            for a in mine
            if a.duration_ms is not None and a.finished_at is not None
        ]
        lines.append(
            f"  run {i}: attempt s, first {len(first)} p50 {_pct(first, 0.5):.2f} p95 "
            f"{_pct(first, 0.95):.2f} max {max(first, default=0):.2f}; rest p50 "
            f"{_pct(rest, 0.5):.2f} p95 {_pct(rest, 0.95):.2f} max {max(rest, default=0):.2f}"
            f"; fetch end -> slot claimed again s p50 {_pct(gaps, 0.5):.3f} p90 "
            f"{_pct(gaps, 0.9):.3f} max {max(gaps, default=0):.3f} (sum {sum(gaps):.0f} "
            f"slot-s); fetch end -> outcome written p50 {_pct(written, 0.5):.3f} p90 "
            f"{_pct(written, 0.9):.3f}"
        )
    return lines
