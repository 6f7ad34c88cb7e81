-- 0020 down: the announcement of 0018 (the queue read without a lock).
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
