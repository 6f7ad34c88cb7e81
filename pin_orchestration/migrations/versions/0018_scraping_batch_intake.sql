-- 0018: intake of many jobs in one statement (POST /jobs/batch, a set-based
-- scraping.submit_job) pays for the scheduler's write-time state once per class and once
-- per (domain, class), not once per job: a batch of 400 jobs took one tenant_vtimes upsert
-- and one domain-queue trigger call per job, about two thirds of its time (issue 18).
-- - scraping.take_fair_tags reserves a run of fair tags; insert_jobs gives each job its
--   tag, and the insert trigger takes one only for a job without one.
-- - The domain queues of inserted jobs are announced by a statement-level trigger over the
--   statement's new rows, grouped by (domain, class); a requeue still announces its job
--   from the row-level update trigger, through the same function.

CREATE OR REPLACE FUNCTION scraping.take_fair_tags(
    p_tenant_id uuid, p_priority text, p_count integer
) RETURNS TABLE (k integer, fair_tag double precision)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_step double precision;
    v_clock double precision;
    v_first double precision;
BEGIN
    SELECT 1.0 / t.weight INTO v_step FROM scraping.tenants t WHERE t.id = p_tenant_id;
    SELECT c.tenant_clock INTO v_clock FROM scraping.pick_classes c
    WHERE c.priority = p_priority;
    INSERT INTO scraping.tenant_vtimes AS v (priority, tenant_id, vtime)
    VALUES (p_priority, p_tenant_id, v_clock + p_count * v_step)
    ON CONFLICT (priority, tenant_id) DO UPDATE
    SET vtime = greatest(v.vtime, v_clock) + p_count * v_step
    RETURNING v.vtime - p_count * v_step INTO v_first;
    RETURN QUERY SELECT g, v_first + g * v_step FROM generate_series(0, p_count - 1) AS g;
END
$fn$;

CREATE OR REPLACE FUNCTION scraping.jobs_fair_tag() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    SELECT t.fair_tag INTO NEW.fair_tag
    FROM scraping.take_fair_tags(NEW.tenant_id, NEW.priority, 1) t;
    RETURN NEW;
END
$fn$;

CREATE OR REPLACE FUNCTION scraping.announce_queued_jobs(
    p_domain text, p_priority text, p_head_tag double precision, p_due_at timestamptz
) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v_blocked timestamptz;
BEGIN
    -- The common case writes nothing: a queue that already sorts at or before these jobs
    -- and is not waiting for a later due time (so intake does not lock a row a claim may
    -- be holding).
    PERFORM 1 FROM scraping.domain_queues q
    WHERE q.domain = p_domain AND q.priority = p_priority
      AND q.head_tag <= p_head_tag
      AND (q.ready OR q.waiting_for = 'room' OR q.wake_at <= p_due_at);
    IF FOUND THEN
        RETURN;
    END IF;
    INSERT INTO scraping.domains (domain) VALUES (p_domain)
    ON CONFLICT (domain) DO NOTHING;
    SELECT d.blocked_until INTO v_blocked FROM scraping.domains d
    WHERE d.domain = p_domain AND d.blocked_until > clock_timestamp();
    INSERT INTO scraping.domain_queues AS q
        (domain, priority, head_tag, ready, waiting_for, wake_at)
    SELECT p_domain, p_priority, p_head_tag, s.waiting_for IS NULL,
           s.waiting_for, s.wake_at
    FROM (SELECT CASE WHEN v_blocked IS NOT NULL THEN 'room'
                      WHEN p_due_at > clock_timestamp() THEN 'due'
                 END AS waiting_for,
                 coalesce(v_blocked, CASE WHEN p_due_at > clock_timestamp()
                                          THEN p_due_at END) AS wake_at) s
    ON CONFLICT (domain, priority) DO UPDATE
    SET head_tag = least(q.head_tag, EXCLUDED.head_tag),
        wake_at = CASE WHEN q.waiting_for = 'due'
                       THEN least(q.wake_at, p_due_at)
                       ELSE q.wake_at END;
END
$fn$;

CREATE OR REPLACE FUNCTION scraping.jobs_inserted_domain_queues() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM scraping.announce_queued_jobs(a.domain, a.priority, a.head_tag, a.due_at)
    FROM (SELECT n.domain, n.priority, min(n.fair_tag) AS head_tag,
                 min(n.next_attempt_at) AS due_at
          FROM new_jobs n
          WHERE n.status = 'queued'
          GROUP BY n.domain, n.priority
          ORDER BY n.domain, n.priority) a;
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION scraping.jobs_domain_queue() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.status = 'queued' AND OLD.status <> 'queued' THEN
        PERFORM scraping.announce_queued_jobs(
            NEW.domain, NEW.priority, NEW.fair_tag, NEW.next_attempt_at);
    END IF;
    IF OLD.status = 'running' AND NEW.status <> 'running' THEN
        UPDATE scraping.domain_queues q SET wake_at = clock_timestamp()
        WHERE q.domain = OLD.domain AND NOT q.ready AND q.waiting_for = 'room'
          AND q.wake_at > clock_timestamp()
          AND NOT EXISTS (SELECT 1 FROM scraping.domains d
                          WHERE d.domain = OLD.domain AND d.blocked_until > clock_timestamp());
    END IF;
    RETURN NULL;
END
$fn$;

DROP TRIGGER jobs_fair_tag_insert ON scraping.jobs;
CREATE TRIGGER jobs_fair_tag_insert BEFORE INSERT ON scraping.jobs
    FOR EACH ROW WHEN (NEW.status = 'queued' AND NEW.fair_tag IS NULL)
    EXECUTE FUNCTION scraping.jobs_fair_tag();
DROP TRIGGER jobs_domain_queue_insert ON scraping.jobs;
CREATE TRIGGER jobs_domain_queue_insert AFTER INSERT ON scraping.jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION scraping.jobs_inserted_domain_queues();
