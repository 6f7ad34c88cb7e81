-- 0025 down: 0011's check_job_url and submit_job, which keys the domain with idna_host.
-- A job's URL or callback as POST /jobs accepts it: http(s), a host, at most 2048
-- characters, no whitespace.
CREATE OR REPLACE FUNCTION scraping.check_job_url(p_url text, p_argument text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    v_authority text;
    v_port text;
BEGIN
    IF p_url IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', p_argument USING ERRCODE = '22023';
    END IF;
    IF length(p_url) > 2048 THEN
        RAISE EXCEPTION '% is longer than 2048 characters', p_argument USING ERRCODE = '22023';
    END IF;
    IF p_url ~ '\s' THEN
        RAISE EXCEPTION '% must not contain whitespace', p_argument USING ERRCODE = '22023';
    END IF;
    v_authority := substring(p_url FROM '^[Hh][Tt][Tt][Pp][Ss]?://([^/?#]*)');
    IF v_authority IS NULL THEN
        RAISE EXCEPTION '% must be an http:// or https:// URL (got %)',
            p_argument, quote_literal(left(p_url, 80))
            USING ERRCODE = '22023';
    END IF;
    v_authority := regexp_replace(v_authority, '^.*@', '');
    v_port := substring(v_authority FROM '(?:^\[[^]]*\]|^[^:\[]*):(.*)$');
    IF regexp_replace(v_authority, '^(\[[^]]*\]|[^:]*).*$', '\1') IN ('', '[]') THEN
        RAISE EXCEPTION '% has no host', p_argument USING ERRCODE = '22023';
    END IF;
    IF v_port IS NOT NULL AND v_port <> ''
       AND (v_port !~ '^[0-9]{1,5}$' OR v_port::integer NOT BETWEEN 1 AND 65535) THEN
        RAISE EXCEPTION '% has an invalid port %', p_argument, quote_literal(v_port)
            USING ERRCODE = '22023';
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION scraping.submit_job(
    p_tenant_id uuid,
    p_url text,
    p_params jsonb DEFAULT '{}',
    p_priority text DEFAULT 'normal',
    p_callback_url text DEFAULT NULL,
    p_idempotency_key text DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $fn$
-- Validates as POST /jobs does (SQLSTATE 22023, the message naming the argument), derives
-- the domain, inserts the job (its fair tag and domain queue come from the triggers of
-- migration 0011). Same key and same body: the first job's id; same key, other body:
-- SQLSTATE 23505 naming the key. A key is remembered 24 hours (the API's documented TTL).
DECLARE
    v_authority text;
    v_host text;
    v_digest text;
    v_id uuid;
    v_existing record;
BEGIN
    IF p_tenant_id IS NULL
       OR NOT EXISTS (SELECT 1 FROM scraping.tenants t WHERE t.id = p_tenant_id) THEN
        RAISE EXCEPTION 'p_tenant_id: no tenant %', coalesce(p_tenant_id::text, 'NULL')
            USING ERRCODE = '22023', HINT = 'pin tenant list shows the tenants';
    END IF;
    PERFORM scraping.check_job_url(p_url, 'p_url');
    IF p_callback_url IS NOT NULL THEN
        PERFORM scraping.check_job_url(p_callback_url, 'p_callback_url');
    END IF;
    IF p_params IS NULL OR jsonb_typeof(p_params) <> 'object' THEN
        RAISE EXCEPTION 'p_params must be a JSON object (got %)',
            coalesce(jsonb_typeof(p_params), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_priority IS NULL OR p_priority NOT IN ('high', 'normal', 'low') THEN
        RAISE EXCEPTION 'p_priority must be high, normal or low (got %)',
            coalesce(quote_literal(p_priority), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_idempotency_key IS NOT NULL
       AND (length(p_idempotency_key) NOT BETWEEN 1 AND 255) THEN
        RAISE EXCEPTION 'p_idempotency_key must be 1 to 255 characters (got %)',
            length(p_idempotency_key)
            USING ERRCODE = '22023';
    END IF;

    v_authority := substring(p_url FROM '^[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)');
    v_authority := regexp_replace(v_authority, '^.*@', '');
    IF v_authority LIKE '[%' THEN
        v_host := substring(v_authority FROM '^(\[[^]]*\])');
    ELSE
        v_host := split_part(v_authority, ':', 1);
    END IF;
    v_digest := scraping.request_sha256(p_url, p_params, p_priority, p_callback_url);

    IF p_idempotency_key IS NOT NULL THEN
        UPDATE scraping.jobs j SET idempotency_key = NULL
        WHERE j.tenant_id = p_tenant_id AND j.idempotency_key = p_idempotency_key
          AND j.created_at < now() - interval '24 hours';
    END IF;
    INSERT INTO scraping.jobs AS j (
        id, tenant_id, url, domain, params, priority, callback_url, idempotency_key,
        request_sha256
    )
    VALUES (
        pin.uuid7(), p_tenant_id, p_url, scraping.idna_host(v_host), p_params,
        p_priority, p_callback_url, p_idempotency_key, v_digest
    )
    ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING j.id INTO v_id;
    IF v_id IS NOT NULL THEN
        RETURN v_id;
    END IF;
    -- The key's first job (a concurrent insert of it has committed by now).
    SELECT j.id, j.request_sha256 INTO v_existing FROM scraping.jobs j
    WHERE j.tenant_id = p_tenant_id AND j.idempotency_key = p_idempotency_key;
    IF v_existing.request_sha256 IS DISTINCT FROM v_digest THEN
        RAISE EXCEPTION 'p_idempotency_key % was already used with a different request',
            quote_literal(p_idempotency_key)
            USING ERRCODE = '23505', HINT = 'use a new key for a new job';
    END IF;
    RETURN v_existing.id;
END
$fn$;

DROP FUNCTION scraping.job_url_host(text, text);
