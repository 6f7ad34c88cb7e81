"""Each job's names, derived from its one identity, are the ones operators rely on: the
Dagster job name (also in definitions_snapshot.json), the job code pin.job_runs, the logs
and `pin locks release` know it by, and the lock key `pin locks list` shows."""

from __future__ import annotations

import pytest

from pin_orchestration.assets.chessboard import DRAIN_JOB
from pin_orchestration.assets.scraping import WORKER_JOB
from pin_orchestration.coordination.job_identity import JobIdentity
from pin_orchestration.coordination.retention import RETENTION_JOB
from pin_orchestration.definitions import build_definitions
from pin_orchestration.jobs.scraping import WEBHOOK_DELIVERY_JOB
from pin_orchestration.news.reconcile import RECONCILE_JOB
from pin_orchestration.news.snapshot_detach.policy import DETACH_JOB
from pin_orchestration.platform.settings import Settings

# The contract, spelled out once more on purpose: a change to the derivation shows here.
NAMES = [
    (
        RECONCILE_JOB,
        "news_comment_reconcile",
        "news-comment-reconcile",
        "Pin:lock:job:scheduled:news-comment-reconcile",
    ),
    (
        DETACH_JOB,
        "news_snapshot_detach_retry",
        "news-snapshot-detach-retry",
        "Pin:lock:job:scheduled:news-snapshot-detach-retry",
    ),
    (RETENTION_JOB, "pin_retention", "pin-retention", "Pin:lock:job:scheduled:pin-retention"),
]
UNRECORDED = [
    (DRAIN_JOB, "chessboard_project_recalc_drain"),
    (WORKER_JOB, "scraping_worker"),
    (WEBHOOK_DELIVERY_JOB, "scraping_webhook_delivery"),
]


@pytest.mark.parametrize(("job", "name", "code", "lock_key"), NAMES)
def test_a_recording_job_keeps_its_three_spellings(
    job: JobIdentity, name: str, code: str, lock_key: str
) -> None:
    assert (job.name, job.code, job.lock_key, job.tags) == (name, code, lock_key, {"pin/job": code})


@pytest.mark.parametrize(("job", "name"), UNRECORDED)
def test_a_drain_job_is_known_by_its_dagster_name(job: JobIdentity, name: str) -> None:
    assert (job.name, job.code, job.tags) == (name, name, {})


def test_every_identity_is_the_one_its_dagster_job_carries() -> None:
    repo = build_definitions(Settings.from_env({})).get_repository_def()
    for job, *_ in NAMES + UNRECORDED:
        assert repo.get_job(job.name).tags.get("pin/job") == job.tags.get("pin/job")
    # The asset job materializes the asset its identity names.
    reconcile = repo.get_job(RECONCILE_JOB.name)
    assert {key.to_user_string() for key in reconcile.asset_layer.executable_asset_keys} == {
        RECONCILE_JOB.asset_key
    }
