-- Redirect hops to another host (README "Scheduling"): a hop counts against the HOP
-- host's limits, shared by every worker, with the claim's rules (scraping.claim_jobs): no
-- pause, a token in the bucket, a free connection. A connection held by a hop is a row of
-- scraping.redirect_slots until the hop's fetch ends (at the latest p_hold_seconds, the
-- fetch deadline: a killed worker's slot lapses by itself), and the claim counts those
-- rows with the domain's running jobs.
--
-- scraping.take_redirect_slot: for attempt p_attempt of job p_job_id, about to follow a
-- redirect to host p_host. Gives back the job's slot of an earlier hop first (one hop at
-- a time). Returns 0 when the hop may go (a token spent, a connection held), else the
-- seconds to wait before asking again. Every hop is a request to its host and spends a
-- token of it, a hop back to the job's own domain too (five hops on the claim's one token
-- sent six requests in a second to a host of 1 rps); only the connection is the claim's
-- there, so such a hop holds no slot. It waits only for the domain's row lock and holds
-- no other.
CREATE OR REPLACE FUNCTION scraping.take_redirect_slot(
    p_job_id uuid,
    p_attempt integer,
    p_host text,
    p_hold_seconds double precision,
    p_default_rps double precision,
    p_default_concurrency integer
) RETURNS double precision
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_domain_name text := scraping.idna_host(p_host);
    v_domain scraping.domains;
    v_now timestamptz;
    v_rps double precision;
    v_tokens double precision;
    v_running integer;
    v_own boolean;
BEGIN
    PERFORM scraping.release_redirect_slot(p_job_id, p_attempt);
    v_own := EXISTS (SELECT 1 FROM scraping.jobs j
                     WHERE j.id = p_job_id AND j.domain = v_domain_name);
    INSERT INTO scraping.domains (domain) VALUES (v_domain_name)
    ON CONFLICT (domain) DO NOTHING;
    SELECT d.* INTO v_domain FROM scraping.domains d
    WHERE d.domain = v_domain_name
    FOR UPDATE;
    v_now := clock_timestamp();

    IF v_domain.blocked_until > v_now THEN
        RETURN extract(epoch FROM v_domain.blocked_until - v_now);
    END IF;
    v_rps := coalesce(v_domain.rps, p_default_rps);
    v_tokens := scraping.domain_tokens(v_domain, v_rps, v_now);
    IF v_tokens < 1 THEN
        RETURN (1 - v_tokens) / v_rps;
    END IF;
    IF NOT v_own THEN
        SELECT (SELECT count(*) FROM scraping.jobs j
                WHERE j.status = 'running' AND j.domain = v_domain_name)
             + (SELECT count(*) FROM scraping.redirect_slots s
                WHERE s.domain = v_domain_name AND s.expires_at > v_now)
        INTO v_running;
        IF v_running >= coalesce(v_domain.concurrency, p_default_concurrency) THEN
            -- A job or hop finishing frees it; nothing tells a waiting hop: it asks again.
            RETURN 0.05;
        END IF;
    END IF;

    UPDATE scraping.domains d
    SET tokens = v_tokens - 1, tokens_at = greatest(v_now, d.tokens_at)
    WHERE d.domain = v_domain_name;
    IF NOT v_own THEN
        INSERT INTO scraping.redirect_slots (job_id, attempt, domain, expires_at)
        VALUES (p_job_id, p_attempt, v_domain_name,
                v_now + make_interval(secs => p_hold_seconds));
    END IF;
    RETURN 0;
END
$fn$;

-- The hop's fetch ended: its connection is free, so the domain's flows set aside for want
-- of one look again at the next claim (as a job leaving `running` does).
CREATE OR REPLACE FUNCTION scraping.release_redirect_slot(p_job_id uuid, p_attempt integer)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_domain_name text;
BEGIN
    DELETE FROM scraping.redirect_slots s
    WHERE s.job_id = p_job_id AND s.attempt = p_attempt
    RETURNING s.domain INTO v_domain_name;
    IF v_domain_name IS NOT NULL THEN
        PERFORM scraping.wake_room_flows(v_domain_name);
    END IF;
END
$fn$;
