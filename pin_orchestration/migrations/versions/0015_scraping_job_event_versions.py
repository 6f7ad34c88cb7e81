"""scraping job events carry the job's version (issue 16, item 9): the read cache compares
it so that a fill never overwrites a newer state.

- The `scraping_job_finished` payload gains `updated_at` (the row's, as the event left it):
  the listener's tombstone records it, and a fill whose row is older is refused.
- `updated_at` strictly increases on every status change. Writers set `updated_at = now()`,
  the start of their transaction: one that waited for the row's lock can write a time
  earlier than the write it waited for, and its event would then look older than the copy
  it must invalidate. The trigger runs only for those rare updates (its WHEN is false for
  the others), so the hot paths pay nothing.

Revision ID: 0015
Revises: 0014
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def _notify_function(payload: str) -> str:
    return f"""
        CREATE OR REPLACE FUNCTION scraping.notify_job_finished() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('scraping_job_finished', {payload}::text);
            RETURN NULL;
        END
        $$
        """


def upgrade() -> None:
    op.execute(
        _notify_function(
            "json_build_object('job_id', NEW.id, 'tenant_id', NEW.tenant_id, "
            "'status', NEW.status, 'updated_at', NEW.updated_at)"
        )
    )
    op.execute(
        """
        CREATE FUNCTION scraping.advance_job_updated_at() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            NEW.updated_at := OLD.updated_at + interval '1 microsecond';
            RETURN NEW;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER jobs_updated_at_advances
        BEFORE UPDATE ON scraping.jobs
        FOR EACH ROW
        WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.updated_at <= OLD.updated_at)
        EXECUTE FUNCTION scraping.advance_job_updated_at()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_updated_at_advances ON scraping.jobs")
    op.execute("DROP FUNCTION scraping.advance_job_updated_at()")
    # 0008's function to the letter: schema.sql compares function bodies as written.
    op.execute(
        """
        CREATE OR REPLACE FUNCTION scraping.notify_job_finished() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify(
                'scraping_job_finished',
                json_build_object(
                    'job_id', NEW.id, 'tenant_id', NEW.tenant_id, 'status', NEW.status
                )::text
            );
            RETURN NULL;
        END
        $$
        """
    )
