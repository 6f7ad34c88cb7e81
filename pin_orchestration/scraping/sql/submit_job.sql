-- Intake from SQL (docs/integration.md): another service submits a job in its own
-- transaction (the job exists exactly when that transaction commits), one row or
-- set-based (`SELECT scraping.submit_job(t.id, u.url) FROM …`). The API's doors check a
-- job in Python (pin_orchestration/scraping/hosts.py) and insert it with queries.sql's
-- insert_jobs; scraping.job_url_host is hosts.check_url in SQL, held equal to it by
-- tests/scraping/test_intake_differential.py, but for one thing: a host with non-ASCII
-- characters is refused here (IDNA 2008 is the `idna` package's, not PostgreSQL's), its
-- ASCII (xn--) form accepted with the key POST /jobs gives the Unicode one.

-- One key per IPv6 address, whatever its spelling (hosts.ipv6_key, rule for rule): the
-- compressed form of RFC 5952 as Python's ipaddress writes it (lowercase hex, no leading
-- zeros, the first longest run of two or more zero groups as ::, no embedded dotted
-- quad), an IPv4-mapped address as the IPv4 address it reaches. PostgreSQL's inet
-- output is that but for its dotted tails (::ffff:127.0.0.1, ::1.2.3.4), rewritten here.
-- 22P02 for what is not an IPv6 address.
CREATE OR REPLACE FUNCTION scraping.ipv6_key(p_address text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $fn$
DECLARE
    v_inet inet := CAST(p_address AS inet);
    v text;
    m text[];
    g text[];
    v_tail text[];
    v_run integer := 0;
    v_start integer := 0;
    v_best integer := 0;
    v_best_start integer := 0;
BEGIN
    IF family(v_inet) <> 6 OR masklen(v_inet) <> 128 THEN
        RAISE EXCEPTION 'not an IPv6 address: %', quote_literal(left(p_address, 80))
            USING ERRCODE = '22P02';
    END IF;
    v := host(v_inet);
    m := regexp_match(v, '^::ffff:([0-9]+\.[0-9]+\.[0-9]+\.[0-9]+)$');
    IF m IS NOT NULL THEN
        RETURN m[1];
    END IF;
    m := regexp_match(v, '^(.*:)([0-9]+)\.([0-9]+)\.([0-9]+)\.([0-9]+)$');
    IF m IS NOT NULL THEN
        v := m[1] || to_hex(m[2]::integer * 256 + m[3]::integer) || ':'
            || to_hex(m[4]::integer * 256 + m[5]::integer);
    END IF;
    IF position('::' IN v) > 0 THEN
        g := CASE WHEN split_part(v, '::', 1) = '' THEN '{}'::text[]
                  ELSE string_to_array(split_part(v, '::', 1), ':') END;
        v_tail := CASE WHEN split_part(v, '::', 2) = '' THEN '{}'::text[]
                       ELSE string_to_array(split_part(v, '::', 2), ':') END;
        g := g || array_fill('0'::text, ARRAY[8 - cardinality(g) - cardinality(v_tail)])
            || v_tail;
    ELSE
        g := string_to_array(v, ':');
    END IF;
    FOR i IN 1..8 LOOP
        g[i] := to_hex(('x' || lpad(g[i], 8, '0'))::bit(32)::integer);
        IF g[i] = '0' THEN
            IF v_run = 0 THEN
                v_start := i;
            END IF;
            v_run := v_run + 1;
            IF v_run > v_best THEN
                v_best := v_run;
                v_best_start := v_start;
            END IF;
        ELSE
            v_run := 0;
        END IF;
    END LOOP;
    IF v_best < 2 THEN
        RETURN array_to_string(g, ':');
    END IF;
    RETURN array_to_string(g[1:v_best_start - 1], ':') || '::'
        || array_to_string(g[v_best_start + v_best:8], ':');
END
$fn$;

-- A host named by the worker (a pause, a redirect hop: ASCII, as requests sends it) as
-- the politeness limits key it: no trailing dot, lowercased, an IPv6 literal without
-- brackets in its one spelling (scraping.ipv6_key). (Its punycode of a non-ASCII name is not IDNA 2008's: intake no longer
-- uses it.)
CREATE OR REPLACE FUNCTION scraping.idna_host(p_host text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $fn$
DECLARE
    v_host text := lower(rtrim(btrim(p_host), '.'));
    v_labels text[];
    v_out text[] := '{}';
    v_label text;
    cps integer[];
    n integer; delta bigint; bias integer; h integer; b integer; m integer;
    q bigint; k integer; t integer; v_enc text;
    first boolean;
BEGIN
    IF v_host LIKE '[%]' THEN
        v_host := substr(v_host, 2, length(v_host) - 2);
    END IF;
    IF position(':' IN v_host) > 0 THEN
        BEGIN
            RETURN scraping.ipv6_key(v_host);
        EXCEPTION WHEN invalid_text_representation THEN
            RETURN v_host;
        END;
    END IF;
    IF v_host ~ '^[\x01-\x7f]*$' THEN
        RETURN v_host;
    END IF;
    v_labels := string_to_array(normalize(v_host, NFKC), '.');
    FOREACH v_label IN ARRAY v_labels LOOP
        IF v_label ~ '^[\x01-\x7f]*$' THEN
            v_out := v_out || v_label;
            CONTINUE;
        END IF;
        SELECT array_agg(ascii(c) ORDER BY o) INTO cps
        FROM unnest(string_to_array(v_label, NULL)) WITH ORDINALITY AS u(c, o);
        v_enc := '';
        FOR i IN 1..array_length(cps, 1) LOOP
            IF cps[i] < 128 THEN v_enc := v_enc || chr(cps[i]); END IF;
        END LOOP;
        b := length(v_enc);
        h := b;
        IF b > 0 THEN v_enc := v_enc || '-'; END IF;
        n := 128; delta := 0; bias := 72; first := true;
        WHILE h < array_length(cps, 1) LOOP
            SELECT min(c) INTO m FROM unnest(cps) AS c WHERE c >= n;
            delta := delta + (m - n)::bigint * (h + 1);
            n := m;
            FOR i IN 1..array_length(cps, 1) LOOP
                IF cps[i] < n THEN delta := delta + 1; END IF;
                IF cps[i] = n THEN
                    q := delta;
                    k := 36;
                    LOOP
                        t := CASE WHEN k <= bias THEN 1 WHEN k >= bias + 26 THEN 26
                                  ELSE k - bias END;
                        EXIT WHEN q < t;
                        v_enc := v_enc || scraping.punycode_digit((t + (q - t) % (36 - t))::integer);
                        q := (q - t) / (36 - t);
                        k := k + 36;
                    END LOOP;
                    v_enc := v_enc || scraping.punycode_digit(q::integer);
                    -- adapt the bias (RFC 3492 §6.1)
                    delta := CASE WHEN first THEN delta / 700 ELSE delta / 2 END;
                    delta := delta + delta / (h + 1);
                    k := 0;
                    WHILE delta > 455 LOOP
                        delta := delta / 35;
                        k := k + 36;
                    END LOOP;
                    bias := k + (36 * delta) / (delta + 38);
                    delta := 0;
                    first := false;
                    h := h + 1;
                END IF;
            END LOOP;
            delta := delta + 1;
            n := n + 1;
        END LOOP;
        v_out := v_out || ('xn--' || v_enc);
    END LOOP;
    RETURN array_to_string(v_out, '.');
END
$fn$;

CREATE OR REPLACE FUNCTION scraping.punycode_digit(p_digit integer) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $fn$
    SELECT CASE WHEN p_digit < 26 THEN chr(97 + p_digit) ELSE chr(22 + p_digit) END;
$fn$;

-- The fingerprint of a request body: the same Idempotency-Key with another body is refused.
CREATE OR REPLACE FUNCTION scraping.request_sha256(
    p_url text, p_params jsonb, p_priority text, p_callback_url text
) RETURNS text
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT encode(sha256(convert_to(jsonb_build_object(
        'url', p_url, 'params', p_params, 'priority', p_priority,
        'callback_url', p_callback_url)::text, 'UTF8')), 'hex');
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
-- (its fair tag, queue, flow and tenant row come from the triggers of domain_queues.sql).
-- Same key and same body: the first job's id; same key, other body: SQLSTATE 23505 naming
-- the key. A key is remembered 24 hours (the API's documented TTL).
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

-- A job's URL or callback as POST /jobs accepts it (pin_orchestration/scraping/hosts.py,
-- check_url, rule for rule), and its host key: at most 2048 characters; no whitespace or
-- control character; http(s)://, then an authority without userinfo or backslash: a name
-- of letters, digits, '-', '_' and dots (lowercased, its trailing dot dropped) or an IPv6
-- literal in brackets (scraping.ipv6_key: one key per address); a port of 1 to 5 digits, 1 to 65535.
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
                RETURN scraping.ipv6_key(v_host);
            END IF;
        EXCEPTION WHEN invalid_text_representation THEN
            NULL;
        END;
        RAISE EXCEPTION '% has an invalid IPv6 address %', p_argument,
            quote_literal(left(v_host, 80))
            USING ERRCODE = '22023';
    END IF;
    IF v_host ~ '^[A-Za-z0-9_-]{1,63}(\.[A-Za-z0-9_-]{1,63})*\.?$' THEN
        -- An IPv4 address in another spelling than a.b.c.d (getaddrinfo reads 0x7f.1 as
        -- 127.0.0.1): one address under many keys gets many rates.
        IF v_host ~ '^(0[xX][0-9A-Fa-f]*|[0-9]+)(\.(0[xX][0-9A-Fa-f]*|[0-9]+)){0,3}\.?$'
           AND v_host !~ ('^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}'
                          '(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.?$') THEN
            RAISE EXCEPTION '% has an IPv4 address not written as a.b.c.d (%): give four '
                'decimal numbers 0 to 255 without leading zeros', p_argument,
                quote_literal(left(v_host, 80))
                USING ERRCODE = '22023';
        END IF;
        RETURN rtrim(lower(v_host COLLATE "C"), '.');
    END IF;
    IF v_host ~ '^[\x01-\x7f]*$' THEN
        RAISE EXCEPTION '% has a host that is not a valid name (%): use letters, digits, '
            '''-'', ''_'' and dots, at most 63 characters between dots', p_argument,
            quote_literal(left(v_host, 80))
            USING ERRCODE = '22023';
    END IF;
    RAISE EXCEPTION '% has a host with non-ASCII characters (%): give it in its IDNA '
        'ASCII form (xn--..., as Python''s idna.encode writes it); POST /jobs takes either',
        p_argument, quote_literal(left(v_host, 80))
        USING ERRCODE = '22023';
END
$fn$;
