"""RFC 9457: every error the API answers is a problem document (type, title, status,
detail; a 422's errors point at the fields), errors raised outside the routes too (the
size limits, unknown paths, wrong methods, unexpected failures), and the OpenAPI document
says so for every error status of every operation."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from pin_orchestration.scraping.api.app import create_app
from pin_orchestration.scraping.api.limits import MAX_BODY_BYTES, MAX_HEADER_BYTES
from pin_orchestration.scraping.store.local import LocalResultStore
from tests.scraping.conftest import TEST_SETTINGS, auth


def problem_of(answer: Any, status: int) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    problem = answer.json()
    assert {"type", "title", "status", "detail"} <= set(problem), problem
    assert problem["status"] == status
    return problem


def test_errors_outside_the_routes_are_problems(client: TestClient, make_tenant) -> None:
    _, key = make_tenant("shop")
    problem = problem_of(client.get("/jobs"), 401)
    assert problem["type"] == "about:blank" and problem["title"] == "Unauthorized"
    problem_of(client.get("/no-such-path", headers=auth(key)), 404)
    problem_of(client.delete("/jobs", headers=auth(key)), 405)
    big = problem_of(
        client.post("/jobs", content=b"x" * (MAX_BODY_BYTES + 1), headers=auth(key)), 413
    )
    assert str(MAX_BODY_BYTES) in big["detail"]
    many = problem_of(
        client.get("/jobs", headers={**auth(key), "X-Pad": "p" * MAX_HEADER_BYTES}), 431
    )
    assert str(MAX_HEADER_BYTES) in many["detail"]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/jobs", "GET, POST"),
        ("PUT", "/jobs/00000000-0000-0000-0000-000000000000", "GET"),
        ("GET", "/jobs/00000000-0000-0000-0000-000000000000/cancel", "POST"),
        ("POST", "/jobs/00000000-0000-0000-0000-000000000000/attempts", "GET"),
        ("GET", "/jobs/batch", "POST"),
        ("DELETE", "/jobs/batch", "POST"),
        # Matched by no route in full: the path's own routes, not /jobs/{job_id}'s.
        ("OPTIONS", "/jobs/batch", "POST"),
        ("OPTIONS", "/jobs", "GET, POST"),
        ("POST", "/healthz", "GET"),
        ("POST", "/results/anything", "GET"),
    ],
)
def test_a_405_lists_the_methods_the_path_allows(
    client: TestClient, method: str, path: str, allowed: str
) -> None:
    """RFC 9110 §15.5.6: a 405 carries Allow with every method the path serves, also when
    several routes serve it (GET and POST /jobs) or the route sits in an included router."""
    answer = client.request(method, path)
    problem_of(answer, 405)
    assert answer.headers["allow"] == allowed


def test_a_422_points_into_the_body_and_at_parameters(client: TestClient, make_tenant) -> None:
    _, key = make_tenant("shop")
    problem = problem_of(
        client.post(
            "/jobs",
            content=b'{"url": "ftp://example.com/", "priority": "soon"}',
            headers={**auth(key), "Content-Type": "application/json"},
        ),
        422,
    )
    assert {e["pointer"] for e in problem["errors"]} == {"/url", "/priority"}
    assert all(e["detail"] for e in problem["errors"])
    assert "/url" in problem["detail"] and problem["instance"] == "/jobs"
    query = problem_of(client.get("/jobs?limit=0", headers=auth(key)), 422)
    assert query["errors"] == [
        {"detail": query["errors"][0]["detail"], "parameter": "limit", "in": "query"}
    ]


def test_an_unexpected_failure_is_a_500_problem_that_tells_nothing(
    db_engine: Engine, local_store: LocalResultStore, make_tenant
) -> None:
    _, key = make_tenant("shop")

    def broken_engine() -> Engine:
        raise RuntimeError("secret internals")

    app = create_app(broken_engine, local_store, TEST_SETTINGS, api_key_cache_seconds=0)
    with TestClient(app, raise_server_exceptions=False) as client:
        problem = problem_of(client.get("/jobs", headers=auth(key)), 500)
    assert "secret" not in problem["detail"]


def test_openapi_documents_every_error_status_as_a_problem(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    assert {"type", "title", "status", "detail"} <= set(schemas["Problem"]["properties"])
    assert "errors" in schemas["ValidationProblem"]["required"]
    assert "HTTPValidationError" not in schemas
    seen = 0
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                if status[0] not in "45":
                    continue
                seen += 1
                [(media_type, content)] = response["content"].items()
                assert media_type == "application/problem+json", (method, path, status)
                name = content["schema"]["$ref"].rsplit("/", 1)[1]
                assert {"type", "title", "status", "detail"} <= set(schemas[name]["properties"]), (
                    method,
                    path,
                    status,
                    name,
                )
                if status == "422":
                    assert name == "ValidationProblem"
    assert seen > 20


@pytest.mark.parametrize("status", ["401", "431"])
def test_every_operation_documents_auth_and_size_problems(client: TestClient, status: str) -> None:
    spec = client.get("/openapi.json").json()
    for path, item in spec["paths"].items():
        if path.startswith("/results/"):
            continue  # signed links need no key
        for operation in item.values():
            assert status in operation["responses"], path
