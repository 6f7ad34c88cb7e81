"""schema.sql is what the migrations produce, the live function files are what head holds,
every revision goes down and up again leaving the schema exactly as it was, and the
revisions are one numbered line of files, each with its frozen SQL.

Runs on whichever PostgreSQL the suite uses: the machine's (PIN_DATABASE_URL, CI) or the
embedded pgserver one; the dump is normalised so both give the same text."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
from alembic import command
from alembic.script import ScriptDirectory

from pin_orchestration.migrations import alembic_config, upgrade_database
from pin_orchestration.migrations.schema_dump import SCHEMA_SQL, dump_schema, libpq_url

REGENERATE = "regenerate it: pin db dump-schema > schema.sql (docs/operators.md, 'Schema')"


def test_the_migrations_produce_schema_sql(empty_db_url: str) -> None:
    upgrade_database(empty_db_url)
    assert dump_schema(empty_db_url) == SCHEMA_SQL.read_text(encoding="utf-8"), REGENERATE


def test_the_scraping_function_files_are_what_head_holds(empty_db_url: str) -> None:
    """pin_orchestration/scraping/sql/*.sql, applied over head, change nothing: a function
    edited there without a migration freezing it shows here."""
    import psycopg

    upgrade_database(empty_db_url)
    at_head = dump_schema(empty_db_url)
    sql_dir = resources.files("pin_orchestration.scraping").joinpath("sql")
    with psycopg.connect(libpq_url(empty_db_url), autocommit=True) as conn:
        for name in (
            "domain_queues.sql",
            "claim_jobs.sql",
            "submit_job.sql",
            "pause_domain.sql",
            "redirect_slots.sql",
            "robots.sql",
        ):
            conn.execute(sql_dir.joinpath(name).read_text(encoding="utf-8"))
    assert dump_schema(empty_db_url) == at_head


def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config("postgresql://unused/unused"))


def _revisions() -> list[tuple[str, str | None]]:
    return [(r.revision, r.down_revision) for r in reversed(list(_script().walk_revisions()))]


def test_the_revisions_are_one_numbered_line_of_files_with_their_sql() -> None:
    """Each versions/*.py is named after its revision id, the ids are unique, each revision
    revises the one before it (one base, one head, no branch), and each has its frozen
    .sql and .down.sql beside it (no other .sql there)."""
    script = _script()
    versions = Path(script.versions)
    files = sorted(versions.glob("*.py"))
    scripts = {Path(r.path).name: r for r in script.walk_revisions()}
    assert sorted(scripts) == [f.name for f in files]
    for name, rev in scripts.items():
        assert name.startswith(f"{rev.revision}_"), f"{name} holds revision {rev.revision}"
        assert not rev.branch_labels and not rev.dependencies, name
    ids = [r.revision for r in scripts.values()]
    assert len(ids) == len(set(ids))
    chain = _revisions()
    assert [down for _, down in chain] == [None] + [rev for rev, _ in chain[:-1]]
    assert len(chain) == len(files)
    assert script.get_heads() == [chain[-1][0]]
    expected_sql = set()
    for f in files:
        for suffix in (".sql", ".down.sql"):
            sql = f.with_name(f.stem + suffix)
            assert sql.is_file(), f"{f.name} has no {sql.name}"
            expected_sql.add(sql.name)
    assert {p.name for p in versions.glob("*.sql")} == expected_sql


@pytest.mark.parametrize(("revision", "down_revision"), _revisions(), ids=lambda r: str(r))
def test_each_revision_goes_down_and_up_again(
    empty_db_url: str, revision: str, down_revision: str | None
) -> None:
    config = alembic_config(empty_db_url)
    if down_revision is not None:
        command.upgrade(config, down_revision)
    else:
        # Base is not an empty database: alembic keeps its version table (and its schema).
        command.upgrade(config, revision)
        command.downgrade(config, "base")
    before = dump_schema(empty_db_url)
    command.upgrade(config, revision)
    after = dump_schema(empty_db_url)
    command.downgrade(config, down_revision or "base")
    assert dump_schema(empty_db_url) == before, f"{revision} down left the schema changed"
    command.upgrade(config, revision)
    assert dump_schema(empty_db_url) == after, f"{revision} up again differs from up"
