"""POST /jobs with input JSON allows but the service cannot keep — lone UTF-16 surrogates,
numbers JSON has no value for, deep nesting, oversized values, credentials in a URL — is a
422 naming the field, never a 500, and stores nothing (issue 16, items 4 and 5)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from pin_orchestration.scraping.api.app import create_app
from pin_orchestration.scraping.store.local import LocalResultStore
from tests.scraping.conftest import TEST_SETTINGS, auth


@pytest.fixture
def unlimited(db_engine: Engine, local_store: LocalResultStore) -> Iterator[TestClient]:
    app = create_app(
        lambda: db_engine, local_store, dataclasses.replace(TEST_SETTINGS, intake_rps=0)
    )
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def post_raw(client: TestClient, key: str, body: str) -> object:
    """The body as sent on the wire: JSON text, escapes (\\ud800, NaN, 1e400) as written."""
    return client.post(
        "/jobs",
        content=body.encode(),
        headers={**auth(key), "Content-Type": "application/json"},
    )


def jobs(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM scraping.jobs")).scalar_one()


def assert_422_naming(answer: object, field: str) -> None:
    assert answer.status_code == 422, answer.text  # type: ignore[attr-defined]
    problem = answer.json()  # type: ignore[attr-defined]
    errors = problem["errors"]
    assert problem["status"] == 422 and errors, problem
    assert any(
        e.get("pointer", "").startswith(f"/{field}") or field in e["detail"] for e in errors
    ), errors


OK_URL = '"url": "https://example.com/"'


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (f'{{{OK_URL}, "params": {{"a": "x\\ud800y"}}}}', "params"),
        (f'{{{OK_URL}, "params": {{"\\udfff": 1}}}}', "params"),
        (f'{{{OK_URL}, "params": {{"a": ["\\ud83d"]}}}}', "params"),
        ('{"url": "https://example.com/\\ud800"}', "url"),
        (f'{{{OK_URL}, "callback_url": "https://cb.example/\\udc00"}}', "callback_url"),
        (f'{{{OK_URL}, "params": {{"a": 1e400}}}}', "params"),
        (f'{{{OK_URL}, "params": {{"a": -1e400}}}}', "params"),
        (f'{{{OK_URL}, "params": {{"a": NaN}}}}', "params"),
        (f'{{{OK_URL}, "params": {{"a": {{"b": -Infinity}}}}}}', "params"),
        (f'{{{OK_URL}, "params": {{"a": Infinity}}}}', "params"),
    ],
)
def test_surrogates_and_non_finite_numbers_are_422_naming_the_field(
    unlimited: TestClient, make_tenant, db_engine: Engine, body: str, field: str
) -> None:
    _, key = make_tenant("shop")
    assert_422_naming(post_raw(unlimited, key, body), field)
    assert jobs(db_engine) == 0


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ('"http://user:pw@example.com/"', "url"),
        ('"https://token@example.com/x"', "url"),
        ('"https://:secret@example.com/"', "url"),
    ],
)
def test_credentials_in_a_url_are_refused(
    unlimited: TestClient, make_tenant, db_engine: Engine, url: str, field: str
) -> None:
    _, key = make_tenant("shop")
    for body in (f'{{"url": {url}}}', f'{{{OK_URL}, "callback_url": {url}}}'):
        answer = post_raw(unlimited, key, body)
        assert answer.status_code == 422, answer.text
        assert "credentials in a URL are not accepted" in answer.text
        assert (
            "pw" not in answer.text and "secret" not in answer.text and "token" not in answer.text
        )
    assert jobs(db_engine) == 0


def test_nesting_deeper_than_the_limit_is_422_naming_params(
    unlimited: TestClient, make_tenant, db_engine: Engine
) -> None:
    _, key = make_tenant("shop")
    for depth in (65, 5_000, 100_000):
        deep = "[" * depth + "]" * depth
        answer = post_raw(unlimited, key, f'{{{OK_URL}, "params": {{"a": {deep}}}}}')
        assert answer.status_code in (413, 422), answer.text[:300]
        if answer.status_code == 422:
            assert_422_naming(answer, "params")
    assert jobs(db_engine) == 0


def _hostile_json():  # type: ignore[no-untyped-def]
    """JSON values with what breaks storage: lone surrogates, NaN/±Infinity, 1e400, deep
    nesting, oversized strings — as JSON text, so the escapes reach the server as sent."""
    from hypothesis import strategies as st

    surrogate = st.integers(0xD800, 0xDFFF).map(lambda c: f'"x\\u{c:04x}"')
    non_finite = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e999"])
    oversized = st.integers(17 * 1024, 40 * 1024).map(lambda n: json.dumps("x" * n))
    bad = st.one_of(surrogate, non_finite, oversized)
    fine = st.one_of(
        st.integers(-(2**53), 2**53).map(str),
        st.text(
            st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=5
        ).map(json.dumps),
    )

    def nest(value: str, depth: int) -> str:
        return "[" * depth + value + "]" * depth

    return st.tuples(
        bad,
        st.integers(0, 200),
        st.lists(fine, max_size=3),
        st.sampled_from(["value", "key"]),
    ).map(
        lambda t: (
            "{"
            + ", ".join(
                [f'"k{i}": {v}' for i, v in enumerate(t[2])] + [f'"bad": {nest(t[0], t[1])}']
            )
            + "}"
            if t[3] == "value" or not t[0].startswith('"')
            else "{" + f"{t[0]}: 1" + "}"
        )
    )


def test_generated_hostile_params_are_never_a_500(
    unlimited: TestClient, make_tenant, db_engine: Engine
) -> None:
    from hypothesis import HealthCheck, given, settings

    _, key = make_tenant("shop")

    @settings(
        max_examples=80,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(params=_hostile_json())
    def refused(params: str) -> None:
        answer = post_raw(unlimited, key, f'{{{OK_URL}, "params": {params}}}')
        assert answer.status_code in (413, 422), (params[:200], answer.text[:300])
        if answer.status_code == 422:
            assert_422_naming(answer, "params")

    refused()
    assert jobs(db_engine) == 0


def _escaped_json_size(params: dict) -> int:
    """The documented size of params: json.dumps' compact, ASCII-escaped form."""
    return len(json.dumps(params, separators=(",", ":")).encode())


