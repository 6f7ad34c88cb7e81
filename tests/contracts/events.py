"""The committed event contracts (contracts/events/*.json) and a check of one message
against them, as a consumer would receive it: key, value and headers."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from pin_orchestration.chessboard.outbox.publisher import OutboxEvent

EVENTS_DIR = Path(__file__).resolve().parents[2] / "contracts" / "events"
FORMATS = Draft202012Validator.FORMAT_CHECKER


@functools.cache
def committed_schemas() -> dict[str, dict[str, Any]]:
    """Topic → committed JSON Schema."""
    return {
        path.name.removesuffix(".json"): json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(EVENTS_DIR.glob("*.json"))
    }


@functools.cache
def _validators(topic: str) -> dict[str, Draft202012Validator]:
    schema = committed_schemas()[topic]
    registry = Registry().with_resource(schema["$id"], Resource.from_contents(schema))

    def part(pointer: str) -> Draft202012Validator:
        return Draft202012Validator(
            {"$ref": f"{schema['$id']}#{pointer}"}, registry=registry, format_checker=FORMATS
        )

    return {
        "value": Draft202012Validator(schema, format_checker=FORMATS),
        "key": part("/$defs/key"),
        "headers": part("/$defs/headers"),
    }


def message_violations(topic: str, key: bytes, value: bytes, headers: dict[str, str]) -> list[str]:
    """Why a message breaks its topic's committed contract (empty: it does not)."""
    if topic not in committed_schemas():
        return [f"{topic}: no committed schema in {EVENTS_DIR}"]
    try:
        payload = json.loads(value)
        key_text = key.decode()
    except ValueError as exc:
        return [f"{topic}: key or value is not UTF-8 JSON ({exc})"]
    validators = _validators(topic)
    problems = [
        f"{topic} {part} at {'/'.join(map(str, error.absolute_path)) or '(root)'}: {error.message}"
        for part, instance in (("value", payload), ("key", key_text), ("headers", headers))
        for error in validators[part].iter_errors(instance)
    ]
    if problems:
        return problems
    # What the schemas' descriptions promise and JSON Schema cannot say.
    snapshot = payload["snapshot"]
    if not (payload["id"] == key_text == snapshot.get("id")):
        problems.append(f"{topic}: key, id and snapshot.id differ")
    if not (payload["version"] == snapshot.get("version") == int(headers["version"])):
        problems.append(f"{topic}: version, snapshot.version and the version header differ")
    return problems


def event_violations(event: OutboxEvent) -> list[str]:
    """The checks of `message_violations` on what the publisher produces for `event`."""
    headers = {name: raw.decode() for name, raw in event.headers}
    return message_violations(event.topic, event.key, event.value, headers)


def payload_violations(topic: str, payload: dict[str, Any]) -> list[str]:
    """Only the value's schema, for a payload built by hand."""
    return [
        f"{'/'.join(map(str, error.absolute_path)) or '(root)'}: {error.message}"
        for error in _validators(topic)["value"].iter_errors(payload)
    ]


def schema_differences(committed: Any, derived: Any, path: str = "") -> list[str]:
    """Where two schemas differ, as JSON-pointer-like paths (empty: identical)."""
    if isinstance(committed, dict) and isinstance(derived, dict):
        return [
            difference
            for name in sorted(set(committed) | set(derived))
            for difference in (
                [f"{path}/{name}: only in the code"]
                if name not in committed
                else [f"{path}/{name}: only in the committed file"]
                if name not in derived
                else schema_differences(committed[name], derived[name], f"{path}/{name}")
            )
        ]
    if committed != derived:
        return [f"{path or '/'}: committed {committed!r}, code {derived!r}"]
    return []
