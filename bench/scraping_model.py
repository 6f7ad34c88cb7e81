"""The scraping model (bench/models/scraping.py) run long: one seeded history of --steps
steps per example, --examples examples, against a database of its own (dropped after).
The suite runs a few hundred steps (tests/scraping/test_state_machine.py); this is for
hunting.

    PIN_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/scraping_model.py --seed 7 --steps 400 [--examples 5]
            [--database pin_model] [--skip-fairness]

A broken promise prints Hypothesis's shrunk history (the steps that break it) and exits 1.
The same --seed replays the same histories.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import run_state_machine_as_test

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._db import drop_bench_database, fresh_bench_database  # noqa: E402
from bench.models.scraping import machine_for  # noqa: E402
from pin_orchestration.platform.db import create_db_engine  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=400, help="steps per example")
    parser.add_argument("--examples", type=int, default=3)
    parser.add_argument("--database", default="pin_model")
    parser.add_argument(
        "--skip-fairness",
        action="store_true",
        help="leave out the fairness check (by jobs started, issue 30 item 7, closed by"
        " migration 0039) to hunt the other promises only",
    )
    args = parser.parse_args()
    url = fresh_bench_database(args.database)
    engine = create_db_engine(url)
    workers = {name: create_db_engine(url) for name in ("w1", "w2")}
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pin-model-") as folder:
        machine = machine_for(engine, workers, Path(folder) / "results")
        seed(args.seed)(machine)
        machine.check_fairness = not args.skip_fairness
        try:
            run_state_machine_as_test(
                machine,
                settings=settings(
                    max_examples=args.examples,
                    stateful_step_count=args.steps,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                ),
            )
        except AssertionError as exc:
            print(f"seed {args.seed}: a promise broken: {exc}", file=sys.stderr)
            return 1
        finally:
            for e in (engine, *workers.values()):
                e.dispose()
            drop_bench_database(args.database)
    took = time.monotonic() - began
    print(
        f"seed {args.seed}, {args.examples} example(s) of up to {args.steps} steps: "
        f"every promise kept ({took:.0f} s)"
    )
    for what, n in sorted(machine.stats.items()):
        print(f"  {what}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
