"""Detach takes every due time from PostgreSQL's now() (issue 20, item 2): a worker whose
wall clock is off — 10 min behind, an hour ahead — claims what the database sees due and
parks a failed row a backoff after the database's now, not after its own."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from faults.scenarios.detach import skew_wall_clock
from tests.news_snapshot_detach.test_snapshot_detach import Selections, enqueue, row, run


def db_now(engine: Engine) -> datetime:
    with engine.connect() as conn:
        return conn.execute(text("SELECT now()")).scalar_one()


def test_a_worker_behind_the_database_claims_what_is_due(
    db_engine: Engine, selections: Selections, monkeypatch: pytest.MonkeyPatch
) -> None:
    [snapshot] = enqueue(db_engine)
    skew_wall_clock(lambda: -600.0, monkeypatch.setattr)

    result = run(db_engine, selections)

    assert (result.claimed, result.succeeded) == (1, 1)
    assert row(db_engine, snapshot).status == "Done"


def test_a_worker_ahead_parks_a_failure_a_backoff_after_the_database_now(
    db_engine: Engine, selections: Selections, monkeypatch: pytest.MonkeyPatch
) -> None:
    [snapshot] = enqueue(db_engine)
    selections.status = 503
    skew_wall_clock(lambda: 3600.0, monkeypatch.setattr)
    before = db_now(db_engine)

    assert run(db_engine, selections).retried == 1

    entry = row(db_engine, snapshot)
    assert before + timedelta(seconds=60) <= entry.next_attempt_at
    assert entry.next_attempt_at <= db_now(db_engine) + timedelta(seconds=60)
    assert before <= entry.updated_at <= db_now(db_engine)
    # An hour ahead, the run still sees the row in its backoff: nothing is claimed.
    assert run(db_engine, selections).claimed == 0
    assert len(selections.calls) == 1
