"""scraping job events (issue 9, seed step 19): a NOTIFY when a job enters or leaves a
terminal status, and an index for the metrics' recent-attempts window.

The API's read cache keeps a finished job for a long time; whatever makes a job finish
(a worker, the sweeper, a cancel) or un-finish (the runbook requeue) must drop the cached
copy. Writers do not know the cache: a trigger on scraping.jobs issues
`pg_notify('scraping_job_finished', …)` inside the writing transaction, so the event is
delivered exactly when that transaction commits and never for one that rolls back. The
API's listener thread turns it into a cache invalidation.

The payload is JSON `{"job_id", "tenant_id", "status"}`: the cache key carries the tenant
(`job:{tenant}:{id}`), so the listener needs both without a query.

Revision ID: 0008
Revises: 0007
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION scraping.notify_job_finished() RETURNS trigger
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
    # Only status changes into or out of a terminal status: queued ↔ running churn is
    # covered by the cache's short TTL and would only load the notification queue (every
    # notifying commit takes a database-wide lock while it queues its events).
    op.execute(
        """
        CREATE TRIGGER jobs_notify_finished
        AFTER UPDATE OF status ON scraping.jobs
        FOR EACH ROW
        WHEN (
            OLD.status IS DISTINCT FROM NEW.status
            AND (NEW.status IN ('succeeded', 'failed', 'cancelled')
                 OR OLD.status IN ('succeeded', 'failed', 'cancelled'))
        )
        EXECUTE FUNCTION scraping.notify_job_finished()
        """
    )
    # Metrics read the attempts started in a recent window (failure share by class and
    # domain); attempts are inserted with started_at = now(), so this index only appends.
    op.execute("CREATE INDEX ix_job_attempts_started ON scraping.job_attempts (started_at)")


def downgrade() -> None:
    op.execute("DROP INDEX scraping.ix_job_attempts_started")
    op.execute("DROP TRIGGER jobs_notify_finished ON scraping.jobs")
    op.execute("DROP FUNCTION scraping.notify_job_finished()")
