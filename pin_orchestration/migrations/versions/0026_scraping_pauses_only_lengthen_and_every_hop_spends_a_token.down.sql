-- 0026 down: pause_domain lifts a pause given a past or NULL until; a hop to the job's own
-- host is free (scraping/sql/pause_domain.sql, redirect_slots.sql before 0026).
DROP FUNCTION scraping.resume_domain(text);
DROP INDEX scraping.ix_job_attempts_finished;
CREATE INDEX ix_job_attempts_started ON scraping.job_attempts USING btree (started_at);

-- A domain's pause (a 429 or Retry-After from it, or an operator): no worker sends it
-- anything before the pause ends. The pause kept is capped at the session's
-- pin.scraping_max_pause_seconds (the worker sets it from PIN_SCRAPING_MAX_PAUSE_SECONDS;
-- 3600 when unset), so `Retry-After: Fri, 31 Dec 9999 …` cannot stop a domain for every
-- tenant for ever. A longer pause already in force stands; p_until NULL or in the past
-- lifts the pause (`pin scraping domain resume`). Returns the pause kept (NULL: none).
CREATE OR REPLACE FUNCTION scraping.pause_domain(p_domain text, p_until timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_cap double precision := coalesce(
        nullif(current_setting('pin.scraping_max_pause_seconds', true), '')::double precision,
        3600);
    v_until timestamptz;
    v_kept timestamptz;
BEGIN
    IF p_domain IS NULL OR btrim(p_domain) = '' THEN
        RAISE EXCEPTION 'p_domain must name a host' USING ERRCODE = '22023';
    END IF;
    IF p_until IS NULL OR p_until <= clock_timestamp() THEN
        UPDATE scraping.domains d SET blocked_until = NULL, updated_at = now()
        WHERE d.domain = scraping.idna_host(p_domain) AND d.blocked_until IS NOT NULL;
        RETURN NULL;
    END IF;
    v_until := least(p_until, clock_timestamp() + make_interval(secs => v_cap));
    INSERT INTO scraping.domains AS d (domain, blocked_until)
    VALUES (scraping.idna_host(p_domain), v_until)
    ON CONFLICT (domain) DO UPDATE
    SET blocked_until = greatest(
            least(coalesce(d.blocked_until, '-infinity'),
                  clock_timestamp() + make_interval(secs => v_cap)),
            EXCLUDED.blocked_until),
        updated_at = now()
    RETURNING d.blocked_until INTO v_kept;
    RETURN v_kept;
END
$fn$;

-- Redirect hops to another host (README "Scheduling"): a hop counts against the HOP
-- host's limits, shared by every worker, with the claim's rules (scraping.claim_jobs): no
-- pause, a token in the bucket, a free connection. A connection held by a hop is a row of
-- scraping.redirect_slots until the hop's fetch ends (at the latest p_hold_seconds, the
-- fetch deadline: a killed worker's slot lapses by itself), and the claim counts those
-- rows with the domain's running jobs.
--
-- scraping.take_redirect_slot: for attempt p_attempt of job p_job_id, about to follow a
-- redirect to host p_host. Gives back the job's slot of an earlier hop first (one hop at
-- a time). Returns 0 when the hop may go (a token spent, a connection held; a hop back to
-- the job's own domain needs neither: the claim gave it both), else the seconds to wait
-- before asking again. It waits only for the domain's row lock and holds no other.
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
BEGIN
    PERFORM scraping.release_redirect_slot(p_job_id, p_attempt);
    IF EXISTS (SELECT 1 FROM scraping.jobs j
               WHERE j.id = p_job_id AND j.domain = v_domain_name) THEN
        RETURN 0;
    END IF;
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
    SELECT (SELECT count(*) FROM scraping.jobs j
            WHERE j.status = 'running' AND j.domain = v_domain_name)
         + (SELECT count(*) FROM scraping.redirect_slots s
            WHERE s.domain = v_domain_name AND s.expires_at > v_now)
    INTO v_running;
    IF v_running >= coalesce(v_domain.concurrency, p_default_concurrency) THEN
        -- A job or hop finishing frees it; nothing tells a waiting hop, so it asks again.
        RETURN 0.05;
    END IF;

    UPDATE scraping.domains d
    SET tokens = v_tokens - 1, tokens_at = greatest(v_now, d.tokens_at)
    WHERE d.domain = v_domain_name;
    INSERT INTO scraping.redirect_slots (job_id, attempt, domain, expires_at)
    VALUES (p_job_id, p_attempt, v_domain_name, v_now + make_interval(secs => p_hold_seconds));
    RETURN 0;
END
$fn$;

-- The hop's fetch ended: its connection is free, so the domain's queues set aside for
-- want of one look again at the next claim (as a job leaving `running` does).
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
        UPDATE scraping.domain_queues q SET wake_at = clock_timestamp()
        WHERE q.domain = v_domain_name AND NOT q.ready AND q.waiting_for = 'room'
          AND q.wake_at > clock_timestamp()
          AND NOT EXISTS (SELECT 1 FROM scraping.domains d
                          WHERE d.domain = v_domain_name AND d.blocked_until > clock_timestamp());
    END IF;
END
$fn$;
