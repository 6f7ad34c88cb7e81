-- 0048: a pause (and a resume) locks its host's queue rows and flows in key order before
-- the host's row (scraping.lock_domain_rows),
-- and the trigger that sets them aside or wakes them fires only when the pause, the rate or
-- the connections changed. Found by a hostile review:
-- - a pause's trigger took a host's queue rows and flows in its scan order with the host's
--   row held, while intake, the sweeper, the requeue runbook and rounds take them in key
--   order (intake the host's row after its queue rows): a pause deadlocked with a batch
--   intake (the producer's batch failed) or the sweeper on one host's rows;
-- - every robots.txt refresh that rewrote Crawl-delay or the default rate (naming rps so a
--   lifted delay wakes the flows) woke the flows waiting for the host's next token even
--   when the rate stayed the same, and the next claim spent its set-aside budget putting
--   them back.

DROP TRIGGER domains_domain_queue_update ON scraping.domains;
CREATE TRIGGER domains_domain_queue_update
    AFTER UPDATE OF blocked_until, rps, concurrency ON scraping.domains
    FOR EACH ROW
    WHEN (OLD.blocked_until IS DISTINCT FROM NEW.blocked_until
          OR OLD.rps IS DISTINCT FROM NEW.rps
          OR OLD.concurrency IS DISTINCT FROM NEW.concurrency)
    EXECUTE FUNCTION scraping.domains_domain_queue();

CREATE OR REPLACE FUNCTION scraping.lock_domain_rows(p_host text)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM 1 FROM scraping.domain_queues q WHERE q.domain = p_host
    ORDER BY q.priority FOR NO KEY UPDATE;
    PERFORM 1 FROM scraping.tenant_flows f WHERE f.domain = p_host
    ORDER BY f.priority, f.tenant_id FOR NO KEY UPDATE;
END
$fn$;

CREATE OR REPLACE FUNCTION scraping.pause_domain(p_domain text, p_until timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_cap double precision := coalesce(
        nullif(current_setting('pin.scraping_max_pause_seconds', true), '')::double precision,
        3600);
    v_until timestamptz;
    v_kept timestamptz;
    v_host text;
BEGIN
    IF p_domain IS NULL OR btrim(p_domain) = '' THEN
        RAISE EXCEPTION 'p_domain must name a host' USING ERRCODE = '22023';
    END IF;
    IF p_until IS NULL OR p_until <= clock_timestamp() THEN
        SELECT d.blocked_until INTO v_kept FROM scraping.domains d
        WHERE d.domain = scraping.idna_host(p_domain) AND d.blocked_until > clock_timestamp();
        RETURN v_kept;
    END IF;
    v_until := least(p_until, clock_timestamp() + make_interval(secs => v_cap));
    v_host := scraping.idna_host(p_domain);
    -- A pause that lengthens sets the host's queues and flows aside (its trigger), so it
    -- takes them first, in key order (scraping.lock_domain_rows). A pause that would change
    -- nothing locks nothing more: read under KEY SHARE, which waits for a resume under way
    -- (FOR UPDATE) and reads what it left (read past it, the pause was taken for no change,
    -- its trigger then took the rows in its own order).
    PERFORM 1 FROM scraping.domains d
    WHERE d.domain = v_host AND d.blocked_until >= v_until
    FOR KEY SHARE;
    IF NOT FOUND THEN
        PERFORM scraping.lock_domain_rows(v_host);
    END IF;
    INSERT INTO scraping.domains AS d (domain, blocked_until)
    VALUES (v_host, v_until)
    ON CONFLICT (domain) DO UPDATE
    SET blocked_until = greatest(coalesce(d.blocked_until, '-infinity'), EXCLUDED.blocked_until),
        updated_at = now()
    RETURNING d.blocked_until INTO v_kept;
    RETURN v_kept;
END
$fn$;

CREATE OR REPLACE FUNCTION scraping.resume_domain(p_domain text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_was_paused boolean;
    v_host text;
BEGIN
    IF p_domain IS NULL OR btrim(p_domain) = '' THEN
        RAISE EXCEPTION 'p_domain must name a host' USING ERRCODE = '22023';
    END IF;
    -- Its trigger wakes the host's queues and flows: taken first, in key order, as a pause
    -- takes them (a resume holding the host's row deadlocked with a pause holding them).
    v_host := scraping.idna_host(p_domain);
    PERFORM scraping.lock_domain_rows(v_host);
    SELECT d.blocked_until > clock_timestamp() INTO v_was_paused FROM scraping.domains d
    WHERE d.domain = v_host AND d.blocked_until IS NOT NULL
    FOR UPDATE;
    UPDATE scraping.domains d SET blocked_until = NULL, updated_at = now()
    WHERE d.domain = v_host AND d.blocked_until IS NOT NULL;
    RETURN coalesce(v_was_paused, false);
END
$fn$;
