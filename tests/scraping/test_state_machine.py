"""The scraping service's promises checked by a model, not by cases (issue 30): the
state machine of bench/models/scraping.py interleaves intake, two workers' claims (alone and
at once), outcomes, sweeps, cancels, requeues, pauses, weight changes and clock steps
against real PostgreSQL, checking every invariant after every step. Seeded here (a few
hundred steps); `python bench/scraping_model.py --seed N --steps M` runs it longer."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from sqlalchemy import Engine, event

from bench.models.scraping import machine_for
from pin_orchestration.platform.db import create_db_engine


def _statement_timeout(dbapi_connection: object, _record: object) -> None:
    with dbapi_connection.cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute("SET statement_timeout = '20s'")
    dbapi_connection.commit()  # type: ignore[attr-defined]


def _run(db_url: str, db_engine: Engine, store: Path) -> None:
    workers = {name: create_db_engine(db_url) for name in ("w1", "w2")}
    for engine in (db_engine, *workers.values()):
        # A claim that never ends (a loop in the pick) fails the step instead of the run.
        event.listen(engine, "connect", _statement_timeout)
    try:
        machine = machine_for(db_engine, workers, store)
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=10,
                stateful_step_count=30,
                derandomize=True,
                deadline=None,
                database=None,
                # No shrinking here: each replay costs real transactions, so a failure is
                # reported as generated (bench/scraping_model.py shrinks it).
                phases=[Phase.explicit, Phase.reuse, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            ),
        )
    finally:
        for engine in workers.values():
            engine.dispose()


def test_the_scraping_model_keeps_every_promise(
    db_url: str, db_engine: Engine, tmp_path: Path
) -> None:
    """Every invariant, fairness by jobs started among them."""
    _run(db_url, db_engine, tmp_path / "results")
