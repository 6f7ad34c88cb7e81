"""The reconcile's history invariant (tests/news_reconcile/test_history.py) at length: any
seed, as many generated histories as asked, shrunk to a minimal one on failure.

    PIN_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python bench/reconcile_history.py --seed 7 --examples 50

Runs in its own database (pin_bench_reconcile_history, dropped at the end); prints the
histories run and the time they took, or the falsifying history.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402

from bench._db import drop_bench_database, fresh_bench_database  # noqa: E402
from bench.models.reconcile_history import HISTORY, Step, World, check_history  # noqa: E402

DATABASE = "pin_bench_reconcile_history"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis seed")
    parser.add_argument("--examples", type=int, default=20, help="histories to generate")
    args = parser.parse_args()
    url = fresh_bench_database(DATABASE)
    engine = create_engine(url)
    world = World(engine, url)
    ran: list[int] = []

    @seed(args.seed)
    @settings(
        max_examples=args.examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(steps=HISTORY)
    def history(steps: list[Step]) -> None:
        ran.append(len(steps))
        check_history(world, steps)

    started = time.monotonic()
    try:
        history()
    finally:
        engine.dispose()
        drop_bench_database(DATABASE)
    elapsed = time.monotonic() - started
    print(
        f"seed {args.seed}: {len(ran)} histories ({sum(ran)} steps) held the invariant "
        f"in {elapsed:.1f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
