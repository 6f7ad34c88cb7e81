"""The API fuzzed from its own OpenAPI schema (schemathesis): whatever the generated
request, no 5xx, every answer is one the schema documents (status, headers, body), and
every error is an RFC 9457 problem document whose 422s point at the fields.

The app is built at import (schemathesis parametrizes from its schema at collection);
each test binds it to that test's fresh database. (`schemathesis.pytest.from_fixture`
does not work with pytest 9.2: it reads a node attribute pytest removed.)
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from sqlalchemy import Engine

from pin_orchestration.scraping.api.app import create_app
from pin_orchestration.scraping.store.local import LocalResultStore
from tests.scraping.conftest import TEST_SETTINGS, auth


@schemathesis.check
def problem_details(ctx, response, case):  # type: ignore[no-untyped-def]
    """Every error answer is application/problem+json with type, title, status and detail
    (status the answer's own); a 422 lists the wrong fields, each pointing at one."""
    if response.status_code < 400:
        return None
    [content_type] = response.headers.get("content-type", ["(none)"])
    assert content_type == "application/problem+json", f"an error as {content_type}"
    problem = response.json()
    for member, kind in (("type", str), ("title", str), ("status", int), ("detail", str)):
        assert isinstance(problem.get(member), kind), f"problem without a {kind.__name__} {member}"
    assert problem["status"] == response.status_code, "the problem's status is not the answer's"
    if response.status_code == 422:
        assert problem.get("errors"), "a 422 without errors"
        for error in problem["errors"]:
            assert isinstance(error.get("detail"), str), f"an error entry without detail: {error}"
            assert "pointer" in error or "parameter" in error, f"{error} points at no field"
    return None


_bound: list[Engine] = []
_store_dir = Path(tempfile.mkdtemp(prefix="pin-fuzz-store-"))
# Removed by every process that imports this module: each xdist worker collects it (and
# makes a directory), but only the one running its tests saw a module fixture's teardown.
atexit.register(shutil.rmtree, _store_dir, ignore_errors=True)
app = create_app(
    lambda: _bound[0],
    LocalResultStore(
        _store_dir / "results", public_base_url="http://testserver", signing_key=b"k" * 32
    ),
    TEST_SETTINGS,
)
# Every other built-in check runs (no 5xx, documented status, headers and body, auth
# enforced, Allow headers). Two cannot hold by design: "schema-valid data is accepted" (a
# URL's host and port and the 16 KiB JSON size of params are checked beyond what JSON
# Schema expresses; those 422s name the field) and "schema-violating data is rejected" (an
# unknown query parameter is ignored, as HTTP APIs commonly do, and a negative case that
# drops the Authorization header gets ours back).
schema = schemathesis.openapi.from_asgi(
    "/openapi.json",
    app,
    config=SchemathesisConfig.from_dict(
        {
            "checks": {
                "positive_data_acceptance": {"enabled": False},
                "negative_data_rejection": {"enabled": False},
            }
        }
    ),
)


@pytest.fixture
def bound_database(db_engine: Engine) -> Iterator[None]:
    _bound[:] = [db_engine]
    yield
    _bound.clear()


@pytest.fixture
def tenant_key(bound_database: None, make_tenant) -> str:  # type: ignore[no-untyped-def]
    return make_tenant("fuzz")[1]


@schema.parametrize()
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_api_answers_only_what_it_documents(case, tenant_key: str) -> None:  # type: ignore[no-untyped-def]
    case.call_and_validate(headers=auth(tenant_key))


def test_stateful_runs_follow_the_links_from_post_to_get_cancel_and_attempts(
    tenant_key: str,
) -> None:
    """Schemathesis's stateful run: sequences of calls chained by the schema's OpenAPI
    links (POST /jobs → GET /jobs/{id} → POST …/cancel → GET …/attempts, …), every answer
    validated as above. The run must really have gone down the chain: each linked call
    found the job the previous answer named."""
    from collections import Counter

    followed: Counter[str] = Counter()
    seen: Counter = Counter()

    class Machine(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            # Every scenario starts from the same state (no jobs, a full intake bucket):
            # hypothesis replays scenarios and needs the same answers to the same calls.
            from sqlalchemy import text

            with _bound[0].begin() as conn:
                conn.execute(text("TRUNCATE scraping.jobs, scraping.intake_buckets CASCADE"))

        def get_call_kwargs(self, case):  # type: ignore[no-untyped-def]
            return {"headers": auth(tenant_key)}

        def before_call(self, case):  # type: ignore[no-untyped-def]
            # What the schema says of a URL (a string) almost never makes one the API
            # accepts (a host it can fetch): whether any job was accepted, hence any link
            # followed, was the generator's luck (the same seed found none after the
            # package moved). A POST /jobs names a real URL; its other fields, the
            # linked calls and the fuzzing of single calls above stay generated.
            super().before_call(case)
            if (
                case.method.upper() == "POST"
                and case.path == "/jobs"
                and isinstance(case.body, dict)
            ):
                case.body["url"] = "https://fuzz.example/page"

        def after_call(self, response, case):  # type: ignore[no-untyped-def]
            super().after_call(response, case)
            seen[(case.method.upper(), case.path, response.status_code)] += 1
            if "job_id" in (case.path_parameters or {}) and response.status_code in (200, 409):
                followed[f"{case.method.upper()} {case.path}"] += 1

    Machine.run(
        settings=settings(
            max_examples=80,
            stateful_step_count=6,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            # The same scenarios every run: which links a random run takes is chance, and
            # a third of random seeds followed none in 80 scenarios (15 jobs accepted, no
            # linked call after them) — CI failed on one. The fuzzing of single calls
            # above stays random.
            derandomize=True,
        )
    )
    # A random id would be 404: these found the job a previous answer linked to.
    assert len(followed) >= 2, seen
    # and the schema links POST /jobs to each of the chain's operations
    links = app.openapi()["paths"]["/jobs"]["post"]["responses"]["202"]["links"]
    assert {"GetJob", "CancelJob", "GetAttempts"} <= set(links)
    cancel_links = app.openapi()["paths"]["/jobs/{job_id}/cancel"]["post"]["responses"]["200"]
    assert {"GetJob", "GetAttempts"} <= set(cancel_links["links"])


def test_every_operation_is_fuzzed_as_a_test_of_its_own() -> None:
    """xdist schedules tests by node id: when schemathesis's items for the nine operations
    shared one (pytest 9.2 builds it from `originalname`), only the first was ever run.
    Collected as a run of the suite collects them."""
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", __file__],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    name = test_api_answers_only_what_it_documents.__name__
    fuzzed = [line for line in collected.stdout.splitlines() if f"::{name}" in line]
    operations = [result.ok().label for result in schema.get_all_operations()]
    assert len(operations) > 1
    assert sorted(fuzzed) == sorted(
        f"tests/scraping/test_api_fuzz.py::{name}[{op}]" for op in operations
    ), collected.stdout + collected.stderr
