-- A host's queue rows, then its flows, locked in key order (priority; priority, tenant):
-- the order intake, the sweeper, the requeue runbook and rounds take them in. A writer of
-- the host's row whose trigger (domains_domain_queue) sets them aside or wakes them calls
-- this first: the trigger takes them in its scan order with the host's row held, and a
-- pause so deadlocked with a batch intake or the sweeper on one host's rows.
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

-- A domain's pause (a 429 or Retry-After from it, or an operator): no worker sends it
-- anything before the pause ends. The pause this call asks for is capped at the session's
-- pin.scraping_max_pause_seconds (the worker sets it from PIN_SCRAPING_MAX_PAUSE_SECONDS;
-- 3600 when unset), so `Retry-After: Fri, 31 Dec 9999 …` cannot stop a domain for every
-- tenant for ever. Pauses only lengthen: a longer pause already in force stands, whatever this
-- session's cap (a worker or CLI with a smaller PIN_SCRAPING_MAX_PAUSE_SECONDS must not cut
-- another's pause), and
-- p_until NULL or already past changes nothing (an outcome held through a database blip
-- arrives with its pause over; it must not lift another worker's longer one). Only
-- scraping.resume_domain (an operator: `pin scraping domain resume`) lifts a pause.
-- Returns the pause in force afterwards (NULL: none).
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

-- An operator lifts a domain's pause at once. Returns whether one was in force.
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
