-- 0025: scraping.submit_job checks a URL as POST /jobs does (scraping.job_url_host).
-- A job's URL or callback as POST /jobs accepts it (pin_orchestration/scraping/hosts.py,
-- check_url, rule for rule), and its host key: at most 2048 characters; no whitespace or
-- control character; http(s)://, then an authority without userinfo or backslash: a name
-- of letters, digits, '-', '_' and dots (lowercased, its trailing dot dropped) or an IPv6
-- literal in brackets (lowercased, as written); a port of 1 to 5 digits, 1 to 65535.
-- SQLSTATE 22023 naming p_argument otherwise.
CREATE OR REPLACE FUNCTION scraping.job_url_host(p_url text, p_argument text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    v_bad text;
    v_parts text[];
    v_authority text;
    v_hostport text[];
    v_host text;
    v_port text;
BEGIN
    IF p_url IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', p_argument USING ERRCODE = '22023';
    END IF;
    IF length(p_url) > 2048 THEN
        RAISE EXCEPTION '% is longer than 2048 characters', p_argument USING ERRCODE = '22023';
    END IF;
    v_bad := substring(
        p_url FROM '[\x01-\x20\x7f-\x9f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]');
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION '% must not contain whitespace or control characters (found U+%): '
            'percent-encode it', p_argument, upper(lpad(to_hex(ascii(v_bad)), 4, '0'))
            USING ERRCODE = '22023';
    END IF;
    v_parts := regexp_match(p_url, '^[Hh][Tt][Tt][Pp][Ss]?://([^/?#]*)');
    IF v_parts IS NULL THEN
        RAISE EXCEPTION '% must be an http:// or https:// URL (got %)',
            p_argument, quote_literal(left(p_url, 80))
            USING ERRCODE = '22023';
    END IF;
    v_authority := v_parts[1];
    IF position('@' IN v_authority) > 0 THEN
        RAISE EXCEPTION '%: credentials in a URL are not accepted (remove the '
            'user:password@ part)', p_argument
            USING ERRCODE = '22023';
    END IF;
    IF position(E'\\' IN v_authority) > 0 THEN
        RAISE EXCEPTION '% has a backslash in its host: write / or percent-encode it',
            p_argument USING ERRCODE = '22023';
    END IF;
    v_hostport := regexp_match(v_authority, '^(\[[0-9A-Fa-f:]*\]|[^:\[\]]*)(?::([0-9]*))?$');
    IF v_hostport IS NULL THEN
        RAISE EXCEPTION '% has an invalid host or port: %', p_argument,
            quote_literal(left(v_authority, 80))
            USING ERRCODE = '22023';
    END IF;
    v_host := v_hostport[1];
    v_port := v_hostport[2];
    IF v_port <> '' AND (length(v_port) > 5 OR v_port::integer NOT BETWEEN 1 AND 65535) THEN
        RAISE EXCEPTION '% has an invalid port %: give 1 to 65535', p_argument,
            quote_literal(v_port)
            USING ERRCODE = '22023';
    END IF;
    IF v_host IN ('', '[]') THEN
        RAISE EXCEPTION '% has no host', p_argument USING ERRCODE = '22023';
    END IF;
    IF left(v_host, 1) = '[' THEN
        v_host := substr(v_host, 2, length(v_host) - 2);
        BEGIN
            IF family(v_host::inet) = 6 THEN
                RETURN lower(v_host COLLATE "C");
            END IF;
        EXCEPTION WHEN invalid_text_representation THEN
            NULL;
        END;
        RAISE EXCEPTION '% has an invalid IPv6 address %', p_argument,
            quote_literal(left(v_host, 80))
            USING ERRCODE = '22023';
    END IF;
    IF v_host ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?$' THEN
        RETURN rtrim(lower(v_host COLLATE "C"), '.');
    END IF;
    IF v_host ~ '^[\x01-\x7f]*$' THEN
        RAISE EXCEPTION '% has a host that is not a valid name (%): use letters, digits, '
            '''-'', ''_'' and dots', p_argument, quote_literal(left(v_host, 80))
            USING ERRCODE = '22023';
    END IF;
    RAISE EXCEPTION '% has a host with non-ASCII characters (%): give it in its IDNA '
        'ASCII form (xn--..., as Python''s idna.encode writes it); POST /jobs takes either',
        p_argument, quote_literal(left(v_host, 80))
        USING ERRCODE = '22023';
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
-- Validates as POST /jobs does (SQLSTATE 22023, the message naming the argument), keys
-- the domain as the fetcher resolves the host (scraping.job_url_host), inserts the job
-- (its fair tag and domain queue come from the triggers of migration 0011). Same key and
-- same body: the first job's id; same key, other body: SQLSTATE 23505 naming the key. A
-- key is remembered 24 hours (the API's documented TTL).
DECLARE
    v_domain text;
    v_digest text;
    v_id uuid;
    v_existing record;
BEGIN
    IF p_tenant_id IS NULL
       OR NOT EXISTS (SELECT 1 FROM scraping.tenants t WHERE t.id = p_tenant_id) THEN
        RAISE EXCEPTION 'p_tenant_id: no tenant %', coalesce(p_tenant_id::text, 'NULL')
            USING ERRCODE = '22023', HINT = 'pin tenant list shows the tenants';
    END IF;
    v_domain := scraping.job_url_host(p_url, 'p_url');
    IF p_callback_url IS NOT NULL THEN
        PERFORM scraping.job_url_host(p_callback_url, 'p_callback_url');
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
        pin.uuid7(), p_tenant_id, p_url, v_domain, p_params,
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

DROP FUNCTION scraping.check_job_url(text, text);
