"""The chessboard event contracts (contracts/events): the committed schemas are the ones
the code produces, real events (through the JSONL sink and a Kafka-protocol broker)
validate, and a changed field type fails."""

from __future__ import annotations

import copy
import dataclasses
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from sqlalchemy import Engine, text

from pin_orchestration.chessboard.drain import drain_tick
from pin_orchestration.chessboard.outbox.publisher import (
    Delivery,
    JsonlSink,
    KafkaSink,
    OutboxEvent,
    publish_pending,
)
from pin_orchestration.chessboard.outbox.schemas import (
    EVENT_CONTRACTS,
    JSON_SCHEMA_DIALECT,
    derive_event_schemas,
)
from pin_orchestration.chessboard.queue import request_project_recalc
from tests.chessboard.test_publisher import TOPICS, consume_all, mock_broker  # noqa: F401
from tests.chessboard.world import T0, add_layout, add_layout_group, add_object, add_project
from tests.contracts import plugin
from tests.contracts.events import (
    EVENTS_DIR,
    FORMATS,
    committed_schemas,
    event_violations,
    message_violations,
    payload_violations,
    schema_differences,
)

REGENERATE = "python -m pin_orchestration.chessboard.outbox.schemas contracts/events"


def recalc_with_every_topic(engine: Engine) -> list[OutboxEvent]:
    """One recalc whose events cover each topic, with null and non-null aggregates:
    a project with free and sold objects, a group with two layouts, one with none."""
    with engine.begin() as conn:
        project = add_project(conn)
        group = add_layout_group(conn, project)
        add_layout_group(conn, project)  # stays at zero layouts: no event, areas NULL
        empty_group = add_layout_group(conn, project)
        small = add_layout(conn, project, group, "41.50")
        add_layout(conn, project, group, "73.25")
        add_layout(conn, project, empty_group, None)
        add_object(conn, project, status="Free", price="9100000.00", layout_id=small)
        add_object(conn, project, status="Sold", price="8000000.00", layout_id=small)
        request_project_recalc(conn, project, project, "Crud", now=T0)
    drain_tick(engine, now=T0 + timedelta(minutes=1))
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT id, topic, entity, entity_id, tenant_id, version, payload "
                "FROM chessboard.event_outbox ORDER BY id"
            )
        )
        return [OutboxEvent(**r._mapping) for r in rows]


# --- the committed files -------------------------------------------------------------------


def test_committed_schemas_are_draft_2020_12_one_per_topic() -> None:
    schemas = committed_schemas()
    assert sorted(schemas) == sorted(c.topic for c in EVENT_CONTRACTS) == sorted(TOPICS)
    for topic, schema in schemas.items():
        assert schema["$schema"] == JSON_SCHEMA_DIALECT
        Draft202012Validator.check_schema(schema)
        assert schema["x-kafka-topic"] == topic
        assert {"key", "headers", "snapshot"} <= set(schema["$defs"])
        assert {"version", "contract_version"} <= set(schema["required"])
    # Formats are asserted, not just annotated: a checker exists for each one used.
    assert {"uuid", "date-time"} <= set(FORMATS.checkers)


def test_committed_schemas_are_the_ones_the_code_derives(db_engine: Engine) -> None:
    with db_engine.connect() as conn:
        derived = derive_event_schemas(conn)
    differences = schema_differences(committed_schemas(), derived)
    assert not differences, (
        f"the events' shape changed: regenerate {EVENTS_DIR} ({REGENERATE}) and review the "
        "change for consumers; differences:\n" + "\n".join(differences)
    )


def test_a_changed_column_type_or_a_dropped_column_breaks_the_comparison(
    db_engine: Engine,
) -> None:
    with db_engine.begin() as conn:
        conn.execute(
            text("ALTER TABLE chessboard.projects ALTER COLUMN name TYPE integer USING NULL")
        )
        conn.execute(text("ALTER TABLE chessboard.layouts DROP COLUMN total_area"))
    with db_engine.connect() as conn:
        derived = derive_event_schemas(conn)

    differences = schema_differences(committed_schemas(), derived)

    assert (
        "/pin.chessboard.project-upserted.v1/$defs/snapshot/properties/name/type: "
        "committed ['string', 'null'], code ['integer', 'null']" in differences
    )
    assert (
        "/pin.chessboard.layout-upserted.v1/$defs/snapshot/properties/total_area: "
        "only in the committed file" in differences
    )


# --- real events -----------------------------------------------------------------------------


