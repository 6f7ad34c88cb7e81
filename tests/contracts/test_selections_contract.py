"""contracts/selections.openapi.yaml: a valid OpenAPI 3.1 document that says what the
detach client sends and how each answer is treated, and the stand-in answers by it."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from pin_orchestration.devstack.standins.selections import SelectionsStandIn
from pin_orchestration.news.selections import SelectionsClient, classify_status
from pin_orchestration.news.snapshot_detach.policy import DetachOptions, Reason
from pin_orchestration.resources.selections import SelectionsResource

DOCUMENT = Path(__file__).resolve().parents[2] / "contracts" / "selections.openapi.yaml"
DOC_URI = "urn:pin:contracts:selections"
PATH = "/internal/snapshots/{snapshotId}/detach"
TOKEN = "m2m-test-token"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return yaml.safe_load(DOCUMENT.read_text(encoding="utf-8"))


def schema_validator(document: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    """A validator of one schema of the document, its $refs resolved in the document."""
    resource = Resource.from_contents(document, default_specification=DRAFT202012)
    registry = Registry().with_resource(DOC_URI, resource)
    rebased = copy.deepcopy(schema)
    if "$ref" in rebased:
        rebased["$ref"] = DOC_URI + rebased["$ref"]
    return Draft202012Validator(
        rebased, registry=registry, format_checker=Draft202012Validator.FORMAT_CHECKER
    )


def response_for(operation: dict[str, Any], status: int) -> dict[str, Any]:
    """The response object OpenAPI picks for a status: exact, then range, then default."""
    responses = operation["responses"]
    return responses.get(str(status)) or responses.get(f"{status // 100}XX") or responses["default"]


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    validate(document)
    assert document["openapi"].startswith("3.1")
    broken = copy.deepcopy(document)
    del broken["paths"][PATH]["post"]["responses"]
    broken["paths"][PATH]["post"]["parameters"][0]["in"] = "body"
    with pytest.raises(OpenAPIValidationError):
        validate(broken)


def test_each_documented_outcome_is_how_the_client_classifies_the_status(
    document: dict[str, Any],
) -> None:
    operation = document["paths"][PATH]["post"]
    for status in (200, 201, 204, 299, 301, 400, 401, 403, 404, 409, 429, 500, 502, 503, 504):
        assert response_for(operation, status)["x-pin-outcome"] == classify_status(status).kind


def test_the_documented_retry_policy_is_the_code_default(document: dict[str, Any]) -> None:
    documented = document["info"]["x-pin-retry"]
    defaults = DetachOptions()
    for name in (
        "max_concurrency",
        "max_attempts",
        "backoff_base_seconds",
        "backoff_factor",
        "backoff_cap_seconds",
        "backoff_jitter_ratio",
    ):
        assert documented[name] == getattr(defaults, name), name
    assert (
        documented["timeout_seconds"]
        == SelectionsResource.model_fields["detach_call_timeout_seconds"].default
    )
    request_schema = document["components"]["schemas"]["DetachRequest"]
    assert request_schema["properties"]["reason"]["enum"] == [r.value for r in Reason]


@dataclasses.dataclass
class Exchange:
    request: requests.PreparedRequest
    status: int
    content_type: str
    body: bytes


def test_the_client_and_the_stand_in_speak_the_document(document: dict[str, Any]) -> None:
    """Real calls of the detach client to the stand-in: every request matches the
    operation, every answer (fresh, repeated, refused, failing) matches its response."""
    operation = document["paths"][PATH]["post"]
    template = re.compile("^" + PATH.replace("{snapshotId}", "(?P<snapshotId>[^/]+)") + "$")
    exchanges: list[Exchange] = []

    def record(response: requests.Response, *_args: Any, **_kwargs: Any) -> None:
        exchanges.append(
            Exchange(
                response.request,
                response.status_code,
                response.headers.get("Content-Type", ""),
                response.content,
            )
        )

    snapshot = uuid.uuid4()
    with SelectionsStandIn(token=TOKEN) as stand_in:
        with SelectionsClient(stand_in.url, TOKEN) as client:
            client.session.hooks["response"].append(record)
            outcomes = [client.detach(snapshot, Reason.POST_DELETED.value)]
            outcomes.append(client.detach(snapshot, Reason.BLOCK_REPLACED.value))
            stand_in.fail(503, count=1)
            outcomes.append(client.detach(uuid.uuid4(), Reason.POST_DELETED.value))
            stand_in.fail(404, count=1)
            outcomes.append(client.detach(uuid.uuid4(), Reason.POST_DELETED.value))
        with SelectionsClient(stand_in.url, "wrong-token") as intruder:
            intruder.session.hooks["response"].append(record)
            outcomes.append(intruder.detach(uuid.uuid4(), Reason.POST_DELETED.value))

    assert [e.status for e in exchanges] == [200, 200, 503, 404, 401]
    assert [o.kind for o in outcomes] == [
        "detached",
        "detached",
        "transient",
        "rejected",
        "rejected",
    ]
    statuses = [json.loads(e.body)["status"] for e in exchanges[:2]]
    assert statuses == ["Detached", "AlreadyDetached"]

    scheme = document["components"]["securitySchemes"]["m2m"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert exchanges[0].request.headers["Authorization"] == f"Bearer {TOKEN}"
    body_schema = operation["requestBody"]["content"]["application/json"]["schema"]
    for exchange in exchanges:
        request = exchange.request
        assert request.method == "POST"
        match = template.match(requests.utils.urlparse(request.url).path)
        assert match, request.url
        schema_validator(document, operation["parameters"][0]["schema"]).validate(
            match["snapshotId"]
        )
        assert request.headers["Content-Type"] == "application/json"
        schema_validator(document, body_schema).validate(json.loads(request.body))
        assert request.headers["Authorization"].startswith("Bearer ")

        response = response_for(operation, exchange.status)
        assert response["x-pin-outcome"] == classify_status(exchange.status).kind
        media = response["content"][exchange.content_type]
        schema_validator(document, media["schema"]).validate(json.loads(exchange.body))


def test_an_answer_off_the_document_fails_the_check(document: dict[str, Any]) -> None:
    operation = document["paths"][PATH]["post"]
    ok = response_for(operation, 200)["content"]["application/json"]["schema"]
    validator = schema_validator(document, ok)
    assert not list(validator.iter_errors({"snapshotId": str(uuid.uuid4()), "status": "Detached"}))
    assert list(validator.iter_errors({"snapshotId": "x", "status": "Detached"}))
    assert list(validator.iter_errors({"snapshotId": str(uuid.uuid4()), "status": "Gone"}))
