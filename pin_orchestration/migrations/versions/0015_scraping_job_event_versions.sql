-- Migration 0015: scraping job events carry the job's version (issue 16, item 9).
-- Function bodies are kept byte for byte as this revision first ran them, indentation
-- included: PostgreSQL stores a body as written, and schema.sql compares them.

        CREATE OR REPLACE FUNCTION scraping.notify_job_finished() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('scraping_job_finished', json_build_object('job_id', NEW.id, 'tenant_id', NEW.tenant_id, 'status', NEW.status, 'updated_at', NEW.updated_at)::text);
            RETURN NULL;
        END
        $$;

        CREATE FUNCTION scraping.advance_job_updated_at() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            NEW.updated_at := OLD.updated_at + interval '1 microsecond';
            RETURN NEW;
        END
        $$;

CREATE TRIGGER jobs_updated_at_advances
BEFORE UPDATE ON scraping.jobs
FOR EACH ROW
WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.updated_at <= OLD.updated_at)
EXECUTE FUNCTION scraping.advance_job_updated_at();
