"""JSON Schemas (draft 2020-12) of the chessboard upserted events, derived from the code.

The committed files `contracts/events/<topic>.json` are what consumers read; the tests
validate every event the publisher sends against them and compare them with the schemas
derived here from the migrated database, so a change to an event's shape fails a test
until the committed contract is regenerated (and reviewed):

    python -m pin_orchestration.chessboard.outbox.schemas contracts/events

(on a database migrated to head: PIN_DATABASE_URL, or the embedded default).

A schema validates the Kafka message value; `$defs/key` and `$defs/headers` describe the
message key and headers. The envelope is closed (a new envelope field is a new contract
version); the snapshot mirrors an upstream-owned table row and is open: consumers must
ignore fields they do not know.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection

from pin_orchestration.platform.sql import NamedQueries

_query = NamedQueries("pin_orchestration.chessboard.outbox", "schemas.sql")

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
CONTRACT_VERSION = 1


@dataclass(frozen=True)
class EventContract:
    topic: str
    event_type: str
    entity: str
    table: str


# The topics and event types the recalc's statements in chessboard/queries.sql write.
EVENT_CONTRACTS = (
    EventContract(
        "pin.chessboard.project-upserted.v1", "ProjectUpsertedKafkaEvent", "project", "projects"
    ),
    EventContract(
        "pin.chessboard.layout-upserted.v1", "LayoutUpsertedKafkaEvent", "layout", "layouts"
    ),
    EventContract(
        "pin.chessboard.layout-group-upserted.v1",
        "LayoutGroupUpsertedKafkaEvent",
        "layout_group",
        "layout_groups",
    ),
)

_UUID = {"type": "string", "format": "uuid"}
_DATE_TIME = {"type": "string", "format": "date-time"}
# PostgreSQL type → JSON type of its to_jsonb() rendering.
_COLUMN_TYPES: dict[str, dict[str, Any]] = {
    "uuid": _UUID,
    "text": {"type": "string"},
    "character varying": {"type": "string"},
    "integer": {"type": "integer"},
    "bigint": {"type": "integer"},
    "smallint": {"type": "integer"},
    "numeric": {"type": "number"},
    "boolean": {"type": "boolean"},
    "timestamp with time zone": _DATE_TIME,
}


class UnmappedColumnType(ValueError):
    """An entity column has a type the schema derivation does not know how to render."""


def _column_schema(column: Any) -> dict[str, Any]:
    try:
        schema = dict(_COLUMN_TYPES[column.data_type])
    except KeyError:
        raise UnmappedColumnType(
            f"column {column.column_name} has type {column.data_type!r}: add its JSON "
            "rendering to _COLUMN_TYPES in chessboard/outbox/schemas.py"
        ) from None
    if column.character_maximum_length is not None:
        schema["maxLength"] = column.character_maximum_length
    if column.nullable:
        schema["type"] = [schema["type"], "null"]
    return schema


def snapshot_schema(conn: Connection, contract: EventContract) -> dict[str, Any]:
    columns = conn.execute(_query("entity_columns"), {"table_name": contract.table}).all()
    if not columns:
        raise ValueError(f"table chessboard.{contract.table} not found: migrate the database")
    return {
        "type": "object",
        "description": (
            f"The chessboard.{contract.table} row after the change (to_jsonb). Fields may be "
            "added without a new contract version: ignore the ones you do not know."
        ),
        "required": [c.column_name for c in columns],
        "properties": {c.column_name: _column_schema(c) for c in columns},
        "additionalProperties": True,
    }


def event_schema(conn: Connection, contract: EventContract) -> dict[str, Any]:
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": f"urn:pin:contracts:events:{contract.topic}",
        "title": contract.event_type,
        "description": (
            f"Value of a message on Kafka topic {contract.topic}: the {contract.entity}'s "
            "aggregates changed. Key: the entity id ($defs/key); headers: $defs/headers. "
            "Delivery is at least once and ordered per key: upsert by id and ignore a "
            "message whose version is not greater than the one already applied."
        ),
        "x-kafka-topic": contract.topic,
        "type": "object",
        "required": [
            "contract_version",
            "event_type",
            "id",
            "tenant_id",
            "version",
            "occurred_at",
            "snapshot",
        ],
        "additionalProperties": False,
        "properties": {
            "contract_version": {"const": CONTRACT_VERSION},
            "event_type": {"const": contract.event_type},
            "id": {**_UUID, "description": "The entity id; equals the message key."},
            "tenant_id": _UUID,
            "version": {
                "type": "integer",
                "minimum": 1,
                "description": "Monotonic per entity id; equals snapshot.version.",
            },
            "occurred_at": {**_DATE_TIME, "description": "Commit-time clock of the recalc."},
            "snapshot": {"$ref": "#/$defs/snapshot"},
        },
        "$defs": {
            "key": {**_UUID, "description": "Message key: the entity id as UTF-8 text."},
            "headers": {
                "type": "object",
                "description": "Message headers, as UTF-8 text.",
                "required": ["event_type", "contract_version", "version", "tenant_id"],
                "additionalProperties": False,
                "properties": {
                    "event_type": {"const": contract.event_type},
                    "contract_version": {"const": str(CONTRACT_VERSION)},
                    "version": {"type": "string", "pattern": "^[1-9][0-9]*$"},
                    "tenant_id": _UUID,
                },
            },
            "snapshot": snapshot_schema(conn, contract),
        },
    }


def derive_event_schemas(conn: Connection) -> dict[str, dict[str, Any]]:
    """Topic → JSON Schema, from the contracts above and the migrated tables."""
    return {c.topic: event_schema(conn, c) for c in EVENT_CONTRACTS}


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def write_event_schemas(conn: Connection, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for topic, schema in derive_event_schemas(conn).items():
        path = directory / f"{topic}.json"
        path.write_text(render(schema), encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    from pin_orchestration.platform.db import create_db_engine, resolve_database_url
    from pin_orchestration.platform.settings import Settings

    if len(argv) != 1:
        print("usage: python -m pin_orchestration.chessboard.outbox.schemas DIRECTORY")
        return 2
    engine = create_db_engine(resolve_database_url(Settings.from_env()))
    with engine.connect() as conn:
        for path in write_event_schemas(conn, Path(argv[0])):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
