-- Migration 0008: scraping job events (issue 9): a NOTIFY when a job enters or leaves an end state.
-- Function bodies are kept byte for byte as this revision first ran them, indentation
-- included: PostgreSQL stores a body as written, and schema.sql compares them.

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
        $$;

-- Only status changes into or out of a terminal status: queued ↔ running churn is
-- covered by the cache's short TTL and would only load the notification queue (every
-- notifying commit takes a database-wide lock while it queues its events).
CREATE TRIGGER jobs_notify_finished
AFTER UPDATE OF status ON scraping.jobs
FOR EACH ROW
WHEN (
    OLD.status IS DISTINCT FROM NEW.status
    AND (NEW.status IN ('succeeded', 'failed', 'cancelled')
         OR OLD.status IN ('succeeded', 'failed', 'cancelled'))
)
EXECUTE FUNCTION scraping.notify_job_finished();

-- Metrics read the attempts started in a recent window (failure share by class and
-- domain); attempts are inserted with started_at = now(), so this index only appends.
CREATE INDEX ix_job_attempts_started ON scraping.job_attempts (started_at);