def test_recalc_events_through_the_jsonl_sink_follow_their_contracts(
    db_engine: Engine, tmp_path: Path
) -> None:
    checked_before = sum(plugin.CHECKED.values())
    events = recalc_with_every_topic(db_engine)
    assert sorted({e.topic for e in events}) == sorted(TOPICS)

    result = publish_pending(db_engine, JsonlSink(tmp_path / "events.jsonl"))

    assert result.published == len(events) == 4  # project, one layout, two groups
    # The session-wide check saw each of them on its way to the sink.
    assert sum(plugin.CHECKED.values()) - checked_before == len(events)
    lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    by_key = {e.key.decode(): e for e in events}
    for line in lines:
        event = by_key[line["key"]]
        headers = {name: raw.decode() for name, raw in event.headers}
        value = json.dumps(line["value"]).encode()
        assert message_violations(line["topic"], line["key"].encode(), value, headers) == []
    groups = [line["value"] for line in lines if line["topic"].endswith("layout-group-upserted.v1")]
    assert sorted(g["snapshot"]["area_min"] is None for g in groups) == [False, True]


def test_recalc_events_consumed_from_kafka_follow_their_contracts(
    db_engine: Engine,
    mock_broker: str,  # noqa: F811
) -> None:
    events = recalc_with_every_topic(db_engine)
    sink = KafkaSink(mock_broker, message_timeout_ms=10_000)
    try:
        assert publish_pending(db_engine, sink).published == len(events)
    finally:
        sink.close()

    received = consume_all(mock_broker, TOPICS, expected=len(events))

    assert len(received) == len(events)
    for message in received:
        headers = {name: raw.decode() for name, raw in message.headers()}
        assert message_violations(message.topic(), message.key(), message.value(), headers) == []


# --- a changed field type fails ------------------------------------------------------------------


def _changed(payload: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(payload)
    target = changed
    for name in path[:-1]:
        target = target[name]
    target[path[-1]] = value
    return changed


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("version",), "2"),  # integer → string
        (("contract_version",), "1"),
        (("id",), 42),
        (("tenant_id",), "not-a-uuid"),
        (("occurred_at",), 1_893_499_260),  # date-time → epoch number
        (("occurred_at",), "yesterday"),
        (("snapshot", "price_min"), "9100000.00"),  # number → string
        (("snapshot", "property_objects_free_count"), 1.5),  # integer → fraction
        (("snapshot", "updated_at"), None),  # NOT NULL column → null
    ],
)
def test_a_changed_field_type_fails_validation(
    db_engine: Engine, path: tuple[str, ...], value: Any
) -> None:
    [project_event] = [e for e in recalc_with_every_topic(db_engine) if e.entity == "project"]
    assert event_violations(project_event) == []

    changed = dataclasses.replace(
        project_event, payload=_changed(project_event.payload, path, value)
    )

    problems = payload_violations(changed.topic, json.loads(changed.value))
    assert problems and problems[0].startswith("/".join(path) + ":")
    assert event_violations(changed)


def test_an_unknown_topic_or_envelope_field_fails(db_engine: Engine) -> None:
    [event] = [e for e in recalc_with_every_topic(db_engine) if e.entity == "layout"]
    renamed = dataclasses.replace(event, topic="pin.chessboard.layout-upserted.v2")
    extra = dataclasses.replace(event, payload={**event.payload, "surprise": 1})
    missing = dataclasses.replace(
        event, payload={k: v for k, v in event.payload.items() if k != "occurred_at"}
    )
    assert event_violations(renamed) == [
        f"pin.chessboard.layout-upserted.v2: no committed schema in {EVENTS_DIR}"
    ]
    assert any("'surprise' was unexpected" in p for p in event_violations(extra))
    assert any("'occurred_at' is a required property" in p for p in event_violations(missing))


def test_the_session_check_records_a_broken_event_and_still_delivers(db_engine: Engine) -> None:
    [event] = [e for e in recalc_with_every_topic(db_engine) if e.entity == "project"]
    broken = dataclasses.replace(event, payload=_changed(event.payload, ("version",), "2"))
    delivered: list[OutboxEvent] = []
    violations: list[str] = []

    def send(_sink: object, events: list[OutboxEvent]) -> Delivery:
        delivered.extend(events)
        return Delivery(acked=[e.id for e in events], failed={})

    plugin._checking(send, violations)(None, [event, broken])

    assert delivered == [event, broken]
    assert violations and all(v.startswith(event.topic) for v in violations)
    assert any("version" in v for v in violations)
