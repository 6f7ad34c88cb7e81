"""FullSweep reconcile vs one set-based UPDATE … FROM (grouped count), on the same data.

    PIN_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python bench/reconcile.py [--posts 1000000] [--comments 5000000]

Builds the data in its own database (pin_bench_reconcile), then alternates the two
contenders, re-injecting the same drift (1 % of posts) before each, and prints both
timings and their ratio. Target: FullSweep ≤ 1.2× the single statement.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import Engine, create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from bench._db import fresh_bench_database  # noqa: E402
from pin_orchestration.migrations import upgrade_database  # noqa: E402
from pin_orchestration.news.reconcile import (  # noqa: E402
    ReconcileOptions,
    Scope,
    run_reconcile,
)
from pin_orchestration.platform.db import resolve_database_url  # noqa: E402
from pin_orchestration.platform.settings import Settings  # noqa: E402

UUID7 = """
CREATE FUNCTION pg_temp.uuid7(ts timestamptz) RETURNS uuid LANGUAGE sql AS $$
  SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
         PLACING substring(int8send(floor(extract(epoch FROM ts) * 1000)::bigint) FROM 3)
         FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$
"""

SINGLE_STATEMENT = """
UPDATE news.posts AS p
SET comments_count = coalesce(c.visible_count, 0), updated_at = now()
FROM news.posts AS p2
LEFT JOIN (
    SELECT post_id, count(*) AS visible_count FROM news.comments
    WHERE status = 'Visible' GROUP BY post_id
) AS c ON c.post_id = p2.id
WHERE p.id = p2.id AND p2.status <> 'Archived'
  AND p2.comments_count <> coalesce(c.visible_count, 0)
"""


DATABASE = "pin_bench_reconcile"


def reusable_bench_database(posts: int, comments: int) -> str | None:
    """The URL of an earlier run's data when it has the asked-for size."""
    server = resolve_database_url(Settings.from_env())
    url = make_url(server).set(database=DATABASE).render_as_string(hide_password=False)
    try:
        engine = create_engine(url)
        with engine.connect() as conn:
            sizes = conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM news.posts), (SELECT count(*) FROM news.comments)"
                )
            ).one()
        engine.dispose()
    except Exception:  # noqa: BLE001 — no such database yet
        return None
    if tuple(sizes) != (posts, comments):
        return None
    upgrade_database(url)  # data built by an older revision gets the current schema
    return url


def build(engine: Engine, posts: int, comments: int) -> None:
    with engine.begin() as conn:
        conn.execute(text(UUID7))
        conn.execute(
            text(
                """
                INSERT INTO news.posts (id, status, comments_count, created_at, updated_at)
                SELECT pg_temp.uuid7(ts),
                       CASE WHEN g % 50 = 0 THEN 'Archived' ELSE 'Published' END, 0, ts, ts
                FROM generate_series(1, :n) AS g,
                     LATERAL (SELECT timestamptz '2025-01-01' + g * interval '20 seconds') AS t(ts)
                """
            ),
            {"n": posts},
        )
        conn.execute(
            text(
                "CREATE TEMP TABLE bench_posts AS "
                "SELECT row_number() OVER (ORDER BY id) AS n, id, created_at FROM news.posts"
            )
        )
        conn.execute(text("CREATE UNIQUE INDEX ON bench_posts (n)"))
        conn.execute(
            text(
                """
                INSERT INTO news.comments (id, post_id, status, created_at, updated_at)
                SELECT pg_temp.uuid7(b.created_at + g * interval '1 millisecond'), b.id,
                       CASE WHEN g % 20 = 0 THEN 'HiddenByModerator'
                            WHEN g % 13 = 0 THEN 'DeletedByAuthor' ELSE 'Visible' END,
                       b.created_at, b.created_at
                FROM generate_series(1, :n) AS g
                JOIN bench_posts AS b ON b.n = 1 + (hashint4(g) & 2147483647) % :posts
                """
            ),
            {"n": comments, "posts": posts},
        )
        conn.execute(text(SINGLE_STATEMENT))  # start from correct counters


def inject_drift(engine: Engine) -> int:
    with engine.begin() as conn:
        drifted = conn.execute(
            text(
                "UPDATE news.posts SET comments_count = comments_count + 1 "
                "WHERE status <> 'Archived' "
                "AND ('x' || substr(id::text, 35, 2))::bit(8)::int % 100 = 7"
            )
        ).rowcount
        conn.execute(text("DELETE FROM pin.job_checkpoints"))
        conn.execute(text("DELETE FROM pin.job_runs"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE news.posts"))
        conn.execute(text("CHECKPOINT"))
    return drifted


def time_full_sweep(engine: Engine, batch_size: int) -> tuple[float, int]:
    options = ReconcileOptions(
        scope=Scope.FULL_SWEEP,
        batch_size=batch_size,
        max_run_duration_seconds=3600,
        lock_ttl_seconds=7200,
    )
    start = time.perf_counter()
    result = run_reconcile(engine, options, run_id="bench", holder="bench")
    elapsed = time.perf_counter() - start
    assert not result.backlog_remaining, "FullSweep stopped early"
    return elapsed, result.drift_corrected


def time_single_statement(engine: Engine) -> tuple[float, int]:
    start = time.perf_counter()
    with engine.begin() as conn:
        corrected = conn.execute(text(SINGLE_STATEMENT)).rowcount
    return time.perf_counter() - start, corrected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--posts", type=int, default=1_000_000)
    parser.add_argument("--comments", type=int, default=5_000_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--reuse", action="store_true", help="keep the data of an earlier run if it matches"
    )
    args = parser.parse_args()

    url = reusable_bench_database(args.posts, args.comments) if args.reuse else None
    if url is None:
        url = fresh_bench_database(DATABASE)
        engine = create_engine(url)
        t0 = time.perf_counter()
        build(engine, args.posts, args.comments)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
        print(
            f"built {args.posts:,} posts, {args.comments:,} comments "
            f"in {time.perf_counter() - t0:.1f}s"
        )
    engine = create_engine(url)

    sweeps: list[float] = []
    singles: list[float] = []
    for round_no in range(1, args.rounds + 1):
        drifted = inject_drift(engine)
        sweep, sweep_fixed = time_full_sweep(engine, args.batch_size)
        inject_drift(engine)
        single, single_fixed = time_single_statement(engine)
        assert sweep_fixed == single_fixed == drifted, (sweep_fixed, single_fixed, drifted)
        sweeps.append(sweep)
        singles.append(single)
        print(
            f"round {round_no}: drifted={drifted:,} FullSweep={sweep:.2f}s "
            f"single UPDATE={single:.2f}s ratio={sweep / single:.2f}"
        )
    sweep_m, single_m = statistics.median(sweeps), statistics.median(singles)
    print(
        f"median: FullSweep (batch {args.batch_size}) {sweep_m:.2f}s, "
        f"single statement {single_m:.2f}s, ratio {sweep_m / single_m:.2f} (target <= 1.20)"
    )


if __name__ == "__main__":
    main()
