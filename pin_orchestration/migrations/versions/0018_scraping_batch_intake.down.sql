-- 0018 down: a fair tag and a domain-queue announcement per inserted job (0011-0017).
DROP TRIGGER jobs_domain_queue_insert ON scraping.jobs;
DROP TRIGGER jobs_fair_tag_insert ON scraping.jobs;

CREATE OR REPLACE FUNCTION scraping.jobs_fair_tag() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    v_step double precision;
    v_clock double precision;
BEGIN
    SELECT 1.0 / t.weight INTO v_step FROM scraping.tenants t WHERE t.id = NEW.tenant_id;
    SELECT c.tenant_clock INTO v_clock FROM scraping.pick_classes c
    WHERE c.priority = NEW.priority;
    INSERT INTO scraping.tenant_vtimes AS v (priority, tenant_id, vtime)
    VALUES (NEW.priority, NEW.tenant_id, v_clock + v_step)
    ON CONFLICT (priority, tenant_id) DO UPDATE
    SET vtime = greatest(v.vtime, v_clock) + v_step
    RETURNING v.vtime - v_step INTO NEW.fair_tag;
    RETURN NEW;
END
$fn$;

CREATE OR REPLACE FUNCTION scraping.jobs_domain_queue() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    v_blocked timestamptz;
BEGIN
    IF NEW.status = 'queued' AND (TG_OP = 'INSERT' OR OLD.status <> 'queued') THEN
        -- The common case writes nothing: a queue that already sorts at or before this
        -- job and is not waiting for a later due time (so intake does not lock a row a
        -- claim may be holding).
        PERFORM 1 FROM scraping.domain_queues q
        WHERE q.domain = NEW.domain AND q.priority = NEW.priority
          AND q.head_tag <= NEW.fair_tag
          AND (q.ready OR q.waiting_for = 'room' OR q.wake_at <= NEW.next_attempt_at);
        IF NOT FOUND THEN
            INSERT INTO scraping.domains (domain) VALUES (NEW.domain)
            ON CONFLICT (domain) DO NOTHING;
            SELECT d.blocked_until INTO v_blocked FROM scraping.domains d
            WHERE d.domain = NEW.domain AND d.blocked_until > clock_timestamp();
            INSERT INTO scraping.domain_queues AS q
                (domain, priority, head_tag, ready, waiting_for, wake_at)
            SELECT NEW.domain, NEW.priority, NEW.fair_tag, s.waiting_for IS NULL,
                   s.waiting_for, s.wake_at
            FROM (SELECT CASE WHEN v_blocked IS NOT NULL THEN 'room'
                              WHEN NEW.next_attempt_at > clock_timestamp() THEN 'due'
                         END AS waiting_for,
                         coalesce(v_blocked, CASE WHEN NEW.next_attempt_at > clock_timestamp()
                                                  THEN NEW.next_attempt_at END) AS wake_at) s
            ON CONFLICT (domain, priority) DO UPDATE
            SET head_tag = least(q.head_tag, EXCLUDED.head_tag),
                wake_at = CASE WHEN q.waiting_for = 'due'
                               THEN least(q.wake_at, NEW.next_attempt_at)
                               ELSE q.wake_at END;
        END IF;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.status = 'running' AND NEW.status <> 'running' THEN
        UPDATE scraping.domain_queues q SET wake_at = clock_timestamp()
        WHERE q.domain = OLD.domain AND NOT q.ready AND q.waiting_for = 'room'
          AND q.wake_at > clock_timestamp()
          AND NOT EXISTS (SELECT 1 FROM scraping.domains d
                          WHERE d.domain = OLD.domain AND d.blocked_until > clock_timestamp());
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER jobs_fair_tag_insert BEFORE INSERT ON scraping.jobs
    FOR EACH ROW WHEN (NEW.status = 'queued')
    EXECUTE FUNCTION scraping.jobs_fair_tag();
CREATE TRIGGER jobs_domain_queue_insert AFTER INSERT ON scraping.jobs
    FOR EACH ROW WHEN (NEW.status = 'queued')
    EXECUTE FUNCTION scraping.jobs_domain_queue();
DROP FUNCTION scraping.jobs_inserted_domain_queues();
DROP FUNCTION scraping.announce_queued_jobs(text, text, double precision, timestamptz);
DROP FUNCTION scraping.take_fair_tags(uuid, text, integer);