@pytest.mark.parametrize(
    "params",
    [
        {"a": "x" * (16 * 1024 - 8)},  # exactly at the limit
        {"a": "x" * (16 * 1024 - 7)},  # one byte over
        {"a": "é" * 2729},  # 6 bytes escaped, 2 in UTF-8: just under the limit escaped
        {"a": "é" * 2730},  # just over escaped, a third of the limit in UTF-8
        {"a": "\U0001d11e" * 1364},  # 12 bytes escaped (a surrogate pair), 4 in UTF-8
        {"a": "\U0001d11e" * 1365},
        {"a": "\u2028" * 2729},  # escaped by json.dumps, not by a UTF-8 writer
        {"a": "\u2028" * 2730},
        {"f": [1e16, 5e-324, -0.0, 10**30] * 300},
        {"f": [1e16, 5e-324, -0.0, 10**30] * 600},
    ],
)
def test_params_size_is_counted_as_escaped_json_whatever_the_characters(params: dict) -> None:
    from pydantic import ValidationError

    from pin_orchestration.scraping.api.job_models import MAX_PARAMS_BYTES, JobCreate

    within = _escaped_json_size(params) <= MAX_PARAMS_BYTES
    try:
        JobCreate(url="https://example.com/", params=params)
        accepted = True
    except ValidationError as exc:
        assert "bytes as JSON" in str(exc)
        accepted = False
    assert accepted == within, _escaped_json_size(params)


@pytest.mark.parametrize(
    "char", [" ", "\t", "\n", "\x0b", "\x1c", "\x85", "\u00a0", "\u3000", "\x00"]
)
def test_whitespace_or_nul_anywhere_in_a_url_is_refused(char: str) -> None:
    from pydantic import ValidationError

    from pin_orchestration.scraping.api.job_models import JobCreate

    with pytest.raises(ValidationError, match="whitespace or control characters"):
        JobCreate(url=f"https://example.com/a{char}b")
    with pytest.raises(ValidationError, match="whitespace or control characters"):
        JobCreate(url="https://example.com/", callback_url=f"https://cb.example/{char}")
