-- 0048 down: the pause takes its host's rows in the trigger's order, and the trigger fires
-- on every update naming its columns (0034's pause_domain, 0011's trigger).

DROP TRIGGER domains_domain_queue_update ON scraping.domains;
CREATE TRIGGER domains_domain_queue_update
    AFTER UPDATE OF blocked_until, rps, concurrency ON scraping.domains
    FOR EACH ROW
    EXECUTE FUNCTION scraping.domains_domain_queue();

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
        SELECT d.blocked_until INTO v_kept FROM scraping.domains d
        WHERE d.domain = scraping.idna_host(p_domain) AND d.blocked_until > clock_timestamp();
        RETURN v_kept;
    END IF;
    v_until := least(p_until, clock_timestamp() + make_interval(secs => v_cap));
    INSERT INTO scraping.domains AS d (domain, blocked_until)
    VALUES (scraping.idna_host(p_domain), v_until)
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
BEGIN
    IF p_domain IS NULL OR btrim(p_domain) = '' THEN
        RAISE EXCEPTION 'p_domain must name a host' USING ERRCODE = '22023';
    END IF;
    SELECT d.blocked_until > clock_timestamp() INTO v_was_paused FROM scraping.domains d
    WHERE d.domain = scraping.idna_host(p_domain) AND d.blocked_until IS NOT NULL
    FOR UPDATE;
    UPDATE scraping.domains d SET blocked_until = NULL, updated_at = now()
    WHERE d.domain = scraping.idna_host(p_domain) AND d.blocked_until IS NOT NULL;
    RETURN coalesce(v_was_paused, false);
END
$fn$;

DROP FUNCTION scraping.lock_domain_rows(text);
