"""A client generated from our /openapi.json by `openapi-python-client` drives the API over
real HTTP: submit → poll → result → download → cancel → attempts → batch. What the
generator warns about, or the generated client cannot parse, is a bug of our schema."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import uvicorn
from fastapi import FastAPI

from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.scraping.store.tenancy import Tenant
from tests.scraping.conftest import free_loopback_port

PACKAGE = "pin_generated_client"


@pytest.fixture
def generated(api_app: FastAPI, tmp_path: Path) -> Iterator[Callable[[str], ModuleType]]:
    """The client package generated from the app's schema, importable for this test."""
    spec = tmp_path / "openapi.json"
    spec.write_text(json.dumps(api_app.openapi()))
    config = tmp_path / "config.json"
    # No formatter hooks: the generated code is imported, not read.
    config.write_text(json.dumps({"package_name_override": PACKAGE, "post_hooks": []}))
    generator = Path(sys.executable).with_name("openapi-python-client")
    run = subprocess.run(
        [
            generator,
            "generate",
            "--path",
            spec,
            "--output-path",
            tmp_path / PACKAGE,
            "--meta",
            "none",
            "--config",
            config,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "warning" not in output.lower(), f"the generator tripped on our schema:\n{output}"
    sys.path.insert(0, str(tmp_path))
    try:
        yield lambda name: importlib.import_module(f"{PACKAGE}.{name}")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


@pytest.fixture
def served(api_app: FastAPI) -> Iterator[str]:
    """The app behind uvicorn on a loopback port, in this process (shares the test's
    database and results store)."""
    port = free_loopback_port()
    server = uvicorn.Server(
        uvicorn.Config(api_app, host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    started = threading.Event()
    while not server.started and thread.is_alive():
        started.wait(0.01)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_a_generated_client_drives_the_whole_job_lifecycle(
    generated: Callable[[str], ModuleType],
    served: str,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    site: ScrapingTarget,
    work: Any,
) -> None:
    client_module = generated("client")
    models = generated("models")
    submit = generated("api.default.submit_jobs_post")
    read_job = generated("api.default.read_job_jobs_job_id_get")
    result_link = generated("api.default.result_link_jobs_job_id_result_get")
    download = generated("api.results.download_result_results_path_get")
    cancel = generated("api.default.cancel_jobs_job_id_cancel_post")
    attempts = generated("api.default.attempts_jobs_job_id_attempts_get")
    batch = generated("api.default.submit_batch_jobs_batch_post")
    _, key = make_tenant("generated")
    client = client_module.AuthenticatedClient(
        base_url=served, token=key, raise_on_unexpected_status=True
    )

    # submit → poll
    receipt = submit.sync(
        client=client,
        body=models.JobCreate(url=f"{site.url}/page/hello", priority=models.JobCreatePriority.HIGH),
        idempotency_key="generated-1",
    )
    assert isinstance(receipt, models.Receipt), receipt
    assert isinstance(receipt.id, uuid.UUID) and receipt.links.self_ == f"/jobs/{receipt.id}"
    job = read_job.sync(receipt.id, client=client)
    assert isinstance(job, models.JobView) and job.status == models.JobViewStatus.QUEUED
    # why it waits, typed: its host's robots.txt is not known yet
    assert isinstance(job.wait, models.WaitView), job.wait
    assert job.wait.reason == models.WaitViewReason.ROBOTS_PENDING
    assert isinstance(job.wait.as_of, datetime) and job.wait.message
    work()
    job = read_job.sync(receipt.id, client=client)
    assert job.status == models.JobViewStatus.SUCCEEDED and job.result.size > 0
    assert job.wait is None
    # Typed as the schema says: times are datetimes, not strings.
    assert isinstance(job.finished_at, datetime) and job.finished_at >= job.created_at

    # result → download (the signed link's key and query, through the generated call)
    link = result_link.sync(receipt.id, client=client)
    assert isinstance(link, models.ResultLink), link
    parts = urlsplit(link.url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    key_path = parts.path.removeprefix("/results/")
    downloaded = download.sync_detailed(
        key_path, client=client, expires=int(query["expires"]), signature=query["signature"]
    )
    assert downloaded.status_code == 200
    assert len(downloaded.content) == job.result.size
    refused = download.sync_detailed(key_path, client=client, expires=1, signature="0" * 64)
    assert refused.status_code == 403 and refused.parsed is not None

    # cancel: a queued job now, a finished one is 409 (a parsed error, not an exception)
    queued = submit.sync(client=client, body=models.JobCreate(url=f"{site.url}/page/later"))
    answer = cancel.sync(queued.id, client=client)
    assert isinstance(answer, models.CancelAnswer) and answer.status == "cancelled"
    again = cancel.sync_detailed(queued.id, client=client)
    assert again.status_code == 409 and again.parsed is not None

    # attempts
    listed = attempts.sync(receipt.id, client=client)
    assert isinstance(listed, models.AttemptList)
    assert [a.outcome for a in listed.items] == ["succeeded"]
    assert listed.items[0].http_status == 200

    # batch: a receipt per accepted job, a problem pointing into the request per refused one
    answer = batch.sync(
        client=client,
        body=models.BatchCreate(
            jobs=[
                models.BatchJob(url=f"{site.url}/page/b0", idempotency_key="b0"),
                models.BatchJob(url="http://127.0.0.1:0/refused"),
                models.BatchJob(url=f"{site.url}/page/b2"),
            ]
        ),
    )
    assert isinstance(answer, models.BatchAnswer), answer
    assert (answer.accepted, answer.refused) == (2, 1)
    assert [item.status for item in answer.items] == [202, 422, 202]
    assert isinstance(answer.items[0].receipt, models.Receipt)
    assert answer.items[1].problem.errors[0].pointer == "/jobs/1/url"
    assert read_job.sync(answer.items[2].receipt.id, client=client).status == "queued"

    # a 404 and a 422 come back as documented, parsed models
    missing = read_job.sync_detailed(uuid.uuid4(), client=client)
    assert missing.status_code == 404 and missing.parsed is not None
    invalid = submit.sync_detailed(client=client, body=models.JobCreate(url="http://127.0.0.1:0/x"))
    assert invalid.status_code == 422 and invalid.parsed is not None
