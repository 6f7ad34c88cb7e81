-- Migration 0015 down: back to 0014.
-- Function bodies are kept byte for byte as this revision first ran them, indentation
-- included: PostgreSQL stores a body as written, and schema.sql compares them.

DROP TRIGGER jobs_updated_at_advances ON scraping.jobs;
DROP FUNCTION scraping.advance_job_updated_at();

-- 0008's function to the letter: schema.sql compares function bodies as written.
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
        $$;
