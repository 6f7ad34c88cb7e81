"""Runbook "drop a stuck lock" from the Dagster UI: pin_release_lock with the lock key."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance
from sqlalchemy import Engine

from pin_orchestration.coordination.locks import list_locks, try_acquire_lock
from pin_orchestration.definitions import build_definitions


def release(lock_key: str):
    return (
        build_definitions()
        .resolve_job_def("pin_release_lock")
        .execute_in_process(
            run_config={"ops": {"release_lock": {"config": {"lock_key": lock_key}}}},
            instance=DagsterInstance.ephemeral(),
            raise_on_error=False,
        )
    )


def test_release_job_drops_the_named_lock_and_refuses_an_unknown_one(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIN_DATABASE_URL", db_url)
    assert try_acquire_lock(db_engine, "news-comment-reconcile", 600, "stuck-pod")
    assert try_acquire_lock(db_engine, "other", 600, "busy-pod")
    assert release("news-comment-reconcile").success
    assert [lock.lock_key for lock in list_locks(db_engine)] == ["other"]
    unknown = release("no-such-lock")
    assert not unknown.success
    (failure,) = [e for e in unknown.all_events if e.is_step_failure]
    assert "no lock 'no-such-lock'" in str(failure.step_failure_data.error.message)
